//! The one adapter from Kubernetes objects to the planner's inputs: a pending pod's packer and
//! scheduler views, and the cluster snapshot (nodes with their bound pods, in-flight claims as
//! nodes-to-be). The live worker (from its watch caches), `archer simulate` (from YAML) and
//! consolidation all build their inputs here, so they cannot decide on different pictures.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};

use archer_api::nodeclaim::NodeClaim;
use crate::objects;
use archer_core::labels;
use archer_core::packer::{PendingPod, Pool};
use archer_core::planner::{Pending, Step};
use archer_core::platform::PlatformSet;
use archer_core::requirements::Requirements;
use archer_core::resources::{pod_requests, Resources};
use archer_core::sched::resources::ResourceList;
use archer_core::sched::{preferences, NodeInfo, PodInfo, Snapshot, Volumes};

/// A pending pod for the planner: the packer's view and the scheduler's, both held to the zones
/// of the volumes its claims are bound to.
/// With [`preferences::Policy::Ignore`] new nodes are planned by its required rules alone.
pub fn pending(pod: &Pod, platforms: Option<PlatformSet>, volumes: &Volumes, policy: preferences::Policy) -> Pending {
    let terms = volumes.terms_for(pod);
    let id = objects::pod_id(pod);
    let views = |p: &Pod| Step { packer: with_volume_terms(pending_pod(&id, p, platforms.clone()), &terms), sched: PodInfo::from_pod(p).with_volumes(p, volumes) };
    let stricter = match policy {
        preferences::Policy::Respect => preferences::stricter(pod).iter().map(views).collect(),
        preferences::Policy::Ignore => Vec::new(),
    };
    let preferences = preferences::each(pod).into_iter().map(|(w, p)| (w, PodInfo::from_pod(&p).with_volumes(&p, volumes))).collect();
    let Step { packer, sched } = views(pod);
    // resourceVersion is opaque to clients; read as a number (etcd's revision, as every API
    // server writes it) it only orders interchangeable pods, and anything else sorts last.
    let queue_order = pod.metadata.resource_version.as_deref().and_then(|v| v.parse().ok()).unwrap_or(u64::MAX);
    Pending { packer, sched, stricter, preferences, planned: None, queue_order }
}

/// A running pod as the planner sees it when planned afresh (consolidation's moves, the
/// counterfactuals of the savings metrics and `archer report`): bound to no node, since kube-scheduler's NodeName rule would hold
/// it to its own, and planned nowhere.
pub fn pending_unbound(pod: &Pod, platforms: Option<PlatformSet>, volumes: &Volumes, policy: preferences::Policy) -> Pending {
    let mut unbound = pod.clone();
    if let Some(s) = unbound.spec.as_mut() {
        s.node_name = None;
    }
    pending(&unbound, platforms, volumes, policy)
}

/// Where the live claims' plans put pods (`namespace/name` -> the claim's node, or the claim
/// while it has none): a later batch keeps a pod there while that node takes it.
pub fn planned_nodes(claims: &[&NodeClaim]) -> HashMap<String, String> {
    claim_plans(claims).map(|(node, pod)| (pod.to_string(), node)).collect()
}

/// (node, pod) for every pod a live claim's plan names; the node is the claim's node, or the
/// claim's own name while it has none (kwok and the snapshot name it so).
fn claim_plans<'a>(claims: &'a [&'a NodeClaim]) -> impl Iterator<Item = (String, &'a str)> + 'a {
    claims.iter().filter(|c| !c.deleting()).flat_map(|c| {
        let node = c.node_name();
        let list = c.metadata.annotations.as_ref().and_then(|a| a.get(labels::PLANNED_PODS_ANNOTATION)).map(String::as_str).unwrap_or("");
        list.split(',').filter(|p| !p.is_empty()).map(move |p| (node.clone(), p))
    })
}

/// Labels the kubelet (or the cloud's node controller) puts on every node, beyond the ones an
/// offering names: a spread on them never rules a new node out.
const KUBELET_LABELS: [&str; 5] = [
    archer_core::labels::HOSTNAME,
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
];

