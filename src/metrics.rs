//! The process's metrics: one registry (prefix `archer`), into which each component registers
//! its own families: the webhook's, the listeners', the registry client's, the provisioner's and
//! the safety net's into the root, the extender's into the sub-registry `extender`. Each
//! component is handed only its own families; `/metrics` renders the whole registry.

use crate::extender::metrics::ExtenderMetrics;
use crate::provisioner::metrics::ProvisionerMetrics;
use crate::safety::metrics::SafetyNetMetrics;
use crate::server::metrics::ServerMetrics;
use crate::webhook::metrics::WebhookMetrics;
use archer_registry::metrics::RegistryMetrics;
use prometheus_client::registry::Registry;
use std::sync::Arc;

pub use archer_metrics::{label, labels2, Labels};

/// Every component's families, each registered by the component's own type.
pub struct Metrics {
    root: Registry,
    pub webhook: Arc<WebhookMetrics>,
    pub extender: Arc<ExtenderMetrics>,
    pub server: Arc<ServerMetrics>,
    pub registry: Arc<RegistryMetrics>,
    pub provisioner: Arc<ProvisionerMetrics>,
    pub safety: Arc<SafetyNetMetrics>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut root = archer_metrics::root();
        let webhook = Arc::new(WebhookMetrics::new(&mut root));
        let extender = Arc::new(ExtenderMetrics::new(root.sub_registry_with_prefix("extender")));
        let server = Arc::new(ServerMetrics::new(&mut root));
        let registry = Arc::new(RegistryMetrics::new(&mut root));
        let provisioner = Arc::new(ProvisionerMetrics::new(&mut root));
        let safety = Arc::new(SafetyNetMetrics::new(&mut root, provisioner.pod_evictions.clone()));
        // archer_build_info{version, revision} 1: which build answers (dashboards, upgrades).
        let build = prometheus_client::metrics::family::Family::<Vec<(&'static str, &'static str)>, prometheus_client::metrics::gauge::Gauge>::default();
        build.get_or_create(&vec![("version", env!("CARGO_PKG_VERSION")), ("revision", env!("ARCHER_GIT_REVISION"))]).set(1);
        root.register("build_info", "1, labelled with the version and git revision of this build", build);
        Metrics { root, webhook, extender, server, registry, provisioner, safety }
    }

    /// Register more families (the memory budget adds its own).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.root
    }

    pub fn encode(&self) -> String {
        archer_metrics::encode(&self.root)
    }
}

impl crate::server::admin::Exposition for Metrics {
    fn encode(&self) -> String {
        Metrics::encode(self)
    }
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
        "archer_admission_memo_displaced",
        "archer_admission_reviews",
        "archer_bad_requests",
        "archer_baseline_cost_per_hour_dollars",
        "archer_build_info",
        "archer_connection_timeouts",
        "archer_connections_displaced",
        "archer_connections_open",
        "archer_connections_refused",
        "archer_consolidation_searches_skipped",
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
        "archer_node_price_dollars_per_hour",
        "archer_nodeclaims_given_up",
        "archer_nodes_cost_per_hour_dollars",
        "archer_nodes_launched",
        "archer_nodes_terminated",
        "archer_panics",
        "archer_pod_deletion_cost_writes",
        "archer_pod_evictions",
        "archer_policy_annotation_errors",
        "archer_price_refresh_failing_since_timestamp_seconds",
        "archer_price_refresh_failures",
        "archer_prices_refreshed_timestamp_seconds",
        "archer_prices_source_info",
        "archer_provisioned_pod_startup_duration_seconds",
        "archer_provisioner_batch_duration_seconds",
        "archer_provisioner_batches",
        "archer_provisioner_leader",
        "archer_provisioner_leader_candidate",
        "archer_provisioner_plan_cost_ratio",
        "archer_provisioner_reconcile_errors",
        "archer_registry_auth_failures",
        "archer_registry_requests",
        "archer_safety_net_leader",
        "archer_safety_net_leader_candidate",
        "archer_safety_record_entries_dropped",
        "archer_savings_leader",
        "archer_savings_leader_candidate",
        "archer_savings_per_hour_dollars",
        "archer_tls_certificate_expiration_timestamp_seconds",
        "archer_tls_certificate_reloads",
        "archer_tls_certificate_writes",
        "archer_unprovisionable_pods",
        ];
        assert_eq!(exported, expected);
    }
}
