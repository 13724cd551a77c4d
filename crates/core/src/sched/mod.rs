//! kube-scheduler's filter rules (v1.34) as pure functions over a snapshot of the cluster: which
//! nodes a pod may be bound to, and why the others are refused.
//!
//! The plugins modelled, with kube-scheduler's reasons: NodeUnschedulable, NodeName,
//! NodeAffinity (nodeSelector AND one of the required terms), TaintToleration (NoSchedule and
//! NoExecute), NodePorts, NodeResourcesFit (every resource, including extended resources and
//! `ephemeral-storage`, and the pod count), PodTopologySpread (DoNotSchedule constraints with
//! `maxSkew`, `minDomains`, `nodeAffinityPolicy`, `nodeTaintsPolicy`, `matchLabelKeys`) and
//! InterPodAffinity (required affinity and anti-affinity of the incoming pod, and the required
//! anti-affinity of pods already running, with `namespaces` and `namespaceSelector`).
//! Each pod placed with [`Snapshot::bind`] counts for the pods decided after it. Preferences
//! (preferred pod affinity and anti-affinity, ScheduleAnyway spread) only score in kube-scheduler;
//! the planner takes them as rules while it can ([`preferences`]).
#![allow(clippy::indexing_slicing, reason = "the scheduling model indexes its own vectors by indices it built from them; no index comes from input")]

mod interpod;
mod memo;
pub mod preferences;
pub mod resources;
pub mod selector;
mod spread;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Namespace, Node, NodeSelectorTerm, PersistentVolume, PersistentVolumeClaim, Pod, PodAffinityTerm, Taint, Toleration, WeightedPodAffinityTerm};

use resources::ResourceList;
use selector::{Labels, NodeFields, Selector};

/// A pod as the filters read it.
#[derive(Debug, Clone)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    pub requests: ResourceList,
    pub host_ports: Vec<HostPort>,
    pub node_name: Option<String>,
    pub node_selector: Labels,
    /// Required node affinity terms (ORed), when the pod has any.
    pub required_terms: Option<Vec<NodeSelectorTerm>>,
    /// Preferred node affinity terms with their weights (NodeAffinity's score).
    pub preferred_terms: Vec<(i32, NodeSelectorTerm)>,
    pub tolerations: Vec<Toleration>,
    /// DoNotSchedule topology spread constraints (ScheduleAnyway ones only score).
    pub spread: Vec<spread::Constraint>,
    pub affinity: Vec<AffinityTerm>,
    pub anti_affinity: Vec<AffinityTerm>,
    /// Preferred pod affinity and anti-affinity terms with their weights: they only score (a
    /// running pod's count toward the pods that come after it, see [`Snapshot::affinity_scores`]).
    pub preferred_affinity: Vec<(i32, AffinityTerm)>,
    pub preferred_anti_affinity: Vec<(i32, AffinityTerm)>,
    pub terminating: bool,
    /// The required node affinity of each PersistentVolume its claims are bound to (all hold).
    pub volume_terms: Vec<Vec<NodeSelectorTerm>>,
    /// Domains a new node for this pod could be in, per topology key (from the NodePools and
    /// offerings that could host it). They count as empty domains of its spread constraints when
    /// the planner decides on new nodes, as Karpenter counts them; kube-scheduler's own pass over
    /// existing nodes leaves this empty.
    pub potential: BTreeMap<String, BTreeSet<String>>,
}

/// A host port a container asks for: (host IP, protocol, port). `0.0.0.0` means every address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    pub ip: String,
    pub protocol: String,
    pub port: i32,
}

impl HostPort {
    fn conflicts(&self, o: &HostPort) -> bool {
        let any = |ip: &str| ip.is_empty() || ip == "0.0.0.0" || ip == "::";
        self.port == o.port && self.protocol == o.protocol && (self.ip == o.ip || any(&self.ip) || any(&o.ip))
    }
}

