//! The bin-packer: pending pods -> the cheapest set of new nodes (pool, instance type, zone,
//! capacity type) that runs them, after filling free room on existing and in-flight nodes.
//!
//! Pods with identical requests and constraints form a class and are packed arithmetically, so
//! thousands of replicas cost as little as one. For each node to open, every compatible offering
//! is tried and the one with the lowest price per unit of work packed wins, where a pod's work is
//! its lower-bound cost (the cheapest price per unit of its scarcer resource on any compatible
//! offering): this is the quantity the plan's cost ratio is measured against.
#![allow(clippy::indexing_slicing, reason = "the packer indexes its own vectors by indices it built from them; no index comes from input")]

use std::collections::BTreeMap;
use std::sync::Arc;

use super::platform::PlatformSet;
use super::requirements::Requirements;
use super::resources::Resources;
use crate::instance::{CapacityType, InstanceType};

mod greedy;
mod knapsack;
mod merge;
mod pod;
mod relax;
mod rounding;
mod split;

/// What the packer adds to each node's price: at equal price per pod, fewer and larger nodes
/// (fewer to launch, register and later consolidate). Far below any price step, far above
/// floating-point noise.
const NODE_TIE_BREAK: f64 = 1e-6;

/// How long the packer may spend on the optimal plan before it keeps the greedy one.
pub const DEFAULT_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);
/// What a batch earns of the budget per pod it packs, and at least: a small batch is decided in
/// tens of milliseconds (its plan is good sooner), a large one up to the whole budget.
const BUDGET_PER_POD: std::time::Duration = std::time::Duration::from_micros(400);
/// 30 ms in a release build; a debug build (the e2e harness runs one) is about ten times slower
/// on the LP and gets 300 ms, or on a slow 2-core machine its small batches get no bound at all.
const MIN_BUDGET: std::time::Duration = std::time::Duration::from_millis(if cfg!(debug_assertions) { 300 } else { 30 });

/// The part of `budget` a batch of `pods` pods may spend on the optimal plan: 0.4 ms a pod,
/// at least 30 ms (300 ms in a debug build), at most `budget` (zero stays zero: the greedy plan
/// alone).
pub fn batch_budget(budget: std::time::Duration, pods: usize) -> std::time::Duration {
    let earned = BUDGET_PER_POD.saturating_mul(u32::try_from(pods).unwrap_or(u32::MAX));
    earned.max(MIN_BUDGET).min(budget)
}

/// The keys every node of an offering carries from the offering (and its pool's name):
/// [`Offering::labels`]; its cloud's own keys are [`crate::cloud_labels`]'s.
const OFFERING_KEYS: [&str; 11] = [
    crate::labels::ARCH,
    crate::labels::OS,
    crate::labels::INSTANCE_TYPE,
    crate::labels::ZONE,
    crate::labels::KARPENTER_CAPACITY_TYPE,
    crate::labels::CAPACITY_TYPE,
    crate::labels::REGION,
    crate::labels::KARPENTER_NODEPOOL,
    crate::labels::KARPENTER_PROVISIONER_NAME,
    crate::labels::NODEPOOL,
    "archer.dev/instance-family",
];

/// A pod waiting for capacity.
#[derive(Debug, Clone)]
pub struct PendingPod {
    /// `namespace/name`.
    pub id: String,
    pub requests: Resources,
    /// Alternatives (required node-affinity terms, each ANDed with the nodeSelector); empty: any node.
    pub terms: Vec<Requirements>,
    /// `(key, value, effect)` taints the pod tolerates, as a predicate input.
    pub tolerations: Vec<k8s_openapi::api::core::v1::Toleration>,
    /// Platforms its images run on; `None`: unknown, assumed to run anywhere.
    pub platforms: Option<PlatformSet>,
    /// Spread the pod's group evenly over the zones it may use (topology spread on the zone key).
    pub zone_spread: bool,
    /// At most this many pods of its group on one node (hostname spread, or anti-affinity to its
    /// own replicas = 1).
    pub per_node_max: Option<usize>,
    /// Pods sharing this key must all land in one zone (required pod affinity on the zone key).
    pub zone_group: Option<String>,
    /// Preferred node-affinity terms (weight, requirements): honoured when they cost nothing.
    pub preferred: Vec<(i32, Requirements)>,
    /// Required anti-affinity to its own group on the zone key: at most one per zone.
    pub one_per_zone: bool,
    /// Required affinity to its own group on the hostname key: the class shares one node.
    pub colocate: bool,
    /// The group `zone_spread` and `per_node_max` count over (the pods their selector picks,
    /// whatever their sizes); `None`: the pod's class alone.
    pub spread_group: Option<String>,
    /// Topology keys of its DoNotSchedule spread constraints: kube-scheduler refuses a node
    /// without one of them, so a new node must carry them all.
    pub spread_keys: Vec<String>,
    /// Extended resources it requests (`nvidia.com/gpu`: 1, `hugepages-2Mi`: bytes). Instance
    /// types offer their GPUs (as `nvidia.com/gpu`) and what NodeOverlays' `capacity` gives them
    /// ([`InstanceType::extended_resource`]).
    pub extended: BTreeMap<String, i64>,
}

pub use crate::instance::GPU_RESOURCE;

/// Can a node of this type hold one such pod's extended resources?
fn extended_fit(pod: &PendingPod, o: &Offering, pool: &str) -> Result<(), String> {
    for (name, amount) in &pod.extended {
        match o.instance.extended_resource(name) {
            0 => return Err(format!("pool {pool}: requests {name}, which no instance type offers")),
            has if has < *amount => return Err(format!("pool {pool}: no instance type has {amount} {name}")),
            _ => {}
        }
    }
    Ok(())
}

/// How many pods each requesting `need` of extended resources the amounts `free` gives hold
/// (unbounded when they request none).
fn extended_count(need: &BTreeMap<String, i64>, free: impl Fn(&str) -> i64) -> i64 {
    need.iter().filter(|(_, v)| **v > 0).map(|(k, v)| free(k).max(0) / v).min().unwrap_or(i64::MAX)
}

