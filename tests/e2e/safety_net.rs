//! The runtime safety net on the real control plane (`tests/e2e/run safety_net_`): a lying image
//! re-placed once, a stalled registry held behind the gate, a silent one released by the bound
//! (and swept on restart, and by `archer ungate --all`), and digest pinning.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::provisioning::{archer_nodes, node_of, pool, DEFAULT_POOL};
use super::{annotation, deployment, namespace, node, node_arch, nodes_ready, running_pods, wait, wait_running};
use crate::cluster::Cluster;

pub(super) const GATE: &str = "archer.dev/inspecting";
/// What runc reports through containerd when the binary is for another architecture.
pub(super) const RUNC: &str = "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: \"/app\": exec format error: unknown";

pub(super) fn gates(p: &Pod) -> Vec<String> {
    p.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()).map(|g| g.iter().map(|g| g.name.clone()).collect()).unwrap_or_default()
}

pub(super) async fn pods_of(client: &Client, ns: &str, app: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns).list(&ListParams::default().labels(&format!("app={app}"))).await.map(|l| l.items).unwrap_or_default()
}

/// One amd64 and one arm64 node (tainted, as arm64 nodes are), Ready.
pub(super) async fn amd_and_arm_nodes(client: &Client) {
    node(client, "amd", "m6i.xlarge", "us-east-1a", "on-demand").await;
    node(client, "arm", "m7g.xlarge", "us-east-1a", "on-demand").await;
    nodes_ready(client, 2).await;
}

/// Write the status kubelet writes for a container whose binary is for another architecture,
/// crash-looping (kwok runs no containers, so the harness is kubelet here).
pub(super) async fn report_exec_format_error(client: &Client, p: &Pod, image_id: &str) {
    let (ns, name) = (p.metadata.namespace.clone().unwrap_or_default(), p.metadata.name.clone().unwrap_or_default());
    let image = p.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone()).unwrap_or_default();
    let status = json!({"status": {"containerStatuses": [{
        "name": "app", "image": image, "imageID": image_id, "ready": false, "restartCount": 3, "started": false,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": format!("back-off 40s restarting failed container=app pod={name}")}},
        "lastState": {"terminated": {"exitCode": 128, "reason": "StartError", "message": RUNC, "startedAt": "1970-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:00Z"}}
    }]}});
    Api::<Pod>::namespaced(client.clone(), &ns).patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await.expect("kubelet's status");
}

/// Events in `ns` with `reason`, as (kind of the object they regard, note).
pub(super) async fn events(client: &Client, ns: &str, reason: &str) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    let all = api.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    all.into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| (e.regarding.and_then(|r| r.kind).unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// An index that lists arm64 for an amd64-only image: both of its entries are the same amd64
/// manifest. Returns the index's digest.
async fn push_lying_index(c: &Cluster, repo: &str, tag: &str) -> String {
    let amd = c.registry.push_image(repo, &format!("{tag}-amd64"), "linux/amd64", true).await;
    let entry = |arch: &str| json!({"mediaType": amd.media_type, "digest": amd.digest, "size": amd.size, "platform": {"os": "linux", "architecture": arch}});
    let index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [entry("amd64"), entry("arm64")]});
    c.registry.push_manifest(repo, tag, "application/vnd.oci.image.index.v1+json", &serde_json::to_vec(&index).expect("json")).await.digest
}

