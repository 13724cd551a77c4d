//! A scenario: ordinary Kubernetes YAML (Deployments with replicas, Pods, NodePools, existing
//! Nodes), turned into the packer's inputs.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use serde::Deserialize;

use super::nodepool::{NodePool, API_VERSION, KARPENTER_API_VERSION};
use crate::core::packer::PendingPod;
use crate::core::placement::{pod_images, PLATFORMS_ANNOTATION};
use crate::core::platform::PlatformSet;
use crate::core::requirements::Requirements;
use crate::core::resources::{pod_requests, Resources};

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("document {index}: {message}")]
    Document { index: usize, message: String },
}

/// A pod to place, with what the packer needs and where its platforms come from.
#[derive(Debug, Clone)]
pub struct ScenarioPod {
    pub id: String,
    pub pod: Pod,
}

#[derive(Debug, Default)]
pub struct Scenario {
    pub pods: Vec<ScenarioPod>,
    pub pools: Vec<NodePool>,
    pub nodes: Vec<Node>,
    /// Pods already bound to nodes.
    pub bound: Vec<Pod>,
    pub claims: Vec<PersistentVolumeClaim>,
    pub volumes: Vec<PersistentVolume>,
    /// Pod templates of DaemonSets: their requests are taken on every new node they would run on.
    pub daemonsets: Vec<Pod>,
    /// Kinds that were ignored, for the report.
    pub ignored: Vec<String>,
}

impl Scenario {
    pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        let mut s = Scenario::default();
        for (index, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let err = |message: String| ScenarioError::Document { index, message };
            let value = serde_yaml::Value::deserialize(doc).map_err(|e| err(e.to_string()))?;
            if value.is_null() {
                continue;
            }
            let json: serde_json::Value = serde_json::to_value(&value).map_err(|e| err(e.to_string()))?;
            let kind = json.get("kind").and_then(|k| k.as_str()).unwrap_or_default().to_string();
            let api = json.get("apiVersion").and_then(|k| k.as_str()).unwrap_or_default().to_string();
            match (kind.as_str(), api.as_str()) {
                ("Deployment", _) => {
                    let d: Deployment = serde_json::from_value(json).map_err(|e| err(format!("Deployment: {e}")))?;
                    let name = d.metadata.name.clone().unwrap_or_default();
                    let ns = d.metadata.namespace.clone().unwrap_or_else(|| "default".into());
                    let spec = d.spec.ok_or_else(|| err(format!("Deployment {name} has no spec")))?;
                    let replicas = spec.replicas.unwrap_or(1).max(0);
                    for i in 0..replicas {
                        let mut meta = spec.template.metadata.clone().unwrap_or_default();
                        meta.name = Some(format!("{name}-{i}"));
                        meta.namespace = Some(ns.clone());
                        let pod = Pod { metadata: meta, spec: spec.template.spec.clone(), status: None };
                        s.pods.push(ScenarioPod { id: format!("{ns}/{name}-{i}"), pod });
                    }
                }
                ("Pod", _) => {
                    let p: Pod = serde_json::from_value(json).map_err(|e| err(format!("Pod: {e}")))?;
                    let ns = p.metadata.namespace.clone().unwrap_or_else(|| "default".into());
                    let id = format!("{ns}/{}", p.metadata.name.clone().unwrap_or_default());
                    // Pods bound to a node (as `kubectl get pods -o yaml` prints running ones)
                    // are the cluster's load; the others wait for a place.
                    if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some_and(|n| !n.is_empty()) {
                        s.bound.push(p);
                    } else {
                        s.pods.push(ScenarioPod { id, pod: p });
                    }
                }
                ("PersistentVolumeClaim", _) => {
                    s.claims.push(serde_json::from_value(json).map_err(|e| err(format!("PersistentVolumeClaim: {e}")))?);
                }
                ("PersistentVolume", _) => {
                    s.volumes.push(serde_json::from_value(json).map_err(|e| err(format!("PersistentVolume: {e}")))?);
                }
                ("NodePool", API_VERSION | KARPENTER_API_VERSION) => {
                    s.pools.push(serde_json::from_value(json).map_err(|e| err(format!("NodePool: {e}")))?);
                }
                ("DaemonSet", _) => {
                    let d: DaemonSet = serde_json::from_value(json).map_err(|e| err(format!("DaemonSet: {e}")))?;
                    let t = d.spec.map(|s| s.template).unwrap_or_default();
                    s.daemonsets.push(Pod { metadata: t.metadata.unwrap_or_default(), spec: t.spec, status: None });
                }
                ("Node", _) => s.nodes.push(serde_json::from_value(json).map_err(|e| err(format!("Node: {e}")))?),
                (k, a) => s.ignored.push(format!("{a} {k}")),
            }
        }
        if s.pools.is_empty() {
            s.pools.push(NodePool::default_pool());
        }
        Ok(s)
    }

    /// The DaemonSets' pods as loads on new nodes.
    pub fn daemon_loads(&self) -> Vec<crate::core::packer::DaemonLoad> {
        self.daemonsets
            .iter()
            .map(|d| {
                let spec = d.spec.as_ref();
                crate::core::packer::DaemonLoad {
                    selector: Requirements::from_node_selector(&spec.and_then(|s| s.node_selector.clone()).unwrap_or_default()),
                    tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
                    requests: Resources { pods: 1, ..pod_requests(d, false) },
                }
            })
            .collect()
    }

    /// The cluster as kube-scheduler's rules see it: the scenario's nodes with their bound pods.
    pub fn volumes(&self) -> crate::core::sched::Volumes {
        crate::core::sched::Volumes::new(&self.claims.iter().collect::<Vec<_>>(), &self.volumes.iter().collect::<Vec<_>>())
    }

    pub fn snapshot(&self) -> crate::core::sched::Snapshot {
        crate::core::sched::Snapshot::new(&self.nodes, &self.bound, &[])
    }
}

