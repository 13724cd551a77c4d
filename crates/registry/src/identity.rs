//! Archer's own cloud identity as a registry credential: for images in the cloud's private
//! registry (ECR, ACR) that pods pull with the node's identity and no pull secret. A pod's own
//! pull secrets come first, then the identity, then the mounted docker config
//! ([`crate::Inspector`]). Implementations live with their cloud (`archer-cloud-aws`'s ECR);
//! [`TokenCache`] keeps their short-lived credentials.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use moka::future::Cache;
use tracing::Instrument;

use crate::credentials::Credential;

/// Where a registry is reached, for identities that sign in at the registry itself (ACR's token
/// exchange): its base URL (`https://name.azurecr.io/`, or that of the host standing for it,
/// `hosts.toml`'s `server`) and the registry client's HTTP client, under the address guard.
pub struct Origin<'a> {
    pub url: url::Url,
    pub http: &'a reqwest::Client,
}

/// A credential source for some registries, from Archer's own identity.
#[async_trait::async_trait]
pub trait RegistryIdentity: Send + Sync {
    /// Its name in errors and metrics (`ecr`, `acr`).
    fn name(&self) -> &'static str;
    /// Whether it signs in to `registry` (`host[:port]`, normalised).
    fn covers(&self, registry: &str) -> bool;
    /// A credential for `registry`, reached at `origin`; `Err` says why there is none.
    async fn credential(&self, registry: &str, origin: &Origin<'_>) -> Result<Credential, String>;
}

/// How long before its expiry a credential is refreshed.
pub const REFRESH_BEFORE: Duration = Duration::from_secs(5 * 60);
/// Registries (of one identity) whose credentials are kept at once.
const KEPT: u64 = 256;
/// Lookups running on tasks of their own at once (the fetch of each key and the lookups waiting
/// on it); past this many, a lookup runs on its caller's task, and a fetch it starts ends with it.
pub const DETACHED: usize = 256;
/// A fetch's bound, whatever its identity's own: the lookups waiting on it end by then.
pub const FETCH_BOUND: Duration = Duration::from_secs(30);

/// How long a failed fetch is answered from memory (so pods naming a registry whose sign-in
/// fails do not each ask the cloud again).
pub const FAILURE_TTL: Duration = Duration::from_secs(10);

/// Credentials by key (a registry, or an account and region), each kept until shortly before its
/// expiry, with one refresh at a time per key: concurrent lookups of a key share one fetch. A
/// failure is remembered for [`FAILURE_TTL`]. Each lookup runs on a task of its own (at most
/// [`DETACHED`] at once; past that, on the caller's), so a fetch ends (within [`FETCH_BOUND`])
/// and is kept whether or not the caller that began it still waits.
#[derive(Clone)]
pub struct TokenCache {
    kept: Cache<String, Arc<(Credential, SystemTime)>>,
    failed: Cache<String, String>,
    /// Sign-ins running on their own task, so that one outliving the pod that asked still ends
    /// in a kept credential (a cold sign-in slower than a pod's decision deadline would otherwise
    /// be dropped with that pod, and begun again, and dropped, by every pod after it).
    detached: Arc<tokio::sync::Semaphore>,
}

impl Default for TokenCache {
    fn default() -> Self {
        Self::new(FAILURE_TTL)
    }
}

impl TokenCache {
    /// A cache remembering failures for `failure_ttl`.
    pub fn new(failure_ttl: Duration) -> Self {
        Self {
            kept: Cache::builder().max_capacity(KEPT).time_to_live(Duration::from_secs(24 * 3600)).build(),
            failed: Cache::builder().max_capacity(KEPT).time_to_live(failure_ttl).build(),
            detached: Arc::new(tokio::sync::Semaphore::new(DETACHED)),
        }
    }

