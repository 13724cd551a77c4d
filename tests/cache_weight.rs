//! The image caches hold no more memory than their weights say, and `memory_bound_bytes`
//! counts them at full weight. The heap is measured by a counting allocator (the tests of this
//! binary take turns, so nothing else allocates meanwhile) while real lookups against the real
//! registry fill the tag cache and the failure cache past their byte budgets with the heaviest
//! entries there are: names as long as the OCI spec allows, 128-character tags, indexes of many
//! platforms, long error messages. The webhook's decision memo is measured the same way.
//!
//! The extender is measured the same way: its node facts cache, filled past its byte share with
//! the heaviest facts there are, and each call, whose peak heap must stay within what it
//! reserved from the memory budget, fed the bodies that weigh least for what they make it build
//! (tiny distinct nodes and names, escaped text, empty containers and volumes, maps nested deep).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

use serde_json::json;
use std::sync::Arc;

use common::*;

struct Counting;

static NET: AtomicI64 = AtomicI64::new(0);
/// The highest `NET` since it was last reset.
static PEAK: AtomicI64 = AtomicI64::new(0);
/// The tests of this binary take turns: each measures the whole heap.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// SAFETY (the one unsafe impl of the test suite): every call is passed to the system
// allocator unchanged; the counter is only arithmetic beside it.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = NET.fetch_add(layout.size() as i64, Ordering::Relaxed) + layout.size() as i64;
        PEAK.fetch_max(now, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        NET.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A moving realloc holds both buffers for a moment: counted at its peak.
        let now = NET.fetch_add(new_size as i64, Ordering::Relaxed) + new_size as i64;
        PEAK.fetch_max(now, Ordering::Relaxed);
        NET.fetch_sub(layout.size() as i64, Ordering::Relaxed);
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
    let _turn = TURN.lock().await;
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
    let inspector = archer::cli::inspector(&cfg, metrics.registry.clone(), archer::limits::MemoryBudget::unlimited()).expect("inspector");
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
    let structures = 5 * archer::registry::inspector::CACHE_STRUCTURE_BYTES;
    assert!(held > 0 && held as u64 <= weighed + structures, "{held} bytes held by entries weighed at {weighed} (+{structures} for the caches' structures): the weigher undercounts");
    // ...and the memory bound counts every cache at its full budget and its structure.
    let mut without = cfg.clone();
    without.registry.cache_max_bytes = 0;
    without.registry.failure_cache_max_bytes = 0;
    assert_eq!(cfg.memory_bound_bytes(1000) - without.memory_bound_bytes(1000), 2 * cfg.registry.cache_max_bytes + 2 * cfg.registry.failure_cache_max_bytes);
    assert_eq!(cfg.image_cache_bytes(), 2 * cfg.registry.cache_max_bytes + 2 * cfg.registry.failure_cache_max_bytes + archer::registry::inspector::ENTRYPOINT_CACHE_BYTES + structures);
    assert!(cfg.memory_bound_bytes(0) >= cfg.image_cache_bytes() + cfg.limits.memory_budget_bytes as u64);

    // The webhook's decision memo: filled past its budget with the lightest answers (where the
    // per-entry overhead weighs most) and with the heaviest keys and answers it keeps.
    let structure = archer::webhook::memo::STRUCTURE_BYTES;
    for (key_len, patch_len, warnings) in [(64, 0, 0), (archer::webhook::memo::MAX_KEY_BYTES, 4000, 3)] {
        let memo = archer::webhook::DecisionMemo::new(cfg.webhook.decision_cache_max_bytes, cfg.webhook.decision_cache_max_bytes_per_namespace, std::time::Duration::from_secs(60), Default::default());
        let before = NET.load(Ordering::SeqCst);
        for i in 0..20_000u32 {
            // Each answer in a namespace of its own, with the longest name a namespace has (63):
            // the memo's per-namespace accounting holds the most then.
            let namespace = format!("{i:0>63}");
            let mut key = (namespace.len() as u32).to_le_bytes().to_vec();
            key.extend_from_slice(namespace.as_bytes());
            key.resize(key_len.max(key.len()), b'k');
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

/// An extender call's body and what it must answer.
struct Call {
    what: &'static str,
    path: &'static str,
    body: Vec<u8>,
    /// Sent without a Content-Length, in chunks.
    streamed: bool,
}

/// JSON of `n` items made by `item`, comma-separated.
fn list(n: usize, item: impl Fn(usize) -> String) -> String {
    (0..n).map(item).collect::<Vec<_>>().join(",")
}

/// The extender's bodies that build the most for their size, each under a few MiB.
fn lightest_calls() -> Vec<Call> {
    const N: usize = 20_000;
    // A pod whose recorded platforms are many and long: every node it cannot run on gets a
    // reason longer than the answer keeps.
    let platforms = list(40, |i| format!("linux/arch{i:03}{}", "x".repeat(40)));
    let pod = |spec: &str| format!(r#"{{"metadata":{{"name":"p","namespace":"n","annotations":{{"archer.dev/platforms":"{platforms}"}}}},"spec":{spec}}}"#);
    let small = pod(r#"{"containers":[{"name":"c","image":"reg.example/app:1"}]}"#);
    let mut calls = Vec::new();
    for path in ["/scheduler/filter", "/scheduler/prioritize"] {
        // Tiny distinct names, none in the node cache.
        calls.push(Call { what: "tiny names", path, body: format!(r#"{{"Pod":{small},"NodeNames":[{}]}}"#, list(4 * N, |i| format!("\"{i:x}\""))).into_bytes(), streamed: false });
        // Tiny full nodes of an architecture the pod cannot run on, control characters in it.
        let arch = "\\u0001".repeat(20);
        calls.push(Call { what: "tiny unrunnable nodes", path, body: format!(r#"{{"Pod":{small},"Nodes":{{"items":[{}]}}}}"#, list(N, |i| format!(r#"{{"metadata":{{"name":"{i:x}","labels":{{"kubernetes.io/arch":"a{arch}"}}}}}}"#))).into_bytes(), streamed: false });
        // Tiny full nodes kept (no architecture), echoed back; sent in chunks with no length.
        calls.push(Call { what: "tiny kept nodes, streamed", path, body: format!(r#"{{"Pod":{small},"Nodes":{{"items":[{}]}}}}"#, list(2 * N, |i| format!(r#"{{"metadata":{{"name":"{i:x}"}}}}"#))).into_bytes(), streamed: true });
        // Escaped names (each decoded into a string of its own) and prices not believed.
        let escaped = "\\u0041".repeat(8);
        let bad_price = "\u{85}".repeat(300);
        calls.push(Call { what: "escaped names, bad prices", path, body: format!(r#"{{"Pod":{small},"Nodes":{{"items":[{}]}}}}"#, list(N / 6, |i| format!(r#"{{"metadata":{{"name":"{escaped}{i:x}","annotations":{{"archer.dev/price-per-hour":"{bad_price}"}},"labels":{{"kubernetes.io/arch":"arm64","node.kubernetes.io/instance-type":"m6g.large"}}}},"status":{{"allocatable":{{"cpu":"2","memory":"8Gi","pods":"29"}}}}}}"#))).into_bytes(), streamed: false });
    }
    // Pods that decode largest for their JSON, with one node.
    let one = r#""NodeNames":["n"]"#;
    let pods = [
        ("empty containers", format!(r#"{{"containers":[{}]}}"#, list(N / 2, |_| "{}".into()))),
        ("empty init and ephemeral containers", format!(r#"{{"initContainers":[{}],"ephemeralContainers":[{}]}}"#, list(N / 4, |_| "{}".into()), list(N / 4, |_| "{}".into()))),
        ("empty volumes", format!(r#"{{"volumes":[{}]}}"#, list(N / 2, |_| "{}".into()))),
        ("tiny env", format!(r#"{{"containers":[{{"name":"c","env":[{}],"command":[{}]}}]}}"#, list(N / 2, |_| r#"{"name":"a"}"#.into()), list(N, |_| "\"a\"".into()))),
        ("tiny tolerations and spread", format!(r#"{{"tolerations":[{}],"topologySpreadConstraints":[{}]}}"#, list(N / 2, |_| "{}".into()), list(N / 4, |_| "{}".into()))),
    ];
    for (what, spec) in pods {
        calls.push(Call { what, path: "/scheduler/filter", body: format!(r#"{{"Pod":{},{one}}}"#, pod(&spec)).into_bytes(), streamed: false });
    }
    // Metadata: many labels, owner references, and managed fields whose fieldsV1 are maps of one
    // key nested as deep as JSON may go.
    let labels = list(N, |i| format!(r#""{i:x}":"""#));
    let owners = list(N / 4, |_| "{}".into());
    let deep = format!("{}1{}", r#"{"a":"#.repeat(100), "}".repeat(100));
    let managed = list(200, |_| format!(r#"{{"fieldsV1":{deep}}}"#));
    calls.push(Call {
        what: "labels, owners, managed fields",
        path: "/scheduler/filter",
        body: format!(r#"{{"Pod":{{"metadata":{{"name":"p","labels":{{{labels}}},"ownerReferences":[{owners}],"managedFields":[{managed}]}}}},{one}}}"#).into_bytes(),
        streamed: false,
    });
    // Junk a parse gives up on only at its end.
    calls.push(Call { what: "items not nodes", path: "/scheduler/filter", body: format!(r#"{{"Pod":{{}},"Nodes":{{"items":[{}]}}}}"#, list(4 * N, |_| "1".into())).into_bytes(), streamed: false });
    calls.push(Call { what: "names not strings", path: "/scheduler/prioritize", body: format!(r#"{{"Pod":{{}},"NodeNames":[{}]}}"#, list(4 * N, |_| "1".into())).into_bytes(), streamed: false });
    calls.push(Call { what: "keys, then not JSON", path: "/scheduler/filter", body: format!(r#"{{"Pod":{{}},{},"NodeNames":[1"#, list(N, |i| format!(r#""{i:x}":1"#))).into_bytes(), streamed: false });
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extender_holds_no_more_than_its_cache_share_and_what_each_call_reserved() {
    use archer::extender::{FactsCache, PriceRules};
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let _turn = TURN.lock().await;

    // The node facts cache: filled past its budget with the heaviest facts a Node gives (a
    // 253-character name, long labels, a price annotation not believed and quoted in the reason).
    let catalog = archer::catalog::Catalog::embedded().expect("catalog");
    let prices = PriceRules { catalog: &catalog, max_per_hour: 1000.0, pricing: None };
    let (store, mut writer) = kube::runtime::reflector::store::<k8s_openapi::api::core::v1::Node>();
    const NODES: usize = 12_000;
    let name = |i: usize| format!("{i:06}{}", "n".repeat(247));
    for i in 0..NODES {
        let node = json!({"metadata": {"name": name(i), "resourceVersion": format!("{}", 1_000_000 + i),
            "labels": {"kubernetes.io/arch": "a".repeat(63), "kubernetes.io/os": "o".repeat(63)},
            "annotations": {"archer.dev/price-per-hour": "p".repeat(1_000)}}});
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(serde_json::from_value(node).expect("node")));
    }
    let names: Vec<String> = (0..NODES).map(name).collect();
    let cache = FactsCache::default();
    let _ = cache.lookup(&names[..16], Some(&store), &prices);
    let (before, weighed_before) = (NET.load(Ordering::SeqCst), cache.weighted_bytes());
    for chunk in names.chunks(500) {
        let facts = cache.lookup(chunk, Some(&store), &prices);
        assert!(facts.iter().all(|f| f.as_ref().is_some_and(|f| f.bad_price.is_some())));
    }
    let held = NET.load(Ordering::SeqCst) - before;
    let weighed = cache.weighted_bytes() - weighed_before;
    let share = archer::extender::FACTS_CACHE_BYTES as u64;
    eprintln!("node facts: {} entries, {held} bytes held, {weighed} weighed, budget {share}", cache.entries());
    assert!(cache.entries() < NODES && cache.weighted_bytes() as f64 >= 0.9 * share as f64, "filled past its budget: {} entries", cache.entries());
    assert!(cache.weighted_bytes() <= share, "within its budget");
    let structure = archer::extender::FACTS_STRUCTURE_BYTES;
    assert!(held > 0 && held as u64 <= weighed + structure, "{held} bytes held by facts weighed at {weighed} (+{structure}): the weigher undercounts");
    // The memory bound counts it full, with its structure.
    let cfg = archer::config::Config::default();
    assert_eq!(archer::config::Config::extender_cache_bytes(), share + archer::extender::FACTS_STRUCTURE_BYTES);
    assert!(cfg.memory_bound_bytes(0) >= cfg.image_cache_bytes() + cfg.decision_cache_bytes() + archer::config::Config::extender_cache_bytes() + cfg.limits.memory_budget_bytes as u64);
    drop((cache, store, writer));

    // Each call, from its body's arrival to its answer's last byte, within what it reserved.
    let budget = archer::limits::MemoryBudget::new(1 << 30);
    let metrics = std::sync::Arc::new(archer::metrics::Metrics::new());
    let router = archer::extender::router(common::extender(None, budget.clone(), metrics.clone()));
    let send = |path: &str, body: Vec<u8>, streamed: bool| {
        let len = body.len();
        let body = if streamed {
            let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = body.chunks(16 * 1024).map(|c| Ok(bytes::Bytes::copy_from_slice(c))).collect();
            axum::body::Body::from_stream(futures::stream::iter(chunks))
        } else {
            axum::body::Body::from(body)
        };
        let mut req = axum::http::Request::post(path).header("content-type", "application/json");
        if !streamed {
            req = req.header("content-length", len);
        }
        req.body(body).expect("request")
    };
    // Warm up: metric families, the runtime's and the router's first allocations.
    for path in ["/scheduler/filter", "/scheduler/prioritize"] {
        let r = router.clone().oneshot(send(path, br#"{"Pod":{},"NodeNames":["a"]}"#.to_vec(), false)).await.expect("call");
        let _ = r.into_body().collect().await;
    }
    for call in lightest_calls() {
        let request = send(call.path, call.body.clone(), call.streamed);
        let before = NET.load(Ordering::SeqCst);
        PEAK.store(before, Ordering::SeqCst);
        let response = router.clone().oneshot(request).await.expect("call");
        let holding = budget.in_use_bytes();
        let answer = response.into_body().collect().await.expect("answer").to_bytes();
        let peak = PEAK.load(Ordering::SeqCst) - before;
        let answer_len = answer.len();
        // An answer, not an error (which holds nothing).
        let answered = answer.starts_with(b"[{") || answer.ends_with(br#""Error":""}"#);
        drop(answer);
        assert_eq!(budget.in_use_bytes(), 0, "{}: everything reserved is given back once the answer is read", call.what);
        // What the call reserved: three times its body as it was read, then what its shape says
        // it builds (a body that is not JSON builds nothing).
        let shape = archer::extender::wire::shape(&call.body);
        let charged = (3 * call.body.len() + shape.as_ref().map_or(0, archer::extender::call_bytes)) as i64;
        if answered {
            // An answer holds the whole reservation until it has been read.
            assert!(holding as i64 >= charged, "{}: the answer held {holding} of the {charged} bytes reserved", call.what);
        }
        eprintln!("{} {}: body {} B, shape {:?}, answer {answer_len} B, peak heap {peak} B, reserved {charged} B", call.path, call.what, call.body.len(), shape.map(|s| (s.nodes, s.pod_bytes)));
        assert!(peak <= charged, "{} {}: the call's heap peaked at {peak} bytes, over the {charged} it reserved", call.path, call.what);
    }
}
