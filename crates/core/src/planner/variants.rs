//! Copies of a pool for the values its requirements leave open on custom keys.
//!
//! A NodePool requirement `capacity.spread In [2,3,4,5]` lets a node carry any of those values,
//! and Karpenter picks the one the pods need: a topology spread over that key counts each value
//! as a domain, and a node affinity naming one value gets it. The planner models this by
//! planning on one copy of the pool per value, each fixing the value (its requirements narrowed
//! to it, [`Pool::variant`] naming it); a planned node carries its copy's value as a label, and
//! the copies of a pool share its limits. Only keys the batch's pods care about are split, so a
//! pool whose open keys nobody selects on is planned as written (its nodes carry the first value
//! listed, as before).

use std::collections::BTreeSet;

use super::Pending;
use crate::packer::{Offering, Pool};
use crate::requirements::Requirements;

/// At most this many copies of one pool: past it, the remaining keys are left as written.
const MAX_COPIES: usize = 64;

/// The pools a batch is planned on: each as written, or, when it leaves several values on custom
/// keys the pods of `pending` select or spread on, one copy per combination of those values.
pub(super) fn expand(pools: &[Pool], pending: &[Pending]) -> Vec<Pool> {
    let keys = cared_about(pending);
    if keys.is_empty() {
        return pools.to_vec();
    }
    let mut out = Vec::with_capacity(pools.len());
    for pool in pools {
        let mut copies = vec![pool.clone()];
        // Only keys the pool's requirements name: a NodePool gives no node a custom label it
        // does not define (Karpenter refuses such a pod for the pool).
        for key in keys.iter().filter(|k| !Offering::sets_label(k) && !pool.labels.contains_key(*k) && pool.requirements.get(k).is_some()) {
            let listed = pool.requirements.get(key).and_then(|c| c.values()).is_some();
            let values = open_values(pool, key, pending);
            // A listed single value is the pool as written; an open key (`Exists`) needs a copy
            // for every value the pods name, even one.
            if values.len() < 2 && (listed || values.is_empty()) {
                continue;
            }
            if copies.len() * values.len() > MAX_COPIES {
                break;
            }
            copies = copies
                .iter()
                .flat_map(|c| {
                    values.iter().map(move |v| {
                        let mut copy = c.clone();
                        copy.requirements = c.requirements.intersect(&Requirements::new().with(key, v));
                        copy.variant.insert(key.clone(), v.clone());
                        copy
                    })
                })
                .collect();
        }
        out.extend(copies);
    }
    out
}

/// Label keys the batch's pods select on (node affinity, required or preferred, at any step of
/// their relaxation) or count domains over (topology spread, inter-pod affinity).
fn cared_about(pending: &[Pending]) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for p in pending {
        let steps = p.stricter.iter().map(|s| (&s.packer, &s.sched)).chain(std::iter::once((&p.packer, &p.sched)));
        for (packer, sched) in steps {
            keys.extend(packer.terms.iter().flat_map(Requirements::keys).map(String::from));
            keys.extend(packer.preferred.iter().flat_map(|(_, r)| r.keys()).map(String::from));
            keys.extend(sched.spread.iter().map(|c| c.topology_key.clone()));
            keys.extend(sched.affinity.iter().chain(&sched.anti_affinity).map(|t| t.topology_key.clone()));
        }
    }
    keys
}

