//! The pricing problem of column generation: the most valuable mix of pods one node holds.
//!
//! A bounded knapsack in four dimensions (cpu, memory, pod slots, GPUs), solved exactly by
//! depth-first branch and bound when it finishes within a node budget. Whatever happens,
//! [`Answer::upper`] is a proven upper bound on the best mix's value (when the search is cut
//! short, the largest bound of the subtrees it left unexplored), which is what keeps the
//! relaxation's lower bound valid.

/// Dimensions of a pod's needs and a node's room: cpu millis, memory bytes, pod slots, one
/// extended resource (GPUs, mostly).
pub(super) const DIMS: usize = 4;

/// One kind of pod that may go on the node.
pub(super) struct Entry {
    /// What one pod takes, per dimension.
    pub need: [i64; DIMS],
    /// How many of them there are at most (pods left).
    pub most: u32,
    /// Its value (the dual price of its class).
    pub value: f64,
}

/// The best mix found and what no mix can beat.
pub(super) struct Answer {
    /// The best mix found: (entry index, count).
    pub mix: Vec<(usize, u32)>,
    pub value: f64,
    /// A proven upper bound on any mix's value (equal to `value` when the search finished).
    pub upper: f64,
}

/// Search nodes per call before the search settles for its best mix and the unexplored
/// subtrees' bound.
pub(super) const NODE_BUDGET: usize = 4_000;

/// What no mix of `entries` within `room` can be worth more than: the root bound of
/// [`best_mix`]'s search, without the search.
pub(super) fn upper_bound(entries: &[Entry], room: &[i64; DIMS]) -> f64 {
    let live = live(entries, room);
    bound_weights(entries, &live, room).iter().map(|w| fractional(entries, &live, room, w)).fold(f64::INFINITY, f64::min)
}

/// The most valuable mix of `entries` within `room` worth more than `floor` (a node's price:
/// cheaper mixes do not matter, which lets the search prune early).
pub(super) fn best_mix(entries: &[Entry], room: &[i64; DIMS], floor: f64, budget: usize) -> Answer {
    let live = live(entries, room);
    let weights = bound_weights(entries, &live, room);
    // Densest first by the strongest combined weighing.
    let mut order = live;
    let per_unit = |i: usize| entries[i].value / weighed(&entries[i].need, &weights[0]).max(1e-12);
    order.sort_by(|&a, &b| per_unit(b).total_cmp(&per_unit(a)).then(a.cmp(&b)));
    let lists = weights.iter().map(|w| Weighing::new(entries, &order, w)).collect();
    let mut s = Search { entries, order: &order, best: floor.max(0.0), best_mix: None, mix: Vec::new(), nodes: 0, budget, lists, left_over: 0.0 };
    let root = s.bound(0, room);
    if root <= s.best {
        return Answer { mix: Vec::new(), value: 0.0, upper: root };
    }
    s.dive(0, *room, 0.0);
    // Cut short: nothing beats the best found or the bound of a subtree left unexplored.
    let upper = if s.nodes < budget { s.best } else { s.best.max(s.left_over).min(root) };
    match s.best_mix {
        Some(mix) => Answer { mix, value: s.best, upper },
        None => Answer { mix: Vec::new(), value: 0.0, upper: if s.nodes < budget { floor.max(0.0) } else { upper } },
    }
}

/// Entries that earn something and fit alone.
fn live(entries: &[Entry], room: &[i64; DIMS]) -> Vec<usize> {
    (0..entries.len()).filter(|&i| entries[i].value > 0.0 && entries[i].most > 0 && fits_once(&entries[i].need, room)).collect()
}

/// Does one pod with these needs fit in `room`?
fn fits_once(need: &[i64; DIMS], room: &[i64; DIMS]) -> bool {
    need.iter().zip(room).all(|(n, r)| n <= r)
}

/// `need` weighed by `w`.
fn weighed(need: &[i64; DIMS], w: &[f64; DIMS]) -> f64 {
    need.iter().zip(w).map(|(&n, &x)| n as f64 * x).sum()
}

