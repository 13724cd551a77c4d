//! The cost and savings gauges while this Archer does not provision: beside Karpenter or AKS
//! node auto-provisioning, the recommended installation, where no provisioner of Archer's
//! reports them. One replica at a time (its own Lease, `savings.leaseName`) watches the pods
//! and DaemonSets, reads Karpenter's NodePools (`karpenter.sh/v1`) and the user's NodeOverlays,
//! and sets the same gauges the provisioner's cost reporter sets, by the same rules
//! ([`super`]): every node whose price is known counts, whoever launched it.
//!
//! Prices are the catalog's in the zones of the nodes and pools, with the NodeOverlays applied
//! (the user's discounts), unless a node's `archer.dev/price-per-hour` says otherwise. A pod's
//! platforms are its own annotation (the webhook's record), else its images inspected by Archer.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client};

use archer_api::nodeoverlay::NodeOverlay;
use archer_core::catalog::Catalog;
use archer_core::policy::PolicyDefaults;
use archer_model::ClusterState;

use crate::cluster::ClusterView;
use super::metrics::CostMetrics;

/// What the reporter reads and where it reports.
pub struct SavingsReporter {
    pub client: Client,
    pub view: ClusterView,
    pub catalog: Arc<Catalog>,
    pub defaults: Arc<PolicyDefaults>,
    pub policy: archer_core::sched::preferences::Policy,
    pub inspector: archer_registry::Inspector,
    pub keyring: archer_registry::Keyring,
    pub metrics: Arc<CostMetrics>,
    pub every: Duration,
}

/// The caches the reporter keeps while it leads.
struct Caches {
    pods: Store<Pod>,
    daemonsets: Store<DaemonSet>,
    overlays: Store<NodeOverlay>,
}

/// Karpenter's NodePool (`karpenter.sh/v1`), read as the model reads a cluster dump of it.
fn karpenter_pools() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool"), "nodepools")
}

impl SavingsReporter {
    /// Report until the task is dropped (leadership lost); the gauges are emptied then.
    pub async fn run(self: Arc<Self>) {
        let _clear = super::ClearOnDrop(self.metrics.clone());
        let (pods, p) = crate::cluster::reflect::<Pod>(&self.client, "pod");
        let (daemonsets, d) = crate::cluster::reflect::<DaemonSet>(&self.client, "daemonset");
        let (overlays, o) = crate::cluster::stores::watch_overlays(self.client.clone());
        let caches = Caches { pods, daemonsets, overlays };
        tokio::select! {
            _ = futures::future::join3(p, d, o) => tracing::error!("the savings reporter's watches ended"),
            _ = self.report_loop(&caches) => {}
        }
    }

    async fn report_loop(&self, caches: &Caches) {
        let _ = futures::future::join(caches.pods.wait_until_ready(), caches.daemonsets.wait_until_ready()).await;
        let mut last = None;
        let mut pools_missing_logged = false;
        loop {
            self.report(caches, &mut last, &mut pools_missing_logged).await;
            tokio::time::sleep(self.every).await;
        }
    }

    /// Karpenter's NodePools now; none when the API does not serve them (said once); `None`
    /// when they cannot be read (the savings then keep their last value).
    async fn pools(&self, missing_logged: &mut bool) -> Option<Vec<serde_json::Value>> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &karpenter_pools());
        match api.list(&ListParams::default()).await {
            Ok(list) => Some(list.items.into_iter().filter_map(|o| serde_json::to_value(o).ok()).collect()),
            Err(kube::Error::Api(e)) if e.code == 404 => {
                if !std::mem::replace(missing_logged, true) {
                    tracing::info!("NodePool (karpenter.sh/v1) is not served: node costs are reported, savings have no pool to plan the counterfactual on");
                }
                Some(Vec::new())
            }
            Err(e) => {
                tracing::warn!(error = %e, "listing Karpenter's NodePools; the savings keep their last value");
                None
            }
        }
    }

    #[tracing::instrument(skip_all, fields(nodes = tracing::field::Empty, pods = tracing::field::Empty))]
    async fn report(&self, caches: &Caches, last: &mut Option<u64>, missing_logged: &mut bool) {
        let Some(pools) = self.pools(missing_logged).await else { return };
        // A pool's spec changes the counterfactual: its name, uid and generation count.
        let pool_versions: Vec<String> = pools.iter().map(|p| format!("{}/{}/{}", p.pointer("/metadata/name").and_then(|v| v.as_str()).unwrap_or(""), p.pointer("/metadata/uid").and_then(|v| v.as_str()).unwrap_or(""), p.pointer("/metadata/generation").and_then(serde_json::Value::as_i64).unwrap_or(0))).collect();
        let mut cluster = state(&self.view, caches, pools, &self.catalog, &self.defaults);
        super::report_nodes(&self.metrics, &cluster);
        let pods = super::priced_pods(&cluster);
        tracing::Span::current().record("nodes", cluster.nodes.len()).record("pods", pods.len());
        let fingerprint = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            pool_versions.hash(&mut h);
            super::fingerprint(&pods, &cluster) ^ h.finish()
        };
        if *last == Some(fingerprint) {
            return;
        }
        *last = Some(fingerprint);
        super::learn_platforms(&mut cluster, &pods, &self.inspector, &self.view, &self.keyring).await;
        let c = tokio::task::block_in_place(|| super::comparison(&cluster, &pods, self.policy));
        super::report_savings(&self.metrics, &c);
    }
}

/// The state the savings are computed on: nodes and namespaces from the cluster view, pods,
/// DaemonSets and overlays from the reporter's caches, Karpenter's NodePools, and offerings the
/// catalog's in every zone a node or a pool is in, with the overlays applied.
fn state(view: &ClusterView, caches: &Caches, pools: Vec<serde_json::Value>, catalog: &Arc<Catalog>, defaults: &Arc<PolicyDefaults>) -> ClusterState {
    let mut state = ClusterState {
        nodes: view.nodes().state(),
        pods: caches.pods.state(),
        namespaces: view.namespaces(),
        daemonsets: caches.daemonsets.state(),
        overlays: caches.overlays.state(),
        policy_defaults: defaults.clone(),
        catalog: Some(catalog.clone()),
        now_ms: crate::cluster::unix_now_ms(),
        ..Default::default()
    };
    let mut unknown = Vec::new();
    for pool in pools {
        let name = pool.pointer("/metadata/name").and_then(|n| n.as_str()).unwrap_or_default().to_string();
        if let Err(e) = state.add(pool, &mut unknown) {
            tracing::warn!(pool = %name, error = %e, "a NodePool the savings cannot read is left out");
        }
    }
    let mut zones: Vec<String> = state.pools.iter().flat_map(|p| p.zones()).chain(state.nodes.iter().filter_map(|n| n.metadata.labels.as_ref()?.get(archer_core::labels::ZONE).cloned())).collect();
    zones.sort();
    zones.dedup();
    state.overlay_offerings(Arc::new(archer_api::nodepool::offerings(catalog, &zones)));
    state
}
