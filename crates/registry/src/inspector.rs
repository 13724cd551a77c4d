//! Cached, coalesced, time-bounded image inspection: the one path the webhook, the extender,
//! `archer inspect` and `simulate` all use.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use moka::future::Cache;
use tokio::time::Instant;

use super::client::{Inspection, ReadAllowance, RegistryClient};
use super::credentials::{Credential, Keyring};
use super::identity::RegistryIdentity;
use super::entrypoint::{Bound, EntrypointCheck, EntrypointLimits, Undetermined};
use super::error::RegistryError;
use super::reference::ImageRef;
use archer_metrics::label;
use crate::metrics::RegistryMetrics;

#[derive(Debug, Clone)]
pub struct CacheSettings {
    /// Entries at most in each of the tag and digest caches.
    pub capacity: u64,
    /// Bytes at most in each of the tag and digest caches, entries weighed by what they hold.
    pub max_bytes: u64,
    /// Bytes at most in the cache of failed lookups.
    pub failure_max_bytes: u64,
    /// How long a failed lookup is remembered (and answered without asking the registry again).
    pub failure_ttl: Duration,
    /// How long a lookup that timed out is remembered (zero: not at all). Brief: the registry may
    /// answer the next time, but images that never answer must not cost every pod that names
    /// them (or every round of the gate controller) a whole lookup timeout.
    pub timeout_ttl: Duration,
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
        Self { capacity: 10_000, max_bytes: 12 * 1024 * 1024, failure_max_bytes: 1024 * 1024, failure_ttl: Duration::from_secs(10), timeout_ttl: Duration::from_secs(5), tag_ttl: Duration::from_secs(300), lookup_timeout: Duration::from_secs(3), per_pod_concurrency: 8, per_pod_bytes: 16 * 1024 * 1024 }
    }
}

#[derive(Clone)]
pub struct Inspector {
    client: RegistryClient,
    by_digest: Cache<String, Arc<Inspection>>,
    by_tag: Cache<String, Arc<Inspection>>,
    /// Lookups that failed for a reason of the image's own (not found, refused, malformed...),
    /// kept briefly so a flood of one bad reference asks the registry once per TTL.
    failures: Cache<String, RegistryError>,
    /// Lookups that timed out, kept for the (shorter) timeout TTL.
    stalled: Option<Cache<String, RegistryError>>,
    lookup_timeout: Duration,
    per_pod_concurrency: usize,
    per_pod_bytes: usize,
    metrics: Arc<RegistryMetrics>,
    /// Entrypoint checks by digest, architecture and credential: what a digest holds never
    /// changes, and one check may read hundreds of megabytes.
    entrypoints: Cache<String, Arc<EntrypointCheck>>,
    entrypoint_limits: EntrypointLimits,
    /// Entrypoint checks running at once.
    entrypoint_slots: Arc<tokio::sync::Semaphore>,
    /// Archer's own cloud identities, asked for registries a pod's own pull secrets do not cover.
    identities: Vec<Arc<dyn RegistryIdentity>>,
    /// The registries the auth-failure metric has named so far.
    auth_registries: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

/// Registries the auth-failure metric names; failures at others count as `other` (image names,
/// and so registries, are the tenants' to choose).
pub const AUTH_FAILURE_REGISTRIES: usize = 64;

/// Entrypoint checks run at most this many at a time (each streams up to its byte bound).
const ENTRYPOINT_CHECKS: usize = 2;
/// Bytes the cache of entrypoint checks holds at most, by its own weighing.
pub const ENTRYPOINT_CACHE_BYTES: u64 = 1024 * 1024;

/// Why a check is not kept: a registry failure, or an answer of this moment (the deadline).
#[derive(Debug)]
enum NotKept {
    Failed(RegistryError),
    Transient(EntrypointCheck),
}

impl Inspector {
    pub fn new(client: RegistryClient, settings: &CacheSettings, metrics: Arc<RegistryMetrics>) -> Self {
        // Each entry weighs at least its share of the budget, so `capacity` bounds the count too.
        let floor = u32::try_from(settings.max_bytes / settings.capacity.max(1)).unwrap_or(u32::MAX);
        Self {
            client,
            by_digest: Cache::builder().max_capacity(settings.max_bytes).weigher(weigh_at_least(floor)).build(),
            by_tag: Cache::builder().max_capacity(settings.max_bytes).weigher(weigh_at_least(floor)).time_to_live(settings.tag_ttl).build(),
            failures: Cache::builder().max_capacity(settings.failure_max_bytes).weigher(weigh_failure).time_to_live(settings.failure_ttl).build(),
            stalled: (!settings.timeout_ttl.is_zero()).then(|| Cache::builder().max_capacity(settings.failure_max_bytes).weigher(weigh_failure).time_to_live(settings.timeout_ttl).build()),
            lookup_timeout: settings.lookup_timeout,
            per_pod_concurrency: settings.per_pod_concurrency.max(1),
            per_pod_bytes: settings.per_pod_bytes,
            metrics,
            entrypoints: Cache::builder().max_capacity(ENTRYPOINT_CACHE_BYTES).weigher(weigh_check).build(),
            entrypoint_limits: EntrypointLimits::default(),
            entrypoint_slots: Arc::new(tokio::sync::Semaphore::new(ENTRYPOINT_CHECKS)),
            identities: Vec::new(),
            auth_registries: Default::default(),
        }
    }

