//! Consolidation's replacement, as Karpenter makes it: the pods that leave a set of nodes and fit
//! on no node that stays go together onto ONE new node, or the set stays. Karpenter's scheduling
//! simulation opens a new NodeClaim only when no instance type of the open one holds the next pod,
//! so a replacement it can make is the cheapest single node that holds them all, in the
//! highest-weight pool that has one. The cost-optimal plan may buy two small nodes where one
//! larger node holds the same pods; consolidation then takes the one node (a trade of one node
//! for many is never made, docs "Consolidation").

use std::collections::HashMap;

use super::domains::DomainCache;
use super::{runs_on, variants, verify, Pending};
use crate::packer::{could_host_with, within_limits, Offering, Plan, PlannedNode, Pool, Visibility};
use crate::resources::Resources;
use crate::sched::Snapshot;

/// `plan` (of `pending` on `snapshot`) with the pods it put on new nodes all on one new node: the
/// cheapest offering, in the first pool by weight that has one, on which kube-scheduler's filters
/// take every such pod (with the pods `plan` put on existing nodes bound there first). `plan`
/// itself when it buys at most one node; `None` when some pod has no place or no single node
/// holds them all.
pub fn onto_one_new_node(snapshot: &Snapshot, pending: &[Pending], pools: &[Pool], offerings: &[Offering], plan: &Plan) -> Option<Plan> {
    if !plan.unschedulable.is_empty() {
        return None;
    }
    if plan.nodes.len() <= 1 {
        return Some(plan.clone());
    }
    let pools = variants::expand(pools, pending);
    let by_id: HashMap<&str, &Pending> = pending.iter().map(|p| (p.packer.id.as_str(), p)).collect();
    let mut base = snapshot.clone();
    for (pod, node) in &plan.existing {
        let (p, i) = (by_id.get(pod.as_str())?, base.node_index(node)?);
        base.bind(p.sched.clone(), i);
    }
    let mut moving: Vec<&Pending> = plan.nodes.iter().flat_map(|n| &n.pods).map(|id| by_id.get(id.as_str()).copied()).collect::<Option<_>>()?;
    // kube-scheduler's queue takes the largest first, as the planner orders its batch.
    moving.sort_by(|a, b| b.packer.requests.cmp(&a.packer.requests).then_with(|| a.packer.id.cmp(&b.packer.id)));
    let total = moving.iter().fold(Resources::default(), |sum, p| sum + p.packer.requests);
    let mut order: Vec<&Pool> = pools.iter().filter(|p| p.closed.is_none()).collect();
    let visible = Visibility::of(offerings);
    order.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| a.name.cmp(&b.name)));
    let mut domains = DomainCache::default();
    for pool in order {
        let mut fitting: Vec<&Offering> = offerings
            .iter()
            .filter(|o| visible.sees(pool, o) && within_limits(pool, (0, 0, 0), o, 1))
            .filter(|o| {
                let labels = o.labels(pool);
                total.fits(pool.room(&labels, o.instance.allocatable)) && moving.iter().all(|p| could_host_with(&p.packer, pool, o, &labels))
            })
            .collect();
        fitting.sort_by(|a, b| a.price.total_cmp(&b.price).then_with(|| a.instance.name.cmp(&b.instance.name)).then_with(|| a.zone.cmp(&b.zone)));
        for o in fitting {
            if let Some(node) = holds_all(&base, &moving, pool, o, &pools, offerings, &mut domains) {
                let total_price_per_hour = node.price_per_hour;
                return Some(Plan { nodes: vec![node], existing: plan.existing.clone(), unschedulable: Vec::new(), total_price_per_hour, lower_bound_per_hour: 0.0 });
            }
        }
    }
    None
}

/// A new node of offering `o` in `pool` with every pod of `moving` on it, if kube-scheduler's
/// filters take each one there in turn (the ones before it bound).
fn holds_all(base: &Snapshot, moving: &[&Pending], pool: &Pool, o: &Offering, pools: &[Pool], offerings: &[Offering], domains: &mut DomainCache) -> Option<PlannedNode> {
    let mut node = PlannedNode {
        name: format!("{}-1", pool.name),
        pool: pool.name.clone(),
        instance_type: o.instance.name.clone(),
        arch: o.instance.arch.clone(),
        zone: o.zone.clone(),
        capacity_type: o.capacity.as_str().to_string(),
        price_per_hour: o.price,
        labels: pool.variant.clone(),
        pods: Vec::new(),
    };
    let mut snap = base.clone();
    let i = snap.nodes.len();
    snap.nodes.push(verify::node_to_be(&node, "planned-node-0", pools, offerings)?);
    for p in moving {
        let info = domains.at_step(p, p.last_step(), pools, offerings);
        if !runs_on(&p.packer, &snap.nodes[i]) || snap.fits(&info, i).is_err() {
            return None;
        }
        snap.bind(p.sched.clone(), i);
        node.pods.push(p.packer.id.clone());
    }
    Some(node)
}
