//! `cargo bench --bench azure_launch`: the Azure provider's launch path against the local Azure
//! Resource Manager (tests/common/arm.rs, every request validated against the SDKs' schemas): the
//! time from a batch's claims to every NIC and VM made (long-running operations polled to the
//! end), for batches of 10, 100 and 500 nodes launched as the worker does (16 at a time), and the
//! ARM requests per node by operation (operation polls and token exchanges included).
//! ARCHER_BENCH_AZURE_SIZES picks the sizes (default 10,100,500).
//!
//! The local ARM answers in well under a millisecond and asks to be polled again at once, where
//! Azure takes tens of seconds to make a VM: the times are Archer's own overhead plus the
//! client's shortest poll interval (50 ms), a floor; the requests per node are what ARM would see.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use archer::catalog::Catalog;
use archer::provisioner::cloud::azure::Azure;
use archer::provisioner::cloud::CloudProvider;
use archer::provisioner::nodeclaim::NodeClaim;
use common::arm::ArmServer;
use futures::StreamExt;

/// As the worker launches.
const IN_FLIGHT: usize = 16;

fn claim(i: usize, batch: usize) -> NodeClaim {
    let (t, arch) = if i.is_multiple_of(2) { ("Standard_D2pls_v6", "arm64") } else { ("Standard_D2as_v6", "amd64") };
    serde_json::from_value(serde_json::json!({
        "apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim",
        "metadata": {"name": format!("bench-{batch}-{i}"), "creationTimestamp": k8s_openapi::jiff::Timestamp::now().to_string()},
        "spec": {"nodePool": "bench", "instanceType": t, "zone": format!("eastus-{}", 1 + i % 3), "capacityType": "on-demand", "arch": arch, "os": "linux",
                 "labels": {"kubernetes.io/arch": arch}, "pricePerHour": 0.08,
                 "nodeClassRef": {"group": "archer.dev", "kind": "AKSNodeClass", "name": "bench"}}
    }))
    .expect("claim")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sizes: Vec<usize> = std::env::var("ARCHER_BENCH_AZURE_SIZES").ok().map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect()).unwrap_or_else(|| vec![10, 100, 500]);
    println!("{:>6} {:>10} {:>10} {:>14}  requests per node", "nodes", "seconds", "nodes/s", "requests/node");
    for (batch, n) in sizes.into_iter().enumerate() {
        let arm = ArmServer::start().await;
        let kube = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().expect("url"))).expect("client");
        let azure = Azure::new(arm.settings(), Arc::new(Catalog::embedded().expect("catalog")), kube).expect("provider");
        let spec = serde_json::from_value(serde_json::json!({"imageFamily": "Ubuntu2204"})).expect("spec");
        assert!(azure.use_class("bench", &spec).await.resolved.ready());
        arm.state.received.lock().unwrap().clear();
        *arm.state.polls.lock().unwrap() = 0;
        *arm.state.tokens_issued.lock().unwrap() = 0;
        let claims: Vec<NodeClaim> = (0..n).map(|i| claim(i, batch)).collect();
        let t0 = Instant::now();
        let results: Vec<_> = futures::stream::iter(claims.iter().map(|c| azure.create(c))).buffer_unordered(IN_FLIGHT).collect().await;
        let elapsed = t0.elapsed().as_secs_f64();
        assert!(results.iter().all(Result::is_ok), "launches failed: {:?}", results.iter().find_map(|r| r.as_ref().err().map(|e| e.to_string())));
        assert!(arm.violations().is_empty(), "{:?}", arm.violations());
        let mut per: BTreeMap<String, usize> = BTreeMap::new();
        for r in arm.state.received.lock().unwrap().iter() {
            *per.entry(r.operation.clone()).or_default() += 1;
        }
        per.insert("operation polls".into(), *arm.state.polls.lock().unwrap());
        per.insert("token exchanges".into(), *arm.state.tokens_issued.lock().unwrap() as usize);
        let total: usize = per.values().sum();
        let text: Vec<String> = per.iter().filter(|(_, c)| **c > 0).map(|(op, c)| format!("{op} {:.2}", *c as f64 / n as f64)).collect();
        println!("{n:>6} {elapsed:>10.2} {:>10.1} {:>14.2}  {}", n as f64 / elapsed, total as f64 / n as f64, text.join(", "));
    }
}
