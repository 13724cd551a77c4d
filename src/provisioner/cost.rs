//! What the managed nodes cost and what Archer saves: the cost and savings gauges, and how long
//! pods the provisioner launched nodes for took to become Ready. Deciding is pure (prices of
//! nodes, the counterfactual of `core::planner::compare`); the loop only reads the watch caches
//! and sets metrics.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};

use archer_model::adapter as model;
use archer_model::objects as state;
use super::context::Context;
use archer_core::labels;
use archer_core::packer::Pool;
use archer_metrics::Labels;

/// How often pods that became Ready are looked for.
const STARTUP_EVERY: Duration = Duration::from_secs(5);

/// (nodepool, arch, capacity_type) of a node Archer launched; None for any other node.
type Key = (String, String, String);

fn node_key(node: &Node) -> Option<Key> {
    let labels = node.metadata.labels.as_ref()?;
    let pool = labels.get(labels::NODEPOOL)?;
    let arch = labels.get(labels::ARCH).cloned().unwrap_or_default();
    let capacity = labels.get(labels::KARPENTER_CAPACITY_TYPE).or_else(|| labels.get(labels::CAPACITY_TYPE)).cloned().unwrap_or_default();
    Some((pool.clone(), arch, capacity))
}

/// Managed nodes and their summed hourly price per (nodepool, arch, capacity_type), by the one
/// price rule ([`archer_model::price`]). A node no price is known for counts, at no price.
fn node_costs(cluster: &archer_model::ClusterState) -> BTreeMap<Key, (i64, f64)> {
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
/// managed by Archer or not; nodes no price is known for are left out.
fn node_prices(cluster: &archer_model::ClusterState) -> Vec<(String, &'static str, f64)> {
    let pricer = cluster.pricer();
    cluster.nodes.iter().filter_map(|n| Some((n.metadata.name.clone()?, pricer.price(n).ok()?))).map(|(name, p)| (name, p.source.as_str(), p.per_hour)).collect()
}

/// Seconds from a pod's creation to its Ready condition turning true; None while not Ready.
fn startup_seconds(pod: &Pod) -> Option<f64> {
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    let ready = pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready" && c.status == "True")?;
    let at = ready.last_transition_time.as_ref()?.0;
    Some(at.duration_since(created).as_secs_f64().max(0.0))
}

/// The pools as the counterfactual plans them: every NodePool at its full limits (the pods
/// compared already run inside them), with its DaemonSets.
fn counterfactual_pools(cluster: &archer_model::ClusterState) -> Vec<Pool> {
    let pools: Vec<&archer_api::nodepool::NodePool> = cluster.pools.iter().map(|p| p.as_ref()).collect();
    // What the pods would cost on the pools as written, whatever their node classes' state now.
    let mut out = state::packer_pools(&pools, &[], &cluster.daemon_loads(), &|_| None);
    for pool in &mut out {
        (pool.limit_cpu_millis, pool.limit_memory_bytes, pool.limit_nodes) = (None, None, None);
    }
    out
}

/// Empties the cost, savings and price gauges when dropped (the loop's task aborted).
struct ClearOnDrop(Arc<super::metrics::ProvisionerMetrics>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.managed_nodes.clear();
        self.0.nodes_cost.clear();
        self.0.node_price.clear();
        self.0.savings.clear();
        self.0.baseline_cost.set(0.0);
        self.0.prices_source.clear();
        self.0.prices_refreshed.clear();
        self.0.price_refresh_failing_since.clear();
    }
}

/// Which pods (by uid) run on which node: the savings are recomputed only when this changes.
fn pod_fingerprint(pods: &[Arc<Pod>]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut ids: Vec<(&str, &str)> = pods.iter().map(|p| (p.metadata.uid.as_deref().unwrap_or(""), p.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or(""))).collect();
    ids.sort_unstable();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ids.hash(&mut h);
    h.finish()
}

fn labels3(key: &Key) -> Labels {
    vec![("nodepool", key.0.clone()), ("arch", key.1.clone()), ("capacity_type", key.2.clone())]
}

/// The cost reporter: keeps the cost, savings and startup metrics current.
pub struct CostReporter {
    ctx: Arc<Context>,
}

impl CostReporter {
    pub fn new(ctx: Arc<Context>) -> Self {
        CostReporter { ctx }
    }

    /// Keep the cost, savings and startup metrics current while this replica provisions.
    pub async fn run(self: Arc<Self>) {
        // A replica that stops provisioning (leadership lost) stops reporting, so sums over
        // replicas count each node once.
        let _clear = ClearOnDrop(self.ctx.metrics.clone());
        let mut observed = HashSet::new();
        let mut last_cost: Option<tokio::time::Instant> = None;
        let mut last_pods = None;
        let every = Duration::from_secs_f64(self.ctx.settings.cost_interval_seconds.max(1.0));
        loop {
            self.observe_startups(&mut observed);
            if last_cost.is_none_or(|t| t.elapsed() >= every) {
                self.report_cost(&mut last_pods).await;
                last_cost = Some(tokio::time::Instant::now());
            }
            tokio::time::sleep(STARTUP_EVERY.min(every)).await;
        }
    }

