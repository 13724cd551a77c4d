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
use archer_api::nodepool::NodePool;
use archer_model::objects as state;
use archer_model::ClusterState;

use super::reflect_with;

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
        let drive = async move {
            futures::future::join(futures::future::join5(p, n, c, np, d), futures::future::join(pvc, pv)).await;
        };
        (Stores { pods, nodes, claims, pools, daemonsets, claims_pv, volumes }, drive)
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
            ..Default::default()
        }
    }

    pub async fn wait_ready(&self) {
        let _ = futures::future::join5(self.pods.wait_until_ready(), self.nodes.wait_until_ready(), self.claims.wait_until_ready(), self.pools.wait_until_ready(), self.daemonsets.wait_until_ready()).await;
        let _ = futures::future::join(self.claims_pv.wait_until_ready(), self.volumes.wait_until_ready()).await;
    }
}
