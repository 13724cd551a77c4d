//! The safety net's record ([`SafetyRecord`]: image digests found broken on an architecture, and
//! the re-placements made) as every replica sees it: one ConfigMap in Archer's namespace,
//! watched by every replica (the webhook, the extender and the provisioner read it) and written
//! only by the replica holding the safety net's lease.
//!
//! Why a ConfigMap: it is shared between replicas and kept across restarts by the API server
//! itself (no volume, no other datastore to run), its size is bounded by the API (1 MiB; the
//! record is cut to [`MAX_RECORD_BYTES`] of JSON before every write, whatever its entries hold),
//! a watch delivers each change to every replica at once, and writes are safe with optimistic
//! concurrency (`resourceVersion`). RBAC narrows Archer to this one object.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::watcher;
use kube::Client;

use archer_core::safety_net::{SafetyRecord, MAX_RECORD_BYTES};

/// The ConfigMap key holding the record as JSON.
pub const DATA_KEY: &str = "record.json";
/// Conflicting writers (a replica that just lost the lease) are retried this often at most.
const WRITE_ATTEMPTS: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("no cluster: the record is not kept")]
    Standalone,
    #[error("the record's ConfigMap {name}: {source}")]
    Api { name: String, source: kube::Error },
    #[error("the record's ConfigMap {0} kept changing under {WRITE_ATTEMPTS} attempts")]
    Contended(String),
}

pub struct SharedRecord {
    current: ArcSwap<SafetyRecord>,
    revision: AtomicU64,
    api: Option<Api<ConfigMap>>,
    name: String,
}

impl SharedRecord {
    /// An empty record that is never written (no cluster).
    pub fn standalone() -> Arc<Self> {
        Arc::new(SharedRecord { current: Default::default(), revision: AtomicU64::new(0), api: None, name: String::new() })
    }

    /// The record in ConfigMap `namespace/name`, and the watch that keeps it current (to be
    /// polled for the life of the process).
    pub fn watched(client: &Client, namespace: &str, name: &str) -> (Arc<Self>, impl std::future::Future<Output = ()> + Send + 'static) {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let shared = Arc::new(SharedRecord { current: Default::default(), revision: AtomicU64::new(0), api: Some(api.clone()), name: name.to_string() });
        let seen = shared.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let (_store, stream) = super::reflect_with(api, config, "configmap", move |cm: &ConfigMap| seen.set(parse(cm)));
        (shared, stream)
    }

    /// The record now.
    pub fn get(&self) -> Arc<SafetyRecord> {
        self.current.load_full()
    }

    /// Changes whenever the record does (decisions remembered from before are stale then).
    pub fn revision(&self) -> u64 {
        self.revision.load(Ordering::Acquire)
    }

    fn set(&self, record: SafetyRecord) {
        if *self.current.load_full() != record {
            self.current.store(Arc::new(record));
            self.revision.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Read the stored record, change it with `change`, write it back; retried (with `change`
    /// run again on the fresh copy) when another writer got there first.
    pub async fn update<T>(&self, mut change: impl FnMut(&mut SafetyRecord) -> T) -> Result<T, RecordError> {
        let api = self.api.as_ref().ok_or(RecordError::Standalone)?;
        let failed = |source| RecordError::Api { name: self.name.clone(), source };
        for _ in 0..WRITE_ATTEMPTS {
            let stored = api.get_opt(&self.name).await.map_err(failed)?;
            let mut record = stored.as_ref().map(parse).unwrap_or_default();
            let out = change(&mut record);
            let dropped = record.fit(MAX_RECORD_BYTES);
            if dropped > 0 {
                tracing::warn!(configmap = %self.name, dropped, "the safety net's record reached its size bound; the largest namespace's oldest entries went");
            }
            let text = serde_json::to_string(&record).unwrap_or_else(|_| "{}".into());
            let written = match stored {
                Some(mut cm) => {
                    cm.data.get_or_insert_with(Default::default).insert(DATA_KEY.into(), text);
                    api.replace(&self.name, &archer_api::apply::post_params(), &cm).await
                }
                None => {
                    let mut cm = ConfigMap::default();
                    cm.metadata.name = Some(self.name.clone());
                    cm.metadata.labels = Some([("app.kubernetes.io/name".to_string(), "archer".to_string())].into());
                    cm.data = Some([(DATA_KEY.to_string(), text)].into());
                    api.create(&archer_api::apply::post_params(), &cm).await
                }
            };
            match written {
                Ok(cm) => {
                    self.set(parse(&cm));
                    return Ok(out);
                }
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(failed(e)),
            }
        }
        Err(RecordError::Contended(self.name.clone()))
    }
}

/// The record a ConfigMap holds; an unreadable one is logged and read as empty (the next write
/// replaces it).
fn parse(cm: &ConfigMap) -> SafetyRecord {
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(DATA_KEY)) else { return SafetyRecord::default() };
    serde_json::from_str(text).unwrap_or_else(|e| {
        tracing::warn!(configmap = cm.metadata.name.as_deref().unwrap_or(""), error = %e, "the safety net's record is unreadable; starting from an empty one");
        SafetyRecord::default()
    })
}