/// The extended resources `pods` ((class, how many)) request together.
fn extended_sum(classes: &[Class], pods: impl IntoIterator<Item = (usize, usize)>) -> BTreeMap<String, i64> {
    let mut sum = BTreeMap::new();
    for (ci, n) in pods {
        for (k, v) in &classes[ci].extended {
            *sum.entry(k.clone()).or_insert(0) += v * n as i64;
        }
    }
    sum
}

/// Does a node of type `t` offer every extended resource in `need`?
fn holds_extended(t: &InstanceType, need: &BTreeMap<String, i64>) -> bool {
    need.iter().all(|(k, v)| t.extended_resource(k) >= *v)
}

impl PendingPod {
    /// The group its spread and per-node cap count over; only pods that spread or cap have one.
    fn spread_key(&self) -> Option<&String> {
        self.spread_group.as_ref().filter(|_| self.zone_spread || self.per_node_max.is_some())
    }
}

/// A taint as Kubernetes writes it: one type for pools, planned and existing nodes.
pub(crate) type Taint = k8s_openapi::api::core::v1::Taint;

/// A NodePool, reduced to what packing needs.
#[derive(Debug, Clone)]
pub struct Pool {
    pub name: String,
    pub weight: i32,
    pub requirements: Requirements,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// Remaining room under the pool's limits (cpu millicores, memory bytes, nodes as pods field).
    pub limit_cpu_millis: Option<i64>,
    pub limit_memory_bytes: Option<i64>,
    pub limit_nodes: Option<i64>,
    /// DaemonSets that would run on this pool's nodes (those whose selector the node matches
    /// and that tolerate the pool's taints take room on it).
    pub daemons: Vec<DaemonLoad>,
    /// Why no node may be launched for this pool now (its node class is not ready), as
    /// Karpenter skips a NodePool that is not Ready. Its room is then zero nodes; the nodes it
    /// already has stay as they are.
    pub closed: Option<String>,
    /// The values this copy of the pool fixes for keys its requirements leave several values on
    /// (`capacity.spread In [2,3,4,5]`): one copy per value a batch's pods care about
    /// ([`crate::planner`]'s variants), each a node label. Empty: the pool as written. Copies
    /// of one pool share its limits.
    pub variant: BTreeMap<String, String>,
}

/// One DaemonSet's pod, as it weighs on every node it runs on.
#[derive(Debug, Clone)]
pub struct DaemonLoad {
    pub selector: Requirements,
    pub tolerations: Vec<k8s_openapi::api::core::v1::Toleration>,
    pub requests: Resources,
}

impl Pool {
    /// Room left for workload pods on a node with these labels and allocatable.
    pub fn room(&self, labels: &BTreeMap<String, String>, allocatable: Resources) -> Resources {
        let overhead = self
            .daemons
            .iter()
            .filter(|d| {
                d.selector.matches_map(labels)
                    && self.taints.iter().filter(|t| t.effect != "PreferNoSchedule").all(|t| {
                        d.tolerations.iter().any(|tol| super::patch::tolerates(tol, &t.key, t.value.as_deref().unwrap_or(""), &t.effect))
                    })
            })
            .fold(Resources::default(), |acc, d| acc + d.requests);
        allocatable - overhead
    }
}

/// One way to buy a node: an instance type in a zone as a capacity type, at a price.
#[derive(Debug, Clone)]
pub struct Offering {
    pub instance: Arc<InstanceType>,
    pub zone: String,
    pub capacity: CapacityType,
    pub price: f64,
    /// The NodePool this offering is that pool's own, priced for it alone (a NodeOverlay whose
    /// requirements depend on the pool, as Karpenter prices instance types per NodePool): that
    /// pool plans with it instead of the shared offering of the same type, zone and capacity
    /// type, and no other pool sees it. `None`: every pool's.
    pub pool: Option<Arc<str>>,
}