/// AND the node affinity of the pod's bound volumes into its terms, so new nodes are bought where
/// its volumes are (each volume's terms are alternatives).
fn with_volume_terms(mut pod: PendingPod, volume_terms: &[Vec<k8s_openapi::api::core::v1::NodeSelectorTerm>]) -> PendingPod {
    for terms in volume_terms {
        let alternatives: Vec<Requirements> = terms.iter().filter_map(|t| Requirements::from_term(t).ok()).collect();
        if alternatives.is_empty() {
            continue;
        }
        pod.terms = if pod.terms.is_empty() { alternatives } else { pod.terms.iter().flat_map(|a| alternatives.iter().map(move |b| a.intersect(b))).collect() };
    }
    pod
}

/// Node label keys a launch fixes whatever instance type it gets.
const SHAPE_FREE_KEYS: [&str; 10] = [
    labels::ARCH,
    labels::OS,
    labels::ZONE,
    labels::REGION,
    labels::HOSTNAME,
    labels::KARPENTER_CAPACITY_TYPE,
    labels::CAPACITY_TYPE,
    labels::NODEPOOL,
    labels::KARPENTER_NODEPOOL,
    labels::KARPENTER_PROVISIONER_NAME,
];

/// Whether a pod selects nodes (node selector, required node affinity or topology spread) on a
/// label that depends on the instance type (the type itself, its family, size, ...).
pub fn selects_on_instance_shape(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return false };
    let mut keys: Vec<&str> = spec.node_selector.iter().flatten().map(|(k, _)| k.as_str()).collect();
    let terms = spec.affinity.as_ref().and_then(|a| a.node_affinity.as_ref()).and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
    for t in terms.iter().flat_map(|r| &r.node_selector_terms) {
        keys.extend(t.match_expressions.iter().flatten().map(|e| e.key.as_str()));
        keys.extend(t.match_fields.iter().flatten().map(|e| e.key.as_str()));
    }
    keys.extend(spec.topology_spread_constraints.iter().flatten().map(|c| c.topology_key.as_str()));
    keys.iter().any(|k| !SHAPE_FREE_KEYS.contains(k))
}

/// The packer's view of a pod, with `platforms` decided by the caller.
pub fn pending_pod(id: &str, pod: &Pod, platforms: Option<PlatformSet>) -> PendingPod {
    let spec = pod.spec.as_ref();
    let mut own = OwnGroup::of(pod);
    // Host ports: pods that ask for the same host port never share a node (NodePorts).
    if let Some(ports) = host_ports(pod) {
        if own.per_node_max.is_none() && own.spread_group.is_none() {
            own.per_node_max = Some(1);
            own.spread_group = Some(format!("host-ports|{ports}"));
        }
    }
    PendingPod {
        one_per_zone: own.one_per_zone,
        colocate: own.colocate,
        spread_keys: spread_keys(pod),
        extended: archer_core::sched::resources::pod_requests(pod).0.into_iter().filter(|(k, v)| *v > 0 && k.contains('/') && !k.starts_with("hugepages-")).collect(),
        spread_group: own.spread_group,
        preferred: preferred_terms(pod),
        zone_group: zone_group(pod),
        id: id.to_string(),
        requests: pod_requests(pod, false),
        terms: required_terms(pod),
        tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
        platforms,
        zone_spread: own.zone_spread,
        per_node_max: own.per_node_max,
    }
}

/// The pod's required node affinity terms, each with its nodeSelector folded in; the nodeSelector
/// alone when it has no terms.
fn required_terms(pod: &Pod) -> Vec<Requirements> {
    let spec = pod.spec.as_ref();
    let selector = spec.and_then(|s| s.node_selector.clone()).unwrap_or_default();
    let base = Requirements::from_node_selector(&selector);
    spec.and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|r| r.node_selector_terms.iter().filter_map(|t| Requirements::from_term(t).ok()).map(|t| t.intersect(&base)).collect())
        .filter(|t: &Vec<Requirements>| !t.is_empty())
        .unwrap_or_else(|| if selector.is_empty() { Vec::new() } else { vec![base] })
}

