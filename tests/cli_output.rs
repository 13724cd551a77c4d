//! What the command line prints, held to what a newcomer reads (#46): the headline and the
//! comparison say which pods they cover, no `-0.0000`, plurals, the real reason a pod cannot be
//! placed, `--fail-on-unschedulable`, `-o text|json|yaml`, unknown fields and `--strict`, no
//! colour when piped, one name per environment variable, error chains without repeats.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

use std::process::{Command, Output};

fn archer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_archer"))
        .args(args)
        .env_remove("ARCHER_CATALOG")
        .env_remove("ARCHER_CONFIG")
        .env_remove("ARCHER_KUBECONFIG")
        .env_remove("NO_COLOR")
        .output()
        .expect("run archer")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn scenario(dir: &tempfile::TempDir, yaml: &str) -> String {
    let p = dir.path().join("scenario.yaml");
    std::fs::write(&p, yaml).expect("write");
    p.to_str().expect("path").to_string()
}

const INFLATE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/inflate.yaml");

/// A pod that no instance type is big enough for, whose images run only on amd64: the reason is
/// its size, not arm64's offerings (which are also too small).
const HUGE: &str = "apiVersion: archer.dev/v1alpha1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      requirements:
        - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
        - {key: karpenter.k8s.aws/instance-category, operator: In, values: [c, m]}
---
apiVersion: v1
kind: Pod
metadata:
  name: huge
  annotations: {archer.dev/platforms: linux/amd64}
spec:
  containers: [{name: c, image: x, resources: {requests: {cpu: '1000', memory: 1Gi}}}]
";

#[test]
fn the_headline_and_the_comparison_say_which_pods_they_cover() {
    let out = archer(&["simulate", "--offline", "--compare", "--scenario", INFLATE]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let o = text(&out.stdout);
    // 14 pods in the plan; the two pinned to arm64 cannot be in a plan without arm64.
    assert!(o.starts_with("Plan for 14 pods: "), "{o}");
    assert!(o.contains("\nWith arm64 forbidden for 12 pods: "), "{o}");
    assert!(o.contains("Comparison over the same 12 pods in every line: the plan's 14 less 2 pods only arm64 or spot can run (default/inflate-arm64-0, default/inflate-arm64-1):"), "{o}");
    // A pool of on-demand only: spot saves nothing, and the month's figure is arm64's alone.
    assert!(o.contains("Spot saves nothing more on these pods"), "{o}");
    assert!(!o.contains("Spot saves $0.0000/hour more") && !o.contains("spot saves $0.0000/hour more"), "{o}");
}

#[test]
fn an_empty_plan_costs_zero_not_minus_zero_and_counts_are_plural() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = scenario(&dir, "apiVersion: v1\nkind: Node\nmetadata: {name: n, labels: {kubernetes.io/arch: amd64}}\n");
    for format in ["text", "json", "yaml"] {
        let out = archer(&["simulate", "--offline", "--compare", "--disruption", "-o", format, "--scenario", &s]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let o = text(&out.stdout);
        assert!(!o.contains("-0.0") && !o.contains("$-0"), "{format}: {o}");
        assert!(!o.contains("(s)"), "{format}: {o}");
    }
    let o = text(&archer(&["simulate", "--offline", "--compare", "--disruption", "--scenario", &s]).stdout);
    assert!(o.starts_with("Plan for 0 pods: 0 new nodes, $0.0000/hour\n"), "{o}");
    assert!(o.contains("Disruption: 0 decisions"), "{o}");
    let o = text(&archer(&["simulate", "--offline", "--compare", "--scenario", INFLATE]).stdout);
    assert!(o.contains(": 12 new nodes, ") && !o.contains("(s)"), "{o}");
}

#[test]
fn a_pod_too_big_for_every_instance_type_is_unschedulable_for_its_size() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = scenario(&dir, HUGE);
    let out = archer(&["simulate", "--offline", "--scenario", &s]);
    assert!(out.status.success(), "without --fail-on-unschedulable a plan with unschedulable pods is a success");
    let o = text(&out.stdout);
    assert!(o.contains("unschedulable default/huge: pool default: no instance type it allows is big enough for the pod's requests (cpu 1000, memory 1Gi)"), "{o}");
    assert!(!o.contains("images support"), "the architecture is not why: {o}");

    let out = archer(&["simulate", "--offline", "--fail-on-unschedulable", "--scenario", &s]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("unschedulable default/huge"), "the plan is still printed");
    assert!(text(&out.stderr).contains("1 pod unschedulable (--fail-on-unschedulable)"), "{}", text(&out.stderr));
    // A plan that places everything passes the gate.
    let out = archer(&["simulate", "--offline", "--fail-on-unschedulable", "--scenario", INFLATE]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn yaml_output_is_the_json_document() {
    for args in [&["simulate", "--offline", "--compare", "--scenario", INFLATE][..], &["prices", "--family", "m7g"][..]] {
        let json = archer(&[args, &["-o", "json"]].concat());
        let yaml = archer(&[args, &["-o", "yaml"]].concat());
        assert!(json.status.success() && yaml.status.success(), "{}{}", text(&json.stderr), text(&yaml.stderr));
        let a: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
        let b: serde_json::Value = serde_saphyr::from_str(&text(&yaml.stdout)).expect("yaml");
        assert_eq!(a, b, "{args:?}");
    }
}

#[test]
fn unknown_fields_are_warned_with_their_path_and_refused_under_strict() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = scenario(
        &dir,
        "apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: default}
spec:
  weight: 10
  wieght: 20
  template:
    spec:
      expireAftr: 720h
      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}
      requirements: [{key: kubernetes.io/arch, operator: In, values: [amd64]}]
---
metadata: {name: stray}
",
    );
    let out = archer(&["simulate", "--offline", "--scenario", &s]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("warning: unknown field document 1: NodePool default: spec.wieght"), "{err}");
    assert!(err.contains("warning: unknown field document 1: NodePool default: spec.template.spec.expireAftr"), "{err}");
    assert!(!err.contains("nodeClassRef") && !err.contains(": kind") && !err.contains("apiVersion"), "known fields are not reported: {err}");
    assert_eq!(err.matches("spec.wieght").count(), 1, "each once: {err}");
    assert!(text(&out.stdout).contains("note: ignored a document without a kind (metadata.name stray)"), "{}", text(&out.stdout));

    let out = archer(&["simulate", "--offline", "--strict", "--scenario", &s]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("error: unknown fields (--strict): document 1: NodePool default: spec.template.spec.expireAftr; document 1: NodePool default: spec.wieght"), "{err}");
}

