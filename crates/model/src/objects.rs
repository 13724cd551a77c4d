//! The cluster as the deciding code sees it: which pods wait for capacity, how much room every
//! node (and every node still being launched) has left, and what each pool may still add.
//! Pure functions over API objects, so they are tested without a cluster.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};

use archer_api::nodeclaim::NodeClaim;
use archer_api::nodepool::NodePool;
use archer_core::labels;
use archer_core::packer::{DaemonLoad, Pool};
use archer_core::requirements::Requirements;
use archer_core::resources::{pod_requests, Resources};

/// Taints a node carries only while it starts (or is briefly unreachable): a pending pod that
/// fits an in-flight node waits for it rather than getting a second node.
pub(crate) const EPHEMERAL_TAINTS: [&str; 4] = ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable", "node.cloudprovider.kubernetes.io/uninitialized", "karpenter.sh/unregistered"];

pub use archer_core::{is_terminal, pod_id};

pub fn is_daemon_pod(p: &Pod) -> bool {
    p.metadata.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet" && o.controller == Some(true))
}


/// A pod the provisioner should find room for: not bound, not gated, not a DaemonSet's, not
/// nominated to a node (preemption will make room), not leaving; and either its scheduler said
/// Unschedulable, or its scheduler is one of `eager` and has not tried it yet. `eager` names the
/// schedulers that consult Archer (kube-scheduler with Archer as extender): the planner decides
/// what they will do, so a pod they would bind to room already there is planned there and no node
/// is bought for it, and a burst of pods does not wait for the scheduler to fail each one first
/// (at ~40 pods a second, 1,000 pods take 25 s to be marked Unschedulable).
pub fn is_provisionable(p: &Pod, eager: &[String]) -> bool {
    let Some(spec) = p.spec.as_ref() else { return false };
    if !archer_core::awaits_node(p) || is_daemon_pod(p) {
        return false;
    }
    if spec.scheduling_gates.as_ref().is_some_and(|g| !g.is_empty()) {
        return false;
    }
    let status = p.status.as_ref();
    if status.and_then(|s| s.nominated_node_name.as_deref()).is_some_and(|n| !n.is_empty()) {
        return false;
    }
    let scheduled = status.and_then(|s| s.conditions.as_ref()).and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"));
    match scheduled.map(|c| (c.status.as_str(), c.reason.as_deref())) {
        Some(("False", Some("Unschedulable"))) => true,
        // Not tried yet (a gate lifted leaves `SchedulingGated` until the scheduler tries it).
        None | Some(("False", Some("SchedulingGated"))) => eager_scheduler(spec, eager),
        Some(_) => false,
    }
}

fn eager_scheduler(spec: &k8s_openapi::api::core::v1::PodSpec, eager: &[String]) -> bool {
    let name = spec.scheduler_name.as_deref().unwrap_or("default-scheduler");
    eager.iter().any(|e| e == name)
}

/// Requests of the live pods bound to each node.
pub(crate) fn usage_by_node<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> HashMap<String, (Resources, Vec<&'a Pod>)> {
    let mut m: HashMap<String, (Resources, Vec<&Pod>)> = HashMap::new();
    for p in pods {
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty()) else { continue };
        if is_terminal(p) {
            continue;
        }
        let e = m.entry(node.to_string()).or_default();
        e.0 = e.0 + Resources { pods: 1, ..pod_requests(p, false) };
        e.1.push(p);
    }
    m
}

pub fn node_ready(n: &Node) -> bool {
    n.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// How long the node has been Ready (from its Ready condition's last transition), if it is.
pub(crate) fn ready_for(n: &Node) -> Option<std::time::Duration> {
    let c = n.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready" && c.status == "True")?;
    age_of(&c.last_transition_time.as_ref()?.0.to_string())
}

/// Does the node carry a taint with this key?
pub fn has_taint(node: &Node, key: &str) -> bool {
    archer_core::taints::node_has_taint(node, key)
}

/// How long ago an RFC 3339 timestamp was (`None`: unparseable or in the future).
fn age_of(t: &str) -> Option<std::time::Duration> {
    age_at(t, time::OffsetDateTime::now_utc())
}

/// How long before `now` the RFC 3339 time `t` was (`None`: unreadable, or after `now`).
pub(crate) fn age_at(t: &str, now: time::OffsetDateTime) -> Option<std::time::Duration> {
    let then = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()?;
    (now - then).try_into().ok()
}

/// Is the node on its way out (cordoned, tainted for disruption, being deleted)?
pub fn node_leaving(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_some() || node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) || has_taint(node, labels::DISRUPTED_TAINT)
}

/// A DaemonSet's pod as a load on the nodes it would run on.
pub(crate) fn daemon_load(d: &DaemonSet) -> DaemonLoad {
    let t = d.spec.as_ref().map(|s| &s.template);
    let pod = Pod { metadata: t.and_then(|t| t.metadata.clone()).unwrap_or_default(), spec: t.and_then(|t| t.spec.clone()), status: None };
    let spec = pod.spec.as_ref();
    DaemonLoad {
        selector: Requirements::from_node_selector(&spec.and_then(|s| s.node_selector.clone()).unwrap_or_default()),
        tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
        requests: Resources { pods: 1, ..pod_requests(&pod, false) },
    }
}