/// Weighings of the dimensions whose one-constraint fractional knapsacks bound the mix (each is
/// a surrogate relaxation, valid for any non-negative weights): first cpu and memory combined
/// with the weight that bounds tightest (the two usually conflict; the best combination gives the
/// LP relaxation's bound on them), then every dimension alone that some entry needs (one no
/// entry needs bounds nothing).
fn bound_weights(entries: &[Entry], live: &[usize], room: &[i64; DIMS]) -> Vec<[f64; DIMS]> {
    let unit = |d: usize| if room[d] > 0 { 1.0 / room[d] as f64 } else { 0.0 };
    let mix = |t: f64| [t * unit(0), (1.0 - t) * unit(1), 0.0, 0.0];
    let value = |w: &[f64; DIMS]| fractional(entries, live, room, w);
    // The bound is quasi-convex in t: golden-section search.
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    let g = 0.618_033_988_75;
    for _ in 0..18 {
        let (a, b) = (hi - g * (hi - lo), lo + g * (hi - lo));
        if value(&mix(a)) <= value(&mix(b)) {
            hi = b;
        } else {
            lo = a;
        }
    }
    let mut out = vec![mix((lo + hi) / 2.0)];
    for d in (0..DIMS).filter(|&d| live.iter().any(|&i| entries[i].need[d] > 0)) {
        let mut w = [0.0; DIMS];
        w[d] = 1.0;
        out.push(w);
    }
    out
}

/// The fractional knapsack of `live` entries on one combined dimension (weights `w`).
fn fractional(entries: &[Entry], live: &[usize], room: &[i64; DIMS], w: &[f64; DIMS]) -> f64 {
    let mut order: Vec<(f64, f64, f64)> = live.iter().map(|&i| (weighed(&entries[i].need, w), entries[i].value, f64::from(entries[i].most))).collect();
    order.sort_by(|a, b| (b.1 * a.0).total_cmp(&(a.1 * b.0)));
    fill(order.into_iter(), weighed(room, w))
}

/// Take (size, value, most) entries in the order given into `left` room, fractionally.
fn fill(entries: impl Iterator<Item = (f64, f64, f64)>, mut left: f64) -> f64 {
    let mut total = 0.0;
    for (size, value, most) in entries {
        if size <= 0.0 {
            total += value * most;
            continue;
        }
        if left <= 0.0 {
            break;
        }
        let take = (left / size).min(most);
        total += value * take;
        left -= take * size;
    }
    total
}

/// One weighing with the search's entries sorted by value per unit of weighed size (free pods
/// first), sizes computed once: (position in the search order, size, value, most).
struct Weighing {
    w: [f64; DIMS],
    sorted: Vec<(usize, f64, f64, f64)>,
}

impl Weighing {
    fn new(entries: &[Entry], order: &[usize], w: &[f64; DIMS]) -> Self {
        let mut sorted: Vec<(usize, f64, f64, f64)> = order.iter().enumerate().map(|(p, &i)| (p, weighed(&entries[i].need, w), entries[i].value, f64::from(entries[i].most))).collect();
        let ratio = |x: &(usize, f64, f64, f64)| if x.1 <= 0.0 { f64::INFINITY } else { x.2 / x.1 };
        sorted.sort_by(|a, b| ratio(b).total_cmp(&ratio(a)).then(a.0.cmp(&b.0)));
        Weighing { w: *w, sorted }
    }

    /// The fractional knapsack of the entries from position `from` on within `room`.
    fn bound(&self, from: usize, room: &[i64; DIMS]) -> f64 {
        fill(self.sorted.iter().filter(|x| x.0 >= from).map(|&(_, size, value, most)| (size, value, most)), weighed(room, &self.w))
    }
}

struct Search<'a> {
    entries: &'a [Entry],
    order: &'a [usize],
    best: f64,
    best_mix: Option<Vec<(usize, u32)>>,
    mix: Vec<(usize, u32)>,
    nodes: usize,
    budget: usize,
    lists: Vec<Weighing>,
    /// Once the budget ran out: the largest bound of a subtree left unexplored.
    left_over: f64,
}

