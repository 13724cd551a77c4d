//! The scheduler extender over real HTTPS with real-shaped ExtenderArgs: full Node objects through
//! the `archer serve` binary, and NodeNames against the watch-backed Node cache type.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

mod common;

use std::collections::BTreeMap;

use common::*;
use serde_json::{json, Value};

fn scores(v: &Value) -> BTreeMap<String, i64> {
    v.as_array()
        .expect("HostPriorityList")
        .iter()
        .map(|h| (h["Host"].as_str().expect("Host").to_string(), h["Score"].as_i64().expect("Score")))
        .collect()
}

fn workshop_nodes() -> Vec<Value> {
    ["m6g.large", "m7g.large", "t4g.large", "m6i.large", "t3a.large", "c6i.large"]
        .iter()
        .map(|t| node_json(&format!("ip-{}", t.replace('.', "-")), t, "us-east-1a", "on-demand"))
        .collect()
}

#[tokio::test]
async fn filter_drops_nodes_the_images_cannot_run_with_reasons() {
    let reg = Registry::start().await;
    reg.push_image("only/amd64", "1", "linux/amd64", true).await;
    let archer = Archer::start(&format!("registry:\n  insecure: [\"{}\"]\n", reg.host), &[]).await;
    let nodes = workshop_nodes();

    // A pod the webhook never saw: the extender inspects its image itself.
    let p = pod("legacy", &[&reg.image("only/amd64:1")]);
    let (status, r) = archer.post_json("/scheduler/filter", &extender_args_full(&p, &nodes)).await;
    assert_eq!(status, 200);
    assert_eq!(r["Error"], "");
    let kept: Vec<&str> = r["Nodes"]["items"].as_array().expect("items").iter().filter_map(|n| n["metadata"]["name"].as_str()).collect();
    assert_eq!(kept, vec!["ip-m6i-large", "ip-t3a-large", "ip-c6i-large"]);
    let failed = r["FailedAndUnresolvableNodes"].as_object().expect("failed");
    assert_eq!(failed.len(), 3);
    let why = failed["ip-m7g-large"].as_str().expect("reason");
    assert!(why.contains(&reg.image("only/amd64:1")) && why.contains("linux/amd64") && why.contains("linux/arm64"), "{why}");
    // Kept nodes are echoed back whole.
    assert_eq!(r["Nodes"]["items"][0], nodes[3]);

    // With the webhook's annotation, no registry call is needed.
    let before = archer.metric("archer_registry_requests_total").await;
    let annotated = with_annotation(pod("web", &["unreachable.invalid/x:1"]), "archer.dev/platforms", "linux/arm64");
    let (_, r) = archer.post_json("/scheduler/filter", &extender_args_full(&annotated, &nodes)).await;
    let kept: Vec<&str> = r["Nodes"]["items"].as_array().expect("items").iter().filter_map(|n| n["metadata"]["name"].as_str()).collect();
    assert_eq!(kept, vec!["ip-m6g-large", "ip-m7g-large", "ip-t4g-large"]);
    assert!(r["FailedAndUnresolvableNodes"]["ip-m6i-large"].as_str().is_some_and(|w| w.contains("archer.dev/platforms")));
    assert_eq!(archer.metric("archer_registry_requests_total").await, before);

    // Images that cannot be inspected: every node is kept.
    let (_, r) = archer.post_json("/scheduler/filter", &extender_args_full(&pod("x", &[&reg.image("missing/image:1")]), &nodes)).await;
    assert_eq!(r["Nodes"]["items"].as_array().map(Vec::len), Some(6));
    assert_eq!(r["FailedAndUnresolvableNodes"], json!({}));
}

