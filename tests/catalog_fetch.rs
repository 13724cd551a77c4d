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
