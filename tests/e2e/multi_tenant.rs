//! Shared clusters (`tests/e2e/run multi_tenant_`): what one tenant writes into its own pods (a
//! termination message, a command override, another controller's gate) reaches no other tenant
//! through Archer, and the safety net's record at its byte bound is written and read back
//! through the real API server.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::provisioning::node_of;
use super::safety_net::{amd_and_arm_nodes, gates, pods_of, report_exec_format_error, GATE};
use super::{annotation, deployment, namespace, node_arch, running_pods, wait, wait_running};
use crate::cluster::Cluster;
use archer::core::safety_net::{Broken, SafetyRecord, MAX_RECORD_BYTES};

/// What a container writes to `/dev/termination-log` (or its log tail under
/// `FallbackToLogsOnError`) when it wants Archer to believe its image is broken: kubelet reports
/// it as the container's own termination.
async fn report_forged_message(client: &Client, p: &Pod, image_id: &str) {
    let (ns, name) = (p.metadata.namespace.clone().unwrap_or_default(), p.metadata.name.clone().unwrap_or_default());
    let image = p.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone()).unwrap_or_default();
    let status = json!({"status": {"containerStatuses": [{
        "name": "app", "image": image, "imageID": image_id, "ready": false, "restartCount": 1, "started": false,
        "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "exec format error\n", "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:01Z"}}
    }]}});
    Api::<Pod>::namespaced(client.clone(), &ns).patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await.expect("kubelet's status");
}

/// A tenant (`evil`) runs a public multi-arch image on arm64 and makes Archer see "exec format
/// error" twice: written by the container into its termination log, and as the runtime's own
/// `StartError` of a command it chose. Both count for `evil` only: its own pods are re-placed off
/// arm64, while a pod of the same digest in `victim` keeps arm64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn multi_tenant_a_forged_exec_format_error_stays_in_its_namespace() {
    let c = Cluster::start("multi-tenant-forged").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    let public = c.registry.push_index("library/python", "3.12", &["linux/amd64", "linux/arm64"], true, false).await;
    for ns in ["evil", "victim"] {
        namespace(&client, ns, json!({"archer.dev/prefer": "arm64,amd64"})).await;
    }
    amd_and_arm_nodes(&client).await;
    let image = c.registry.image("library/python:3.12");
    let image_id = format!("{}/library/python@{}", c.registry.host, public.digest);
    let evil: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), "evil");
    evil.create(&PostParams::default(), &deployment("forger", &image, 1, json!({}))).await.expect("create");
    let overriding = deployment("override", &image, 1, json!({"containers": [{"name": "app", "image": image, "command": ["/mnt/arm/binary"], "resources": {"requests": {"cpu": "200m", "memory": "128Mi"}}}]}));
    evil.create(&PostParams::default(), &overriding).await.expect("create");
    let forger = wait_running(&client, "evil", "forger", 1, Duration::from_secs(120)).await;
    let overrider = wait_running(&client, "evil", "override", 1, Duration::from_secs(120)).await;
    for p in forger.iter().chain(&overrider) {
        assert_eq!(node_arch(&client, &node_of(p)).await, "arm64", "the index says arm64, and the namespace prefers it");
    }

    report_forged_message(&client, &forger[0], &image_id).await;
    report_exec_format_error(&client, &overrider[0], &image_id).await;
    wait("both detections handled", Duration::from_secs(60), || async { c.archer_metric("archer_exec_format_errors_total{namespace=\"evil\",arch=\"arm64\"}").await == 2.0 }).await;
    assert_eq!(c.archer_metric("archer_exec_format_learned_total{scope=\"namespace\"}").await, 1.0, "one pair, for evil");
    assert_eq!(c.archer_metric("archer_exec_format_learned_total{scope=\"cluster\"}").await, 0.0, "nothing a tenant chose is evidence for everyone");
    let record: ConfigMap = Api::namespaced(client.clone(), "archer-system").get("archer-safety-net").await.expect("the shared record");
    let text = record.data.and_then(|d| d.get("record.json").cloned()).unwrap_or_default();
    let parsed: SafetyRecord = serde_json::from_str(&text).expect("record");
    assert!(parsed.broken.iter().all(|b| b.namespace == "evil" && !b.verified && b.expires > b.at), "{text}");

    // The tenant hurt only itself: its pods are replaced off arm64...
    let forged_name = forger[0].metadata.name.clone().expect("name");
    wait("evil's forger re-placed onto amd64", Duration::from_secs(120), || async {
        let now = running_pods(&client, "evil", "forger").await;
        let fresh: Vec<&Pod> = now.iter().filter(|p| p.metadata.name.as_ref() != Some(&forged_name)).collect();
        let mut on_amd = 0;
        for p in &fresh {
            on_amd += usize::from(node_arch(&client, &node_of(p)).await == "amd64");
        }
        on_amd == 1
    })
    .await;
    // ...while the victim, running the very same digest, keeps arm64.
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), "victim").create(&PostParams::default(), &deployment("web", &image, 2, json!({}))).await.expect("create");
    let victims = wait_running(&client, "victim", "web", 2, Duration::from_secs(120)).await;
    for p in &victims {
        assert_eq!(annotation(p, "archer.dev/platforms"), Some("linux/amd64,linux/arm64"), "nothing excluded for the victim");
        assert_eq!(node_arch(&client, &node_of(p)).await, "arm64");
    }
}

