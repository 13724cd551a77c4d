//! What consolidation would do, decided purely: given the cluster (the same snapshot the
//! provisioner plans on) and the nodes that may be disrupted, which nodes go and why (empty,
//! underutilised with their pods moved elsewhere or onto a cheaper replacement), and what that
//! saves. The live worker calls this with its clocks and budgets applied; `archer simulate
//! --disruption` calls it on a cluster dump. Acting (tainting, launching, evicting) is the
//! worker's.

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};

use super::model;
use super::nodeclaim::NodeClaim;
use super::state;
use crate::core::packer::{Offering, Plan, PlannedNode, Pool};
use crate::core::planner::{plan_batch, Pending};
use crate::core::platform::PlatformSet;
use crate::core::sched::Volumes;

/// A node that may be disrupted, with the live pods bound to it and its hourly price.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub node: &'a Node,
    pub pods: Vec<&'a Pod>,
    pub price: f64,
}

impl Candidate<'_> {
    pub fn name(&self) -> &str {
        self.node.metadata.name.as_deref().unwrap_or("")
    }
}

/// The cluster the decisions are made on.
pub struct World<'a> {
    pub nodes: &'a [&'a Node],
    pub claims: &'a [&'a NodeClaim],
    pub pods: &'a [&'a Pod],
    pub namespaces: &'a [&'a Namespace],
    pub pools: &'a [Pool],
    pub offerings: &'a [Offering],
    pub volumes: &'a Volumes,
    /// The platforms of a pod's images (resolved by the caller; `None`: unknown).
    pub platforms: &'a (dyn Fn(&Pod) -> Option<PlatformSet> + Sync),
}

/// One disruption: the nodes that go, why, what replaces them and the saving per hour.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub pool: String,
    pub nodes: Vec<String>,
    pub reason: &'static str,
    pub replacements: Vec<PlannedNode>,
    /// Where the moving pods go on nodes already there: pod -> node.
    pub moves: std::collections::BTreeMap<String, String>,
    pub saving_per_hour: f64,
}

/// Empty candidates (no pods but DaemonSets'), at most `budget` of them.
pub fn empty(pool: &str, candidates: &[&Candidate<'_>], budget: usize) -> Option<Decision> {
    let gone: Vec<&Candidate> = candidates.iter().copied().filter(|c| state::evictable(&c.pods).is_empty()).take(budget).collect();
    (!gone.is_empty()).then(|| Decision {
        pool: pool.to_string(),
        nodes: gone.iter().map(|c| c.name().to_string()).collect(),
        reason: "empty",
        replacements: Vec::new(),
        moves: Default::default(),
        saving_per_hour: gone.iter().map(|c| c.price).filter(|p| p.is_finite()).sum(),
    })
}

/// Where the pods of `set` would go if its nodes were removed: other nodes first, then new
/// nodes, by the provisioner's own planner. `None` when some pod would have nowhere to go.
pub fn evaluate(world: &World<'_>, set: &[&Candidate<'_>]) -> Option<Plan> {
    let leaving: Vec<&str> = set.iter().map(|c| c.name()).collect();
    // The moving pods as kube-scheduler will see them once evicted: unbound replicas.
    let batch: Vec<Pending> = set
        .iter()
        .flat_map(|c| state::evictable(&c.pods))
        .map(|p| {
            let mut pending = model::pending(p, (world.platforms)(p), world.volumes);
            pending.sched.node_name = None;
            pending
        })
        .collect();
    let snapshot = model::cluster_snapshot(world.nodes, world.claims, world.pods, world.namespaces, world.pools, &|n: &str| leaving.contains(&n));
    let plan = plan_batch(&snapshot, &batch, world.pools, world.offerings);
    plan.unschedulable.is_empty().then_some(plan)
}

/// The underutilised nodes of `pool` worth replacing or removing: each eligible node alone, and
/// (within the budget) the least used ones together; the set with the largest saving above 1% of
/// its price wins.
pub fn underutilized(world: &World<'_>, pool: &str, eligible: &[&Candidate<'_>], budget: usize) -> Option<Decision> {
    let eligible: Vec<&Candidate> = eligible.iter().copied().filter(|c| !c.pods.is_empty()).collect();
    if eligible.is_empty() || budget == 0 {
        return None;
    }
    let mut sets: Vec<Vec<&Candidate>> = eligible.iter().map(|c| vec![*c]).collect();
    if eligible.len() > 1 && budget > 1 {
        let mut by_price_per_pod = eligible.clone();
        by_price_per_pod.sort_by(|a, b| (b.price / (b.pods.len() as f64 + 1.0)).total_cmp(&(a.price / (a.pods.len() as f64 + 1.0))));
        sets.push(by_price_per_pod.into_iter().take(budget).collect());
    }
    let mut best: Option<(f64, Vec<&Candidate>, Plan)> = None;
    for set in sets {
        let Some(plan) = evaluate(world, &set) else { continue };
        let old: f64 = set.iter().map(|c| c.price).sum();
        let saving = old - plan.total_price_per_hour;
        // Only a real saving (a sliver of price noise does not churn nodes).
        if saving > old * 0.01 && best.as_ref().is_none_or(|(s, _, _)| saving > *s) {
            best = Some((saving, set, plan));
        }
    }
    let (saving, set, plan) = best?;
    Some(Decision {
        pool: pool.to_string(),
        nodes: set.iter().map(|c| c.name().to_string()).collect(),
        reason: "underutilized",
        replacements: plan.nodes,
        moves: plan.existing,
        saving_per_hour: saving,
    })
}