/// A required pod (anti-)affinity term with its namespaces resolved against its pod.
#[derive(Debug, Clone)]
pub struct AffinityTerm {
    pub selector: Selector,
    /// Named namespaces; with no selector either, the term's own pod's namespace.
    pub namespaces: BTreeSet<String>,
    pub namespace_selector: Selector,
    pub topology_key: String,
}

impl AffinityTerm {
    fn from_api(t: &PodAffinityTerm, own_namespace: &str, own_labels: &Labels) -> Self {
        let mut namespaces: BTreeSet<String> = t.namespaces.iter().flatten().cloned().collect();
        if namespaces.is_empty() && t.namespace_selector.is_none() {
            namespaces.insert(own_namespace.to_string());
        }
        let mut selector = Selector::from_api(t.label_selector.as_ref());
        for key in t.match_label_keys.iter().flatten() {
            if let Some(v) = own_labels.get(key) {
                selector = selector.and_equals(key, v);
            }
        }
        Self { selector, namespaces, namespace_selector: Selector::from_api(t.namespace_selector.as_ref()), topology_key: t.topology_key.clone() }
    }

    /// Does the term select `pod` (whose namespace carries `ns_labels`)?
    fn matches(&self, pod: &PodInfo, ns_labels: &Labels) -> bool {
        (self.namespaces.contains(&pod.namespace) || self.namespace_selector.matches(ns_labels)) && self.selector.matches(&pod.labels)
    }
}

impl PodInfo {
    pub fn from_pod(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
        let labels: Labels = meta.labels.clone().unwrap_or_default();
        let affinity = spec.and_then(|s| s.affinity.as_ref());
        let pod_terms = |required: Option<&Vec<PodAffinityTerm>>| -> Vec<AffinityTerm> {
            required.into_iter().flatten().map(|t| AffinityTerm::from_api(t, &namespace, &labels)).collect()
        };
        let weighted = |preferred: Option<&Vec<WeightedPodAffinityTerm>>| -> Vec<(i32, AffinityTerm)> {
            preferred.into_iter().flatten().map(|w| (w.weight, AffinityTerm::from_api(&w.pod_affinity_term, &namespace, &labels))).collect()
        };
        let host_ports = spec
            .into_iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(s.containers.iter()))
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.host_port.is_some_and(|h| h > 0))
            .map(|p| HostPort { ip: p.host_ip.clone().unwrap_or_default(), protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()), port: p.host_port.unwrap_or(0) })
            .collect();
        PodInfo {
            name: meta.name.clone().unwrap_or_default(),
            requests: resources::pod_requests(pod),
            host_ports,
            node_name: spec.and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty()),
            node_selector: spec.and_then(|s| s.node_selector.clone()).unwrap_or_default(),
            required_terms: affinity
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
                .map(|r| r.node_selector_terms.clone()),
            preferred_terms: affinity
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_ref())
                .map(|terms| terms.iter().map(|t| (t.weight, t.preference.clone())).collect())
                .unwrap_or_default(),
            tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
            spread: spec.map(|s| spread::Constraint::from_pod(s, &labels)).unwrap_or_default(),
            affinity: pod_terms(affinity.and_then(|a| a.pod_affinity.as_ref()).and_then(|p| p.required_during_scheduling_ignored_during_execution.as_ref())),
            anti_affinity: pod_terms(affinity.and_then(|a| a.pod_anti_affinity.as_ref()).and_then(|p| p.required_during_scheduling_ignored_during_execution.as_ref())),
            preferred_affinity: weighted(affinity.and_then(|a| a.pod_affinity.as_ref()).and_then(|p| p.preferred_during_scheduling_ignored_during_execution.as_ref())),
            preferred_anti_affinity: weighted(affinity.and_then(|a| a.pod_anti_affinity.as_ref()).and_then(|p| p.preferred_during_scheduling_ignored_during_execution.as_ref())),
            terminating: meta.deletion_timestamp.is_some(),
            volume_terms: Vec::new(),
            potential: BTreeMap::new(),
            labels,
            namespace,
        }
    }

    /// With the node affinity of the volumes its claims are bound to (VolumeBinding and
    /// VolumeZone: a pod whose claim is bound to a zonal volume stays in that zone).
    pub fn with_volumes(mut self, pod: &Pod, volumes: &Volumes) -> Self {
        self.volume_terms = volumes.terms_for(pod);
        self
    }

    /// The pod's nodeSelector and required node affinity (NodeAffinity's filter).
    fn node_affinity_matches(&self, node: &NodeInfo) -> bool {
        self.admits_node(&node.name, &node.labels)
    }

    /// Whether the pod's nodeSelector and required node affinity admit a node of this name and
    /// these labels.
    pub fn admits_node(&self, name: &str, labels: &Labels) -> bool {
        let fields = NodeFields { name, labels };
        self.node_selector.iter().all(|(k, v)| labels.get(k) == Some(v)) && self.required_terms.as_ref().is_none_or(|t| selector::node_matches_terms(t, &fields))
    }
}

