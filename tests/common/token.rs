//! A token issuer for the registry's bearer-token auth (`auth: token:`). The registry that checks
//! the tokens is the real distribution server; only the issuer is ours, since no token service
//! ships as a Debian package. It signs ES256 JWTs with an `x5c` header the registry verifies
//! against its `rootcertbundle`.

use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use base64::Engine;
use serde_json::json;

pub const SERVICE: &str = "archer-test-registry";
pub const ISSUER: &str = "archer-test-issuer";

/// Signs registry tokens: ES256 JWTs whose `x5c` header carries a self-signed certificate the
/// registry trusts (its `rootcertbundle`).
#[derive(Clone)]
pub struct Signer {
    key: Arc<jsonwebtoken::EncodingKey>,
    cert_der_b64: String,
    /// The certificate bundle the registry must trust.
    pub bundle: std::path::PathBuf,
}

impl Signer {
    /// A new key and certificate; the bundle is written in `dir`.
    pub fn new(dir: &Path) -> Signer {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec!["archer-test-issuer".to_string()]).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("cert");
        let bundle = dir.join("token-signer.crt");
        std::fs::write(&bundle, cert.pem()).expect("bundle");
        let enc = jsonwebtoken::EncodingKey::from_ec_pem(key.serialize_pem().as_bytes()).expect("ec key");
        Signer { key: Arc::new(enc), cert_der_b64: base64::engine::general_purpose::STANDARD.encode(cert.der()), bundle }
    }

    /// A token for `service` granting `access` (the registry's `access` claim) to `sub`.
    pub fn mint(&self, service: &str, sub: &str, access: serde_json::Value) -> Result<String, jsonwebtoken::errors::Error> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
        let claims = json!({"iss": ISSUER, "sub": sub, "aud": service, "exp": now + 300, "nbf": now - 10, "iat": now, "jti": format!("{now}-{sub}-{access}"), "access": access});
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.x5c = Some(vec![self.cert_der_b64.clone()]);
        jsonwebtoken::encode(&header, &claims, &self.key)
    }

    /// The registry's `auth:` section trusting this signer, its tokens asked at `realm`.
    pub fn auth_yaml(&self, realm: &str, service: &str) -> String {
        format!("auth:\n  token:\n    realm: {realm}\n    service: {service}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n", self.bundle.display())
    }
}

#[derive(Clone)]
struct Issuer {
    signer: Signer,
    /// repositories under this prefix need the credential below
    private_prefix: String,
    credential: (String, String),
    /// (scope, whether basic credentials came with the request)
    pub seen: Arc<Mutex<Vec<(String, bool)>>>,
}

pub struct TokenService {
    pub realm: String,
    pub seen: Arc<Mutex<Vec<(String, bool)>>>,
    /// The `auth:` section for a registry config trusting this issuer.
    pub auth_yaml: String,
}

#[derive(serde::Deserialize)]
struct TokenQuery {
    #[serde(default)]
    scope: String,
    #[serde(default)]
    service: String,
}

async fn token(State(issuer): State<Issuer>, Query(q): Query<TokenQuery>, headers: HeaderMap) -> impl IntoResponse {
    let basic = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok());
    issuer.seen.lock().expect("lock").push((q.scope.clone(), basic.is_some()));
    let authenticated = basic.as_deref() == Some(&format!("{}:{}", issuer.credential.0, issuer.credential.1));
    if basic.is_some() && !authenticated {
        return (StatusCode::UNAUTHORIZED, Json(json!({"details": "bad credentials"}))).into_response();
    }
    // scope = repository:<name>:<actions>
    let mut parts = q.scope.splitn(3, ':');
    let (kind, name, actions) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let allowed = kind == "repository" && (authenticated || !name.starts_with(&issuer.private_prefix));
    let access = if allowed { json!([{"type": "repository", "name": name, "actions": actions.split(',').collect::<Vec<_>>()}]) } else { json!([]) };
    match issuer.signer.mint(&q.service, if authenticated { "puller" } else { "" }, access) {
        Ok(t) => Json(json!({"token": t, "expires_in": 300})).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

impl TokenService {
    /// Start the issuer; `dir` receives the signer certificate the registry must trust.
    pub async fn start(dir: &Path, private_prefix: &str, user: &str, pass: &str) -> TokenService {
        let signer = Signer::new(dir);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let issuer = Issuer {
            signer: signer.clone(),
            private_prefix: private_prefix.to_string(),
            credential: (user.to_string(), pass.to_string()),
            seen: seen.clone(),
        };
        let app = axum::Router::new().route("/token", axum::routing::get(token)).with_state(issuer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        let realm = format!("http://{addr}/token");
        let auth_yaml = signer.auth_yaml(&realm, SERVICE);
        TokenService { realm, seen, auth_yaml }
    }
}
