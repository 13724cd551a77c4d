//! The learning record and the no-loop rule, on pods as kube-controller-manager makes them.

use serde_json::json;

use super::*;

const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

fn limits() -> Limits {
    Limits { max_broken: 3, max_replaced: 2, replacement_ttl_seconds: 3600 }
}

/// A ReplicaSet's pod created at `created` (seconds), with the webhook's platforms record.
fn replica(name: &str, hash: &str, created: i64, platforms: Option<&str>) -> Pod {
    let at = k8s_openapi::jiff::Timestamp::from_second(created).expect("time").to_string();
    let mut annotations = serde_json::Map::new();
    if let Some(p) = platforms {
        annotations.insert("archer.dev/platforms".into(), json!(p));
    }
    serde_json::from_value(json!({"metadata": {
        "name": name, "namespace": "shop", "creationTimestamp": at,
        "labels": {"app": "web", "pod-template-hash": hash},
        "annotations": annotations,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("web-{hash}"), "uid": "rs-uid", "controller": true}]
    }, "spec": {"containers": [{"name": "app", "image": "reg/app:1"}]}}))
    .expect("pod")
}

fn error(digest: Option<&str>) -> ExecFormatError {
    ExecFormatError { container: "app".into(), image: "reg/app:1".into(), digest: digest.map(String::from), reason: "StartError".into(), message: "exec format error".into() }
}

#[test]
fn a_lying_index_is_learned_once_and_excluded_for_its_digest_only() {
    let mut record = SafetyRecord::default();
    let pod = replica("web-abc-1", "abc", 100, Some("linux/amd64,linux/arm64"));
    let f = on_exec_format_errors(&pod, "arm64", &[error(Some(DIGEST))], true, &mut record, 200, &limits());
    assert_eq!(f.learned.len(), 1);
    assert_eq!(f.verdict, Verdict::Replace);
    let both: PlatformSet = ["linux/amd64", "linux/arm64"].iter().map(|p| p.parse().expect("platform")).collect();
    let (left, removed) = record.exclude(DIGEST, &both);
    assert_eq!(left.to_annotation(), "linux/amd64");
    assert_eq!(removed, vec!["arm64".to_string()]);
    assert_eq!(record.exclude("sha256:other", &both).0, both, "another digest (a rebuilt image) is not excluded");
    assert!(record.mentions_image("reg/app:1") && !record.mentions_image("reg/app:2"));
    let again = on_exec_format_errors(&replica("web-abc-2", "abc", 150, None), "arm64", &[error(Some(DIGEST))], true, &mut record, 210, &limits());
    assert!(again.learned.is_empty(), "a known pair is not learned twice");
    assert_eq!(again.verdict, Verdict::Replace, "a pod of the same round (created before the re-placement) is re-placed too");
    assert!(on_exec_format_errors(&pod, "arm64", &[error(None)], true, &mut SafetyRecord::default(), 200, &limits()).learned.is_empty(), "no digest, nothing learned");
}

#[test]
fn never_a_loop_one_replacement_per_template_and_architecture_per_ttl() {
    let l = limits();
    let mut r = SafetyRecord::default();
    let web = "shop/ReplicaSet/web-abc/abc";
    assert_eq!(r.replacement(web, "arm64", 90, false, 100, &l), Verdict::Replace);
    assert_eq!(r.replacement(web, "arm64", 95, false, 110, &l), Verdict::Replace, "created before: same round");
    assert_eq!(r.replacement(web, "arm64", 100, false, 110, &l), Verdict::Replace, "created in the second it opened, admitted with arm64: same round");
    assert_eq!(r.replacement(web, "arm64", 100, true, 110, &l), Verdict::Skip(Why::AlreadyReplaced), "admitted without arm64 and failing there anyway: the exclusion did not hold");
    assert_eq!(r.replacement(web, "arm64", 101, false, 120, &l), Verdict::Skip(Why::AlreadyReplaced), "created after it: a replacement that failed again");
    assert_eq!(r.replacement(web, "amd64", 100, false, 120, &l), Verdict::Replace, "another architecture is another key");
    assert_eq!(r.replacement("shop/ReplicaSet/db/x", "arm64", 100, false, 130, &l), Verdict::Skip(Why::RecordFull), "a full record refuses rather than forgets");
    assert_eq!(r.replacement(web, "arm64", 3650, false, 3700, &l), Verdict::Replace, "after the TTL, once more");
    assert_eq!(r.replacement(web, "arm64", 3701, false, 3702, &l), Verdict::Skip(Why::AlreadyReplaced));
    assert_eq!(r.replacement("shop/ReplicaSet/db/x", "arm64", 3700, false, 3730, &l), Verdict::Replace, "room again once an entry expired");
}

#[test]
fn bare_pods_opted_out_namespaces_and_images_with_nowhere_left_get_only_the_event() {
    let l = limits();
    let mut bare = replica("solo", "abc", 100, None);
    bare.metadata.owner_references = None;
    assert_eq!(template_key(&bare), None);
    assert_eq!(on_exec_format_errors(&bare, "arm64", &[error(Some(DIGEST))], true, &mut SafetyRecord::default(), 200, &l).verdict, Verdict::Skip(Why::BarePod));
    let pod = replica("web-abc-1", "abc", 100, Some("linux/amd64,linux/arm64"));
    let mut record = SafetyRecord::default();
    let off = on_exec_format_errors(&pod, "arm64", &[error(Some(DIGEST))], false, &mut record, 200, &l);
    assert_eq!(off.verdict, Verdict::Skip(Why::Disabled));
    assert_eq!(off.learned.len(), 1, "learning goes on when re-placement is off");
    let amd = on_exec_format_errors(&replica("web-def-1", "def", 300, Some("linux/amd64,linux/arm64")), "amd64", &[error(Some(DIGEST))], true, &mut record, 400, &l);
    assert_eq!(amd.verdict, Verdict::Skip(Why::NoArchitectureLeft), "broken on both: a replacement could run nowhere");
    assert_eq!(Verdict::Skip(Why::NoArchitectureLeft).as_str(), "no_architecture_left");
}

