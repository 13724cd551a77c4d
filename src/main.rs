use clap::Parser;

// Admission is allocation-heavy (JSON in, JSON out); mimalloc roughly halves its cost.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option: its place in mimalloc's `mi_option_e` (libmimalloc-sys
/// names no constant for it). `tests/hardening.rs` checks that this is the option
/// `MIMALLOC_PURGE_DELAY` sets.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Archer's memory bound assumes freed memory goes back to the OS at once; mimalloc otherwise
/// keeps freed pages for a while, and bursts then peak far over the budget. The environment
/// variable stays the knob: when it is set, it wins. Returns the delay in force, in ms.
#[allow(unsafe_code)]
#[allow(clippy::useless_conversion, reason = "c_long is i64 on Linux, not everywhere")]
fn return_freed_memory_at_once() -> i64 {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: mi_option_set stores an integer in mimalloc's option table (an atomic store);
        // it takes no pointers and may be called at any time from any thread.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
    }
    // SAFETY: mi_option_get reads that table; no pointers, any thread.
    i64::from(unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) })
}

fn main() -> std::process::ExitCode {
    let purge_delay_ms = return_freed_memory_at_once();
    archer::cli::ALLOCATOR_PURGE_DELAY_MS.store(purge_delay_ms, std::sync::atomic::Ordering::Relaxed);
    archer::cli::main(archer::cli::Cli::parse())
}
