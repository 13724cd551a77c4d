//! Prices of any region from the clouds' own price APIs, as a catalog file: `archer catalog
//! fetch` writes what the providers' clients read (`archer_cloud_aws::prices`, the Price List
//! Query API; `archer_cloud_azure::prices`, the Retail Prices API) for `simulate`, `report`,
//! `prices` and `serve` to take with `--catalog`. The running providers read the same APIs
//! themselves (`archer_cloud::prices`).

use archer_core::catalog::{Catalog, CatalogFile, InstanceTypeEntry};

/// What one region's prices are, as a cloud's price API gave them.
pub use archer_cloud::prices::RegionPrices as Fetched;

/// The catalog file for `fetched`: every instance type the catalog knows (its facts) that the
/// API prices on demand, with this region's price added to the ones it has and, where the API
/// prices spot too, its spot discount from this region's two prices. The names the API prices
/// that the catalog has no facts for come back apart (they cannot be planned without them).
pub fn catalog_file(catalog: &Catalog, fetched: &Fetched) -> (CatalogFile, Vec<String>) {
    let mut entries = Vec::new();
    let mut unknown = Vec::new();
    for (name, od) in &fetched.on_demand {
        let Some(t) = catalog.get(name) else {
            unknown.push(name.clone());
            continue;
        };
        let mut entry = InstanceTypeEntry::of(t);
        entry.prices.insert(fetched.region.clone(), *od);
        if let Some(spot) = fetched.spot.get(name).filter(|s| *od > 0.0 && **s > 0.0 && **s < *od) {
            entry.spot_discount = Some(1.0 - spot / od);
        }
        entries.push(entry);
    }
    (CatalogFile { instance_types: entries, ..Default::default() }, unknown)
}
