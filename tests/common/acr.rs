//! A local Azure Container Registry: ACR's token endpoints in front of the real `docker-registry`
//! with token authentication, on one host as ACR serves them.
//!
//! - `POST /oauth2/exchange` (`Authentication_ExchangeAadAccessTokenForAcrRefreshToken`) and
//!   `GET`/`POST /oauth2/token` (`Authentication_GetAcrAccessTokenFromLogin`,
//!   `Authentication_ExchangeAcrRefreshTokenForAcrAccessToken`) check every request against
//!   ACR's published data-plane model, as ACR's own client on PyPI carries it
//!   (`tests/azure/acr_model.py` reads azure-containerregistry 1.2.0: each operation's form
//!   fields, the required ones, the grant types, `api-version`), record what the model refuses,
//!   and mint registry tokens the real registry verifies (the issuer's certificate in its
//!   `rootcertbundle`).
//! - Everything else (`/v2/...`) passes through to the registry, headers included, so its
//!   `WWW-Authenticate` challenge names this host's `/oauth2/token` as the realm.
//!
//! What it cannot prove: how ACR checks the Microsoft Entra token (audience, tenant, AcrPull
//! role); here the token must be the one the local Entra stand-in (`arm.rs`) issues.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::json;

use super::token::Signer;
use super::Registry;

/// One operation of the model: its form fields, the required ones, its grant types, api-version.
#[derive(serde::Deserialize)]
struct Operation {
    fields: Vec<String>,
    required: Vec<String>,
    grant_type: Vec<String>,
    api_version: String,
}

#[derive(serde::Deserialize)]
struct Model {
    exchange: Operation,
    token: Operation,
}

/// The model, read from ACR's client once per test process.
fn model() -> &'static Model {
    static MODEL: std::sync::OnceLock<Model> = std::sync::OnceLock::new();
    MODEL.get_or_init(|| {
        let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/azure/acr_model.py");
        let out = std::process::Command::new(super::arm::sdk_python()).arg(&script).output().expect("run acr_model.py");
        assert!(out.status.success(), "acr_model.py (pip install azure-containerregistry==1.2.0; .ci/run does): {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("the model")
    })
}
/// The user ACR takes a refresh token with.
pub const TOKEN_USER: &str = "00000000-0000-0000-0000-000000000000";

struct State {
    /// The login server (`<name>.azurecr.io`): the `service` every request must name.
    service: String,
    /// The Microsoft Entra access token the exchange accepts.
    entra_token: String,
    tenant: String,
    signer: Signer,
    registry: String,
    http: reqwest::Client,
    refresh_tokens: Mutex<Vec<String>>,
    /// Requests the model refuses, and every exchange's and token request's form.
    pub violations: Mutex<Vec<String>>,
    pub exchanges: Mutex<usize>,
}

pub struct Acr {
    /// `127.0.0.1:port`: where the registry is reached (its `hosts.toml` `server`).
    pub host: String,
    state: Arc<State>,
    pub registry: Registry,
}

impl Acr {
    /// A registry for login server `service` serving `storage` (pushed to by an open registry
    /// beforehand), whose exchange takes `entra_token` of `tenant`.
    pub async fn start(dir: &std::path::Path, storage: &std::path::Path, service: &str, entra_token: &str, tenant: &str) -> Acr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let host = listener.local_addr().expect("addr").to_string();
        let signer = Signer::new(dir);
        let registry = Registry::serve_storage(storage, &signer.auth_yaml(&format!("http://{host}/oauth2/token"), service)).await;
        let state = Arc::new(State {
            service: service.to_string(),
            entra_token: entra_token.to_string(),
            tenant: tenant.to_string(),
            signer,
            registry: registry.host.clone(),
            http: reqwest::Client::new(),
            refresh_tokens: Mutex::new(Vec::new()),
            violations: Mutex::new(Vec::new()),
            exchanges: Mutex::new(0),
        });
        let shared = state.clone();
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let state = shared.clone();
            async move { handle(&state, method, uri, headers, body).await }
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        Acr { host, state, registry }
    }

    pub fn violations(&self) -> Vec<String> {
        self.state.violations.lock().expect("lock").clone()
    }

    pub fn exchanges(&self) -> usize {
        *self.state.exchanges.lock().expect("lock")
    }
}

fn refuse(state: &State, status: StatusCode, why: String) -> Response {
    state.violations.lock().expect("lock").push(why.clone());
    (status, axum::Json(json!({"errors": [{"code": "UNAUTHORIZED", "message": why}]}))).into_response()
}

