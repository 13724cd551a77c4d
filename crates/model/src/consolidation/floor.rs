//! The least a set's replacement can cost, from one look at the cluster: a set that no
//! replacement could make worth it is refused without planning its pods (issue #45: a still
//! pool's single-node sweeps planned every candidate, one planning run each, to find nothing).
//!
//! A pod the other nodes have no room for (kube-scheduler's NodeResourcesFit and its pod slots,
//! each node's free room now) can only go onto the replacement, and whatever the other nodes'
//! room together cannot take must too; the one replacement a set may have must hold that, so it
//! costs at least the cheapest offering a pool may launch ([`launchable`]) with the room. Only
//! ever an underestimate: the other filters (affinity, taints, ports, spread, DaemonSets' room,
//! a pool's limits) only take more room away, so a set it refuses is one the planner would
//! refuse too.

use std::cell::OnceCell;

use archer_core::packer::launchable;
use archer_core::resources::Resources;
use archer_core::sched::resources::pod_requests;

use super::{Candidate, World};
use crate::objects;

pub(crate) struct Floor<'w, 'a> {
    world: &'w World<'a>,
    /// Every node (and node still coming) of the snapshot the planner reads, with its free
    /// room: cpu, memory, pod slots (negatives as 0).
    free: OnceCell<Vec<(String, Resources)>>,
    /// What a new node can hold (its allocatable) and costs per hour, cheapest first.
    rooms: OnceCell<Vec<(Resources, f64)>>,
}

impl<'w, 'a> Floor<'w, 'a> {
    pub(crate) fn new(world: &'w World<'a>) -> Self {
        Floor { world, free: OnceCell::new(), rooms: OnceCell::new() }
    }

    fn free(&self) -> &[(String, Resources)] {
        self.free.get_or_init(|| {
            let snapshot = self.world.state.snapshot(self.world.pools, &|_: &str| false);
            snapshot
                .nodes
                .iter()
                .map(|n| {
                    let left = |k: &str| (n.allocatable.get(k) - n.requested.get(k)).max(0);
                    (n.name.clone(), Resources::new(left("cpu"), left("memory"), (n.max_pods - n.pods.len() as i64).max(0)))
                })
                .collect()
        })
    }

    fn rooms(&self) -> &[(Resources, f64)] {
        self.rooms.get_or_init(|| {
            let mut rooms: Vec<(Resources, f64)> = launchable(self.world.pools, &self.world.state.offerings).map(|o| (o.instance.allocatable, o.price)).collect();
            rooms.sort_by(|a, b| a.1.total_cmp(&b.1));
            rooms
        })
    }

    /// The least the pods of `set` cost on new nodes per hour, with the set's nodes gone: 0 when
    /// the other nodes might take them all; `None` when no new node could hold what they cannot.
    pub(crate) fn replacement(&self, set: &[&Candidate<'_>]) -> Option<f64> {
        let leaving = |name: &str| set.iter().any(|c| c.name() == name);
        let others: Vec<Resources> = self.free().iter().filter(|(n, _)| !leaving(n)).map(|(_, r)| *r).collect();
        let room_elsewhere = others.iter().fold(Resources::default(), |a, r| a + *r);
        let fits_somewhere = |req: Resources| others.iter().any(|free| takes(*free, req));
        let (mut all, mut stranded) = (Resources::default(), Resources::default());
        for p in set.iter().flat_map(|c| objects::evictable(&c.pods)) {
            let r = pod_requests(p);
            let req = Resources::new(r.get("cpu"), r.get("memory"), 1);
            all = all + req;
            if !fits_somewhere(req) {
                stranded = stranded + req;
            }
        }
        let need = stranded.max(all - room_elsewhere).max(Resources::default());
        if need == Resources::default() {
            return Some(0.0);
        }
        self.rooms().iter().find(|(room, _)| need.fits(*room)).map(|(_, price)| *price)
    }
}

/// Whether a node with `free` room takes a pod requesting `req`, as NodeResourcesFit checks it:
/// a resource requested at zero is not checked; a pod slot is.
fn takes(free: Resources, req: Resources) -> bool {
    free.pods >= 1 && (req.cpu_millis == 0 || req.cpu_millis <= free.cpu_millis) && (req.memory_bytes == 0 || req.memory_bytes <= free.memory_bytes)
}
