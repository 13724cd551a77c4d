//! A panic while answering a request is caught per request: the client gets HTTP 500 with a
//! JSON body saying so, `archer_panics_total{route}` counts it, and the connection lives on.
//! (Nothing on the request path should panic; this is the net under that promise.) The process
//! hook logs one line per panic, without capturing a backtrace.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use futures::FutureExt;

use archer_metrics::label;
use super::metrics::ServerMetrics;

/// The JSON body of every refusal Archer's listeners answer with.
#[derive(serde::Serialize)]
pub struct ErrorBody<'a> {
    pub error: &'a str,
    pub reason: &'a str,
}

/// Wrap every route of `router` so a panic in its handler is answered 500 and counted.
pub fn guard(router: Router, metrics: Arc<ServerMetrics>) -> Router {
    router.route_layer(axum::middleware::from_fn_with_state(metrics, catch))
}

async fn catch(State(metrics): State<Arc<ServerMetrics>>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    match AssertUnwindSafe(next.run(req)).catch_unwind().await {
        Ok(response) => response,
        Err(payload) => {
            metrics.panics.get_or_create(&label("route", route.clone())).inc();
            let what = message(payload.as_ref());
            tracing::error!(route, panic = what, "a request handler panicked; answered 500");
            let error = format!("archer failed while answering this request ({route}): internal error");
            (StatusCode::INTERNAL_SERVER_ERROR, Json(ErrorBody { error: &error, reason: "panic" })).into_response()
        }
    }
}

fn message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str)).unwrap_or("(no message)")
}

/// Replace the default panic hook (which may capture and symbolise a backtrace on every panic,
/// slow and loud on a request path) with one log line: message and location.
pub fn install_hook() {
    std::panic::set_hook(Box::new(|info| {
        let location = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        let what = message(info.payload());
        tracing::error!(panic = what, %location, "panic");
        if !tracing::dispatcher::has_been_set() {
            eprintln!("panic at {location}: {what}");
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::post;
    use tower::ServiceExt;

    #[tokio::test]
    async fn a_panicking_handler_is_answered_500_and_counted_by_route() {
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let router = Router::new()
            .route("/boom", post(|| async { if true { panic!("deliberate") } "never" }))
            .route("/fine", post(|| async { "ok" }));
        let router = guard(router, metrics.server.clone());
        let response = router.clone().oneshot(Request::post("/boom").body(Body::empty()).expect("request")).await.expect("answered");
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.expect("body");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json body");
        assert_eq!(v["reason"], "panic");
        assert_eq!(metrics.server.panics.get_or_create(&label("route", "/boom")).get(), 1);
        let ok = router.oneshot(Request::post("/fine").body(Body::empty()).expect("request")).await.expect("answered");
        assert_eq!(ok.status(), StatusCode::OK);
        assert!(metrics.encode().contains("archer_panics_total{route=\"/boom\"} 1"), "{}", metrics.encode());
    }
}
