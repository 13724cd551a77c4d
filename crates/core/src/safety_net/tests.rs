//! The learning record and the no-loop rule, on pods as kube-controller-manager makes them.

use serde_json::json;

use super::*;

const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

fn limits() -> Limits {
    Limits { max_broken: 3, max_broken_per_namespace: 3, max_replaced: 2, max_replaced_per_namespace: 2, replacement_ttl_seconds: 3600, broken_ttl_seconds: 86_400 }
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

fn error(digest: Option<&str>) -> Vec<Detection> {
    let error = ExecFormatError { container: "app".into(), image: "reg/app:1".into(), digest: digest.map(String::from), reason: "StartError".into(), message: "exec format error".into(), evidence: Evidence::Runtime };
    vec![Detection { error, scope: Scope::Namespace(Unverified::NotVerified) }]
}

#[test]
fn a_lying_index_is_learned_once_and_excluded_for_its_digest_only() {
    let mut record = SafetyRecord::default();
    let pod = replica("web-abc-1", "abc", 100, Some("linux/amd64,linux/arm64"));
    let f = on_exec_format_errors(&pod, "arm64", &error(Some(DIGEST)), true, &mut record, 200, &limits());
    assert_eq!(f.learned.len(), 1);
    assert_eq!(f.verdict, Verdict::Replace);
    let both: PlatformSet = ["linux/amd64", "linux/arm64"].iter().map(|p| p.parse().expect("platform")).collect();
    let (left, removed) = record.exclude(DIGEST, "shop", 200, &both);
    assert_eq!(left.to_annotation(), "linux/amd64");
    assert_eq!(removed, vec!["arm64".to_string()]);
    assert_eq!(record.exclude("sha256:other", "shop", 200, &both).0, both, "another digest (a rebuilt image) is not excluded");
    assert_eq!(record.exclude(DIGEST, "elsewhere", 200, &both).0, both, "unverified evidence holds only in its namespace");
    assert!(record.mentions_image("reg/app:1", "shop", 200) && !record.mentions_image("reg/app:2", "shop", 200) && !record.mentions_image("reg/app:1", "elsewhere", 200));
    let again = on_exec_format_errors(&replica("web-abc-2", "abc", 150, None), "arm64", &error(Some(DIGEST)), true, &mut record, 210, &limits());
    assert!(again.learned.is_empty(), "a known pair is not learned twice");
    assert_eq!(again.verdict, Verdict::Replace, "a pod of the same round (created before the re-placement) is re-placed too");
    assert!(on_exec_format_errors(&pod, "arm64", &error(None), true, &mut SafetyRecord::default(), 200, &limits()).learned.is_empty(), "no digest, nothing learned");
}

#[test]
fn never_a_loop_one_replacement_per_template_and_architecture_per_ttl() {
    let l = limits();
    let mut r = SafetyRecord::default();
    let web = "shop/ReplicaSet/web-abc/abc";
    assert_eq!(r.replacement(web, "shop", "arm64", 90, false, 100, &l), Verdict::Replace);
    assert_eq!(r.replacement(web, "shop", "arm64", 95, false, 110, &l), Verdict::Replace, "created before: same round");
    assert_eq!(r.replacement(web, "shop", "arm64", 100, false, 110, &l), Verdict::Replace, "created in the second it opened, admitted with arm64: same round");
    assert_eq!(r.replacement(web, "shop", "arm64", 100, true, 110, &l), Verdict::Skip(Why::AlreadyReplaced), "admitted without arm64 and failing there anyway: the exclusion did not hold");
    assert_eq!(r.replacement(web, "shop", "arm64", 101, false, 120, &l), Verdict::Skip(Why::AlreadyReplaced), "created after it: a replacement that failed again");
    assert_eq!(r.replacement(web, "shop", "amd64", 100, false, 120, &l), Verdict::Replace, "another architecture is another key");
    assert_eq!(r.replacement("shop/ReplicaSet/db/x", "shop", "arm64", 100, false, 130, &l), Verdict::Skip(Why::RecordFull), "a full record refuses rather than forgets");
    assert_eq!(r.replacement(web, "shop", "arm64", 3650, false, 3700, &l), Verdict::Replace, "after the TTL, once more");
    assert_eq!(r.replacement(web, "shop", "arm64", 3701, false, 3702, &l), Verdict::Skip(Why::AlreadyReplaced));
    assert_eq!(r.replacement("shop/ReplicaSet/db/x", "shop", "arm64", 3700, false, 3730, &l), Verdict::Replace, "room again once an entry expired");
}

#[test]
fn bare_pods_opted_out_namespaces_and_images_with_nowhere_left_get_only_the_event() {
    let l = limits();
    let mut bare = replica("solo", "abc", 100, None);
    bare.metadata.owner_references = None;
    assert_eq!(template_key(&bare), None);
    assert_eq!(on_exec_format_errors(&bare, "arm64", &error(Some(DIGEST)), true, &mut SafetyRecord::default(), 200, &l).verdict, Verdict::Skip(Why::BarePod));
    let pod = replica("web-abc-1", "abc", 100, Some("linux/amd64,linux/arm64"));
    let mut record = SafetyRecord::default();
    let off = on_exec_format_errors(&pod, "arm64", &error(Some(DIGEST)), false, &mut record, 200, &l);
    assert_eq!(off.verdict, Verdict::Skip(Why::Disabled));
    assert_eq!(off.learned.len(), 1, "learning goes on when re-placement is off");
    let amd = on_exec_format_errors(&replica("web-def-1", "def", 300, Some("linux/amd64,linux/arm64")), "amd64", &error(Some(DIGEST)), true, &mut record, 400, &l);
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
        r.learn(Broken { digest: format!("sha256:{i}"), arch: "arm64".into(), image: "x".repeat(2000), at: i, namespace: "shop".into(), verified: false, expires: 0 }, &l);
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

/// A pod of `namespace` running `reg/app:1` with the container spec `container` (merged).
fn tenant_pod(namespace: &str, container: serde_json::Value) -> Pod {
    let mut c = json!({"name": "app", "image": "reg/app:1"});
    if let (Some(base), Some(extra)) = (c.as_object_mut(), container.as_object()) {
        base.extend(extra.clone());
    }
    serde_json::from_value(json!({"metadata": {"name": "p", "namespace": namespace,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "rs", "controller": true}],
        "labels": {"pod-template-hash": "abc"}},
        "spec": {"containers": [c]}}))
    .expect("pod")
}

