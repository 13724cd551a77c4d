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
use kube::api::Patch;
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
/// Pods of one namespace tried in one round at most (those tried longest ago first), so a
/// namespace whose images never answer delays no other namespace's release.
const PER_NAMESPACE_PER_ROUND: usize = 4;

/// Whether the pod is held by Archer's gate.
fn carries_gate(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()).is_some_and(|g| g.iter().any(|g| g.name == GATE))
}

/// What is kept of one gated pod.
#[derive(Debug, Clone, Copy, Default)]
struct Held {
    /// The fail-closed Event was posted.
    warned: bool,
    /// The round it was last tried in.
    tried: u64,
}

/// The gated pods the watch has seen, by (namespace, name).
#[derive(Clone, Default)]
pub(super) struct Gated(Arc<Mutex<BTreeMap<(String, String), Held>>>);

impl Gated {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<(String, String), Held>) -> T) -> T {
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
                m.entry(key).or_default();
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

    /// The pods to try in round `round`: at most [`PER_NAMESPACE_PER_ROUND`] of each namespace,
    /// those tried longest ago first, the namespaces interleaved; each is marked tried.
    fn round(&self, round: u64) -> Vec<(String, String)> {
        self.with(|m| {
            type Tried<'a> = Vec<(u64, &'a (String, String))>;
            let mut by_namespace: BTreeMap<&str, Tried<'_>> = BTreeMap::new();
            for (key, held) in m.iter() {
                by_namespace.entry(key.0.as_str()).or_default().push((held.tried, key));
            }
            let mut picked: Vec<Vec<(String, String)>> = by_namespace
                .into_values()
                .map(|mut pods| {
                    pods.sort_by_key(|(tried, _)| *tried);
                    pods.into_iter().take(PER_NAMESPACE_PER_ROUND).map(|(_, k)| k.clone()).collect()
                })
                .collect();
            let mut out = Vec::new();
            for i in 0..PER_NAMESPACE_PER_ROUND {
                out.extend(picked.iter_mut().filter_map(|p| p.get(i).cloned()));
            }
            for key in &out {
                if let Some(h) = m.get_mut(key) {
                    h.tried = round;
                }
            }
            out
        })
    }

    /// Mark the fail-closed Event posted; true the first time.
    fn first_warning(&self, key: &(String, String)) -> bool {
        self.with(|m| m.get_mut(key).is_some_and(|h| !std::mem::replace(&mut h.warned, true)))
    }
}

fn seconds_since_created(pod: &Pod) -> f64 {
    let created = pod.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second());
    super::unix_now().saturating_sub(created).max(0) as f64
}

async fn apply(api: &Api<Pod>, name: &str, ops: &[Op]) -> Result<Pod, kube::Error> {
    let patch: json_patch::Patch = serde_json::from_slice(&patch::to_json(ops)).map_err(kube::Error::SerdeError)?;
    let params = archer_api::apply::patch_params();
    api.patch(name, &params, &Patch::<()>::Json(patch)).await
}

impl SafetyNet {
    pub(super) async fn gate_loop(self: Arc<Self>, gated: Gated) {
        let mut tick = tokio::time::interval(Duration::from_secs_f64(self.config.gate_retry_seconds));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for round in 1u64.. {
            tick.tick().await;
            futures::stream::iter(gated.round(round))
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
        if let Some(why) = self.not_decided(&pod, &key.0, &policy) {
            return self.release_undecided(gated, &api, &key, &pod, why).await;
        }
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
                self.metrics.gate_releases.get_or_create(&label("outcome", outcome)).inc();
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

impl SafetyNet {
    /// Why Archer does not decide this pod at all, as the webhook would not: its namespace is
    /// excluded, the pod opts out (`archer.dev/ignore`), or the namespace's mode is `off`.
    fn not_decided(&self, pod: &Pod, namespace: &str, policy: &archer_core::policy::Policy) -> Option<&'static str> {
        if self.excluded_namespaces.contains(namespace) {
            return Some("its namespace is excluded from Archer");
        }
        let ignored = pod.metadata.labels.as_ref().and_then(|l| l.get(archer_core::policy::IGNORE_LABEL)).is_some_and(|v| v == "true");
        if ignored {
            return Some("it carries archer.dev/ignore");
        }
        (policy.mode == archer_core::policy::Mode::Off).then_some("its namespace's mode is off")
    }

    /// Remove only the gate from a pod Archer does not decide: nothing else of it is touched.
    async fn release_undecided(&self, gated: &Gated, api: &Api<Pod>, key: &(String, String), pod: &Pod, why: &str) {
        let Some(ungate) = patch::remove_scheduling_gate(&mut pod.clone(), GATE) else { return };
        let result = match apply(api, &key.1, &ungate).await {
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            other => other.map(drop),
        };
        match result {
            Ok(()) => {
                gated.with(|m| m.remove(key));
                self.metrics.gate_releases.get_or_create(&label("outcome", "not_decided")).inc();
                tracing::info!(why, "gate removed from a pod Archer does not decide");
                let note = format!("Archer does not decide this pod ({why}): its scheduling gate {GATE} was removed and nothing else changed.");
                crate::cluster::events::post(&self.recorder, &pod.object_ref(&()), EventType::Normal, "NotDecided", "Released", &note).await;
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

#[cfg(test)]
mod tests {
    use super::{Gated, PER_NAMESPACE_PER_ROUND};

    fn gated_pod(namespace: &str, name: &str) -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": namespace}, "spec": {"containers": [], "schedulingGates": [{"name": "archer.dev/inspecting"}]}})).expect("pod")
    }

    #[test]
    fn a_namespace_of_unanswerable_pods_delays_no_other_namespaces_release() {
        let gated = Gated::default();
        for i in 0..1000 {
            gated.observe(&gated_pod("evil", &format!("stuck-{i:04}")));
        }
        gated.observe(&gated_pod("victim", "web"));
        let first = gated.round(1);
        assert_eq!(first.len(), PER_NAMESPACE_PER_ROUND + 1, "a round takes a few of each namespace");
        assert_eq!(first[0].0, "evil");
        assert_eq!(first[1], ("victim".to_string(), "web".to_string()), "the victim is tried in the first round, second in line");
        // Rounds go through the flood's pods, those tried longest ago first.
        let second = gated.round(2);
        assert!(second.iter().filter(|k| k.0 == "evil").all(|k| !first.contains(k)), "{second:?}");
        assert!(second.contains(&("victim".to_string(), "web".to_string())));
    }
}
