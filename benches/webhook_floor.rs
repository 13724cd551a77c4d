//! `cargo bench --bench webhook_floor`: the webhook's own cost, measured by wrk (Debian's `wrk`)
//! side by side with a floor server on the same stack: Archer's HTTPS listener (rustls, hyper,
//! axum, the same connection limits), reading the body within the same limits, decoding the
//! AdmissionReview with Archer's decoder and echoing its uid. What `/mutate` costs beyond the
//! floor is the decision itself: the pod view, policy, the cached image lookup, the patch and
//! the answer.
//!
//! Both are release builds; the floor runs in this process on a runtime of its own with as many
//! workers as `archer serve` gets. Archer runs as shipped: the chart's `--log-format json` at
//! the default level (info), its log written to a file, and its default config, where the
//! replicas of a workload reuse the decision kept for the second. Two loads: the same review
//! repeated (the same pod each time, as a Deployment's replicas are), and each review a pod not
//! seen before (its own name, uid and node selector, so no decision is reused: view, typed
//! decode, cached image lookup, decision, patch, every time); the floor gets the same bodies.
//! Throughput at 16 connections and p50 latency at one, over `ARCHER_BENCH_SECONDS` (default 10)
//! each, floor and Archer alternating, three rounds, the median round's ratios reported.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "benchmark code: a failed expectation is a panic by design")]

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::Request;
use axum::response::{IntoResponse, Response};
use common::*;

