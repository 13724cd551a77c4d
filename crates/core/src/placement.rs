//! The placement decision: images' platforms + namespace policy + the pod -> patch, warnings or denial.
//! Pure: no I/O, so the webhook, the extender and `simulate` share it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod, PreferredSchedulingTerm, Toleration};
use serde::{Deserialize, Serialize};

use super::patch::{self, Op};
use super::platform::PlatformSet;
use super::policy::{FailurePolicy, Mode, Policy};

pub const ARCH_LABEL: &str = "kubernetes.io/arch";
const OS_LABEL: &str = "kubernetes.io/os";
pub const PLATFORMS_ANNOTATION: &str = "archer.dev/platforms";
pub const DECISION_ANNOTATION: &str = "archer.dev/decision";
const CONFLICT_ANNOTATION: &str = "archer.dev/conflict";
const INSPECTION_ERROR_ANNOTATION: &str = "archer.dev/inspection-error";

/// A taint that keeps pods off nodes of one architecture unless they tolerate it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArchitectureTaint {
    /// The architecture whose nodes carry the taint; defaults to `value` when the key is `kubernetes.io/arch`.
    #[serde(default)]
    pub architecture: Option<String>,
    pub key: String,
    #[serde(default)]
    pub value: Option<String>,
    pub effect: String,
}

impl ArchitectureTaint {
    pub fn arm64_default() -> Self {
        Self { architecture: None, key: ARCH_LABEL.into(), value: Some("arm64".into()), effect: "NoSchedule".into() }
    }

    pub fn applies_to(&self) -> Option<&str> {
        self.architecture.as_deref().or(if self.key == ARCH_LABEL { self.value.as_deref() } else { None })
    }

    fn toleration(&self) -> Toleration {
        Toleration {
            key: Some(self.key.clone()),
            operator: Some(if self.value.is_some() { "Equal" } else { "Exists" }.into()),
            value: self.value.clone(),
            effect: Some(self.effect.clone()),
            toleration_seconds: None,
        }
    }
}

/// Settings of the decision that are not per-namespace policy.
#[derive(Debug, Clone)]
pub struct PlacementSettings {
    pub architecture_taints: Vec<ArchitectureTaint>,
    /// Weight (1-100) of the preferred node-affinity term toward the preferred architecture.
    pub preferred_weight: i32,
}

impl Default for PlacementSettings {
    fn default() -> Self {
        Self { architecture_taints: vec![ArchitectureTaint::arm64_default()], preferred_weight: 50 }
    }
}

/// What inspecting one container image found.
#[derive(Debug, Clone)]
pub struct ImageFinding {
    pub image: String,
    pub platforms: Result<PlatformSet, String>,
}

/// The outcome, named for metrics and the decision annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Required/preferred affinity and tolerations patched in.
    Enforced,
    /// Platforms recorded only.
    Observed,
    /// The pod's own architecture constraint fits the images and was kept.
    KeptExistingConstraint,
    /// The pod's own architecture constraint contradicts the images.
    Conflict,
    /// The images share no platform (or none the namespace allows).
    NoCommonPlatform,
    /// An image could not be inspected; admitted unpatched.
    InspectionFailed,
    /// An image could not be inspected; pinned to the fallback architecture.
    Fallback,
    /// Already decided on an earlier invocation; nothing changes.
    Unchanged,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Enforced => "enforced",
            Outcome::Observed => "observed",
            Outcome::KeptExistingConstraint => "kept-existing-constraint",
            Outcome::Conflict => "conflict",
            Outcome::NoCommonPlatform => "no-common-platform",
            Outcome::InspectionFailed => "inspection-failed",
            Outcome::Fallback => "fallback",
            Outcome::Unchanged => "unchanged",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Decision {
    pub outcome: Outcome,
    /// `Some(message)` when the pod must be denied.
    pub denied: Option<String>,
    pub warnings: Vec<String>,
    pub patch: Vec<Op>,
    /// The platforms every container supports (after the namespace's allowed list), when known.
    pub platforms: Option<PlatformSet>,
}