/// The values a node of `pool` may carry on `key`: those its requirement lists, else (`Exists`,
/// `NotIn`, bounds) those the pods' node affinity names that it admits.
fn open_values(pool: &Pool, key: &str, pending: &[Pending]) -> Vec<String> {
    if let Some(listed) = pool.requirements.get(key).and_then(|c| c.values()) {
        return listed.into_iter().map(String::from).collect();
    }
    let named: BTreeSet<String> = pending
        .iter()
        .flat_map(|p| p.stricter.iter().map(|s| &s.packer).chain(std::iter::once(&p.packer)))
        .flat_map(|pod| pod.terms.iter().chain(pod.preferred.iter().map(|(_, r)| r)))
        .filter_map(|r| r.get(key).and_then(|c| c.values()))
        .flatten()
        .map(String::from)
        .collect();
    named.into_iter().filter(|v| pool.requirements.compatible(&Requirements::new().with(key, v))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packer::PendingPod;
    use crate::sched::PodInfo;
    use serde_json::json;

    const KEY: &str = "capacity.spread";

    fn pool(name: &str, reqs: &[(&str, &str, &[&str])]) -> Pool {
        let mut requirements = Requirements::new();
        for (k, op, v) in reqs {
            requirements.add(k, op, &v.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("requirement");
        }
        Pool { name: name.into(), weight: 0, requirements, labels: Default::default(), taints: Vec::new(), limit_cpu_millis: None, limit_memory_bytes: None, limit_nodes: None, daemons: Vec::new(), closed: None, variant: Default::default() }
    }

    fn pending(spec: serde_json::Value) -> Pending {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "x"}]);
        let pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "default", "labels": {"app": "a"}}, "spec": spec})).expect("pod");
        let sched = PodInfo::from_pod(&pod);
        Pending { packer: PendingPod::from_info("default/p", &sched, None), sched, stricter: Vec::new(), preferences: Vec::new(), planned: None, queue_order: 0 }
    }

    fn spreading() -> Pending {
        pending(json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": KEY, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "a"}}}]}))
    }

    fn variants(pools: &[Pool]) -> Vec<(String, Vec<(String, String)>)> {
        pools.iter().map(|p| (p.name.clone(), p.variant.iter().map(|(k, v)| (k.clone(), v.clone())).collect())).collect()
    }

    #[test]
    fn a_key_the_pods_spread_on_splits_the_pool_per_listed_value() {
        let pools = [pool("spot", &[(KEY, "In", &["2", "3"])]), pool("plain", &[])];
        let out = expand(&pools, &[spreading()]);
        let v = |p: &str, x: &[(&str, &str)]| (p.to_string(), x.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>());
        assert_eq!(variants(&out), [v("spot", &[(KEY, "2")]), v("spot", &[(KEY, "3")]), v("plain", &[])], "a pool that does not define the key is not split");
        let implied: Vec<(&str, &str)> = out[1].requirements.implied_labels().collect();
        assert_eq!(implied, [(KEY, "3")], "each copy's requirement is narrowed to its value");
    }

    #[test]
    fn keys_nobody_selects_on_and_single_values_leave_the_pool_as_written() {
        let pools = [pool("spot", &[(KEY, "In", &["2", "3"]), ("other", "In", &["x", "y"])])];
        assert_eq!(variants(&expand(&pools, &[pending(json!({}))])), [("spot".to_string(), Vec::new())]);
        let single = [pool("one", &[(KEY, "In", &["1"])])];
        assert_eq!(variants(&expand(&single, &[spreading()])), [("one".to_string(), Vec::new())], "its nodes carry the one value already");
        // Keys an offering sets (the zone) are the offerings' domains, not copies.
        let zoned = [pool("z", &[(crate::labels::ZONE, "In", &["us-east-1a", "us-east-1b"])])];
        let zone_spread = pending(json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": crate::labels::ZONE, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "a"}}}]}));
        assert_eq!(expand(&zoned, &[zone_spread]).len(), 1);
    }

    #[test]
    fn an_open_key_takes_the_values_the_pods_name_and_copies_are_bounded() {
        let open = [pool("open", &[(KEY, "Exists", &[])])];
        let selecting = pending(json!({"nodeSelector": {KEY: "r9"}}));
        assert_eq!(variants(&expand(&open, &[selecting])), [("open".to_string(), vec![(KEY.to_string(), "r9".to_string())])]);
        let many: Vec<String> = (0..100).map(|i| i.to_string()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let wide = [pool("wide", &[(KEY, "In", &many)])];
        assert_eq!(expand(&wide, &[spreading()]).len(), 1, "past {MAX_COPIES} copies the key is left as written");
    }
}
