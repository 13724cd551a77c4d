//! What one claim's node is on Azure, built purely from the claim, its node class and the
//! settings: the names, the tags, the NIC and VM bodies, and the node's bootstrap (custom data);
//! and what a failed VM creation means for planning.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::models::*;
use crate::nodeclass::{AKSNodeClassSpec, KubeletConfiguration};
use archer_api::nodeclaim::NodeClaim;
use archer_cloud::settings::AzureConfig;

/// Tags on everything Archer creates (Azure tag names cannot hold `/`: Karpenter on Azure's
/// convention replaces it with `_`).
pub(crate) const CLUSTER_TAG: &str = "archer.dev_cluster";
pub(crate) const NODECLAIM_TAG: &str = "archer.dev_nodeclaim";
pub(crate) const NODEPOOL_TAG: &str = "archer.dev_nodepool";
pub(crate) const NODECLASS_TAG: &str = "archer.dev_aksnodeclass";
/// AKS bills a node by this tag, as on NAP's nodes.
const BILLING_TAG: (&str, &str) = ("compute.aks.billing", "linux");
/// Azure's limit on a Linux VM's name.
const MAX_NAME: usize = 64;
const DEFAULT_OS_DISK_GB: i32 = 128;

/// The VM's name, which is also its NIC's and the Node's: `aks-<claim>` (64 characters at most,
/// a hash of the claim's name keeping long ones apart). A retried launch finds the same VM.
pub(crate) fn vm_name(claim: &str) -> String {
    let name = format!("aks-{claim}");
    if name.len() <= MAX_NAME {
        return name;
    }
    let hash = hex::encode(Sha256::digest(claim.as_bytes()).get(..4).unwrap_or_default());
    let keep: String = name.chars().take(MAX_NAME - 9).collect();
    format!("{keep}-{hash}")
}

pub(crate) fn vm_path(settings: &AzureConfig, name: &str) -> String {
    format!("/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/{name}", settings.subscription_id, settings.resource_group)
}

pub(crate) fn nic_path(settings: &AzureConfig, name: &str) -> String {
    format!("/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network/networkInterfaces/{name}", settings.subscription_id, settings.resource_group)
}

/// The class's own tags (`/` made `_`), under Archer's, which win.
pub(crate) fn tags(settings: &AzureConfig, class_name: &str, spec: &AKSNodeClassSpec, claim: &NodeClaim) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = spec.tags.iter().map(|(k, v)| (k.replace('/', "_"), v.clone())).collect();
    out.insert(BILLING_TAG.0.into(), BILLING_TAG.1.into());
    out.insert(CLUSTER_TAG.into(), settings.cluster_name.clone());
    out.insert(NODECLAIM_TAG.into(), claim.metadata.name.clone().unwrap_or_default());
    out.insert(NODEPOOL_TAG.into(), claim.spec.node_pool.clone());
    out.insert(NODECLASS_TAG.into(), class_name.to_string());
    out
}

/// The zone number Azure takes (`eastus-2` -> `2`), if the claim's zone is one.
fn zone_number(zone: &str) -> Option<String> {
    let (_, n) = zone.rsplit_once('-')?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then(|| n.to_string())
}

pub(crate) fn nic_request(settings: &AzureConfig, subnet: &str, tags: BTreeMap<String, String>, accelerated: bool) -> NicRequest {
    NicRequest {
        location: settings.location.clone(),
        tags,
        properties: NicProperties {
            ip_configurations: vec![IpConfiguration {
                name: "ipconfig1".into(),
                properties: IpConfigurationProperties { primary: true, private_ip_allocation_method: "Dynamic".into(), subnet: Id { id: subnet.to_string() } },
            }],
            enable_accelerated_networking: accelerated,
        },
    }
}

/// Everything of the VM but the NIC's id and the image: see [`vm_request`].
pub(crate) struct VmShape<'a> {
    pub settings: &'a AzureConfig,
    pub spec: &'a AKSNodeClassSpec,
    pub claim: &'a NodeClaim,
    pub name: &'a str,
    pub image_id: &'a str,
    pub nic_id: &'a str,
    pub tags: BTreeMap<String, String>,
    /// The node's bootstrap ([`custom_data`]).
    pub custom_data: &'a str,
}

