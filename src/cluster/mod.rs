//! What Archer reads from the cluster: a watch-backed Namespace and Node cache (no API call per
//! admission), node registrations seen on it, the safety record, and image pull secrets from the
//! pod's own namespace ([`ClusterView`]); the provisioner's watch caches ([`stores`]); the
//! placements its plans made ([`plans`]); and the one place the [`ClusterState`] every decision
//! reads is built from them ([`picture`]).
//!
//! [`ClusterState`]: archer_model::ClusterState

pub mod events;
pub mod leader;
pub mod picture;
pub mod plans;
pub mod registrations;
pub mod safety_record;
pub mod stores;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, ServiceAccount};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use moka::future::Cache;

use archer_core::placement::{pod_images, recorded_platforms};
use archer_core::platform::PlatformSet;
use archer_core::policy::{Policy, PolicyDefaults, PolicyWarning};
use archer_registry::{Inspector, Keyring};

const SECRET_TTL: Duration = Duration::from_secs(60);

/// A watch-backed cache of every object of kind `K`, and the future that keeps it current.
pub(crate) fn reflect<K>(client: &Client, what: &'static str) -> (Store<K>, impl std::future::Future<Output = ()> + Send + 'static)
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    reflect_with(Api::all(client.clone()), watcher::Config::default(), what, |_: &K| {})
}

/// Like [`reflect`] over `api` and `config`, calling `on_applied` for every object added or changed.
pub fn reflect_with<K>(api: Api<K>, config: watcher::Config, what: &'static str, on_applied: impl Fn(&K) + Send + Sync + 'static) -> (Store<K>, impl std::future::Future<Output = ()> + Send + 'static)
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    (store, reflect_writer(api, config, what, writer, on_applied))
}

/// [`reflect_with`] into a writer made beforehand (its store handed out earlier).
fn reflect_writer<K>(api: Api<K>, config: watcher::Config, what: &'static str, writer: reflector::store::Writer<K>, on_applied: impl Fn(&K) + Send + Sync + 'static) -> impl std::future::Future<Output = ()> + Send + 'static
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let on_applied = Arc::new(on_applied);
    let stream = watcher(api, config.any_semantic())
        .default_backoff()
        // Nothing here reads managedFields, often the largest part of an object: the caches
        // hold every Pod and Node of the cluster, so they are not kept.
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .reflect(writer)
        .applied_objects()
        .for_each(move |ev| {
            let on_applied = on_applied.clone();
            async move {
                match ev {
                    Ok(obj) => on_applied(&obj),
                    Err(e) => tracing::warn!(error = %e, kind = what, "watch error; retrying"),
                }
            }
        });
    stream
}

/// The NodeOverlay watch into `writer` (its store was handed out before the CRD was found).
pub(super) fn reflect_into(api: Api<archer_api::nodeoverlay::NodeOverlay>, writer: reflector::store::Writer<archer_api::nodeoverlay::NodeOverlay>) -> impl std::future::Future<Output = ()> + Send + 'static {
    reflect_writer(api, watcher::Config::default(), "nodeoverlay", writer, |_| {})
}

/// Every page of a list, 500 objects at a time (as kubectl pages), one page an item.
pub fn pages<K>(api: Api<K>) -> impl futures::Stream<Item = Result<Vec<K>, kube::Error>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let first = Some(kube::api::ListParams::default().limit(500));
    futures::stream::unfold(first, move |params| {
        let api = api.clone();
        async move {
            let params = params?;
            match api.list(&params).await {
                Ok(page) => {
                    let next = page.metadata.continue_.filter(|c| !c.is_empty()).map(|c| params.continue_token(&c));
                    Some((Ok(page.items), next))
                }
                Err(e) => Some((Err(e), None)),
            }
        }
    })
}

/// The credentials for a pod's images: its namespace's pull secrets (pod's and service account's)
/// first, then (as the fallback, which Archer's cloud identity comes before) the mounted docker
/// config. Standalone: the mounted config only.
pub async fn pod_keyring(cluster: Option<&ClusterView>, base: &Keyring, namespace: &str, pod: &Pod) -> Keyring {
    match cluster {
        Some(c) => c.pull_keyring(namespace, pod).await.with_fallback(base.clone()),
        None => Keyring::default().with_fallback(base.clone()),
    }
}

/// A namespace's placement policy: `defaults` under its `archer.dev/*` annotations (none without
/// a cluster), with a warning per bad value. The one place the webhook, the extender and the
/// safety net resolve it.
pub fn namespace_policy(cluster: Option<&ClusterView>, defaults: &PolicyDefaults, namespace: &str) -> (Policy, Vec<PolicyWarning>) {
    let annotations = cluster.and_then(|c| c.namespace_annotations(namespace)).unwrap_or_default();
    archer_core::policy::resolve(defaults, &annotations)
}

