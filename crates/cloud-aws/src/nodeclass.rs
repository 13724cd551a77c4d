//! EC2NodeClass, `archer.dev/v1alpha1`: the fields of Karpenter's `karpenter.k8s.aws/v1`
//! EC2NodeClass a launch needs, under the same names, so a Karpenter user ports one by changing
//! its apiVersion. A NodePool names it in `spec.template.spec.nodeClassRef`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where and how an EC2 node of a pool is launched. Cluster-scoped.
#[derive(CustomResource, Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[kube(group = "archer.dev", version = "v1alpha1", kind = "EC2NodeClass", plural = "archerec2nodeclasses", singular = "archerec2nodeclass", shortname = "aec2nc", category = "archer", status = "EC2NodeClassStatus")]
#[kube(printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#)]
#[kube(printcolumn = r#"{"name":"Role","type":"string","jsonPath":".spec.role"}"#)]
#[kube(printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct EC2NodeClassSpec {
    /// Subnets to launch in, by tags or id (any term matches).
    #[serde(default)]
    pub subnet_selector_terms: Vec<SelectorTerm>,
    /// Security groups of the instances, by tags, id or name (any term matches).
    #[serde(default)]
    pub security_group_selector_terms: Vec<SelectorTerm>,
    /// The images: by `alias` (`al2023@latest`, `bottlerocket@latest`, or a version after `@`),
    /// by id, by tags or by name (with an optional owner). Resolved per architecture; the newest
    /// image of an architecture wins.
    #[serde(default)]
    pub ami_selector_terms: Vec<AmiSelectorTerm>,
    /// `AL2023`, `Bottlerocket` or `Custom`; implied by an alias.
    #[serde(default)]
    pub ami_family: Option<String>,
    /// The IAM role of the nodes: Archer keeps an instance profile `archer_<cluster>_<hash>`
    /// holding exactly this role (created with the cluster's tag).
    #[serde(default)]
    pub role: Option<String>,
    /// The instance profile of the nodes (instead of `role`).
    #[serde(default)]
    pub instance_profile: Option<String>,
    /// User data passed to every instance as given.
    #[serde(default)]
    pub user_data: Option<String>,
    /// Tags on every instance, volume and launch template (Archer's own tags win).
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    #[serde(default)]
    pub block_device_mappings: Vec<BlockDeviceMapping>,
    /// Instance metadata service settings; IMDSv2 (`httpTokens: required`) unless set otherwise.
    #[serde(default)]
    pub metadata_options: Option<MetadataOptions>,
    #[serde(default, rename = "associatePublicIPAddress")]
    pub associate_public_ip_address: Option<bool>,
    #[serde(default)]
    pub detailed_monitoring: Option<bool>,
}

