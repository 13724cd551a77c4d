//! The cluster at one moment: every object the provisioner's decisions read, in one value. The
//! runtime builds it from its watch caches, `archer simulate` from a scenario or a cluster dump;
//! the planner's inputs (pools with their room, kube-scheduler's snapshot, volumes, DaemonSet
//! loads, what a live plan already covers) are made from it here, once, for both.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};

use archer_api::nodeclaim::NodeClaim;
use archer_api::nodeoverlay::NodeOverlay;
use archer_api::nodepool::NodePool;
use archer_core::catalog::Catalog;
use archer_core::packer::{DaemonLoad, Offering, Pool};
use archer_core::platform::PlatformSet;
use archer_core::policy::{Policy, PolicyDefaults};
use archer_core::safety_net::SafetyRecord;
use archer_core::sched::{Snapshot, Volumes};

use crate::plans::Plans;
use crate::{adapter, objects};

/// Every object the deciding code reads, as the cluster had them at one moment.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    pub nodes: Vec<Arc<Node>>,
    /// Every pod: bound, waiting for a node, finishing.
    pub pods: Vec<Arc<Pod>>,
    pub claims: Vec<Arc<NodeClaim>>,
    pub pools: Vec<Arc<NodePool>>,
    pub namespaces: Vec<Arc<Namespace>>,
    pub daemonsets: Vec<Arc<DaemonSet>>,
    pub volume_claims: Vec<Arc<PersistentVolumeClaim>>,
    pub volumes: Vec<Arc<PersistentVolume>>,
    /// What can be launched now, with its prices: the provider's offerings (for a scenario, the
    /// catalog's in the pools' zones).
    pub offerings: Arc<Vec<Offering>>,
    /// Pools that may launch nothing now, and why (their node class is not ready), by name.
    pub closed_pools: BTreeMap<String, String>,
    /// The platforms of the images inspected for this state, by image reference (the runtime
    /// inspects the pods a decision reads, `archer simulate` its scenario's images up front). A
    /// pod's own record (the webhook's annotation) comes first: [`ClusterState::pod_platforms`].
    pub platforms: BTreeMap<String, PlatformSet>,
    /// The digests the images inspected for this state resolved to, by image reference: what
    /// the safety record's entries are keyed by.
    pub digests: BTreeMap<String, String>,
    /// The safety net's record at this moment: image digests found broken on an architecture.
    pub safety: Arc<SafetyRecord>,
    /// Where the provisioner's recent plans put pending pods, and which nodes recently finished
    /// registering (this process's; empty for a scenario).
    pub plans: Plans,
    /// Karpenter's NodeOverlays (`karpenter.sh/v1alpha1`): the user's own prices, applied to
    /// `offerings` by [`ClusterState::overlay_offerings`].
    pub overlays: Vec<Arc<NodeOverlay>>,
    /// What became of each overlay when `offerings` were overlaid, by name.
    pub overlay_outcomes: BTreeMap<String, crate::overlay::Outcome>,
    /// The price catalog, for nodes no claim or offering prices ([`crate::price`]).
    pub catalog: Option<Arc<Catalog>>,
    /// The cluster-wide policy defaults (the config's `defaults`) that namespaces' annotations
    /// override: [`ClusterState::policy`].
    pub policy_defaults: Arc<PolicyDefaults>,
    /// When this state was taken (Unix milliseconds): the safety record's entries expire, claims
    /// age. (Plans age on their own clock, [`Plans::now_ms`].)
    pub now_ms: i64,
}

/// Why an object of a dump or scenario could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ObjectError {
    pub kind: String,
    pub message: String,
}

/// `o` as a `T`, each field `T` does not have added to `unknown` as `Kind name: field path`
/// (serde ignores them; a person who misspelt one should hear of it).
pub fn read_object<T: serde::de::DeserializeOwned>(kind: &str, o: serde_json::Value, unknown: &mut Vec<String>) -> Result<Arc<T>, ObjectError> {
    let name = o.pointer("/metadata/name").and_then(|n| n.as_str()).unwrap_or_default().to_string();
    let mut found: Vec<String> = Vec::new();
    let read = serde_ignored::deserialize(o, |path| {
        let path = path.to_string();
        // The type fields chose the type; a derived custom resource does not keep them.
        if path != "apiVersion" && path != "kind" && !found.contains(&path) {
            found.push(path);
        }
    });
    unknown.extend(found.iter().map(|path| unknown_field(kind, &name, path)));
    read.map(Arc::new).map_err(|e| ObjectError { kind: kind.to_string(), message: e.to_string() })
}