/// A pod that runs on both architectures but carries no affinity (admitted before the policy,
/// or its inspection failed open) is not bound onto an architecture its namespace's policy
/// forbids: the filter applies the planner's rule (`Policy::placeable`), with the policy as the
/// reason; under observe the policy moves nothing.
#[tokio::test]
async fn filter_keeps_only_the_architectures_the_policy_allows() {
    let nodes = workshop_nodes();
    let both = with_annotation(pod("web", &["unreachable.invalid/x:1"]), "archer.dev/platforms", "linux/amd64,linux/arm64");
    let kept = |r: &Value| -> Vec<String> { r["Nodes"]["items"].as_array().expect("items").iter().filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string)).collect() };

    let archer = Archer::start("defaults:\n  allowedArchitectures: [amd64]\n", &[]).await;
    let (status, r) = archer.post_json("/scheduler/filter", &extender_args_full(&both, &nodes)).await;
    assert_eq!((status, r["Error"].as_str()), (200, Some("")));
    assert_eq!(kept(&r), ["ip-m6i-large", "ip-t3a-large", "ip-c6i-large"]);
    let why = r["FailedAndUnresolvableNodes"]["ip-m7g-large"].as_str().expect("refused with a reason");
    assert!(why.contains("archer.dev/allowed-architectures") && why.contains("amd64") && why.contains("arm64"), "{why}");

    let observing = Archer::start("defaults:\n  mode: observe\n  allowedArchitectures: [amd64]\n", &[]).await;
    let (_, r) = observing.post_json("/scheduler/filter", &extender_args_full(&both, &nodes)).await;
    assert_eq!(kept(&r).len(), 6, "observe changes no placement: {r}");
}

