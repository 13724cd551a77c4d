//! One batch's plan: pending pods onto the room the cluster already has (running nodes and
//! in-flight claims) by kube-scheduler's own filter rules, then the rest onto new nodes by the
//! packer. Pure: the same snapshot and pods give the same plan in the worker and in `simulate`.
#![allow(clippy::indexing_slicing, reason = "the planner indexes its own vectors by indices it built from them; no index comes from input")]

use super::packer::{pack_within, Offering, PendingPod, Plan, Pool, DEFAULT_BUDGET};
use super::sched::{NodeInfo, PodInfo, Snapshot};

pub mod compare;
pub use one_node::onto_one_new_node;
mod domains;
mod one_node;
mod order;
mod variants;
mod verify;

/// A pending pod: the packer's view and the scheduler's.
#[derive(Debug, Clone)]
pub struct Pending {
    pub packer: PendingPod,
    pub sched: PodInfo,
    /// The pod with its preferences taken as rules ([`crate::sched::preferences::stricter`]),
    /// strictest first; `packer` and `sched` (its required rules only) come after the last. The
    /// planner buys new nodes for it at the first step the packer and the filters allow.
    pub stricter: Vec<Step>,
    /// Each preference alone as a rule, with its weight ([`crate::sched::preferences::each`]):
    /// among the nodes that take the pod, the planner picks one with the heaviest sum honoured,
    /// as kube-scheduler scores them.
    pub preferences: Vec<(i32, PodInfo)>,
    /// The node (or claim) an earlier plan put this pod on, if any: while that node takes it,
    /// the pod stays there, so batches do not move a pod kube-scheduler is about to bind.
    pub planned: Option<String>,
    /// Where kube-scheduler's queue most likely has the pod among the others (lower first): the
    /// pod's resourceVersion, which its last failed scheduling attempt set. Only the order in
    /// which interchangeable pods take their places depends on it ([`order`]).
    pub queue_order: u64,
}

/// One step of a pod's relaxation: both views of the pod with some of its preferences as rules.
#[derive(Debug, Clone)]
pub struct Step {
    pub packer: PendingPod,
    pub sched: PodInfo,
}

impl Pending {
    /// Its views at step `k` of its relaxation (past the last stricter step: as written).
    fn step(&self, k: usize) -> (&PendingPod, &PodInfo) {
        self.stricter.get(k).map_or((&self.packer, &self.sched), |s| (&s.packer, &s.sched))
    }

    /// The index of its last step (required rules only).
    fn last_step(&self) -> usize {
        self.stricter.len()
    }

    /// The same pod under another id (at every step).
    pub fn with_id(mut self, id: &str) -> Self {
        self.packer.id = id.to_string();
        for s in &mut self.stricter {
            s.packer.id = id.to_string();
        }
        self
    }
}

/// Can the pod's images run on this node's architecture and OS (unknown platforms: anywhere)?
fn runs_on(pod: &PendingPod, node: &NodeInfo) -> bool {
    let Some(platforms) = &pod.platforms else { return true };
    let Some(arch) = node.labels.get(super::labels::ARCH) else { return true };
    let os = node.labels.get(super::labels::OS).map_or("linux", String::as_str);
    platforms.0.iter().any(|p| &p.architecture == arch && p.os == os)
}

/// Plan `pending` on `snapshot`: a pod an earlier plan put on a node of the snapshot stays there
/// while that node takes it; every other pod, largest first, goes to the first node of the snapshot
/// that kube-scheduler would bind it to (resources, affinity, taints, ports, topology spread and
/// inter-pod affinity, counting running pods and the ones placed before it); the rest are packed
/// onto new nodes, and every placement on a new node is then checked by the same rules
/// ([`verify`]). Pods whose group must share a zone or a node are left to the packer, which
/// places such groups together.
pub fn plan_batch(snapshot: &Snapshot, pending: &[Pending], pools: &[Pool], offerings: &[Offering]) -> Plan {
    plan_batch_within(snapshot, pending, pools, offerings, DEFAULT_BUDGET)
}

