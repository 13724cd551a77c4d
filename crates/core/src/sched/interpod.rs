//! InterPodAffinity's filter.
//!
//! - The incoming pod's required affinity: every term's topology key is on the node, and some
//!   pod matching *all* its terms runs in the node's domain of each term; unless no pod anywhere
//!   matches them and the pod matches its own terms (the first of a group with affinity to
//!   itself).
//! - Its required anti-affinity: no pod matching a term runs in the node's domain of that term.
//! - Running pods' required anti-affinity (symmetry): a pod whose term matches the incoming pod
//!   keeps it out of its own domain of that term.

use std::collections::{BTreeMap, BTreeSet};

use super::{DomainRule, NodeInfo, PodInfo, Snapshot, Unfit};

type Domain = (String, String);

#[derive(Debug, Clone)]
pub(crate) struct State {
    /// Domains holding a pod that matches all the incoming pod's affinity terms (per term key).
    affinity: BTreeSet<Domain>,
    /// Whether the pod matches its own affinity terms.
    self_match: bool,
    anti: BTreeSet<Domain>,
    existing_anti: BTreeSet<Domain>,
    terms: Vec<String>,
    anti_terms: Vec<String>,
}

impl State {
    pub fn new(s: &Snapshot, pod: &PodInfo) -> Self {
        let own_ns = s.ns_labels(&pod.namespace);
        let mut st = State {
            affinity: BTreeSet::new(),
            self_match: !pod.affinity.is_empty() && pod.affinity.iter().all(|t| t.matches(pod, own_ns)),
            anti: BTreeSet::new(),
            existing_anti: BTreeSet::new(),
            terms: pod.affinity.iter().map(|t| t.topology_key.clone()).collect(),
            anti_terms: pod.anti_affinity.iter().map(|t| t.topology_key.clone()).collect(),
        };
        // No terms of its own: only placed pods with anti-affinity can refuse it.
        if pod.affinity.is_empty() && pod.anti_affinity.is_empty() {
            for &(p, n) in &s.with_anti_affinity {
                st.note_existing_anti(&s.pods[p], pod, own_ns, &s.nodes[n]);
            }
            return st;
        }
        for node in &s.nodes {
            for other in node.pods.iter().map(|&p| &s.pods[p]) {
                st.add_pod(s, pod, node, other);
            }
        }
        st
    }

    /// One more pod (`other`) on `node`.
    pub(super) fn add_pod(&mut self, s: &Snapshot, pod: &PodInfo, node: &NodeInfo, other: &PodInfo) {
        if other.terminating {
            return;
        }
        let own_ns = s.ns_labels(&pod.namespace);
        let other_ns = s.ns_labels(&other.namespace);
        if !pod.affinity.is_empty() && pod.affinity.iter().all(|t| t.matches(other, other_ns)) {
            for t in &pod.affinity {
                if let Some(v) = node.labels.get(&t.topology_key) {
                    self.affinity.insert((t.topology_key.clone(), v.clone()));
                }
            }
        }
        for t in pod.anti_affinity.iter().filter(|t| t.matches(other, other_ns)) {
            if let Some(v) = node.labels.get(&t.topology_key) {
                self.anti.insert((t.topology_key.clone(), v.clone()));
            }
        }
        self.note_existing_anti(other, pod, own_ns, node);
    }

    /// A running pod's required anti-affinity that selects the incoming pod keeps it out of the
    /// running pod's domain of that term.
    fn note_existing_anti(&mut self, other: &PodInfo, pod: &PodInfo, own_ns: &super::selector::Labels, node: &NodeInfo) {
        if other.terminating {
            return;
        }
        for t in other.anti_affinity.iter().filter(|t| t.matches(pod, own_ns)) {
            if let Some(v) = node.labels.get(&t.topology_key) {
                self.existing_anti.insert((t.topology_key.clone(), v.clone()));
            }
        }
    }

    /// What a new node's domains must be for the pod (see [`Snapshot::new_node_domains`]).
    pub(crate) fn domain_rules(&self) -> Result<Vec<DomainRule>, Unfit> {
        use crate::labels::HOSTNAME;
        let mut rules: BTreeMap<(String, bool), BTreeSet<String>> = BTreeMap::new();
        for (k, v) in self.anti.iter().chain(&self.existing_anti) {
            if k != HOSTNAME {
                rules.entry((k.clone(), false)).or_default().insert(v.clone());
            }
        }
        let first_of_group = self.affinity.is_empty() && self.self_match;
        if !self.terms.is_empty() && !first_of_group {
            for key in &self.terms {
                if key == HOSTNAME {
                    return Err(Unfit::AffinityElsewhere(key.clone()));
                }
                let values: BTreeSet<String> = self.affinity.iter().filter(|(k, _)| k == key).map(|(_, v)| v.clone()).collect();
                if values.is_empty() {
                    return Err(Unfit::Affinity);
                }
                rules.entry((key.clone(), true)).or_default().extend(values);
            }
        }
        Ok(rules.into_iter().map(|((key, allowed), values)| DomainRule { key, allowed, values }).collect())
    }

    pub fn filter(&self, node: &NodeInfo) -> Result<(), Unfit> {
        let domain = |key: &String| node.labels.get(key).map(|v| (key.clone(), v.clone()));
        if node.labels.iter().any(|(k, v)| self.existing_anti.contains(&(k.clone(), v.clone()))) {
            return Err(Unfit::ExistingAntiAffinity);
        }
        if self.anti_terms.iter().filter_map(domain).any(|d| self.anti.contains(&d)) {
            return Err(Unfit::AntiAffinity);
        }
        if !self.terms.is_empty() {
            let domains: Option<Vec<Domain>> = self.terms.iter().map(domain).collect();
            let Some(domains) = domains else { return Err(Unfit::Affinity) };
            let all_present = domains.iter().all(|d| self.affinity.contains(d));
            // No matching pod in any domain: the first of a group with affinity to itself.
            let first_of_group = self.affinity.is_empty() && self.self_match;
            if !(all_present || first_of_group) {
                return Err(Unfit::Affinity);
            }
        }
        Ok(())
    }
}