impl Offering {
    /// The offering of this instance type in this zone as this capacity type (`on-demand`/`spot`).
    /// (The shared one: not a pool's own, [`Offering::pool`].)
    pub fn find<'a>(offerings: &'a [Offering], instance_type: &str, zone: &str, capacity: &str) -> Option<&'a Offering> {
        offerings.iter().find(|o| o.pool.is_none() && o.instance.name == instance_type && o.zone == zone && o.capacity.as_str() == capacity)
    }

    /// The offering `pool` buys this instance type in this zone as this capacity type at: its
    /// own ([`Offering::pool`]) if it has one, else the shared one.
    pub fn find_for_pool<'a>(offerings: &'a [Offering], pool: &str, instance_type: &str, zone: &str, capacity: &str) -> Option<&'a Offering> {
        let same = |o: &&Offering| o.instance.name == instance_type && o.zone == zone && o.capacity.as_str() == capacity;
        offerings.iter().filter(same).find(|o| o.pool.as_deref() == Some(pool)).or_else(|| Self::find(offerings, instance_type, zone, capacity))
    }

    /// The offering a node runs as, by its labels: instance type (`node.kubernetes.io/instance-type`
    /// or its beta name), zone, and capacity type ([`CapacityType::of_node`]). One source of a
    /// running node's price (`archer_model::price`, the one rule).
    pub fn of_node<'a>(offerings: &'a [Offering], label: &dyn Fn(&str) -> Option<String>) -> Option<&'a Offering> {
        let instance = label(crate::labels::INSTANCE_TYPE).or_else(|| label(crate::labels::INSTANCE_TYPE_BETA))?;
        let zone = label(crate::labels::ZONE)?;
        let capacity = CapacityType::of_node(label);
        match label(crate::labels::KARPENTER_NODEPOOL).or_else(|| label(crate::labels::NODEPOOL)) {
            Some(pool) => Offering::find_for_pool(offerings, &pool, &instance, &zone, capacity.as_str()),
            None => Offering::find(offerings, &instance, &zone, capacity.as_str()),
        }
    }

    /// Every on-demand type of the embedded catalog, offered in us-east-1a (the fixture of tests
    /// in this crate and the runtime's; empty if the embedded catalog did not parse, which its own
    /// test catches).
    pub fn embedded_on_demand() -> Vec<Offering> {
        let Ok(c) = crate::catalog::Catalog::embedded() else { return Vec::new() };
        c.types()
            .iter()
            .filter_map(|t| c.price_of(t, None, CapacityType::OnDemand).map(|price| Offering { instance: t.clone(), zone: "us-east-1a".into(), capacity: CapacityType::OnDemand, price, pool: None }))
            .collect()
    }

    /// The labels a node of this offering carries whatever its pool: the instance type's
    /// well-known and cloud labels, its zone, region and capacity type.
    pub fn own_labels(&self) -> impl Iterator<Item = (&'static str, String)> {
        use super::labels as l;
        let t = &self.instance;
        [
            (l::ARCH, t.arch.clone()),
            (l::OS, t.os.clone()),
            (l::INSTANCE_TYPE, t.name.clone()),
            (l::ZONE, self.zone.clone()),
            (l::KARPENTER_CAPACITY_TYPE, self.capacity.as_str().to_string()),
            (l::CAPACITY_TYPE, self.capacity.as_str().to_string()),
            (l::REGION, region_of(&self.zone).to_string()),
            ("archer.dev/instance-family", t.family.clone()),
        ]
        .into_iter()
        .chain(crate::cloud_labels::labels(t, self.capacity))
    }

    /// Whether [`Offering::labels`] sets `key` from the offering itself (whatever the pool).
    pub(crate) fn sets_label(key: &str) -> bool {
        OFFERING_KEYS.contains(&key) || crate::cloud_labels::is_cloud_key(key)
    }

    /// The labels a node from this offering in `pool` would carry.
    pub fn labels(&self, pool: &Pool) -> BTreeMap<String, String> {
        use super::labels as l;
        let mut m = pool.labels.clone();
        for (k, v) in self.own_labels().chain([(l::KARPENTER_NODEPOOL, pool.name.clone()), (l::KARPENTER_PROVISIONER_NAME, pool.name.clone()), (l::NODEPOOL, pool.name.clone())]) {
            m.insert(k.to_string(), v);
        }
        // Requirement keys no offering label covers (custom keys) label the node, as Karpenter
        // does; keys the offering sets keep the offering's value.
        for (k, v) in pool.requirements.implied_labels() {
            m.entry(k.to_string()).or_insert_with(|| v.to_string());
        }
        m
    }

    /// Can a node of this offering carry the pool's template labels? A template label on a key
    /// the offering sets (`kubernetes.io/arch: arm64` on an amd64 type) rules the offering out
    /// rather than being overwritten.
    fn keeps_template_labels(labels: &BTreeMap<String, String>, pool: &Pool) -> bool {
        pool.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// Whether a new node of offering `o` in `pool`, carrying `labels` (the offering's labels in the
/// pool), could take the pod (its size aside): the pool's requirements, template labels and taints,
/// the pod's node affinity, its images' platforms, its spread keys and extended resources.
pub(crate) fn could_host_with(pod: &PendingPod, pool: &Pool, o: &Offering, labels: &BTreeMap<String, String>) -> bool {
    tolerates_all(pod, &pool.taints) && could_host_but_for_taints(pod, pool, o, labels)
}

/// [`could_host_with`], whatever the pool's taints (a topology spread with `nodeTaintsPolicy:
/// Ignore` counts the domains of nodes the pod does not tolerate).
pub(crate) fn could_host_but_for_taints(pod: &PendingPod, pool: &Pool, o: &Offering, labels: &BTreeMap<String, String>) -> bool {
    pool.requirements.matches_map(labels) && Offering::keeps_template_labels(labels, pool) && labels_fit(pod, labels).is_ok() && extended_fit(pod, o, &pool.name).is_ok()
}

use crate::labels::region_of;

/// An existing (or in-flight) node with free room.
#[derive(Debug, Clone)]
pub struct ExistingNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub free: Resources,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedNode {
    pub name: String,
    pub pool: String,
    pub instance_type: String,
    pub arch: String,
    pub zone: String,
    pub capacity_type: String,
    pub price_per_hour: f64,
    pub pods: Vec<String>,
    /// Labels chosen from the pool's requirements that list several values
    /// ([`Pool::variant`]); the node carries them.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Unschedulable {
    pub pod: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub nodes: Vec<PlannedNode>,
    /// Pods placed on existing or in-flight nodes: pod -> node.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub existing: BTreeMap<String, String>,
    pub unschedulable: Vec<Unschedulable>,
    pub total_price_per_hour: f64,
    /// A lower bound on the price of any set of new nodes for the pods this plan puts on new
    /// nodes (the LP relaxation's, [`relax`]); 0 when unknown (the budget ran out before it, or
    /// some pods could not be placed).
    #[serde(skip)]
    pub lower_bound_per_hour: f64,
}

impl Plan {
    /// The plan less these pods (bound or gone since it was made): they leave their nodes, a
    /// new node left with no pod is not bought, and the lower bound no longer applies.
    pub fn without(mut self, gone: &std::collections::HashSet<String>) -> Plan {
        if gone.is_empty() {
            return self;
        }
        for n in &mut self.nodes {
            n.pods.retain(|p| !gone.contains(p));
        }
        self.nodes.retain(|n| !n.pods.is_empty());
        self.existing.retain(|p, _| !gone.contains(p));
        self.unschedulable.retain(|u| !gone.contains(&u.pod));
        self.total_price_per_hour = self.nodes.iter().map(|n| n.price_per_hour).sum();
        self.lower_bound_per_hour = 0.0;
        self
    }
}

fn tolerates_all(pod: &PendingPod, taints: &[Taint]) -> bool {
    taints.iter().filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute").all(|t| {
        pod.tolerations.iter().any(|tol| super::patch::tolerates(tol, &t.key, t.value.as_deref().unwrap_or(""), &t.effect))
    })
}

