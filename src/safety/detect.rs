//! Pods failing with an exec format error: learn, tell, re-place once.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::EvictParams;
use kube::runtime::events::EventType;
use kube::{Api, Resource};

use archer_core::exec_format::{exec_format_errors, ExecFormatError};
use archer_core::placement::DECISION_ANNOTATION;
use archer_core::safety_net::{on_exec_format_errors, Finding, Verdict};
use archer_metrics::{label, labels2};

use super::SafetyNet;

/// Failing pods handled at the same time.
const CONCURRENCY: usize = 8;
/// Pods handled are remembered (by uid) this many at most, so each is handled once.
const MAX_HANDLED: u64 = 100_000;
/// A PodDisruptionBudget refusing the eviction is asked again this often, this many times.
const EVICTION_RETRY: Duration = Duration::from_secs(5);
const EVICTION_ATTEMPTS: usize = 60;
/// Bound on resolving the digest of an image kubelet reported none for.
const DIGEST_LOOKUP: Duration = Duration::from_secs(10);

/// A pod Archer admitted, not going away, with a container failing for its architecture.
pub(super) fn failing(pod: &Pod) -> bool {
    let admitted = pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(DECISION_ANNOTATION));
    admitted && pod.metadata.deletion_timestamp.is_none() && !exec_format_errors(pod).is_empty()
}

impl SafetyNet {
    pub(super) async fn detect_loop(self: Arc<Self>, rx: tokio::sync::mpsc::Receiver<Pod>) {
        let handled: moka::sync::Cache<String, ()> =
            moka::sync::Cache::builder().max_capacity(MAX_HANDLED).time_to_live(Duration::from_secs(self.config.replacement_ttl_seconds)).build();
        let pods = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|p| (p, rx)) });
        pods.for_each_concurrent(CONCURRENCY, |pod| {
            let this = self.clone();
            let handled = handled.clone();
            async move {
                let Some(uid) = pod.metadata.uid.clone() else { return };
                if handled.contains_key(&uid) {
                    return;
                }
                // Marked first: a second event for the same pod while this one runs is skipped.
                handled.insert(uid.clone(), ());
                if !this.handle(&pod).await {
                    handled.invalidate(&uid);
                }
            }
        })
        .await;
    }

    /// Handle one failing pod; false when it should be tried again at its next change.
    #[tracing::instrument(skip_all, fields(pod = pod.metadata.name.as_deref().unwrap_or(""), namespace = pod.metadata.namespace.as_deref().unwrap_or(""), node = tracing::field::Empty, arch = tracing::field::Empty))]
    async fn handle(&self, pod: &Pod) -> bool {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let Some(arch) = self.cluster.node_arch(&node) else {
            tracing::warn!(%node, "exec format error on a node whose architecture is unknown; not learned");
            return false;
        };
        tracing::Span::current().record("node", node.as_str()).record("arch", arch.as_str());
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let errors = self.with_digests(pod, exec_format_errors(pod)).await;
        let policy = self.policy(&namespace);
        let (limits, now) = (self.config.limits(), super::unix_now());
        let finding = match self.cluster.safety_record().update(|r| on_exec_format_errors(pod, &arch, &errors, policy.replace_on_exec_format_error, r, now, &limits)).await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "could not record the exec format error; tried again at the pod's next change");
                return false;
            }
        };
        self.metrics.safety.exec_format_errors.get_or_create(&labels2("namespace", namespace.as_str(), "arch", arch.as_str())).inc();
        tracing::warn!(verdict = finding.verdict.as_str(), learned = finding.learned.len(), "exec format error: the image's binary does not run on this architecture");
        self.tell(pod, &arch, &node, &errors, &finding).await;
        let outcome = match finding.verdict {
            Verdict::Replace => self.evict(pod).await,
            skipped => skipped.as_str(),
        };
        self.metrics.safety.replacements.get_or_create(&label("outcome", outcome)).inc();
        true
    }

    /// Errors without the digest kubelet resolved get the one the registry gives the image now.
    async fn with_digests(&self, pod: &Pod, mut errors: Vec<ExecFormatError>) -> Vec<ExecFormatError> {
        if errors.iter().all(|e| e.digest.is_some()) {
            return errors;
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let keyring = crate::cluster::pod_keyring(Some(&self.cluster), &self.base_keyring, namespace, pod).await;
        for e in errors.iter_mut().filter(|e| e.digest.is_none()) {
            if let Ok(Ok(found)) = tokio::time::timeout(DIGEST_LOOKUP, self.inspector.inspect(&e.image, &keyring)).await {
                e.digest = Some(found.digest.clone());
            }
        }
        errors
    }

    /// The Event on the pod and on its owner.
    async fn tell(&self, pod: &Pod, arch: &str, node: &str, errors: &[ExecFormatError], finding: &Finding) {
        let what: Vec<String> = errors.iter().map(|e| format!("container {} (image {}, {})", e.container, e.image, e.digest.as_deref().unwrap_or("digest unknown"))).collect();
        let action = match finding.verdict {
            Verdict::Replace => format!("the pod is evicted once so its replacement is admitted without {arch}"),
            Verdict::Skip(_) => format!("the pod is left as it is ({})", finding.verdict.as_str().replace('_', " ")),
        };
        let note = format!("{} failed on {arch} node {node} with an exec format error: the binary is not for {arch}. Archer excludes {arch} for these digests from now on; {action}.", what.join(", "));
        let pod_ref = pod.object_ref(&());
        crate::cluster::events::post(&self.recorder, &pod_ref, EventType::Warning, "ExecFormatError", "Detected", &note).await;
        let owner = pod.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
        if let Some(o) = owner {
            let owner_ref = ObjectReference { api_version: Some(o.api_version.clone()), kind: Some(o.kind.clone()), name: Some(o.name.clone()), namespace: pod.metadata.namespace.clone(), uid: Some(o.uid.clone()), ..Default::default() };
            let pod_name = pod.metadata.name.as_deref().unwrap_or("");
            crate::cluster::events::post(&self.recorder, &owner_ref, EventType::Warning, "ExecFormatError", "Detected", &format!("pod {pod_name}: {note}")).await;
        }
    }

    /// Evict through the Eviction API (PodDisruptionBudgets hold), retried while a budget
    /// refuses; the outcome label.
    async fn evict(&self, pod: &Pod) -> &'static str {
        let (namespace, name) = (pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default());
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        for _ in 0..EVICTION_ATTEMPTS {
            match api.evict(&name, &EvictParams::default()).await {
                Ok(_) => {
                    self.metrics.pod_evictions.get_or_create(&label("reason", "exec_format_error")).inc();
                    tracing::info!("evicted: its replacement is admitted without this architecture");
                    return "evicted";
                }
                Err(kube::Error::Api(s)) if s.code == 404 => return "gone",
                Err(kube::Error::Api(s)) if s.code == 429 => tracing::debug!("eviction refused by a PodDisruptionBudget; retrying"),
                Err(e) => tracing::warn!(error = %e, "eviction failed; retrying"),
            }
            tokio::time::sleep(EVICTION_RETRY).await;
        }
        tracing::warn!("the pod could not be evicted in time (a PodDisruptionBudget?); it is left as it is");
        "eviction_refused"
    }
}
