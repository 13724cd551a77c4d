//! `archer report`: the arm64 readiness of a cluster, read-only. Which workloads run where and
//! what they cost, which could move to arm64 (every image runs there) and what that would save,
//! which are blocked and by which single-architecture image, and which pods already sit on an
//! architecture their images do not support. Pure: nodes, pods, image platforms and the price
//! catalog in, a [`Report`] out; the command gathers the inputs (a live cluster or a dump).

mod text;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::Serialize;

use archer_core::catalog::Catalog;
use archer_core::labels;
use archer_core::platform::PlatformSet;
use archer_core::resources::{pod_requests, Resources};
use archer_api::nodepool::{offerings, NodePool};
use crate::provisioner::{adapter as model, objects as state};

pub use text::render_text;

/// Hours in a month, as cloud bills count them.
pub const HOURS_PER_MONTH: f64 = 730.0;

/// What each image can run on, or why that is not known.
pub type ImagePlatforms = BTreeMap<String, Result<PlatformSet, String>>;

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub summary: Summary,
    pub workloads: Vec<Workload>,
    /// Pods running on an architecture none of their images supports.
    pub misplaced: Vec<Misplaced>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub nodes: usize,
    pub nodes_by_arch: BTreeMap<String, usize>,
    pub pods: usize,
    /// What the nodes cost per month, and the part of it on arm64 nodes (unpriced nodes left
    /// out: see `unpriced_nodes`).
    pub cost_per_month: f64,
    pub arm64_cost_per_month: f64,
    /// Nodes no price is known for, which the costs above do not count (each named in the notes).
    pub unpriced_nodes: usize,
    pub workloads: usize,
    pub movable: usize,
    pub blocked: usize,
    pub unknown: usize,
    /// What moving every movable workload to arm64 would save per month.
    pub saving_per_month: f64,
    pub misplaced_pods: usize,
    /// Pods whose platforms Archer could not decide: the webhook could not inspect their images
    /// (`archer.dev/decision: inspection-failed`), or this report could not; and how many for
    /// each reason (`unauthorized`, `identity`, `timeout`, ...; `not_inspected` offline, `other`
    /// for a reason the report cannot read).
    pub undecided_pods: usize,
    pub undecided_by_reason: BTreeMap<String, usize>,
}

/// Where a workload stands with arm64.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Readiness {
    /// Every pod already runs on arm64.
    OnArm64,
    /// Every image runs on arm64 and some pods run elsewhere: it can move.
    Movable,
    /// Every image runs on arm64, but the pods' own constraints (nodeSelector, affinity) keep
    /// them off it.
    Pinned,
    /// Some image has no linux/arm64 build.
    Blocked,
    /// Some image could not be inspected.
    Unknown,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    pub namespace: String,
    /// Deployment, StatefulSet, DaemonSet, Job, ReplicaSet, ... or Pod for a bare pod.
    pub kind: String,
    pub name: String,
    pub pods: usize,
    /// Pods per node architecture.
    pub architectures: BTreeMap<String, usize>,
    /// The pods' share of their nodes' price (by requests against allocatable), per month.
    pub cost_per_month: f64,
    pub readiness: Readiness,
    /// Images without a linux/arm64 build (blocked), or that could not be inspected (unknown).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocked_by: Vec<ImageProblem>,
    /// Movable: what the pods would save per month on arm64 (planned as `simulate --compare`
    /// plans them: fresh on-demand nodes, arm64 allowed against arm64 forbidden).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saving_per_month: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageProblem {
    pub image: String,
    /// Its platforms (`linux/amd64`), or empty when unknown.
    pub platforms: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Misplaced {
    pub pod: String,
    pub node: String,
    pub arch: String,
    /// The platforms every image of the pod supports.
    pub supported: Vec<String>,
}

