//! What nodes cost and what the pods on them save, whoever launched the nodes: the one rule the
//! provisioner's cost reporter ([`crate::provisioner::cost`]) and the savings reporter that runs
//! beside Karpenter ([`savings`]) both set the cost and savings gauges by. Deciding is
//! pure (prices by the one price rule, the counterfactual of `core::planner::compare`); the
//! reporters only read their caches and set metrics.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};

use archer_core::labels;
use archer_core::packer::Pool;
use archer_core::planner::compare::Comparison;
use archer_metrics::Labels;
use archer_model::adapter as model;
use archer_model::objects as state;
use archer_model::ClusterState;

use metrics::CostMetrics;

pub mod metrics;
pub mod savings;

/// (nodepool, arch, capacity_type) of a node a NodePool launched (Archer's or Karpenter's); None
/// for any other node.
pub type Key = (String, String, String);

pub fn node_key(node: &Node) -> Option<Key> {
    let labels = node.metadata.labels.as_ref()?;
    let pool = labels.get(labels::NODEPOOL).or_else(|| labels.get(labels::KARPENTER_NODEPOOL))?;
    let arch = labels.get(labels::ARCH).cloned().unwrap_or_default();
    let capacity = labels.get(labels::KARPENTER_CAPACITY_TYPE).or_else(|| labels.get(labels::CAPACITY_TYPE)).cloned().unwrap_or_default();
    Some((pool.clone(), arch, capacity))
}

/// Nodes a NodePool launched and their summed hourly price per (nodepool, arch, capacity_type),
/// by the one price rule ([`archer_model::price`]). A node no price is known for counts, at no
/// price.
pub fn node_costs(cluster: &ClusterState) -> BTreeMap<Key, (i64, f64)> {
    let pricer = cluster.pricer();
    let mut out: BTreeMap<Key, (i64, f64)> = BTreeMap::new();
    for n in &cluster.nodes {
        let Some(key) = node_key(n) else { continue };
        let entry = out.entry(key).or_default();
        entry.0 += 1;
        entry.1 += pricer.per_hour(n).unwrap_or(0.0);
    }
    out
}

/// Every node's price and where it came from (`archer_node_price_dollars_per_hour{node,source}`),
/// whoever launched it; nodes no price is known for are left out.
pub fn node_prices(cluster: &ClusterState) -> Vec<(String, &'static str, f64)> {
    let pricer = cluster.pricer();
    cluster.nodes.iter().filter_map(|n| Some((n.metadata.name.clone()?, pricer.price(n).ok()?))).map(|(name, p)| (name, p.source.as_str(), p.per_hour)).collect()
}

/// The pods the savings are computed over: running (not a DaemonSet's, not finished, not being
/// deleted) on a node whose price is known, whoever launched it.
pub fn priced_pods(cluster: &ClusterState) -> Vec<Arc<Pod>> {
    let pricer = cluster.pricer();
    let priced: HashSet<&str> = cluster.nodes.iter().filter(|n| pricer.per_hour(n).is_some()).filter_map(|n| n.metadata.name.as_deref()).collect();
    cluster
        .pods
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| priced.contains(n)))
        .filter(|p| !state::is_daemon_pod(p) && !state::is_terminal(p) && p.metadata.deletion_timestamp.is_none())
        .cloned()
        .collect()
}

/// The pools as the counterfactual plans them: every NodePool at its full limits (the pods
/// compared already run inside them), with its DaemonSets.
fn counterfactual_pools(cluster: &ClusterState) -> Vec<Pool> {
    let pools: Vec<&archer_api::nodepool::NodePool> = cluster.pools.iter().map(|p| p.as_ref()).collect();
    // What the pods would cost on the pools as written, whatever their node classes' state now.
    let mut out = state::packer_pools(&pools, &[], &cluster.daemon_loads(), &|_| None);
    for pool in &mut out {
        (pool.limit_cpu_millis, pool.limit_memory_bytes, pool.limit_nodes) = (None, None, None);
    }
    out
}

