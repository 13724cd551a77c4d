//! Scoring nodes by what running one pod there costs.
//!
//! cost = node price per hour x the share of the node the pod takes (the larger of its CPU and
//! memory shares of allocatable). The namespace's architecture preference discounts the cost of
//! preferred nodes a little, so it wins between nodes of near-equal cost. Costs are scaled to
//! 0..=10 across the candidates (cheapest 10); a node without a known price or allocatable gets
//! the neutral middle score.

use super::policy::Policy;
use super::resources::Resources;

pub const MAX_SCORE: i64 = 10;
const NEUTRAL_SCORE: i64 = 5;

#[derive(Debug, Clone)]
pub struct Candidate {
    pub name: String,
    pub arch: Option<String>,
    /// USD per hour, when known.
    pub price: Option<f64>,
    pub allocatable: Resources,
}

/// The cost of running `pod` on `c`, before preference; `None` when it cannot be known.
pub(crate) fn cost(pod: Resources, c: &Candidate) -> Option<f64> {
    let price = c.price.filter(|p| p.is_finite() && *p >= 0.0)?;
    let share = pod.dominant_share(c.allocatable);
    let cost = price * share;
    // A huge price times a share above 1 overflows to infinity: that cost is not known either.
    (share.is_finite() && cost.is_finite()).then_some(cost)
}

/// Fraction taken off a node's cost for the namespace's preference: `bonus` for the most
/// preferred architecture, decreasing linearly down the list, nothing for unlisted ones.
fn preference_discount(policy: &Policy, arch: Option<&str>, bonus: f64) -> f64 {
    let n = policy.prefer.len();
    match arch {
        Some(a) if n > 0 => {
            let rank = policy.preference_rank(a);
            if rank >= n {
                0.0
            } else {
                bonus * (n - rank) as f64 / n as f64
            }
        }
        _ => 0.0,
    }
}

/// Scores 0..=10 in the order of `candidates` (kube-scheduler's MaxExtenderPriority), whatever
/// the input. Deterministic: equal inputs give equal scores.
pub fn score(pod: Resources, candidates: &[Candidate], policy: &Policy, bonus: f64) -> Vec<i64> {
    let bonus = if bonus.is_finite() { bonus.clamp(0.0, 0.5) } else { 0.0 };
    let effective: Vec<Option<f64>> = candidates
        .iter()
        .map(|c| cost(pod, c).map(|k| k * (1.0 - preference_discount(policy, c.arch.as_deref(), bonus))).filter(|k| k.is_finite()))
        .collect();
    let known = effective.iter().flatten();
    let (min, max) = known.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &k| (lo.min(k), hi.max(k)));
    effective
        .iter()
        .map(|k| match k {
            None => NEUTRAL_SCORE,
            Some(_) if max - min <= f64::EPSILON * max.abs().max(1.0) => MAX_SCORE,
            Some(k) => {
                // (max - k) / (max - min) without overflowing when the costs span f64's range.
                let s = MAX_SCORE as f64 * ((max / 2.0 - k / 2.0) / (max / 2.0 - min / 2.0));
                if s.is_finite() { (s.round() as i64).clamp(0, MAX_SCORE) } else { NEUTRAL_SCORE }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{resolve, PolicyDefaults};
    use crate::quantity::MIB;

    fn cand(name: &str, arch: &str, price: Option<f64>, cpu: i64, mem_mib: i64) -> Candidate {
        Candidate { name: name.into(), arch: Some(arch.into()), price, allocatable: Resources::new(cpu, mem_mib * MIB, 29) }
    }

    fn policy() -> Policy {
        resolve(&PolicyDefaults::default(), &Default::default()).0
    }

    #[test]
    fn cheaper_cost_per_pod_scores_higher() {
        let pod = Resources::new(500, 512 * MIB, 1);
        // m7g.large vs m6i.large (us-east-1 on-demand), allocatable from the catalog
        let c = [cand("arm", "arm64", Some(0.0816), 1930, 6844), cand("x86", "amd64", Some(0.096), 1930, 6903)];
        assert_eq!(score(pod, &c, &policy(), 0.05), vec![10, 0]);
    }

    #[test]
    fn larger_nodes_cost_less_per_pod_only_by_price_per_share() {
        let pod = Resources::new(1000, 1024 * MIB, 1);
        // same price per vCPU: equal cost per pod
        let c = [cand("l", "amd64", Some(0.1), 2000, 8192), cand("xl", "amd64", Some(0.2), 4000, 16384)];
        assert_eq!(score(pod, &c, &policy(), 0.0), vec![10, 10]);
    }

    #[test]
    fn memory_heavy_pods_use_the_memory_share() {
        let pod = Resources::new(100, 4096 * MIB, 1);
        // c6g.large (little memory) vs m6g.large (twice the memory, a bit dearer)
        let c = [cand("c6g", "arm64", Some(0.068), 1930, 3055), cand("m6g", "arm64", Some(0.077), 1930, 6844)];
        assert_eq!(score(pod, &c, &policy(), 0.05), vec![0, 10]);
    }

    #[test]
    fn scores_stay_within_0_to_10_whatever_the_prices() {
        let pod = Resources::new(500, 512 * MIB, 1);
        let hostile = [Some(1e308), Some(f64::MAX), Some(f64::INFINITY), Some(f64::NAN), Some(-1.0), Some(0.0), Some(f64::MIN_POSITIVE), Some(0.05), None];
        for a in hostile {
            for b in hostile {
                // A node smaller than the pod (share > 1) multiplies the price past f64's range.
                for (cpu_a, cpu_b) in [(1930, 1930), (100, 1930), (1, 1)] {
                    let c = [cand("a", "arm64", a, cpu_a, 8192), cand("b", "amd64", b, cpu_b, 8192), cand("c", "amd64", Some(0.1), 1930, 8192)];
                    for bonus in [0.05, f64::NAN, 10.0] {
                        let s = score(pod, &c, &policy(), bonus);
                        assert!(s.iter().all(|v| (0..=MAX_SCORE).contains(v)), "{a:?} {b:?} -> {s:?}");
                    }
                }
            }
        }
        // The finding itself: one node at 1e308 USD/h against a cheap one.
        let c = [cand("cheap", "amd64", Some(0.05), 1930, 8192), cand("absurd", "amd64", Some(1e308), 100, 8192)];
        assert_eq!(score(pod, &c, &policy(), 0.05), vec![MAX_SCORE, NEUTRAL_SCORE]);
    }

    #[test]
    fn unknown_prices_are_neutral_and_preference_breaks_near_ties() {
        let pod = Resources::new(500, 512 * MIB, 1);
        let c = [cand("a", "amd64", Some(0.100), 2000, 8192), cand("b", "arm64", Some(0.102), 2000, 8192), cand("u", "arm64", None, 2000, 8192)];
        let s = score(pod, &c, &policy(), 0.05);
        assert_eq!(s[2], NEUTRAL_SCORE);
        assert!(s[1] > s[0], "arm64 within 5% wins with the default preference: {s:?}");
        let amd_first = Policy { prefer: vec!["amd64".into(), "arm64".into()], ..policy() };
        let s = score(pod, &c, &amd_first, 0.05);
        assert!(s[0] > s[1], "{s:?}");
        // A real price gap is not overturned by preference.
        let c = [cand("a", "amd64", Some(0.05), 2000, 8192), cand("b", "arm64", Some(0.10), 2000, 8192)];
        assert_eq!(score(pod, &c, &policy(), 0.05), vec![10, 0]);
        assert_eq!(score(pod, &[], &policy(), 0.05), Vec::<i64>::new());
    }
}