impl Search<'_> {
    /// What the pods from position `from` on can add within `room`: the least of the
    /// fractional knapsacks of every weighing.
    fn bound(&self, from: usize, room: &[i64; DIMS]) -> f64 {
        self.lists.iter().map(|l| l.bound(from, room)).fold(f64::INFINITY, f64::min)
    }

    fn dive(&mut self, at: usize, room: [i64; DIMS], value: f64) {
        self.nodes += 1;
        if value > self.best {
            self.best = value;
            self.best_mix = Some(self.mix.clone());
        }
        if at == self.order.len() {
            return;
        }
        if self.nodes >= self.budget {
            self.left_over = self.left_over.max(value + self.bound(at, &room));
            return;
        }
        if value + self.bound(at, &room) <= self.best * (1.0 + 1e-12) {
            return;
        }
        let i = self.order[at];
        let e = &self.entries[i];
        let most = e.need.iter().zip(&room).filter(|(n, _)| **n > 0).map(|(n, r)| r / n).min().unwrap_or(i64::MAX).min(i64::from(e.most)).max(0);
        let child = |k: i64| {
            let mut left = room;
            for (l, n) in left.iter_mut().zip(&e.need) {
                *l -= n * k;
            }
            left
        };
        for k in (0..=most).rev() {
            if self.nodes >= self.budget {
                // The siblings not tried: their subtrees' bound (the first is the largest in
                // count of this entry, not always in bound, so each is read).
                for j in (0..=k).rev() {
                    let left = child(j);
                    self.left_over = self.left_over.max(value + e.value * j as f64 + self.bound(at + 1, &left));
                }
                return;
            }
            if k > 0 {
                self.mix.push((i, k as u32));
            }
            self.dive(at + 1, child(k), value + e.value * k as f64);
            if k > 0 {
                self.mix.pop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(need: &[i64], most: u32, value: f64) -> Entry {
        let mut n = [0; DIMS];
        n[..need.len()].copy_from_slice(need);
        Entry { need: n, most, value }
    }

    /// Every mix by enumeration (small instances).
    fn brute(entries: &[Entry], room: &[i64; DIMS]) -> f64 {
        fn go(entries: &[Entry], at: usize, room: Vec<i64>) -> f64 {
            if at == entries.len() {
                return 0.0;
            }
            let mut best = 0.0f64;
            for k in 0..=entries[at].most as i64 {
                let left: Vec<i64> = room.iter().zip(&entries[at].need).map(|(r, n)| r - n * k).collect();
                if left.iter().any(|&l| l < 0) {
                    break;
                }
                best = best.max(entries[at].value * k as f64 + go(entries, at + 1, left));
            }
            best
        }
        go(entries, 0, room.to_vec())
    }

    #[test]
    fn the_search_finds_the_best_mix_and_bounds_it() {
        // Two dimensions pulling apart: the greedy by density is not optimal here.
        let entries = vec![entry(&[3, 1], 4, 5.0), entry(&[1, 3], 4, 5.0), entry(&[2, 2], 4, 4.5), entry(&[0, 0], 2, 0.5)];
        for room in [[6, 6, 0, 0], [7, 5, 0, 0], [10, 2, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]] {
            let a = best_mix(&entries, &room, 0.0, NODE_BUDGET);
            let exact = brute(&entries, &room);
            assert!((a.value - exact).abs() < 1e-9, "room {room:?}: found {} of {exact}", a.value);
            assert!(a.upper + 1e-9 >= exact);
            // The mix is what it says and fits.
            let used: Vec<i64> = (0..2).map(|d| a.mix.iter().map(|&(i, k)| entries[i].need[d] * i64::from(k)).sum()).collect();
            assert!(used.iter().zip(&room).all(|(u, r)| u <= r), "{used:?} in {room:?}");
            let v: f64 = a.mix.iter().map(|&(i, k)| entries[i].value * f64::from(k)).sum();
            assert!((v - a.value).abs() < 1e-9);
            assert!(a.mix.iter().all(|&(i, k)| k <= entries[i].most));
        }
    }

    #[test]
    fn a_search_cut_short_still_bounds_the_best_mix() {
        // Many interchangeable kinds: more nodes than the budget.
        let entries: Vec<Entry> = (0..40).map(|i| entry(&[7 + i % 5, 11 + i % 7, 1], 3, 1.0 + f64::from(i as u32 % 9) * 0.01)).collect();
        let room = [200, 230, 30, 0];
        let a = best_mix(&entries, &room, 0.0, NODE_BUDGET);
        assert!(a.upper + 1e-9 >= a.value);
        // No mix beats the fractional bound on the pod-slot dimension alone (30 x the best value).
        assert!(a.upper <= 30.0 * 1.08 + 1e-9, "{}", a.upper);
        assert!(a.value > 0.0);
    }
}
