//! The greedy pass: node after node, the offering with the lowest price per unit of packed
//! lower-bound work, filled with the largest class left and then smaller compatible ones.

use std::collections::BTreeMap;

use super::{extended_count, fall_through, pods_that_fit, within_limits, Class, Draft, Offering, Packing, Pool, Resources, Unschedulable};

/// Open nodes until every class in `classes` is placed or can be placed nowhere.
pub(super) fn fill(classes: &mut [Class], pools: &[Pool], offerings: &[Offering], room_of: &dyn Fn(usize, usize) -> Resources, out: &mut Packing) {
    for ci in 0..classes.len() {
        while !classes[ci].pods.is_empty() {
            // Choose the offering with the lowest price per unit of packed lower-bound work, filling
            // the node with this class, then with smaller compatible classes (first fit).
            // (price per unit of work, pool, offering, (class, count) packed)
            type Choice = (f64, usize, usize, Vec<(usize, usize)>);
            let mut best: Option<Choice> = None;
            for &(pi, oi) in &classes[ci].offerings {
                let pool = &pools[pi];
                let o = &offerings[oi];
                if !within_limits(pool, out.used_by(pi), o, 1) {
                    continue;
                }
                let mut free = room_of(pi, oi);
                let mut used_extended: BTreeMap<&str, i64> = BTreeMap::new();
                let mut take = Vec::new();
                let mut work = 0.0;
                // Pods of each spread group already on this candidate node.
                let mut in_group: Vec<(&str, i64)> = Vec::new();
                for (cj, c) in classes.iter().enumerate().skip(ci) {
                    if c.pods.is_empty() || (cj != ci && !c.mask.contains(&(pi, oi))) {
                        continue;
                    }
                    let r = c.requests;
                    let by = |f: i64, need: i64| if need <= 0 { i64::MAX } else { f / need };
                    let group = c.spread_group.as_deref();
                    let already = group.and_then(|g| in_group.iter().find(|(k, _)| *k == g)).map_or(0, |(_, n)| *n);
                    let cap = c.per_node_max.map_or(i64::MAX, |m| m as i64 - already);
                    let n = by(free.cpu_millis, r.cpu_millis).min(by(free.memory_bytes, r.memory_bytes)).min(by(free.pods, r.pods.max(1))).min(extended_count(&c.extended, |k| o.instance.extended_resource(k) - used_extended.get(k).copied().unwrap_or(0))).min(c.pods.len() as i64).min(cap);
                    // Affinity to its own group on the hostname key: all of the class or none.
                    if n <= 0 || (c.colocate && n < c.pods.len() as i64) {
                        continue;
                    }
                    free = free - Resources::new(r.cpu_millis * n, r.memory_bytes * n, r.pods.max(1) * n);
                    for (k, v) in &c.extended {
                        *used_extended.entry(k).or_insert(0) += v * n;
                    }
                    if let Some(g) = group {
                        match in_group.iter_mut().find(|(k, _)| *k == g) {
                            Some(e) => e.1 += n,
                            None => in_group.push((g, n)),
                        }
                    }
                    take.push((cj, n as usize));
                    work += c.lower_bound * n as f64;
                }
                if take.first().is_none_or(|&(cj, _)| cj != ci) || work <= 0.0 {
                    continue;
                }
                let score = o.price / work;
                // Equal cost (within rounding): the lead class's preferred affinity decides.
                let pref = |p: usize, q: usize| classes[ci].preference.get(&(p, q)).copied().unwrap_or(0);
                let better = match &best {
                    None => true,
                    Some((s, bp, bo, _)) => {
                        let tie = (score - *s).abs() <= 1e-9 * s.abs().max(1e-12);
                        (!tie && score < *s) || (tie && (pref(*bp, *bo), std::cmp::Reverse((o.price, pi, oi))) > (pref(pi, oi), std::cmp::Reverse((offerings[*bo].price, *bp, *bo))))
                    }
                };
                if better {
                    best = Some((score, pi, oi, take));
                }
            }
            let Some((_, pi, oi, take)) = best else {
                if fall_through(&mut classes[ci], offerings, room_of) {
                    continue;
                }
                // Affinity to its own replicas on the hostname key, and no node holds them all:
                // the first goes to a node and the next follow it while it has room, as
                // kube-scheduler binds them; the rest can run nowhere.
                if classes[ci].colocate {
                    let c = &classes[ci];
                    let most = c.offerings.iter().filter(|&&(pi, oi)| within_limits(&pools[pi], out.used_by(pi), &offerings[oi], 1)).map(|&(pi, oi)| pods_that_fit(c, room_of(pi, oi), &offerings[oi].instance)).max().unwrap_or(0);
                    if most > 0 && most < c.pods.len() {
                        let pool_name = c.offerings.first().map(|&(pi, _)| pools[pi].name.as_str()).unwrap_or("");
                        let reason = format!("affinity to its own replicas on the hostname key: no instance type of pool {pool_name} holds more than {most} of them");
                        for p in classes[ci].pods.drain(most..) {
                            out.unschedulable.push(Unschedulable { pod: p, reason: reason.clone() });
                        }
                        continue;
                    }
                }
                let c = &classes[ci];
                let pool_name = c.offerings.first().map(|&(pi, _)| pools[pi].name.as_str()).unwrap_or("");
                // Limits aside, could one node hold a colocated class whole?
                let holds_all = || c.offerings.iter().any(|&(pi, oi)| pods_that_fit(c, room_of(pi, oi), &offerings[oi].instance) >= c.pods.len());
                let reason = match c.offerings.first().and_then(|&(pi, _)| pools[pi].closed.as_deref()) {
                    Some(why) => format!("NodePool {pool_name} is not ready: {why}"),
                    None if c.colocate && !holds_all() => format!("affinity to its own replicas on the hostname key: no instance type of pool {pool_name} holds all {} of them", c.pods.len()),
                    None => format!("pool limits reached ({pool_name})"),
                };
                for p in classes[ci].pods.drain(..) {
                    out.unschedulable.push(Unschedulable { pod: p, reason: reason.clone() });
                }
                break;
            };
            // The same choice repeats while every class it takes from has as many pods left (the
            // evaluation would see the same inputs): open those nodes at once.
            let o = &offerings[oi];
            let mut repeat = take.iter().map(|&(cj, n)| classes[cj].pods.len() / n).min().unwrap_or(1).max(1);
            while repeat > 1 && !within_limits(&pools[pi], out.used_by(pi), o, repeat) {
                repeat -= 1;
            }
            for _ in 0..repeat {
                let mut items = Vec::with_capacity(take.len());
                for &(cj, n) in &take {
                    items.push((cj, classes[cj].pods.drain(..n).collect::<Vec<_>>()));
                }
                out.charge(pi, o, 1);
                out.drafts.push(Draft { pi, oi, items });
            }
        }
    }
}