/// The preferred node affinity terms with their weights.
fn preferred_terms(pod: &Pod) -> Vec<(i32, Requirements)> {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_ref())
        .map(|terms| terms.iter().filter_map(|t| Requirements::from_term(&t.preference).ok().map(|r| (t.weight, r))).collect())
        .unwrap_or_default()
}

/// The keys of the pod's hard topology spreads a new node's labels decide (not the kubelet's).
fn spread_keys(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.topology_spread_constraints.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.when_unsatisfiable == "DoNotSchedule" && !KUBELET_LABELS.contains(&c.topology_key.as_str()))
        .map(|c| c.topology_key.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The host ports the pod's containers ask for (`port/protocol`, sorted, comma-separated).
fn host_ports(pod: &Pod) -> Option<String> {
    let mut ports: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(s.containers.iter()))
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| format!("{}/{}", p.host_port.unwrap_or(0), p.protocol.as_deref().unwrap_or("TCP")))
        .collect();
    ports.sort();
    ports.dedup();
    (!ports.is_empty()).then(|| ports.join(","))
}

/// Required pod affinity on the zone key: every pod whose affinity selects on the same label
/// keys (in its namespace) is put in one zone, which satisfies each of them whatever value it
/// selects (a conservative reading: one zone for the whole family of pods).
fn zone_group(pod: &Pod) -> Option<String> {
    let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref()).and_then(|a| a.pod_affinity.as_ref()).and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    affinity.and_then(|terms| terms.iter().find(|t| t.topology_key == archer_core::labels::ZONE)).map(|t| {
        let sel = t.label_selector.as_ref();
        let mut keys: Vec<&str> = sel.and_then(|s| s.match_labels.as_ref()).map(|m| m.keys().map(String::as_str).collect()).unwrap_or_default();
        keys.extend(sel.and_then(|s| s.match_expressions.as_ref()).map(|e| e.iter().map(|e| e.key.as_str()).collect::<Vec<_>>()).unwrap_or_default());
        keys.sort();
        keys.dedup();
        format!("{}|{}", pod.metadata.namespace.as_deref().unwrap_or("default"), keys.join(","))
    })
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
    fn of(pod: &Pod) -> OwnGroup {
        type Selector = k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
        let spec = pod.spec.as_ref();
        let own = pod.metadata.labels.clone().unwrap_or_default();
        let selects_own = |sel: Option<&Selector>| sel.and_then(|s| s.match_labels.as_ref()).is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| own.get(k) == Some(v)));
        let mut g = OwnGroup::default();
        // `matchLabelKeys` are merged into the selector from the pod's own labels, as
        // kube-scheduler does at admission (a key the pod lacks is ignored): two ReplicaSets of
        // one Deployment (`pod-template-hash`) are two groups.
        let note_group = |group: &mut Option<String>, sel: Option<&Selector>, keys: Option<&Vec<String>>| {
            if group.is_none() {
                let mut m: BTreeMap<&str, &str> = sel.and_then(|s| s.match_labels.as_ref()).into_iter().flatten().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                for k in keys.into_iter().flatten() {
                    if let Some(v) = own.get(k) {
                        m.insert(k, v);
                    }
                }
                let m = m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
                *group = Some(format!("{}|{m}", pod.metadata.namespace.as_deref().unwrap_or("default")));
            }
        };
        // A ScheduleAnyway constraint is a preference: the step of the pod that takes it as a
        // rule has it as DoNotSchedule ([`preferences::stricter`]).
        for c in spec.and_then(|s| s.topology_spread_constraints.as_ref()).into_iter().flatten().filter(|c| c.when_unsatisfiable == "DoNotSchedule" && selects_own(c.label_selector.as_ref())) {
            match c.topology_key.as_str() {
                archer_core::labels::ZONE => {
                    g.zone_spread = true;
                    note_group(&mut g.spread_group, c.label_selector.as_ref(), c.match_label_keys.as_ref());
                }
                archer_core::labels::HOSTNAME => {
                    let m = usize::try_from(c.max_skew.max(1)).unwrap_or(1);
                    g.per_node_max = Some(g.per_node_max.map_or(m, |x| x.min(m)));
                    note_group(&mut g.spread_group, c.label_selector.as_ref(), c.match_label_keys.as_ref());
                }
                _ => {}
            }
        }
        let affinity = spec.and_then(|s| s.affinity.as_ref());
        let anti = affinity.and_then(|a| a.pod_anti_affinity.as_ref()).and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
        if let Some(t) = anti.and_then(|terms| terms.iter().find(|t| t.topology_key == archer_core::labels::HOSTNAME && selects_own(t.label_selector.as_ref()))) {
            g.per_node_max = Some(1);
            note_group(&mut g.spread_group, t.label_selector.as_ref(), t.match_label_keys.as_ref());
        }
        g.one_per_zone = anti.is_some_and(|terms| terms.iter().any(|t| t.topology_key == archer_core::labels::ZONE && selects_own(t.label_selector.as_ref())));
        g.colocate = affinity
            .and_then(|a| a.pod_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
            .is_some_and(|terms| terms.iter().any(|t| t.topology_key == archer_core::labels::HOSTNAME && selects_own(t.label_selector.as_ref())));
        g
    }
}