/// Gate mode beside another admission controller's scheduling gate: the webhook appends
/// `archer.dev/inspecting` after `example.com/quota` (it used to replace the list), and the gate
/// controller removes only its own, so the pod still waits for the other controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn multi_tenant_gate_mode_keeps_another_controllers_gate() {
    let c = Cluster::start("multi-tenant-gates").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    c.registry.push_index("apps/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "shop", json!({"archer.dev/mode": "gate"})).await;
    amd_and_arm_nodes(&client).await;
    c.registry.pause();
    let api: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "quota", "labels": {"app": "quota"}}, "spec": {
        "schedulingGates": [{"name": "example.com/quota"}],
        "containers": [{"name": "app", "image": c.registry.image("apps/web:1")}]}}))
    .expect("pod");
    api.create(&PostParams::default(), &pod).await.expect("create");
    let held = api.get("quota").await.expect("pod");
    assert_eq!(gates(&held), vec!["example.com/quota".to_string(), GATE.to_string()], "both gates, the other controller's first");

    c.registry.resume();
    wait("Archer's gate released, decided", Duration::from_secs(60), || async {
        let p = api.get("quota").await.expect("pod");
        gates(&p) == vec!["example.com/quota".to_string()] && annotation(&p, "archer.dev/platforms").is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let p = api.get("quota").await.expect("pod");
    assert!(node_of(&p).is_empty(), "the other controller's gate still holds it");
    assert_eq!(c.archer_metric("archer_gate_releases_total{outcome=\"decided\"}").await, 1.0);
    assert_eq!(pods_of(&client, "shop", "quota").await.len(), 1);

    // A pod Archer does not decide (archer.dev/ignore) that carries its gate anyway only loses
    // that gate: it is neither decided nor patched otherwise.
    let ignored: Pod = serde_json::from_value(json!({"metadata": {"name": "ignored", "labels": {"app": "ignored", "archer.dev/ignore": "true"}}, "spec": {
        "schedulingGates": [{"name": GATE}, {"name": "example.com/quota"}],
        "containers": [{"name": "app", "image": c.registry.image("apps/web:1")}]}}))
    .expect("pod");
    api.create(&PostParams::default(), &ignored).await.expect("create");
    wait("the ignored pod's Archer gate removed", Duration::from_secs(30), || async { gates(&api.get("ignored").await.expect("pod")) == vec!["example.com/quota".to_string()] }).await;
    let p = api.get("ignored").await.expect("pod");
    assert!(annotation(&p, "archer.dev/platforms").is_none() && annotation(&p, "archer.dev/decision").is_none(), "not decided");
    assert_eq!(c.archer_metric("archer_gate_releases_total{outcome=\"not_decided\"}").await, 1.0);
}

/// The safety net's record filled past its byte bound with the costliest entries there are
/// (control characters escape to six bytes each in JSON) is cut to the bound before it is
/// written, written through the real API server (which refuses a ConfigMap over 1 MiB), and
/// read back unchanged by a fresh watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn multi_tenant_a_record_at_its_bound_is_written_and_read_back() {
    let c = Cluster::start("multi-tenant-record").await;
    let client = c.client().await;
    let name = "record-at-its-bound";
    let (shared, watch) = archer::cluster::safety_record::SharedRecord::watched(&client, "archer-system", name);
    let watching = tokio::spawn(watch);
    let limits = archer::core::safety_net::Limits { max_broken: 1500, max_broken_per_namespace: 1500, max_replaced: 1500, max_replaced_per_namespace: 1500, ..Default::default() };
    let nasty = "\u{1}".repeat(600);
    shared
        .update(|r| {
            for i in 0..1500 {
                let ns = format!("tenant-{}", i % 7);
                r.learn(Broken { digest: format!("sha256:{i}{nasty}"), arch: "arm64".into(), image: format!("{i}{nasty}"), at: 1_000 + i, namespace: ns.clone(), verified: i % 2 == 0, expires: 0 }, &limits);
                r.replacement(&format!("{ns}/ReplicaSet/{i}{nasty}"), &ns, "arm64", 1_000 + i, false, 1_000 + i, &limits);
            }
        })
        .await
        .expect("written through the API server");
    let stored: ConfigMap = Api::namespaced(client.clone(), "archer-system").get(name).await.expect("the record");
    let text = stored.data.and_then(|d| d.get("record.json").cloned()).expect("record.json");
    assert!(text.len() <= MAX_RECORD_BYTES && text.len() > MAX_RECORD_BYTES - 16 * 1024, "at its bound: {} bytes", text.len());
    let read: SafetyRecord = serde_json::from_str(&text).expect("parses");
    assert_eq!(read, *shared.get(), "what was written is what is read");
    assert!(read.broken.len() > 50 && !read.replaced.is_empty());
    // Another replica's watch reads the same record.
    let (other, other_watch) = archer::cluster::safety_record::SharedRecord::watched(&client, "archer-system", name);
    let other_watching = tokio::spawn(other_watch);
    wait("another replica's watch reads it", Duration::from_secs(30), || async { *other.get() == read }).await;
    // And one more learning still writes (the record stays at its bound, never over).
    shared
        .update(|r| {
            r.learn(Broken { digest: "sha256:late".into(), arch: "arm64".into(), image: "late".into(), at: 9_999, namespace: "late".into(), verified: false, expires: 0 }, &limits);
        })
        .await
        .expect("a write at the bound");
    assert!(shared.get().broken.iter().any(|b| b.digest == "sha256:late"));
    watching.abort();
    other_watching.abort();
}