/// The workload a pod belongs to: its controller, a ReplicaSet read as its Deployment (the
/// ReplicaSet's name is the Deployment's plus the pod-template-hash), or the pod itself.
fn workload_of(pod: &Pod) -> (String, String) {
    let owner = pod.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
    match owner {
        Some(o) if o.kind == "ReplicaSet" => {
            let hash = pod.metadata.labels.as_ref().and_then(|l| l.get("pod-template-hash"));
            match hash.and_then(|h| o.name.strip_suffix(&format!("-{h}"))) {
                Some(deployment) => ("Deployment".into(), deployment.into()),
                None => ("ReplicaSet".into(), o.name.clone()),
            }
        }
        Some(o) => (o.kind.clone(), o.name.clone()),
        None => ("Pod".into(), pod.metadata.name.clone().unwrap_or_default()),
    }
}

fn node_arch(node: &Node) -> String {
    node.metadata.labels.as_ref().and_then(|l| l.get(labels::ARCH)).cloned().unwrap_or_else(|| "unknown".into())
}


/// A pod's share of its node: the mean of its cpu and memory requests' fractions of the node's
/// allocatable (requests as the scheduler counts them, defaults for containers without).
fn share(pod: &Pod, node: &Node) -> f64 {
    let alloc = Resources::from_map(node.status.as_ref().and_then(|s| s.allocatable.as_ref()));
    let req = pod_requests(pod, true);
    let frac = |r: i64, a: i64| if a > 0 { (r as f64 / a as f64).min(1.0) } else { 0.0 };
    (frac(req.cpu_millis, alloc.cpu_millis) + frac(req.memory_bytes, alloc.memory_bytes)) / 2.0
}

/// Why Archer could not decide a pod's platforms, if it could not: the webhook's word first
/// (its `archer.dev/inspection-error`, whatever the decision it then took: `inspection-failed`,
/// or a namespace's fallback architecture; the bracketed reason in it), else this report's own
/// inspection.
fn undecided(pod: &Pod, images: &ImagePlatforms) -> Option<&'static str> {
    if let Some(said) = pod.metadata.annotations.as_ref().and_then(|a| a.get("archer.dev/inspection-error")) {
        return Some(archer_registry::RegistryError::reason_in(said).unwrap_or("other"));
    }
    let problems = pod_platforms(pod, images).err()?;
    Some(match problems.iter().find_map(|p| p.error.as_deref()) {
        Some(text) if !text.starts_with(NOT_INSPECTED) => archer_registry::RegistryError::reason_in(text).unwrap_or("other"),
        _ => "not_inspected",
    })
}

/// What an image the report did not inspect says (offline: `not inspected (--offline)`).
const NOT_INSPECTED: &str = "not inspected";

/// The platforms every image of the pod supports, by the one rule
/// ([`archer_core::placement::pod_platforms`]: the webhook's annotation, else the images'); `Err`
/// lists the images that could not be inspected.
fn pod_platforms(pod: &Pod, images: &ImagePlatforms) -> Result<PlatformSet, Vec<ImageProblem>> {
    if let Some(p) = archer_core::placement::pod_platforms(pod, &|i| images.get(i).and_then(|r| r.as_ref().ok())) {
        return Ok(p);
    }
    let problems: Vec<ImageProblem> = archer_core::placement::pod_images(pod)
        .into_iter()
        .filter_map(|image| match images.get(&image) {
            Some(Ok(_)) => None,
            Some(Err(e)) => Some(ImageProblem { image, platforms: Vec::new(), error: Some(e.clone()) }),
            None => Some(ImageProblem { image, platforms: Vec::new(), error: Some(NOT_INSPECTED.into()) }),
        })
        .collect();
    // A pod that names no image has nothing to run anywhere.
    if problems.is_empty() {
        return Ok(PlatformSet::default());
    }
    Err(problems)
}

