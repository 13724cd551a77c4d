//! `cargo bench --bench provisioner`: the planner's decision throughput, peak memory and cost
//! quality, on these workloads (select one with ARCHER_BENCH_WORKLOAD=optimality|catalog|karpenter|
//! preferences, default all):
//!
//! - catalog: batches of 100, 1,000 and 5,000 pending pods of mixed sizes and platforms against
//!   the full embedded AWS catalog, one NodePool allowing both architectures, three zones.
//! - karpenter: the shape of Karpenter's scheduling benchmark (kubernetes-sigs/karpenter,
//!   pkg/controllers/provisioning/scheduling/scheduling_benchmark_test.go): 400 synthetic types
//!   (type i: i+1 vCPU, 2(i+1) GiB, 10(i+1) pods, price 0.1/vCPU + 0.1/GB, on-demand in zones 1-3
//!   and spot in zones 1-2), N pods in five equal groups (no constraint; zone spread maxSkew 1
//!   DoNotSchedule; hostname spread maxSkew 1 DoNotSchedule; required zone affinity among pods
//!   labelled with one of 7 values; required hostname anti-affinity within the group), requests
//!   drawn with a fixed seed from cpu {100,250,500,1000,1500}m x memory {100,...,4096}Mi.
//! - preferences: Karpenter's `makePreferencePods` (4,000 pods preferring zone 1 and no sibling in
//!   their zone or on their node) on the same types, with the preference policy Respect and Ignore
//!   (Karpenter's BenchmarkRespectPreferences / BenchmarkIgnorePreferences).
//!
//! Pods are API objects with their real constraints, turned into planner input by the
//! provisioner's one adapter, and planned by `plan_batch_within` exactly as the worker does (the budget scaled to the batch): packed,
//! then every new-node placement checked by the scheduling model (spread counted over every
//! domain the pool offers, inter-pod affinity and anti-affinity, host ports, resources).
//!
//! Reported per batch: pods/s (pods / mean plan time), new nodes, cost ratio (plan price over the
//! packer's LP lower bound; the pods it leaves to the greedy pass, those with hostname rules, are
//! not in that bound, so the ratio overstates the gap on Karpenter's shape; `-` when the budget
//! ended before any bound), peak memory added while packing (VmHWM after a reset, minus VmRSS
//! before). ARCHER_BENCH_BUDGET_MS sets the packer's budget (0: the greedy plan alone).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use archer::catalog::{CapacityType, Catalog, InstanceType};
use archer::core::packer::{batch_budget, Offering, Plan, Pool, DEFAULT_BUDGET};
use archer::core::planner::{plan_batch_within, Pending};
use archer::core::sched::preferences::Policy;
use archer::core::sched::{Snapshot, Volumes};
use archer::provisioner::adapter as model;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};
use archer::core::platform::PlatformSet;
use archer::core::resources::Resources;
use archer::provisioner::nodepool::{offerings, NodePool};

// The same allocator as the archer binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MIB: i64 = 1024 * 1024;
const ZONE: &str = "topology.kubernetes.io/zone";
const HOSTNAME: &str = "kubernetes.io/hostname";

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

