//! `archer simulate`: the provisioner's deciding code on scenario YAML, with no cluster.

mod common;

use common::*;
use serde_json::Value;

fn simulate(args: &[&str]) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_archer")).arg("simulate").args(args).args(["--output", "json"]).output().expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn example(name: &str) -> String {
    format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn node_of<'a>(plan: &'a Value, pod: &str) -> &'a Value {
    plan["nodes"].as_array().expect("nodes").iter().find(|n| n["pods"].as_array().is_some_and(|p| p.iter().any(|x| x == pod))).unwrap_or_else(|| panic!("{pod} not placed: {plan}"))
}

#[test]
fn inflate_workshop_plan() {
    let plan = simulate(&["--scenario", &example("inflate.yaml"), "--compare"]);
    for i in 0..2 {
        let n = node_of(&plan, &format!("default/inflate-arm64-{i}"));
        assert_eq!(n["instanceType"], "c6g.xlarge");
        let n = node_of(&plan, &format!("default/inflate-amd64-{i}"));
        assert_eq!((n["arch"].as_str(), n["capacityType"].as_str()), (Some("amd64"), Some("on-demand")));
    }
    // Unconstrained multi-arch pods go to cheaper arm64 capacity.
    for i in 0..10 {
        assert_eq!(node_of(&plan, &format!("default/inflate-any-{i}"))["arch"], "arm64");
    }
    let total: f64 = plan["nodes"].as_array().expect("nodes").iter().map(|n| n["pricePerHour"].as_f64().expect("price")).sum();
    assert!((total - plan["totalPricePerHour"].as_f64().expect("total")).abs() < 1e-6);
    assert!(plan["unschedulable"].as_array().is_some_and(|u| u.is_empty()));
    assert!(plan["compare"]["savingsPerHour"].as_f64().is_some_and(|s| s > 0.0), "{}", plan["compare"]);
}

#[test]
fn team_pool_taints_and_labels() {
    let plan = simulate(&["--scenario", &example("team1.yaml"), "--offline"]);
    // The team's Deployment spreads over its pool's two zones (maxSkew 1).
    let mut zones = std::collections::BTreeMap::new();
    for n in plan["nodes"].as_array().expect("nodes").iter().filter(|n| n["pool"] == "team1") {
        *zones.entry(n["zone"].as_str().unwrap_or("").to_string()).or_insert(0) += n["pods"].as_array().map(Vec::len).unwrap_or(0);
    }
    assert_eq!(zones.into_values().collect::<Vec<_>>(), vec![2, 2], "4 replicas, 2 per zone");
    for n in plan["nodes"].as_array().expect("nodes") {
        let team = n["pods"].as_array().expect("pods").iter().any(|p| p.as_str().is_some_and(|p| p.starts_with("team1/")));
        let other = n["pods"].as_array().expect("pods").iter().any(|p| p.as_str().is_some_and(|p| p.starts_with("default/other-team")));
        assert!(!(team && other), "no other team's pods on team1 nodes: {n}");
        if team {
            assert_eq!(n["pool"], "team1");
            assert!(["us-east-1a", "us-east-1b"].contains(&n["zone"].as_str().unwrap_or("")));
        }
        if other {
            assert_eq!(n["pool"], "default");
            assert_eq!(n["arch"], "amd64");
        }
    }
}

#[tokio::test]
async fn images_are_inspected_like_the_webhook_does() {
    let reg = Registry::start().await;
    reg.push_image("only/amd64", "1", "linux/amd64", true).await;
    reg.push_image("only/s390x", "1", "linux/s390x", true).await;
    let dir = tempfile::tempdir().expect("tmp");
    let scenario = dir.path().join("s.yaml");
    std::fs::write(
        &scenario,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: shop}}\nspec:\n  containers:\n  - name: a\n    image: {}\n    resources: {{requests: {{cpu: 500m, memory: 256Mi}}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: mainframe, namespace: shop}}\nspec:\n  containers:\n  - name: a\n    image: {}\n",
            reg.image("only/amd64:1"),
            reg.image("only/s390x:1")
        ),
    )
    .expect("write");
    let s = scenario.to_str().expect("utf8");
    let plan = simulate(&["--scenario", s, "--insecure-registry", &reg.host]);
    assert_eq!(node_of(&plan, "shop/web")["arch"], "amd64");
    let u = &plan["unschedulable"][0];
    assert_eq!(u["pod"], "shop/mainframe");
    assert!(u["reason"].as_str().is_some_and(|r| r.contains("s390x")), "{u}");
    // --offline assumes unknown images run anywhere, and says so.
    let plan = simulate(&["--scenario", s, "--offline"]);
    assert!(plan["notes"].as_array().is_some_and(|n| n.iter().any(|x| x.as_str().is_some_and(|x| x.contains("assumed")))));
    assert!(plan["unschedulable"].as_array().is_some_and(|u| u.is_empty()));
}

#[test]
fn bad_scenarios_are_errors() {
    let dir = tempfile::tempdir().expect("tmp");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: many}\n").expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_archer")).args(["simulate", "--scenario"]).arg(&bad).output().expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("document 0"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn daemonsets_take_room_on_every_node_they_run_on() {
    let dir = tempfile::tempdir().expect("tmp");
    let deploy = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: w}\nspec:\n  replicas: 4\n  selector: {matchLabels: {app: w}}\n  template:\n    metadata: {labels: {app: w}, annotations: {archer.dev/platforms: linux/arm64}}\n    spec:\n      nodeSelector: {node.kubernetes.io/instance-type: m6g.large}\n      containers: [{name: a, image: x, resources: {requests: {cpu: 900m, memory: 256Mi}}}]\n";
    let ds = |selector: &str| format!("---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: agent}}\nspec:\n  selector: {{matchLabels: {{app: agent}}}}\n  template:\n    metadata: {{labels: {{app: agent}}}}\n    spec:\n      nodeSelector: {{{selector}}}\n      containers: [{{name: a, image: y, resources: {{requests: {{cpu: 200m, memory: 128Mi}}}}}}]\n");
    let run = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        simulate(&["--scenario", path.to_str().expect("utf8"), "--offline"])["nodes"].as_array().map(Vec::len).unwrap_or(0)
    };
    assert_eq!(run("none.yaml", deploy.to_string()), 2, "two 900m pods per 1930m node");
    assert_eq!(run("ds.yaml", format!("{deploy}{}", ds("kubernetes.io/os: linux"))), 4, "a 200m agent leaves room for one");
    assert_eq!(run("elsewhere.yaml", format!("{deploy}{}", ds("kubernetes.io/arch: s390x"))), 2, "an agent for other nodes takes nothing here");
}