/// [`plan_batch`], the packer spending at most `budget` on the optimal plan before it keeps the
/// greedy one (zero: the greedy plan, with no lower bound). The live paths pass
/// [`crate::packer::batch_budget`], so a small batch is decided quickly.
///
/// Preferences never cost a pod its place: when the plan that honours them leaves a pod with
/// preferences unschedulable (the nodes bought for the stricter steps too small for the relaxed
/// pods under a pool's limit), the batch is planned again by required rules alone and that plan is
/// kept if it places more pods.
pub fn plan_batch_within(snapshot: &Snapshot, pending: &[Pending], pools: &[Pool], offerings: &[Offering], budget: std::time::Duration) -> Plan {
    let pools = &variants::expand(pools, pending)[..];
    let plan = plan_once(snapshot, pending, pools, offerings, budget);
    let with_preferences: std::collections::HashSet<&str> = pending.iter().filter(|p| !p.stricter.is_empty()).map(|p| p.packer.id.as_str()).collect();
    if !plan.unschedulable.iter().any(|u| with_preferences.contains(u.pod.as_str())) {
        return plan;
    }
    let plain: Vec<Pending> = pending.iter().map(|p| Pending { stricter: Vec::new(), ..p.clone() }).collect();
    let fallback = plan_once(snapshot, &plain, pools, offerings, budget);
    if fallback.unschedulable.len() < plan.unschedulable.len() {
        fallback
    } else {
        plan
    }
}

/// One plan of the batch (see [`plan_batch_within`]).
fn plan_once(snapshot: &Snapshot, pending: &[Pending], pools: &[Pool], offerings: &[Offering], budget: std::time::Duration) -> Plan {
    let mut snap = snapshot.clone();
    let mut order: Vec<&Pending> = pending.iter().collect();
    order.sort_by(|a, b| b.packer.requests.cmp(&a.packer.requests).then_with(|| a.packer.id.cmp(&b.packer.id)));
    let mut placed = std::collections::BTreeMap::new();
    let mut refused = std::collections::BTreeMap::new();
    let mut remaining = Vec::new();
    let grouped = |p: &Pending| p.packer.zone_group.is_some() || p.packer.colocate;
    let mut domains = domains::DomainCache::default();
    // Pods an earlier plan put on a node of the snapshot go first and stay there while it takes
    // them, so no other pod of this batch is given their room.
    let index: std::collections::HashMap<&str, usize> = snap.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
    let sticky: std::collections::HashMap<&str, usize> = order.iter().filter(|p| !grouped(p)).filter_map(|p| Some((p.packer.id.as_str(), *index.get(p.planned.as_deref()?)?))).collect();
    drop(index);
    // In kube-scheduler's likely queue order, and again while any more take their place: the
    // earlier plan held as a whole, but a spread checked pod by pod can refuse a pod its place
    // until the pods planned for the other domains are counted.
    let (mut waiting, mut rest): (Vec<&Pending>, Vec<&Pending>) = order.into_iter().partition(|p| sticky.contains_key(p.packer.id.as_str()));
    waiting.sort_by(|a, b| a.queue_order.cmp(&b.queue_order).then_with(|| a.packer.id.cmp(&b.packer.id)));
    let mut kept = std::collections::HashSet::new();
    loop {
        let before = waiting.len();
        waiting.retain(|p| {
            let i = sticky[p.packer.id.as_str()];
            if !runs_on(&p.packer, &snap.nodes[i]) || snap.fits(&p.sched, i).is_err() {
                return true;
            }
            kept.insert(p.packer.id.clone());
            placed.insert(p.packer.id.clone(), snap.nodes[i].name.clone());
            snap.bind(p.sched.clone(), i);
            false
        });
        if waiting.is_empty() || waiting.len() == before {
            break;
        }
    }
    rest.extend(waiting);
    rest.sort_by(|a, b| b.packer.requests.cmp(&a.packer.requests).then_with(|| a.packer.id.cmp(&b.packer.id)));
    for p in rest {
        if grouped(p) {
            remaining.push(p.step(0).0.clone());
            continue;
        }
        // The domains a pool could open count on room already there too (a zone no node is in
        // yet is an empty domain of a zone spread).
        let info = domains.at_step(p, p.last_step(), pools, offerings);
        let verdicts = snap.feasible(&info);
        match first_taker(&snap, &p.packer, &verdicts) {
            Some(any) => {
                let i = most_preferred(&snap, p, &verdicts, any);
                placed.insert(p.packer.id.clone(), snap.nodes[i].name.clone());
                snap.bind(p.sched.clone(), i);
            }
            None => {
                if !snap.nodes.is_empty() {
                    refused.insert(p.packer.id.clone(), refusals(&snap, &p.packer, &verdicts));
                }
                // New nodes are bought for the pod with every preference as a rule first.
                remaining.push(p.step(0).0.clone());
            }
        }
    }
    let mut plan = pack_within(&remaining, pools, offerings, &[], budget);
    plan.existing.extend(placed);
    let by_id: std::collections::HashMap<&str, &Pending> = pending.iter().map(|p| (p.packer.id.as_str(), p)).collect();
    let settled = (plan.existing.len(), plan.unschedulable.len());
    verify::verify(&mut snap, &mut plan, &by_id, pools, offerings, &mut domains);
    if (plan.existing.len(), plan.unschedulable.len()) != settled {
        // The bound was for the pods the packer placed; some of them went elsewhere.
        plan.lower_bound_per_hour = 0.0;
    }
    order::in_queue_order(&mut plan, pending, snapshot, &kept);
    for u in &mut plan.unschedulable {
        if let Some(why) = refused.get(&u.pod) {
            u.reason = format!("{}; {why}", u.reason);
        }
    }
    plan
}

