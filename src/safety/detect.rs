//! Pods failing with an exec format error: learn (for the pod's namespace, or for every
//! namespace when the image itself shows it), tell, re-place once.
//!
//! One tenant cannot hold the detector: failing pods wait in per-namespace queues taken in
//! turn ([`super::fair::FairQueue`]), a namespace handles at most [`SLOTS_PER_NAMESPACE`] pods at
//! once, and an eviction a PodDisruptionBudget refuses gives its slot back and is tried again
//! later from the eviction queue (also per namespace).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{DeleteParams, EvictParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Api, Resource};
use tokio::time::Instant;

use archer_core::exec_format::{exec_format_errors, in_log, quick_exits, ExecFormatError, LOG_TAIL_BYTES, LOG_TAIL_LINES};
use archer_core::placement::DECISION_ANNOTATION;
use archer_core::safety_net::{on_exec_format_errors, scope, unverifiable, Detection, Entrypoint, Finding, Verdict, MAX_RECORD_BYTES};
use archer_metrics::{label, labels2};

use super::fair::FairQueue;
use super::SafetyNet;

/// Container instances whose log tail was read (`<pod uid>/<container>/<instance>`): each is read
/// once, however often its pod changes.
type LogReads = moka::sync::Cache<String, ()>;

/// Failing pods handled at the same time, all namespaces together...
const CONCURRENCY: usize = 8;
/// ...and of one namespace.
pub(super) const SLOTS_PER_NAMESPACE: usize = 2;
/// Failing pods waiting, per namespace and in all (a pod dropped here is seen again at its next
/// status change: a crash-looping container changes its status at every restart).
pub(super) const QUEUE_PER_NAMESPACE: usize = 64;
pub(super) const QUEUE_TOTAL: usize = 1024;
/// Pods handled are remembered (by uid) this many at most, so each is handled once.
const MAX_HANDLED: u64 = 100_000;
/// A PodDisruptionBudget refusing the eviction: asked again this often, for this long.
const EVICTION_RETRY: Duration = Duration::from_secs(5);
const EVICTION_PATIENCE: Duration = Duration::from_secs(300);
/// Bound on resolving the digest of an image kubelet reported none for.
const DIGEST_LOOKUP: Duration = Duration::from_secs(10);
/// Outer bound on reading an image's entrypoint binary to verify a detection (the check keeps
/// its own deadline, 60 s, within it).
const VERIFY_LOOKUP: Duration = Duration::from_secs(70);

/// Bound on reading one quick exit's log tail, and on all of one pod's.
const LOG_READ: Duration = Duration::from_secs(10);
const LOG_READS_PER_POD: Duration = Duration::from_secs(15);

/// A pod Archer admitted, not going away, with a container failing for its architecture, or
/// exiting with an error at once (its log may say why: [`archer_core::exec_format::quick_exits`]).
pub(super) fn failing(pod: &Pod) -> bool {
    let admitted = pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(DECISION_ANNOTATION));
    admitted && pod.metadata.deletion_timestamp.is_none() && (!exec_format_errors(pod).is_empty() || !quick_exits(pod, super::unix_now()).is_empty())
}

/// An eviction waiting for its PodDisruptionBudget.
#[derive(Debug, Clone)]
pub(super) struct Eviction {
    namespace: String,
    name: String,
    uid: Option<String>,
    give_up: Instant,
    next: Instant,
}

fn ns_of(pod: &Pod) -> String {
    pod.metadata.namespace.clone().unwrap_or_default()
}