/// A lying image lands on arm64 (its index says it can), fails there with an exec format error,
/// and each of its pods is evicted once; the replacements are admitted with arm64 excluded and
/// land on amd64. When a replacement fails there too, nothing is left to try: it gets the Event
/// and stays (no second re-placement).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn safety_net_a_lying_image_is_replaced_once_onto_amd64() {
    let c = Cluster::start("safety-net-lying-image").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    let digest = push_lying_index(&c, "apps/liar", "1").await;
    namespace(&client, "shop", json!({"archer.dev/prefer": "arm64,amd64"})).await;
    amd_and_arm_nodes(&client).await;
    let image = c.registry.image("apps/liar:1");
    let image_id = format!("{}/apps/liar@{digest}", c.registry.host);
    Api::<Deployment>::namespaced(client.clone(), "shop").create(&PostParams::default(), &deployment("web", &image, 2, json!({}))).await.expect("create");
    let first = wait_running(&client, "shop", "web", 2, Duration::from_secs(120)).await;
    for p in &first {
        assert_eq!(node_arch(&client, &node_of(p)).await, "arm64", "the index says arm64, and the namespace prefers it");
    }

    for p in &first {
        report_exec_format_error(&client, p, &image_id).await;
    }
    let first_names: Vec<String> = first.iter().filter_map(|p| p.metadata.name.clone()).collect();
    wait("both failing pods re-placed onto amd64", Duration::from_secs(120), || async {
        let now = running_pods(&client, "shop", "web").await;
        let fresh: Vec<&Pod> = now.iter().filter(|p| !first_names.contains(p.metadata.name.as_ref().expect("name"))).collect();
        let mut on_amd = 0;
        for p in &fresh {
            on_amd += usize::from(node_arch(&client, &node_of(p)).await == "amd64");
        }
        on_amd == 2 && now.len() == 2
    })
    .await;
    let replacements = running_pods(&client, "shop", "web").await;
    for p in &replacements {
        assert_eq!(annotation(p, "archer.dev/platforms"), Some("linux/amd64"), "admitted with arm64 excluded");
    }
    assert_eq!(c.archer_metric("archer_exec_format_errors_total{namespace=\"shop\",arch=\"arm64\"}").await, 2.0);
    assert_eq!(c.archer_metric("archer_exec_format_replacements_total{outcome=\"evicted\"}").await, 2.0);
    let told = events(&client, "shop", "ExecFormatError").await;
    assert!(told.iter().any(|(kind, _)| kind == "Pod") && told.iter().any(|(kind, _)| kind == "ReplicaSet"), "an Event on each pod and on its owner: {told:?}");
    let record: ConfigMap = Api::namespaced(client.clone(), "archer-system").get("archer-safety-net").await.expect("the shared record");
    let text = record.data.and_then(|d| d.get("record.json").cloned()).unwrap_or_default();
    assert!(text.contains(&digest) && text.contains("arm64"), "the broken pair is kept across restarts: {text}");

    // The replacement fails on amd64 too: no architecture is left, so it is not re-placed again.
    let victim = &replacements[0];
    report_exec_format_error(&client, victim, &image_id).await;
    wait("the second failure handled", Duration::from_secs(60), || async {
        c.archer_metric("archer_exec_format_replacements_total{outcome=\"no_architecture_left\"}").await == 1.0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let still = Api::<Pod>::namespaced(client.clone(), "shop").get(victim.metadata.name.as_deref().expect("name")).await.expect("the pod stays");
    assert!(still.metadata.deletion_timestamp.is_none(), "no second re-placement");
    assert_eq!(c.archer_metric("archer_exec_format_replacements_total{outcome=\"evicted\"}").await, 2.0);
}

/// A registry that stalls past the admission deadline in a gate-mode namespace: the pods are
/// admitted behind `archer.dev/inspecting` (counted, and not provisioned for), and once the
/// registry answers they are released with the affinity and tolerations the images call for,
/// and the provisioner launches arm64 nodes for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn safety_net_a_stalled_registry_gates_then_decides() {
    let c = Cluster::start("safety-net-stalled").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    c.registry.push_index("apps/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "shop", json!({"archer.dev/mode": "gate"})).await;
    pool(&client, DEFAULT_POOL).await;

    c.registry.pause();
    let created = Instant::now();
    Api::<Deployment>::namespaced(client.clone(), "shop").create(&PostParams::default(), &deployment("web", &c.registry.image("apps/web:1"), 3, json!({}))).await.expect("create");
    wait("3 pods gated", Duration::from_secs(60), || async {
        let pods = pods_of(&client, "shop", "web").await;
        pods.len() == 3 && pods.iter().all(|p| gates(p).contains(&GATE.to_string()))
    })
    .await;
    wait("the gated pods counted", Duration::from_secs(30), || async { c.archer_metric("archer_gated_pods").await == 3.0 }).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(archer_nodes(&client).await.is_empty(), "gated pods are not provisioned for");
    assert!(pods_of(&client, "shop", "web").await.iter().all(|p| node_of(p).is_empty()), "nor scheduled");

    c.registry.resume();
    let pods = wait_running(&client, "shop", "web", 3, Duration::from_secs(120)).await;
    assert!(created.elapsed() < Duration::from_secs(20 + 60), "released by the inspection, not the bound");
    for p in &pods {
        assert!(gates(p).is_empty(), "the gate is gone");
        assert_eq!(annotation(p, "archer.dev/platforms"), Some("linux/amd64,linux/arm64"));
        let required = p.spec.as_ref().and_then(|s| s.affinity.as_ref()).and_then(|a| a.node_affinity.as_ref()).and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
        assert!(required.is_some(), "the required architecture term was patched in after admission");
        assert!(p.spec.as_ref().and_then(|s| s.tolerations.as_ref()).is_some_and(|t| t.iter().any(|t| t.key.as_deref() == Some("kubernetes.io/arch"))));
        assert_eq!(node_arch(&client, &node_of(p)).await, "arm64", "the provisioner planned them once ungated: arm64 is cheaper");
    }
    assert_eq!(c.archer_metric("archer_gate_releases_total{outcome=\"decided\"}").await, 3.0);
    assert_eq!(c.archer_metric("archer_gated_pods").await, 0.0);
}

/// A registry that never answers: gated pods are held no longer than the bound (20 s in these
/// tests), then released under the namespace's fail-open policy, unpatched (and here onto amd64,
/// as arm64 is tainted). With Archer down past the bound they stay held until it starts again
/// and sweeps them; `archer ungate --all` releases a held pod by hand and leaves other gates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn safety_net_a_silent_registry_is_released_by_the_bound() {
    let mut c = Cluster::start("safety-net-silent").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    c.registry.push_index("apps/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "shop", json!({"archer.dev/mode": "gate"})).await;
    amd_and_arm_nodes(&client).await;
    c.registry.pause();

    let api: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "shop");
    deploys.create(&PostParams::default(), &deployment("web", &c.registry.image("apps/web:1"), 2, json!({}))).await.expect("create");
    wait("2 pods gated", Duration::from_secs(60), || async { pods_of(&client, "shop", "web").await.iter().filter(|p| gates(p).contains(&GATE.to_string())).count() == 2 }).await;
    let pods = wait_running(&client, "shop", "web", 2, Duration::from_secs(90)).await;
    for p in &pods {
        let created = p.metadata.creation_timestamp.as_ref().expect("created").0;
        let age = k8s_openapi::jiff::Timestamp::now().duration_since(created).as_secs_f64();
        assert!(age >= 20.0, "released no sooner than the bound ({age:.1} s)");
        assert!(gates(p).is_empty());
        assert!(annotation(p, "archer.dev/inspection-error").is_some(), "released as fail-open leaves a pod: unpatched, with the error recorded");
        assert_eq!(node_arch(&client, &node_of(p)).await, "amd64", "unpatched, it does not tolerate arm64's taint");
    }
    assert_eq!(c.archer_metric("archer_gate_releases_total{outcome=\"bound\"}").await, 2.0);

    // Archer down past the bound: the pods it gated stay held, and the sweep on start releases them.
    deploys.create(&PostParams::default(), &deployment("late", &c.registry.image("apps/web:1"), 1, json!({}))).await.expect("create");
    wait("late gated", Duration::from_secs(60), || async { pods_of(&client, "shop", "late").await.iter().any(|p| gates(p).contains(&GATE.to_string())) }).await;
    c.stop_archer();
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert!(pods_of(&client, "shop", "late").await.iter().all(|p| gates(p).contains(&GATE.to_string())), "nothing else releases it");
    c.start_archer().await;
    wait_running(&client, "shop", "late", 1, Duration::from_secs(60)).await;

    // By hand: only Archer's gate goes (Archer stopped first: running, it would release a pod it
    // does not decide, as this one with archer.dev/ignore, by itself).
    c.stop_archer();
    let held: Pod = serde_json::from_value(json!({"metadata": {"name": "held", "labels": {"archer.dev/ignore": "true"}}, "spec": {
        "schedulingGates": [{"name": GATE}, {"name": "example.com/quota"}],
        "containers": [{"name": "app", "image": c.registry.image("apps/web:1")}]}}))
    .expect("pod");
    api.create(&PostParams::default(), &held).await.expect("create held");
    // As the uninstall hook runs it: only Archer's and the hook's service accounts may remove the gate.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_archer")).args(["ungate", "--all", "--kubeconfig"]).arg(c.kubeconfig_as(crate::cluster::UNGATE_USER)).output().expect("archer ungate");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("released 1 pod from the gate"), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(gates(&api.get("held").await.expect("held")), vec!["example.com/quota".to_string()]);
    c.registry.resume();
}