    /// The credential kept for `key` while it is valid for [`REFRESH_BEFORE`] more, else the one
    /// `fetch` returns (with its expiry), kept. A failed fetch is answered again for a while. The
    /// fetch goes on if the caller stops waiting (its pod's deadline), and what it returns is kept.
    pub async fn get<F, Fut>(&self, key: &str, fetch: F) -> Result<Credential, String>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<(Credential, SystemTime), String>> + Send + 'static,
    {
        let fresh = |e: &(Credential, SystemTime)| e.1.duration_since(SystemTime::now()).is_ok_and(|left| left > REFRESH_BEFORE);
        if let Some(hit) = self.kept.get(key).await {
            if fresh(&hit) {
                return Ok(hit.0.clone());
            }
            self.kept.invalidate(key).await;
        }
        if let Some(why) = self.failed.get(key).await {
            return Err(why);
        }
        let (kept, failed, key, fetching) = (self.kept.clone(), self.failed.clone(), key.to_string(), fetch());
        let bounded = async move {
            match tokio::time::timeout(FETCH_BOUND, fetching).await {
                Ok(got) => got.map(Arc::new),
                Err(_) => Err(format!("the sign-in did not end within {FETCH_BOUND:?}")),
            }
        };
        let sign_in = async move {
            match kept.try_get_with(key.clone(), bounded).await {
                Ok(got) => Ok(got.0.clone()),
                Err(e) => {
                    failed.insert(key, (*e).clone()).await;
                    Err((*e).clone())
                }
            }
        };
        match self.detached.clone().try_acquire_owned() {
            Ok(slot) => tokio::spawn(
                async move {
                    let _slot = slot;
                    sign_in.await
                }
                .in_current_span(),
            )
            .await
            .unwrap_or_else(|e| Err(format!("the sign-in stopped: {e}"))),
            Err(_) => sign_in.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn cred(p: &str) -> Credential {
        Credential { username: "AWS".into(), password: p.into() }
    }

    #[tokio::test]
    async fn kept_until_shortly_before_expiry_and_fetched_once_at_a_time() {
        let cache = TokenCache::new(Duration::from_millis(200));
        let calls = Arc::new(AtomicUsize::new(0));
        let fetch = |expires: SystemTime, p: &'static str| {
            let calls = calls.clone();
            move || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok((cred(p), expires))
            }
        };
        let hour = SystemTime::now() + Duration::from_secs(3600);
        // Ten at once: one fetch.
        let all = futures::future::join_all((0..10).map(|_| cache.get("123.dkr.ecr.eu-west-1", fetch(hour, "one")))).await;
        assert!(all.iter().all(|c| c.as_ref().ok() == Some(&cred("one"))));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Kept while it has more than five minutes left.
        assert_eq!(cache.get("123.dkr.ecr.eu-west-1", fetch(hour, "two")).await, Ok(cred("one")));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // One within five minutes of expiry is refreshed.
        let soon = SystemTime::now() + Duration::from_secs(60);
        assert_eq!(cache.get("other", fetch(soon, "soon")).await, Ok(cred("soon")));
        assert_eq!(cache.get("other", fetch(hour, "renewed")).await, Ok(cred("renewed")));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // A failure is answered from memory for a while, then asked again.
        assert_eq!(cache.get("bad", || async { Err("denied".to_string()) }).await, Err("denied".to_string()));
        assert_eq!(cache.get("bad", fetch(hour, "ok")).await, Err("denied".to_string()));
        assert_eq!(calls.load(Ordering::SeqCst), 3, "not asked while the failure is remembered");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(cache.get("bad", fetch(hour, "ok")).await, Ok(cred("ok")));
    }

    /// A sign-in slower than the pod that asked for it (its decision deadline) still ends in a
    /// kept credential: the next pod is answered from it, with no second fetch. (Before, the
    /// fetch was dropped with its caller, and every later pod began it again.)
    #[tokio::test]
    async fn a_sign_in_outlives_the_caller_that_stopped_waiting() {
        let cache = TokenCache::default();
        let calls = Arc::new(AtomicUsize::new(0));
        let slow = {
            let calls = calls.clone();
            move || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok((cred("slow"), SystemTime::now() + Duration::from_secs(3600)))
            }
        };
        let gave_up = tokio::time::timeout(Duration::from_millis(50), cache.get("eu-west-1", slow)).await;
        assert!(gave_up.is_err(), "the caller stopped waiting");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let again = {
            let calls = calls.clone();
            move || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok((cred("again"), SystemTime::now() + Duration::from_secs(3600)))
            }
        };
        assert_eq!(cache.get("eu-west-1", again).await, Ok(cred("slow")), "the first sign-in's credential was kept");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "one fetch");
    }
}
