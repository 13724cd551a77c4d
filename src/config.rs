//! The optional YAML config file. Every field has a default; command-line flags (and their
//! environment variables) override the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use archer_core::placement::{ArchitectureTaint, PlacementSettings};
use archer_core::policy::PolicyDefaults;
use archer_registry::AddressGuard;
pub use archer_cloud::settings::{AwsConfig, AzureConfig};

pub const DEFAULT_NAMESPACE: &str = "archer-system";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Config {
    pub listen: String,
    pub admin_listen: String,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// How often the certificate files are re-read (a Secret volume's symlink swap included), or
    /// with `--tls-secret` the managed certificate's Secret.
    pub tls_reload_interval_seconds: u64,
    /// Archer's own namespace, never mutated.
    pub namespace: String,
    /// Cluster-wide policy; namespace annotations override it.
    pub defaults: PolicyDefaults,
    /// Namespaces left alone besides Archer's own.
    pub excluded_namespaces: Vec<String>,
    pub architecture_taints: Vec<ArchitectureTaint>,
    /// Weight (1-100) of the preferred node-affinity term added toward the preferred architecture.
    pub preferred_weight: i32,
    pub registry: RegistryConfig,
    pub webhook: WebhookConfig,
    pub extender: ExtenderConfig,
    pub provisioner: ProvisionerConfig,
    /// The runtime safety net: exec format errors, re-placement and the scheduling gate.
    pub safety_net: SafetyNetConfig,
    /// The cost and savings gauges of every priced node while this Archer does not provision
    /// (beside Karpenter or AKS node auto-provisioning); the provisioner reports them itself.
    pub savings: SavingsConfig,
    /// Connection and memory limits shared by every listener and request.
    pub limits: LimitsConfig,
    /// A user catalog file (YAML or CSV) on top of the embedded price catalog.
    pub catalog: Option<PathBuf>,
    /// After SIGTERM, how long Archer stays not-ready but keeps accepting connections, so the
    /// API server and kube-scheduler learn from the endpoints update before anything is refused.
    pub shutdown_delay_seconds: f64,
    /// How long in-flight requests may take to finish after the listeners close.
    pub shutdown_grace_seconds: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:8443".into(),
            admin_listen: "0.0.0.0:8080".into(),
            tls_cert: None,
            tls_key: None,
            tls_reload_interval_seconds: 10,
            namespace: DEFAULT_NAMESPACE.into(),
            defaults: PolicyDefaults::default(),
            excluded_namespaces: vec!["kube-system".into()],
            architecture_taints: vec![ArchitectureTaint::arm64_default()],
            preferred_weight: 50,
            registry: RegistryConfig::default(),
            webhook: WebhookConfig::default(),
            extender: ExtenderConfig::default(),
            provisioner: ProvisionerConfig::default(),
            safety_net: SafetyNetConfig::default(),
            savings: SavingsConfig::default(),
            limits: LimitsConfig::default(),
            catalog: None,
            shutdown_delay_seconds: 5.0,
            shutdown_grace_seconds: 20,
        }
    }
}

/// The safety net's controllers run on the replica holding `leaseName`; its record of broken
/// (digest, architecture) pairs and re-placements is the ConfigMap `configMap` in Archer's
/// namespace, read by every replica.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct SafetyNetConfig {
    /// Watch admitted pods for exec format errors and release gated pods.
    pub enabled: bool,
    pub config_map: String,
    pub lease_name: String,
    pub lease_duration_seconds: u64,
    /// Broken (digest, architecture) pairs kept at most, all namespaces together (when full, the
    /// namespace holding the most loses its oldest).
    pub max_broken: usize,
    /// Broken pairs learned from one namespace's pods kept at most (its oldest leave first).
    pub max_broken_per_namespace: usize,
    /// Open re-placements kept at most, all namespaces together.
    pub max_replacements: usize,
    /// Open re-placements of one namespace's templates at most (then it is refused new ones).
    pub max_replacements_per_namespace: usize,
    /// At most one re-placement per pod template and architecture in this long.
    pub replacement_ttl_seconds: u64,
    /// How long a broken pair holds after it was learned (then the architecture is trusted
    /// again until the next failure).
    pub broken_ttl_seconds: u64,
    /// The longest a pod stays behind `archer.dev/inspecting`; then the namespace's failure policy
    /// decides (see the docs).
    pub gate_max_seconds: f64,
    /// Bound on one inspection of a gated pod's images.
    pub gate_inspection_timeout_seconds: f64,
    /// Pause between inspections of a gated pod whose images did not answer.
    pub gate_retry_seconds: f64,
}

/// The savings reporter: one replica at a time (its Lease) watches pods, NodePools
/// (`karpenter.sh/v1`), DaemonSets and NodeOverlays and sets the cost and savings gauges.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct SavingsConfig {
    pub enabled: bool,
    pub lease_name: String,
    pub lease_duration_seconds: u64,
    /// Seconds between two computations (only when the pods on priced nodes or the prices
    /// changed).
    pub interval_seconds: f64,
}

impl Default for SavingsConfig {
    fn default() -> Self {
        Self { enabled: true, lease_name: "archer-savings".into(), lease_duration_seconds: 15, interval_seconds: 60.0 }
    }
}