/// PersistentVolumeClaims and the PersistentVolumes they are bound to.
#[derive(Debug, Clone, Default)]
pub struct Volumes {
    /// (namespace, claim) -> the volume it is bound to, if any.
    claims: BTreeMap<(String, String), Option<String>>,
    /// volume -> its required node affinity terms.
    volumes: BTreeMap<String, Vec<NodeSelectorTerm>>,
}

impl Volumes {
    pub fn new(claims: &[&PersistentVolumeClaim], volumes: &[&PersistentVolume]) -> Self {
        Volumes {
            claims: claims
                .iter()
                .map(|c| ((c.metadata.namespace.clone().unwrap_or_else(|| "default".into()), c.metadata.name.clone().unwrap_or_default()), c.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty())))
                .collect(),
            volumes: volumes
                .iter()
                .filter_map(|v| {
                    let terms = v.spec.as_ref()?.node_affinity.as_ref()?.required.as_ref()?.node_selector_terms.clone();
                    Some((v.metadata.name.clone()?, terms))
                })
                .collect(),
        }
    }

    /// The node affinity each of the pod's bound claims imposes. A claim not bound yet (its
    /// class binds on first consumer) imposes nothing: the volume follows the pod.
    fn terms_for(&self, pod: &Pod) -> Vec<Vec<NodeSelectorTerm>> {
        let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        pod.spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .filter_map(|c| self.claims.get(&(ns.clone(), c.claim_name.clone()))?.as_ref())
            .filter_map(|pv| self.volumes.get(pv).cloned())
            .collect()
    }
}

/// A node as the filters read it, with the pods bound (or planned) there.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    pub labels: Labels,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub allocatable: ResourceList,
    pub max_pods: i64,
    /// Sum of the requests of its pods.
    pub requested: ResourceList,
    /// Indices into [`Snapshot::pods`].
    pub pods: Vec<usize>,
}

impl NodeInfo {
    pub fn from_node(node: &Node) -> Self {
        let alloc = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let mut allocatable = ResourceList::from_api(alloc);
        let max_pods = allocatable.0.remove("pods").unwrap_or(110);
        NodeInfo {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default(),
            unschedulable: node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
            allocatable,
            max_pods,
            requested: ResourceList::default(),
            pods: Vec::new(),
        }
    }
}

/// A requirement on a topology domain of a new node: `key In values` or `key NotIn values`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DomainRule {
    pub key: String,
    pub allowed: bool,
    pub values: BTreeSet<String>,
}

