//! On-demand prices of every EC2 instance type in a region, from the AWS Price List Query API
//! (`GetProducts`, service code `AmazonEC2`), as Karpenter's AWS provider reads them: Linux,
//! shared tenancy, no pre-installed software, used capacity, on-demand. The API answers in
//! us-east-1 (and two other regions) for every commercial region. Pages follow `NextToken`;
//! their count is bounded.

use std::collections::BTreeMap;

use archer_cloud::prices::RegionPrices;
use aws_sdk_pricing::types::{Filter, FilterType};

/// The API's name in metrics and status.
pub const API: &str = "price-list-api";

/// The region the Price List Query API is asked in.
pub const PRICING_REGION: &str = "us-east-1";
/// Pages at most (a region's EC2 Linux on-demand list is some tens of pages of 100).
const MAX_PAGES: usize = 1_000;

#[derive(Debug, thiserror::Error)]
pub enum PriceListError {
    #[error("region {0:?} is not an AWS region name (like eu-west-1)")]
    Region(String),
    #[error("GetProducts: {0}")]
    Call(String),
    #[error("more than {MAX_PAGES} pages")]
    TooManyPages,
    #[error("the Price List Query API priced no EC2 Linux instance type in {0}")]
    Empty(String),
}

/// The filters of one region's EC2 Linux on-demand prices.
fn filters(region: &str) -> Result<Vec<Filter>, PriceListError> {
    [("regionCode", region), ("operatingSystem", "Linux"), ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("capacitystatus", "Used"), ("marketoption", "OnDemand")]
        .into_iter()
        .map(|(field, value)| Filter::builder().r#type(FilterType::TermMatch).field(field).value(value).build().map_err(|e| PriceListError::Call(e.to_string())))
        .collect()
}

/// A Price List Query API client: `sdk`'s credentials, asked in [`PRICING_REGION`], at
/// `endpoint` when given (else the SDK's).
pub fn client(sdk: &aws_config::SdkConfig, endpoint: Option<&str>) -> aws_sdk_pricing::Client {
    let mut conf = aws_sdk_pricing::config::Builder::from(sdk).region(aws_config::Region::new(PRICING_REGION));
    if let Some(e) = endpoint {
        conf = conf.endpoint_url(e);
    }
    aws_sdk_pricing::Client::from_conf(conf.build())
}

/// Every EC2 instance type's Linux on-demand USD price per hour in `region`.
pub async fn on_demand(pricing: &aws_sdk_pricing::Client, region: &str) -> Result<RegionPrices, PriceListError> {
    let valid = !region.is_empty() && region.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !valid {
        return Err(PriceListError::Region(region.to_string()));
    }
    let filters = filters(region)?;
    let mut prices = BTreeMap::new();
    let (mut token, mut pages) = (None::<String>, 0);
    loop {
        if pages >= MAX_PAGES {
            return Err(PriceListError::TooManyPages);
        }
        let page = pricing
            .get_products()
            .service_code("AmazonEC2")
            .format_version("aws_v1")
            .max_results(100)
            .set_filters(Some(filters.clone()))
            .set_next_token(token.take())
            .send()
            .await
            .map_err(|e| PriceListError::Call(aws_sdk_pricing::error::DisplayErrorContext(e).to_string()))?;
        pages += 1;
        for item in page.price_list() {
            if let Some((instance, price)) = price_of(item) {
                let p = prices.entry(instance).or_insert(price);
                *p = f64::min(*p, price);
            }
        }
        match page.next_token() {
            Some(t) if !t.is_empty() => token = Some(t.to_string()),
            _ => break,
        }
    }
    if prices.is_empty() {
        return Err(PriceListError::Empty(region.to_string()));
    }
    Ok(RegionPrices { region: region.to_string(), on_demand: prices, spot: BTreeMap::new(), pages })
}

/// One price list item (a JSON document): its instance type and its hourly USD on-demand price.
fn price_of(item: &str) -> Option<(String, f64)> {
    let doc: serde_json::Value = serde_json::from_str(item).ok()?;
    let instance = doc.pointer("/product/attributes/instanceType")?.as_str()?.to_string();
    let terms = doc.pointer("/terms/OnDemand")?.as_object()?;
    let price = terms
        .values()
        .filter_map(|t| t.get("priceDimensions")?.as_object())
        .flat_map(|d| d.values())
        .filter(|d| d.get("unit").and_then(|u| u.as_str()) == Some("Hrs"))
        .filter_map(|d| d.pointer("/pricePerUnit/USD")?.as_str()?.parse::<f64>().ok())
        .filter(|p| p.is_finite() && *p > 0.0)
        .fold(f64::INFINITY, f64::min);
    price.is_finite().then_some((instance, price))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_price_list_item_gives_its_type_and_hourly_price() {
        let item = r#"{"product": {"productFamily": "Compute Instance", "attributes": {"instanceType": "m7g.large", "regionCode": "eu-west-1"}, "sku": "ABC"},
            "terms": {"OnDemand": {"ABC.JRTCKXETXF": {"priceDimensions": {"ABC.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": "0.0892000000"}}}}}}}"#;
        assert_eq!(price_of(item), Some(("m7g.large".to_string(), 0.0892)));
        assert_eq!(price_of(&item.replace("0.0892000000", "0.0000000000")), None, "a zero price is no price");
        assert_eq!(price_of(&item.replace("Hrs", "Quantity")), None, "not an hourly price");
        assert_eq!(price_of("not json"), None);
    }
}
