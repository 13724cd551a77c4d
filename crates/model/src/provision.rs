//! One provisioning batch, decided from one [`ClusterState`]: the plan for the pods it plans
//! (room already there, then new nodes), and the NodeClaim of each new node, made from the same
//! state. The runtime only fills in the platforms of the pods first (registry lookups) and then
//! carries the result out; a claim that cannot be made (its pool or offering gone) comes back
//! with the reason, for an Event.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use archer_api::nodeclaim::NodeClaim;
use archer_core::packer::{batch_budget, PlannedNode, Plan, Unschedulable};
use archer_core::planner::{plan_batch_within, Pending};
use archer_core::sched::preferences::Policy;
use archer_core::sched::Volumes;

use crate::{adapter, claims, ClusterState};

/// The planner's view of `pods` through the one adapter, with the platforms `state` knows. Each
/// carries the node an earlier plan put it on: the state's plans (this process's latest), else
/// the live claims' record (after a restart).
fn pending_pods<P: std::borrow::Borrow<Pod>>(state: &ClusterState, pods: &[P], volumes: &Volumes, preferences: Policy) -> Vec<Pending> {
    let claimed = state.planned_nodes();
    pods.iter()
        .map(|p| {
            let p: &Pod = p.borrow();
            let mut pending = adapter::pending(p, state.pod_platforms(p), volumes, preferences);
            let latest = state.plans.placement(&pending.packer.id).map(|at| at.node.clone());
            pending.planned = latest.or_else(|| claimed.get(&pending.packer.id).cloned());
            pending
        })
        .collect()
}

/// The plan for `pending` (from [`ClusterState::provisionable`]) on `state`, within `budget` of
/// packing time. Its new nodes' claims: [`claims_for`].
pub fn provision(state: &ClusterState, pending: &[Arc<Pod>], preferences: Policy, budget: Duration) -> Plan {
    let pools = state.packer_pools();
    let batch = pending_pods(state, pending, &state.volumes(), preferences);
    if pools.is_empty() {
        return Plan { unschedulable: batch.iter().map(|p| Unschedulable { pod: p.packer.id.clone(), reason: "no NodePool exists".into() }).collect(), ..Default::default() };
    }
    let snapshot = state.snapshot(&pools, &|_| false);
    plan_batch_within(&snapshot, &batch, &pools, &state.offerings, batch_budget(budget, batch.len()))
}

/// The claim of each planned node, made from `state` (`reason`: `provisioning`, `replacement`).
pub fn claims_for(state: &ClusterState, nodes: &[PlannedNode], reason: &str) -> Vec<(PlannedNode, Result<NodeClaim, String>)> {
    nodes.iter().map(|n| (n.clone(), claims::claim_for(state, &state.offerings, n, reason))).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, reason = "test code")]
    use super::*;
    use crate::plans::{Placement, Plans};
    use archer_core::packer::Offering;
    use serde_json::json;

    fn state() -> (ClusterState, Arc<Pod>) {
        let (pod, pool) = crate::cluster::tests::web_pod_and_pool(json!({}));
        let pod = Arc::new(pod);
        (ClusterState { pods: vec![pod.clone()], pools: vec![Arc::new(pool)], offerings: Arc::new(Offering::embedded_on_demand()), ..Default::default() }, pod)
    }

    #[test]
    fn a_batch_plans_and_claims_from_one_state() {
        let (mut state, pod) = state();
        let (pending, _) = state.provisionable(&[]);
        assert_eq!(pending.len(), 1);
        let plan = provision(&state, &pending, Policy::default(), Duration::from_secs(1));
        assert_eq!(plan.nodes.len(), 1, "{plan:?}");
        let made = claims_for(&state, &plan.nodes, "provisioning");
        assert!(made[0].1.as_ref().is_ok_and(|c| c.spec.node_pool == "general"));
        // The pool gone from the state the claims are made from: the reason, not a silent skip.
        let gone = ClusterState { pools: Vec::new(), ..state.clone() };
        assert_eq!(claims_for(&gone, &plan.nodes, "provisioning")[0].1.as_ref().err().map(String::as_str), Some("NodePool general is gone"));
        // No pool at all: every pod is unschedulable, and says why.
        let plan = provision(&gone, &pending, Policy::default(), Duration::from_secs(1));
        assert_eq!(plan.unschedulable.iter().map(|u| (u.pod.as_str(), u.reason.as_str())).collect::<Vec<_>>(), vec![("shop/web", "no NodePool exists")]);
        // The state's plans name the node an earlier plan put the pod on.
        state.plans = Plans::new(1, 0, Arc::new([("shop/web".to_string(), Placement { node: "general-abc".into(), at_ms: 0 })].into()), Arc::default());
        let batch = pending_pods(&state, &[pod], &state.volumes(), Policy::default());
        assert_eq!(batch[0].planned.as_deref(), Some("general-abc"));
    }
    /// A pod whose images run on both architectures but which carries no affinity (its
    /// inspection failed open, or it was admitted before its namespace's policy) is planned onto
    /// an architecture its namespace allows, under a mode that changes placement; under observe
    /// the namespace's policy moves nothing. Archer's provisioner and extender read the same rule.
    #[test]
    fn a_pod_is_planned_only_onto_architectures_its_namespace_allows() {
        let arch = |annotations: serde_json::Value| {
            let (mut state, _) = state();
            state.platforms.insert("example.com/web:1".into(), archer_core::platform::PlatformSet::parse_annotation("linux/amd64,linux/arm64").expect("platforms"));
            let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop", "annotations": annotations}});
            state.namespaces.push(Arc::new(serde_json::from_value(namespace).expect("namespace")));
            let (pending, _) = state.provisionable(&[]);
            let plan = provision(&state, &pending, Policy::default(), Duration::from_secs(1));
            plan.nodes.iter().map(|n| n.arch.clone()).collect::<Vec<_>>()
        };
        assert_eq!(arch(json!({})), ["arm64"], "no policy: the cheaper arm64 node");
        assert_eq!(arch(json!({"archer.dev/allowed-architectures": "amd64"})), ["amd64"]);
        assert_eq!(arch(json!({"archer.dev/allowed-architectures": "amd64", "archer.dev/mode": "gate"})), ["amd64"]);
        assert_eq!(arch(json!({"archer.dev/allowed-architectures": "amd64", "archer.dev/mode": "observe"})), ["arm64"], "observe changes no placement");
        // The cluster-wide default stands where the namespace says nothing.
        let (mut state, _) = state();
        state.platforms.insert("example.com/web:1".into(), archer_core::platform::PlatformSet::parse_annotation("linux/amd64,linux/arm64").expect("platforms"));
        state.policy_defaults = Arc::new(archer_core::policy::PolicyDefaults { allowed_architectures: vec!["amd64".into()], ..Default::default() });
        assert_eq!(state.policy("shop").allowed_architectures.as_deref(), Some(&["amd64".to_string()][..]));
        let (pending, _) = state.provisionable(&[]);
        assert_eq!(provision(&state, &pending, Policy::default(), Duration::from_secs(1)).nodes.iter().map(|n| n.arch.as_str()).collect::<Vec<_>>(), ["amd64"]);
    }
}
