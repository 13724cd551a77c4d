//! An instance type and the capacity types it is sold as: what a node is, as the catalog lists
//! it and the packer buys it. Prices live in the catalog (`crate::catalog`). And an [`Instance`]:
//! one a provider runs, as the model's lifecycle decisions read it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::resources::Resources;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityType {
    OnDemand,
    Spot,
}

impl CapacityType {
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityType::OnDemand => "on-demand",
            CapacityType::Spot => "spot",
        }
    }

    /// A node's capacity type from its labels: Karpenter's `karpenter.sh/capacity-type`, else
    /// Archer's `archer.dev/capacity-type`, else EKS managed node groups'
    /// `eks.amazonaws.com/capacityType`, else AKS's `kubernetes.azure.com/scalesetpriority`
    /// (`spot`, else on-demand); on-demand when none says (a value none of these names, like
    /// Karpenter's `reserved`, gives way to the next). The one reading every price of a running
    /// node uses.
    pub fn of_node(label: &dyn Fn(&str) -> Option<String>) -> CapacityType {
        use crate::labels as l;
        let parsed = |key: &str| label(key).and_then(|c| CapacityType::parse(&c));
        parsed(l::KARPENTER_CAPACITY_TYPE)
            .or_else(|| parsed(l::CAPACITY_TYPE))
            .or_else(|| parsed(l::EKS_CAPACITY_TYPE))
            .or_else(|| label(l::AKS_SCALE_SET_PRIORITY).map(|p| if p == "spot" { CapacityType::Spot } else { CapacityType::OnDemand }))
            .unwrap_or(CapacityType::OnDemand)
    }

    /// `on-demand` / `spot`, also as EKS managed node groups write them (`ON_DEMAND`, `SPOT`).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "on-demand" | "ondemand" | "on_demand" => Some(CapacityType::OnDemand),
            "spot" => Some(CapacityType::Spot),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceType {
    pub name: String,
    pub provider: String,
    pub arch: String,
    pub os: String,
    pub family: String,
    pub category: String,
    pub generation: u32,
    pub cpu_manufacturer: String,
    pub vcpu: u32,
    pub memory_mib: u64,
    pub gpu_count: u32,
    pub gpu_name: String,
    /// What the kubelet offers pods (cpu millicores, memory bytes, max pods).
    #[serde(skip)]
    pub allocatable: Resources,
    pub allocatable_cpu: String,
    pub allocatable_memory: String,
    pub max_pods: i64,
    /// On-demand USD per hour by region.
    pub prices: BTreeMap<String, f64>,
    /// Fraction below on-demand that spot usually costs; `None`: the catalog default.
    pub spot_discount: Option<f64>,
    /// Facts of the type's own cloud the catalog's columns carry beyond the common ones (Azure:
    /// `accelerated_networking`, `premium_storage`, `ephemeral_os_max_gb`): the cloud's labels
    /// are made from them ([`crate::cloud_labels`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub facts: BTreeMap<String, String>,
    /// Extended resources a NodeOverlay's `capacity` gives the type (`smarter-devices/fuse`: 1,
    /// `hugepages-2Mi`: bytes), assigned over what it has, as Karpenter's `ApplyCapacityOverlay`
    /// does: an entry for `nvidia.com/gpu` replaces the catalog's GPU count.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extended: BTreeMap<String, i64>,
}

/// The resource instance types offer their GPUs as.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

impl InstanceType {
    /// How much of extended resource `name` a node of this type offers pods: an overlay's
    /// `capacity` first, then its GPUs as `nvidia.com/gpu`; 0 for any other.
    pub fn extended_resource(&self, name: &str) -> i64 {
        match self.extended.get(name) {
            Some(v) => *v,
            None if name == GPU_RESOURCE => i64::from(self.gpu_count),
            None => 0,
        }
    }

    /// Every extended resource it offers (those above 0): its GPUs, then overlays' `capacity`.
    pub fn extended_resources(&self) -> BTreeMap<String, i64> {
        let mut all = BTreeMap::new();
        if self.gpu_count > 0 {
            all.insert(GPU_RESOURCE.to_string(), i64::from(self.gpu_count));
        }
        all.extend(self.extended.iter().map(|(k, v)| (k.clone(), *v)));
        all.retain(|_, v| *v > 0);
        all
    }
}

/// A running (or starting) instance the provider knows of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub provider_id: String,
    /// The Node it registers as.
    pub node_name: String,
    /// The NodeClaim it was launched for.
    pub claim: String,
    /// What the provider launched (it may pick another type than planned from the claim's list).
    pub instance_type: Option<String>,
    pub zone: Option<String>,
    /// When it was launched (garbage collection leaves young instances alone).
    pub launched_at: Option<std::time::SystemTime>,
    /// The image it booted, and a hash of the node class it was launched with (drift).
    pub image_id: Option<String>,
    pub node_class_hash: Option<String>,
}
