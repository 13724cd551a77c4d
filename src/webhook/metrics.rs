//! The admission webhook's metric families, registered by the webhook into the registry it is
//! handed (names `archer_admission_*`, `archer_bad_requests`, `archer_policy_annotation_errors`).

use archer_metrics::label;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use archer_metrics::Labels;

/// The admission webhook's families.
pub struct WebhookMetrics {
    /// Admission reviews answered, by outcome (enforced, observed, denied, skipped, invalid, ...).
    pub admissions: Family<Labels, Counter>,
    pub admission_seconds: Histogram,
    /// Admission reviews answered with a decision remembered for a pod with the same inputs.
    pub admission_decisions_reused: Counter,
    /// Remembered answers a namespace's newer ones displaced at its share of the memo.
    pub admission_memo_displaced: Counter,
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
            admission_memo_displaced: Counter::default(),
            admission_outcomes: Default::default(),
            bad_requests: Family::default(),
            policy_warnings: Counter::default(),
        }
    }
}

impl WebhookMetrics {
    /// The families, registered into `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        m.register(registry);
        m
    }

    fn register(&self, r: &mut Registry) {
        r.register("admission_decisions_reused", "Admission reviews answered with the decision made for an earlier pod with the same inputs (a workload's replicas)", self.admission_decisions_reused.clone());
        r.register("admission_memo_displaced", "Remembered decisions a namespace's newer ones displaced at its share of the memo (webhook.decisionCacheMaxBytesPerNamespace)", self.admission_memo_displaced.clone());
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
