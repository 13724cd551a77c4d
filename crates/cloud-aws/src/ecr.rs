//! Private ECR images read with Archer's own AWS identity (IRSA, EKS Pod Identity, the instance
//! role: the SDK's standard chain), as nodes pull them with theirs and no pull secret.
//!
//! `GetAuthorizationToken` in the registry's region gives a token (`AWS:<password>`, base64) for
//! every ECR registry the principal may read there, other accounts' included (its `registryIds`
//! parameter is deprecated and changes nothing). One token per region is kept until five minutes
//! before its `expiresAt` (12 hours after it was issued), with one refresh at a time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::Engine;

use archer_registry::identity::Origin;
use archer_registry::{Credential, RegistryIdentity, TokenCache};

/// An ECR registry's account and region, from its host name:
/// `<account>.dkr.ecr[-fips].<region>.amazonaws.com[.cn]` or the dual-stack
/// `<account>.dkr-ecr[-fips].<region>.on.aws`. `None` for any other host (ECR Public,
/// `public.ecr.aws`, takes anonymous tokens and needs none).
pub fn registry_of(host: &str) -> Option<(String, String)> {
    let host = host.split(':').next().unwrap_or(host);
    let (account, rest) = host.split_once('.')?;
    if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let region_of = |rest: &str, prefixes: &[&str], suffixes: &[&str]| {
        let after = prefixes.iter().find_map(|p| rest.strip_prefix(p))?;
        let region = suffixes.iter().find_map(|s| after.strip_suffix(s))?;
        let valid = !region.is_empty() && region.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') && region.contains('-');
        valid.then(|| region.to_string())
    };
    let region = region_of(rest, &["dkr.ecr-fips.", "dkr.ecr."], &[".amazonaws.com.cn", ".amazonaws.com"]).or_else(|| region_of(rest, &["dkr-ecr-fips.", "dkr-ecr."], &[".on.aws"]))?;
    // A region as AWS names them (`us-east-1`, `us-gov-west-1`, `ap-southeast-2`), China's alone
    // under `.amazonaws.com.cn` (so `<12 digits>.dkr.ecr.s3-website-...` is no ECR host).
    let parts: Vec<&str> = region.split('-').collect();
    let named = parts.len() >= 3
        && parts.first().is_some_and(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_lowercase()))
        && parts.last().is_some_and(|p| !p.is_empty() && p.len() <= 2 && p.bytes().all(|b| b.is_ascii_digit()))
        && parts.iter().skip(1).take(parts.len() - 2).all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()));
    let china = region.starts_with("cn-");
    (named && china == host.ends_with(".amazonaws.com.cn")).then(|| (account.to_string(), region))
}

/// Regions whose client is kept.
const CLIENTS: usize = 32;

/// Archer's ECR sign-in: one `GetAuthorizationToken` client per region, tokens kept by region.
pub struct Ecr {
    clients: Arc<Clients>,
    tokens: TokenCache,
}

/// What a sign-in needs, shared with the sign-ins running on their own tasks.
struct Clients {
    /// The SDK's configuration: given, or read from the standard chain on first use.
    sdk: tokio::sync::OnceCell<aws_config::SdkConfig>,
    endpoint: Option<String>,
    by_region: Mutex<HashMap<String, aws_sdk_ecr::Client>>,
}

/// One `GetAuthorizationToken` call's bound, its retries included (the SDK sets none).
const SIGN_IN_TIMEOUT: Duration = Duration::from_secs(10);

impl Ecr {
    /// Sign in with `sdk`'s credentials; `endpoint` replaces ECR's API endpoint (a VPC endpoint,
    /// or moto in tests).
    pub fn new(sdk: &aws_config::SdkConfig, endpoint: Option<String>) -> Ecr {
        Ecr::with(tokio::sync::OnceCell::new_with(Some(sdk.clone())), endpoint)
    }

    /// Sign in with the standard chain's credentials (IRSA, EKS Pod Identity, the instance
    /// role), read when the first ECR image is; `AWS_ENDPOINT_URL_ECR` is honoured.
    pub fn from_chain(endpoint: Option<String>) -> Ecr {
        Ecr::with(tokio::sync::OnceCell::new(), endpoint)
    }

    fn with(sdk: tokio::sync::OnceCell<aws_config::SdkConfig>, endpoint: Option<String>) -> Ecr {
        Ecr { clients: Arc::new(Clients { sdk, endpoint, by_region: Mutex::new(HashMap::new()) }), tokens: TokenCache::default() }
    }
}

