//! Catalog data formats: the CSV the embedded catalog uses, and the user's YAML file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{CapacityType, CatalogError, InstanceType};
use crate::quantity;
use crate::resources::Resources;

const PRICE_PREFIX: &str = "ondemand_usd_per_hour_";

fn invalid(source_name: &str, message: String) -> CatalogError {
    CatalogError::Invalid { source_name: source_name.to_string(), message }
}

/// Parse a provider CSV; every `ondemand_usd_per_hour_<region>` column is a region's price.
pub(crate) fn parse_csv(provider: &str, text: &str) -> Result<Vec<InstanceType>, CatalogError> {
    let mut reader = csv::ReaderBuilder::new().trim(csv::Trim::All).from_reader(text.as_bytes());
    let headers = reader.headers().map_err(|e| invalid(provider, format!("header: {e}")))?.clone();
    let col = |name: &str| headers.iter().position(|h| h == name);
    let need = |name: &str| col(name).ok_or_else(|| invalid(provider, format!("missing column {name}")));
    let (c_name, c_arch, c_os, c_vcpu, c_mem, c_acpu, c_amem, c_pods) = (
        need("instance_type")?,
        need("arch")?,
        need("os")?,
        need("vcpu")?,
        need("memory_mib")?,
        need("allocatable_cpu")?,
        need("allocatable_memory")?,
        need("max_pods")?,
    );
    const OPTIONAL: [&str; 6] = ["family", "category", "generation", "cpu_manufacturer", "gpu_count", "gpu_name"];
    let optional = OPTIONAL.map(col);
    const REQUIRED: [&str; 8] = ["instance_type", "arch", "os", "vcpu", "memory_mib", "allocatable_cpu", "allocatable_memory", "max_pods"];
    // Every other column is a fact of the type's own cloud.
    let fact_cols: Vec<(usize, String)> = headers
        .iter()
        .enumerate()
        .filter(|(_, h)| !h.starts_with(PRICE_PREFIX) && !OPTIONAL.contains(h) && !REQUIRED.contains(h))
        .map(|(i, h)| (i, h.to_string()))
        .collect();
    let price_cols: Vec<(usize, String)> = headers
        .iter()
        .enumerate()
        .filter_map(|(i, h)| h.strip_prefix(PRICE_PREFIX).map(|r| (i, r.replace('_', "-"))))
        .collect();
    let mut out = Vec::new();
    for (n, record) in reader.records().enumerate() {
        let record = record.map_err(|e| invalid(provider, format!("row {}: {e}", n + 2)))?;
        let get = |i: usize| record.get(i).unwrap_or("");
        let opt = |k: usize| optional.get(k).copied().flatten().map(get).unwrap_or("");
        let name = get(c_name).to_string();
        let bad = |what: &str, v: &str| invalid(provider, format!("row {} ({name}): {what} {v:?}", n + 2));
        let num = |i: usize, what: &str| -> Result<u64, CatalogError> { get(i).parse().map_err(|_| bad(what, get(i))) };
        let cpu = quantity::cpu_millis(get(c_acpu)).ok_or_else(|| bad("allocatable_cpu", get(c_acpu)))?;
        let mem = quantity::value(get(c_amem)).ok_or_else(|| bad("allocatable_memory", get(c_amem)))?;
        let max_pods = num(c_pods, "max_pods")? as i64;
        let mut prices = BTreeMap::new();
        for (i, region) in &price_cols {
            let v = get(*i);
            if !v.is_empty() {
                prices.insert(region.clone(), v.parse::<f64>().map_err(|_| bad("price", v))?);
            }
        }
        out.push(InstanceType {
            allocatable: Resources::new(cpu, mem, max_pods),
            provider: provider.to_string(),
            arch: get(c_arch).to_string(),
            os: get(c_os).to_string(),
            family: opt(0).to_string(),
            category: opt(1).to_string(),
            generation: opt(2).parse().unwrap_or(0),
            cpu_manufacturer: opt(3).to_string(),
            vcpu: num(c_vcpu, "vcpu")? as u32,
            memory_mib: num(c_mem, "memory_mib")?,
            gpu_count: opt(4).parse().unwrap_or(0),
            gpu_name: opt(5).to_string(),
            allocatable_cpu: get(c_acpu).to_string(),
            allocatable_memory: get(c_amem).to_string(),
            max_pods,
            prices,
            spot_discount: None,
            facts: fact_cols.iter().filter(|(i, _)| !get(*i).is_empty()).map(|(i, h)| (h.clone(), get(*i).to_string())).collect(),
            extended: BTreeMap::new(),
            name,
        });
    }
    Ok(out)
}

