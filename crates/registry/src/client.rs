//! The distribution-protocol client: manifest and config-blob reads with the token/basic auth
//! dance, size caps, digest checks, 429 back-off, mirrors, and every hop through the address guard.
//!
//! HTTP, TLS and DNS are reqwest's; what is here is the protocol steps Archer needs (two GETs),
//! written against reqwest's resolver and redirect hooks so the guard cannot be bypassed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use reqwest::header::{HeaderMap, ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use reqwest::{redirect, StatusCode};
use serde::Deserialize;
use sha2::{Digest, Sha256, Sha512};
use tokio::time::Instant;
use url::Url;

use super::credentials::Credential;
use super::error::RegistryError;
use super::guard::{AddressGuard, GuardedResolver, MAX_REDIRECTS};
use super::hosts::RegistryHosts;
use super::reference::{api_host, ImageRef};
use archer_core::platform::{Platform, PlatformSet};
use archer_limits::{MemoryBudget, MemoryPermit};

/// What the budget is charged per registry byte read: the bytes, and the document parsed from them.
const REGISTRY_EXPANSION: usize = 2;

/// The registry bytes one pod's lookups may still read, all its images together.
#[derive(Debug, Clone)]
pub struct ReadAllowance(Arc<std::sync::atomic::AtomicUsize>);

impl ReadAllowance {
    pub fn new(bytes: usize) -> Self {
        Self(Arc::new(std::sync::atomic::AtomicUsize::new(bytes)))
    }

    /// Take `n` bytes; false (and nothing taken) when fewer are left.
    pub(crate) fn take(&self, n: usize) -> bool {
        use std::sync::atomic::Ordering;
        self.0.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(n)).is_ok()
    }

    pub fn remaining(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1+prettyjws";
pub(crate) const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json;q=0.9, application/vnd.docker.distribution.manifest.v1+prettyjws;q=0.5, application/json;q=0.1";
const ATTESTATION_ANNOTATION: &str = "vnd.docker.reference.type";
const MAX_RATE_LIMIT_RETRIES: usize = 3;

#[derive(Debug, Clone)]
pub struct ClientSettings {
    pub guard: Arc<AddressGuard>,
    /// registry (`_default`: every registry without its own) -> its mirrors, tried before it in
    /// order and never sent the image's pull credential, and the host standing for it
    /// (`hosts.toml`'s `server`), read in its place and sent the credential.
    pub hosts: BTreeMap<String, RegistryHosts>,
    pub max_body_bytes: usize,
    pub connect_timeout: Duration,
    /// Extra PEM CA bundle trusted for registries (besides the system roots).
    pub extra_ca_pem: Option<Vec<u8>>,
    /// Registry bytes in flight draw from this shared budget (twice over: the bytes and what is
    /// parsed from them), waiting at most until the lookup's deadline.
    pub budget: MemoryBudget,
}

impl Default for ClientSettings {
    fn default() -> Self {
        Self {
            guard: Arc::new(AddressGuard::default()),
            hosts: BTreeMap::new(),
            max_body_bytes: 8 * 1024 * 1024,
            connect_timeout: Duration::from_secs(2),
            extra_ca_pem: None,
            budget: MemoryBudget::unlimited(),
        }
    }
}

/// What an image resolves to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Inspection {
    pub digest: String,
    #[serde(rename = "mediaType")]
    pub media_type: String,
    #[serde(serialize_with = "ser_platforms")]
    pub platforms: PlatformSet,
}

fn ser_platforms<S: serde::Serializer>(p: &PlatformSet, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(p.0.iter().map(ToString::to_string))
}

#[derive(Clone)]
pub struct RegistryClient {
    http: reqwest::Client,
    insecure_http: reqwest::Client,
    settings: Arc<ClientSettings>,
    requests: prometheus_client::metrics::counter::Counter,
}

impl RegistryClient {
    pub fn new(settings: ClientSettings) -> Result<Self, String> {
        let http = Self::build_http(&settings, false)?;
        let insecure_http = Self::build_http(&settings, true)?;
        Ok(Self { http, insecure_http, settings: Arc::new(settings), requests: Default::default() })
    }

