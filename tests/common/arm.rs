//! A local Azure Resource Manager (and Microsoft Entra ID token endpoint) for the Azure provider's
//! tests. No emulator of ARM compute runs here, so this server stands in for it, and checks
//! rather than trusts:
//!
//! - every request's body against that operation's JSON Schema, made at test time from Azure's
//!   official management SDKs on PyPI (`tests/azure/arm_schemas.py`, azure-mgmt-compute 39.0.0
//!   and azure-mgmt-network 33.1.0, generated from azure-rest-api-specs), with a real JSON Schema
//!   validator (the `jsonschema` crate); a request that fails is answered 400
//!   `InvalidRequestContent` and recorded as a violation, which every test asserts is empty;
//! - its own answers against the operation's response schema (a violation too);
//! - the api-version of each operation (the SDK's), the bearer token, the token exchange's form.
//!
//! It answers as the specification's examples do: `201` with the resource and
//! `provisioningState: Creating`, an `Azure-AsyncOperation` header to poll, operation statuses
//! `InProgress` then `Succeeded` or `Failed` with an error, ARM's `{"error": {"code", "message"}}`.
//! Faults are switched on by tests: a size not available in a zone (`SkuNotAvailable`, at once),
//! an allocation failing (`AllocationFailed`, in the operation), a family's quota used up
//! (`OperationNotAllowed`), throttling (429), and answers no server should give (an endless
//! body, a poll link to another host).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

pub const SUBSCRIPTION: &str = "00000000-0000-0000-0000-0000000000aa";
pub const RESOURCE_GROUP: &str = "MC_archer_test_eastus";
pub const LOCATION: &str = "eastus";
pub const TENANT: &str = "11111111-1111-1111-1111-111111111111";
pub const CLIENT_ID: &str = "22222222-2222-2222-2222-222222222222";
pub const ASSERTION: &str = "eyJhbGciOiJSUzI1NiJ9.the-projected-service-account-token.sig";
pub const SUBNET: &str = "/subscriptions/00000000-0000-0000-0000-0000000000aa/resourceGroups/MC_archer_test_eastus/providers/Microsoft.Network/virtualNetworks/aks-vnet/subnets/aks-subnet";
pub const TOKEN: &str = "arm-access-token-1";
/// The token the same identity gets for ACR's data plane (`https://containerregistry.azure.net`).
pub const ACR_TOKEN: &str = "acr-scoped-entra-token-1";

/// The schemas and api-versions of the operations, from the SDKs (once per test process).
struct Spec {
    operations: BTreeMap<String, Operation>,
}

struct Operation {
    method: String,
    segments: Vec<String>,
    api_version: String,
    request: Option<jsonschema::Validator>,
    response: Option<jsonschema::Validator>,
}

pub fn sdk_python() -> PathBuf {
    if let Some(p) = std::env::var_os("ARCHER_TEST_AZURE_PYTHON") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let cached = home.join(".cache/archer-test/azure-sdk/bin/python");
    assert!(
        cached.exists(),
        "Azure's management SDKs are needed: python3 -m venv ~/.cache/archer-test/azure-sdk && ~/.cache/archer-test/azure-sdk/bin/pip install azure-mgmt-compute==39.0.0 azure-mgmt-network==33.1.0 (.ci/run does; or set ARCHER_TEST_AZURE_PYTHON)"
    );
    cached
}

