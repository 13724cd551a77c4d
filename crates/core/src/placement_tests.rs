//! Patch generation checked by applying the patch to real pod JSON.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

use super::placement::*;
use super::platform::PlatformSet;
use super::policy::{resolve, FailurePolicy, Mode, Policy, PolicyDefaults};

fn policy() -> Policy {
    resolve(&PolicyDefaults::default(), &Default::default()).0
}

fn finding(image: &str, platforms: &str) -> ImageFinding {
    ImageFinding { image: image.into(), platforms: Ok(PlatformSet::parse_annotation(platforms).expect("platforms")) }
}

fn failed(image: &str) -> ImageFinding {
    ImageFinding { image: image.into(), platforms: Err("registry unavailable".into()) }
}

fn pod_json(spec_extra: Value, annotations: Option<Value>) -> Value {
    let mut spec = json!({"containers": [{"name": "app", "image": "example.com/app:1"}]});
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    let mut metadata = json!({"name": "web-0", "namespace": "team"});
    if let Some(a) = annotations {
        metadata["annotations"] = a;
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

/// Run the decision and apply its patch, as the API server would.
fn run(pod: &Value, policy: &Policy, findings: &[ImageFinding]) -> (Decision, Value) {
    let typed: Pod = serde_json::from_value(pod.clone()).expect("pod");
    let d = decide(&typed, policy, findings, &PlacementSettings::default());
    let mut out = pod.clone();
    let ops: json_patch::Patch = serde_json::from_slice(&super::patch::to_json(&d.patch)).expect("the patch is RFC 6902 JSON");
    json_patch::patch(&mut out, &ops).unwrap_or_else(|e| panic!("patch does not apply: {e}\n{:#?}", d.patch));
    // The patched object must still be a valid Pod.
    let _: Pod = serde_json::from_value(out.clone()).expect("patched pod decodes");
    (d, out)
}

fn required_terms(p: &Value) -> &Value {
    &p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
}

#[test]
fn multi_arch_pod_without_affinity_gets_required_preferred_and_toleration() {
    let pod = pod_json(json!({}), None);
    let (d, out) = run(&pod, &policy(), &[finding("example.com/app:1", "linux/amd64,linux/arm64")]);
    assert_eq!(d.outcome, Outcome::Enforced);
    assert!(d.denied.is_none());
    assert_eq!(
        required_terms(&out),
        &json!([{"matchExpressions": [
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]},
            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
        ]}])
    );
    assert_eq!(
        out["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
        json!([{"weight": 50, "preference": {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}]}}])
    );
    assert_eq!(
        out["spec"]["tolerations"],
        json!([{"key": "kubernetes.io/arch", "operator": "Equal", "value": "arm64", "effect": "NoSchedule"}])
    );
    assert_eq!(out["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64,linux/arm64");
    assert_eq!(out["metadata"]["annotations"]["archer.dev/decision"], "enforced");
}

#[test]
fn amd64_only_pod_gets_no_arm_toleration_and_no_preference() {
    let pod = pod_json(json!({}), Some(json!({"team": "a"})));
    let (d, out) = run(&pod, &policy(), &[finding("a", "linux/amd64"), finding("b", "linux/amd64,linux/arm64")]);
    assert_eq!(d.outcome, Outcome::Enforced);
    assert_eq!(required_terms(&out)[0]["matchExpressions"][0]["values"], json!(["amd64"]));
    assert!(out["spec"].get("tolerations").is_none());
    assert!(out["spec"]["affinity"]["nodeAffinity"].get("preferredDuringSchedulingIgnoredDuringExecution").is_none());
    // existing annotations are kept, ours added beside them (the key's '/' escaped in the pointer)
    assert_eq!(out["metadata"]["annotations"]["team"], "a");
    assert_eq!(out["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64");
    assert!(d.patch.iter().any(|op| op.path() == "/metadata/annotations/archer.dev~1platforms"));
}

#[test]
fn merges_into_every_existing_term_and_keeps_other_affinity() {
    let pod = pod_json(
        json!({
            "affinity": {
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}}]},
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}]},
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                    ]},
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 5, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]
                }
            },
            "tolerations": [{"key": "dedicated", "operator": "Exists"}]
        }),
        None,
    );
    let (_, out) = run(&pod, &policy(), &[finding("a", "linux/amd64,linux/arm64")]);
    let terms = required_terms(&out).as_array().expect("terms");
    assert_eq!(terms.len(), 2);
    assert_eq!(terms[0]["matchExpressions"][0]["key"], "topology.kubernetes.io/zone");
    assert_eq!(terms[0]["matchExpressions"][1]["key"], "kubernetes.io/arch");
    assert_eq!(terms[1]["matchFields"][0]["key"], "metadata.name");
    assert_eq!(terms[1]["matchExpressions"][0]["key"], "kubernetes.io/arch");
    let preferred = out["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"].as_array().expect("pref");
    assert_eq!(preferred.len(), 2);
    assert_eq!(preferred[0]["weight"], 5);
    assert!(out["spec"]["affinity"]["podAntiAffinity"].is_object());
    assert_eq!(out["spec"]["tolerations"].as_array().map(Vec::len), Some(2));
}

