use clap::Parser;

// Admission is allocation-heavy (JSON in, JSON out); mimalloc roughly halves its cost.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    archer::cli::main(archer::cli::Cli::parse())
}
