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

