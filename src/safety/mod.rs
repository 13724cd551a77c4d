//! The runtime safety net (the replica holding the safety net's lease runs it):
//! - `detect`: pods Archer admitted that fail with an exec format error teach the shared record
//!   ([`crate::cluster::safety_record`]) the broken (digest, architecture) pair, get an Event on
//!   themselves and their owner, and are evicted once so their replacement is admitted with that
//!   architecture excluded (the pure rule: `archer_core::safety_net`);
//! - `gate`: pods the webhook held behind `archer.dev/inspecting` are inspected again, patched
//!   and released; past `safetyNet.gateMaxSeconds` the namespace's failure policy decides; on
//!   start every gated pod is swept the same way; `archer ungate --all` releases them all. Pods
//!   Archer does not decide (excluded namespaces, `archer.dev/ignore`, mode `off`) only lose the
//!   gate; namespaces are served in turn.
//!
//! One pod watch feeds both (no cache of pods is kept: each event is looked at and dropped).

mod detect;
mod fair;
mod gate;
pub mod metrics;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};

use crate::cluster::ClusterView;
use crate::config::SafetyNetConfig;
use archer_core::placement::PlacementSettings;
use archer_core::policy::{Policy, PolicyDefaults};
use metrics::SafetyNetMetrics;
use archer_registry::{Inspector, Keyring};

pub use gate::ungate_all;

use crate::cluster::unix_now;

/// Everything the safety net's controllers read and act with.
pub struct SafetyNet {
    pub client: Client,
    pub cluster: ClusterView,
    pub inspector: Inspector,
    pub base_keyring: Keyring,
    pub defaults: PolicyDefaults,
    pub settings: PlacementSettings,
    pub config: SafetyNetConfig,
    pub metrics: Arc<SafetyNetMetrics>,
    /// Namespaces Archer never decides (config `excludedNamespaces` and its own).
    excluded_namespaces: std::collections::BTreeSet<String>,
    recorder: Recorder,
}

impl SafetyNet {
    /// The safety net of `cluster` under `cfg`'s policy defaults, placement settings and
    /// `safetyNet` section.
    pub fn new(cluster: ClusterView, cfg: &crate::config::Config, inspector: Inspector, base_keyring: Keyring, metrics: Arc<SafetyNetMetrics>) -> Arc<Self> {
        let client = cluster.client().clone();
        let reporter = Reporter { controller: "archer-safety-net".into(), instance: std::env::var("POD_NAME").ok() };
        let recorder = Recorder::new(client.clone(), reporter);
        let (defaults, settings, config) = (cfg.defaults.clone(), cfg.placement_settings(), cfg.safety_net.clone());
        Arc::new(SafetyNet { client, cluster, inspector, base_keyring, defaults, settings, config, metrics, excluded_namespaces: cfg.excluded(), recorder })
    }

    /// The namespace's policy now.
    fn policy(&self, namespace: &str) -> Policy {
        crate::cluster::namespace_policy(Some(&self.cluster), &self.defaults, namespace).0
    }

    /// Watch every pod; hand failing ones to the detector and gated ones to the gate loop. Runs
    /// until the lease is lost (the caller drops it).
    pub async fn run(self: Arc<Self>) {
        let gated = gate::Gated::default();
        let failing = Arc::new(fair::FairQueue::<Pod>::new(detect::QUEUE_PER_NAMESPACE, detect::QUEUE_TOTAL));
        let evictions = Arc::new(fair::FairQueue::new(detect::QUEUE_PER_NAMESPACE, detect::QUEUE_TOTAL));
        let watch = watcher(Api::<Pod>::all(self.client.clone()), watcher::Config::default().any_semantic()).default_backoff().for_each(|event| {
            match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                    gated.observe(&pod);
                    if detect::failing(&pod) {
                        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
                        if !failing.push(&namespace, pod) {
                            self.metrics.detections_dropped.inc();
                            tracing::warn!(%namespace, "the detector is behind for this namespace; a failing pod waits for its next status change");
                        }
                    }
                }
                Ok(watcher::Event::Delete(pod)) => gated.forget(&pod),
                Ok(watcher::Event::Init) => gated.relist(),
                Ok(watcher::Event::InitDone) => {}
                Err(e) => tracing::warn!(error = %e, kind = "pod", "watch error; retrying"),
            }
            self.metrics.gated_pods.set(i64::try_from(gated.len()).unwrap_or(i64::MAX));
            futures::future::ready(())
        });
        tokio::select! {
            _ = watch => tracing::error!("the safety net's pod watch ended"),
            _ = self.clone().detect_loop(failing.clone(), evictions.clone()) => tracing::error!("the safety net's detector ended"),
            _ = self.clone().evict_loop(evictions.clone()) => tracing::error!("the safety net's evictions ended"),
            _ = self.clone().gate_loop(gated.clone()) => tracing::error!("the safety net's gate loop ended"),
        }
    }
}
