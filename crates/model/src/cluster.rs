//! The cluster at one moment: every object the provisioner's decisions read, in one value. The
//! runtime builds it from its watch caches, `archer simulate` from a scenario or a cluster dump;
//! the planner's inputs (pools with their room, kube-scheduler's snapshot, volumes, DaemonSet
//! loads, what a live plan already covers) are made from it here, once, for both.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};

use archer_api::nodeclaim::NodeClaim;
use archer_api::nodepool::NodePool;
use archer_core::packer::{DaemonLoad, Pool};
use archer_core::sched::{Snapshot, Volumes};

use crate::{adapter, objects};

/// Every object the deciding code reads, as the cluster had them at one moment.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    pub nodes: Vec<Arc<Node>>,
    /// Every pod: bound, waiting for a node, finishing.
    pub pods: Vec<Arc<Pod>>,
    pub claims: Vec<Arc<NodeClaim>>,
    pub pools: Vec<Arc<NodePool>>,
    pub namespaces: Vec<Arc<Namespace>>,
    pub daemonsets: Vec<Arc<DaemonSet>>,
    pub volume_claims: Vec<Arc<PersistentVolumeClaim>>,
    pub volumes: Vec<Arc<PersistentVolume>>,
}

fn refs<T>(v: &[Arc<T>]) -> Vec<&T> {
    v.iter().map(Arc::as_ref).collect()
}

impl ClusterState {
    pub fn node_refs(&self) -> Vec<&Node> {
        refs(&self.nodes)
    }

    pub fn pod_refs(&self) -> Vec<&Pod> {
        refs(&self.pods)
    }

    pub fn claim_refs(&self) -> Vec<&NodeClaim> {
        refs(&self.claims)
    }

    /// The node of that name.
    pub fn node(&self, name: &str) -> Option<&Arc<Node>> {
        self.nodes.iter().find(|n| n.metadata.name.as_deref() == Some(name))
    }

    /// The claim whose node has that name.
    pub fn claim_of_node(&self, node: &str) -> Option<&Arc<NodeClaim>> {
        self.claims.iter().find(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
    }

    /// The DaemonSets' pods as loads on the nodes they would run on.
    pub fn daemon_loads(&self) -> Vec<DaemonLoad> {
        self.daemonsets.iter().map(|d| objects::daemon_load(d)).collect()
    }

    /// The volume claims and the volumes they are bound to.
    pub fn volumes(&self) -> Volumes {
        Volumes::new(&refs(&self.volume_claims), &refs(&self.volumes))
    }

    /// The packer's pools: each NodePool with the room left under its limits and the
    /// DaemonSets that would run on its nodes (see [`objects::packer_pools`]). `closed` says why
    /// a pool may launch nothing now.
    pub fn packer_pools(&self, closed: &dyn Fn(&NodePool) -> Option<String>) -> Vec<Pool> {
        objects::packer_pools(&refs(&self.pools), &self.claim_refs(), &self.daemon_loads(), closed)
    }

    /// The cluster as kube-scheduler's rules see it, leaving out the nodes `skip` names (see
    /// [`adapter::cluster_snapshot`]).
    pub fn snapshot(&self, pools: &[Pool], skip: &dyn Fn(&str) -> bool) -> Snapshot {
        adapter::cluster_snapshot(&self.node_refs(), &self.claim_refs(), &self.pod_refs(), &refs(&self.namespaces), pools, skip)
    }

    /// Pending pods a live plan already placed on a node still coming (see [`adapter::covered`]).
    pub fn covered(&self) -> HashSet<String> {
        adapter::covered(&self.claim_refs(), &self.node_refs(), &self.pod_refs()).into_iter().map(|(p, _)| objects::pod_id(p)).collect()
    }

    /// The pods a batch plans: those the provisioner should find room for
    /// ([`objects::is_provisionable`] with the `eager` schedulers), less those a live plan
    /// covers; and the covered ones.
    pub fn provisionable(&self, eager: &[String]) -> (Vec<Arc<Pod>>, HashSet<String>) {
        let covered = self.covered();
        let pending = self.pods.iter().filter(|p| objects::is_provisionable(p, eager) && !covered.contains(&objects::pod_id(p))).cloned().collect();
        (pending, covered)
    }

    /// The node each pod was planned onto by a live claim (the claims' record, after a restart).
    pub fn planned_nodes(&self) -> HashMap<String, String> {
        adapter::planned_nodes(&self.claim_refs())
    }

    /// Why `pool` must not be consolidated now (see [`objects::consolidation_hold`]).
    pub fn consolidation_hold(&self, pool: &str, waiting: &[String]) -> Option<String> {
        objects::consolidation_hold(pool, &self.claim_refs(), &self.node_refs(), waiting)
    }
}
