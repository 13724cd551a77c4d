//! Pods held behind `archer.dev/inspecting`: inspected again every `gateRetrySeconds`, patched
//! and released once their images answer; past `gateMaxSeconds` (counted from the pod's
//! creation, so pods gated before a restart are swept the same way) the namespace's failure
//! policy decides:
//! - `fail-open`: released as a fail-open admission would have left it (unpatched, or pinned to
//!   the fallback architecture), with a Warning Event;
//! - `fail-closed`: it stays held, as a fail-closed admission would not have let it in, until
//!   its images answer (one Warning Event says so; `archer ungate --all` releases it by hand).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, Client, Resource};

use archer_core::patch::{self, Op};
use archer_core::safety_net::GATE;
use archer_metrics::label;

use super::SafetyNet;

/// Gated pods inspected at the same time.
const CONCURRENCY: usize = 8;
/// Gated pods tracked at most; beyond it the newest wait until tracked ones are released.
const MAX_TRACKED: usize = 100_000;

/// Whether the pod is held by Archer's gate.
fn carries_gate(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()).is_some_and(|g| g.iter().any(|g| g.name == GATE))
}

/// The gated pods the watch has seen: (namespace, name) -> whether the fail-closed Event was posted.
#[derive(Clone, Default)]
pub(super) struct Gated(Arc<Mutex<BTreeMap<(String, String), bool>>>);

impl Gated {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<(String, String), bool>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn key(pod: &Pod) -> (String, String) {
        (pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default())
    }

    pub(super) fn observe(&self, pod: &Pod) {
        let key = Self::key(pod);
        let held = carries_gate(pod) && pod.metadata.deletion_timestamp.is_none();
        self.with(|m| {
            if !held {
                m.remove(&key);
            } else if m.len() < MAX_TRACKED || m.contains_key(&key) {
                m.entry(key).or_insert(false);
            }
        });
    }

    pub(super) fn forget(&self, pod: &Pod) {
        self.with(|m| m.remove(&Self::key(pod)));
    }

    /// A relist starts: what it lists is what is gated.
    pub(super) fn relist(&self) {
        self.with(BTreeMap::clear);
    }

    pub(super) fn len(&self) -> usize {
        self.with(|m| m.len())
    }

    fn keys(&self) -> Vec<(String, String)> {
        self.with(|m| m.keys().cloned().collect())
    }

    /// Mark the fail-closed Event posted; true the first time.
    fn first_warning(&self, key: &(String, String)) -> bool {
        self.with(|m| m.get_mut(key).is_some_and(|warned| !std::mem::replace(warned, true)))
    }
}

fn seconds_since_created(pod: &Pod) -> f64 {
    let created = pod.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second());
    super::unix_now().saturating_sub(created).max(0) as f64
}

async fn apply(api: &Api<Pod>, name: &str, ops: &[Op]) -> Result<Pod, kube::Error> {
    let patch: json_patch::Patch = serde_json::from_slice(&patch::to_json(ops)).map_err(kube::Error::SerdeError)?;
    let params = PatchParams { field_manager: Some("archer-safety-net".into()), ..Default::default() };
    api.patch(name, &params, &Patch::<()>::Json(patch)).await
}

