//! A scenario: ordinary Kubernetes YAML (Deployments with replicas, Pods, NodePools, existing
//! Nodes), turned into the packer's inputs.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use archer_api::nodepool::NodePool;
use archer_core::placement::pod_images;
use crate::ClusterState;

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("not YAML: {0}")]
    Yaml(String),
    #[error("document {index}: {message}")]
    Document { index: usize, message: String },
    #[error("NodePool {pool}: {source}")]
    Pool { pool: String, source: archer_core::requirements::RequirementError },
}

/// What the planner decides on for a scenario, built by the same adapter as the live worker's.
pub struct Inputs {
    pub pending: Vec<archer_core::planner::Pending>,
    pub pools: Vec<archer_core::packer::Pool>,
    /// The state's offerings (the catalog's in the pools' zones).
    pub offerings: Arc<Vec<archer_core::packer::Offering>>,
    pub snapshot: archer_core::sched::Snapshot,
    /// Pods whose image platforms are unknown (assumed to run anywhere).
    pub assumed: usize,
    /// `pending` as their owners would write them for amd64 (the comparison's:
    /// [`crate::counterfactual`]).
    pub on_amd64: Vec<archer_core::planner::Pending>,
}

/// A pod to place, with what the packer needs and where its platforms come from.
#[derive(Debug, Clone)]
pub struct ScenarioPod {
    pub id: String,
    pub pod: Pod,
}

#[derive(Debug, Default)]
pub struct Scenario {
    /// The cluster it describes: nodes, pods (bound ones and those to place), pools, volumes,
    /// DaemonSets.
    pub state: ClusterState,
    /// The pods to place, in the scenario's order.
    pub pods: Vec<ScenarioPod>,
    /// Kinds that were ignored, for the report.
    pub ignored: Vec<String>,
    /// Fields of the scenario's objects that their types do not have, with their path
    /// (`document 2: NodePool default: spec.wieght`): serde skips them, so a misspelt field
    /// would otherwise change nothing without a word.
    pub unknown_fields: Vec<String>,
}