fn labels_fit(pod: &PendingPod, labels: &BTreeMap<String, String>) -> Result<(), String> {
    if let Some(key) = pod.spread_keys.iter().find(|k| !labels.contains_key(*k)) {
        return Err(format!("topology spread on {key}: no node carries that label (DoNotSchedule)"));
    }
    if !pod.terms.is_empty() && !pod.terms.iter().any(|t| t.matches_map(labels)) {
        return Err("node selector / required affinity".into());
    }
    if let Some(p) = &pod.platforms {
        let arch = labels.get(super::labels::ARCH).map(String::as_str).unwrap_or("");
        let os = labels.get(super::labels::OS).map(String::as_str).unwrap_or("linux");
        if !p.0.iter().any(|pl| pl.architecture == arch && pl.os == os) {
            return Err(format!("images support {p}, not {os}/{arch}"));
        }
    }
    Ok(())
}

/// Nodes opened so far by one way of packing, and what it could not place.
#[derive(Clone, Default)]
struct Packing {
    /// Per pool: (cpu millis, memory bytes, nodes) opened, against its limits; copies of a pool
    /// ([`Pool::variant`]) count on the first copy's entry ([`Packing::family`]).
    used: Vec<(i64, i64, i64)>,
    /// Per pool: the index whose entry of `used` it counts on.
    family: Vec<usize>,
    drafts: Vec<Draft>,
    unschedulable: Vec<Unschedulable>,
    /// The LP relaxation's bound, when it covers exactly the pods placed.
    relaxed_bound: Option<f64>,
}

impl Packing {
    /// Count `nodes` more nodes of `o` (negative: fewer) against pool `pi`'s limits.
    fn charge(&mut self, pi: usize, o: &Offering, nodes: i64) {
        let Some(&fi) = self.family.get(pi) else { return };
        let u = &mut self.used[fi];
        u.0 += nodes * i64::from(o.instance.vcpu) * 1000;
        u.1 += nodes * o.instance.memory_mib as i64 * 1024 * 1024;
        u.2 += nodes;
    }

    /// What pool `pi` (with every copy of it) has opened so far.
    fn used_by(&self, pi: usize) -> (i64, i64, i64) {
        self.family.get(pi).and_then(|&fi| self.used.get(fi)).copied().unwrap_or_default()
    }

    /// What its nodes cost per hour.
    fn price(&self, offerings: &[Offering]) -> f64 {
        self.drafts.iter().map(|d| offerings[d.oi].price).sum()
    }
}

/// Pods that share requests and constraints.
#[derive(Clone)]
struct Class {
    pods: Vec<String>,
    requests: Resources,
    /// Compatible (pool index, offering index) pairs.
    offerings: Vec<(usize, usize)>,
    /// Lower-bound cost of one pod of this class.
    lower_bound: f64,
    zone_spread: bool,
    per_node_max: Option<usize>,
    zone_group: Option<String>,
    /// What spread and per-node caps count over (defaults to the class itself).
    spread_group: Option<String>,
    one_per_zone: bool,
    colocate: bool,
    /// Preferred-affinity weight each compatible (pool, offering) earns (absent: 0).
    preference: std::collections::HashMap<(usize, usize), i32>,
    /// Every compatible (pool, offering), for the "can this class fill that node" test.
    mask: std::collections::HashSet<(usize, usize)>,
    /// Extended resources (`nvidia.com/gpu`, an overlay's `smarter-devices/fuse`) one pod takes.
    extended: BTreeMap<String, i64>,
    /// The compatible offerings of each lower-weight pool the pod fits, in weight order: the
    /// class falls through to them when its pool reaches its limits (as Karpenter does).
    fallback: Vec<Vec<Slot>>,
}

fn signature(p: &PendingPod) -> String {
    format!(
        "{:?}|{:?}|{:?}|{:?}|{}|{:?}|{:?}|{:?}|{:?}|{}|{}|{:?}|{:?}",
        p.requests,
        p.terms,
        p.tolerations,
        p.platforms.as_ref().map(|s| s.to_annotation()),
        p.zone_spread,
        p.per_node_max,
        p.zone_group,
        p.preferred,
        p.spread_key(),
        p.one_per_zone,
        p.colocate,
        p.spread_keys,
        p.extended
    )
}

/// The lower-bound cost of one pod of `requests` over `slots`: the cheapest price per unit of its
/// scarcer resource.
fn lower_bound(slots: &[Slot], requests: Resources, offerings: &[Offering], room: &dyn Fn(usize, usize) -> Resources) -> f64 {
    slots.iter().map(|&(pi, oi)| offerings[oi].price * share(requests, room(pi, oi))).fold(f64::INFINITY, f64::min)
}

/// The share of a node's room a pod takes: its scarcest of cpu, memory and pod slots. A pod that
/// requests nothing still takes one of the node's `max pods` (kube-scheduler counts it), so its
/// share is never zero.
fn share(requests: Resources, room: Resources) -> f64 {
    let pods = if room.pods > 0 { requests.pods.max(1) as f64 / room.pods as f64 } else { f64::INFINITY };
    requests.dominant_share(room).max(pods)
}