/// Images of init and regular containers (ephemeral containers never constrain placement).
pub fn pod_images(pod: &Pod) -> Vec<String> {
    let Some(spec) = &pod.spec else { return Vec::new() };
    let mut seen = BTreeSet::new();
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .filter_map(|c| c.image.clone())
        .filter(|i| seen.insert(i.clone()))
        .collect()
}

/// The platforms recorded on the pod: the webhook's `archer.dev/platforms` annotation, if it is
/// there and names any.
pub fn recorded_platforms(pod: &Pod) -> Option<PlatformSet> {
    let a = pod.metadata.annotations.as_ref()?.get(PLATFORMS_ANNOTATION)?;
    PlatformSet::parse_annotation(a).ok().filter(|p| !p.is_empty())
}

/// A pod's platforms: the recorded ones ([`recorded_platforms`]), else the intersection of its
/// images' platforms as `lookup` knows them; `None` when an image is unknown (or it names none).
/// The runtime's lookup inspects registries (`archer::cluster::pod_platforms`); `archer simulate`
/// and `archer report` look in what they inspected up front.
pub fn pod_platforms<'a>(pod: &Pod, lookup: &dyn Fn(&str) -> Option<&'a PlatformSet>) -> Option<PlatformSet> {
    recorded_platforms(pod).or_else(|| {
        let sets: Option<Vec<&PlatformSet>> = pod_images(pod).iter().map(|i| lookup(i)).collect();
        sets.and_then(PlatformSet::intersect_all)
    })
}

/// The architectures a pod's own nodeSelector / required affinity admits, as a predicate;
/// `None` when the pod does not constrain the architecture itself.
fn existing_arch_constraint(pod: &Pod) -> Option<impl Fn(&str) -> bool + '_> {
    let spec = pod.spec.as_ref()?;
    let selector = spec.node_selector.as_ref().and_then(|s| s.get(ARCH_LABEL));
    let terms: &[NodeSelectorTerm] = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or(&[]);
    let term_has_arch = |t: &NodeSelectorTerm| t.match_expressions.iter().flatten().any(|e| e.key == ARCH_LABEL);
    let terms_constrain = !terms.is_empty() && terms.iter().all(term_has_arch);
    if selector.is_none() && !terms_constrain {
        return None;
    }
    Some(move |arch: &str| {
        selector.is_none_or(|s| s == arch)
            && (terms.is_empty() || terms.iter().any(|t| t.match_expressions.iter().flatten().all(|e| expression_admits(e, arch))))
    })
}

fn expression_admits(e: &NodeSelectorRequirement, arch: &str) -> bool {
    if e.key != ARCH_LABEL {
        return true;
    }
    let values = e.values.as_deref().unwrap_or(&[]);
    match e.operator.as_str() {
        "In" => values.iter().any(|v| v == arch),
        "NotIn" => !values.iter().any(|v| v == arch),
        "Exists" => true,
        _ => false, // DoesNotExist, Gt, Lt never admit an architecture label value
    }
}

/// The pod's architecture constraint unless Archer itself put it there on an earlier invocation
/// (then a changed image set, say an injected sidecar, narrows it again instead of conflicting).
fn user_arch_constraint(pod: &Pod) -> Option<impl Fn(&str) -> bool + '_> {
    let ours = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DECISION_ANNOTATION))
        .is_some_and(|d| d == Outcome::Enforced.as_str() || d == Outcome::Fallback.as_str());
    if ours {
        None
    } else {
        existing_arch_constraint(pod)
    }
}

