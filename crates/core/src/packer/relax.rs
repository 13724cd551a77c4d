//! The LP relaxation of the packing problem, solved by column generation: the lower bound no plan
//! can beat, and the fractional plan that reaches it.
//!
//! A pattern is one node kind (pool, offering) with how many pods of each class it holds. The
//! master LP chooses how many of each pattern to buy (fractionally) so that every class is
//! covered, at the least total price. Column generation starts from one pattern per class and
//! adds, while any exists, a pattern whose value at the current dual prices exceeds its price
//! ([`super::knapsack`] finds it, per node kind). Its dual is solved here with `microlp` (the
//! dual prices are its variables; each pattern adds one row, re-solved from the last basis).
//!
//! The bound is valid whenever it is returned, not only at convergence: for any dual prices `y`
//! and `theta` = the largest ratio of a pattern's value at `y` to its price (proven by the
//! knapsack's upper bounds over every node kind), `y / theta` is dual feasible, so `b·y / theta`
//! is at most the LP optimum and so at most the price of any plan (weak duality). Solver
//! round-off can only weaken it.

use std::time::Instant;

use microlp::{ComparisonOp, OptimizationDirection, Problem};

use super::knapsack::{best_mix, Entry, DIMS, NODE_BUDGET};

/// A class of identical pods, for the relaxation.
#[derive(Clone, Copy)]
pub(super) struct Item {
    pub count: u32,
    /// What one pod takes: cpu millis, memory bytes, pod slots, GPUs.
    pub need: [i64; DIMS],
}

/// A kind of node.
pub(super) struct Bin {
    pub price: f64,
    /// Room for pods: cpu millis, memory bytes, pod slots, GPUs.
    pub room: [i64; DIMS],
    /// The items it may hold.
    pub items: Vec<usize>,
}

/// A pattern with its value in the LP's solution.
#[derive(Debug, Clone)]
pub(super) struct Column {
    pub bin: usize,
    pub counts: Vec<(usize, u32)>,
    pub value: f64,
}

#[derive(Debug, Clone)]
pub(super) struct Relaxation {
    /// No plan that places every item costs less.
    pub bound: f64,
    /// Column generation ended with no improving pattern (else the deadline stopped it).
    pub converged: bool,
    /// The master LP's solution over the patterns generated (nonzero values only).
    pub columns: Vec<Column>,
    /// Every pattern generated, to seed the next solve.
    pub patterns: Vec<Pattern>,
}

/// Most patterns added per round (the best of each node kind, best first).
const PATTERNS_PER_ROUND: usize = 40;
/// Bins searched per pricing round (the most promising by their fractional bound).
const SEARCHED_PER_ROUND: usize = 48;
/// Search nodes times items per knapsack search, at most (a node's bound reads every item).
const WORK_PER_SEARCH: usize = 400_000;
/// Relative margin a pattern's value must beat its price by to be added.
const IMPROVES: f64 = 1e-7;

/// A pattern: a bin (its index in the caller's list) and how many of each item it holds.
pub(super) type Pattern = (usize, Vec<(usize, u32)>);

