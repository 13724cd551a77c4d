//! Archer against Karpenter on the same control plane (issue #29, `tests/e2e/karpenter-compare`):
//! every workload in three modes, each on a fresh control plane: Karpenter alone, Karpenter with
//! Archer's webhook and extender (Archer's provisioner off), Archer alone. Both provisioners see
//! the same instance types, zones and prices (Archer's catalog, [`crate::karpenter::instance_types`]),
//! an equivalent NodePool, and the same batching clocks (1 s idle, 3 s at most).
//!
//! Writes `target/karpenter-compare/summary.json` (`{"karpenterVersion", "workloads": {name:
//! {mode: report}}}`) and prints the docs' table ("Benchmarks").

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use archer::catalog::Catalog;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::Mode;
use crate::karpenter;
use crate::provisioning::{pool, price, scale, with_requests, DEFAULT_POOL};

/// What one mode did on one workload (the JSON's contract).
#[derive(Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ModeReport {
    seconds_to_running: f64,
    nodes: usize,
    cost_per_hour: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost_per_hour_after_consolidation: Option<f64>,
    evictions: usize,
    claims_created: usize,
    claims_kept: usize,
    wrong_arch_pods: usize,
    #[serde(rename = "peakRssMiB")]
    peak_rss_mib: f64,
    cpu_seconds: f64,
}

/// A Deployment of a workload: name, image repository and its architectures, replicas,
/// requests, extra pod spec.
struct App {
    name: &'static str,
    repo: &'static str,
    archs: &'static [&'static str],
    replicas: i32,
    cpu: &'static str,
    memory: &'static str,
    spec: serde_json::Value,
}

struct Workload {
    name: &'static str,
    apps: Vec<App>,
    /// Scale every Deployment to this fraction afterwards and wait for the node set to settle.
    scale_down_to: Option<f64>,
}

fn workloads(pods: i32) -> Vec<Workload> {
    let half = pods / 2;
    let perf = |name: &'static str, scale_down_to| Workload {
        name,
        apps: vec![
            App { name: "small", repo: "apps/perf", archs: &["amd64", "arm64"], replicas: half, cpu: "900m", memory: "3100Mi", spec: json!({}) },
            App { name: "large", repo: "apps/perf", archs: &["amd64", "arm64"], replicas: half, cpu: "3500m", memory: "28Gi", spec: json!({}) },
        ],
        scale_down_to,
    };
    let spread = |app: &str| json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": app}}}]});
    let anti = |app: &str| json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": app}}}]}}});
    let mixed = Workload {
        name: "mixed",
        apps: vec![
            App { name: "web", repo: "apps/web", archs: &["amd64", "arm64"], replicas: 30, cpu: "500m", memory: "1Gi", spec: spread("web") },
            App { name: "legacy", repo: "apps/legacy", archs: &["amd64"], replicas: 20, cpu: "1", memory: "2Gi", spec: json!({}) },
            App { name: "ml", repo: "apps/ml", archs: &["arm64"], replicas: 10, cpu: "2", memory: "4Gi", spec: json!({}) },
            App { name: "db", repo: "apps/db", archs: &["amd64"], replicas: 3, cpu: "1", memory: "4Gi", spec: anti("db") },
            App { name: "cache", repo: "apps/cache", archs: &["amd64", "arm64"], replicas: 6, cpu: "250m", memory: "512Mi", spec: spread("cache") },
        ],
        scale_down_to: None,
    };
    vec![perf("perf", None), mixed, perf("consolidation", Some(0.7))]
}

fn running(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none() && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

async fn pods(client: &Client) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), "bench").list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default()
}

/// The names of the provisioner's NodeClaims now.
async fn claim_names(client: &Client, mode: Mode) -> BTreeSet<String> {
    match mode {
        Mode::Archer => crate::provisioning::claims(client).await.into_iter().filter_map(|c| c.metadata.name).collect(),
        Mode::Karpenter | Mode::KarpenterWithArcher => karpenter::claims(client).await.into_iter().filter_map(|c| c.metadata.name).collect(),
    }
}

/// Live nodes either provisioner launched (both label theirs with `karpenter.sh/nodepool`).
async fn live_nodes(client: &Client) -> Vec<k8s_openapi::api::core::v1::Node> {
    karpenter::nodes(client).await.into_iter().filter(|n| n.metadata.deletion_timestamp.is_none()).collect()
}

/// The controllers' peak RSS (MiB, summed) and CPU seconds (summed) so far.
fn usage(pids: &[u32]) -> (f64, f64) {
    pids.iter().map(|&p| crate::scale::usage(p)).fold((0.0, 0.0), |(m, c), (rss, cpu)| (m + rss as f64 / (1024.0 * 1024.0), c + cpu))
}

