//! `cargo bench --bench mutate`: /mutate over HTTPS with a warm cache, side by side with a
//! trivial HTTPS endpoint of the same server stack, plus cold-cache latency against the local
//! registry. Runs the optimised `archer serve` binary against Debian's docker-registry.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

/// In-flight requests (kube-apiserver keeps a handful of connections per webhook); override
/// with ARCHER_BENCH_CONCURRENCY.
fn concurrency() -> usize {
    std::env::var("ARCHER_BENCH_CONCURRENCY").ok().and_then(|v| v.parse().ok()).unwrap_or(4)
}
const REQUESTS: usize = 20_000;
const COLD_IMAGES: usize = 40;

struct Figures {
    rps: f64,
    p50: Duration,
    p99: Duration,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

async fn load(client: &reqwest::Client, make: Arc<dyn Fn(usize) -> reqwest::RequestBuilder + Send + Sync>) -> Figures {
    let _ = client;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency() {
        let next = next.clone();
        let make = make.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= REQUESTS {
                    break;
                }
                let t = Instant::now();
                let resp = make(i).send().await.expect("request");
                assert!(resp.status().is_success(), "status {}", resp.status());
                let _ = resp.bytes().await.expect("body");
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut all = Vec::with_capacity(REQUESTS);
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    let wall = started.elapsed();
    all.sort();
    Figures { rps: all.len() as f64 / wall.as_secs_f64(), p50: percentile(&all, 0.5), p99: percentile(&all, 0.99) }
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` probing: nothing to list
    }
    let reg = Registry::start().await;
    reg.push_index("bench/app", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    for i in 0..COLD_IMAGES {
        reg.push_index("bench/cold", &format!("v{i}"), &["linux/amd64", "linux/arm64"], true, false).await;
    }
    let archer = Archer::start(&format!("registry:\n  insecure: [\"{}\"]\n", reg.host), &["--log", "warn"]).await;
    let ca = std::fs::read(archer.certs.join("ca.crt")).expect("ca");
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).expect("pem"))
        .pool_max_idle_per_host(concurrency())
        .build()
        .expect("client");

    // Cold cache: the first admission of each distinct image goes to the registry.
    let mut cold = Vec::new();
    for i in 0..COLD_IMAGES {
        let body = serde_json::to_vec(&review("CREATE", &pod("cold", &[&reg.image(&format!("bench/cold:v{i}"))]))).expect("json");
        let t = Instant::now();
        let r = client.post(format!("{}/mutate", archer.https)).body(body).send().await.expect("post");
        let _ = r.bytes().await;
        cold.push(t.elapsed());
    }
    cold.sort();

    let body = Arc::new(serde_json::to_vec(&review("CREATE", &pod("warm", &[&reg.image("bench/app:1")]))).expect("json"));
    let warmup = client.post(format!("{}/mutate", archer.https)).body(body.to_vec()).send().await.expect("warm");
    assert!(warmup.text().await.expect("text").contains("\"patch\""), "the warm request must be a real patching admission");

    let (c1, url1, b) = (client.clone(), format!("{}/mutate", archer.https), body.clone());
    let mutate = load(&client, Arc::new(move |_| c1.post(&url1).header("content-type", "application/json").body(b.to_vec()))).await;
    let (c2, url2) = (client.clone(), format!("{}/healthz", archer.https));
    let trivial = load(&client, Arc::new(move |_| c2.get(&url2))).await;

    println!("archer /mutate benchmark: {REQUESTS} requests, concurrency {}, HTTPS keep-alive, warm cache", concurrency());
    println!("{:<22} {:>10} {:>10} {:>10}", "endpoint", "req/s", "p50", "p99");
    for (name, f) in [("POST /mutate", &mutate), ("GET /healthz (trivial)", &trivial)] {
        println!("{name:<22} {:>10.0} {:>10.3?} {:>10.3?}", f.rps, f.p50, f.p99);
    }
    println!("throughput ratio /mutate : trivial = {:.2}", mutate.rps / trivial.rps);
    println!(
        "cold cache (first admission of {COLD_IMAGES} distinct images, one at a time): p50 {:.3?}, p99 {:.3?}, max {:.3?}",
        percentile(&cold, 0.5),
        percentile(&cold, 0.99),
        cold.last().copied().unwrap_or_default()
    );
}
