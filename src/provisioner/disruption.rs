//! Taking nodes away: empty nodes after `consolidateAfter`, underutilised nodes when their pods
//! fit more cheaply elsewhere (on other nodes, or on a cheaper replacement), and nodes past
//! `expireAfter`. A disrupted node is tainted, its replacements (if any) are launched and waited
//! for, its pods are evicted through the Eviction API (PodDisruptionBudgets hold it back), and
//! then the instance and its claim are deleted. Budgets bound how many nodes of a pool are being
//! disrupted at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, EvictParams, Patch, PatchParams};
use kube::Api;

use super::consolidation;
use super::nodeclaim::NodeClaim;
use super::state::{self, DisruptionSettings};
use super::state::age_of;
use super::worker::Provisioner;
use crate::core::labels;
use crate::metrics::label;

/// Per-node clocks: since when a node has been empty / had the same pods.
#[derive(Default)]
pub struct Tracker {
    since: Mutex<HashMap<String, (String, Instant)>>,
    drains: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
}

impl Tracker {
    /// How long the node has had exactly this set of pods.
    fn stable_for(&self, node: &str, signature: String) -> Duration {
        let mut m = self.since.lock().unwrap_or_else(|e| e.into_inner());
        let e = m.entry(node.to_string()).or_insert_with(|| (signature.clone(), Instant::now()));
        if e.0 != signature {
            *e = (signature, Instant::now());
        }
        e.1.elapsed()
    }

    fn draining(&self, node: &str) -> bool {
        self.drains.lock().unwrap_or_else(|e| e.into_inner()).get(node).is_some_and(|h| !h.is_finished())
    }
}

/// One node Archer may disrupt, with the live pods bound to it.
struct Candidate<'a> {
    node: Arc<Node>,
    claim: Arc<NodeClaim>,
    pods: Vec<&'a Pod>,
    price: f64,
}

impl Provisioner {
    pub(super) async fn disruption_loop(self: Arc<Self>) {
        let interval = Duration::from_secs_f64(self.settings.disruption_interval_seconds);
        tracing::debug!(?interval, "disruption loop started");
        loop {
            tokio::time::sleep(interval).await;
            self.disrupt_once().await;
        }
    }