/// The platforms recorded on the pod (the webhook's annotation), if any.
pub fn annotated_platforms(pod: &Pod) -> Option<PlatformSet> {
    let a = pod.metadata.annotations.as_ref()?.get(PLATFORMS_ANNOTATION)?;
    PlatformSet::parse_annotation(a).ok().filter(|p| !p.is_empty())
}

/// The packer's view of a pod, with `platforms` decided by the caller.
/// Labels the kubelet (or the cloud's node controller) puts on every node, beyond the ones an
/// offering names: a spread on them never rules a new node out.
const KUBELET_LABELS: [&str; 5] = [
    crate::core::labels::HOSTNAME,
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
];

/// AND the node affinity of the pod's bound volumes into its terms, so new nodes are bought where
/// its volumes are (each volume's terms are alternatives).
pub fn with_volume_terms(mut pod: PendingPod, volume_terms: &[Vec<k8s_openapi::api::core::v1::NodeSelectorTerm>]) -> PendingPod {
    for terms in volume_terms {
        let alternatives: Vec<Requirements> = terms.iter().filter_map(|t| Requirements::from_term(t).ok()).collect();
        if alternatives.is_empty() {
            continue;
        }
        pod.terms = if pod.terms.is_empty() { alternatives } else { pod.terms.iter().flat_map(|a| alternatives.iter().map(move |b| a.intersect(b))).collect() };
    }
    pod
}

