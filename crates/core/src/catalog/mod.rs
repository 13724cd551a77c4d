//! The price catalog: instance types (arch, os, size, allocatable, max pods), on-demand prices per
//! region and a spot-discount estimate. It ships in the binary (AWS EC2 first) and users add or
//! override entries and prices with their own file. The extender scores nodes with it and the
//! provisioner chooses instance types from it.
//!
//! A provider is data: a CSV with the columns of `data/catalog/aws-ec2-instance-types.csv`, where
//! every `ondemand_usd_per_hour_<region>` column is a region's price (`_` stands for `-`). Azure
//! (`Standard_D4ps_v5`) or GCP (`c4a-standard-4`) types are rows of another such file.

mod file;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;


use crate::labels;
pub use crate::instance::{CapacityType, InstanceType};
pub use file::{CatalogFile, InstanceTypeEntry, PriceOverride, PriceRule};

/// The catalog built into the binary.
const EMBEDDED_CSV: &[(&str, &str)] = &[
    ("aws", include_str!("../../data/catalog/aws-ec2-instance-types.csv")),
    ("azure", include_str!("../../data/catalog/azure-vm-sizes.csv")),
];
const DEFAULT_REGION: &str = "us-east-1";
/// The region Azure pools plan in when nothing names one (their zones default to its three).
pub const DEFAULT_AZURE_REGION: &str = "eastus";
/// Spot capacity is typically 60-70% below on-demand; a planning estimate, overridable.
const DEFAULT_SPOT_DISCOUNT: f64 = 0.65;

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("catalog {source_name}: {message}")]
    Invalid { source_name: String, message: String },
    #[error("reading catalog file {path}: {source}")]
    Read { path: String, source: std::io::Error },
}

/// The catalog: instance types by name, price rules, defaults.
#[derive(Debug, Clone)]
pub struct Catalog {
    types: Vec<Arc<InstanceType>>,
    by_name: HashMap<String, usize>,
    pub default_region: String,
    pub spot_discount: f64,
}

impl Catalog {
    /// The catalog built into the binary.
    pub fn embedded() -> Result<Catalog, CatalogError> {
        let mut c = Catalog { types: Vec::new(), by_name: HashMap::new(), default_region: DEFAULT_REGION.into(), spot_discount: DEFAULT_SPOT_DISCOUNT };
        for (provider, text) in EMBEDDED_CSV {
            for t in file::parse_csv(provider, text)? {
                c.upsert(t);
            }
        }
        Ok(c)
    }

    /// The embedded catalog with a user file (YAML, or CSV in the embedded format) on top.
    pub fn with_user_file(path: Option<&Path>) -> Result<Catalog, CatalogError> {
        let mut c = Catalog::embedded()?;
        if let Some(p) = path {
            c.apply_file(p)?;
        }
        Ok(c)
    }

