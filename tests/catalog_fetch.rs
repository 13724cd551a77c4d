//! `archer catalog fetch --cloud azure` against a local stand-in of the Azure Retail Prices API
//! that checks every request against the API's documentation (path, query parameters, the
//! `$filter` grammar and filterable fields, `api-version`) and answers in its documented shape,
//! with paging (`NextPageLink`) and throttling (429 with `Retry-After`). What it cannot prove:
//! that the live API still answers this way, and that its rows for a region are the ones this
//! stand-in serves (the row selection, Linux consumption and Spot meters, follows Karpenter on
//! Azure's reading of the same API).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// The query parameters the API documents.
const DOCUMENTED_PARAMETERS: [&str; 5] = ["api-version", "$filter", "currencyCode", "meterRegion", "$skip"];
/// The API versions it documents.
const API_VERSIONS: [&str; 2] = ["2021-10-01-preview", "2023-01-01-preview"];
/// The fields `$filter` may name.
const FILTERABLE: [&str; 14] = ["armRegionName", "location", "meterId", "meterName", "productId", "skuId", "productName", "skuName", "serviceName", "serviceId", "serviceFamily", "priceType", "armSkuName", "type"];

#[derive(Default)]
struct StandIn {
    port: AtomicUsize,
    calls: AtomicUsize,
    refused: Mutex<Vec<String>>,
    filters: Mutex<Vec<String>>,
}

fn item(sku: &str, meter: &str, product: &str, price: f64) -> Value {
    json!({"currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price, "unitPrice": price, "armRegionName": "westus3", "location": "US West 3",
        "effectiveStartDate": "2024-01-01T00:00:00Z", "meterId": "00000000-0000-0000-0000-000000000000", "meterName": meter, "productId": "DZH318Z0BQ4L",
        "skuId": "DZH318Z0BQ4L/00BJ", "productName": product, "skuName": meter, "serviceName": "Virtual Machines", "serviceId": "DZH313Z7MMC8",
        "serviceFamily": "Compute", "unitOfMeasure": "1 Hour", "type": "Consumption", "isPrimaryMeterRegion": true, "armSkuName": sku})
}

/// A `$filter` as the API takes it: `field eq 'value'` clauses joined by ` and `, each field one
/// it documents as filterable.
fn valid_filter(filter: &str) -> Result<(), String> {
    for clause in filter.split(" and ") {
        let (field, value) = clause.split_once(" eq ").ok_or_else(|| format!("not `field eq 'value'`: {clause:?}"))?;
        if !FILTERABLE.contains(&field) {
            return Err(format!("{field} is not filterable"));
        }
        if !(value.starts_with('\'') && value.ends_with('\'') && value.len() >= 2) {
            return Err(format!("{value} is not a quoted string"));
        }
    }
    Ok(())
}

async fn prices(State(s): State<Arc<StandIn>>, Query(q): Query<BTreeMap<String, String>>) -> Response {
    let call = s.calls.fetch_add(1, Ordering::SeqCst);
    let refuse = |why: String| {
        s.refused.lock().unwrap().push(why.clone());
        (StatusCode::BAD_REQUEST, axum::Json(json!({"Error": {"Code": "BadRequest", "Message": why}}))).into_response()
    };
    if let Some(k) = q.keys().find(|k| !DOCUMENTED_PARAMETERS.contains(&k.as_str())) {
        return refuse(format!("undocumented parameter {k}"));
    }
    if !q.get("api-version").is_some_and(|v| API_VERSIONS.contains(&v.as_str())) {
        return refuse(format!("api-version {:?}", q.get("api-version")));
    }
    let Some(filter) = q.get("$filter") else { return refuse("no $filter".into()) };
    if let Err(why) = valid_filter(filter) {
        return refuse(why);
    }
    s.filters.lock().unwrap().push(filter.clone());
    // The first call is throttled, as the API throttles bursts.
    if call == 0 {
        return (StatusCode::TOO_MANY_REQUESTS, [("Retry-After", "1")], "throttled").into_response();
    }
    let port = s.port.load(Ordering::SeqCst);
    let (items, next) = match q.get("$skip").map(String::as_str) {
        None => (
            vec![
                item("Standard_D2ps_v5", "D2ps v5", "Virtual Machines Dpsv5 Series", 0.0912),
                item("Standard_D2ps_v5", "D2ps v5 Spot", "Virtual Machines Dpsv5 Series", 0.01824),
                item("Standard_D2ps_v5", "D2ps v5", "Virtual Machines Dpsv5 Series Windows", 0.1832),
                item("Standard_D2ps_v5", "D2ps v5 Low Priority", "Virtual Machines Dpsv5 Series", 0.01824),
            ],
            Some(format!("http://127.0.0.1:{port}/api/retail/prices?api-version=2023-01-01-preview&$filter={}&$skip=100", urlencode(filter))),
        ),
        Some("100") => (vec![item("Standard_D4ps_v5", "D4ps v5", "Virtual Machines Dpsv5 Series", 0.1824), item("Standard_Z99_v9", "Z99 v9", "Virtual Machines Z Series", 9.0)], None),
        Some(other) => return refuse(format!("$skip {other}")),
    };
    let count = items.len();
    axum::Json(json!({"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail", "Items": items, "NextPageLink": next, "Count": count})).into_response()
}