fn failure(evidence: Evidence) -> ExecFormatError {
    let (reason, message) = match evidence {
        Evidence::Runtime => ("StartError", "exec: \"/app\": exec format error: unknown"),
        Evidence::Container => ("Error", "exec format error"),
        Evidence::ExitedAtOnce => ("Error", "exec /app: exec format error"),
    };
    ExecFormatError { container: "app".into(), image: "reg/app:1".into(), digest: Some(DIGEST.into()), reason: reason.into(), message: message.into(), evidence }
}

fn both() -> PlatformSet {
    ["linux/amd64", "linux/arm64"].iter().map(|p| p.parse().expect("platform")).collect()
}

#[test]
fn a_tenants_own_words_or_binary_never_mark_an_image_broken_for_another_namespace() {
    let arm_binary = Entrypoint { path: "/app".into(), arch: "amd64".into() };
    // The container wrote "exec format error" to its termination log: its own words.
    let evil = tenant_pod("evil", json!({}));
    assert_eq!(scope(&evil, &failure(Evidence::Container), "arm64", Some(&arm_binary)), Scope::Namespace(Unverified::ContainersOwnMessage), "even when the image does hold another architecture's binary");
    // A real runtime error, but of a binary the pod chose.
    for chosen in [json!({"command": ["/elsewhere/arm"]}), json!({"args": ["x"]})] {
        assert_eq!(scope(&tenant_pod("evil", chosen), &failure(Evidence::Runtime), "arm64", Some(&arm_binary)), Scope::Namespace(Unverified::CommandOverridden));
    }
    let mounted = tenant_pod("evil", json!({"volumeMounts": [{"name": "v", "mountPath": "/"}]}));
    assert_eq!(scope(&mounted, &failure(Evidence::Runtime), "arm64", Some(&arm_binary)), Scope::Namespace(Unverified::VolumeOverEntrypoint));
    let beside = tenant_pod("evil", json!({"volumeMounts": [{"name": "v", "mountPath": "/ap"}, {"name": "w", "mountPath": "/app/"}]}));
    assert_eq!(scope(&beside, &failure(Evidence::Runtime), "arm64", Some(&arm_binary)), Scope::Namespace(Unverified::VolumeOverEntrypoint), "/app/ covers /app");
    let near = tenant_pod("evil", json!({"volumeMounts": [{"name": "v", "mountPath": "/ap"}, {"name": "w", "mountPath": "/data"}]}));
    assert_eq!(scope(&near, &failure(Evidence::Runtime), "arm64", Some(&arm_binary)), Scope::Cluster, "mounts beside the entrypoint do not hide it");
    assert_eq!(scope(&evil, &failure(Evidence::Runtime), "arm64", None), Scope::Namespace(Unverified::NotVerified));
    assert_eq!(scope(&evil, &failure(Evidence::Runtime), "amd64", Some(&arm_binary)), Scope::Namespace(Unverified::BinaryMatches));
    assert_eq!(scope(&evil, &failure(Evidence::Runtime), "amd64", Some(&Entrypoint { path: "/app".into(), arch: "386".into() })), Scope::Namespace(Unverified::BinaryMatches));
    assert_eq!(unverifiable(&evil, &failure(Evidence::Runtime)), None, "only then is the image read");
    // A quick exit whose log says it (runc 1.1): the log is the tenant's, so only the image's
    // own binary widens it, exactly as for the runtime's report.
    assert_eq!(unverifiable(&evil, &failure(Evidence::ExitedAtOnce)), None, "the image is read");
    assert_eq!(scope(&evil, &failure(Evidence::ExitedAtOnce), "arm64", Some(&arm_binary)), Scope::Cluster);
    assert_eq!(scope(&evil, &failure(Evidence::ExitedAtOnce), "arm64", None), Scope::Namespace(Unverified::NotVerified));
    assert_eq!(scope(&evil, &failure(Evidence::ExitedAtOnce), "amd64", Some(&arm_binary)), Scope::Namespace(Unverified::BinaryMatches), "a forged line over a binary that runs here");
    assert_eq!(scope(&tenant_pod("evil", json!({"command": ["/elsewhere/arm"]})), &failure(Evidence::ExitedAtOnce), "arm64", Some(&arm_binary)), Scope::Namespace(Unverified::CommandOverridden));

    // What each teaches the record: the forged one holds in `evil` only.
    let mut record = SafetyRecord::default();
    let forged = Detection { error: failure(Evidence::Container), scope: scope(&evil, &failure(Evidence::Container), "arm64", None) };
    on_exec_format_errors(&evil, "arm64", &[forged], true, &mut record, 100, &limits());
    assert_eq!(record.exclude(DIGEST, "victim", 101, &both()).0, both(), "the victim keeps arm64");
    assert_eq!(record.exclude(DIGEST, "evil", 101, &both()).1, vec!["arm64".to_string()], "the tenant excluded it for itself");
    // Verified from the image: it holds everywhere, and replaces the namespace's own entry.
    let verified = Detection { error: failure(Evidence::Runtime), scope: Scope::Cluster };
    let f = on_exec_format_errors(&tenant_pod("shop", json!({})), "arm64", &[verified], true, &mut record, 102, &limits());
    assert!(f.learned.iter().all(|b| b.verified));
    assert_eq!(record.exclude(DIGEST, "victim", 103, &both()).1, vec!["arm64".to_string()]);
    assert_eq!(record.broken.len(), 1);
}