/// How long the node set must hold still to count as settled: longer than one consolidation
/// cycle on Karpenter's clocks (5 s consolidateAfter, a 10 s pass, 15 s validation).
const SETTLED: Duration = Duration::from_secs(60);

/// Wait until the node set has held still for [`SETTLED`] with `running` pods Running, noting
/// every pod uid and claim seen on the way (`seen`); at most `patience`.
async fn hold_still(client: &Client, mode: Mode, running_pods: usize, seen: (&mut BTreeSet<String>, &mut BTreeSet<String>), patience: Duration, what: &str) {
    let (uids, claims) = seen;
    let start = Instant::now();
    let mut last: (BTreeSet<String>, Instant) = (BTreeSet::new(), Instant::now());
    loop {
        let live: BTreeSet<String> = live_nodes(client).await.into_iter().filter_map(|n| n.metadata.name).collect();
        let now = pods(client).await;
        uids.extend(now.iter().filter_map(|p| p.metadata.uid.clone()));
        claims.extend(claim_names(client, mode).await);
        let up = now.iter().filter(|p| running(p)).count();
        if live != last.0 {
            last = (live, Instant::now());
        } else if up == running_pods && last.1.elapsed() > SETTLED {
            return;
        }
        assert!(start.elapsed() < patience, "{what}: not settled after {patience:?} ({up} of {running_pods} Running)");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Run `w` in `mode` on a fresh control plane.
async fn run(w: &Workload, mode: Mode, patience: Duration) -> ModeReport {
    // Archer's consolidation on Karpenter's clocks: a disruption pass every 10 s (its polling
    // period), a decision re-validated after 15 s (its command validation delay); nodes younger
    // than consolidateAfter (5 s) left alone. Batching is 1 s idle, 3 s at most for both
    // (Archer: batchIdleSeconds/batchMaxSeconds; Karpenter: BATCH_IDLE_DURATION/BATCH_MAX_DURATION).
    let clocks = vec!["disruptionIntervalSeconds: 10".into(), "consolidationValidationSeconds: 15".into(), "disruptionGraceSeconds: 5".into()];
    let (c, karpenter_pid) = karpenter::cluster(&format!("compare-{}-{}", w.name, mode.name().replace('+', "-")), mode, clocks).await;
    let client = c.client().await;
    if mode == Mode::Archer {
        pool(&client, DEFAULT_POOL).await;
    }
    let pids: Vec<u32> = karpenter_pid.into_iter().chain(c.archer_pid()).collect();
    let cpu0 = usage(&pids).1;
    crate::namespace(&client, "bench", json!({})).await;
    let mut platforms: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for repo in w.apps.iter().map(|a| (a.repo, a.archs)).collect::<BTreeMap<_, _>>() {
        let (repo, archs) = repo;
        let list: Vec<String> = archs.iter().map(|a| format!("linux/{a}")).collect();
        if archs.len() == 1 {
            c.registry.push_image(repo, "1", &list[0], true).await;
        } else {
            c.registry.push_index(repo, "1", &list.iter().map(String::as_str).collect::<Vec<_>>(), true, false).await;
        }
        platforms.insert(c.registry.image(&format!("{repo}:1")), archs.to_vec());
    }
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "bench");
    let total: i32 = w.apps.iter().map(|a| a.replicas).sum();
    let t0 = Instant::now();
    for a in &w.apps {
        let d = with_requests(crate::deployment(a.name, &c.registry.image(&format!("{}:1", a.repo)), a.replicas, a.spec.clone()), a.cpu, a.memory);
        deploys.create(&PostParams::default(), &d).await.expect("create");
    }
    let (mut uids, mut claims_seen) = (BTreeSet::new(), BTreeSet::new());
    loop {
        let now = pods(&client).await;
        uids.extend(now.iter().filter_map(|p| p.metadata.uid.clone()));
        claims_seen.extend(claim_names(&client, mode).await);
        if now.iter().filter(|p| running(p)).count() == total as usize {
            break;
        }
        assert!(t0.elapsed() < patience, "{} in {}: {} of {total} pods Running after {patience:?}", w.name, mode.name(), now.iter().filter(|p| running(p)).count());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let catalog = Catalog::embedded().expect("catalog");
    let nodes = live_nodes(&client).await;
    let mut r = ModeReport {
        seconds_to_running: t0.elapsed().as_secs_f64(),
        nodes: nodes.len(),
        cost_per_hour: nodes.iter().map(|n| price(&catalog, n)).sum(),
        wrong_arch_pods: karpenter::wrong_arch_pods(&client, "bench", &platforms).await.len(),
        ..Default::default()
    };
    if let Some(fraction) = w.scale_down_to {
        // A scale-down comes long after the scale-up: it starts once the node set has held still
        // for SETTLED (what either side does meanwhile is counted too).
        hold_still(&client, mode, total as usize, (&mut uids, &mut claims_seen), patience, &format!("{} in {}: after the scale-up", w.name, mode.name())).await;
        let now = pods(&client).await;
        let costed = now.iter().filter(|p| p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("controller.kubernetes.io/pod-deletion-cost"))).count();
        for a in &w.apps {
            scale(&client, "bench", a.name, (f64::from(a.replicas) * fraction).round() as i32).await;
        }
        let target: usize = w.apps.iter().map(|a| (f64::from(a.replicas) * fraction).round() as usize).sum();
        // What the scale-down alone did: nodes it left with no pod of the workload.
        let t = Instant::now();
        while pods(&client).await.len() > target && t.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let used: BTreeSet<String> = pods(&client).await.iter().filter_map(|p| p.spec.as_ref()?.node_name.clone()).collect();
        let nodes = live_nodes(&client).await;
        let emptied = nodes.iter().filter(|n| n.metadata.name.as_ref().is_some_and(|name| !used.contains(name))).count();
        eprintln!("compare: {} in {}: {costed} of {} pods carried a deletion cost; the scale-down left {emptied} of {} nodes empty", w.name, mode.name(), now.len(), nodes.len());
        hold_still(&client, mode, target, (&mut uids, &mut claims_seen), patience, &format!("{} in {}: after the scale-down", w.name, mode.name())).await;
        let nodes = live_nodes(&client).await;
        r.cost_per_hour_after_consolidation = Some(nodes.iter().map(|n| price(&catalog, n)).sum());
        r.wrong_arch_pods = r.wrong_arch_pods.max(karpenter::wrong_arch_pods(&client, "bench", &platforms).await.len());
    }
    // A scale-down deletes pods without making new ones: every uid beyond the replicas is a pod
    // made again after an eviction (or a disruption's drain).
    r.evictions = uids.len().saturating_sub(total as usize);
    r.claims_created = claims_seen.len();
    r.claims_kept = claim_names(&client, mode).await.len();
    let (rss, cpu) = usage(&pids);
    r.peak_rss_mib = rss;
    r.cpu_seconds = cpu - cpu0;
    eprintln!("compare: {} in {}: {r:?}", w.name, mode.name());
    r
}

/// The comparison (`tests/e2e/karpenter-compare`; ARCHER_COMPARE_PODS for the perf-suite size,
/// ARCHER_COMPARE_WORKLOADS and ARCHER_COMPARE_MODES, comma-separated, to run fewer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run tests/e2e/karpenter-compare"]
async fn compare() {
    let pods = std::env::var("ARCHER_COMPARE_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let only = |var: &str| std::env::var(var).ok().map(|v| v.split(',').map(str::to_string).collect::<BTreeSet<_>>());
    let (which, modes) = (only("ARCHER_COMPARE_WORKLOADS"), only("ARCHER_COMPARE_MODES"));
    let mut out: BTreeMap<&str, BTreeMap<&str, ModeReport>> = BTreeMap::new();
    for w in workloads(pods).iter().filter(|w| which.as_ref().is_none_or(|s| s.contains(w.name))) {
        for mode in [Mode::Karpenter, Mode::KarpenterWithArcher, Mode::Archer].into_iter().filter(|m| modes.as_ref().is_none_or(|s| s.contains(m.name()))) {
            let r = run(w, mode, Duration::from_secs(1200)).await;
            out.entry(w.name).or_default().insert(mode.name(), r);
        }
    }
    let summary = json!({"karpenterVersion": karpenter::VERSION, "workloads": out});
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/karpenter-compare");
    std::fs::create_dir_all(&dir).expect("output dir");
    std::fs::write(dir.join("summary.json"), serde_json::to_string_pretty(&summary).expect("json")).expect("summary.json");
    println!("| workload | mode | s to Running | nodes | $/h | $/h after consolidation | evictions | claims created / kept | wrong-arch pods | peak RSS MiB | CPU s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (w, modes) in &out {
        for (m, r) in modes {
            let after = r.cost_per_hour_after_consolidation.map_or("-".to_string(), |c| format!("{c:.2}"));
            println!("| {w} | {m} | {:.1} | {} | {:.2} | {after} | {} | {} / {} | {} | {:.0} | {:.1} |", r.seconds_to_running, r.nodes, r.cost_per_hour, r.evictions, r.claims_created, r.claims_kept, r.wrong_arch_pods, r.peak_rss_mib, r.cpu_seconds);
        }
    }
}
