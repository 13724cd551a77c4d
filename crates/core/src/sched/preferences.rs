//! A pod's scheduling preferences taken as rules, and relaxed one at a time, in Karpenter's order
//! (`pkg/controllers/provisioning/scheduling/preferences.go`): preferred pod affinity terms
//! (heaviest first), then preferred pod anti-affinity terms (heaviest first), then ScheduleAnyway
//! topology spread constraints (in order).
//!
//! kube-scheduler only scores preferences: among the nodes its filters pass, it prefers those
//! that honour them, by weight. The planner follows it there ([`each`]: among the nodes that take
//! a pod, one that honours the heaviest sum of preferences) and, for a pod no node takes yet, buys
//! new nodes that honour them while that is possible, as Karpenter does ([`stricter`]). Each step
//! is the pod itself with the remaining preferences written as required rules, so the one adapter
//! derives both of the planner's views (packer and filters) from it with the rules it already
//! knows.
//!
//! Preferred node affinity is not relaxed here (the packer honours it when it costs nothing); it
//! only scores, in [`each`].

use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, NodeSelector, NodeSelectorTerm, Pod, PodAffinity, PodAffinityTerm, PodAntiAffinity, WeightedPodAffinityTerm};

/// Whether new nodes are bought to honour preferences (Karpenter's `--preference-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Policy {
    /// Honour them on new nodes while that is possible, relaxing one at a time.
    #[default]
    Respect,
    /// Plan new nodes by the required rules alone: a preference never buys a node. Among nodes
    /// already there the planner still prefers those that honour them, as kube-scheduler does.
    Ignore,
}

/// Most preferences taken as rules per pod; any beyond stay scores only (each one costs the
/// planner one more pass over the nodes for a pod that cannot honour it).
const MAX_PREFERENCES: usize = 8;

/// What a honoured ScheduleAnyway constraint counts for against weighted terms (1-100) when
/// nodes are compared: as much as the heaviest term.
const SPREAD_WEIGHT: i32 = 100;

/// One preference of a pod.
#[derive(Debug, Clone)]
enum Preference {
    Affinity(i32, PodAffinityTerm),
    AntiAffinity(i32, PodAffinityTerm),
    /// The index of a ScheduleAnyway constraint in the pod's `topologySpreadConstraints`.
    Spread(usize),
}

impl Preference {
    fn weight(&self) -> i32 {
        match self {
            Preference::Affinity(w, _) | Preference::AntiAffinity(w, _) => *w,
            Preference::Spread(_) => SPREAD_WEIGHT,
        }
    }
}

/// Weighted terms, heaviest first (stable for equal weights).
fn heaviest_first(terms: Option<&Vec<WeightedPodAffinityTerm>>) -> Vec<(i32, PodAffinityTerm)> {
    let mut terms: Vec<&WeightedPodAffinityTerm> = terms.into_iter().flatten().collect();
    terms.sort_by_key(|t| std::cmp::Reverse(t.weight));
    terms.into_iter().map(|t| (t.weight, t.pod_affinity_term.clone())).collect()
}

/// The pod's preferences in the order they are relaxed, at most [`MAX_PREFERENCES`].
fn preferences(pod: &Pod) -> Vec<Preference> {
    let Some(spec) = pod.spec.as_ref() else { return Vec::new() };
    let affinity = spec.affinity.as_ref();
    let mut out: Vec<Preference> = heaviest_first(affinity.and_then(|a| a.pod_affinity.as_ref()).and_then(|p| p.preferred_during_scheduling_ignored_during_execution.as_ref()))
        .into_iter()
        .map(|(w, t)| Preference::Affinity(w, t))
        .collect();
    out.extend(heaviest_first(affinity.and_then(|a| a.pod_anti_affinity.as_ref()).and_then(|p| p.preferred_during_scheduling_ignored_during_execution.as_ref())).into_iter().map(|(w, t)| Preference::AntiAffinity(w, t)));
    out.extend(spec.topology_spread_constraints.iter().flatten().enumerate().filter(|(_, c)| c.when_unsatisfiable == "ScheduleAnyway").map(|(i, _)| Preference::Spread(i)));
    out.truncate(MAX_PREFERENCES);
    out
}

