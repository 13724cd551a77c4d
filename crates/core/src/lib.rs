//! Archer's deciding code, free of I/O: platforms, namespace policy, the placement decision and
//! its patch; the scheduling model, packer and planner; instance types and their prices (the
//! catalog, data). No tokio, kube client or cloud SDK: the compiler keeps it pure.
#![forbid(unsafe_code)]

pub mod catalog;
mod cloud_labels;
pub mod exec_format;
pub mod instance;
pub mod labels;
pub mod packer;
pub mod patch;
pub mod placement;
pub mod platform;
pub mod planner;
pub mod policy;
pub mod quantity;
pub mod requirements;
pub mod resources;
pub mod safety_net;
pub mod sched;
pub mod scoring;
pub mod taints;
pub mod words;
pub mod yaml;

#[cfg(test)]
mod placement_tests;

/// A pod's key in plans, placements and hints: `namespace/name` (`default` when unset).
pub fn pod_id(p: &k8s_openapi::api::core::v1::Pod) -> String {
    format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or("default"), p.metadata.name.as_deref().unwrap_or(""))
}

/// Has the pod finished (phase `Succeeded` or `Failed`)?
pub fn is_terminal(p: &k8s_openapi::api::core::v1::Pod) -> bool {
    matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// Does the pod still wait for a node: not bound, not being deleted, not finished?
pub fn awaits_node(p: &k8s_openapi::api::core::v1::Pod) -> bool {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_none_or(str::is_empty) && p.metadata.deletion_timestamp.is_none() && !is_terminal(p)
}

#[cfg(test)]
mod pod_tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn a_pod_awaits_a_node_until_bound_deleted_or_finished() {
        let spec = serde_json::json!({"containers": [{"name": "c", "image": "x"}]});
        assert!(awaits_node(&pod(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))));
        assert!(awaits_node(&pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [], "nodeName": ""}}))), "an empty nodeName is unbound");
        assert!(!awaits_node(&pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [], "nodeName": "n1"}}))), "bound");
        assert!(!awaits_node(&pod(serde_json::json!({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": spec}))), "being deleted");
        for phase in ["Succeeded", "Failed"] {
            let done = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": spec, "status": {"phase": phase}}));
            assert!(is_terminal(&done) && !awaits_node(&done), "{phase}");
        }
        assert!(!is_terminal(&pod(serde_json::json!({"metadata": {"name": "p"}, "spec": spec, "status": {"phase": "Pending"}}))));
        assert_eq!(pod_id(&pod(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))), "default/p");
    }
}