/// What a pool has launched so far (claims not being deleted): cpu millis, memory bytes, nodes.
pub fn pool_usage(pool: &str, claims: &[&NodeClaim]) -> (i64, i64, i64) {
    claims.iter().filter(|c| c.spec.node_pool == pool && !c.deleting()).fold((0, 0, 0), |acc, c| {
        let q = |k: &str, f: fn(&str) -> Option<i64>| c.spec.capacity.get(k).and_then(|v| f(v)).unwrap_or(0);
        (acc.0 + q("cpu", archer_core::quantity::cpu_millis), acc.1 + q("memory", archer_core::quantity::value), acc.2 + 1)
    })
}

/// The packer's pools: each NodePool with the room left under its limits and the DaemonSets that
/// would run on its nodes. Pools that cannot be read are skipped with a log line.
/// `closed` says why a pool may launch nothing now (its node class is not ready): it keeps no room
/// for a new node, and the packer gives that reason for pods no other pool takes.
pub fn packer_pools(pools: &[&NodePool], claims: &[&NodeClaim], daemons: &[DaemonLoad], closed: &dyn Fn(&NodePool) -> Option<String>) -> Vec<Pool> {
    pools
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|np| match np.to_pool() {
            Ok(mut pool) => {
                let (cpu, mem, nodes) = pool_usage(&pool.name, claims);
                pool.limit_cpu_millis = pool.limit_cpu_millis.map(|l| l - cpu);
                pool.limit_memory_bytes = pool.limit_memory_bytes.map(|l| l - mem);
                pool.limit_nodes = pool.limit_nodes.map(|l| l - nodes);
                pool.daemons = daemons.to_vec();
                pool.closed = closed(np);
                if pool.closed.is_some() {
                    pool.limit_nodes = Some(0);
                }
                Some(pool)
            }
            Err(e) => {
                tracing::warn!(pool = %np.name(), error = %e, "NodePool has an unusable requirement; skipped");
                None
            }
        })
        .collect()
}

/// A Karpenter-style duration: `30s`, `5m`, `720h`, `1h30m`; `Never` is `None`.
fn parse_duration(s: &str) -> Result<Option<Duration>, String> {
    if s.eq_ignore_ascii_case("never") {
        return Ok(None);
    }
    humantime::parse_duration(s).map(Some).map_err(|e| format!("{s:?}: {e}"))
}

/// The pool's disruption settings, with Karpenter v1's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct DisruptionSettings {
    pub underutilized: bool,
    /// `consolidationPolicy: Balanced` (Karpenter v1.15): underutilised nodes go only when the
    /// move's share of the pool's cost saved is at least half its share of the pool's disruption
    /// (`crate::consolidation::Balance`).
    pub balanced: bool,
    pub consolidate_after: Option<Duration>,
    pub expire_after: Option<Duration>,
    /// Budgets on nodes: (absolute count or percentage, reasons they apply to; empty = all).
    pub budgets: Vec<(BudgetValue, Vec<String>)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BudgetValue {
    Count(usize),
    Percent(f64),
}

impl BudgetValue {
    pub fn parse(s: &str) -> Result<BudgetValue, String> {
        let s = s.trim();
        match s.strip_suffix('%') {
            Some(p) => p.trim().parse::<f64>().ok().filter(|v| (0.0..=100.0).contains(v)).map(BudgetValue::Percent).ok_or_else(|| format!("budget {s:?}: not a percentage 0-100")),
            None => s.parse::<usize>().map(BudgetValue::Count).map_err(|_| format!("budget {s:?}: not a count or a percentage")),
        }
    }

    /// How many of `total` nodes may be disrupted at once (percentages round up, as Karpenter's).
    pub fn allowed(self, total: usize) -> usize {
        match self {
            BudgetValue::Count(n) => n,
            BudgetValue::Percent(p) => ((p / 100.0) * total as f64).ceil() as usize,
        }
    }
}

impl DisruptionSettings {
    pub fn of(pool: &NodePool) -> Result<Self, String> {
        let d = pool.spec.disruption.clone().unwrap_or_default();
        let (underutilized, balanced) = match d.consolidation_policy.as_deref() {
            None | Some("WhenEmptyOrUnderutilized") => (true, false),
            Some("Balanced") => (true, true),
            Some("WhenEmpty") => (false, false),
            Some(other) => return Err(format!("consolidationPolicy {other:?}: expected WhenEmpty, WhenEmptyOrUnderutilized or Balanced")),
        };
        let consolidate_after = match d.consolidate_after.as_deref() {
            None => Some(Duration::ZERO),
            Some(s) => parse_duration(s)?,
        };
        let expire_after = match pool.spec.template.spec.expire_after.as_deref() {
            None => Some(Duration::from_secs(720 * 3600)),
            Some(s) => parse_duration(s)?,
        };
        let budgets = if d.budgets.is_empty() {
            vec![(BudgetValue::Percent(10.0), Vec::new())]
        } else {
            d.budgets.iter().map(|b| BudgetValue::parse(&b.nodes).map(|v| (v, b.reasons.clone()))).collect::<Result<_, _>>()?
        };
        Ok(Self { underutilized, balanced, consolidate_after, expire_after, budgets })
    }

