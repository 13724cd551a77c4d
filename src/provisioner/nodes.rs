//! Writes on Nodes shared by the executors: the disruption taint, and removing a taint safely.

use k8s_openapi::api::core::v1::Node;
use kube::api::Patch;
use kube::{Api, Client};

use archer_core::labels;
use archer_model::objects as state;

/// Taint a node as being disrupted (the scheduler stops adding pods to it).
pub async fn taint(client: &Client, node: &Node) {
    let name = node.metadata.name.clone().unwrap_or_default();
    if state::has_taint(node, labels::DISRUPTED_TAINT) {
        return;
    }
    let mut taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    taints.push(k8s_openapi::api::core::v1::Taint { key: labels::DISRUPTED_TAINT.into(), value: None, effect: "NoSchedule".into(), time_added: None });
    let patch = serde_json::json!({"spec": {"taints": taints}});
    if let Err(e) = Api::<Node>::all(client.clone()).patch(&name, &archer_api::apply::patch_params(), &Patch::Merge(patch)).await {
        tracing::warn!(node = %name, error = %e, "could not taint the node");
    }
}

/// Remove the taint `key` from a node: a JSON patch that tests the taint is still at the index
/// it was read from, so it neither conflicts with kwok's status updates nor removes a taint
/// someone added meanwhile (retried on a failed test). True when this call removed it.
pub async fn remove_taint(client: &Client, node: &str, key: &str) -> bool {
    let api: Api<Node> = Api::all(client.clone());
    for _ in 0..5 {
        let n = match api.get_opt(node).await {
            Ok(Some(n)) => n,
            Ok(None) => return false,
            Err(e) => {
                tracing::debug!(node, key, error = %e, "taint removal deferred");
                return false;
            }
        };
        let taints: Vec<_> = n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        let Some(i) = taints.iter().position(|t| t.key == key) else { return false };
        let ops = serde_json::json!([
            {"op": "test", "path": format!("/spec/taints/{i}/key"), "value": key},
            {"op": "remove", "path": format!("/spec/taints/{i}")}
        ]);
        let Ok(patch) = serde_json::from_value::<json_patch::Patch>(ops) else { return false };
        match api.patch(node, &archer_api::apply::patch_params(), &Patch::<()>::Json(patch)).await {
            Ok(_) => return true,
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422 => continue,
            Err(e) => {
                tracing::debug!(node, key, error = %e, "taint removal deferred");
                return false;
            }
        }
    }
    false
}
