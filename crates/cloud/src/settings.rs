//! The providers' settings, as data (the config file's `provisioner.<cloud>` sections). They
//! live here, not in each provider's crate, so the config reads the same with every cloud
//! compiled in or none.

use serde::{Deserialize, Serialize};

/// The Azure Retail Prices API's address.
pub const AZURE_RETAIL_PRICES: &str = "https://prices.azure.com/api/retail/prices";
/// The longest period between two price refreshes a setting may ask for (a week).
const MAX_PRICE_REFRESH_HOURS: u64 = 168;

/// Why `value`, the setting `setting`, may not receive a token (a bearer token, a federated
/// token, signed requests, a node's bootstrap token), if it may not: it must be an `https` URL,
/// or `http` to loopback only (`localhost`, 127.0.0.0/8, `::1`: tests, a local proxy), where
/// nothing leaves the host in clear text.
pub fn token_endpoint(setting: &str, value: &str) -> Result<(), String> {
    let url = url::Url::parse(value.trim()).map_err(|e| format!("{setting}: {value:?} is not a URL: {e}"))?;
    let loopback = match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    match url.scheme() {
        "https" if url.host().is_some() => Ok(()),
        "http" if loopback => Ok(()),
        "http" => Err(format!("{setting}: {value:?} is plain http to a host that is not loopback: tokens would travel in clear text; use https")),
        other => Err(format!("{setting}: {value:?} must be an https URL (scheme {other:?})")),
    }
}

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
    /// A message of that queue whose handling failed this many times (SQS's receive count) is
    /// deleted and counted (`archer_interruption_messages_dropped_total{reason="max_receives"}`).
    pub interruption_max_receives: u32,
    /// A launch offers EC2 every instance type that fits the claim within this percentage of the
    /// cheapest's price (more choice, fewer capacity failures).
    pub price_margin_percent: f64,
    /// How long an offering that answered "insufficient capacity" is left out of plans.
    pub insufficient_capacity_ttl_seconds: u64,
    /// How often spot prices are read again.
    pub spot_price_refresh_seconds: u64,
    /// How often on-demand prices are read from the AWS Price List Query API (also at start;
    /// the catalog's until the first answer). 0: never (the catalog's only).
    pub price_refresh_hours: u64,
    /// The Price List Query API's endpoint instead of AWS's (`https://api.pricing.us-east-1.amazonaws.com`);
    /// unset: AWS's, or `provisioner.aws.endpoint` when that is set.
    pub pricing_endpoint: Option<String>,
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
            interruption_max_receives: 5,
            price_margin_percent: 20.0,
            insufficient_capacity_ttl_seconds: 180,
            spot_price_refresh_seconds: 300,
            price_refresh_hours: 12,
            pricing_endpoint: None,
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
        if self.interruption_max_receives == 0 {
            return Err("provisioner.aws.interruptionMaxReceives must be at least 1".into());
        }
        // Signed requests (with the session token) go to the endpoint; the node's IAM token to
        // the cluster's.
        if let Some(e) = &self.endpoint {
            token_endpoint("provisioner.aws.endpoint", e)?;
        }
        if let Some(e) = &self.pricing_endpoint {
            token_endpoint("provisioner.aws.pricingEndpoint", e)?;
        }
        if self.price_refresh_hours > MAX_PRICE_REFRESH_HOURS {
            return Err(format!("provisioner.aws.priceRefreshHours must be at most {MAX_PRICE_REFRESH_HOURS} (0: never)"));
        }
        if let Some(e) = &self.cluster_endpoint {
            token_endpoint("provisioner.aws.clusterEndpoint", e)?;
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
    /// How often on-demand and spot prices are read from the Azure Retail Prices API (also at
    /// start; the catalog's until the first answer). 0: never (the catalog's only).
    pub price_refresh_hours: u64,
    /// The Retail Prices API's address (a proxy's, tests).
    pub prices_endpoint: String,
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
            price_refresh_hours: 12,
            prices_endpoint: AZURE_RETAIL_PRICES.into(),
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
        // The bearer token goes to the endpoint, the federated token to the authority, the
        // node's bootstrap token to the cluster's endpoint.
        token_endpoint("provisioner.azure.endpoint", &self.endpoint)?;
        if let Some(a) = &self.authority_host {
            token_endpoint("provisioner.azure.authorityHost", a)?;
        }
        if let Some(e) = &self.cluster_endpoint {
            token_endpoint("provisioner.azure.clusterEndpoint", e)?;
        }
        token_endpoint("provisioner.azure.pricesEndpoint", &self.prices_endpoint)?;
        if self.price_refresh_hours > MAX_PRICE_REFRESH_HOURS {
            return Err(format!("provisioner.azure.priceRefreshHours must be at most {MAX_PRICE_REFRESH_HOURS} (0: never)"));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_go_over_https_or_to_loopback_only() {
        for ok in ["https://management.azure.com", "https://login.microsoftonline.com/", "https://10.0.0.1:8443", "http://127.0.0.1:8080", "http://127.3.2.1", "http://localhost:9000/x", "http://LOCALHOST", "http://[::1]:4566"] {
            assert_eq!(token_endpoint("x", ok), Ok(()), "{ok}");
        }
        for bad in ["http://management.azure.com", "http://10.0.0.1:8080", "http://127.0.0.1.evil.example", "http://127.0.0.1@evil.example/", "http://[::2]", "http://localhost.evil.example", "ftp://127.0.0.1", "management.azure.com", "https://"] {
            assert!(token_endpoint("x", bad).is_err(), "{bad}");
        }
        let e = token_endpoint("provisioner.azure.endpoint", "http://arm.example.com").expect_err("refused");
        assert!(e.contains("provisioner.azure.endpoint") && e.contains("clear text") && e.contains("https"), "{e}");
    }

    #[test]
    fn settings_with_a_plain_http_token_endpoint_are_refused() {
        let azure = AzureConfig { cluster_name: "c".into(), subscription_id: "s".into(), resource_group: "rg".into(), location: "eastus".into(), ssh_public_key: "ssh-ed25519 AAAA".into(), ..Default::default() };
        assert_eq!(azure.validate(), Ok(()));
        assert_eq!(AzureConfig { endpoint: "http://127.0.0.1:8080".into(), authority_host: Some("http://localhost:8080".into()), ..azure.clone() }.validate(), Ok(()), "loopback: tests");
        for (bad, setting) in [
            (AzureConfig { endpoint: "http://management.example.com".into(), ..azure.clone() }, "provisioner.azure.endpoint"),
            (AzureConfig { authority_host: Some("http://login.example.com/".into()), ..azure.clone() }, "provisioner.azure.authorityHost"),
            (AzureConfig { cluster_endpoint: Some("http://aks.example.com:443".into()), ..azure.clone() }, "provisioner.azure.clusterEndpoint"),
        ] {
            let e = bad.validate().expect_err("refused");
            assert!(e.starts_with(setting) && e.contains("https"), "{e}");
        }
        let aws = AwsConfig { cluster_name: "c".into(), ..Default::default() };
        assert_eq!(AwsConfig { endpoint: Some("http://127.0.0.1:5000".into()), ..aws.clone() }.validate(), Ok(()));
        assert!(AwsConfig { endpoint: Some("http://ec2.example.com".into()), ..aws.clone() }.validate().is_err_and(|e| e.starts_with("provisioner.aws.endpoint")));
        assert!(AwsConfig { cluster_endpoint: Some("http://eks.example.com".into()), ..aws.clone() }.validate().is_err_and(|e| e.starts_with("provisioner.aws.clusterEndpoint")));
        assert!(AwsConfig { interruption_max_receives: 0, ..aws }.validate().is_err());
    }
}