/// The three plans of `pods` (with arm64, arm64 forbidden, amd64 on-demand only) on the state's
/// pools and offerings: the savings. Each pod's platforms are its own (its annotation, else
/// what the state knows of its images), so what one pod says changes only its own share.
pub fn comparison(cluster: &ClusterState, pods: &[Arc<Pod>], policy: archer_core::sched::preferences::Policy) -> Comparison {
    let volumes = cluster.volumes();
    let platforms: Vec<_> = pods.iter().map(|p| cluster.pod_platforms(p)).collect();
    let pending: Vec<_> = pods.iter().zip(&platforms).map(|(p, platforms)| model::pending_unbound(p, platforms.clone(), &volumes, policy)).collect();
    // The same pods as their owners would write them for amd64 (one rule with simulate's).
    let on_amd64: Vec<_> = pods
        .iter()
        .zip(&platforms)
        .zip(&pending)
        .map(|((p, platforms), as_is)| archer_model::counterfactual::pending_on_amd64(p, platforms.as_ref(), as_is, |rewritten| model::pending_unbound(rewritten, platforms.clone(), &volumes, policy)))
        .collect();
    let namespaces: Vec<_> = cluster.namespaces.iter().map(|n| n.as_ref().clone()).collect();
    let pools = counterfactual_pools(cluster);
    let empty = archer_core::sched::Snapshot::new(&[], &[], &namespaces);
    archer_core::planner::compare::compare(&empty, &pending, &on_amd64, &pools, &cluster.offerings)
}

/// Inspect the images of `pods` whose platforms `state` does not know (no webhook record on the
/// pod, an image not seen), and of those whose images the safety record names, into `state`.
/// What the registry says of an image is Archer's own finding, so the state shares it between
/// namespaces; a pod's own annotation stays that pod's ([`ClusterState::pod_platforms`]).
pub async fn learn_platforms<P: std::borrow::Borrow<Pod> + Sync>(state: &mut ClusterState, pods: &[P], inspector: &archer_registry::Inspector, view: &crate::cluster::ClusterView, keyring: &archer_registry::Keyring) {
    let unknown: Vec<&Pod> = pods.iter().map(|p| p.borrow()).filter(|p| state.pod_platforms(p).is_none() || state.needs_digests(p)).collect();
    let found = futures::future::join_all(unknown.into_iter().map(|pod| async move {
        match crate::cluster::pod_platforms(inspector, Some(view), keyring, pod, inspector.lookup_timeout() * 2).await {
            crate::cluster::PodPlatforms::Known { inspected, .. } => inspected,
            crate::cluster::PodPlatforms::Unknown(why) => {
                tracing::info!(pod = %state::pod_id(pod), reason = %why, "platforms unknown; the pod is assumed to run on any architecture");
                Vec::new()
            }
        }
    }))
    .await;
    // The images' platforms as the registry gave them: `ClusterState::pod_platforms` takes away
    // what the record holds broken for each pod's own namespace.
    for (image, digest, platforms) in found.into_iter().flatten() {
        state.platforms.insert(image.clone(), platforms);
        state.digests.insert(image, digest);
    }
}

/// Which pods (by uid) run on which node, and the offerings' prices: the savings are computed
/// again only when this changes.
pub fn fingerprint(pods: &[Arc<Pod>], cluster: &ClusterState) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut ids: Vec<(&str, &str)> = pods.iter().map(|p| (p.metadata.uid.as_deref().unwrap_or(""), p.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or(""))).collect();
    ids.sort_unstable();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ids.hash(&mut h);
    // New spot prices change the savings as much as new pods.
    h.finish() ^ cluster.offerings.iter().map(|o| o.price).sum::<f64>().to_bits()
}

fn labels3(key: &Key) -> Labels {
    vec![("nodepool", key.0.clone()), ("arch", key.1.clone()), ("capacity_type", key.2.clone())]
}

/// Set the node gauges: NodePools' nodes and their cost, and every priced node's price.
pub fn report_nodes(metrics: &CostMetrics, cluster: &ClusterState) {
    metrics.managed_nodes.clear();
    metrics.nodes_cost.clear();
    for (key, (count, price)) in &node_costs(cluster) {
        metrics.managed_nodes.get_or_create(&labels3(key)).set(*count);
        metrics.nodes_cost.get_or_create(&labels3(key)).set(*price);
    }
    metrics.node_price.clear();
    for (node, source, price) in node_prices(cluster) {
        metrics.node_price.get_or_create(&vec![("node", node), ("source", source.to_string())]).set(price);
    }
}

/// Set the savings gauges from a comparison.
pub fn report_savings(metrics: &CostMetrics, c: &Comparison) {
    // `+ 0.0` turns an empty sum's -0.0 into 0.
    metrics.savings.get_or_create(&vec![("source", "arm64".to_string())]).set(c.arm64_saving() + 0.0);
    metrics.savings.get_or_create(&vec![("source", "spot".to_string())]).set(c.spot_saving() + 0.0);
    metrics.baseline_cost.set(c.baseline() + 0.0);
    tracing::debug!(baseline = c.baseline(), arm64 = c.arm64_saving(), spot = c.spot_saving(), left_out = c.left_out.len(), "cost and savings");
}

