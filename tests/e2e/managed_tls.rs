//! The managed webhook certificate (`tls.mode: managed`, `archer serve --tls-secret`) on the real
//! API server (`tests/e2e/run managed_tls_`): two replicas started together write one Secret
//! between them (the API server arbitrates), publish its CA in the webhook configuration, and
//! serve the same certificate; the Secret goes with the configuration (its owner); a deleted
//! Secret is written again and the new CA published. The chart's own install (installed.rs) runs
//! this mode with its RBAC and the API server calling through the Service.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use serde_json::json;

use super::wait;
use crate::cluster::{metric_at, spawn, Cluster, Mode};

const NS: &str = "archer-system";
const SERVICE: &str = "archer";
const HOST: &str = "archer.archer-system.svc";

/// A client that trusts only `bundle` and reaches the Service's name at 127.0.0.1:`port`.
fn client_trusting(bundle: &[u8], port: u16) -> reqwest::Client {
    let mut b = reqwest::Client::builder().tls_built_in_root_certs(false).resolve(HOST, std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    for pem in pem_certs(bundle) {
        b = b.add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).expect("a CA"));
    }
    b.build().expect("client")
}

fn pem_certs(bundle: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bundle);
    text.split_inclusive("-----END CERTIFICATE-----").filter(|c| c.contains("BEGIN CERTIFICATE")).map(|c| c.trim().to_string()).collect()
}

async fn serves_under(bundle: &[u8], port: u16) -> bool {
    client_trusting(bundle, port).get(format!("https://{HOST}:{port}/healthz")).timeout(Duration::from_secs(3)).send().await.is_ok_and(|r| r.status().is_success())
}

async fn ca_bundle(api: &Api<MutatingWebhookConfiguration>) -> Option<Vec<u8>> {
    let config = api.get("archer").await.ok()?;
    config.webhooks?.first()?.client_config.ca_bundle.clone().map(|b| b.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run managed_tls_"]
async fn managed_tls_two_replicas_write_one_secret_publish_its_ca_and_follow_a_new_one() {
    let c = Cluster::start_mode("managed-tls", &[], Mode::Karpenter, Vec::new()).await;
    let client = c.client().await;
    crate::ensure_namespace(&client, NS).await;
    // The webhook's configuration, without a caBundle (the chart renders none in this mode).
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let config: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "archer"},
        "webhooks": [{
            "name": "pods.archer.dev", "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Ignore",
            "clientConfig": {"service": {"name": SERVICE, "namespace": NS, "path": "/mutate", "port": 443}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {"archer.dev/e2e-nothing": "true"}}
        }]
    }))
    .expect("config");
    let created = webhooks.create(&PostParams::default(), &config).await.expect("webhook configuration");
    let config_uid = created.metadata.uid.clone().expect("uid");

    // Two replicas, started at once, re-reading every second.
    let cfg = c.dir.path().join("managed-tls.yaml");
    std::fs::write(&cfg, "tlsReloadIntervalSeconds: 1\n").expect("config");
    let replica = |name: &'static str| {
        let (port, admin) = (crate::common::free_port(), crate::common::free_port());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_archer"));
        cmd.args(["serve", "--namespace", NS, "--tls-secret", "archer-tls", "--webhook-configuration", "archer", "--tls-service", SERVICE])
            .arg("--config")
            .arg(&cfg)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--admin-listen", &format!("127.0.0.1:{admin}")])
            .arg("--kubeconfig")
            .arg(&c.kubeconfig)
            .env("ARCHER_LOG", "info,archer=debug");
        (spawn(name, &c.logs, cmd), port, admin)
    };
    let (a, b) = (replica("archer-tls-a"), replica("archer-tls-b"));
    let ready = |admin: u16| async move { reqwest::get(format!("http://127.0.0.1:{admin}/readyz")).await.is_ok_and(|r| r.status().is_success()) };
    wait("both replicas ready", Duration::from_secs(60), || async { ready(a.2).await && ready(b.2).await }).await;

    // One Secret, written once between the two, owned by the configuration.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let secret = secrets.get("archer-tls").await.expect("the managed Secret");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(secret.metadata.labels.as_ref().and_then(|l| l.get("app.kubernetes.io/managed-by")).map(String::as_str), Some("archer"));
    let owners = secret.metadata.owner_references.clone().unwrap_or_default();
    assert!(owners.iter().any(|o| o.kind == "MutatingWebhookConfiguration" && o.uid == config_uid), "owned by the webhook configuration: {owners:?}");
    let writes = |admin: u16| async move { metric_at(admin, "archer_tls_certificate_writes_total{reason=\"absent\"}").await };
    assert_eq!(writes(a.2).await + writes(b.2).await, 1.0, "the API server let one replica create the Secret; the other read it");
    let data = secret.data.clone().expect("data");
    let bundle = data["ca.crt"].0.clone();
    wait("the CA published in the configuration", Duration::from_secs(10), || async { ca_bundle(&webhooks).await.as_deref() == Some(bundle.as_slice()) }).await;
    // Both serve a certificate the published CA vouches for, for the Service's name.
    assert!(serves_under(&bundle, a.1).await && serves_under(&bundle, b.1).await, "both replicas serve under the published CA");
    let expiry = metric_at(a.2, "archer_tls_certificate_expiration_timestamp_seconds").await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64();
    assert!(expiry > now + 300.0 * 86400.0, "a year's certificate: expires at {expiry}");

    // The Secret deleted: written again with a new CA, published, served by both.
    secrets.delete("archer-tls", &DeleteParams::default()).await.expect("delete");
    wait("a new Secret", Duration::from_secs(30), || async { secrets.get_opt("archer-tls").await.ok().flatten().and_then(|s| s.data).is_some_and(|d| d["ca.crt"].0 != bundle) }).await;
    let renewed = secrets.get("archer-tls").await.expect("secret").data.expect("data")["ca.crt"].0.clone();
    wait("the new CA published", Duration::from_secs(10), || async { ca_bundle(&webhooks).await.as_deref() == Some(renewed.as_slice()) }).await;
    // The new bundle is the new signing CA first, then the CA the webhook trusted until now (kept
    // an hour, so a replica still serving the old certificate stays trusted meanwhile): the wait
    // is on the signing CA alone, since the whole bundle vouches for the old certificate too.
    let renewed_certs = pem_certs(&renewed);
    let old_ca = pem_certs(&bundle);
    assert!(renewed_certs.len() >= 2 && renewed_certs[1..].iter().any(|c| old_ca.contains(c)), "the new bundle keeps trusting the old CA for a while: {} certificates", renewed_certs.len());
    let signing = renewed_certs[0].clone().into_bytes();
    assert!(!old_ca.contains(&renewed_certs[0]), "a new CA signs");
    wait("both replicas serving under the new signing CA", Duration::from_secs(10), || async { serves_under(&signing, a.1).await && serves_under(&signing, b.1).await }).await;
    assert!(!serves_under(&bundle, a.1).await, "the old CA no longer vouches for what is served");
    assert_eq!(writes(a.2).await + writes(b.2).await, 2.0, "one more write between the two");
    drop((a, b));

    // Deleting the configuration (the chart's uninstall hook does) takes the Secret with it.
    webhooks.delete("archer", &DeleteParams::default()).await.expect("delete configuration");
    wait("the Secret garbage-collected with its owner", Duration::from_secs(60), || async { secrets.get_opt("archer-tls").await.ok().flatten().is_none() }).await;
}