fn proc_status_kib(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Plan `pods` repeatedly for about a second; (plan, mean time, peak MiB added). The packer's
/// budget is the worker's (its default scaled to the batch), or ARCHER_BENCH_BUDGET_MS (0: the
/// greedy plan alone).
fn measure(pods: &[Pending], pools: &[Pool], offers: &[Offering]) -> (Plan, Duration, f64) {
    let empty = Snapshot::default();
    let budget = std::env::var("ARCHER_BENCH_BUDGET_MS").ok().and_then(|v| v.parse().ok()).map_or(batch_budget(DEFAULT_BUDGET, pods.len()), Duration::from_millis);
    let plan_batch = |snapshot: &Snapshot, pods: &[Pending], pools: &[Pool], offers: &[Offering]| plan_batch_within(snapshot, pods, pools, offers, budget);
    // Peak memory of one plan: reset the high-water mark (Linux clear_refs 5), plan, read it.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = proc_status_kib("VmRSS:").unwrap_or(0);
    let plan = plan_batch(&empty, pods, pools, offers);
    let peak = proc_status_kib("VmHWM:").unwrap_or(before).saturating_sub(before) as f64 / 1024.0;
    let start = Instant::now();
    let mut runs = 0u32;
    while runs < 3 || start.elapsed() < Duration::from_secs(1) {
        std::hint::black_box(plan_batch(&empty, pods, pools, offers));
        runs += 1;
    }
    (plan, start.elapsed() / runs, peak)
}

fn report(label: &str, n: usize, plan: &Plan, mean: Duration, peak_mib: f64) {
    let placed: usize = plan.nodes.iter().map(|n| n.pods.len()).sum();
    let ratio = if plan.lower_bound_per_hour > 0.0 { format!("{:.3}", plan.total_price_per_hour / plan.lower_bound_per_hour) } else { "-".to_string() };
    println!(
        "{label:<10} {n:>6} pods  {:>10.0} pods/s  {:>8.2} ms  {:>5} nodes  {placed:>6} placed  {:>4} unschedulable  ${:>9.3}/h  cost ratio {ratio:>5}  peak +{peak_mib:.1} MiB",
        n as f64 / mean.as_secs_f64(),
        mean.as_secs_f64() * 1e3,
        plan.nodes.len(),
        plan.unschedulable.len(),
        plan.total_price_per_hour,
    );
}

/// A pending pod as the API server would hold it, through the provisioner's one adapter (the
/// packer's and the scheduling model's views, as the worker builds them).
fn pod(name: &str, cpu: i64, mem_mib: i64, labels: Value, spec: Value, platforms: Option<PlatformSet>) -> Pending {
    pod_with(name, cpu, mem_mib, labels, spec, platforms, Policy::Respect)
}

fn pod_with(name: &str, cpu: i64, mem_mib: i64, labels: Value, spec: Value, platforms: Option<PlatformSet>, policy: Policy) -> Pending {
    let mut spec = spec;
    spec["containers"] = json!([{"name": "app", "image": "app", "resources": {"requests": {"cpu": format!("{cpu}m"), "memory": format!("{mem_mib}Mi")}}}]);
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default", "labels": labels}, "spec": spec})).expect("pod");
    model::pending(&pod, platforms, &Volumes::default(), policy)
}

fn spread(key: &str, group: &str) -> Value {
    json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"group": group}}}]})
}

fn catalog_workload(n: usize, rng: &mut Rng) -> Vec<Pending> {
    let multi = PlatformSet::parse_annotation("linux/amd64,linux/arm64").ok();
    let amd = PlatformSet::parse_annotation("linux/amd64").ok();
    // Deployments of 1-20 replicas, each with one shape, platform set and constraint.
    let mut pods = Vec::with_capacity(n);
    let mut d = 0;
    while pods.len() < n {
        let replicas = (1 + rng.next() % 20) as usize;
        let cpu = rng.pick(&[100, 250, 500, 1000, 2000, 4000]);
        let mem = rng.pick(&[128, 256, 512, 1024, 2048, 4096, 8192]);
        let platforms = if rng.next() % 10 < 6 { multi.clone() } else { amd.clone() };
        let kind = rng.next() % 10;
        let group = format!("d{d}");
        let spec = match kind {
            0 | 1 => spread(ZONE, &group),
            2 => spread(HOSTNAME, &group),
            _ => json!({}),
        };
        for r in 0..replicas.min(n - pods.len()) {
            pods.push(pod(&format!("d{d}-{r}"), cpu, mem, json!({"group": group}), spec.clone(), platforms.clone()));
        }
        d += 1;
    }
    pods
}

fn karpenter_types() -> Vec<Offering> {
    let mut out = Vec::new();
    for i in 0..400u32 {
        let vcpu = i + 1;
        let mem_gib = 2 * u64::from(vcpu);
        let pods = 10 * i64::from(vcpu);
        let t = Arc::new(InstanceType {
            name: format!("fake-it-{i}"),
            provider: "fake".into(),
            arch: "amd64".into(),
            os: "linux".into(),
            family: "fake".into(),
            category: "f".into(),
            generation: 1,
            cpu_manufacturer: "fake".into(),
            vcpu,
            memory_mib: mem_gib * 1024,
            gpu_count: 0,
            gpu_name: String::new(),
            allocatable: Resources::new(i64::from(vcpu) * 1000, mem_gib as i64 * 1024 * MIB, pods),
            allocatable_cpu: vcpu.to_string(),
            allocatable_memory: format!("{mem_gib}Gi"),
            max_pods: pods,
            prices: Default::default(),
            spot_discount: None,
            facts: Default::default(),
            extended: Default::default(),
        });
        // Karpenter's fake.PriceFromResources: 0.1 per vCPU + 0.1 per 1e9 bytes.
        let price = 0.1 * f64::from(vcpu) + 0.1 * (mem_gib as f64 * 1024.0 * 1024.0 * 1024.0) / 1e9;
        for (zone, cap) in [("test-zone-1", CapacityType::Spot), ("test-zone-2", CapacityType::Spot), ("test-zone-1", CapacityType::OnDemand), ("test-zone-2", CapacityType::OnDemand), ("test-zone-3", CapacityType::OnDemand)] {
            out.push(Offering { instance: t.clone(), zone: zone.into(), capacity: cap, price, pool: None });
        }
    }
    out
}