/// Empties the cost, savings and price gauges when dropped (a reporter's task ended: leadership
/// lost), so sums over replicas count each node once.
pub struct ClearOnDrop(pub Arc<CostMetrics>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.managed_nodes.clear();
        self.0.nodes_cost.clear();
        self.0.node_price.clear();
        self.0.savings.clear();
        self.0.baseline_cost.set(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, pool: Option<(&str, &str)>, arch: &str, instance: &str, capacity: &str) -> Node {
        let mut labels = BTreeMap::from([
            (labels::ARCH.to_string(), arch.to_string()),
            (labels::INSTANCE_TYPE.to_string(), instance.to_string()),
            (labels::ZONE.to_string(), "us-east-1a".to_string()),
            (labels::KARPENTER_CAPACITY_TYPE.to_string(), capacity.to_string()),
        ]);
        if let Some((label, p)) = pool {
            labels.insert(label.to_string(), p.to_string());
        }
        Node { metadata: kube::api::ObjectMeta { name: Some(name.into()), labels: Some(labels), ..Default::default() }, ..Default::default() }
    }

    #[test]
    fn node_costs_sum_offering_prices_per_pool_arch_and_capacity_whoever_launched_the_node() {
        let offerings = archer_core::packer::Offering::embedded_on_demand();
        let price = |t: &str| archer_core::packer::Offering::find(&offerings, t, "us-east-1a", "on-demand").map(|o| o.price).expect("offered");
        let nodes = [
            node("a", Some((labels::NODEPOOL, "default")), "arm64", "m7g.large", "on-demand"),
            node("b", Some((labels::NODEPOOL, "default")), "arm64", "m7g.large", "on-demand"),
            node("c", Some((labels::NODEPOOL, "default")), "amd64", "m7i.large", "on-demand"),
            node("d", None, "amd64", "m7i.large", "on-demand"),
            node("e", Some((labels::NODEPOOL, "batch")), "amd64", "no-such.type", "on-demand"),
            // Karpenter's node, beside Archer: its NodePool's label.
            node("k", Some((labels::KARPENTER_NODEPOOL, "general")), "arm64", "m7g.large", "on-demand"),
        ];
        let cluster = ClusterState { nodes: nodes.into_iter().map(Arc::new).collect(), offerings: Arc::new(offerings.clone()), ..Default::default() };
        let costs = node_costs(&cluster);
        let key = |p: &str, a: &str| (p.to_string(), a.to_string(), "on-demand".to_string());
        assert_eq!(costs.len(), 4, "{costs:?}");
        let (n, p) = costs[&key("default", "arm64")];
        assert_eq!(n, 2);
        assert!((p - 2.0 * price("m7g.large")).abs() < 1e-9);
        assert!((costs[&key("default", "amd64")].1 - price("m7i.large")).abs() < 1e-9);
        assert_eq!(costs[&key("batch", "amd64")], (1, 0.0), "an unknown offering counts at no price");
        assert!((costs[&key("general", "arm64")].1 - price("m7g.large")).abs() < 1e-9, "Karpenter's node counts under its NodePool");
        // Every priced node, in a pool or not, with where its price came from.
        let prices = node_prices(&cluster);
        assert_eq!(prices.iter().map(|(n, s, _)| (n.as_str(), *s)).collect::<Vec<_>>(), [("a", "offering"), ("b", "offering"), ("c", "offering"), ("d", "offering"), ("k", "offering")]);
    }

    #[test]
    fn a_reporter_that_stops_stops_reporting_cost() {
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let key = ("default".to_string(), "arm64".to_string(), "spot".to_string());
        metrics.provisioner.cost.nodes_cost.get_or_create(&labels3(&key)).set(1.5);
        metrics.provisioner.cost.savings.get_or_create(&vec![("source", "arm64".to_string())]).set(0.7);
        metrics.provisioner.cost.baseline_cost.set(3.0);
        let sample = |m: &crate::metrics::Metrics, name: &str| m.encode().lines().any(|l| l.starts_with(name) && !l.ends_with(" 0") && !l.ends_with(" 0.0"));
        assert!(sample(&metrics, "archer_nodes_cost_per_hour_dollars{") && sample(&metrics, "archer_baseline_cost_per_hour_dollars"));
        drop(ClearOnDrop(metrics.provisioner.cost.clone()));
        for name in ["archer_nodes_cost_per_hour_dollars{", "archer_savings_per_hour_dollars{", "archer_baseline_cost_per_hour_dollars"] {
            assert!(!sample(&metrics, name), "{name} still reported:\n{}", metrics.encode());
        }
    }
}