impl Default for SafetyNetConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            config_map: "archer-safety-net".into(),
            lease_name: "archer-safety-net".into(),
            lease_duration_seconds: 15,
            max_broken: 1000,
            max_broken_per_namespace: 50,
            max_replacements: 1000,
            max_replacements_per_namespace: 50,
            replacement_ttl_seconds: 3600,
            broken_ttl_seconds: 7 * 24 * 3600,
            gate_max_seconds: 120.0,
            gate_inspection_timeout_seconds: 10.0,
            gate_retry_seconds: 2.0,
        }
    }
}

impl SafetyNetConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let within = |v: f64, lo: f64, hi: f64| v.is_finite() && v > lo && v <= hi;
        if !within(self.gate_max_seconds, 0.0, 3600.0) || !within(self.gate_inspection_timeout_seconds, 0.0, 60.0) || !within(self.gate_retry_seconds, 0.0, 60.0) {
            return Err(ConfigError::Invalid("safetyNet: gateMaxSeconds must be in (0, 3600], gateInspectionTimeoutSeconds and gateRetrySeconds in (0, 60]".into()));
        }
        // One ConfigMap holds the record: about 300 bytes an entry; it is also cut to its byte
        // bound before every write.
        if !(1..=1500).contains(&self.max_broken) || !(1..=1500).contains(&self.max_replacements) {
            return Err(ConfigError::Invalid("safetyNet: maxBroken and maxReplacements must be in [1, 1500]".into()));
        }
        if !(1..=self.max_broken).contains(&self.max_broken_per_namespace) || !(1..=self.max_replacements).contains(&self.max_replacements_per_namespace) {
            return Err(ConfigError::Invalid("safetyNet: maxBrokenPerNamespace and maxReplacementsPerNamespace must be in [1, maxBroken] and [1, maxReplacements]".into()));
        }
        if self.replacement_ttl_seconds == 0 || self.broken_ttl_seconds == 0 || self.lease_duration_seconds < 2 || self.config_map.is_empty() || self.lease_name.is_empty() {
            return Err(ConfigError::Invalid("safetyNet: replacementTtlSeconds and brokenTtlSeconds must be positive, leaseDurationSeconds at least 2, configMap and leaseName set".into()));
        }
        Ok(())
    }

    /// The record's bounds and TTL for the pure rule.
    pub fn limits(&self) -> archer_core::safety_net::Limits {
        archer_core::safety_net::Limits {
            max_broken: self.max_broken,
            max_broken_per_namespace: self.max_broken_per_namespace,
            max_replaced: self.max_replacements,
            max_replaced_per_namespace: self.max_replacements_per_namespace,
            replacement_ttl_seconds: i64::try_from(self.replacement_ttl_seconds).unwrap_or(i64::MAX),
            broken_ttl_seconds: i64::try_from(self.broken_ttl_seconds).unwrap_or(i64::MAX),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct RegistryConfig {
    /// `host[:port]` registries reached over plain HTTP (and exempt from the address guard).
    pub insecure: Vec<String>,
    /// registry -> mirrors tried first, e.g. `docker.io: [mirror.example.com]`.
    pub mirrors: BTreeMap<String, Vec<String>>,
    /// CIDRs, IPs or registry hosts never contacted.
    pub deny: Vec<String>,
    /// When set, only these registries are contacted.
    pub allow: Vec<String>,
    /// Bound on one image lookup, in seconds.
    pub timeout_seconds: f64,
    pub tag_cache_ttl_seconds: u64,
    /// Entries at most in each of the tag and digest caches.
    pub cache_capacity: u64,
    /// Bytes at most in each of the tag and digest caches (entries weighed by what they hold).
    pub cache_max_bytes: u64,
    /// Bytes at most in the cache of failed lookups.
    pub failure_cache_max_bytes: u64,
    /// How long a lookup that failed for a reason of the image's own (not found, unauthorized,
    /// refused address, malformed manifest) is remembered; timeouts and busy answers are not.
    pub failure_cache_ttl_seconds: f64,
    /// How long a lookup that timed out is remembered (answered as a timeout at once), so
    /// images that never answer cannot hold the gate controller or admission (0: never).
    pub timeout_cache_ttl_seconds: f64,
    pub max_manifest_bytes: usize,
    /// Distinct images of one pod inspected at the same time.
    pub max_concurrent_lookups_per_pod: usize,
    /// Manifest and config bytes read from registries for one pod, all its images together.
    pub max_bytes_per_pod: usize,
    /// A mounted docker `config.json` with credentials for every namespace.
    pub docker_config: Option<PathBuf>,
    /// Extra PEM CA bundle trusted for registries.
    pub ca_file: Option<PathBuf>,
    /// A containerd `hosts.toml` tree (`config_path`, e.g. `/etc/containerd/certs.d`): each
    /// registry's mirrors and `server`, read at start, after `mirrors`.
    pub hosts_dir: Option<PathBuf>,
    /// Private ECR images read with Archer's own AWS identity.
    pub ecr: EcrConfig,
    /// Private ACR images read with Archer's own workload identity.
    pub acr: AcrConfig,
}

/// Archer's own Azure workload identity for private ACR images, asked for
/// `<name>.azurecr.io` images no pull secret of the pod covers. Each setting unset falls back to
/// the variable the workload identity webhook sets (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`,
/// `AZURE_FEDERATED_TOKEN_FILE`, `AZURE_AUTHORITY_HOST`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct AcrConfig {
    pub enabled: bool,
    pub tenant_id: Option<String>,
    pub client_id: Option<String>,
    pub federated_token_file: Option<String>,
    pub authority_host: Option<String>,
}

impl Default for AcrConfig {
    fn default() -> Self {
        Self { enabled: true, tenant_id: None, client_id: None, federated_token_file: None, authority_host: None }
    }
}

/// Archer's own AWS identity for private ECR images (IRSA, EKS Pod Identity, the instance role),
/// asked for `<account>.dkr.ecr.<region>.amazonaws.com` images no pull secret of the pod covers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct EcrConfig {
    pub enabled: bool,
    /// ECR's API endpoint instead of AWS's (a VPC endpoint); `AWS_ENDPOINT_URL_ECR` works too.
    pub endpoint: Option<String>,
}

