//! The launch and lifecycle executor: a NodeClaim is written per planned node *before* the cloud
//! is asked for it, the launch is recorded on the claim, the node is registered when Ready, and
//! the claim keeper brings claims and instances back in step after crashes and failures.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::future::join_all;
use futures::StreamExt;
use kube::api::{DeleteParams, ObjectMeta};
use kube::runtime::events::EventType;
use kube::{Api, Resource};

use archer_api::nodeclaim::{NodeClaim, NodeClaimStatus};
use archer_core::packer::PlannedNode;
use archer_metrics::label;
use archer_model::lifecycle::{self, ClaimCommand, KeeperSettings};
use archer_model::objects as state;

use super::context::{Action, Context, ReconcileError};
use super::nodes;

/// Set (tests only) to make the process exit right after it wrote a NodeClaim and before it asked
/// the provider for the node: the crash a restart must recover from without a second node.
pub const CRASH_AFTER_CLAIM_ENV: &str = "ARCHER_TEST_CRASH_AFTER_CLAIM";
/// The claim reason of nodes bought for pending pods.
pub const PROVISIONING: &str = "provisioning";

/// How long a claim this process wrote or launched is left to the claim cache to show launched.
const LAUNCH_SETTLE: Duration = Duration::from_secs(60);
/// NodeClaims written at once by one batch.
const CLAIM_WRITES_IN_FLIGHT: usize = 8;
/// Provider launches in flight at once.
const LAUNCHES_IN_FLIGHT: usize = 16;
/// How long a launch's own task waits for its nodes to become Ready and registers them.
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Launcher {
    ctx: Arc<Context>,
    limiter: governor::DefaultDirectRateLimiter,
    /// Claims this process wrote or launched, and when: the claim keeper, running beside the
    /// batches, leaves them alone until the claim cache has caught up with the launch's status.
    launched_here: Mutex<HashMap<String, Instant>>,
}

impl Launcher {
    pub fn new(ctx: Arc<Context>) -> Self {
        let per_minute = std::num::NonZeroU32::new(ctx.settings.max_launches_per_minute).unwrap_or(std::num::NonZeroU32::MIN);
        Launcher { limiter: governor::RateLimiter::direct(governor::Quota::per_minute(per_minute)), launched_here: Mutex::new(HashMap::new()), ctx }
    }

    /// How often the claim keeper passes.
    pub fn interval(&self) -> Duration {
        Duration::from_secs_f64(self.ctx.settings.disruption_interval_seconds.min(10.0))
    }