pub(crate) fn vm_request(s: VmShape<'_>) -> VmRequest {
    let spot = s.claim.spec.capacity_type == "spot";
    VmRequest {
        location: s.settings.location.clone(),
        tags: s.tags,
        zones: zone_number(&s.claim.spec.zone).into_iter().collect(),
        properties: VmRequestProperties {
            hardware_profile: HardwareProfile { vm_size: s.claim.spec.instance_type.clone() },
            storage_profile: StorageProfile {
                image_reference: ImageReference { community_gallery_image_id: Some(s.image_id.to_string()) },
                os_disk: OsDisk {
                    name: s.name.to_string(),
                    create_option: "FromImage".into(),
                    delete_option: "Delete".into(),
                    caching: "ReadOnly".into(),
                    os_type: "Linux".into(),
                    disk_size_gb: s.spec.os_disk_size_gb.unwrap_or(DEFAULT_OS_DISK_GB),
                    managed_disk: ManagedDisk { storage_account_type: "Premium_LRS".into() },
                },
            },
            os_profile: OsProfile {
                computer_name: s.name.to_string(),
                admin_username: s.settings.admin_username.clone(),
                custom_data: base64::engine::general_purpose::STANDARD.encode(s.custom_data),
                linux_configuration: LinuxConfiguration {
                    disable_password_authentication: true,
                    ssh: Ssh { public_keys: vec![SshPublicKey { path: format!("/home/{}/.ssh/authorized_keys", s.settings.admin_username), key_data: s.settings.ssh_public_key.clone() }] },
                },
            },
            network_profile: NetworkProfile { network_interfaces: vec![NicReference { id: s.nic_id.to_string(), properties: NicReferenceProperties { primary: true, delete_option: "Delete".into() } }] },
            priority: if spot { "Spot" } else { "Regular" }.into(),
            eviction_policy: spot.then(|| "Delete".into()),
            billing_profile: spot.then_some(BillingProfile { max_price: -1.0 }),
            security_profile: s.spec.security.as_ref().and_then(|sec| sec.encryption_at_host).map(|e| SecurityProfile { encryption_at_host: e }),
        },
    }
}

#[derive(Serialize)]
struct CloudConfig {
    write_files: Vec<WriteFile>,
    runcmd: Vec<Vec<String>>,
}

#[derive(Serialize)]
struct WriteFile {
    path: String,
    permissions: String,
    content: String,
}

/// The node's bootstrap, a cloud-init `#cloud-config` (JSON, which YAML reads): the kubelet's
/// labels, taints, max pods and the node class's kubelet settings in `/etc/default/kubelet`, and
/// with `clusterEndpoint` set a bootstrap kubeconfig (TLS bootstrap token, the cluster's CA).
///
/// `/etc/default/kubelet` is a systemd environment file (and shell-sourceable): a newline or a
/// space in a label would be another variable or another kubelet flag. So the labels, taints
/// and kubelet settings are first held to Kubernetes' syntax (refused with why, whatever the CRD
/// let through), then each value is written double-quoted and escaped ([`env_value`]).
pub(crate) fn custom_data(settings: &AzureConfig, spec: &AKSNodeClassSpec, claim: &NodeClaim) -> Result<String, String> {
    let claim_name = claim.metadata.name.as_deref().unwrap_or_default();
    archer_api::validation::node_shape(&claim.spec.labels, claim.spec.taints.iter().chain(&claim.spec.startup_taints).map(|t| (t.key.as_str(), t.value.as_deref(), t.effect.as_str()))).map_err(|e| format!("NodeClaim {claim_name} cannot be written into the node's bootstrap: {e}"))?;
    if let Some(k) = &spec.kubelet {
        k.validate().map_err(|e| format!("the AKSNodeClass's kubelet settings cannot be written into the node's bootstrap: {e}"))?;
    }
    let labels: Vec<String> = claim.spec.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let taints: Vec<String> = claim.spec.taints.iter().chain(&claim.spec.startup_taints).map(|t| format!("{}={}:{}", t.key, t.value.clone().unwrap_or_default(), t.effect)).collect();
    let mut flags = vec![format!("--max-pods={}", spec.max_pods.unwrap_or(250))];
    if !taints.is_empty() {
        flags.push(format!("--register-with-taints={}", taints.join(",")));
    }
    if let Some(k) = &spec.kubelet {
        flags.extend(kubelet_flags(k));
    }
    let content = format!("KUBELET_NODE_LABELS={}\nKUBELET_FLAGS={}\n", env_value(&labels.join(","))?, env_value(&flags.join(" "))?);
    let mut write_files = vec![WriteFile { path: "/etc/default/kubelet".into(), permissions: "0644".into(), content }];
    if let (Some(endpoint), Some(token)) = (&settings.cluster_endpoint, &settings.bootstrap_token) {
        write_files.push(WriteFile { path: "/etc/kubernetes/certs/ca.crt".into(), permissions: "0644".into(), content: settings.cluster_ca_bundle.as_deref().and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok()).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default() });
        // JSON strings are YAML's double-quoted scalars: the settings' values stay values.
        let (endpoint, token) = (serde_json::Value::from(endpoint.as_str()), serde_json::Value::from(token.as_str()));
        write_files.push(WriteFile {
            path: "/var/lib/kubelet/bootstrap-kubeconfig".into(),
            permissions: "0600".into(),
            content: format!("apiVersion: v1\nkind: Config\nclusters:\n- name: cluster\n  cluster:\n    server: {endpoint}\n    certificate-authority: /etc/kubernetes/certs/ca.crt\nusers:\n- name: kubelet-bootstrap\n  user:\n    token: {token}\ncontexts:\n- name: bootstrap\n  context:\n    cluster: cluster\n    user: kubelet-bootstrap\ncurrent-context: bootstrap\n"),
        });
    }
    let config = CloudConfig { write_files, runcmd: vec![vec!["systemctl".into(), "restart".into(), "kubelet".into()]] };
    serde_json::to_string(&config).map(|json| format!("#cloud-config\n{json}\n")).map_err(|e| format!("the node's bootstrap: {e}"))
}