    /// One HTTP client. With `exempting`, names of insecure registries resolve even to guarded
    /// addresses; that client is used only for URLs naming an insecure registry's exact
    /// host:port, and its redirects may reach such a name only at such a host:port.
    fn build_http(settings: &ClientSettings, exempting: bool) -> Result<reqwest::Client, String> {
        let guard = settings.guard.clone();
        let redirect_guard = guard.clone();
        let policy = redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > MAX_REDIRECTS {
                return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
            }
            let downgrade = attempt.previous().last().is_some_and(|prev| prev.scheme() == "https") && attempt.url().scheme() != "https";
            if downgrade {
                return attempt.error("refusing a redirect from https to http");
            }
            if exempting && !redirect_guard.is_insecure_url(attempt.url()) && attempt.url().host_str().is_some_and(|h| redirect_guard.name_exempt(h)) {
                let msg = format!("refusing to contact {}: only the listed port of an insecure registry is exempt", attempt.url());
                return attempt.error(msg);
            }
            match redirect_guard.check_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(e) => attempt.error(e.to_string()),
            }
        });
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .https_only(false) // plain HTTP is allowed only for listed registries, checked per URL
            .redirect(policy)
            .dns_resolver(Arc::new(GuardedResolver { guard, exempt_insecure: exempting }))
            .connect_timeout(settings.connect_timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            .user_agent(concat!("archer/", env!("CARGO_PKG_VERSION")))
            .no_proxy();
        if let Some(pem) = &settings.extra_ca_pem {
            for cert in reqwest::Certificate::from_pem_bundle(pem).map_err(|e| format!("registry CA bundle: {e}"))? {
                builder = builder.add_root_certificate(cert);
            }
        }
        builder.build().map_err(|e| format!("building the registry HTTP client: {e}"))
    }

    /// The HTTP client for `url`: the exempting one only for an insecure registry's exact host:port.
    fn http_for(&self, url: &Url) -> &reqwest::Client {
        if self.settings.guard.is_insecure_url(url) {
            &self.insecure_http
        } else {
            &self.http
        }
    }

    /// Count every HTTP request this client sends in `counter`.
    pub fn count_requests_in(mut self, counter: prometheus_client::metrics::counter::Counter) -> Self {
        self.requests = counter;
        self
    }

    pub fn settings(&self) -> &ClientSettings {
        &self.settings
    }

    /// Resolve an image to its digest and platforms, trying mirrors first, by `deadline`, reading
    /// no more than `allowance` leaves.
    pub async fn inspect(&self, image: &ImageRef, cred: Option<&Credential>, deadline: Instant, allowance: &ReadAllowance) -> Result<Inspection, RegistryError> {
        let endpoints = self.endpoints(image)?;
        let mut last = None;
        for (i, endpoint) in endpoints.iter().enumerate() {
            let is_origin = i + 1 == endpoints.len();
            let repo = self.repo(&endpoint.host, image, if endpoint.credential { cred } else { None }, deadline, allowance)?;
            match repo.inspect(image.reference(), image.digest.as_deref()).await {
                Ok(found) => return Ok(found),
                Err(e) if !is_origin && e.is_endpoint_failure() => {
                    tracing::debug!(mirror = %endpoint.host, error = %e, "mirror failed, trying the next endpoint");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| RegistryError::Unavailable("no endpoint".into())))
    }

    /// The registries an image is read from, in order: its mirrors (those that may resolve a
    /// tag, for a tag), then its own or the host standing for it (the last). Only the last is sent
    /// the pull credential, and only when it is the registry itself or the `server` of the
    /// registry's own `hosts.toml`: `_default`'s server (a proxy for every registry) never is.
    pub(crate) fn endpoints(&self, image: &ImageRef) -> Result<Vec<Endpoint>, RegistryError> {
        self.settings.guard.check_registry(&image.registry)?;
        let own = self.settings.hosts.get(&image.registry);
        let hosts = own.or_else(|| self.settings.hosts.get(crate::hosts::DEFAULT));
        let mut endpoints: Vec<Endpoint> = hosts.iter().flat_map(|h| &h.mirrors).filter(|m| m.resolve || image.digest.is_some()).map(|m| Endpoint { host: m.host.clone(), credential: false }).collect();
        endpoints.push(match hosts.and_then(|h| h.server.as_ref()) {
            Some(server) => Endpoint { host: server.host.clone(), credential: own.is_some() },
            None => Endpoint { host: image.registry.clone(), credential: true },
        });
        Ok(endpoints)
    }

    /// Where `registry` itself is reached, for an identity's sign-in there: the registry, or the
    /// `server` of its own `hosts.toml` (never `_default`'s, a proxy for every registry).
    pub(crate) fn origin(&self, registry: &str) -> Result<crate::identity::Origin<'_>, RegistryError> {
        self.settings.guard.check_registry(registry)?;
        let host = self.settings.hosts.get(registry).and_then(|h| h.server.as_ref()).map_or(registry, |m| m.host.as_str());
        let url = self.base_url(host)?;
        Ok(crate::identity::Origin { http: self.http_for(&url), url })
    }

    /// `image`'s repository on `endpoint`, read by `deadline` within `allowance`.
    pub(crate) fn repo<'a>(&'a self, endpoint: &str, image: &ImageRef, cred: Option<&'a Credential>, deadline: Instant, allowance: &'a ReadAllowance) -> Result<Repo<'a>, RegistryError> {
        Ok(Repo { client: self, base: self.base_url(endpoint)?, repository: image.repository.clone(), cred, deadline, auth: None, allowance, held: MemoryPermit::default() })
    }

    fn base_url(&self, registry: &str) -> Result<Url, RegistryError> {
        let scheme = if self.settings.guard.is_insecure(registry) { "http" } else { "https" };
        let url = Url::parse(&format!("{scheme}://{}/", api_host(registry)))
            .map_err(|e| RegistryError::Malformed(format!("registry host {registry}: {e}")))?;
        self.settings.guard.check_url(&url)?;
        Ok(url)
    }
}

