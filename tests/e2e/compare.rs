//! Archer against Karpenter on the same control plane (issues #29, #45,
//! `tests/e2e/karpenter-compare`): every workload in each mode, each on a fresh control plane:
//! Karpenter alone, Karpenter with Archer's webhook and extender (Archer's provisioner off),
//! Archer alone. Both provisioners see the same instance types, zones and prices (Archer's
//! catalog, [`crate::karpenter::instance_types`]), the same NodePool ([`suites::NodePoolShape`]:
//! `--pool all` or Karpenter's `getting-started`, and Karpenter's perf-suite pool for its
//! suites), and the same batching clocks (1 s idle, 3 s at most).
//!
//! The workloads are the comparison's own (perf, mixed, consolidation) and Karpenter's
//! performance suites ([`suites`]), each row beside Karpenter's own thresholds for its suite.
//! Writes `target/karpenter-compare/summary-<pool>.json` (`{"karpenterVersion", "pool",
//! "workloads": {name: {mode: report}}}`; `summary.json` is the last run's) and prints the
//! README's table.

mod measure;
mod suites;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use archer::catalog::Catalog;
use archer::provisioner::nodepool::NodePool;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{Mode, ARCHER_USER};
use crate::karpenter;
use crate::provisioning::{price, scale, with_requests};
use measure::{Sampler, Usage};
use suites::{Limits, NodePoolShape, PoolKind, Then, Threshold, Workload};

/// One phase as Karpenter's suites report it.
#[derive(Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Phase {
    seconds: f64,
    cpu_utilisation: f64,
    memory_utilisation: f64,
    #[serde(flatten)]
    usage: Usage,
}

/// What one mode did on one workload (the JSON's contract).
#[derive(Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ModeReport {
    seconds_to_running: f64,
    nodes: usize,
    cost_per_hour: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost_per_hour_after_consolidation: Option<f64>,
    /// After a scale-down or a drift: seconds from it until the node set last changed (it then
    /// held still for the settling window with every pod Running).
    #[serde(skip_serializing_if = "Option::is_none")]
    seconds_to_stable: Option<f64>,
    evictions: usize,
    claims_created: usize,
    claims_kept: usize,
    wrong_arch_pods: usize,
    #[serde(rename = "peakRssMiB")]
    peak_rss_mib: f64,
    /// The controllers' CPU seconds over the whole run.
    cpu_seconds: f64,
    scale_out: Phase,
    /// The scale-down's consolidation or the drift, to stable.
    #[serde(skip_serializing_if = "Option::is_none")]
    then: Option<Phase>,
    /// Writes each controller made (the API server's count), and per pod placed.
    api_writes: BTreeMap<String, f64>,
    api_writes_per_pod: f64,
    /// Karpenter's thresholds this run missed (empty: within them, or no suite).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    outside_thresholds: Vec<String>,
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
/// cycle on the comparison's clocks (5 s consolidateAfter, a 10 s pass, 15 s validation)...
const SETTLED: Duration = Duration::from_secs(60);
/// ...and on the suites' (30 s consolidateAfter).
const SUITE_SETTLED: Duration = Duration::from_secs(90);

