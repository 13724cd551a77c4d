//! PodTopologySpread's filter: for each DoNotSchedule constraint, the candidate node's domain may
//! hold at most `maxSkew` more matching pods (counting the incoming one if it matches) than the
//! emptiest eligible domain; with fewer eligible domains than `minDomains`, the emptiest counts 0.
//!
//! Eligible nodes carry every constraint's topology key and pass the constraint's inclusion
//! policies (`nodeAffinityPolicy` Honor by default: the pod's node affinity; `nodeTaintsPolicy`
//! Ignore by default). Matching pods are those in the incoming pod's namespace, not terminating,
//! selected by the constraint's selector (an empty selector counts none).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;

use super::selector::{Labels, Selector};
use super::{DomainRule, NodeInfo, PodInfo, Snapshot, Unfit};

#[derive(Debug, Clone)]
pub struct Constraint {
    pub max_skew: i32,
    pub topology_key: String,
    pub min_domains: i32,
    pub selector: Selector,
    pub honor_affinity: bool,
    pub honor_taints: bool,
}

impl Constraint {
    /// The pod's DoNotSchedule constraints, `matchLabelKeys` folded into their selectors.
    pub fn from_pod(spec: &PodSpec, labels: &Labels) -> Vec<Constraint> {
        spec.topology_spread_constraints
            .iter()
            .flatten()
            .filter(|c| c.when_unsatisfiable == "DoNotSchedule")
            .map(|c| {
                let mut selector = Selector::from_api(c.label_selector.as_ref());
                for key in c.match_label_keys.iter().flatten() {
                    if let Some(v) = labels.get(key) {
                        selector = selector.and_equals(key, v);
                    }
                }
                Constraint {
                    max_skew: c.max_skew,
                    topology_key: c.topology_key.clone(),
                    min_domains: c.min_domains.unwrap_or(1),
                    selector,
                    honor_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
                    honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
                }
            })
            .collect()
    }

    fn includes(&self, pod: &PodInfo, node: &NodeInfo) -> bool {
        (!self.honor_affinity || pod.node_affinity_matches(node)) && (!self.honor_taints || crate::taints::untolerated(&node.taints, &pod.tolerations).is_none())
    }
}

/// Matching pods per domain for each constraint, computed once per incoming pod.
#[derive(Debug, Clone)]
pub(crate) struct State {
    counts: Vec<BTreeMap<String, i64>>,
}

impl State {
    pub fn new(s: &Snapshot, pod: &PodInfo) -> Self {
        let mut st = State { counts: vec![BTreeMap::new(); pod.spread.len()] };
        if pod.spread.is_empty() {
            return st;
        }
        for node in &s.nodes {
            st.add_node(s, pod, node);
        }
        // Domains a new node could open count as empty ones (the planner's pass over new nodes).
        for (ci, c) in pod.spread.iter().enumerate() {
            for v in pod.potential.get(&c.topology_key).into_iter().flatten() {
                st.counts[ci].entry(v.clone()).or_insert(0);
            }
        }
        st
    }

    /// Count a node: its domain of each constraint it is eligible for, and the matching pods on it.
    pub(super) fn add_node(&mut self, s: &Snapshot, pod: &PodInfo, node: &NodeInfo) {
        if !Self::eligible(pod, node) {
            return;
        }
        for (ci, c) in pod.spread.iter().enumerate() {
            if !c.includes(pod, node) {
                continue;
            }
            let matching = node.pods.iter().filter(|&&p| Self::counts_for(c, pod, &s.pods[p])).count() as i64;
            *self.counts[ci].entry(node.labels[&c.topology_key].clone()).or_insert(0) += matching;
        }
    }

    /// One more pod on a node [`State::add_node`] already counted.
    pub(super) fn add_pod(&mut self, pod: &PodInfo, node: &NodeInfo, other: &PodInfo) {
        if !Self::eligible(pod, node) {
            return;
        }
        for (ci, c) in pod.spread.iter().enumerate() {
            if c.includes(pod, node) && Self::counts_for(c, pod, other) {
                *self.counts[ci].entry(node.labels[&c.topology_key].clone()).or_insert(0) += 1;
            }
        }
    }

    /// Only nodes that carry every constraint's key take part.
    fn eligible(pod: &PodInfo, node: &NodeInfo) -> bool {
        !pod.spread.is_empty() && pod.spread.iter().all(|c| node.labels.contains_key(&c.topology_key))
    }

    /// Does `other` count toward constraint `c` of `pod`? (Same namespace, not terminating,
    /// selected; an empty selector counts none.)
    fn counts_for(c: &Constraint, pod: &PodInfo, other: &PodInfo) -> bool {
        !c.selector.is_empty() && !other.terminating && other.namespace == pod.namespace && c.selector.matches(&other.labels)
    }

    /// The smallest count over eligible domains (0 with fewer domains than `minDomains`).
    fn min(&self, ci: usize, c: &Constraint) -> i64 {
        let counts = &self.counts[ci];
        if (counts.len() as i64) < c.min_domains as i64 {
            return 0;
        }
        counts.values().copied().min().unwrap_or(0)
    }

    /// For a new node: per constraint on a key other than the hostname, the known domains one
    /// more matching pod may go to. A constraint whose key no domain has yet allows any value.
    pub fn allowed(&self, pod: &PodInfo) -> Result<Vec<DomainRule>, Unfit> {
        let mut rules = Vec::new();
        for (ci, c) in pod.spread.iter().enumerate() {
            if c.topology_key == crate::labels::HOSTNAME || self.counts[ci].is_empty() {
                continue;
            }
            let min = self.min(ci, c);
            let own = i64::from(c.selector.matches(&pod.labels));
            let values: std::collections::BTreeSet<String> = self.counts[ci].iter().filter(|(_, &n)| n + own - min <= c.max_skew as i64).map(|(d, _)| d.clone()).collect();
            if values.is_empty() {
                return Err(Unfit::SpreadNowhere { key: c.topology_key.clone(), max_skew: c.max_skew, domains: self.counts[ci].keys().cloned().collect() });
            }
            rules.push(DomainRule { key: c.topology_key.clone(), allowed: true, values });
        }
        Ok(rules)
    }

    pub fn filter(&self, _s: &Snapshot, pod: &PodInfo, node: &NodeInfo) -> Result<(), Unfit> {
        for (ci, c) in pod.spread.iter().enumerate() {
            let Some(domain) = node.labels.get(&c.topology_key) else {
                return Err(Unfit::SpreadLabelMissing(c.topology_key.clone()));
            };
            let counts = &self.counts[ci];
            let min = self.min(ci, c);
            let own = i64::from(c.selector.matches(&pod.labels));
            let skew = counts.get(domain).copied().unwrap_or(0) + own - min;
            if skew > c.max_skew as i64 {
                return Err(Unfit::Spread { key: c.topology_key.clone(), domain: domain.clone(), skew, max_skew: c.max_skew });
            }
        }
        Ok(())
    }
}
