//! Bounded under hostile input: each finding of the hardening review as a test against the real
//! `archer serve` binary over real TLS (memory measured from /proc), a real registry where one
//! can produce the fault, and a small stalling server only for the fault a registry cannot make
//! (a manifest that stops mid-body).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use common::*;
use rustls_pki_types::pem::PemObject;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MIB: usize = 1024 * 1024;

/// A TLS connection to Archer's HTTPS listener, trusting its dev CA.
async fn tls_connect(archer: &Archer) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    tls_connect_to(archer.https.trim_start_matches("https://"), &archer.certs).await
}

/// Read until the server closes the connection; what it sent, or None if it was still open
/// after `limit`.
async fn read_until_closed<S: tokio::io::AsyncRead + Unpin>(s: &mut S, limit: Duration) -> Option<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let until = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(until, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(String::from_utf8_lossy(&out).into_owned()),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// ExtenderArgs of about `bytes` with full Nodes: every node carries a large label (the finding).
fn big_extender_args(bytes: usize) -> Vec<u8> {
    let label = "x".repeat(64 * 1024);
    let nodes: Vec<Value> = (0..bytes / (64 * 1024 + 3000))
        .map(|i| {
            let mut n = node_json(&format!("n{i}"), if i % 2 == 0 { "m6g.large" } else { "m6i.large" }, "us-east-1a", "on-demand");
            n["metadata"]["labels"]["example.com/blob"] = json!(label);
            n
        })
        .collect();
    let pod = with_annotation(pod("p", &["app:1"]), "archer.dev/platforms", "linux/amd64");
    serde_json::to_vec(&extender_args_full(&pod, &nodes)).expect("json")
}

/// An AdmissionReview of about `bytes` (a pod with a huge annotation and env).
fn big_review(bytes: usize) -> Vec<u8> {
    let mut p = pod("big", &["169.254.169.254/x:1"]);
    p["metadata"]["annotations"] = json!({"blob": "y".repeat(bytes / 2)});
    p["spec"]["containers"][0]["env"] = json!((0..bytes / 2 / 64).map(|i| json!({"name": format!("V{i}"), "value": "z".repeat(40)})).collect::<Vec<_>>());
    serde_json::to_vec(&review("CREATE", &p)).expect("json")
}

#[tokio::test]
async fn concurrent_big_bodies_stay_under_the_memory_budget() {
    const BUDGET: usize = 64 * MIB;
    // The finding's configuration: a body cap far above what memory can hold (256 MiB), so only
    // the shared budget stands between concurrent callers and the memory limit.
    let config = format!("limits:\n  memoryBudgetBytes: {BUDGET}\n  budgetWaitSeconds: 20\n  bodyReadTimeoutSeconds: 30\nextender:\n  maxBodyBytes: 268435456\nregistry:\n  timeoutSeconds: 1\n");
    let archer = Archer::start(&config, &[]).await;
    let (baseline, _) = archer.rss();

    // One body larger than the whole budget is refused before it is read.
    let huge = big_extender_args(100 * MIB);
    match archer.client().post(format!("{}/scheduler/filter", archer.https)).body(huge).send().await {
        Ok(r) => {
            let v: Value = r.json().await.expect("json");
            assert!(v["Error"].as_str().is_some_and(|e| e.contains("memory budget")), "{v}");
        }
        Err(e) => eprintln!("the server closed the connection before the whole body was sent: {e}"),
    }
    assert_eq!(archer.metric("archer_memory_budget_refusals_total{consumer=\"extender_body\"}").await, 1.0);
    // Four 12 MiB extender calls and eight 10 MiB reviews at once: each is answered, one after
    // another as the budget frees, and the process never grows past the budget.
    let ext_body = Arc::new(big_extender_args(12 * MIB));
    let review_body = Arc::new(big_review(10 * MIB));
    let mut calls = Vec::new();
    for i in 0..12 {
        // One HTTP/1.1 connection each: a stream waiting for budget on a shared HTTP/2
        // connection holds up the others' bodies (flow control) until it is refused.
        let client = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(archer.certs.join("ca.crt")).expect("ca")).expect("pem"))
            .http1_only()
            .build()
            .expect("client");
        let https = archer.https.clone();
        let (path, body) = if i % 3 == 0 { ("/scheduler/filter", ext_body.clone()) } else { ("/mutate", review_body.clone()) };
        calls.push(tokio::spawn(async move {
            let r = client.post(format!("{https}{path}")).header("content-type", "application/json").body((*body).clone()).send().await.expect("post");
            (path, r.status().as_u16(), r.json::<Value>().await.expect("json"))
        }));
    }
    for c in calls {
        let (path, status, body) = c.await.expect("join");
        assert_eq!(status, 200, "{path}: {body}");
        if path == "/mutate" {
            assert_eq!(body["response"]["allowed"], true);
        } else {
            assert!(body["Error"].as_str().unwrap_or_default().is_empty(), "{body}");
            assert!(body["Nodes"]["items"].as_array().is_some_and(|n| !n.is_empty()));
        }
    }
    let (_, peak) = archer.rss();
    let grown = peak.saturating_sub(baseline);
    eprintln!("baseline RSS {} MiB, peak {} MiB, grown {} MiB (budget {} MiB)", baseline >> 20, peak >> 20, grown >> 20, BUDGET >> 20);
    // The docs' bound ("Memory bound"): the budget with the allocator's 15% slack, plus connection buffers.
    let bound = (BUDGET * 115 / 100 + 8 * MIB) as u64;
    assert!(grown < bound, "peak RSS grew {} MiB, over {} MiB for a {} MiB budget", grown >> 20, bound >> 20, BUDGET >> 20);
    assert_eq!(archer.metric("archer_memory_budget_in_use_bytes").await, 0.0, "everything reserved was given back");
}

