//! The cost and savings gauges, set by whichever reporter runs: the provisioner's, or the savings
//! reporter while Archer does not provision.

use std::sync::atomic::AtomicU64;

use archer_metrics::Labels;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Default)]
pub struct CostMetrics {
    /// Nodes a NodePool (Archer's or Karpenter's) launched, by nodepool, arch and capacity_type.
    pub managed_nodes: Family<Labels, Gauge>,
    /// Their hourly price, by the same labels.
    pub nodes_cost: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Every node's hourly price by the one price rule, by node and source (annotation,
    /// nodeclaim, offering, catalog, catalog-default-region).
    pub node_price: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Hourly saving of the pods on priced nodes against amd64 on-demand, by source (arm64, spot).
    pub savings: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Hourly price of the same pods on amd64 on-demand nodes.
    pub baseline_cost: Gauge<f64, AtomicU64>,
    /// 1 while this replica holds the savings reporter's lease (the provisioner off).
    pub savings_leader: Gauge,
    /// 1 while this replica campaigns for the savings reporter's lease.
    pub savings_candidate: Gauge,
}

impl CostMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register("managed_nodes", "Nodes a NodePool launched (Archer's or Karpenter's), by nodepool, arch and capacity_type", self.managed_nodes.clone());
        r.register("node_price_dollars_per_hour", "Hourly price of each node by the one price rule, by node and where the price came from (annotation, nodeclaim, offering, catalog, catalog-default-region)", self.node_price.clone());
        r.register("nodes_cost_per_hour_dollars", "Hourly price of the nodes a NodePool launched (Archer's or Karpenter's), by nodepool, arch and capacity_type", self.nodes_cost.clone());
        r.register("savings_per_hour_dollars", "Hourly saving of the pods on priced nodes against the same pods on amd64 on-demand nodes (as simulate --compare plans them), by source: arm64, spot", self.savings.clone());
        r.register("baseline_cost_per_hour_dollars", "Hourly price of the pods on priced nodes if they ran on amd64 on-demand nodes (as simulate --compare plans them)", self.baseline_cost.clone());
        r.register("savings_leader", "1 while this replica holds the savings reporter's lease (it sets the cost and savings gauges while Archer does not provision)", self.savings_leader.clone());
        r.register("savings_leader_candidate", "1 while this replica campaigns for the savings reporter's lease", self.savings_candidate.clone());
    }
}
