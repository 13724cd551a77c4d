//! The well-known labels each cloud's nodes carry, made from the catalog's facts the way that
//! cloud's Karpenter provider writes them: EC2 (`karpenter.k8s.aws/instance-*`) and Azure
//! (`karpenter.azure.com/sku-*`, `kubernetes.azure.com/*`, as AKS node auto-provisioning does).
//! A pool's requirements select on them; a planned node carries them.

use crate::instance::{CapacityType, InstanceType};

/// The keys EC2 types carry.
pub(crate) const AWS_KEYS: [&str; 5] = [
    "karpenter.k8s.aws/instance-family",
    "karpenter.k8s.aws/instance-category",
    "karpenter.k8s.aws/instance-generation",
    "karpenter.k8s.aws/instance-cpu",
    "karpenter.k8s.aws/instance-memory",
];

const AZURE_SKU_NAME: &str = "karpenter.azure.com/sku-name";
const AZURE_SKU_FAMILY: &str = "karpenter.azure.com/sku-family";
const AZURE_SKU_SERIES: &str = "karpenter.azure.com/sku-series";
const AZURE_SKU_VERSION: &str = "karpenter.azure.com/sku-version";
const AZURE_SKU_CPU: &str = "karpenter.azure.com/sku-cpu";
/// In MiB, as Karpenter on Azure writes it.
const AZURE_SKU_MEMORY: &str = "karpenter.azure.com/sku-memory";
const AZURE_ACCELERATED_NETWORKING: &str = "karpenter.azure.com/sku-networking-accelerated";
const AZURE_PREMIUM_STORAGE: &str = "karpenter.azure.com/sku-storage-premium-capable";
/// In GB; written only where the size supports an ephemeral OS disk.
const AZURE_EPHEMERAL_OS_MAX: &str = "karpenter.azure.com/sku-storage-ephemeralos-maxsize";
const AZURE_GPU_NAME: &str = "karpenter.azure.com/sku-gpu-name";
const AZURE_GPU_MANUFACTURER: &str = "karpenter.azure.com/sku-gpu-manufacturer";
const AZURE_GPU_COUNT: &str = "karpenter.azure.com/sku-gpu-count";
const AKS_SKU_CPU: &str = "kubernetes.azure.com/sku-cpu";
const AKS_SKU_MEMORY: &str = "kubernetes.azure.com/sku-memory";

/// The keys Azure sizes carry.
const AZURE_KEYS: [&str; 15] = [
    AZURE_SKU_NAME,
    AZURE_SKU_FAMILY,
    AZURE_SKU_SERIES,
    AZURE_SKU_VERSION,
    AZURE_SKU_CPU,
    AZURE_SKU_MEMORY,
    AZURE_ACCELERATED_NETWORKING,
    AZURE_PREMIUM_STORAGE,
    AZURE_EPHEMERAL_OS_MAX,
    AZURE_GPU_NAME,
    AZURE_GPU_MANUFACTURER,
    AZURE_GPU_COUNT,
    AKS_SKU_CPU,
    AKS_SKU_MEMORY,
    crate::labels::AKS_SCALE_SET_PRIORITY,
];

/// Whether `key` is a label some cloud's types set (so a pool's requirement on it selects types
/// rather than labelling the node).
pub(crate) fn is_cloud_key(key: &str) -> bool {
    AWS_KEYS.contains(&key) || AZURE_KEYS.contains(&key)
}

/// The labels a node of `t` sold as `capacity` carries from its cloud.
pub(crate) fn labels(t: &InstanceType, capacity: CapacityType) -> Vec<(&'static str, String)> {
    match t.provider.as_str() {
        "azure" => azure(t, capacity),
        "aws" => aws(t),
        _ => Vec::new(),
    }
}

fn aws(t: &InstanceType) -> Vec<(&'static str, String)> {
    let [family, category, generation, cpu, memory] = AWS_KEYS;
    vec![(family, t.family.clone()), (category, t.category.clone()), (generation, t.generation.to_string()), (cpu, t.vcpu.to_string()), (memory, t.memory_mib.to_string())]
}

/// Karpenter on Azure's labels: the family is the size's letter(s) (`D`), the series its name
/// without size and prefix (`Dpds_v5`), the version its number (`5`); cpu and memory (MiB) under
/// both domains; the storage and networking capabilities; a GPU's count always, its maker and
/// name where it has one; and the scale set priority (`spot` or `regular`).
fn azure(t: &InstanceType, capacity: CapacityType) -> Vec<(&'static str, String)> {
    let fact = |k: &str| t.facts.get(k).cloned();
    let mut out = vec![
        (AZURE_SKU_NAME, t.name.clone()),
        (AZURE_SKU_FAMILY, t.category.clone()),
        (AZURE_SKU_SERIES, t.family.clone()),
        (AZURE_SKU_VERSION, t.generation.max(1).to_string()),
        (AZURE_SKU_CPU, t.vcpu.to_string()),
        (AZURE_SKU_MEMORY, t.memory_mib.to_string()),
        (AKS_SKU_CPU, t.vcpu.to_string()),
        (AKS_SKU_MEMORY, t.memory_mib.to_string()),
        (AZURE_ACCELERATED_NETWORKING, fact("accelerated_networking").unwrap_or_else(|| "false".into())),
        (AZURE_PREMIUM_STORAGE, fact("premium_storage").unwrap_or_else(|| "false".into())),
        (AZURE_GPU_COUNT, t.gpu_count.to_string()),
        (crate::labels::AKS_SCALE_SET_PRIORITY, if capacity == CapacityType::Spot { "spot" } else { "regular" }.to_string()),
    ];
    if let Some(gb) = fact("ephemeral_os_max_gb").filter(|g| g.parse::<u64>().is_ok_and(|g| g > 0)) {
        out.push((AZURE_EPHEMERAL_OS_MAX, gb));
    }
    if t.gpu_count > 0 {
        if let Some(maker) = fact("gpu_manufacturer") {
            out.push((AZURE_GPU_MANUFACTURER, maker));
        }
        if !t.gpu_name.is_empty() {
            out.push((AZURE_GPU_NAME, t.gpu_name.clone()));
        }
    }
    out
}