/// Wait until the node set has held still for `settle` with `running` pods Running, noting
/// every pod uid and claim seen on the way (`seen`); at most `patience`. Returns when the node
/// set last changed.
async fn hold_still(client: &Client, mode: Mode, running_pods: usize, seen: (&mut BTreeSet<String>, &mut BTreeSet<String>), settle: Duration, patience: Duration, what: &str) -> Instant {
    let (uids, claims) = seen;
    let start = Instant::now();
    let mut last: (BTreeSet<String>, Instant) = (BTreeSet::new(), Instant::now());
    let mut first = true;
    loop {
        let live: BTreeSet<String> = live_nodes(client).await.into_iter().filter_map(|n| n.metadata.name).collect();
        let now = pods(client).await;
        uids.extend(now.iter().filter_map(|p| p.metadata.uid.clone()));
        claims.extend(claim_names(client, mode).await);
        let up = now.iter().filter(|p| running(p)).count();
        if live != last.0 {
            // The first look is the starting set, not a change.
            last = (live, if first { start } else { Instant::now() });
        } else if up == running_pods && last.1.elapsed() > settle {
            return last.1;
        }
        first = false;
        assert!(start.elapsed() < patience, "{what}: not settled after {patience:?} ({up} of {running_pods} Running)");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn pool_api(client: &Client, mode: Mode) -> Api<DynamicObject> {
    let r = match mode {
        Mode::Archer => ApiResource { group: "archer.dev".into(), version: "v1alpha1".into(), api_version: "archer.dev/v1alpha1".into(), kind: "NodePool".into(), plural: "archernodepools".into() },
        Mode::Karpenter | Mode::KarpenterWithArcher => ApiResource { group: "karpenter.sh".into(), version: "v1".into(), api_version: "karpenter.sh/v1".into(), kind: "NodePool".into(), plural: "nodepools".into() },
    };
    Api::all_with(client.clone(), &r)
}

/// What a phase missed of Karpenter's limits.
fn outside(which: &str, limits: &Limits, p: &Phase) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(s) = limits.seconds {
        if p.seconds >= s {
            out.push(format!("{which}: {:.0} s >= {s:.0} s", p.seconds));
        }
    }
    if let Some(c) = limits.cpu_utilisation {
        if p.cpu_utilisation <= c {
            out.push(format!("{which}: cpu utilisation {:.2} <= {c:.2}", p.cpu_utilisation));
        }
    }
    if let Some(m) = limits.memory_utilisation {
        if p.memory_utilisation <= m {
            out.push(format!("{which}: memory utilisation {:.2} <= {m:.2}", p.memory_utilisation));
        }
    }
    if p.usage.p95_memory_mib >= limits.p95_memory_mib {
        out.push(format!("{which}: P95 memory {:.0} MiB >= {:.0}", p.usage.p95_memory_mib, limits.p95_memory_mib));
    }
    if p.usage.average_cores >= limits.average_cores {
        out.push(format!("{which}: {:.2} cores >= {:.2}", p.usage.average_cores, limits.average_cores));
    }
    out
}

/// Run `w` in `mode` on `kind`'s NodePool, on a fresh control plane.
async fn run(w: &Workload, mode: Mode, kind: PoolKind, patience: Duration) -> ModeReport {
    // Archer's consolidation on Karpenter's clocks: a disruption pass every 10 s (its polling
    // period), a decision re-validated after 15 s (its command validation delay); nodes younger
    // than 5 s left alone. Batching is 1 s idle, 3 s at most for both (Archer:
    // batchIdleSeconds/batchMaxSeconds; Karpenter: BATCH_IDLE_DURATION/BATCH_MAX_DURATION).
    let clocks = vec!["disruptionIntervalSeconds: 10".into(), "consolidationValidationSeconds: 15".into(), "disruptionGraceSeconds: 5".into()];
    let shape = NodePoolShape { kind, suite: w.suite_pool };
    let setup = karpenter::Setup { pool: shape.karpenter(), keep: shape.keep(), flow_control: true };
    let settle = if w.suite_pool { SUITE_SETTLED } else { SETTLED };
    let (c, karpenter_pid) = karpenter::cluster(&format!("compare-{}-{}-{}", kind.name(), w.name, mode.name().replace('+', "-")), mode, clocks, &setup).await;
    let client = c.client().await;
    if mode == Mode::Archer {
        let p: NodePool = serde_json::from_value(shape.archer()).expect("Archer's pool");
        Api::<NodePool>::all(client.clone()).create(&PostParams::default(), &p).await.expect("create Archer's pool");
    }
    let mut controllers: Vec<&str> = Vec::new();
    if c.archer_pid().is_some() {
        measure::count_writes(&client, "archer", ARCHER_USER, false).await;
        controllers.push("archer");
    }
    if karpenter_pid.is_some() {
        measure::count_writes(&client, "karpenter", karpenter::USER, true).await;
        controllers.push("karpenter");
    }
    let pids: Vec<u32> = karpenter_pid.into_iter().chain(c.archer_pid()).collect();
    let sampler = Sampler::start(pids.clone());
    let cpu0 = usage(&pids).1;
    let writes0 = measure::writes(&c.apiserver, &controllers).await;
    crate::namespace(&client, "bench", json!({})).await;
    let mut platforms: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (repo, archs) in w.apps.iter().map(|a| (a.repo, a.archs)).collect::<BTreeMap<_, _>>() {
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
        let mut d = with_requests(crate::deployment(&a.name, &c.registry.image(&format!("{}:1", a.repo)), a.replicas, a.spec.clone()), a.cpu, a.memory);
        if let Some(meta) = d.spec.as_mut().and_then(|s| s.template.metadata.as_mut()) {
            meta.annotations = serde_json::from_value(a.annotations.clone()).ok().filter(|m: &BTreeMap<String, String>| !m.is_empty());
        }
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
    let t_running = Instant::now();
    let catalog = Catalog::embedded().expect("catalog");
    let nodes = live_nodes(&client).await;
    let (cpu_util, mem_util) = measure::utilisation(&client).await;
    let mut r = ModeReport {
        seconds_to_running: (t_running - t0).as_secs_f64(),
        nodes: nodes.len(),
        cost_per_hour: nodes.iter().map(|n| price(&catalog, n)).sum(),
        wrong_arch_pods: karpenter::wrong_arch_pods(&client, "bench", &platforms).await.len(),
        scale_out: Phase { seconds: (t_running - t0).as_secs_f64(), cpu_utilisation: cpu_util, memory_utilisation: mem_util, usage: sampler.usage(t0, t_running) },
        ..Default::default()
    };
    if w.then != Then::Nothing {
        if w.suite_pool {
            // As Karpenter's suites do: the scale-down right after every pod is Running, the
            // drift 30 s after (drift_performance_test.go). A provisioner still consolidating the
            // scale-up does so inside the measured phase.
            if w.then == Then::Drift {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
        } else {
            // The comparison's own: what follows comes long after the scale-up, once the node set
            // has held still (what either side does meanwhile is counted too).
            hold_still(&client, mode, total as usize, (&mut uids, &mut claims_seen), settle, patience, &format!("{} in {}: after the scale-up", w.name, mode.name())).await;
        }
        let t1 = Instant::now();
        let mut protected: BTreeSet<String> = BTreeSet::new();
        let target: usize = match w.then {
            Then::ScaleDown => {
                let now = pods(&client).await;
                // Karpenter's do-not-disrupt suite: a node that holds such a pod stays.
                protected = now.iter().filter(|p| p.metadata.annotations.as_ref().is_some_and(|a| a.get("karpenter.sh/do-not-disrupt").is_some_and(|v| v == "true"))).filter_map(|p| p.spec.as_ref()?.node_name.clone()).collect();
                let costed = now.iter().filter(|p| p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("controller.kubernetes.io/pod-deletion-cost"))).count();
                for a in &w.apps {
                    scale(&client, "bench", &a.name, a.scale_to).await;
                }
                let target: usize = w.apps.iter().map(|a| a.scale_to as usize).sum();
                // What the scale-down alone did: nodes it left with no pod of the workload.
                while pods(&client).await.len() > target && t1.elapsed() < Duration::from_secs(30) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                let used: BTreeSet<String> = pods(&client).await.iter().filter_map(|p| p.spec.as_ref()?.node_name.clone()).collect();
                let nodes = live_nodes(&client).await;
                let emptied = nodes.iter().filter(|n| n.metadata.name.as_ref().is_some_and(|name| !used.contains(name))).count();
                eprintln!("compare: {} in {}: {costed} of {} pods carried a deletion cost; the scale-down left {emptied} of {} nodes empty", w.name, mode.name(), now.len(), nodes.len());
                target
            }
            Then::Drift | Then::Nothing => {
                // Every node drifts: the pool's template gains an annotation, as Karpenter's drift
                // suite does. Done when every pod is Running on a node made after the change.
                let old: BTreeSet<String> = live_nodes(&client).await.into_iter().filter_map(|n| n.metadata.name).collect();
                let trigger = json!({"spec": {"template": {"metadata": {"annotations": {"test-drift-trigger": format!("drift-{}", std::process::id())}}}}});
                pool_api(&client, mode).patch("default", &PatchParams::default(), &Patch::Merge(trigger)).await.expect("drift the NodePool");
                loop {
                    let now = pods(&client).await;
                    uids.extend(now.iter().filter_map(|p| p.metadata.uid.clone()));
                    claims_seen.extend(claim_names(&client, mode).await);
                    let replaced = now.iter().filter(|p| running(p) && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some_and(|n| !old.contains(n))).count();
                    if replaced == total as usize {
                        break;
                    }
                    assert!(t1.elapsed() < patience, "{} in {}: {replaced} of {total} pods Running on replaced nodes after {patience:?}", w.name, mode.name());
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                eprintln!("compare: {} in {}: every pod Running on replaced nodes after {:.1} s", w.name, mode.name(), t1.elapsed().as_secs_f64());
                total as usize
            }
        };
        let changed = hold_still(&client, mode, target, (&mut uids, &mut claims_seen), settle, patience, &format!("{} in {}: after the {}", w.name, mode.name(), if w.then == Then::Drift { "drift" } else { "scale-down" })).await;
        let stable = changed.max(t1);
        let nodes = live_nodes(&client).await;
        let kept = nodes.iter().filter(|n| n.metadata.name.as_ref().is_some_and(|name| protected.contains(name))).count();
        if !protected.is_empty() && kept == 0 {
            r.outside_thresholds.push(format!("none of the {} nodes with a do-not-disrupt pod is left", protected.len()));
        }
        r.cost_per_hour_after_consolidation = Some(nodes.iter().map(|n| price(&catalog, n)).sum());
        r.seconds_to_stable = Some((stable - t1).as_secs_f64());
        r.wrong_arch_pods = r.wrong_arch_pods.max(karpenter::wrong_arch_pods(&client, "bench", &platforms).await.len());
        let (cpu_util, mem_util) = measure::utilisation(&client).await;
        r.then = Some(Phase { seconds: (stable - t1).as_secs_f64(), cpu_utilisation: cpu_util, memory_utilisation: mem_util, usage: sampler.usage(t1, stable) });
    }
    // A scale-down deletes pods without making new ones: every uid beyond the replicas is a pod
    // made again after an eviction (or a disruption's drain).
    r.evictions = uids.len().saturating_sub(total as usize);
    r.claims_created = claims_seen.len();
    r.claims_kept = claim_names(&client, mode).await.len();
    let writes = measure::writes(&c.apiserver, &controllers).await;
    r.api_writes = writes.iter().map(|(k, v)| (k.clone(), v - writes0.get(k).copied().unwrap_or(0.0))).collect();
    r.api_writes_per_pod = r.api_writes.values().sum::<f64>() / uids.len().max(1) as f64;
    let (rss, cpu) = usage(&pids);
    r.peak_rss_mib = rss;
    r.cpu_seconds = cpu - cpu0;
    if let Some(t) = &w.threshold {
        r.outside_thresholds.extend(outside("scale-out", &t.out, &r.scale_out));
        if let (Some(limits), Some(p)) = (&t.then, &r.then) {
            r.outside_thresholds.extend(outside(if w.then == Then::Drift { "drift" } else { "consolidation" }, limits, p));
        }
    }
    eprintln!("compare: {} in {}: {r:?}", w.name, mode.name());
    r
}

/// Karpenter's limits as a table cell.
fn threshold_cell(t: Option<&Threshold>) -> String {
    let Some(t) = t else { return "-".into() };
    let one = |l: &Limits| {
        let mut parts = Vec::new();
        if let Some(s) = l.seconds {
            parts.push(format!("<{:.0}m", s / 60.0));
        }
        if let (Some(c), Some(m)) = (l.cpu_utilisation, l.memory_utilisation) {
            parts.push(format!("util >{c:.2}/{m:.2}"));
        }
        parts.push(format!("<{:.0} MB", l.p95_memory_mib));
        parts.push(format!("<{:.2} cores", l.average_cores));
        parts.join(", ")
    };
    match &t.then {
        Some(then) => format!("{}: {}; then {}", t.suite, one(&t.out), one(then)),
        None => format!("{}: {}", t.suite, one(&t.out)),
    }
}

/// The comparison (`tests/e2e/karpenter-compare [--pool all|getting-started]`, which sets
/// ARCHER_COMPARE_POOL; ARCHER_COMPARE_PODS scales every workload from its 1,000-pod size,
/// ARCHER_COMPARE_WORKLOADS and ARCHER_COMPARE_MODES, comma-separated, run fewer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run tests/e2e/karpenter-compare"]
async fn compare() {
    let pods: f64 = std::env::var("ARCHER_COMPARE_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000.0);
    let kind = std::env::var("ARCHER_COMPARE_POOL").ok().map_or(PoolKind::All, |p| PoolKind::parse(&p).unwrap_or_else(|| panic!("ARCHER_COMPARE_POOL={p}: all or getting-started")));
    let only = |var: &str| std::env::var(var).ok().map(|v| v.split(',').map(str::to_string).collect::<BTreeSet<_>>());
    let (which, modes) = (only("ARCHER_COMPARE_WORKLOADS"), only("ARCHER_COMPARE_MODES"));
    let workloads = suites::workloads(pods / 1000.0);
    let mut out: BTreeMap<&str, BTreeMap<&str, ModeReport>> = BTreeMap::new();
    for w in workloads.iter().filter(|w| which.as_ref().is_none_or(|s| s.contains(w.name))) {
        for mode in [Mode::Karpenter, Mode::KarpenterWithArcher, Mode::Archer].into_iter().filter(|m| modes.as_ref().is_none_or(|s| s.contains(m.name()))) {
            let r = run(w, mode, kind, Duration::from_secs(3000)).await;
            out.entry(w.name).or_default().insert(mode.name(), r);
        }
    }
    let thresholds: BTreeMap<&str, Option<Threshold>> = workloads.iter().map(|w| (w.name, w.threshold)).collect();
    let summary = json!({"karpenterVersion": karpenter::VERSION, "pool": kind.name(), "thresholds": thresholds, "workloads": out});
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/karpenter-compare");
    std::fs::create_dir_all(&dir).expect("output dir");
    let text = serde_json::to_string_pretty(&summary).expect("json");
    std::fs::write(dir.join("summary.json"), &text).expect("summary.json");
    std::fs::write(dir.join(format!("summary-{}.json", kind.name())), &text).expect("summary-<pool>.json");
    println!("NodePool `{}`", kind.name());
    println!("| workload | mode | s to Running | nodes | $/h | $/h after | s to stable | evictions | wrong-arch pods | cores out / then | P95 MiB out / then | CPU s | API writes / pod | Karpenter's threshold | outside it |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (w, modes) in &out {
        for (m, r) in modes {
            let after = r.cost_per_hour_after_consolidation.map_or("-".to_string(), |c| format!("{c:.2}"));
            let stable = r.seconds_to_stable.map_or("-".to_string(), |s| format!("{s:.0}"));
            let then = |f: fn(&Phase) -> String| r.then.as_ref().map_or("-".to_string(), f);
            let cores = format!("{:.2} / {}", r.scale_out.usage.average_cores, then(|p| format!("{:.2}", p.usage.average_cores)));
            let mem = format!("{:.0} / {}", r.scale_out.usage.p95_memory_mib, then(|p| format!("{:.0}", p.usage.p95_memory_mib)));
            let miss = if r.outside_thresholds.is_empty() { "-".to_string() } else { r.outside_thresholds.join("; ") };
            println!(
                "| {w} | {m} | {:.1} | {} | {:.2} | {after} | {stable} | {} | {} | {cores} | {mem} | {:.1} | {:.2} | {} | {miss} |",
                r.seconds_to_running,
                r.nodes,
                r.cost_per_hour,
                r.evictions,
                r.wrong_arch_pods,
                r.cpu_seconds,
                r.api_writes_per_pod,
                threshold_cell(thresholds.get(w).copied().flatten().as_ref())
            );
        }
    }
}