/// A registry that stalls: repositories named `big*` send most of an 8 MiB manifest and then
/// stop, the others stop right after the headers. Counts requests in flight and served.
async fn stalling_registry(in_flight: Arc<AtomicUsize>, most: Arc<AtomicUsize>, served: Arc<AtomicUsize>) -> String {
    let app = axum::Router::new().route(
        "/v2/{name}/manifests/{reference}",
        axum::routing::get(move |axum::extract::Path((name, _)): axum::extract::Path<(String, String)>| {
            let (in_flight, most, served) = (in_flight.clone(), most.clone(), served.clone());
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                served.fetch_add(1, Ordering::SeqCst);
                struct Leave(Arc<AtomicUsize>);
                impl Drop for Leave {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                let leave = Leave(in_flight);
                let chunks = if name.starts_with("big") { 30 } else { 0 };
                let chunks = futures::stream::iter((0..chunks).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b' '; 256 * 1024]))));
                let stall = futures::stream::unfold(leave, |leave| async move {
                    std::future::pending::<()>().await;
                    Some((Ok(bytes::Bytes::new()), leave))
                });
                use futures::StreamExt;
                let body = axum::body::Body::from_stream(chunks.chain(stall));
                (StatusCode::OK, [(header::CONTENT_TYPE, OCI_INDEX), (header::CONTENT_LENGTH, "8000000")], body).into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr.to_string()
}