/// With `archer.dev/pin-digests: "true"` the pod runs the digest Archer inspected: its image
/// reference carries it, so moving the tag afterwards changes nothing for it; without the
/// annotation the reference is left as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn safety_net_a_pinned_pod_runs_the_digest_it_was_decided_on() {
    let c = Cluster::start("safety-net-pinned").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    let first = c.registry.push_index("apps/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "pinned", json!({"archer.dev/pin-digests": "true"})).await;
    namespace(&client, "plain", json!({})).await;
    amd_and_arm_nodes(&client).await;
    let image = c.registry.image("apps/web:1");
    for ns in ["pinned", "plain"] {
        Api::<Deployment>::namespaced(client.clone(), ns).create(&PostParams::default(), &deployment("web", &image, 1, json!({}))).await.expect("create");
    }
    let pinned = wait_running(&client, "pinned", "web", 1, Duration::from_secs(120)).await;
    let plain = wait_running(&client, "plain", "web", 1, Duration::from_secs(120)).await;
    let image_of = |p: &Pod| p.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone()).unwrap_or_default();
    assert_eq!(image_of(&pinned[0]), format!("{image}@{}", first.digest), "the reference names the digest that was inspected");
    assert_eq!(image_of(&plain[0]), image, "not pinned without the annotation");
    let template = Api::<Deployment>::namespaced(client.clone(), "pinned").get("web").await.expect("deployment");
    let template_image = template.spec.and_then(|s| s.template.spec).and_then(|s| s.containers.first().and_then(|c| c.image.clone()));
    assert_eq!(template_image.as_deref(), Some(image.as_str()), "the Deployment keeps its tag; its pods are pinned");

    // The tag moves (a rebuild): the pinned pod still names, and so runs, what was decided.
    let moved = c.registry.push_index("apps/web", "1", &["linux/amd64"], true, false).await;
    assert_ne!(moved.digest, first.digest);
    let again = Api::<Pod>::namespaced(client.clone(), "pinned").get(pinned[0].metadata.name.as_deref().expect("name")).await.expect("pod");
    assert_eq!(image_of(&again), format!("{image}@{}", first.digest));
}