    /// Write the claims a decision made (each with its planned node, or why it has none), then
    /// launch them. Before writing, each is checked against the caches now
    /// ([`archer_model::claims::still_launchable`]: its pool not deleted, its offering still
    /// offered since the decision); a claim that cannot be written is a Warning Event
    /// `NodeClaimNotMade` on its pool, never a silent skip. Returns the names of the claims
    /// written, once the claim cache shows them.
    pub async fn launch_claims(self: &Arc<Self>, made: Vec<(PlannedNode, Result<NodeClaim, String>)>, reason: &str) -> Vec<String> {
        // The cap is a safety valve on provisioning; a consolidation's replacements are bounded by
        // the pool's disruption budget instead, and never wait behind provisioning's launches.
        let capped = reason == PROVISIONING;
        let total = made.len();
        let now = self.ctx.state();
        let mut writes = Vec::with_capacity(total);
        for (i, (planned, claim)) in made.into_iter().enumerate() {
            if capped && self.limiter.check().is_err() {
                self.ctx.metrics.launches_rate_limited.inc_by((total - i) as u64);
                tracing::warn!(deferred = total - i, per_minute = self.ctx.settings.max_launches_per_minute, "launch cap reached; the rest wait for the next batch");
                break;
            }
            match claim.and_then(|c| archer_model::claims::still_launchable(&now, &planned).map(|()| c)) {
                Ok(claim) => writes.push(self.write_claim(planned, claim)),
                Err(why) => {
                    tracing::warn!(pool = %planned.pool, instance_type = %planned.instance_type, why = %why, "no NodeClaim for the planned node; its pods wait for the next batch");
                    let note = format!("no NodeClaim for a planned {} ({}) node: {why}; its {} pod(s) wait for the next batch", planned.instance_type, reason, planned.pods.len());
                    self.ctx.post_pool_event(&planned.pool, EventType::Warning, "NodeClaimNotMade", "Launching", &note).await;
                }
            }
        }
        // Written concurrently, a few at a time.
        let mut claims: Vec<NodeClaim> = futures::stream::iter(writes).buffer_unordered(CLAIM_WRITES_IN_FLIGHT).filter_map(std::future::ready).collect().await;
        let names: Vec<String> = claims.iter().map(|c| c.name()).collect();
        if names.len() > 1 {
            for c in claims.iter_mut() {
                let me = c.name();
                let siblings: Vec<&str> = names.iter().map(String::as_str).filter(|n| *n != me).collect();
                c.metadata.annotations.get_or_insert_with(Default::default).insert(archer_core::labels::BATCH_NODES_ANNOTATION.into(), siblings.join(","));
            }
        }
        self.ctx.post_launch_events(&claims, reason).await;
        // Launched concurrently too, a bounded number at a time (a cloud API has its own limits).
        let launches: Vec<_> = claims.iter().map(|c| self.launch(c)).collect();
        futures::stream::iter(launches).buffer_unordered(LAUNCHES_IN_FLIGHT).collect::<Vec<()>>().await;
        if !names.is_empty() {
            let me = self.clone();
            let batch = names.clone();
            tokio::spawn(async move { me.register_each(batch).await });
        }
        self.wait_seen(&names).await;
        names
    }

