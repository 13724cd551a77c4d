//! What consolidation would do, decided purely: given the cluster (the same snapshot the
//! provisioner plans on) and the nodes that may be disrupted, which nodes go and why (empty,
//! underutilised with their pods moved elsewhere or onto a cheaper replacement), and what that
//! saves. The live worker calls this with its clocks and budgets applied; `archer simulate
//! --disruption` calls it on a cluster dump. Acting (tainting, launching, evicting) is the
//! worker's.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::adapter;
use crate::objects::{self, DisruptionSettings};
use crate::ClusterState;
use archer_core::packer::{Plan, PlannedNode, Pool};
use archer_core::packer::batch_budget;
use archer_core::planner::{onto_one_new_node, plan_batch_within, Pending};
use archer_core::sched::Volumes;

mod floor;
use floor::Floor;

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

/// The cluster the decisions are made on, with what the caller resolved for it.
pub struct World<'a> {
    pub state: &'a ClusterState,
    /// The state's pools as the packer takes them (room left, readiness applied).
    pub pools: &'a [Pool],
    pub volumes: &'a Volumes,
    /// The packer's time budget for each re-plan.
    pub budget: std::time::Duration,
    /// Whether re-plans buy new nodes to honour preferences (the worker's setting).
    pub preferences: archer_core::sched::preferences::Policy,
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
    /// The Balanced pool's totals the decision was scored against (checked again on revalidation).
    #[serde(skip)]
    pub balance: Option<Balance>,
}

/// `consolidationPolicy: Balanced`, as Karpenter v1.15 scores a move (its RFC "balanced
/// consolidation"): the share of the pool's hourly cost the move saves, over the share of the
/// pool's disruption cost it causes, must be at least 1/k (k = 2). A node's disruption cost is 1
/// plus the eviction cost of each pod that moves ([`objects::eviction_cost`], negatives as 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Balance {
    pub total_cost: f64,
    pub total_disruption: f64,
}

/// Karpenter's `BalancedK`.
const BALANCED_K: f64 = 2.0;

/// What draining a node costs in disruption: 1 (the drain itself) plus its moving pods'.
fn node_disruption_cost(c: &Candidate<'_>) -> f64 {
    1.0 + objects::evictable(&c.pods).iter().map(|p| objects::eviction_cost(p).max(0.0)).sum::<f64>()
}

impl Balance {
    /// The totals of a pool's nodes.
    pub fn of(nodes: &[Candidate<'_>]) -> Balance {
        Balance { total_cost: nodes.iter().map(|c| c.price).filter(|p| p.is_finite()).sum(), total_disruption: nodes.iter().map(node_disruption_cost).sum() }
    }

    /// The move's score: savings fraction over disruption fraction (0 when it saves nothing,
    /// infinite when it disrupts nothing).
    pub fn score(&self, saving: f64, disruption: f64) -> f64 {
        if self.total_cost <= 0.0 || self.total_disruption <= 0.0 {
            return f64::INFINITY;
        }
        let (saved, disrupted) = (saving / self.total_cost, disruption / self.total_disruption);
        if saved <= 0.0 {
            return 0.0;
        }
        if disrupted == 0.0 {
            return f64::INFINITY;
        }
        saved / disrupted
    }

    /// Whether a move saving `saving` per hour at `disruption` passes.
    fn approves(&self, saving: f64, disruption: f64) -> bool {
        self.score(saving, disruption) >= 1.0 / BALANCED_K
    }
}

/// A pool's nodes as one disruption pass sees them.
pub struct PoolNodes<'a> {
    /// Nodes of the pool.
    pub total: usize,
    /// Nodes of the pool on their way out (tainted, cordoned, being deleted).
    pub disrupting: usize,
    /// The pool's nodes that may be disrupted, in the state's order, with their live pods.
    pub candidates: Vec<Candidate<'a>>,
}

impl PoolNodes<'_> {
    /// How many more nodes the pool's budget for `reason` lets go now.
    pub fn budget(&self, settings: &DisruptionSettings, reason: &str) -> usize {
        settings.allowed(self.total, reason).saturating_sub(self.disrupting)
    }

    /// The candidate of that name.
    pub fn get(&self, name: &str) -> Option<&Candidate<'_>> {
        self.candidates.iter().find(|c| c.name() == name)
    }
}

