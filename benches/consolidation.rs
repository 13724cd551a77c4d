//! `cargo bench --bench consolidation`: how long one consolidation pass of the worker takes on a
//! large pool, and what it decides. The cluster is a scenario, read as `archer simulate` reads
//! one: a NodePool (amd64, on-demand, c/m/r, consolidation on), N nodes of m6i.2xlarge over
//! three zones, each running 1 to 4 ReplicaSet pods drawn with a fixed seed (250m to 2 vCPU,
//! 512Mi to 4Gi): underused, so most sets can go.
//!
//! Reported per N: the pass time (mean of repeated passes, each as the worker runs it: at most
//! `EVALUATIONS_PER_PASS` candidate sets planned, from a given start) and the exhaustive search's
//! (`archer simulate --disruption`: every set the search reaches), and the decision each took
//! (nodes taken, replacements, saving per hour).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

use std::time::{Duration, Instant};

use archer::catalog::Catalog;
use archer::provisioner::consolidation::{self, Decision, Search, World, EVALUATIONS_PER_PASS};
use archer::provisioner::objects::DisruptionSettings;
use archer::provisioner::scenario::Scenario;
use serde_json::json;

// The same allocator as the archer binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

/// The scenario's text: the NodePool, then the nodes and their pods as one `List` (a scenario
/// reads at most 1,024 documents).
fn scenario(nodes: usize, rng: &mut Rng) -> String {
    let pool = "apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: general}\nspec:\n  template:\n    spec:\n      requirements:\n        - {key: kubernetes.io/arch, operator: In, values: [amd64]}\n        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}\n        - {key: karpenter.k8s.aws/instance-category, operator: In, values: [c, m, r]}\n  disruption: {consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 30s, budgets: [{nodes: \"10%\"}]}\n";
    let mut items = Vec::new();
    for i in 0..nodes {
        let zone = ["us-east-1a", "us-east-1b", "us-east-1c"][i % 3];
        let name = format!("node-{i}");
        items.push(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "topology.kubernetes.io/zone": zone,
                "node.kubernetes.io/instance-type": "m6i.2xlarge", "karpenter.sh/capacity-type": "on-demand", "archer.dev/nodepool": "general"}},
            "status": {"allocatable": {"cpu": "7910m", "memory": "29Gi", "pods": "58"}, "conditions": [{"type": "Ready", "status": "True"}]}}));
        for k in 0..rng.pick(&[1, 2, 3, 4]) {
            let (cpu, memory) = (rng.pick(&["250m", "500m", "1", "2"]), rng.pick(&["512Mi", "1Gi", "2Gi", "4Gi"]));
            items.push(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("app-{i}-{k}"), "namespace": "default", "labels": {"app": "app"}, "annotations": {"archer.dev/platforms": "linux/amd64"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "app", "uid": "1", "controller": true}]},
                "spec": {"nodeName": name, "containers": [{"name": "c", "image": "app", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
                "status": {"phase": "Running"}}));
        }
    }
    format!("{pool}---\n{}\n", json!({"apiVersion": "v1", "kind": "List", "items": items}))
}

fn describe(d: &Option<Decision>) -> String {
    match d {
        Some(d) => format!("{} node(s) -> {} replacement(s), saves ${:.3}/h", d.nodes.len(), d.replacements.len(), d.saving_per_hour),
        None => "nothing".into(),
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let catalog = Catalog::embedded().expect("embedded catalog");
    let sizes: Vec<usize> = std::env::var("ARCHER_BENCH_SIZES").ok().map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect()).unwrap_or_else(|| vec![100, 500, 1_000]);
    println!("consolidation: one pass over a pool of m6i.2xlarge nodes with 1-4 pods each; at most {EVALUATIONS_PER_PASS} sets planned per worker pass");
    for n in sizes {
        let mut s = Scenario::parse(&scenario(n, &mut Rng(7))).expect("scenario");
        let inputs = s.inputs(&catalog, Default::default()).expect("inputs");
        let volumes = s.state.volumes();
        let world = World { state: &s.state, pools: &inputs.pools, volumes: &volumes, budget: archer::core::packer::DEFAULT_BUDGET, preferences: Default::default() };
        let prices = s.state.pricer();
        let price = |node: &k8s_openapi::api::core::v1::Node| prices.per_hour(node);
        let nodes = consolidation::pool_nodes(&s.state, "general", &|_| true, &price, &mut |_| {});
        assert_eq!(nodes.candidates.len(), n, "every node is a priced candidate");
        let settings = DisruptionSettings::of(&s.state.pools[0]).expect("settings");
        let pass = |search: Search| consolidation::consolidate_pool(&world, "general", &settings, &nodes, &|_| true, &|_| true, search);
        let margin = archer::config::ProvisionerConfig::default().min_saving_fraction();
        // The worker's pass, from successive starts, for about two seconds.
        let (mut runs, mut spent, mut decided) = (0usize, Duration::ZERO, None);
        while spent < Duration::from_secs(2) || runs < 3 {
            let search = Search { min_saving_fraction: margin, max_evaluations: EVALUATIONS_PER_PASS, start: runs * EVALUATIONS_PER_PASS, balance: None };
            let t = Instant::now();
            let d = pass(search);
            spent += t.elapsed();
            decided = decided.or(d);
            runs += 1;
        }
        let t = Instant::now();
        let exhaustive = pass(Search::exhaustive(margin));
        let exhaustive_time = t.elapsed();
        println!("  {n:>5} nodes: worker pass {:>8.1} ms ({}) | exhaustive {:>8.1} ms ({})", spent.as_secs_f64() * 1e3 / runs as f64, describe(&decided), exhaustive_time.as_secs_f64() * 1e3, describe(&exhaustive));
    }
}