fn spec() -> &'static Spec {
    static SPEC: OnceLock<Spec> = OnceLock::new();
    SPEC.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/azure/arm_schemas.py");
        let out = std::process::Command::new(sdk_python()).arg(&script).output().expect("run arm_schemas.py");
        assert!(out.status.success(), "arm_schemas.py: {}", String::from_utf8_lossy(&out.stderr));
        let doc: Value = serde_json::from_slice(&out.stdout).expect("schemas");
        let definitions = doc["definitions"].clone();
        let compile = |s: &Value| -> Option<jsonschema::Validator> {
            if s.is_null() {
                return None;
            }
            let mut root = s.clone();
            root["definitions"] = definitions.clone();
            Some(jsonschema::validator_for(&root).expect("schema compiles"))
        };
        let operations = doc["operations"]
            .as_object()
            .expect("operations")
            .iter()
            .map(|(id, op)| {
                let segments = op["path"].as_str().unwrap_or_default().split('/').filter(|s| !s.is_empty()).map(str::to_string).collect();
                (id.clone(), Operation { method: op["method"].as_str().unwrap_or_default().into(), segments, api_version: op["apiVersion"].as_str().unwrap_or_default().into(), request: compile(&op["request"]), response: compile(&op["response"]) })
            })
            .collect();
        Spec { operations }
    })
}

/// The operation a request is, with its path's parameters.
fn route(method: &Method, path: &str) -> Option<(&'static str, BTreeMap<String, String>)> {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    spec().operations.iter().find_map(|(id, op)| {
        if op.method != method.as_str() || op.segments.len() != parts.len() {
            return None;
        }
        let mut params = BTreeMap::new();
        for (template, actual) in op.segments.iter().zip(&parts) {
            if let Some(name) = template.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
                params.insert(name.to_string(), actual.to_string());
            } else if !template.eq_ignore_ascii_case(actual) {
                return None;
            }
        }
        Some((id.as_str(), params))
    })
}

fn violations(v: &jsonschema::Validator, doc: &Value) -> Vec<String> {
    v.iter_errors(doc).map(|e| format!("{} at {}", e, e.instance_path())).collect()
}

/// Faults the next requests meet.
#[derive(Default)]
pub struct Faults {
    /// (size, zone number): `SkuNotAvailable` at once.
    pub sku_not_available: BTreeSet<(String, String)>,
    /// Sizes whose allocation fails in the operation (`AllocationFailed`).
    pub allocation_failed: BTreeSet<String>,
    /// Sizes whose family's quota is used up (`OperationNotAllowed`).
    pub quota_exceeded: BTreeSet<String>,
    /// The next this many requests are answered 429 (`Retry-After: 0`).
    pub throttle: u32,
    /// VM GETs answer an endless body.
    pub endless_answers: bool,
    /// Operations are to be polled on another host.
    pub foreign_poll_links: bool,
}

/// A request as received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub operation: String,
    pub path: String,
    pub body: Value,
}

struct AsyncOp {
    polls_left: u32,
    error: Option<(String, String)>,
    /// Done when it succeeds: (VM name to mark Succeeded | VM name to delete | NIC to delete).
    on_success: Done,
}

enum Done {
    VmReady(String),
    VmDeleted(String),
    Nothing,
}

#[derive(Default)]
pub struct Arm {
    pub vms: Mutex<BTreeMap<String, Value>>,
    /// The custom data each VM was made with (ARM never answers it back).
    pub custom_data: Mutex<BTreeMap<String, String>>,
    pub nics: Mutex<BTreeMap<String, Value>>,
    /// Image versions by definition: (name, published date).
    pub images: Mutex<BTreeMap<String, Vec<(String, String)>>>,
    pub faults: Mutex<Faults>,
    pub received: Mutex<Vec<Received>>,
    pub violations: Mutex<Vec<String>>,
    pub tokens_issued: Mutex<u32>,
    /// Long-running operation polls answered.
    pub polls: Mutex<usize>,
    ops: Mutex<HashMap<String, AsyncOp>>,
    next: Mutex<u64>,
    endpoint: OnceLock<String>,
}

