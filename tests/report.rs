//! `archer report` on a dump (`kubectl get nodes,pods -A -o yaml`) whose images live in a real
//! registry: one multi-arch, one built for amd64 only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

mod common;

use common::*;
use serde_json::{json, Value};

fn node(name: &str, arch: &str, instance: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/arch": arch, "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": instance, "topology.kubernetes.io/zone": "us-east-1a", "topology.kubernetes.io/region": "us-east-1"}},
           "status": {"allocatable": {"cpu": "2", "memory": "8Gi", "pods": "29"}}})
}

fn pod(name: &str, owner: &str, node: &str, image: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "shop", "labels": {"pod-template-hash": "7c9d"}, "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{owner}-7c9d"), "uid": "x", "controller": true}]},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": image, "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]},
           "status": {"phase": "Running"}})
}

/// The dump in a file, as kubectl writes it (YAML; JSON is YAML too).
fn write_dump(dump: &Value) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("dump.yaml");
    std::fs::write(&path, serde_saphyr::to_string(dump).expect("yaml")).expect("write");
    (dir, path)
}

/// `archer report ARGS --output json`, which must succeed.
fn report_json(args: &[&str]) -> Value {
    let (out, ok) = report(&[args, &["--output", "json"]].concat());
    assert!(ok, "{out}");
    serde_json::from_str(&out).expect("json")
}

fn report(args: &[&str]) -> (String, bool) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_archer")).arg("report").args(args).output().expect("run");
    (String::from_utf8_lossy(if out.status.success() { &out.stdout } else { &out.stderr }).into_owned(), out.status.success())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dump_reports_movable_blocked_and_misplaced_workloads() {
    let reg = Registry::start().await;
    reg.push_index("apps/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    reg.push_image("apps/legacy", "1", "linux/amd64", true).await;
    let (web, legacy) = (reg.image("apps/web:1"), reg.image("apps/legacy:1"));
    let dump = json!({"apiVersion": "v1", "kind": "List", "items": [
        node("amd-1", "amd64", "m7i.xlarge"), node("arm-1", "arm64", "m7g.xlarge"),
        pod("web-7c9d-a", "web", "amd-1", &web), pod("web-7c9d-b", "web", "amd-1", &web),
        pod("legacy-7c9d-a", "legacy", "amd-1", &legacy),
        pod("batch-7c9d-a", "batch", "arm-1", &legacy),
    ]});
    let (_dir, path) = write_dump(&dump);
    let file = path.to_str().expect("utf8");
    let r = report_json(&["--from-file", file, "--insecure-registry", &reg.host]);
    let w = |name: &str| r["workloads"].as_array().expect("workloads").iter().find(|w| w["name"] == name).cloned().unwrap_or_else(|| panic!("no {name}: {r}"));
    assert_eq!((w("web")["kind"].as_str(), w("web")["readiness"].as_str(), w("web")["pods"].as_u64()), (Some("Deployment"), Some("movable"), Some(2)));
    assert!(w("web")["savingPerMonth"].as_f64().is_some_and(|s| s > 0.0), "{r}");
    assert_eq!(w("legacy")["readiness"], "blocked");
    assert_eq!(w("legacy")["blockedBy"][0]["image"], legacy.as_str());
    assert_eq!(w("legacy")["blockedBy"][0]["platforms"], json!(["linux/amd64"]));
    assert_eq!(r["misplaced"][0]["pod"], "shop/batch-7c9d-a");
    assert_eq!(r["misplaced"][0]["arch"], "arm64");
    assert_eq!((r["summary"]["nodes"].as_u64(), r["summary"]["pods"].as_u64(), r["summary"]["movable"].as_u64(), r["summary"]["misplacedPods"].as_u64()), (Some(2), Some(4), Some(1), Some(1)));
    assert!((r["summary"]["savingPerMonth"].as_f64().unwrap_or(0.0) - w("web")["savingPerMonth"].as_f64().unwrap_or(0.0)).abs() < 1e-9);

    let (text, ok) = report(&["--from-file", file, "--insecure-registry", &reg.host]);
    assert!(ok, "{text}");
    assert!(text.contains("Cluster: 2 nodes (amd64 1, arm64 1), 4 pods"), "{text}");
    assert!(text.contains(&format!("{legacy} built only for linux/amd64")), "{text}");
    assert!(text.contains("shop/batch-7c9d-a on arm-1 (arm64)"), "{text}");

    // Offline, unannotated images are unknown, never guessed.
    let (out, ok) = report(&["--from-file", file, "--offline", "--output", "json"]);
    assert!(ok, "{out}");
    let r: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(r["summary"]["unknown"].as_u64(), Some(3), "{r}");
    // A missing or malformed dump is a clear error.
    let (err, ok) = report(&["--from-file", "/nonexistent/dump.yaml"]);
    assert!(!ok && err.contains("reading /nonexistent/dump.yaml"), "{err}");
}

/// The report says how many pods Archer could not decide, and why (issue #43): a pod the webhook
/// admitted without inspecting its images (`archer.dev/decision: inspection-failed`, the reason
/// in brackets in its `archer.dev/inspection-error`) counts even when the report itself can read
/// the image; a pod whose image the report cannot read counts by its own reason; offline, what
/// was not inspected is `not_inspected`, never guessed.
#[tokio::test(flavor = "multi_thread")]
async fn pods_archer_could_not_decide_are_counted_by_reason() {
    let reg = Registry::start().await;
    reg.push_index("apps/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    let web = reg.image("apps/web:1");
    let mut failed = pod("private-7c9d-a", "private", "amd-1", &web);
    failed["metadata"]["annotations"] = json!({"archer.dev/decision": "inspection-failed", "archer.dev/inspection-error": format!("image \"{web}\": [identity] no ecr credential for {}: GetAuthorizationToken in eu-west-1: dispatch failure", reg.host)});
    let dump = json!({"apiVersion": "v1", "kind": "List", "items": [
        node("amd-1", "amd64", "m7i.xlarge"),
        failed,
        pod("missing-7c9d-a", "missing", "amd-1", &reg.image("apps/missing:1")),
        pod("web-7c9d-a", "web", "amd-1", &web),
    ]});
    let (_dir, path) = write_dump(&dump);
    let file = path.to_str().expect("utf8");
    let r = report_json(&["--from-file", file, "--insecure-registry", &reg.host]);
    assert_eq!((r["summary"]["undecidedPods"].clone(), r["summary"]["undecidedByReason"].clone()), (json!(2), json!({"identity": 1, "not_found": 1})), "{r}");
    let (text, ok) = report(&["--from-file", file, "--insecure-registry", &reg.host]);
    assert!(ok && text.contains("Pods Archer could not decide (their images could not be inspected): 2 (identity 1, not_found 1)"), "{text}");
    let (out, ok) = report(&["--from-file", file, "--offline", "--output", "json"]);
    assert!(ok, "{out}");
    let r: Value = serde_json::from_str(&out).expect("json");
    assert_eq!((r["summary"]["undecidedPods"].clone(), r["summary"]["undecidedByReason"].clone()), (json!(3), json!({"identity": 1, "not_inspected": 2})), "{r}");
}
