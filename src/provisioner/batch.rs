//! The provisioning executor: pending pods are batched; each batch is decided purely on the
//! cluster state (room already there first, then new nodes, by `archer_core::planner`) and its new
//! nodes handed to the launcher.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::EventType;
use kube::Resource;

use archer_core::packer::Plan;
use archer_model::provision;
use archer_model::objects::{self as state, pod_id};
use archer_model::ClusterState;

use super::context::Context;
use super::launch::{Launcher, PROVISIONING};

/// Event reason on a pod no NodePool can run.
pub const UNPROVISIONABLE_REASON: &str = "FailedProvisioning";

pub struct Batcher {
    ctx: Arc<Context>,
    launcher: Arc<Launcher>,
    /// Notified whenever a pod may need capacity (the pod watch).
    pending: Arc<tokio::sync::Notify>,
    /// Last event message posted per pod uid (an unchanged reason is not posted again).
    reported: Mutex<HashMap<String, String>>,
}

impl Batcher {
    pub fn new(ctx: Arc<Context>, launcher: Arc<Launcher>, pending: Arc<tokio::sync::Notify>) -> Self {
        Batcher { ctx, launcher, pending, reported: Mutex::new(HashMap::new()) }
    }

    /// Batch pending pods (a batch closes after `batchIdleSeconds` without a new one, or
    /// `batchMaxSeconds` after it opened) and provision each batch, until dropped.
    pub async fn run(self: Arc<Self>) {
        let idle = Duration::from_secs_f64(self.ctx.settings.batch_idle_seconds);
        let max = Duration::from_secs_f64(self.ctx.settings.batch_max_seconds);
        loop {
            // A pending pod, or the periodic resync (pods that stay pending send no events).
            tokio::select! {
                _ = self.pending.notified() => {}
                _ = tokio::time::sleep(max) => {}
            }
            let opened = tokio::time::Instant::now();
            loop {
                let deadline = (tokio::time::Instant::now() + idle).min(opened + max);
                tokio::select! {
                    _ = self.pending.notified() => continue,
                    _ = tokio::time::sleep_until(deadline) => break,
                }
            }
            self.provision_once().await;
        }
    }

    /// One batch: decide and launch.
    #[tracing::instrument(skip_all, fields(pods = tracing::field::Empty, nodes = tracing::field::Empty))]
    pub async fn provision_once(self: &Arc<Self>) {
        let started = Instant::now();
        let Some((state, pending, covered, plan)) = self.decide().await else { return };
        self.ctx.metrics.provisioner_batches.inc();
        // kube-scheduler goes on binding pods while the batch is decided: nodes bought for pods
        // bound meanwhile would stay (partly) empty. Decide once more on the cluster as it is
        // now; what is bound even then leaves the plan.
        let (state, pending, covered, plan) = match self.gone_from(&plan) {
            gone if gone.is_empty() => (state, pending, covered, plan),
            gone => {
                tracing::info!(gone = gone.len(), "pods of the batch were bound or deleted while it was decided; deciding again");
                match self.decide().await {
                    Some(again) => again,
                    None => return,
                }
            }
        };
        tracing::Span::current().record("pods", pending.len());
        let plan = {
            let gone = self.gone_from(&plan);
            plan.without(&gone)
        };
        if !plan.nodes.is_empty() && plan.lower_bound_per_hour > 0.0 {
            self.ctx.metrics.plan_cost_ratio.observe(plan.total_price_per_hour / plan.lower_bound_per_hour);
        }
        tracing::Span::current().record("nodes", plan.nodes.len());
        tracing::info!(
            pending = pending.len(),
            on_existing = plan.existing.len(),
            new_nodes = plan.nodes.len(),
            unschedulable = plan.unschedulable.len(),
            price_per_hour = plan.total_price_per_hour,
            "batch decided"
        );
        for (pod, node) in &plan.existing {
            tracing::debug!(pod = %pod, node = %node, "placed on room the cluster already has");
        }
        let plans = self.ctx.picture.plans();
        for (pod, node) in &plan.existing {
            plans.placed(vec![pod.clone()], node, crate::cluster::monotonic_ms());
        }
        plans.forgotten(plan.unschedulable.iter().map(|u| u.pod.clone()).collect());
        {
            let unplaceable: HashSet<&str> = plan.unschedulable.iter().map(|u| u.pod.as_str()).collect();
            let placeable = pending.iter().map(|p| pod_id(p)).filter(|id| !unplaceable.contains(id.as_str())).chain(covered.iter().cloned()).collect();
            *self.ctx.waiting.lock().unwrap_or_else(|e| e.into_inner()) = placeable;
        }
        let by_id: HashMap<String, &Arc<Pod>> = pending.iter().map(|p| (pod_id(p), p)).collect();
        for u in &plan.unschedulable {
            if let Some(p) = by_id.get(&u.pod) {
                self.report_unprovisionable(p, &u.reason).await;
            }
        }
        self.launcher.launch_claims(provision::claims_for(&state, &plan.nodes, PROVISIONING), PROVISIONING).await;
        self.ctx.metrics.provisioner_batch_seconds.observe(started.elapsed().as_secs_f64());
    }

    /// What a batch would do on the cluster as the caches have it now: the state it read, the
    /// pods it plans (those a live plan already covers aside), the covered ones, the plan.
    /// `None`: nothing pending.
    async fn decide(&self) -> Option<(ClusterState, Vec<Arc<Pod>>, HashSet<String>, Plan)> {
        let mut state = self.ctx.state();
        // Pods a live plan already placed on a node still coming are not planned again.
        let (pending, covered) = state.provisionable(&self.ctx.settings.scheduler_names);
        if pending.is_empty() {
            return None;
        }
        self.ctx.learn_platforms(&mut state, &pending).await;
        let budget = self.ctx.settings.packing_budget();
        let plan = tokio::task::block_in_place(|| provision::provision(&state, &pending, self.ctx.settings.preference_policy, budget));
        Some((state, pending, covered, plan))
    }

    /// The pods the plan places that the Pod cache no longer has pending (bound, deleted).
    fn gone_from(&self, plan: &Plan) -> HashSet<String> {
        let placed = plan.nodes.iter().flat_map(|n| n.pods.iter()).chain(plan.existing.keys());
        placed
            .filter(|id| {
                let Some((ns, name)) = id.split_once('/') else { return false };
                self.ctx.stores.pods.get(&kube::runtime::reflector::ObjectRef::new(name).within(ns)).is_none_or(|p| !state::is_provisionable(&p, &self.ctx.settings.scheduler_names))
            })
            .cloned()
            .collect()
    }

    async fn report_unprovisionable(&self, pod: &Pod, reason: &str) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let note = format!("no NodePool can run this pod: {reason}");
        {
            let mut seen = self.reported.lock().unwrap_or_else(|e| e.into_inner());
            if seen.get(&uid) == Some(&note) {
                return;
            }
            seen.insert(uid, note.clone());
        }
        self.ctx.metrics.unprovisionable_pods.inc();
        tracing::warn!(pod = %pod_id(pod), reason, "no node launched for the pod");
        self.ctx.post_event(&pod.object_ref(&()), EventType::Warning, UNPROVISIONABLE_REASON, "Provisioning", &note).await;
    }
}