impl SafetyNet {
    /// Take failing pods from `queue` in turn by namespace, at most [`CONCURRENCY`] at once and
    /// [`SLOTS_PER_NAMESPACE`] of one namespace.
    pub(super) async fn detect_loop(self: Arc<Self>, queue: Arc<FairQueue<Pod>>, evictions: Arc<FairQueue<Eviction>>) {
        // Pods handled, and container instances whose log was read: each remembered as long.
        let remembered = || moka::sync::Cache::builder().max_capacity(MAX_HANDLED).time_to_live(Duration::from_secs(self.config.replacement_ttl_seconds)).build();
        let (handled, log_reads): (moka::sync::Cache<String, ()>, LogReads) = (remembered(), remembered());
        let workers = (0..CONCURRENCY).map(|_| {
            let (this, queue, evictions, handled, log_reads) = (self.clone(), queue.clone(), evictions.clone(), handled.clone(), log_reads.clone());
            async move {
                loop {
                    let (namespace, pod) = queue.take(SLOTS_PER_NAMESPACE).await;
                    if let Some(uid) = pod.metadata.uid.clone() {
                        // Marked first: a second event for the same pod while this one runs is skipped.
                        if !handled.contains_key(&uid) {
                            handled.insert(uid.clone(), ());
                            if !this.handle(&pod, &evictions, &log_reads).await {
                                handled.invalidate(&uid);
                            }
                        }
                    }
                    queue.done(&namespace);
                }
            }
        });
        futures::future::join_all(workers).await;
    }