#[test]
fn affinity_without_node_affinity_gets_one_added() {
    let pod = pod_json(json!({"affinity": {"podAffinity": {}}}), None);
    let (_, out) = run(&pod, &policy(), &[finding("a", "linux/arm64")]);
    assert_eq!(required_terms(&out)[0]["matchExpressions"][0]["values"], json!(["arm64"]));
    assert!(out["spec"]["affinity"]["podAffinity"].is_object());
}

#[test]
fn reinvocation_changes_nothing() {
    let pod = pod_json(json!({"nodeSelector": {"disk": "ssd"}}), None);
    let findings = [finding("a", "linux/amd64,linux/arm64")];
    let (_, once) = run(&pod, &policy(), &findings);
    let (d, twice) = run(&once, &policy(), &findings);
    assert_eq!(d.outcome, Outcome::Unchanged);
    assert!(d.patch.is_empty(), "{:?}", d.patch);
    assert_eq!(once, twice);
    // a sidecar injected after us with a narrower image set is re-evaluated: Archer's own earlier
    // constraint is narrowed (ANDed) to amd64, not treated as the user's and not left as it was.
    let (d, thrice) = run(&once, &policy(), &[finding("a", "linux/amd64,linux/arm64"), finding("sidecar", "linux/amd64")]);
    assert_eq!(d.outcome, Outcome::Enforced);
    assert_eq!(thrice["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64");
    let exprs = required_terms(&thrice)[0]["matchExpressions"].as_array().expect("exprs").clone();
    assert!(exprs.contains(&json!({"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]})), "{exprs:?}");
}

#[test]
fn existing_constraint_is_kept_and_conflicts_reported() {
    let pod = pod_json(json!({"nodeSelector": {"kubernetes.io/arch": "amd64"}}), None);
    let (d, out) = run(&pod, &policy(), &[finding("a", "linux/amd64,linux/arm64")]);
    assert_eq!(d.outcome, Outcome::KeptExistingConstraint);
    assert!(out["spec"].get("affinity").is_none(), "no affinity added to a pod that chose amd64");
    assert!(out["spec"].get("tolerations").is_none(), "amd64-only choice needs no arm64 toleration");

    let (d, out) = run(&pod, &policy(), &[finding("a", "linux/arm64")]);
    assert_eq!(d.outcome, Outcome::Conflict);
    assert!(d.denied.is_none());
    assert!(d.warnings[0].contains("linux/arm64"));
    assert!(out["metadata"]["annotations"]["archer.dev/conflict"].as_str().is_some_and(|s| s.contains("admits none")));
    assert_eq!(out["spec"]["nodeSelector"]["kubernetes.io/arch"], "amd64");

    let strict = Policy { on_inspection_failure: FailurePolicy::FailClosed, ..policy() };
    let (d, _) = run(&pod, &strict, &[finding("a", "linux/arm64")]);
    assert!(d.denied.is_some());

    // required affinity with NotIn is understood too
    let pod = pod_json(
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "NotIn", "values": ["arm64"]}]}]}}}}),
        None,
    );
    let (d, _) = run(&pod, &policy(), &[finding("a", "linux/arm64")]);
    assert_eq!(d.outcome, Outcome::Conflict);
}

#[test]
fn no_common_platform_warns_or_denies() {
    let pod = pod_json(json!({}), None);
    let findings = [finding("a", "linux/amd64"), finding("b", "linux/arm64")];
    let (d, out) = run(&pod, &policy(), &findings);
    assert_eq!(d.outcome, Outcome::NoCommonPlatform);
    assert!(d.denied.is_none());
    assert!(d.warnings[0].contains("share no platform"), "{:?}", d.warnings);
    assert!(out["spec"].get("affinity").is_none());
    let strict = Policy { on_inspection_failure: FailurePolicy::FailClosed, ..policy() };
    let (d, _) = run(&pod, &strict, &findings);
    assert!(d.denied.as_deref().is_some_and(|m| m.contains("a (linux/amd64)") && m.contains("b (linux/arm64)")));
}