impl Scenario {
    pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        let mut s = Scenario::default();
        let docs = archer_core::yaml::objects(text).map_err(|e| ScenarioError::Yaml(e.to_string()))?;
        for (index, json) in docs.into_iter().enumerate() {
            let err = |message: String| ScenarioError::Document { index: index + 1, message };
            if json.is_null() {
                continue;
            }
            let kind = json.get("kind").and_then(|k| k.as_str()).unwrap_or_default().to_string();
            if kind == "Deployment" {
                let mut unknown = Vec::new();
                let d: Arc<Deployment> = crate::cluster::read_object("Deployment", json, &mut unknown).map_err(|e| err(e.to_string()))?;
                s.unknown_fields.extend(unknown.into_iter().map(|u| format!("document {}: {u}", index + 1)));
                let d = Arc::unwrap_or_clone(d);
                let name = d.metadata.name.clone().unwrap_or_default();
                let ns = d.metadata.namespace.clone().unwrap_or_else(|| "default".into());
                let spec = d.spec.ok_or_else(|| err(format!("Deployment {name} has no spec")))?;
                let replicas = spec.replicas.unwrap_or(1).max(0);
                for i in 0..replicas {
                    let mut meta = spec.template.metadata.clone().unwrap_or_default();
                    meta.name = Some(format!("{name}-{i}"));
                    meta.namespace = Some(ns.clone());
                    let pod = Pod { metadata: meta, spec: spec.template.spec.clone(), status: None };
                    s.state.pods.push(Arc::new(pod.clone()));
                    s.pods.push(ScenarioPod { id: format!("{ns}/{name}-{i}"), pod });
                }
                continue;
            }
            // Pods bound to a node (as `kubectl get pods -o yaml` prints running ones) are the
            // cluster's load; the others wait for a place.
            let to_place = kind == "Pod" && json.pointer("/spec/nodeName").and_then(|n| n.as_str()).is_none_or(str::is_empty);
            let mut unknown = Vec::new();
            let added = s.state.add(json, &mut unknown).map_err(|e| err(e.to_string()))?;
            s.unknown_fields.extend(unknown.into_iter().map(|u| format!("document {}: {u}", index + 1)));
            match added {
                Some(other) => s.ignored.push(other),
                None if to_place => {
                    if let Some(p) = s.state.pods.last() {
                        let id = format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or("default"), p.metadata.name.as_deref().unwrap_or_default());
                        s.pods.push(ScenarioPod { id, pod: (**p).clone() });
                    }
                }
                None => {}
            }
        }
        if s.state.pools.is_empty() {
            s.state.pools.push(Arc::new(NodePool::default_pool()));
        }
        Ok(s)
    }

    /// The scenario's cluster as if Archer had launched its pools' nodes, long ago: each node of
    /// a pool with an offering among `offerings` (instance type, zone and capacity type labels)
    /// gets a NodeClaim priced by it, in place of any claim the scenario has (a dump's claims
    /// record what was paid then; a plan compares with the catalog now), and is taken as Ready
    /// and registered. Disruption then reads it by the worker's own rule
    /// ([`crate::disruption::candidates`]); a node with no offering gets no claim and is left
    /// alone.
    pub fn as_launched(&self, offerings: &[archer_core::packer::Offering]) -> ClusterState {
        use k8s_openapi::api::core::v1::NodeCondition;
        let mut state = self.state.clone();
        let mut claims = Vec::new();
        for node in &mut state.nodes {
            let Some(pool) = crate::objects::node_pool_of(node).map(str::to_string) else { continue };
            let labels = node.metadata.labels.clone().unwrap_or_default();
            let Some(price) = archer_core::packer::Offering::of_node(offerings, &|k| labels.get(k).cloned()).map(|o| o.price) else { continue };
            let name = node.metadata.name.clone().unwrap_or_default();
            let n = Arc::make_mut(node);
            let conditions = n.status.get_or_insert_with(Default::default).conditions.get_or_insert_with(Vec::new);
            conditions.retain(|c| c.type_ != "Ready");
            conditions.push(NodeCondition { type_: "Ready".into(), status: "True".into(), ..Default::default() });
            if let Some(taints) = n.spec.as_mut().and_then(|s| s.taints.as_mut()) {
                taints.retain(|t| t.key != archer_core::labels::UNREGISTERED_TAINT);
            }
            let labels = crate::objects::labels_of(n);
            let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
            claims.push(Arc::new(archer_api::nodeclaim::NodeClaim {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta { name: Some(name.clone()), ..Default::default() },
                spec: archer_api::nodeclaim::NodeClaimSpec { node_pool: pool, instance_type: get(archer_core::labels::INSTANCE_TYPE), zone: get(archer_core::labels::ZONE), price_per_hour: price, ..Default::default() },
                status: Some(archer_api::nodeclaim::NodeClaimStatus { node_name: Some(name), launched_at: Some("1970-01-01T00:00:00Z".into()), ..Default::default() }),
            }));
        }
        state.claims = claims;
        state.now_ms = 0;
        state
    }

    /// Pods bound to the scenario's nodes.
    pub fn bound(&self) -> impl Iterator<Item = &Pod> {
        self.state.pods.iter().map(|p| p.as_ref()).filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty()))
    }

    /// The planner's inputs: each pending pod with its platforms (its annotation, else the
    /// platforms the state knows for all its images, else unknown), the pools with the scenario's
    /// DaemonSets, offerings in the pools' zones, and the cluster as the live worker sees it.
    /// Also fills the state's offerings: the catalog's, in every zone a pool allows, with the
    /// scenario's NodeOverlays applied.
    pub fn inputs(&mut self, catalog: &archer_core::catalog::Catalog, policy: archer_core::sched::preferences::Policy) -> Result<Inputs, ScenarioError> {
        use crate::adapter;
        let volumes = self.state.volumes();
        let mut assumed = 0;
        let mut on_amd64 = Vec::with_capacity(self.pods.len());
        let pending = self
            .pods
            .iter()
            .map(|p| {
                let platforms = self.state.pod_platforms(&p.pod);
                assumed += usize::from(platforms.is_none());
                let pending = adapter::pending(&p.pod, platforms.clone(), &volumes, policy).with_id(&p.id);
                on_amd64.push(crate::counterfactual::pending_on_amd64(&p.pod, platforms.as_ref(), &pending, |rewritten| adapter::pending(rewritten, platforms.clone(), &volumes, policy)));
                pending
            })
            .collect();
        // A pool that cannot be read is an error here (the live worker skips it with a log line).
        for p in &self.state.pools {
            p.to_pool().map_err(|source| ScenarioError::Pool { pool: p.name(), source })?;
        }
        let pools = self.state.packer_pools();
        let mut zones: Vec<String> = self.state.pools.iter().flat_map(|p| p.zones()).collect();
        zones.sort();
        zones.dedup();
        self.state.overlay_offerings(Arc::new(archer_api::nodepool::offerings(catalog, &zones)));
        let offerings = self.state.offerings.clone();
        let snapshot = self.state.snapshot(&pools, &|_| false);
        Ok(Inputs { pending, pools, offerings, snapshot, assumed, on_amd64 })
    }
}

/// Images of all scenario pods, deduplicated, for one inspection pass.
pub fn all_images(pods: &[ScenarioPod]) -> Vec<String> {
    let mut seen = BTreeMap::new();
    for p in pods {
        if archer_core::placement::recorded_platforms(&p.pod).is_none() {
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
    use archer_core::resources::Resources;

    fn first_pod(yaml: &str) -> archer_core::packer::PendingPod {
        let s = Scenario::parse(yaml).expect("scenario");
        crate::adapter::pending_pod(&s.pods[0].id, &s.pods[0].pod, None)
    }

    #[test]
    fn constraints_on_a_pods_own_group_become_packer_inputs() {
        let base = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: shop}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers: [{name: c, image: x, resources: {requests: {cpu: 250m, memory: 64Mi}}}]\n";
        let p = first_pod(base);
        assert_eq!((p.zone_spread, p.per_node_max, p.zone_group.clone()), (false, None, None));
        assert_eq!(p.requests, Resources::new(250, 64 << 20, 1));

        let spread = format!("{base}      topologySpreadConstraints:\n        - {{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway, labelSelector: {{matchLabels: {{app: web}}}}}}\n        - {{maxSkew: 2, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {{matchLabels: {{app: web}}}}}}\n");
        let p = first_pod(&spread);
        assert!(!p.zone_spread, "a ScheduleAnyway spread is a preference: only the stricter step has it");
        assert_eq!(p.per_node_max, Some(2));
        let s = Scenario::parse(&spread).expect("scenario");
        let strict = archer_core::sched::preferences::stricter(&s.pods[0].pod);
        assert_eq!(strict.len(), 1);
        let p = crate::adapter::pending_pod(&s.pods[0].id, &strict[0], None);
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
