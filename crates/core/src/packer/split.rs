//! One planned node into two: where two offerings together hold a node's pods for less than it
//! costs (a big node of the wrong kind, say memory-optimised room bought for pods that two
//! general-purpose nodes hold exactly).

use std::collections::BTreeMap;

use super::{extended_count, extended_sum, holds_extended, Class, Draft, InstanceType, Offering, Resources};

/// How many of the most expensive nodes are tried.
const CANDIDATES: usize = 24;

/// Split each of the most expensive `drafts` into two nodes where that saves money: both in its
/// pool and zone, on offerings every class of their pods may use, with room for their pods (pod
/// slots and GPUs included), and together no more vCPU or memory than the node (so pool limits
/// still hold). Nodes with a per-node cap, hostname spread or pods that must share a node are
/// left alone (a second node changes what those count).
pub(super) fn split_nodes(drafts: &mut Vec<Draft>, classes: &[Class], offerings: &[Offering], room: &dyn Fn(usize, usize) -> Resources) {
    let mut order: Vec<usize> = (0..drafts.len()).collect();
    order.sort_by(|&a, &b| offerings[drafts[b].oi].price.total_cmp(&offerings[drafts[a].oi].price).then(a.cmp(&b)));
    order.truncate(CANDIDATES);
    for d in order {
        if let Some((first, second)) = split(&drafts[d], classes, offerings, room) {
            drafts[d] = first;
            drafts.push(second);
        }
    }
}

/// The cheapest split of `d` into two nodes that costs less than `d`, if any.
fn split(d: &Draft, classes: &[Class], offerings: &[Offering], room: &dyn Fn(usize, usize) -> Resources) -> Option<(Draft, Draft)> {
    let splittable = |ci: usize| classes[ci].per_node_max.is_none() && classes[ci].spread_group.is_none() && !classes[ci].colocate;
    if d.items.iter().map(|(_, pods)| pods.len()).sum::<usize>() < 2 || !d.items.iter().all(|(ci, _)| splittable(*ci)) {
        return None;
    }
    let current = &offerings[d.oi];
    let may_use = |ci: usize, oj: usize| classes[ci].mask.contains(&(d.pi, oj));
    // The offerings worth leading a node with (undominated) for the node's first class.
    let candidates: Vec<usize> = classes[d.items.first()?.0]
        .offerings
        .iter()
        .filter(|&&(pj, oj)| pj == d.pi && offerings[oj].zone == current.zone && offerings[oj].price < current.price && d.items.iter().all(|(ci, _)| may_use(*ci, oj)))
        .map(|&(_, oj)| oj)
        .collect();
    // Pods largest first, as (class, pod).
    let mut pods: Vec<Unit> = d.items.iter().flat_map(|(ci, pods)| pods.iter().map(move |p| (*ci, p))).collect();
    pods.sort_by(|a, b| classes[b.0].requests.cmp(&classes[a.0].requests).then(a.1.cmp(b.1)));
    let mut best: Option<(f64, Draft, Draft)> = None;
    for &a in &candidates {
        let (first, rest) = fill(&pods, room(d.pi, a), &offerings[a].instance, classes);
        if first.is_empty() || rest.is_empty() {
            continue;
        }
        let need = rest.iter().fold(Resources::default(), |acc, &(ci, _)| acc + classes[ci].one_pod());
        let extended = extended_sum(classes, rest.iter().map(|&(ci, _)| (ci, 1)));
        let Some(b) = candidates
            .iter()
            .copied()
            .filter(|&b| {
                let (oa, ob) = (&offerings[a].instance, &offerings[b].instance);
                oa.vcpu + ob.vcpu <= current.instance.vcpu
                    && oa.memory_mib + ob.memory_mib <= current.instance.memory_mib
                    && holds_extended(ob, &extended)
                    && need.fits(room(d.pi, b))
            })
            .min_by(|&x, &y| offerings[x].price.total_cmp(&offerings[y].price).then(x.cmp(&y)))
        else {
            continue;
        };
        let total = offerings[a].price + offerings[b].price;
        if total < current.price * (1.0 - 1e-9) && best.as_ref().is_none_or(|(p, ..)| total < *p) {
            best = Some((total, draft(d.pi, a, &first), draft(d.pi, b, &rest)));
        }
    }
    best.map(|(_, x, y)| (x, y))
}

/// A pod as (class, name).
type Unit<'a> = (usize, &'a String);

/// `pods` first fit into `room` on a node of type `t`: (those placed, the rest).
fn fill<'a>(pods: &[Unit<'a>], room: Resources, t: &InstanceType, classes: &[Class]) -> (Vec<Unit<'a>>, Vec<Unit<'a>>) {
    let mut left = room;
    let mut used: BTreeMap<&str, i64> = BTreeMap::new();
    let (mut placed, mut rest) = (Vec::new(), Vec::new());
    for &(ci, p) in pods {
        let need = classes[ci].one_pod();
        if need.fits(left) && extended_count(&classes[ci].extended, |k| t.extended_resource(k) - used.get(k).copied().unwrap_or(0)) >= 1 {
            left = left - need;
            for (k, v) in &classes[ci].extended {
                *used.entry(k).or_insert(0) += v;
            }
            placed.push((ci, p));
        } else {
            rest.push((ci, p));
        }
    }
    (placed, rest)
}

/// A node of offering `oi` in pool `pi` holding `pods`.
fn draft(pi: usize, oi: usize, pods: &[Unit]) -> Draft {
    let mut d = Draft { pi, oi, items: Vec::new() };
    for &(ci, p) in pods {
        d.add(ci, [p.clone()]);
    }
    d
}
