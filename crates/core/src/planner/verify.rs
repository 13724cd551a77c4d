//! The new-node pass, checked by kube-scheduler's own rules. Every pod the packer put on a new
//! node is bound there in the exact model (resources, ports, taints, node affinity, topology
//! spread, inter-pod affinity), with the domains new nodes could open counted as empty domains,
//! as Karpenter counts them. A pod the model refuses goes to another node of the plan that takes
//! it, or back to the packer narrowed to the domains its rules allow (`zone In [...]`,
//! `capacity-type NotIn [...]`), for a few rounds; what still fails is unschedulable, with the rule
//! that failed. The plan that comes out is one kube-scheduler can follow pod by pod.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::domains::DomainCache;
use super::{refusals, Pending};
use crate::labels::HOSTNAME;
use crate::packer::{pack_within, Offering, PendingPod, Plan, PlannedNode, Pool, Unschedulable};
use crate::requirements::Requirements;
use crate::sched::resources::ResourceList;
use crate::sched::{DomainRule, NodeInfo, Snapshot};

/// Repacking rounds for pods the exact model refused on the nodes planned for them.
const ROUNDS: usize = 6;

/// The plan's new nodes and the snapshot indices they occupy.
struct NewNodes {
    nodes: Vec<PlannedNode>,
    index: Vec<usize>,
}

/// Check `plan`'s new nodes against `snap` (which already holds the pods placed on existing
/// nodes), moving or repacking the pods it refuses. On return `snap` holds the whole plan.
pub(super) fn verify(snap: &mut Snapshot, plan: &mut Plan, pending: &HashMap<&str, &Pending>, pools: &[Pool], offerings: &[Offering], domains: &mut DomainCache) {
    let mut new = NewNodes { nodes: Vec::new(), index: Vec::new() };
    let mut batch = std::mem::take(&mut plan.nodes);
    let limits = pools;
    let mut pools = pools.to_vec();
    // Each pod's step of relaxation (absent: the first, every preference a rule).
    let mut steps: HashMap<String, usize> = HashMap::new();
    // Pods the packer could not place, with the step it failed them at and why.
    let mut failed: HashMap<String, (usize, String)> = HashMap::new();
    let mut retry = unplaced(&mut plan.unschedulable, pending, &steps, &mut failed);
    for round in 0.. {
        let queues = add_nodes(snap, &mut new, batch, pools.as_slice(), offerings, &mut plan.unschedulable);
        let mut work: VecDeque<(String, bool)> = VecDeque::new();
        // One pod from each new node in turn, as kube-scheduler would see them arrive: a spread
        // group split over zones is checked zone by zone, never one whole zone first.
        let mut queues: Vec<(usize, VecDeque<String>)> = queues;
        while queues.iter().any(|(_, q)| !q.is_empty()) {
            for (k, q) in &mut queues {
                let Some(id) = q.pop_front() else { continue };
                let Some(p) = pending.get(id.as_str()) else { continue };
                let info = domains.at_step(p, step_of(&steps, &id), &pools, offerings);
                match snap.fits(&info, new.index[*k]) {
                    Ok(()) => {
                        snap.bind(p.sched.clone(), new.index[*k]);
                        new.nodes[*k].pods.push(id);
                    }
                    Err(_) => work.push_back((id, false)),
                }
            }
        }
        // Pods the packer could not place are tried on the nodes planned since, then relaxed.
        work.extend(retry.drain(..).map(|id| (id, true)));
        let mut repack = Vec::new();
        while let Some((id, relaxed)) = work.pop_front() {
            let Some(p) = pending.get(id.as_str()) else { continue };
            let k = step_of(&steps, &id);
            let info = domains.at_step(p, k, &pools, offerings);
            let verdicts = snap.feasible(&info);
            if let Some(i) = super::first_taker(snap, &p.packer, &verdicts) {
                match new.index.iter().position(|&x| x == i) {
                    Some(k) => new.nodes[k].pods.push(id.clone()),
                    None => {
                        plan.existing.insert(id.clone(), snap.nodes[i].name.clone());
                    }
                }
                snap.bind(p.sched.clone(), i);
                continue;
            }
            let (packer, _) = p.step(k);
            let packer_failed = failed.get(&id).filter(|(at, _)| *at == k).map(|(_, why)| why.clone());
            match snap.new_node_domains(&info) {
                // Pods just relaxed may be repacked whatever the round: relaxing ends.
                Ok(rules) if packer_failed.is_none() && (round < ROUNDS || relaxed) => repack.push(narrow(packer, &rules)),
                // Its next preference goes, and it is tried again (Karpenter's relaxation).
                _ if k < p.last_step() => {
                    tracing::debug!(pod = %id, step = k + 1, of = p.last_step(), "relaxing a preference the plan cannot honour");
                    steps.insert(id.clone(), k + 1);
                    work.push_back((id, true));
                }
                _ if packer_failed.is_some() => plan.unschedulable.push(Unschedulable { pod: id, reason: packer_failed.unwrap_or_default() }),
                Ok(_) => plan.unschedulable.push(Unschedulable { pod: id, reason: refusals(snap, &p.packer, &verdicts) }),
                Err(e) => plan.unschedulable.push(Unschedulable { pod: id, reason: e.to_string() }),
            }
        }
        if repack.is_empty() {
            break;
        }
        // New nodes left empty are given up (no pod slot left, whatever it tolerates): only the
        // others count against the pools' limits.
        for (n, &i) in new.nodes.iter().zip(&new.index) {
            if n.pods.is_empty() {
                snap.nodes[i].max_pods = 0;
            }
        }
        pools = limits.to_vec();
        charge_limits(&mut pools, &new.nodes[..], offerings);
        // Few pods, each round: the greedy packer.
        let mut next = pack_within(&repack, &pools, offerings, &[], std::time::Duration::ZERO);
        retry = unplaced(&mut next.unschedulable, pending, &steps, &mut failed);
        plan.unschedulable.extend(next.unschedulable);
        batch = next.nodes;
        // Pods the packer put on planned nodes are verified against them above; none go to
        // existing ones (the packer was given none).
    }
    finish(plan, new.nodes);
}