impl Default for EcrConfig {
    fn default() -> Self {
        Self { enabled: true, endpoint: None }
    }
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            insecure: Vec::new(),
            mirrors: BTreeMap::new(),
            deny: Vec::new(),
            allow: Vec::new(),
            timeout_seconds: 3.0,
            tag_cache_ttl_seconds: 300,
            cache_capacity: 10_000,
            cache_max_bytes: 12 * 1024 * 1024,
            failure_cache_max_bytes: 1024 * 1024,
            failure_cache_ttl_seconds: 10.0,
            timeout_cache_ttl_seconds: 5.0,
            max_manifest_bytes: 8 * 1024 * 1024,
            max_concurrent_lookups_per_pod: 8,
            max_bytes_per_pod: 16 * 1024 * 1024,
            docker_config: None,
            ca_file: None,
            hosts_dir: None,
            ecr: EcrConfig::default(),
            acr: AcrConfig::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct WebhookConfig {
    /// Largest AdmissionReview body accepted (at least 8 MiB).
    pub max_body_bytes: usize,
    /// Every review is answered within this long (images not inspected by then count as
    /// inspection failures); keep it below the webhook configuration's `timeoutSeconds`.
    pub decision_timeout_seconds: f64,
    /// Bytes at most of answers kept for pods with the same inputs (a workload's replicas are
    /// decided once); 0 turns the memo off.
    pub decision_cache_max_bytes: u64,
    /// Bytes at most of those any one namespace's answers hold (at most all of them): one
    /// tenant's stream of distinct pods displaces its own kept answers, not other tenants'.
    pub decision_cache_max_bytes_per_namespace: u64,
    /// How long such an answer is reused, in seconds (at most the tag cache's TTL); 0 turns the
    /// memo off.
    pub decision_cache_ttl_seconds: f64,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self { max_body_bytes: 16 * 1024 * 1024, decision_timeout_seconds: 4.0, decision_cache_max_bytes: 1024 * 1024, decision_cache_max_bytes_per_namespace: 256 * 1024, decision_cache_ttl_seconds: 10.0 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ExtenderConfig {
    /// Optional plain-HTTP listener for a co-located kube-scheduler; must be a loopback address.
    pub listen: Option<String>,
    /// Bound on inspecting the images of a pod without an `archer.dev/platforms` annotation.
    pub inspection_timeout_seconds: f64,
    /// Fraction of cost taken off the namespace's most preferred architecture (near-ties go to it).
    pub preference_bonus: f64,
    /// Largest ExtenderArgs body accepted: kube-scheduler sends about 2.5 KB per full Node
    /// (5,000 nodes are 13 MB); with `nodeCacheCapable: true` only names are sent.
    pub max_body_bytes: usize,
    /// Node prices above this (USD per hour), like NaN, infinite or negative ones, are treated
    /// as unknown.
    pub max_price_per_hour: f64,
}

impl Default for ExtenderConfig {
    fn default() -> Self {
        Self { listen: None, inspection_timeout_seconds: 2.0, preference_bonus: 0.05, max_body_bytes: 32 * 1024 * 1024, max_price_per_hour: 1000.0 }
    }
}

/// Connection and memory limits. Worst-case memory is stated in docs ("Memory bound").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// The shared budget request bodies (times their expansion), extender node lists and
    /// registry reads draw from.
    pub memory_budget_bytes: usize,
    /// How long a request or lookup waits for room in the budget before it is refused.
    pub budget_wait_seconds: f64,
    /// Open connections per listener; more are closed at once and counted.
    pub max_connections: usize,
    /// A TLS handshake must finish within this long.
    pub handshake_timeout_seconds: f64,
    /// A request's headers must arrive within this long (HTTP/1).
    pub header_read_timeout_seconds: f64,
    /// A request's body must arrive within this long.
    pub body_read_timeout_seconds: f64,
    /// A connection with no request in flight and no bytes moving for this long is closed.
    pub idle_timeout_seconds: f64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            memory_budget_bytes: 128 * 1024 * 1024,
            budget_wait_seconds: 2.0,
            max_connections: 256,
            handshake_timeout_seconds: 10.0,
            header_read_timeout_seconds: 10.0,
            body_read_timeout_seconds: 10.0,
            idle_timeout_seconds: 60.0,
        }
    }
}