#[test]
fn an_error_says_each_cause_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = scenario(&dir, "apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  template:\n    spec:\n      requirements: [{key: kubernetes.io/arch, operator: Inn, values: [amd64]}]\n");
    let out = archer(&["simulate", "--offline", "--scenario", &s]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(err.matches("unknown operator").count(), 1, "{err}");
    assert!(err.contains("NodePool default: requirement on kubernetes.io/arch: unknown operator \"Inn\""), "{err}");
}

#[test]
fn prices_refuses_an_architecture_or_family_it_does_not_have() {
    let out = archer(&["prices", "--arch", "sparc"]);
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(text(&out.stderr).contains("possible values: amd64, arm64"), "{}", text(&out.stderr));
    let out = archer(&["prices", "--arch", "arm64", "--family", "m7i"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("no instance type of family \"m7i\" here; the families are: ") && err.contains("m7g") && !err.contains("m7i,"), "arm64's families only: {err}");
}

#[test]
fn logs_have_no_colour_when_piped_and_every_command_reads_archer_kubeconfig() {
    // ungate with a kubeconfig that is not there: the error names it, so ARCHER_KUBECONFIG is
    // the variable it reads (as serve and report do).
    let out = Command::new(env!("CARGO_BIN_EXE_archer")).args(["ungate", "--all"]).env("ARCHER_KUBECONFIG", "/nonexistent/archer-kubeconfig").output().expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/nonexistent/archer-kubeconfig"), "{}", text(&out.stderr));
    // A log line on a pipe: no escape codes, with or without NO_COLOR.
    let out = Command::new(env!("CARGO_BIN_EXE_archer")).args(["report", "--offline", "--log", "debug"]).env("KUBECONFIG", "/nonexistent").env_remove("ARCHER_KUBECONFIG").env_remove("KUBERNETES_SERVICE_HOST").output().expect("run");
    let err = text(&out.stderr);
    assert!(err.contains("INFO") || err.contains("DEBUG") || err.contains("error"), "something was logged: {err}");
    assert!(!err.contains('\u{1b}'), "no ANSI escapes on a pipe: {err:?}");
}