/// The pod's step of relaxation.
fn step_of(steps: &HashMap<String, usize>, id: &str) -> usize {
    steps.get(id).copied().unwrap_or(0)
}

/// Take out of `list` the pods the packer could not place that still have a preference to
/// relax, noting the step it failed them at and why, and return them to be tried again: first on
/// the nodes planned by then, as they are, and only then with their next preference relaxed.
fn unplaced(list: &mut Vec<Unschedulable>, pending: &HashMap<&str, &Pending>, steps: &HashMap<String, usize>, failed: &mut HashMap<String, (usize, String)>) -> Vec<String> {
    let mut retry = Vec::new();
    list.retain(|u| {
        let Some(p) = pending.get(u.pod.as_str()) else { return true };
        let k = step_of(steps, &u.pod);
        if k >= p.last_step() {
            return true;
        }
        failed.insert(u.pod.clone(), (k, u.reason.clone()));
        retry.push(u.pod.clone());
        false
    });
    retry
}

/// Add `batch` to the snapshot as nodes-to-be, empty; returns each one's queue of planned pods.
fn add_nodes(snap: &mut Snapshot, new: &mut NewNodes, batch: Vec<PlannedNode>, pools: &[Pool], offerings: &[Offering], unschedulable: &mut Vec<Unschedulable>) -> Vec<(usize, VecDeque<String>)> {
    let mut queues = Vec::new();
    for mut n in batch {
        let name = format!("planned-node-{}", new.nodes.len());
        let Some(info) = node_to_be(&n, &name, pools, offerings) else {
            for pod in n.pods {
                unschedulable.push(Unschedulable { pod, reason: format!("offering {} in {} ({}) is not in the catalog", n.instance_type, n.zone, n.capacity_type) });
            }
            continue;
        };
        let pods: VecDeque<String> = std::mem::take(&mut n.pods).into();
        queues.push((new.nodes.len(), pods));
        new.index.push(snap.nodes.len());
        snap.nodes.push(info);
        new.nodes.push(n);
    }
    queues
}

