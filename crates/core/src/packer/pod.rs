//! The packer's view of a pod, read from the scheduler's ([`PodInfo`]): the one reading of a
//! Pod's constraints and requests, turned into what new nodes must offer (requirements, taints
//! tolerated, extended resources) and what its own group asks of them (spread, caps per node,
//! one zone).

use std::collections::BTreeSet;

use super::{PendingPod, Requirements, Resources};
use crate::labels;
use crate::platform::PlatformSet;
use crate::sched::selector::Selector;
use crate::sched::{AffinityTerm, PodInfo};

/// Labels the kubelet (or the cloud's node controller) puts on every node, beyond the ones an
/// offering names: a spread on them never rules a new node out.
const KUBELET_LABELS: [&str; 5] = [
    labels::HOSTNAME,
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
];

impl PendingPod {
    /// The packer's view of the pod `info` reads (`id` is `namespace/name`), its platforms
    /// decided by the caller. The node affinity of its bound volumes is ANDed into its terms, so
    /// new nodes are bought where its volumes are.
    pub fn from_info(id: &str, info: &PodInfo, platforms: Option<PlatformSet>) -> PendingPod {
        let mut own = OwnGroup::of(info);
        // Host ports: pods that ask for the same host port never share a node (NodePorts).
        if let Some(ports) = host_ports(info) {
            if own.per_node_max.is_none() && own.spread_group.is_none() {
                own.per_node_max = Some(1);
                own.spread_group = Some(format!("host-ports|{ports}"));
            }
        }
        let pod = PendingPod {
            id: id.to_string(),
            requests: Resources::new(info.requests.get("cpu"), info.requests.get("memory"), 1),
            terms: required_terms(info),
            tolerations: info.tolerations.clone(),
            platforms,
            zone_spread: own.zone_spread,
            per_node_max: own.per_node_max,
            zone_group: zone_group(info),
            preferred: info.preferred_terms.iter().filter_map(|(w, t)| Requirements::from_term(t).ok().map(|r| (*w, r))).collect(),
            one_per_zone: own.one_per_zone,
            colocate: own.colocate,
            spread_group: own.spread_group,
            spread_keys: spread_keys(info),
            extended: info.requests.0.iter().filter(|(k, v)| **v > 0 && extended(k)).map(|(k, v)| (k.clone(), *v)).collect(),
        };
        with_volume_terms(pod, info)
    }
}

/// A resource kube-scheduler's NodeResourcesFit counts as a scalar a node must offer: an extended
/// resource (a name with a domain, not `kubernetes.io/` or one of its subdomains) or huge pages (`hugepages-2Mi`).
/// Instance types offer GPUs and what NodeOverlays' `capacity` gives them.
fn extended(name: &str) -> bool {
    name.starts_with("hugepages-") || (name.contains('/') && !name.contains("kubernetes.io/"))
}

/// The pod's required node affinity terms, each with its nodeSelector folded in; the nodeSelector
/// alone when it has no terms.
fn required_terms(info: &PodInfo) -> Vec<Requirements> {
    let base = Requirements::from_node_selector(&info.node_selector);
    info.required_terms
        .as_ref()
        .map(|terms| terms.iter().filter_map(|t| Requirements::from_term(t).ok()).map(|t| t.intersect(&base)).collect())
        .filter(|t: &Vec<Requirements>| !t.is_empty())
        .unwrap_or_else(|| if info.node_selector.is_empty() { Vec::new() } else { vec![base] })
}

/// AND the node affinity of the pod's bound volumes into its terms (each volume's terms are
/// alternatives).
fn with_volume_terms(mut pod: PendingPod, info: &PodInfo) -> PendingPod {
    for terms in &info.volume_terms {
        let alternatives: Vec<Requirements> = terms.iter().filter_map(|t| Requirements::from_term(t).ok()).collect();
        if alternatives.is_empty() {
            continue;
        }
        pod.terms = if pod.terms.is_empty() { alternatives } else { pod.terms.iter().flat_map(|a| alternatives.iter().map(move |b| a.intersect(b))).collect() };
    }
    pod
}

/// The keys of the pod's hard topology spreads a new node's labels decide (not the kubelet's).
fn spread_keys(info: &PodInfo) -> Vec<String> {
    let keys: BTreeSet<&str> = info.spread.iter().map(|c| c.topology_key.as_str()).filter(|k| !KUBELET_LABELS.contains(k)).collect();
    keys.into_iter().map(String::from).collect()
}

/// The host ports the pod's containers ask for (`port/protocol`, sorted, comma-separated).
fn host_ports(info: &PodInfo) -> Option<String> {
    let ports: BTreeSet<String> = info.host_ports.iter().map(|p| format!("{}/{}", p.port, p.protocol)).collect();
    (!ports.is_empty()).then(|| ports.into_iter().collect::<Vec<_>>().join(","))
}

/// Required pod affinity on the zone key: every pod whose affinity selects on the same label
/// keys (in its namespace) is put in one zone, which satisfies each of them whatever value it
/// selects (a conservative reading: one zone for the whole family of pods).
fn zone_group(info: &PodInfo) -> Option<String> {
    info.affinity.iter().find(|t| t.topology_key == labels::ZONE).map(|t| format!("{}|{}", info.namespace, t.selector.written_keys().join(",")))
}

