//! Private registries on the real control plane (issue #43): a pod whose image is in the cloud's
//! private registry, with no pull secret, is decided through the API server's admission as a
//! public one would be; and a registry reachable only through a mirror. The registries' host
//! names (`*.dkr.ecr.*.amazonaws.com`, `*.azurecr.io`, `*.invalid`) resolve nowhere here: only
//! Archer's `hosts.toml` tree reaches them. Run inside the AWS and Azure scenarios, whose
//! clusters already run moto and the local Entra.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use serde_json::json;

use crate::cluster::Cluster;

/// One registry's `hosts.toml` in the cluster's hosts tree.
pub struct HostsFile {
    pub registry: String,
    pub text: String,
}

/// Restart the cluster's Archer with a `hosts.toml` tree of `files`, plain-HTTP `insecure` hosts
/// and more lines of its `registry:` section.
pub async fn restart_with_hosts(c: &mut Cluster, files: &[HostsFile], insecure: &[String], lines: &[String]) {
    let dir = c.dir.path().join("certs.d");
    for f in files {
        std::fs::create_dir_all(dir.join(&f.registry)).expect("hosts dir");
        std::fs::write(dir.join(&f.registry).join("hosts.toml"), &f.text).expect("hosts.toml");
    }
    c.stop_archer();
    c.insecure.extend(insecure.iter().cloned());
    c.registry_config = std::iter::once(format!("hostsDir: {}", dir.display())).chain(lines.iter().cloned()).collect();
    c.start_archer().await;
}

/// Create a pod of `image` with no pull secret in `ns` through the API server, and return it as
/// admitted (then delete it): its `archer.dev/platforms`, and the architectures its required
/// node affinity allows.
pub async fn admitted(c: &Cluster, ns: &str, name: &str, image: &str) -> (Option<String>, Vec<String>, Option<String>) {
    let client = c.client().await;
    let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": {"containers": [{"name": "app", "image": image}]}})).expect("pod");
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let p = pods.create(&PostParams::default(), &pod).await.expect("create pod");
    let _ = pods.delete(name, &DeleteParams::default()).await;
    let annotation = |k: &str| p.metadata.annotations.as_ref().and_then(|a| a.get(k)).cloned();
    let arch: Vec<String> = p
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|r| r.node_selector_terms.iter().flat_map(|t| t.match_expressions.iter().flatten()).filter(|e| e.key == "kubernetes.io/arch").flat_map(|e| e.values.clone().unwrap_or_default()).collect())
        .unwrap_or_default();
    (annotation("archer.dev/platforms"), arch, annotation("archer.dev/inspection-error"))
}
