//! RFC 6902 operations that change a pod, built from JSON-pointer tokens (never by string
//! formatting), creating missing parents, and appending rather than rewriting where possible.
//!
//! Each function also applies its change to the typed pod it is given, so the next function
//! builds its operations against the pod as the API server will see it after the earlier ones.
//!
//! An operation's value is serialised once, from its typed API struct, when the operation is
//! made ([`Op`]): no `serde_json::Value` tree is built on the admission path.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PreferredSchedulingTerm, Toleration,
};
use serde::Serialize;
use serde_json::value::RawValue;

/// One RFC 6902 operation (`add`, `replace`, `test` or `remove`) with its value already
/// serialised.
#[derive(Debug, Clone, Serialize)]
pub struct Op {
    op: OpKind,
    path: PointerBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<Box<RawValue>>,
}

#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "lowercase")]
enum OpKind {
    Add,
    Replace,
    Test,
    Remove,
}

impl Op {
    /// The JSON pointer the operation writes to.
    pub fn path(&self) -> &str {
        self.path.as_str()
    }
}

/// A whole patch as the JSON array the API server applies.
pub fn to_json(ops: &[Op]) -> Vec<u8> {
    // Strings and pre-serialised values: writing them cannot fail.
    serde_json::to_vec(ops).unwrap_or_default()
}

fn ptr(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

fn raw<T: Serialize>(t: &T) -> Box<RawValue> {
    // Serialising k8s-openapi types cannot fail (no maps with non-string keys); `null` is
    // unreachable and the API server would refuse it rather than apply something else.
    serde_json::value::to_raw_value(t).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

fn add<T: Serialize>(tokens: &[&str], value: &T) -> Op {
    Op { op: OpKind::Add, path: ptr(tokens), value: Some(raw(value)) }
}

fn replace<T: Serialize>(tokens: &[&str], value: &T) -> Op {
    Op { op: OpKind::Replace, path: ptr(tokens), value: Some(raw(value)) }
}

/// Set annotations (an `add` on an existing key replaces its value).
pub(crate) fn set_annotations(pod: &mut Pod, annotations: &BTreeMap<String, String>) -> Vec<Op> {
    if annotations.is_empty() {
        return Vec::new();
    }
    let ops = match &pod.metadata.annotations {
        None => vec![add(&["metadata", "annotations"], annotations)],
        Some(existing) => annotations
            .iter()
            .filter(|(k, v)| existing.get(*k) != Some(*v))
            .map(|(k, v)| add(&["metadata", "annotations", k], v))
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
pub(crate) fn require_node_expressions(pod: &mut Pod, groups: &[Vec<NodeSelectorRequirement>]) -> Vec<Op> {
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
        vec![replace(&[NODE_AFFINITY[0], NODE_AFFINITY[1], NODE_AFFINITY[2], REQUIRED, "nodeSelectorTerms"], &required.node_selector_terms)]
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
pub(crate) fn add_preferred_term(pod: &mut Pod, term: PreferredSchedulingTerm) -> Vec<Op> {
    let existing = pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_ref());
    let ops = match existing {
        Some(list) if list.contains(&term) => return Vec::new(),
        Some(_) => vec![add(&[NODE_AFFINITY[0], NODE_AFFINITY[1], NODE_AFFINITY[2], PREFERRED, "-"], &term)],
        None => {
            let na = NodeAffinity { preferred_during_scheduling_ignored_during_execution: Some(vec![term.clone()]), ..Default::default() };
            node_affinity_ops(pod, na, PREFERRED)
        }
    };
    node_affinity_mut(pod).preferred_during_scheduling_ignored_during_execution.get_or_insert_with(Vec::new).push(term);
    ops
}

/// Add `field` of `wanted` at the shallowest missing level of spec.affinity.nodeAffinity.
fn node_affinity_ops(pod: &Pod, wanted: NodeAffinity, field: &str) -> Vec<Op> {
    let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
    match affinity {
        None => vec![add(&["spec", "affinity"], &Affinity { node_affinity: Some(wanted), ..Default::default() })],
        Some(a) if a.node_affinity.is_none() => vec![add(&NODE_AFFINITY, &wanted)],
        Some(_) => {
            let path = [NODE_AFFINITY[0], NODE_AFFINITY[1], NODE_AFFINITY[2], field];
            // Only the one field `wanted` sets is added, as its own typed value.
            let op = if field == REQUIRED {
                wanted.required_during_scheduling_ignored_during_execution.as_ref().map(|r| add(&path, r))
            } else {
                wanted.preferred_during_scheduling_ignored_during_execution.as_ref().map(|p| add(&path, p))
            };
            op.into_iter().collect()
        }
    }
}

pub use super::taints::tolerates;

/// Append the tolerations the pod does not already have.
pub(crate) fn add_tolerations(pod: &mut Pod, wanted: &[Toleration]) -> Vec<Op> {
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
        None => vec![add(&["spec", "tolerations"], &missing)],
        Some(_) => missing.iter().map(|t| add(&["spec", "tolerations", "-"], t)).collect(),
    };
    pod.spec.get_or_insert_with(Default::default).tolerations.get_or_insert_with(Vec::new).extend(missing);
    ops
}

/// Add the scheduling gate `name` (unless the pod already carries it).
pub fn add_scheduling_gate(pod: &mut Pod, name: &str) -> Vec<Op> {
    use k8s_openapi::api::core::v1::PodSchedulingGate;
    let gate = PodSchedulingGate { name: name.to_string() };
    let spec = pod.spec.get_or_insert_with(Default::default);
    let ops = match &spec.scheduling_gates {
        Some(gates) if gates.iter().any(|g| g.name == name) => return Vec::new(),
        Some(_) => vec![add(&["spec", "schedulingGates", "-"], &gate)],
        None => vec![add(&["spec", "schedulingGates"], &std::slice::from_ref(&gate))],
    };
    spec.scheduling_gates.get_or_insert_with(Vec::new).push(gate);
    ops
}

/// Remove the scheduling gate `name`, guarded by a `test` of its position so a patch built
/// from a stale copy of the pod fails instead of removing another gate. `None`: not gated by it.
pub fn remove_scheduling_gate(pod: &mut Pod, name: &str) -> Option<Vec<Op>> {
    let gates = pod.spec.as_mut()?.scheduling_gates.as_mut()?;
    let at = gates.iter().position(|g| g.name == name)?;
    gates.remove(at);
    let index = at.to_string();
    let path = ["spec", "schedulingGates", index.as_str(), "name"];
    let test = Op { op: OpKind::Test, path: ptr(&path), value: Some(raw(&name)) };
    let remove = Op { op: OpKind::Remove, path: ptr(&path[..3]), value: None };
    Some(vec![test, remove])
}

/// Rewrite each container's image (init containers too) to `image@digest` where `digests` has
/// the image and the reference names no digest yet.
pub fn pin_images(pod: &mut Pod, digests: &BTreeMap<String, String>) -> Vec<Op> {
    let mut ops = Vec::new();
    let Some(spec) = pod.spec.as_mut() else { return ops };
    let lists = [("initContainers", spec.init_containers.as_mut()), ("containers", Some(&mut spec.containers))];
    for (field, list) in lists {
        for (i, c) in list.into_iter().flatten().enumerate() {
            let Some(image) = c.image.as_mut() else { continue };
            let Some(digest) = digests.get(image.as_str()).filter(|_| !image.contains('@')) else { continue };
            let pinned = format!("{image}@{digest}");
            ops.push(replace(&["spec", field, &i.to_string(), "image"], &pinned));
            *image = pinned;
        }
    }
    ops
}
