//! Archer's own cloud identity as a registry credential: for images in the cloud's private
//! registry (ECR, ACR) that pods pull with the node's identity and no pull secret. A pod's own
//! pull secrets come first, then the identity, then the mounted docker config
//! ([`crate::Inspector`]). Implementations live with their cloud (`archer-cloud-aws`'s ECR);
//! [`TokenCache`] keeps their short-lived credentials.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use moka::future::Cache;

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

/// How long a failed fetch is answered from memory (so pods naming a registry whose sign-in
/// fails do not each ask the cloud again).
pub const FAILURE_TTL: Duration = Duration::from_secs(10);

/// Credentials by key (a registry, or an account and region), each kept until shortly before its
/// expiry, with one refresh at a time per key: concurrent lookups of a key share one fetch. A
/// failure is remembered for [`FAILURE_TTL`].
#[derive(Clone)]
pub struct TokenCache {
    kept: Cache<String, Arc<(Credential, SystemTime)>>,
    failed: Cache<String, String>,
}

impl Default for TokenCache {
    fn default() -> Self {
        Self::new(FAILURE_TTL)
    }
}

impl TokenCache {
    /// A cache remembering failures for `failure_ttl`.
    pub fn new(failure_ttl: Duration) -> Self {
        Self { kept: Cache::builder().max_capacity(KEPT).time_to_live(Duration::from_secs(24 * 3600)).build(), failed: Cache::builder().max_capacity(KEPT).time_to_live(failure_ttl).build() }
    }

    /// The credential kept for `key` while it is valid for [`REFRESH_BEFORE`] more, else the one
    /// `fetch` returns (with its expiry), kept. A failed fetch is answered again for a while.
    pub async fn get<F, Fut>(&self, key: &str, fetch: F) -> Result<Credential, String>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<(Credential, SystemTime), String>>,
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
        match self.kept.try_get_with(key.to_string(), async { fetch().await.map(Arc::new) }).await {
            Ok(got) => Ok(got.0.clone()),
            Err(e) => {
                self.failed.insert(key.to_string(), (*e).clone()).await;
                Err((*e).clone())
            }
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
}