/// The pod with `kept` preferences as required rules and no other preference of those kinds:
/// preferred terms become required ones (after the pod's own), ScheduleAnyway constraints it
/// keeps become DoNotSchedule, and the others are dropped.
fn with_rules(pod: &Pod, kept: &[Preference]) -> Pod {
    let mut out = pod.clone();
    let Some(spec) = out.spec.as_mut() else { return out };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let pod_affinity = affinity.pod_affinity.get_or_insert_with(PodAffinity::default);
    pod_affinity.preferred_during_scheduling_ignored_during_execution = None;
    let anti = affinity.pod_anti_affinity.get_or_insert_with(PodAntiAffinity::default);
    anti.preferred_during_scheduling_ignored_during_execution = None;
    let mut spread_kept = Vec::new();
    for p in kept {
        match p {
            Preference::Affinity(_, t) => pod_affinity.required_during_scheduling_ignored_during_execution.get_or_insert_with(Vec::new).push(t.clone()),
            Preference::AntiAffinity(_, t) => anti.required_during_scheduling_ignored_during_execution.get_or_insert_with(Vec::new).push(t.clone()),
            Preference::Spread(i) => spread_kept.push(*i),
        }
    }
    if let Some(constraints) = spec.topology_spread_constraints.take() {
        let kept: Vec<_> = constraints
            .into_iter()
            .enumerate()
            .filter(|(i, c)| c.when_unsatisfiable != "ScheduleAnyway" || spread_kept.contains(i))
            .map(|(_, mut c)| {
                c.when_unsatisfiable = "DoNotSchedule".into();
                c
            })
            .collect();
        spec.topology_spread_constraints = Some(kept);
    }
    out
}

/// The pod with its preferences taken as rules, strictest first: every preference, then one
/// fewer at each step, down to the last one alone. The step after the last is the pod as written
/// (required rules only). Empty for a pod with no preferences.
pub fn stricter(pod: &Pod) -> Vec<Pod> {
    let prefs = preferences(pod);
    (0..prefs.len()).map(|i| with_rules(pod, &prefs[i..])).collect()
}

/// Each preference alone as a rule, with its weight: a node that takes the pod so honours it.
/// kube-scheduler scores a node by the weights of the preferences it honours; preferred node
/// affinity terms count too (NodeAffinity's score), though they are not relaxed in [`stricter`].
pub fn each(pod: &Pod) -> Vec<(i32, Pod)> {
    let mut out: Vec<(i32, Pod)> = preferences(pod).into_iter().map(|p| (p.weight(), with_rules(pod, std::slice::from_ref(&p)))).collect();
    let preferred = pod.spec.as_ref().and_then(|s| s.affinity.as_ref()).and_then(|a| a.node_affinity.as_ref()).and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_ref());
    out.extend(preferred.into_iter().flatten().take(MAX_PREFERENCES).map(|t| (t.weight, with_node_term(pod, &t.preference))));
    out
}