    /// One pass: resume drains after a restart, then at most one new decision per pool.
    #[tracing::instrument(skip_all)]
    pub async fn disrupt_once(self: &Arc<Self>) {
        let nodes = self.stores.nodes.state();
        let claims = self.stores.claims.state();
        let pods = self.stores.pods.state();
        let by_node_name: HashMap<&str, &Arc<NodeClaim>> = claims.iter().filter_map(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()).map(|n| (n, c))).collect();
        let claim_of = |n: &Node| n.metadata.name.as_deref().and_then(|name| by_node_name.get(name)).map(|c| Arc::clone(c));
        // Drains a previous leader started (the taint is the record).
        for n in nodes.iter().filter(|n| state::node_leaving(n) && state::node_pool_of(n).is_some()) {
            let name = n.metadata.name.clone().unwrap_or_default();
            if n.metadata.deletion_timestamp.is_none() && !self.disruption.draining(&name) {
                if let Some(c) = claim_of(n) {
                    tracing::info!(node = %name, "resuming the drain of a disrupted node");
                    self.start_drain(n.clone(), c, Vec::new(), "resumed");
                }
            }
        }
        let grace = Duration::from_secs(self.settings.disruption_grace_seconds);
        let by_node = state::usage_by_node(pods.iter().map(|p| p.as_ref()));
        for np in self.stores.pools.state() {
            let pool = np.name();
            let settings = match DisruptionSettings::of(&np) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(pool = %pool, error = %e, "disruption settings unusable; the pool's nodes are left alone");
                    continue;
                }
            };
            let pool_nodes: Vec<&Arc<Node>> = nodes.iter().filter(|n| state::node_pool_of(n) == Some(pool.as_str())).collect();
            let disrupting = pool_nodes.iter().filter(|n| state::node_leaving(n)).count();
            let mut candidates = Vec::new();
            for n in pool_nodes.iter().filter(|n| !state::node_leaving(n) && state::node_ready(n)) {
                let Some(claim) = claim_of(n) else { continue };
                let young = claim.status.as_ref().and_then(|s| s.launched_at.as_deref()).and_then(age_of).is_none_or(|a| a < grace);
                if young || state::has_taint(n, labels::UNREGISTERED_TAINT) {
                    continue;
                }
                let name = n.metadata.name.clone().unwrap_or_default();
                let on_node = by_node.get(&name).map(|(_, pods)| pods.clone()).unwrap_or_default();
                let price = if claim.spec.price_per_hour > 0.0 { claim.spec.price_per_hour } else { f64::INFINITY };
                candidates.push(Candidate { node: (*n).clone(), claim, pods: on_node, price });
            }
            let budget = |reason: &str| settings.allowed(pool_nodes.len(), reason).saturating_sub(disrupting);
            tracing::debug!(pool = %pool, nodes = pool_nodes.len(), candidates = candidates.len(), disrupting, "disruption pass");

            // Expired nodes first: they go whatever their pods cost elsewhere.
            if let Some(expire) = settings.expire_after {
                let expired: Vec<&Candidate> = candidates.iter().filter(|c| c.claim.metadata.creation_timestamp.as_ref().and_then(|t| age_of(&t.0.to_string())).is_some_and(|a| a >= expire)).collect();
                for c in expired.into_iter().take(budget("Expired")) {
                    tracing::info!(node = ?c.node.metadata.name, pool = %pool, "node expired; draining it");
                    self.start_drain(c.node.clone(), c.claim.clone(), Vec::new(), "expired");
                }
                if candidates.iter().any(|c| self.disruption.draining(c.node.metadata.name.as_deref().unwrap_or(""))) {
                    continue;
                }
            }
            let Some(after) = settings.consolidate_after else { continue };
            // Only on a settled cluster: not while pods wait for capacity or claims are launching.
            let waiting: Vec<String> = {
                let w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
                w.iter().filter(|id| pods.iter().any(|p| state::pod_id(p) == **id && state::is_provisionable(p))).cloned().collect()
            };
            let node_refs: Vec<&Node> = nodes.iter().map(|n| n.as_ref()).collect();
            let claim_refs: Vec<&NodeClaim> = claims.iter().map(|c| c.as_ref()).collect();
            if let Some(why) = state::consolidation_hold(&pool, &claim_refs, &node_refs, &waiting) {
                tracing::debug!(pool = %pool, why = %why, "consolidation waits for a settled cluster");
                continue;
            }
            // Empty nodes (DaemonSet pods do not count).
            let empty: Vec<&Candidate> = candidates
                .iter()
                .filter(|c| {
                    let workload = state::evictable(&c.pods).len();
                    let name = c.node.metadata.name.clone().unwrap_or_default();
                    // Every pass updates the clock, so a node that gets a pod starts over.
                    let empty_for = self.disruption.stable_for(&format!("empty/{name}"), if workload == 0 { "empty" } else { "busy" }.into());
                    workload == 0 && empty_for >= after
                })
                .collect();
            if !empty.is_empty() {
                for c in empty.into_iter().take(budget("Empty")) {
                    tracing::info!(node = ?c.node.metadata.name, pool = %pool, "node empty; removing it");
                    self.start_drain(c.node.clone(), c.claim.clone(), Vec::new(), "empty");
                }
                continue;
            }
            if settings.underutilized && budget("Underutilized") > 0 {
                self.consolidate(&pool, &candidates, after, budget("Underutilized")).await;
            }
        }
    }

    /// Replace or remove underutilised nodes of `pool` when that lowers the price.
    async fn consolidate(self: &Arc<Self>, pool: &str, candidates: &[Candidate<'_>], after: Duration, budget: usize) {
        let eligible: Vec<&Candidate> = candidates
            .iter()
            .filter(|c| {
                let name = c.node.metadata.name.clone().unwrap_or_default();
                let mut ids: Vec<String> = c.pods.iter().map(|p| state::pod_id(p)).collect();
                ids.sort();
                let blocked = state::disruption_blocker(&c.pods);
                let annotated = state::do_not_disrupt(&c.node.metadata);
                if let Some(why) = &blocked {
                    tracing::debug!(node = %name, why = %why, "not a consolidation candidate");
                }
                let stable_for = self.disruption.stable_for(&format!("pods/{name}"), ids.join(","));
                blocked.is_none() && !annotated && !c.pods.is_empty() && stable_for >= after
            })
            .collect();
        if eligible.is_empty() {
            return;
        }
        // The deciding is pure (`consolidation`); the platforms of the pods that would move are
        // resolved first (registry lookups are the only awaits).
        let moving: Vec<&Pod> = eligible.iter().flat_map(|c| state::evictable(&c.pods)).collect();
        let found = futures::future::join_all(moving.iter().map(|p| async move { (state::pod_id(p), self.platforms(p).await) })).await;
        let found: HashMap<String, Option<crate::core::platform::PlatformSet>> = found.into_iter().collect();
        let platforms = |p: &Pod| found.get(&state::pod_id(p)).cloned().flatten();
        let views: Vec<consolidation::Candidate> = eligible.iter().map(|c| consolidation::Candidate { node: c.node.as_ref(), pods: c.pods.clone(), price: c.price }).collect();
        let nodes = self.stores.nodes.state();
        let claims = self.stores.claims.state();
        let pods = self.stores.pods.state();
        let namespaces = self.cluster.as_ref().map(|c| c.namespaces()).unwrap_or_default();
        let (node_refs, claim_refs, pod_refs, ns_refs): (Vec<&Node>, Vec<&NodeClaim>, Vec<&Pod>, Vec<&k8s_openapi::api::core::v1::Namespace>) =
            (nodes.iter().map(|n| n.as_ref()).collect(), claims.iter().map(|c| c.as_ref()).collect(), pods.iter().map(|p| p.as_ref()).collect(), namespaces.iter().map(|n| n.as_ref()).collect());
        let pools = self.pools();
        let volumes = self.volumes();
        let world = consolidation::World { nodes: &node_refs, claims: &claim_refs, pods: &pod_refs, namespaces: &ns_refs, pools: &pools, offerings: &self.offerings, volumes: &volumes, platforms: &platforms };
        let view_refs: Vec<&consolidation::Candidate> = views.iter().collect();
        let Some(decision) = tokio::task::block_in_place(|| consolidation::underutilized(&world, pool, &view_refs, budget)) else { return };
        let set: Vec<&Candidate> = eligible.iter().copied().filter(|c| decision.nodes.iter().any(|n| Some(n.as_str()) == c.node.metadata.name.as_deref())).collect();
        tracing::info!(pool, nodes = ?decision.nodes, replacements = decision.replacements.len(), saving_per_hour = decision.saving_per_hour, "consolidating");
        // Taint first, so the scheduler stops adding pods while replacements start.
        for c in &set {
            self.taint(&c.node).await;
        }
        let replacements = self.launch_plan(&decision.replacements, "replacement").await;
        if replacements.len() < decision.replacements.len() {
            // A decision is carried out whole or not at all: without every replacement the
            // evicted pods would have no place.
            tracing::warn!(pool, wanted = decision.replacements.len(), launched = replacements.len(), "not every replacement could be launched; the consolidation is called off");
            for c in &set {
                self.remove_taint(c.node.metadata.name.as_deref().unwrap_or(""), labels::DISRUPTED_TAINT).await;
            }
            return;
        }
        for c in set {
            self.start_drain(c.node.clone(), c.claim.clone(), replacements.clone(), "underutilized");
        }
    }

    async fn taint(&self, node: &Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        if state::has_taint(node, labels::DISRUPTED_TAINT) {
            return;
        }
        let mut taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        taints.push(k8s_openapi::api::core::v1::Taint { key: labels::DISRUPTED_TAINT.into(), value: None, effect: "NoSchedule".into(), time_added: None });
        let patch = serde_json::json!({"spec": {"taints": taints}});
        if let Err(e) = Api::<Node>::all(self.client.clone()).patch(&name, &PatchParams::default(), &Patch::Merge(patch)).await {
            tracing::warn!(node = %name, error = %e, "could not taint the node");
        }
    }

    fn start_drain(self: &Arc<Self>, node: Arc<Node>, claim: Arc<NodeClaim>, replacements: Vec<String>, reason: &'static str) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let me = self.clone();
        let task = tokio::spawn(async move { me.drain(node, claim, replacements, reason).await });
        self.disruption.drains.lock().unwrap_or_else(|e| e.into_inner()).insert(name, task);
    }

    /// Taint, wait for replacements, evict, delete.
    #[tracing::instrument(skip_all, fields(node = %node.metadata.name.as_deref().unwrap_or(""), reason))]
    async fn drain(self: Arc<Self>, node: Arc<Node>, claim: Arc<NodeClaim>, replacements: Vec<String>, reason: &'static str) {
        let name = node.metadata.name.clone().unwrap_or_default();
        self.taint(&node).await;
        let deadline = Instant::now() + Duration::from_secs(self.settings.drain_timeout_seconds);
        // Replacements Ready before any pod leaves; without them no pod leaves at all.
        while !replacements.is_empty() {
            let nodes = self.stores.nodes.state();
            let ready = replacements.iter().all(|r| nodes.iter().any(|n| n.metadata.name.as_deref() == Some(r.as_str()) && state::node_ready(n) && !state::has_taint(n, labels::UNREGISTERED_TAINT)));
            if ready {
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(?replacements, "replacements not Ready in time; nothing evicted, the node is given back");
                self.remove_taint(&name, labels::DISRUPTED_TAINT).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        loop {
            let pods: Vec<Arc<Pod>> = self.stores.pods.state().into_iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str())).collect();
            let left = state::evictable(&pods.iter().map(|p| p.as_ref()).collect::<Vec<_>>()).into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).cloned().collect::<Vec<Pod>>();
            let terminating = pods.iter().any(|p| p.metadata.deletion_timestamp.is_some() && !state::is_daemon_pod(p));
            if left.is_empty() && !terminating {
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(remaining = left.len(), "drain timed out (PodDisruptionBudgets?); the node is given back");
                self.remove_taint(&name, labels::DISRUPTED_TAINT).await;
                return;
            }
            for p in &left {
                let ns = p.metadata.namespace.clone().unwrap_or_default();
                let pname = p.metadata.name.clone().unwrap_or_default();
                match Api::<Pod>::namespaced(self.client.clone(), &ns).evict(&pname, &EvictParams::default()).await {
                    Ok(_) => tracing::info!(pod = %pname, namespace = %ns, "evicted"),
                    Err(kube::Error::Api(s)) if s.code == 429 => tracing::debug!(pod = %pname, namespace = %ns, "eviction refused by a PodDisruptionBudget; retrying"),
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => tracing::warn!(pod = %pname, namespace = %ns, error = %e, "eviction failed; retrying"),
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if let Err(e) = self.provider.delete(&claim).await {
            tracing::warn!(error = %e, "could not delete the instance; retried on the next pass");
            return;
        }
        match Api::<NodeClaim>::all(self.client.clone()).delete(&claim.name(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => tracing::warn!(error = %e, "could not delete the claim"),
        }
        self.metrics.nodes_terminated.get_or_create(&label("reason", reason)).inc();
        tracing::info!("node removed");
    }
}