/// Now, in whole seconds since the Unix epoch (the safety record's and creationTimestamp's unit).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Milliseconds on this process's monotonic clock (from its first reading): what plans and
/// registrations are timed by, so a step of the wall clock neither ages nor freshens them.
pub fn monotonic_ms() -> i64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    i64::try_from(START.get_or_init(std::time::Instant::now).elapsed().as_millis()).unwrap_or(i64::MAX)
}

/// Now, in milliseconds since the Unix epoch (the unit of [`archer_model::ClusterState::now_ms`]).
pub fn unix_now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Where a pod's pull credentials come from: its service account (`default` when unnamed) and
/// its own `imagePullSecrets`, in order.
pub fn pull_secret_refs(pod: &Pod) -> (String, Vec<String>) {
    let spec = pod.spec.as_ref();
    let secrets = spec.and_then(|s| s.image_pull_secrets.as_ref()).map(|l| l.iter().map(|r| r.name.clone()).collect()).unwrap_or_default();
    let account = spec.and_then(|s| s.service_account_name.clone()).unwrap_or_else(|| "default".into());
    (account, secrets)
}

/// The platforms a pod's images run on, and per image when they were inspected here.
pub enum PodPlatforms {
    /// `per_image`: each inspected image's platforms less the ones broken for this pod's
    /// namespace; `inspected`: each inspected image's digest and platforms as the registry gave
    /// them (what another namespace's pods of the same image may read).
    Known { all: PlatformSet, per_image: Vec<(String, PlatformSet)>, inspected: Vec<(String, String, PlatformSet)> },
    Unknown(String),
}

/// A pod's platforms: its `archer.dev/platforms` annotation (the webhook's record), else its
/// images inspected with its namespace's credentials within `timeout`; either way less the
/// architectures the safety net found its images' digests broken on. Used by the extender and
/// the provisioner alike.
pub async fn pod_platforms(inspector: &Inspector, cluster: Option<&ClusterView>, base: &Keyring, pod: &Pod, timeout: Duration) -> PodPlatforms {
    let record = cluster.map(|c| c.safety.get()).unwrap_or_default();
    let images = pod_images(pod);
    let recorded = recorded_platforms(pod);
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let now = unix_now();
    // A recorded pod is inspected only when the record names one of its images (for the digest).
    if let Some(all) = &recorded {
        if !images.iter().any(|i| record.mentions_image(i, namespace, now)) {
            return PodPlatforms::Known { all: all.clone(), per_image: Vec::new(), inspected: Vec::new() };
        }
    }
    if images.is_empty() {
        return PodPlatforms::Unknown("the pod names no images".into());
    }
    let keyring = pod_keyring(cluster, base, namespace, pod).await;
    let results = inspector.inspect_all(&images, &keyring, tokio::time::Instant::now() + timeout).await;
    let mut per_image = Vec::new();
    let mut inspected = Vec::new();
    for (image, r) in images.into_iter().zip(results) {
        match r {
            Ok(found) => {
                per_image.push((image.clone(), record.exclude(&found.digest, namespace, now, &found.platforms).0));
                inspected.push((image, found.digest.clone(), found.platforms.clone()));
            }
            Err(_) if recorded.is_some() => {}
            Err(e) => return PodPlatforms::Unknown(format!("image {image}: {e}")),
        }
    }
    if let Some(all) = recorded {
        let digests = inspected.iter().map(|(_, digest, _)| digest.clone());
        return PodPlatforms::Known { all: record.exclude_all(digests, namespace, now, &all), per_image: Vec::new(), inspected };
    }
    let all = PlatformSet::intersect_all(per_image.iter().map(|(_, p)| p)).unwrap_or_default();
    PodPlatforms::Known { all, per_image, inspected }
}

/// The watch caches every mode reads (Namespaces, Nodes, the registrations seen on Nodes, the
/// safety record) and image pull secrets, read from the pod's own namespace only.
#[derive(Clone)]
pub struct ClusterView {
    client: Client,
    namespaces: Store<Namespace>,
    nodes: Store<Node>,
    secrets: Cache<(String, String), Option<Arc<Keyring>>>,
    service_accounts: Cache<(String, String), Vec<String>>,
    /// When nodes the Node cache saw registering became free of registering taints.
    registrations: registrations::Registrations,
    /// The safety net's record of image digests broken on an architecture.
    safety: Arc<safety_record::SharedRecord>,
}

