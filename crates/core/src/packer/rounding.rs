//! The plan from the LP relaxation: its whole patterns kept as nodes, the rest packed greedily,
//! every node right-sized; kept when it is cheaper than the greedy plan.

use std::time::Instant;

use super::relax::{self, Bin, Item, Relaxation};
use super::{greedy, merge, right_size, split, within_limits, Class, Draft, Offering, Packing, Pool, Resources, Slot};

/// The cheapest of the greedy plan and the plans rounded from the relaxation (those that place
/// the most pods; the greedy one on a tie). Candidates past the greedy one are only computed
/// while `deadline` allows. The relaxation's bound is attached when the plan places every pod
/// of `classes`: it is then a lower bound on any plan for them.
pub(super) fn best_packing(classes: Vec<Class>, base: Packing, pools: &[Pool], offerings: &[Offering], room_of: &dyn Fn(usize, usize) -> Resources, deadline: Instant) -> Packing {
    let r = Rounding { pools, offerings, room_of, base };
    if Instant::now() >= deadline {
        // No time at all: the greedy plan as it comes.
        let mut left = classes;
        let mut packing = r.base.clone();
        greedy::fill(&mut left, pools, offerings, room_of, &mut packing);
        right_size(&mut packing.drafts, &left, offerings, room_of);
        return packing;
    }
    let greedy = r.finish(classes.clone(), r.base.clone());
    if Instant::now() >= deadline {
        return greedy;
    }
    let mut input = relaxation_input(&classes, offerings, room_of);
    let Some(first) = relax::solve(&input.items, &input.bins, &[], deadline) else { return greedy };
    // Keep the whole patterns, the rest greedily.
    let mut kept = classes.clone();
    let mut whole = r.base.clone();
    prefill(&mut kept, &first, &input, pools, offerings, &mut whole, false);
    let price = |p: &Packing| p.price(offerings);
    let mut prices = vec![price(&greedy)];
    let mut best = greedy;
    let mut consider = |p: Packing, best: &mut Packing| {
        prices.push(price(&p));
        let better = p.unschedulable.len() < best.unschedulable.len() || (p.unschedulable.len() == best.unschedulable.len() && price(&p) < price(best) * (1.0 - 1e-9));
        if better {
            *best = p;
        }
    };
    // Cheapest first: whole patterns and the rest greedily; the optimum of a small batch;
    // sequential rounding; an integer program over the patterns found, for a bounded time.
    consider(r.finish(kept.clone(), whole.clone()), &mut best);
    let close = |best: &Packing| best.unschedulable.is_empty() && price(best) <= first.bound * (1.0 + CLOSE_ENOUGH);
    if Instant::now() < deadline && !close(&best) {
        if let Some(p) = r.optimal(&classes, &input, deadline) {
            consider(p, &mut best);
        }
    }
    if Instant::now() < deadline && !close(&best) {
        consider(r.sequential(classes.clone(), r.base.clone(), first.clone(), &mut input, deadline), &mut best);
    }
    if Instant::now() < deadline && !close(&best) {
        let until = deadline.min(Instant::now() + INTEGER_TIME);
        consider(r.integral(kept, whole, &first, &input, until), &mut best);
    }
    if Instant::now() < deadline && !close(&best) {
        if let Some(p) = r.polish(&best, &classes, &first, &mut input, deadline) {
            consider(p, &mut best);
        }
    }
    tracing::debug!(candidates = ?prices, bound = first.bound, converged = first.converged, "packing candidates");
    if best.unschedulable.is_empty() && first.bound > 0.0 {
        best.relaxed_bound = Some(first.bound);
    }
    best
}

/// What every rounding shares.
struct Rounding<'a> {
    pools: &'a [Pool],
    offerings: &'a [Offering],
    room_of: &'a dyn Fn(usize, usize) -> Resources,
    base: Packing,
}

