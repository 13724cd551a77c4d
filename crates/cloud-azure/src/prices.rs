//! The Azure Retail Prices API (`https://prices.azure.com/api/retail/prices`): Linux
//! pay-as-you-go (`priceType eq 'Consumption'`) and Spot prices of every VM size in a region, as
//! Karpenter on Azure reads them. Public, no credentials. Pages follow `NextPageLink`; a 429 is
//! retried after its `Retry-After`; every page and the whole fetch are bounded.

use std::time::Duration;

use archer_cloud::prices::RegionPrices;

/// The API's address.
pub use archer_cloud::settings::AZURE_RETAIL_PRICES as ENDPOINT;
/// The API's name in metrics and status.
pub const API: &str = "retail-prices-api";
/// The API version asked for (the documented preview that carries `savingsPlan`).
pub const API_VERSION: &str = "2023-01-01-preview";
/// Pages at most (a region's VM prices are a few hundred pages of 100 items at worst).
const MAX_PAGES: usize = 2_000;
/// Bytes of one page at most.
const MAX_PAGE_BYTES: usize = 8 << 20;
/// 429 answers retried at most, per page.
const MAX_RETRIES: u32 = 5;
/// The longest `Retry-After` waited for.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum PriceError {
    #[error("region {0:?} is not an Azure region name (lowercase letters and digits, like westus3)")]
    Region(String),
    #[error("{url}: {source}")]
    Http { url: String, source: reqwest::Error },
    #[error("{url}: HTTP {status}: {body}")]
    Status { url: String, status: u16, body: String },
    #[error("{url}: a page larger than {MAX_PAGE_BYTES} bytes")]
    TooLarge { url: String },
    #[error("{url}: {source}")]
    Decode { url: String, source: serde_json::Error },
    #[error("more than {MAX_PAGES} pages")]
    TooManyPages,
    #[error("{url}: still throttled after {MAX_RETRIES} retries")]
    Throttled { url: String },
    #[error("the API priced no Linux VM size in {0} (is it a region Azure sells VMs in?)")]
    Empty(String),
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Page {
    #[serde(default)]
    items: Vec<Item>,
    #[serde(default)]
    next_page_link: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Item {
    #[serde(default)]
    currency_code: String,
    retail_price: f64,
    #[serde(default)]
    unit_of_measure: String,
    #[serde(default)]
    arm_region_name: String,
    #[serde(default)]
    arm_sku_name: String,
    #[serde(default)]
    meter_name: String,
    #[serde(default)]
    product_name: String,
    #[serde(default, rename = "type")]
    kind: String,
}

/// The `$filter` for a region's VM prices (the documented OData subset: `eq` joined by `and`).
pub fn filter(region: &str) -> String {
    format!("serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and priceType eq 'Consumption'")
}

/// Every Linux VM size's on-demand and Spot price in `region`, from `endpoint` (the API's, or a
/// stand-in's).
pub async fn fetch(http: &reqwest::Client, endpoint: &str, region: &str) -> Result<RegionPrices, PriceError> {
    if region.is_empty() || !region.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
        return Err(PriceError::Region(region.to_string()));
    }
    let first = reqwest::Url::parse_with_params(endpoint, [("api-version", API_VERSION), ("$filter", filter(region).as_str())]).map_err(|e| PriceError::Status { url: endpoint.to_string(), status: 0, body: e.to_string() })?;
    let mut next = Some(first.to_string());
    let mut out = RegionPrices { region: region.to_string(), ..Default::default() };
    while let Some(url) = next.take() {
        if out.pages >= MAX_PAGES {
            return Err(PriceError::TooManyPages);
        }
        let page = page(http, &url).await?;
        out.pages += 1;
        for item in page.items {
            take(&mut out, region, item);
        }
        next = match page.next_page_link.filter(|l| !l.is_empty()) {
            Some(link) if same_origin(&first, &link) => Some(link),
            Some(link) => return Err(PriceError::Status { url, status: 0, body: format!("NextPageLink {link:?} leaves {}", first.origin().ascii_serialization()) }),
            None => None,
        };
    }
    if out.on_demand.is_empty() {
        return Err(PriceError::Empty(region.to_string()));
    }
    Ok(out)
}

/// Whether a page's `NextPageLink` stays on the API's own scheme, host and port (a page is not
/// let send the client elsewhere).
fn same_origin(endpoint: &reqwest::Url, link: &str) -> bool {
    reqwest::Url::parse(link).is_ok_and(|l| l.origin() == endpoint.origin())
}

/// One price row into `out`: Linux (no `Windows` product), hourly, USD, this region, not Low
/// Priority; a `Spot` meter is the spot price. Where two rows price one size the lower stands.
fn take(out: &mut RegionPrices, region: &str, item: Item) {
    let usable = item.kind == "Consumption"
        && item.unit_of_measure == "1 Hour"
        && item.currency_code == "USD"
        && item.arm_region_name == region
        && !item.arm_sku_name.is_empty()
        && !item.product_name.contains("Windows")
        && !item.meter_name.contains("Low Priority")
        && item.retail_price.is_finite()
        && item.retail_price > 0.0;
    if !usable {
        return;
    }
    let book = if item.meter_name.ends_with("Spot") { &mut out.spot } else { &mut out.on_demand };
    let price = book.entry(item.arm_sku_name).or_insert(item.retail_price);
    *price = price.min(item.retail_price);
}

/// One page, retried on 429 after its `Retry-After` (seconds; 1 when absent).
async fn page(http: &reqwest::Client, url: &str) -> Result<Page, PriceError> {
    let mut retries = 0;
    loop {
        let mut response = http.get(url).send().await.map_err(|source| PriceError::Http { url: url.to_string(), source })?;
        let status = response.status();
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            if retries >= MAX_RETRIES {
                return Err(PriceError::Throttled { url: url.to_string() });
            }
            retries += 1;
            let after = response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(1);
            tracing::info!(url, after, "Azure Retail Prices API throttled; retrying");
            tokio::time::sleep(Duration::from_secs(after).min(MAX_RETRY_AFTER)).await;
            continue;
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|source| PriceError::Http { url: url.to_string(), source })? {
            if body.len() + chunk.len() > MAX_PAGE_BYTES {
                return Err(PriceError::TooLarge { url: url.to_string() });
            }
            body.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            let text: String = String::from_utf8_lossy(&body).chars().take(300).collect();
            return Err(PriceError::Status { url: url.to_string(), status: status.as_u16(), body: text });
        }
        return serde_json::from_slice(&body).map_err(|source| PriceError::Decode { url: url.to_string(), source });
    }
}
