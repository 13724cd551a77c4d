//! `cargo bench --bench extender`: filter + prioritize over 5,000 nodes over HTTPS, in both
//! `nodeCacheCapable` modes, with p50/p99 latency, and how much of the full-Node time is parsing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{reflector, watcher};

// The same allocator as the archer binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NODES: usize = 5_000;
const ROUNDS: usize = 60;


fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// (sum, count) of one histogram, read from the metrics text (the handler's own time, body read
/// included, TLS and the client excluded).
fn histogram_sum_count(metrics: &archer::metrics::Metrics, h: &prometheus_client::metrics::histogram::Histogram) -> (f64, u64) {
    let name = if std::ptr::eq(h, &metrics.extender.filter_seconds) { "archer_extender_filter_duration_seconds" } else { "archer_extender_prioritize_duration_seconds" };
    let text = metrics.encode();
    let get = |suffix: &str| text.lines().find_map(|l| l.strip_prefix(&format!("{name}_{suffix} "))).and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0);
    (get("sum"), get("count") as u64)
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let types = ["m7g.large", "m6g.xlarge", "t4g.large", "c6g.2xlarge", "m6i.large", "t3a.xlarge", "c6i.2xlarge", "r7g.large"];
    let zones = ["us-east-1a", "us-east-1b", "us-east-1c"];
    let nodes: Vec<serde_json::Value> = (0..NODES)
        .map(|i| node_json(&format!("ip-10-0-{}-{}.ec2.internal", i / 250, i % 250), types[i % types.len()], zones[i % 3], if i % 4 == 0 { "spot" } else { "on-demand" }))
        .collect();
    let names: Vec<String> = nodes.iter().map(|n| n["metadata"]["name"].as_str().unwrap_or_default().to_string()).collect();
    let (store, mut writer) = reflector::store::<Node>();
    for n in &nodes {
        writer.apply_watcher_event(&watcher::Event::Apply(serde_json::from_value::<Node>(n.clone()).expect("node")));
    }
    let (port, http, _certs, metrics) = serve_extender_with_metrics(store).await;

    // A multi-arch pod (the webhook's annotation) whose filter keeps every node, the worst case.
    let p = with_annotation(with_requests(pod("web", &["x"]), "500m", "512Mi"), "archer.dev/platforms", "linux/amd64,linux/arm64");
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let bodies = [
        ("NodeNames", serde_json::to_vec(&extender_args_names(&p, &name_refs)).expect("json")),
        ("full Nodes", serde_json::to_vec(&extender_args_full(&p, &nodes)).expect("json")),
    ];
    println!("archer extender benchmark: {NODES} nodes, {ROUNDS} rounds, HTTPS, one call at a time");
    println!("{:<12} {:<12} {:>10} {:>10} {:>10} {:>14}", "mode", "verb", "body", "p50", "p99", "server mean");
    // ARCHER_BENCH_MODE=names|full runs one mode only (for profiling).
    let only = std::env::var("ARCHER_BENCH_MODE").ok();
    for (mode, body) in &bodies {
        if only.as_deref().is_some_and(|o| !mode.to_lowercase().contains(o)) {
            continue;
        }
        for verb in ["filter", "prioritize"] {
            let url = format!("https://127.0.0.1:{port}/scheduler/{verb}");
            let mut lat = Vec::new();
            let histogram = if verb == "filter" { &metrics.extender.filter_seconds } else { &metrics.extender.prioritize_seconds };
            let mut before = (0.0, 0u64);
            for round in 0..ROUNDS + 5 {
                if round == 5 {
                    before = histogram_sum_count(&metrics, histogram);
                }
                let t = Instant::now();
                let r = http.post(&url).header("content-type", "application/json").body(body.clone()).send().await.expect("post");
                assert!(r.status().is_success());
                let bytes = r.bytes().await.expect("body");
                if round >= 5 {
                    lat.push(t.elapsed());
                }
                if round == 0 {
                    assert!(bytes.len() > 2, "{verb} answered");
                }
            }
            let after = histogram_sum_count(&metrics, histogram);
            let server_mean = Duration::from_secs_f64((after.0 - before.0) / (after.1 - before.1).max(1) as f64);
            println!("{mode:<12} {verb:<12} {:>8.1}MB {:>10.2?} {:>10.2?} {:>14.2?}", body.len() as f64 / 1e6, pct(&mut lat, 0.5), pct(&mut lat, 0.99), server_mean);
        }
    }
    // Parsing share for full Node objects: the same parse the handler does, alone.
    if only.as_deref() == Some("names") {
        return;
    }
    let mut parse = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let args = archer::extender::wire::parse_args(&bodies[1].1).expect("args");
        std::hint::black_box(&args.pod);
        parse.push(t.elapsed());
    }
    println!("parsing the full-Node body alone: p50 {:.2?}", pct(&mut parse, 0.5));
}