pub fn pending_pod(p: &ScenarioPod, platforms: Option<PlatformSet>) -> PendingPod {
    let spec = p.pod.spec.as_ref();
    let selector = spec.and_then(|s| s.node_selector.clone()).unwrap_or_default();
    let base = Requirements::from_node_selector(&selector);
    let terms: Vec<Requirements> = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|r| r.node_selector_terms.iter().filter_map(|t| Requirements::from_term(t).ok()).map(|t| t.intersect(&base)).collect())
        .filter(|t: &Vec<Requirements>| !t.is_empty())
        .unwrap_or_else(|| if selector.is_empty() { Vec::new() } else { vec![base] });
    // Topology spread and anti-affinity on the pod's own group (its replicas).
    let own = p.pod.metadata.labels.clone().unwrap_or_default();
    let selects_own = |sel: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>| {
        sel.and_then(|s| s.match_labels.as_ref()).is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| own.get(k) == Some(v)))
    };
    let mut zone_spread = false;
    let mut per_node_max: Option<usize> = None;
    // The group those constraints count over: the pod's namespace and its own labels they select.
    let mut spread_group: Option<String> = None;
    let mut note_group = |sel: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>| {
        if spread_group.is_none() {
            let m = sel.and_then(|s| s.match_labels.as_ref()).map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")).unwrap_or_default();
            spread_group = Some(format!("{}|{m}", p.pod.metadata.namespace.as_deref().unwrap_or("default")));
        }
    };
    let spread_keys: Vec<String> = spec
        .and_then(|s| s.topology_spread_constraints.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.when_unsatisfiable == "DoNotSchedule" && !KUBELET_LABELS.contains(&c.topology_key.as_str()))
        .map(|c| c.topology_key.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for c in spec.and_then(|s| s.topology_spread_constraints.as_ref()).into_iter().flatten() {
        if !selects_own(c.label_selector.as_ref()) {
            continue;
        }
        match c.topology_key.as_str() {
            crate::core::labels::ZONE => {
                zone_spread = true;
                note_group(c.label_selector.as_ref());
            }
            crate::core::labels::HOSTNAME if c.when_unsatisfiable == "DoNotSchedule" => {
                let m = usize::try_from(c.max_skew.max(1)).unwrap_or(1);
                per_node_max = Some(per_node_max.map_or(m, |x| x.min(m)));
                note_group(c.label_selector.as_ref());
            }
            _ => {}
        }
    }
    let anti = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    if let Some(t) = anti.and_then(|terms| terms.iter().find(|t| t.topology_key == crate::core::labels::HOSTNAME && selects_own(t.label_selector.as_ref()))) {
        per_node_max = Some(1);
        note_group(t.label_selector.as_ref());
    }
    // Host ports: pods that ask for the same host port never share a node (NodePorts).
    let mut ports: Vec<String> = spec
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(s.containers.iter()))
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| format!("{}/{}", p.host_port.unwrap_or(0), p.protocol.as_deref().unwrap_or("TCP")))
        .collect();
    ports.sort();
    ports.dedup();
    if !ports.is_empty() && per_node_max.is_none() && spread_group.is_none() {
        per_node_max = Some(1);
        spread_group = Some(format!("host-ports|{}", ports.join(",")));
    }
    let one_per_zone = anti.is_some_and(|terms| terms.iter().any(|t| t.topology_key == crate::core::labels::ZONE && selects_own(t.label_selector.as_ref())));
    let colocate = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.pod_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
        .is_some_and(|terms| terms.iter().any(|t| t.topology_key == crate::core::labels::HOSTNAME && selects_own(t.label_selector.as_ref())));
    // Required pod affinity on the zone key: every pod whose affinity selects on the same label
    // keys (in its namespace) is put in one zone, which satisfies each of them whatever value it
    // selects (a conservative reading: one zone for the whole family of pods).
    let affinity = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.pod_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    let zone_group = affinity.and_then(|terms| terms.iter().find(|t| t.topology_key == crate::core::labels::ZONE)).map(|t| {
        let sel = t.label_selector.as_ref();
        let mut keys: Vec<&str> = sel.and_then(|s| s.match_labels.as_ref()).map(|m| m.keys().map(String::as_str).collect()).unwrap_or_default();
        keys.extend(sel.and_then(|s| s.match_expressions.as_ref()).map(|e| e.iter().map(|e| e.key.as_str()).collect::<Vec<_>>()).unwrap_or_default());
        keys.sort();
        keys.dedup();
        format!("{}|{}", p.pod.metadata.namespace.as_deref().unwrap_or("default"), keys.join(","))
    });
    let preferred: Vec<(i32, Requirements)> = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_ref())
        .map(|terms| terms.iter().filter_map(|t| Requirements::from_term(&t.preference).ok().map(|r| (t.weight, r))).collect())
        .unwrap_or_default();
    PendingPod {
        one_per_zone,
        colocate,
        spread_keys,
        extended: crate::core::sched::resources::pod_requests(&p.pod).0.into_iter().filter(|(k, v)| *v > 0 && k.contains('/') && !k.starts_with("hugepages-")).collect(),
        spread_group,
        preferred,
        zone_group,
        id: p.id.clone(),
        requests: pod_requests(&p.pod, false),
        terms,
        tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
        platforms,
        zone_spread,
        per_node_max,
    }
}