pub struct ArmServer {
    pub endpoint: String,
    pub state: Arc<Arm>,
    pub token_file: tempfile::NamedTempFile,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ArmServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ArmServer {
    /// A server on loopback, with one node image version of every AKS definition published.
    pub async fn start() -> ArmServer {
        spec();
        let state = Arc::new(Arm::default());
        for def in ["2204gen2containerd", "2204gen2arm64containerd", "2404gen2containerd", "2404gen2arm64containerd", "V3gen2", "V3gen2arm64"] {
            state.images.lock().unwrap().insert(def.into(), vec![("202611.10.0".into(), "2026-11-10T00:00:00Z".into())]);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let _ = state.endpoint.set(endpoint.clone());
        let app = axum::Router::new().fallback(handle).with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let token_file = tempfile::NamedTempFile::new().expect("token file");
        std::fs::write(token_file.path(), ASSERTION).expect("write token");
        ArmServer { endpoint, state, token_file, task }
    }

    /// The provider's settings against this server (cluster `archer-test`).
    pub fn settings(&self) -> archer_cloud::settings::AzureConfig {
        archer_cloud::settings::AzureConfig {
            cluster_name: "archer-test".into(),
            subscription_id: SUBSCRIPTION.into(),
            resource_group: RESOURCE_GROUP.into(),
            location: LOCATION.into(),
            endpoint: self.endpoint.clone(),
            authority_host: Some(self.endpoint.clone()),
            tenant_id: Some(TENANT.into()),
            client_id: Some(CLIENT_ID.into()),
            federated_token_file: Some(self.token_file.path().display().to_string()),
            subnet_id: Some(SUBNET.into()),
            ssh_public_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIArcherTestKey archer@test".into(),
            create_timeout_seconds: 30,
            ..Default::default()
        }
    }

    /// The config lines of `provisioner.azure` for `archer serve`.
    pub fn config_lines(&self) -> Vec<String> {
        let s = self.settings();
        vec![
            "azure:".into(),
            format!("  clusterName: {}", s.cluster_name),
            format!("  subscriptionId: {}", s.subscription_id),
            format!("  resourceGroup: {}", s.resource_group),
            format!("  location: {}", s.location),
            format!("  endpoint: {}", s.endpoint),
            format!("  authorityHost: {}", s.endpoint),
            format!("  tenantId: {}", s.tenant_id.unwrap_or_default()),
            format!("  clientId: {}", s.client_id.unwrap_or_default()),
            format!("  federatedTokenFile: {}", s.federated_token_file.unwrap_or_default()),
            format!("  subnetID: {}", s.subnet_id.unwrap_or_default()),
            format!("  sshPublicKey: {}", s.ssh_public_key),
            "  createTimeoutSeconds: 30".into(),
            "  nodeClassRefreshSeconds: 2".into(),
        ]
    }

    pub fn violations(&self) -> Vec<String> {
        self.state.violations.lock().unwrap().clone()
    }

    pub fn received(&self, operation: &str) -> Vec<Received> {
        self.state.received.lock().unwrap().iter().filter(|r| r.operation == operation).cloned().collect()
    }

    /// Publish a newer version of a node image definition.
    pub fn publish(&self, definition: &str, version: &str, date: &str) {
        self.state.images.lock().unwrap().entry(definition.into()).or_default().push((version.into(), date.into()));
    }

    /// VMs whose creation succeeded, by name.
    pub fn running(&self) -> BTreeMap<String, Value> {
        self.state.vms.lock().unwrap().iter().filter(|(_, v)| v["properties"]["provisioningState"] == "Succeeded").map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Make a VM the way another tool (or a lost launch) would: tagged for the cluster, never
    /// asked for by Archer.
    pub fn plant_vm(&self, name: &str, claim: &str) {
        let id = format!("/subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Compute/virtualMachines/{name}");
        let vm = json!({"id": id, "name": name, "type": "Microsoft.Compute/virtualMachines", "location": LOCATION, "tags": {"archer.dev_cluster": "archer-test", "archer.dev_nodeclaim": claim},
            "properties": {"hardwareProfile": {"vmSize": "Standard_D2pls_v6"}, "provisioningState": "Succeeded", "timeCreated": "2026-01-01T00:00:00Z", "osProfile": {"computerName": name}}});
        self.state.vms.lock().unwrap().insert(name.into(), vm);
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, axum::Json(json!({"error": {"code": code, "message": message}}))).into_response()
}

async fn handle(State(arm): State<Arc<Arm>>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path().to_string();
    if path.ends_with("/oauth2/v2.0/token") {
        return token(&arm, &path, &body);
    }
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {TOKEN}")) {
        return error(StatusCode::UNAUTHORIZED, "AuthenticationFailed", "no valid bearer token");
    }
    {
        let mut f = arm.faults.lock().unwrap();
        if f.throttle > 0 {
            f.throttle -= 1;
            return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "0")], axum::Json(json!({"error": {"code": "TooManyRequests", "message": "throttled"}}))).into_response();
        }
    }
    if path.contains("/operations/") {
        return poll(&arm, &path);
    }
    let Some((operation, params)) = route(&method, &path) else {
        return error(StatusCode::NOT_FOUND, "InvalidResourceType", &format!("no operation {method} {path}"));
    };
    let op = &spec().operations[operation];
    let query: BTreeMap<String, String> = uri.query().map(|q| url::form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default();
    if query.get("api-version") != Some(&op.api_version) {
        arm.violations.lock().unwrap().push(format!("{operation}: api-version {:?}, expected {}", query.get("api-version"), op.api_version));
        return error(StatusCode::BAD_REQUEST, "InvalidApiVersionParameter", &format!("api-version {:?} is not supported", query.get("api-version")));
    }
    let doc: Value = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap_or(Value::String("<not JSON>".into())) };
    arm.received.lock().unwrap().push(Received { method: method.to_string(), operation: operation.to_string(), path: path.clone(), body: doc.clone() });
    if let Some(v) = &op.request {
        let errors = violations(v, &doc);
        if !errors.is_empty() {
            let message = errors.join("; ");
            arm.violations.lock().unwrap().push(format!("{operation} request: {message}"));
            return error(StatusCode::BAD_REQUEST, "InvalidRequestContent", &message);
        }
    }
    let (status, headers_out, answer) = match operation {
        "NetworkInterfaces_CreateOrUpdate" => put_nic(&arm, &params, doc),
        "NetworkInterfaces_Delete" => delete_nic(&arm, &params),
        "NetworkInterfaces_Get" => match arm.nics.lock().unwrap().get(&params["networkInterfaceName"]) {
            Some(nic) => (StatusCode::OK, vec![], nic.clone()),
            None => return error(StatusCode::NOT_FOUND, "NotFound", &format!("Resource {} not found.", params["networkInterfaceName"])),
        },
        "VirtualMachines_CreateOrUpdate" => match put_vm(&arm, &params, doc) {
            Ok(r) => r,
            Err(resp) => return *resp,
        },
        "VirtualMachines_Get" => {
            if arm.faults.lock().unwrap().endless_answers {
                return endless();
            }
            match arm.vms.lock().unwrap().get(&params["vmName"]) {
                Some(vm) => (StatusCode::OK, vec![], vm.clone()),
                None => return error(StatusCode::NOT_FOUND, "ResourceNotFound", &format!("The Resource 'Microsoft.Compute/virtualMachines/{}' under resource group '{}' was not found.", params["vmName"], params["resourceGroupName"])),
            }
        }
        "VirtualMachines_List" => (StatusCode::OK, vec![], json!({"value": arm.vms.lock().unwrap().values().cloned().collect::<Vec<_>>()})),
        "VirtualMachines_Delete" => delete_vm(&arm, &params),
        "CommunityGalleryImageVersions_List" => (StatusCode::OK, vec![], image_versions(&arm, &params)),
        _ => return error(StatusCode::NOT_FOUND, "NotImplemented", operation),
    };
    if let (Some(v), false) = (&op.response, answer.is_null()) {
        let errors = violations(v, &answer);
        if !errors.is_empty() {
            arm.violations.lock().unwrap().push(format!("{operation} answer (the server's own): {}", errors.join("; ")));
        }
    }
    let mut resp = if answer.is_null() { status.into_response() } else { (status, axum::Json(answer)).into_response() };
    for (k, v) in headers_out {
        if let Ok(v) = axum::http::HeaderValue::from_str(&v) {
            resp.headers_mut().insert(k, v);
        }
    }
    resp
}

