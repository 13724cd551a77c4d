use super::*;
use serde_json::json;

fn node(name: &str, arch: &str, instance: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/arch": arch, "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": instance, "topology.kubernetes.io/zone": "us-east-1a", "topology.kubernetes.io/region": "us-east-1"}},
        "status": {"allocatable": {"cpu": "2", "memory": "8Gi", "pods": "29"}}
    }))
    .expect("node")
}

/// A pod of Deployment `app` (ReplicaSet `app-5d9f` with pod-template-hash `5d9f`).
fn pod(app: &str, i: usize, node: &str, image: &str, extra: serde_json::Value) -> Pod {
    let mut p = json!({
        "metadata": {"name": format!("{app}-5d9f-{i}"), "namespace": "shop", "labels": {"app": app, "pod-template-hash": "5d9f"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{app}-5d9f"), "uid": "u", "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": image, "resources": {"requests": {"cpu": "1", "memory": "4Gi"}}}]},
        "status": {"phase": "Running"}
    });
    if let Some(o) = extra.as_object() {
        for (k, v) in o {
            p["spec"][k] = v.clone();
        }
    }
    serde_json::from_value(p).expect("pod")
}

fn platforms(s: &str) -> Result<PlatformSet, String> {
    Ok(PlatformSet::parse_annotation(s).expect("platforms"))
}

fn sample() -> Report {
    let catalog = Catalog::embedded().expect("catalog");
    let nodes = vec![node("amd-1", "amd64", "m7i.large"), node("amd-2", "amd64", "m7i.large"), node("arm-1", "arm64", "m7g.large")];
    let pods = vec![
        pod("web", 0, "amd-1", "example.com/web:1", json!({})),
        pod("web", 1, "amd-2", "example.com/web:1", json!({})),
        pod("legacy", 0, "amd-1", "example.com/legacy:1", json!({})),
        pod("pinned", 0, "amd-2", "example.com/web:1", json!({"nodeSelector": {"kubernetes.io/arch": "amd64"}})),
        pod("native", 0, "arm-1", "example.com/web:1", json!({})),
        pod("wrong", 0, "arm-1", "example.com/legacy:1", json!({})),
        pod("mystery", 0, "amd-1", "example.com/private:1", json!({})),
    ];
    let images: ImagePlatforms = [
        ("example.com/web:1".to_string(), platforms("linux/amd64,linux/arm64")),
        ("example.com/legacy:1".to_string(), platforms("linux/amd64")),
        ("example.com/private:1".to_string(), Err("unauthorized".to_string())),
    ]
    .into_iter()
    .collect();
    let cluster = archer_model::ClusterState { nodes: nodes.into_iter().map(std::sync::Arc::new).collect(), pods: pods.into_iter().map(std::sync::Arc::new).collect(), ..Default::default() };
    build(&cluster, &images, &catalog)
}

fn workload<'a>(r: &'a Report, name: &str) -> &'a Workload {
    r.workloads.iter().find(|w| w.name == name).unwrap_or_else(|| panic!("no workload {name}: {:?}", r.workloads))
}

#[test]
fn workloads_are_grouped_by_their_deployment_and_classified() {
    let r = sample();
    assert_eq!(r.summary.workloads, 6);
    let web = workload(&r, "web");
    assert_eq!((web.kind.as_str(), web.pods, web.readiness), ("Deployment", 2, Readiness::Movable));
    assert!(web.saving_per_month.is_some_and(|s| s > 0.0), "multi-arch pods on amd64 save on arm64: {web:?}");
    let legacy = workload(&r, "legacy");
    assert_eq!(legacy.readiness, Readiness::Blocked);
    assert_eq!(legacy.blocked_by, vec![ImageProblem { image: "example.com/legacy:1".into(), platforms: vec!["linux/amd64".into()], error: None }]);
    assert_eq!(workload(&r, "pinned").readiness, Readiness::Pinned, "its nodeSelector keeps it on amd64");
    assert_eq!(workload(&r, "native").readiness, Readiness::OnArm64);
    let mystery = workload(&r, "mystery");
    assert_eq!(mystery.readiness, Readiness::Unknown);
    assert_eq!(mystery.blocked_by[0].error.as_deref(), Some("unauthorized"));
    assert_eq!((r.summary.movable, r.summary.blocked, r.summary.unknown), (1, 2, 1), "legacy and wrong are blocked");
    assert!((r.summary.saving_per_month - web.saving_per_month.unwrap_or(0.0)).abs() < 1e-9);
}

#[test]
fn a_pod_on_an_architecture_its_images_lack_is_misplaced() {
    let r = sample();
    assert_eq!(r.misplaced.len(), 1, "{:?}", r.misplaced);
    assert_eq!((r.misplaced[0].pod.as_str(), r.misplaced[0].arch.as_str()), ("shop/wrong-5d9f-0", "arm64"));
    assert_eq!(r.misplaced[0].supported, vec!["linux/amd64".to_string()]);
}

#[test]
fn costs_are_node_prices_shared_by_requests() {
    let catalog = Catalog::embedded().expect("catalog");
    let r = sample();
    let m7i = catalog.price("m7i.large", Some("us-east-1"), archer_core::catalog::CapacityType::OnDemand).expect("price");
    let m7g = catalog.price("m7g.large", Some("us-east-1"), archer_core::catalog::CapacityType::OnDemand).expect("price");
    assert!((r.summary.cost_per_month - (2.0 * m7i + m7g) * HOURS_PER_MONTH).abs() < 1e-6);
    assert!((r.summary.arm64_cost_per_month - m7g * HOURS_PER_MONTH).abs() < 1e-6);
    // 1 cpu of 2 and 4Gi of 8Gi: half the node, for each of web's two pods.
    assert!((workload(&r, "web").cost_per_month - m7i * HOURS_PER_MONTH).abs() < 1e-6);
    assert_eq!(r.summary.nodes_by_arch, BTreeMap::from([("amd64".to_string(), 2), ("arm64".to_string(), 1)]));
}

#[test]
fn the_text_report_names_blockers_and_misplaced_pods() {
    let text = render_text(&sample());
    assert!(text.contains("Cluster: 3 nodes (amd64 2, arm64 1), 7 pods"), "{text}");
    assert!(text.contains("shop/Deployment legacy: example.com/legacy:1 built only for linux/amd64"), "{text}");
    assert!(text.contains("shop/wrong-5d9f-0 on arm-1 (arm64): its images run on linux/amd64"), "{text}");
    assert!(text.contains("could not be inspected: unauthorized"), "{text}");
}