/// The nodes of `pool` in `state` ([`objects::node_pool_of`]): how many, how many are leaving,
/// and as candidates those not leaving that `eligible` accepts, priced by `price`. A node `price`
/// has no price for is left out and handed to `unpriced`.
pub fn pool_nodes<'a>(state: &'a ClusterState, pool: &str, eligible: &dyn Fn(&Node) -> bool, price: &dyn Fn(&Node) -> Option<f64>, unpriced: &mut dyn FnMut(&Node)) -> PoolNodes<'a> {
    let by_node = objects::usage_by_node(state.pods.iter().map(|p| p.as_ref()));
    let nodes: Vec<&Node> = state.nodes.iter().map(|n| n.as_ref()).filter(|n| objects::node_pool_of(n) == Some(pool)).collect();
    let disrupting = nodes.iter().filter(|n| objects::node_leaving(n)).count();
    let mut candidates = Vec::new();
    for n in nodes.iter().copied().filter(|n| !objects::node_leaving(n) && eligible(n)) {
        let Some(price) = price(n) else {
            unpriced(n);
            continue;
        };
        let pods = by_node.get(n.metadata.name.as_deref().unwrap_or("")).map(|(_, pods)| pods.clone()).unwrap_or_default();
        candidates.push(Candidate { node: n, pods, price });
    }
    PoolNodes { total: nodes.len(), disrupting, candidates }
}

/// Neither a pod on the candidate nor its node forbids a voluntary disruption.
pub fn disruptable(c: &Candidate<'_>) -> bool {
    objects::disruption_blocker(&c.pods).is_none() && !objects::do_not_disrupt(&c.node.metadata)
}

/// Consolidation's one decision for a pool on a pass, if any: the candidates `empty_long_enough`
/// accepts that have no pod to move go first, within the `Empty` budget; else, when the pool
/// consolidates underutilised nodes and no candidate is empty but for its clock, the best set of
/// the disruptable candidates `settled` accepts, within the `Underutilized` budget. The worker passes its clocks as the two
/// predicates; `archer simulate --disruption` takes every node as long settled. Both predicates
/// are asked about every candidate (the worker's clocks start over when a node changes).
pub fn consolidate_pool(world: &World<'_>, pool: &str, settings: &DisruptionSettings, nodes: &PoolNodes<'_>, empty_long_enough: &dyn Fn(&Candidate<'_>) -> bool, settled: &dyn Fn(&Candidate<'_>) -> bool, search: Search) -> Option<Decision> {
    settings.consolidate_after?;
    let empty_ok: Vec<bool> = nodes.candidates.iter().map(empty_long_enough).collect();
    let settled_ok: Vec<bool> = nodes.candidates.iter().map(settled).collect();
    let pick = |ok: &[bool]| -> Vec<&Candidate<'_>> { nodes.candidates.iter().zip(ok).filter(|(_, ok)| **ok).map(|(c, _)| c).collect() };
    if let Some(d) = empty(pool, &pick(&empty_ok), nodes.budget(settings, "Empty")) {
        return Some(d);
    }
    if !settings.underutilized {
        return None;
    }
    // A node just emptied (a scale-down) goes next, for free, once its clock has run: no pod is
    // moved meanwhile, least of all onto it.
    if nodes.candidates.iter().zip(&empty_ok).any(|(c, ok)| !ok && objects::evictable(&c.pods).is_empty()) {
        return None;
    }
    let eligible: Vec<&Candidate> = pick(&settled_ok).into_iter().filter(|c| disruptable(c) && !c.pods.is_empty()).collect();
    let search = Search { balance: settings.balanced.then(|| Balance::of(&nodes.candidates)), ..search };
    underutilized(world, pool, &eligible, nodes.budget(settings, "Underutilized"), search)
}

/// Empty candidates (no pods but DaemonSets'), at most `budget` of them.
pub(crate) fn empty(pool: &str, candidates: &[&Candidate<'_>], budget: usize) -> Option<Decision> {
    let gone: Vec<&Candidate> = candidates.iter().copied().filter(|c| objects::evictable(&c.pods).is_empty()).take(budget).collect();
    (!gone.is_empty()).then(|| Decision {
        pool: pool.to_string(),
        nodes: gone.iter().map(|c| c.name().to_string()).collect(),
        reason: "empty",
        replacements: Vec::new(),
        moves: Default::default(),
        saving_per_hour: gone.iter().map(|c| c.price).filter(|p| p.is_finite()).sum(),
        balance: None,
    })
}

/// Where the pods of `set` would go if its nodes were removed: other nodes first, then new
/// nodes, by the provisioner's own planner, on one new node when one holds all the pods that need
/// one. `None` when some pod would have nowhere to go.
pub fn evaluate(world: &World<'_>, set: &[&Candidate<'_>]) -> Option<Plan> {
    #[cfg(test)]
    tests::PLANNING_RUNS.with(|n| n.set(n.get() + 1));
    let leaving: Vec<&str> = set.iter().map(|c| c.name()).collect();
    // The moving pods as kube-scheduler will see them once evicted: unbound replicas.
    let batch: Vec<Pending> = set
        .iter()
        .flat_map(|c| objects::evictable(&c.pods))
        .map(|p| adapter::pending_unbound(p, world.state.pod_platforms(p), world.volumes, world.preferences))
        .collect();
    let snapshot = world.state.snapshot(world.pools, &|n: &str| leaving.contains(&n));
    let plan = plan_batch_within(&snapshot, &batch, world.pools, &world.state.offerings, batch_budget(world.budget, batch.len()));
    if !plan.unschedulable.is_empty() {
        return None;
    }
    // As Karpenter's simulation: the pods go onto one new node when one holds them all, though
    // two smaller ones may cost less (a set is replaced by at most one node, [`decide`]).
    Some(onto_one_new_node(&snapshot, &batch, world.pools, &world.state.offerings, &plan).unwrap_or(plan))
}