    fn apply_file(&mut self, path: &Path) -> Result<(), CatalogError> {
        let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Read { path: path.display().to_string(), source })?;
        if path.extension().is_some_and(|e| e == "csv") {
            let provider = path.file_stem().and_then(|s| s.to_str()).unwrap_or("user");
            for t in file::parse_csv(provider, &text)? {
                self.upsert(t);
            }
            return Ok(());
        }
        let f: CatalogFile = crate::yaml::from_str(&text)
            .map_err(|e| CatalogError::Invalid { source_name: path.display().to_string(), message: e.to_string() })?;
        self.apply(f, &path.display().to_string())
    }

    pub fn apply(&mut self, f: CatalogFile, source_name: &str) -> Result<(), CatalogError> {
        let CatalogFile { default_region, spot_discount, instance_types, price_overrides } = f;
        if let Some(r) = default_region {
            self.default_region = r;
        }
        if let Some(d) = spot_discount {
            if !(0.0..1.0).contains(&d) {
                return Err(CatalogError::Invalid { source_name: source_name.into(), message: format!("spotDiscount {d} must be in [0, 1)") });
            }
            self.spot_discount = d;
        }
        for t in instance_types {
            self.upsert(t.into_instance_type(source_name)?);
        }
        if !price_overrides.is_empty() {
            return Err(CatalogError::Invalid { source_name: source_name.into(), message: self.retired_overrides(&price_overrides)? });
        }
        Ok(())
    }

    /// Why a file's `priceOverrides` are refused, with the NodeOverlays that price the same: the
    /// rules were retired for Karpenter's NodeOverlay, which Karpenter reads too and which never
    /// stacks with another (a rule and an overlay both discounting one type would have).
    fn retired_overrides(&self, rules: &[PriceOverride]) -> Result<String, CatalogError> {
        let mut overlays = Vec::new();
        let count = u32::try_from(rules.len()).unwrap_or(u32::MAX);
        for (i, o) in rules.iter().enumerate() {
            o.validate().map_err(|message| CatalogError::Invalid { source_name: "priceOverrides".into(), message })?;
            // The family label of the family's cloud: EC2's is Karpenter's own; Azure sizes' catalog
            // family (`Dps_v5`) is not Karpenter on Azure's (`D`), so Archer's label carries it.
            let aws = o.family.as_ref().is_some_and(|f| self.types.iter().any(|t| &t.family == f && t.provider == "aws"));
            let family_key = if aws { "karpenter.k8s.aws/instance-family" } else { "archer.dev/instance-family" };
            let rank = u32::try_from(i).unwrap_or(u32::MAX);
            overlays.push(o.node_overlay_yaml(&format!("catalog-price-override-{}", i + 1), count.saturating_sub(rank).saturating_mul(10), family_key));
        }
        Ok(format!(
            "priceOverrides were retired: Karpenter's NodeOverlay (karpenter.sh/v1alpha1) prices the same, and Archer, `simulate --scenario` and Karpenter all read it. Remove priceOverrides from this file and apply these (kubectl apply -f, or add them to a scenario):\n---\n{}",
            overlays.join("---\n")
        ))
    }

    fn upsert(&mut self, t: InstanceType) {
        match self.by_name.get(&t.name) {
            Some(&i) => {
                if let Some(slot) = self.types.get_mut(i) {
                    *slot = Arc::new(t);
                }
            }
            None => {
                self.by_name.insert(t.name.clone(), self.types.len());
                self.types.push(Arc::new(t));
            }
        }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<InstanceType>> {
        self.by_name.get(name).and_then(|&i| self.types.get(i))
    }

    pub fn types(&self) -> &[Arc<InstanceType>] {
        &self.types
    }

    pub fn len(&self) -> usize {
        self.types.len()
    }

    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// Hourly USD price of one instance of `t` in `region` as `capacity`.
    /// `None` when the catalog has no price for that region.
    pub fn price_of(&self, t: &InstanceType, region: Option<&str>, capacity: CapacityType) -> Option<f64> {
        let region = region.unwrap_or(&self.default_region);
        let on_demand = *t.prices.get(region)?;
        Some(self.price_from(t, on_demand, capacity))
    }

    /// Hourly USD price of `t` as `capacity` when its on-demand list price is `on_demand` (a cloud's price API's, or the catalog's): spot estimated by the type's (else
    /// the catalog's) spot discount. The user's own prices are NodeOverlays, applied to the
    /// offerings (`archer_model::overlay`).
    pub fn price_from(&self, t: &InstanceType, on_demand: f64, capacity: CapacityType) -> f64 {
        match capacity {
            CapacityType::OnDemand => on_demand,
            CapacityType::Spot => on_demand * (1.0 - t.spot_discount.unwrap_or(self.spot_discount)),
        }
    }

    /// Regions some type has a price in, with the providers priced there.
    pub fn regions(&self) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
        let mut out: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = Default::default();
        for t in &self.types {
            for r in t.prices.keys() {
                out.entry(r.clone()).or_default().insert(t.provider.clone());
            }
        }
        out
    }

    /// The price of `t` for a node in `zone`: in the zone's region when the catalog prices any
    /// type there (an Azure region prices only Azure sizes, an AWS region only EC2 types), else
    /// in the default region (a region the catalog has no prices for: EC2's us-east-1 list).
    pub fn price_in_zone(&self, t: &InstanceType, zone: &str, known: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>, capacity: CapacityType) -> Option<f64> {
        let region = labels::region_of(zone);
        if known.contains_key(region) {
            return self.price_of(t, Some(region), capacity);
        }
        self.price_of(t, None, capacity)
    }

    pub fn price(&self, instance_type: &str, region: Option<&str>, capacity: CapacityType) -> Option<f64> {
        self.price_of(self.get(instance_type)?, region, capacity)
    }
}

#[cfg(test)]
mod tests;
