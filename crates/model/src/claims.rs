//! The NodeClaim a planned node becomes: written before the cloud is asked for the node, so a
//! restart finds every launch it must finish. Built purely from the plan and the cluster state.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use archer_api::nodeclaim::{NodeClaim, NodeClaimSpec};
use archer_api::nodepool::{NodePool, RequirementDoc};
use archer_core::labels;
use archer_core::packer::{Offering, PlannedNode};

use crate::objects::pod_id;
use crate::{adapter, ClusterState};

/// The NodeClaim for one planned node: its pool's template, the offering's shape and price, the
/// pods it was planned for, `reason` (`provisioning`, `replacement`). `Err` says why there is
/// none: the pool is gone from `state` or unusable, or the offering from `offerings`.
pub(crate) fn claim_for(state: &ClusterState, offerings: &[Offering], planned: &PlannedNode, reason: &str) -> Result<NodeClaim, String> {
    let np = state.pools.iter().find(|p| p.name() == planned.pool).ok_or_else(|| format!("NodePool {} is gone", planned.pool))?;
    let pool = np.to_pool().map_err(|e| format!("NodePool {} is unusable: {e}", planned.pool))?;
    let offering = Offering::find_for_pool(offerings, &planned.pool, &planned.instance_type, &planned.zone, &planned.capacity_type)
        .ok_or_else(|| format!("{} ({}, {}) is no longer offered", planned.instance_type, planned.capacity_type, planned.zone))?;
    let t = &offering.instance;
    // Extended resources as the type offers them: GPUs, and what overlays' `capacity` gives it.
    let with_extended = |mut m: BTreeMap<String, String>| {
        m.extend(t.extended_resources().into_iter().map(|(k, v)| (k, v.to_string())));
        m
    };
    let q = |cpu_millis: i64, mem: i64, pods: i64| BTreeMap::from([("cpu".to_string(), format!("{cpu_millis}m")), ("memory".to_string(), format!("{}Ki", mem / 1024)), ("pods".to_string(), pods.to_string())]);
    Ok(NodeClaim {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", planned.pool)),
            annotations: Some(BTreeMap::from([
                (labels::PLANNED_PODS_ANNOTATION.to_string(), planned.pods.join(",")),
                (crate::drift::POOL_HASH_ANNOTATION.to_string(), crate::drift::pool_hash(np)),
            ])),
            labels: Some(BTreeMap::from([(labels::NODEPOOL.to_string(), planned.pool.clone()), (labels::KARPENTER_NODEPOOL.to_string(), planned.pool.clone())])),
            ..Default::default()
        },
        spec: NodeClaimSpec {
            node_pool: planned.pool.clone(),
            instance_type: t.name.clone(),
            zone: offering.zone.clone(),
            capacity_type: planned.capacity_type.clone(),
            arch: t.arch.clone(),
            os: t.os.clone(),
            labels: planned_labels(offering, &pool, planned),
            taints: np.spec.template.spec.taints.clone(),
            startup_taints: np.spec.template.spec.startup_taints.clone(),
            capacity: with_extended(q(i64::from(t.vcpu) * 1000, t.memory_mib as i64 * 1024 * 1024, t.max_pods)),
            allocatable: with_extended(q(t.allocatable.cpu_millis, t.allocatable.memory_bytes, t.allocatable.pods)),
            price_per_hour: offering.price,
            expire_after: np.spec.template.spec.expire_after.clone(),
            reason: Some(reason.into()),
            node_class_ref: np.spec.template.spec.node_class_ref.clone(),
            requirements: claim_requirements(state, np, planned),
        },
        status: None,
    })
}

/// Whether a claim made for `planned` may still be written on `now` (the caches when it is
/// written): its pool was not deleted and its offering is still offered since the decision. The
/// launcher's guard between a decision and its writes.
pub fn still_launchable(now: &ClusterState, planned: &PlannedNode) -> Result<(), String> {
    if !now.pools.iter().any(|p| p.name() == planned.pool && p.metadata.deletion_timestamp.is_none()) {
        return Err(format!("NodePool {} was deleted after the plan was made", planned.pool));
    }
    if Offering::find(&now.offerings, &planned.instance_type, &planned.zone, &planned.capacity_type).is_none() {
        return Err(format!("{} ({}, {}) is no longer offered", planned.instance_type, planned.capacity_type, planned.zone));
    }
    Ok(())
}