impl LimitsConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let positive = |v: f64| v.is_finite() && v > 0.0 && v <= 3600.0;
        let all = [
            ("budgetWaitSeconds", self.budget_wait_seconds),
            ("handshakeTimeoutSeconds", self.handshake_timeout_seconds),
            ("headerReadTimeoutSeconds", self.header_read_timeout_seconds),
            ("bodyReadTimeoutSeconds", self.body_read_timeout_seconds),
            ("idleTimeoutSeconds", self.idle_timeout_seconds),
        ];
        if let Some((name, _)) = all.iter().find(|(_, v)| !positive(*v)) {
            return Err(ConfigError::Invalid(format!("limits.{name} must be in (0, 3600]")));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::Invalid("limits.maxConnections must be at least 1".into()));
        }
        if self.memory_budget_bytes < 16 * 1024 * 1024 {
            return Err(ConfigError::Invalid("limits.memoryBudgetBytes must be at least 16 MiB (16777216)".into()));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct ProvisionerConfig {
    /// `none` (the provisioner is off), `kwok`, `aws` or `azure`.
    pub cloud_provider: String,
    /// Zones the provider launches in (a pool's zone requirement narrows them).
    pub zones: Vec<String>,
    /// A batch closes after this long without a new pending pod ...
    pub batch_idle_seconds: f64,
    /// ... or this long after it opened, whichever comes first.
    pub batch_max_seconds: f64,
    /// Schedulers that consult Archer (kube-scheduler with Archer as its extender): their pods
    /// are planned as soon as they are created, not only once the scheduler has marked them
    /// Unschedulable (a pod the scheduler would bind to room already there is planned there).
    /// Pods of any other scheduler wait for its Unschedulable, as with Karpenter.
    pub scheduler_names: Vec<String>,
    /// `Respect` (default): new nodes are bought to honour pods' preferences (preferred pod
    /// affinity and anti-affinity, ScheduleAnyway spread) while that is possible, relaxed one at a
    /// time, as Karpenter does. `Ignore`: new nodes follow required rules alone.
    pub preference_policy: archer_core::sched::preferences::Policy,
    /// Cap on node launches for pending pods per minute (across pools): a safety valve against a
    /// runaway, not a pace (a burst of 1,000 pods needs a few hundred nodes at once).
    pub max_launches_per_minute: u32,
    /// How often disruption (empty, underutilised, expired nodes) is evaluated.
    pub disruption_interval_seconds: f64,
    /// How long a drain may wait on evictions (PDBs) before the node is given back.
    pub drain_timeout_seconds: u64,
    /// A node launched less than this long ago is never taken for empty or underutilised: the
    /// pods it was launched for may not have been scheduled onto it yet.
    pub disruption_grace_seconds: u64,
    /// A consolidation decision is checked again on the cluster as it is after this quiet
    /// period, and dropped if anything it was taken on changed, before any node is tainted.
    pub consolidation_validation_seconds: f64,
    /// Underutilised nodes are replaced only when their pods cost less elsewhere by more than
    /// this percentage of the nodes' price.
    pub consolidation_min_saving_percent: f64,
    /// How long the packer may spend on one plan's optimisation (the LP relaxation and the plans
    /// rounded from it) before it keeps its greedy plan; 0: the greedy plan only, and no lower
    /// bound. Consolidation's re-plans use the same budget.
    pub packing_budget_seconds: f64,
    /// The coordination Lease (in Archer's namespace) that elects the one provisioning replica.
    pub lease_name: String,
    pub lease_duration_seconds: u64,
    /// A launch that fails (other than for capacity) is retried with backoff this many times,
    /// then its claim is deleted with an Event and its pods planned again.
    pub launch_attempts: u32,
    /// A launched node that has not registered (or not become Ready) within this long is given
    /// up: its claim is deleted and its instance terminated.
    pub registration_timeout_seconds: u64,
    /// An instance of this cluster without a claim is terminated once it is this old (a claim
    /// written a moment ago may not be visible yet).
    pub garbage_grace_seconds: u64,
    /// How often the cost and savings metrics are computed (three plans of every pod on the
    /// managed nodes).
    pub cost_interval_seconds: f64,
    /// Give the pods on managed nodes a `controller.kubernetes.io/pod-deletion-cost` so that a
    /// ReplicaSet's scale-down empties whole nodes (the dearest first) instead of thinning all
    /// of them (`archer_model::deletion_cost`).
    pub pod_deletion_cost: bool,
    /// Settings of the `aws` provider.
    pub aws: AwsConfig,
    /// Settings of the `azure` provider.
    pub azure: AzureConfig,
}

impl Default for ProvisionerConfig {
    fn default() -> Self {
        Self {
            cloud_provider: "none".into(),
            zones: vec!["us-east-1a".into(), "us-east-1b".into(), "us-east-1c".into()],
            batch_idle_seconds: 1.0,
            batch_max_seconds: 10.0,
            scheduler_names: vec!["default-scheduler".into()],
            preference_policy: Default::default(),
            max_launches_per_minute: 1000,
            disruption_interval_seconds: 10.0,
            drain_timeout_seconds: 600,
            disruption_grace_seconds: 30,
            consolidation_validation_seconds: 15.0,
            consolidation_min_saving_percent: 2.0,
            packing_budget_seconds: 2.0,
            lease_name: "archer-provisioner".into(),
            lease_duration_seconds: 15,
            launch_attempts: 5,
            registration_timeout_seconds: 900,
            garbage_grace_seconds: 60,
            cost_interval_seconds: 60.0,
            pod_deletion_cost: true,
            aws: AwsConfig::default(),
            azure: AzureConfig::default(),
        }
    }
}

impl ProvisionerConfig {
    pub fn enabled(&self) -> bool {
        self.cloud_provider != "none"
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !["none", "kwok", "aws", "azure"].contains(&self.cloud_provider.as_str()) {
            return Err(ConfigError::Invalid(format!("provisioner.cloudProvider {:?}: expected none, kwok, aws or azure", self.cloud_provider)));
        }
        if self.cloud_provider == "aws" {
            self.aws.validate().map_err(ConfigError::Invalid)?;
        }
        if self.cloud_provider == "azure" {
            self.azure.validate().map_err(ConfigError::Invalid)?;
        }
        if self.launch_attempts == 0 || self.registration_timeout_seconds < 30 {
            return Err(ConfigError::Invalid("provisioner: launchAttempts must be at least 1 and registrationTimeoutSeconds at least 30".into()));
        }
        if self.enabled() && self.zones.is_empty() {
            return Err(ConfigError::Invalid("provisioner.zones must name at least one zone".into()));
        }
        if self.scheduler_names.iter().any(|n| n.trim().is_empty()) {
            return Err(ConfigError::Invalid("provisioner.schedulerNames: a scheduler name is empty".into()));
        }
        if !(self.batch_idle_seconds > 0.0 && self.batch_max_seconds >= self.batch_idle_seconds) {
            return Err(ConfigError::Invalid("provisioner: need 0 < batchIdleSeconds <= batchMaxSeconds".into()));
        }
        if self.max_launches_per_minute == 0 {
            return Err(ConfigError::Invalid("provisioner.maxLaunchesPerMinute must be at least 1".into()));
        }
        if self.disruption_interval_seconds <= 0.0 || self.disruption_interval_seconds.is_nan() || self.lease_duration_seconds < 2 {
            return Err(ConfigError::Invalid("provisioner: disruptionIntervalSeconds must be > 0 and leaseDurationSeconds >= 2".into()));
        }
        if !(self.cost_interval_seconds >= 1.0 && self.cost_interval_seconds <= 3600.0) {
            return Err(ConfigError::Invalid("provisioner.costIntervalSeconds must be between 1 and 3600".into()));
        }
        if !(self.consolidation_validation_seconds >= 0.0 && self.consolidation_validation_seconds <= 600.0) {
            return Err(ConfigError::Invalid("provisioner.consolidationValidationSeconds must be between 0 and 600".into()));
        }
        if !(self.consolidation_min_saving_percent >= 0.0 && self.consolidation_min_saving_percent < 100.0) {
            return Err(ConfigError::Invalid("provisioner.consolidationMinSavingPercent must be at least 0 and below 100".into()));
        }
        if !(self.packing_budget_seconds >= 0.0 && self.packing_budget_seconds <= 60.0) {
            return Err(ConfigError::Invalid("provisioner.packingBudgetSeconds must be between 0 and 60".into()));
        }
        Ok(())
    }

    /// [`Self::packing_budget_seconds`] as a duration.
    pub fn packing_budget(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.packing_budget_seconds.clamp(0.0, 60.0))
    }

    /// [`Self::consolidation_min_saving_percent`] as a fraction.
    pub fn min_saving_fraction(&self) -> f64 {
        self.consolidation_min_saving_percent / 100.0
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {source}")]
    Parse { path: PathBuf, source: Box<archer_core::yaml::Error> },
    #[error("config: {0}")]
    Invalid(String),
}

impl Config {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        let cfg: Config = archer_core::yaml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.into(), source: Box::new(source) })?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.webhook.max_body_bytes < 8 * 1024 * 1024 {
            return Err(ConfigError::Invalid("webhook.maxBodyBytes must be at least 8 MiB (8388608)".into()));
        }
        if !(self.registry.timeout_seconds > 0.0 && self.registry.timeout_seconds <= 30.0) {
            return Err(ConfigError::Invalid("registry.timeoutSeconds must be in (0, 30]".into()));
        }
        if !(self.savings.interval_seconds.is_finite() && (1.0..=3600.0).contains(&self.savings.interval_seconds)) || self.savings.lease_duration_seconds < 2 {
            return Err(ConfigError::Invalid("savings.intervalSeconds must be in [1, 3600] and savings.leaseDurationSeconds at least 2".into()));
        }
        if !(1..=100).contains(&self.preferred_weight) {
            return Err(ConfigError::Invalid("preferredWeight must be 1..100".into()));
        }
        if !(self.extender.inspection_timeout_seconds > 0.0 && self.extender.inspection_timeout_seconds <= 30.0) {
            return Err(ConfigError::Invalid("extender.inspectionTimeoutSeconds must be in (0, 30]".into()));
        }
        if !(0.0..0.5).contains(&self.extender.preference_bonus) {
            return Err(ConfigError::Invalid("extender.preferenceBonus must be in [0, 0.5)".into()));
        }
        if !(self.webhook.decision_timeout_seconds > 0.0 && self.webhook.decision_timeout_seconds <= 30.0) {
            return Err(ConfigError::Invalid("webhook.decisionTimeoutSeconds must be in (0, 30]".into()));
        }
        if !(self.webhook.decision_cache_ttl_seconds.is_finite() && (0.0..=3600.0).contains(&self.webhook.decision_cache_ttl_seconds)) {
            return Err(ConfigError::Invalid("webhook.decisionCacheTtlSeconds must be in [0, 3600]".into()));
        }
        if self.webhook.decision_cache_max_bytes > 1024 * 1024 * 1024 {
            return Err(ConfigError::Invalid("webhook.decisionCacheMaxBytes must be at most 1 GiB".into()));
        }
        // A namespace at its share looks through the whole memo to make room: at least 1/64 of
        // it keeps that to one look per 1/128 of the memo inserted.
        let memo = self.webhook.decision_cache_max_bytes;
        if memo > 0 && self.webhook.decision_cache_max_bytes_per_namespace < (8 * 1024).max(memo / 64) {
            return Err(ConfigError::Invalid("webhook.decisionCacheMaxBytesPerNamespace must be at least 8 KiB and 1/64 of decisionCacheMaxBytes while the memo is on".into()));
        }
        if !(self.extender.max_price_per_hour.is_finite() && self.extender.max_price_per_hour > 0.0) {
            return Err(ConfigError::Invalid("extender.maxPricePerHour must be a positive number".into()));
        }
        if self.registry.max_concurrent_lookups_per_pod == 0 || self.registry.max_bytes_per_pod < self.registry.max_manifest_bytes {
            return Err(ConfigError::Invalid("registry: maxConcurrentLookupsPerPod must be at least 1 and maxBytesPerPod at least maxManifestBytes".into()));
        }
        let r = &self.registry;
        if r.cache_capacity == 0 || r.cache_max_bytes < 64 * 1024 || r.cache_max_bytes > u64::from(u32::MAX) || r.failure_cache_max_bytes > u64::from(u32::MAX) {
            return Err(ConfigError::Invalid("registry: cacheCapacity must be at least 1, and cacheMaxBytes in [64 KiB, 4 GiB) (failureCacheMaxBytes under 4 GiB)".into()));
        }
        if !(r.failure_cache_ttl_seconds.is_finite() && (0.0..=3600.0).contains(&r.failure_cache_ttl_seconds)) {
            return Err(ConfigError::Invalid("registry.failureCacheTtlSeconds must be in [0, 3600]".into()));
        }
        if !(r.timeout_cache_ttl_seconds.is_finite() && (0.0..=60.0).contains(&r.timeout_cache_ttl_seconds)) {
            return Err(ConfigError::Invalid("registry.timeoutCacheTtlSeconds must be in [0, 60]".into()));
        }
        if !(self.shutdown_delay_seconds.is_finite() && (0.0..=300.0).contains(&self.shutdown_delay_seconds)) {
            return Err(ConfigError::Invalid("shutdownDelaySeconds must be in [0, 300]".into()));
        }
        self.limits.validate()?;
        if let Some(l) = &self.extender.listen {
            let addr: std::net::SocketAddr = l.parse().map_err(|_| ConfigError::Invalid(format!("extender.listen {l:?} is not an address:port")))?;
            if !addr.ip().is_loopback() {
                return Err(ConfigError::Invalid("extender.listen serves plain HTTP and must be a loopback address".into()));
            }
        }
        self.provisioner.validate()?;
        self.safety_net.validate()?;
        AddressGuard::new(&self.registry.deny, &self.registry.allow, &self.registry.insecure).map_err(ConfigError::Invalid)?;
        Ok(())
    }

    /// The worst-case resident memory of `archer serve` with this config in a cluster of
    /// `nodes` nodes (docs "Memory bound"): the process at rest, the image caches (all three
    /// full, at their byte budgets), the webhook's decision memo and the extender's node facts,
    /// the node cache, the memory budget with the allocator's slack, and every connection at its
    /// buffers' and HTTP/2 window's worst.
    pub fn memory_bound_bytes(&self, nodes: u64) -> u64 {
        const MIB: u64 = 1024 * 1024;
        let baseline = 48 * MIB;
        let image_caches = self.image_cache_bytes() + self.decision_cache_bytes() + Self::extender_cache_bytes();
        let node_cache = nodes * 10 * 1024;
        let budget = self.limits.memory_budget_bytes as u64 * 115 / 100;
        let connections = self.limits.max_connections as u64 * crate::server::CONNECTION_BYTES as u64;
        baseline + image_caches + node_cache + budget + connections
    }

    /// The most the image caches hold together: the tag and digest caches and the failure cache,
    /// each at its byte budget (entries are weighed by what they hold), and each cache's own
    /// structure.
    pub fn image_cache_bytes(&self) -> u64 {
        2 * self.registry.cache_max_bytes + 2 * self.registry.failure_cache_max_bytes + archer_registry::inspector::ENTRYPOINT_CACHE_BYTES + 5 * archer_registry::inspector::CACHE_STRUCTURE_BYTES
    }

    /// The most the extender's node facts cache holds: its byte budget and its structure.
    pub fn extender_cache_bytes() -> u64 {
        crate::extender::FACTS_CACHE_BYTES as u64 + crate::extender::FACTS_STRUCTURE_BYTES
    }

    /// The most the webhook's decision memo holds: its byte budget and its structure.
    pub fn decision_cache_bytes(&self) -> u64 {
        if self.webhook.decision_cache_max_bytes == 0 {
            return 0;
        }
        self.webhook.decision_cache_max_bytes + crate::webhook::memo::STRUCTURE_BYTES
    }

    /// The listeners' connection bounds from `limits` and `shutdownGraceSeconds`.
    /// The listeners' connection bounds, as plain settings (the server makes its limits of them).
    pub fn connection_settings(&self) -> ConnectionSettings {
        let l = &self.limits;
        ConnectionSettings {
            max_connections: l.max_connections,
            handshake_timeout: Duration::from_secs_f64(l.handshake_timeout_seconds),
            header_read_timeout: Duration::from_secs_f64(l.header_read_timeout_seconds),
            idle_timeout: Duration::from_secs_f64(l.idle_timeout_seconds),
            grace: Duration::from_secs(self.shutdown_grace_seconds),
        }
    }

    /// The webhook's decision memo bounds, as plain settings: its TTL never exceeds the tag
    /// cache's, so a reused decision is no older than the platforms it came from could be.
    pub fn memo_settings(&self) -> MemoSettings {
        let ttl = self.webhook.decision_cache_ttl_seconds.min(self.registry.tag_cache_ttl_seconds as f64);
        MemoSettings { max_bytes: self.webhook.decision_cache_max_bytes, per_namespace: self.webhook.decision_cache_max_bytes_per_namespace.min(self.webhook.decision_cache_max_bytes), ttl: Duration::from_secs_f64(ttl.max(0.0)) }
    }

    /// The shared memory budget of a server built from this config.
    pub fn memory_budget(&self) -> archer_limits::MemoryBudget {
        archer_limits::MemoryBudget::new(self.limits.memory_budget_bytes)
    }

    pub fn placement_settings(&self) -> PlacementSettings {
        PlacementSettings { architecture_taints: self.architecture_taints.clone(), preferred_weight: self.preferred_weight }
    }

    /// Namespaces never mutated: the configured ones plus Archer's own.
    pub fn excluded(&self) -> std::collections::BTreeSet<String> {
        self.excluded_namespaces.iter().cloned().chain([self.namespace.clone()]).collect()
    }
}


