//! What every executor of the provisioner shares: the clients, the cloud provider, the image
//! inspector, the metrics and the Event recorder, the settings, the watch caches,
//! and the pods the last batch is waiting for. It reads the cluster ([`Context::state`]) and posts
//! Events; it decides nothing. Each executor is a loop over `&Context` whose pass returns what to
//! do next ([`Action`]) or an error whose variant names its metric label ([`ReconcileError`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{EventType, Recorder};
use kube::{Client, Resource};

use archer_api::nodeclaim::NodeClaim;
use archer_api::nodepool::NodePool;
use archer_cloud::{CloudError, CloudProvider};
use archer_metrics::labels2;
use super::metrics::ProvisionerMetrics;
use archer_model::objects as state;
use archer_model::ClusterState;
use archer_registry::{Inspector, Keyring};

use crate::cluster::stores::Stores;
use crate::cluster::picture::Picture;
use crate::config::ProvisionerConfig;

pub struct Context {
    pub client: Client,
    pub provider: Arc<dyn CloudProvider>,
    pub inspector: Inspector,
    /// Where the state is built from, and the plans recorded.
    pub picture: Picture,
    pub base_keyring: Keyring,
    pub metrics: Arc<ProvisionerMetrics>,
    pub settings: ProvisionerConfig,
    pub recorder: Recorder,
    pub stores: Stores,
    /// Pending pods the last batch could place (on existing room or new nodes): consolidation
    /// and the savings wait for them to land.
    pub waiting: Mutex<Vec<String>>,
}

/// What an executor's pass asks for: when to run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    pub requeue_after: Duration,
}

impl Action {
    pub fn requeue(after: Duration) -> Self {
        Action { requeue_after: after }
    }
}

/// Why an executor's pass stopped short. The variant's name is the `error` label of
/// `archer_provisioner_reconcile_errors_total`.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("cloud provider: {0}")]
    Cloud(#[from] CloudError),
    #[error("API server: {0}")]
    Api(#[from] kube::Error),
}

impl ReconcileError {
    pub fn label(&self) -> &'static str {
        match self {
            ReconcileError::Cloud(_) => "Cloud",
            ReconcileError::Api(_) => "Api",
        }
    }
}

/// Run an executor's passes until the future is dropped: each pass says when the next one runs;
/// a failed pass is counted by executor and error, logged, and retried after `retry`.
pub async fn run_loop<F, Fut>(executor: &'static str, metrics: &ProvisionerMetrics, retry: Duration, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Action, ReconcileError>>,
{
    loop {
        let wait = match pass().await {
            Ok(a) => a.requeue_after,
            Err(e) => {
                metrics.reconcile_errors.get_or_create(&labels2("executor", executor, "error", e.label())).inc();
                tracing::warn!(executor, error = %e, "pass failed; retrying");
                retry
            }
        };
        tokio::time::sleep(wait).await;
    }
}

impl Context {
    /// The cluster at this moment ([`Picture::state_of`], from this provisioner's caches).
    pub fn state(&self) -> ClusterState {
        self.picture.state_of(&self.stores, self.provider.as_ref())
    }

    /// Inspect the images of `pods` (each with its namespace's credentials, concurrently) and
    /// record their platforms in `state`, where the decisions read them
    /// ([`ClusterState::pod_platforms`]). A pod the webhook recorded, or whose images the state
    /// already knows, needs no lookup unless the safety record names one of its images (the
    /// digest decides what the record takes away); one whose images cannot be read stays
    /// unknown (assumed to run anywhere).
    pub async fn learn_platforms<P: std::borrow::Borrow<Pod> + Sync>(&self, state: &mut ClusterState, pods: &[P]) {
        crate::cost::learn_platforms(state, pods, &self.inspector, self.picture.view(), &self.base_keyring).await;
    }

    /// Pods the last batch placed that are still pending in `state`: they wait for capacity
    /// Archer is providing.
    pub fn waiting_now(&self, state: &ClusterState) -> Vec<String> {
        let provisionable: std::collections::HashSet<String> = state.pods.iter().filter(|p| state::is_provisionable(p, &self.settings.scheduler_names)).map(|p| state::pod_id(p)).collect();
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|id| provisionable.contains(*id)).cloned().collect()
    }

    /// Why the pool must not be consolidated now: pods wait for capacity Archer is providing, or
    /// claims are still launching.
    pub fn hold(&self, state: &ClusterState, pool: &str) -> Option<String> {
        state.consolidation_hold(pool, &self.waiting_now(state))
    }

    /// Post an Event about `object` (logged when it cannot be posted).
    pub async fn post_event(&self, object: &k8s_openapi::api::core::v1::ObjectReference, type_: EventType, reason: &str, action: &str, note: &str) {
        crate::cluster::events::post(&self.recorder, object, type_, reason, action, note).await;
    }

    /// Post an Event about a NodePool.
    pub async fn post_pool_event(&self, pool: &str, type_: EventType, reason: &str, action: &str, note: &str) {
        let np = NodePool::new(pool, Default::default());
        self.post_event(&np.object_ref(&()), type_, reason, action, note).await;
    }

    /// One Event per pool for a batch of claims written: how many nodes of which shapes, and why.
    pub async fn post_launch_events(&self, claims: &[NodeClaim], reason: &str) {
        let mut by_pool: std::collections::BTreeMap<&str, std::collections::BTreeMap<String, usize>> = Default::default();
        for c in claims {
            *by_pool.entry(c.spec.node_pool.as_str()).or_default().entry(format!("{} ({}, {})", c.spec.instance_type, c.spec.capacity_type, c.spec.zone)).or_default() += 1;
        }
        for (pool, shapes) in by_pool {
            let total: usize = shapes.values().sum();
            let list: Vec<String> = shapes.iter().map(|(s, n)| format!("{n} x {s}")).collect();
            self.post_pool_event(pool, EventType::Normal, "Launching", "Launching", &format!("{total} node(s) for {reason}: {}", list.join(", "))).await;
        }
    }
}
