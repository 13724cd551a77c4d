//! Registry credentials from docker config JSON: `kubernetes.io/dockerconfigjson` and legacy
//! `kubernetes.io/dockercfg` pull secrets, and a mounted `config.json`.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::reference::normalise_registry;

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Credential {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential").field("username", &self.username).field("password", &"<redacted>").finish()
    }
}

impl Credential {
    /// Short stable fingerprint, so cached results are never shared across different credentials.
    pub fn fingerprint(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.username.as_bytes());
        h.update([0]);
        h.update(self.password.as_bytes());
        hex::encode(h.finalize().get(..8).unwrap_or_default())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("docker config is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("docker config entry for {0:?} has an auth field that is not base64 user:password")]
    BadAuth(String),
}

#[derive(Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

#[derive(Deserialize)]
struct DockerConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

/// Credentials by registry, in the order they were added (first match wins, as in the kubelet):
/// a pod's own (its pull secrets and its service account's), then a fallback (the mounted docker
/// config), which Archer's cloud identity comes before.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    entries: Vec<(String, Credential)>,
    fallback: Vec<(String, Credential)>,
}

impl Keyring {
    /// Parse `.dockerconfigjson` (`{"auths": {...}}`) or legacy `.dockercfg` (the map itself).
    pub fn parse(bytes: &[u8]) -> Result<Keyring, CredentialError> {
        let value: serde_json::Value = serde_json::from_slice(bytes)?;
        let auths: BTreeMap<String, AuthEntry> = if value.get("auths").is_some() {
            serde_json::from_value::<DockerConfigJson>(value)?.auths
        } else {
            serde_json::from_value(value)?
        };
        let mut ring = Keyring::default();
        for (server, entry) in auths {
            let cred = match (entry.username, entry.password, entry.auth) {
                (Some(u), Some(p), _) if !u.is_empty() => Credential { username: u, password: p },
                (_, _, Some(auth)) if !auth.is_empty() => {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(auth.trim())
                        .map_err(|_| CredentialError::BadAuth(server.clone()))?;
                    let text = String::from_utf8(decoded).map_err(|_| CredentialError::BadAuth(server.clone()))?;
                    let (u, p) = text.split_once(':').ok_or_else(|| CredentialError::BadAuth(server.clone()))?;
                    Credential { username: u.to_string(), password: p.to_string() }
                }
                _ => continue,
            };
            if let Some(key) = pattern(&server) {
                ring.entries.push((key, cred));
            }
        }
        Ok(ring)
    }

    pub fn extend(&mut self, other: Keyring) {
        self.entries.extend(other.entries);
        self.fallback.extend(other.fallback);
    }

    /// This keyring with every entry of `base` after its own, as the fallback.
    pub fn with_fallback(mut self, base: Keyring) -> Keyring {
        self.fallback.extend(base.entries);
        self.fallback.extend(base.fallback);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.fallback.is_empty()
    }

    /// The credential for a registry (`host[:port]`); `*.example.com` entries match subdomains.
    pub fn lookup(&self, registry: &str) -> Option<&Credential> {
        self.own(registry).or_else(|| self.fallback(registry))
    }

    /// The credential for a registry among the pod's own entries.
    pub fn own(&self, registry: &str) -> Option<&Credential> {
        self.entries.iter().find(|(k, _)| matches(k, registry)).map(|(_, c)| c)
    }

    /// The credential for a registry among the fallback entries.
    pub fn fallback(&self, registry: &str) -> Option<&Credential> {
        self.fallback.iter().find(|(k, _)| matches(k, registry)).map(|(_, c)| c)
    }
}

fn pattern(server: &str) -> Option<String> {
    if let Some(rest) = server.trim().strip_prefix("*.") {
        return normalise_registry(rest).map(|r| format!("*.{r}"));
    }
    normalise_registry(server)
}

fn matches(pattern: &str, registry: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => registry.strip_suffix(suffix).is_some_and(|head| head.ends_with('.') && head.len() > 1),
        None => pattern == registry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn parses_dockerconfigjson_and_legacy_dockercfg() {
        let json = format!(
            r#"{{"auths": {{"https://index.docker.io/v1/": {{"auth": "{}"}}, "registry.example.com:5000": {{"username": "u2", "password": "p:2"}}, "*.corp.example": {{"auth": "{}"}}}}}}"#,
            b64("hub:secret"),
            b64("corp:pw")
        );
        let ring = Keyring::parse(json.as_bytes()).expect("parse");
        assert_eq!(ring.lookup("docker.io").map(|c| c.username.as_str()), Some("hub"));
        assert_eq!(ring.lookup("registry.example.com:5000").map(|c| c.password.as_str()), Some("p:2"));
        assert_eq!(ring.lookup("eu.corp.example").map(|c| c.username.as_str()), Some("corp"));
        assert!(ring.lookup("corp.example").is_none());
        assert!(ring.lookup("registry.example.com").is_none(), "ports must match");

        let legacy = format!(r#"{{"quay.io": {{"auth": "{}", "email": "x@y"}}}}"#, b64("q:w"));
        assert_eq!(Keyring::parse(legacy.as_bytes()).expect("legacy").lookup("quay.io").map(|c| c.username.as_str()), Some("q"));
    }

    #[test]
    fn bad_auth_and_json_are_errors_and_passwords_never_print() {
        assert!(Keyring::parse(br#"{"auths": {"r.io": {"auth": "%%%"}}}"#).is_err());
        assert!(Keyring::parse(b"not json").is_err());
        let c = Credential { username: "u".into(), password: "hunter2".into() };
        assert!(!format!("{c:?}").contains("hunter2"));
        assert_ne!(c.fingerprint(), Credential { username: "u".into(), password: "other".into() }.fingerprint());
    }
}
