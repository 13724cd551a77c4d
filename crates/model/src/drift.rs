//! Drift, decided purely: a node no longer matches what its pool would launch now. The pool's
//! node template (labels, annotations, taints, startup taints, node class) is hashed onto each
//! claim when it is written; a claim whose hash differs from the pool's current one, or whose
//! node's labels no longer satisfy the pool's requirements, has drifted. The cloud provider adds
//! its own reasons (a changed node class, a newer image).

use sha2::{Digest, Sha256};

use archer_api::nodeclaim::NodeClaim;
use archer_api::nodepool::NodePool;

/// On a NodeClaim: the hash of its pool's node template when it was written.
pub(crate) const POOL_HASH_ANNOTATION: &str = "archer.dev/nodepool-hash";

/// The hash of the parts of a pool's template that shape a node (requirements are checked
/// against the node's labels instead, as Karpenter does, so widening them drifts nothing).
pub(crate) fn pool_hash(pool: &NodePool) -> String {
    let t = &pool.spec.template;
    let shape = serde_json::json!({
        "labels": t.metadata.labels,
        "annotations": t.metadata.annotations,
        "taints": t.spec.taints,
        "startupTaints": t.spec.startup_taints,
        "nodeClassRef": t.spec.node_class_ref,
    });
    hex::encode(Sha256::digest(shape.to_string().as_bytes()).get(..8).unwrap_or_default())
}

/// Why a claim's node has drifted from its pool, if it has. `node_label` reads the node's labels.
pub(crate) fn drift_reason(claim: &NodeClaim, pool: &NodePool, node_label: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let recorded = claim.metadata.annotations.as_ref().and_then(|a| a.get(POOL_HASH_ANNOTATION));
    if let Some(h) = recorded {
        if *h != pool_hash(pool) {
            return Some(format!("NodePool {} changed its node template", pool.name()));
        }
    }
    // The pool's own requirements (not the defaults it implies), one at a time to say which.
    for q in &pool.spec.template.spec.requirements {
        let mut one = archer_core::requirements::Requirements::new();
        if one.add(&q.key, &q.operator, &q.values).is_err() {
            continue;
        }
        if !one.matches(node_label) {
            return Some(format!("the node's {}={} no longer meets NodePool {}'s requirements", q.key, node_label(&q.key).unwrap_or_default(), pool.name()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn pool(yaml: &str) -> NodePool {
        archer_core::yaml::from_str(yaml).expect("pool")
    }

    const POOL: &str = "apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: p}\nspec:\n  template:\n    metadata: {labels: {team: a}}\n    spec:\n      requirements: [{key: kubernetes.io/arch, operator: In, values: [arm64, amd64]}]\n";

    fn claim_of(p: &NodePool) -> NodeClaim {
        let mut c: NodeClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": "p-1"},
            "spec": {"nodePool": "p", "instanceType": "m6g.large", "zone": "us-east-1a", "capacityType": "on-demand", "arch": "arm64", "os": "linux", "pricePerHour": 0.077}
        }))
        .expect("claim");
        c.metadata.annotations = Some(BTreeMap::from([(POOL_HASH_ANNOTATION.to_string(), pool_hash(p))]));
        c
    }

    #[test]
    fn a_changed_template_or_narrowed_requirements_drift_and_nothing_else_does() {
        let before = pool(POOL);
        let claim = claim_of(&before);
        let arm = |k: &str| (k == "kubernetes.io/arch").then(|| "arm64".to_string());
        assert_eq!(drift_reason(&claim, &before, &arm), None);
        // Widening requirements or changing the weight shapes no node: no drift.
        let wider = pool(&POOL.replace("[arm64, amd64]", "[arm64, amd64, s390x]").replace("spec:\n  template", "spec:\n  weight: 5\n  template"));
        assert_eq!(drift_reason(&claim, &wider, &arm), None);
        // A new template label: drift.
        let relabelled = pool(&POOL.replace("team: a", "team: b"));
        assert!(drift_reason(&claim, &relabelled, &arm).is_some_and(|r| r.contains("node template")));
        // Requirements that exclude the node: drift.
        let amd_only = pool(&POOL.replace("[arm64, amd64]", "[amd64]"));
        assert!(drift_reason(&claim, &amd_only, &arm).is_some_and(|r| r.contains("kubernetes.io/arch=arm64")));
        // A claim written before hashes were recorded drifts only on requirements.
        let mut old = claim.clone();
        old.metadata.annotations = None;
        assert_eq!(drift_reason(&old, &relabelled, &arm), None);
    }
}
