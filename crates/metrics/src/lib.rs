//! Prometheus metrics: one registry (prefix `archer`), and a struct of families per component.
//! Each component's families are registered by its own struct ([`WebhookMetrics`],
//! [`ExtenderMetrics`] under the sub-registry `extender`, [`ServerMetrics`],
//! [`RegistryMetrics`], [`ProvisionerMetrics`], [`SafetyNetMetrics`]); a component is handed the
//! whole [`Metrics`] and reaches only its own part. The names every family is exported under are
//! a contract (dashboards, alert rules, runbooks): a sub-registry's prefix is part of the name.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

pub type Labels = Vec<(&'static str, String)>;

/// Every component's families, registered in one registry.
pub struct Metrics {
    root: Registry,
    pub webhook: WebhookMetrics,
    pub extender: ExtenderMetrics,
    pub server: ServerMetrics,
    pub registry: RegistryMetrics,
    pub provisioner: ProvisionerMetrics,
    pub safety: SafetyNetMetrics,
}

/// The admission webhook's families.
pub struct WebhookMetrics {
    /// Admission reviews answered, by outcome (enforced, observed, denied, skipped, invalid, ...).
    pub admissions: Family<Labels, Counter>,
    pub admission_seconds: Histogram,
    /// Admission reviews answered with a decision remembered for a pod with the same inputs.
    pub admission_decisions_reused: Counter,
    /// `admissions`' counters by outcome, once used: the admission path counts without building
    /// a label set each time.
    admission_outcomes: std::sync::RwLock<std::collections::HashMap<&'static str, Counter>>,
    /// Requests refused before a decision, by reason (bad_json, body_too_large, ...).
    pub bad_requests: Family<Labels, Counter>,
    /// Namespace annotations that could not be used.
    pub policy_warnings: Counter,
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        WebhookMetrics {
            admissions: Family::default(),
            admission_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            admission_decisions_reused: Counter::default(),
            admission_outcomes: Default::default(),
            bad_requests: Family::default(),
            policy_warnings: Counter::default(),
        }
    }
}

impl WebhookMetrics {
    fn register(&self, r: &mut Registry) {
        r.register("admission_decisions_reused", "Admission reviews answered with the decision made for an earlier pod with the same inputs (a workload's replicas)", self.admission_decisions_reused.clone());
        r.register("admission_reviews", "Admission reviews answered, by outcome", self.admissions.clone());
        r.register("admission_duration_seconds", "Time to answer an admission review", self.admission_seconds.clone());
        r.register("bad_requests", "Requests refused before a decision, by reason", self.bad_requests.clone());
        r.register("policy_annotation_errors", "Namespace policy annotations that could not be used", self.policy_warnings.clone());
    }

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
}

/// The scheduler extender's families, under the sub-registry `extender` (`archer_extender_*`).
pub struct ExtenderMetrics {
    /// Calls by verb (filter, prioritize) and result (ok, error).
    pub requests: Family<Labels, Counter>,
    pub filter_seconds: Histogram,
    pub prioritize_seconds: Histogram,
    /// Nodes the filter removed because the pod's images cannot run there.
    pub filtered_nodes: Counter,
    /// Nodes scored neutrally because their price is unknown.
    pub unknown_price_nodes: Counter,
    /// Node prices not believed (NaN, infinite, negative or above the ceiling).
    pub invalid_prices: Counter,
    pub planned_placements: Counter,
    /// Nodes the filter refused a pod because their room is held for pods a plan put there.
    pub held_room_refusals: Counter,
}

impl Default for ExtenderMetrics {
    fn default() -> Self {
        ExtenderMetrics {
            requests: Family::default(),
            filter_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            prioritize_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            filtered_nodes: Counter::default(),
            unknown_price_nodes: Counter::default(),
            invalid_prices: Counter::default(),
            planned_placements: Counter::default(),
            held_room_refusals: Counter::default(),
        }
    }
}