/// How consolidation searches and what it must save.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Search {
    /// A set of nodes goes only when its pods cost less elsewhere by more than this share of the
    /// set's price: price noise never churns nodes, and no later decision can undo this one
    /// (undoing it would cost more, not less).
    pub min_saving_fraction: f64,
    /// Candidate sets evaluated per call, each one planning run; the others wait for later calls.
    pub max_evaluations: usize,
    /// Where in the ordered candidates the single-node search starts (the caller moves it on each
    /// pass, so every candidate gets its turn).
    pub start: usize,
    /// A Balanced pool's totals: a move must also pass its score ([`consolidate_pool`] sets it
    /// from the pool's settings).
    pub balance: Option<Balance>,
}

impl Search {
    /// Every candidate (offline: `archer simulate --disruption`).
    pub fn exhaustive(min_saving_fraction: f64) -> Self {
        Search { min_saving_fraction, max_evaluations: usize::MAX, start: 0, balance: None }
    }
}

/// The underutilised nodes of `pool` worth replacing or removing, searched as Karpenter does.
/// Candidates are ordered by what disrupting them costs (fewest pods to move first, as
/// Karpenter's disruption cost; the priciest first among equals). First the largest
/// prefix of that order (2 up to the budget, at most [`MAX_SET`]) that can go, found by binary
/// search; then each node alone, from `search.start` on: with no such set, the first that can go;
/// with one, the set unless a node alone saves more. At most `search.max_evaluations` sets are
/// planned. A set can go when its pods all have a place (on the other nodes plus at most one
/// replacement) and the re-plan saves more than the margin.
pub(crate) fn underutilized(world: &World<'_>, pool: &str, eligible: &[&Candidate<'_>], budget: usize, search: Search) -> Option<Decision> {
    let mut order: Vec<&Candidate> = eligible.iter().copied().filter(|c| !c.pods.is_empty()).collect();
    if order.is_empty() || budget == 0 {
        return None;
    }
    let moving = |c: &Candidate| objects::evictable(&c.pods).len();
    order.sort_by(|a, b| moving(a).cmp(&moving(b)).then_with(|| b.price.total_cmp(&a.price)).then_with(|| a.name().cmp(b.name())));
    let mut left = search.max_evaluations;
    // A set refused by its floor counts as evaluated: the search visits the same sets in the
    // same passes as without it, and decides the same.
    let floor = Floor::new(world);
    let mut try_set = |set: &[&Candidate]| {
        if left == 0 {
            return None;
        }
        left -= 1;
        decide(world, pool, set, "underutilized", search.min_saving_fraction, search.balance, Some(&floor)).ok()
    };
    let (mut lo, mut hi) = (2, budget.min(order.len()).min(MAX_SET));
    let mut best = None;
    while lo <= hi {
        let mid = (lo + hi) / 2;
        match try_set(order.get(..mid).unwrap_or(&order)) {
            Some(d) => {
                best = Some(d);
                lo = mid + 1;
            }
            None => hi = mid - 1,
        }
    }
    let n = order.len();
    let Some(set) = best else {
        return (0..n).find_map(|i| order.get((search.start + i) % n).and_then(|o| try_set(std::slice::from_ref(o))));
    };
    // A set is replaced by one node, which may hold its pods at a higher price than the nodes a
    // single member's few pods need: a node alone goes instead when it saves more (within the
    // evaluations left). Only a node priced above the set's saving can: alone, it saves at most
    // its price.
    let alone = (0..n)
        .filter_map(|i| order.get((search.start + i) % n))
        .filter(|o| o.price > set.saving_per_hour)
        .filter_map(|o| try_set(std::slice::from_ref(o)))
        .max_by(|a, b| a.saving_per_hour.total_cmp(&b.saving_per_hour));
    Some(match alone {
        Some(one) if one.saving_per_hour > set.saving_per_hour => one,
        _ => set,
    })
}

/// Candidate sets one pass of the worker evaluates for underutilisation (each is one planning
/// run); the next pass goes on where this one stopped.
pub const EVALUATIONS_PER_PASS: usize = 16;

