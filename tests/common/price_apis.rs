//! Local stand-ins for the clouds' price APIs, which no emulator here implements (moto has no
//! `pricing`). Each checks every request against the service's published model and answers in
//! its documented shape, with paging and throttling:
//!
//! - [`AzureRetail`]: the Azure Retail Prices API, checked against its documentation (path, the
//!   query parameters, the `$filter` grammar and filterable fields, `api-version`), paging by
//!   `NextPageLink` and `$skip`, a 429 with `Retry-After` on the first call;
//! - [`PriceList`]: the AWS Price List Query API, checked against botocore's JSON model of
//!   `pricing` (the target, content type, SigV4 scope, the GetProducts input shape), paging by
//!   `NextToken`, a `ThrottlingException` on the first call.
//!
//! What they cannot prove: that the live services still answer this way, and that their rows for
//! a region are the ones served here.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// The query parameters the Retail Prices API documents.
const DOCUMENTED_PARAMETERS: [&str; 5] = ["api-version", "$filter", "currencyCode", "meterRegion", "$skip"];
/// The API versions it documents.
const API_VERSIONS: [&str; 2] = ["2021-10-01-preview", "2023-01-01-preview"];
/// The fields `$filter` may name.
const FILTERABLE: [&str; 14] = ["armRegionName", "location", "meterId", "meterName", "productId", "skuId", "productName", "skuName", "serviceName", "serviceId", "serviceFamily", "priceType", "armSkuName", "type"];

/// A stand-in of the Azure Retail Prices API serving `rows` for one region, `page` rows a page.
pub struct AzureRetail {
    pub endpoint: String,
    pub calls: AtomicUsize,
    pub refused: Mutex<Vec<String>>,
    pub filters: Mutex<Vec<String>>,
    /// Answer every call 503 while set.
    pub down: AtomicBool,
    region: String,
    rows: Mutex<Vec<Value>>,
    page: usize,
    port: AtomicUsize,
}