fn karpenter_workload(n: usize, rng: &mut Rng) -> Vec<Pending> {
    let group = n / 5;
    let mut pods = Vec::with_capacity(n);
    for i in 0..n {
        let kind = if i < 5 * group { i / group } else { 0 };
        let (cpu, mem) = (rng.pick(&[100, 250, 500, 1000, 1500]), rng.pick(&[100, 256, 512, 1024, 2048, 4096]));
        // Karpenter's randomLabelValue: one of 7 values.
        let value = rng.pick(&["a", "b", "c", "d", "e", "f", "g"]);
        let g = format!("group-{kind}");
        let term = |key: &str, sel: Value| json!([{"labelSelector": sel, "topologyKey": key}]);
        let (labels, spec) = match kind {
            1 => (json!({"group": g}), spread(ZONE, &g)),
            2 => (json!({"group": g}), spread(HOSTNAME, &g)),
            3 => (json!({"group": g, "my-affininity": value}), json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term(ZONE, json!({"matchLabels": {"my-affininity": value}}))}}})),
            4 => (json!({"group": g}), json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term(HOSTNAME, json!({"matchLabels": {"group": g}}))}}})),
            _ => (json!({"group": g}), json!({})),
        };
        pods.push(pod(&format!("p{i}"), cpu, mem, labels, spec, None));
    }
    pods
}

/// Karpenter's `makePreferencePods`: every pod labelled `app: nginx`, preferring zone 1 (preferred
/// node affinity), and preferring no other such pod in its zone (weight 10, which cannot hold past
/// three pods) nor on its node (weight 1, which can); requests as in [`karpenter_workload`].
fn preference_workload(n: usize, policy: Policy, rng: &mut Rng) -> Vec<Pending> {
    let anti = |w: i32, key: &str| json!({"weight": w, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "nginx"}}, "topologyKey": key}});
    let spec = json!({"affinity": {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["test-zone-1"]}]}}]},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [anti(10, ZONE), anti(1, HOSTNAME)]}
    }});
    (0..n)
        .map(|i| {
            let (cpu, mem) = (rng.pick(&[100, 250, 500, 1000, 1500]), rng.pick(&[100, 256, 512, 1024, 2048, 4096]));
            pod_with(&format!("p{i}"), cpu, mem, json!({"app": "nginx"}), spec.clone(), None, policy)
        })
        .collect()
}

/// `deployments` Deployments of `replicas`, one shape each (cpu 100m-1.5, memory 128Mi-4Gi),
/// multi-arch or amd64 only, no constraints: the optimality workloads.
fn deployments(deployments: usize, replicas: usize, multi_arch: bool, rng: &mut Rng) -> Vec<Pending> {
    let platforms = PlatformSet::parse_annotation(if multi_arch { "linux/amd64,linux/arm64" } else { "linux/amd64" }).ok();
    let mut pods = Vec::with_capacity(deployments * replicas);
    for d in 0..deployments {
        let cpu = rng.pick(&[100, 250, 500, 750, 1000, 1500]);
        let mem = rng.pick(&[128, 256, 512, 1024, 2048, 3072, 4096]);
        for r in 0..replicas {
            pods.push(pod(&format!("d{d}-{r}"), cpu, mem, json!({"app": format!("d{d}")}), json!({}), platforms.clone()));
        }
    }
    pods
}