/// A host an image is read from, and whether it is sent the image's pull credential.
pub(crate) struct Endpoint {
    pub(crate) host: String,
    pub(crate) credential: bool,
}

/// One repository on one endpoint, with the auth header learnt from its first challenge.
pub(crate) struct Repo<'a> {
    client: &'a RegistryClient,
    base: Url,
    repository: String,
    cred: Option<&'a Credential>,
    deadline: Instant,
    auth: Option<String>,
    allowance: &'a ReadAllowance,
    /// This lookup's share of the memory budget, given back when the lookup ends.
    held: MemoryPermit,
}

#[derive(Deserialize)]
struct IndexDoc {
    #[serde(default, rename = "mediaType")]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<IndexEntry>>,
    #[serde(default)]
    config: Option<DescriptorDoc>,
    /// Docker schema 1 manifests carry the architecture inline.
    #[serde(default)]
    architecture: Option<String>,
    #[serde(default, rename = "schemaVersion")]
    schema_version: Option<u32>,
}

#[derive(Deserialize)]
struct IndexEntry {
    #[serde(default)]
    platform: Option<PlatformDoc>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
struct DescriptorDoc {
    digest: String,
}

#[derive(Deserialize)]
struct PlatformDoc {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    variant: Option<String>,
}

impl Repo<'_> {
    async fn inspect(mut self, reference: &str, digest: Option<&str>) -> Result<Inspection, RegistryError> {
        let path = format!("v2/{}/manifests/{}", self.repository, reference);
        let (headers, body) = self.get(&path, MANIFEST_ACCEPT).await?;
        let actual = match digest {
            Some(expected) => {
                verify_digest(expected, &body)?;
                expected.to_string()
            }
            None => headers
                .get("docker-content-digest")
                .and_then(|v| v.to_str().ok())
                .filter(|d| verify_digest(d, &body).is_ok())
                .map(str::to_string)
                .unwrap_or_else(|| format!("sha256:{}", hex::encode(Sha256::digest(&body)))),
        };
        let doc: IndexDoc = serde_json::from_slice(&body).map_err(|e| RegistryError::Malformed(format!("manifest: {e}")))?;
        let content_type = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or_default().trim().to_string())
            .filter(|v| !v.is_empty() && v != "application/json" && v != "application/octet-stream");
        let media_type = content_type.or(doc.media_type.clone()).unwrap_or_else(|| {
            if doc.manifests.is_some() {
                OCI_INDEX.into()
            } else if doc.schema_version == Some(1) {
                DOCKER_SCHEMA1.into()
            } else {
                OCI_MANIFEST.into()
            }
        });
        let platforms = match media_type.as_str() {
            OCI_INDEX | DOCKER_LIST => {
                let entries = doc.manifests.ok_or_else(|| RegistryError::Malformed("index without manifests".into()))?;
                let set = PlatformSet::from_iter(
                    entries
                        .into_iter()
                        .filter(|e| !e.annotations.as_ref().is_some_and(|a| a.contains_key(ATTESTATION_ANNOTATION)))
                        .filter_map(|e| e.platform)
                        .map(|p| Platform::new(&p.os, &p.architecture, p.variant.as_deref())),
                );
                let (set, summarised) = set.schedulable_summary();
                if summarised {
                    tracing::warn!(repository = %self.repository, "image index lists platforms no node can carry, or more than {}; summarised", archer_core::platform::MAX_PLATFORMS);
                }
                if set.is_empty() {
                    return Err(RegistryError::Malformed("index lists no runnable platform".into()));
                }
                set
            }
            OCI_MANIFEST | DOCKER_MANIFEST => {
                let config = doc.config.ok_or_else(|| RegistryError::Malformed("manifest without config".into()))?;
                self.config_platform(&config.digest).await?
            }
            DOCKER_SCHEMA1 | "application/vnd.docker.distribution.manifest.v1+json" => {
                let arch = doc.architecture.ok_or_else(|| RegistryError::Malformed("schema 1 manifest without architecture".into()))?;
                PlatformSet::from_iter([Platform::new("linux", &arch, None)])
            }
            other => return Err(RegistryError::Malformed(format!("unsupported manifest media type {other:?}"))),
        };
        Ok(Inspection { digest: actual, media_type, platforms })
    }

    async fn config_platform(&mut self, digest: &str) -> Result<PlatformSet, RegistryError> {
        if !digest.starts_with("sha256:") && !digest.starts_with("sha512:") {
            return Err(RegistryError::Malformed(format!("config digest {digest:?}")));
        }
        let path = format!("v2/{}/blobs/{}", self.repository, digest);
        let (_, body) = self.get(&path, "application/vnd.oci.image.config.v1+json, application/vnd.docker.container.image.v1+json, */*").await?;
        verify_digest(digest, &body)?;
        let p: PlatformDoc = serde_json::from_slice(&body).map_err(|e| RegistryError::Malformed(format!("image config: {e}")))?;
        let set = PlatformSet::from_iter([Platform::new(&p.os, &p.architecture, p.variant.as_deref())]);
        if set.is_empty() {
            return Err(RegistryError::Malformed("image config names no os/architecture".into()));
        }
        Ok(set)
    }

    /// Read a response body of at most `max` bytes, charging the per-pod allowance and the
    /// shared memory budget as the bytes arrive (waiting for budget no longer than the deadline).
    async fn read_capped(&mut self, resp: reqwest::Response, max: usize) -> Result<Bytes, RegistryError> {
        if resp.content_length().is_some_and(|l| l > max as u64) {
            return Err(RegistryError::TooLarge(max));
        }
        let mut buf = Vec::new();
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| if e.is_timeout() { RegistryError::Timeout(Duration::ZERO) } else { RegistryError::Unavailable(format!("reading body: {e}")) })?;
            if buf.len() + chunk.len() > max {
                return Err(RegistryError::TooLarge(max));
            }
            if !self.allowance.take(chunk.len()) {
                return Err(RegistryError::PodBytesExceeded);
            }
            let permit = self.client.settings.budget.reserve("registry", chunk.len() * REGISTRY_EXPANSION, self.deadline).await.map_err(|e| RegistryError::Busy(e.to_string()))?;
            self.held.absorb(permit);
            buf.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(buf))
    }

    fn remaining(&self) -> Result<Duration, RegistryError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RegistryError::Timeout(Duration::ZERO));
        }
        Ok(left)
    }

    pub(crate) fn repository(&self) -> &str {
        &self.repository
    }

    /// GET with auth challenge handling and 429 back-off; returns headers and the capped body.
    pub(crate) async fn get(&mut self, path: &str, accept: &str) -> Result<(HeaderMap, Bytes), RegistryError> {
        let resp = self.open(path, accept).await?;
        let headers = resp.headers().clone();
        let body = self.read_capped(resp, self.client.settings.max_body_bytes).await?;
        Ok((headers, body))
    }

    /// GET with auth challenge handling and 429 back-off, up to a successful response whose body
    /// the caller reads (by the deadline: the request's timeout covers the body).
    pub(crate) async fn open(&mut self, path: &str, accept: &str) -> Result<reqwest::Response, RegistryError> {
        let url = self.base.join(path).map_err(|e| RegistryError::Malformed(format!("path {path}: {e}")))?;
        let mut challenged = false;
        let mut rate_limited = 0;
        loop {
            let mut req = self.client.http_for(&url).get(url.clone()).header(ACCEPT, accept).timeout(self.remaining()?);
            if let Some(a) = &self.auth {
                req = req.header(AUTHORIZATION, a);
            }
            let resp = req.send().await.map_err(|e| transport_error(&e, &url))?;
            self.client.requests.inc();
            match resp.status() {
                s if s.is_success() => return Ok(resp),
                StatusCode::UNAUTHORIZED if !challenged => {
                    challenged = true;
                    let challenge = resp.headers().get(WWW_AUTHENTICATE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                    self.auth = Some(self.answer_challenge(&challenge).await?);
                }
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    let hint = if self.cred.is_some() { "" } else { "; no pull credentials matched this registry" };
                    return Err(RegistryError::Unauthorized { status: resp.status().as_u16(), hint: hint.to_string() });
                }
                StatusCode::NOT_FOUND => return Err(RegistryError::NotFound(redact(&url))),
                StatusCode::TOO_MANY_REQUESTS => {
                    rate_limited += 1;
                    let wait = retry_after(resp.headers()).unwrap_or(Duration::from_millis(500 * rate_limited as u64));
                    if rate_limited > MAX_RATE_LIMIT_RETRIES || wait >= self.remaining()? {
                        return Err(RegistryError::RateLimited);
                    }
                    tokio::time::sleep(wait).await;
                }
                s => return Err(RegistryError::Unavailable(format!("HTTP {} from {}", s.as_u16(), redact(&url)))),
            }
        }
    }

    /// Answer a `WWW-Authenticate` challenge: Basic with the credential, or Bearer via the realm.
    async fn answer_challenge(&mut self, challenge: &str) -> Result<String, RegistryError> {
        let (scheme, params) = parse_challenge(challenge);
        match scheme.to_ascii_lowercase().as_str() {
            "basic" => {
                let cred = self.cred.ok_or(RegistryError::Unauthorized { status: 401, hint: "; no pull credentials matched this registry".into() })?;
                use base64::Engine;
                let token = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", cred.username, cred.password));
                Ok(format!("Basic {token}"))
            }
            "bearer" => {
                let realm = params.get("realm").ok_or_else(|| RegistryError::Malformed("bearer challenge without realm".into()))?;
                let mut url = Url::parse(realm).map_err(|e| RegistryError::Malformed(format!("token realm {realm:?}: {e}")))?;
                self.client.settings.guard.check_url(&url)?;
                {
                    let mut q = url.query_pairs_mut();
                    if let Some(service) = params.get("service") {
                        q.append_pair("service", service);
                    }
                    q.append_pair("scope", params.get("scope").map_or(&format!("repository:{}:pull", self.repository), |s| s));
                }
                let mut req = self.client.http_for(&url).get(url.clone()).timeout(self.remaining()?);
                if let Some(c) = self.cred {
                    req = req.basic_auth(&c.username, Some(&c.password));
                }
                let resp = req.send().await.map_err(|e| transport_error(&e, &url))?;
                self.client.requests.inc();
                if !resp.status().is_success() {
                    return Err(RegistryError::Unauthorized { status: resp.status().as_u16(), hint: " from the token service".into() });
                }
                #[derive(Deserialize)]
                struct TokenDoc {
                    #[serde(default)]
                    token: Option<String>,
                    #[serde(default)]
                    access_token: Option<String>,
                }
                let body = self.read_capped(resp, 1024 * 1024).await?;
                let doc: TokenDoc = serde_json::from_slice(&body).map_err(|e| RegistryError::Malformed(format!("token response: {e}")))?;
                let token = doc.token.or(doc.access_token).filter(|t| !t.is_empty()).ok_or_else(|| RegistryError::Malformed("token response without a token".into()))?;
                Ok(format!("Bearer {token}"))
            }
            _ => Err(RegistryError::Unauthorized { status: 401, hint: format!("; unsupported auth challenge {scheme:?}") }),
        }
    }
}

