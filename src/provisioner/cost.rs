//! What the managed nodes cost and what Archer saves: the cost and savings gauges, and how long
//! pods the provisioner launched nodes for took to become Ready. Deciding is pure (prices of
//! nodes, the counterfactual of `core::planner::compare`); the loop only reads the watch caches
//! and sets metrics.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use archer_model::adapter as model;
use archer_model::objects as state;
use super::context::Context;
use crate::cost;

/// How often pods that became Ready are looked for.
const STARTUP_EVERY: Duration = Duration::from_secs(5);

/// Seconds from a pod's creation to its Ready condition turning true; None while not Ready.
fn startup_seconds(pod: &Pod) -> Option<f64> {
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    let ready = pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready" && c.status == "True")?;
    let at = ready.last_transition_time.as_ref()?.0;
    Some(at.duration_since(created).as_secs_f64().max(0.0))
}

/// Empties the price gauges when dropped (leadership lost), as [`cost::ClearOnDrop`] the cost
/// ones.
struct ClearPrices(Arc<super::metrics::ProvisionerMetrics>);

impl Drop for ClearPrices {
    fn drop(&mut self) {
        self.0.prices_source.clear();
        self.0.prices_refreshed.clear();
        self.0.price_refresh_failing_since.clear();
    }
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
        let _clear = (cost::ClearOnDrop(self.ctx.metrics.cost.clone()), ClearPrices(self.ctx.metrics.clone()));
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
    /// running on priced nodes.
    #[tracing::instrument(skip_all, fields(nodes = tracing::field::Empty, pods = tracing::field::Empty))]
    async fn report_cost(&self, last: &mut Option<u64>) {
        self.report_prices();
        let mut cluster = self.ctx.state();
        cost::report_nodes(&self.ctx.metrics.cost, &cluster);
        let pods = cost::priced_pods(&cluster);
        tracing::Span::current().record("nodes", cluster.nodes.len()).record("pods", pods.len());
        // The savings take three plans of every pod: only once the cluster has settled (as the
        // consolidation hold judges it: no claim in flight, no pod waiting for one) and when the
        // pods on priced nodes have changed, so a burst's provisioning never shares the CPU
        // with them.
        let claimed: std::collections::BTreeSet<String> = cluster.claims.iter().map(|c| c.spec.node_pool.clone()).collect();
        let waiting = self.ctx.waiting_now(&cluster);
        let unsettled = !waiting.is_empty() || claimed.iter().any(|pool| cluster.consolidation_hold(pool, &waiting).is_some());
        let fingerprint = cost::fingerprint(&pods, &cluster);
        if unsettled || *last == Some(fingerprint) {
            return;
        }
        *last = Some(fingerprint);
        // Images no pod annotation records are inspected (Archer's own word, not a tenant's).
        self.ctx.learn_platforms(&mut cluster, &pods).await;
        let policy = self.ctx.settings.preference_policy;
        let c = tokio::task::block_in_place(|| cost::comparison(&cluster, &pods, policy));
        cost::report_savings(&self.ctx.metrics.cost, &c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