/// Split zone-spread classes into one class per zone, pods dealt round-robin so the counts per
/// zone differ by at most one.
fn spread_over_zones(classes: Vec<Class>, offerings: &[Offering], room: &dyn Fn(usize, usize) -> Resources, unschedulable: &mut Vec<Unschedulable>) -> Vec<Class> {
    let mut out = Vec::new();
    // Pods of a spread group are dealt round-robin across its classes, so the group (not only
    // each class) stays within a skew of one.
    let mut next: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for mut c in classes {
        let zones: std::collections::BTreeSet<&str> = c.offerings.iter().map(|&(_, oi)| offerings[oi].zone.as_str()).collect();
        if c.one_per_zone && c.pods.len() > zones.len() {
            // Anti-affinity on the zone key: one pod per zone; the rest cannot run anywhere.
            for p in c.pods.drain(zones.len()..) {
                unschedulable.push(Unschedulable { pod: p, reason: format!("anti-affinity on the zone key: all {} already hold one of its group", super::words::count(zones.len(), "zone")) });
            }
        }
        if !(c.zone_spread || c.one_per_zone) || zones.len() < 2 {
            out.push(c);
            continue;
        }
        let zones: Vec<String> = zones.into_iter().map(String::from).collect();
        let start = c.spread_group.as_ref().map_or(0, |g| *next.get(g).unwrap_or(&0));
        let mut parts: Vec<Vec<String>> = vec![Vec::new(); zones.len()];
        let pods = std::mem::take(&mut c.pods);
        let count = pods.len();
        for (i, p) in pods.into_iter().enumerate() {
            parts[(start + i) % zones.len()].push(p);
        }
        if let Some(g) = &c.spread_group {
            next.insert(g.clone(), (start + count) % zones.len());
        }
        for (zone, pods) in zones.iter().zip(parts) {
            if pods.is_empty() {
                continue;
            }
            let offs: Vec<(usize, usize)> = c.offerings.iter().copied().filter(|&(_, oi)| offerings[oi].zone == *zone).collect();
            let lower_bound = lower_bound(&offs, c.requests, offerings, room);
            out.push(Class { pods, offerings: offs, lower_bound, zone_spread: true, ..c.clone() });
        }
    }
    out
}

/// Classes sharing a zone group are pinned to one zone: the zone every class of the group can use
/// that has the cheapest lower bound for the whole group. A class that cannot use it is
/// unschedulable (its affinity cannot be met together with the rest of its group).
fn pin_zone_groups(classes: &mut Vec<Class>, offerings: &[Offering], room: &dyn Fn(usize, usize) -> Resources, unschedulable: &mut Vec<Unschedulable>) {
    use std::collections::{BTreeSet, HashMap};
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, c) in classes.iter().enumerate() {
        if let Some(g) = &c.zone_group {
            groups.entry(g.clone()).or_default().push(i);
        }
    }
    let mut drop = BTreeSet::new();
    for (group, members) in groups {
        // Per zone: the group's lower bound there (pods x cheapest unit price in that zone).
        let mut cost: HashMap<&str, (usize, f64)> = HashMap::new();
        for &ci in &members {
            let c = &classes[ci];
            let mut best: HashMap<&str, f64> = HashMap::new();
            for &(pi, oi) in &c.offerings {
                let o = &offerings[oi];
                let unit = o.price * share(c.requests, room(pi, oi));
                let e = best.entry(o.zone.as_str()).or_insert(f64::INFINITY);
                *e = e.min(unit);
            }
            for (z, unit) in best {
                let e = cost.entry(z).or_insert((0, 0.0));
                e.0 += 1;
                e.1 += unit * c.pods.len() as f64;
            }
        }
        let zone = cost
            .iter()
            .filter(|(_, (n, _))| *n == members.len())
            .min_by(|a, b| a.1 .1.total_cmp(&b.1 .1).then_with(|| a.0.cmp(b.0)))
            .or_else(|| cost.iter().max_by(|a, b| a.1 .0.cmp(&b.1 .0).then_with(|| b.0.cmp(a.0))))
            .map(|(z, _)| z.to_string());
        let Some(zone) = zone else { continue };
        for &ci in &members {
            let c = &mut classes[ci];
            c.offerings.retain(|&(_, oi)| offerings[oi].zone == zone);
            c.zone_spread = false;
            if c.offerings.is_empty() {
                drop.insert(ci);
                for p in c.pods.drain(..) {
                    unschedulable.push(Unschedulable { pod: p, reason: format!("pod affinity ({group}): its group is in zone {zone}, where the pod fits no offering") });
                }
            } else {
                c.lower_bound = lower_bound(&c.offerings, c.requests, offerings, room);
            }
        }
    }
    let mut i = 0;
    classes.retain(|_| {
        let keep = !drop.contains(&i);
        i += 1;
        keep
    });
}

/// How many pods of the class a node of type `t` with this room holds.
fn pods_that_fit(c: &Class, free: Resources, t: &InstanceType) -> usize {
    let r = c.requests;
    let by = |f: i64, need: i64| if need <= 0 { i64::MAX } else { f / need };
    let n = by(free.cpu_millis, r.cpu_millis).min(by(free.memory_bytes, r.memory_bytes)).min(by(free.pods, r.pods.max(1))).min(extended_count(&c.extended, |k| t.extended_resource(k)));
    usize::try_from(n.max(0)).unwrap_or(0)
}

/// A (pool, offering) pair, by index.
type Slot = (usize, usize);

/// A node being planned: its pool and offering, and the pods of each class it holds.
#[derive(Clone)]
struct Draft {
    pi: usize,
    oi: usize,
    items: Vec<(usize, Vec<String>)>,
}

impl Draft {
    fn used(&self, classes: &[Class]) -> Resources {
        self.items.iter().fold(Resources::default(), |acc, (cj, pods)| {
            let one = classes[*cj].one_pod();
            let n = pods.len() as i64;
            acc + Resources::new(one.cpu_millis * n, one.memory_bytes * n, one.pods * n)
        })
    }

    /// Put `pods` of class `ci` on this node.
    fn add(&mut self, ci: usize, pods: impl IntoIterator<Item = String>) {
        match self.items.iter_mut().find(|(c, _)| *c == ci) {
            Some((_, list)) => list.extend(pods),
            None => self.items.push((ci, pods.into_iter().collect())),
        }
    }
}

impl Class {
    /// What one of its pods takes of a node (a pod slot at least).
    fn one_pod(&self) -> Resources {
        Resources::new(self.requests.cpu_millis, self.requests.memory_bytes, self.requests.pods.max(1))
    }
}