#[tokio::test]
async fn a_stalling_registry_with_many_images_is_bounded_per_pod() {
    let (in_flight, most, served) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let host = stalling_registry(in_flight.clone(), most.clone(), served.clone()).await;
    let config = format!("registry:\n  insecure: [\"{host}\"]\n  timeoutSeconds: 3\nwebhook:\n  decisionTimeoutSeconds: 2\n");
    let archer = Archer::start(&config, &[]).await;
    let (baseline, _) = archer.rss();

    // 32 images that stall at once: 8 at a time, and the decision still arrives in time.
    let images: Vec<String> = (0..32).map(|i| format!("{host}/slow{i}:1")).collect();
    let refs: Vec<&str> = images.iter().map(String::as_str).collect();
    let started = Instant::now();
    let (resp, p) = archer.admit(&pod("many", &refs)).await;
    let took = started.elapsed();
    assert_eq!(resp["allowed"], true, "fail-open: admitted with a warning");
    assert_eq!(p["metadata"]["annotations"]["archer.dev/decision"], "inspection-failed");
    assert!(took < Duration::from_millis(3500), "the decision arrives within the webhook's timeout: {took:?}");
    assert_eq!(most.load(Ordering::SeqCst), 8, "8 images of one pod are inspected at once, no more");
    assert_eq!(served.load(Ordering::SeqCst), 8, "the rest wait their turn until the deadline");

    // 32 images that send 7.5 MiB each and stall: the per-pod byte allowance ends it early.
    let images: Vec<String> = (0..32).map(|i| format!("{host}/big{i}:1")).collect();
    let refs: Vec<&str> = images.iter().map(String::as_str).collect();
    let started = Instant::now();
    let (resp, _) = archer.admit(&pod("many-big", &refs)).await;
    let took = started.elapsed();
    assert_eq!(resp["allowed"], true);
    let (_, peak) = archer.rss();
    eprintln!("32 stalled images: answered in {took:?}, {} requests, RSS grew {} MiB", served.load(Ordering::SeqCst), peak.saturating_sub(baseline) >> 20);
    // 16 MiB of registry bytes per pod, charged twice to the budget: far below the 360 MiB found.
    assert!(peak.saturating_sub(baseline) < 96 * MIB as u64, "RSS grew {} MiB", peak.saturating_sub(baseline) >> 20);
    assert!(archer.metric("archer_image_inspection_failures_total{reason=\"pod_bytes_exceeded\"}").await >= 1.0, "{}", archer.metrics().await);
    // Abandoned lookups let go of their connections.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(in_flight.load(Ordering::SeqCst), 0, "no registry connection is left open");
}

#[tokio::test]
async fn prioritize_scores_stay_within_0_to_10_with_absurd_prices() {
    let archer = Archer::start("", &[]).await;
    let mut nodes = Vec::new();
    for (name, price) in [("cheap", None), ("absurd", Some("1e308")), ("nan", Some("NaN")), ("inf", Some("inf")), ("negative", Some("-3")), ("ceiling", Some("1000.5"))] {
        let mut n = node_json(name, "m6g.large", "us-east-1a", "on-demand");
        if let Some(p) = price {
            n["metadata"]["annotations"]["archer.dev/price-per-hour"] = json!(p);
        }
        nodes.push(n);
    }
    let pod = with_requests(pod("p", &["app:1"]), "500m", "512Mi");
    let (status, list) = archer.post_json("/scheduler/prioritize", &extender_args_full(&pod, &nodes)).await;
    assert_eq!(status, 200);
    let scores: Vec<(String, i64)> = list.as_array().expect("list").iter().map(|h| (h["Host"].as_str().unwrap_or("").to_string(), h["Score"].as_i64().expect("score"))).collect();
    assert_eq!(scores.len(), 6);
    assert!(scores.iter().all(|(_, s)| (0..=10).contains(s)), "{scores:?}");
    assert_eq!(scores[0], ("cheap".to_string(), 10));
    assert!(scores[1..].iter().all(|(_, s)| *s == 5), "absurd prices are unknown (neutral): {scores:?}");
    assert_eq!(archer.metric("archer_extender_invalid_prices_total").await, 5.0);
    assert!(archer.log_text().contains("node price not believed"));
}

