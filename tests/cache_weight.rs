//! The image caches hold no more memory than their weights say, and `memory_bound_bytes`
//! counts them at full weight. The heap is measured by a counting allocator (this test binary
//! holds one test, so nothing else allocates meanwhile) while real lookups against the real
//! registry fill the tag cache and the failure cache past their byte budgets with the heaviest
//! entries there are: names as long as the OCI spec allows, 128-character tags, indexes of many
//! platforms, long error messages. The webhook's decision memo is measured the same way.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use common::*;

struct Counting;

static NET: AtomicI64 = AtomicI64::new(0);

// SAFETY (the one unsafe impl of the test suite): every call is passed to the system
// allocator unchanged; the counter is only arithmetic beside it.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        NET.fetch_add(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        NET.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        NET.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const PLATFORMS: [&str; 16] = [
    "linux/amd64", "linux/amd64/v2", "linux/amd64/v3", "linux/arm64", "linux/ppc64", "linux/arm/v7", "linux/arm/v6", "linux/arm/v5",
    "linux/386", "linux/ppc64le", "linux/s390x", "linux/riscv64", "linux/mips64le", "linux/loong64", "freebsd/amd64", "windows/amd64",
];

#[tokio::test(flavor = "current_thread")]
async fn the_caches_hold_no_more_than_their_weights_and_the_memory_bound_counts_them_full() {
    let reg = Registry::start().await;
    // The heaviest entries: a 255-character name, 128-character tags, 16 platforms.
    let repo = format!("w/{}", "n".repeat(255 - reg.host.len() - 1 - 2));
    reg.push_index(&repo, "base", &PLATFORMS, true, false).await;
    let index = reqwest::Client::new()
        .get(format!("http://{}/v2/{repo}/manifests/base", reg.host))
        .header("accept", "application/vnd.oci.image.index.v1+json")
        .send()
        .await
        .expect("get index")
        .bytes()
        .await
        .expect("index body");
    const TAGS: usize = 1200;
    let tag = |i: usize| format!("{i:05}{}", "t".repeat(123));
    for i in 0..TAGS {
        reg.push_manifest(&repo, &tag(i), "application/vnd.oci.image.index.v1+json", &index).await;
    }

    let mut cfg = archer::config::Config::default();
    cfg.registry.insecure = vec![reg.host.clone()];
    cfg.registry.cache_max_bytes = 4 * 1024 * 1024;
    cfg.registry.failure_cache_max_bytes = 2 * 1024 * 1024;
    cfg.registry.cache_capacity = 1_000_000; // the byte budgets bind, not the count
    cfg.validate().expect("config");
    let metrics = Arc::new(archer::metrics::Metrics::new());
    let inspector = archer::cli::inspector(&cfg, metrics, archer::limits::MemoryBudget::unlimited()).expect("inspector");
    let keyring = archer::registry::Keyring::default();

    // Warm the client (connection pool, DNS, metric families) before measuring.
    for i in 0..8 {
        let _ = inspector.inspect(&format!("{}/{repo}:{}", reg.host, tag(TAGS - 1 - i)), &keyring).await.expect("found");
        let _ = inspector.inspect(&format!("{}/w/warm{i}:x", reg.host), &keyring).await.expect_err("missing");
    }
    inspector.settle().await;
    let before = NET.load(Ordering::SeqCst);
    let weighed_before = inspector.cached_bytes();

    for i in 0..TAGS {
        let found = inspector.inspect(&format!("{}/{repo}:{}", reg.host, tag(i)), &keyring).await.expect("found");
        assert_eq!(found.platforms.0.len(), PLATFORMS.len());
        // A failure with a long key and a long message.
        let missing = format!("{}/w/{}{i:05}:{}", reg.host, "m".repeat(240 - reg.host.len()), "t".repeat(128));
        let e = inspector.inspect(&missing, &keyring).await.expect_err("missing");
        assert_eq!(e.reason(), "not_found");
    }
    inspector.settle().await;
    let held = NET.load(Ordering::SeqCst) - before;
    let weighed = inspector.cached_bytes() - weighed_before;
    eprintln!("caches: {held} bytes held, {weighed} weighed ({} budgeted), entries {:?}", cfg.image_cache_bytes(), inspector.cached_entries());

    // The caches were filled past their budgets (entries were evicted to stay within them)...
    assert!(weighed as f64 >= 0.9 * (cfg.registry.cache_max_bytes + cfg.registry.failure_cache_max_bytes) as f64, "both caches filled: {weighed}");
    assert!(inspector.cached_bytes() <= cfg.image_cache_bytes(), "weights stay within the budgets");
    // ...the heap they hold is no more than their weights and their structures...
    let structures = 4 * archer::registry::inspector::CACHE_STRUCTURE_BYTES;
    assert!(held > 0 && held as u64 <= weighed + structures, "{held} bytes held by entries weighed at {weighed} (+{structures} for the caches' structures): the weigher undercounts");
    // ...and the memory bound counts every cache at its full budget and its structure.
    let mut without = cfg.clone();
    without.registry.cache_max_bytes = 0;
    without.registry.failure_cache_max_bytes = 0;
    assert_eq!(cfg.memory_bound_bytes(1000) - without.memory_bound_bytes(1000), 2 * cfg.registry.cache_max_bytes + 2 * cfg.registry.failure_cache_max_bytes);
    assert_eq!(cfg.image_cache_bytes(), 2 * cfg.registry.cache_max_bytes + 2 * cfg.registry.failure_cache_max_bytes + structures);
    assert!(cfg.memory_bound_bytes(0) >= cfg.image_cache_bytes() + cfg.limits.memory_budget_bytes as u64);

    // The webhook's decision memo: filled past its budget with the lightest answers (where the
    // per-entry overhead weighs most) and with the heaviest keys and answers it keeps.
    let structure = archer::webhook::memo::STRUCTURE_BYTES;
    for (key_len, patch_len, warnings) in [(64, 0, 0), (archer::webhook::memo::MAX_KEY_BYTES, 4000, 3)] {
        let memo = archer::webhook::DecisionMemo::new(cfg.webhook.decision_cache_max_bytes, std::time::Duration::from_secs(60));
        let before = NET.load(Ordering::SeqCst);
        for i in 0..20_000u32 {
            let mut key = vec![b'k'; key_len];
            key[..4].copy_from_slice(&i.to_le_bytes());
            let mut answer = archer::webhook::Answer::allow("");
            answer.patch = (patch_len > 0).then(|| "p".repeat(patch_len));
            answer.warnings = (0..warnings).map(|w| format!("warning {w}: {}", "w".repeat(240))).collect();
            answer.audit_annotations.insert("platforms".into(), "linux/amd64,linux/arm64".into());
            answer.audit_annotations.insert("decision".into(), "enforced".into());
            memo.insert(key, answer, "enforced");
        }
        let weighed = memo.weighted_bytes();
        let held = NET.load(Ordering::SeqCst) - before;
        eprintln!("decision memo (keys {key_len} B, patches {patch_len} B): {} entries, {held} bytes held, {weighed} weighed", memo.entries());
        assert!(weighed as f64 >= 0.9 * cfg.webhook.decision_cache_max_bytes as f64, "filled: {weighed}");
        assert!(weighed <= cfg.webhook.decision_cache_max_bytes);
        assert!(held > 0 && held as u64 <= weighed + structure, "{held} bytes held by memo entries weighed at {weighed} (+{structure}): the weigher undercounts");
        drop(memo);
    }
    let mut without = cfg.clone();
    without.webhook.decision_cache_max_bytes = 0;
    assert_eq!(cfg.memory_bound_bytes(1000) - without.memory_bound_bytes(1000), cfg.webhook.decision_cache_max_bytes + structure);
}
