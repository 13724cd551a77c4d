//! The watch caches the provisioner reads (Pods, Nodes, NodeClaims, NodePools, DaemonSets, volume
//! claims and volumes), and the objects they hold at any moment. The provisioner owns them;
//! [`super::picture`] builds every state from them while this process provisions.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client};

use archer_api::nodeclaim::NodeClaim;
use archer_api::nodeoverlay::NodeOverlay;
use archer_api::nodepool::NodePool;
use archer_model::objects as state;
use archer_model::ClusterState;

use super::{reflect_into, reflect_with};

/// Watch-backed caches of what the worker reads.
#[derive(Clone)]
pub struct Stores {
    pub pods: Store<Pod>,
    pub nodes: Store<Node>,
    pub claims: Store<NodeClaim>,
    pub pools: Store<NodePool>,
    pub daemonsets: Store<DaemonSet>,
    pub claims_pv: Store<PersistentVolumeClaim>,
    pub volumes: Store<PersistentVolume>,
    /// Karpenter's NodeOverlays, once their CRD is served (empty until then).
    pub overlays: Store<NodeOverlay>,
}

impl Stores {
    /// Start the watches; `pending` is notified whenever a pod may need capacity.
    /// `nodes`: a Node cache the process keeps already (the cluster view's), shared rather than
    /// watched twice.
    pub fn start(client: &Client, pending: Arc<tokio::sync::Notify>, nodes: Option<Store<Node>>, eager: Vec<String>) -> (Stores, impl std::future::Future<Output = ()> + Send + 'static) {
        let (pods, p) = reflect_with(Api::<Pod>::all(client.clone()), watcher::Config::default(), "pod", move |pod: &Pod| {
            if state::is_provisionable(pod, &eager) {
                pending.notify_one();
            }
        });
        let (nodes, n) = match nodes {
            Some(shared) => (shared, futures::future::Either::Left(futures::future::pending::<()>())),
            None => {
                let (store, watch) = reflect_with(Api::<Node>::all(client.clone()), watcher::Config::default(), "node", |_: &Node| {});
                (store, futures::future::Either::Right(watch))
            }
        };
        let (claims, c) = reflect_with(Api::<NodeClaim>::all(client.clone()), watcher::Config::default(), "nodeclaim", |_: &NodeClaim| {});
        let (pools, np) = reflect_with(Api::<NodePool>::all(client.clone()), watcher::Config::default(), "nodepool", |_: &NodePool| {});
        let (daemonsets, d) = reflect_with(Api::<DaemonSet>::all(client.clone()), watcher::Config::default(), "daemonset", |_: &DaemonSet| {});
        let (claims_pv, pvc) = reflect_with(Api::<PersistentVolumeClaim>::all(client.clone()), watcher::Config::default(), "persistentvolumeclaim", |_: &PersistentVolumeClaim| {});
        let (volumes, pv) = reflect_with(Api::<PersistentVolume>::all(client.clone()), watcher::Config::default(), "persistentvolume", |_: &PersistentVolume| {});
        let (overlays, ov) = watch_overlays(client.clone());
        let drive = async move {
            futures::future::join(futures::future::join5(p, n, c, np, d), futures::future::join3(pvc, pv, ov)).await;
        };
        (Stores { pods, nodes, claims, pools, daemonsets, claims_pv, volumes, overlays }, drive)
    }

    /// The objects as the caches hold them now, with the namespaces the process keeps (the rest
    /// of the state is added by [`super::picture::Picture::state_of`]).
    pub(super) fn state(&self, namespaces: Vec<Arc<Namespace>>) -> ClusterState {
        ClusterState {
            nodes: self.nodes.state(),
            pods: self.pods.state(),
            claims: self.claims.state(),
            pools: self.pools.state(),
            namespaces,
            daemonsets: self.daemonsets.state(),
            volume_claims: self.claims_pv.state(),
            volumes: self.volumes.state(),
            overlays: self.overlays.state(),
            ..Default::default()
        }
    }

    pub async fn wait_ready(&self) {
        let _ = futures::future::join5(self.pods.wait_until_ready(), self.nodes.wait_until_ready(), self.claims.wait_until_ready(), self.pools.wait_until_ready(), self.daemonsets.wait_until_ready()).await;
        let _ = futures::future::join(self.claims_pv.wait_until_ready(), self.volumes.wait_until_ready()).await;
    }
}

/// How often Archer looks again for the NodeOverlay CRD while it is not served.
const OVERLAY_CRD_RECHECK: std::time::Duration = std::time::Duration::from_secs(300);

/// The NodeOverlay cache. Karpenter's CRD (`nodeoverlays.karpenter.sh`) may not be installed:
/// until the API serves it, the cache stays empty and the absence is logged once per look (every
/// five minutes), rather than a watch failing every few seconds.
pub(crate) fn watch_overlays(client: Client) -> (Store<NodeOverlay>, impl std::future::Future<Output = ()> + Send + 'static) {
    let (store, writer) = kube::runtime::reflector::store();
    let drive = async move {
        let api = Api::<NodeOverlay>::all(client);
        loop {
            match api.list(&kube::api::ListParams::default().limit(1)).await {
                Ok(_) => break,
                Err(kube::Error::Api(e)) if e.code == 404 => tracing::info!("NodeOverlay (karpenter.sh/v1alpha1) is not served: no overlays; looking again in 5 minutes"),
                Err(e) => tracing::warn!(error = %e, "listing NodeOverlays; looking again in 5 minutes"),
            }
            tokio::time::sleep(OVERLAY_CRD_RECHECK).await;
        }
        reflect_into(api, writer).await;
    };
    (store, drive)
}
