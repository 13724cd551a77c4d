//! The extender's hand-off to kube-scheduler: which node a pending pod should take now, given
//! where the provisioner's plans put it and the room they hold for others. Pure over one
//! [`ClusterState`] (its `plans`, nodes, claims and pods); the extender turns the answers into
//! filter results.
//!
//! **Steering** ([`steer`]). A pod a plan put on a node kube-scheduler offers takes only that
//! node. Otherwise it waits (every candidate refused) only for something a cluster event ends,
//! because kube-scheduler tries a pod it could not place again only on events its own filters
//! care about: a wait a timer alone ended would hold the pod until its periodic flush of
//! unschedulable pods (5 minutes). The pod waits for its planned node
//! - while the node is still registering, or was seen registered less than
//!   [`SCHEDULER_VIEW_LAG`] ago and would take the pod (kube-scheduler's cache can lag Archer's;
//!   the taints going away is a Node event it requeues on);
//! - while the node is not made yet and its claim is live, for at most [`PLAN_PATIENCE`] (the
//!   plan may have opened a domain kube-scheduler cannot see yet; the Node's creation requeues);
//! - while kube-scheduler refuses it for topology spread alone and pods the spread counts are
//!   still pending under a plan that will bind them, for at most [`PLAN_PATIENCE`] (each of them
//!   binding is a Pod event PodTopologySpread requeues on).
//!
//! A node refused for anything else (its room taken, ports, affinity) is not waited for: no event
//! may ever come.
//!
//! **Held room** ([`HeldRoom`]). kube-scheduler binds pods one at a time in its own queue order
//! and knows nothing of the plan that bought a node: a pod the plan put elsewhere can take the
//! room the plan counted on for another pod, which then needs yet another node. kube-scheduler
//! holds room the same way for the pods it nominates when it preempts (their requests count on
//! the nominated node for pods of no higher priority); the hand-off does it for the plan's pods.
//! The refusal never strands a pod: when every candidate is held, nothing is.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};

use archer_core::sched::{NodeInfo, PodInfo, Snapshot};

use archer_core::{awaits_node, pod_id};
use crate::plans::Placement;
use crate::ClusterState;

/// How long after its plan a pod may wait for its planned node: to be created, or to be
/// accepted by kube-scheduler's spread.
const PLAN_PATIENCE: Duration = Duration::from_secs(60);

/// How long after Archer saw a node finish registering kube-scheduler may still filter on a view
/// in which it has not (its informer lags under load; tens of milliseconds were seen on a busy
/// 2-core machine, where a pod then bound to a sibling node the plan had counted on for others).
const SCHEDULER_VIEW_LAG: Duration = Duration::from_secs(5);

/// The plan's node for a pod, and why every other candidate is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steer {
    pub node: String,
    pub why: String,
    /// The planned node is among the candidates (the pod binds there now).
    pub offered: bool,
}

/// Where the pod must go now, if its plan decides it (see the module's doc); `candidates` are
/// the nodes kube-scheduler found feasible. `None`: no steering, any candidate will do.
pub fn steer(state: &ClusterState, pod: &Pod, candidates: &[&str]) -> Option<Steer> {
    let placement = state.plans.placement(&pod_id(pod))?;
    if let Some(s) = offered(placement, candidates) {
        return Some(s);
    }
    let planned = placement.node.as_str();
    let since_plan = state.plans.age(placement.at_ms);
    let waits = |why: String| Some(Steer { node: planned.to_string(), why, offered: false });
    let Some(node) = state.node(planned) else {
        return node_coming(planned, since_plan, state).and_then(waits);
    };
    // Registered moments ago counts only while the node would take the pod by Archer's own view
    // of it: if its room is taken, kube-scheduler refuses it for that, and no event would end
    // the wait.
    let recently = state.plans.registered_at(planned).map(|at| state.plans.age(at)).filter(|d| *d < SCHEDULER_VIEW_LAG);
    let recently = recently.filter(|_| !archer_core::taints::node_registering(node) && fits_alone(&PodInfo::from_pod(pod), node, state));
    if let Some(why) = awaiting_registration(planned, node, recently) {
        return waits(why);
    }
    if since_plan < PLAN_PATIENCE && refused_only_for_spread(pod, node, state) && siblings_coming(pod, state) {
        return waits(format!("waiting for node {planned}, where the provisioning plan put the pod, until the pods planned before it in other domains land"));
    }
    None
}