    /// Handle one failing pod; false when it should be tried again at its next change.
    #[tracing::instrument(skip_all, fields(pod = pod.metadata.name.as_deref().unwrap_or(""), namespace = pod.metadata.namespace.as_deref().unwrap_or(""), node = tracing::field::Empty, arch = tracing::field::Empty))]
    async fn handle(&self, pod: &Pod, evictions: &FairQueue<Eviction>, log_reads: &LogReads) -> bool {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let Some(arch) = self.cluster.node_arch(&node) else {
            tracing::warn!(%node, "exec format error on a node whose architecture is unknown; not learned");
            return false;
        };
        tracing::Span::current().record("node", node.as_str()).record("arch", arch.as_str());
        let namespace = ns_of(pod);
        let mut errors = exec_format_errors(pod);
        if errors.is_empty() {
            // A quick exit: its log tail says whether the entrypoint failed to exec. Each
            // container instance's log is read once; the pod is not marked handled, so a later
            // failure of it (a runtime's StartError, another instance) is still seen.
            errors = self.read_logs(pod, log_reads).await;
            if errors.is_empty() {
                return false;
            }
        }
        let errors = self.with_digests(pod, errors).await;
        let detections = self.scoped(pod, &arch, errors).await;
        let policy = self.policy(&namespace);
        let (limits, now) = (self.config.limits(), super::unix_now());
        let update = self.cluster.safety_record().update(|r| {
            let finding = on_exec_format_errors(pod, &arch, &detections, policy.replace_on_exec_format_error, r, now, &limits);
            (finding, r.fit(MAX_RECORD_BYTES))
        });
        let (finding, dropped) = match update.await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "could not record the exec format error; tried again at the pod's next change");
                return false;
            }
        };
        self.metrics.record_entries_dropped.inc_by(dropped as u64);
        self.metrics.exec_format_errors.get_or_create(&labels2("namespace", namespace.as_str(), "arch", arch.as_str())).inc();
        for b in &finding.learned {
            self.metrics.learned.get_or_create(&label("scope", if b.verified { "cluster" } else { "namespace" })).inc();
        }
        tracing::warn!(verdict = finding.verdict.as_str(), learned = finding.learned.len(), "exec format error: the image's binary does not run on this architecture");
        self.tell(pod, &arch, &node, &detections, &finding).await;
        match finding.verdict {
            Verdict::Replace => {
                let now = Instant::now();
                let eviction = Eviction { namespace: namespace.clone(), name: pod.metadata.name.clone().unwrap_or_default(), uid: pod.metadata.uid.clone(), give_up: now + EVICTION_PATIENCE, next: now };
                if !evictions.push(&namespace, eviction) {
                    tracing::warn!("the eviction queue of this namespace is full; the pod is left as it is");
                    self.metrics.replacements.get_or_create(&label("outcome", "eviction_queue_full")).inc();
                }
            }
            skipped => {
                self.metrics.replacements.get_or_create(&label("outcome", skipped.as_str())).inc();
            }
        }
        true
    }

    /// Where each error's evidence holds: the image's entrypoint binary is read only when
    /// nothing the pod chose could have made the error.
    async fn scoped(&self, pod: &Pod, arch: &str, errors: Vec<ExecFormatError>) -> Vec<Detection> {
        let mut out = Vec::with_capacity(errors.len());
        for error in errors {
            let entrypoint = match unverifiable(pod, &error) {
                Some(_) => None,
                None => self.entrypoint(pod, &error, arch).await,
            };
            let scope = scope(pod, &error, arch, entrypoint.as_ref());
            tracing::info!(container = %error.container, image = %error.image, scope = scope.as_str(), why = scope.why(), "where the evidence holds");
            out.push(Detection { error, scope });
        }
        out
    }

    /// The failing image's entrypoint binary for `arch` as the registry holds it (the digest
    /// kubelet ran), or `None` when it could not be read within the bounds.
    async fn entrypoint(&self, pod: &Pod, error: &ExecFormatError, arch: &str) -> Option<Entrypoint> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let keyring = crate::cluster::pod_keyring(Some(&self.cluster), &self.base_keyring, namespace, pod).await;
        let checked = tokio::time::timeout(VERIFY_LOOKUP, self.inspector.entrypoint_machine(&error.image, error.digest.as_deref(), arch, &keyring)).await;
        let outcome = match &checked {
            Ok(Ok(check)) => check.outcome(),
            Ok(Err(_)) => "error",
            Err(_) => "timeout",
        };
        self.metrics.verifications.get_or_create(&label("outcome", outcome)).inc();
        match checked {
            Ok(Ok(archer_registry::EntrypointCheck::Machine { path, arch, .. })) => Some(Entrypoint { path, arch }),
            Ok(Ok(archer_registry::EntrypointCheck::Undetermined(why))) => {
                tracing::info!(image = %error.image, %why, "the image's entrypoint binary could not be read: the detection holds in its namespace only");
                None
            }
            Ok(Err(e)) => {
                tracing::info!(image = %error.image, error = %e, "the image's entrypoint binary could not be read: the detection holds in its namespace only");
                None
            }
            Err(_) => None,
        }
    }

    /// The exec format errors the log tails of the pod's quick exits show (runc's own line, in
    /// the container's log: evidence of the container's, as a termination message is).
    async fn read_logs(&self, pod: &Pod, log_reads: &LogReads) -> Vec<ExecFormatError> {
        let (namespace, name) = (ns_of(pod), pod.metadata.name.clone().unwrap_or_default());
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let deadline = Instant::now() + LOG_READS_PER_POD;
        let mut found = Vec::new();
        for exit in quick_exits(pod, super::unix_now()) {
            let key = format!("{uid}/{}/{}", exit.container, exit.instance);
            let left = deadline.saturating_duration_since(Instant::now());
            if log_reads.contains_key(&key) || left.is_zero() {
                continue;
            }
            let params = kube::api::LogParams { container: Some(exit.container.clone()), previous: exit.previous, tail_lines: Some(LOG_TAIL_LINES), limit_bytes: Some(LOG_TAIL_BYTES), ..Default::default() };
            let read = tokio::time::timeout(LOG_READ.min(left), api.logs(&name, &params)).await;
            if matches!(read, Ok(Ok(_))) {
                // A failed read is tried again at the pod's next change.
                log_reads.insert(key, ());
            }
            match read {
                Ok(Ok(log)) => match in_log(&exit, &log) {
                    Some(error) => found.push(error),
                    None => tracing::debug!(container = %exit.container, "a quick exit whose log says nothing of an exec format error"),
                },
                Ok(Err(e)) => tracing::info!(container = %exit.container, error = %e, "could not read the log of a container that exited at once"),
                Err(_) => tracing::info!(container = %exit.container, "reading the log of a container that exited at once timed out"),
            }
        }
        found
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
    async fn tell(&self, pod: &Pod, arch: &str, node: &str, detections: &[Detection], finding: &Finding) {
        let what: Vec<String> = detections
            .iter()
            .map(|d| {
                let e = &d.error;
                let scope = match d.scope {
                    archer_core::safety_net::Scope::Cluster => "for every namespace".to_string(),
                    other => format!("for this namespace only: {}", other.why()),
                };
                format!("container {} (image {}, {}; excluded {scope})", e.container, e.image, e.digest.as_deref().unwrap_or("digest unknown"))
            })
            .collect();
        let action = match finding.verdict {
            Verdict::Replace => format!("the pod is evicted once so its replacement is admitted without {arch}"),
            Verdict::Skip(_) => format!("the pod is left as it is ({})", finding.verdict.as_str().replace('_', " ")),
        };
        let note = format!("{} failed on {arch} node {node} with an exec format error: the binary is not for {arch}. Archer excludes {arch} for these digests; {action}.", what.join(", "));
        let pod_ref = pod.object_ref(&());
        crate::cluster::events::post(&self.recorder, &pod_ref, EventType::Warning, "ExecFormatError", "Detected", &note).await;
        let owner = pod.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
        if let Some(o) = owner {
            let owner_ref = ObjectReference { api_version: Some(o.api_version.clone()), kind: Some(o.kind.clone()), name: Some(o.name.clone()), namespace: pod.metadata.namespace.clone(), uid: Some(o.uid.clone()), ..Default::default() };
            let pod_name = pod.metadata.name.as_deref().unwrap_or("");
            crate::cluster::events::post(&self.recorder, &owner_ref, EventType::Warning, "ExecFormatError", "Detected", &format!("pod {pod_name}: {note}")).await;
        }
    }

    /// Carry out the evictions decided, in turn by namespace: each is one request (PodDisruption
    /// Budgets hold); one a budget refuses waits [`EVICTION_RETRY`] in the queue, holding no
    /// slot, until [`EVICTION_PATIENCE`] has passed.
    pub(super) async fn evict_loop(self: Arc<Self>, queue: Arc<FairQueue<Eviction>>) {
        let workers = (0..CONCURRENCY / 2).map(|_| {
            let (this, queue) = (self.clone(), queue.clone());
            async move {
                loop {
                    let (namespace, e) = queue.take(SLOTS_PER_NAMESPACE).await;
                    let wait = e.next.saturating_duration_since(Instant::now());
                    if !wait.is_zero() {
                        // Not due: back to the end of its namespace's line, and a pause so a
                        // queue of waiting evictions does not spin.
                        queue.done(&namespace);
                        if !queue.push(&namespace, e) {
                            this.metrics.replacements.get_or_create(&label("outcome", "eviction_queue_full")).inc();
                        }
                        tokio::time::sleep(wait.min(Duration::from_millis(500))).await;
                        continue;
                    }
                    let outcome = this.evict_once(&e).await;
                    queue.done(&namespace);
                    match outcome {
                        None if Instant::now() < e.give_up => {
                            if !queue.push(&namespace, Eviction { next: Instant::now() + EVICTION_RETRY, ..e }) {
                                this.metrics.replacements.get_or_create(&label("outcome", "eviction_queue_full")).inc();
                            }
                        }
                        None => {
                            tracing::warn!(namespace = %e.namespace, pod = %e.name, "the pod could not be evicted in time (a PodDisruptionBudget?); it is left as it is");
                            this.metrics.replacements.get_or_create(&label("outcome", "eviction_refused")).inc();
                        }
                        Some(outcome) => {
                            this.metrics.replacements.get_or_create(&label("outcome", outcome)).inc();
                        }
                    }
                }
            }
        });
        futures::future::join_all(workers).await;
    }

    /// One eviction request: the outcome label, or `None` to try again later.
    #[tracing::instrument(skip_all, fields(namespace = %e.namespace, pod = %e.name))]
    async fn evict_once(&self, e: &Eviction) -> Option<&'static str> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &e.namespace);
        // Only the pod that failed: a StatefulSet's replacement of the same name is another pod.
        let params = EvictParams { delete_options: Some(DeleteParams { preconditions: Some(Preconditions { uid: e.uid.clone(), resource_version: None }), ..Default::default() }), ..Default::default() };
        match api.evict(&e.name, &params).await {
            Ok(_) => {
                self.metrics.pod_evictions.get_or_create(&label("reason", "exec_format_error")).inc();
                tracing::info!("evicted: its replacement is admitted without this architecture");
                Some("evicted")
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Some("gone"),
            Err(kube::Error::Api(s)) if s.code == 429 => {
                tracing::debug!("eviction refused by a PodDisruptionBudget; tried again later");
                None
            }
            Err(err) => {
                tracing::warn!(error = %err, "eviction failed; tried again later");
                None
            }
        }
    }
}
