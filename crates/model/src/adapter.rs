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
use archer_core::resources::Resources;
use archer_core::sched::resources::ResourceList;
use archer_core::sched::{preferences, NodeInfo, PodInfo, Snapshot, Volumes};

/// A pending pod for the planner: the packer's view and the scheduler's, both held to the zones
/// of the volumes its claims are bound to.
/// With [`preferences::Policy::Ignore`] new nodes are planned by its required rules alone.
pub fn pending(pod: &Pod, platforms: Option<PlatformSet>, volumes: &Volumes, policy: preferences::Policy) -> Pending {
    let id = objects::pod_id(pod);
    let views = |p: &Pod| {
        let sched = PodInfo::from_pod(p).with_volumes(p, volumes);
        Step { packer: PendingPod::from_info(&id, &sched, platforms.clone()), sched }
    };
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
pub(crate) fn selects_on_instance_shape(pod: &Pod) -> bool {
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

/// The packer's view of a pod, with `platforms` decided by the caller (read from its scheduler
/// view: [`PendingPod::from_info`]).
#[cfg(test)]
pub(crate) fn pending_pod(id: &str, pod: &Pod, platforms: Option<PlatformSet>) -> PendingPod {
    PendingPod::from_info(id, &PodInfo::from_pod(pod), platforms)
}

/// The cluster as kube-scheduler's rules see it ([`archer_core::sched::Snapshot`]): every node
/// with the pods bound there (one on its way out takes none, but its pods count), and every claim whose node is not there yet,
/// with their room: taints a starting node sheds are left out, and a node (or claim) with no pods
/// yet holds its DaemonSets' room. `skip` names nodes to leave out (those a disruption is about
/// to remove).
pub(crate) fn cluster_snapshot(nodes: &[&Node], claims: &[&NodeClaim], pods: &[&Pod], namespaces: &[&Namespace], pools: &[Pool], skip: &dyn Fn(&str) -> bool) -> Snapshot {
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
pub(crate) fn covered<'a>(claims: &[&NodeClaim], nodes: &[&Node], pods: &[&'a Pod]) -> Vec<(&'a Pod, String)> {
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