fn seconds() -> u64 {
    std::env::var("ARCHER_BENCH_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(10)
}

/// The floor: read the body as `/mutate` does, decode the review, echo its uid.
async fn floor(State(limits): State<archer::server::body::BodyLimits>, req: Request<Body>) -> Response {
    let Ok((body, _permit)) = archer::server::body::read_body(req, &limits).await else {
        return (axum::http::StatusCode::BAD_REQUEST, "body").into_response();
    };
    match archer::webhook::decode(&body) {
        Ok(r) => ([(axum::http::header::CONTENT_TYPE, "application/json")], archer::webhook::Answer::allow(&r.uid).to_json()).into_response(),
        Err(e) => (axum::http::StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

/// Start the floor server on its own runtime; its https URL.
fn start_floor(certs: &std::path::Path) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    let certs = certs.to_path_buf();
    std::thread::spawn(move || {
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build().expect("runtime");
        rt.block_on(async move {
            let cfg = archer::config::Config::default();
            let budget = cfg.memory_budget();
            let limits = archer::server::body::BodyLimits {
                max_bytes: cfg.webhook.max_body_bytes,
                expansion: 3,
                read_timeout: Duration::from_secs(10),
                budget_wait: Duration::from_secs(2),
                budget,
                consumer: "floor",
            };
            let router = axum::Router::new().route("/mutate", axum::routing::post(floor)).with_state(limits);
            let store = archer::server::tls::CertStore::load(&certs.join("tls.crt"), &certs.join("tls.key")).expect("certs");
            let (listener, addr) = archer::server::bind("127.0.0.1:0").await.expect("bind");
            let metrics = Arc::new(archer::metrics::Metrics::new());
            let conn_limits = archer::cli::connection_limits(&cfg, metrics.server.clone());
            let (_trigger, shutdown) = archer::server::shutdown_channel();
            tx.send(format!("https://{addr}")).expect("send");
            archer::server::serve_https(listener, store.server_config(), router, shutdown, conn_limits).await;
        });
    });
    rx.recv().expect("floor url")
}

struct Figures {
    rps: f64,
    p50_ms: f64,
}

/// One wrk run: `connections` keep-alive connections over `threads` threads, POSTing `body_file`.
fn wrk(url: &str, connections: usize, threads: usize, script: &std::path::Path) -> Figures {
    let out = Command::new("wrk")
        .args(["-t", &threads.to_string(), "-c", &connections.to_string(), "-d", &format!("{}s", seconds()), "--latency", "-s"])
        .arg(script)
        .arg(url)
        .output()
        .expect("wrk (apt-get install wrk)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && !text.contains("Non-2xx"), "wrk failed or got errors:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let rps = text.lines().find_map(|l| l.trim().strip_prefix("Requests/sec:")).and_then(|v| v.trim().parse::<f64>().ok()).expect("Requests/sec");
    let p50 = text.lines().find_map(|l| l.trim().strip_prefix("50%")).map(str::trim).expect("50% line");
    let p50_ms = if let Some(us) = p50.strip_suffix("us") {
        us.parse::<f64>().expect("us") / 1000.0
    } else if let Some(ms) = p50.strip_suffix("ms") {
        ms.parse::<f64>().expect("ms")
    } else {
        p50.trim_end_matches('s').parse::<f64>().expect("s") * 1000.0
    };
    Figures { rps, p50_ms }
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` probing: nothing to list
    }
    let reg = Registry::start().await;
    reg.push_index("bench/app", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    // As the chart runs it: JSON logs at the default level. `--log info` outranks the harness's
    // ARCHER_LOG (`info,archer=debug`, for the tests' logs): without it this measured Archer
    // writing a debug line per review, which the chart never does.
    let archer = Archer::start(&format!("registry:\n  insecure: [\"{}\"]\n", reg.host), &["--log-format", "json", "--log", "info"]).await;
    let floor_url = start_floor(&archer.certs);

    // A real-shaped review of a multi-arch pod: /mutate patches it (warm cache after the first).
    let body = serde_json::to_vec(&review("CREATE", &pod("warm", &[&reg.image("bench/app:1")]))).expect("json");
    let (status, first) = archer.post_raw(body.clone()).await;
    assert_eq!(status, 200);
    assert!(first["response"]["patch"].is_string(), "the measured request is a real patching admission: {first}");
    let dir = tempfile::tempdir().expect("tempdir");
    let body_file = dir.path().join("review.json");
    std::fs::write(&body_file, &body).expect("body");
    let script = dir.path().join("post.lua");
    std::fs::write(
        &script,
        format!("wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nlocal f = assert(io.open(\"{}\", \"rb\"))\nwrk.body = f:read(\"*a\")\nf:close()\n", body_file.display()),
    )
    .expect("script");
    // Each request a pod not seen before: the template's NEWPOD marks (its name, its uid, a node
    // selector value) replaced by the wrk thread's number, the run's start time and a counter.
    let mut fresh_pod = pod("warm", &[&reg.image("bench/app:1")]);
    fresh_pod["metadata"]["name"] = serde_json::json!("pod-NEWPOD");
    fresh_pod["spec"]["nodeSelector"] = serde_json::json!({"bench.archer.dev/pod": "NEWPOD"});
    let mut fresh_review = review("CREATE", &fresh_pod);
    fresh_review["request"]["uid"] = serde_json::json!("00000000-0000-0000-0000-NEWPOD");
    let template = serde_json::to_vec(&fresh_review).expect("json");
    let template_file = dir.path().join("review-template.json");
    std::fs::write(&template_file, &template).expect("template");
    let fresh_script = dir.path().join("fresh.lua");
    std::fs::write(
        &fresh_script,
        format!(
            "local threads = 0\nfunction setup(thread)\n  threads = threads + 1\n  thread:set(\"tid\", threads)\nend\n\
             local f = assert(io.open(\"{}\", \"rb\"))\nlocal template = f:read(\"*a\")\nf:close()\nlocal n = 0\nlocal run = os.time() % 100000\n\
             request = function()\n  n = n + 1\n  local body = template:gsub(\"NEWPOD\", string.format(\"%02d%05d%07d\", tid or 0, run, n))\n\
             return wrk.format(\"POST\", nil, {{[\"Content-Type\"] = \"application/json\"}}, body)\nend\n",
            template_file.display()
        ),
    )
    .expect("script");
    let once = String::from_utf8(template.clone()).expect("utf8").replace("NEWPOD", "000001");
    let (status, new_pod) = archer.post_raw(once.into_bytes()).await;
    assert_eq!(status, 200);
    assert!(new_pod["response"]["patch"].is_string(), "a new pod is patched too: {new_pod}");

    let archer_url = format!("{}/mutate", archer.https);
    let floor_url = format!("{floor_url}/mutate");
    println!("webhook vs floor (wrk, {} s per run, HTTPS keep-alive, {} byte review), Archer as shipped (JSON logs at info)", seconds(), body.len());
    println!("'same' repeats one pod (a workload's replicas reuse its decision); 'new' is a pod not seen before each time (no decision reuse)");
    println!("{:<6} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7} {:>9} {:>9} {:>7} {:>9} {:>9} {:>7}", "round", "floor rps", "same rps", "ratio", "floor rps", "new rps", "ratio", "floor p50", "same p50", "ratio", "floor p50", "new p50", "ratio");
    let (mut thr, mut lat, mut thr_new, mut lat_new) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 1..=3 {
        let f16 = wrk(&floor_url, 16, 2, &script);
        let a16 = wrk(&archer_url, 16, 2, &script);
        let g16 = wrk(&floor_url, 16, 2, &fresh_script);
        let n16 = wrk(&archer_url, 16, 2, &fresh_script);
        let f1 = wrk(&floor_url, 1, 1, &script);
        let a1 = wrk(&archer_url, 1, 1, &script);
        let g1 = wrk(&floor_url, 1, 1, &fresh_script);
        let n1 = wrk(&archer_url, 1, 1, &fresh_script);
        thr.push(a16.rps / f16.rps);
        lat.push(a1.p50_ms / f1.p50_ms);
        thr_new.push(n16.rps / g16.rps);
        lat_new.push(n1.p50_ms / g1.p50_ms);
        println!(
            "{round:<6} {:>10.0} {:>10.0} {:>6.2}x {:>10.0} {:>10.0} {:>6.2}x {:>6.3} ms {:>6.3} ms {:>6.2}x {:>6.3} ms {:>6.3} ms {:>6.2}x",
            f16.rps,
            a16.rps,
            a16.rps / f16.rps,
            g16.rps,
            n16.rps,
            n16.rps / g16.rps,
            f1.p50_ms,
            a1.p50_ms,
            a1.p50_ms / f1.p50_ms,
            g1.p50_ms,
            n1.p50_ms,
            n1.p50_ms / g1.p50_ms
        );
    }
    // The median round: one round disturbed by the machine (the floor's own rate varies by 20%
    // from run to run here) does not decide the figure.
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("throughput at 16 connections (median round): {:.2}x the floor (target >= 0.80x); a new pod each review: {:.2}x", median(&thr), median(&thr_new));
    println!("p50 at 1 connection (median round): {:.2}x the floor (target <= 1.30x); a new pod each review: {:.2}x", median(&lat), median(&lat_new));
}