/// Why a node cannot take a pod, worded as kube-scheduler words it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    #[error("node(s) were unschedulable")]
    Unschedulable,
    #[error("node(s) didn't match the requested node name")]
    NodeName,
    #[error("node(s) didn't match Pod's node affinity/selector")]
    NodeAffinity,
    #[error("node(s) had volume node affinity conflict")]
    VolumeNodeAffinity,
    #[error("node(s) had untolerated taint {{{0}}}")]
    Taint(String),
    #[error("node(s) didn't have free ports for the requested pod ports")]
    Ports,
    #[error("Too many pods")]
    TooManyPods,
    #[error("Insufficient {0}")]
    Insufficient(String),
    #[error("node(s) didn't match pod topology spread constraints (missing required label {0})")]
    SpreadLabelMissing(String),
    #[error("node(s) didn't match pod topology spread constraints: on {key}, {domain} would have a skew of {skew} (maxSkew {max_skew})")]
    Spread { key: String, domain: String, skew: i64, max_skew: i32 },
    #[error("topology spread on {key}: maxSkew {max_skew} cannot be met in {}", domains.join(", "))]
    SpreadNowhere { key: String, max_skew: i32, domains: Vec<String> },
    #[error("pod affinity on {0}: the pods it must join run on nodes a new node cannot be")]
    AffinityElsewhere(String),
    #[error("node(s) didn't match pod affinity rules")]
    Affinity,
    #[error("node(s) didn't match pod anti-affinity rules")]
    AntiAffinity,
    #[error("node(s) didn't satisfy existing pods anti-affinity rules")]
    ExistingAntiAffinity,
}

/// The cluster as the filters see it.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub nodes: Vec<NodeInfo>,
    pub pods: Vec<PodInfo>,
    /// Namespace name -> its labels (for `namespaceSelector`).
    pub namespace_labels: BTreeMap<String, Labels>,
    /// Placed pods that carry required anti-affinity (indices into `pods`, and of their nodes): a pod without terms
    /// of its own need only look at these.
    with_anti_affinity: Vec<(usize, usize)>,
    /// Placed pods whose terms score the pods that come after them (required affinity, preferred
    /// affinity or anti-affinity), and their nodes.
    with_scoring_terms: Vec<(usize, usize)>,
    /// Per kind of incoming pod (namespace, labels), what `with_scoring_terms` gives it and how
    /// many of them that covers: pods are only ever added, so a later call adds the newer ones.
    scoring: std::cell::RefCell<std::collections::HashMap<(String, Labels), (usize, TopologyScores)>>,
    /// Each kind of pod's spread counts and inter-pod domains, kept up to date by [`Snapshot::bind`].
    memo: std::cell::RefCell<memo::Memo>,
}

/// A score per topology domain: `(key, value)` -> score.
type TopologyScores = BTreeMap<(String, String), i64>;

/// What a running pod's required affinity term that selects the incoming pod adds to a node's
/// score (kube-scheduler's `hardPodAffinityWeight`, 1 by default).
const HARD_POD_AFFINITY_WEIGHT: i64 = 1;

impl Snapshot {
    /// From API objects: every node, the pods bound to them (others are ignored), namespaces.
    pub fn new(nodes: &[Node], pods: &[Pod], namespaces: &[Namespace]) -> Self {
        let mut s = Snapshot {
            nodes: nodes.iter().map(NodeInfo::from_node).collect(),
            pods: Vec::new(),
            namespace_labels: namespaces.iter().filter_map(|n| Some((n.metadata.name.clone()?, n.metadata.labels.clone().unwrap_or_default()))).collect(),
            with_anti_affinity: Vec::new(),
            with_scoring_terms: Vec::new(),
            scoring: Default::default(),
            memo: Default::default(),
        };
        // One lookup table, not a scan of every node per bound pod.
        let index: std::collections::HashMap<String, usize> = s.nodes.iter().enumerate().map(|(i, n)| (n.name.clone(), i)).collect();
        for p in pods {
            let info = PodInfo::from_pod(p);
            if let Some(&i) = info.node_name.as_ref().and_then(|n| index.get(n)) {
                s.bind(info, i);
            }
        }
        s
    }

    /// No nodes yet, namespaces with these labels.
    pub fn with_namespaces(namespace_labels: BTreeMap<String, Labels>) -> Self {
        Snapshot { namespace_labels, ..Default::default() }
    }

    pub(crate) fn node_index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    fn ns_labels(&self, namespace: &str) -> &Labels {
        static EMPTY: Labels = BTreeMap::new();
        self.namespace_labels.get(namespace).unwrap_or(&EMPTY)
    }