/// How an unknown field is named to people: `NodePool default: spec.wieght`.
pub fn unknown_field(kind: &str, name: &str, path: &str) -> String {
    if name.is_empty() {
        format!("{kind}: {path}")
    } else {
        format!("{kind} {name}: {path}")
    }
}

/// [`ClusterState::pricer`].
pub struct Pricer<'a> {
    state: &'a ClusterState,
    claims: HashMap<&'a str, &'a Arc<NodeClaim>>,
}

impl Pricer<'_> {
    /// `node`'s hourly price and where it came from, or why it has none.
    pub fn price(&self, node: &Node) -> Result<crate::price::NodePrice, crate::price::Unpriced> {
        let labels = node.metadata.labels.as_ref();
        let annotation = node.metadata.annotations.as_ref().and_then(|a| a.get(archer_core::labels::PRICE_ANNOTATION)).map(String::as_str);
        let claim = node.metadata.name.as_deref().and_then(|n| self.claims.get(n)).map(|c| c.spec.price_per_hour);
        let sources = crate::price::Sources { offerings: &self.state.offerings, catalog: self.state.catalog.as_deref(), max_per_hour: crate::price::DEFAULT_MAX_PER_HOUR };
        crate::price::node_price(&sources, &|k| labels.and_then(|l| l.get(k)).cloned(), annotation, claim)
    }

    /// The price alone, when known.
    pub fn per_hour(&self, node: &Node) -> Option<f64> {
        self.price(node).ok().map(|p| p.per_hour)
    }
}

/// The objects of one kind as plain references (what the adapter's functions take).
pub fn refs<T>(v: &[Arc<T>]) -> Vec<&T> {
    v.iter().map(Arc::as_ref).collect()
}

impl ClusterState {
    /// Where a pod may be placed: the webhook's record of its platforms, else the intersection
    /// of its images' platforms as this state knows them; `None` (unknown: assumed to run
    /// anywhere) when an image is not known. Either way less the architectures the safety record
    /// holds broken, for the pod's namespace, on the digests its images resolved to, and less
    /// those its namespace's policy forbids ([`Policy::placeable`]): the rules the extender
    /// filters by, so no plan buys a node the extender then refuses.
    pub fn pod_platforms(&self, pod: &Pod) -> Option<PlatformSet> {
        let platforms = archer_core::placement::pod_platforms(pod, &|i| self.platforms.get(i))?;
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let digests = archer_core::placement::pod_images(pod).into_iter().filter_map(|i| self.digests.get(&i).cloned());
        let runnable = self.safety.exclude_all(digests, namespace, self.now_ms.div_euclid(1000), &platforms);
        Some(self.policy(namespace).placeable(&runnable))
    }

    /// Set the offerings every decision reads: `offerings` with this state's NodeOverlays
    /// applied ([`crate::overlay`]), and what became of each overlay.
    pub fn overlay_offerings(&mut self, offerings: Arc<Vec<Offering>>) {
        if self.overlays.is_empty() {
            self.offerings = offerings;
            self.overlay_outcomes.clear();
            return;
        }
        let overlaid = crate::overlay::apply(&self.overlays, &self.pools, &offerings);
        self.offerings = Arc::new(overlaid.offerings);
        self.overlay_outcomes = overlaid.outcomes;
    }