impl ExtenderMetrics {
    /// Into `r`, the sub-registry with the prefix `extender`.
    fn register(&self, r: &mut Registry) {
        r.register("invalid_prices", "Node prices treated as unknown because they are not sane numbers", self.invalid_prices.clone());
        r.register("planned_placements", "Prioritize calls that scored the node a provisioning plan put the pod on highest", self.planned_placements.clone());
        r.register("held_room_refusals", "Nodes the filter refused a pod because their room is held for pending pods a provisioning plan put there", self.held_room_refusals.clone());
        r.register("requests", "Scheduler extender calls, by verb and result", self.requests.clone());
        r.register("filter_duration_seconds", "Time to answer a filter call", self.filter_seconds.clone());
        r.register("prioritize_duration_seconds", "Time to answer a prioritize call", self.prioritize_seconds.clone());
        r.register("filtered_nodes", "Nodes filtered out because the pod's images cannot run there", self.filtered_nodes.clone());
        r.register("unknown_price_nodes", "Nodes scored neutrally because their price is unknown", self.unknown_price_nodes.clone());
    }
}

/// The listeners' families: connections, timeouts, panics, certificate reloads.
#[derive(Default)]
pub struct ServerMetrics {
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
    pub connections_open: Gauge,
    /// Serving-certificate reloads by result (ok, error).
    pub cert_reloads: Family<Labels, Counter>,
}

impl ServerMetrics {
    fn register(&self, r: &mut Registry) {
        r.register("connections_displaced", "Connections closed to make room for a new one at the connection cap, by what the closed one was doing (handshake, headers, body, idle)", self.connections_displaced.clone());
        r.register("panics", "Request handlers that panicked and were answered 500, by route", self.panics.clone());
        r.register("connections_refused", "Connections closed at once because the listener was at its connection cap", self.connections_refused.clone());
        r.register("connection_timeouts", "Connections closed by a timeout, by phase", self.connection_timeouts.clone());
        r.register("connections_open", "Connections open now", self.connections_open.clone());
        r.register("tls_certificate_reloads", "Serving certificate reloads, by result", self.cert_reloads.clone());
    }
}

/// The registry client's and image inspector's families.
#[derive(Default)]
pub struct RegistryMetrics {
    /// Image lookups by result: hit, miss, error.
    pub image_lookups: Family<Labels, Counter>,
    /// Failed image inspections by reason (timeout, not_found, forbidden_address, ...).
    pub inspection_failures: Family<Labels, Counter>,
    /// Registry HTTP exchanges that got a response (manifests, blobs, tokens, retries included).
    pub registry_requests: Counter,
}

impl RegistryMetrics {
    fn register(&self, r: &mut Registry) {
        r.register("image_lookups", "Image platform lookups, by cache result", self.image_lookups.clone());
        r.register("image_inspection_failures", "Images that could not be inspected, by reason", self.inspection_failures.clone());
        r.register("registry_requests", "Registry HTTP requests answered (manifests, blobs, tokens)", self.registry_requests.clone());
    }
}

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
    /// Pod deletion costs written, by outcome (written, gone, error).
    pub deletion_cost_writes: Family<Labels, Counter>,
    /// Pending pods no pool can run (an Event says why).
    pub unprovisionable_pods: Counter,
    /// Launches put off by the per-minute cap.
    pub launches_rate_limited: Counter,
    /// 1 while this replica holds the provisioner lease.
    pub leader: Gauge,
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
            deletion_cost_writes: Family::default(),
            unprovisionable_pods: Counter::default(),
            launches_rate_limited: Counter::default(),
            leader: Gauge::default(),
            claims_given_up: Family::default(),
            reconcile_errors: Family::default(),
            interruption_messages: Family::default(),
            interruption_messages_dropped: Family::default(),
            managed_nodes: Family::default(),
            nodes_cost: Family::default(),
            savings: Family::default(),
            baseline_cost: Gauge::default(),
            pod_startup_seconds: Histogram::new(exponential_buckets(0.5, 2.0, 14)),
        }
    }
}

