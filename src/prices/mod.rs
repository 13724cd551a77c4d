//! Live prices from the clouds' own price APIs, for any region: `archer catalog fetch` writes
//! them as a catalog file that `simulate`, `report`, `prices` and `serve` take with `--catalog`.
//! Azure's Retail Prices API needs no credentials (`azure.rs`).

pub mod azure;

use std::collections::BTreeMap;

use archer_core::catalog::{Catalog, CatalogFile, InstanceTypeEntry};

/// What one region's prices are, as a cloud's price API gave them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fetched {
    pub region: String,
    /// On-demand Linux USD per hour, by instance type (VM size) name.
    pub on_demand: BTreeMap<String, f64>,
    /// Spot USD per hour, by the same names.
    pub spot: BTreeMap<String, f64>,
    /// Pages read.
    pub pages: usize,
}

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
