//! Tokens for Azure Resource Manager through workload identity, as AKS sets it up: the
//! Kubernetes service account token projected into the pod (`AZURE_FEDERATED_TOKEN_FILE`) is
//! exchanged at Microsoft Entra ID for an access token (OAuth 2.0 client credentials with a JWT
//! client assertion). The file is read again at each exchange (kubelet rotates it); the token is
//! kept until five minutes before it expires.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::sync::Mutex;

use crate::wire::{error_chain, read_limited, ArmError};
use archer_cloud::settings::AzureConfig;

const PUBLIC_AUTHORITY: &str = "https://login.microsoftonline.com/";
/// The scope of Azure Resource Manager's tokens (the public cloud).
pub(crate) const ARM_SCOPE: &str = "https://management.azure.com/.default";
/// The scope of Azure Container Registry's data plane: a token for it manages nothing else.
pub(crate) const ACR_SCOPE: &str = "https://containerregistry.azure.net/.default";
const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// A token is exchanged again this long before it expires.
const EARLY: Duration = Duration::from_secs(300);
/// The longest federated token read.
const MAX_ASSERTION: u64 = 64 << 10;

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    expires_in: Option<serde_json::Value>,
}

pub struct Credential {
    http: reqwest::Client,
    token_url: reqwest::Url,
    client_id: String,
    token_file: PathBuf,
    /// What the tokens are for ([`ARM_SCOPE`], [`ACR_SCOPE`]).
    scope: &'static str,
    cached: Mutex<Option<(String, Instant)>>,
}

impl Credential {
    /// From the settings, falling back to the `AZURE_*` variables of the workload-identity webhook.
    pub(crate) fn workload_identity(http: reqwest::Client, settings: &AzureConfig) -> Result<Self, ArmError> {
        let env = |v: &str| std::env::var(v).ok().filter(|s| !s.trim().is_empty());
        let missing = |what: &str, var: &str| ArmError::Auth(format!("no {what}: set provisioner.azure.{what} or {var} (workload identity)"));
        let authority = settings.authority_host.clone().or_else(|| env("AZURE_AUTHORITY_HOST")).unwrap_or_else(|| PUBLIC_AUTHORITY.into());
        let tenant = settings.tenant_id.clone().or_else(|| env("AZURE_TENANT_ID")).ok_or_else(|| missing("tenantId", "AZURE_TENANT_ID"))?;
        let client_id = settings.client_id.clone().or_else(|| env("AZURE_CLIENT_ID")).ok_or_else(|| missing("clientId", "AZURE_CLIENT_ID"))?;
        let token_file = settings.federated_token_file.clone().or_else(|| env("AZURE_FEDERATED_TOKEN_FILE")).ok_or_else(|| missing("federatedTokenFile", "AZURE_FEDERATED_TOKEN_FILE"))?;
        // The federated token goes there: https (or loopback) only, whichever source named it.
        archer_cloud::settings::token_endpoint("the token authority (provisioner.azure.authorityHost, AZURE_AUTHORITY_HOST)", &authority).map_err(ArmError::Auth)?;
        let base = if authority.ends_with('/') { authority } else { format!("{authority}/") };
        let token_url = reqwest::Url::parse(&base).and_then(|u| u.join(&format!("{tenant}/oauth2/v2.0/token"))).map_err(|e| ArmError::Auth(format!("authority {base:?}: {e}")))?;
        Ok(Credential { http, token_url, client_id, token_file: token_file.into(), scope: ARM_SCOPE, cached: Mutex::new(None) })
    }

    /// The same identity's tokens for `scope` instead of Azure Resource Manager's.
    pub(crate) fn for_scope(mut self, scope: &'static str) -> Self {
        self.scope = scope;
        self
    }

    /// A token valid for at least five more minutes.
    pub async fn token(&self) -> Result<String, ArmError> {
        let mut cached = self.cached.lock().await;
        if let Some((token, until)) = cached.as_ref() {
            if Instant::now() + EARLY < *until {
                return Ok(token.clone());
            }
        }
        let (token, lifetime) = self.exchange().await?;
        *cached = Some((token.clone(), Instant::now() + lifetime));
        Ok(token)
    }

    async fn exchange(&self) -> Result<(String, Duration), ArmError> {
        let file = &self.token_file;
        let len = tokio::fs::metadata(file).await.map_err(|e| ArmError::Auth(format!("federated token {}: {e}", file.display())))?.len();
        if len > MAX_ASSERTION {
            return Err(ArmError::Auth(format!("federated token {} is {len} bytes", file.display())));
        }
        let assertion = tokio::fs::read_to_string(file).await.map_err(|e| ArmError::Auth(format!("federated token {}: {e}", file.display())))?;
        let form = [("client_id", self.client_id.as_str()), ("scope", self.scope), ("grant_type", "client_credentials"), ("client_assertion_type", ASSERTION_TYPE), ("client_assertion", assertion.trim())];
        let resp = self.http.post(self.token_url.clone()).form(&form).send().await.map_err(|e| ArmError::Auth(error_chain(&e)))?;
        let status = resp.status();
        let body = read_limited(resp).await?;
        if !status.is_success() {
            #[derive(Deserialize, Default)]
            struct Refusal {
                #[serde(default)]
                error: String,
                #[serde(default)]
                error_description: String,
            }
            let r: Refusal = serde_json::from_slice(&body).unwrap_or_default();
            let said: String = format!("{} {}", r.error, r.error_description).chars().take(300).collect();
            return Err(ArmError::Auth(format!("Microsoft Entra ID refused the federated token (HTTP {status}): {}", said.trim())));
        }
        let answer: TokenAnswer = serde_json::from_slice(&body).map_err(|e| ArmError::Auth(format!("token answer: {e}")))?;
        // `expires_in` is a number (or a string of one); absent: an hour, as Entra ID's default.
        let secs = match answer.expires_in {
            Some(serde_json::Value::Number(n)) => n.as_u64(),
            Some(serde_json::Value::String(s)) => s.parse().ok(),
            _ => None,
        }
        .unwrap_or(3600);
        Ok((answer.access_token, Duration::from_secs(secs.min(86_400))))
    }
}