impl Clients {
    /// The region's client: kept for at most [`CLIENTS`] regions (image names, and so regions,
    /// are the tenants' to choose), built afresh past that.
    async fn client(&self, region: &str) -> aws_sdk_ecr::Client {
        let sdk = self.sdk.get_or_init(|| async { crate::sdk_config(&archer_cloud::settings::AwsConfig::default()).await }).await;
        let build = || {
            let timeouts = aws_sdk_ecr::config::timeout::TimeoutConfig::builder().operation_timeout(SIGN_IN_TIMEOUT).build();
            let mut conf = aws_sdk_ecr::config::Builder::from(sdk).region(aws_config::Region::new(region.to_string())).timeout_config(timeouts);
            if let Some(e) = &self.endpoint {
                conf = conf.endpoint_url(e);
            }
            aws_sdk_ecr::Client::from_conf(conf.build())
        };
        let mut clients = self.by_region.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clients.get(region) {
            return c.clone();
        }
        let client = build();
        if clients.len() < CLIENTS {
            clients.insert(region.to_string(), client.clone());
        }
        client
    }

    /// A fresh token for `region`: the credential and when it expires.
    async fn fetch(&self, region: &str) -> Result<(Credential, SystemTime), String> {
        let ecr = self.client(region).await;
        let out = ecr.get_authorization_token().send().await.map_err(|e| format!("GetAuthorizationToken in {region}: {}", aws_sdk_ecr::error::DisplayErrorContext(&e)))?;
        let data = out.authorization_data().first().ok_or_else(|| format!("GetAuthorizationToken in {region} returned no authorization data"))?;
        let token = data.authorization_token().ok_or_else(|| "the authorization data has no token".to_string())?;
        let decoded = base64::engine::general_purpose::STANDARD.decode(token.trim()).map_err(|_| "the token is not base64".to_string())?;
        let text = String::from_utf8(decoded).map_err(|_| "the token is not UTF-8".to_string())?;
        let (username, password) = text.split_once(':').ok_or_else(|| "the token is not user:password".to_string())?;
        // Without an expiry, the documented 12 hours.
        let expires = data.expires_at().and_then(|t| SystemTime::try_from(*t).ok()).unwrap_or_else(|| SystemTime::now() + std::time::Duration::from_secs(12 * 3600));
        Ok((Credential { username: username.to_string(), password: password.to_string() }, expires))
    }
}

#[async_trait::async_trait]
impl RegistryIdentity for Ecr {
    fn name(&self) -> &'static str {
        "ecr"
    }

    fn covers(&self, registry: &str) -> bool {
        registry_of(registry).is_some()
    }

    async fn credential(&self, registry: &str, _origin: &Origin<'_>) -> Result<Credential, String> {
        let (_, region) = registry_of(registry).ok_or_else(|| format!("{registry} is not an ECR registry"))?;
        let clients = self.clients.clone();
        let asked = region.clone();
        self.tokens.get(&region, move || async move { clients.fetch(&asked).await }).await
    }
}

#[cfg(test)]
mod tests {
    use super::registry_of;

    #[test]
    fn ecr_host_names_give_the_account_and_region() {
        let of = |h: &str| registry_of(h).map(|(a, r)| format!("{a}/{r}"));
        assert_eq!(of("123456789012.dkr.ecr.eu-west-1.amazonaws.com").as_deref(), Some("123456789012/eu-west-1"));
        assert_eq!(of("123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com").as_deref(), Some("123456789012/us-gov-west-1"));
        assert_eq!(of("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn").as_deref(), Some("123456789012/cn-north-1"));
        assert_eq!(of("123456789012.dkr-ecr.ap-south-2.on.aws").as_deref(), Some("123456789012/ap-south-2"));
        assert_eq!(of("123456789012.dkr.ecr.eu-west-1.amazonaws.com:443").as_deref(), Some("123456789012/eu-west-1"));
        assert_eq!(of("123456789012.dkr.ecr.us-gov-west-1.amazonaws.com").as_deref(), Some("123456789012/us-gov-west-1"));
        for not in [
            "public.ecr.aws",
            "docker.io",
            "12345.dkr.ecr.eu-west-1.amazonaws.com",
            "123456789012.dkr.ecr.amazonaws.com",
            "123456789012.dkr.ecr.eu-west-1.amazonaws.com.evil.example",
            "123456789012.dkr.ecr.EU.amazonaws.com",
            "abcdefghijkl.dkr.ecr.eu-west-1.amazonaws.com",
            // An S3 website bucket named like an ECR host, and regions of the wrong partition.
            "123456789012.dkr.ecr.s3-website-us-east-1.amazonaws.com",
            "123456789012.dkr.ecr.cn-north-1.amazonaws.com",
            "123456789012.dkr.ecr.eu-west-1.amazonaws.com.cn",
            "123456789012.dkr.ecr.a-1.amazonaws.com",
        ] {
            assert_eq!(of(not), None, "{not}");
        }
    }
}