/// What the pod's hard constraints on its own group (its replicas) ask of new nodes: topology
/// spread on the zone and hostname keys, anti-affinity per node or zone, affinity per node.
#[derive(Default)]
struct OwnGroup {
    zone_spread: bool,
    per_node_max: Option<usize>,
    /// The group those constraints count over: the pod's namespace and its own labels they select.
    spread_group: Option<String>,
    one_per_zone: bool,
    colocate: bool,
}

impl OwnGroup {
    fn of(info: &PodInfo) -> OwnGroup {
        // A selector picks the pod's own group when its matchLabels are the pod's own.
        let selects_own = |sel: &Selector| {
            let mut m = sel.match_labels().peekable();
            m.peek().is_some() && m.all(|(k, v)| info.labels.get(k).map(String::as_str) == Some(v))
        };
        // The group is named by the selector's equalities, `matchLabelKeys` included (merged from
        // the pod's own labels, as kube-scheduler does at admission): two ReplicaSets of one
        // Deployment (`pod-template-hash`) are two groups.
        let group_of = |sel: &Selector| {
            let m = sel.group_labels().iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
            format!("{}|{m}", info.namespace)
        };
        let mut g = OwnGroup::default();
        // Only DoNotSchedule constraints are rules: the step of the pod that takes a
        // ScheduleAnyway one as a rule has it as DoNotSchedule ([`crate::sched::preferences::stricter`]).
        for c in info.spread.iter().filter(|c| selects_own(&c.selector)) {
            match c.topology_key.as_str() {
                labels::ZONE => g.zone_spread = true,
                labels::HOSTNAME => {
                    let m = usize::try_from(c.max_skew.max(1)).unwrap_or(1);
                    g.per_node_max = Some(g.per_node_max.map_or(m, |x| x.min(m)));
                }
                _ => continue,
            }
            g.spread_group.get_or_insert_with(|| group_of(&c.selector));
        }
        let own_term = |terms: &[AffinityTerm], key: &str| terms.iter().find(|t| t.topology_key == key && selects_own(&t.selector)).map(|t| group_of(&t.selector));
        if let Some(group) = own_term(&info.anti_affinity, labels::HOSTNAME) {
            g.per_node_max = Some(1);
            g.spread_group.get_or_insert(group);
        }
        g.one_per_zone = own_term(&info.anti_affinity, labels::ZONE).is_some();
        g.colocate = own_term(&info.affinity, labels::HOSTNAME).is_some();
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(spec: serde_json::Value, labels: serde_json::Value) -> PodInfo {
        let pod = serde_json::json!({"metadata": {"name": "p", "namespace": "shop", "labels": labels}, "spec": spec});
        PodInfo::from_pod(&serde_json::from_value(pod).expect("pod"))
    }

    #[test]
    fn match_label_keys_name_the_group_and_a_missing_key_is_ignored() {
        let spread = |keys: serde_json::Value| serde_json::json!({"containers": [{"name": "c"}], "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": labels::HOSTNAME, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}, "matchLabelKeys": keys}]});
        let a = PendingPod::from_info("shop/p", &info(spread(serde_json::json!(["pod-template-hash"])), serde_json::json!({"app": "web", "pod-template-hash": "a"})), None);
        let b = PendingPod::from_info("shop/p", &info(spread(serde_json::json!(["pod-template-hash"])), serde_json::json!({"app": "web", "pod-template-hash": "b"})), None);
        assert_eq!(a.spread_group.as_deref(), Some("shop|app=web,pod-template-hash=a"));
        assert_ne!(a.spread_group, b.spread_group, "two ReplicaSets are two groups");
        let missing = PendingPod::from_info("shop/p", &info(spread(serde_json::json!(["track"])), serde_json::json!({"app": "web"})), None);
        assert_eq!(missing.spread_group.as_deref(), Some("shop|app=web"));
        assert_eq!(missing.per_node_max, Some(1));
    }

    #[test]
    fn a_selector_of_expressions_alone_is_not_the_pods_own_group() {
        let spec = serde_json::json!({"containers": [{"name": "c"}], "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": labels::ZONE, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}}]});
        let p = PendingPod::from_info("shop/p", &info(spec, serde_json::json!({"app": "web"})), None);
        assert!(!p.zone_spread);
        assert_eq!(p.spread_keys, vec![labels::ZONE.to_string()], "a new node must carry the key of every hard spread");
    }

    #[test]
    fn host_ports_cap_one_per_node_and_zone_affinity_names_its_keys() {
        let spec = serde_json::json!({
            "containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 53, "hostPort": 53, "protocol": "UDP"}]}],
            "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": labels::ZONE, "labelSelector": {"matchLabels": {"cache": "redis"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}}]}}
        });
        let p = PendingPod::from_info("shop/p", &info(spec, serde_json::json!({"app": "web"})), None);
        assert_eq!((p.per_node_max, p.spread_group.as_deref()), (Some(1), Some("host-ports|53/UDP,8080/TCP")));
        assert_eq!(p.zone_group.as_deref(), Some("shop|cache,tier"));
    }
}