/// A gzipped layer holding one executable file.
fn layer_with(path: &str, data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o755);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(data.len() as u64);
    b.append_data(&mut h, path, data).expect("file");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&b.into_inner().expect("tar")).expect("gzip");
    gz.finish().expect("gzip")
}

/// The 64-byte header of a little-endian 64-bit ELF executable for `machine` (62: x86-64), and a
/// few bytes of code.
fn elf(machine: u16) -> Vec<u8> {
    let mut h = vec![0u8; 64];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = 2;
    h[5] = 1;
    h[6] = 1;
    h[16..18].copy_from_slice(&2u16.to_le_bytes());
    h[18..20].copy_from_slice(&machine.to_le_bytes());
    h[20..24].copy_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&[0x90; 16]);
    h
}

/// The runtime's own exec format error for an image that nothing in the pod overrides, whose
/// index lists arm64 for a manifest whose entrypoint is an x86-64 binary: Archer reads that binary
/// from the registry, and the pair holds for every namespace. A pod of the same digest in another
/// namespace is admitted without arm64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn multi_tenant_a_verified_exec_format_error_holds_for_every_namespace() {
    let c = Cluster::start("multi-tenant-verified").await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    let config = json!({"architecture": "amd64", "os": "linux", "config": {"Entrypoint": ["/app"]}, "rootfs": {"type": "layers", "diff_ids": []}});
    let amd = c.registry.push_image_layers("apps/liar", "1-amd64", &config, &[layer_with("app", &elf(62))], true).await;
    let index = c.registry.push_index_over("apps/liar", "1", &[(&amd, "linux/amd64"), (&amd, "linux/arm64")]).await;
    for ns in ["shop", "other"] {
        namespace(&client, ns, json!({"archer.dev/prefer": "arm64,amd64"})).await;
    }
    amd_and_arm_nodes(&client).await;
    let image = c.registry.image("apps/liar:1");
    let image_id = format!("{}/apps/liar@{}", c.registry.host, index.digest);
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), "shop").create(&PostParams::default(), &deployment("web", &image, 1, json!({}))).await.expect("create");
    let first = wait_running(&client, "shop", "web", 1, Duration::from_secs(120)).await;
    assert_eq!(node_arch(&client, &node_of(&first[0])).await, "arm64");
    report_exec_format_error(&client, &first[0], &image_id).await;
    wait("the detection verified from the image", Duration::from_secs(90), || async { c.archer_metric("archer_exec_format_learned_total{scope=\"cluster\"}").await == 1.0 }).await;
    assert_eq!(c.archer_metric("archer_exec_format_verifications_total{outcome=\"machine\"}").await, 1.0);

    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), "other").create(&PostParams::default(), &deployment("web", &image, 1, json!({}))).await.expect("create");
    let others = wait_running(&client, "other", "web", 1, Duration::from_secs(120)).await;
    assert_eq!(annotation(&others[0], "archer.dev/platforms"), Some("linux/amd64"), "arm64 excluded in every namespace");
    assert_eq!(node_arch(&client, &node_of(&others[0])).await, "amd64");
}
