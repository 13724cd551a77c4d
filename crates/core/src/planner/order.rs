//! Which of several interchangeable pods takes which of their planned places.
//!
//! kube-scheduler binds a batch's pods one at a time, in its queue's order, and checks every
//! topology spread constraint against the pods bound so far. A plan whose places are right as a
//! whole can still be refused pod by pod: with `maxSkew: 1` over three zones, the second pod kube-
//! scheduler tries is refused its planned zone if the first one went there too, and then binds to
//! a place the plan meant for another pod. Pods of one kind (same namespace, labels, constraints,
//! requests and platforms: the replicas of one ReplicaSet) are interchangeable, so the plan may
//! give their places out in any order without changing what it buys. This hands them out in the
//! order kube-scheduler will most likely try the pods, each to the place whose domains hold the
//! fewest of them so far, so that every prefix of that order keeps the skew the plan keeps.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::Pending;
use crate::labels;
use crate::packer::Plan;
use crate::sched::selector::Labels;
use crate::sched::Snapshot;

/// A planned place: a node of the snapshot (by name) or a new node of the plan (by index).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Place {
    Existing(String),
    New(usize),
}

/// Reassign the places of interchangeable pods with hard spread constraints in kube-scheduler's
/// likely order (see the module). Pods in `keep` (an earlier plan's placement, possibly known to
/// kube-scheduler already) keep theirs.
pub(super) fn in_queue_order(plan: &mut Plan, pending: &[Pending], snapshot: &Snapshot, keep: &HashSet<String>) {
    let mut place: HashMap<String, Place> = plan.existing.iter().map(|(p, n)| (p.clone(), Place::Existing(n.clone()))).collect();
    for (i, n) in plan.nodes.iter().enumerate() {
        place.extend(n.pods.iter().map(|p| (p.clone(), Place::New(i))));
    }
    let mut groups: BTreeMap<String, Vec<&Pending>> = BTreeMap::new();
    for p in pending.iter().filter(|p| !p.sched.spread.is_empty() && !keep.contains(&p.packer.id) && place.contains_key(&p.packer.id)) {
        groups.entry(kind(p)).or_default().push(p);
    }
    let mut moved = false;
    for mut group in groups.into_values().filter(|g| g.len() > 1) {
        group.sort_by(|a, b| a.queue_order.cmp(&b.queue_order).then_with(|| a.packer.id.cmp(&b.packer.id)));
        let places: Vec<Place> = group.iter().filter_map(|p| place.get(&p.packer.id).cloned()).collect();
        for (p, to) in group.iter().zip(assign(group[0], places, plan, snapshot)) {
            if place.get(&p.packer.id) != Some(&to) {
                place.insert(p.packer.id.clone(), to);
                moved = true;
            }
        }
    }
    if !moved {
        return;
    }
    for n in &mut plan.nodes {
        n.pods.clear();
    }
    plan.existing.clear();
    for (pod, to) in place {
        match to {
            Place::Existing(node) => {
                plan.existing.insert(pod, node);
            }
            Place::New(i) => plan.nodes[i].pods.push(pod),
        }
    }
    for n in &mut plan.nodes {
        n.pods.sort();
    }
}

/// The group's places, one per pod in order: each pod takes a place in the domains (constraint by
/// constraint, in the pod's order of constraints) that hold the fewest matching pods so far.
/// Hostname constraints are left out: a new node is a domain of its own, and they are checked
/// node by node as each one comes up. Places are bucketed by their domains, so this is linear in
/// the group times the (few) buckets.
fn assign(first: &Pending, places: Vec<Place>, plan: &Plan, snapshot: &Snapshot) -> Vec<Place> {
    let constraints: Vec<_> = first.sched.spread.iter().filter(|c| c.topology_key != labels::HOSTNAME).collect();
    if constraints.is_empty() {
        return places;
    }
    let by_name: HashMap<&str, &Labels> = snapshot.nodes.iter().map(|n| (n.name.as_str(), &n.labels)).collect();
    let domain = |place: &Place, key: &str| -> Option<String> {
        match place {
            Place::Existing(name) => by_name.get(name.as_str()).and_then(|l| l.get(key).cloned()),
            Place::New(i) => {
                let n = &plan.nodes[*i];
                match key {
                    labels::ZONE => Some(n.zone.clone()),
                    labels::ARCH => Some(n.arch.clone()),
                    labels::INSTANCE_TYPE => Some(n.instance_type.clone()),
                    labels::KARPENTER_CAPACITY_TYPE | labels::CAPACITY_TYPE => Some(n.capacity_type.clone()),
                    _ => None,
                }
            }
        }
    };
    // Matching pods already bound, per constraint and domain.
    let mut counts: Vec<HashMap<String, usize>> = constraints
        .iter()
        .map(|c| {
            let mut m: HashMap<String, usize> = HashMap::new();
            for n in &snapshot.nodes {
                let Some(value) = n.labels.get(&c.topology_key) else { continue };
                let matching = n.pods.iter().filter(|&&i| snapshot.pods[i].namespace == first.sched.namespace && c.selector.matches(&snapshot.pods[i].labels)).count();
                *m.entry(value.clone()).or_default() += matching;
            }
            m
        })
        .collect();
    // Places by their domains, each bucket in plan order.
    let mut buckets: BTreeMap<Vec<Option<String>>, std::collections::VecDeque<Place>> = BTreeMap::new();
    let total = places.len();
    for place in places {
        let key: Vec<Option<String>> = constraints.iter().map(|c| domain(&place, &c.topology_key)).collect();
        buckets.entry(key).or_default().push_back(place);
    }
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let score = |key: &[Option<String>]| -> Vec<usize> { key.iter().zip(&counts).map(|(v, m)| v.as_ref().map_or(0, |v| m.get(v).copied().unwrap_or(0))).collect() };
        let Some(best) = buckets.iter().filter(|(_, b)| !b.is_empty()).min_by_key(|(k, _)| score(k)).map(|(k, _)| k.clone()) else { break };
        let Some(chosen) = buckets.get_mut(&best).and_then(|b| b.pop_front()) else { break };
        for (v, m) in best.iter().zip(counts.iter_mut()) {
            if let Some(v) = v {
                *m.entry(v.clone()).or_default() += 1;
            }
        }
        out.push(chosen);
    }
    out
}

/// Pods with the same key are interchangeable for the plan.
fn kind(p: &Pending) -> String {
    let s = &p.sched;
    format!(
        "{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
        s.namespace, s.labels, s.requests, s.host_ports, s.spread, s.affinity, s.anti_affinity, s.node_selector, s.required_terms, s.tolerations, s.volume_terms, p.packer.platforms, p.packer.requests
    )
}
