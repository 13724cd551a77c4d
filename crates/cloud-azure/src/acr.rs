//! Private ACR images read with Archer's own workload identity, as AKS nodes pull them with the
//! kubelet identity (AcrPull) and no pull secret. As ACR's data-plane API documents
//! (`Authentication_ExchangeAadAccessTokenForAcrRefreshToken`, 2021-07-01): a Microsoft Entra
//! token from the provider's workload identity exchange ([`crate::auth`]), scoped to ACR's data
//! plane alone (`https://containerregistry.azure.net`, never Resource Manager's), is exchanged at
//! `POST https://<registry>/oauth2/exchange` (form `grant_type=access_token`, `service`,
//! `tenant`, `access_token`) for an ACR refresh token. That token is the credential (user
//! `00000000-0000-0000-0000-000000000000`): the registry client's challenge answer trades it at
//! the registry's `/oauth2/token` realm for a pull-scoped access token, as `docker login` with a
//! token does. Refresh tokens are kept until five minutes before their `exp`, one exchange at a
//! time per registry.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine;
use reqwest::Url;
use serde::Deserialize;

use archer_cloud::settings::AzureConfig;
use archer_registry::identity::Origin;
use archer_registry::{Credential, RegistryIdentity, TokenCache};

use crate::auth;

/// The user ACR takes a refresh token with.
pub const TOKEN_USER: &str = "00000000-0000-0000-0000-000000000000";
/// The data-plane API version asked.
const API_VERSION: &str = "2021-07-01";
/// A refresh token's lifetime when it names none (ACR's are three hours).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3 * 3600);
/// Largest exchange answer read.
const MAX_ANSWER: usize = 64 << 10;
/// The exchange's bound.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether `registry` is an ACR login server (`<name>.azurecr.io`, and the sovereign clouds').
pub fn is_acr(registry: &str) -> bool {
    let host = registry.split(':').next().unwrap_or(registry);
    [".azurecr.io", ".azurecr.cn", ".azurecr.us"].iter().any(|s| host.strip_suffix(s).is_some_and(|name| !name.is_empty() && !name.contains('.')))
}

/// Archer's ACR sign-in.
pub struct Acr {
    /// The workload identity exchange, or why there is none (missing settings).
    entra: Result<Arc<auth::Credential>, String>,
    tenant: Option<String>,
    tokens: TokenCache,
}

impl Acr {
    /// From the workload identity settings (`tenantId`, `clientId`, `federatedTokenFile`,
    /// `authorityHost`), each falling back to the `AZURE_*` variable the workload identity
    /// webhook sets. Missing settings are said at the first ACR image, not at start: a cluster
    /// whose ACR images all have pull secrets needs none.
    pub fn from_workload_identity(settings: &AzureConfig) -> Acr {
        let tenant = settings.tenant_id.clone().or_else(|| std::env::var("AZURE_TENANT_ID").ok()).filter(|t| !t.trim().is_empty());
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap_or_default();
        let entra = auth::Credential::workload_identity(http, settings).map(|c| Arc::new(c.for_scope(auth::ACR_SCOPE))).map_err(|e| e.to_string());
        Acr { entra, tenant, tokens: TokenCache::default() }
    }
}

/// Exchange the identity's Entra token for `registry`'s refresh token at `url` (the registry's
/// own, or that of the host standing for it): owned arguments, so the exchange can run on a task
/// of its own ([`TokenCache`]).
async fn exchange(entra: Result<Arc<auth::Credential>, String>, tenant: Option<String>, registry: String, url: Url, http: reqwest::Client) -> Result<(Credential, SystemTime), String> {
    let entra = entra?;
    let aad = entra.token().await.map_err(|e| e.to_string())?;
    let mut url = url.join("oauth2/exchange").map_err(|e| format!("{url}: {e}"))?;
    url.query_pairs_mut().append_pair("api-version", API_VERSION);
    let mut form = vec![("grant_type", "access_token"), ("service", registry.as_str()), ("access_token", aad.as_str())];
    if let Some(t) = &tenant {
        form.push(("tenant", t));
    }
    let mut resp = http.post(url.clone()).form(&form).timeout(EXCHANGE_TIMEOUT).send().await.map_err(|e| format!("POST {url}: {e}"))?;
    let status = resp.status();
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| format!("POST {url}: {e}"))? {
        if body.len() + chunk.len() > MAX_ANSWER {
            return Err(format!("POST {url}: an answer over {MAX_ANSWER} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        let said: String = String::from_utf8_lossy(&body).chars().take(300).collect();
        return Err(format!("ACR refused the token exchange (HTTP {status}): {}", said.trim()));
    }
    #[derive(Deserialize)]
    struct Answer {
        refresh_token: String,
    }
    let answer: Answer = serde_json::from_slice(&body).map_err(|e| format!("the exchange's answer: {e}"))?;
    let expires = expiry(&answer.refresh_token).unwrap_or_else(|| SystemTime::now() + DEFAULT_LIFETIME);
    Ok((Credential { username: TOKEN_USER.to_string(), password: answer.refresh_token }, expires))
}

/// A JWT's `exp`, unverified (only to know when to exchange again).
fn expiry(jwt: &str) -> Option<SystemTime> {
    let payload = jwt.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let exp = serde_json::from_slice::<serde_json::Value>(&bytes).ok()?.get("exp")?.as_u64()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(exp))
}

#[async_trait::async_trait]
impl RegistryIdentity for Acr {
    fn name(&self) -> &'static str {
        "acr"
    }

    fn covers(&self, registry: &str) -> bool {
        is_acr(registry)
    }

    async fn credential(&self, registry: &str, origin: &Origin<'_>) -> Result<Credential, String> {
        let (entra, tenant, asked, url, http) = (self.entra.clone(), self.tenant.clone(), registry.to_string(), origin.url.clone(), origin.http.clone());
        self.tokens.get(registry, move || exchange(entra, tenant, asked, url, http)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acr_login_servers_and_token_expiry() {
        assert!(is_acr("myregistry.azurecr.io") && is_acr("contoso.azurecr.cn") && is_acr("gov.azurecr.us:443"));
        for not in ["azurecr.io", ".azurecr.io", "a.b.azurecr.io", "myregistry.azurecr.io.evil.example", "docker.io"] {
            assert!(!is_acr(not), "{not}");
        }
        let b64 = |v: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let jwt = format!("{}.{}.sig", b64(serde_json::json!({"alg": "RS256"})), b64(serde_json::json!({"exp": 2_000_000_000u64})));
        assert_eq!(expiry(&jwt), SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(2_000_000_000)));
        assert_eq!(expiry("not-a-jwt"), None);
    }
}
