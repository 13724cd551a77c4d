//! AKSNodeClass, `archer.dev/v1alpha1`: the fields of Karpenter on Azure's
//! `karpenter.azure.com/v1beta1` AKSNodeClass under the same names (imageFamily, osDiskSizeGB,
//! vnetSubnetID, tags, maxPods, kubelet, security), so a NAP user ports one by changing its
//! apiVersion, and the same status conditions. A NodePool names it in
//! `spec.template.spec.nodeClassRef` (Karpenter on Azure's own, group `karpenter.azure.com`, is
//! read as well: the pool plans Azure sizes either way).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How an Azure node of a pool is made. Cluster-scoped.
#[derive(CustomResource, Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[kube(group = "archer.dev", version = "v1alpha1", kind = "AKSNodeClass", plural = "aksnodeclasses", shortname = "aksnc", status = "AKSNodeClassStatus")]
#[kube(printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#)]
#[kube(printcolumn = r#"{"name":"ImageFamily","type":"string","jsonPath":".spec.imageFamily"}"#)]
#[kube(printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct AKSNodeClassSpec {
    /// The subnet the nodes' NICs join (`/subscriptions/.../virtualNetworks/<vnet>/subnets/<subnet>`);
    /// unset: the cluster's.
    #[serde(default, rename = "vnetSubnetID", skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"(?i)^/subscriptions/[^/]+/resourceGroups/[a-zA-Z0-9_\-().]{0,89}[a-zA-Z0-9_\-()]/providers/Microsoft\.Network/virtualNetworks/[^/]+/subnets/[^/]+$"))]
    pub vnet_subnet_id: Option<String>,
    /// OS disk size in GB (30-2048; default 128).
    #[serde(default, rename = "osDiskSizeGB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30, max = 2048))]
    pub os_disk_size_gb: Option<i32>,
    /// `Ubuntu`, `Ubuntu2204`, `Ubuntu2404` or `AzureLinux`: the AKS node image of each size's
    /// architecture and generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_family: Option<ImageFamily>,
    /// `FIPS` or `Disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fips_mode: Option<FipsMode>,
    /// Tags on every VM, NIC and disk (Archer's own tags win).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<KubeletConfiguration>,
    /// Pods per node (10-250); default 250 (Azure CNI overlay), as the catalog's allocatable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 250))]
    pub max_pods: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<Security>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub enum ImageFamily {
    Ubuntu,
    Ubuntu2204,
    Ubuntu2404,
    AzureLinux,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub enum FipsMode {
    #[serde(rename = "FIPS")]
    Fips,
    Disabled,
}

/// The kubelet settings Karpenter on Azure exposes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfiguration {
    /// `none` or `static`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_manager_policy: Option<String>,
    #[serde(default, rename = "cpuCFSQuota", skip_serializing_if = "Option::is_none")]
    pub cpu_cfs_quota: Option<bool>,
    #[serde(default, rename = "cpuCFSQuotaPeriod", skip_serializing_if = "Option::is_none")]
    pub cpu_cfs_quota_period: Option<String>,
    #[serde(default, rename = "imageGCHighThresholdPercent", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub image_gc_high_threshold_percent: Option<i32>,
    #[serde(default, rename = "imageGCLowThresholdPercent", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub image_gc_low_threshold_percent: Option<i32>,
    /// `restricted`, `best-effort`, `none` or `single-numa-node`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_manager_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_unsafe_sysctls: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_log_max_size: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2))]
    pub container_log_max_files: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_pids_limit: Option<i64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Security {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_at_host: Option<bool>,
}

/// Conditions as Karpenter on Azure reports them (`ImagesReady`, `KubernetesVersionReady`,
/// `SubnetsReady`, `ValidationSucceeded`, and `Ready` over them), and what was resolved.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AKSNodeClassStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The node images resolved, per architecture.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<NodeImage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct NodeImage {
    pub id: String,
    /// The architectures and generations it runs (`kubernetes.io/arch In [arm64]`).
    #[serde(default)]
    pub requirements: Vec<k8s_openapi::api::core::v1::NodeSelectorRequirement>,
}

/// The condition types, as Karpenter on Azure names them.
pub const CONDITION_TYPES: [&str; 5] = ["Ready", "ImagesReady", "KubernetesVersionReady", "SubnetsReady", "ValidationSucceeded"];

#[cfg(test)]
mod tests {
    use super::*;

    /// The module's AKSNodeClass, written for Karpenter on Azure, reads unchanged as Archer's.
    #[test]
    fn karpenter_on_azures_node_class_reads_unchanged() {
        let doc = serde_json::json!({"apiVersion": "archer.dev/v1alpha1", "kind": "AKSNodeClass", "metadata": {"name": "default"}, "spec": {
            "imageFamily": "Ubuntu2204", "osDiskSizeGB": 100, "maxPods": 110,
            "vnetSubnetID": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/nodes",
            "tags": {"team": "demo"}, "kubelet": {"cpuManagerPolicy": "static", "imageGCHighThresholdPercent": 85, "cpuCFSQuota": true},
            "security": {"encryptionAtHost": true}, "fipsMode": "FIPS"}});
        let class: AKSNodeClass = serde_json::from_value(doc.clone()).expect("class");
        assert_eq!(class.spec.image_family, Some(ImageFamily::Ubuntu2204));
        assert_eq!((class.spec.os_disk_size_gb, class.spec.max_pods), (Some(100), Some(110)));
        assert_eq!(class.spec.kubelet.as_ref().and_then(|k| k.image_gc_high_threshold_percent), Some(85));
        assert_eq!(class.spec.fips_mode, Some(FipsMode::Fips));
        assert_eq!(serde_json::to_value(&class).expect("json")["spec"], doc["spec"], "written back under Karpenter on Azure's names");
        assert!(serde_json::from_value::<AKSNodeClass>(serde_json::json!({"apiVersion": "archer.dev/v1alpha1", "kind": "AKSNodeClass", "metadata": {"name": "x"}, "spec": {"imageFamily": "Windows"}})).is_err());
    }
}