/// Plan price against the LP lower bound, with the optimal packer and with the greedy one alone.
fn optimality() {
    let catalog = Catalog::embedded().expect("embedded catalog");
    let offers: Vec<Offering> = offerings(&catalog, &["us-east-1a".to_string()]).into_iter().filter(|o| o.capacity == CapacityType::OnDemand).collect();
    let mut pool: Pool = NodePool::default_pool().to_pool().expect("pool");
    pool.requirements = archer::core::requirements::Requirements::new().with("kubernetes.io/os", "linux");
    pool.daemons.clear();
    let perf = || {
        let mut pods: Vec<Pending> = (0..500).map(|i| pod(&format!("a{i}"), 900, 3100, json!({"app": "a"}), json!({}), None)).collect();
        pods.extend((0..500).map(|i| pod(&format!("b{i}"), 3500, 28 * 1024, json!({"app": "b"}), json!({}), None)));
        pods
    };
    let workloads: Vec<(&str, Vec<Pending>)> = vec![
        ("100x20 multi-arch", deployments(100, 20, true, &mut Rng(7))),
        ("100x20 amd64", deployments(100, 20, false, &mut Rng(7))),
        ("5x20 mixed", deployments(5, 20, true, &mut Rng(11))),
        ("karpenter perf", perf()),
        ("250x20 multi-arch", deployments(250, 20, true, &mut Rng(7))),
    ];
    let empty = Snapshot::default();
    println!("optimality: embedded catalog, on-demand, one zone, no DaemonSets; ratio = plan price / LP lower bound");
    for (name, pods) in workloads {
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let before = proc_status_kib("VmRSS:").unwrap_or(0);
        let start = Instant::now();
        let plan = plan_batch_within(&empty, &pods, std::slice::from_ref(&pool), &offers, batch_budget(DEFAULT_BUDGET, pods.len()));
        let took = start.elapsed();
        let peak = proc_status_kib("VmHWM:").unwrap_or(before).saturating_sub(before) as f64 / 1024.0;
        let start = Instant::now();
        let greedy = plan_batch_within(&empty, &pods, std::slice::from_ref(&pool), &offers, Duration::ZERO);
        let greedy_took = start.elapsed();
        let bound = plan.lower_bound_per_hour;
        println!(
            "{name:<18} {:>5} pods  bound ${bound:>8.3}/h  plan ${:>8.3}/h {:>4} nodes ratio {:.4} ({:>6.0} ms, peak +{peak:.1} MiB)  greedy ${:>8.3}/h {:>4} nodes ratio {:.4} ({:>4.0} ms)",
            pods.len(),
            plan.total_price_per_hour,
            plan.nodes.len(),
            plan.total_price_per_hour / bound,
            took.as_secs_f64() * 1e3,
            greedy.total_price_per_hour,
            greedy.nodes.len(),
            greedy.total_price_per_hour / bound,
            greedy_took.as_secs_f64() * 1e3,
        );
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let which = std::env::var("ARCHER_BENCH_WORKLOAD").unwrap_or_default();
    if which.is_empty() || which == "optimality" {
        optimality();
    }
    let default_pool = NodePool::default_pool();
    if which.is_empty() || which == "catalog" {
        let catalog = Catalog::embedded().expect("embedded catalog");
        let zones: Vec<String> = ["us-east-1a", "us-east-1b", "us-east-1c"].iter().map(|z| z.to_string()).collect();
        let offers = offerings(&catalog, &zones);
        let mut pool: Pool = default_pool.to_pool().expect("pool");
        // Both capacity types, both architectures.
        pool.requirements = archer::core::requirements::Requirements::new().with("kubernetes.io/os", "linux");
        println!("catalog: {} instance types, {} offerings", catalog.len(), offers.len());
        for n in [100, 1_000, 5_000] {
            let pods = catalog_workload(n, &mut Rng(42));
            let (plan, mean, peak) = measure(&pods, std::slice::from_ref(&pool), &offers);
            report("catalog", n, &plan, mean, peak);
        }
    }
    if which.is_empty() || which == "karpenter" {
        let offers = karpenter_types();
        let pool: Pool = default_pool.to_pool().expect("pool");
        println!("karpenter-shaped: 400 synthetic types, {} offerings", offers.len());
        for n in std::env::var("ARCHER_BENCH_SIZES").ok().map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect::<Vec<usize>>()).unwrap_or_else(|| vec![100, 1_000, 5_000, 20_000]) {
            let pods = karpenter_workload(n, &mut Rng(42));
            let (plan, mean, peak) = measure(&pods, std::slice::from_ref(&pool), &offers);
            report("karpenter", n, &plan, mean, peak);
        }
    }
    if which.is_empty() || which == "preferences" {
        let offers = karpenter_types();
        let pool: Pool = default_pool.to_pool().expect("pool");
        println!("preferences (Karpenter's makePreferencePods): 400 synthetic types, {} offerings", offers.len());
        for n in std::env::var("ARCHER_BENCH_SIZES").ok().map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect::<Vec<usize>>()).unwrap_or_else(|| vec![4_000]) {
            for (label, policy) in [("respect", Policy::Respect), ("ignore", Policy::Ignore)] {
                let pods = preference_workload(n, policy, &mut Rng(42));
                let (plan, mean, peak) = measure(&pods, std::slice::from_ref(&pool), &offers);
                report(label, n, &plan, mean, peak);
            }
        }
    }
}