/// A request against one operation of the model: every form field one it names, the required
/// ones present, the grant type one of its own, its api-version.
fn check_form(op: &Operation, form: &BTreeMap<String, String>, query: &BTreeMap<String, String>) -> Result<(), String> {
    if let Some(k) = form.keys().find(|k| !op.fields.contains(k)) {
        return Err(format!("form field {k:?} is not in the model"));
    }
    if let Some(k) = op.required.iter().find(|k| !form.contains_key(*k)) {
        return Err(format!("required form field {k:?} missing"));
    }
    if let Some(g) = form.get("grant_type").filter(|g| !op.grant_type.contains(g)) {
        return Err(format!("grant_type={g:?} is not one of {:?}", op.grant_type));
    }
    if query.get("api-version") != Some(&op.api_version) {
        return Err(format!("api-version {:?}, the model's is {}", query.get("api-version"), op.api_version));
    }
    Ok(())
}

async fn handle(state: &State, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let query: BTreeMap<String, String> = url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()).into_owned().collect();
    let form_body = headers.get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
    let form: BTreeMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
    match (method.clone(), uri.path()) {
        (Method::POST, "/oauth2/exchange") => {
            let checked = check_form(&model().exchange, &form, &query).and_then(|()| if form_body { Ok(()) } else { Err("the exchange must be application/x-www-form-urlencoded".into()) });
            if let Err(why) = checked {
                return refuse(state, StatusCode::BAD_REQUEST, format!("exchange: {why}"));
            }
            *state.exchanges.lock().expect("lock") += 1;
            let ok = form.get("grant_type").map(String::as_str) == Some("access_token")
                && form.get("access_token") == Some(&state.entra_token)
                && form.get("service") == Some(&state.service)
                && form.get("tenant").is_none_or(|t| *t == state.tenant);
            if !ok {
                return refuse(state, StatusCode::UNAUTHORIZED, format!("exchange refused: {:?}", form.keys().collect::<Vec<_>>()));
            }
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
            let b64 = |v: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
            let refresh = format!("{}.{}.sig{}", b64(json!({"alg": "RS256", "typ": "JWT"})), b64(json!({"exp": now + 3 * 3600, "grant_type": "refresh_token", "iss": "Azure Container Registry", "aud": state.service})), now);
            state.refresh_tokens.lock().expect("lock").push(refresh.clone());
            axum::Json(json!({"refresh_token": refresh})).into_response()
        }
        (Method::GET, "/oauth2/token") | (Method::POST, "/oauth2/token") => {
            // GET: login (basic: the token user and a refresh token); POST: refresh_token grant.
            let (service, scope, refresh) = if method == Method::GET {
                let basic = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Basic ")).and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok()).and_then(|b| String::from_utf8(b).ok());
                let refresh = basic.as_deref().and_then(|b| b.split_once(':')).filter(|(u, _)| *u == TOKEN_USER).map(|(_, p)| p.to_string());
                if !query.contains_key("service") || !query.contains_key("scope") {
                    return refuse(state, StatusCode::BAD_REQUEST, format!("token (GET): service and scope are required: {query:?}"));
                }
                (query.get("service").cloned(), query.get("scope").cloned(), refresh)
            } else {
                if let Err(why) = check_form(&model().token, &form, &query) {
                    return refuse(state, StatusCode::BAD_REQUEST, format!("token (POST): {why}"));
                }
                (form.get("service").cloned(), form.get("scope").cloned(), form.get("refresh_token").cloned())
            };
            let known = refresh.is_some_and(|r| state.refresh_tokens.lock().expect("lock").contains(&r));
            if service.as_deref() != Some(&state.service) || !known {
                return (StatusCode::UNAUTHORIZED, axum::Json(json!({"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]}))).into_response();
            }
            let scope = scope.unwrap_or_default();
            let mut parts = scope.splitn(3, ':');
            let (kind, name, actions) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            // AcrPull: pull only.
            let granted: Vec<&str> = actions.split(',').filter(|a| *a == "pull").collect();
            let access = if kind == "repository" { json!([{"type": "repository", "name": name, "actions": granted}]) } else { json!([]) };
            match state.signer.mint(&state.service, TOKEN_USER, access) {
                Ok(t) => axum::Json(json!({"access_token": t})).into_response(),
                Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
            }
        }
        _ => proxy(state, method, &uri, &headers, body).await,
    }
}

/// Pass a registry request through, every header both ways but `Host`.
async fn proxy(state: &State, method: Method, uri: &Uri, headers: &HeaderMap, body: Bytes) -> Response {
    let mut req = state.http.request(method, format!("http://{}{uri}", state.registry)).body(body);
    for (k, v) in headers {
        if k != axum::http::header::HOST {
            req = req.header(k, v);
        }
    }
    match req.send().await {
        Ok(r) => {
            let status = r.status();
            let headers = r.headers().clone();
            let mut resp = (status, r.bytes().await.unwrap_or_default()).into_response();
            for (k, v) in &headers {
                if k != axum::http::header::CONTENT_LENGTH && k != axum::http::header::TRANSFER_ENCODING {
                    resp.headers_mut().insert(k.clone(), v.clone());
                }
            }
            resp
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