#[tokio::test]
async fn an_insecure_registry_entry_covers_only_its_own_port() {
    let reg = Registry::start().await;
    reg.push_index("app/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    let port = reg.host.rsplit(':').next().expect("port").to_string();
    // Another port of the same host, counting the connections it gets.
    let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let other_port = other.local_addr().expect("addr").port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let seen = accepted.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = other.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            drop(s);
        }
    });
    let archer = Archer::start(&format!("registry:\n  insecure: [\"localhost:{port}\"]\n  timeoutSeconds: 2\n"), &[]).await;
    let (_, p) = archer.admit(&pod("listed", &[&format!("localhost:{port}/app/web:1")])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64,linux/arm64", "the listed host:port works: {p}");
    for image in [format!("localhost:{other_port}/x:1"), "localhost/x:1".to_string()] {
        let (_, p) = archer.admit(&pod("unlisted", &[&image])).await;
        let err = p["metadata"]["annotations"]["archer.dev/inspection-error"].as_str().unwrap_or_default().to_string();
        assert!(err.contains("refusing to contact"), "{image}: {err}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "no connection reached the unlisted port");
    assert_eq!(archer.metric("archer_image_inspection_failures_total{reason=\"forbidden_address\"}").await, 2.0);
}

#[tokio::test]
async fn stalled_clients_are_released_by_the_timeouts_and_the_cap() {
    // The timeouts are long enough that no stalled connection times out before the 21st arrives,
    // even with 20 TLS handshakes on a loaded machine (a parallel `cargo test`): with shorter ones
    // the first connection's header timeout, or freed slots, came first there.
    let config = "limits:\n  maxConnections: 20\n  handshakeTimeoutSeconds: 1\n  headerReadTimeoutSeconds: 4\n  bodyReadTimeoutSeconds: 3\n  idleTimeoutSeconds: 4\n";
    let archer = Archer::start(config, &[]).await;
    let mut stalled = Vec::new();
    for i in 0..20 {
        let mut s = tls_connect(&archer).await.expect("connect");
        match i % 3 {
            0 => s.write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Ty").await.expect("partial headers"),
            1 => s.write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"apiVer").await.expect("partial body"),
            _ => {} // nothing at all after the handshake
        }
        s.flush().await.expect("flush");
        stalled.push((i % 3, s));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // At the cap, a new connection displaces the stalled one that has gone longest without
    // progress (the first, stalled in its headers), and is served.
    let started = Instant::now();
    let fresh = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(archer.certs.join("ca.crt")).expect("ca")).expect("pem"))
        .build()
        .expect("client");
    let ok = fresh.get(format!("{}/healthz", archer.https)).send().await.expect("the 21st connection is served");
    assert!(ok.status().is_success());
    assert!(started.elapsed() < Duration::from_secs(1), "served at once, not after a timeout: {:?}", started.elapsed());
    // One stalled connection (part way into its headers or its body) is displaced, never an
    // idle one. Which stalled one is the stalest is the server's view of when each last made
    // progress, and under load that order is not the order the test opened them in (measured:
    // about one run in eight displaced a body-stalled connection on an idle machine).
    let headers = archer.metric("archer_connections_displaced_total{phase=\"headers\"}").await;
    let body = archer.metric("archer_connections_displaced_total{phase=\"body\"}").await;
    assert_eq!(headers + body, 1.0, "{}", archer.metrics().await);
    assert_eq!(archer.metric("archer_connections_displaced_total{phase=\"idle\"}").await, 0.0, "a stalled connection goes before an idle one");
    assert_eq!(archer.metric("archer_connections_refused_total").await, 0.0);
    drop(fresh);
    // Every stalled connection is closed, by a timeout (the slow body with a 408) or by the
    // displacement.
    let mut answered_408 = 0;
    for (kind, mut s) in stalled {
        let said = read_until_closed(&mut s, Duration::from_secs(5)).await.unwrap_or_else(|| panic!("stalled connection of kind {kind} still open"));
        if kind == 1 {
            answered_408 += usize::from(said.starts_with("HTTP/1.1 408"));
        }
    }
    assert_eq!(answered_408 as f64, 7.0 - body, "every slow body not displaced is answered 408");
    // Slots are free again: an ordinary request is served.
    let ok = archer.client().get(format!("{}/healthz", archer.https)).send().await.expect("healthz");
    assert!(ok.status().is_success());
    let metrics = archer.metrics().await;
    let timeouts: f64 = metrics.lines().filter(|l| l.starts_with("archer_connection_timeouts_total{")).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum();
    assert!(timeouts >= 12.0, "header and idle timeouts counted: {metrics}");
    assert_eq!(archer.metric("archer_bad_requests_total{reason=\"body_timeout\"}").await, 7.0 - body);
}

