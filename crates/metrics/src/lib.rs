//! Prometheus metrics: one registry, one struct of families handed to each component.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::AtomicU64;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

pub type Labels = Vec<(&'static str, String)>;

pub struct Metrics {
    registry: Registry,
    /// Admission reviews answered, by outcome (enforced, observed, denied, skipped, invalid, ...).
    pub admissions: Family<Labels, Counter>,
    pub admission_seconds: Histogram,
    /// Admission reviews answered with a decision remembered for a pod with the same inputs.
    pub admission_decisions_reused: Counter,
    /// `admissions`' counters by outcome, once used: the admission path counts without building
    /// a label set each time.
    admission_outcomes: std::sync::RwLock<std::collections::HashMap<&'static str, Counter>>,
    /// Image lookups by result: hit, miss, error.
    pub image_lookups: Family<Labels, Counter>,
    /// Failed image inspections by reason (timeout, not_found, forbidden_address, ...).
    pub inspection_failures: Family<Labels, Counter>,
    /// Requests refused before a decision, by reason (bad_json, body_too_large, ...).
    pub bad_requests: Family<Labels, Counter>,
    /// Serving-certificate reloads by result (ok, error).
    pub cert_reloads: Family<Labels, Counter>,
    /// Namespace annotations that could not be used.
    pub policy_warnings: Counter,
    /// Scheduler extender calls by verb (filter, prioritize) and result (ok, error).
    pub extender_requests: Family<Labels, Counter>,
    pub extender_filter_seconds: Histogram,
    pub extender_prioritize_seconds: Histogram,
    /// Nodes the filter removed because the pod's images cannot run there.
    pub extender_filtered_nodes: Counter,
    /// Nodes scored neutrally because their price is unknown.
    pub extender_unknown_price_nodes: Counter,
    /// Node prices not believed (NaN, infinite, negative or above the ceiling).
    pub extender_invalid_prices: Counter,
    pub extender_planned_placements: Counter,
    /// Nodes the filter refused a pod because their room is held for pods a plan put there.
    pub extender_held_room_refusals: Counter,
    /// Connections closed at once because the listener was at its connection cap.
    pub connections_refused: Counter,
    /// Connections closed to make room for a new one at the cap, by what the closed one was
    /// doing (handshake, headers, body, idle).
    pub connections_displaced: Family<Labels, Counter>,
    /// Request handlers that panicked (answered 500), by route.
    pub panics: Family<Labels, Counter>,
    /// Connections closed by a timeout, by phase (handshake, headers, idle).
    pub connection_timeouts: Family<Labels, Counter>,
    /// Connections open now.
    pub connections_open: prometheus_client::metrics::gauge::Gauge,
    /// Registry HTTP exchanges that got a response (manifests, blobs, tokens, retries included).
    pub registry_requests: Counter,
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
    /// Pod deletion costs written, by outcome (written, gone, error).
    pub deletion_cost_writes: Family<Labels, Counter>,
    /// Pending pods no pool can run (an Event says why).
    pub unprovisionable_pods: Counter,
    /// Launches put off by the per-minute cap.
    pub launches_rate_limited: Counter,
    /// 1 while this replica holds the provisioner lease.
    pub leader: prometheus_client::metrics::gauge::Gauge,
    /// Claims deleted because they could not become nodes, by reason.
    pub claims_given_up: Family<Labels, Counter>,
    /// Provisioner executor passes that failed, by executor and error.
    pub reconcile_errors: Family<Labels, Counter>,
    /// Interruption queue messages, by kind and outcome.
    pub interruption_messages: Family<Labels, Counter>,
    /// Interruption queue messages deleted without being acted on, by reason (foreign_source,
    /// foreign_account, max_receives).
    pub interruption_messages_dropped: Family<Labels, Counter>,
    /// Nodes Archer manages now, by nodepool, arch and capacity_type.
    pub managed_nodes: Family<Labels, Gauge>,
    /// Their hourly price, by the same labels.
    pub nodes_cost: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Hourly saving of the pods on managed nodes against amd64 on-demand, by source (arm64, spot).
    pub savings: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Hourly price of the same pods on amd64 on-demand nodes.
    pub baseline_cost: Gauge<f64, AtomicU64>,
    /// Created to Ready, of pods the provisioner launched nodes for.
    pub pod_startup_seconds: Histogram,
    /// The runtime safety net's families.
    pub safety: SafetyNetMetrics,
}

/// The safety net: exec format errors seen, re-placements, and the scheduling gate.
#[derive(Default)]
pub struct SafetyNetMetrics {
    /// `archer_exec_format_errors_total{namespace,arch}`: pods found failing for their binary's architecture.
    pub exec_format_errors: Family<Labels, Counter>,
    /// What was done about each, by outcome (evicted, bare_pod, disabled, already_replaced, ...).
    pub replacements: Family<Labels, Counter>,
    /// Pods held behind `archer.dev/inspecting` now.
    pub gated_pods: Gauge,
    /// Gates removed, by outcome (decided, bound, swept).
    pub gate_releases: Family<Labels, Counter>,
    /// 1 while this replica holds the safety net's lease.
    pub leader: Gauge,
    /// `archer_exec_format_learned_total{scope}`: broken pairs learned, for the failing pod's
    /// namespace only or (verified from the image) for every namespace.
    pub learned: Family<Labels, Counter>,
    /// `archer_exec_format_verifications_total{outcome}`: reads of a failing image's entrypoint
    /// binary (read, undetermined, error, timeout).
    pub verifications: Family<Labels, Counter>,
    /// `archer_safety_record_entries_dropped_total`: entries the record's byte bound pushed out.
    pub record_entries_dropped: Counter,
    /// `archer_exec_format_detections_dropped_total`: failing pods not queued (their namespace's
    /// share of the detector's queue was full); seen again at their next status change.
    pub detections_dropped: Counter,
}

impl SafetyNetMetrics {
    fn register(&self, root: &mut Registry) {
        root.register("exec_format_errors", "Pods admitted by Archer found failing with an exec format error, by namespace and the node's architecture", self.exec_format_errors.clone());
        root.register("exec_format_replacements", "What the safety net did about a pod failing with an exec format error, by outcome", self.replacements.clone());
        root.register("gated_pods", "Pods held behind the scheduling gate archer.dev/inspecting now", self.gated_pods.clone());
        root.register("gate_releases", "Scheduling gates archer.dev/inspecting removed, by outcome (decided, bound, swept)", self.gate_releases.clone());
        root.register("safety_net_leader", "1 while this replica holds the safety net's lease", self.leader.clone());
        root.register("exec_format_learned", "Broken (digest, architecture) pairs learned, by scope: the failing pod's namespace, or every namespace when verified from the image", self.learned.clone());
        root.register("exec_format_verifications", "Reads of a failing image's entrypoint binary to verify an exec format error, by outcome", self.verifications.clone());
        root.register("safety_record_entries_dropped", "Entries of the safety net's record pushed out by its byte bound", self.record_entries_dropped.clone());
        root.register("exec_format_detections_dropped", "Failing pods not queued for the detector because their namespace's share was full", self.detections_dropped.clone());
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Count one admission review under `outcome` (`archer_admission_reviews_total{outcome}`).
    pub fn admission(&self, outcome: &'static str) {
        if let Ok(m) = self.admission_outcomes.read() {
            if let Some(c) = m.get(outcome) {
                c.inc();
                return;
            }
        }
        let counter = self.admissions.get_or_create(&label("outcome", outcome)).clone();
        counter.inc();
        if let Ok(mut m) = self.admission_outcomes.write() {
            m.insert(outcome, counter);
        }
    }

    pub fn new() -> Self {
        let mut root = Registry::with_prefix("archer");
        let admissions = Family::<Labels, Counter>::default();
        let admission_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        let admission_decisions_reused = Counter::default();
        root.register("admission_decisions_reused", "Admission reviews answered with the decision made for an earlier pod with the same inputs (a workload's replicas)", admission_decisions_reused.clone());
        let image_lookups = Family::<Labels, Counter>::default();
        let inspection_failures = Family::<Labels, Counter>::default();
        let bad_requests = Family::<Labels, Counter>::default();
        let cert_reloads = Family::<Labels, Counter>::default();
        let policy_warnings = Counter::default();
        let registry_requests = Counter::default();
        let extender_requests = Family::<Labels, Counter>::default();
        let extender_filter_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        let extender_prioritize_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        let extender_filtered_nodes = Counter::default();
        let extender_unknown_price_nodes = Counter::default();
        let extender_invalid_prices = Counter::default();
        let extender_planned_placements = Counter::default();
        let extender_held_room_refusals = Counter::default();
        let connections_refused = Counter::default();
        let connections_displaced = Family::<Labels, Counter>::default();
        let panics = Family::<Labels, Counter>::default();
        root.register("connections_displaced", "Connections closed to make room for a new one at the connection cap, by what the closed one was doing (handshake, headers, body, idle)", connections_displaced.clone());
        root.register("panics", "Request handlers that panicked and were answered 500, by route", panics.clone());
        let connection_timeouts = Family::<Labels, Counter>::default();
        let connections_open = prometheus_client::metrics::gauge::Gauge::default();
        root.register("extender_invalid_prices", "Node prices treated as unknown because they are not sane numbers", extender_invalid_prices.clone());
        root.register("extender_planned_placements", "Prioritize calls that scored the node a provisioning plan put the pod on highest", extender_planned_placements.clone());
        root.register("extender_held_room_refusals", "Nodes the filter refused a pod because their room is held for pending pods a provisioning plan put there", extender_held_room_refusals.clone());
        root.register("connections_refused", "Connections closed at once because the listener was at its connection cap", connections_refused.clone());
        root.register("connection_timeouts", "Connections closed by a timeout, by phase", connection_timeouts.clone());
        root.register("connections_open", "Connections open now", connections_open.clone());
        root.register("extender_requests", "Scheduler extender calls, by verb and result", extender_requests.clone());
        root.register("extender_filter_duration_seconds", "Time to answer a filter call", extender_filter_seconds.clone());
        root.register("extender_prioritize_duration_seconds", "Time to answer a prioritize call", extender_prioritize_seconds.clone());
        root.register("extender_filtered_nodes", "Nodes filtered out because the pod's images cannot run there", extender_filtered_nodes.clone());
        root.register("extender_unknown_price_nodes", "Nodes scored neutrally because their price is unknown", extender_unknown_price_nodes.clone());
        root.register("admission_reviews", "Admission reviews answered, by outcome", admissions.clone());
        root.register("admission_duration_seconds", "Time to answer an admission review", admission_seconds.clone());
        root.register("image_lookups", "Image platform lookups, by cache result", image_lookups.clone());
        root.register("image_inspection_failures", "Images that could not be inspected, by reason", inspection_failures.clone());
        root.register("bad_requests", "Requests refused before a decision, by reason", bad_requests.clone());
        root.register("tls_certificate_reloads", "Serving certificate reloads, by result", cert_reloads.clone());
        root.register("policy_annotation_errors", "Namespace policy annotations that could not be used", policy_warnings.clone());
        root.register("registry_requests", "Registry HTTP requests answered (manifests, blobs, tokens)", registry_requests.clone());
        let provisioner_batches = Counter::default();
        let provisioner_batch_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let plan_cost_ratio = Histogram::new([1.0, 1.005, 1.01, 1.02, 1.03, 1.05, 1.1, 1.25, 1.5, 2.0]);
        let nodes_launched = Family::<Labels, Counter>::default();
        let launch_errors = Family::<Labels, Counter>::default();
        let nodes_terminated = Family::<Labels, Counter>::default();
        let unprovisionable_pods = Counter::default();
        let disruption_decisions = Family::<Labels, Counter>::default();
        let pod_evictions = Family::<Labels, Counter>::default();
        let deletion_cost_writes = Family::<Labels, Counter>::default();
        let launches_rate_limited = Counter::default();
        let leader = prometheus_client::metrics::gauge::Gauge::default();
        let claims_given_up = Family::<Labels, Counter>::default();
        let reconcile_errors = Family::<Labels, Counter>::default();
        let interruption_messages = Family::<Labels, Counter>::default();
        let interruption_messages_dropped = Family::<Labels, Counter>::default();
        let managed_nodes = Family::<Labels, Gauge>::default();
        let nodes_cost = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let savings = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let baseline_cost = Gauge::<f64, AtomicU64>::default();
        let pod_startup_seconds = Histogram::new(exponential_buckets(0.5, 2.0, 14));
        root.register("managed_nodes", "Nodes Archer manages, by nodepool, arch and capacity_type", managed_nodes.clone());
        root.register("nodes_cost_per_hour_dollars", "Hourly price of the nodes Archer manages, by nodepool, arch and capacity_type", nodes_cost.clone());
        root.register("savings_per_hour_dollars", "Hourly saving of the pods on managed nodes against the same pods on amd64 on-demand nodes (as simulate --compare plans them), by source: arm64, spot", savings.clone());
        root.register("baseline_cost_per_hour_dollars", "Hourly price of the pods on managed nodes if they ran on amd64 on-demand nodes (as simulate --compare plans them)", baseline_cost.clone());
        root.register("provisioned_pod_startup_duration_seconds", "Time from creation to Ready of pods the provisioner launched nodes for", pod_startup_seconds.clone());
        root.register("nodeclaims_given_up", "NodeClaims deleted because they could not become nodes (launch failures, registration timeouts), by reason", claims_given_up.clone());
        root.register("provisioner_reconcile_errors", "Provisioner executor passes that failed, by executor and error", reconcile_errors.clone());
        root.register("interruption_messages", "Interruption queue messages, by kind and outcome (handled, ignored, malformed, failed, dropped)", interruption_messages.clone());
        root.register("interruption_messages_dropped", "Interruption queue messages deleted without being acted on, by reason (foreign_source, foreign_account: not an EC2 or Health event of Archer's account; max_receives: failed on every receive allowed)", interruption_messages_dropped.clone());
        root.register("provisioner_batches", "Provisioning batches decided", provisioner_batches.clone());
        root.register("provisioner_batch_duration_seconds", "Time to decide and launch one batch", provisioner_batch_seconds.clone());
        root.register("provisioner_plan_cost_ratio", "Per batch that buys nodes: their price over the lower bound no plan for the same pods can beat (1 = optimal)", plan_cost_ratio.clone());
        root.register("nodes_launched", "Nodes launched, by pool", nodes_launched.clone());
        root.register("node_launch_errors", "Node launches that failed and will be retried, by provider", launch_errors.clone());
        root.register("nodes_terminated", "Nodes removed, by reason", nodes_terminated.clone());
        root.register("pod_evictions", "Pods evicted by a drain, by the drain's reason", pod_evictions.clone());
        root.register("disruption_decisions", "Disruption decisions, by reason and result (taken, stale)", disruption_decisions.clone());
        root.register("pod_deletion_cost_writes", "Pod deletion costs written on pods of managed nodes, by outcome (written, gone, error)", deletion_cost_writes.clone());
        root.register("unprovisionable_pods", "Pending pods no NodePool can run", unprovisionable_pods.clone());
        root.register("launches_rate_limited", "Launches put off by the per-minute cap", launches_rate_limited.clone());
        root.register("provisioner_leader", "1 while this replica holds the provisioner lease", leader.clone());
        let safety = SafetyNetMetrics::default();
        safety.register(&mut root);
        Self { safety, managed_nodes, nodes_cost, savings, baseline_cost, pod_startup_seconds, provisioner_batches, provisioner_batch_seconds, plan_cost_ratio, nodes_launched, launch_errors, nodes_terminated, disruption_decisions, deletion_cost_writes, pod_evictions, unprovisionable_pods, launches_rate_limited, leader, claims_given_up, reconcile_errors, interruption_messages, interruption_messages_dropped, registry: root, admissions, admission_seconds, admission_decisions_reused, admission_outcomes: Default::default(), image_lookups, inspection_failures, bad_requests, cert_reloads, policy_warnings, registry_requests, extender_requests, extender_filter_seconds, extender_prioritize_seconds, extender_filtered_nodes, extender_unknown_price_nodes, extender_invalid_prices, extender_planned_placements, extender_held_room_refusals, connections_refused, connections_displaced, panics, connection_timeouts, connections_open }
    }

    /// Register more families (the extender and provisioner add theirs).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

pub fn label(key: &'static str, value: impl Into<String>) -> Labels {
    vec![(key, value.into())]
}

pub fn labels2(k1: &'static str, v1: impl Into<String>, k2: &'static str, v2: impl Into<String>) -> Labels {
    vec![(k1, v1.into()), (k2, v2.into())]
}
