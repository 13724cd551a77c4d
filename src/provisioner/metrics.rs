//! The provisioner's metric families.

use archer_metrics::Labels;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The provisioner's families.
pub struct ProvisionerMetrics {
    /// Provisioning batches run, and how long deciding + launching took.
    pub provisioner_batches: Counter,
    pub provisioner_batch_seconds: Histogram,
    /// Per batch with new nodes: their price over the LP lower bound for the same pods.
    pub plan_cost_ratio: Histogram,
    /// Nodes launched, by pool.
    pub nodes_launched: Family<Labels, Counter>,
    /// Launches that failed (retried), by provider.
    pub launch_errors: Family<Labels, Counter>,
    /// Nodes removed, by reason (empty, underutilized, expired, garbage).
    pub nodes_terminated: Family<Labels, Counter>,
    /// Pods evicted by a drain, by the drain's reason.
    pub pod_evictions: Family<Labels, Counter>,
    /// Disruption decisions, by reason and result (taken, or stale when re-validation dropped it).
    pub disruption_decisions: Family<Labels, Counter>,
    /// Disruption passes that skipped the consolidation search: nothing it reads changed since a
    /// full search found nothing (Karpenter's "consolidated" state).
    pub consolidation_skipped: Counter,
    /// Pod deletion costs written, by outcome (written, gone, error).
    pub deletion_cost_writes: Family<Labels, Counter>,
    /// Pending pods no pool can run (an Event says why).
    pub unprovisionable_pods: Counter,
    /// Launches put off by the per-minute cap.
    pub launches_rate_limited: Counter,
    /// 1 while this replica holds the provisioner lease.
    pub leader: Gauge,
    /// 1 while this replica campaigns for the provisioner lease (the provisioner is on), so
    /// "no leader" is told apart from "no provisioner".
    pub candidate: Gauge,
    /// Claims deleted because they could not become nodes, by reason.
    pub claims_given_up: Family<Labels, Counter>,
    /// Provisioner executor passes that failed, by executor and error.
    pub reconcile_errors: Family<Labels, Counter>,
    /// Interruption queue messages, by kind and outcome.
    pub interruption_messages: Family<Labels, Counter>,
    /// Interruption queue messages deleted without being acted on, by reason (foreign_source,
    /// foreign_account, max_receives).
    pub interruption_messages_dropped: Family<Labels, Counter>,
    /// The cost and savings gauges (its cost reporter sets them while this replica provisions).
    pub cost: std::sync::Arc<crate::cost::metrics::CostMetrics>,
    /// Created to Ready, of pods the provisioner launched nodes for.
    pub pod_startup_seconds: Histogram,
    /// 1 for where the provider's on-demand prices come from now, by provider and source
    /// (`price-list-api`, `retail-prices-api`, `catalog`).
    pub prices_source: Family<Labels, Gauge>,
    /// When the provider's price API last answered (Unix seconds), by provider.
    pub prices_refreshed: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Since when every price refresh has failed (Unix seconds; 0: the last one answered).
    pub price_refresh_failing_since: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Price refreshes that failed, by provider.
    pub price_refresh_failures: Family<Labels, Counter>,
}

impl Default for ProvisionerMetrics {
    fn default() -> Self {
        ProvisionerMetrics {
            provisioner_batches: Counter::default(),
            provisioner_batch_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            plan_cost_ratio: Histogram::new([1.0, 1.005, 1.01, 1.02, 1.03, 1.05, 1.1, 1.25, 1.5, 2.0]),
            nodes_launched: Family::default(),
            launch_errors: Family::default(),
            nodes_terminated: Family::default(),
            pod_evictions: Family::default(),
            disruption_decisions: Family::default(),
            consolidation_skipped: Counter::default(),
            deletion_cost_writes: Family::default(),
            unprovisionable_pods: Counter::default(),
            launches_rate_limited: Counter::default(),
            leader: Gauge::default(),
            candidate: Gauge::default(),
            claims_given_up: Family::default(),
            reconcile_errors: Family::default(),
            interruption_messages: Family::default(),
            interruption_messages_dropped: Family::default(),
            cost: Default::default(),
            pod_startup_seconds: Histogram::new(exponential_buckets(0.5, 2.0, 14)),
            prices_source: Family::default(),
            prices_refreshed: Family::default(),
            price_refresh_failing_since: Family::default(),
            price_refresh_failures: Family::default(),
        }
    }
}