#[tokio::test]
async fn no_connection_is_refused_during_the_shutdown_delay() {
    let mut archer = Archer::start("shutdownDelaySeconds: 2\nshutdownGraceSeconds: 2\n", &[]).await;
    archer.terminate();
    let started = Instant::now();
    let mut served = 0;
    let mut saw_not_ready = false;
    while started.elapsed() < Duration::from_millis(1600) {
        // A new connection each time, as a rollout's API server would open.
        let fresh = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(archer.certs.join("ca.crt")).expect("ca")).expect("pem"))
            .build()
            .expect("client");
        let r = fresh.get(format!("{}/healthz", archer.https)).send().await.expect("no connection may be refused during the delay");
        assert!(r.status().is_success());
        served += 1;
        if let Ok(r) = reqwest::get(format!("{}/readyz", archer.admin)).await {
            saw_not_ready |= r.status() == StatusCode::SERVICE_UNAVAILABLE;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // (Any number served proves the point; a loaded CI machine makes fresh TLS handshakes slow.)
    assert!(served >= 3 && saw_not_ready, "served {served}, not ready seen: {saw_not_ready}");
    let status = archer.wait_exit(Duration::from_secs(8)).await.expect("archer exits after the delay and the drain");
    assert!(status.success(), "{status:?}");
    assert!(started.elapsed() >= Duration::from_secs(2), "the listener stayed open for the whole delay");
}