/// The user's catalog file (YAML).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CatalogFile {
    /// Region assumed for nodes without `topology.kubernetes.io/region`.
    pub default_region: Option<String>,
    /// Default fraction below on-demand for spot (0.65 = 65% cheaper).
    pub spot_discount: Option<f64>,
    /// Instance types to add, or to replace when the name exists.
    #[serde(default)]
    pub instance_types: Vec<InstanceTypeEntry>,
    /// Price rules, first match wins (e.g. a savings plan on a family, a reserved rate).
    #[serde(default)]
    pub price_overrides: Vec<PriceOverride>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceTypeEntry {
    pub name: String,
    #[serde(default = "user_provider")]
    pub provider: String,
    pub arch: String,
    #[serde(default = "linux")]
    pub os: String,
    #[serde(default)]
    pub family: String,
    #[serde(default)]
    pub category: String,
    #[serde(default)]
    pub generation: u32,
    #[serde(default)]
    pub cpu_manufacturer: String,
    pub vcpu: u32,
    pub memory_mib: u64,
    #[serde(default)]
    pub gpu_count: u32,
    #[serde(default)]
    pub gpu_name: String,
    /// `{cpu: 3920m, memory: 14103Mi}`
    pub allocatable: BTreeMap<String, String>,
    pub max_pods: i64,
    /// On-demand USD per hour by region.
    pub prices: BTreeMap<String, f64>,
    /// Facts of the type's own cloud (see the embedded CSVs' extra columns).
    #[serde(default)]
    pub facts: BTreeMap<String, String>,
    #[serde(default)]
    pub spot_discount: Option<f64>,
}

fn user_provider() -> String {
    "user".into()
}

fn linux() -> String {
    "linux".into()
}

impl InstanceTypeEntry {
    /// The entry a catalog file would give for `t` (what `archer catalog fetch` writes).
    pub fn of(t: &InstanceType) -> Self {
        InstanceTypeEntry {
            name: t.name.clone(),
            provider: t.provider.clone(),
            arch: t.arch.clone(),
            os: t.os.clone(),
            family: t.family.clone(),
            category: t.category.clone(),
            generation: t.generation,
            cpu_manufacturer: t.cpu_manufacturer.clone(),
            vcpu: t.vcpu,
            memory_mib: t.memory_mib,
            gpu_count: t.gpu_count,
            gpu_name: t.gpu_name.clone(),
            allocatable: [("cpu".to_string(), t.allocatable_cpu.clone()), ("memory".to_string(), t.allocatable_memory.clone())].into(),
            max_pods: t.max_pods,
            prices: t.prices.clone(),
            facts: t.facts.clone(),
            spot_discount: t.spot_discount,
        }
    }