/// A value of a systemd environment file that a shell can source as well: double-quoted, with
/// `\`, `"`, `$` and `` ` `` escaped (both read those escapes inside double quotes). Control
/// characters have no escape both read alike: refused.
fn env_value(value: &str) -> Result<String, String> {
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(format!("{value:?} holds the control character {c:?}"));
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if matches!(c, '\\' | '"' | '$' | '`') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Ok(out)
}

fn kubelet_flags(k: &KubeletConfiguration) -> Vec<String> {
    let mut out = Vec::new();
    let mut flag = |name: &str, v: Option<String>| {
        if let Some(v) = v {
            out.push(format!("--{name}={v}"));
        }
    };
    flag("cpu-manager-policy", k.cpu_manager_policy.clone());
    flag("cpu-cfs-quota", k.cpu_cfs_quota.map(|b| b.to_string()));
    flag("cpu-cfs-quota-period", k.cpu_cfs_quota_period.clone());
    flag("image-gc-high-threshold", k.image_gc_high_threshold_percent.map(|p| p.to_string()));
    flag("image-gc-low-threshold", k.image_gc_low_threshold_percent.map(|p| p.to_string()));
    flag("topology-manager-policy", k.topology_manager_policy.clone());
    flag("allowed-unsafe-sysctls", (!k.allowed_unsafe_sysctls.is_empty()).then(|| k.allowed_unsafe_sysctls.join(",")));
    flag("container-log-max-size", k.container_log_max_size.clone());
    flag("container-log-max-files", k.container_log_max_files.map(|n| n.to_string()));
    flag("pod-max-pids", k.pod_pids_limit.map(|n| n.to_string()));
    out
}

/// What a failed creation says about the offerings, as Karpenter on Azure reads ARM's errors
/// (its offerings error handlers; the codes and the terms its SDK extensions match on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The size is unavailable: in the claim's zone or in all, for the claim's capacity type or
    /// for both, for `ttl`.
    Size { all_zones: bool, both_capacities: bool, ttl: Duration },
    /// The subscription's spot cores quota (`LowPriorityCores`): every spot offering.
    AllSpot { ttl: Duration },
    /// The region's cores quota for the capacity type: no other size helps. Karpenter on Azure
    /// marks nothing; Archer leaves the capacity type's offerings out for [`LOW_QUOTA_TTL`]
    /// rather than asking ARM again at every batch.
    RegionalQuota { ttl: Duration },
}

