//! RFC 6902 operations that change a pod, built from JSON-pointer tokens (never by string
//! formatting), creating missing parents, and appending rather than rewriting where possible.
//!
//! Each function also applies its change to the typed pod it is given, so the next function
//! builds its operations against the pod as the API server will see it after the earlier ones.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, ReplaceOperation};
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PreferredSchedulingTerm, Toleration,
};
use serde_json::Value;

fn ptr(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

fn add(tokens: &[&str], value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path: ptr(tokens), value })
}

fn to_value<T: serde::Serialize>(t: &T) -> Value {
    // Serialising k8s-openapi types into a Value cannot fail (no maps with non-string keys).
    serde_json::to_value(t).unwrap_or(Value::Null)
}

/// Set annotations (an `add` on an existing key replaces its value).
pub fn set_annotations(pod: &mut Pod, annotations: &BTreeMap<String, String>) -> Vec<PatchOperation> {
    if annotations.is_empty() {
        return Vec::new();
    }
    let ops = match &pod.metadata.annotations {
        None => vec![add(&["metadata", "annotations"], to_value(annotations))],
        Some(existing) => annotations
            .iter()
            .filter(|(k, v)| existing.get(*k) != Some(*v))
            .map(|(k, v)| add(&["metadata", "annotations", k], Value::String(v.clone())))
            .collect(),
    };
    let existing = pod.metadata.annotations.get_or_insert_with(Default::default);
    existing.extend(annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
    ops
}

const NODE_AFFINITY: [&str; 3] = ["spec", "affinity", "nodeAffinity"];
const REQUIRED: &str = "requiredDuringSchedulingIgnoredDuringExecution";
const PREFERRED: &str = "preferredDuringSchedulingIgnoredDuringExecution";

/// Require one of `groups` (each a list of expressions ANDed) on top of every existing
/// nodeSelectorTerm: the result is the product, so the pod's own terms keep their meaning.
pub fn require_node_expressions(pod: &mut Pod, groups: &[Vec<NodeSelectorRequirement>]) -> Vec<PatchOperation> {
    if groups.is_empty() {
        return Vec::new();
    }
    let existing_terms = pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|r| r.node_selector_terms.clone())
        .filter(|t| !t.is_empty());
    let merged: Vec<NodeSelectorTerm> = match &existing_terms {
        None => groups
            .iter()
            .map(|g| NodeSelectorTerm { match_expressions: Some(g.clone()), match_fields: None })
            .collect(),
        Some(terms) => terms
            .iter()
            .flat_map(|term| {
                groups.iter().map(move |g| {
                    let mut t = term.clone();
                    let exprs = t.match_expressions.get_or_insert_with(Vec::new);
                    for e in g {
                        if !exprs.contains(e) {
                            exprs.push(e.clone());
                        }
                    }
                    t
                })
            })
            .collect(),
    };
    let required = NodeSelector { node_selector_terms: merged };
    let ops = if existing_terms.is_some() {
        let path = ptr(&[NODE_AFFINITY[0], NODE_AFFINITY[1], NODE_AFFINITY[2], REQUIRED, "nodeSelectorTerms"]);
        vec![PatchOperation::Replace(ReplaceOperation { path, value: to_value(&required.node_selector_terms) })]
    } else {
        let wanted = NodeAffinity { required_during_scheduling_ignored_during_execution: Some(required.clone()), ..Default::default() };
        node_affinity_ops(pod, wanted, REQUIRED)
    };
    node_affinity_mut(pod).required_during_scheduling_ignored_during_execution = Some(required);
    ops
}

fn node_affinity_mut(pod: &mut Pod) -> &mut NodeAffinity {
    pod.spec
        .get_or_insert_with(Default::default)
        .affinity
        .get_or_insert_with(Default::default)
        .node_affinity
        .get_or_insert_with(Default::default)
}

/// Append a preferred node-affinity term (unless an identical one is there already).
pub fn add_preferred_term(pod: &mut Pod, term: PreferredSchedulingTerm) -> Vec<PatchOperation> {
    let existing = pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_ref());
    let ops = match existing {
        Some(list) if list.contains(&term) => return Vec::new(),
        Some(_) => vec![add(&[NODE_AFFINITY[0], NODE_AFFINITY[1], NODE_AFFINITY[2], PREFERRED, "-"], to_value(&term))],
        None => {
            let na = NodeAffinity { preferred_during_scheduling_ignored_during_execution: Some(vec![term.clone()]), ..Default::default() };
            node_affinity_ops(pod, na, PREFERRED)
        }
    };
    node_affinity_mut(pod).preferred_during_scheduling_ignored_during_execution.get_or_insert_with(Vec::new).push(term);
    ops
}

/// Add `field` of `wanted` at the shallowest missing level of spec.affinity.nodeAffinity.
fn node_affinity_ops(pod: &Pod, wanted: NodeAffinity, field: &str) -> Vec<PatchOperation> {
    let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
    match affinity {
        None => vec![add(&["spec", "affinity"], to_value(&Affinity { node_affinity: Some(wanted), ..Default::default() }))],
        Some(a) if a.node_affinity.is_none() => vec![add(&NODE_AFFINITY, to_value(&wanted))],
        Some(_) => {
            let v = to_value(&wanted);
            let inner = v.get(field).cloned().unwrap_or(Value::Null);
            vec![add(&[NODE_AFFINITY[0], NODE_AFFINITY[1], NODE_AFFINITY[2], field], inner)]
        }
    }
}

pub use super::taints::tolerates;

/// Append the tolerations the pod does not already have.
pub fn add_tolerations(pod: &mut Pod, wanted: &[Toleration]) -> Vec<PatchOperation> {
    let existing = pod.spec.as_ref().and_then(|s| s.tolerations.as_ref());
    let missing: Vec<Toleration> = wanted
        .iter()
        .filter(|w| {
            let key = w.key.as_deref().unwrap_or("");
            let value = w.value.as_deref().unwrap_or("");
            let effect = w.effect.as_deref().unwrap_or("");
            !existing.is_some_and(|list| list.iter().any(|t| tolerates(t, key, value, effect)))
        })
        .cloned()
        .collect();
    if missing.is_empty() {
        return Vec::new();
    }
    let ops = match existing {
        None => vec![add(&["spec", "tolerations"], to_value(&missing))],
        Some(_) => missing.iter().map(|t| add(&["spec", "tolerations", "-"], to_value(t))).collect(),
    };
    pod.spec.get_or_insert_with(Default::default).tolerations.get_or_insert_with(Vec::new).extend(missing);
    ops
}