/// Images of the pod with no linux/arm64 build.
fn arm64_blockers(pod: &Pod, images: &ImagePlatforms) -> Vec<ImageProblem> {
    archer_core::placement::pod_images(pod)
        .into_iter()
        .filter_map(|image| match images.get(&image) {
            Some(Ok(p)) if !p.architectures_for_os("linux").contains("arm64") => Some(ImageProblem { image, platforms: p.0.iter().map(|x| x.to_string()).collect(), error: None }),
            _ => None,
        })
        .collect()
}

fn supports(p: &PlatformSet, arch: &str) -> bool {
    p.architectures_for_os("linux").contains(arch)
}

/// Whether the pod's own nodeSelector and required node affinity admit its node were it arm64.
fn admits_arm64(pod: &Pod, node: &Node) -> bool {
    let mut l = node.metadata.labels.clone().unwrap_or_default();
    l.insert(labels::ARCH.into(), "arm64".into());
    archer_core::sched::PodInfo::from_pod(pod).admits_node(node.metadata.name.as_deref().unwrap_or(""), &l)
}

/// What moving `pods` to arm64 would save per hour: the counterfactual `simulate --compare` and
/// the savings metrics use, on a default pool (any architecture, on-demand) in `zones`.
fn arm64_saving(pods: &[&Pod], platforms: &PlatformSet, catalog: &Catalog, zones: &[String]) -> f64 {
    let volumes = archer_core::sched::Volumes::default();
    let pending: Vec<_> = pods.iter().map(|p| model::pending_unbound(p, Some(platforms.clone()), &volumes, archer_core::sched::preferences::Policy::default())).collect();
    let Ok(pool) = NodePool::default_pool().to_pool() else { return 0.0 };
    let offers = offerings(catalog, zones);
    let snapshot = archer_core::sched::Snapshot::new(&[], &[], &[]);
    archer_core::planner::compare::compare(&snapshot, &pending, &pending, &[pool], &offers).arm64_saving().max(0.0)
}

#[derive(Default)]
struct Group<'a> {
    pods: Vec<&'a Pod>,
    architectures: BTreeMap<String, usize>,
    cost: f64,
}

