//! `POST /mutate`: decode the AdmissionReview, inspect the pod's images, call the core decision,
//! encode the answer. Every well-formed review gets HTTP 200 with allowed/denied; malformed input
//! gets HTTP 400 with a JSON error. Never a 500, never a panic.

mod key;
pub mod memo;
pub mod metrics;
mod review;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use k8s_openapi::api::core::v1::Pod;
use tracing::Instrument;

use crate::cluster::ClusterView;
use archer_core::placement::PlacementSettings;
use archer_core::policy::{self, Mode, PolicyDefaults};
use crate::server::body::{read_body, BodyError, BodyLimits};
use archer_metrics::label;
use metrics::WebhookMetrics;
use archer_registry::{Inspector, Keyring};
pub use memo::DecisionMemo;
pub use review::{decode, pod_view, Answer, ReviewError};

pub struct Webhook {
    pub defaults: PolicyDefaults,
    pub excluded_namespaces: BTreeSet<String>,
    pub settings: PlacementSettings,
    pub inspector: Inspector,
    /// `None` in standalone mode: cluster defaults for every namespace, no pull secrets.
    pub cluster: Option<ClusterView>,
    /// Credentials from a mounted docker config, for every namespace.
    pub base_keyring: Keyring,
    pub metrics: Arc<WebhookMetrics>,
    /// The body cap, read timeout and memory budget of `/mutate`.
    pub body: BodyLimits,
    /// Every review is answered within this long; images not inspected by then are failures.
    pub decision_timeout: std::time::Duration,
    /// Answers kept briefly for pods with the same inputs (a workload's replicas).
    pub memo: DecisionMemo,
    /// Gate mode's bound (`safetyNet.gateMaxSeconds`) when the safety net's gate controller runs;
    /// `None`: gate mode fails as enforce does.
    pub gate: Option<std::time::Duration>,
}

pub fn router(webhook: Arc<Webhook>) -> Router {
    Router::new().route("/mutate", post(mutate)).with_state(webhook)
}

/// A JSON error body with HTTP 400, counted by reason.
fn bad_request(metrics: &WebhookMetrics, reason: &'static str, message: String) -> Response {
    refuse(metrics, StatusCode::BAD_REQUEST, reason, message)
}

fn refuse(metrics: &WebhookMetrics, status: StatusCode, reason: &'static str, message: String) -> Response {
    metrics.bad_requests.get_or_create(&label("reason", reason)).inc();
    tracing::warn!(reason, detail = %message, "request refused");
    (status, Json(crate::server::ErrorBody { error: &message, reason })).into_response()
}

/// Bodies over the cap keep the documented HTTP 400; a slow body is 408, a spent budget 503.
fn body_refused(metrics: &WebhookMetrics, e: BodyError) -> Response {
    let status = match e {
        BodyError::TooLarge(_) | BodyError::Unreadable(_) => StatusCode::BAD_REQUEST,
        _ => e.status(),
    };
    refuse(metrics, status, e.reason(), e.to_string())
}

async fn mutate(State(w): State<Arc<Webhook>>, req: Request<Body>) -> Response {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + w.decision_timeout;
    // Held until the answer is built: the body, the decoded pod and the patch live that long.
    let (body, _budget) = match read_body(req, &w.body).await {
        Ok(b) => b,
        Err(e) => return body_refused(&w.metrics, e),
    };
    let request = match decode(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(&w.metrics, e.reason(), e.to_string()),
    };
    let (response, outcome) = review_pod(&w, &request, deadline).await;
    w.metrics.admission_seconds.observe(started.elapsed().as_secs_f64());
    // One line per review at debug: at the shipped level (info) a line for every pod made the
    // log the webhook's largest cost (a JSON line formatted and written to stderr per request,
    // issue #45); the outcome is counted in archer_admission_reviews_total and written to the
    // API server's audit log as the `decision` annotation, and denials and gates log at info.
    tracing::debug!(
        uid = %request.uid,
        namespace = request.namespace.as_deref().unwrap_or(""),
        outcome,
        allowed = response.answer().allowed,
        elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
        "admission review answered"
    );
    ([(axum::http::header::CONTENT_TYPE, "application/json")], response.to_json_for(&request.uid)).into_response()
}