impl ClusterView {
    /// Start the Namespace and Node watches; the returned future drives them and must be polled
    /// for the life of the process (they retry with back-off when the API server goes away).
    /// `safety` names the safety net's ConfigMap (namespace, name), when it runs.
    pub fn start(client: Client, safety: Option<(&str, &str)>) -> (Self, impl std::future::Future<Output = ()> + Send + 'static) {
        let (safety, safety_stream): (_, std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) = match safety {
            Some((namespace, name)) => {
                let (record, stream) = safety_record::SharedRecord::watched(&client, namespace, name);
                (record, Box::pin(stream))
            }
            None => (safety_record::SharedRecord::standalone(), Box::pin(futures::future::ready(()))),
        };
        let (namespaces, ns_stream) = reflect::<Namespace>(&client, "namespace");
        let registrations = registrations::Registrations::default();
        let seen = registrations.clone();
        let (nodes, node_stream) = reflect_with(Api::all(client.clone()), watcher::Config::default(), "node", move |n: &Node| seen.observe(n, monotonic_ms()));
        let view = Self {
            client,
            namespaces,
            nodes,
            secrets: Cache::builder().max_capacity(10_000).time_to_live(SECRET_TTL).build(),
            service_accounts: Cache::builder().max_capacity(10_000).time_to_live(SECRET_TTL).build(),
            registrations,
            safety,
        };
        (view, async move {
            futures::future::join3(ns_stream, node_stream, safety_stream).await;
        })
    }

    /// When nodes seen registering were seen free of registering taints.
    pub fn registrations(&self) -> &registrations::Registrations {
        &self.registrations
    }

    /// The safety net's record as this replica sees it.
    pub fn safety_record(&self) -> &Arc<safety_record::SharedRecord> {
        &self.safety
    }

    /// The `kubernetes.io/arch` label of a cached node.
    pub fn node_arch(&self, name: &str) -> Option<String> {
        let node = self.nodes.get(&ObjectRef::new(name))?;
        node.metadata.labels.as_ref()?.get(archer_core::placement::ARCH_LABEL).cloned()
    }

    /// The watch-backed Node cache.
    pub fn nodes(&self) -> Store<Node> {
        self.nodes.clone()
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Wait until the Namespace and Node caches have their first full lists.
    pub async fn wait_ready(&self) {
        let _ = self.namespaces.wait_until_ready().await;
        let _ = self.nodes.wait_until_ready().await;
    }

    /// The caches still waiting for their first full list (what keeps Archer not ready).
    pub fn unsynced(&self) -> Vec<&'static str> {
        use futures::FutureExt;
        let mut waiting = Vec::new();
        if self.namespaces.wait_until_ready().now_or_never().is_none() {
            waiting.push("namespaces");
        }
        if self.nodes.wait_until_ready().now_or_never().is_none() {
            waiting.push("nodes");
        }
        waiting
    }

    /// Every Namespace in the cache (their labels answer `namespaceSelector`s).
    pub fn namespaces(&self) -> Vec<Arc<Namespace>> {
        self.namespaces.state()
    }

    fn namespace_annotations(&self, name: &str) -> Option<BTreeMap<String, String>> {
        let ns = self.namespaces.get(&ObjectRef::new(name))?;
        Some(ns.metadata.annotations.clone().unwrap_or_default())
    }

    /// Credentials from the pod's `imagePullSecrets` and its service account's, read only from
    /// the pod's own namespace. Unreadable secrets are skipped with a log line (the kubelet
    /// does the same); the lookup then goes on anonymously.
    #[tracing::instrument(skip_all, fields(namespace = %namespace))]
    pub async fn pull_keyring(&self, namespace: &str, pod: &Pod) -> Keyring {
        let (sa, mut names) = pull_secret_refs(pod);
        names.extend(self.service_account_secrets(namespace, &sa).await);
        let mut ring = Keyring::default();
        for name in names.iter().filter(|n| !n.is_empty()) {
            if let Some(k) = self.secret_keyring(namespace, name).await {
                ring.extend((*k).clone());
            }
        }
        ring
    }

    async fn service_account_secrets(&self, namespace: &str, name: &str) -> Vec<String> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let key = (namespace.to_string(), name.to_string());
        self.service_accounts
            .get_with(key, async move {
                match api.get_opt(name).await {
                    Ok(Some(sa)) => sa.image_pull_secrets.unwrap_or_default().into_iter().map(|r| r.name).collect(),
                    Ok(None) => Vec::new(),
                    Err(e) => {
                        tracing::warn!(service_account = name, error = %e, "cannot read service account");
                        Vec::new()
                    }
                }
            })
            .await
    }

    async fn secret_keyring(&self, namespace: &str, name: &str) -> Option<Arc<Keyring>> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let key = (namespace.to_string(), name.to_string());
        self.secrets
            .get_with(key, async move {
                let secret = match api.get_opt(name).await {
                    Ok(Some(s)) => s,
                    Ok(None) => {
                        tracing::warn!(secret = name, "image pull secret not found");
                        return None;
                    }
                    Err(e) => {
                        tracing::warn!(secret = name, error = %e, "cannot read image pull secret");
                        return None;
                    }
                };
                let data = secret.data.unwrap_or_default();
                let bytes = data.get(".dockerconfigjson").or_else(|| data.get(".dockercfg"))?;
                match Keyring::parse(&bytes.0) {
                    Ok(k) => Some(Arc::new(k)),
                    Err(e) => {
                        tracing::warn!(secret = name, error = %e, "image pull secret is not a docker config");
                        None
                    }
                }
            })
            .await
    }
}