/// The parts of `pod` the patch functions read and write (its annotations, node affinity and
/// tolerations): the working copy a decision patches, without a copy of the rest (cloning and
/// dropping the whole pod was a fifth of a decision's time, issue #45).
fn patched_parts(pod: &Pod) -> Pod {
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let spec = pod.spec.as_ref().map(|s| PodSpec { affinity: s.affinity.clone(), tolerations: s.tolerations.clone(), ..PodSpec::default() });
    Pod { metadata: ObjectMeta { annotations: pod.metadata.annotations.clone(), ..ObjectMeta::default() }, spec, status: None }
}

fn requirement(key: &str, values: impl IntoIterator<Item = String>) -> NodeSelectorRequirement {
    NodeSelectorRequirement { key: key.into(), operator: "In".into(), values: Some(values.into_iter().collect()) }
}

/// Decide what to do with a pod being created. `findings` has one entry per distinct image.
pub fn decide(original: &Pod, policy: &Policy, findings: &[ImageFinding], settings: &PlacementSettings) -> Decision {
    // The patch functions update this copy as they go, so later operations see earlier ones.
    let mut working = patched_parts(original);
    let pod = &mut working;
    let mut d = Decision { outcome: Outcome::Observed, denied: None, warnings: Vec::new(), patch: Vec::new(), platforms: None };
    let mut annotations = BTreeMap::new();
    let fail_closed = policy.on_inspection_failure == FailurePolicy::FailClosed;

    let failures: Vec<String> = findings
        .iter()
        .filter_map(|f| f.platforms.as_ref().err().map(|e| format!("image {:?}: {e}", f.image)))
        .collect();
    if !failures.is_empty() {
        let cause = failures.join("; ");
        if fail_closed {
            d.outcome = Outcome::InspectionFailed;
            d.denied = Some(format!("archer could not inspect the pod's images: {cause}"));
            return d;
        }
        d.warnings.push(format!("archer could not inspect the pod's images, placement unchanged: {cause}"));
        annotations.insert(INSPECTION_ERROR_ANNOTATION.to_string(), truncate(&cause, 1024));
        d.outcome = Outcome::InspectionFailed;
        let constrained = user_arch_constraint(original).is_some();
        if let (Some(fallback), true, false) = (&policy.fallback_architecture, policy.mode.enforces(), constrained) {
            d.outcome = Outcome::Fallback;
            d.warnings.push(format!("pinned to the fallback architecture {fallback}"));
            d.patch.extend(patch::require_node_expressions(pod, &[vec![requirement(ARCH_LABEL, [fallback.clone()])]]));
            d.patch.extend(patch::add_tolerations(pod, &tolerations_for(settings, &BTreeSet::from([fallback.clone()]))));
        }
        return finish(original, pod, d, annotations);
    }

    let sets: Vec<&PlatformSet> = findings.iter().filter_map(|f| f.platforms.as_ref().ok()).collect();
    let Some(common) = PlatformSet::intersect_all(sets) else {
        return d; // no images at all: nothing to decide
    };
    let eligible = common.retain_architectures(|a| policy.allows(a));
    annotations.insert(PLATFORMS_ANNOTATION.to_string(), common.to_annotation());
    d.platforms = Some(eligible.clone());

    if eligible.is_empty() {
        let why = if common.is_empty() {
            let per_image: Vec<String> = findings
                .iter()
                .filter_map(|f| f.platforms.as_ref().ok().map(|p| format!("{} ({})", f.image, p)))
                .collect();
            format!("the pod's images share no platform: {}", per_image.join(", "))
        } else {
            format!(
                "the pod's images run only on {common}, none of which the namespace allows ({})",
                policy.allowed_architectures.as_deref().unwrap_or(&[]).join(",")
            )
        };
        d.outcome = Outcome::NoCommonPlatform;
        if fail_closed {
            d.denied = Some(why);
            return d;
        }
        d.warnings.push(why);
        return finish(original, pod, d, annotations);
    }

    let archs = eligible.architectures();
    if let Some(admits) = user_arch_constraint(original) {
        let runnable: BTreeSet<String> = archs.iter().filter(|a| admits(a)).cloned().collect();
        if runnable.is_empty() {
            let why = format!("the pod's own architecture constraint admits none of its images' platforms ({eligible})");
            d.outcome = Outcome::Conflict;
            if fail_closed {
                d.denied = Some(why);
                return d;
            }
            annotations.insert(CONFLICT_ANNOTATION.to_string(), why.clone());
            d.warnings.push(why);
            return finish(original, pod, d, annotations);
        }
        d.outcome = Outcome::KeptExistingConstraint;
        if policy.mode.enforces() {
            d.patch.extend(preferred(pod, policy, &runnable, settings));
            d.patch.extend(patch::add_tolerations(pod, &tolerations_for(settings, &runnable)));
        }
        return finish(original, pod, d, annotations);
    }

    if policy.mode == Mode::Observe {
        d.outcome = Outcome::Observed;
        return finish(original, pod, d, annotations);
    }
    d.outcome = Outcome::Enforced;
    let os_constrained = original.spec.as_ref().and_then(|s| s.node_selector.as_ref()).is_some_and(|s| s.contains_key(OS_LABEL));
    let groups: Vec<Vec<NodeSelectorRequirement>> = eligible
        .operating_systems()
        .into_iter()
        .map(|os| {
            let mut g = vec![requirement(ARCH_LABEL, eligible.architectures_for_os(&os))];
            if !os_constrained {
                g.push(requirement(OS_LABEL, [os]));
            }
            g
        })
        .collect();
    d.patch.extend(patch::require_node_expressions(pod, &groups));
    d.patch.extend(preferred(pod, policy, &archs, settings));
    d.patch.extend(patch::add_tolerations(pod, &tolerations_for(settings, &archs)));
    finish(original, pod, d, annotations)
}