impl SafetyNet {
    pub(super) async fn gate_loop(self: Arc<Self>, gated: Gated) {
        let mut tick = tokio::time::interval(Duration::from_secs_f64(self.config.gate_retry_seconds));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            futures::stream::iter(gated.keys())
                .for_each_concurrent(CONCURRENCY, |key| {
                    let (this, gated) = (self.clone(), gated.clone());
                    async move { this.try_release(&gated, key).await }
                })
                .await;
        }
    }

    /// One attempt at a gated pod: inspect, then release it decided, or past the bound under the
    /// failure policy, or leave it for the next tick.
    #[tracing::instrument(skip_all, fields(namespace = %key.0, pod = %key.1))]
    async fn try_release(&self, gated: &Gated, key: (String, String)) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.0);
        let pod = match api.get_opt(&key.1).await {
            Ok(Some(p)) if carries_gate(&p) => p,
            Ok(_) => {
                gated.with(|m| m.remove(&key));
                return;
            }
            Err(e) => return tracing::warn!(error = %e, "could not read the gated pod; tried again"),
        };
        let policy = self.policy(&key.0);
        let deciding = crate::admission::Deciding { inspector: &self.inspector, cluster: Some(&self.cluster), base_keyring: &self.base_keyring, settings: &self.settings };
        let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(self.config.gate_inspection_timeout_seconds);
        let decided = crate::admission::decide(&deciding, &pod, &key.0, &policy, deadline).await;
        let held_for = seconds_since_created(&pod);
        if decided.timed_out && held_for < self.config.gate_max_seconds {
            return tracing::debug!(held_for, "images still not inspected; the pod stays gated");
        }
        let pod_ref = pod.object_ref(&());
        if let Some(why) = &decided.decision.denied {
            if gated.first_warning(&key) {
                let note = format!("{why}. The namespace is fail-closed: the pod stays held until its images can be inspected (archer ungate --all releases it by hand).");
                crate::cluster::events::post(&self.recorder, &pod_ref, EventType::Warning, "InspectionFailed", "Holding", &note).await;
            }
            return tracing::info!(%why, "fail-closed: the pod stays gated");
        }
        let outcome = if decided.timed_out { "bound" } else { "decided" };
        let mut working = pod.clone();
        let Some(ungate) = patch::remove_scheduling_gate(&mut working, GATE) else { return };
        let mut ops = decided.decision.patch.clone();
        ops.extend(ungate.iter().cloned());
        let note = match outcome {
            "decided" => format!("images inspected after {held_for:.0} s: placement decided ({}) and the gate removed", decided.decision.outcome.as_str()),
            _ => format!("images not inspected within {:.0} s: released under the namespace's fail-open policy ({})", self.config.gate_max_seconds, decided.decision.warnings.join("; ")),
        };
        let result = match apply(&api, &key.1, &ops).await {
            Err(kube::Error::Api(s)) if s.code == 422 => {
                // The API refused the placement change on this pod (a gated pod's affinity may
                // only narrow): released as it is rather than held.
                tracing::warn!(error = %s.message, "the placement patch was refused; releasing the pod unpatched");
                apply(&api, &key.1, &ungate).await
            }
            other => other,
        };
        match result {
            Ok(_) => {
                gated.with(|m| m.remove(&key));
                self.metrics.safety.gate_releases.get_or_create(&label("outcome", outcome)).inc();
                tracing::info!(outcome, held_for, "gate removed");
                let kind = if outcome == "decided" { EventType::Normal } else { EventType::Warning };
                crate::cluster::events::post(&self.recorder, &pod_ref, kind, if outcome == "decided" { "Inspected" } else { "InspectionTimedOut" }, "Released", &note).await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                gated.with(|m| m.remove(&key));
            }
            Err(e) => tracing::warn!(error = %e, "could not release the gated pod; tried again"),
        }
    }
}

/// Remove Archer's gate from every pod that carries it (Helm's pre-delete hook runs this as
/// `archer ungate --all`, so uninstalling Archer leaves no pod held). Returns how many.
pub async fn ungate_all(client: Client) -> Result<usize, kube::Error> {
    let mut released = 0;
    let mut pages = std::pin::pin!(crate::cluster::pages(Api::<Pod>::all(client.clone())));
    while let Some(page) = pages.next().await {
        for pod in page?.iter().filter(|p| carries_gate(p)) {
            let (namespace, name) = Gated::key(pod);
            let Some(ops) = patch::remove_scheduling_gate(&mut pod.clone(), GATE) else { continue };
            match apply(&Api::namespaced(client.clone(), &namespace), &name, &ops).await {
                Ok(_) => released += 1,
                Err(e) => tracing::warn!(%namespace, pod = %name, error = %e, "could not remove the gate"),
            }
        }
    }
    Ok(released)
}