fn urlencode(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

async fn stand_in() -> (Arc<StandIn>, String) {
    let state = Arc::new(StandIn::default());
    let app = axum::Router::new().route("/api/retail/prices", axum::routing::get(prices)).with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    state.port.store(usize::from(port), Ordering::SeqCst);
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (state, format!("http://127.0.0.1:{port}/api/retail/prices"))
}

fn archer(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_archer")).args(args).output().expect("run archer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_prices_for_a_region_become_a_catalog_the_offline_commands_price_with() {
    let (state, endpoint) = stand_in().await;
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("westus3.yaml");
    let out = tokio::task::spawn_blocking({
        let (endpoint, file) = (endpoint.clone(), file.clone());
        move || archer(&["catalog", "fetch", "--cloud", "azure", "--region", "westus3", "--endpoint", &endpoint, "--out", file.to_str().expect("path")])
    })
    .await
    .expect("join");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(state.refused.lock().unwrap().is_empty(), "requests the API would refuse: {:?}", state.refused.lock().unwrap());
    assert_eq!(state.calls.load(Ordering::SeqCst), 3, "throttled once, then two pages");
    assert_eq!(state.filters.lock().unwrap()[0], "serviceName eq 'Virtual Machines' and armRegionName eq 'westus3' and priceType eq 'Consumption'");
    assert!(stderr.contains("2 instance types priced in westus3 (1 with spot prices), 2 pages") && stderr.contains("Standard_Z99_v9"), "{stderr}");

    // `archer prices` lists the region's Linux prices, spot from the Spot meter (not Windows,
    // not Low Priority).
    let out = archer(&["prices", "--region", "westus3", "--catalog", file.to_str().expect("path"), "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).expect("json");
    let row = |name: &str| rows.iter().find(|r| r["instanceType"] == name).unwrap_or_else(|| panic!("{name} not listed: {rows:?}")).clone();
    assert_eq!(row("Standard_D2ps_v5")["onDemandPerHour"].as_f64(), Some(0.0912));
    assert!((row("Standard_D2ps_v5")["spotPerHour"].as_f64().expect("spot") - 0.01824).abs() < 1e-9);
    assert_eq!(row("Standard_D4ps_v5")["onDemandPerHour"].as_f64(), Some(0.1824));
    assert_eq!(rows.len(), 2, "only the sizes the API priced there: {rows:?}");

    // Refused: a region that is not an ARM region name, before any request.
    let before = state.calls.load(Ordering::SeqCst);
    let out = archer(&["catalog", "fetch", "--cloud", "azure", "--region", "West US' or 1 eq '1", "--endpoint", &endpoint]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("is not an Azure region name"));
    assert_eq!(state.calls.load(Ordering::SeqCst), before);
}

/// botocore's model of the Price List Query API (`pricing`, as the AWS SDKs are generated from),
/// read from the Python environment the moto tests install (.ci/run).
#[cfg(feature = "aws")]
fn pricing_model() -> Value {
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from).unwrap_or_default();
    let python = std::env::var_os("ARCHER_TEST_MOTO").map(|m| std::path::PathBuf::from(m).with_file_name("python3")).unwrap_or_else(|| home.join(".cache/archer-test/moto/bin/python3"));
    let script = "import botocore, glob, gzip, os, sys\np = sorted(glob.glob(os.path.join(os.path.dirname(botocore.__file__), 'data/pricing/*/service-2.json*')))[-1]\nsys.stdout.write((gzip.open(p) if p.endswith('.gz') else open(p, 'rb')).read().decode())";
    let out = std::process::Command::new(&python).args(["-c", script]).output().unwrap_or_else(|e| panic!("{}: {e} (the moto environment .ci/run installs)", python.display()));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the model is JSON")
}

/// `value` against the model's shape `name`: structures' members and required ones, lists,
/// strings (their enums and lengths), integers (their bounds).
#[cfg(feature = "aws")]
fn conforms(model: &Value, name: &str, value: &Value) -> Result<(), String> {
    let shape = &model["shapes"][name];
    match shape["type"].as_str() {
        Some("structure") => {
            let object = value.as_object().ok_or_else(|| format!("{name}: not an object"))?;
            for required in shape["required"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                if !object.contains_key(required) {
                    return Err(format!("{name}: {required} is required"));
                }
            }
            for (k, v) in object {
                let member = shape["members"].get(k).ok_or_else(|| format!("{name}: no member {k}"))?;
                conforms(model, member["shape"].as_str().unwrap_or(""), v)?;
            }
            Ok(())
        }
        Some("list") => value.as_array().ok_or_else(|| format!("{name}: not a list"))?.iter().try_for_each(|v| conforms(model, shape["member"]["shape"].as_str().unwrap_or(""), v)),
        Some("string") => {
            let s = value.as_str().ok_or_else(|| format!("{name}: not a string"))?;
            if let Some(values) = shape["enum"].as_array() {
                if !values.iter().any(|e| e == s) {
                    return Err(format!("{name}: {s:?} is not one of {values:?}"));
                }
            }
            let len = s.chars().count() as u64;
            if shape["min"].as_u64().is_some_and(|m| len < m) || shape["max"].as_u64().is_some_and(|m| len > m) {
                return Err(format!("{name}: length {len} out of bounds"));
            }
            Ok(())
        }
        Some("integer") => {
            let n = value.as_i64().ok_or_else(|| format!("{name}: not an integer"))?;
            if shape["min"].as_i64().is_some_and(|m| n < m) || shape["max"].as_i64().is_some_and(|m| n > m) {
                return Err(format!("{name}: {n} out of bounds"));
            }
            Ok(())
        }
        other => Err(format!("{name}: shape type {other:?} not checked here")),
    }
}

#[cfg(feature = "aws")]
#[derive(Default)]
struct PriceList {
    model: Value,
    calls: AtomicUsize,
    refused: Mutex<Vec<String>>,
    bodies: Mutex<Vec<Value>>,
}

#[cfg(feature = "aws")]
fn ec2_item(instance: &str, region: &str, usd: &str) -> String {
    json!({"product": {"productFamily": "Compute Instance", "sku": "SKU", "attributes": {"instanceType": instance, "regionCode": region, "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used", "marketoption": "OnDemand"}},
        "serviceCode": "AmazonEC2", "terms": {"OnDemand": {"SKU.JRTCKXETXF": {"offerTermCode": "JRTCKXETXF", "sku": "SKU", "effectiveDate": "2026-11-01T00:00:00Z",
        "priceDimensions": {"SKU.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "endRange": "Inf", "description": "hourly", "appliesTo": [], "rateCode": "SKU.JRTCKXETXF.6YS6EN2CT7", "beginRange": "0", "pricePerUnit": {"USD": usd}}}, "termAttributes": {}}}},
        "version": "20261101000000", "publicationDate": "2026-11-01T00:00:00Z"}).to_string()
}

#[cfg(feature = "aws")]
async fn get_products(State(s): State<Arc<PriceList>>, headers: axum::http::HeaderMap, body: axum::body::Bytes) -> Response {
    let call = s.calls.fetch_add(1, Ordering::SeqCst);
    let meta = &s.model["metadata"];
    let header = |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let refuse = |why: String| {
        s.refused.lock().unwrap().push(why.clone());
        (StatusCode::BAD_REQUEST, axum::Json(json!({"__type": "InvalidParameterException", "Message": why}))).into_response()
    };
    let target = format!("{}.GetProducts", meta["targetPrefix"].as_str().unwrap_or(""));
    if header("x-amz-target") != target {
        return refuse(format!("X-Amz-Target {:?}, not {target}", header("x-amz-target")));
    }
    let content_type = format!("application/x-amz-json-{}", meta["jsonVersion"].as_str().unwrap_or(""));
    if header("content-type") != content_type {
        return refuse(format!("Content-Type {:?}, not {content_type}", header("content-type")));
    }
    let scope = format!("/us-east-1/{}/aws4_request", meta["signingName"].as_str().unwrap_or(""));
    if !(header("authorization").starts_with("AWS4-HMAC-SHA256 ") && header("authorization").contains(&scope)) {
        return refuse(format!("not signed for {scope}: {:?}", header("authorization")));
    }
    let Ok(request) = serde_json::from_slice::<Value>(&body) else { return refuse("body is not JSON".into()) };
    let input = s.model["operations"]["GetProducts"]["input"]["shape"].as_str().unwrap_or("").to_string();
    if let Err(why) = conforms(&s.model, &input, &request) {
        return refuse(why);
    }
    s.bodies.lock().unwrap().push(request.clone());
    if call == 0 {
        return (StatusCode::BAD_REQUEST, [("content-type", "application/x-amz-json-1.1")], axum::Json(json!({"__type": "ThrottlingException", "message": "Rate exceeded"}))).into_response();
    }
    let term = |field: &str| request["Filters"].as_array().into_iter().flatten().find(|f| f["Field"] == field && f["Type"] == "TERM_MATCH").and_then(|f| f["Value"].as_str()).map(str::to_string);
    let region = term("regionCode").unwrap_or_default();
    let (items, next) = match request.get("NextToken").and_then(Value::as_str) {
        None => (vec![ec2_item("m7g.large", &region, "0.0892000000"), ec2_item("c6g.large", &region, "0.0770000000")], Some("page-2")),
        Some("page-2") => (vec![ec2_item("c7g.large", &region, "0.0803000000"), ec2_item("x9.unknown", &region, "1.0000000000")], None),
        Some(other) => return refuse(format!("NextToken {other:?}")),
    };
    let linux = term("operatingSystem").as_deref() == Some("Linux") && term("tenancy").as_deref() == Some("Shared") && term("preInstalledSw").as_deref() == Some("NA") && term("capacitystatus").as_deref() == Some("Used");
    let items = if linux { items } else { Vec::new() };
    let mut answer = json!({"FormatVersion": "aws_v1", "PriceList": items});
    if let Some(n) = next {
        answer["NextToken"] = json!(n);
    }
    ([("content-type", "application/x-amz-json-1.1")], axum::Json(answer)).into_response()
}

/// `archer catalog fetch --cloud aws`: eu-west-1's prices from a stand-in of the Price List
/// Query API that checks every request against botocore's model of it (target, content type,
/// signing scope, the GetProducts input shape), pages by `NextToken` and throttles once; then
/// `archer prices` lists eu-west-1's prices and `archer simulate` plans an eu-west-1a pool with
/// them, with no default-region warning. What it cannot prove: that AWS's price list still
/// carries these attributes for the region.
#[cfg(feature = "aws")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_prices_for_a_region_plan_an_eu_west_1_pool() {
    let state = Arc::new(PriceList { model: pricing_model(), ..Default::default() });
    let app = axum::Router::new().route("/", axum::routing::post(get_products)).with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://127.0.0.1:{}", listener.local_addr().expect("addr").port());
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("eu-west-1.yaml");
    let file_arg = file.to_str().expect("path").to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_archer"))
            .args(["catalog", "fetch", "--cloud", "aws", "--region", "eu-west-1", "--endpoint", &endpoint, "--out", &file_arg])
            .envs([("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_EC2_METADATA_DISABLED", "true")])
            .env_remove("AWS_REGION")
            .output()
            .expect("run archer")
    })
    .await
    .expect("join");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(state.refused.lock().unwrap().is_empty(), "requests the model refuses: {:?}", state.refused.lock().unwrap());
    assert_eq!(state.calls.load(Ordering::SeqCst), 3, "throttled once (retried by the SDK), then two pages");
    let first = state.bodies.lock().unwrap()[0].clone();
    assert_eq!((first["ServiceCode"].as_str(), first["FormatVersion"].as_str()), (Some("AmazonEC2"), Some("aws_v1")));
    assert!(stderr.contains("3 instance types priced in eu-west-1") && stderr.contains("x9.unknown"), "{stderr}");

    let out = archer(&["prices", "--region", "eu-west-1", "--catalog", file.to_str().expect("path"), "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).expect("json");
    let price = |name: &str| rows.iter().find(|r| r["instanceType"] == name).and_then(|r| r["onDemandPerHour"].as_f64());
    assert_eq!((price("m7g.large"), price("c6g.large"), price("c7g.large")), (Some(0.0892), Some(0.077), Some(0.0803)));
    assert_eq!(rows.len(), 3, "{rows:?}");

    let scenario = dir.path().join("dublin.yaml");
    std::fs::write(&scenario, "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: dublin}\nspec:\n  template:\n    spec:\n      requirements:\n        - {key: topology.kubernetes.io/zone, operator: In, values: [eu-west-1a]}\n        - {key: node.kubernetes.io/instance-type, operator: In, values: [m7g.large, c7g.large]}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: default, annotations: {archer.dev/platforms: linux/arm64}}\nspec:\n  containers: [{name: c, image: nginx, resources: {requests: {cpu: 500m, memory: 1Gi}}}]\n").expect("write");
    let out = archer(&["simulate", "--scenario", scenario.to_str().expect("path"), "--offline", "--catalog", file.to_str().expect("path"), "--output", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let plan: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!((plan["nodes"][0]["instanceType"].as_str(), plan["nodes"][0]["pricePerHour"].as_f64()), (Some("c7g.large"), Some(0.0803)), "{plan}");
    assert!(plan["notes"].as_array().is_none_or(|n| n.iter().all(|n| !n.as_str().unwrap_or("").contains("no eu-west-1 prices"))), "{plan}");
}