/// The safety net on a real runtime: an index that lists amd64 whose amd64 manifest holds an
/// arm64 binary (the tests' own Go image) lands on the real amd64 node, where runc itself fails
/// with an exec format error; nothing here writes a status. Archer reads kubelet's status,
/// verifies the binary, records the pair, evicts once, and the replacement, admitted with amd64
/// excluded, runs on an arm64 (kwok) node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane and a real node: run tests/e2e/run safety_net_"]
async fn safety_net_a_real_exec_format_error_is_replaced_once() {
    use crate::node::{push_tiny, NODE_NAME};
    let c = Cluster::start_real("safety-net-real-runtime", true).await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    let tiny = c.dir.path().join("tiny");
    let lie = push_tiny(&c.registry, &tiny, "apps/liar", "amd64", "amd64", "arm64", &[]).await;
    let arm = push_tiny(&c.registry, &tiny, "apps/liar", "arm64", "arm64", "arm64", &[]).await;
    let index = c.registry.push_index_over("apps/liar", "1", &[(&lie, "linux/amd64"), (&arm, "linux/arm64")]).await;
    namespace(&client, "shop", json!({"archer.dev/prefer": "amd64,arm64"})).await;
    node(&client, "arm", "m7g.xlarge", "us-east-1a", "on-demand").await;
    nodes_ready(&client, 2).await;
    let image = c.registry.image("apps/liar:1");
    Api::<Deployment>::namespaced(client.clone(), "shop").create(&PostParams::default(), &deployment("web", &image, 1, json!({}))).await.expect("create");

    // kubelet's own account of the failure, from the real runtime.
    let kubelet_said = || async {
        let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "shop");
        events
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("kubelet"))
            .filter_map(|e| e.message)
            .find(|m| m.contains("exec format error"))
    };
    // Every status kubelet writes for a container on the real node, as it writes them.
    let seen: std::sync::Arc<std::sync::Mutex<Vec<k8s_openapi::api::core::v1::ContainerStatus>>> = Default::default();
    let watch = {
        use futures::StreamExt;
        let (pods, seen) = (Api::<Pod>::namespaced(client.clone(), "shop"), seen.clone());
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(kube::runtime::watcher(pods, Default::default()));
            while let Some(event) = stream.next().await {
                if let Ok(kube::runtime::watcher::Event::Apply(p)) = event {
                    if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE_NAME) {
                        let statuses = p.status.and_then(|s| s.container_statuses).unwrap_or_default();
                        seen.lock().expect("seen").extend(statuses.into_iter().filter(|c| c.last_state.as_ref().is_some_and(|s| s.terminated.is_some()) || c.state.as_ref().is_some_and(|s| s.terminated.is_some())));
                    }
                }
            }
        })
    };
    wait("the failing pod re-placed onto arm64", Duration::from_secs(120), || async {
        let now = running_pods(&client, "shop", "web").await;
        let mut on_arm = 0;
        for p in &now {
            on_arm += usize::from(node_arch(&client, &node_of(p)).await == "arm64" && annotation(p, "archer.dev/platforms") == Some("linux/arm64"));
        }
        on_arm == 1 && now.len() == 1
    })
    .await;
    watch.abort();
    let terminated: Vec<_> = seen.lock().expect("seen").clone();
    eprintln!("kubelet's statuses of the failing container: {}", serde_json::to_string(&terminated).unwrap_or_default());
    assert!(!terminated.is_empty(), "kubelet reported the container's failure");
    eprintln!("kubelet's events: {:?}", kubelet_said().await);
    assert_eq!(c.archer_metric("archer_exec_format_errors_total{namespace=\"shop\",arch=\"amd64\"}").await, 1.0);
    assert_eq!(c.archer_metric("archer_exec_format_replacements_total{outcome=\"evicted\"}").await, 1.0);
    assert_eq!(c.archer_metric("archer_exec_format_verifications_total{outcome=\"machine\"}").await, 1.0, "the entrypoint binary read (its machine determined)");
    assert_eq!(c.archer_metric("archer_exec_format_learned_total{scope=\"cluster\"}").await, 1.0, "verified from the image: it holds in every namespace");
    let told = events(&client, "shop", "ExecFormatError").await;
    eprintln!("Archer's events: {told:?}");
    assert!(told.iter().any(|(kind, note)| kind == "Pod" && note.contains(NODE_NAME)), "an Event on the pod, naming the real node: {told:?}");
    let record: ConfigMap = Api::namespaced(client.clone(), "archer-system").get("archer-safety-net").await.expect("the shared record");
    let text = record.data.and_then(|d| d.get("record.json").cloned()).unwrap_or_default();
    assert!(text.contains(&lie.digest) || text.contains(&index.digest), "the broken pair is recorded: {text}");
    // Evicted once: no second replacement while the replacement runs.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(c.archer_metric("archer_exec_format_replacements_total{outcome=\"evicted\"}").await, 1.0);
}