/// The bounds every listener holds its connections to (`limits` and `shutdownGraceSeconds`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConnectionSettings {
    /// Open connections at most; more are closed at once and counted.
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    /// HTTP/1 request headers must arrive within this long.
    pub header_read_timeout: Duration,
    /// No request in flight and no bytes moving for this long closes the connection.
    pub idle_timeout: Duration,
    /// After shutdown, how long open requests may take to finish.
    pub grace: Duration,
}

/// The webhook's decision memo: at most `max_bytes`, `per_namespace` of them any one
/// namespace's, entries kept for `ttl`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoSettings {
    pub max_bytes: u64,
    pub per_namespace: u64,
    pub ttl: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_config_file_parses() {
        let cfg: Config = archer_core::yaml::from_str(
            r#"
listen: 127.0.0.1:9443
defaults:
  mode: observe
  prefer: [amd64]
  onInspectionFailure: fail-closed
  fallbackArchitecture: amd64
excludedNamespaces: [kube-system, monitoring]
architectureTaints:
  - {key: kubernetes.io/arch, value: arm64, effect: NoSchedule}
  - {architecture: s390x, key: z, effect: NoExecute}
registry:
  insecure: ["127.0.0.1:5000"]
  mirrors: {docker.io: [mirror.example.com]}
  deny: [10.0.0.0/8]
  timeoutSeconds: 1.5
webhook:
  maxBodyBytes: 33554432
"#,
        )
        .expect("config");
        cfg.validate().expect("valid");
        assert_eq!(cfg.listen, "127.0.0.1:9443");
        assert_eq!(cfg.admin_listen, "0.0.0.0:8080");
        assert_eq!(cfg.architecture_taints[1].applies_to(), Some("s390x"));
        assert!(cfg.excluded().contains("archer-system") && cfg.excluded().contains("monitoring"));
        assert_eq!(cfg.registry.timeout_seconds, 1.5);
        assert_eq!(cfg.registry.insecure, ["127.0.0.1:5000"]);
    }

    #[test]
    fn bad_configs_are_rejected_with_reasons() {
        assert!(archer_core::yaml::from_str::<Config>("lisen: x").is_err(), "unknown keys are errors");
        let small = Config { webhook: WebhookConfig { max_body_bytes: 1024, ..Default::default() }, ..Default::default() };
        assert!(small.validate().is_err());
        let bad_deny = Config { registry: RegistryConfig { deny: vec!["no way".into()], ..Default::default() }, ..Default::default() };
        assert!(bad_deny.validate().is_err());
        let provisioner = |p: ProvisionerConfig| Config { provisioner: p, ..Default::default() }.validate().map_err(|e| e.to_string());
        assert!(provisioner(ProvisionerConfig { consolidation_min_saving_percent: 100.0, ..Default::default() }).is_err_and(|e| e.contains("consolidationMinSavingPercent")));
        assert!(provisioner(ProvisionerConfig { consolidation_min_saving_percent: f64::NAN, ..Default::default() }).is_err());
        assert!(provisioner(ProvisionerConfig { consolidation_validation_seconds: -1.0, ..Default::default() }).is_err_and(|e| e.contains("consolidationValidationSeconds")));
        assert_eq!(ProvisionerConfig::default().min_saving_fraction(), 0.02);
        assert!(provisioner(ProvisionerConfig { packing_budget_seconds: -0.5, ..Default::default() }).is_err_and(|e| e.contains("packingBudgetSeconds")));
        assert!(provisioner(ProvisionerConfig { packing_budget_seconds: f64::NAN, ..Default::default() }).is_err());
        assert_eq!(ProvisionerConfig::default().packing_budget(), std::time::Duration::from_secs(2));
        let parsed: Config = archer_core::yaml::from_str("provisioner: {packingBudgetSeconds: 0.5}").expect("config");
        assert_eq!(parsed.provisioner.packing_budget(), std::time::Duration::from_millis(500));
        assert!(provisioner(ProvisionerConfig { scheduler_names: vec!["default-scheduler".into(), " ".into()], ..Default::default() }).is_err_and(|e| e.contains("schedulerNames")));
        assert_eq!(ProvisionerConfig::default().scheduler_names, ["default-scheduler"]);
        let parsed: Config = archer_core::yaml::from_str("provisioner: {preferencePolicy: Ignore}").expect("config");
        assert_eq!(parsed.provisioner.preference_policy, archer_core::sched::preferences::Policy::Ignore);
        assert!(archer_core::yaml::from_str::<Config>("provisioner: {preferencePolicy: Sometimes}").is_err(), "only Respect or Ignore");
        let parsed: Config = archer_core::yaml::from_str("provisioner: {schedulerNames: []}").expect("config");
        assert!(parsed.validate().is_ok() && parsed.provisioner.scheduler_names.is_empty(), "none: every pod waits for its scheduler's Unschedulable");
        assert!(provisioner(ProvisionerConfig { cloud_provider: "azure".into(), ..Default::default() }).is_err_and(|e| e.contains("provisioner.azure.clusterName is required")), "the first missing setting, named");
        let azure = |extra: &str| {
            let doc = format!("provisioner: {{cloudProvider: azure, azure: {{clusterName: c, subscriptionId: s, resourceGroup: MC_rg, location: eastus, sshPublicKey: ssh-ed25519 AAAA{extra}}}}}");
            archer_core::yaml::from_str::<Config>(&doc).map_err(|e| e.to_string()).and_then(|c| c.validate().map_err(|e| e.to_string()))
        };
        assert!(azure("").is_ok());
        assert!(azure(", zones: [eastus-1, eastus-3]").is_ok());
        assert!(azure(", zones: [westus2-1]").is_err_and(|e| e.contains("not a zone of eastus")), "{:?}", azure(", zones: [westus2-1]"));
        assert!(azure(", createTimeoutSeconds: 0").is_err());
        let zones = AzureConfig { location: "eastus".into(), ..Default::default() }.zones();
        assert_eq!(zones, ["eastus-1", "eastus-2", "eastus-3"], "three zones of the location by default");
    }

    #[test]
    fn the_safety_nets_bounds_are_validated() {
        let net = |n: SafetyNetConfig| Config { safety_net: n, ..Default::default() }.validate().map_err(|e| e.to_string());
        assert!(net(SafetyNetConfig::default()).is_ok());
        assert!(net(SafetyNetConfig { gate_max_seconds: 0.0, ..Default::default() }).is_err_and(|e| e.contains("gateMaxSeconds")));
        assert!(net(SafetyNetConfig { gate_retry_seconds: f64::NAN, ..Default::default() }).is_err());
        assert!(net(SafetyNetConfig { max_broken: 5000, ..Default::default() }).is_err_and(|e| e.contains("maxBroken")), "one ConfigMap holds it");
        assert!(net(SafetyNetConfig { replacement_ttl_seconds: 0, ..Default::default() }).is_err());
        assert!(net(SafetyNetConfig { broken_ttl_seconds: 0, ..Default::default() }).is_err());
        assert!(net(SafetyNetConfig { max_broken_per_namespace: 2000, ..Default::default() }).is_err_and(|e| e.contains("maxBrokenPerNamespace")), "a share is at most the whole");
        let parsed: Config = archer_core::yaml::from_str("safetyNet: {gateMaxSeconds: 30, replacementTtlSeconds: 600}").expect("config");
        assert_eq!((parsed.safety_net.gate_max_seconds, parsed.safety_net.limits().replacement_ttl_seconds), (30.0, 600));
    }

    #[test]
    fn the_decision_memos_namespace_share_is_validated_and_never_more_than_the_memo() {
        let memo = |w: WebhookConfig| Config { webhook: w, ..Default::default() };
        let d = WebhookConfig::default();
        assert_eq!(memo(d.clone()).memo_settings().per_namespace, 256 * 1024);
        assert!(memo(WebhookConfig { decision_cache_max_bytes_per_namespace: 4096, ..d.clone() }).validate().is_err_and(|e| e.to_string().contains("decisionCacheMaxBytesPerNamespace")));
        // At least 1/64 of the memo: 1 GiB needs 16 MiB.
        let big = WebhookConfig { decision_cache_max_bytes: 1 << 30, decision_cache_max_bytes_per_namespace: 8 << 20, ..d.clone() };
        assert!(memo(big.clone()).validate().is_err());
        assert!(memo(WebhookConfig { decision_cache_max_bytes_per_namespace: 16 << 20, ..big }).validate().is_ok());
        // A memo smaller than the share is all one namespace's at most; a memo turned off needs none.
        assert_eq!(memo(WebhookConfig { decision_cache_max_bytes: 64 * 1024, ..d.clone() }).memo_settings().per_namespace, 64 * 1024);
        assert!(memo(WebhookConfig { decision_cache_max_bytes: 0, decision_cache_max_bytes_per_namespace: 0, ..d }).validate().is_ok());
        let parsed: Config = archer_core::yaml::from_str("webhook: {decisionCacheMaxBytesPerNamespace: 65536}").expect("config");
        assert_eq!(parsed.memo_settings().per_namespace, 65536);
    }
}
