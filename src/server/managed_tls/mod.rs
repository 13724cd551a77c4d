//! The webhook's serving certificate, managed by Archer itself (`tls.mode: managed`, the chart's
//! default), as Karpenter and Kyverno manage theirs: nothing in the chart is generated at render
//! time, so `helm template` and Argo CD render the same objects every time.
//!
//! Every replica, every `tlsReloadIntervalSeconds`: reads the Secret, decides with [`plan::plan`] whether to keep
//! it or write a new one, writes (create when absent, replace at the resourceVersion read), then
//! makes the MutatingWebhookConfiguration's `caBundle` the Secret's bundle, and only then serves
//! the Secret's certificate. Replicas race only through the API server: a create that finds the
//! Secret made, or a replace that finds it changed, reads it again and follows the winner.
//! Because the bundle is published before a certificate it signs is served, and a rolled-over CA
//! stays in the bundle until it expires, the API server trusts every replica throughout.

pub mod plan;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::ByteString;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

use archer_metrics::label;
use super::metrics::ServerMetrics;
use super::tls::CertStore;
use plan::{Lifetimes, Material, Plan};

/// How soon a failed round is tried again.
const RETRY: Duration = Duration::from_secs(5);
/// Until when the CAs after the signing one stay in the bundle (Unix seconds).
const OLDER_UNTIL: &str = "archer.dev/older-cas-until";
/// Label on the Secret Archer writes.
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "archer");

#[derive(Debug, thiserror::Error)]
pub enum ManagedTlsError {
    #[error("Secret {namespace}/{name}: {source}")]
    Secret { namespace: String, name: String, source: kube::Error },
    #[error("MutatingWebhookConfiguration {name}: {source}")]
    Webhook { name: String, source: kube::Error },
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    #[error("the Secret's certificate cannot be served: {0}")]
    Serve(#[from] super::tls::TlsError),
    #[error("Secret {0} kept changing under this replica: trying again")]
    Contended(String),
    #[error("MutatingWebhookConfiguration {0} is not there (yet): the certificate is served once its CA can be published")]
    NoWebhook(String),
}

/// Where the certificate is kept and for which names.
pub struct ManagedTls {
    secrets: Api<Secret>,
    webhooks: Api<MutatingWebhookConfiguration>,
    namespace: String,
    secret: String,
    webhook: String,
    names: Vec<String>,
    life: Lifetimes,
    /// How often the Secret is read again (a rotation by another replica is followed within it).
    every: Duration,
    store: Arc<CertStore>,
    metrics: Arc<ServerMetrics>,
}

impl ManagedTls {
    /// The certificate for Service `service` in `namespace`, kept in Secret `secret` there, its
    /// CA published in MutatingWebhookConfiguration `webhook`, served by `store`, read again
    /// `every` so often.
    #[allow(clippy::too_many_arguments)]
    pub fn new(client: Client, namespace: &str, secret: &str, webhook: &str, service: &str, life: Lifetimes, every: Duration, store: Arc<CertStore>, metrics: Arc<ServerMetrics>) -> Self {
        let names = vec![format!("{service}.{namespace}.svc"), format!("{service}.{namespace}.svc.cluster.local")];
        ManagedTls {
            secrets: Api::namespaced(client.clone(), namespace),
            webhooks: Api::all(client),
            namespace: namespace.to_string(),
            secret: secret.to_string(),
            webhook: webhook.to_string(),
            names,
            life,
            every,
            store,
            metrics,
        }
    }

