//! Two planned nodes into one: where one offering holds the pods of two nodes for less than the
//! two cost (the last nodes of a plan are often partly filled, and right-sizing swaps one node
//! for one cheaper node only).

use super::{extended_sum, holds_extended, Class, Draft, Offering, Resources};

/// How many of the least-filled nodes are paired up (the pairs grow with its square).
const CANDIDATES: usize = 24;
/// Most merges per plan.
const MERGES: usize = 32;

/// Merge pairs of `drafts` into one node while a merge saves money: the same pool, an offering
/// every class of both may use, with room for both (pod slots, GPUs and per-node caps included)
/// and no more vCPU or memory than the two together (so pool limits still hold).
pub(super) fn merge_pairs(drafts: &mut Vec<Draft>, classes: &[Class], offerings: &[Offering], room: &dyn Fn(usize, usize) -> Resources) {
    for _ in 0..MERGES {
        let fill = |d: &Draft| {
            let r = room(d.pi, d.oi);
            d.used(classes).dominant_share(r)
        };
        let mut order: Vec<usize> = (0..drafts.len()).collect();
        order.sort_by(|&a, &b| fill(&drafts[a]).total_cmp(&fill(&drafts[b])).then(a.cmp(&b)));
        order.truncate(CANDIDATES);
        let mut best: Option<(f64, usize, usize, usize)> = None;
        for (x, &a) in order.iter().enumerate() {
            for &b in &order[x + 1..] {
                if let Some((saving, oi)) = merged(&drafts[a], &drafts[b], classes, offerings, room) {
                    if best.is_none_or(|(s, ..)| saving > s) {
                        best = Some((saving, a, b, oi));
                    }
                }
            }
        }
        let Some((_, a, b, oi)) = best else { return };
        let (lo, hi) = (a.min(b), a.max(b));
        let second = drafts.swap_remove(hi);
        let first = &mut drafts[lo];
        first.oi = oi;
        for (ci, pods) in second.items {
            first.add(ci, pods);
        }
    }
}

/// The saving and the cheapest offering one node holding both `a` and `b` could use.
fn merged(a: &Draft, b: &Draft, classes: &[Class], offerings: &[Offering], room: &dyn Fn(usize, usize) -> Resources) -> Option<(f64, usize)> {
    if a.pi != b.pi {
        return None;
    }
    let (oa, ob) = (&offerings[a.oi].instance, &offerings[b.oi].instance);
    let both = offerings[a.oi].price + offerings[b.oi].price;
    let need = a.used(classes) + b.used(classes);
    let extended = extended_sum(classes, a.items.iter().chain(&b.items).map(|(ci, pods)| (*ci, pods.len())));
    if !caps_hold(a, b, classes) {
        return None;
    }
    // The offerings worth leading a node with, for the first class of either node (cheapest
    // first, so each list is read only while it is cheaper than the best so far).
    let lead = a.items.first()?.0;
    let other = b.items.first()?.0;
    let mut best: Option<usize> = None;
    let cheaper = |oj: usize, best: Option<usize>| offerings[oj].price < best.map_or(both, |x| offerings[x].price);
    for &(pj, oj) in classes[lead].offerings.iter().take_while(|&&(_, oj)| cheaper(oj, None)).chain(classes[other].offerings.iter().take_while(|&&(_, oj)| cheaper(oj, None))) {
        if !cheaper(oj, best) {
            continue;
        }
        let o = &offerings[oj];
        if pj != a.pi
            || o.instance.vcpu > oa.vcpu + ob.vcpu
            || o.instance.memory_mib > oa.memory_mib + ob.memory_mib
            || !holds_extended(&o.instance, &extended)
            || !need.fits(room(pj, oj))
            || !a.items.iter().chain(&b.items).all(|(ci, _)| classes[*ci].mask.contains(&(pj, oj)))
        {
            continue;
        }
        best = Some(oj);
    }
    best.map(|oj| (both - offerings[oj].price, oj))
}

/// Would the pods of `a` and `b` on one node stay within every per-node cap (hostname spread,
/// anti-affinity to their own group)?
fn caps_hold(a: &Draft, b: &Draft, classes: &[Class]) -> bool {
    let mut groups: Vec<(String, usize, usize)> = Vec::new();
    for (ci, pods) in a.items.iter().chain(&b.items) {
        let c = &classes[*ci];
        let Some(max) = c.per_node_max else { continue };
        let key = c.spread_group.clone().unwrap_or_else(|| format!("class {ci}"));
        match groups.iter_mut().find(|(k, ..)| *k == key) {
            Some(g) => g.1 += pods.len(),
            None => groups.push((key, pods.len(), max)),
        }
    }
    groups.iter().all(|(_, n, max)| n <= max)
}