impl ProvisionerMetrics {
    fn register(&self, r: &mut Registry) {
        r.register("managed_nodes", "Nodes Archer manages, by nodepool, arch and capacity_type", self.managed_nodes.clone());
        r.register("nodes_cost_per_hour_dollars", "Hourly price of the nodes Archer manages, by nodepool, arch and capacity_type", self.nodes_cost.clone());
        r.register("savings_per_hour_dollars", "Hourly saving of the pods on managed nodes against the same pods on amd64 on-demand nodes (as simulate --compare plans them), by source: arm64, spot", self.savings.clone());
        r.register("baseline_cost_per_hour_dollars", "Hourly price of the pods on managed nodes if they ran on amd64 on-demand nodes (as simulate --compare plans them)", self.baseline_cost.clone());
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
        r.register("pod_deletion_cost_writes", "Pod deletion costs written on pods of managed nodes, by outcome (written, gone, error)", self.deletion_cost_writes.clone());
        r.register("unprovisionable_pods", "Pending pods no NodePool can run", self.unprovisionable_pods.clone());
        r.register("launches_rate_limited", "Launches put off by the per-minute cap", self.launches_rate_limited.clone());
        r.register("provisioner_leader", "1 while this replica holds the provisioner lease", self.leader.clone());
    }
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
    /// Every component's families, each registered by its own struct (the extender's under the
    /// prefix `extender`).
    pub fn new() -> Self {
        let mut root = Registry::with_prefix("archer");
        let m = (WebhookMetrics::default(), ExtenderMetrics::default(), ServerMetrics::default(), RegistryMetrics::default(), ProvisionerMetrics::default(), SafetyNetMetrics::default());
        m.0.register(&mut root);
        m.1.register(root.sub_registry_with_prefix("extender"));
        m.2.register(&mut root);
        m.3.register(&mut root);
        m.4.register(&mut root);
        m.5.register(&mut root);
        let (webhook, extender, server, registry, provisioner, safety) = m;
        Metrics { root, webhook, extender, server, registry, provisioner, safety }
    }

    /// Register more families (the memory budget adds its own).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.root
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.root);
        out
    }
}

pub fn label(key: &'static str, value: impl Into<String>) -> Labels {
    vec![(key, value.into())]
}

pub fn labels2(k1: &'static str, v1: impl Into<String>, k2: &'static str, v2: impl Into<String>) -> Labels {
    vec![(k1, v1.into()), (k2, v2.into())]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names every family is exported under are a contract (dashboards, alert rules,
    /// runbooks, users' queries): splitting the families by component kept each one.
    #[test]
    fn every_family_keeps_its_exported_name() {
        let text = Metrics::new().encode();
        let mut exported: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
        exported.sort_unstable();
        let expected = [
        "archer_admission_decisions_reused",
        "archer_admission_duration_seconds",
        "archer_admission_reviews",
        "archer_bad_requests",
        "archer_baseline_cost_per_hour_dollars",
        "archer_connection_timeouts",
        "archer_connections_displaced",
        "archer_connections_open",
        "archer_connections_refused",
        "archer_disruption_decisions",
        "archer_exec_format_detections_dropped",
        "archer_exec_format_errors",
        "archer_exec_format_learned",
        "archer_exec_format_replacements",
        "archer_exec_format_verifications",
        "archer_extender_filter_duration_seconds",
        "archer_extender_filtered_nodes",
        "archer_extender_held_room_refusals",
        "archer_extender_invalid_prices",
        "archer_extender_planned_placements",
        "archer_extender_prioritize_duration_seconds",
        "archer_extender_requests",
        "archer_extender_unknown_price_nodes",
        "archer_gate_releases",
        "archer_gated_pods",
        "archer_image_inspection_failures",
        "archer_image_lookups",
        "archer_interruption_messages",
        "archer_interruption_messages_dropped",
        "archer_launches_rate_limited",
        "archer_managed_nodes",
        "archer_node_launch_errors",
        "archer_nodeclaims_given_up",
        "archer_nodes_cost_per_hour_dollars",
        "archer_nodes_launched",
        "archer_nodes_terminated",
        "archer_panics",
        "archer_pod_deletion_cost_writes",
        "archer_pod_evictions",
        "archer_policy_annotation_errors",
        "archer_provisioned_pod_startup_duration_seconds",
        "archer_provisioner_batch_duration_seconds",
        "archer_provisioner_batches",
        "archer_provisioner_leader",
        "archer_provisioner_plan_cost_ratio",
        "archer_provisioner_reconcile_errors",
        "archer_registry_requests",
        "archer_safety_net_leader",
        "archer_safety_record_entries_dropped",
        "archer_savings_per_hour_dollars",
        "archer_tls_certificate_reloads",
        "archer_unprovisionable_pods",
        ];
        assert_eq!(exported, expected);
    }
}