/// `Bearer realm="https://auth.docker.io/token",service="registry.docker.io"` -> ("Bearer", {...}).
fn parse_challenge(header: &str) -> (String, BTreeMap<String, String>) {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    let mut params = BTreeMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect::<String>().trim().to_ascii_lowercase();
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.peek().copied() {
                if c == ',' {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        params.insert(key, value.trim().to_string());
    }
    (scheme.to_string(), params)
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate_parse(v)?;
    Some(when.duration_since(std::time::SystemTime::now()).unwrap_or_default())
}

fn httpdate_parse(v: &str) -> Option<std::time::SystemTime> {
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    let dt = time::PrimitiveDateTime::parse(v, &format).ok()?.assume_utc();
    Some(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(dt.unix_timestamp()).ok()?))
}

pub(crate) fn verify_digest(expected: &str, body: &[u8]) -> Result<(), RegistryError> {
    let actual = match expected.split_once(':') {
        Some(("sha256", _)) => format!("sha256:{}", hex::encode(Sha256::digest(body))),
        Some(("sha512", _)) => format!("sha512:{}", hex::encode(Sha512::digest(body))),
        _ => return Err(RegistryError::Malformed(format!("unsupported digest {expected:?}"))),
    };
    if actual != expected {
        return Err(RegistryError::DigestMismatch { expected: expected.to_string(), actual });
    }
    Ok(())
}

