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
#[kube(group = "archer.dev", version = "v1alpha1", kind = "AKSNodeClass", plural = "archeraksnodeclasses", singular = "archeraksnodeclass", shortname = "aaksnc", category = "archer", status = "AKSNodeClassStatus")]
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

/// The kubelet settings Karpenter on Azure exposes. Each becomes a kubelet flag in the node's
/// bootstrap, so each string is held to what the kubelet takes (enums, a duration, a quantity,
/// sysctl names): by the CRD, and again at launch.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfiguration {
    /// `none` or `static`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // A pattern rather than an enum: the API server refuses an explicit null for a nullable enum.
    #[schemars(regex(pattern = "^(none|static)$"))]
    pub cpu_manager_policy: Option<String>,
    #[serde(default, rename = "cpuCFSQuota", skip_serializing_if = "Option::is_none")]
    pub cpu_cfs_quota: Option<bool>,
    /// A duration (`100ms`).
    #[serde(default, rename = "cpuCFSQuotaPeriod", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = DURATION_PATTERN))]
    pub cpu_cfs_quota_period: Option<String>,
    #[serde(default, rename = "imageGCHighThresholdPercent", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub image_gc_high_threshold_percent: Option<i32>,
    #[serde(default, rename = "imageGCLowThresholdPercent", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub image_gc_low_threshold_percent: Option<i32>,
    /// `restricted`, `best-effort`, `none` or `single-numa-node`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^(restricted|best-effort|none|single-numa-node)$"))]
    pub topology_manager_policy: Option<String>,
    /// Sysctl names, or patterns ending in `*` (`kernel.msg*`, `net.*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(max = 253), regex(pattern = SYSCTL_PATTERN)))]
    pub allowed_unsafe_sysctls: Vec<String>,
    /// A quantity (`50Mi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = QUANTITY_PATTERN))]
    pub container_log_max_size: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2))]
    pub container_log_max_files: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_pids_limit: Option<i64>,
}

/// A Go duration as the kubelet reads one (`100ms`, `1m30s`).
const DURATION_PATTERN: &str = "^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$";
/// A quantity with a unit, as Karpenter on Azure's CRD has it (`50Mi`, `1G`).
const QUANTITY_PATTERN: &str = "^[0-9]+(E|P|T|G|M|K|Ei|Pi|Ti|Gi|Mi|Ki)$";
/// A sysctl name (segments of `[a-z0-9_-]` joined by `.` or `/`), optionally ending in `*`.
const SYSCTL_PATTERN: &str = "^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*([a-z0-9]([-_a-z0-9]*[a-z0-9])?[*]?|[*])$";
const CPU_MANAGER_POLICIES: [&str; 2] = ["none", "static"];
const TOPOLOGY_MANAGER_POLICIES: [&str; 4] = ["restricted", "best-effort", "none", "single-numa-node"];

impl KubeletConfiguration {
    /// Why these settings cannot be written as kubelet flags, if they cannot: what the CRD
    /// refuses, checked again for a class that reached Archer without it.
    pub fn validate(&self) -> Result<(), String> {
        let one_of = |field: &str, v: &Option<String>, allowed: &[&str]| match v {
            Some(v) if !allowed.contains(&v.as_str()) => Err(format!("kubelet.{field} {v:?} is not one of {}", allowed.join(", "))),
            _ => Ok(()),
        };
        one_of("cpuManagerPolicy", &self.cpu_manager_policy, &CPU_MANAGER_POLICIES)?;
        one_of("topologyManagerPolicy", &self.topology_manager_policy, &TOPOLOGY_MANAGER_POLICIES)?;
        if let Some(v) = self.cpu_cfs_quota_period.as_deref().filter(|v| !is_duration(v)) {
            return Err(format!("kubelet.cpuCFSQuotaPeriod {v:?} is not a duration (100ms)"));
        }
        if let Some(v) = self.container_log_max_size.as_deref().filter(|v| !is_quantity(v)) {
            return Err(format!("kubelet.containerLogMaxSize {v:?} is not a quantity with a unit (50Mi)"));
        }
        if let Some(v) = self.allowed_unsafe_sysctls.iter().find(|v| !is_sysctl(v)) {
            return Err(format!("kubelet.allowedUnsafeSysctls: {v:?} is not a sysctl name or pattern (net.core.somaxconn, kernel.msg*)"));
        }
        Ok(())
    }
}

