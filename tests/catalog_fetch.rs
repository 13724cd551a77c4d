//! `archer catalog fetch --cloud azure` against a local stand-in of the Azure Retail Prices API
//! that checks every request against the API's documentation (path, query parameters, the
//! `$filter` grammar and filterable fields, `api-version`) and answers in its documented shape,
//! with paging (`NextPageLink`) and throttling (429 with `Retry-After`). What it cannot prove:
//! that the live API still answers this way, and that its rows for a region are the ones this
//! stand-in serves (the row selection, Linux consumption and Spot meters, follows Karpenter on
//! Azure's reading of the same API).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

mod common;

use std::sync::atomic::Ordering;

use serde_json::Value;

use common::price_apis::{azure_row, AzureRetail, PriceList};

/// The Retail Prices API's rows for westus3: a size's Linux, Spot, Windows and Low Priority
/// meters, another size, and a size the catalog has no facts for; four rows a page.
async fn stand_in() -> (std::sync::Arc<AzureRetail>, String) {
    let row = |sku, meter, product, price| azure_row("westus3", sku, meter, product, price);
    let rows = vec![
        row("Standard_D2ps_v5", "D2ps v5", "Virtual Machines Dpsv5 Series", 0.0912),
        row("Standard_D2ps_v5", "D2ps v5 Spot", "Virtual Machines Dpsv5 Series", 0.01824),
        row("Standard_D2ps_v5", "D2ps v5", "Virtual Machines Dpsv5 Series Windows", 0.1832),
        row("Standard_D2ps_v5", "D2ps v5 Low Priority", "Virtual Machines Dpsv5 Series", 0.01824),
        row("Standard_D4ps_v5", "D4ps v5", "Virtual Machines Dpsv5 Series", 0.1824),
        row("Standard_Z99_v9", "Z99 v9", "Virtual Machines Z Series", 9.0),
    ];
    let state = AzureRetail::start("westus3", rows, 4).await;
    let endpoint = state.endpoint.clone();
    (state, endpoint)
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
    assert!(state.refused().is_empty(), "requests the API would refuse: {:?}", state.refused());
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

/// `archer catalog fetch --cloud aws`: eu-west-1's prices from a stand-in of the Price List
/// Query API that checks every request against botocore's model of it (target, content type,
/// signing scope, the GetProducts input shape), pages by `NextToken` and throttles once; then
/// `archer prices` lists eu-west-1's prices and `archer simulate` plans an eu-west-1a pool with
/// them, with no default-region warning. What it cannot prove: that AWS's price list still
/// carries these attributes for the region.
#[cfg(feature = "aws")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_prices_for_a_region_plan_an_eu_west_1_pool() {
    let state = PriceList::start(&[("m7g.large", "0.0892000000"), ("c6g.large", "0.0770000000"), ("c7g.large", "0.0803000000"), ("x9.unknown", "1.0000000000")]).await;
    let endpoint = state.endpoint.clone();
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
    assert!(state.refused().is_empty(), "requests the model refuses: {:?}", state.refused());
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