/// Among the nodes the verdicts pass that the pod's images run on, the first (in snapshot order)
/// with the heaviest sum of the pod's preferences honoured (kube-scheduler scores preferred pod
/// affinity and anti-affinity by their weights and prefers the nodes a ScheduleAnyway spread
/// allows) and of what running pods' own affinity terms that select it give each node
/// ([`Snapshot::affinity_scores`], InterPodAffinity's symmetry).
fn most_preferred(snap: &Snapshot, p: &Pending, verdicts: &[Result<usize, (usize, super::sched::Unfit)>], any: usize) -> usize {
    let toward = snap.affinity_scores(&p.sched);
    if p.preferences.is_empty() && toward.is_empty() {
        return any;
    }
    let mut score: std::collections::BTreeMap<usize, i64> = verdicts
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .copied()
        .filter(|&i| runs_on(&p.packer, &snap.nodes[i]))
        .map(|i| (i, toward.iter().filter(|((k, v), _)| snap.nodes[i].labels.get(k) == Some(v)).map(|(_, s)| s).sum()))
        .collect();
    for (weight, info) in &p.preferences {
        for i in snap.feasible(info).into_iter().filter_map(Result::ok) {
            if let Some(s) = score.get_mut(&i) {
                *s += i64::from(*weight);
            }
        }
    }
    // The highest score, the first node among equals.
    score.iter().max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0))).map_or(any, |(&i, _)| i)
}

/// The first node (in snapshot order) the verdicts pass that the pod's images run on.
fn first_taker(snap: &Snapshot, pod: &PendingPod, verdicts: &[Result<usize, (usize, super::sched::Unfit)>]) -> Option<usize> {
    verdicts.iter().filter_map(|r| r.as_ref().ok()).copied().find(|&i| runs_on(pod, &snap.nodes[i]))
}

/// kube-scheduler's summary of why no existing node took the pod: `0/3 nodes are available: 2
/// node(s) didn't match pod anti-affinity rules, 1 Insufficient cpu.`
fn refusals(snap: &Snapshot, pod: &PendingPod, verdicts: &[Result<usize, (usize, super::sched::Unfit)>]) -> String {
    let mut counts: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for v in verdicts {
        let why = match v {
            Err((_, unfit)) => unfit.to_string(),
            Ok(i) if !runs_on(pod, &snap.nodes[*i]) => "node(s) had an architecture the pod's images do not support".to_string(),
            Ok(_) => continue,
        };
        *counts.entry(why).or_insert(0) += 1;
    }
    let parts: Vec<String> = counts.into_iter().map(|(why, n)| format!("{n} {why}")).collect();
    format!("0/{} nodes are available: {}.", snap.nodes.len(), parts.join(", "))
}

#[cfg(test)]
mod tests;