/// The pod takes only its planned node when kube-scheduler offers it: the first rule of
/// [`steer`], which needs nothing but the pod's placement (the extender answers it before
/// building a state).
pub fn offered(placement: &Placement, candidates: &[&str]) -> Option<Steer> {
    let planned = placement.node.as_str();
    candidates.contains(&planned).then(|| Steer { node: planned.to_string(), why: format!("the provisioning plan put the pod on node {planned}"), offered: true })
}

/// Why a pod should wait for `planned`, the node its plan bought, which kube-scheduler did not
/// offer: the node is still registering, or was seen registered `registered_for` ago, less than
/// [`SCHEDULER_VIEW_LAG`]. `None`: the node is up and kube-scheduler refused it for reasons of
/// its own.
fn awaiting_registration(planned: &str, node: &Node, registered_for: Option<Duration>) -> Option<String> {
    if archer_core::taints::node_registering(node) {
        return Some(format!("waiting for node {planned}, which the provisioning plan bought for the pod, to register"));
    }
    registered_for
        .is_some_and(|d| d < SCHEDULER_VIEW_LAG)
        .then(|| format!("waiting for kube-scheduler to see node {planned}, which the provisioning plan bought for the pod, registered"))
}

/// Why the pod waits for `planned`, the node its plan (made `since_plan` ago) bought for it,
/// which has no Node yet: a live claim will make it (kwok names the node as its claim; a cloud
/// names it at launch, in the claim's status).
fn node_coming(planned: &str, since_plan: Duration, state: &ClusterState) -> Option<String> {
    let coming = since_plan < PLAN_PATIENCE && state.claims.iter().any(|c| !c.deleting() && c.node_name() == planned);
    coming.then(|| format!("waiting for node {planned}, which the provisioning plan bought for the pod, to be created"))
}

/// Would `node` take the pod but for topology spread across nodes? It is checked alone, with
/// the pods bound to it: every filter of the scheduling model holds there, and spread over a
/// single domain always does. Pods with required inter-pod (anti-)affinity are left out (pods
/// on other nodes decide those).
fn refused_only_for_spread(pod: &Pod, node: &Node, state: &ClusterState) -> bool {
    let info = PodInfo::from_pod(pod);
    if info.spread.is_empty() || !info.affinity.is_empty() || !info.anti_affinity.is_empty() {
        return false;
    }
    fits_alone(&info, node, state)
}

/// Would `node` take the pod by every filter of the scheduling model, checked alone with the
/// pods bound to it? A node whose room, ports or pods refuse the pod here is refused by
/// kube-scheduler for that, not for a view that lags.
fn fits_alone(info: &PodInfo, node: &Node, state: &ClusterState) -> bool {
    let Some(name) = node.metadata.name.as_deref() else { return false };
    let bound: Vec<Pod> = state.pods_on(name).map(|p| p.as_ref().clone()).collect();
    Snapshot::new(std::slice::from_ref(node), &bound, &[]).fits(info, 0).is_ok()
}

/// Will another pod the pod's spread counts bind soon, where its own plan put it? Such a pod is
/// pending with a plan whose node is still registering (it binds once the node is up), or whose
/// node takes it now by the scheduling model on the bound pods alone (kube-scheduler's view).
/// Pods that are themselves waiting for the others do not count, so pods never wait for each
/// other in a circle.
fn siblings_coming(pod: &Pod, state: &ClusterState) -> bool {
    let info = PodInfo::from_pod(pod);
    let planned: Vec<(&Pod, &str)> = state
        .pods
        .iter()
        .filter(|p| p.metadata.namespace.as_deref().unwrap_or("default") == info.namespace && p.metadata.name.as_deref() != Some(info.name.as_str()))
        .filter(|p| awaits_node(p))
        .filter(|p| {
            let labels = p.metadata.labels.clone().unwrap_or_default();
            info.spread.iter().any(|c| c.selector.matches(&labels))
        })
        .filter_map(|p| Some((p.as_ref(), state.plans.placement(&pod_id(p))?.node.as_str())))
        .collect();
    if planned.is_empty() {
        return false;
    }
    let nodes: Vec<Node> = state.nodes.iter().map(|n| n.as_ref().clone()).collect();
    let bound: Vec<Pod> = state.pods.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty())).map(|p| p.as_ref().clone()).collect();
    let snap = Snapshot::new(&nodes, &bound, &[]);
    planned.into_iter().any(|(p, node)| {
        let Some((i, planned_node)) = snap.nodes.iter().enumerate().find(|(_, n)| n.name == node) else { return false };
        let registering = planned_node.taints.iter().any(|t| archer_core::taints::is_registering_taint(&t.key));
        registering || snap.fits(&PodInfo::from_pod(p), i).is_ok()
    })
}