impl Rounding<'_> {
    /// The pods left packed greedily, then every node right-sized and pairs merged.
    fn finish(&self, mut classes: Vec<Class>, mut packing: Packing) -> Packing {
        greedy::fill(&mut classes, self.pools, self.offerings, self.room_of, &mut packing);
        right_size(&mut packing.drafts, &classes, self.offerings, self.room_of);
        split::split_nodes(&mut packing.drafts, &classes, self.offerings, self.room_of);
        merge::merge_pairs(&mut packing.drafts, &classes, self.offerings, self.room_of);
        packing
    }

    /// Open `n` nodes of each chosen pattern with the pods of it left.
    fn open_all(&self, classes: &mut [Class], packing: &mut Packing, input: &Input, patterns: &[relax::Pattern], choice: Vec<(usize, u32)>) {
        for (p, n) in choice {
            let col = relax::Column { bin: patterns[p].0, counts: patterns[p].1.clone(), value: f64::from(n) };
            for _ in 0..n {
                open(classes, &col, input, self.pools, self.offerings, packing);
            }
        }
    }

    /// The pods the whole patterns left: an integer program over every pattern found.
    fn integral(&self, mut left: Vec<Class>, mut packing: Packing, first: &Relaxation, input: &Input, deadline: Instant) -> Packing {
        let residual: Vec<Item> = input.items.iter().zip(&input.class_of).map(|(it, &ci)| Item { count: u32::try_from(left[ci].pods.len()).unwrap_or(u32::MAX), ..*it }).collect();
        if let Some(choice) = relax::integer(&residual, &input.bins, &first.patterns, deadline) {
            self.open_all(&mut left, &mut packing, input, &first.patterns, choice);
        }
        self.finish(left, packing)
    }

    /// A small batch: the integer program over every pattern, which is the optimal plan.
    fn optimal(&self, classes: &[Class], input: &Input, deadline: Instant) -> Option<Packing> {
        let all = relax::all_patterns(&input.items, &input.bins, SMALL)?;
        let choice = relax::integer(&input.items, &input.bins, &all, deadline)?;
        let mut left = classes.to_vec();
        let mut packing = self.base.clone();
        self.open_all(&mut left, &mut packing, input, &all, choice);
        Some(self.finish(left, packing))
    }

    /// Sequential rounding from `packing`: keep the whole patterns, else round up one ([`prefill`]
    /// says which); solve the relaxation of the pods left (seeded with the patterns found so far)
    /// and again, while time allows.
    fn sequential(&self, mut classes: Vec<Class>, mut packing: Packing, mut relaxation: Relaxation, input: &mut Input, deadline: Instant) -> Packing {
        while prefill(&mut classes, &relaxation, input, self.pools, self.offerings, &mut packing, true) {
            for (it, &ci) in input.items.iter_mut().zip(&input.class_of) {
                it.count = u32::try_from(classes[ci].pods.len()).unwrap_or(u32::MAX);
            }
            if input.items.iter().all(|it| it.count == 0) || Instant::now() >= deadline {
                break;
            }
            match relax::solve(&input.items, &input.bins, &relaxation.patterns, deadline) {
                Some(next) => relaxation = next,
                None => break,
            }
        }
        self.finish(classes, packing)
    }

    /// `best` with its loosely filled nodes (under [`LOOSE`] of their cpu and of their memory)
    /// planned again: their pods relaxed and rounded as a batch of their own (sequential
    /// rounding, then an integer program over the patterns), the cheaper kept. Only nodes
    /// whose classes are all in the relaxation are taken apart. `None` when fewer than two
    /// nodes are loose or the relaxation fails.
    fn polish(&self, best: &Packing, classes: &[Class], first: &Relaxation, input: &mut Input, deadline: Instant) -> Option<Packing> {
        let in_relaxation: std::collections::HashSet<usize> = input.class_of.iter().copied().collect();
        let mut left: Vec<Class> = classes.iter().map(|c| Class { pods: Vec::new(), ..c.clone() }).collect();
        let mut packing = Packing { drafts: Vec::new(), ..best.clone() };
        let mut loose = 0;
        for d in &best.drafts {
            if d.used(classes).dominant_share((self.room_of)(d.pi, d.oi)) >= LOOSE || !d.items.iter().all(|(c, _)| in_relaxation.contains(c)) {
                packing.drafts.push(d.clone());
                continue;
            }
            loose += 1;
            for (c, pods) in &d.items {
                left[*c].pods.extend(pods.iter().cloned());
            }
            packing.charge(d.pi, &self.offerings[d.oi], -1);
        }
        if loose < 2 {
            return None;
        }
        for (it, &ci) in input.items.iter_mut().zip(&input.class_of) {
            it.count = u32::try_from(left[ci].pods.len()).unwrap_or(u32::MAX);
        }
        let relaxation = relax::solve(&input.items, &input.bins, &first.patterns, deadline)?;
        let until = deadline.min(Instant::now() + INTEGER_TIME);
        let integral = self.integral(left.clone(), packing.clone(), &relaxation, input, until);
        let sequential = self.sequential(left, packing, relaxation, input, deadline);
        let price = |p: &Packing| p.price(self.offerings);
        Some(if price(&integral) < price(&sequential) && integral.unschedulable.len() <= sequential.unschedulable.len() { integral } else { sequential })
    }
}

/// Nodes filled less than this (of cpu and of memory) are planned again by the polish.
const LOOSE: f64 = 0.97;
/// A plan this close to the bound (relatively) is not worth another candidate.
const CLOSE_ENOUGH: f64 = 0.002;
/// The longest the integer program over the patterns found may take (it rarely beats
/// sequential rounding on large batches, where it would need much longer).
const INTEGER_TIME: std::time::Duration = std::time::Duration::from_millis(100);

/// Most patterns a batch may have for the integer program over all of them.
const SMALL: usize = 2_000;

/// The relaxation's items and node kinds, with what they stand for.
struct Input {
    /// One per class, but classes that must share one node (the greedy pass places them whole).
    items: Vec<Item>,
    /// Every (pool, offering) some item may use.
    bins: Vec<Bin>,
    /// The slot of each bin.
    slots: Vec<Slot>,
    /// The class of each item.
    class_of: Vec<usize>,
}