    /// A namespace's placement policy: its `archer.dev/*` annotations over
    /// [`ClusterState::policy_defaults`] (annotations that cannot be used give way to the
    /// default; the webhook reports them). A namespace this state does not hold has the defaults.
    pub fn policy(&self, namespace: &str) -> Policy {
        let annotations = self
            .namespaces
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(namespace))
            .and_then(|n| n.metadata.annotations.clone())
            .unwrap_or_default();
        archer_core::policy::resolve(&self.policy_defaults, &annotations).0
    }

    /// Whether the platforms of `pod` depend on an image digest this state has not resolved:
    /// the safety record names one of its images for its namespace, and the digest that image
    /// resolves to now is unknown (the webhook's record on the pod does not say it).
    pub fn needs_digests(&self, pod: &Pod) -> bool {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        archer_core::placement::pod_images(pod).iter().any(|i| !self.digests.contains_key(i) && self.safety.mentions_image(i, namespace, self.now_ms.div_euclid(1000)))
    }

    /// A cluster dump (`kubectl get nodes,pods,... -o yaml`, or documents): every object read
    /// in, the kinds that were not (`apiVersion Kind`), and the fields Archer does not know
    /// ([`unknown_field`]).
    pub fn from_objects(objects: impl IntoIterator<Item = serde_json::Value>) -> Result<(ClusterState, Vec<String>, Vec<String>), ObjectError> {
        let mut state = ClusterState::default();
        let mut ignored = Vec::new();
        let mut unknown = Vec::new();
        for o in objects.into_iter().filter(|o| !o.is_null()) {
            if let Some(kind) = state.add(o, &mut unknown)? {
                ignored.push(kind);
            }
        }
        Ok((state, ignored, unknown))
    }

    /// Read one object into the state. `Ok(Some(what))` for a kind the state does not keep
    /// (`apiVersion Kind`: a NodePool of another group than Archer's or Karpenter's
    /// `karpenter.sh/v1`; a document without a kind says so). Fields the object's type does not
    /// have (a misspelt `wieght`, a field of a newer API) go to `unknown`, with their path.
    pub fn add(&mut self, object: serde_json::Value, unknown: &mut Vec<String>) -> Result<Option<String>, ObjectError> {
        let kind = object.get("kind").and_then(|k| k.as_str()).unwrap_or_default().to_string();
        let api = object.get("apiVersion").and_then(|k| k.as_str()).unwrap_or_default().to_string();
        match (kind.as_str(), api.as_str()) {
            ("Node", _) => self.nodes.push(read_object(&kind, object, unknown)?),
            ("Pod", _) => self.pods.push(read_object(&kind, object, unknown)?),
            ("NodeClaim", archer_api::nodepool::API_VERSION) => self.claims.push(read_object(&kind, object, unknown)?),
            ("NodePool", archer_api::nodepool::API_VERSION | archer_api::nodepool::KARPENTER_API_VERSION) => self.pools.push(read_object(&kind, object, unknown)?),
            ("Namespace", _) => self.namespaces.push(read_object(&kind, object, unknown)?),
            ("DaemonSet", _) => self.daemonsets.push(read_object(&kind, object, unknown)?),
            ("PersistentVolumeClaim", _) => self.volume_claims.push(read_object(&kind, object, unknown)?),
            ("PersistentVolume", _) => self.volumes.push(read_object(&kind, object, unknown)?),
            ("NodeOverlay", "karpenter.sh/v1alpha1") => self.overlays.push(read_object(&kind, object, unknown)?),
            ("", _) => {
                let name = object.pointer("/metadata/name").and_then(|n| n.as_str()).map(|n| format!(" (metadata.name {n})")).unwrap_or_default();
                return Ok(Some(format!("a document without a kind{name}")));
            }
            _ => return Ok(Some(format!("{api} {kind}").trim().to_string())),
        }
        Ok(None)
    }

    /// The pods bound to the node of that name (running, finishing or done).
    pub fn pods_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Arc<Pod>> + 'a {
        self.pods.iter().filter(move |p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
    }

    /// The node of that name.
    pub fn node(&self, name: &str) -> Option<&Arc<Node>> {
        self.nodes.iter().find(|n| n.metadata.name.as_deref() == Some(name))
    }

    /// The claim whose node has that name.
    pub fn claim_of_node(&self, node: &str) -> Option<&Arc<NodeClaim>> {
        self.claims.iter().find(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
    }

    /// Every node by name, for lookups in a loop.
    pub(crate) fn nodes_by_name(&self) -> HashMap<&str, &Arc<Node>> {
        self.nodes.iter().filter_map(|n| Some((n.metadata.name.as_deref()?, n))).collect()
    }

    /// Every launched claim by the name of its node ([`Self::claim_of_node`], for a loop).
    pub(crate) fn claims_by_node(&self) -> HashMap<&str, &Arc<NodeClaim>> {
        self.claims.iter().filter_map(|c| Some((c.status.as_ref()?.node_name.as_deref()?, c))).collect()
    }

    /// Nodes' prices by the one rule ([`crate::price::node_price`]: the node's annotation, its
    /// claim, the offerings, the catalog), the claims indexed once for many nodes.
    pub fn pricer(&self) -> Pricer<'_> {
        Pricer { state: self, claims: self.claims_by_node() }
    }

    /// The DaemonSets' pods as loads on the nodes they would run on.
    pub fn daemon_loads(&self) -> Vec<DaemonLoad> {
        self.daemonsets.iter().map(|d| objects::daemon_load(d)).collect()
    }

    /// The volume claims and the volumes they are bound to.
    pub fn volumes(&self) -> Volumes {
        Volumes::new(&refs(&self.volume_claims), &refs(&self.volumes))
    }

    /// The packer's pools: each NodePool with the room left under its limits and the
    /// DaemonSets that would run on its nodes (see [`objects::packer_pools`]); a pool in
    /// `closed_pools` keeps no room for a new node.
    pub fn packer_pools(&self) -> Vec<Pool> {
        let closed = |np: &NodePool| self.closed_pools.get(&np.name()).cloned();
        objects::packer_pools(&refs(&self.pools), &refs(&self.claims), &self.daemon_loads(), &closed)
    }

    /// The cluster as kube-scheduler's rules see it, leaving out the nodes `skip` names (see
    /// [`adapter::cluster_snapshot`]).
    pub fn snapshot(&self, pools: &[Pool], skip: &dyn Fn(&str) -> bool) -> Snapshot {
        adapter::cluster_snapshot(&refs(&self.nodes), &refs(&self.claims), &refs(&self.pods), &refs(&self.namespaces), pools, skip)
    }

    /// Pending pods a live plan already placed on a node still coming (see [`adapter::covered`]).
    pub fn covered(&self) -> HashSet<String> {
        adapter::covered(&refs(&self.claims), &refs(&self.nodes), &refs(&self.pods)).into_iter().map(|(p, _)| objects::pod_id(p)).collect()
    }

    /// The pods a batch plans: those the provisioner should find room for
    /// ([`objects::is_provisionable`] with the `eager` schedulers), less those a live plan
    /// covers; and the covered ones.
    pub fn provisionable(&self, eager: &[String]) -> (Vec<Arc<Pod>>, HashSet<String>) {
        let covered = self.covered();
        let pending = self.pods.iter().filter(|p| objects::is_provisionable(p, eager) && !covered.contains(&objects::pod_id(p))).cloned().collect();
        (pending, covered)
    }

    /// The node each pod was planned onto by a live claim (the claims' record, after a restart).
    pub fn planned_nodes(&self) -> HashMap<String, String> {
        adapter::planned_nodes(&refs(&self.claims))
    }

    /// Why `pool` must not be consolidated now (see [`objects::consolidation_hold`]).
    pub fn consolidation_hold(&self, pool: &str, waiting: &[String]) -> Option<String> {
        objects::consolidation_hold(pool, &refs(&self.claims), &refs(&self.nodes), waiting)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_dump_reads_every_kind_the_decisions_use_and_names_the_rest() {
        let objects = vec![
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"}, "spec": {"containers": [], "nodeName": "n1"}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a", "labels": {"team": "x"}}}),
            json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": "c"}, "spec": {"nodePool": "general", "instanceType": "m7g.large", "zone": "us-east-1a", "capacityType": "spot", "arch": "arm64", "os": "linux", "pricePerHour": 0.03}}),
            json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "k"}, "spec": {"template": {"spec": {"requirements": []}}}}),
            json!({"apiVersion": "example.com/v1", "kind": "NodePool", "metadata": {"name": "other"}}),
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d"}, "spec": {"selector": {}, "template": {"spec": {"containers": []}}}}),
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data", "namespace": "a"}}),
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv"}}),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}),
            serde_json::Value::Null,
        ];
        let (state, ignored, _) = ClusterState::from_objects(objects).expect("dump");
        assert_eq!((state.nodes.len(), state.pods.len(), state.namespaces.len(), state.claims.len(), state.pools.len()), (1, 1, 1, 1, 1));
        assert_eq!((state.daemonsets.len(), state.volume_claims.len(), state.volumes.len()), (1, 1, 1));
        assert_eq!(ignored, ["example.com/v1 NodePool", "v1 Service"]);
        assert!(state.node("n1").is_some() && state.node("n2").is_none());
        let snapshot = state.snapshot(&state.packer_pools(), &|_| false);
        assert_eq!(snapshot.nodes.len(), 2, "the node, and the claim's node still coming");
        let err = ClusterState::from_objects(vec![json!({"apiVersion": "v1", "kind": "Pod", "spec": 3})]).expect_err("malformed");
        assert_eq!(err.kind, "Pod");
    }

    #[test]
    fn a_pods_platforms_are_its_record_else_every_image_known() {
        let pod = |annotations: serde_json::Value, images: &[&str]| -> Pod {
            let containers: Vec<_> = images.iter().enumerate().map(|(i, image)| json!({"name": format!("c{i}"), "image": image})).collect();
            serde_json::from_value(json!({"metadata": {"name": "p", "annotations": annotations}, "spec": {"containers": containers}})).expect("pod")
        };
        let set = |s: &str| PlatformSet::parse_annotation(s).expect("platforms");
        let mut state = ClusterState::default();
        state.platforms.insert("web".into(), set("linux/amd64,linux/arm64"));
        state.platforms.insert("sidecar".into(), set("linux/arm64"));
        assert_eq!(state.pod_platforms(&pod(json!({}), &["web", "sidecar"])), Some(set("linux/arm64")), "the images' intersection");
        assert_eq!(state.pod_platforms(&pod(json!({}), &["web", "unknown"])), None, "one image unknown: the pod's platforms are");
        let recorded = pod(json!({"archer.dev/platforms": "linux/amd64"}), &["sidecar"]);
        assert_eq!(state.pod_platforms(&recorded), Some(set("linux/amd64")), "the webhook's record comes first");
    }

    /// A pending pod `shop/web` (500m, 512Mi, image `example.com/web:1`) with `annotations`, and
    /// the on-demand pool `general` of m6g.large and m6i.large: the arm64 node is the cheaper.
    pub(crate) fn web_pod_and_pool(annotations: serde_json::Value) -> (Pod, NodePool) {
        let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": "example.com/web:1", "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}))
        .expect("pod");
        let pool: NodePool = serde_json::from_value(json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodePool", "metadata": {"name": "general"},
            "spec": {"template": {"spec": {"requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m6g.large", "m6i.large"]}]}}}}))
        .expect("pool");
        (pod, pool)
    }

    /// The webhook recorded the pod's platforms before the safety net found its image broken on
    /// arm64: the plan must not buy arm64 for it (the extender would refuse that node).
    #[test]
    fn a_pod_annotated_before_a_detection_is_not_planned_onto_the_broken_architecture() {
        use archer_core::safety_net::{Broken, Limits};
        let (pod, pool) = web_pod_and_pool(json!({"archer.dev/platforms": "linux/amd64,linux/arm64"}));
        let mut state = ClusterState { pods: vec![Arc::new(pod.clone())], pools: vec![Arc::new(pool)], offerings: Arc::new(Offering::embedded_on_demand()), now_ms: 1_000_000, ..Default::default() };
        let arch_planned = |state: &ClusterState| {
            let pools = state.packer_pools();
            let pending = [adapter::pending(&pod, state.pod_platforms(&pod), &state.volumes(), Default::default())];
            let plan = archer_core::planner::plan_batch(&state.snapshot(&pools, &|_| false), &pending, &pools, &state.offerings);
            plan.nodes.first().map(|n| n.arch.clone())
        };
        assert_eq!(arch_planned(&state).as_deref(), Some("arm64"), "arm64 (m6g.large) is the cheaper of the two");

        let mut record = SafetyRecord::default();
        let entry = Broken { digest: "sha256:d1".into(), arch: "arm64".into(), image: "example.com/web:1".into(), at: 900, namespace: "shop".into(), verified: false, expires: 900 + 3600 };
        assert!(record.learn(entry, &Limits { broken_ttl_seconds: 3600, ..Limits::default() }));
        state.safety = Arc::new(record);
        assert!(state.needs_digests(&pod), "the record names the pod's image: its digest decides");
        state.digests.insert("example.com/web:1".into(), "sha256:d1".into());
        assert!(!state.needs_digests(&pod));
        assert_eq!(state.pod_platforms(&pod), PlatformSet::parse_annotation("linux/amd64").ok(), "the record takes arm64 away from the annotation");
        assert_eq!(arch_planned(&state).as_deref(), Some("amd64"));

        // The state is shared by every namespace's pods: a pod of the same image elsewhere,
        // whose platforms come from the image as the registry gave them, keeps arm64.
        state.platforms.insert("example.com/web:1".into(), PlatformSet::parse_annotation("linux/amd64,linux/arm64").expect("platforms"));
        let mut other: Pod = pod.clone();
        other.metadata.namespace = Some("blog".into());
        other.metadata.annotations = None;
        assert_eq!(state.pod_platforms(&other), PlatformSet::parse_annotation("linux/amd64,linux/arm64").ok(), "another namespace's detection");
        let mut unannotated = pod.clone();
        unannotated.metadata.annotations = None;
        assert_eq!(state.pod_platforms(&unannotated), PlatformSet::parse_annotation("linux/amd64").ok(), "the detection's own namespace");

        // The same tag at another digest, or the entry past its time, takes nothing.
        let mut elsewhere = state.clone();
        elsewhere.digests.insert("example.com/web:1".into(), "sha256:d2".into());
        assert_eq!(arch_planned(&elsewhere).as_deref(), Some("arm64"), "the tag now names another digest");
        let mut later = state.clone();
        later.now_ms = (900 + 3601) * 1000;
        assert_eq!(arch_planned(&later).as_deref(), Some("arm64"), "the entry expired");
    }

    /// The batcher's inputs from a recorded state: which pods a batch plans, which a live plan
    /// covers, and where a restarted worker finds what it planned.
    #[test]
    fn a_batch_plans_the_unschedulable_pods_no_live_plan_covers() {
        let pod = |name: &str, extra: serde_json::Value| {
            let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "1", "controller": true}]},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}});
            if let (Some(p), Some(e)) = (p.as_object_mut(), extra.as_object()) {
                for (k, v) in e {
                    if let (Some(serde_json::Value::Object(have)), serde_json::Value::Object(add)) = (p.get_mut(k), v) {
                        have.extend(add.clone());
                    }
                }
            }
            p
        };
        let objects = vec![
            pod("waiting", json!({})),
            pod("planned", json!({})),
            pod("bound", json!({"spec": {"nodeName": "n1"}})),
            pod("gated", json!({"spec": {"schedulingGates": [{"name": "example.com/wait"}]}})),
            pod("untried", json!({"status": {"conditions": []}})),
            json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": "general-abc", "annotations": {archer_core::labels::PLANNED_PODS_ANNOTATION: "default/planned"}},
                   "spec": {"nodePool": "general", "instanceType": "m7g.large", "zone": "us-east-1a", "capacityType": "spot", "arch": "arm64", "os": "linux", "pricePerHour": 0.03}}),
        ];
        let (state, _, _) = ClusterState::from_objects(objects).expect("state");
        let (pending, covered) = state.provisionable(&[]);
        let names: Vec<&str> = pending.iter().filter_map(|p| p.metadata.name.as_deref()).collect();
        assert_eq!(names, ["waiting"], "bound, gated, covered and untried pods are not planned");
        assert_eq!(covered.into_iter().collect::<Vec<_>>(), ["default/planned"]);
        let (eager, _) = state.provisionable(&["default-scheduler".to_string()]);
        assert_eq!(eager.len(), 2, "a pod the extender's scheduler has not tried yet is planned at once");
        assert_eq!(state.planned_nodes().get("default/planned").map(String::as_str), Some("general-abc"));
    }
}