    /// Sign in to the registries `identity` covers with it, after a pod's own pull secrets and
    /// before the mounted docker config.
    pub fn with_identity(mut self, identity: Arc<dyn RegistryIdentity>) -> Self {
        self.identities.push(identity);
        self
    }

    /// The credential an image of `registry` is read with: the pod's own (pull secrets), else
    /// Archer's identity for that registry, else the fallback (the mounted docker config). An
    /// identity that fails with no fallback to take its place is an error: the pod is not
    /// decided, and says why.
    async fn credential_for(&self, registry: &str, keyring: &Keyring) -> Result<Option<Credential>, RegistryError> {
        if let Some(own) = keyring.own(registry) {
            return Ok(Some(own.clone()));
        }
        let fallback = keyring.fallback(registry).cloned();
        match self.identity_credential(registry, None).await {
            None => Ok(fallback),
            Some(Ok(c)) => Ok(Some(c)),
            Some(Err(e)) if fallback.is_none() => Err(e),
            Some(Err(e)) => {
                tracing::warn!(registry, error = %e, "the identity's credential failed: the mounted docker config's is used");
                Ok(fallback)
            }
        }
    }

    /// The credential of Archer's identity for `registry`, if one covers it (signed in where the
    /// registry itself is reached), waited for until just before `deadline` (a pod's, so that
    /// this, not the pod's own timeout, says what was waited on): a sign-in that has not ended
    /// by then is a [`RegistryError::SigningIn`], and goes on for the pods after it.
    async fn identity_credential(&self, registry: &str, deadline: Option<Instant>) -> Option<Result<Credential, RegistryError>> {
        let identity = self.identities.iter().find(|i| i.covers(registry))?;
        let origin = match self.client.origin(registry) {
            Ok(o) => o,
            Err(e) => return Some(Err(e)),
        };
        let started = Instant::now();
        let signing_in = identity.credential(registry, &origin);
        let answer = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline.checked_sub(DEADLINE_MARGIN).unwrap_or(deadline), signing_in).await {
                Ok(answer) => answer,
                Err(_) => return Some(Err(RegistryError::SigningIn { identity: identity.name(), registry: registry.to_string(), waited: whole_ms(started.elapsed()) })),
            },
            None => signing_in.await,
        };
        Some(answer.map_err(|why| RegistryError::Identity { identity: identity.name(), registry: registry.to_string(), why }))
    }

    /// Count a failure to sign in: the registry denied the credential Archer had (`denied`), or
    /// asked for one Archer had none for (`no_credential`), or Archer's identity got none
    /// (`identity`). The registry label names only registries Archer's configuration or
    /// identities name (image names are the tenants' to choose), at most
    /// [`AUTH_FAILURE_REGISTRIES`] of them; any other is `other`.
    fn count_auth_failure(&self, registry: &str, had_credential: bool, e: &RegistryError) {
        let reason = match e {
            RegistryError::Unauthorized { .. } if had_credential => "denied",
            RegistryError::Unauthorized { .. } => "no_credential",
            RegistryError::Identity { .. } => "identity",
            _ => return,
        };
        let named = self.identities.iter().any(|i| i.covers(registry)) || self.client.settings().hosts.contains_key(registry);
        let registry = {
            let mut seen = self.auth_registries.lock().unwrap_or_else(|p| p.into_inner());
            if named && (seen.contains(registry) || seen.len() < AUTH_FAILURE_REGISTRIES) {
                seen.insert(registry.to_string());
                registry.to_string()
            } else {
                "other".to_string()
            }
        };
        self.metrics.auth_failures.get_or_create(&vec![("registry", registry), ("reason", reason.to_string())]).inc();
    }

    /// The bounds of each entrypoint check (`EntrypointLimits::default()` unless set).
    pub fn with_entrypoint_limits(mut self, limits: EntrypointLimits) -> Self {
        self.entrypoint_limits = limits;
        self
    }

    /// Verify from the image itself which architecture its program is built for: the manifest
    /// for linux/`arch` (`image`'s own when it is not an index), its config's entrypoint (or
    /// command), and that file's ELF header (for a script, its interpreter's), read from the
    /// layers within `EntrypointLimits`. `digest`, when given, is the digest checked (it replaces
    /// any the reference names). Answers for a digest are kept; at most two checks run at once.
    #[tracing::instrument(skip_all, fields(image = %image, digest = digest.unwrap_or_default(), arch = %arch))]
    pub async fn entrypoint_machine(&self, image: &str, digest: Option<&str>, arch: &str, keyring: &Keyring) -> Result<EntrypointCheck, RegistryError> {
        let mut parsed = ImageRef::parse(image)?;
        if let Some(d) = digest {
            parsed.digest = ImageRef::parse(&format!("{}@{d}", parsed.name()))?.digest;
        }
        let cred = self.credential_for(&parsed.registry, keyring).await?;
        let who = cred.as_ref().map(|c| c.fingerprint()).unwrap_or_default();
        // Kept by digest alone: a tag beside it changes nothing the check reads.
        let key = format!("{}@{}#{arch}#{who}", parsed.name(), parsed.digest.as_deref().unwrap_or_default());
        let check = async {
            let deadline = Instant::now() + self.entrypoint_limits.timeout;
            let Ok(Ok(_slot)) = tokio::time::timeout_at(deadline, self.entrypoint_slots.acquire()).await else {
                return Ok(EntrypointCheck::Undetermined(Undetermined::OverBound(Bound::Deadline)));
            };
            self.client.entrypoint_machine(&parsed, arch, cred.as_ref(), &self.entrypoint_limits, deadline).await
        };
        let result = if parsed.digest.is_some() {
            let kept = self
                .entrypoints
                .try_get_with(key, async {
                    match check.await {
                        Ok(c @ EntrypointCheck::Undetermined(Undetermined::OverBound(Bound::Deadline))) => Err(NotKept::Transient(c)),
                        Ok(c) => Ok(Arc::new(c)),
                        Err(e) => Err(NotKept::Failed(e)),
                    }
                })
                .await;
            match kept {
                Ok(c) => Ok((*c).clone()),
                Err(e) => match &*e {
                    NotKept::Transient(c) => Ok(c.clone()),
                    NotKept::Failed(e) => Err(e.clone()),
                },
            }
        } else {
            check.await
        };
        match &result {
            Ok(EntrypointCheck::Machine { path, arch: machine, script, .. }) => tracing::info!(path = %path, machine = %machine, script = script.as_deref().unwrap_or_default(), "entrypoint machine read from the image"),
            Ok(EntrypointCheck::Undetermined(why)) => tracing::info!(reason = why.reason(), why = %why, "entrypoint machine not determined"),
            Err(e) => tracing::warn!(reason = e.reason(), error = %e, "entrypoint check failed"),
        }
        result
    }

    pub fn client(&self) -> &RegistryClient {
        &self.client
    }

    /// Inspect one image with the credentials in `keyring`. Concurrent calls for the same image
    /// (and credential) share one registry round trip; failures of the image's own are remembered
    /// for the failure TTL.
    #[tracing::instrument(skip_all, fields(image = %image))]
    pub async fn inspect(&self, image: &str, keyring: &Keyring) -> Result<Arc<Inspection>, RegistryError> {
        self.inspect_within(image, keyring, &ReadAllowance::new(self.per_pod_bytes), None).await
    }

    /// Inspect `image`; Archer's identity's sign-in is waited for until `deadline` (the pod's).
    async fn inspect_within(&self, image: &str, keyring: &Keyring, allowance: &ReadAllowance, deadline: Option<Instant>) -> Result<Arc<Inspection>, RegistryError> {
        let mut had_credential = false;
        let result = self.inspect_inner(image, keyring, allowance, deadline, &mut had_credential).await;
        if let Err(e) = &result {
            self.metrics.image_lookups.get_or_create(&label("result", "error")).inc();
            self.metrics.inspection_failures.get_or_create(&label("reason", e.reason())).inc();
            if let Ok(parsed) = ImageRef::parse(image) {
                self.count_auth_failure(&parsed.registry, had_credential, e);
            }
            tracing::warn!(reason = e.reason(), error = %e, "image inspection failed");
        }
        result
    }

    /// Inspect with each credential that may read the image in the kubelet's order, the next
    /// tried while the registry refuses the one before (an expired pull secret, a role that
    /// cannot read another account's repository): the pod's own pull secrets, Archer's identity,
    /// the mounted docker config; with none, anonymously.
    async fn inspect_inner(&self, image: &str, keyring: &Keyring, allowance: &ReadAllowance, deadline: Option<Instant>, had_credential: &mut bool) -> Result<Arc<Inspection>, RegistryError> {
        let parsed = ImageRef::parse(image)?;
        let registry = parsed.registry.clone();
        let fallback = keyring.fallback(&registry).cloned();
        let identity_covers = self.identities.iter().any(|i| i.covers(&registry));
        let denied = |r: &Result<Arc<Inspection>, RegistryError>| matches!(r, Err(RegistryError::Unauthorized { .. }));
        let mut last = None;
        if let Some(own) = keyring.own(&registry).cloned() {
            let r = self.inspect_as(&parsed, Some(own), allowance, had_credential).await;
            if !denied(&r) || (!identity_covers && fallback.is_none()) {
                return r;
            }
            last = Some(r);
        }
        if let Some(signed_in) = self.identity_credential(&registry, deadline).await {
            match signed_in {
                Ok(c) => {
                    let r = self.inspect_as(&parsed, Some(c), allowance, had_credential).await;
                    if !denied(&r) || fallback.is_none() {
                        return r;
                    }
                    last = Some(r);
                }
                Err(e) => {
                    if fallback.is_none() {
                        // The pod's own secret's refusal, if it had one, says more.
                        return last.unwrap_or(Err(e));
                    }
                    tracing::warn!(registry = %registry, error = %e, "the identity's credential failed: the mounted docker config's is used");
                }
            }
        }
        match (fallback, last) {
            (Some(c), _) => self.inspect_as(&parsed, Some(c), allowance, had_credential).await,
            (None, Some(r)) => r,
            (None, None) => self.inspect_as(&parsed, None, allowance, had_credential).await,
        }
    }

    /// Inspect `parsed` with `cred` (none: anonymously), through the caches.
    async fn inspect_as(&self, parsed: &ImageRef, cred: Option<Credential>, allowance: &ReadAllowance, had_credential: &mut bool) -> Result<Arc<Inspection>, RegistryError> {
        let parsed = parsed.clone();
        *had_credential = cred.is_some();
        let who = cred.as_ref().map(|c| c.fingerprint()).unwrap_or_default();
        let key = format!("{parsed}#{who}");
        let cache = if parsed.digest.is_some() { &self.by_digest } else { &self.by_tag };
        if let Some(hit) = cache.get(&key).await {
            self.metrics.image_lookups.get_or_create(&label("result", "hit")).inc();
            return Ok(hit);
        }
        if let Some(failed) = self.failures.get(&key).await {
            self.metrics.image_lookups.get_or_create(&label("result", "failure_hit")).inc();
            return Err(failed);
        }
        if let Some(stalled) = &self.stalled {
            if let Some(failed) = stalled.get(&key).await {
                self.metrics.image_lookups.get_or_create(&label("result", "timeout_hit")).inc();
                return Err(failed);
            }
        }
        self.metrics.image_lookups.get_or_create(&label("result", "miss")).inc();
        let timeout = self.lookup_timeout;
        let client = self.client.clone();
        let allowance = allowance.clone();
        // Kept for the failure cache: the lookup takes the key.
        let failure_key = key.clone();
        let found = cache
            .try_get_with(key, async move {
                let deadline = Instant::now() + timeout;
                match tokio::time::timeout_at(deadline, client.inspect(&parsed, cred.as_ref(), deadline, &allowance)).await {
                    Ok(Ok(found)) => Ok(Arc::new(found)),
                    Ok(Err(RegistryError::Timeout(_))) | Err(_) => Err(RegistryError::Timeout(timeout)),
                    Ok(Err(e)) => Err(e),
                }
            })
            .await;
        match found {
            Ok(found) => Ok(found),
            Err(e) => {
                let e = (*e).clone();
                if remembered(&e) {
                    self.failures.insert(failure_key, e.clone()).await;
                } else if let (RegistryError::Timeout(_), Some(stalled)) = (&e, &self.stalled) {
                    stalled.insert(failure_key, e.clone()).await;
                }
                Err(e)
            }
        }
    }

    /// Run the caches' pending evictions now (they otherwise run as the caches are used).
    pub async fn settle(&self) {
        self.by_digest.run_pending_tasks().await;
        self.by_tag.run_pending_tasks().await;
        self.failures.run_pending_tasks().await;
        if let Some(stalled) = &self.stalled {
            stalled.run_pending_tasks().await;
        }
        self.entrypoints.run_pending_tasks().await;
    }

    /// Entries the caches hold: (tag and digest caches, failure cache).
    pub fn cached_entries(&self) -> (u64, u64) {
        (self.by_digest.entry_count() + self.by_tag.entry_count(), self.failures.entry_count() + self.stalled.as_ref().map_or(0, Cache::entry_count))
    }

    /// Bytes the caches hold by their own weighing (successes and failures together).
    pub fn cached_bytes(&self) -> u64 {
        self.by_digest.weighted_size() + self.by_tag.weighted_size() + self.failures.weighted_size() + self.stalled.as_ref().map_or(0, Cache::weighted_size) + self.entrypoints.weighted_size()
    }

    /// Inspect one pod's images, one result per image, in order: at most `per_pod_concurrency`
    /// at a time, reading at most `per_pod_bytes` from registries together, and all answered by
    /// `deadline` (an image not inspected by then is a timeout, after the time the pod waited;
    /// one whose registry's sign-in had not ended is a [`RegistryError::SigningIn`] saying so).
    pub async fn inspect_all(&self, images: &[String], keyring: &Keyring, deadline: Instant) -> Vec<Result<Arc<Inspection>, RegistryError>> {
        let allowance = ReadAllowance::new(self.per_pod_bytes);
        let allowance = &allowance;
        let started = Instant::now();
        futures::stream::iter(images.iter().cloned())
            .map(|image: String| async move {
                match tokio::time::timeout_at(deadline, self.inspect_within(&image, keyring, allowance, Some(deadline))).await {
                    Ok(r) => r,
                    Err(_) => {
                        // The time waited, not what was left of it (none, at the deadline).
                        let e = RegistryError::Timeout(whole_ms(started.elapsed()));
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

/// How long before a pod's deadline a sign-in still running is given up on (so its error, not
/// the pod's timeout, is what the pod is told).
const DEADLINE_MARGIN: Duration = Duration::from_millis(5);

/// `d` to the millisecond, as errors say it (`4.001s`, not `4.000987512s`).
fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What each cache holds besides its entries, at most: its hash table's spare buckets (the
/// table grows with the entries a burst inserts before evictions catch up, and never shrinks),
/// its frequency sketch and its queues of pending reads and writes.
pub const CACHE_STRUCTURE_BYTES: u64 = 256 * 1024;

/// What one cached entry holds, in bytes, over-counted: the key and the strings it names, the
/// platform set's nodes and moka's own bookkeeping for the entry (measured by
/// `tests/cache_weight.rs`, which fails if the weights fall short of the real bytes).
/// (Measured by that test: 1,468 entries, 16-platform indexes and failures with keys of about
/// 400 bytes, held 4.0 MB of heap and were weighed 6.2 MB.)
const ENTRY_OVERHEAD: usize = 1024;
/// One platform in a set: its share of the B-tree's nodes (72-byte elements in nodes of 11, not
/// all full) and its three strings' allocations.
const PLATFORM_OVERHEAD: usize = 256;

fn weigh_at_least(floor: u32) -> impl Fn(&String, &Arc<Inspection>) -> u32 {
    move |key, found| {
        let platforms: usize = found.platforms.0.iter().map(|p| PLATFORM_OVERHEAD + p.os.len() + p.architecture.len() + p.variant.as_ref().map_or(0, String::len)).sum();
        let bytes = ENTRY_OVERHEAD + 2 * key.len() + found.digest.len() + found.media_type.len() + platforms;
        u32::try_from(bytes).unwrap_or(u32::MAX).max(floor)
    }
}

#[allow(clippy::ptr_arg, reason = "moka's weigher takes the key type by reference")]
fn weigh_check(key: &String, check: &Arc<EntrypointCheck>) -> u32 {
    let held = match &**check {
        EntrypointCheck::Machine { digest, path, arch, script } => digest.len() + path.len() + arch.len() + script.as_ref().map_or(0, String::len),
        EntrypointCheck::Undetermined(why) => 2 * why.to_string().len(),
    };
    u32::try_from(ENTRY_OVERHEAD + 2 * key.len() + held).unwrap_or(u32::MAX)
}

#[allow(clippy::ptr_arg, reason = "moka's weigher takes the key type by reference")]
fn weigh_failure(key: &String, e: &RegistryError) -> u32 {
    // The message is formatted only when the entry is weighed (once, on insert).
    u32::try_from(ENTRY_OVERHEAD + 2 * key.len() + 2 * e.to_string().len()).unwrap_or(u32::MAX)
}

/// Failures that say something about the image itself are remembered; those that only say
/// something about this moment or this request (a timeout, a busy budget, a pod's byte
/// allowance, an unreachable registry) are not, so the next pod tries again.
fn remembered(e: &RegistryError) -> bool {
    matches!(
        e,
        RegistryError::Forbidden(_)
            | RegistryError::NotAllowed(_)
            | RegistryError::Unauthorized { .. }
            | RegistryError::NotFound(_)
            | RegistryError::TooLarge(_)
            | RegistryError::DigestMismatch { .. }
            | RegistryError::Malformed(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Origin;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An identity for `*.example.test` that answers `answer` after `delay` and counts its calls.
    struct Fake {
        answer: Result<Credential, String>,
        delay: Duration,
        calls: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl RegistryIdentity for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn covers(&self, registry: &str) -> bool {
            registry.ends_with(".example.test")
        }
        async fn credential(&self, _: &str, _: &Origin<'_>) -> Result<Credential, String> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            self.answer.clone()
        }
    }

    fn cred(u: &str) -> Credential {
        Credential { username: u.into(), password: "p".into() }
    }

    fn ring(entries: &[(&str, &str)]) -> Keyring {
        let auths: serde_json::Map<String, serde_json::Value> = entries.iter().map(|(r, u)| (r.to_string(), serde_json::json!({"username": u, "password": "p"}))).collect();
        Keyring::parse(serde_json::json!({"auths": auths}).to_string().as_bytes()).expect("keyring")
    }

    fn inspector(answer: Result<Credential, String>) -> (Inspector, Arc<Fake>) {
        slow_inspector(answer, Duration::ZERO)
    }

    fn slow_inspector(answer: Result<Credential, String>, delay: Duration) -> (Inspector, Arc<Fake>) {
        let fake = Arc::new(Fake { answer, delay, calls: AtomicUsize::new(0) });
        let client = RegistryClient::new(crate::ClientSettings::default()).expect("client");
        let i = Inspector::new(client, &CacheSettings::default(), Arc::new(RegistryMetrics::default())).with_identity(fake.clone());
        (i, fake)
    }

    /// The order issue #43 names: the pod's own pull secrets, then Archer's identity, then the
    /// mounted docker config; an identity that fails falls back to the mounted config, and with
    /// none is an error naming the registry. Registries the identity does not cover never ask it.
    #[tokio::test]
    async fn pull_secrets_then_the_identity_then_the_mounted_config() {
        let r = "acme.example.test";
        let mounted = ring(&[(r, "mounted")]);
        let (ok, fake) = inspector(Ok(cred("identity")));
        let own = ring(&[(r, "pod")]).with_fallback(mounted.clone());
        assert_eq!(ok.credential_for(r, &own).await.expect("own"), Some(cred("pod")));
        assert_eq!(fake.calls.load(Ordering::SeqCst), 0, "the pod's own secret: the identity is not asked");
        let none_own = Keyring::default().with_fallback(mounted.clone());
        assert_eq!(ok.credential_for(r, &none_own).await.expect("identity"), Some(cred("identity")), "before the mounted config");
        assert_eq!(ok.credential_for("docker.io", &Keyring::default()).await.expect("uncovered"), None);
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);

        let (failing, _) = inspector(Err("no token".into()));
        assert_eq!(failing.credential_for(r, &none_own).await.expect("fallback"), Some(cred("mounted")), "a failing identity falls back");
        match failing.credential_for(r, &Keyring::default()).await {
            Err(e @ RegistryError::Identity { .. }) => assert_eq!(e.to_string(), format!("no fake credential for {r}: no token")),
            other => panic!("{other:?}"),
        }
    }

    /// At a pod's deadline the error says what the pod waited on, and for how long: a sign-in
    /// of Archer's identity that had not ended, or a registry that had not answered (before,
    /// both were `registry lookup timed out after 0ns`: what was left of the deadline).
    #[tokio::test]
    async fn at_the_pods_deadline_the_error_says_what_it_waited_on() {
        let (signing_in, _) = slow_inspector(Ok(cred("identity")), Duration::from_secs(5));
        let r = signing_in.inspect_all(&["acme.example.test/app:1".to_string()], &Keyring::default(), Instant::now() + Duration::from_millis(200)).await;
        match &r[..] {
            [Err(e @ RegistryError::SigningIn { identity: "fake", waited, .. })] => {
                assert!(*waited >= Duration::from_millis(150), "{waited:?}");
                assert!(e.is_timeout(), "a timeout: a gate-mode pod is held, not admitted undecided");
                let said = e.with_reason();
                assert!(said.starts_with("[timeout] no fake credential for acme.example.test yet: the sign-in had not ended by the pod's deadline (waited "), "{said}");
            }
            other => panic!("{other:?}"),
        }

        // A registry that takes the connection and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let host = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let guard = crate::AddressGuard::new(&[], &[], std::slice::from_ref(&host)).expect("guard");
        let client = RegistryClient::new(crate::ClientSettings { guard: Arc::new(guard), ..Default::default() }).expect("client");
        let silent = Inspector::new(client, &CacheSettings::default(), Arc::new(RegistryMetrics::default()));
        let r = silent.inspect_all(&[format!("{host}/app:1")], &Keyring::default(), Instant::now() + Duration::from_millis(300)).await;
        match &r[..] {
            [Err(RegistryError::Timeout(waited))] => assert!(*waited >= Duration::from_millis(250), "after the time waited: {waited:?}"),
            other => panic!("{other:?}"),
        }
    }
}