/// Give every planned node the cheapest offering (same pool and zone, no more vCPU or memory, so
/// limits still hold) that every class on it may use and that holds exactly what was put on it:
/// the last node of a class is often only partly filled.
fn right_size(drafts: &mut [Draft], classes: &[Class], offerings: &[Offering], room: &dyn Fn(usize, usize) -> Resources) {
    for d in drafts.iter_mut() {
        let need = d.used(classes);
        let extended = extended_sum(classes, d.items.iter().map(|(cj, pods)| (*cj, pods.len())));
        let current = &offerings[d.oi];
        let Some(lead) = d.items.first().map(|(c, _)| *c) else { continue };
        let mut best: Option<usize> = None;
        for &(pj, oj) in &classes[lead].mask {
            let o = &offerings[oj];
            if pj != d.pi
                || o.zone != current.zone
                || o.price >= best.map_or(current.price, |b| offerings[b].price)
                || o.instance.vcpu > current.instance.vcpu
                || o.instance.memory_mib > current.instance.memory_mib
                || !need.fits(room(pj, oj))
                || !holds_extended(&o.instance, &extended)
                || !d.items.iter().all(|(cj, _)| classes[*cj].mask.contains(&(pj, oj)))
            {
                continue;
            }
            best = Some(oj);
        }
        if let Some(b) = best {
            d.oi = b;
        }
    }
}

/// Would `count` more nodes of `o` stay within the pool's limits?
pub(crate) fn within_limits(pool: &Pool, (cpu_used, mem_used, nodes_used): (i64, i64, i64), o: &Offering, count: usize) -> bool {
    let k = count as i64;
    !(pool.limit_nodes.is_some_and(|l| nodes_used + k > l)
        || pool.limit_cpu_millis.is_some_and(|l| cpu_used + k * i64::from(o.instance.vcpu) * 1000 > l)
        || pool.limit_memory_bytes.is_some_and(|l| mem_used + k * o.instance.memory_mib as i64 * 1024 * 1024 > l))
}

/// The offerings of `list` no other offering of `list` dominates (lower or equal price, at least
/// as much room in cpu, memory and pods, at least as preferred; ties keep the first in (price,
/// pool, offering) order).
fn pareto(list: &[Slot], offerings: &[Offering], room: &dyn Fn(usize, usize) -> Resources, preference: &std::collections::HashMap<Slot, i32>) -> Vec<Slot> {
    let pref = |s: &Slot| preference.get(s).copied().unwrap_or(0);
    let mut sorted: Vec<(f64, Resources, Slot)> = list.iter().map(|&(pi, oi)| (offerings[oi].price, room(pi, oi), (pi, oi))).collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| b.1.cmp(&a.1)).then_with(|| pref(&b.2).cmp(&pref(&a.2))).then_with(|| a.2.cmp(&b.2)));
    let mut kept: Vec<(f64, Resources, Slot)> = Vec::new();
    for cand in sorted {
        // A preferred offering is only dominated by one preferred at least as much.
        let dominated = kept.iter().any(|k| k.0 <= cand.0 && cand.1.fits(k.1) && pref(&k.2) >= pref(&cand.2));
        if !dominated {
            kept.push(cand);
        }
    }
    kept.into_iter().map(|k| k.2).collect()
}

/// Move a class whose pool is at its limits to the next pool it fits, within the zones it is held
/// to (a zone-spread or zone-pinned class keeps its zone). False when there is none.
fn fall_through(class: &mut Class, offerings: &[Offering], room: &dyn Fn(usize, usize) -> Resources) -> bool {
    let zones: std::collections::HashSet<&str> = class.mask.iter().map(|&(_, oi)| offerings[oi].zone.as_str()).collect();
    while !class.fallback.is_empty() {
        let next: Vec<Slot> = class.fallback.remove(0).into_iter().filter(|&(_, oi)| zones.contains(offerings[oi].zone.as_str())).collect();
        if next.is_empty() {
            continue;
        }
        class.mask = next.iter().copied().collect();
        class.lower_bound = lower_bound(&next, class.requests, offerings, room);
        class.preference.clear();
        class.offerings = pareto(&next, offerings, room, &Default::default());
        return true;
    }
    false
}

/// Pack `pods` onto `existing` nodes first, then onto new nodes from `pools` x `offerings`.
/// `pools` are tried by weight (highest first); a pod uses the highest-weight pool that has any
/// compatible offering.
pub fn pack(pods: &[PendingPod], pools: &[Pool], offerings: &[Offering], existing: &[ExistingNode]) -> Plan {
    pack_within(pods, pools, offerings, existing, DEFAULT_BUDGET)
}