fn transport_error(e: &reqwest::Error, url: &Url) -> RegistryError {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg = format!("{msg}: {s}");
        source = s.source();
    }
    if msg.contains("refusing") {
        return RegistryError::Forbidden(msg.split("refusing to contact ").last().unwrap_or(&msg).to_string());
    }
    if e.is_timeout() {
        return RegistryError::Timeout(Duration::ZERO);
    }
    RegistryError::Unavailable(format!("{}: {msg}", redact(url)))
}

/// A URL without its query (which may carry tokens).
fn redact(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_and_basic_challenges() {
        let (s, p) = parse_challenge(r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/nginx:pull""#);
        assert_eq!(s, "Bearer");
        assert_eq!(p["realm"], "https://auth.docker.io/token");
        assert_eq!(p["service"], "registry.docker.io");
        assert_eq!(p["scope"], "repository:library/nginx:pull");
        let (s, p) = parse_challenge(r#"Basic realm="Registry Realm""#);
        assert_eq!((s.as_str(), p["realm"].as_str()), ("Basic", "Registry Realm"));
        let (s, p) = parse_challenge("Bearer realm=https://x/token, service=reg");
        assert_eq!((s.as_str(), p["realm"].as_str(), p["service"].as_str()), ("Bearer", "https://x/token", "reg"));
        assert!(parse_challenge("").1.is_empty());
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, "2".parse().expect("hv"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert(RETRY_AFTER, "Wed, 21 Oct 2015 07:28:00 GMT".parse().expect("hv"));
        assert_eq!(retry_after(&h), Some(Duration::ZERO), "a date in the past means now");
        h.insert(RETRY_AFTER, "soon".parse().expect("hv"));
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn digests_are_verified() {
        let body = b"{}";
        let good = format!("sha256:{}", hex::encode(Sha256::digest(body)));
        assert!(verify_digest(&good, body).is_ok());
        assert!(matches!(verify_digest(&good, b"{ }"), Err(RegistryError::DigestMismatch { .. })));
        assert!(verify_digest("md5:abc", body).is_err());
    }
}
