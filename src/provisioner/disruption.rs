//! Taking nodes away: empty nodes after `consolidateAfter`, underutilised nodes when their pods
//! fit more cheaply elsewhere (on other nodes, or on a cheaper replacement), and nodes past
//! `expireAfter`. A disrupted node is tainted, its replacements (if any) are launched and waited
//! for, its pods are evicted through the Eviction API (PodDisruptionBudgets hold it back), and
//! then the instance and its claim are deleted. Budgets bound how many nodes of a pool are being
//! disrupted at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, EvictParams};
use kube::Api;

use archer_cloud::{Interruption, InterruptionHandler};
use archer_model::{consolidation, disruption};
use archer_api::nodeclaim::NodeClaim;
use archer_model::objects::{self as state, DisruptionSettings};
use archer_model::ClusterState;
use super::context::{Action, Context, ReconcileError};
use super::launch::Launcher;
use super::nodes;
use super::status::{StatusWriter, DISRUPTING, DRIFTED};
use archer_core::labels;
use archer_metrics::{label, labels2};

/// Per-node clocks: since when a node has been empty / had the same pods.
#[derive(Default)]
pub struct Tracker {
    since: Mutex<HashMap<String, (String, Instant)>>,
    drains: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
    /// Nodes another task is taking out (tainted, its drain not started yet): not resumed.
    reserved: Mutex<std::collections::HashSet<String>>,
    start: std::sync::atomic::AtomicUsize,
    /// Pools a full search found nothing in, on inputs that have not changed since.
    quiet: super::quiet::Quiet,
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

    /// Where this pass's single-node search starts: each pass moves on by what the last one
    /// evaluated.
    fn next_start(&self, step: usize) -> usize {
        self.start.fetch_add(step, std::sync::atomic::Ordering::Relaxed)
    }

    fn draining(&self, node: &str) -> bool {
        self.reserved.lock().unwrap_or_else(|e| e.into_inner()).contains(node) || self.drains.lock().unwrap_or_else(|e| e.into_inner()).get(node).is_some_and(|h| !h.is_finished())
    }

    /// Mark a node as being taken out by the caller (false when it already is).
    fn reserve(&self, node: &str) -> bool {
        !self.draining(node) && self.reserved.lock().unwrap_or_else(|e| e.into_inner()).insert(node.to_string())
    }

    fn release(&self, node: &str) {
        self.reserved.lock().unwrap_or_else(|e| e.into_inner()).remove(node);
    }
}

/// The disruption executor: decides per pool with `archer_model::consolidation`, then taints,
/// launches replacements through the launcher, drains and deletes.
pub struct Disrupter {
    ctx: Arc<Context>,
    launcher: Arc<Launcher>,
    status: Arc<StatusWriter>,
    tracker: Tracker,
}

impl Disrupter {
    pub fn new(ctx: Arc<Context>, launcher: Arc<Launcher>, status: Arc<StatusWriter>) -> Self {
        Disrupter { ctx, launcher, status, tracker: Tracker::default() }
    }

    /// One pass: resume drains after a restart, then at most one new decision per pool.
    #[tracing::instrument(skip_all)]
    pub async fn reconcile(self: &Arc<Self>) -> Result<Action, ReconcileError> {
        self.resume_drains();
        for np in self.ctx.stores.pools.state() {
            self.disrupt_pool(&np).await;
        }
        Ok(Action::requeue(Duration::from_secs_f64(self.ctx.settings.disruption_interval_seconds)))
    }

    /// Drains a previous leader started (the taint is the record).
    fn resume_drains(self: &Arc<Self>) {
        let state = self.ctx.state();
        for n in state.nodes.iter().filter(|n| state::node_leaving(n) && state::node_pool_of(n).is_some()) {
            let name = n.metadata.name.clone().unwrap_or_default();
            if n.metadata.deletion_timestamp.is_none() && !self.tracker.draining(&name) {
                if let Some(c) = state.claim_of_node(&name) {
                    tracing::info!(node = %name, "resuming the drain of a disrupted node");
                    self.start_drain(n.clone(), c.clone(), Vec::new(), "resumed");
                }
            }
        }
    }