/// The pod with `term` ANDed into its required node affinity (into each of its terms, which are
/// ORed; the term alone when it has none).
fn with_node_term(pod: &Pod, term: &NodeSelectorTerm) -> Pod {
    let mut out = pod.clone();
    let Some(spec) = out.spec.as_mut() else { return out };
    let node = spec.affinity.get_or_insert_with(Affinity::default).node_affinity.get_or_insert_with(NodeAffinity::default);
    let required = node.required_during_scheduling_ignored_during_execution.get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required.node_selector_terms.push(term.clone());
    } else {
        for t in &mut required.node_selector_terms {
            t.match_expressions.get_or_insert_with(Vec::new).extend(term.match_expressions.iter().flatten().cloned());
            t.match_fields.get_or_insert_with(Vec::new).extend(term.match_fields.iter().flatten().cloned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "x"}]);
        serde_json::from_value(json!({"metadata": {"name": "p", "labels": {"app": "a"}}, "spec": spec})).expect("pod")
    }

    fn term(key: &str, app: &str, weight: i32) -> serde_json::Value {
        json!({"weight": weight, "podAffinityTerm": {"topologyKey": key, "labelSelector": {"matchLabels": {"app": app}}}})
    }

    fn required(p: &Pod, anti: bool) -> Vec<String> {
        let a = p.spec.as_ref().and_then(|s| s.affinity.as_ref());
        let terms = if anti {
            a.and_then(|a| a.pod_anti_affinity.as_ref()).and_then(|x| x.required_during_scheduling_ignored_during_execution.clone())
        } else {
            a.and_then(|a| a.pod_affinity.as_ref()).and_then(|x| x.required_during_scheduling_ignored_during_execution.clone())
        };
        terms.unwrap_or_default().iter().map(|t| format!("{}={}", t.topology_key, t.label_selector.as_ref().and_then(|s| s.match_labels.as_ref()).and_then(|m| m.get("app")).cloned().unwrap_or_default())).collect()
    }

    fn spread_modes(p: &Pod) -> Vec<String> {
        p.spec.as_ref().and_then(|s| s.topology_spread_constraints.clone()).unwrap_or_default().iter().map(|c| format!("{}:{}", c.topology_key, c.when_unsatisfiable)).collect()
    }

    #[test]
    fn a_pod_without_preferences_has_no_stricter_step() {
        assert!(stricter(&pod(json!({}))).is_empty());
        let req = pod(json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "a"}}}]}},
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]}));
        assert!(stricter(&req).is_empty(), "required rules are not preferences");
    }

    #[test]
    fn preferences_relax_in_karpenters_order_heaviest_first() {
        let p = pod(json!({
            "affinity": {
                "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term("host", "light", 10), term("host", "heavy", 90)]},
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "host", "labelSelector": {"matchLabels": {"app": "own"}}}],
                    "preferredDuringSchedulingIgnoredDuringExecution": [term("zone", "anti", 5)]
                }
            },
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"},
                {"maxSkew": 2, "topologyKey": "host", "whenUnsatisfiable": "DoNotSchedule"}
            ]
        }));
        let steps = stricter(&p);
        assert_eq!(steps.len(), 4);
        // Every preference as a rule.
        assert_eq!(required(&steps[0], false), ["host=heavy", "host=light"]);
        assert_eq!(required(&steps[0], true), ["host=own", "zone=anti"]);
        assert_eq!(spread_modes(&steps[0]), ["zone:DoNotSchedule", "host:DoNotSchedule"]);
        // The heaviest pod affinity goes first, then the lighter one, then the anti-affinity.
        assert_eq!(required(&steps[1], false), ["host=light"]);
        assert!(required(&steps[2], false).is_empty());
        assert_eq!(required(&steps[2], true), ["host=own", "zone=anti"]);
        assert_eq!(required(&steps[3], true), ["host=own"], "the required term stays");
        assert_eq!(spread_modes(&steps[3]), ["zone:DoNotSchedule", "host:DoNotSchedule"]);
        for s in &steps {
            let a = s.spec.as_ref().and_then(|s| s.affinity.as_ref()).expect("affinity");
            assert!(a.pod_affinity.as_ref().is_some_and(|x| x.preferred_during_scheduling_ignored_during_execution.is_none()));
            assert!(a.pod_anti_affinity.as_ref().is_some_and(|x| x.preferred_during_scheduling_ignored_during_execution.is_none()));
        }
    }

    #[test]
    fn each_preference_alone_with_its_weight() {
        let p = pod(json!({
            "affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term("host", "light", 10), term("host", "heavy", 90)]}},
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]
        }));
        let each = each(&p);
        assert_eq!(each.iter().map(|(w, _)| *w).collect::<Vec<_>>(), [90, 10, SPREAD_WEIGHT]);
        assert_eq!(required(&each[0].1, false), ["host=heavy"]);
        assert!(spread_modes(&each[0].1).is_empty(), "the other preferences are gone");
        assert!(required(&each[2].1, false).is_empty());
        assert_eq!(spread_modes(&each[2].1), ["zone:DoNotSchedule"]);
    }

    #[test]
    fn preferred_node_affinity_terms_score_anded_into_the_required_ones() {
        let expr = |k: &str, v: &str| json!({"key": k, "operator": "In", "values": [v]});
        let p = pod(json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [expr("arch", "arm64")]}, {"matchExpressions": [expr("arch", "amd64")]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 30, "preference": {"matchExpressions": [expr("zone", "a")]}}]
        }}}));
        assert!(stricter(&p).is_empty(), "preferred node affinity is not relaxed here");
        let steps = each(&p);
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].0, 30);
        let terms = steps[0].1.spec.as_ref().and_then(|s| s.affinity.as_ref()).and_then(|a| a.node_affinity.as_ref()).and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref()).map(|r| r.node_selector_terms.clone()).unwrap_or_default();
        let keys: Vec<Vec<String>> = terms.iter().map(|t| t.match_expressions.iter().flatten().map(|e| format!("{}={}", e.key, e.values.clone().unwrap_or_default().join(","))).collect()).collect();
        assert_eq!(keys, [vec!["arch=arm64", "zone=a"], vec!["arch=amd64", "zone=a"]]);
        let alone = pod(json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 5, "preference": {"matchExpressions": [expr("zone", "b")]}}]}}}));
        let e = each(&alone);
        let terms = e[0].1.spec.as_ref().and_then(|s| s.affinity.as_ref()).and_then(|a| a.node_affinity.as_ref()).and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref()).map(|r| r.node_selector_terms.len());
        assert_eq!(terms, Some(1));
    }

    #[test]
    fn schedule_anyway_spreads_become_rules_then_go() {
        let p = pod(json!({"topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"},
            {"maxSkew": 1, "topologyKey": "host", "whenUnsatisfiable": "ScheduleAnyway"}
        ]}));
        let steps = stricter(&p);
        assert_eq!(steps.iter().map(spread_modes).collect::<Vec<_>>(), [vec!["zone:DoNotSchedule", "host:DoNotSchedule"], vec!["host:DoNotSchedule"]]);
    }

    #[test]
    fn preferences_beyond_the_cap_stay_scores() {
        let terms: Vec<serde_json::Value> = (0..20).map(|i| term("host", &format!("t{i}"), i)).collect();
        let p = pod(json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}}}));
        let steps = stricter(&p);
        assert_eq!(steps.len(), MAX_PREFERENCES);
        assert_eq!(required(&steps[0], true).first().map(String::as_str), Some("host=t19"), "the heaviest are kept");
    }
}
