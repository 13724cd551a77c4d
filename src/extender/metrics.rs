//! The scheduler extender's metric families, registered into the sub-registry `extender`
//! (`archer_extender_*`).

use archer_metrics::Labels;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

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
    /// The families, registered into `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        m.register(registry);
        m
    }

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
