//! `cargo bench --bench aws_launch`: the AWS provider's launch path against moto's server (the
//! real EC2 API, on loopback): the time from a batch's plan (its claims written) to every
//! instance requested and answered, for batches of 10, 100 and 500 nodes launched as the worker
//! does (16 at a time), and the EC2 API calls per launched node, counted by a pass-through proxy
//! in front of moto. ARCHER_BENCH_AWS_SIZES picks the sizes (default 10,100,500).
//!
//! moto answers in a few milliseconds on this machine where EC2 takes hundreds (CreateFleet is
//! typically 1-3 s), so the times here are Archer's own overhead plus moto's, a floor; the calls
//! per node are what the real API would see.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use archer::catalog::Catalog;
use archer::provisioner::cloud::aws::nodeclass::EC2NodeClass;
use archer::provisioner::cloud::aws::Aws;
use archer::provisioner::cloud::CloudProvider;
use archer::provisioner::nodeclaim::NodeClaim;
use common::moto::Moto;
use futures::StreamExt;

/// As the worker launches.
const IN_FLIGHT: usize = 16;

/// Per action: requests, and seconds moto took to answer them.
type Counts = Arc<Mutex<BTreeMap<String, (usize, f64)>>>;

/// A proxy that forwards to moto and counts each request's `Action` and moto's time on it.
async fn counting_proxy(upstream: String, counts: Counts) -> String {
    use axum::body::Bytes;
    let http = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |method: http::Method, uri: http::Uri, headers: http::HeaderMap, body: Bytes| {
        let (http, upstream, counts) = (http.clone(), upstream.clone(), counts.clone());
        async move {
            let text = String::from_utf8_lossy(&body);
            let action = text.split('&').find_map(|kv| kv.strip_prefix("Action=")).unwrap_or("other").to_string();
            let started = Instant::now();
            let answer = common::moto::forward(&http, &upstream, method, &uri, &headers, body).await;
            let mut c = counts.lock().expect("counts");
            let e = c.entry(action).or_default();
            e.0 += 1;
            e.1 += started.elapsed().as_secs_f64();
            answer
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn claim(i: usize, batch: usize) -> NodeClaim {
    let (t, arch) = if i.is_multiple_of(2) { ("m6g.large", "arm64") } else { ("m6i.large", "amd64") };
    let zone = ["us-east-1a", "us-east-1b", "us-east-1c"][i % 3];
    serde_json::from_value(serde_json::json!({
        "apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim",
        "metadata": {"name": format!("bench-{batch}-{i}"), "creationTimestamp": k8s_openapi::jiff::Timestamp::now().to_string()},
        "spec": {"nodePool": "bench", "instanceType": t, "zone": zone, "capacityType": "on-demand", "arch": arch, "os": "linux",
                 "labels": {"kubernetes.io/arch": arch}, "pricePerHour": 0.08,
                 "nodeClassRef": {"group": "archer.dev", "kind": "EC2NodeClass", "name": "bench"}}
    }))
    .expect("claim")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sizes: Vec<usize> = std::env::var("ARCHER_BENCH_AWS_SIZES").ok().map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect()).unwrap_or_else(|| vec![10, 100, 500]);
    println!("{:>6} {:>10} {:>10} {:>12}  calls per node (and moto's mean answer time)", "nodes", "seconds", "nodes/s", "calls/node");
    for (batch, n) in sizes.into_iter().enumerate() {
        let moto = Moto::start().await;
        moto.network().await;
        let counts: Counts = Arc::default();
        let mut settings = moto.settings();
        settings.endpoint = Some(counting_proxy(moto.endpoint.clone(), counts.clone()).await);
        let sdk = archer::provisioner::cloud::aws::sdk_config(&settings).await;
        let aws = Aws::new(&sdk, Arc::new(Catalog::embedded().expect("catalog")), settings).await.expect("provider");
        let nc: EC2NodeClass = archer::yaml::from_str(
            "apiVersion: archer.dev/v1alpha1\nkind: EC2NodeClass\nmetadata: {name: bench}\nspec:\n  instanceProfile: Node\n  amiSelectorTerms: [{alias: al2023@latest}]\n  subnetSelectorTerms: [{tags: {karpenter.sh/discovery: archer-test}}]\n  securityGroupSelectorTerms: [{tags: {karpenter.sh/discovery: archer-test}}]\n",
        )
        .expect("node class");
        aws.use_class(&nc).await;
        counts.lock().expect("counts").clear();
        let claims: Vec<NodeClaim> = (0..n).map(|i| claim(i, batch)).collect();
        let t0 = Instant::now();
        let results: Vec<_> = futures::stream::iter(claims.iter().map(|c| aws.create(c))).buffer_unordered(IN_FLIGHT).collect().await;
        let elapsed = t0.elapsed().as_secs_f64();
        let failed = results.iter().filter(|r| r.is_err()).count();
        assert_eq!(failed, 0, "launches failed: {:?}", results.iter().find_map(|r| r.as_ref().err().map(|e| e.to_string())));
        let counts = counts.lock().expect("counts").clone();
        let total: usize = counts.values().map(|c| c.0).sum();
        let per: Vec<String> = counts.iter().map(|(a, c)| format!("{a} {:.2} ({:.0} ms each in moto)", c.0 as f64 / n as f64, 1000.0 * c.1 / c.0.max(1) as f64)).collect();
        println!("{n:>6} {elapsed:>10.2} {:>10.1} {:>12.2}  {}", n as f64 / elapsed, total as f64 / n as f64, per.join(", "));
    }
}
