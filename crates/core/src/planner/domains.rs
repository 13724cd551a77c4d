//! The domains new nodes could open, per topology key, as Karpenter counts them: every value a
//! pool's nodes can carry (its offerings' zones and capacity types, the values its requirements
//! list on custom keys) for a pod those nodes could take. They count as empty domains of the
//! pod's spread constraints, on room already there and on new nodes alike: a batch opens a zone
//! a pool allows and no node is in yet. A constraint with `nodeTaintsPolicy: Ignore` (the
//! default) counts the domains of pools whose taints the pod does not tolerate too, as
//! kube-scheduler counts such nodes; with `Honor`, only the pools it tolerates. Hostname is left
//! out: a node Archer could buy is not a domain kube-scheduler sees (docs, "The scheduling
//! model").

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::Pending;
use crate::labels::HOSTNAME;
use crate::packer::{could_host_but_for_taints, could_host_with, Offering, Pool};
use crate::sched::PodInfo;

/// The domains a new node for a pod could open, per spread key, computed once per kind of pod.
#[derive(Default)]
pub(super) struct DomainCache {
    by_kind: HashMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// The labels of every (pool, offering), computed once per plan.
    labels: Option<Vec<Vec<BTreeMap<String, String>>>>,
}

impl DomainCache {
    /// The pod's scheduling view at step `k` of its relaxation, with [`PodInfo::potential`]
    /// filled for its spread keys.
    pub(super) fn at_step<'a>(&mut self, p: &'a Pending, k: usize, pools: &[Pool], offerings: &[Offering]) -> Cow<'a, PodInfo> {
        let (pod, sched) = p.step(k);
        // Each key, and whether its domains count the pools whose taints the pod does not
        // tolerate (every constraint on it has `nodeTaintsPolicy: Ignore`, the default).
        let keys: BTreeMap<&str, bool> = sched
            .spread
            .iter()
            .filter(|c| c.topology_key != HOSTNAME)
            .map(|c| (c.topology_key.as_str(), sched.spread.iter().filter(|d| d.topology_key == c.topology_key).all(|d| !d.honor_taints)))
            .collect();
        if keys.is_empty() {
            return Cow::Borrowed(sched);
        }
        let kind = format!("{keys:?}|{:?}|{:?}|{:?}|{:?}", pod.terms, pod.tolerations, pod.platforms.as_ref().map(|s| s.to_annotation()), pod.extended);
        let all = self.labels.get_or_insert_with(|| pools.iter().map(|pool| offerings.iter().map(|o| o.labels(pool)).collect()).collect());
        let potential = self.by_kind.entry(kind).or_insert_with(|| {
            let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (pool, labels) in pools.iter().zip(all.iter()) {
                for (o, labels) in offerings.iter().zip(labels) {
                    if !could_host_but_for_taints(pod, pool, o, labels) {
                        continue;
                    }
                    let tolerated = could_host_with(pod, pool, o, labels);
                    for (k, any_taints) in &keys {
                        if let Some(v) = labels.get(*k).filter(|_| tolerated || *any_taints) {
                            out.entry((*k).to_string()).or_default().insert(v.clone());
                        }
                    }
                }
            }
            out
        });
        let mut info = sched.clone();
        info.potential = potential.clone();
        Cow::Owned(info)
    }
}