/// The cluster as kube-scheduler's rules see it ([`archer_core::sched::Snapshot`]): every node
/// with the pods bound there (one on its way out takes none, but its pods count), and every claim whose node is not there yet,
/// with their room: taints a starting node sheds are left out, and a node (or claim) with no pods
/// yet holds its DaemonSets' room. `skip` names nodes to leave out (those a disruption is about
/// to remove).
pub fn cluster_snapshot(nodes: &[&Node], claims: &[&NodeClaim], pods: &[&Pod], namespaces: &[&Namespace], pools: &[Pool], skip: &dyn Fn(&str) -> bool) -> Snapshot {
    let mut snap = Snapshot::with_namespaces(namespaces.iter().filter_map(|n| Some((n.metadata.name.clone()?, n.metadata.labels.clone().unwrap_or_default()))).collect());
    let bound = objects::usage_by_node(pods.iter().copied());
    let mut seen = std::collections::HashSet::new();
    let mut claim_by_node: HashMap<&str, &NodeClaim> = claims.iter().map(|c| (c.metadata.name.as_deref().unwrap_or(""), *c)).collect();
    claim_by_node.extend(claims.iter().filter_map(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()).map(|n| (n, *c))));
    let pool_of = |c: Option<&NodeClaim>| c.and_then(|c| pools.iter().find(|p| p.name == c.spec.node_pool));
    for n in nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        seen.insert(name.clone());
        if skip(&name) {
            continue;
        }
        let claim = claim_by_node.get(name.as_str()).copied();
        let startup: Vec<&str> = claim.map(|c| c.spec.startup_taints.iter().map(|t| t.key.as_str()).collect()).unwrap_or_default();
        let mut info = NodeInfo::from_node(n);
        info.taints.retain(|t| !objects::EPHEMERAL_TAINTS.contains(&t.key.as_str()) && !startup.contains(&t.key.as_str()));
        // A node on its way out takes no pod, but its pods still count for topology spread and
        // inter-pod affinity until they are gone, as they do for kube-scheduler.
        info.unschedulable |= objects::node_leaving(n);
        let on_node = bound.get(&name).map(|b| b.1.clone()).unwrap_or_default();
        if on_node.is_empty() {
            if let Some(pool) = pool_of(claim) {
                hold_daemon_room(&mut info, pool);
            }
        }
        let i = snap.nodes.len();
        snap.nodes.push(info);
        for p in on_node {
            snap.bind(PodInfo::from_pod(p), i);
        }
    }
    for c in claims {
        // The node-to-be is named as its node will be.
        let name = c.node_name();
        if c.deleting() || seen.contains(&name) || seen.contains(&c.name()) || skip(&name) || skip(&c.name()) {
            continue;
        }
        let mut labels = c.spec.labels.clone();
        labels.insert(labels::HOSTNAME.into(), name.clone());
        let alloc: BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> =
            c.spec.allocatable.iter().map(|(k, v)| (k.clone(), k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.clone()))).collect();
        let mut allocatable = ResourceList::from_api(Some(&alloc));
        let max_pods = allocatable.0.remove("pods").unwrap_or(110);
        let mut info = NodeInfo {
            name,
            labels,
            taints: c.spec.taints.iter().map(archer_api::nodepool::TaintDoc::to_taint).collect(),
            unschedulable: false,
            allocatable,
            max_pods,
            requested: ResourceList::default(),
            pods: Vec::new(),
        };
        if let Some(pool) = pool_of(Some(c)) {
            hold_daemon_room(&mut info, pool);
        }
        snap.nodes.push(info);
    }
    // Pending pods a live plan put on a node still coming hold their room there.
    let index: HashMap<String, usize> = snap.nodes.iter().enumerate().map(|(i, n)| (n.name.clone(), i)).collect();
    for (pod, node) in covered(claims, nodes, pods) {
        if let Some(&i) = index.get(&node) {
            snap.bind(PodInfo::from_pod(pod), i);
        }
    }
    snap
}