#[tokio::test]
async fn prioritize_ranks_by_cost_per_pod_arm64_first() {
    let archer = Archer::start("", &[]).await;
    let p = with_requests(pod("web", &["x"]), "500m", "512Mi");
    let (status, r) = archer.post_json("/scheduler/prioritize", &extender_args_full(&p, &workshop_nodes())).await;
    assert_eq!(status, 200);
    let s = scores(&r);
    // Cost per pod = price x max(cpu share, memory share); all six have 1930m allocatable and CPU
    // dominates, so the order is the price order: t4g 0.0672, t3a 0.0752, m6g 0.0770,
    // m7g 0.0816, c6i 0.0850, m6i 0.0960 (us-east-1 on-demand).
    // The worked example in the docs ("Scheduler extender") (arm64 5% and amd64 2.5% preference discounts).
    let expected: BTreeMap<String, i64> =
        [("ip-t4g-large", 10), ("ip-t3a-large", 7), ("ip-m6g-large", 7), ("ip-m7g-large", 5), ("ip-c6i-large", 4), ("ip-m6i-large", 0)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
    assert_eq!(s, expected);
    // Input order is kept.
    assert_eq!(r[0]["Host"], "ip-m6g-large");
}

#[tokio::test]
async fn spot_beats_on_demand_and_unknown_prices_stay_neutral() {
    let archer = Archer::start("", &[]).await;
    let nodes = vec![
        node_json("od", "m7g.large", "us-east-1a", "on-demand"),
        node_json("spot", "m7g.large", "us-east-1b", "spot"),
        node_json("dear", "m6i.xlarge", "us-east-1a", "on-demand"),
        {
            let mut n = node_json("mystery", "m7g.large", "us-east-1a", "on-demand");
            n["metadata"]["labels"]["node.kubernetes.io/instance-type"] = json!("x9z.huge");
            n
        },
        {
            let mut n = node_json("priced", "m6i.large", "us-east-1a", "on-demand");
            n["metadata"]["annotations"]["archer.dev/price-per-hour"] = json!("0.001");
            n
        },
    ];
    let p = with_requests(pod("web", &["x"]), "250m", "256Mi");
    let (_, r) = archer.post_json("/scheduler/prioritize", &extender_args_full(&p, &nodes)).await;
    let s = scores(&r);
    assert!(s["spot"] > s["od"], "{s:?}");
    assert_eq!(s["priced"], 10, "an explicit price annotation wins: {s:?}");
    assert_eq!(s["mystery"], 5, "unknown instance types are neutral: {s:?}");
    assert_eq!(s["dear"], 0);
    assert!(archer.metric("archer_extender_unknown_price_nodes_total").await >= 1.0);
}

#[tokio::test]
async fn bad_input_gets_an_error_not_a_crash() {
    let archer = Archer::start("", &[]).await;
    for body in [json!("not an object"), json!({"Nodes": {"items": []}}), json!({"Pod": {"metadata": {"name": "p"}}}), json!({"Pod": {"spec": {"containers": 3}}, "NodeNames": []})] {
        let (status, r) = archer.post_json("/scheduler/filter", &body).await;
        assert_eq!(status, 200);
        assert!(r["Error"].as_str().is_some_and(|e| !e.is_empty()), "{r}");
        let (status, r) = archer.post_json("/scheduler/prioritize", &body).await;
        assert_eq!(status, 200);
        assert_eq!(r, json!([]));
    }
    let raw = archer.client().post(format!("{}/scheduler/filter", archer.https)).body("{{{").send().await.expect("post");
    assert_eq!(raw.status().as_u16(), 200);
    // Lower-case keys are accepted, as Go's decoder does.
    let (_, r) = archer.post_json("/scheduler/filter", &json!({"pod": with_annotation(pod("p", &["x"]), "archer.dev/platforms", "linux/amd64"), "nodes": {"items": [node_json("a", "m7g.large", "us-east-1a", "spot")]}})).await;
    assert_eq!(r["FailedAndUnresolvableNodes"].as_object().map(|m| m.len()), Some(1));
    // In standalone mode there is no node cache: names are reported, not a crash.
    let (_, r) = archer.post_json("/scheduler/filter", &extender_args_names(&pod("p", &["x"]), &["n1"])).await;
    assert!(r["FailedNodes"]["n1"].as_str().is_some_and(|w| w.contains("not found")), "{r}");
}

/// NodeNames mode: the extender answers from the Node cache (kube-runtime's reflector Store,
/// filled here by its writer), served over real HTTPS by the same server code.
#[tokio::test]
async fn node_names_mode_uses_the_node_cache() {
    use k8s_openapi::api::core::v1::Node;
    use kube::runtime::{reflector, watcher};

    let (store, mut writer) = reflector::store::<Node>();
    for (name, t, cap) in [("arm-od", "m7g.large", "on-demand"), ("arm-spot", "m7g.large", "spot"), ("x86", "m6i.large", "on-demand")] {
        let node: Node = serde_json::from_value(node_json(name, t, "us-east-1a", cap)).expect("node");
        writer.apply_watcher_event(&watcher::Event::Apply(node));
    }
    let (port, client, _certs) = serve_extender_in_process(store).await;
    let post = |path: &'static str, body: Value| {
        let client = client.clone();
        async move { client.post(format!("https://127.0.0.1:{port}{path}")).json(&body).send().await.expect("post").json::<Value>().await.expect("json") }
    };

    let amd = with_annotation(with_requests(pod("p", &["x"]), "500m", "512Mi"), "archer.dev/platforms", "linux/amd64");
    let r = post("/scheduler/filter", extender_args_names(&amd, &["arm-od", "arm-spot", "x86", "gone"])).await;
    assert_eq!(r["NodeNames"], json!(["x86"]));
    assert_eq!(r["Nodes"], Value::Null);
    assert!(r["FailedAndUnresolvableNodes"]["arm-od"].as_str().is_some_and(|w| w.contains("linux/arm64")));
    assert!(r["FailedNodes"]["gone"].is_string());

    let multi = with_annotation(with_requests(pod("p", &["x"]), "500m", "512Mi"), "archer.dev/platforms", "linux/amd64,linux/arm64");
    let r = post("/scheduler/prioritize", extender_args_names(&multi, &["arm-od", "arm-spot", "x86"])).await;
    let s = scores(&r);
    assert_eq!(s["arm-spot"], 10);
    assert_eq!(s["x86"], 0);
    assert!(s["arm-od"] > s["x86"]);
}