/// A preferred term toward the most preferred runnable architecture, when there is a choice.
fn preferred(pod: &mut Pod, policy: &Policy, archs: &BTreeSet<String>, settings: &PlacementSettings) -> Vec<Op> {
    if archs.len() < 2 {
        return Vec::new();
    }
    let Some(best) = archs.iter().min_by(|a, b| (policy.preference_rank(a), a).cmp(&(policy.preference_rank(b), b))) else { return Vec::new() };
    if policy.preference_rank(best) >= policy.prefer.len() {
        return Vec::new(); // the namespace prefers none of them
    }
    patch::add_preferred_term(
        pod,
        PreferredSchedulingTerm {
            weight: settings.preferred_weight.clamp(1, 100),
            preference: NodeSelectorTerm { match_expressions: Some(vec![requirement(ARCH_LABEL, [best.clone()])]), match_fields: None },
        },
    )
}

fn tolerations_for(settings: &PlacementSettings, archs: &BTreeSet<String>) -> Vec<Toleration> {
    settings
        .architecture_taints
        .iter()
        .filter(|t| t.applies_to().is_some_and(|a| archs.contains(a)))
        .map(ArchitectureTaint::toleration)
        .collect()
}

/// Record the decision on the pod; a pod already decided with the same platforms stays as it is,
/// so reinvocation changes nothing.
fn finish(original: &Pod, pod: &mut Pod, mut d: Decision, mut annotations: BTreeMap<String, String>) -> Decision {
    let existing = original.metadata.annotations.as_ref();
    let already_decided = existing.is_some_and(|a| a.contains_key(DECISION_ANNOTATION))
        && existing.and_then(|a| a.get(PLATFORMS_ANNOTATION)) == annotations.get(PLATFORMS_ANNOTATION);
    if already_decided {
        d.outcome = Outcome::Unchanged;
        d.patch.clear();
        return d;
    }
    annotations.insert(DECISION_ANNOTATION.to_string(), d.outcome.as_str().to_string());
    let mut ops = patch::set_annotations(pod, &annotations);
    // Annotations first: they create /metadata/annotations when missing and touch nothing else.
    ops.append(&mut d.patch);
    d.patch = ops;
    d
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