    /// Record `pod` on node `i` (bound, or placed by a plan): it counts from now on.
    pub fn bind(&mut self, mut pod: PodInfo, i: usize) {
        pod.node_name = Some(self.nodes[i].name.clone());
        let mut memo = std::mem::take(self.memo.get_mut());
        memo.bind(self, &pod, i);
        *self.memo.get_mut() = memo;
        if !pod.anti_affinity.is_empty() {
            self.with_anti_affinity.push((self.pods.len(), i));
        }
        if !(pod.affinity.is_empty() && pod.preferred_affinity.is_empty() && pod.preferred_anti_affinity.is_empty()) {
            self.with_scoring_terms.push((self.pods.len(), i));
        }
        self.nodes[i].requested.add(&pod.requests);
        self.nodes[i].pods.push(self.pods.len());
        self.pods.push(pod);
    }

    /// What placed pods' own terms add to the score of each node for `pod`, as kube-scheduler's
    /// InterPodAffinity scores them: for every running pod whose preferred affinity term selects
    /// `pod`, the term's weight goes to each node sharing that pod's node's value of the term's
    /// topology key; a preferred anti-affinity term takes its weight away; a required affinity
    /// term that selects `pod` adds 1 (`hardPodAffinityWeight`). `(key, value)` -> score. The
    /// incoming pod's own preferences are scored by the planner.
    pub(crate) fn affinity_scores(&self, pod: &PodInfo) -> TopologyScores {
        let own_ns = self.ns_labels(&pod.namespace);
        let mut cache = self.scoring.borrow_mut();
        let (done, scores) = cache.entry((pod.namespace.clone(), pod.labels.clone())).or_default();
        for &(p, n) in &self.with_scoring_terms[(*done).min(self.with_scoring_terms.len())..] {
            let other = &self.pods[p];
            if other.terminating {
                continue;
            }
            let hard = other.affinity.iter().map(|t| (HARD_POD_AFFINITY_WEIGHT, t));
            let preferred = other.preferred_affinity.iter().map(|(w, t)| (i64::from(*w), t));
            let avoided = other.preferred_anti_affinity.iter().map(|(w, t)| (-i64::from(*w), t));
            for (weight, t) in hard.chain(preferred).chain(avoided) {
                if let Some(v) = self.nodes[n].labels.get(&t.topology_key).filter(|_| t.matches(pod, own_ns)) {
                    *scores.entry((t.topology_key.clone(), v.clone())).or_default() += weight;
                }
            }
        }
        *done = self.with_scoring_terms.len();
        scores.iter().filter(|(_, s)| **s != 0).map(|(k, s)| (k.clone(), *s)).collect()
    }

    /// Every node the pod may be bound to, or for each node why not.
    pub(crate) fn feasible(&self, pod: &PodInfo) -> Vec<Result<usize, (usize, Unfit)>> {
        self.memo.borrow_mut().with(self, pod, |spread, interpod| (0..self.nodes.len()).map(|i| self.filter(pod, i, spread, interpod).map(|()| i).map_err(|e| (i, e))).collect())
    }

    /// The first node (in snapshot order) that takes the pod, or the reasons for each refusal.
    #[cfg(test)]
    fn first_fit(&self, pod: &PodInfo) -> Result<usize, Vec<(usize, Unfit)>> {
        let mut why = Vec::new();
        for r in self.feasible(pod) {
            match r {
                Ok(i) => return Ok(i),
                Err(e) => why.push(e),
            }
        }
        Err(why)
    }

    /// Does node `i` take the pod? (One node's verdict; [`Snapshot::feasible`] gives them all.)
    pub fn fits(&self, pod: &PodInfo, i: usize) -> Result<(), Unfit> {
        self.memo.borrow_mut().with(self, pod, |spread, interpod| self.filter(pod, i, spread, interpod))
    }