/// [`pack`], spending at most `budget` on the optimal plan (then the greedy plan stands).
pub(crate) fn pack_within(pods: &[PendingPod], pools: &[Pool], offerings: &[Offering], existing: &[ExistingNode], budget: std::time::Duration) -> Plan {
    let mut plan = Plan::default();
    let remaining = fill_existing(pods, existing, &mut plan);
    let priced: Vec<Offering> = offerings.iter().map(|o| Offering { price: o.price + NODE_TIE_BREAK, ..o.clone() }).collect();
    let (real, offerings) = (offerings, priced.as_slice());
    let slots = Slots::new(pools, offerings);
    let room_of = |pi: usize, oi: usize| slots.room(pi, oi);
    let mut classes: BTreeMap<String, Class> = BTreeMap::new();
    for pod in remaining {
        let sig = signature(pod);
        if let Some(c) = classes.get_mut(&sig) {
            c.pods.push(pod.id.clone());
            continue;
        }
        match class_of(pod, pools, offerings, &slots) {
            Ok(c) => {
                classes.insert(sig, c);
            }
            Err(reason) => plan.unschedulable.push(Unschedulable { pod: pod.id.clone(), reason }),
        }
    }
    let mut classes: Vec<Class> = spread_over_zones(classes.into_values().collect(), offerings, &room_of, &mut plan.unschedulable);
    pin_zone_groups(&mut classes, offerings, &room_of, &mut plan.unschedulable);
    narrow(&mut classes, offerings, &room_of);
    let family = (0..pools.len()).map(|pi| pools.iter().position(|p| p.name == pools[pi].name).unwrap_or(pi)).collect();
    let base = Packing { used: vec![(0, 0, 0); pools.len()], family, ..Packing::default() };
    let deadline = std::time::Instant::now() + budget;
    let packing = rounding::best_packing(classes, base, pools, offerings, &room_of, deadline);
    plan.unschedulable.extend(packing.unschedulable);
    // The bound is on prices with the tie-break: every node's price grew by at most the share
    // the tie-break is of the cheapest offering's price.
    let cheapest = real.iter().map(|o| o.price).fold(f64::INFINITY, f64::min);
    plan.lower_bound_per_hour = match packing.relaxed_bound {
        Some(b) if cheapest > 0.0 && cheapest.is_finite() => b / (1.0 + NODE_TIE_BREAK / cheapest),
        _ => 0.0,
    };
    for (i, d) in packing.drafts.into_iter().enumerate() {
        let o = &real[d.oi];
        plan.total_price_per_hour += o.price;
        plan.nodes.push(PlannedNode {
            name: format!("{}-{}", pools[d.pi].name, i + 1),
            pool: pools[d.pi].name.clone(),
            instance_type: o.instance.name.clone(),
            arch: o.instance.arch.clone(),
            zone: o.zone.clone(),
            capacity_type: o.capacity.as_str().to_string(),
            price_per_hour: o.price,
            labels: pools[d.pi].variant.clone(),
            pods: d.items.into_iter().flat_map(|(_, pods)| pods).collect(),
        });
    }
    plan
}

/// Existing nodes first: first fit, largest pods first. The pods left for new nodes (those that
/// go with their group are always left: co-location is decided zone by zone).
fn fill_existing<'a>(pods: &'a [PendingPod], existing: &[ExistingNode], plan: &mut Plan) -> Vec<&'a PendingPod> {
    let mut existing: Vec<ExistingNode> = existing.to_vec();
    let mut remaining = Vec::new();
    let mut order: Vec<&PendingPod> = pods.iter().collect();
    order.sort_by(|a, b| b.requests.cmp(&a.requests).then_with(|| a.id.cmp(&b.id)));
    for pod in order {
        if pod.zone_group.is_some() || pod.colocate {
            remaining.push(pod);
            continue;
        }
        let fit = existing.iter_mut().find(|n| pod.requests.fits(n.free) && tolerates_all(pod, &n.taints) && labels_fit(pod, &n.labels).is_ok());
        match fit {
            Some(n) => {
                n.free = n.free - pod.requests;
                plan.existing.insert(pod.id.clone(), n.name.clone());
            }
            None => remaining.push(pod),
        }
    }
    remaining
}

/// Which offerings a pool plans with: its own ([`Offering::pool`]) instead of the shared ones of
/// the same type, zone and capacity type, and no other pool's. The one rule for every planner
/// path that buys a node (the packer's slots, consolidation's single replacement).
pub(crate) struct Visibility<'a> {
    own: std::collections::HashSet<(&'a str, &'a str, &'a str, CapacityType)>,
}

impl<'a> Visibility<'a> {
    pub(crate) fn of(offerings: &'a [Offering]) -> Self {
        Visibility { own: offerings.iter().filter_map(|o| Some((o.pool.as_deref()?, o.instance.name.as_str(), o.zone.as_str(), o.capacity))).collect() }
    }

    pub(crate) fn sees(&self, pool: &Pool, o: &Offering) -> bool {
        match o.pool.as_deref() {
            Some(p) => p == pool.name,
            None => self.own.is_empty() || !self.own.contains(&(pool.name.as_str(), o.instance.name.as_str(), o.zone.as_str(), o.capacity)),
        }
    }
}

/// The offerings a new node of some pool of `pools` may be bought as, or more: an offering a pool
/// sees ([`Offering::pool`]) whose labels that pool's requirements admit on every key an offering
/// sets (arch, zone, instance type, capacity type, the cloud's keys). Requirements on custom keys
/// are not read, so the copies the planner makes of a pool for them (which narrow only those
/// keys) buy nothing outside this set: what a new node costs is never below the cheapest of it.
pub fn launchable<'a>(pools: &'a [Pool], offerings: &'a [Offering]) -> impl Iterator<Item = &'a Offering> + 'a {
    let visible = Visibility::of(offerings);
    offerings.iter().filter(move |o| {
        pools.iter().filter(|pool| visible.sees(pool, o)).any(|pool| {
            let labels = o.labels(pool);
            pool.requirements.keys().filter(|k| Offering::sets_label(k)).all(|k| pool.requirements.get(k).is_some_and(|c| c.admits(labels.get(k).map(String::as_str))))
        })
    })
}

/// Every (pool, offering) a new node can be: pools by weight, the labels each offering gets in
/// each pool, and the room for workload pods after the pool's DaemonSets.
struct Slots {
    pool_order: Vec<usize>,
    labels: Vec<Vec<(usize, BTreeMap<String, String>)>>,
    room: std::collections::HashMap<Slot, Resources>,
}

impl Slots {
    fn new(pools: &[Pool], offerings: &[Offering]) -> Slots {
        let mut pool_order: Vec<usize> = (0..pools.len()).collect();
        pool_order.sort_by(|&a, &b| pools[b].weight.cmp(&pools[a].weight).then_with(|| pools[a].name.cmp(&pools[b].name)));
        let visible = Visibility::of(offerings);
        let labels: Vec<Vec<(usize, BTreeMap<String, String>)>> = pools
            .iter()
            .map(|pool| {
                offerings
                    .iter()
                    .enumerate()
                    .filter(|(_, o)| visible.sees(pool, o))
                    .filter_map(|(i, o)| {
                        let labels = o.labels(pool);
                        (pool.requirements.matches_map(&labels) && Offering::keeps_template_labels(&labels, pool)).then_some((i, labels))
                    })
                    .collect()
            })
            .collect();
        let room = labels.iter().enumerate().flat_map(|(pi, list)| list.iter().map(move |(oi, l)| ((pi, *oi), pools[pi].room(l, offerings[*oi].instance.allocatable)))).collect();
        Slots { pool_order, labels, room }
    }