#[test]
fn template_keys_follow_the_controllers_revision() {
    let pod = replica("web-abc-1", "abc", 100, None);
    assert_eq!(template_key(&pod).as_deref(), Some("shop/ReplicaSet/web-abc/abc"));
    let mut sts = pod.clone();
    sts.metadata.labels = Some([("controller-revision-hash".to_string(), "db-7f".to_string())].into());
    sts.metadata.owner_references.iter_mut().flatten().for_each(|o| {
        o.kind = "StatefulSet".into();
        o.name = "db".into();
    });
    assert_eq!(template_key(&sts).as_deref(), Some("shop/StatefulSet/db/db-7f"));
    let mut job = pod;
    job.metadata.labels = None;
    assert_eq!(template_key(&job).as_deref(), Some("shop/ReplicaSet/web-abc/rs-uid"), "no revision label: the owner's uid");
}

#[test]
fn the_record_is_bounded_and_round_trips_through_its_configmap_form() {
    let l = limits();
    let mut r = SafetyRecord::default();
    for i in 0..5 {
        r.learn(Broken { digest: format!("sha256:{i}"), arch: "arm64".into(), image: "x".repeat(2000), at: i }, &l);
    }
    assert_eq!(r.broken.len(), 3, "at most max_broken");
    assert_eq!(r.broken.iter().map(|b| b.at).collect::<Vec<_>>(), vec![2, 3, 4], "the oldest leave first");
    assert!(r.broken.iter().all(|b| b.image.len() <= 512), "long references are cut");
    let text = serde_json::to_string(&r).expect("json");
    assert_eq!(serde_json::from_str::<SafetyRecord>(&text).expect("parse"), r);
    assert_eq!(serde_json::from_str::<SafetyRecord>("{}").expect("empty"), SafetyRecord::default());
}

/// Apply `ops` to `pod` as the API server applies a JSON patch.
fn applied(pod: &Pod, ops: &[crate::patch::Op]) -> Result<Pod, json_patch::PatchError> {
    let mut doc = serde_json::to_value(pod).expect("json");
    let patch: json_patch::Patch = serde_json::from_slice(&crate::patch::to_json(ops)).expect("patch");
    json_patch::patch(&mut doc, &patch)?;
    Ok(serde_json::from_value(doc).expect("pod"))
}

#[test]
fn the_gate_is_added_once_and_removed_only_where_it_is() {
    use crate::patch::{add_scheduling_gate, remove_scheduling_gate};
    let original = replica("web-abc-1", "abc", 100, None);
    let mut working = original.clone();
    let ops = add_scheduling_gate(&mut working, GATE);
    let gated = applied(&original, &ops).expect("applies");
    assert_eq!(gated, working, "the ops do to the stored pod what they did to the working copy");
    assert!(add_scheduling_gate(&mut working, GATE).is_empty(), "already gated");
    let mut other: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [], "schedulingGates": [{"name": "example.com/quota"}]}})).expect("pod");
    let both = applied(&other.clone(), &add_scheduling_gate(&mut other, GATE)).expect("appends");
    assert_eq!(both.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()).map(Vec::len), Some(2));

    let mut releasing = both.clone();
    let ops = remove_scheduling_gate(&mut releasing, GATE).expect("gated");
    let released = applied(&both, &ops).expect("removes");
    let names: Vec<_> = released.spec.iter().flat_map(|s| s.scheduling_gates.iter().flatten()).map(|g| g.name.as_str()).collect();
    assert_eq!(names, vec!["example.com/quota"], "only Archer's gate goes");
    assert!(applied(&released, &ops).is_err(), "a stale patch fails its test instead of removing another gate");
    assert!(remove_scheduling_gate(&mut released.clone(), GATE).is_none());
}

#[test]
fn pins_rewrite_tags_to_the_inspected_digest_and_leave_digests_alone() {
    use crate::patch::pin_images;
    let original: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {
        "initContainers": [{"name": "init", "image": "reg/init:1"}],
        "containers": [{"name": "app", "image": "reg/app:1"}, {"name": "side", "image": format!("reg/side@{DIGEST}")}, {"name": "other", "image": "reg/unknown:2"}]}}))
    .expect("pod");
    let digests: std::collections::BTreeMap<String, String> =
        [("reg/init:1", "sha256:aa"), ("reg/app:1", "sha256:bb"), (format!("reg/side@{DIGEST}").as_str(), DIGEST)].into_iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    let mut working = original.clone();
    let ops = pin_images(&mut working, &digests);
    assert_eq!(ops.len(), 2, "the tag references only");
    let pinned = applied(&original, &ops).expect("applies");
    assert_eq!(pinned, working);
    let spec = pinned.spec.expect("spec");
    assert_eq!(spec.init_containers.expect("init")[0].image.as_deref(), Some("reg/init:1@sha256:aa"));
    let images: Vec<_> = spec.containers.iter().map(|c| c.image.clone().unwrap_or_default()).collect();
    assert_eq!(images, vec!["reg/app:1@sha256:bb".to_string(), format!("reg/side@{DIGEST}"), "reg/unknown:2".into()]);
}
