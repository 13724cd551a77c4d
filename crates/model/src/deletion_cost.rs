//! Which pod a scale-down removes: the `controller.kubernetes.io/pod-deletion-cost` Archer
//! gives the pods on the nodes it manages.
//!
//! A ReplicaSet that scales down deletes the pods with the lowest deletion cost first; among
//! equal costs it takes pods from the nodes that hold the most of its replicas, which thins every
//! node evenly and leaves each one partly used (consolidation then evicts pods to empty them).
//! Archer gives every pod the cost of its node, one order of nodes for every ReplicaSet: the
//! pods on the dearest node go first, nodes of one price in a fixed order (a hash of the node's
//! name). Scale-downs then empty whole nodes, the dearest first, and those go without an
//! eviction. (Ordering first by the ReplicaSet's share of each node, so that a node it fills
//! alone goes first, emptied more nodes offline but left the dear shared nodes holding a few
//! small pods each, which consolidation then had to move: measured worse on the comparison's
//! consolidation workload, 258 evictions against 116.)
//!
//! A pod whose cost someone else set (no `archer.dev/deletion-cost` record of the same value) is
//! left alone. Only pods a ReplicaSet owns, bound to a node of a NodePool, and not terminating.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::objects;
use crate::ClusterState;

pub use archer_core::labels::{ARCHER_DELETION_COST, POD_DELETION_COST};

/// Costs lie in [0, (MAX_PRICE_MILLIS + 1) * PRICE_STEP), inside an int32: price, then hash.
const PRICE_STEP: i64 = 1000;
/// Hourly prices above this many thousandths of a dollar count as this ($1,000,000/h).
const MAX_PRICE_MILLIS: i64 = 999_999;

/// One pod's deletion cost to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostWrite {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub cost: i32,
}

/// The deletion cost of the pods on node `name` priced `price` $/h: dearer nodes lower (to the
/// thousandth of a dollar), nodes of one price ordered by a hash of the name.
fn node_cost(name: &str, price: Option<f64>) -> i32 {
    let millis = price.filter(|p| p.is_finite() && *p > 0.0).map_or(0, |p| ((p * 1000.0).round() as i64).min(MAX_PRICE_MILLIS));
    let key = (MAX_PRICE_MILLIS - millis) * PRICE_STEP + i64::from(fnv1a(name) % PRICE_STEP as u32);
    i32::try_from(key).unwrap_or(i32::MAX)
}

/// 32-bit FNV-1a: fixed across releases and platforms (the std hasher is not).
fn fnv1a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// Is the pod's deletion cost Archer's to set: no cost, or the cost Archer recorded?
fn archers_to_set(pod: &Pod) -> bool {
    let Some(a) = pod.metadata.annotations.as_ref() else { return true };
    match (a.get(POD_DELETION_COST), a.get(ARCHER_DELETION_COST)) {
        (None, _) => true,
        (Some(cost), Some(ours)) => cost == ours,
        (Some(_), None) => false,
    }
}

/// Does a ReplicaSet control the pod (only ReplicaSets read the cost)?
fn owned_by_replica_set(pod: &Pod) -> bool {
    pod.metadata.owner_references.as_ref().is_some_and(|o| o.iter().any(|r| r.controller == Some(true) && r.kind == "ReplicaSet"))
}

/// The pods of `state` whose deletion cost Archer should write now, at most `limit` of them
/// (the others on a later pass), in the state's pod order: live ReplicaSet pods bound to a node
/// of a NodePool, whose cost is Archer's to set and not yet their node's.
pub fn writes(state: &ClusterState, limit: usize) -> Vec<CostWrite> {
    let managed: HashMap<&str, &Node> = state.nodes.iter().filter(|n| objects::node_pool_of(n).is_some()).filter_map(|n| Some((n.metadata.name.as_deref()?, n.as_ref()))).collect();
    let prices = state.pricer();
    let mut out = Vec::new();
    for pod in &state.pods {
        if out.len() >= limit {
            break;
        }
        let Some((node, n)) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).and_then(|name| Some((name, *managed.get(name)?))) else { continue };
        if pod.metadata.deletion_timestamp.is_some() || archer_core::is_terminal(pod) || objects::is_daemon_pod(pod) || !owned_by_replica_set(pod) || !archers_to_set(pod) {
            continue;
        }
        let cost = node_cost(node, prices.per_hour(n));
        let written = pod.metadata.annotations.as_ref().and_then(|a| a.get(POD_DELETION_COST)).and_then(|v| v.parse::<i32>().ok());
        if written == Some(cost) {
            continue;
        }
        let (Some(namespace), Some(name)) = (pod.metadata.namespace.clone(), pod.metadata.name.clone()) else { continue };
        out.push(CostWrite { namespace, name, node: node.to_string(), cost });
    }
    out
}

#[cfg(test)]
mod tests;