    fn room(&self, pi: usize, oi: usize) -> Resources {
        self.room.get(&(pi, oi)).copied().unwrap_or_default()
    }
}

/// The class of `pod` (pods identical to it join it): the offerings of the first pool by weight
/// that has any it fits, with the preferred-affinity weight each earns, and the lower-weight
/// pools it also fits for when that pool reaches its limits. `Err`: why no pool takes it.
fn class_of(pod: &PendingPod, pools: &[Pool], offerings: &[Offering], slots: &Slots) -> Result<Class, String> {
    let mut compatible = Vec::new();
    let mut fallback: Vec<Vec<Slot>> = Vec::new();
    let mut why = String::from("no NodePool");
    for &pi in &slots.pool_order {
        let pool = &pools[pi];
        if !tolerates_all(pod, &pool.taints) {
            why = format!("does not tolerate the taints of pool {}", pool.name);
            continue;
        }
        // The largest room among the instance types the pod's constraints allow here: when
        // some are allowed and none is big enough, the reason is the pod's size (whatever the
        // other types fail on), not the last constraint a smaller type failed.
        let mut largest_allowed: Option<Resources> = None;
        let fits: Vec<(Slot, i32)> = slots.labels[pi]
            .iter()
            .filter(|(oi, labels)| {
                let ok = labels_fit(pod, labels).and_then(|()| extended_fit(pod, &offerings[*oi], &pool.name));
                if let Err(e) = &ok {
                    why = if e.starts_with("pool ") { e.clone() } else { format!("pool {}: {e}", pool.name) };
                    return false;
                }
                let room = slots.room(pi, *oi);
                largest_allowed = Some(largest_allowed.map_or(room, |l| if (room.cpu_millis, room.memory_bytes) > (l.cpu_millis, l.memory_bytes) { room } else { l }));
                pod.requests.fits(room)
            })
            .map(|(oi, labels)| ((pi, *oi), pod.preferred.iter().filter(|(_, r)| r.matches_map(labels)).map(|(w, _)| *w).sum()))
            .collect();
        if !fits.is_empty() {
            if compatible.is_empty() {
                compatible = fits;
            } else {
                fallback.push(fits.into_iter().map(|(slot, _)| slot).collect());
            }
            continue;
        }
        if !compatible.is_empty() {
            continue;
        }
        if let Some(l) = largest_allowed {
            why = format!("pool {}: no instance type it allows is big enough for the pod's requests ({}); the largest has room for {l}", pool.name, pod.requests);
            continue;
        }
        if why.starts_with("no NodePool") || why.starts_with("does not tolerate") {
            why = format!("pool {}: no instance type fits the pod's requests and constraints", pool.name);
        }
    }
    if compatible.is_empty() {
        return Err(why);
    }
    let preference: std::collections::HashMap<Slot, i32> = compatible.iter().copied().filter(|&(_, w)| w > 0).collect();
    let compatible: Vec<Slot> = compatible.into_iter().map(|(slot, _)| slot).collect();
    let lower_bound = lower_bound(&compatible, pod.requests, offerings, &|pi, oi| slots.room(pi, oi));
    Ok(Class {
        pods: vec![pod.id.clone()],
        requests: pod.requests,
        offerings: compatible,
        lower_bound,
        zone_spread: pod.zone_spread,
        per_node_max: pod.per_node_max,
        zone_group: pod.zone_group.clone(),
        spread_group: pod.spread_key().cloned(),
        one_per_zone: pod.one_per_zone,
        colocate: pod.colocate,
        preference,
        mask: Default::default(),
        extended: pod.extended.clone(),
        fallback,
    })
}

/// Biggest pods first; what each class may fill, then the offerings worth leading a node with:
/// per class, drop offerings another compatible one beats on price with at least as much room
/// everywhere (the same type in another zone included, unless the class is held to a zone).
fn narrow(classes: &mut [Class], offerings: &[Offering], room_of: &dyn Fn(usize, usize) -> Resources) {
    classes.sort_by_key(|c| std::cmp::Reverse(c.requests));
    let mut pruned: std::collections::HashMap<Vec<Slot>, Vec<Slot>> = std::collections::HashMap::new();
    for c in classes.iter_mut() {
        c.mask = c.offerings.iter().copied().collect();
        c.offerings = if c.preference.is_empty() {
            pruned.entry(c.offerings.clone()).or_insert_with(|| pareto(&c.offerings, offerings, room_of, &Default::default())).clone()
        } else {
            pareto(&c.offerings, offerings, room_of, &c.preference)
        };
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod budget_tests {
    use super::batch_budget;
    use std::time::Duration;

    #[test]
    fn the_budget_grows_with_the_batch_within_its_bounds() {
        let two = Duration::from_secs(2);
        assert_eq!(batch_budget(two, 0), super::MIN_BUDGET);
        assert_eq!(batch_budget(two, 10), super::MIN_BUDGET);
        assert!(super::MIN_BUDGET == Duration::from_millis(30) || cfg!(debug_assertions));
        assert_eq!(batch_budget(two, 1_000), Duration::from_millis(400));
        assert_eq!(batch_budget(two, 5_000), two);
        assert_eq!(batch_budget(two, usize::MAX), two);
        assert_eq!(batch_budget(Duration::ZERO, 1_000), Duration::ZERO);
        assert_eq!(batch_budget(Duration::from_millis(10), 1_000), Duration::from_millis(10));
    }
}