/// Count the review under `outcome`, which it returns.
fn count(w: &Webhook, outcome: &'static str) -> &'static str {
    w.metrics.admission(outcome);
    outcome
}

/// The answer to one review and the outcome it is counted under.
async fn review_pod(w: &Webhook, req: &review::Request<'_>, deadline: tokio::time::Instant) -> (Reply, &'static str) {
    let allow = Answer::allow(&req.uid);
    let is_pod = req.kind.group.is_empty() && req.kind.version == "v1" && req.kind.kind == "Pod";
    if !is_pod || req.operation != "CREATE" || req.sub_resource.as_deref().is_some_and(|s| !s.is_empty()) {
        return (allow.into(), count(w, "skipped"));
    }
    let namespace = req.namespace.as_deref().unwrap_or_default();
    if w.excluded_namespaces.contains(namespace) {
        return (allow.into(), count(w, "excluded"));
    }
    let view = match req.object.map(|o| review::pod_view(o.get())) {
        Some(Ok(v)) => v,
        Some(Err(e)) => return (with_warnings(allow, vec![format!("archer could not decode the pod and left it unchanged: {e}")]).into(), count(w, "undecodable")),
        None => return (with_warnings(allow, vec!["archer got no pod object and left it unchanged".into()]).into(), count(w, "undecodable")),
    };
    review_view(w, view, req, namespace, allow, deadline).await
}

/// The pod's span, with every field when it is made: a field recorded later costs the JSON log
/// format a parse and a rewrite of the span's fields each time, per review (issue #45). The
/// outcome is in the debug line, the metric and the audit annotation instead.
fn admission_span(req: &review::Request<'_>, namespace: &str, pod: &str) -> tracing::Span {
    tracing::info_span!("admission", uid = req.uid.as_str(), namespace, pod, operation = req.operation.as_str(), dry_run = req.dry_run.unwrap_or(false))
}

/// A pod the webhook decides on: its policy, a remembered answer or a decision. A remembered
/// answer is given without the pod's span (making one was the largest part of what a reused
/// answer cost, issue #45): what it logs names the pod itself. Everything else runs in it.
async fn review_view(w: &Webhook, view: review::PodView<'_>, req: &review::Request<'_>, namespace: &str, allow: Answer, deadline: tokio::time::Instant) -> (Reply, &'static str) {
    if let Some(why) = view.too_large() {
        let _in = admission_span(req, namespace, view.name()).entered();
        let (answer, outcome) = undecided(w, namespace, allow, "too_large", why);
        return (answer.into(), outcome);
    }
    if view.ignored() {
        return (allow.into(), count(w, "excluded"));
    }
    let (policy, policy_warnings) = crate::cluster::namespace_policy(w.cluster.as_ref(), &w.defaults, namespace);
    if !policy_warnings.is_empty() {
        w.metrics.policy_warnings.inc_by(policy_warnings.len() as u64);
    }
    if policy.mode == Mode::Off {
        return (allow.into(), count(w, "off"));
    }
    // The replicas of one workload are decided once: the same inputs get the same answer.
    let key = if w.memo.enabled() && policy_warnings.is_empty() { view.memo_key(namespace, &policy) } else { None };
    // What the safety net learned changes decisions: answers from before it are not reused.
    let key = key.map(|mut k| {
        k.extend(w.cluster.as_ref().map_or(0, |c| c.safety_record().revision()).to_le_bytes());
        k
    });
    if let Some(found) = key.as_deref().and_then(|k| w.memo.get(k)) {
        return reused(w, found, req, namespace, view.name());
    }
    let span = admission_span(req, namespace, view.name());
    decide_view(w, view, namespace, &policy, policy_warnings, key, allow, deadline).instrument(span).await
}

/// A pod with no remembered answer: decoded within the memory budget, decided, and its answer
/// remembered when every image was inspected.
#[allow(clippy::too_many_arguments, reason = "the review's parts, passed on from review_view")]
async fn decide_view(
    w: &Webhook,
    view: review::PodView<'_>,
    namespace: &str,
    policy: &policy::Policy,
    policy_warnings: Vec<policy::PolicyWarning>,
    key: Option<Vec<u8>>,
    allow: Answer,
    deadline: tokio::time::Instant,
) -> (Reply, &'static str) {
    // The decoded pod's memory is reserved before it is built.
    let _decoded = match w.body.budget.reserve("webhook_pod", view.decoded_cost(), deadline).await {
        Ok(p) => p,
        Err(e) => {
            let (answer, outcome) = undecided(w, namespace, allow, "busy", format!("archer is at its memory budget: {e}"));
            return (answer.into(), outcome);
        }
    };
    let pod: Pod = match view.into_pod() {
        Ok(p) => p,
        Err(e) => return (with_warnings(allow, vec![format!("archer could not decode the pod and left it unchanged: {e}")]).into(), count(w, "undecodable")),
    };
    let (answer, outcome, inspected) = decide_pod(w, &pod, namespace, policy, policy_warnings, allow, deadline).await;
    count(w, outcome);
    if let (Some(key), true) = (key, inspected) {
        // Kept the second time these inputs are decided (a workload's second pod), without the
        // uid: each pod that reuses it gets its own. This pod is answered from the kept JSON
        // too, so its answer is written once, not twice (issue #45).
        if w.memo.seen_before(&key) {
            return (Reply::Kept(w.memo.insert(key, Answer { uid: String::new(), ..answer }, outcome)), outcome);
        }
    }
    (answer.into(), outcome)
}

/// Inspect the pod's images and decide: the answer, the outcome it is counted under, and
/// whether every image was inspected (only such answers may be reused). In gate mode a pod
/// whose images did not answer in time is held behind the scheduling gate instead.
async fn decide_pod(
    w: &Webhook,
    pod: &Pod,
    namespace: &str,
    policy: &policy::Policy,
    policy_warnings: Vec<policy::PolicyWarning>,
    allow: Answer,
    deadline: tokio::time::Instant,
) -> (Answer, &'static str, bool) {
    let deciding = crate::admission::Deciding { inspector: &w.inspector, cluster: w.cluster.as_ref(), base_keyring: &w.base_keyring, settings: &w.settings };
    let decided = crate::admission::decide(&deciding, pod, namespace, policy, deadline).await;
    let mut warnings: Vec<String> = policy_warnings.iter().map(ToString::to_string).collect();
    if policy.mode == Mode::Gate && decided.timed_out && w.gate.is_some() {
        return (gated(w, pod, allow, warnings), "gated", false);
    }
    let decision = decided.decision;
    warnings.extend(decision.warnings.iter().cloned());
    if let Some(message) = decision.denied {
        tracing::info!(reason = decision.outcome.as_str(), denial = %message, "pod denied");
        return (with_warnings(allow.deny(&message), warnings), "denied", decided.inspected);
    }
    let mut resp = with_warnings(allow, warnings).with_patch(&decision.patch);
    if let Some(p) = &decision.platforms {
        resp.audit_annotations.insert("platforms".into(), p.to_annotation());
    }
    resp.audit_annotations.insert("decision".into(), decision.outcome.as_str().into());
    (resp, decision.outcome.as_str(), decided.inspected)
}

/// Hold the pod behind `archer.dev/inspecting`: the safety net's gate controller finishes the
/// inspection and releases it (within `safetyNet.gateMaxSeconds`).
fn gated(w: &Webhook, pod: &Pod, allow: Answer, mut warnings: Vec<String>) -> Answer {
    // The gate is the only mark: the decision annotations are written when the pod is decided.
    let ops = archer_core::patch::add_scheduling_gate(&mut pod.clone(), archer_core::safety_net::GATE);
    let bound = w.gate.unwrap_or_default().as_secs();
    warnings.push(format!("archer is still inspecting the pod's images: it is held behind the scheduling gate {} until it has (at most {bound} s)", archer_core::safety_net::GATE));
    tracing::info!("images not inspected in time; pod gated");
    let mut resp = with_warnings(allow, warnings).with_patch(&ops);
    resp.audit_annotations.insert("decision".into(), "gated".into());
    resp
}

/// A remembered answer given to another pod with the same inputs: counted and logged as the
/// first one was, the log line naming the pod (it has no span).
fn reused(w: &Webhook, found: Arc<memo::Remembered>, req: &review::Request<'_>, namespace: &str, pod: &str) -> (Reply, &'static str) {
    w.metrics.admission_decisions_reused.inc();
    let outcome = count(w, found.outcome);
    if let Some((_, _, message)) = found.answer.status.as_ref().filter(|_| !found.answer.allowed) {
        tracing::info!(uid = %req.uid, namespace, pod, denial = %message, "pod denied (decision reused)");
    }
    (Reply::Kept(found), outcome)
}

/// The answer to one review: decided for it and not kept, or kept in the memo (decided for it,
/// or remembered from a pod with the same inputs), whose JSON was written when it was kept.
enum Reply {
    Own(Answer),
    Kept(Arc<memo::Remembered>),
}

impl Reply {
    fn answer(&self) -> &Answer {
        match self {
            Reply::Own(a) => a,
            Reply::Kept(r) => &r.answer,
        }
    }

    /// The answer's JSON for the review `uid` (a kept one was written when it was kept).
    fn to_json_for(&self, uid: &str) -> Vec<u8> {
        match self {
            Reply::Own(a) => a.to_json_for(uid),
            Reply::Kept(r) => r.wire.for_uid(uid).unwrap_or_else(|| r.answer.to_json_for(uid)),
        }
    }
}

impl From<Answer> for Reply {
    fn from(a: Answer) -> Self {
        Reply::Own(a)
    }
}

/// A pod Archer could not decide on (too large, or no memory to decode it): admitted unchanged
/// with a warning, or denied where the namespace's policy is `fail-closed`, so neither is a way
/// around a fail-closed namespace.
fn undecided(w: &Webhook, namespace: &str, allow: Answer, outcome: &'static str, why: String) -> (Answer, &'static str) {
    let (policy, _) = crate::cluster::namespace_policy(w.cluster.as_ref(), &w.defaults, namespace);
    if policy.mode == Mode::Off {
        return (allow, count(w, "off"));
    }
    if policy.on_inspection_failure == policy::FailurePolicy::FailClosed {
        tracing::info!(reason = outcome, %why, "pod denied");
        return (allow.deny(&format!("archer could not decide on the pod: {why}")), count(w, "denied"));
    }
    (with_warnings(allow, vec![format!("archer left the pod unchanged: {why}")]), count(w, outcome))
}

/// Warnings go back to the client (kubectl prints them); keep each within the API's 256 chars.
fn with_warnings(mut resp: Answer, warnings: Vec<String>) -> Answer {
    if warnings.is_empty() {
        return resp;
    }
    let clipped = warnings
        .into_iter()
        .map(|w| if w.len() > 250 { format!("{}…", &w[..w.floor_char_boundary(249)]) } else { w })
        .collect();
    resp.warnings.extend::<Vec<String>>(clipped);
    resp
}