/// One price row as the API documents it: a size, its meter (`D2ps v5`, `D2ps v5 Spot`), its
/// product (`... Windows` for Windows) and its hourly USD price.
pub fn azure_row(region: &str, sku: &str, meter: &str, product: &str, price: f64) -> Value {
    json!({"currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price, "unitPrice": price, "armRegionName": region, "location": region,
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

fn urlencode(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

impl AzureRetail {
    pub async fn start(region: &str, rows: Vec<Value>, page: usize) -> Arc<AzureRetail> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(AzureRetail {
            endpoint: format!("http://127.0.0.1:{port}/api/retail/prices"),
            calls: AtomicUsize::new(0),
            refused: Mutex::default(),
            filters: Mutex::default(),
            down: AtomicBool::new(false),
            region: region.to_string(),
            rows: Mutex::new(rows),
            page: page.max(1),
            port: AtomicUsize::new(usize::from(port)),
        });
        let app = axum::Router::new().route("/api/retail/prices", axum::routing::get(Self::prices)).with_state(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        state
    }

    /// Serve these rows from now on.
    pub fn set_rows(&self, rows: Vec<Value>) {
        *self.rows.lock().unwrap_or_else(|e| e.into_inner()) = rows;
    }

    pub fn refused(&self) -> Vec<String> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    async fn prices(State(s): State<Arc<AzureRetail>>, Query(q): Query<BTreeMap<String, String>>) -> Response {
        let call = s.calls.fetch_add(1, Ordering::SeqCst);
        let refuse = |why: String| {
            s.refused.lock().unwrap_or_else(|e| e.into_inner()).push(why.clone());
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
        s.filters.lock().unwrap_or_else(|e| e.into_inner()).push(filter.clone());
        if s.down.load(Ordering::SeqCst) {
            return (StatusCode::SERVICE_UNAVAILABLE, "down").into_response();
        }
        // The first call is throttled, as the API throttles bursts.
        if call == 0 {
            return (StatusCode::TOO_MANY_REQUESTS, [("Retry-After", "1")], "throttled").into_response();
        }
        let skip: usize = match q.get("$skip").map(|s| s.parse()) {
            None => 0,
            Some(Ok(n)) => n,
            Some(Err(_)) => return refuse("$skip is not a number".into()),
        };
        let wanted = format!("armRegionName eq '{}'", s.region);
        let rows: Vec<Value> = if filter.contains(&wanted) { s.rows.lock().unwrap_or_else(|e| e.into_inner()).clone() } else { Vec::new() };
        let items: Vec<Value> = rows.iter().skip(skip).take(s.page).cloned().collect();
        let next = (skip + s.page < rows.len()).then(|| format!("http://127.0.0.1:{}/api/retail/prices?api-version=2023-01-01-preview&$filter={}&$skip={}", s.port.load(Ordering::SeqCst), urlencode(filter), skip + s.page));
        let count = items.len();
        axum::Json(json!({"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail", "Items": items, "NextPageLink": next, "Count": count})).into_response()
    }
}

/// botocore's model of the Price List Query API (`pricing`, as the AWS SDKs are generated from),
/// read from the Python environment the moto tests install (.ci/run).
pub fn pricing_model() -> Value {
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from).unwrap_or_default();
    let python = std::env::var_os("ARCHER_TEST_MOTO").map(|m| std::path::PathBuf::from(m).with_file_name("python3")).unwrap_or_else(|| home.join(".cache/archer-test/moto/bin/python3"));
    let script = "import botocore, glob, gzip, os, sys\np = sorted(glob.glob(os.path.join(os.path.dirname(botocore.__file__), 'data/pricing/*/service-2.json*')))[-1]\nsys.stdout.write((gzip.open(p) if p.endswith('.gz') else open(p, 'rb')).read().decode())";
    let out = std::process::Command::new(&python).args(["-c", script]).output().unwrap_or_else(|e| panic!("{}: {e} (the moto environment .ci/run installs)", python.display()));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the model is JSON")
}

/// `value` against the model's shape `name`: structures' members and required ones, lists,
/// strings (their enums and lengths), integers (their bounds).
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

/// A stand-in of the AWS Price List Query API pricing EC2 Linux on demand: `prices` (type, USD
/// per hour) in whatever region is asked, two items a page.
pub struct PriceList {
    pub endpoint: String,
    pub calls: AtomicUsize,
    pub refused: Mutex<Vec<String>>,
    pub bodies: Mutex<Vec<Value>>,
    /// Answer every call `ServiceUnavailableException` while set.
    pub down: AtomicBool,
    model: Value,
    prices: Mutex<Vec<(String, String)>>,
}

/// One price list item as the API answers it (a JSON document in a string).
pub fn ec2_item(instance: &str, region: &str, usd: &str) -> String {
    json!({"product": {"productFamily": "Compute Instance", "sku": "SKU", "attributes": {"instanceType": instance, "regionCode": region, "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used", "marketoption": "OnDemand"}},
        "serviceCode": "AmazonEC2", "terms": {"OnDemand": {"SKU.JRTCKXETXF": {"offerTermCode": "JRTCKXETXF", "sku": "SKU", "effectiveDate": "2026-11-01T00:00:00Z",
        "priceDimensions": {"SKU.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "endRange": "Inf", "description": "hourly", "appliesTo": [], "rateCode": "SKU.JRTCKXETXF.6YS6EN2CT7", "beginRange": "0", "pricePerUnit": {"USD": usd}}}, "termAttributes": {}}}},
        "version": "20261101000000", "publicationDate": "2026-11-01T00:00:00Z"}).to_string()
}

impl PriceList {
    pub async fn start(prices: &[(&str, &str)]) -> Arc<PriceList> {
        Self::start_on("127.0.0.1:0", prices).await
    }

    /// On `address` (a port other processes are told of).
    pub async fn start_on(address: &str, prices: &[(&str, &str)]) -> Arc<PriceList> {
        let listener = tokio::net::TcpListener::bind(address).await.expect("bind");
        let state = Arc::new(PriceList {
            endpoint: format!("http://127.0.0.1:{}", listener.local_addr().expect("addr").port()),
            calls: AtomicUsize::new(0),
            refused: Mutex::default(),
            bodies: Mutex::default(),
            down: AtomicBool::new(false),
            model: pricing_model(),
            prices: Mutex::new(prices.iter().map(|(t, p)| (t.to_string(), p.to_string())).collect()),
        });
        let app = axum::Router::new().route("/", axum::routing::post(Self::get_products)).with_state(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        state
    }

    /// Price these from now on.
    pub fn set_prices(&self, prices: &[(&str, &str)]) {
        *self.prices.lock().unwrap_or_else(|e| e.into_inner()) = prices.iter().map(|(t, p)| (t.to_string(), p.to_string())).collect();
    }

    pub fn refused(&self) -> Vec<String> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    async fn get_products(State(s): State<Arc<PriceList>>, headers: axum::http::HeaderMap, body: axum::body::Bytes) -> Response {
        let call = s.calls.fetch_add(1, Ordering::SeqCst);
        let meta = &s.model["metadata"];
        let header = |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let refuse = |why: String| {
            s.refused.lock().unwrap_or_else(|e| e.into_inner()).push(why.clone());
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
        s.bodies.lock().unwrap_or_else(|e| e.into_inner()).push(request.clone());
        let json_error = |kind: &str, message: &str| (StatusCode::BAD_REQUEST, [("content-type", "application/x-amz-json-1.1")], axum::Json(json!({"__type": kind, "message": message}))).into_response();
        if s.down.load(Ordering::SeqCst) {
            return json_error("ServiceUnavailableException", "the service is unavailable");
        }
        if call == 0 {
            return json_error("ThrottlingException", "Rate exceeded");
        }
        let term = |field: &str| request["Filters"].as_array().into_iter().flatten().find(|f| f["Field"] == field && f["Type"] == "TERM_MATCH").and_then(|f| f["Value"].as_str()).map(str::to_string);
        let region = term("regionCode").unwrap_or_default();
        let page: usize = match request.get("NextToken").and_then(Value::as_str) {
            None => 0,
            Some(t) => match t.strip_prefix("page-").and_then(|n| n.parse().ok()) {
                Some(n) => n,
                None => return refuse(format!("NextToken {t:?}")),
            },
        };
        let all = s.prices.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let linux = term("operatingSystem").as_deref() == Some("Linux") && term("tenancy").as_deref() == Some("Shared") && term("preInstalledSw").as_deref() == Some("NA") && term("capacitystatus").as_deref() == Some("Used");
        let items: Vec<String> = if linux { all.iter().skip(page * 2).take(2).map(|(t, p)| ec2_item(t, &region, p)).collect() } else { Vec::new() };
        let mut answer = json!({"FormatVersion": "aws_v1", "PriceList": items});
        if linux && (page + 1) * 2 < all.len() {
            answer["NextToken"] = json!(format!("page-{}", page + 1));
        }
        ([("content-type", "application/x-amz-json-1.1")], axum::Json(answer)).into_response()
    }
}