/// The node a planned node will become, as the filters will read it: the offering's labels in its
/// pool (its hostname a placeholder), the pool's taints, room after the pool's DaemonSets.
pub(super) fn node_to_be(n: &PlannedNode, name: &str, pools: &[Pool], offerings: &[Offering]) -> Option<NodeInfo> {
    let pool = pools.iter().find(|p| p.name == n.pool && p.variant == n.labels)?;
    let o = Offering::find_for_pool(offerings, &n.pool, &n.instance_type, &n.zone, &n.capacity_type)?;
    let mut labels = o.labels(pool);
    labels.insert(HOSTNAME.to_string(), name.to_string());
    let room = pool.room(&labels, o.instance.allocatable);
    let mut allocatable = BTreeMap::from([("cpu".to_string(), room.cpu_millis), ("memory".to_string(), room.memory_bytes)]);
    allocatable.extend(o.instance.extended_resources());
    Some(NodeInfo {
        name: name.to_string(),
        labels,
        taints: pool.taints.clone(),
        unschedulable: false,
        allocatable: ResourceList(allocatable),
        max_pods: room.pods,
        requested: ResourceList::default(),
        pods: Vec::new(),
    })
}

/// The pod for the packer again, its node-affinity terms narrowed by the domain rules.
fn narrow(pod: &PendingPod, rules: &[DomainRule]) -> PendingPod {
    let mut req = Requirements::new();
    for r in rules {
        let values: Vec<String> = r.values.iter().cloned().collect();
        // Keys and values come from node labels the snapshot already holds: always valid.
        let _ = req.add(&r.key, if r.allowed { "In" } else { "NotIn" }, &values);
    }
    let terms = if pod.terms.is_empty() { vec![req] } else { pod.terms.iter().map(|t| t.intersect(&req)).collect() };
    PendingPod { terms, ..pod.clone() }
}

/// Take the nodes planned so far that hold pods off each pool's limits before repacking.
fn charge_limits(pools: &mut [Pool], planned: &[PlannedNode], offerings: &[Offering]) {
    for pool in pools.iter_mut() {
        let (mut cpu, mut mem, mut nodes) = (0i64, 0i64, 0i64);
        for n in planned.iter().filter(|n| n.pool == pool.name && !n.pods.is_empty()) {
            if let Some(o) = offerings.iter().find(|o| o.instance.name == n.instance_type) {
                cpu += i64::from(o.instance.vcpu) * 1000;
                mem += o.instance.memory_mib as i64 * 1024 * 1024;
                nodes += 1;
            }
        }
        pool.limit_cpu_millis = pool.limit_cpu_millis.map(|l| l - cpu);
        pool.limit_memory_bytes = pool.limit_memory_bytes.map(|l| l - mem);
        pool.limit_nodes = pool.limit_nodes.map(|l| l - nodes);
    }
}

/// Drop new nodes left empty, name the rest `<pool>-<n>`, total the price.
fn finish(plan: &mut Plan, nodes: Vec<PlannedNode>) {
    let mut nodes: Vec<PlannedNode> = nodes.into_iter().filter(|n| !n.pods.is_empty()).collect();
    for (i, n) in nodes.iter_mut().enumerate() {
        n.name = format!("{}-{}", n.pool, i + 1);
    }
    plan.total_price_per_hour = nodes.iter().map(|n| n.price_per_hour).sum();
    plan.nodes = nodes;
}