/// The report on the cluster's nodes and pods (finished pods and pods on no node are left out).
pub fn build(cluster: &archer_model::ClusterState, images: &ImagePlatforms, catalog: &Catalog) -> Report {
    let (nodes, pods) = (archer_model::cluster::refs(&cluster.nodes), archer_model::cluster::refs(&cluster.pods));
    let mut notes = Vec::new();
    let by_name: BTreeMap<&str, &Node> = nodes.iter().filter_map(|n| Some((n.metadata.name.as_deref()?, *n))).collect();
    // The one price rule (annotation, claim, catalog), with the report's catalog.
    let priced = archer_model::ClusterState { catalog: Some(std::sync::Arc::new(catalog.clone())), ..cluster.clone() };
    let pricer = priced.pricer();
    let mut unpriced_nodes = 0;
    let prices: BTreeMap<&str, f64> = nodes
        .iter()
        .filter_map(|n| {
            let name = n.metadata.name.as_deref()?;
            let price = pricer.price(n);
            if let Err(why) = &price {
                unpriced_nodes += 1;
                notes.push(format!("node {name}: unpriced ({why}); left out of the costs"));
            }
            Some((name, price.map_or(0.0, |p| p.per_hour)))
        })
        .collect();
    let zones: Vec<String> = {
        let z: BTreeSet<String> = nodes.iter().filter_map(|n| n.metadata.labels.as_ref()?.get(labels::ZONE).cloned()).collect();
        if z.is_empty() { archer_api::nodepool::DEFAULT_ZONES.iter().map(|s| s.to_string()).collect() } else { z.into_iter().collect() }
    };
    let mut summary = Summary { nodes: nodes.len(), unpriced_nodes, ..Default::default() };
    for n in nodes.iter().copied() {
        *summary.nodes_by_arch.entry(node_arch(n)).or_default() += 1;
        let p = prices.get(n.metadata.name.as_deref().unwrap_or("")).copied().unwrap_or(0.0) * HOURS_PER_MONTH;
        summary.cost_per_month += p;
        if node_arch(n) == "arm64" {
            summary.arm64_cost_per_month += p;
        }
    }
    let mut groups: BTreeMap<(String, String, String), Group> = BTreeMap::new();
    let mut misplaced = Vec::new();
    for pod in pods.iter().copied().filter(|p| !state::is_terminal(p)) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).and_then(|n| by_name.get(n)) else { continue };
        summary.pods += 1;
        let arch = node_arch(node);
        let (kind, name) = workload_of(pod);
        let g = groups.entry((pod.metadata.namespace.clone().unwrap_or_default(), kind, name)).or_default();
        g.pods.push(pod);
        *g.architectures.entry(arch.clone()).or_default() += 1;
        g.cost += prices.get(node.metadata.name.as_deref().unwrap_or("")).copied().unwrap_or(0.0) * share(pod, node) * HOURS_PER_MONTH;
        if let Ok(p) = pod_platforms(pod, images) {
            if !p.is_empty() && !supports(&p, &arch) {
                misplaced.push(Misplaced { pod: state::pod_id(pod), node: node.metadata.name.clone().unwrap_or_default(), arch, supported: p.0.iter().map(|x| x.to_string()).collect() });
            }
        }
        if let Some(reason) = undecided(pod, images) {
            summary.undecided_pods += 1;
            *summary.undecided_by_reason.entry(reason.to_string()).or_default() += 1;
        }
    }
    let mut workloads = Vec::new();
    for ((namespace, kind, name), g) in groups {
        let Some(&first) = g.pods.first() else { continue };
        let (readiness, blocked_by, saving) = match pod_platforms(first, images) {
            Err(problems) => (Readiness::Unknown, problems, None),
            Ok(p) if !supports(&p, "arm64") => {
                let blockers = arm64_blockers(first, images);
                (Readiness::Blocked, blockers, None)
            }
            Ok(_) if g.architectures.keys().all(|a| a == "arm64") => (Readiness::OnArm64, Vec::new(), None),
            // A DaemonSet runs on every node whatever its architecture: nothing to move.
            Ok(_) if kind == "DaemonSet" => (Readiness::OnArm64, Vec::new(), None),
            Ok(p) => {
                let node_of = |pod: &Pod| pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).and_then(|n| by_name.get(n)).copied();
                let off_arm: Vec<(&Pod, &Node)> = g.pods.iter().filter_map(|pod| Some((*pod, node_of(pod)?))).filter(|(_, n)| node_arch(n) != "arm64").collect();
                if off_arm.iter().all(|(pod, n)| admits_arm64(pod, n)) {
                    let pods: Vec<&Pod> = off_arm.iter().map(|(p, _)| *p).collect();
                    (Readiness::Movable, Vec::new(), Some(arm64_saving(&pods, &p, catalog, &zones) * HOURS_PER_MONTH))
                } else {
                    (Readiness::Pinned, Vec::new(), None)
                }
            }
        };
        match readiness {
            Readiness::Movable => summary.movable += 1,
            Readiness::Blocked => summary.blocked += 1,
            Readiness::Unknown => summary.unknown += 1,
            _ => {}
        }
        summary.saving_per_month += saving.unwrap_or(0.0);
        workloads.push(Workload { namespace, kind, name, pods: g.pods.len(), architectures: g.architectures, cost_per_month: g.cost, readiness, blocked_by, saving_per_month: saving });
    }
    summary.workloads = workloads.len();
    summary.misplaced_pods = misplaced.len();
    // Biggest saving first, then biggest cost.
    workloads.sort_by(|a, b| b.saving_per_month.unwrap_or(0.0).total_cmp(&a.saving_per_month.unwrap_or(0.0)).then(b.cost_per_month.total_cmp(&a.cost_per_month)).then(a.name.cmp(&b.name)));
    Report { summary, workloads, misplaced, notes }
}

#[cfg(test)]
mod tests;