/// The nodes whose room plans hold, each as a one-node snapshot of its bound pods plus the
/// pending pods planned there. Built from one state and shared by the filter calls of a short
/// while: a pod binding in between counts the same on its node bound or held.
pub struct HeldRoom {
    /// The plans' version it was built from ([`crate::plans::Plans::version`]).
    pub version: u64,
    nodes: HashMap<String, Held>,
}

struct Held {
    snapshot: Mutex<Snapshot>,
    /// The pods the room is held for (`namespace/name`) and the highest of their priorities.
    pods: HashSet<String>,
    priority: i32,
}

impl HeldRoom {
    /// The room `state`'s plans hold: for the pods still pending, on the nodes in the state, that
    /// still fit beside what is there (a stale plan holds nothing).
    pub fn build(state: &ClusterState) -> Self {
        let held = state.plans.by_node();
        let wanted: HashSet<&str> = held.values().flatten().copied().collect();
        let pending: HashMap<String, &Arc<Pod>> = state.pods.iter().filter(|p| awaits_node(p)).map(|p| (pod_id(p), p)).filter(|(id, _)| wanted.contains(id.as_str())).collect();
        let waiting: HashMap<&str, Vec<&Arc<Pod>>> = held
            .iter()
            .map(|(node, ids)| (*node, ids.iter().filter_map(|i| pending.get(*i).copied()).collect::<Vec<_>>()))
            .filter(|(_, ps)| !ps.is_empty())
            .collect();
        // The pods bound to those nodes, in one pass.
        let mut bound: HashMap<&str, Vec<&Arc<Pod>>> = HashMap::new();
        if !waiting.is_empty() {
            for p in &state.pods {
                if let Some((node, _)) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).and_then(|n| waiting.get_key_value(n)) {
                    bound.entry(node).or_default().push(p);
                }
            }
        }
        let nodes = state.nodes_by_name();
        let mut out = HashMap::new();
        for (node, planned) in waiting {
            let Some(n) = nodes.get(node) else { continue };
            let mut snap = Snapshot::default();
            snap.nodes.push(NodeInfo::from_node(n));
            for p in bound.get(node).into_iter().flatten() {
                snap.bind(PodInfo::from_pod(p), 0);
            }
            let (mut ids, mut priority) = (HashSet::new(), i32::MIN);
            for q in planned {
                let info = PodInfo::from_pod(q);
                if snap.room_and_anti_affinity(&info, 0).is_ok() {
                    snap.bind(info, 0);
                    ids.insert(pod_id(q));
                    priority = priority.max(self::priority(q));
                }
            }
            if !ids.is_empty() {
                out.insert(node.to_string(), Held { snapshot: Mutex::new(snap), pods: ids, priority });
            }
        }
        HeldRoom { version: state.plans.version, nodes: out }
    }

    /// `(node, why)` for each of `candidates` (the nodes kube-scheduler found feasible, the
    /// pod's own planned node aside) whose room is held for pods other than `pod`: it does not
    /// fit there (room, host ports, anti-affinity either way) once they count as bound. As for
    /// kube-scheduler's nominated pods, a pod of higher priority than all of them is not held
    /// back. Held room never leaves a pod with no node: when every candidate is held, nothing
    /// is, and the pod binds now.
    pub fn refusals(&self, pod: &Pod, candidates: &[&str]) -> Vec<(String, String)> {
        if self.nodes.is_empty() {
            return Vec::new();
        }
        let (me, mine) = (pod_id(pod), priority(pod));
        let info = PodInfo::from_pod(pod);
        let mut out = Vec::new();
        for node in candidates {
            let Some(h) = self.nodes.get(*node) else { continue };
            if h.pods.contains(&me) || mine > h.priority {
                continue;
            }
            let snap = h.snapshot.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(why) = snap.room_and_anti_affinity(&info, 0) {
                out.push((node.to_string(), format!("room on node {node} is held for {} pending pod(s) the provisioning plan put there ({why})", h.pods.len())));
            }
        }
        if out.len() >= candidates.len() {
            return Vec::new();
        }
        out.sort();
        out
    }
}

fn priority(p: &Pod) -> i32 {
    p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

#[cfg(test)]
mod tests;
