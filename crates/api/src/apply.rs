//! Status writes by server-side apply, under Archer's one field manager, as controller-rs and
//! Karpenter write theirs. Each write carries the whole status Archer owns on the object (the
//! fields it leaves out would otherwise be taken away from it), computed from the object as read,
//! and that read's resourceVersion: a status computed from a stale read is refused (409) and
//! computed again from a fresh one, never written over a newer one.

use kube::core::params::{Patch, PatchParams, PostParams};
use kube::Resource;
use serde::Serialize;

/// The field manager of every object Archer writes.
pub(crate) const FIELD_MANAGER: &str = "archer";

/// Patch parameters under [`FIELD_MANAGER`], for Archer's writes that are not a whole status
/// (a taint, an annotation, a scheduling gate).
pub fn patch_params() -> PatchParams {
    PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }
}

/// Create and replace parameters under [`FIELD_MANAGER`] (claims, kwok's Nodes, the safety
/// record's ConfigMap).
pub fn post_params() -> PostParams {
    PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }
}

/// The parameters and body that apply `status` as the whole status of the object `name` of kind
/// `K`, read at `resource_version`. Forced: the status is Archer's, whoever wrote a field of it
/// before (a merge patch of an earlier version, a person with kubectl).
pub fn status<K: Resource<DynamicType = ()>>(name: &str, resource_version: Option<&str>, status: &impl Serialize) -> (PatchParams, Patch<serde_json::Value>) {
    let mut metadata = serde_json::Map::new();
    metadata.insert("name".into(), serde_json::json!(name));
    if let Some(rv) = resource_version {
        metadata.insert("resourceVersion".into(), serde_json::json!(rv));
    }
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": metadata,
        "status": status,
    });
    (PatchParams::apply(FIELD_MANAGER).force(), Patch::Apply(body))
}

/// `old` as a JSON merge patch of `new` (RFC 7396) would leave it: the fields `new` sets written
/// over, the ones it serialises as null removed, the ones it leaves out kept. What a writer of
/// some fields applies as the whole status.
pub fn merged<T: Serialize + serde::de::DeserializeOwned>(old: &T, new: &T) -> Result<T, serde_json::Error> {
    fn merge(into: &mut serde_json::Value, from: &serde_json::Value) {
        match (into, from) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    if v.is_null() {
                        a.remove(k);
                        continue;
                    }
                    match a.get_mut(k) {
                        Some(have) if have.is_object() && v.is_object() => merge(have, v),
                        _ => {
                            a.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            (into, from) => *into = from.clone(),
        }
    }
    let mut base = serde_json::to_value(old)?;
    merge(&mut base, &serde_json::to_value(new)?);
    serde_json::from_value(base)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodeclaim::{NodeClaim, NodeClaimStatus};

    #[test]
    fn a_status_is_applied_whole_under_archers_manager_guarded_by_its_read() {
        let s = NodeClaimStatus { node_name: Some("n1".into()), launch_attempts: Some(2), ..Default::default() };
        let (params, patch) = status::<NodeClaim>("general-abc", Some("42"), &s);
        assert_eq!((params.field_manager.as_deref(), params.force), (Some("archer"), true));
        assert_eq!((patch_params().field_manager.as_deref(), post_params().field_manager.as_deref()), (Some("archer"), Some("archer")));
        let Patch::Apply(body) = patch else { panic!("not an apply") };
        assert_eq!(body["apiVersion"], "archer.dev/v1alpha1");
        assert_eq!(body["kind"], "NodeClaim");
        assert_eq!(body["metadata"], serde_json::json!({"name": "general-abc", "resourceVersion": "42"}));
        assert_eq!(body["status"]["nodeName"], "n1");
        let (_, Patch::Apply(unguarded)) = status::<NodeClaim>("x", None, &s) else { panic!("not an apply") };
        assert!(unguarded["metadata"].get("resourceVersion").is_none());
    }

    #[test]
    fn a_writer_of_some_fields_keeps_the_rest() {
        let mut old = NodeClaimStatus { launch_attempts: Some(1), last_error: Some("quota".into()), ..Default::default() };
        crate::conditions::set(&mut old.conditions, "Launched", "False", "LaunchFailed", "quota", None);
        // A failed attempt: its fields over the old ones, the conditions kept.
        let failed = NodeClaimStatus { launch_attempts: Some(2), last_error: Some("capacity".into()), ..Default::default() };
        let m = merged(&old, &failed).expect("merged");
        assert_eq!((m.launch_attempts, m.last_error.as_deref(), m.conditions.len()), (Some(2), Some("capacity"), 1));
        // The launch: its fields set, the error (null in its JSON) gone, the attempts kept.
        let launched = NodeClaimStatus { provider_id: Some("kwok://n1".into()), node_name: Some("n1".into()), ..Default::default() };
        let m = merged(&m, &launched).expect("merged");
        assert_eq!((m.provider_id.as_deref(), m.node_name.as_deref(), m.last_error, m.launch_attempts, m.conditions.len()), (Some("kwok://n1"), Some("n1"), None, Some(2), 1));
    }
}