/// The token exchange (client credentials with the federated token as client assertion).
fn token(arm: &Arm, path: &str, body: &[u8]) -> Response {
    let form: BTreeMap<String, String> = url::form_urlencoded::parse(body).into_owned().collect();
    let want = [
        ("client_id", CLIENT_ID),
        ("grant_type", "client_credentials"),
        ("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"),
        ("client_assertion", ASSERTION),
    ];
    let mut wrong: Vec<String> = want.iter().filter(|(k, v)| form.get(*k).map(String::as_str) != Some(*v)).map(|(k, _)| k.to_string()).collect();
    // Resource Manager's scope, or ACR's data plane's (each its own token).
    let token = match form.get("scope").map(String::as_str) {
        Some("https://management.azure.com/.default") => TOKEN,
        Some("https://containerregistry.azure.net/.default") => ACR_TOKEN,
        _ => {
            wrong.push("scope".into());
            TOKEN
        }
    };
    if path != format!("/{TENANT}/oauth2/v2.0/token") || !wrong.is_empty() {
        arm.violations.lock().unwrap().push(format!("token request to {path}: wrong {wrong:?}"));
        return (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": "invalid_client", "error_description": format!("AADSTS700016: wrong {wrong:?}")}))).into_response();
    }
    *arm.tokens_issued.lock().unwrap() += 1;
    axum::Json(json!({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token})).into_response()
}

type Answer = (StatusCode, Vec<(&'static str, String)>, Value);

/// A new long-running operation; its `Azure-AsyncOperation` header.
fn start_op(arm: &Arm, provider: &str, polls: u32, error: Option<(String, String)>, on_success: Done) -> Vec<(&'static str, String)> {
    let id = {
        let mut n = arm.next.lock().unwrap();
        *n += 1;
        format!("op-{:08}", *n)
    };
    arm.ops.lock().unwrap().insert(id.clone(), AsyncOp { polls_left: polls, error, on_success });
    let host = if arm.faults.lock().unwrap().foreign_poll_links { "http://169.254.169.254".to_string() } else { arm.endpoint.get().cloned().unwrap_or_default() };
    let url = format!("{host}/subscriptions/{SUBSCRIPTION}/providers/{provider}/locations/{LOCATION}/operations/{id}?api-version=2026-04-01");
    vec![("azure-asyncoperation", url), ("retry-after", "0".into())]
}

fn poll(arm: &Arm, path: &str) -> Response {
    *arm.polls.lock().unwrap() += 1;
    let id = path.rsplit('/').next().unwrap_or_default().to_string();
    let mut ops = arm.ops.lock().unwrap();
    let Some(op) = ops.get_mut(&id) else { return error(StatusCode::NOT_FOUND, "OperationNotFound", &id) };
    if op.polls_left > 0 {
        op.polls_left -= 1;
        return (StatusCode::OK, [("retry-after", "0")], axum::Json(json!({"name": id, "status": "InProgress", "startTime": "2026-11-27T00:00:00Z"}))).into_response();
    }
    let Some(op) = ops.remove(&id) else { return error(StatusCode::NOT_FOUND, "OperationNotFound", &id) };
    drop(ops);
    if let Some((code, message)) = op.error {
        if let Done::VmReady(name) = &op.on_success {
            if let Some(vm) = arm.vms.lock().unwrap().get_mut(name) {
                vm["properties"]["provisioningState"] = json!("Failed");
            }
        }
        return axum::Json(json!({"name": id, "status": "Failed", "startTime": "2026-11-27T00:00:00Z", "endTime": "2026-11-27T00:00:01Z", "error": {"code": code, "message": message}})).into_response();
    }
    match op.on_success {
        Done::VmReady(name) => {
            if let Some(vm) = arm.vms.lock().unwrap().get_mut(&name) {
                vm["properties"]["provisioningState"] = json!("Succeeded");
            }
        }
        Done::VmDeleted(name) => {
            let vm = arm.vms.lock().unwrap().remove(&name);
            // deleteOption Delete: the NIC goes with the VM.
            let nic = vm.as_ref().and_then(|v| v["properties"]["networkProfile"]["networkInterfaces"][0].clone().as_object().cloned());
            if let Some(nic) = nic.filter(|n| n.get("properties").and_then(|p| p.get("deleteOption")).and_then(Value::as_str) == Some("Delete")) {
                let nic_name = nic.get("id").and_then(Value::as_str).unwrap_or_default().rsplit('/').next().unwrap_or_default().to_string();
                arm.nics.lock().unwrap().remove(&nic_name);
            }
        }
        Done::Nothing => {}
    }
    axum::Json(json!({"name": id, "status": "Succeeded", "startTime": "2026-11-27T00:00:00Z", "endTime": "2026-11-27T00:00:01Z"})).into_response()
}

fn put_nic(arm: &Arm, params: &BTreeMap<String, String>, mut doc: Value) -> Answer {
    let name = &params["networkInterfaceName"];
    let id = format!("/subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Network/networkInterfaces/{name}");
    doc["id"] = json!(id);
    doc["name"] = json!(name);
    doc["type"] = json!("Microsoft.Network/networkInterfaces");
    doc["properties"]["provisioningState"] = json!("Succeeded");
    if let Some(configs) = doc["properties"]["ipConfigurations"].as_array_mut() {
        for c in configs {
            c["properties"]["privateIPAddress"] = json!("10.224.0.10");
        }
    }
    let existed = arm.nics.lock().unwrap().insert(name.clone(), doc.clone()).is_some();
    let headers = start_op(arm, "Microsoft.Network", 0, None, Done::Nothing);
    (if existed { StatusCode::OK } else { StatusCode::CREATED }, headers, doc)
}

fn delete_nic(arm: &Arm, params: &BTreeMap<String, String>) -> Answer {
    if arm.nics.lock().unwrap().remove(&params["networkInterfaceName"]).is_none() {
        return (StatusCode::NO_CONTENT, vec![], Value::Null);
    }
    (StatusCode::OK, vec![], Value::Null)
}

fn put_vm(arm: &Arm, params: &BTreeMap<String, String>, mut doc: Value) -> Result<Answer, Box<Response>> {
    let name = params["vmName"].clone();
    let size = doc["properties"]["hardwareProfile"]["vmSize"].as_str().unwrap_or_default().to_string();
    let zone = doc["zones"][0].as_str().unwrap_or_default().to_string();
    let nic_id = doc["properties"]["networkProfile"]["networkInterfaces"][0]["id"].as_str().unwrap_or_default().to_string();
    let nic_name = nic_id.rsplit('/').next().unwrap_or_default().to_string();
    if !arm.nics.lock().unwrap().contains_key(&nic_name) {
        return Err(Box::new(error(StatusCode::BAD_REQUEST, "InvalidResourceReference", &format!("Resource {nic_id} referenced by resource {name} was not found."))));
    }
    let image = doc["properties"]["storageProfile"]["imageReference"]["communityGalleryImageId"].as_str().unwrap_or_default().to_string();
    let published = arm.images.lock().unwrap().iter().any(|(def, versions)| versions.iter().any(|(v, _)| image.ends_with(&format!("/images/{def}/versions/{v}"))));
    if !published {
        return Err(Box::new(error(StatusCode::NOT_FOUND, "GalleryImageNotFound", &format!("The gallery image {image} is not available."))));
    }
    let (allocation_fails, quota) = {
        let f = arm.faults.lock().unwrap();
        if f.sku_not_available.contains(&(size.clone(), zone.clone())) {
            return Err(Box::new(error(StatusCode::CONFLICT, "SkuNotAvailable", &format!("The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: {size}' is currently not available in location '{LOCATION}' zones '{zone}'. Please try another size or deploy to a different location or zones."))));
        }
        (f.allocation_failed.contains(&size), f.quota_exceeded.contains(&size))
    };
    if quota {
        return Err(Box::new(error(StatusCode::CONFLICT, "OperationNotAllowed", &format!("Operation could not be completed as it results in exceeding approved standardDPLSv6Family Cores quota. Location: {LOCATION}, Current Limit: 0, Current Usage: 0, Additional Required: 2."))));
    }
    let custom_data = doc["properties"]["osProfile"]["customData"].as_str().unwrap_or_default().to_string();
    if let Some(os) = doc["properties"]["osProfile"].as_object_mut() {
        os.remove("customData");
    }
    let id = format!("/subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Compute/virtualMachines/{name}");
    doc["id"] = json!(id);
    doc["name"] = json!(name);
    doc["type"] = json!("Microsoft.Compute/virtualMachines");
    doc["properties"]["provisioningState"] = json!("Creating");
    doc["properties"]["vmId"] = json!(format!("71aa3d5a-d73d-4970-9182-{:012}", arm.vms.lock().unwrap().len()));
    doc["properties"]["timeCreated"] = json!(k8s_openapi::jiff::Timestamp::now().to_string());
    let existed = arm.vms.lock().unwrap().insert(name.clone(), doc.clone()).is_some();
    arm.custom_data.lock().unwrap().insert(name.clone(), custom_data);
    let error = allocation_fails.then(|| ("AllocationFailed".to_string(), format!("Allocation failed. We do not have sufficient capacity for the requested VM size {size} in this region.")));
    let headers = start_op(arm, "Microsoft.Compute", 1, error, Done::VmReady(name));
    Ok((if existed { StatusCode::OK } else { StatusCode::CREATED }, headers, doc))
}

fn delete_vm(arm: &Arm, params: &BTreeMap<String, String>) -> Answer {
    let name = params["vmName"].clone();
    if !arm.vms.lock().unwrap().contains_key(&name) {
        return (StatusCode::NO_CONTENT, vec![], Value::Null);
    }
    let headers = start_op(arm, "Microsoft.Compute", 1, None, Done::VmDeleted(name));
    (StatusCode::ACCEPTED, headers, Value::Null)
}

fn image_versions(arm: &Arm, params: &BTreeMap<String, String>) -> Value {
    let def = &params["galleryImageName"];
    let versions = arm.images.lock().unwrap().get(def).cloned().unwrap_or_default();
    let value: Vec<Value> = versions
        .iter()
        .map(|(v, date)| {
            json!({"name": v, "location": LOCATION, "identifier": {"uniqueId": format!("/CommunityGalleries/{}/Images/{def}/Versions/{v}", params["publicGalleryName"])},
                "properties": {"publishedDate": date, "excludeFromLatest": false, "storageProfile": {"osDiskImage": {"diskSizeGB": 30, "hostCaching": "ReadOnly"}}}})
        })
        .collect();
    json!({"value": value})
}

/// An answer that never ends (1 MiB chunks, forever).
fn endless() -> Response {
    let chunk = Bytes::from(vec![b' '; 1 << 20]);
    let stream = futures::stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone()));
    Response::builder().status(200).header("content-type", "application/json").body(axum::body::Body::from_stream(stream)).unwrap_or_default()
}