#[test]
fn allowed_architectures_narrow_the_choice() {
    let pod = pod_json(json!({}), None);
    let p = Policy { allowed_architectures: Some(vec!["amd64".into()]), ..policy() };
    let (d, out) = run(&pod, &p, &[finding("a", "linux/amd64,linux/arm64")]);
    assert_eq!(d.outcome, Outcome::Enforced);
    assert_eq!(required_terms(&out)[0]["matchExpressions"][0]["values"], json!(["amd64"]));
    assert_eq!(out["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64,linux/arm64");
    let p = Policy { allowed_architectures: Some(vec!["s390x".into()]), ..policy() };
    let (d, _) = run(&pod, &p, &[finding("a", "linux/amd64,linux/arm64")]);
    assert_eq!(d.outcome, Outcome::NoCommonPlatform);
}

#[test]
fn inspection_failure_fail_open_fallback_and_fail_closed() {
    let pod = pod_json(json!({}), None);
    let (d, out) = run(&pod, &policy(), &[failed("a"), finding("b", "linux/arm64")]);
    assert_eq!(d.outcome, Outcome::InspectionFailed);
    assert!(d.denied.is_none());
    assert!(out["spec"].get("affinity").is_none());
    assert!(out["metadata"]["annotations"]["archer.dev/inspection-error"].as_str().is_some_and(|s| s.contains("registry unavailable")));

    let p = Policy { fallback_architecture: Some("amd64".into()), ..policy() };
    let (d, out) = run(&pod, &p, &[failed("a")]);
    assert_eq!(d.outcome, Outcome::Fallback);
    assert_eq!(required_terms(&out)[0]["matchExpressions"][0]["values"], json!(["amd64"]));

    let p = Policy { on_inspection_failure: FailurePolicy::FailClosed, ..policy() };
    let (d, _) = run(&pod, &p, &[failed("registry.example.com/a:1")]);
    assert!(d.denied.as_deref().is_some_and(|m| m.contains("registry.example.com/a:1") && m.contains("registry unavailable")));
}

#[test]
fn observe_mode_only_annotates() {
    let pod = pod_json(json!({}), None);
    let p = Policy { mode: Mode::Observe, ..policy() };
    let (d, out) = run(&pod, &p, &[finding("a", "linux/amd64,linux/arm64")]);
    assert_eq!(d.outcome, Outcome::Observed);
    assert!(out["spec"].get("affinity").is_none() && out["spec"].get("tolerations").is_none());
    assert_eq!(out["metadata"]["annotations"]["archer.dev/decision"], "observed");
}

#[test]
fn windows_and_linux_get_one_term_per_os() {
    let pod = pod_json(json!({}), None);
    let (_, out) = run(&pod, &policy(), &[finding("a", "linux/amd64,linux/arm64,windows/amd64")]);
    let terms = required_terms(&out).as_array().expect("terms");
    assert_eq!(terms.len(), 2);
    assert_eq!(terms[0]["matchExpressions"], json!([
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]));
    assert_eq!(terms[1]["matchExpressions"], json!([
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        {"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]}]));
}

#[test]
fn images_come_from_init_and_regular_containers_not_ephemeral() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [{"name": "i", "image": "init:1"}],
            "containers": [{"name": "a", "image": "app:1"}, {"name": "b", "image": "app:1"}],
            "ephemeralContainers": [{"name": "dbg", "image": "busybox"}]
        }
    }))
    .expect("pod");
    assert_eq!(pod_images(&pod), vec!["init:1", "app:1"]);
}

#[test]
fn existing_toleration_is_not_duplicated() {
    let pod = pod_json(json!({"tolerations": [{"operator": "Exists"}]}), None);
    let (_, out) = run(&pod, &policy(), &[finding("a", "linux/amd64,linux/arm64")]);
    assert_eq!(out["spec"]["tolerations"], json!([{"operator": "Exists"}]));
}

#[test]
fn a_pods_platforms_are_its_record_else_its_images_platforms_intersected() {
    let set = |s: &str| PlatformSet::parse_annotation(s).expect("set");
    let pod = |annotations: Value| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "annotations": annotations}, "spec": {"initContainers": [{"name": "i", "image": "init"}], "containers": [{"name": "c", "image": "app"}]}})).expect("pod")
    };
    let known = std::collections::BTreeMap::from([("init".to_string(), set("linux/amd64,linux/arm64")), ("app".to_string(), set("linux/arm64"))]);
    let lookup = |i: &str| known.get(i);
    assert_eq!(pod_platforms(&pod(json!({})), &lookup), Some(set("linux/arm64")), "every image's platforms, intersected");
    let recorded = pod(json!({PLATFORMS_ANNOTATION: "linux/amd64"}));
    assert_eq!(recorded_platforms(&recorded), Some(set("linux/amd64")));
    assert_eq!(pod_platforms(&recorded, &lookup), Some(set("linux/amd64")), "the webhook's record wins");
    assert_eq!(recorded_platforms(&pod(json!({PLATFORMS_ANNOTATION: ""}))), None, "an empty record is no record");
    assert_eq!(pod_platforms(&pod(json!({})), &|i: &str| if i == "app" { known.get(i) } else { None }), None, "an unknown image: unknown");
}