    pub(crate) fn into_instance_type(self, source_name: &str) -> Result<InstanceType, CatalogError> {
        let cpu_s = self.allocatable.get("cpu").cloned().unwrap_or_default();
        let mem_s = self.allocatable.get("memory").cloned().unwrap_or_default();
        let cpu = quantity::cpu_millis(&cpu_s).ok_or_else(|| invalid(source_name, format!("{}: allocatable.cpu {cpu_s:?}", self.name)))?;
        let mem = quantity::value(&mem_s).ok_or_else(|| invalid(source_name, format!("{}: allocatable.memory {mem_s:?}", self.name)))?;
        if let Some(d) = self.spot_discount {
            if !(0.0..1.0).contains(&d) {
                return Err(invalid(source_name, format!("{}: spotDiscount {d} must be in [0, 1)", self.name)));
            }
        }
        Ok(InstanceType {
            allocatable: Resources::new(cpu, mem, self.max_pods),
            name: self.name,
            provider: self.provider,
            arch: self.arch,
            os: self.os,
            family: self.family,
            category: self.category,
            generation: self.generation,
            cpu_manufacturer: self.cpu_manufacturer,
            vcpu: self.vcpu,
            memory_mib: self.memory_mib,
            gpu_count: self.gpu_count,
            gpu_name: self.gpu_name,
            allocatable_cpu: cpu_s,
            allocatable_memory: mem_s,
            max_pods: self.max_pods,
            prices: self.prices,
            facts: self.facts,
            spot_discount: self.spot_discount,
            extended: BTreeMap::new(),
        })
    }
}

/// A price rule: which instances it applies to, and the price it sets.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriceOverride {
    #[serde(default)]
    pub instance_type: Option<String>,
    #[serde(default)]
    pub family: Option<String>,
    #[serde(default)]
    pub arch: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    /// `on-demand` or `spot`; absent: both.
    #[serde(default)]
    pub capacity_type: Option<String>,
    #[serde(flatten)]
    pub rule: PriceRule,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub enum PriceRule {
    /// A fixed hourly price (a reserved-instance rate).
    PricePerHour(f64),
    /// A fraction off the list price (0.2 = 20% off, a savings plan).
    Discount(f64),
}

impl PriceOverride {
    pub fn validate(&self) -> Result<(), String> {
        match self.rule {
            PriceRule::PricePerHour(p) if !(p >= 0.0 && p.is_finite()) => return Err(format!("pricePerHour {p} must be >= 0")),
            PriceRule::Discount(d) if !(0.0..=1.0).contains(&d) => return Err(format!("discount {d} must be in [0, 1]")),
            _ => {}
        }
        if let Some(c) = &self.capacity_type {
            CapacityType::parse(c).ok_or_else(|| format!("capacityType {c:?} must be on-demand or spot"))?;
        }
        Ok(())
    }

    /// The Karpenter NodeOverlay (`karpenter.sh/v1alpha1`) that prices what this retired rule
    /// priced, as YAML: each field a requirement (`family` on `family_key`, the family label of
    /// the family's cloud), `discount` a `priceAdjustment` in percent, `pricePerHour` a `price`.
    /// Rules were first-match-wins; overlays are highest-weight-wins, so the caller gives the
    /// first rule the highest `weight`.
    pub fn node_overlay_yaml(&self, name: &str, weight: u32, family_key: &str) -> String {
        let mut requirements = Vec::new();
        let mut require = |key: &str, value: &Option<String>| {
            if let Some(v) = value {
                requirements.push(format!("    - {{key: {key}, operator: In, values: [{}]}}\n", yaml_string(v)));
            }
        };
        require(crate::labels::INSTANCE_TYPE, &self.instance_type);
        require(family_key, &self.family);
        require(crate::labels::ARCH, &self.arch);
        require(crate::labels::REGION, &self.region);
        require(crate::labels::KARPENTER_CAPACITY_TYPE, &self.capacity_type);
        let price = match self.rule {
            PriceRule::PricePerHour(p) => format!("  price: \"{p}\"\n"),
            PriceRule::Discount(d) => format!("  priceAdjustment: \"-{}%\"\n", (d * 1e6).round() / 1e4),
        };
        let requirements = if requirements.is_empty() { "  requirements: []\n".to_string() } else { format!("  requirements:\n{}", requirements.concat()) };
        format!("apiVersion: karpenter.sh/v1alpha1\nkind: NodeOverlay\nmetadata:\n  name: {name}\nspec:\n  weight: {weight}\n{requirements}{price}")
    }
}

/// A YAML scalar for a value a user wrote (quoted, so nothing in it is read as syntax).
fn yaml_string(v: &str) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "\"\"".to_string())
}
