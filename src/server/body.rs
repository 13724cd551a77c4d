//! Reading a request body within a byte cap, a time limit and the memory budget.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use bytes::BytesMut;
use http_body_util::BodyExt;
use tokio::time::Instant;

use archer_limits::{BudgetError, MemoryBudget, MemoryPermit};

/// How one route reads its bodies.
#[derive(Debug, Clone)]
pub struct BodyLimits {
    /// Largest body accepted.
    pub max_bytes: usize,
    /// The budget is charged this many times the body's size: what the handler builds from the
    /// body (parsed objects, the answer) lives as long as the body does.
    pub expansion: usize,
    /// The whole body must arrive within this long.
    pub read_timeout: Duration,
    /// How long a request may wait for room in the budget before it is refused.
    pub budget_wait: Duration,
    pub budget: MemoryBudget,
    /// The metric label of this consumer of the budget.
    pub consumer: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("request body exceeds the {0}-byte limit")]
    TooLarge(usize),
    #[error("the request body did not arrive within {0:?}")]
    Timeout(Duration),
    #[error("reading the request body: {0}")]
    Unreadable(String),
    #[error("server busy: {0}")]
    Budget(#[from] BudgetError),
}

impl BodyError {
    /// The metric label of the failure.
    pub fn reason(&self) -> &'static str {
        match self {
            BodyError::TooLarge(_) => "body_too_large",
            BodyError::Timeout(_) => "body_timeout",
            BodyError::Unreadable(_) => "body_unreadable",
            BodyError::Budget(_) => "memory_budget",
        }
    }

    /// The HTTP status of the failure.
    pub fn status(&self) -> StatusCode {
        match self {
            BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            BodyError::Unreadable(_) => StatusCode::BAD_REQUEST,
            BodyError::Budget(BudgetError::Larger { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::Budget(BudgetError::Exhausted { .. }) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// Read the body of `req` within `limits`. The returned permit holds the body's share of the
/// memory budget; keep it until the answer has been built.
pub async fn read_body(req: Request<Body>, limits: &BodyLimits) -> Result<(bytes::Bytes, MemoryPermit), BodyError> {
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<usize>().ok());
    if declared.is_some_and(|l| l > limits.max_bytes) {
        return Err(BodyError::TooLarge(limits.max_bytes));
    }
    let deadline = Instant::now() + limits.read_timeout;
    let budget_until = Instant::now() + limits.budget_wait.min(limits.read_timeout);
    let charge = |bytes: usize| bytes.saturating_mul(limits.expansion.max(1));
    // A declared length is reserved whole before reading, so concurrent bodies cannot each hold
    // part of the budget while waiting for the rest.
    let mut permit = match declared {
        Some(len) => limits.budget.reserve(limits.consumer, charge(len), budget_until).await?,
        None => MemoryPermit::default(),
    };
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0));
    let mut body = req.into_body();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(BodyError::Timeout(limits.read_timeout)),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BodyError::Unreadable(e.to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else { continue };
        if buf.len() + data.len() > limits.max_bytes {
            return Err(BodyError::TooLarge(limits.max_bytes));
        }
        if declared.is_none_or(|l| buf.len() + data.len() > l) {
            // Undeclared (or longer than declared): reserve as it arrives.
            let extra = charge(buf.len() + data.len()).saturating_sub(permit.bytes());
            permit.absorb(limits.budget.reserve(limits.consumer, extra, budget_until).await?);
        }
        buf.extend_from_slice(&data);
    }
    // A body read as it came (no length declared, or a wrong one) may sit in a buffer up to
    // twice its size: it is copied out at its size (the charge covers both for the moment).
    if buf.capacity() > buf.len() + buf.len() / 8 {
        return Ok((bytes::Bytes::copy_from_slice(&buf), permit));
    }
    Ok((buf.freeze(), permit))
}

/// A response body that keeps `permit` until the body has been sent (or the connection has
/// gone): an answer the handler built is memory until the client has read it, and a client that
/// reads slowly must not let the handler's share of the budget go to the next request meanwhile.
/// The server asks for the next chunk only once it has written out most of the last one (it
/// buffers only so much), so the permit goes at that second ask, or when the body is dropped.
/// The body's length is not announced: set `Content-Length` to `bytes`' length.
pub fn held_body(bytes: bytes::Bytes, permit: MemoryPermit) -> Body {
    let chunks = futures::stream::unfold((Some(bytes), Some(permit)), |(data, permit)| async move {
        match data {
            Some(d) => Some((Ok::<_, std::convert::Infallible>(d), (None, permit))),
            None => {
                drop(permit);
                None
            }
        }
    });
    Body::from_stream(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(budget: &MemoryBudget, max: usize) -> BodyLimits {
        BodyLimits {
            max_bytes: max,
            expansion: 2,
            read_timeout: Duration::from_millis(300),
            budget_wait: Duration::from_millis(50),
            budget: budget.clone(),
            consumer: "test",
        }
    }

    fn request(body: Body, len: Option<usize>) -> Request<Body> {
        let mut b = Request::post("/");
        if let Some(l) = len {
            b = b.header(header::CONTENT_LENGTH, l);
        }
        b.body(body).expect("request")
    }

    #[tokio::test]
    async fn bodies_are_charged_with_their_expansion_and_given_back() {
        let budget = MemoryBudget::new(64 * 1024);
        let (bytes, permit) = read_body(request(Body::from(vec![b'x'; 10_000]), Some(10_000)), &limits(&budget, 1 << 20)).await.expect("body");
        assert_eq!(bytes.len(), 10_000);
        assert!(permit.bytes() >= 20_000 && budget.in_use_bytes() == permit.bytes());
        drop(permit);
        assert_eq!(budget.in_use_bytes(), 0);
        // Undeclared length (a stream): charged as it arrives.
        let chunks = futures::stream::iter((0..4).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'y'; 5000]))));
        let (bytes, permit) = read_body(request(Body::from_stream(chunks), None), &limits(&budget, 1 << 20)).await.expect("stream");
        assert_eq!((bytes.len(), permit.bytes() >= 40_000), (20_000, true));
    }

    #[tokio::test]
    async fn too_large_slow_and_over_budget_bodies_are_refused() {
        let budget = MemoryBudget::new(64 * 1024);
        let e = read_body(request(Body::from(vec![0u8; 100]), Some(100)), &limits(&budget, 10)).await.expect_err("declared too large");
        assert_eq!(e.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let e = read_body(request(Body::from(vec![0u8; 100]), None), &limits(&budget, 10)).await.expect_err("streamed too large");
        assert_eq!(e.reason(), "body_too_large");
        let stalled = futures::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
        let e = read_body(request(Body::from_stream(stalled), None), &limits(&budget, 100)).await.expect_err("stalled");
        assert_eq!((e.reason(), e.status()), ("body_timeout", StatusCode::REQUEST_TIMEOUT));
        let held = budget.reserve("other", 60 * 1024, Instant::now()).await.expect("hold");
        let e = read_body(request(Body::from(vec![0u8; 4096]), Some(4096)), &limits(&budget, 1 << 20)).await.expect_err("spent");
        assert_eq!((e.reason(), e.status()), ("memory_budget", StatusCode::SERVICE_UNAVAILABLE));
        drop(held);
        assert!(read_body(request(Body::from(vec![0u8; 4096]), Some(4096)), &limits(&budget, 1 << 20)).await.is_ok());
    }

    #[tokio::test]
    async fn an_answer_holds_its_share_until_it_has_been_read_or_dropped() {
        let budget = MemoryBudget::new(64 * 1024);
        let permit = budget.reserve("t", 8 * 1024, Instant::now()).await.expect("room");
        let body = held_body(bytes::Bytes::from(vec![b'a'; 5000]), permit);
        assert_eq!(budget.in_use_bytes(), 8 * 1024, "held while the answer is unread");
        let read = body.collect().await.expect("body").to_bytes();
        assert_eq!((read.len(), budget.in_use_bytes()), (5000, 0));
        // An answer never read (the client went away) gives its share back when dropped.
        let permit = budget.reserve("t", 8 * 1024, Instant::now()).await.expect("room");
        drop(held_body(bytes::Bytes::from_static(b"x"), permit));
        assert_eq!(budget.in_use_bytes(), 0);
    }
}