/// The labels the node carries: the offering's in its pool, and the values the plan chose for
/// keys the pool's requirements leave open ([`PlannedNode::labels`]).
fn planned_labels(offering: &Offering, pool: &archer_core::packer::Pool, planned: &PlannedNode) -> BTreeMap<String, String> {
    let mut labels = offering.labels(pool);
    labels.extend(planned.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    labels
}

/// The pool's requirements, and the planned instance type as a requirement when a planned pod
/// selects on anything but the node's architecture, OS, zone, region, capacity type or pool:
/// a provider may then launch no other type than the one planned.
fn claim_requirements(state: &ClusterState, pool: &NodePool, planned: &PlannedNode) -> Vec<RequirementDoc> {
    let mut r = pool.spec.template.spec.requirements.clone();
    let wanted: HashSet<&str> = planned.pods.iter().map(String::as_str).collect();
    let pins = state.pods.iter().filter(|p| wanted.contains(pod_id(p).as_str())).any(|p| adapter::selects_on_instance_shape(p));
    if pins {
        r.push(RequirementDoc { key: labels::INSTANCE_TYPE.into(), operator: "In".into(), values: vec![planned.instance_type.clone()], min_values: None });
    }
    r
}


#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn pool() -> NodePool {
        serde_json::from_value(serde_json::json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodePool", "metadata": {"name": "general"},
            "spec": {"template": {"spec": {"requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64", "amd64"]}],
                "taints": [{"key": "team", "value": "a", "effect": "NoSchedule"}], "startupTaints": [{"key": "boot", "effect": "NoSchedule"}], "expireAfter": "24h"}}}}))
        .expect("pool")
    }

    fn pod(name: &str, node_selector: serde_json::Value) -> Arc<k8s_openapi::api::core::v1::Pod> {
        Arc::new(serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": "default"}, "spec": {"containers": [{"name": "c", "image": "x"}], "nodeSelector": node_selector}})).expect("pod"))
    }

    #[test]
    fn a_planned_node_becomes_a_claim_with_its_pools_template_and_the_offerings_shape() {
        let offerings = Offering::embedded_on_demand();
        let o = Offering::find(&offerings, "m7g.large", "us-east-1a", "on-demand").expect("m7g.large");
        let planned = PlannedNode { name: "general-1".into(), pool: "general".into(), instance_type: "m7g.large".into(), arch: "arm64".into(), zone: "us-east-1a".into(), capacity_type: "on-demand".into(), price_per_hour: o.price, pods: vec!["default/a".into(), "default/b".into()], labels: Default::default() };
        let state = ClusterState { pools: vec![Arc::new(pool())], pods: vec![pod("a", serde_json::json!({})), pod("b", serde_json::json!({"kubernetes.io/arch": "arm64"}))], ..Default::default() };
        let c = claim_for(&state, &offerings, &planned, "provisioning").expect("claim");
        assert_eq!(c.metadata.generate_name.as_deref(), Some("general-"));
        let a = c.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(a.get(labels::PLANNED_PODS_ANNOTATION).map(String::as_str), Some("default/a,default/b"));
        assert!(a.contains_key(crate::drift::POOL_HASH_ANNOTATION));
        let s = &c.spec;
        assert_eq!((s.instance_type.as_str(), s.arch.as_str(), s.zone.as_str(), s.reason.as_deref()), ("m7g.large", "arm64", "us-east-1a", Some("provisioning")));
        assert_eq!(s.price_per_hour, o.price);
        assert_eq!(s.capacity.get("cpu").map(String::as_str), Some("2000m"));
        assert_eq!(s.allocatable.get("pods").map(String::as_str), Some("29"));
        assert_eq!((s.taints.len(), s.startup_taints.len(), s.expire_after.as_deref()), (1, 1, Some("24h")));
        assert_eq!(s.labels.get(labels::ARCH).map(String::as_str), Some("arm64"));
        assert_eq!(s.requirements.len(), 1, "no planned pod selects on the instance's shape: the pool's requirements only");
        // A pod selecting on something only the planned type has pins the claim to it.
        let pinned = ClusterState { pods: vec![pod("a", serde_json::json!({"node.kubernetes.io/instance-type": "m7g.large"}))], ..state.clone() };
        let c = claim_for(&pinned, &offerings, &planned, "replacement").expect("claim");
        assert!(c.spec.requirements.iter().any(|r| r.key == labels::INSTANCE_TYPE && r.values == ["m7g.large"]));
        // Gone pool or offering: no claim.
        assert_eq!(claim_for(&ClusterState::default(), &offerings, &planned, "provisioning").err(), Some(format!("NodePool {} is gone", planned.pool)));
        // Between the decision and the write: the pool deleted, or the offering withdrawn.
        let now = ClusterState { offerings: Arc::new(offerings.clone()), ..state.clone() };
        assert_eq!(still_launchable(&now, &planned), Ok(()));
        assert_eq!(still_launchable(&ClusterState { pools: Vec::new(), ..now.clone() }, &planned), Err(format!("NodePool {} was deleted after the plan was made", planned.pool)));
        assert!(still_launchable(&ClusterState { offerings: Arc::default(), ..now.clone() }, &planned).is_err_and(|e| e.ends_with("is no longer offered")));
        assert!(claim_for(&state, &[], &planned, "provisioning").is_err_and(|e| e.ends_with("is no longer offered")));
    }
}