const HOUR: Duration = Duration::from_secs(3600);
/// A family quota not used up entirely: the smaller sizes of the family are tried meanwhile.
const LOW_QUOTA_TTL: Duration = Duration::from_secs(600);

pub(crate) fn classify(code: &str, message: &str, spot: bool) -> Option<Failure> {
    let quota = |term: &str| code == "OperationNotAllowed" && message.contains(term);
    let size = |all_zones, both_capacities, ttl| Some(Failure::Size { all_zones, both_capacities, ttl });
    if quota("LowPriorityCores") {
        return Some(Failure::AllSpot { ttl: HOUR });
    }
    if quota("Family Cores quota") {
        // A limit of 0: the subscription has no quota for the family at all.
        return size(true, false, if message.contains("Current Limit: 0") { HOUR } else { LOW_QUOTA_TTL });
    }
    match code {
        // Not offered to the subscription here, or out of spot capacity.
        "SkuNotAvailable" => size(true, false, if spot { HOUR } else { 23 * HOUR }),
        "ZonalAllocationFailed" => size(false, true, HOUR),
        "AllocationFailed" => size(true, true, HOUR),
        "OverconstrainedZonalAllocationRequest" => size(false, false, HOUR),
        "OverconstrainedAllocationRequest" => size(true, false, HOUR),
        _ if quota("exceeding approved Total Regional Cores quota") => Some(Failure::RegionalQuota { ttl: LOW_QUOTA_TTL }),
        _ => None,
    }
}