/// Pending pods a live plan already placed, with the node (or claim) they were put on: the pods
/// a NodeClaim's plan named ([`labels::PLANNED_PODS_ANNOTATION`]) while its node is still coming
/// (not there, or not registered or Ready yet) or came up less than [`PLANNED_POD_GRACE`] ago
/// (kube-scheduler is still binding the pods it was bought for). They are not planned again, and
/// their room on that node is held, so the next batch neither buys a second node for them nor
/// gives their room away. Afterwards a pod still pending is planned afresh.
pub fn covered<'a>(claims: &[&NodeClaim], nodes: &[&Node], pods: &[&'a Pod]) -> Vec<(&'a Pod, String)> {
    let by_name: HashMap<&str, &Node> = nodes.iter().filter_map(|n| Some((n.metadata.name.as_deref()?, *n))).collect();
    // Once the node is registered and Ready its free room is in the snapshot: a pod still
    // pending is planned again (it stays on that node if it still fits: `Pending::planned`).
    let coming = |node: &str| by_name.get(node).is_none_or(|n| !objects::node_ready(n) || objects::has_taint(n, labels::UNREGISTERED_TAINT) || objects::ready_for(n).is_some_and(|d| d < PLANNED_POD_GRACE));
    let planned: HashMap<&str, String> = claim_plans(claims).filter(|(node, _)| coming(node)).map(|(node, pod)| (pod, node)).collect();
    if planned.is_empty() {
        return Vec::new();
    }
    pods.iter()
        .copied()
        .filter(|p| archer_core::awaits_node(p))
        .filter_map(|p| planned.get(objects::pod_id(p).as_str()).map(|n| (p, n.clone())))
        .collect()
}

/// How long after its node came up a pod the plan put there is left to kube-scheduler before it
/// is planned again (re-planning it while it is being bound bought nodes that stayed empty).
const PLANNED_POD_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Hold the room the pool's DaemonSets will take on a node that has none of its pods yet.
fn hold_daemon_room(info: &mut NodeInfo, pool: &Pool) {
    let allocatable = Resources::new(info.allocatable.get("cpu"), info.allocatable.get("memory"), info.max_pods);
    let held = allocatable - pool.room(&info.labels, allocatable);
    info.requested.add(&ResourceList([("cpu".to_string(), held.cpu_millis), ("memory".to_string(), held.memory_bytes)].into()));
    info.max_pods -= held.pods;
}