/// One selector: every given field must match.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelectorTerm {
    /// Tags the resource carries; the value `*` matches any value.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    #[serde(default)]
    pub id: Option<String>,
    /// Security groups only: the group's name.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AmiSelectorTerm {
    /// `family@version`: `al2023@latest`, `bottlerocket@latest`, `al2023@v20240807`.
    #[serde(default)]
    pub alias: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Name (wildcards allowed), with `owner` (account id or alias) to narrow it.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub owner: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockDeviceMapping {
    pub device_name: String,
    #[serde(default)]
    pub ebs: Option<BlockDevice>,
    /// The root volume (informational, as in Karpenter).
    #[serde(default)]
    pub root_volume: Option<bool>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockDevice {
    /// A quantity: `20Gi`, `100G`.
    #[serde(default)]
    pub volume_size: Option<String>,
    /// `gp3`, `gp2`, `io2`, ...
    #[serde(default)]
    pub volume_type: Option<String>,
    #[serde(default)]
    pub iops: Option<i32>,
    #[serde(default)]
    pub throughput: Option<i32>,
    #[serde(default)]
    pub encrypted: Option<bool>,
    #[serde(default, rename = "kmsKeyID")]
    pub kms_key_id: Option<String>,
    #[serde(default)]
    pub delete_on_termination: Option<bool>,
    #[serde(default, rename = "snapshotID")]
    pub snapshot_id: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetadataOptions {
    /// `enabled` (default) or `disabled`.
    #[serde(default)]
    pub http_endpoint: Option<String>,
    /// `disabled` (default) or `enabled`.
    #[serde(default, rename = "httpProtocolIPv6")]
    pub http_protocol_ipv6: Option<String>,
    /// 1 (default): pods cannot reach the node's credentials through IMDS.
    #[serde(default)]
    pub http_put_response_hop_limit: Option<i32>,
    /// `required` (IMDSv2, default) or `optional`.
    #[serde(default)]
    pub http_tokens: Option<String>,
}

/// What the node class resolved to, refreshed periodically.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EC2NodeClassStatus {
    #[serde(default)]
    pub subnets: Vec<ResolvedSubnet>,
    #[serde(default)]
    pub security_groups: Vec<ResolvedSecurityGroup>,
    #[serde(default)]
    pub amis: Vec<ResolvedAmi>,
    #[serde(default)]
    pub instance_profile: Option<String>,
    /// `Ready`: every selector resolved to at least one resource.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedSubnet {
    pub id: String,
    pub zone: String,
    #[serde(default, rename = "zoneID")]
    pub zone_id: Option<String>,
    /// Free addresses when resolved (the launch prefers the emptiest subnet of a zone).
    #[serde(default)]
    pub available_ips: Option<i32>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedSecurityGroup {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedAmi {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    /// `amd64` or `arm64`.
    pub arch: String,
    /// When the image was created (RFC 3339), newest wins per architecture.
    #[serde(default)]
    pub creation_date: Option<String>,
}

impl EC2NodeClass {
    pub fn name(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }
}

/// An AMI alias: the family's image name pattern per architecture and the version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Alias {
    pub family: &'static str,
    pub version: String,
}

impl Alias {
    /// `al2023@latest` → AL2023, latest. Unknown families are an error naming the known ones.
    pub fn parse(s: &str) -> Result<Alias, String> {
        let (family, version) = s.split_once('@').unwrap_or((s, "latest"));
        let family = match family.to_ascii_lowercase().as_str() {
            "al2023" => "AL2023",
            "bottlerocket" => "Bottlerocket",
            other => return Err(format!("unknown AMI alias family {other:?} (known: al2023, bottlerocket)")),
        };
        if version.is_empty() || version.contains(['*', '?', ' ']) {
            return Err(format!("AMI alias {s:?}: the version must be `latest` or a release such as v20240807"));
        }
        Ok(Alias { family, version: version.to_string() })
    }

    /// The image-name pattern of this alias for an architecture (`amd64`/`arm64`), as EKS
    /// publishes its optimised images.
    pub(crate) fn name_pattern(&self, arch: &str) -> String {
        let version = if self.version == "latest" { "*".to_string() } else { format!("*{}*", self.version.trim_start_matches('v')) };
        match (self.family, arch) {
            ("AL2023", "arm64") => format!("amazon-eks-node-al2023-arm64-standard-{version}"),
            ("AL2023", _) => format!("amazon-eks-node-al2023-x86_64-standard-{version}"),
            ("Bottlerocket", "arm64") => format!("bottlerocket-aws-k8s-{version}-aarch64-*"),
            (_, _) => format!("bottlerocket-aws-k8s-{version}-x86_64-*"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_karpenter_node_class_reads_by_changing_its_api_version() {
        let text = r#"
apiVersion: archer.dev/v1alpha1
kind: EC2NodeClass
metadata: {name: default}
spec:
  role: KarpenterNodeRole-demo
  amiSelectorTerms: [{alias: al2023@latest}]
  subnetSelectorTerms: [{tags: {karpenter.sh/discovery: demo}}, {id: subnet-0abc}]
  securityGroupSelectorTerms: [{tags: {karpenter.sh/discovery: demo}}, {name: extra}]
  tags: {team: platform}
  blockDeviceMappings:
    - deviceName: /dev/xvda
      ebs: {volumeSize: 100Gi, volumeType: gp3, encrypted: true, kmsKeyID: key-1, deleteOnTermination: true}
  metadataOptions: {httpTokens: required, httpPutResponseHopLimit: 1, httpProtocolIPv6: disabled}
  associatePublicIPAddress: false
"#;
        let nc: EC2NodeClass = archer_core::yaml::from_str(text).expect("node class");
        assert_eq!(nc.spec.role.as_deref(), Some("KarpenterNodeRole-demo"));
        assert_eq!(nc.spec.ami_selector_terms[0].alias.as_deref(), Some("al2023@latest"));
        assert_eq!(nc.spec.subnet_selector_terms[1].id.as_deref(), Some("subnet-0abc"));
        assert_eq!(nc.spec.security_group_selector_terms[1].name.as_deref(), Some("extra"));
        let ebs = nc.spec.block_device_mappings[0].ebs.as_ref().expect("ebs");
        assert_eq!((ebs.volume_size.as_deref(), ebs.kms_key_id.as_deref()), (Some("100Gi"), Some("key-1")));
        assert_eq!(nc.spec.metadata_options.as_ref().and_then(|m| m.http_protocol_ipv6.as_deref()), Some("disabled"));
        assert_eq!(nc.spec.associate_public_ip_address, Some(false));
    }

    #[test]
    fn aliases_map_to_each_architectures_image_names() {
        let a = Alias::parse("al2023@latest").expect("alias");
        assert_eq!(a.name_pattern("arm64"), "amazon-eks-node-al2023-arm64-standard-*");
        assert_eq!(a.name_pattern("amd64"), "amazon-eks-node-al2023-x86_64-standard-*");
        let b = Alias::parse("bottlerocket@v1.20.0").expect("alias");
        assert_eq!(b.name_pattern("arm64"), "bottlerocket-aws-k8s-*1.20.0*-aarch64-*");
        assert!(Alias::parse("windows2022@latest").unwrap_err().contains("known: al2023, bottlerocket"));
        assert!(Alias::parse("al2023@*").is_err());
    }
}