    /// What a *new* node must satisfy for the pod, as requirements on topology domains: for each
    /// DoNotSchedule spread constraint the domains where one more matching pod keeps the skew
    /// within `maxSkew` (counting [`PodInfo::potential`] domains as empty), and for required pod
    /// affinity and anti-affinity (its own and running pods') the domains it must or must not be
    /// in. Hostname-keyed rules need nothing: a new node is a domain of its own, except affinity
    /// to a pod already running on some node, which no new node meets. `Err`: no domain can work.
    pub(crate) fn new_node_domains(&self, pod: &PodInfo) -> Result<Vec<DomainRule>, Unfit> {
        self.memo.borrow_mut().with(self, pod, |spread, interpod| {
            let mut rules = spread.allowed(pod)?;
            rules.extend(interpod.domain_rules()?);
            Ok(rules)
        })
    }

    /// [`Snapshot::feasible`] with the state computed afresh (tests compare the memo with it).
    #[cfg(test)]
    fn feasible_fresh(&self, pod: &PodInfo) -> Vec<Result<usize, (usize, Unfit)>> {
        let (spread, interpod) = (spread::State::new(self, pod), interpod::State::new(self, pod));
        (0..self.nodes.len()).map(|i| self.filter(pod, i, &spread, &interpod).map(|()| i).map_err(|e| (i, e))).collect()
    }

    fn filter(&self, pod: &PodInfo, i: usize, spread: &spread::State, interpod: &interpod::State) -> Result<(), Unfit> {
        let node = &self.nodes[i];
        if node.unschedulable && !pod.tolerations.iter().any(|t| crate::taints::tolerates(t, "node.kubernetes.io/unschedulable", "", "NoSchedule")) {
            return Err(Unfit::Unschedulable);
        }
        if pod.node_name.as_ref().is_some_and(|n| n != &node.name) {
            return Err(Unfit::NodeName);
        }
        if !pod.node_affinity_matches(node) {
            return Err(Unfit::NodeAffinity);
        }
        let fields = NodeFields { name: &node.name, labels: &node.labels };
        if !pod.volume_terms.iter().all(|t| selector::node_matches_terms(t, &fields)) {
            return Err(Unfit::VolumeNodeAffinity);
        }
        if let Some(t) = crate::taints::untolerated(&node.taints, &pod.tolerations) {
            return Err(Unfit::Taint(format!("{}: {}", t.key, t.value.as_deref().unwrap_or(""))));
        }
        self.room_for(pod, i)?;
        spread.filter(self, pod, node)?;
        interpod.filter(node)
    }

    /// What node `i` alone decides: room ([`Snapshot::room_for`]) and inter-pod anti-affinity
    /// both ways with the pods placed on it (a node is in every domain it has a label for, so a
    /// conflict there is a conflict anywhere; conflicts with pods on other nodes are not seen).
    pub fn room_and_anti_affinity(&self, pod: &PodInfo, i: usize) -> Result<(), Unfit> {
        self.room_for(pod, i)?;
        self.memo.borrow_mut().with(self, pod, |_, interpod| match interpod.filter(&self.nodes[i]) {
            Err(e @ (Unfit::AntiAffinity | Unfit::ExistingAntiAffinity)) => Err(e),
            _ => Ok(()),
        })
    }

    /// Does node `i` have room for the pod: free host ports, a pod slot, and every requested
    /// resource (NodePorts and NodeResourcesFit)? The rest of the filters aside.
    fn room_for(&self, pod: &PodInfo, i: usize) -> Result<(), Unfit> {
        let node = &self.nodes[i];
        let used_ports = node.pods.iter().flat_map(|&p| self.pods[p].host_ports.iter());
        if used_ports.into_iter().any(|u| pod.host_ports.iter().any(|w| w.conflicts(u))) {
            return Err(Unfit::Ports);
        }
        if node.pods.len() as i64 + 1 > node.max_pods {
            return Err(Unfit::TooManyPods);
        }
        let mut free = node.allocatable.clone();
        free.sub(&node.requested);
        if let Some((name, _, _)) = pod.requests.first_short(&free) {
            return Err(Unfit::Insufficient(name.to_string()));
        }
        Ok(())
    }
}
