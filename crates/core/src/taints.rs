//! Taints and tolerations as kube-scheduler's TaintToleration plugin matches them.

use k8s_openapi::api::core::v1::Toleration;

/// Does `toleration` tolerate the taint `key=value:effect`? An empty effect tolerates every
/// effect; `Exists` with an empty key tolerates every taint; `Equal` (or no operator) needs the
/// value to match.
pub fn tolerates(toleration: &Toleration, key: &str, value: &str, effect: &str) -> bool {
    let effect_ok = toleration.effect.as_deref().is_none_or(|e| e.is_empty() || e == effect);
    let key_ok = match toleration.key.as_deref() {
        None | Some("") => toleration.operator.as_deref() == Some("Exists"),
        Some(k) => k == key,
    };
    let value_ok = match toleration.operator.as_deref() {
        Some("Exists") => true,
        _ => toleration.value.as_deref().unwrap_or("") == value,
    };
    effect_ok && key_ok && value_ok
}

/// The first taint with a scheduling effect (NoSchedule, NoExecute) no toleration tolerates.
pub(crate) fn untolerated<'a>(taints: &'a [k8s_openapi::api::core::v1::Taint], tolerations: &[Toleration]) -> Option<&'a k8s_openapi::api::core::v1::Taint> {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, &t.key, t.value.as_deref().unwrap_or(""), &t.effect)))
}

/// Does the node carry a taint with this key?
pub fn node_has_taint(node: &k8s_openapi::api::core::v1::Node, key: &str) -> bool {
    node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|t| t.iter().any(|t| t.key == key))
}

/// The taints a new node carries until it is registered and Ready: while it has one, the pods a
/// plan put there wait for it.
pub const REGISTERING_TAINTS: [&str; 2] = [crate::labels::UNREGISTERED_TAINT, "node.kubernetes.io/not-ready"];

/// Is this one of [`REGISTERING_TAINTS`]?
pub fn is_registering_taint(key: &str) -> bool {
    REGISTERING_TAINTS.contains(&key)
}

/// Is the node still registering (one of [`REGISTERING_TAINTS`] on it)?
pub fn node_registering(node: &k8s_openapi::api::core::v1::Node) -> bool {
    REGISTERING_TAINTS.iter().any(|k| node_has_taint(node, k))
}