/// A hash of a node class's spec: a claim launched under another one has drifted.
pub(crate) fn class_hash(spec: &AKSNodeClassSpec) -> String {
    hex::encode(Sha256::digest(serde_json::to_string(spec).unwrap_or_default().as_bytes()).get(..8).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Karpenter on Azure's offerings error handlers' cases: what each error leaves out, and for
    /// how long.
    #[test]
    fn arms_errors_leave_out_what_karpenter_on_azure_leaves_out() {
        let f = |code: &str, message: &str, spot: bool| classify(code, message, spot);
        assert_eq!(f("OperationNotAllowed", "Operation could not be completed as it results in exceeding approved LowPriorityCores quota.", true), Some(Failure::AllSpot { ttl: HOUR }));
        let family = "Operation could not be completed as it results in exceeding approved standardDPLSv6Family Cores quota. Location: eastus, Current Limit: 10, Current Usage: 8, Additional Required: 4.";
        assert_eq!(f("OperationNotAllowed", family, false), Some(Failure::Size { all_zones: true, both_capacities: false, ttl: LOW_QUOTA_TTL }));
        assert_eq!(f("OperationNotAllowed", &family.replace("Limit: 10", "Limit: 0"), false), Some(Failure::Size { all_zones: true, both_capacities: false, ttl: HOUR }), "no quota at all");
        assert_eq!(f("SkuNotAvailable", "", true), Some(Failure::Size { all_zones: true, both_capacities: false, ttl: HOUR }));
        assert_eq!(f("SkuNotAvailable", "", false), Some(Failure::Size { all_zones: true, both_capacities: false, ttl: 23 * HOUR }));
        assert_eq!(f("ZonalAllocationFailed", "", false), Some(Failure::Size { all_zones: false, both_capacities: true, ttl: HOUR }));
        assert_eq!(f("AllocationFailed", "", true), Some(Failure::Size { all_zones: true, both_capacities: true, ttl: HOUR }));
        assert_eq!(f("OverconstrainedZonalAllocationRequest", "", false), Some(Failure::Size { all_zones: false, both_capacities: false, ttl: HOUR }));
        assert_eq!(f("OverconstrainedAllocationRequest", "", false), Some(Failure::Size { all_zones: true, both_capacities: false, ttl: HOUR }));
        assert_eq!(f("OperationNotAllowed", "results in exceeding approved Total Regional Cores quota", false), Some(Failure::RegionalQuota { ttl: LOW_QUOTA_TTL }));
        assert_eq!(f("OperationNotAllowed", "the VM is being deleted", false), None, "not every OperationNotAllowed is a quota");
        assert_eq!(f("InvalidParameter", "", false), None);
    }

    fn claim_with(labels: serde_json::Value, taints: serde_json::Value) -> NodeClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": "general-abcde"},
            "spec": {"nodePool": "general", "instanceType": "Standard_D2pls_v6", "zone": "eastus-1", "capacityType": "spot", "arch": "arm64", "os": "linux",
                     "labels": labels, "taints": taints, "pricePerHour": 0.05}
        }))
        .expect("claim")
    }

    /// `/etc/default/kubelet` of a custom data, as cloud-init writes it.
    fn kubelet_file(custom_data: &str) -> String {
        let config: serde_json::Value = serde_json::from_str(custom_data.strip_prefix("#cloud-config\n").expect("cloud-config")).expect("JSON");
        config["write_files"][0]["content"].as_str().expect("content").to_string()
    }

    /// A NodePool label with a newline and `--` never reaches `/etc/default/kubelet`: the custom
    /// data is refused, saying which label; so are a taint or a kubelet setting that would carry a
    /// flag. What passes is written double-quoted, one variable a line.
    #[test]
    fn a_nodepool_label_with_a_newline_and_dashes_is_refused_in_the_custom_data() {
        let settings = AzureConfig::default();
        let spec: AKSNodeClassSpec = serde_json::from_value(serde_json::json!({"maxPods": 110, "kubelet": {"cpuManagerPolicy": "static", "allowedUnsafeSysctls": ["net.*"]}})).expect("spec");
        let taint = serde_json::json!([{"key": "dedicated", "value": "demo", "effect": "NoSchedule"}]);
        let ok = custom_data(&settings, &spec, &claim_with(serde_json::json!({"team": "a", "kubernetes.io/arch": "arm64"}), taint.clone())).expect("custom data");
        assert_eq!(kubelet_file(&ok), "KUBELET_NODE_LABELS=\"kubernetes.io/arch=arm64,team=a\"\nKUBELET_FLAGS=\"--max-pods=110 --register-with-taints=dedicated=demo:NoSchedule --cpu-manager-policy=static --allowed-unsafe-sysctls=net.*\"\n");

        let injected = claim_with(serde_json::json!({"team": "a\n--kubeconfig=/tmp/evil"}), taint.clone());
        let e = custom_data(&settings, &spec, &injected).expect_err("refused");
        assert!(e.contains("NodeClaim general-abcde") && e.contains("label team: value") && e.contains("not a label value"), "{e}");
        let e = custom_data(&settings, &spec, &claim_with(serde_json::json!({"team\n--kubeconfig": "a"}), taint.clone())).expect_err("refused");
        assert!(e.contains("label key"), "{e}");
        let e = custom_data(&settings, &spec, &claim_with(serde_json::json!({}), serde_json::json!([{"key": "dedicated", "value": "x --anonymous-auth=true", "effect": "NoSchedule"}]))).expect_err("refused");
        assert!(e.contains("taint dedicated: value"), "{e}");
        let evil: AKSNodeClassSpec = serde_json::from_value(serde_json::json!({"kubelet": {"containerLogMaxSize": "10Mi\nKUBELET_FLAGS=--anonymous-auth=true"}})).expect("spec");
        let e = custom_data(&settings, &evil, &claim_with(serde_json::json!({}), taint)).expect_err("refused");
        assert!(e.contains("kubelet.containerLogMaxSize"), "{e}");
    }

    #[test]
    fn environment_file_values_are_quoted_and_escaped() {
        assert_eq!(env_value("a=b,c=d").as_deref(), Ok("\"a=b,c=d\""));
        assert_eq!(env_value("--x=1 --y=2").as_deref(), Ok("\"--x=1 --y=2\""));
        assert_eq!(env_value(r#"a"b\c$d`e"#).as_deref(), Ok(r#""a\"b\\c\$d\`e""#));
        assert!(env_value("a\n--b").is_err_and(|e| e.contains("control character")));
        assert!(env_value("a\rb").is_err());
    }

    #[test]
    fn long_claim_names_make_distinct_vm_names_within_azures_limit() {
        assert_eq!(vm_name("default-abcde"), "aks-default-abcde");
        let long = "a".repeat(80);
        let (one, two) = (vm_name(&long), vm_name(&format!("{long}b")));
        assert!(one.len() <= 64 && two.len() <= 64 && one != two);
        assert_eq!(zone_number("eastus-2").as_deref(), Some("2"));
        assert_eq!(zone_number("eastus"), None);
    }
}
