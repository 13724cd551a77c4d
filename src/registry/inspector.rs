//! Cached, coalesced, time-bounded image inspection: the one path the webhook, the extender,
//! `archer inspect` and `simulate` all use.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use moka::future::Cache;
use tokio::time::Instant;

use super::client::{Inspection, ReadAllowance, RegistryClient};
use super::credentials::Keyring;
use super::error::RegistryError;
use super::reference::ImageRef;
use crate::metrics::{label, Metrics};

#[derive(Debug, Clone)]
pub struct CacheSettings {
    pub capacity: u64,
    /// How long a tag's resolution is trusted (digests are immutable and kept until evicted).
    pub tag_ttl: Duration,
    /// Bound on one image lookup (all requests, redirects and retries included).
    pub lookup_timeout: Duration,
    /// Distinct images of one pod looked up at the same time.
    pub per_pod_concurrency: usize,
    /// Registry bytes one pod's lookups may read, all its images together.
    pub per_pod_bytes: usize,
}

impl Default for CacheSettings {
    fn default() -> Self {
        Self { capacity: 10_000, tag_ttl: Duration::from_secs(300), lookup_timeout: Duration::from_secs(3), per_pod_concurrency: 8, per_pod_bytes: 16 * 1024 * 1024 }
    }
}

#[derive(Clone)]
pub struct Inspector {
    client: RegistryClient,
    by_digest: Cache<String, Arc<Inspection>>,
    by_tag: Cache<String, Arc<Inspection>>,
    lookup_timeout: Duration,
    per_pod_concurrency: usize,
    per_pod_bytes: usize,
    metrics: Arc<Metrics>,
}

impl Inspector {
    pub fn new(client: RegistryClient, settings: &CacheSettings, metrics: Arc<Metrics>) -> Self {
        Self {
            client,
            by_digest: Cache::builder().max_capacity(settings.capacity).build(),
            by_tag: Cache::builder().max_capacity(settings.capacity).time_to_live(settings.tag_ttl).build(),
            lookup_timeout: settings.lookup_timeout,
            per_pod_concurrency: settings.per_pod_concurrency.max(1),
            per_pod_bytes: settings.per_pod_bytes,
            metrics,
        }
    }

    pub fn client(&self) -> &RegistryClient {
        &self.client
    }

    /// Inspect one image with the credentials in `keyring`. Concurrent calls for the same image
    /// (and credential) share one registry round trip; failures are not cached.
    #[tracing::instrument(skip_all, fields(image = %image))]
    pub async fn inspect(&self, image: &str, keyring: &Keyring) -> Result<Arc<Inspection>, RegistryError> {
        self.inspect_within(image, keyring, &ReadAllowance::new(self.per_pod_bytes)).await
    }

    async fn inspect_within(&self, image: &str, keyring: &Keyring, allowance: &ReadAllowance) -> Result<Arc<Inspection>, RegistryError> {
        let result = self.inspect_inner(image, keyring, allowance).await;
        if let Err(e) = &result {
            self.metrics.image_lookups.get_or_create(&label("result", "error")).inc();
            self.metrics.inspection_failures.get_or_create(&label("reason", e.reason())).inc();
            tracing::warn!(reason = e.reason(), error = %e, "image inspection failed");
        }
        result
    }

    async fn inspect_inner(&self, image: &str, keyring: &Keyring, allowance: &ReadAllowance) -> Result<Arc<Inspection>, RegistryError> {
        let parsed = ImageRef::parse(image)?;
        let cred = keyring.lookup(&parsed.registry).cloned();
        let who = cred.as_ref().map(|c| c.fingerprint()).unwrap_or_default();
        let key = format!("{parsed}#{who}");
        let cache = if parsed.digest.is_some() { &self.by_digest } else { &self.by_tag };
        if let Some(hit) = cache.get(&key).await {
            self.metrics.image_lookups.get_or_create(&label("result", "hit")).inc();
            return Ok(hit);
        }
        self.metrics.image_lookups.get_or_create(&label("result", "miss")).inc();
        let timeout = self.lookup_timeout;
        let client = self.client.clone();
        let allowance = allowance.clone();
        let found = cache
            .try_get_with(key, async move {
                let deadline = Instant::now() + timeout;
                match tokio::time::timeout_at(deadline, client.inspect(&parsed, cred.as_ref(), deadline, &allowance)).await {
                    Ok(Ok(found)) => Ok(Arc::new(found)),
                    Ok(Err(RegistryError::Timeout(_))) | Err(_) => Err(RegistryError::Timeout(timeout)),
                    Ok(Err(e)) => Err(e),
                }
            })
            .await
            .map_err(|e: Arc<RegistryError>| (*e).clone())?;
        Ok(found)
    }

    /// Inspect one pod's images, one result per image, in order: at most `per_pod_concurrency`
    /// at a time, reading at most `per_pod_bytes` from registries together, and all answered by
    /// `deadline` (an image not inspected by then is a timeout).
    pub async fn inspect_all(&self, images: &[String], keyring: &Keyring, deadline: Instant) -> Vec<Result<Arc<Inspection>, RegistryError>> {
        let allowance = ReadAllowance::new(self.per_pod_bytes);
        let allowance = &allowance;
        futures::stream::iter(images.iter().cloned())
            .map(|image: String| async move {
                match tokio::time::timeout_at(deadline, self.inspect_within(&image, keyring, allowance)).await {
                    Ok(r) => r,
                    Err(_) => {
                        let e = RegistryError::Timeout(self.lookup_timeout.min(deadline.saturating_duration_since(Instant::now())));
                        self.metrics.inspection_failures.get_or_create(&label("reason", e.reason())).inc();
                        tracing::warn!(image = %image, "image not inspected before the pod's deadline");
                        Err(e)
                    }
                }
            })
            .buffered(self.per_pod_concurrency)
            .collect()
            .await
    }

    /// Inspect unrelated images (a command line's list), each on its own allowance and timeout,
    /// `per_pod_concurrency` at a time.
    pub async fn inspect_each(&self, images: &[String], keyring: &Keyring) -> Vec<Result<Arc<Inspection>, RegistryError>> {
        futures::stream::iter(images.iter().cloned())
            .map(|image: String| async move { self.inspect(&image, keyring).await })
            .buffered(self.per_pod_concurrency)
            .collect()
            .await
    }

    pub fn lookup_timeout(&self) -> Duration {
        self.lookup_timeout
    }
}
