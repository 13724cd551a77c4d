//! `archer crds migrate` on the real API server (`tests/e2e/run crd_migration_`): the CRDs of
//! the previous release (plurals shared with Karpenter: nodepools.archer.dev, ...) with a pool, a
//! launched claim and the Node it owns, and a provisioner holding its Lease. The command takes
//! the Lease, moves every object to the new CRDs with its status, keeps the Node (the garbage
//! collector never sees it ownerless) and gives it its new claim as owner, carries Helm's
//! ownership labels to the new CRDs, deletes its backup and releases the Lease; run again, it
//! has nothing to do; interrupted after the old CRD went, it resumes from the backup. It runs as
//! the chart's hook does: under the hook's service account and the chart's rules for it.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;

use archer::provisioner::nodeclaim::NodeClaim;
use archer::provisioner::nodepool::NodePool;
use crate::cluster::{Cluster, Mode};

const NS: &str = "archer-system";

/// A shipped CRD as the previous release named it: the plural and singular Karpenter shares.
fn old_crd(file: &str, old_plural: &str) -> CustomResourceDefinition {
    let text = std::fs::read_to_string(format!("{}/deploy/crds/{file}", env!("CARGO_MANIFEST_DIR"))).expect("crd");
    let mut crd: CustomResourceDefinition = archer::yaml::from_str(&text).expect("crd");
    crd.metadata.name = Some(format!("{old_plural}.archer.dev"));
    crd.spec.names.plural = old_plural.to_string();
    crd.spec.names.singular = Some(crd.spec.names.kind.to_lowercase());
    crd.spec.names.categories = None;
    // As a chart with CRDs in crds/ installed them: not Helm's (no ownership metadata).
    crd.metadata.labels = Some([("team".to_string(), "platform".to_string())].into());
    crd
}

/// The hook's service account, with the chart's permissions for it.
const HOOK_USER: &str = "system:serviceaccount:archer-system:archer-crd-migration";

/// `archer crds migrate` as the chart's hook runs it: as the hook's service account.
fn migrate(c: &Cluster) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_archer")).args(["crds", "migrate", "--namespace", NS, "--lease", "archer-provisioner", "--helm-release", "archer", "--kubeconfig"]).arg(c.kubeconfig_as(HOOK_USER)).output().expect("archer crds migrate");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "archer crds migrate: {text}");
    text
}