#[test]
fn broken_pairs_expire_after_their_ttl() {
    let l = Limits { broken_ttl_seconds: 600, ..Limits::default() };
    let mut record = SafetyRecord::default();
    on_exec_format_errors(&tenant_pod("shop", json!({})), "arm64", &error(Some(DIGEST)), false, &mut record, 1000, &l);
    assert_eq!(record.exclude(DIGEST, "shop", 1599, &both()).1.len(), 1);
    assert_eq!(record.exclude(DIGEST, "shop", 1600, &both()).0, both(), "expired: arm64 is trusted again");
    assert!(!record.mentions_image("reg/app:1", "shop", 1600));
    let f = on_exec_format_errors(&tenant_pod("shop", json!({})), "arm64", &error(Some(DIGEST)), false, &mut record, 1700, &l);
    assert_eq!((f.learned.len(), record.broken.len()), (1, 1), "learned again, the expired entry gone");
}

#[test]
fn two_thousand_bare_pods_with_invented_owners_leave_another_namespaces_replacement_working() {
    let l = Limits::default();
    let mut record = SafetyRecord::default();
    for i in 0..2000 {
        // An invented controller per pod, each failing on its own digest in one container and
        // many more in others.
        let mut pod = tenant_pod("evil", json!({}));
        pod.metadata.owner_references.iter_mut().flatten().for_each(|o| {
            o.name = format!("made-up-{i}");
            o.uid = format!("uid-{i}");
        });
        let many: Vec<Detection> = (0..4).map(|c| Detection { error: ExecFormatError { digest: Some(format!("sha256:{i}-{c}")), ..failure(Evidence::Runtime) }, scope: Scope::Namespace(Unverified::NotVerified) }).collect();
        on_exec_format_errors(&pod, "arm64", &many, true, &mut record, 100 + i, &l);
    }
    let evil_broken = record.broken.iter().filter(|b| b.namespace == "evil").count();
    assert_eq!((evil_broken, record.replaced.len()), (l.max_broken_per_namespace, l.max_replaced_per_namespace), "one namespace holds its share and no more");
    let victim = tenant_pod("victim", json!({}));
    let f = on_exec_format_errors(&victim, "arm64", &error(Some(DIGEST)), true, &mut record, 3000, &l);
    assert_eq!(f.verdict, Verdict::Replace, "the other namespace's re-placement works");
    assert_eq!(f.learned.len(), 1);
    // A flood after it does not push the victim's entries out.
    for i in 0..500 {
        let mut pod = tenant_pod("evil", json!({}));
        pod.metadata.owner_references.iter_mut().flatten().for_each(|o| o.name = format!("later-{i}"));
        on_exec_format_errors(&pod, "arm64", &error(Some(&format!("sha256:later-{i}"))), true, &mut record, 3001 + i, &l);
    }
    assert_eq!(record.exclude(DIGEST, "victim", 4000, &both()).1, vec!["arm64".to_string()]);
    assert!(record.replaced.iter().any(|r| r.namespace == "victim"));

    // A full record (every namespace under its share) makes room from the largest namespace.
    let tight = Limits { max_replaced: 3, max_replaced_per_namespace: 2, ..Limits::default() };
    let mut r = SafetyRecord::default();
    assert_eq!(r.replacement("a/x/1/h", "a", "arm64", 1, false, 1, &tight), Verdict::Replace);
    assert_eq!(r.replacement("a/x/2/h", "a", "arm64", 2, false, 2, &tight), Verdict::Replace);
    assert_eq!(r.replacement("a/x/3/h", "a", "arm64", 3, false, 3, &tight), Verdict::Skip(Why::RecordFull), "a's share");
    assert_eq!(r.replacement("b/x/1/h", "b", "arm64", 4, false, 4, &tight), Verdict::Replace);
    assert_eq!(r.replacement("c/x/1/h", "c", "arm64", 5, false, 5, &tight), Verdict::Replace, "the record is full: a, the largest, gives up its oldest");
    assert!(!r.replaced.iter().any(|e| e.template == "a/x/1/h"));
}

