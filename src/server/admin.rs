//! The admin listener: `/healthz` (the process is alive), `/readyz` (ready to take reviews),
//! `/metrics` (Prometheus text format).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// What `/metrics` renders: the process's registry in the Prometheus text format.
pub trait Exposition: Send + Sync {
    fn encode(&self) -> String;
}

#[derive(Default)]
pub struct Health {
    ready: AtomicBool,
    reason: std::sync::Mutex<String>,
}

impl Health {
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    pub fn set_not_ready(&self, why: &str) {
        self.ready.store(false, Ordering::SeqCst);
        if let Ok(mut r) = self.reason.lock() {
            *r = why.to_string();
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
}

#[derive(Clone)]
struct AdminState {
    health: Arc<Health>,
    metrics: Arc<dyn Exposition>,
}

pub fn router(health: Arc<Health>, metrics: Arc<dyn Exposition>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { health, metrics })
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    if s.health.is_ready() {
        (StatusCode::OK, "ready".to_string())
    } else {
        let why = s.health.reason.lock().map(|r| r.clone()).unwrap_or_default();
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}"))
    }
}

async fn metrics_text(State(s): State<AdminState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode())
}
