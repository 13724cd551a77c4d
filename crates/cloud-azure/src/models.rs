//! The parts of ARM's resources Archer writes and reads, under ARM's names (Compute
//! `2026-04-01`, Network `2026-03-01`). What Archer sends is exactly these fields; what it reads
//! ignores every other field.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The api-versions the operations are called with.
pub(crate) const COMPUTE_API: &str = "2026-04-01";
pub(crate) const NETWORK_API: &str = "2026-03-01";
pub(crate) const GALLERY_API: &str = "2026-03-03";

/// A reference to another resource by id.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct Id {
    pub id: String,
}

// ---- Network interface (PUT) ----

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NicRequest {
    pub location: String,
    pub tags: BTreeMap<String, String>,
    pub properties: NicProperties,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NicProperties {
    pub ip_configurations: Vec<IpConfiguration>,
    pub enable_accelerated_networking: bool,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct IpConfiguration {
    pub name: String,
    pub properties: IpConfigurationProperties,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct IpConfigurationProperties {
    pub primary: bool,
    #[serde(rename = "privateIPAllocationMethod")]
    pub private_ip_allocation_method: String,
    pub subnet: Id,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Nic {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
}

// ---- Virtual machine (PUT) ----

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct VmRequest {
    pub location: String,
    pub tags: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
    pub properties: VmRequestProperties,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct VmRequestProperties {
    pub hardware_profile: HardwareProfile,
    pub storage_profile: StorageProfile,
    pub os_profile: OsProfile,
    pub network_profile: NetworkProfile,
    /// `Regular` or `Spot`; spot with `evictionPolicy` `Delete` and no price cap (`maxPrice` -1).
    pub priority: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub billing_profile: Option<BillingProfile>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security_profile: Option<SecurityProfile>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HardwareProfile {
    #[serde(default)]
    pub vm_size: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StorageProfile {
    pub image_reference: ImageReference,
    pub os_disk: OsDisk,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ImageReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub community_gallery_image_id: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OsDisk {
    pub name: String,
    pub create_option: String,
    pub delete_option: String,
    pub caching: String,
    pub os_type: String,
    #[serde(rename = "diskSizeGB")]
    pub disk_size_gb: i32,
    pub managed_disk: ManagedDisk,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ManagedDisk {
    pub storage_account_type: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OsProfile {
    pub computer_name: String,
    pub admin_username: String,
    /// The node's bootstrap (cloud-init), base64.
    pub custom_data: String,
    pub linux_configuration: LinuxConfiguration,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LinuxConfiguration {
    pub disable_password_authentication: bool,
    pub ssh: Ssh,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Ssh {
    pub public_keys: Vec<SshPublicKey>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SshPublicKey {
    pub path: String,
    pub key_data: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NetworkProfile {
    pub network_interfaces: Vec<NicReference>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct NicReference {
    pub id: String,
    pub properties: NicReferenceProperties,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NicReferenceProperties {
    pub primary: bool,
    /// `Delete`: the NIC goes with the VM.
    pub delete_option: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BillingProfile {
    pub max_price: f64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SecurityProfile {
    pub encryption_at_host: bool,
}

// ---- Virtual machine (GET, list) ----

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Vm {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    #[serde(default)]
    pub zones: Vec<String>,
    #[serde(default)]
    pub properties: VmProperties,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct VmProperties {
    #[serde(default)]
    pub hardware_profile: HardwareProfile,
    #[serde(default)]
    pub storage_profile: Option<StorageProfileView>,
    #[serde(default)]
    pub os_profile: Option<OsProfileView>,
    #[serde(default)]
    pub provisioning_state: Option<String>,
    /// RFC 3339.
    #[serde(default)]
    pub time_created: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StorageProfileView {
    #[serde(default)]
    pub image_reference: Option<ImageReference>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OsProfileView {
    #[serde(default)]
    pub computer_name: Option<String>,
}

// ---- Community gallery image versions (list) ----

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ImageVersion {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub identifier: Option<ImageVersionIdentifier>,
    #[serde(default)]
    pub properties: ImageVersionProperties,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageVersionIdentifier {
    #[serde(default)]
    pub unique_id: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageVersionProperties {
    #[serde(default)]
    pub published_date: Option<String>,
    #[serde(default)]
    pub exclude_from_latest: Option<bool>,
}