/// The most nodes one decision takes (Karpenter's multi-node consolidation looks at 100).
const MAX_SET: usize = 100;

/// The decision to take `set` away for `reason`, or why not: some pod would have no place, or
/// the saving is not above the margin. With a `floor`, a set whose replacement could not cost
/// little enough ([`Floor::replacement`]) is refused before its pods are planned.
fn decide(world: &World<'_>, pool: &str, set: &[&Candidate<'_>], reason: &'static str, min_saving_fraction: f64, balance: Option<Balance>, floor: Option<&Floor<'_, '_>>) -> Result<Decision, String> {
    if set.iter().all(|c| objects::evictable(&c.pods).is_empty()) {
        // Nothing moves: removing the nodes saves what they cost.
        let saving = set.iter().map(|c| c.price).filter(|p| p.is_finite()).sum();
        return Ok(Decision { pool: pool.to_string(), nodes: set.iter().map(|c| c.name().to_string()).collect(), reason, replacements: Vec::new(), moves: Default::default(), saving_per_hour: saving, balance });
    }
    let old: f64 = set.iter().map(|c| c.price).sum();
    if let Some(floor) = floor {
        let least = floor.replacement(set).ok_or_else(|| "some pod would have no place: no new node holds what the other nodes cannot".to_string())?;
        worth(set, old, old - least, min_saving_fraction, balance).map_err(|e| format!("at most: {e} (a replacement costs at least ${least:.4}/h)"))?;
    }
    let plan = evaluate(world, set).ok_or_else(|| "some pod would have no place".to_string())?;
    // As Karpenter: nodes are replaced by at most one node, so consolidation never raises the
    // node count (one node traded for many small ones churns pods for a sliver of price).
    if plan.nodes.len() > 1 {
        return Err(format!("would need {} replacements; at most one replaces a set", plan.nodes.len()));
    }
    let saving = old - plan.total_price_per_hour;
    worth(set, old, saving, min_saving_fraction, balance)?;
    Ok(Decision { pool: pool.to_string(), nodes: set.iter().map(|c| c.name().to_string()).collect(), reason, replacements: plan.nodes, moves: plan.existing, saving_per_hour: saving, balance })
}

/// Whether saving `saving` of the set's `old` price per hour is worth the disruption: more than
/// the margin, and in a Balanced pool a passing score. Both only grow with the saving, so a bound
/// on it that fails means the saving fails.
fn worth(set: &[&Candidate<'_>], old: f64, saving: f64, min_saving_fraction: f64, balance: Option<Balance>) -> Result<(), String> {
    if saving.partial_cmp(&(old * min_saving_fraction)) != Some(std::cmp::Ordering::Greater) {
        return Err(format!("saves ${saving:.4}/h of ${old:.4}/h, not more than {:.1}%", min_saving_fraction * 100.0));
    }
    if let Some(b) = balance {
        let disruption: f64 = set.iter().map(|c| node_disruption_cost(c)).sum();
        if !b.approves(saving, disruption) {
            return Err(format!("Balanced: score {:.3} below {:.3} (saves {:.1}% of the pool's cost for {:.1}% of its disruption)", b.score(saving, disruption), 1.0 / BALANCED_K, saving / b.total_cost * 100.0, disruption / b.total_disruption * 100.0));
        }
    }
    Ok(())
}

/// The pods that would move off each node (DaemonSet pods stay with their node): what a decision
/// was taken on, compared again before it is acted on.
pub(crate) fn signature(set: &[&Candidate<'_>]) -> BTreeMap<String, Vec<String>> {
    set.iter()
        .map(|c| {
            let mut ids: Vec<String> = objects::evictable(&c.pods).iter().map(|p| objects::pod_id(p)).collect();
            ids.sort();
            (c.name().to_string(), ids)
        })
        .collect()
}

/// A decision checked again on the cluster as it is now, after a quiet period: every node is
/// still a candidate with the same pods to move, the pods still all have a place and the saving
/// is still above the margin. The fresh decision (its replacements re-planned), or why the old
/// one is stale.
pub fn revalidate(world: &World<'_>, decision: &Decision, before: &BTreeMap<String, Vec<String>>, now: &[&Candidate<'_>], min_saving_fraction: f64) -> Result<Decision, String> {
    let mut set = Vec::with_capacity(decision.nodes.len());
    for name in &decision.nodes {
        let c = now.iter().copied().find(|c| c.name() == name).ok_or_else(|| format!("node {name} is no longer a candidate"))?;
        if signature(&[c]).get(name.as_str()) != before.get(name.as_str()) {
            return Err(format!("the pods on node {name} changed"));
        }
        set.push(c);
    }
    decide(world, &decision.pool, &set, decision.reason, min_saving_fraction, decision.balance, None)
}

#[cfg(test)]
mod tests;