    /// Register each node of a batch as soon as it is Ready (a slow node holds back none of the
    /// others). Pods the plan put on a node bind there as it comes up; the extender keeps pods
    /// the plan did not place off a node while others of its batch are still registering, so a
    /// batch meant to spread is not packed onto its first node.
    async fn register_each(&self, batch: Vec<String>) {
        let deadline = Instant::now() + REGISTRATION_TIMEOUT;
        let mut left: Vec<String> = batch;
        while !left.is_empty() {
            let nodes = self.ctx.stores.nodes.state();
            let claims = self.ctx.stores.claims.state();
            let node_of = |b: &str| claims.iter().find(|c| c.name() == b).map(|c| c.node_name()).unwrap_or_else(|| b.to_string());
            let (up, waiting): (Vec<String>, Vec<String>) = left.into_iter().partition(|b| match nodes.iter().find(|n| n.metadata.name.as_deref() == Some(node_of(b).as_str())) {
                Some(n) => state::node_ready(n),
                // Gone (or never launched): nothing to register.
                None => !claims.iter().any(|c| c.name() == *b && c.launched()),
            });
            let up_nodes: Vec<String> = up.iter().map(|b| node_of(b)).collect();
            join_all(up_nodes.iter().map(|n| self.register(n))).await;
            left = waiting;
            if Instant::now() >= deadline {
                // The claim keeper lifts the taint once such a node is Ready.
                tracing::warn!(nodes = ?left, "nodes not Ready in time; left to the claim keeper");
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Lift the unregistered taint from a node (the node joins the cluster for scheduling).
    pub async fn register(&self, node: &str) {
        if nodes::remove_taint(&self.ctx.client, node, archer_core::labels::UNREGISTERED_TAINT).await {
            tracing::info!(node, "node registered");
        }
    }

    /// Write one planned node's NodeClaim.
    async fn write_claim(&self, planned: PlannedNode, claim: NodeClaim) -> Option<NodeClaim> {
        match Api::<NodeClaim>::all(self.ctx.client.clone()).create(&archer_api::apply::post_params(), &claim).await {
            Ok(c) => {
                // Before anything else can see it: the claim keeper leaves it to us.
                self.mark_ours(&c.name());
                tracing::info!(claim = %c.name(), pool = %planned.pool, instance_type = %planned.instance_type, zone = %planned.zone, capacity = %planned.capacity_type, pods = planned.pods.len(), "node claimed");
                if std::env::var_os(CRASH_AFTER_CLAIM_ENV).is_some() {
                    tracing::error!(claim = %c.name(), "{CRASH_AFTER_CLAIM_ENV} set: exiting between claim and launch");
                    std::process::exit(70);
                }
                Some(c)
            }
            Err(e) => {
                tracing::warn!(pool = %planned.pool, error = %e, "could not write the NodeClaim; the pods wait for the next batch");
                None
            }
        }
    }

    /// A claim this process wrote or is launching: the claim keeper leaves it alone for a while.
    fn mark_ours(&self, name: &str) {
        let mut here = self.launched_here.lock().unwrap_or_else(|e| e.into_inner());
        here.retain(|_, at| at.elapsed() < LAUNCH_SETTLE);
        here.insert(name.to_string(), Instant::now());
    }

    /// Ask the provider for the claim's node and record the result on the claim.
    #[tracing::instrument(skip_all, fields(claim = %claim.name()))]
    pub async fn launch(&self, claim: &NodeClaim) {
        self.mark_ours(&claim.name());
        let api: Api<NodeClaim> = Api::all(self.ctx.client.clone());
        let status = match self.ctx.provider.create(claim).await {
            Ok(i) => {
                self.ctx.metrics.nodes_launched.get_or_create(&label("pool", claim.spec.node_pool.clone())).inc();
                tracing::info!(node = %i.node_name, provider_id = %i.provider_id, "node launched");
                let what = format!("{} ({} in {}, {}) for node {}", i.provider_id, i.instance_type.as_deref().unwrap_or(&claim.spec.instance_type), i.zone.as_deref().unwrap_or(&claim.spec.zone), claim.spec.capacity_type, i.node_name);
                self.ctx.post_event(&claim.object_ref(&()), EventType::Normal, "Launched", "Launching", &what).await;
                let planned = claim.metadata.annotations.as_ref().and_then(|a| a.get(archer_core::labels::PLANNED_PODS_ANNOTATION)).cloned().unwrap_or_default();
                let pods: Vec<String> = planned.split(',').filter(|p| !p.is_empty()).map(String::from).collect();
                self.ctx.picture.plans().placed(pods, &i.node_name, crate::cluster::monotonic_ms());
                NodeClaimStatus { provider_id: Some(i.provider_id), node_name: Some(i.node_name), launched_at: Some(now_rfc3339()), instance_type: i.instance_type, zone: i.zone, image_id: i.image_id, node_class_hash: i.node_class_hash, ..Default::default() }
            }
            Err(e) => {
                self.ctx.metrics.launch_errors.get_or_create(&label("provider", self.ctx.provider.name())).inc();
                tracing::warn!(error = %e, "launch failed");
                if matches!(e, archer_cloud::CloudError::InsufficientCapacity { .. }) {
                    // Give the pods back to the next batch, which picks another offering.
                    let _ = api.delete(&claim.name(), &DeleteParams::default()).await;
                    return;
                }
                let attempts = claim.status.as_ref().and_then(|s| s.launch_attempts).unwrap_or(0) + 1;
                if attempts >= self.ctx.settings.launch_attempts {
                    let times = if attempts == 1 { "once".to_string() } else { format!("{attempts} times") };
                    self.give_up(claim, "LaunchFailed", &format!("launch failed {times}, the claim is deleted and its pods planned again: {e}")).await;
                    return;
                }
                self.ctx.post_event(&claim.object_ref(&()), EventType::Warning, "LaunchFailed", "Launching", &format!("attempt {attempts} of {}: {e}", self.ctx.settings.launch_attempts)).await;
                NodeClaimStatus { last_error: Some(e.to_string()), launch_attempts: Some(attempts), last_attempt_at: Some(now_rfc3339()), ..Default::default() }
            }
        };
        if let Err(e) = super::status::apply_claim_status(&api, &claim.name(), |old| archer_api::apply::merged(old, &status).ok()).await {
            tracing::warn!(error = %e, "could not record the launch on the claim; the claim keeper retries (the launch is idempotent)");
        }
    }

    /// Delete a claim that cannot become a node (with a Warning Event on it saying why) and its
    /// instance, if any: it stops counting as room and against the pool's limits.
    async fn give_up(&self, claim: &NodeClaim, reason: &str, note: &str) {
        tracing::warn!(claim = %claim.name(), reason, note, "claim given up");
        self.ctx.metrics.claims_given_up.get_or_create(&label("reason", reason)).inc();
        self.ctx.post_event(&claim.object_ref(&()), EventType::Warning, reason, "Launching", note).await;
        self.ctx.post_pool_event(&claim.spec.node_pool, EventType::Warning, reason, "Launching", &format!("node claim {}: {note}", claim.name())).await;
        if let Err(e) = self.ctx.provider.delete(claim).await {
            tracing::warn!(claim = %claim.name(), error = %e, "could not terminate the instance; garbage collection will");
        }
        let _ = Api::<NodeClaim>::all(self.ctx.client.clone()).delete(&claim.name(), &DeleteParams::default()).await;
    }

    /// Wait (briefly) until the claim cache shows what was just written, so the next batch sees
    /// the in-flight capacity and the pool usage.
    async fn wait_seen(&self, names: &[String]) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let have: HashSet<String> = self.ctx.stores.claims.state().iter().map(|c| c.name()).collect();
            if names.iter().all(|n| have.contains(n)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One pass of the claim keeper: the commands `archer_model::lifecycle` decides on the
    /// cluster state and the provider's instances, carried out.
    pub async fn keep_claims(&self) -> Result<Action, ReconcileError> {
        let state = self.ctx.state();
        let recent = |c: &NodeClaim| self.launched_here.lock().unwrap_or_else(|e| e.into_inner()).get(&c.name()).is_some_and(|at| at.elapsed() < LAUNCH_SETTLE);
        let mut commands = lifecycle::to_launch(&state, &recent, SystemTime::now());
        let instances = self.ctx.provider.list().await?;
        let settings = KeeperSettings { registration_timeout: Duration::from_secs(self.ctx.settings.registration_timeout_seconds), garbage_grace: Duration::from_secs(self.ctx.settings.garbage_grace_seconds) };
        commands.extend(lifecycle::keep(&state, &instances, settings, SystemTime::now()));
        for c in commands {
            self.carry_out(c).await;
        }
        Ok(Action::requeue(self.interval()))
    }

    async fn carry_out(&self, command: ClaimCommand) {
        let api: Api<NodeClaim> = Api::all(self.ctx.client.clone());
        match command {
            ClaimCommand::Launch(c) => {
                tracing::info!(claim = %c.name(), "claim was never launched (restart?); launching it now");
                self.launch(&c).await;
            }
            ClaimCommand::Register { node } => self.register(&node).await,
            ClaimCommand::GiveUp { claim, reason, note } => self.give_up(&claim, reason, &note).await,
            ClaimCommand::DeleteOrphan(i) => {
                // The cache may lag a claim written a moment ago: ask the API server.
                if let Ok(None) = api.get_opt(&i.claim).await {
                    tracing::warn!(node = %i.node_name, claim = %i.claim, "instance without a claim; deleting it");
                    let orphan = NodeClaim { metadata: ObjectMeta { name: Some(i.claim.clone()), ..Default::default() }, spec: Default::default(), status: None };
                    if self.ctx.provider.delete(&orphan).await.is_ok() {
                        self.ctx.metrics.nodes_terminated.get_or_create(&label("reason", "garbage")).inc();
                    }
                }
            }
            ClaimCommand::DeleteClaim(c) => {
                tracing::warn!(claim = %c.name(), "the claim's instance is gone; deleting the claim");
                let _ = api.delete(&c.name(), &DeleteParams::default()).await;
            }
        }
    }
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

