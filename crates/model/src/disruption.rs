//! One disruption pass over a pool, decided purely: expired nodes go first, then drifted nodes
//! are replaced, then (on a settled cluster) consolidation takes empty or underutilised nodes.
//! The runtime supplies what only it knows: its clocks, which nodes it is draining already,
//! whether pods still wait for capacity, and the provider's own drift reasons. It carries out the
//! commands returned.

use std::collections::BTreeMap;

use archer_api::nodeclaim::NodeClaim;
use archer_api::nodepool::NodePool;

use k8s_openapi::api::core::v1::Node;

use archer_core::labels;

use crate::consolidation::{self, Candidate, Decision, PoolNodes, Search, World};
use crate::objects::{self, age_at, DisruptionSettings};
use crate::ClusterState;

/// The nodes of `pool` disruption may take now, and what each costs: the one rule the worker
/// and `archer simulate --disruption` read. A candidate is Ready, registered (no unregistered
/// taint), not being deleted, and made by a NodeClaim launched at least `grace` before the
/// state's time; it is priced by the one rule ([`crate::price`]: its annotation, else its
/// offering now, else what its claim paid, else the catalog; a node none prices is never worth
/// replacing: it is priced infinite). A node no claim made (Karpenter's, or one left behind) is
/// never a candidate: Archer has nothing to take it out with. A scenario's nodes are given
/// claims first ([`crate::scenario::Scenario::as_launched`]).
pub fn candidates<'a>(state: &'a ClusterState, pool: &str, grace: std::time::Duration) -> PoolNodes<'a> {
    let now = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(state.now_ms) * 1_000_000).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let claims = state.claims_by_node();
    let claim_of = |n: &Node| claims.get(n.metadata.name.as_deref().unwrap_or("")).map(|c| c.as_ref());
    let settled = |c: &NodeClaim| c.status.as_ref().and_then(|s| s.launched_at.as_deref()).and_then(|t| age_at(t, now)).is_some_and(|a| a >= grace);
    let eligible = |n: &Node| objects::node_ready(n) && n.metadata.deletion_timestamp.is_none() && !objects::has_taint(n, labels::UNREGISTERED_TAINT) && claim_of(n).is_some_and(settled);
    let prices = state.pricer();
    let price = |n: &Node| Some(prices.per_hour(n).unwrap_or(f64::INFINITY));
    consolidation::pool_nodes(state, pool, &eligible, &price, &mut |_| {})
}

/// What one pass does to a pool.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Drain an expired node now, whatever its pods cost elsewhere.
    Expire { node: String },
    /// Replace a drifted node: replacements Ready first, then drain it.
    Replace { node: String, why: String },
    /// Take these nodes away (after a quiet period the runtime checks the decision again against
    /// `before`, the pods each node had).
    Consolidate { decision: Decision, before: BTreeMap<String, Vec<String>> },
}

/// What the runtime knows about the pool's nodes now.
pub struct Clock<'a> {
    pub now: time::OffsetDateTime,
    /// The node is being drained already.
    pub draining: &'a dyn Fn(&str) -> bool,
    /// The candidate has had no pod to move for `consolidateAfter`.
    pub empty_long_enough: &'a dyn Fn(&Candidate<'_>) -> bool,
    /// The candidate's pods have not changed for `consolidateAfter`.
    pub settled: &'a dyn Fn(&Candidate<'_>) -> bool,
    /// Why consolidation must wait (pods waiting for capacity, claims still launching).
    pub hold: Option<String>,
}

/// The commands of one pass over `pool` (its `nodes` from [`consolidation::pool_nodes`]).
/// `provider_drift` gives the cloud provider's own reason a claim's node drifted.
pub fn disrupt_pool(world: &World<'_>, pool: &NodePool, settings: &DisruptionSettings, nodes: &PoolNodes<'_>, clock: &Clock<'_>, provider_drift: &dyn Fn(&NodeClaim) -> Option<String>, search: Search) -> Vec<Command> {
    let claims = world.state.claims_by_node();
    let claim_of = |c: &Candidate<'_>| claims.get(c.name()).map(|c| c.as_ref());
    if let Some(expire) = settings.expire_after {
        let created = |c: &Candidate<'_>| claim_of(c).and_then(|cl| cl.metadata.creation_timestamp.as_ref()).and_then(|t| age_at(&t.0.to_string(), clock.now));
        let expired: Vec<Command> = nodes.candidates.iter().filter(|c| created(c).is_some_and(|a| a >= expire)).take(nodes.budget(settings, "Expired")).map(|c| Command::Expire { node: c.name().to_string() }).collect();
        if !expired.is_empty() || nodes.candidates.iter().any(|c| (clock.draining)(c.name())) {
            return expired;
        }
    }
    let drifted: Vec<Command> = nodes
        .candidates
        .iter()
        .filter(|c| !(clock.draining)(c.name()))
        .filter_map(|c| {
            let claim = claim_of(c)?;
            let labels = c.node.metadata.labels.clone().unwrap_or_default();
            let why = crate::drift::drift_reason(claim, pool, &|k| labels.get(k).cloned()).or_else(|| provider_drift(claim))?;
            Some(Command::Replace { node: c.name().to_string(), why })
        })
        .take(nodes.budget(settings, "Drifted"))
        .collect();
    if !drifted.is_empty() {
        return drifted;
    }
    if clock.hold.is_some() {
        return Vec::new();
    }
    let Some(decision) = consolidation::consolidate_pool(world, &pool.name(), settings, nodes, clock.empty_long_enough, clock.settled, search) else { return Vec::new() };
    let chosen: Vec<&Candidate> = nodes.candidates.iter().filter(|c| decision.nodes.iter().any(|n| n == c.name())).collect();
    let before = consolidation::signature(&chosen);
    vec![Command::Consolidate { decision, before }]
}

#[cfg(test)]
mod tests;