fn is_duration(s: &str) -> bool {
    let mut rest = s;
    if s.is_empty() || s.len() > 32 {
        return false;
    }
    while !rest.is_empty() {
        let int = rest.bytes().take_while(u8::is_ascii_digit).count();
        if int == 0 {
            return false;
        }
        rest = rest.get(int..).unwrap_or_default();
        if let Some(frac) = rest.strip_prefix('.') {
            let n = frac.bytes().take_while(u8::is_ascii_digit).count();
            if n == 0 {
                return false;
            }
            rest = frac.get(n..).unwrap_or_default();
        }
        let Some(unit) = ["ns", "us", "ms", "s", "m", "h"].into_iter().find(|u| rest.starts_with(u)) else { return false };
        rest = rest.get(unit.len()..).unwrap_or_default();
    }
    true
}

fn is_quantity(s: &str) -> bool {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && s.len() <= 32 && ["E", "P", "T", "G", "M", "K", "Ei", "Pi", "Ti", "Gi", "Mi", "Ki"].contains(&s.get(digits..).unwrap_or_default())
}

fn is_sysctl(s: &str) -> bool {
    let segment = |seg: &str| {
        let b = seg.as_bytes();
        !b.is_empty()
            && b.first().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && b.last().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'_')
    };
    if s.len() > 253 {
        return false;
    }
    let segments: Vec<&str> = s.split(['.', '/']).collect();
    let (last, init) = match segments.split_last() {
        Some(x) => x,
        None => return false,
    };
    let last_ok = *last == "*" || segment(last.strip_suffix('*').unwrap_or(last));
    last_ok && init.iter().all(|seg| segment(seg))
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

    /// Kubelet settings the kubelet takes pass; anything that could carry another flag does not.
    #[test]
    fn kubelet_settings_are_held_to_what_the_kubelet_takes() {
        let k = |v: serde_json::Value| serde_json::from_value::<KubeletConfiguration>(v).expect("kubelet");
        let good = k(serde_json::json!({"cpuManagerPolicy": "static", "topologyManagerPolicy": "single-numa-node", "cpuCFSQuotaPeriod": "100ms", "containerLogMaxSize": "50Mi",
            "allowedUnsafeSysctls": ["kernel.msg*", "net.*", "net.ipv4.route.min_pmtu", "kernel.shm_rmid_forced", "net/ipv4/ip_forward"]}));
        assert_eq!(good.validate(), Ok(()));
        assert_eq!(k(serde_json::json!({"cpuCFSQuotaPeriod": "1m30.5s"})).validate(), Ok(()));
        for (bad, says) in [
            (serde_json::json!({"cpuManagerPolicy": "static --kubeconfig=/tmp/x"}), "cpuManagerPolicy"),
            (serde_json::json!({"topologyManagerPolicy": "none\n--anonymous-auth=true"}), "topologyManagerPolicy"),
            (serde_json::json!({"cpuCFSQuotaPeriod": "100ms --x"}), "cpuCFSQuotaPeriod"),
            (serde_json::json!({"cpuCFSQuotaPeriod": "ms"}), "cpuCFSQuotaPeriod"),
            (serde_json::json!({"containerLogMaxSize": "10Mi\nKUBELET_FLAGS=--x"}), "containerLogMaxSize"),
            (serde_json::json!({"containerLogMaxSize": "10"}), "containerLogMaxSize"),
            (serde_json::json!({"allowedUnsafeSysctls": ["net.core.somaxconn --x"]}), "allowedUnsafeSysctls"),
            (serde_json::json!({"allowedUnsafeSysctls": ["a,b"]}), "allowedUnsafeSysctls"),
            (serde_json::json!({"allowedUnsafeSysctls": ["net..x"]}), "allowedUnsafeSysctls"),
        ] {
            let e = k(bad.clone()).validate().expect_err("refused");
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
