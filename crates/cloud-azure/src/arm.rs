//! A thin typed client for the few Azure Resource Manager operations Archer needs, on `reqwest`
//! (rustls with ring, like the rest of Archer). Why not the SDK: Azure publishes no Rust
//! management SDK for compute (`azure_resourcemanager_compute` is a placeholder,
//! `azure_mgmt_compute` unmaintained), and `azure_core` alone would bring a second HTTP pipeline
//! and TLS stack for seven requests. What ARM's protocol asks of a client is here:
//!
//! - a bearer token ([`crate::auth`]) on every request, sent only to the configured endpoint,
//!   which must be `https` (or loopback);
//! - `api-version` on every request; pages followed through `nextLink` (same origin only);
//! - long-running operations polled through `Azure-AsyncOperation` (else `Location`) until
//!   `Succeeded`, `Failed` or `Canceled`, at the `Retry-After` it asks for;
//! - errors read from ARM's `{"error": {"code", "message"}}`;
//! - throttling (429) and server errors (5xx) retried a few times, after `Retry-After`.
//!
//! Every answer is read up to [`crate::wire::MAX_BODY`] bytes; a longer one is an error, never a
//! buffer.

use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::auth::Credential;
pub use crate::wire::ArmError;
use crate::wire::{error_chain, read_limited};

/// Attempts of a request answered 429 or 5xx (or not answered).
const ATTEMPTS: u32 = 4;
/// The longest wait between attempts or polls, whatever `Retry-After` says.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// Pages followed at most (`nextLink`), against a server that never stops.
const MAX_PAGES: usize = 1000;

/// ARM's error body (`CloudError`).
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error: Option<ErrorDetail>,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorDetail {
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: String,
}

/// An operation's status (what `Azure-AsyncOperation` answers).
#[derive(Debug, Deserialize)]
struct OperationStatus {
    #[serde(default)]
    status: String,
    #[serde(default)]
    error: Option<ErrorDetail>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page<T> {
    #[serde(default = "Vec::new")]
    value: Vec<T>,
    #[serde(default)]
    next_link: Option<String>,
}

/// An answer: status, headers, body.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

pub struct Arm {
    http: reqwest::Client,
    endpoint: reqwest::Url,
    credential: Credential,
}

impl Arm {
    pub fn new(http: reqwest::Client, endpoint: &str, credential: Credential) -> Result<Self, ArmError> {
        // The bearer token goes with every request: https (or loopback) only.
        archer_cloud::settings::token_endpoint("provisioner.azure.endpoint", endpoint).map_err(ArmError::Auth)?;
        let endpoint = reqwest::Url::parse(endpoint).map_err(|e| ArmError::Decode(format!("endpoint {endpoint:?}: {e}")))?;
        Ok(Arm { http, endpoint, credential })
    }

    /// GET a resource; `None` when it does not exist (404).
    pub async fn get<T: DeserializeOwned>(&self, path: &str, api_version: &str) -> Result<Option<T>, ArmError> {
        let a = self.call(Method::GET, &self.url(path, api_version)?, None).await?;
        if a.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let a = ok(a)?;
        decode(&a.body).map(Some)
    }

    /// Every item of a list, page after page.
    pub async fn list<T: DeserializeOwned>(&self, path: &str, api_version: &str) -> Result<Vec<T>, ArmError> {
        let mut url = self.url(path, api_version)?;
        let mut out = Vec::new();
        for _ in 0..MAX_PAGES {
            let page: Page<T> = decode(&ok(self.call(Method::GET, &url, None).await?)?.body)?;
            out.extend(page.value);
            match page.next_link.filter(|l| !l.is_empty()) {
                Some(next) => url = self.same_origin(&next)?,
                None => return Ok(out),
            }
        }
        Err(ArmError::Decode(format!("more than {MAX_PAGES} pages from {path}")))
    }

    /// PUT a resource and wait (up to `timeout`) for ARM to finish making it; then its state.
    pub async fn put<B: Serialize, T: DeserializeOwned>(&self, path: &str, api_version: &str, body: &B, timeout: Duration) -> Result<T, ArmError> {
        let body = serde_json::to_vec(body).map_err(|e| ArmError::Decode(e.to_string()))?;
        let url = self.url(path, api_version)?;
        let a = ok(self.call(Method::PUT, &url, Some(body)).await?)?;
        self.wait(&a, path, timeout).await?;
        if let Some(t) = self.get(path, api_version).await? {
            return Ok(t);
        }
        Err(ArmError::Decode(format!("{path} was made but is not there")))
    }

    /// DELETE a resource and wait (up to `timeout`) for it to go; one already gone is not an error.
    pub async fn delete(&self, path: &str, api_version: &str, timeout: Duration) -> Result<(), ArmError> {
        let a = self.call(Method::DELETE, &self.url(path, api_version)?, None).await?;
        if a.status == StatusCode::NOT_FOUND || a.status == StatusCode::NO_CONTENT {
            return Ok(());
        }
        let a = ok(a)?;
        self.wait(&a, path, timeout).await
    }