impl ProvisionerMetrics {
    /// The families, registered into `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        m.register(registry);
        m
    }

    fn register(&self, r: &mut Registry) {
        self.cost.register(r);
        r.register("provisioned_pod_startup_duration_seconds", "Time from creation to Ready of pods the provisioner launched nodes for", self.pod_startup_seconds.clone());
        r.register("nodeclaims_given_up", "NodeClaims deleted because they could not become nodes (launch failures, registration timeouts), by reason", self.claims_given_up.clone());
        r.register("provisioner_reconcile_errors", "Provisioner executor passes that failed, by executor and error", self.reconcile_errors.clone());
        r.register("interruption_messages", "Interruption queue messages, by kind and outcome (handled, ignored, malformed, failed, dropped)", self.interruption_messages.clone());
        r.register("interruption_messages_dropped", "Interruption queue messages deleted without being acted on, by reason (foreign_source, foreign_account: not an EC2 or Health event of Archer's account; max_receives: failed on every receive allowed)", self.interruption_messages_dropped.clone());
        r.register("provisioner_batches", "Provisioning batches decided", self.provisioner_batches.clone());
        r.register("provisioner_batch_duration_seconds", "Time to decide and launch one batch", self.provisioner_batch_seconds.clone());
        r.register("provisioner_plan_cost_ratio", "Per batch that buys nodes: their price over the lower bound no plan for the same pods can beat (1 = optimal)", self.plan_cost_ratio.clone());
        r.register("nodes_launched", "Nodes launched, by pool", self.nodes_launched.clone());
        r.register("node_launch_errors", "Node launches that failed and will be retried, by provider", self.launch_errors.clone());
        r.register("nodes_terminated", "Nodes removed, by reason", self.nodes_terminated.clone());
        r.register("pod_evictions", "Pods evicted by a drain, by the drain's reason", self.pod_evictions.clone());
        r.register("disruption_decisions", "Disruption decisions, by reason and result (taken, stale)", self.disruption_decisions.clone());
        r.register("consolidation_searches_skipped", "Disruption passes that skipped the consolidation search: nothing it reads changed since a full search found nothing", self.consolidation_skipped.clone());
        r.register("pod_deletion_cost_writes", "Pod deletion costs written on pods of managed nodes, by outcome (written, gone, error)", self.deletion_cost_writes.clone());
        r.register("unprovisionable_pods", "Pending pods no NodePool can run", self.unprovisionable_pods.clone());
        r.register("launches_rate_limited", "Launches put off by the per-minute cap", self.launches_rate_limited.clone());
        r.register("provisioner_leader", "1 while this replica holds the provisioner lease", self.leader.clone());
        r.register("provisioner_leader_candidate", "1 while this replica campaigns for the provisioner lease", self.candidate.clone());
        r.register("prices_source_info", "1 for where the cloud provider's on-demand prices come from now, by provider and source (price-list-api, retail-prices-api, catalog: before the API's first answer or with live prices off)", self.prices_source.clone());
        r.register("prices_refreshed_timestamp_seconds", "When the cloud provider's price API last answered (Unix seconds), by provider", self.prices_refreshed.clone());
        r.register("price_refresh_failing_since_timestamp_seconds", "Since when every price refresh of the provider has failed (Unix seconds; 0 when the last one answered), by provider", self.price_refresh_failing_since.clone());
        r.register("price_refresh_failures", "Price refreshes that failed, by provider", self.price_refresh_failures.clone());
    }
}