fn relaxation_input(classes: &[Class], offerings: &[Offering], room_of: &dyn Fn(usize, usize) -> Resources) -> Input {
    let mut items = Vec::new();
    let mut item_class = Vec::new();
    // The relaxation's fourth dimension: one extended resource, the one the most pods request
    // (GPUs, mostly). Classes that request another are left to the greedy pass, as below.
    let mut asked: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for c in classes {
        for k in c.extended.keys() {
            *asked.entry(k.as_str()).or_insert(0) += c.pods.len();
        }
    }
    let extended: Option<&str> = asked.iter().max_by_key(|(k, n)| (**n, std::cmp::Reverse(**k))).map(|(k, _)| *k);
    for (ci, c) in classes.iter().enumerate() {
        // Classes with hostname rules (spread over nodes, anti-affinity or affinity to their own
        // group) are left to the greedy pass: kube-scheduler's hostname spread is a skew over
        // every node, not a per-node cap, and plans rounded from per-node caps sent the
        // planner's check into rounds of repacking (20,000 Karpenter-shaped pods: 22 s).
        // The bound over the other classes is still a bound for the whole batch.
        if c.colocate || c.per_node_max.is_some() || c.pods.is_empty() || c.extended.keys().any(|k| Some(k.as_str()) != extended) {
            continue;
        }
        let r = c.requests;
        let ext = extended.and_then(|k| c.extended.get(k)).copied().unwrap_or(0);
        items.push(Item { count: u32::try_from(c.pods.len()).unwrap_or(u32::MAX), need: [r.cpu_millis, r.memory_bytes, r.pods.max(1), ext] });
        item_class.push(ci);
    }
    let mut slots: Vec<Slot> = item_class.iter().flat_map(|&ci| classes[ci].mask.iter().copied()).collect();
    slots.sort_unstable();
    slots.dedup();
    let bins = slots
        .iter()
        .map(|&(pi, oi)| {
            let room = room_of(pi, oi);
            let o = &offerings[oi];
            let holds = item_class.iter().enumerate().filter(|(_, &ci)| classes[ci].mask.contains(&(pi, oi))).map(|(i, _)| i).collect();
            Bin { price: o.price, room: [room.cpu_millis, room.memory_bytes, room.pods, extended.map_or(0, |k| o.instance.extended_resource(k))], items: holds }
        })
        .collect();
    Input { items, bins, slots, class_of: item_class }
}

/// Open the relaxation's whole patterns as nodes (most used first), as long as their pool's
/// limits and the pods left allow; when none is whole and `round_up`, one node of one pattern
/// (its pods as far as they are left): of those used at least half, else of all, the one whose
/// rounding up adds the least price (rounding up a big node little used leaves it mostly empty).
/// False when no node could be opened.
fn prefill(classes: &mut [Class], r: &Relaxation, input: &Input, pools: &[Pool], offerings: &[Offering], out: &mut Packing, round_up: bool) -> bool {
    let mut columns: Vec<&relax::Column> = r.columns.iter().collect();
    columns.sort_by(|a, b| b.value.total_cmp(&a.value).then(a.bin.cmp(&b.bin)));
    let whole = columns.iter().any(|c| c.value >= 1.0 - 1e-6) || !round_up;
    if !whole {
        let extra = |c: &relax::Column| (1.0 - c.value) * input.bins[c.bin].price;
        columns.sort_by(|a, b| (a.value < 0.5).cmp(&(b.value < 0.5)).then(extra(a).total_cmp(&extra(b))).then(a.bin.cmp(&b.bin)));
    }
    let mut opened = false;
    for col in columns {
        // Nothing whole: round up the first pattern alone.
        let copies = match whole {
            true => (col.value + 1e-6).floor() as usize,
            false if !opened => 1,
            false => 0,
        };
        for _ in 0..copies {
            if !open(classes, col, input, pools, offerings, out) {
                break;
            }
            opened = true;
        }
    }
    opened
}

/// Open one node of `col`'s pattern with the pods of it that are left. False when its pool's
/// limits or the pods left do not allow it.
fn open(classes: &mut [Class], col: &relax::Column, input: &Input, pools: &[Pool], offerings: &[Offering], out: &mut Packing) -> bool {
    let (pi, oi) = input.slots[col.bin];
    let o = &offerings[oi];
    if !within_limits(&pools[pi], out.used_by(pi), o, 1) {
        return false;
    }
    let mut items = Vec::new();
    for &(i, k) in &col.counts {
        let ci = input.class_of[i];
        let n = (k as usize).min(classes[ci].pods.len());
        if n > 0 {
            items.push((ci, classes[ci].pods.drain(..n).collect::<Vec<_>>()));
        }
    }
    if items.is_empty() {
        return false;
    }
    out.charge(pi, o, 1);
    out.drafts.push(Draft { pi, oi, items });
    true
}