    /// Poll a long-running operation until it ends; `Failed` and `Canceled` are errors with the
    /// operation's own code (`AllocationFailed`, ...).
    async fn wait(&self, first: &Answer, what: &str, timeout: Duration) -> Result<(), ArmError> {
        let header = |name: &str| first.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let (poll, via_location) = match (header("azure-asyncoperation"), header("location")) {
            (Some(p), _) => (p, false),
            (None, Some(p)) => (p, true),
            (None, None) => return Ok(()),
        };
        let url = self.same_origin(&poll)?;
        let deadline = Instant::now() + timeout;
        let mut wait = retry_after(&first.headers).unwrap_or(Duration::from_secs(1));
        loop {
            if Instant::now() + wait > deadline {
                return Err(ArmError::Timeout(what.to_string()));
            }
            tokio::time::sleep(wait).await;
            let a = self.call(Method::GET, &url, None).await?;
            wait = retry_after(&a.headers).unwrap_or(Duration::from_secs(1));
            if via_location {
                // The Location protocol: 202 while running, then the final answer (or an error).
                if a.status == StatusCode::ACCEPTED {
                    continue;
                }
                ok(a)?;
                return Ok(());
            }
            let status: OperationStatus = decode(&ok(a)?.body)?;
            match status.status.as_str() {
                "Succeeded" => return Ok(()),
                "Failed" | "Canceled" => {
                    let e = status.error.unwrap_or_default();
                    let code = if e.code.is_empty() { format!("Operation{}", status.status) } else { e.code };
                    return Err(ArmError::Service { status: 200, code, message: e.message });
                }
                _ => {}
            }
        }
    }

    fn url(&self, path: &str, api_version: &str) -> Result<reqwest::Url, ArmError> {
        let mut url = self.endpoint.join(path.trim_start_matches('/')).map_err(|e| ArmError::Decode(format!("{path}: {e}")))?;
        url.query_pairs_mut().append_pair("api-version", api_version);
        Ok(url)
    }

    /// A URL ARM handed back (a next page, an operation to poll), if it is on ARM's own origin:
    /// the token goes nowhere else.
    fn same_origin(&self, link: &str) -> Result<reqwest::Url, ArmError> {
        let url = reqwest::Url::parse(link).map_err(|e| ArmError::Decode(format!("link {link:?}: {e}")))?;
        if url.origin() != self.endpoint.origin() {
            return Err(ArmError::Decode(format!("link to another origin refused: {}", url.origin().ascii_serialization())));
        }
        Ok(url)
    }

    /// One request, retried on throttling, server errors and failed connections.
    async fn call(&self, method: Method, url: &reqwest::Url, body: Option<Vec<u8>>) -> Result<Answer, ArmError> {
        let mut last = ArmError::Transport("no attempt".into());
        for attempt in 0..ATTEMPTS {
            let token = self.credential.token().await?;
            let mut req = self.http.request(method.clone(), url.clone()).header(AUTHORIZATION, format!("Bearer {token}"));
            if let Some(b) = &body {
                req = req.header(CONTENT_TYPE, "application/json").body(b.clone());
            }
            let wait = match req.send().await {
                Ok(resp) => {
                    let status = resp.status();
                    let headers = resp.headers().clone();
                    let body = read_limited(resp).await?;
                    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
                        return Ok(Answer { status, headers, body });
                    }
                    last = service_error(status, &body);
                    retry_after(&headers).unwrap_or(Duration::from_secs(1 << attempt))
                }
                Err(e) => {
                    last = ArmError::Transport(error_chain(&e));
                    Duration::from_secs(1 << attempt)
                }
            };
            if attempt + 1 < ATTEMPTS {
                tracing::debug!(%method, url = %url.path(), error = %last, "Azure Resource Manager request retried");
                tokio::time::sleep(wait).await;
            }
        }
        Err(last)
    }
}

/// The answer if it is a success, else ARM's error in it.
fn ok(a: Answer) -> Result<Answer, ArmError> {
    if a.status.is_success() {
        Ok(a)
    } else {
        Err(service_error(a.status, &a.body))
    }
}

fn service_error(status: StatusCode, body: &[u8]) -> ArmError {
    let detail = serde_json::from_slice::<ErrorBody>(body).ok().and_then(|b| b.error).unwrap_or_default();
    let code = if detail.code.is_empty() { status.canonical_reason().unwrap_or("Error").replace(' ', "") } else { detail.code };
    let message: String = detail.message.chars().take(512).collect();
    ArmError::Service { status: status.as_u16(), code, message }
}

fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ArmError> {
    serde_json::from_slice(body).map_err(|e| ArmError::Decode(e.to_string()))
}

/// `Retry-After` in seconds, at most [`MAX_WAIT`] and at least 50 ms.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let secs: f64 = headers.get(RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs_f64(secs.clamp(0.05, MAX_WAIT.as_secs_f64())))
}