#[tokio::test]
async fn plain_http_extender_listener_on_loopback() {
    let port = free_port();
    let archer = Archer::start("", &["--extender-listen", &format!("127.0.0.1:{port}")]).await;
    let p = with_annotation(pod("p", &["x"]), "archer.dev/platforms", "linux/arm64");
    let body = extender_args_full(&p, &[node_json("a", "m6i.large", "us-east-1a", "on-demand"), node_json("b", "m7g.large", "us-east-1a", "on-demand")]);
    let r: Value = reqwest::Client::new().post(format!("http://127.0.0.1:{port}/scheduler/filter")).json(&body).send().await.expect("post").json().await.expect("json");
    assert_eq!(r["Nodes"]["items"].as_array().map(Vec::len), Some(1));
    assert!(r["FailedAndUnresolvableNodes"]["a"].is_string());
    // /mutate is not on the plain listener.
    let m = reqwest::Client::new().post(format!("http://127.0.0.1:{port}/mutate")).body("{}").send().await.expect("post");
    assert_eq!(m.status().as_u16(), 404);
    drop(archer);
    // Only loopback addresses are accepted for plain HTTP.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_archer"))
        .args(["serve", "--tls-cert", "/nonexistent", "--tls-key", "/nonexistent", "--extender-listen", "0.0.0.0:9999"])
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn prices_lists_the_catalog() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_archer")).args(["prices", "--arch", "arm64", "--family", "m7g", "--output", "json"]).output().expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Value = serde_json::from_slice(&out.stdout).expect("json");
    let rows = rows.as_array().expect("list");
    assert!(rows.iter().all(|r| r["arch"] == "arm64" && r["family"] == "m7g"));
    assert_eq!(rows[0]["instanceType"], "m7g.medium", "cheapest first");
    let large = rows.iter().find(|r| r["instanceType"] == "m7g.large").expect("m7g.large");
    assert_eq!(large["onDemandPerHour"], json!(0.0816));
    assert_eq!(large["maxPods"], json!(29));
    let text = std::process::Command::new(env!("CARGO_BIN_EXE_archer")).args(["prices", "--family", "t4g"]).output().expect("run");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.lines().next().is_some_and(|h| h.contains("ON-DEMAND")) && text.contains("t4g.large"), "{text}");
}

/// `--region eastus` lists Azure's sizes priced there (and no EC2 type); a region the catalog
/// has no prices for is an error naming the ones it has, never a silent fall-back.
#[test]
fn prices_for_an_azure_region_list_azure_sizes_and_an_unknown_region_is_an_error() {
    let run = |args: &[&str]| std::process::Command::new(env!("CARGO_BIN_EXE_archer")).arg("prices").args(args).output().expect("run");
    let out = run(&["--region", "eastus", "--arch", "arm64", "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Value = serde_json::from_slice(&out.stdout).expect("json");
    let rows = rows.as_array().expect("list");
    assert_eq!(rows.len(), 60, "the arm64 D-family sizes");
    assert!(rows.iter().all(|r| r["provider"] == "azure" && r["region"] == "eastus"));
    assert_eq!(rows[0]["instanceType"], "Standard_D2pls_v6", "cheapest first");
    let d2pds = rows.iter().find(|r| r["instanceType"] == "Standard_D2pds_v5").expect("D2pds_v5");
    assert_eq!((d2pds["onDemandPerHour"].clone(), d2pds["allocatableCpu"].clone(), d2pds["maxPods"].clone()), (json!(0.0904), json!("1900m"), json!(250)));
    let aws = run(&["--region", "us-east-1", "--output", "json"]);
    let aws: Value = serde_json::from_slice(&aws.stdout).expect("json");
    assert!(aws.as_array().expect("list").iter().all(|r| r["provider"] == "aws"), "an AWS region lists EC2 types only");
    let unknown = run(&["--region", "mars-1"]);
    assert!(!unknown.status.success());
    let err = String::from_utf8_lossy(&unknown.stderr);
    assert!(err.contains("mars-1") && err.contains("eastus") && err.contains("us-east-1"), "{err}");
}