/// The relaxation of packing `items` onto `bins`, within `deadline`, starting from the patterns
/// of `seed` (an earlier solve's, for the same bins) and one per item. `None` when an item with
/// pods left fits no bin (no plan places every item) or the solver fails.
pub(super) fn solve(items: &[Item], bins: &[Bin], seed: &[Pattern], deadline: Instant) -> Option<Relaxation> {
    if items.iter().all(|it| it.count == 0) {
        return Some(Relaxation { bound: 0.0, converged: true, columns: Vec::new(), patterns: seed.to_vec() });
    }
    let kept = screened(items, bins);
    let position: std::collections::HashMap<usize, usize> = kept.iter().enumerate().map(|(i, &b)| (b, i)).collect();
    let bins: Vec<&Bin> = kept.iter().map(|&b| &bins[b]).collect();
    let mut patterns: Vec<Pattern> = seed.iter().filter_map(|(b, counts)| Some((*position.get(b)?, counts.clone()))).collect();
    for (i, it) in items.iter().enumerate() {
        if it.count > 0 {
            patterns.push(cheapest_single(items, &bins, i)?);
        }
    }
    let mut problem = Problem::new(OptimizationDirection::Maximize);
    // Items with no pods left price at zero.
    let y: Vec<microlp::Variable> = items.iter().map(|it| problem.add_var(f64::from(it.count), (0.0, if it.count > 0 { f64::INFINITY } else { 0.0 }))).collect();
    for (b, counts) in &patterns {
        problem.add_constraint(counts.iter().map(|&(i, k)| (y[i], f64::from(k))).collect::<Vec<_>>(), ComparisonOp::Le, bins[*b].price);
    }
    let mut solution = problem.solve().ok()?.into_solution().ok()?;
    let mut best_bound = 0.0f64;
    let mut converged = false;
    loop {
        let duals: Vec<f64> = y.iter().map(|&v| solution.var_value(v).max(0.0)).collect();
        let dual_value: f64 = duals.iter().zip(items).map(|(d, it)| d * f64::from(it.count)).sum();
        let (mut theta, found) = price(items, &bins, &duals, NODE_BUDGET, deadline);
        if found.is_empty() && theta.is_finite() && theta > 1.0 + 1e-6 {
            // Nothing improves, but some searches were cut short: prove it with a longer search.
            theta = theta.min(price(items, &bins, &duals, 16 * NODE_BUDGET, deadline).0);
        }
        best_bound = best_bound.max(dual_value / theta.max(1.0));
        if found.is_empty() {
            converged = theta.is_finite();
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
        for (b, counts) in found {
            let row: Vec<(microlp::Variable, f64)> = counts.iter().map(|&(i, k)| (y[i], f64::from(k))).collect();
            solution = solution.add_constraint(row, ComparisonOp::Le, bins[b].price).ok()?.into_solution().ok()?;
            patterns.push((b, counts));
        }
    }
    let mut columns = primal(items, &bins, &patterns).unwrap_or_default();
    for c in &mut columns {
        c.bin = kept[c.bin];
    }
    let patterns = patterns.into_iter().map(|(b, counts)| (kept[b], counts)).collect();
    Some(Relaxation { bound: best_bound, converged, columns, patterns })
}

/// Node kinds worth pricing (indices into `bins`): of kinds that hold the same items, those no
/// cheaper (or equal) kind with at least as much useful room of every kind dominates. Useful
/// room is the room up to what all the items' pods together need: past that, a bigger node
/// holds no more (so of the kinds that could hold every pod, only the cheapest counts).
fn screened(items: &[Item], bins: &[Bin]) -> Vec<usize> {
    let mut by_items: std::collections::BTreeMap<&[usize], Vec<usize>> = std::collections::BTreeMap::new();
    for (i, b) in bins.iter().enumerate().filter(|(_, b)| !b.items.is_empty() && b.price > 0.0) {
        by_items.entry(b.items.as_slice()).or_default().push(i);
    }
    let mut out = Vec::new();
    for (members, mut group) in by_items {
        let mut demand = [0i64; DIMS];
        for &i in members {
            for (d, n) in demand.iter_mut().zip(&items[i].need) {
                *d = d.saturating_add(n.saturating_mul(i64::from(items[i].count)));
            }
        }
        let useful = |b: usize| -> [i64; DIMS] { std::array::from_fn(|d| bins[b].room[d].min(demand[d])) };
        group.sort_by(|&a, &b| bins[a].price.total_cmp(&bins[b].price).then_with(|| useful(b).cmp(&useful(a))).then(a.cmp(&b)));
        let mut kept: Vec<usize> = Vec::new();
        for b in group {
            let room = useful(b);
            let dominated = kept.iter().any(|&k| bins[k].price <= bins[b].price && useful(k).iter().zip(&room).all(|(x, y)| x >= y));
            if !dominated {
                kept.push(b);
            }
        }
        out.extend(kept);
    }
    out
}

/// How many pods of `item` fit on an empty `bin`.
fn fits_alone(item: &Item, bin: &Bin) -> u32 {
    let n = item.need.iter().zip(&bin.room).filter(|(n, _)| **n > 0).map(|(n, r)| r / n).min().unwrap_or(i64::MAX);
    u32::try_from(n.max(0)).unwrap_or(u32::MAX).min(item.count)
}

/// The starting pattern of item `i`: the bin with the lowest price per pod, filled with it alone.
fn cheapest_single(items: &[Item], bins: &[&Bin], i: usize) -> Option<Pattern> {
    bins.iter()
        .enumerate()
        .filter(|(_, b)| b.items.contains(&i))
        .filter_map(|(bi, b)| {
            let k = fits_alone(&items[i], b);
            (k > 0).then(|| (b.price / f64::from(k), bi, k))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
        .map(|(_, bi, k)| (bi, vec![(i, k)]))
}

/// At dual prices `duals`: the largest proven ratio of a pattern's value to its price over every
/// bin (at least 1 when the duals are feasible for the patterns so far; infinite when the
/// deadline stopped the pricing before every bin), and the improving patterns found, best first.
/// Partial pricing: every bin's fractional bound first (cheap), then a search, held to `budget`
/// nodes (fewer when it has many items), in the [`SEARCHED_PER_ROUND`] bins whose bound promises
/// most, and beyond them only until an improving pattern is found; the others' ratio is their
/// bound.
fn price(items: &[Item], bins: &[&Bin], duals: &[f64], budget: usize, deadline: Instant) -> (f64, Vec<Pattern>) {
    let mut knapsacks = Vec::with_capacity(bins.len());
    for b in bins {
        if Instant::now() >= deadline {
            return (f64::INFINITY, Vec::new());
        }
        let entries = knapsack_of(items, b, duals);
        let ratio = super::knapsack::upper_bound(&entries, &b.room) / b.price;
        knapsacks.push((ratio, entries));
    }
    let mut order: Vec<usize> = (0..bins.len()).collect();
    order.sort_by(|&a, &b| knapsacks[b].0.total_cmp(&knapsacks[a].0).then(a.cmp(&b)));
    let mut theta = 0.0f64;
    // (value per unit of price, bin, pattern counts)
    let mut found: Vec<(f64, Pattern)> = Vec::new();
    for (rank, &bi) in order.iter().enumerate() {
        let (ratio, entries) = &knapsacks[bi];
        // Past the first bins, search on only while nothing improving has been found.
        if (rank >= SEARCHED_PER_ROUND && !found.is_empty()) || *ratio <= 1.0 + IMPROVES {
            theta = theta.max(*ratio);
            continue;
        }
        if Instant::now() >= deadline {
            return (f64::INFINITY, found_patterns(found));
        }
        let b = bins[bi];
        let answer = best_mix(entries, &b.room, b.price, budget.min(WORK_PER_SEARCH / entries.len().max(1)).max(64));
        theta = theta.max(answer.upper / b.price);
        if answer.value > b.price * (1.0 + IMPROVES) {
            let counts = answer.mix.into_iter().map(|(e, k)| (b.items[e], k)).collect();
            found.push((answer.value / b.price, (bi, counts)));
        }
    }
    (theta, found_patterns(found))
}

/// The best [`PATTERNS_PER_ROUND`] of `found`, best first.
fn found_patterns(mut found: Vec<(f64, Pattern)>) -> Vec<Pattern> {
    found.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1 .0.cmp(&b.1 .0)));
    found.truncate(PATTERNS_PER_ROUND);
    found.into_iter().map(|(_, p)| p).collect()
}

/// The pricing knapsack of bin `b` at `duals`: its items' needs and counts, at their prices.
fn knapsack_of(items: &[Item], b: &Bin, duals: &[f64]) -> Vec<Entry> {
    b.items.iter().map(|&i| Entry { need: items[i].need, most: items[i].count, value: duals[i] }).collect()
}

/// The master LP over `patterns`: how many of each to buy, at the least price covering every
/// item (a vertex: few patterns nonzero, which rounding keeps whole).
fn primal(items: &[Item], bins: &[&Bin], patterns: &[Pattern]) -> Option<Vec<Column>> {
    let mut problem = Problem::new(OptimizationDirection::Minimize);
    let x: Vec<microlp::Variable> = patterns.iter().map(|(b, _)| problem.add_var(bins[*b].price, (0.0, f64::INFINITY))).collect();
    for (i, it) in items.iter().enumerate().filter(|(_, it)| it.count > 0) {
        let row: Vec<(microlp::Variable, f64)> = patterns.iter().zip(&x).filter_map(|((_, counts), &v)| counts.iter().find(|(ci, _)| *ci == i).map(|&(_, k)| (v, f64::from(k)))).collect();
        problem.add_constraint(row, ComparisonOp::Ge, f64::from(it.count));
    }
    let solution = problem.solve().ok()?.into_solution().ok()?;
    Some(
        patterns
            .iter()
            .zip(&x)
            .filter_map(|((b, counts), &v)| {
                let value = solution.var_value(v);
                (value > 1e-9).then(|| Column { bin: *b, counts: counts.clone(), value })
            })
            .collect(),
    )
}

/// The best whole number of nodes of each of `patterns` (an earlier solve's) covering `items`,
/// by `microlp`'s branch and bound within `deadline`: (pattern index, nodes). `None` when it
/// finds no covering in time.
pub(super) fn integer(items: &[Item], bins: &[Bin], patterns: &[Pattern], deadline: Instant) -> Option<Vec<(usize, u32)>> {
    let left = deadline.checked_duration_since(Instant::now())?;
    let mut problem = Problem::new(OptimizationDirection::Minimize);
    problem.set_time_limit(left);
    // Patterns that cover some item with pods left, each at most as often as that can be useful.
    let useful: Vec<(usize, i32)> = patterns
        .iter()
        .enumerate()
        .filter_map(|(p, (_, counts))| {
            let most = counts.iter().filter(|&&(i, k)| k > 0 && items[i].count > 0).map(|&(i, k)| items[i].count.div_ceil(k)).max()?;
            Some((p, i32::try_from(most).unwrap_or(i32::MAX)))
        })
        .collect();
    let x: Vec<microlp::Variable> = useful.iter().map(|&(p, most)| problem.add_integer_var(bins[patterns[p].0].price, (0, most))).collect();
    for (i, it) in items.iter().enumerate().filter(|(_, it)| it.count > 0) {
        let row: Vec<(microlp::Variable, f64)> = useful.iter().zip(&x).filter_map(|(&(p, _), &v)| patterns[p].1.iter().find(|(ci, _)| *ci == i).map(|&(_, k)| (v, f64::from(k)))).collect();
        if row.is_empty() {
            return None;
        }
        problem.add_constraint(row, ComparisonOp::Ge, f64::from(it.count));
    }
    let solution = problem.solve().ok()?.into_solution().ok()?;
    Some(useful.iter().zip(&x).filter_map(|(&(p, _), &v)| {
        let n = solution.var_value(v).round();
        (n >= 1.0).then_some((p, n as u32))
    }).collect())
}

/// Every pattern of the node kinds worth pricing, when there are at most `limit` of them (small
/// batches): the integer program over all of them finds the optimal plan.
pub(super) fn all_patterns(items: &[Item], bins: &[Bin], limit: usize) -> Option<Vec<Pattern>> {
    let mut e = Enumeration { items, limit, bin: 0, counts: Vec::new(), out: Vec::new() };
    for b in screened(items, bins) {
        e.bin = b;
        if !e.go(&bins[b], 0, bins[b].room) {
            return None;
        }
    }
    Some(e.out)
}

/// The patterns of one bin after another, depth first over its items.
struct Enumeration<'a> {
    items: &'a [Item],
    limit: usize,
    bin: usize,
    counts: Vec<(usize, u32)>,
    out: Vec<Pattern>,
}

impl Enumeration<'_> {
    /// False once there are more than `limit` patterns.
    fn go(&mut self, bin: &Bin, at: usize, left: [i64; DIMS]) -> bool {
        if at == bin.items.len() {
            if !self.counts.is_empty() {
                self.out.push((self.bin, self.counts.clone()));
            }
            return self.out.len() <= self.limit;
        }
        let i = bin.items[at];
        let it = self.items[i];
        let fit = it.need.iter().zip(&left).filter(|(n, _)| **n > 0).map(|(n, l)| l / n).min().unwrap_or(i64::MAX);
        let most = u32::try_from(fit.max(0)).unwrap_or(u32::MAX).min(it.count);
        for k in 0..=most {
            let mut l = left;
            for (x, n) in l.iter_mut().zip(&it.need) {
                *x -= n * i64::from(k);
            }
            if k > 0 {
                self.counts.push((i, k));
            }
            let ok = self.go(bin, at + 1, l);
            if k > 0 {
                self.counts.pop();
            }
            if !ok {
                return false;
            }
        }
        true
    }
}
