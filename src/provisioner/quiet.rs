//! A pool already consolidated is not searched again until something the search reads changes
//! (Karpenter's `IsConsolidated`: its consolidation skips a cluster whose state has not changed
//! since a search found nothing, and searches again after 5 minutes regardless).
//!
//! The search is a pure function of the cluster, so with the same inputs it finds the same
//! nothing: re-running it every disruption pass on an idle cluster was most of Archer's
//! controller CPU in the comparison with Karpenter (issue #45: 1-1.5 s of packing per pass on
//! 52 nodes and 1,000 pods, every 10 s). The inputs are summarised as a hash of what a search
//! reads; a pool counts as consolidated once the single-node search's rotating window has gone
//! all the way round (one pass per window) on the same inputs, and found nothing.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use archer_model::consolidation::PoolNodes;
use archer_model::ClusterState;

/// A consolidated pool is searched again after this long even if nothing changed (prices the
/// hash does not see, the safety record): Karpenter's 5 minutes.
pub const RECHECK_AFTER: Duration = Duration::from_secs(300);

/// What a consolidation search of `pool` reads, as one number: every node (name, taints,
/// schedulability, allocatable, labels, deletion: not its status heartbeats), every pod (uid,
/// node, phase, deletion), every claim, every pool's generation, the offerings' prices, the
/// overlays, and the pass's own clocks (which candidates are settled or empty long enough, the
/// budget, whether consolidation is held).
pub fn inputs(state: &ClusterState, nodes: &PoolNodes<'_>, settled: &[&str], empty: &[&str], budget: usize, hold: Option<&str>) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for n in &state.nodes {
        n.metadata.name.hash(&mut h);
        n.metadata.deletion_timestamp.is_some().hash(&mut h);
        n.metadata.labels.hash(&mut h);
        if let Some(spec) = &n.spec {
            spec.unschedulable.hash(&mut h);
            for t in spec.taints.iter().flatten() {
                (&t.key, &t.value, &t.effect).hash(&mut h);
            }
        }
        if let Some(alloc) = n.status.as_ref().and_then(|s| s.allocatable.as_ref()) {
            for (k, v) in alloc {
                (k, &v.0).hash(&mut h);
            }
        }
    }
    for p in &state.pods {
        p.metadata.uid.hash(&mut h);
        p.metadata.deletion_timestamp.is_some().hash(&mut h);
        p.spec.as_ref().and_then(|s| s.node_name.as_ref()).hash(&mut h);
        p.status.as_ref().and_then(|s| s.phase.as_ref()).hash(&mut h);
    }
    for c in &state.claims {
        c.metadata.name.hash(&mut h);
        c.metadata.deletion_timestamp.is_some().hash(&mut h);
    }
    for p in &state.pools {
        (&p.metadata.name, p.metadata.generation).hash(&mut h);
    }
    for o in state.offerings.iter() {
        (&o.instance.name, o.zone.as_str(), o.capacity.as_str(), o.price.to_bits()).hash(&mut h);
    }
    for o in &state.overlays {
        (&o.metadata.name, o.metadata.generation).hash(&mut h);
    }
    (nodes.total, nodes.disrupting, settled, empty, budget, hold).hash(&mut h);
    h.finish()
}

/// Per pool: the inputs of the last passes that found nothing, how many such passes in a row,
/// and since when.
#[derive(Default)]
pub struct Quiet {
    pools: Mutex<HashMap<String, (u64, usize, Instant)>>,
}

impl Quiet {
    /// Whether `pool` is consolidated on these `inputs`: `windows` passes in a row (the single-node
    /// search's window gone all the way round) found nothing on them, within [`RECHECK_AFTER`].
    pub fn consolidated(&self, pool: &str, inputs: u64, windows: usize, now: Instant) -> bool {
        let m = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        m.get(pool).is_some_and(|&(seen, passes, since)| seen == inputs && passes >= windows.max(1) && now.duration_since(since) < RECHECK_AFTER)
    }

