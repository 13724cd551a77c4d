//! The providers' settings, as data (the config file's `provisioner.<cloud>` sections). They
//! live here, not in each provider's crate, so the config reads the same with every cloud
//! compiled in or none.

use serde::{Deserialize, Serialize};

/// `provisioner.aws`: the EC2 provider. Credentials and region come from the standard chain
/// (IRSA / EKS Pod Identity in a cluster, environment and profiles elsewhere).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct AwsConfig {
    /// The cluster's name: every resource Archer creates is tagged with it.
    pub cluster_name: String,
    /// The region; unset: the standard chain (`AWS_REGION`, the profile, IMDS).
    pub region: Option<String>,
    /// An endpoint to use instead of AWS's (tests, private endpoints); `AWS_ENDPOINT_URL` works too.
    pub endpoint: Option<String>,
    /// The SQS queue (name or URL) receiving EventBridge's interruption events; unset: none.
    pub interruption_queue: Option<String>,
    /// A launch offers EC2 every instance type that fits the claim within this percentage of the
    /// cheapest's price (more choice, fewer capacity failures).
    pub price_margin_percent: f64,
    /// How long an offering that answered "insufficient capacity" is left out of plans.
    pub insufficient_capacity_ttl_seconds: u64,
    /// How often spot prices are read again.
    pub spot_price_refresh_seconds: u64,
    /// How often EC2NodeClasses are resolved again (subnets, security groups, AMIs).
    pub node_class_refresh_seconds: u64,
    /// Owners an AMI alias (`al2023@latest`) is looked up under.
    pub ami_owners: Vec<String>,
    /// The cluster's API endpoint, CA bundle (base64) and service CIDR: with the endpoint set,
    /// AL2023 nodes get the whole nodeadm cluster section from Archer and a node class needs no
    /// user data (unset: the class's user data supplies it).
    pub cluster_endpoint: Option<String>,
    #[serde(rename = "clusterCABundle")]
    pub cluster_ca_bundle: Option<String>,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
}

impl Default for AwsConfig {
    fn default() -> Self {
        Self {
            cluster_name: String::new(),
            region: None,
            endpoint: None,
            interruption_queue: None,
            price_margin_percent: 20.0,
            insufficient_capacity_ttl_seconds: 180,
            spot_price_refresh_seconds: 300,
            node_class_refresh_seconds: 60,
            ami_owners: vec!["amazon".into()],
            cluster_endpoint: None,
            cluster_ca_bundle: None,
            cluster_cidr: None,
        }
    }
}

impl AwsConfig {
    /// The first setting that is out of range, said as the config file spells it.
    pub fn validate(&self) -> Result<(), String> {
        if self.cluster_name.trim().is_empty() {
            return Err("provisioner.aws.clusterName is required with cloudProvider aws".into());
        }
        if !(self.price_margin_percent >= 0.0 && self.price_margin_percent <= 100.0) {
            return Err("provisioner.aws.priceMarginPercent must be between 0 and 100".into());
        }
        if self.spot_price_refresh_seconds == 0 || self.node_class_refresh_seconds == 0 || self.insufficient_capacity_ttl_seconds == 0 {
            return Err("provisioner.aws: refresh intervals and insufficientCapacityTtlSeconds must be at least 1".into());
        }
        if self.ami_owners.is_empty() {
            return Err("provisioner.aws.amiOwners must name at least one owner".into());
        }
        Ok(())
    }
}


/// `provisioner.azure`: the Azure VM provider. Its token comes from workload identity (the
/// federated token AKS projects into the pod, exchanged at Microsoft Entra ID), as Karpenter on
/// Azure's does; unset fields fall back to the `AZURE_*` variables the workload-identity webhook
/// sets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct AzureConfig {
    /// The cluster's name: every VM, NIC and disk Archer creates is tagged with it.
    pub cluster_name: String,
    pub subscription_id: String,
    /// The resource group the nodes go in (AKS's node resource group, `MC_...`).
    pub resource_group: String,
    /// The region (`eastus`): the catalog's prices of that region, zones `<location>-<n>`.
    pub location: String,
    /// Zones launched in; empty: `<location>-1`, `-2` and `-3`.
    pub zones: Vec<String>,
    /// Azure Resource Manager's endpoint (tests, sovereign clouds).
    pub endpoint: String,
    /// Microsoft Entra ID's endpoint; unset: `AZURE_AUTHORITY_HOST`, else the public cloud's.
    pub authority_host: Option<String>,
    /// Unset: `AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_FEDERATED_TOKEN_FILE`.
    pub tenant_id: Option<String>,
    pub client_id: Option<String>,
    pub federated_token_file: Option<String>,
    /// The subnet of a node class that names none (`vnetSubnetID`).
    #[serde(rename = "subnetID")]
    pub subnet_id: Option<String>,
    /// The nodes' admin user and SSH public key (password log-in is always off).
    pub admin_username: String,
    pub ssh_public_key: String,
    /// The cluster's API endpoint, CA bundle (base64) and a TLS bootstrap token: the kubelet's
    /// bootstrap kubeconfig in the node's custom data.
    pub cluster_endpoint: Option<String>,
    #[serde(rename = "clusterCABundle")]
    pub cluster_ca_bundle: Option<String>,
    pub bootstrap_token: Option<String>,
    /// How often AKSNodeClasses are resolved again (the newest node image of each).
    pub node_class_refresh_seconds: u64,
    /// How long a VM's creation may take before the launch is given up.
    pub create_timeout_seconds: u64,
}

impl Default for AzureConfig {
    fn default() -> Self {
        Self {
            cluster_name: String::new(),
            subscription_id: String::new(),
            resource_group: String::new(),
            location: String::new(),
            zones: Vec::new(),
            endpoint: "https://management.azure.com".into(),
            authority_host: None,
            tenant_id: None,
            client_id: None,
            federated_token_file: None,
            subnet_id: None,
            admin_username: "azureuser".into(),
            ssh_public_key: String::new(),
            cluster_endpoint: None,
            cluster_ca_bundle: None,
            bootstrap_token: None,
            node_class_refresh_seconds: 300,
            create_timeout_seconds: 600,
        }
    }
}

impl AzureConfig {
    /// The first setting that is missing or out of range, said as the config file spells it.
    pub fn validate(&self) -> Result<(), String> {
        for (value, name) in [(&self.cluster_name, "clusterName"), (&self.subscription_id, "subscriptionId"), (&self.resource_group, "resourceGroup"), (&self.location, "location"), (&self.ssh_public_key, "sshPublicKey"), (&self.admin_username, "adminUsername")] {
            if value.trim().is_empty() {
                return Err(format!("provisioner.azure.{name} is required with cloudProvider azure"));
            }
        }
        if let Some(z) = self.zones.iter().find(|z| !z.strip_prefix(&format!("{}-", self.location)).is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))) {
            return Err(format!("provisioner.azure.zones: {z:?} is not a zone of {} (<location>-<n>)", self.location));
        }
        if !(self.endpoint.starts_with("https://") || self.endpoint.starts_with("http://")) {
            return Err("provisioner.azure.endpoint must be an http(s) URL".into());
        }
        if self.node_class_refresh_seconds == 0 || self.create_timeout_seconds == 0 {
            return Err("provisioner.azure: nodeClassRefreshSeconds and createTimeoutSeconds must be at least 1".into());
        }
        Ok(())
    }

    /// The zones launched in.
    pub fn zones(&self) -> Vec<String> {
        if self.zones.is_empty() {
            return (1..=3).map(|n| format!("{}-{n}", self.location)).collect();
        }
        self.zones.clone()
    }
}