#[test]
fn the_record_always_fits_its_configmap_whatever_its_entries_hold() {
    let l = Limits { max_broken: 1500, max_broken_per_namespace: 1500, max_replaced: 1500, max_replaced_per_namespace: 1500, ..Limits::default() };
    let mut record = SafetyRecord::default();
    // The worst escapes: control characters take six bytes each in JSON.
    let nasty = "\u{1}".repeat(60);
    for i in 0..1500 {
        let ns = if i % 10 == 0 { "quiet" } else { "loud" };
        record.learn(Broken { digest: format!("sha256:{i}{nasty}"), arch: "arm64".into(), image: nasty.clone(), at: i, namespace: ns.into(), verified: false, expires: 0 }, &l);
        record.replacement(&format!("{ns}/x/{i}/{nasty}"), ns, "arm64", i, false, i, &l);
    }
    let before = serde_json::to_vec(&record).expect("json").len();
    assert!(before > MAX_RECORD_BYTES, "the bounds alone would not fit: {before}");
    let dropped = record.fit(MAX_RECORD_BYTES);
    let after = serde_json::to_vec(&record).expect("json").len();
    assert!(after <= MAX_RECORD_BYTES && dropped > 0, "{after} bytes after dropping {dropped}");
    assert!(after > MAX_RECORD_BYTES - 8 * 1024, "no more is dropped than needed: {after}");
    let quiet = record.broken.iter().filter(|b| b.namespace == "quiet").count();
    assert_eq!(quiet, 150, "the namespace holding the most gives way: the quiet one keeps all of its entries");
    let mut small = SafetyRecord::default();
    assert_eq!(small.fit(MAX_RECORD_BYTES), 0);
    assert_eq!(serde_json::from_slice::<SafetyRecord>(&serde_json::to_vec(&record).expect("json")).expect("parse"), record);
}

#[test]
fn a_do_not_disrupt_pod_is_never_evicted() {
    let mut pod = tenant_pod("shop", json!({}));
    pod.metadata.annotations = Some([(DO_NOT_DISRUPT.to_string(), "true".to_string())].into());
    let f = on_exec_format_errors(&pod, "arm64", &error(Some(DIGEST)), true, &mut SafetyRecord::default(), 100, &limits());
    assert_eq!((f.verdict, f.learned.len()), (Verdict::Skip(Why::DoNotDisrupt), 1), "learned, not evicted");
    assert_eq!(f.verdict.as_str(), "do_not_disrupt");
}