/// An API server that takes connections and never answers (a hung list: a fault the real one
/// cannot be made to produce on demand) keeps Archer not ready, and /readyz names the lists it
/// still waits for.
#[tokio::test]
async fn a_silent_api_server_keeps_archer_not_ready_and_readyz_says_why() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = silent.local_addr().expect("addr");
    let held = Arc::new(tokio::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = silent.accept().await {
            keep.lock().await.push(conn);
        }
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!("apiVersion: v1\nkind: Config\nclusters:\n- name: silent\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: silent\n  context:\n    cluster: silent\n    user: nobody\ncurrent-context: silent\nusers:\n- name: nobody\n  user: {{}}\n"),
    )
    .expect("kubeconfig");
    let certs = make_certs(&dir.path().join("certs"));
    let archer = Archer::spawn(dir, certs, "", &["--kubeconfig", kubeconfig.to_str().expect("utf-8 path")]);
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(40) {
        if let Ok(r) = reqwest::get(format!("{}/readyz", archer.admin)).await {
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "ready without a single list");
            last = r.text().await.unwrap_or_default();
            if last.contains("waiting for the first list of namespaces, nodes") {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(last, "not ready: waiting for the first list of namespaces, nodes", "log:\n{}", archer.log_text());
    assert!(held.lock().await.len() >= 2, "the watches did reach the API server");
    assert!(archer.log_text().contains("caches not synced yet"), "a warning is logged:\n{}", archer.log_text());
}

#[tokio::test]
async fn pods_too_large_to_decide_on_are_left_unchanged_or_denied_when_fail_closed() {
    // 600 KiB of tolerations: decoded whole it would cost ~45x that; Archer does not decode it.
    let mut p = pod("huge", &["169.254.169.254/x:1"]);
    p["spec"]["tolerations"] = json!((0..16_000).map(|i| json!({"key": format!("example.com/taint-{i}"), "operator": "Exists"})).collect::<Vec<_>>());
    let open = Archer::start("registry:\n  timeoutSeconds: 1\n", &[]).await;
    let (resp, patched) = open.admit(&p).await;
    assert_eq!(resp["allowed"], true);
    assert!(resp["patch"].is_null() && patched == p, "left unchanged");
    let w = resp["warnings"].to_string();
    assert!(w.contains("scheduling constraints") && w.contains("524288-byte limit"), "{w}");
    assert_eq!(open.metric("archer_admission_reviews_total{outcome=\"too_large\"}").await, 1.0);
    let closed = Archer::start("defaults:\n  onInspectionFailure: fail-closed\n", &[]).await;
    let (resp, _) = closed.admit(&p).await;
    assert_eq!(resp["allowed"], false, "no way around a fail-closed namespace: {resp}");
    assert!(resp["status"]["message"].as_str().is_some_and(|m| m.contains("could not decide")));
}

/// An attacker holds and renews twice `maxConnections` stalled connections (handshakes never
/// finished, headers and bodies trickled a byte at a time); a normal client, opening a new
/// connection for each review as well as reusing one, is answered every time.
#[tokio::test]
async fn a_normal_client_is_answered_while_twice_the_cap_of_stalled_clients_keep_renewing() {
    const CAP: usize = 16;
    let config = format!("limits:\n  maxConnections: {CAP}\n  handshakeTimeoutSeconds: 30\n  headerReadTimeoutSeconds: 30\n  bodyReadTimeoutSeconds: 30\n  idleTimeoutSeconds: 30\n");
    let archer = Archer::start(&config, &[]).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let https = archer.https.trim_start_matches("https://").to_string();
    let mut attackers = Vec::new();
    for i in 0..2 * CAP {
        let stop = stop.clone();
        let addr = https.clone();
        let certs = archer.certs.clone();
        attackers.push(tokio::spawn(async move {
            let mut renewals = 0usize;
            while !stop.load(Ordering::SeqCst) {
                // Hold each connection about 1.5 s, trickling, then renew it.
                let until = Instant::now() + Duration::from_millis(1500);
                match i % 3 {
                    0 => {
                        // A handshake that never finishes: half a ClientHello.
                        if let Ok(mut s) = TcpStream::connect(&addr).await {
                            let _ = s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await;
                            while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                    kind => {
                        let Ok(mut s) = tls_connect_to(&addr, &certs).await else {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        };
                        let head: &[u8] = if kind == 1 {
                            b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nX-Slow: "
                        } else {
                            b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
                        };
                        if s.write_all(head).await.is_err() {
                            continue;
                        }
                        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                            if s.write_all(b"a").await.is_err() || s.flush().await.is_err() {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                    }
                }
                renewals += 1;
            }
            renewals
        }));
    }
    // Let the attackers fill the cap.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ca = reqwest::Certificate::from_pem(&std::fs::read(archer.certs.join("ca.crt")).expect("ca")).expect("pem");
    let fresh_each = reqwest::Client::builder().add_root_certificate(ca.clone()).pool_max_idle_per_host(0).timeout(Duration::from_secs(5)).build().expect("client");
    let kept_alive = reqwest::Client::builder().add_root_certificate(ca).timeout(Duration::from_secs(5)).build().expect("client");
    let body = serde_json::to_vec(&review("CREATE", &pod("normal", &["169.254.169.254/x:1"]))).expect("json");
    let mut answered = 0;
    let started = Instant::now();
    for i in 0..40 {
        let client = if i % 2 == 0 { &fresh_each } else { &kept_alive };
        let r = client.post(format!("{}/mutate", archer.https)).header("content-type", "application/json").body(body.clone()).send().await;
        let r = r.unwrap_or_else(|e| panic!("review {i} after {:?} was not answered: {e}", started.elapsed()));
        assert_eq!(r.status(), 200, "review {i}");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["response"]["allowed"], true);
        answered += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut renewals = 0;
    for a in attackers {
        renewals += a.await.expect("attacker");
    }
    let displaced: f64 = archer.metrics().await.lines().filter(|l| l.starts_with("archer_connections_displaced_total{")).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum();
    eprintln!("{answered} reviews answered in {:?} while {} stalled clients renewed {renewals} times; {displaced} connections displaced", started.elapsed(), 2 * CAP);
    assert_eq!(answered, 40);
    assert!(renewals >= 2 * CAP * 2, "the attackers kept renewing: {renewals}");
    assert!(displaced >= 2.0 * CAP as f64, "the cap stayed full and new connections displaced stalled ones: {displaced}");
    assert_eq!(archer.metric("archer_panics_total{route=\"/mutate\"}").await, 0.0);
}

async fn tls_connect_to(addr: &str, certs: &std::path::Path) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let ca = std::fs::read(certs.join("ca.crt"))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert.map_err(std::io::Error::other)?).map_err(std::io::Error::other)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await?;
    let name = rustls_pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await
}

/// The binary sets mimalloc's purge delay itself, so the memory bound holds without the
/// environment variable; when the variable is set it wins. Reading the option back after
/// `MIMALLOC_PURGE_DELAY=7` also proves `main.rs` names the right option.
#[tokio::test]
async fn the_binary_returns_freed_memory_at_once_unless_the_environment_says_otherwise() {
    for (env, want) in [(None, 0), (Some("7"), 7)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = make_certs(&dir.path().join("certs"));
        let archer = Archer::spawn_binary(std::path::Path::new(env!("CARGO_BIN_EXE_archer")), dir, certs, "", &["--log-format", "json"], env).ready().await;
        let log = archer.log_text();
        assert!(log.contains(&format!("\"purge_delay_ms\":{want}")), "MIMALLOC_PURGE_DELAY={env:?}: want {want}:\n{log}");
    }
}