    /// The pool's nodes now: all of them, and as candidates those the worker may disrupt, priced
    /// ([`disruption::candidates`], the rule `archer simulate --disruption` reads too).
    fn pool_nodes<'a>(&self, state: &'a ClusterState, pool: &str) -> consolidation::PoolNodes<'a> {
        disruption::candidates(state, pool, Duration::from_secs(self.ctx.settings.disruption_grace_seconds))
    }

    /// The node of that name and its claim, to act on.
    fn node_and_claim(state: &ClusterState, name: &str) -> Option<(Arc<Node>, Arc<NodeClaim>)> {
        Some((state.node(name)?.clone(), state.claim_of_node(name)?.clone()))
    }

    /// At most one new decision for the pool, by `archer_model::disruption`: expired nodes go at
    /// once; drifted nodes are replaced; empty or underutilised nodes only on a settled pool, and
    /// only if the decision still holds after a quiet period.
    async fn disrupt_pool(self: &Arc<Self>, np: &archer_api::nodepool::NodePool) {
        let pool = np.name();
        let settings = match DisruptionSettings::of(np) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(pool = %pool, error = %e, "disruption settings unusable; the pool's nodes are left alone");
                return;
            }
        };
        let state = self.ctx.state();
        let nodes = self.pool_nodes(&state, &pool);
        tracing::debug!(pool = %pool, nodes = nodes.total, candidates = nodes.candidates.len(), disrupting = nodes.disrupting, "disruption pass");
        let (empty_for, settled) = match settings.consolidate_after {
            Some(after) => self.read_clocks(&nodes, after),
            None => Default::default(),
        };
        let mut hold = self.ctx.hold(&state, &pool);
        if let Some(why) = &hold {
            tracing::debug!(pool = %pool, why = %why, "consolidation waits for a settled cluster");
        }
        // Nothing a search reads changed since a full search found nothing: skip it (drift and
        // expiry are still checked).
        fn names(set: &HashSet<String>) -> Vec<&str> {
            let mut v: Vec<&str> = set.iter().map(String::as_str).collect();
            v.sort_unstable();
            v
        }
        let budget = nodes.budget(&settings, "Underutilized").min(nodes.budget(&settings, "Empty"));
        let inputs = super::quiet::inputs(&state, &nodes, &names(&settled), &names(&empty_for), budget, hold.as_deref());
        let windows = nodes.candidates.len().div_ceil(consolidation::EVALUATIONS_PER_PASS);
        let searching = hold.is_none() && !self.tracker.quiet.consolidated(&pool, inputs, windows, Instant::now());
        if hold.is_none() && !searching {
            tracing::debug!(pool = %pool, "consolidation skipped: nothing changed since a full search found nothing");
            self.ctx.metrics.consolidation_skipped.inc();
            hold = Some("consolidated: nothing changed since a full search found nothing".into());
        }
        let moving: Vec<&Pod> = if searching { nodes.candidates.iter().filter(|c| settled.contains(c.name()) && consolidation::disruptable(c)).flat_map(|c| state::evictable(&c.pods)).collect() } else { Vec::new() };
        let start = if moving.is_empty() { 0 } else { self.tracker.next_start(consolidation::EVALUATIONS_PER_PASS) };
        let search = consolidation::Search { min_saving_fraction: self.ctx.settings.min_saving_fraction(), max_evaluations: consolidation::EVALUATIONS_PER_PASS, start, balance: None };
        let draining = |n: &str| self.tracker.draining(n);
        let provider_drift = |c: &NodeClaim| self.ctx.provider.drifted(c);
        let commands = self
            .with_world(&state, &moving, |world| {
                let clock = disruption::Clock { now: time::OffsetDateTime::now_utc(), draining: &draining, empty_long_enough: &|c| empty_for.contains(c.name()), settled: &|c| settled.contains(c.name()), hold };
                disruption::disrupt_pool(world, np, &settings, &nodes, &clock, &provider_drift, search)
            })
            .await;
        if searching {
            if commands.is_empty() {
                self.tracker.quiet.found_nothing(&pool, inputs, Instant::now());
            } else {
                self.tracker.quiet.forget(&pool);
            }
        }
        for c in commands {
            self.carry_out(&pool, &state, c).await;
        }
    }

    /// The candidates' clocks, read once each (a read starts a clock over if the node changed):
    /// those with no pod to move and those whose pods have not changed, for `after`.
    fn read_clocks<'a>(&self, nodes: &consolidation::PoolNodes<'a>, after: Duration) -> (HashSet<String>, HashSet<String>) {
        let mut empty_for = HashSet::new();
        let mut settled = HashSet::new();
        for c in &nodes.candidates {
            let workload = state::evictable(&c.pods).len();
            let empty = self.tracker.stable_for(&format!("empty/{}", c.name()), if workload == 0 { "empty" } else { "busy" }.into());
            if workload == 0 && empty >= after {
                empty_for.insert(c.name().to_string());
            }
            let mut ids: Vec<String> = c.pods.iter().map(|p| state::pod_id(p)).collect();
            ids.sort();
            if self.tracker.stable_for(&format!("pods/{}", c.name()), ids.join(",")) >= after {
                settled.insert(c.name().to_string());
            }
        }
        (empty_for, settled)
    }

    /// Carry out one of the pass's commands.
    async fn carry_out(self: &Arc<Self>, pool: &str, state: &ClusterState, command: disruption::Command) {
        match command {
            disruption::Command::Expire { node } => {
                let Some((node, claim)) = Self::node_and_claim(state, &node) else { return };
                tracing::info!(node = ?node.metadata.name, pool = %pool, "node expired; draining it");
                self.start_drain(node, claim, Vec::new(), "expired");
            }
            disruption::Command::Replace { node: name, why } => {
                let Some((node, claim)) = Self::node_and_claim(state, &name) else { return };
                if !self.tracker.reserve(&name) {
                    return;
                }
                tracing::info!(node = %name, pool = %pool, why = %why, "node drifted; replacing it");
                self.ctx.metrics.disruption_decisions.get_or_create(&labels2("reason", "drifted", "result", "taken")).inc();
                self.status.mark_claim(&claim.name(), DRIFTED, "Drifted", &why).await;
                self.take_out(node, claim, "drifted", true).await;
                self.tracker.release(&name);
            }
            disruption::Command::Consolidate { decision, before } => self.validate_and_act(pool, decision, before).await,
        }
    }

    /// Run `decide` on `state`, with the platforms of the `moving` pods learnt first (registry
    /// lookups are the only awaits; the deciding is pure).
    async fn with_world<R: Send>(&self, state: &ClusterState, moving: &[&Pod], decide: impl FnOnce(&consolidation::World<'_>) -> R + Send) -> R {
        let mut state = state.clone();
        self.ctx.learn_platforms(&mut state, moving).await;
        let (pools, volumes) = (state.packer_pools(), state.volumes());
        let world = consolidation::World { state: &state, pools: &pools, volumes: &volumes, budget: self.ctx.settings.packing_budget(), preferences: self.ctx.settings.preference_policy };
        tokio::task::block_in_place(|| decide(&world))
    }

    /// Wait the quiet period, check the decision again on the cluster as it is then, and only
    /// if it still holds taint, launch the replacements and start the drains.
    async fn validate_and_act(self: &Arc<Self>, pool: &str, decision: consolidation::Decision, before: BTreeMap<String, Vec<String>>) {
        tracing::info!(pool, reason = decision.reason, nodes = ?decision.nodes, replacements = decision.replacements.len(), saving_per_hour = decision.saving_per_hour, "disruption decided; validating after a quiet period");
        tokio::time::sleep(Duration::from_secs_f64(self.ctx.settings.consolidation_validation_seconds)).await;
        let state = self.ctx.state();
        let result = match self.ctx.hold(&state, pool) {
            Some(why) => Err(why),
            None => {
                let nodes = self.pool_nodes(&state, pool);
                let now: Vec<&consolidation::Candidate> = nodes.candidates.iter().filter(|c| decision.reason == "empty" || consolidation::disruptable(c)).collect();
                let fraction = self.ctx.settings.min_saving_fraction();
                let moving: Vec<&Pod> = now.iter().filter(|c| decision.nodes.iter().any(|n| n == c.name())).flat_map(|c| state::evictable(&c.pods)).collect();
                self.with_world(&state, &moving, |world| consolidation::revalidate(world, &decision, &before, &now, fraction)).await
            }
        };
        let decision = match result {
            Ok(d) => d,
            Err(why) => {
                self.ctx.metrics.disruption_decisions.get_or_create(&labels2("reason", decision.reason, "result", "stale")).inc();
                tracing::info!(pool, nodes = ?decision.nodes, why = %why, "disruption decision dropped: no longer valid");
                return;
            }
        };
        self.ctx.metrics.disruption_decisions.get_or_create(&labels2("reason", decision.reason, "result", "taken")).inc();
        let state = self.ctx.state();
        let set: Vec<(Arc<Node>, Arc<NodeClaim>)> = decision.nodes.iter().filter_map(|name| Self::node_and_claim(&state, name)).collect();
        tracing::info!(pool, reason = decision.reason, nodes = ?decision.nodes, replacements = decision.replacements.len(), saving_per_hour = decision.saving_per_hour, "disrupting");
        // Taint first, so the scheduler stops adding pods while replacements start.
        for (node, _) in &set {
            nodes::taint(&self.ctx.client, node).await;
        }
        let replacements = self.launcher.launch_claims(archer_model::provision::claims_for(&state, &decision.replacements, "replacement"), "replacement").await;
        if replacements.len() < decision.replacements.len() {
            // A decision is carried out whole or not at all: without every replacement the
            // evicted pods would have no place.
            tracing::warn!(pool, wanted = decision.replacements.len(), launched = replacements.len(), "not every replacement could be launched; the disruption is called off");
            for (node, _) in &set {
                nodes::remove_taint(&self.ctx.client, node.metadata.name.as_deref().unwrap_or(""), labels::DISRUPTED_TAINT).await;
            }
            return;
        }
        for (node, claim) in set {
            self.start_drain(node, claim, replacements.clone(), decision.reason);
        }
    }

    fn start_drain(self: &Arc<Self>, node: Arc<Node>, claim: Arc<NodeClaim>, replacements: Vec<String>, reason: &'static str) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let me = self.clone();
        let task = tokio::spawn(async move { me.drain(node, claim, replacements, reason).await });
        self.tracker.drains.lock().unwrap_or_else(|e| e.into_inner()).insert(name, task);
    }

    /// Taint, wait for replacements, evict, delete.
    #[tracing::instrument(skip_all, fields(node = %node.metadata.name.as_deref().unwrap_or(""), reason))]
    async fn drain(self: Arc<Self>, node: Arc<Node>, claim: Arc<NodeClaim>, replacements: Vec<String>, reason: &'static str) {
        let name = node.metadata.name.clone().unwrap_or_default();
        nodes::taint(&self.ctx.client, &node).await;
        let why = if replacements.is_empty() { format!("node {name} is drained ({reason})") } else { format!("node {name} is drained ({reason}) once its {} replacement(s) are Ready", replacements.len()) };
        self.status.mark_claim(&claim.name(), DISRUPTING, condition_reason(reason), &why).await;
        let deadline = Instant::now() + Duration::from_secs(self.ctx.settings.drain_timeout_seconds);
        // Replacements Ready before any pod leaves; without them no pod leaves at all.
        while !replacements.is_empty() {
            let nodes = self.ctx.stores.nodes.state();
            let claims = self.ctx.stores.claims.state();
            let node_of = |r: &String| claims.iter().find(|c| c.name() == *r).map(|c| c.node_name()).unwrap_or_else(|| r.clone());
            let ready = replacements.iter().all(|r| nodes.iter().any(|n| n.metadata.name.as_deref() == Some(node_of(r).as_str()) && state::node_ready(n) && !state::has_taint(n, labels::UNREGISTERED_TAINT)));
            if ready {
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(?replacements, "replacements not Ready in time; nothing evicted, the node is given back");
                nodes::remove_taint(&self.ctx.client, &name, labels::DISRUPTED_TAINT).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        loop {
            let pods: Vec<Arc<Pod>> = self.ctx.stores.pods.state().into_iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str())).collect();
            let left = state::evictable(&pods.iter().map(|p| p.as_ref()).collect::<Vec<_>>()).into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).cloned().collect::<Vec<Pod>>();
            let terminating = pods.iter().any(|p| p.metadata.deletion_timestamp.is_some() && !state::is_daemon_pod(p));
            if left.is_empty() && !terminating {
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(remaining = left.len(), "drain timed out (PodDisruptionBudgets?); the node is given back");
                nodes::remove_taint(&self.ctx.client, &name, labels::DISRUPTED_TAINT).await;
                return;
            }
            for p in &left {
                let ns = p.metadata.namespace.clone().unwrap_or_default();
                let pname = p.metadata.name.clone().unwrap_or_default();
                match Api::<Pod>::namespaced(self.ctx.client.clone(), &ns).evict(&pname, &EvictParams::default()).await {
                    Ok(_) => {
                        self.ctx.metrics.pod_evictions.get_or_create(&label("reason", reason)).inc();
                        tracing::info!(pod = %pname, namespace = %ns, "evicted");
                    }
                    Err(kube::Error::Api(s)) if s.code == 429 => tracing::debug!(pod = %pname, namespace = %ns, "eviction refused by a PodDisruptionBudget; retrying"),
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => tracing::warn!(pod = %pname, namespace = %ns, error = %e, "eviction failed; retrying"),
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if let Err(e) = self.ctx.provider.delete(&claim).await {
            tracing::warn!(error = %e, "could not delete the instance; retried on the next pass");
            return;
        }
        match Api::<NodeClaim>::all(self.ctx.client.clone()).delete(&claim.name(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => tracing::warn!(error = %e, "could not delete the claim"),
        }
        self.ctx.metrics.nodes_terminated.get_or_create(&label("reason", reason)).inc();
        tracing::info!("node removed");
    }

    /// Take interrupted instances' nodes out: taint, plan and launch replacements for their pods,
    /// then drain (after the replacements are Ready when there is time) and delete. A notice for
    /// an instance Archer has no claim for is done at once.
    async fn interrupt(self: &Arc<Self>, notice: &Interruption) -> Result<(), String> {
        let state = self.ctx.state();
        for id in &notice.instance_ids {
            let suffix = format!("/{id}");
            let Some(claim) = state.claims.iter().find(|c| c.status.as_ref().and_then(|s| s.provider_id.as_deref()).is_some_and(|p| p.ends_with(&suffix))).cloned() else {
                tracing::info!(instance = %id, kind = notice.kind, "interruption for an instance Archer did not launch; nothing to do");
                continue;
            };
            let node_name = claim.status.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            if !self.tracker.reserve(&node_name) {
                continue;
            }
            let Some(node) = state.node(&node_name).cloned() else {
                // Never registered: no pod to move.
                tracing::warn!(instance = %id, claim = %claim.name(), kind = notice.kind, "interrupted before registering; deleting the claim");
                let deleted = self.ctx.provider.delete(&claim).await.map_err(|e| e.to_string());
                self.tracker.release(&node_name);
                deleted?;
                let _ = Api::<NodeClaim>::all(self.ctx.client.clone()).delete(&claim.name(), &DeleteParams::default()).await;
                continue;
            };
            tracing::warn!(node = %node_name, instance = %id, kind = notice.kind, "instance interrupted: replacing and draining its node");
            self.take_out(node, claim, "interrupted", notice.replace_first).await;
            self.tracker.release(&node_name);
        }
        Ok(())
    }

    /// Taint a node, plan its pods on the shared model (other nodes first, then new ones) and
    /// launch the replacements, then drain it: after the replacements are Ready when
    /// `replace_first`, at once otherwise (its pods are then provisioned for like any pending
    /// pod, onto the replacements already coming).
    async fn take_out(self: &Arc<Self>, node: Arc<Node>, claim: Arc<NodeClaim>, reason: &'static str, replace_first: bool) {
        let node_name = node.metadata.name.clone().unwrap_or_default();
        nodes::taint(&self.ctx.client, &node).await;
        // Fresh: replacements launched for a node taken out just before are in-flight room now.
        let state = &self.ctx.state();
        let on_node: Vec<&Pod> = state.pods_on(&node_name).map(|p| p.as_ref()).collect();
        let moving = state::evictable(&on_node);
        let leaving = consolidation::Candidate { node: node.as_ref(), pods: on_node, price: state.pricer().per_hour(&node).unwrap_or(f64::INFINITY) };
        let plan = self.with_world(state, &moving, |world| consolidation::evaluate(world, &[&leaving])).await;
        let replacements = match plan {
            Some(p) => {
                tracing::info!(node = %node_name, reason, replacements = p.nodes.len(), onto_existing = p.existing.len(), "replacements for the node's pods");
                self.launcher.launch_claims(archer_model::provision::claims_for(state, &p.nodes, "replacement"), "replacement").await
            }
            None => {
                tracing::warn!(node = %node_name, reason, "no place for every pod of the node now; they are provisioned for once evicted");
                Vec::new()
            }
        };
        let wait_for = if replace_first { replacements } else { Vec::new() };
        self.start_drain(node, claim, wait_for, reason);
    }

}

/// A drain's reason as a condition's and an Event's reason (CamelCase, as Karpenter's).
fn condition_reason(reason: &str) -> &'static str {
    match reason {
        "empty" => "Empty",
        "underutilized" => "Underutilized",
        "expired" => "Expired",
        "interrupted" => "Interrupted",
        "drifted" => "Drifted",
        _ => "Disrupted",
    }
}

/// The provisioner as the cloud provider's interruption handler.
pub struct Interruptions(pub Arc<Disrupter>);

#[async_trait::async_trait]
impl InterruptionHandler for Interruptions {
    async fn interrupted(&self, notice: Interruption) -> Result<(), String> {
        self.0.interrupt(&notice).await
    }

    fn count(&self, kind: &str, outcome: &str) {
        self.0.ctx.metrics.interruption_messages.get_or_create(&labels2("kind", kind, "outcome", outcome)).inc();
    }

    fn dropped(&self, reason: &str) {
        self.0.ctx.metrics.interruption_messages_dropped.get_or_create(&label("reason", reason)).inc();
    }
}