    /// Pods a claim was launched for that became Ready since the last look: their startup time,
    /// once each. `observed` holds only pods still on a claim's list, so it stays bounded.
    fn observe_startups(&self, observed: &mut HashSet<String>) {
        let planned = {
            let claims = self.ctx.stores.claims.state();
            model::planned_nodes(&claims.iter().map(|c| c.as_ref()).collect::<Vec<_>>())
        };
        observed.retain(|id| planned.contains_key(id));
        for pod in self.ctx.stores.pods.state() {
            let id = state::pod_id(&pod);
            if !planned.contains_key(&id) || observed.contains(&id) {
                continue;
            }
            if let Some(s) = startup_seconds(&pod) {
                self.ctx.metrics.pod_startup_seconds.observe(s);
                observed.insert(id);
            }
        }
    }

    /// Set the price gauges from the provider's price status: where its prices come from, when
    /// its price API last answered, since when refreshes fail (the alert's input).
    fn report_prices(&self) {
        let Some(status) = self.ctx.provider.prices() else { return };
        let m = &self.ctx.metrics;
        let provider = self.ctx.provider.name().to_string();
        let secs = |t: Option<std::time::SystemTime>| t.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0.0, |d| d.as_secs_f64());
        for source in [status.api, archer_cloud::prices::CATALOG] {
            m.prices_source.get_or_create(&vec![("provider", provider.clone()), ("source", source.to_string())]).set(i64::from(source == status.source));
        }
        let by = vec![("provider", provider)];
        m.prices_refreshed.get_or_create(&by).set(secs(status.refreshed_at));
        m.price_refresh_failing_since.get_or_create(&by).set(secs(status.failing_since));
        let counted = m.price_refresh_failures.get_or_create(&by).get();
        m.price_refresh_failures.get_or_create(&by).inc_by(status.failures.saturating_sub(counted));
    }

    /// Set the node cost gauges, and the savings gauges from the counterfactual plans of the pods
    /// running on managed nodes.
    #[tracing::instrument(skip_all, fields(nodes = tracing::field::Empty, pods = tracing::field::Empty))]
    async fn report_cost(&self, last: &mut Option<u64>) {
        self.report_prices();
        let mut cluster = self.ctx.state();
        let offerings = cluster.offerings.clone();
        let costs = node_costs(&cluster);
        self.ctx.metrics.managed_nodes.clear();
        self.ctx.metrics.nodes_cost.clear();
        for (key, (count, price)) in &costs {
            self.ctx.metrics.managed_nodes.get_or_create(&labels3(key)).set(*count);
            self.ctx.metrics.nodes_cost.get_or_create(&labels3(key)).set(*price);
        }
        self.ctx.metrics.node_price.clear();
        for (node, source, price) in node_prices(&cluster) {
            self.ctx.metrics.node_price.get_or_create(&vec![("node", node), ("source", source.to_string())]).set(price);
        }
        let nodes = &cluster.nodes;
        let managed: HashSet<&str> = nodes.iter().filter(|n| node_key(n).is_some()).filter_map(|n| n.metadata.name.as_deref()).collect();
        let pods: Vec<Arc<Pod>> = cluster
            .pods
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| managed.contains(n)))
            .filter(|p| !state::is_daemon_pod(p) && !state::is_terminal(p) && p.metadata.deletion_timestamp.is_none())
            .cloned()
            .collect();
        tracing::Span::current().record("nodes", managed.len()).record("pods", pods.len());
        // The savings take three plans of every pod: only once the cluster has settled (as the
        // consolidation hold judges it: no claim in flight, no pod waiting for one) and when the
        // pods on managed nodes have changed, so a burst's provisioning never shares the CPU
        // with them.
        let claimed: std::collections::BTreeSet<String> = cluster.claims.iter().map(|c| c.spec.node_pool.clone()).collect();
        let waiting = self.ctx.waiting_now(&cluster);
        let unsettled = !waiting.is_empty() || claimed.iter().any(|pool| cluster.consolidation_hold(pool, &waiting).is_some());
        // New spot prices change the savings as much as new pods.
        let fingerprint = pod_fingerprint(&pods) ^ offerings.iter().map(|o| o.price).sum::<f64>().to_bits();
        if unsettled || *last == Some(fingerprint) {
            return;
        }
        *last = Some(fingerprint);
        let volumes = cluster.volumes();
        self.ctx.learn_platforms(&mut cluster, &pods).await;
        let policy = self.ctx.settings.preference_policy;
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
        let pools = counterfactual_pools(&cluster);
        let empty = archer_core::sched::Snapshot::new(&[], &[], &namespaces);
        let c = tokio::task::block_in_place(|| archer_core::planner::compare::compare(&empty, &pending, &on_amd64, &pools, &offerings));
        self.ctx.metrics.savings.get_or_create(&vec![("source", "arm64".to_string())]).set(c.arm64_saving());
        self.ctx.metrics.savings.get_or_create(&vec![("source", "spot".to_string())]).set(c.spot_saving());
        self.ctx.metrics.baseline_cost.set(c.baseline());
        tracing::debug!(baseline = c.baseline(), arm64 = c.arm64_saving(), spot = c.spot_saving(), left_out = c.left_out.len(), "cost and savings");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, pool: Option<&str>, arch: &str, instance: &str, capacity: &str) -> Node {
        let mut labels = BTreeMap::from([
            (labels::ARCH.to_string(), arch.to_string()),
            (labels::INSTANCE_TYPE.to_string(), instance.to_string()),
            (labels::ZONE.to_string(), "us-east-1a".to_string()),
            (labels::KARPENTER_CAPACITY_TYPE.to_string(), capacity.to_string()),
        ]);
        if let Some(p) = pool {
            labels.insert(labels::NODEPOOL.to_string(), p.to_string());
        }
        Node { metadata: kube::api::ObjectMeta { name: Some(name.into()), labels: Some(labels), ..Default::default() }, ..Default::default() }
    }

    #[test]
    fn node_costs_sum_offering_prices_per_pool_arch_and_capacity_and_skip_unmanaged_nodes() {
        let offerings = archer_core::packer::Offering::embedded_on_demand();
        let price = |t: &str| archer_core::packer::Offering::find(&offerings, t, "us-east-1a", "on-demand").map(|o| o.price).expect("offered");
        let nodes = [
            node("a", Some("default"), "arm64", "m7g.large", "on-demand"),
            node("b", Some("default"), "arm64", "m7g.large", "on-demand"),
            node("c", Some("default"), "amd64", "m7i.large", "on-demand"),
            node("d", None, "amd64", "m7i.large", "on-demand"),
            node("e", Some("batch"), "amd64", "no-such.type", "on-demand"),
        ];
        let cluster = archer_model::ClusterState { nodes: nodes.into_iter().map(Arc::new).collect(), offerings: Arc::new(offerings.clone()), ..Default::default() };
        let costs = node_costs(&cluster);
        let key = |p: &str, a: &str| (p.to_string(), a.to_string(), "on-demand".to_string());
        assert_eq!(costs.len(), 3, "{costs:?}");
        let (n, p) = costs[&key("default", "arm64")];
        assert_eq!(n, 2);
        assert!((p - 2.0 * price("m7g.large")).abs() < 1e-9);
        assert!((costs[&key("default", "amd64")].1 - price("m7i.large")).abs() < 1e-9);
        assert_eq!(costs[&key("batch", "amd64")], (1, 0.0), "an unknown offering counts at no price");
        // Every priced node, managed or not, with where its price came from.
        let prices = node_prices(&cluster);
        assert_eq!(prices.iter().map(|(n, s, _)| (n.as_str(), *s)).collect::<Vec<_>>(), [("a", "offering"), ("b", "offering"), ("c", "offering"), ("d", "offering")]);
    }

    #[test]
    fn a_replica_that_stops_provisioning_stops_reporting_cost() {
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let key = ("default".to_string(), "arm64".to_string(), "spot".to_string());
        metrics.provisioner.nodes_cost.get_or_create(&labels3(&key)).set(1.5);
        metrics.provisioner.savings.get_or_create(&vec![("source", "arm64".to_string())]).set(0.7);
        metrics.provisioner.baseline_cost.set(3.0);
        let sample = |m: &crate::metrics::Metrics, name: &str| m.encode().lines().any(|l| l.starts_with(name) && !l.ends_with(" 0") && !l.ends_with(" 0.0"));
        assert!(sample(&metrics, "archer_nodes_cost_per_hour_dollars{") && sample(&metrics, "archer_baseline_cost_per_hour_dollars"));
        drop(ClearOnDrop(metrics.provisioner.clone()));
        for name in ["archer_nodes_cost_per_hour_dollars{", "archer_savings_per_hour_dollars{", "archer_baseline_cost_per_hour_dollars"] {
            assert!(!sample(&metrics, name), "{name} still reported:\n{}", metrics.encode());
        }
    }

    #[test]
    fn startup_is_creation_to_ready() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:03Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:42Z"}
            ]}
        }))
        .expect("pod");
        assert_eq!(startup_seconds(&pod), Some(42.0));
        let mut not_ready = pod.clone();
        if let Some(c) = not_ready.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c[1].status = "False".into();
        }
        assert_eq!(startup_seconds(&not_ready), None);
    }
}