    /// Keep the certificate current for the life of the process; `ready` turns true once the
    /// managed certificate is served.
    pub async fn run(self, ready: tokio::sync::watch::Sender<bool>) {
        loop {
            let wait = match self.round().await {
                Ok(()) => {
                    ready.send_replace(true);
                    self.every
                }
                Err(e) => {
                    self.metrics.cert_reloads.get_or_create(&label("result", "error")).inc();
                    tracing::warn!(error = %e, secret = %self.secret, namespace = %self.namespace, "managing the webhook certificate");
                    RETRY.min(self.every)
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Read, decide, write if needed, publish the bundle, serve.
    #[tracing::instrument(skip_all, fields(namespace = %self.namespace, secret = %self.secret))]
    pub async fn round(&self) -> Result<(), ManagedTlsError> {
        let config = self.webhooks.get_opt(&self.webhook).await.map_err(|source| ManagedTlsError::Webhook { name: self.webhook.clone(), source })?;
        // Not ready without it: a certificate served before its CA is published is refused.
        let Some(config) = config else { return Err(ManagedTlsError::NoWebhook(self.webhook.clone())) };
        let published = published_bundle(&config);
        // The Secret goes with the webhook's configuration: deleting it (the chart's uninstall
        // hook does) lets the garbage collector delete the Secret.
        let owner = owner_of(&config);
        for _ in 0..3 {
            let found = self.secrets.get_opt(&self.secret).await.map_err(|e| self.secret_error(e))?;
            // A Secret that lacks a key is unusable (made anew), not absent.
            let current = found.as_ref().map(|s| material_of(s).unwrap_or_else(Material::unusable));
            let (material, reason) = match plan::plan(current.as_ref(), &published, &self.names, self.life, time::OffsetDateTime::now_utc())? {
                Plan::Keep => match (current, &found) {
                    (Some(m), Some(s)) if owner.as_ref().is_none_or(|o| owned_by(s, o)) => return self.publish(&config, &m).await,
                    (Some(m), _) => (m, None),
                    (None, _) => continue,
                },
                Plan::Write(m, reason) => (m, Some(reason)),
            };
            match self.write(found, &material, owner.clone()).await {
                Ok(()) => {
                    if let Some(reason) = reason {
                        self.metrics.cert_writes.get_or_create(&label("reason", reason.as_str())).inc();
                        tracing::info!(reason = reason.as_str(), "wrote the webhook certificate");
                    }
                    return self.publish(&config, &material).await;
                }
                // Another replica wrote first: read what it wrote.
                Err(kube::Error::Api(e)) if e.code == 409 => tracing::debug!("the Secret changed under this replica; reading it again"),
                Err(e) => return Err(self.secret_error(e)),
            }
        }
        Err(ManagedTlsError::Contended(self.secret.clone()))
    }

    fn secret_error(&self, source: kube::Error) -> ManagedTlsError {
        ManagedTlsError::Secret { namespace: self.namespace.clone(), name: self.secret.clone(), source }
    }

    /// Create the Secret, or replace the one read (at its resourceVersion: a 409 when another
    /// replica changed it since).
    async fn write(&self, found: Option<Secret>, m: &Material, owner: Option<OwnerReference>) -> Result<(), kube::Error> {
        let data = BTreeMap::from([
            (plan::CA_BUNDLE.to_string(), ByteString(m.ca_bundle.clone().into_bytes())),
            (plan::CA_KEY.to_string(), ByteString(m.ca_key.clone().into_bytes())),
            (plan::CERT.to_string(), ByteString(m.cert.clone().into_bytes())),
            (plan::KEY.to_string(), ByteString(m.key.clone().into_bytes())),
        ]);
        let until = m.older_until.map(|t| t.to_string());
        match found {
            Some(mut s) => {
                s.data = Some(data);
                let annotations = s.metadata.annotations.get_or_insert_with(Default::default);
                match &until {
                    Some(t) => annotations.insert(OLDER_UNTIL.into(), t.clone()),
                    None => annotations.remove(OLDER_UNTIL),
                };
                s.string_data = None;
                s.metadata.managed_fields = None;
                s.metadata.labels.get_or_insert_with(Default::default).insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
                if let Some(o) = owner {
                    let refs = s.metadata.owner_references.get_or_insert_with(Vec::new);
                    refs.retain(|r| r.kind != o.kind || r.api_version != o.api_version);
                    refs.push(o);
                }
                self.secrets.replace(&self.secret, &PostParams::default(), &s).await.map(drop)
            }
            None => {
                let s = Secret {
                    metadata: kube::api::ObjectMeta {
                        name: Some(self.secret.clone()),
                        namespace: Some(self.namespace.clone()),
                        labels: Some(BTreeMap::from([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())])),
                        owner_references: owner.map(|o| vec![o]),
                        annotations: until.map(|t| BTreeMap::from([(OLDER_UNTIL.to_string(), t)])),
                        ..Default::default()
                    },
                    type_: Some("kubernetes.io/tls".into()),
                    data: Some(data),
                    ..Default::default()
                };
                self.secrets.create(&PostParams::default(), &s).await.map(drop)
            }
        }
    }

    /// Make every webhook of the configuration trust the bundle, then serve the certificate.
    async fn publish(&self, config: &MutatingWebhookConfiguration, m: &Material) -> Result<(), ManagedTlsError> {
        self.publish_bundle(config, m.ca_bundle.as_bytes()).await?;
        if self.store.install(m.cert.as_bytes(), m.key.as_bytes(), &format!("Secret {}/{}", self.namespace, self.secret))? {
            self.metrics.cert_reloads.get_or_create(&label("result", "ok")).inc();
            tracing::info!("serving the managed webhook certificate");
        }
        if let Some(at) = self.store.expires_at() {
            self.metrics.cert_expiration.set(at);
        }
        Ok(())
    }

    /// Patch the `caBundle` of each webhook that does not carry `bundle` yet (by name: a
    /// strategic merge on the webhooks list).
    async fn publish_bundle(&self, config: &MutatingWebhookConfiguration, bundle: &[u8]) -> Result<(), ManagedTlsError> {
        let err = |source| ManagedTlsError::Webhook { name: self.webhook.clone(), source };
        let stale: Vec<String> = config.webhooks.clone().unwrap_or_default().into_iter().filter(|w| w.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()) != Some(bundle)).map(|w| w.name).collect();
        if stale.is_empty() {
            return Ok(());
        }
        use base64::Engine;
        let encoded = base64::engine::general_purpose::STANDARD.encode(bundle);
        // At the version read: a replica with an older view gets a conflict, not the last word.
        let patch = serde_json::json!({"metadata": {"resourceVersion": config.metadata.resource_version}, "webhooks": stale.iter().map(|name| serde_json::json!({"name": name, "clientConfig": {"caBundle": encoded}})).collect::<Vec<_>>()});
        self.webhooks.patch(&self.webhook, &PatchParams::default(), &Patch::Strategic(patch)).await.map_err(err)?;
        tracing::info!(webhook = %self.webhook, webhooks = ?stale, "published the CA bundle");
        Ok(())
    }
}

/// A reference to the webhook's configuration, as the Secret's owner.
fn owner_of(config: &MutatingWebhookConfiguration) -> Option<OwnerReference> {
    Some(OwnerReference { api_version: "admissionregistration.k8s.io/v1".into(), kind: "MutatingWebhookConfiguration".into(), name: config.metadata.name.clone()?, uid: config.metadata.uid.clone()?, ..Default::default() })
}

fn owned_by(s: &Secret, owner: &OwnerReference) -> bool {
    s.metadata.owner_references.as_ref().is_some_and(|refs| refs.iter().any(|r| r.uid == owner.uid))
}

/// The CA bundle the configuration's first webhook trusts now (empty when none).
fn published_bundle(config: &MutatingWebhookConfiguration) -> Vec<u8> {
    config.webhooks.as_ref().and_then(|w| w.first()?.client_config.ca_bundle.as_ref().map(|b| b.0.clone())).unwrap_or_default()
}

/// The Secret's four PEM texts; None when one is missing or not UTF-8 (the plan makes it anew).
fn material_of(s: &Secret) -> Option<Material> {
    let data = s.data.as_ref()?;
    let text = |k: &str| data.get(k).and_then(|v| String::from_utf8(v.0.clone()).ok());
    let older_until = s.metadata.annotations.as_ref().and_then(|a| a.get(OLDER_UNTIL)).and_then(|t| t.parse().ok());
    Some(Material { ca_bundle: text(plan::CA_BUNDLE)?, ca_key: text(plan::CA_KEY)?, cert: text(plan::CERT)?, key: text(plan::KEY)?, older_until })
}