    /// A full search of `pool` on `inputs` found nothing.
    pub fn found_nothing(&self, pool: &str, inputs: u64, now: Instant) {
        let mut m = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let e = m.entry(pool.to_string()).or_insert((inputs, 0, now));
        if e.0 != inputs || now.duration_since(e.2) >= RECHECK_AFTER {
            *e = (inputs, 0, now);
        }
        e.1 += 1;
    }

    /// A search of `pool` decided something (or the pool is gone): search again next pass.
    pub fn forget(&self, pool: &str) {
        self.pools.lock().unwrap_or_else(|e| e.into_inner()).remove(pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn state(yaml_nodes: &[(&str, &str)], pods: &[(&str, Option<&str>)]) -> ClusterState {
        ClusterState {
            nodes: yaml_nodes
                .iter()
                .map(|(name, rv)| Arc::new(serde_json::from_value(serde_json::json!({"metadata": {"name": name, "resourceVersion": rv}, "status": {"allocatable": {"cpu": "4"}}})).expect("node")))
                .collect(),
            pods: pods.iter().map(|(uid, node)| Arc::new(serde_json::from_value(serde_json::json!({"metadata": {"name": uid, "uid": uid}, "spec": {"containers": [], "nodeName": node}})).expect("pod"))).collect(),
            ..ClusterState::default()
        }
    }

    fn no_nodes() -> PoolNodes<'static> {
        PoolNodes { total: 2, disrupting: 0, candidates: Vec::new() }
    }

    #[test]
    fn the_inputs_change_when_a_pod_moves_or_a_clock_turns_and_not_on_a_heartbeat() {
        let base = inputs(&state(&[("a", "1"), ("b", "1")], &[("p", Some("a"))]), &no_nodes(), &[], &[], 1, None);
        // A node's status heartbeat (a new resourceVersion) changes nothing a search reads.
        assert_eq!(base, inputs(&state(&[("a", "7"), ("b", "9")], &[("p", Some("a"))]), &no_nodes(), &[], &[], 1, None));
        assert_ne!(base, inputs(&state(&[("a", "1"), ("b", "1")], &[("p", Some("b"))]), &no_nodes(), &[], &[], 1, None), "a pod moved");
        assert_ne!(base, inputs(&state(&[("a", "1"), ("b", "1")], &[("p", Some("a")), ("q", None)]), &no_nodes(), &[], &[], 1, None), "a pod is pending");
        assert_ne!(base, inputs(&state(&[("a", "1")], &[("p", Some("a"))]), &no_nodes(), &[], &[], 1, None), "a node went");
        assert_ne!(base, inputs(&state(&[("a", "1"), ("b", "1")], &[("p", Some("a"))]), &no_nodes(), &["a"], &[], 1, None), "a node settled");
        assert_ne!(base, inputs(&state(&[("a", "1"), ("b", "1")], &[("p", Some("a"))]), &no_nodes(), &[], &[], 0, None), "the budget changed");
        assert_ne!(base, inputs(&state(&[("a", "1"), ("b", "1")], &[("p", Some("a"))]), &no_nodes(), &[], &[], 1, Some("pods pending")), "held");
    }

    #[test]
    fn a_pool_is_consolidated_after_a_full_round_of_windows_on_the_same_inputs_until_they_change_or_time_passes() {
        let q = Quiet::default();
        let t = Instant::now();
        assert!(!q.consolidated("p", 1, 3, t));
        q.found_nothing("p", 1, t);
        q.found_nothing("p", 1, t);
        assert!(!q.consolidated("p", 1, 3, t), "two of three windows searched");
        q.found_nothing("p", 1, t);
        assert!(q.consolidated("p", 1, 3, t));
        assert!(!q.consolidated("p", 2, 3, t), "the inputs changed");
        assert!(!q.consolidated("other", 1, 3, t), "per pool");
        assert!(!q.consolidated("p", 1, 3, t + RECHECK_AFTER), "searched again after five minutes");
        q.found_nothing("p", 2, t);
        assert!(!q.consolidated("p", 2, 3, t), "new inputs start the round again");
        q.found_nothing("p", 2, t);
        q.found_nothing("p", 2, t);
        assert!(q.consolidated("p", 2, 3, t));
        q.forget("p");
        assert!(!q.consolidated("p", 2, 3, t), "a decision forgets it");
    }
}
