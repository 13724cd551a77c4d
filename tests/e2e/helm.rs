//! The Helm chart's rendered manifests applied to the real API server (server-side apply, as
//! `helm install` and `kubectl apply --server-side` send them): every object is accepted by the
//! API server's validation, with default and non-default values.

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{ApiResource, Discovery, Scope};
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::cluster::Cluster;

pub(crate) fn helm() -> PathBuf {
    if let Some(p) = std::env::var_os("ARCHER_HELM") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("tests/build-helm")).output().expect("tests/build-helm");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).expect("utf-8").trim())
}

pub fn render(namespace: &str, flags: &[&str]) -> Vec<Value> {
    let out = Command::new(helm())
        .args(["template", "archer"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/archer"))
        .args(["--namespace", namespace, "--include-crds"])
        .args(flags)
        .output()
        .expect("helm");
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    let docs: Vec<Value> = archer::yaml::from_multiple(&String::from_utf8(out.stdout).expect("utf-8")).expect("yaml");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// Server-side apply each object (CRDs first, discovery refreshed after them); the objects the
/// API server returned.
pub async fn apply(client: &Client, objects: &[Value]) -> Vec<DynamicObject> {
    let (crds, rest): (Vec<&Value>, Vec<&Value>) = objects.iter().partition(|o| o["kind"] == "CustomResourceDefinition");
    let mut applied = Vec::new();
    for batch in [crds, rest] {
        let discovery = Discovery::new(client.clone()).run().await.expect("discovery");
        for o in batch {
            let api_version = o["apiVersion"].as_str().expect("apiVersion");
            let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
            let kind = o["kind"].as_str().expect("kind");
            let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
            let (ar, caps): (ApiResource, _) = discovery.resolve_gvk(&gvk).unwrap_or_else(|| panic!("the API server serves no {api_version} {kind}"));
            let name = o["metadata"]["name"].as_str().expect("name");
            let api: Api<DynamicObject> = match caps.scope {
                Scope::Namespaced => Api::namespaced_with(client.clone(), o["metadata"]["namespace"].as_str().expect("a namespaced object names its namespace"), &ar),
                Scope::Cluster => Api::all_with(client.clone(), &ar),
            };
            let obj = api.patch(name, &PatchParams::apply("archer-e2e-helm").force(), &Patch::Apply(o)).await.unwrap_or_else(|e| panic!("{kind} {name} refused: {e}"));
            applied.push(obj);
        }
        // Let the new CRDs' APIs be served before the objects that use them.
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    applied
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn the_helm_chart_applies_to_the_api_server() {
    let c = Cluster::start("helm").await;
    let client = c.client().await;
    for ns in ["archer-helm", "archer-helm-2"] {
        let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns");
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &n).await.expect("namespace");
    }
    // Defaults: the webhook (its certificate is Archer's to make at run time), the CRDs.
    let objects = render("archer-helm", &[]);
    let applied = apply(&client, &objects).await;
    assert_eq!(applied.len(), objects.len());
    let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    for k in ["CustomResourceDefinition", "Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "MutatingWebhookConfiguration", "PodDisruptionBudget"] {
        assert!(kinds.contains(&k), "the default render has no {k}");
    }
    let d = Api::<Deployment>::namespaced(client.clone(), "archer-helm").get("archer").await.expect("deployment");
    assert_eq!(d.spec.and_then(|s| s.replicas), Some(2));
    // Non-default values, into a second namespace under another release name's objects.
    let objects = render("archer-helm-2", &["--set", "fullnameOverride=archer2,replicas=3,podDisruptionBudget.enabled=false,extender.secondScheduler.enabled=true,extender.secondScheduler.schedulerName=archer2-scheduler,provisioner.cloudProvider=kwok,webhook.failurePolicy=Fail,webhook.timeoutSeconds=10"]);
    let objects: Vec<Value> = objects.into_iter().filter(|o| o["kind"] != "CustomResourceDefinition").collect();
    apply(&client, &objects).await;
    let d = Api::<Deployment>::namespaced(client.clone(), "archer-helm-2").get("archer2").await.expect("deployment");
    assert_eq!(d.spec.and_then(|s| s.replicas), Some(3));
    Api::<Deployment>::namespaced(client.clone(), "archer-helm-2").get("archer2-scheduler").await.expect("the second scheduler");
    let w = Api::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>::all(client.clone()).get("archer2").await.expect("webhook");
    assert_eq!(w.webhooks.and_then(|w| w.into_iter().next()).and_then(|w| w.failure_policy).as_deref(), Some("Fail"));
}