async fn established(crds: &Api<CustomResourceDefinition>, name: &str) {
    crate::wait(&format!("{name} established"), Duration::from_secs(30), || async {
        crds.get_opt(name).await.ok().flatten().and_then(|c| c.status).and_then(|s| s.conditions).is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run crd_migration_"]
async fn crd_migration_moves_objects_with_status_keeps_owned_nodes_and_resumes() {
    let c = Cluster::start_mode("crd-migration", &[], Mode::Karpenter, Vec::new()).await;
    let client = c.client().await;
    crate::ensure_namespace(&client, NS).await;
    // The chart's hook permissions (its account, roles and bindings), and nothing more.
    let hook: Vec<serde_json::Value> = crate::helm::render(NS, &[]).into_iter().filter(|o| o["metadata"]["name"] == "archer-crd-migration" && o["kind"] != "Job").collect();
    assert_eq!(hook.len(), 5, "{hook:?}");
    crate::helm::apply(&client, &hook).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (file, old) in [("nodepool.yaml", "nodepools"), ("nodeclaim.yaml", "nodeclaims")] {
        crds.create(&PostParams::default(), &old_crd(file, old)).await.expect("the previous release's CRD");
        established(&crds, &format!("{old}.archer.dev")).await;
    }
    // RBAC takes effect within moments: the hook's account reads the old CRD first.
    let as_hook: Api<CustomResourceDefinition> = Api::all(c.client_as(HOOK_USER).await);
    crate::wait("the hook's permissions in effect", Duration::from_secs(30), || async { as_hook.get("nodepools.archer.dev").await.is_ok() }).await;
    // The previous release's objects, through the old plurals.
    let raw = |path: &str, body: serde_json::Value| {
        let client = client.clone();
        let path = path.to_string();
        async move {
            let req = http::Request::post(path).header("content-type", "application/json").body(serde_json::to_vec(&body).expect("json")).expect("request");
            client.request::<serde_json::Value>(req).await.expect("create through the old plural")
        }
    };
    let pool = raw("/apis/archer.dev/v1alpha1/nodepools", json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodePool", "metadata": {"name": "default", "labels": {"team": "a"}}, "spec": {"weight": 20, "template": {"spec": {"requirements": []}}}})).await;
    assert_eq!(pool["spec"]["weight"], 20);
    let claim = raw("/apis/archer.dev/v1alpha1/nodeclaims", json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": "default-abc12"}, "spec": {
        "nodePool": "default", "instanceType": "m7g.large", "zone": "us-east-1a", "capacityType": "on-demand", "arch": "arm64", "os": "linux", "pricePerHour": 0.0816
    }})).await;
    let old_uid = claim["metadata"]["uid"].as_str().expect("uid").to_string();
    let status = json!({"status": {"providerId": "kwok://default-abc12", "nodeName": "default-abc12", "launchedAt": "2026-11-29T00:00:00Z"}});
    let req = http::Request::patch("/apis/archer.dev/v1alpha1/nodeclaims/default-abc12/status").header("content-type", "application/merge-patch+json").body(serde_json::to_vec(&status).expect("json")).expect("request");
    client.request::<serde_json::Value>(req).await.expect("the claim's status");
    // The Node it became, owned by it (kwok's Node objects are).
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "default-abc12", "labels": {"archer.dev/nodepool": "default"},
        "ownerReferences": [{"apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "name": "default-abc12", "uid": old_uid}]}})).expect("node");
    nodes.create(&PostParams::default(), &node).await.expect("node");
    // A provisioner holds its Lease (a short one: the command waits it out) and keeps renewing
    // it, as a replica does until it finds the Lease taken (kube-lease-manager renews with a
    // patch of the time and its duration, without looking at the holder).
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "archer-provisioner"}, "spec": {"holderIdentity": "archer-old-replica", "leaseDurationSeconds": 2, "renewTime": k8s_openapi::jiff::Timestamp::now()}})).expect("lease");
    leases.create(&PostParams::default(), &lease).await.expect("lease");
    let renewer = {
        let leases = leases.clone();
        tokio::spawn(async move {
            for _ in 0..6 {
                let patch = json!({"spec": {"renewTime": k8s_openapi::jiff::Timestamp::now(), "leaseDurationSeconds": 2}});
                let _ = leases.patch("archer-provisioner", &PatchParams::default(), &Patch::Strategic(patch)).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };

    // Another replica campaigns: it takes the Lease whenever it has expired. It must never take
    // it from the migration.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let candidate = {
        let (leases, stop) = (leases.clone(), stop.clone());
        tokio::spawn(async move {
            let mut took_from_migration = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(mut lease) = leases.get("archer-provisioner").await {
                    let spec = lease.spec.get_or_insert_with(Default::default);
                    let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
                        (Some(t), Some(d)) => t.0.as_second() + i64::from(d) < k8s_openapi::jiff::Timestamp::now().as_second(),
                        _ => false,
                    };
                    if expired && spec.holder_identity.as_deref() == Some("archer-crd-migration") {
                        spec.holder_identity = Some("archer-new-replica".into());
                        spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now()));
                        spec.lease_duration_seconds = Some(2);
                        if leases.replace("archer-provisioner", &PostParams::default(), &lease).await.is_ok() {
                            took_from_migration += 1;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            took_from_migration
        })
    };
    let out = tokio::task::block_in_place(|| migrate(&c));
    renewer.await.expect("renewer");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(candidate.await.expect("candidate"), 0, "no replica took the Lease while objects moved");
    assert!(out.contains("NodePool: 1 object moved from nodepools.archer.dev to archernodepools.archer.dev") && out.contains("NodeClaim: 1 object moved"), "{out}");
    for old in ["nodepools.archer.dev", "nodeclaims.archer.dev"] {
        assert!(crds.get_opt(old).await.expect("crds").is_none(), "{old} is gone");
    }
    for new in ["archernodepools.archer.dev", "archernodeclaims.archer.dev"] {
        let crd = crds.get(new).await.expect("the new CRD");
        assert_eq!(crd.metadata.annotations.as_ref().and_then(|a| a.get("meta.helm.sh/release-name")).map(String::as_str), Some("archer"), "{new}: the release's, so the upgrade adopts it");
        let labels = crd.metadata.labels.unwrap_or_default();
        assert_eq!((labels.get("app.kubernetes.io/managed-by").map(String::as_str), labels.get("team").map(String::as_str)), (Some("Helm"), Some("platform")), "{new}: Helm's label and the old CRD's own");
    }
    // The objects, through Archer's own types (the new plurals), with their status.
    let pool = Api::<NodePool>::all(client.clone()).get("default").await.expect("the pool moved");
    assert_eq!((pool.spec.weight, pool.metadata.labels.as_ref().and_then(|l| l.get("team")).map(String::as_str)), (Some(20), Some("a")));
    let claim = Api::<NodeClaim>::all(client.clone()).get("default-abc12").await.expect("the claim moved");
    let st = claim.status.clone().expect("status restored");
    assert_eq!((st.node_name.as_deref(), st.provider_id.as_deref()), (Some("default-abc12"), Some("kwok://default-abc12")));
    // The Node survived the old claim's deletion and is owned by the new claim; the garbage
    // collector, given time, leaves it.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let node = nodes.get("default-abc12").await.expect("the Node was not collected");
    let owner = node.metadata.owner_references.unwrap_or_default();
    assert_eq!(owner.iter().map(|o| (o.kind.as_str(), o.uid.as_str())).collect::<Vec<_>>(), [("NodeClaim", claim.metadata.uid.as_deref().expect("uid"))]);
    let released = leases.get("archer-provisioner").await.expect("the Lease stays");
    assert_eq!(released.spec.and_then(|s| s.holder_identity), None, "released as the replicas' own library releases it: no holder, taken at once");
    let backups: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    assert!(backups.list(&Default::default()).await.expect("configmaps").items.iter().all(|c| !c.metadata.name.as_deref().unwrap_or("").starts_with("archer-crd-migration")), "the backup deleted");

    // Again: nothing to do.
    assert!(tokio::task::block_in_place(|| migrate(&c)).contains("nothing to migrate"));

    // Interrupted after the old CRD went: the backup alone is there, and the run restores it.
    Api::<NodePool>::all(client.clone()).delete("default", &Default::default()).await.expect("delete the pool");
    let crd_name = "archernodepools.archer.dev";
    crds.delete(crd_name, &Default::default()).await.expect("delete the new CRD");
    crate::wait("the new CRD gone", Duration::from_secs(30), || async { crds.get_opt(crd_name).await.ok().flatten().is_none() }).await;
    let backup = json!({"objects": [{"apiVersion": "archer.dev/v1alpha1", "kind": "NodePool", "metadata": {"name": "resumed"}, "spec": {"template": {"spec": {"requirements": []}}}}], "owners": [], "labels": {}, "annotations": {}});
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "archer-crd-migration-nodepools-0", "annotations": {"archer.dev/chunks": "1"}}, "data": {"backup.json": backup.to_string()}})).expect("cm");
    backups.create(&PostParams::default(), &cm).await.expect("backup");
    let out = tokio::task::block_in_place(|| migrate(&c));
    assert!(out.contains("NodePool: 1 object moved"), "{out}");
    established(&crds, crd_name).await;
    Api::<NodePool>::all(client.clone()).get("resumed").await.expect("restored from the backup");
    assert!(backups.get_opt("archer-crd-migration-nodepools-0").await.expect("cm").is_none());
    let _ = nodes.patch("default-abc12", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"ownerReferences": null}}))).await;
}