/// Images of all scenario pods, deduplicated, for one inspection pass.
pub fn all_images(pods: &[ScenarioPod]) -> Vec<String> {
    let mut seen = BTreeMap::new();
    for p in pods {
        if annotated_platforms(&p.pod).is_none() {
            for i in pod_images(&p.pod) {
                seen.insert(i, ());
            }
        }
    }
    seen.into_keys().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_pod(yaml: &str) -> PendingPod {
        let s = Scenario::parse(yaml).expect("scenario");
        pending_pod(&s.pods[0], None)
    }

    #[test]
    fn constraints_on_a_pods_own_group_become_packer_inputs() {
        let base = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: shop}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers: [{name: c, image: x, resources: {requests: {cpu: 250m, memory: 64Mi}}}]\n";
        let p = first_pod(base);
        assert_eq!((p.zone_spread, p.per_node_max, p.zone_group.clone()), (false, None, None));
        assert_eq!(p.requests, Resources::new(250, 64 << 20, 1));

        let spread = format!("{base}      topologySpreadConstraints:\n        - {{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway, labelSelector: {{matchLabels: {{app: web}}}}}}\n        - {{maxSkew: 2, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {{matchLabels: {{app: web}}}}}}\n");
        let p = first_pod(&spread);
        assert!(p.zone_spread);
        assert_eq!(p.per_node_max, Some(2));

        let other = format!("{base}      topologySpreadConstraints:\n        - {{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {{matchLabels: {{app: db}}}}}}\n");
        assert!(!first_pod(&other).zone_spread, "a spread over another group's pods is not the pod's own");

        let affinity = format!("{base}      affinity:\n        nodeAffinity:\n          preferredDuringSchedulingIgnoredDuringExecution:\n            - {{weight: 50, preference: {{matchExpressions: [{{key: kubernetes.io/arch, operator: In, values: [arm64]}}]}}}}\n        podAntiAffinity:\n          requiredDuringSchedulingIgnoredDuringExecution:\n            - {{topologyKey: kubernetes.io/hostname, labelSelector: {{matchLabels: {{app: web}}}}}}\n        podAffinity:\n          requiredDuringSchedulingIgnoredDuringExecution:\n            - {{topologyKey: topology.kubernetes.io/zone, labelSelector: {{matchLabels: {{cache: redis}}}}}}\n");
        let p = first_pod(&affinity);
        assert_eq!(p.per_node_max, Some(1));
        assert_eq!(p.zone_group.as_deref(), Some("shop|cache"));
        assert!(!p.one_per_zone && !p.colocate);
        assert_eq!(p.preferred.len(), 1);
        assert_eq!(p.preferred[0].0, 50);
        assert!(p.preferred[0].1.matches_map(&[("kubernetes.io/arch".to_string(), "arm64".to_string())].into_iter().collect()));

        let zone_anti = format!("{base}      affinity:\n        podAntiAffinity:\n          requiredDuringSchedulingIgnoredDuringExecution:\n            - {{topologyKey: topology.kubernetes.io/zone, labelSelector: {{matchLabels: {{app: web}}}}}}\n        podAffinity:\n          requiredDuringSchedulingIgnoredDuringExecution:\n            - {{topologyKey: kubernetes.io/hostname, labelSelector: {{matchLabels: {{app: web}}}}}}\n");
        let p = first_pod(&zone_anti);
        assert!(p.one_per_zone && p.colocate);
    }
}