    /// Nodes of a pool of `total` that may be disrupted at once for `reason`
    /// (`Empty`, `Underutilized`, `Expired`): the smallest budget that applies.
    pub fn allowed(&self, total: usize, reason: &str) -> usize {
        self.budgets.iter().filter(|(_, reasons)| reasons.is_empty() || reasons.iter().any(|r| r == reason)).map(|(v, _)| v.allowed(total)).min().unwrap_or(usize::MAX)
    }
}

/// What evicting `pod` costs, as Karpenter counts it: 1, plus its pod-deletion-cost / 2^27, plus
/// its priority / 2^25, clamped to [-10, 10]. A deletion cost Archer wrote itself (recorded in
/// `archer.dev/deletion-cost`: the node's price order, for scale-downs) is not the owner's and is
/// left out.
pub(crate) fn eviction_cost(pod: &Pod) -> f64 {
    let annotations = pod.metadata.annotations.as_ref();
    let get = |k: &str| annotations.and_then(|a| a.get(k));
    let deletion = get(archer_core::labels::POD_DELETION_COST).filter(|v| get(archer_core::labels::ARCHER_DELETION_COST) != Some(*v)).and_then(|v| v.trim().parse::<f64>().ok()).filter(|v| v.is_finite()).unwrap_or(0.0);
    let priority = pod.spec.as_ref().and_then(|s| s.priority).map_or(0.0, f64::from);
    (1.0 + deletion / 2f64.powi(27) + priority / 2f64.powi(25)).clamp(-10.0, 10.0)
}

/// Is the object (pod or node) annotated `archer.dev/do-not-disrupt` or
/// `karpenter.sh/do-not-disrupt` = "true"?
pub(crate) fn do_not_disrupt(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
    let a = meta.annotations.as_ref();
    [labels::DO_NOT_DISRUPT, labels::KARPENTER_DO_NOT_DISRUPT].iter().any(|k| a.and_then(|a| a.get(*k)).map(String::as_str) == Some("true"))
}

/// Pods on a node that block its voluntary disruption, and why.
pub(crate) fn disruption_blocker(pods: &[&Pod]) -> Option<String> {
    for p in pods {
        if do_not_disrupt(&p.metadata) {
            return Some(format!("pod {} is annotated do-not-disrupt", pod_id(p)));
        }
        if !is_daemon_pod(p) && p.metadata.owner_references.as_ref().is_none_or(|o| o.is_empty()) {
            return Some(format!("pod {} has no controller to recreate it", pod_id(p)));
        }
    }
    None
}

/// Pods to evict from a node being drained (DaemonSet and mirror pods stay).
pub fn evictable<'a>(pods: &[&'a Pod]) -> Vec<&'a Pod> {
    pods.iter()
        .copied()
        .filter(|p| !is_daemon_pod(p) && !is_terminal(p) && p.metadata.annotations.as_ref().is_none_or(|a| !a.contains_key("kubernetes.io/config.mirror")))
        .collect()
}

/// Why a pool's nodes must not be taken away as empty or underutilised now, if so: the cluster
/// has not settled. Pods still wait for capacity Archer is providing (`waiting`: pending pods
/// the last plan could place), or a claim of the pool has no Ready, registered node yet. A node
/// launched for pending pods is empty until they land; taking it then undoes the launch.
pub(crate) fn consolidation_hold(pool: &str, claims: &[&NodeClaim], nodes: &[&Node], waiting: &[String]) -> Option<String> {
    if let Some(p) = waiting.first() {
        return Some(format!("pod {p} is waiting for capacity"));
    }
    let settled: std::collections::HashSet<&str> = nodes.iter().filter(|n| node_ready(n) && !has_taint(n, labels::UNREGISTERED_TAINT)).filter_map(|n| n.metadata.name.as_deref()).collect();
    claims
        .iter()
        .filter(|c| c.spec.node_pool == pool && !c.deleting())
        .find(|c| {
            let node = c.node_name();
            !settled.contains(node.as_str())
        })
        .map(|c| format!("node claim {} is still launching", c.name()))
}

/// The NodePool a node was launched from: Archer's `archer.dev/nodepool` label, else
/// Karpenter's `karpenter.sh/nodepool` (a cluster dump of nodes Karpenter launched). The live
/// worker only acts on a node with an Archer NodeClaim.
pub fn node_pool_of(node: &Node) -> Option<&str> {
    let l = node.metadata.labels.as_ref()?;
    l.get(labels::NODEPOOL).or_else(|| l.get(labels::KARPENTER_NODEPOOL)).map(String::as_str)
}

pub fn labels_of(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests;
