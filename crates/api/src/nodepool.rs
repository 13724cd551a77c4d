//! NodePool, `archer.dev/v1alpha1`: the schema of Karpenter v1's NodePool, so a pool is ported by
//! changing its apiVersion.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use archer_core::catalog::{CapacityType, Catalog};
use archer_core::labels;
use archer_core::packer::{Offering, Pool};
use archer_core::quantity;
use archer_core::requirements::{RequirementError, Requirements};

pub const API_VERSION: &str = "archer.dev/v1alpha1";
pub const KARPENTER_API_VERSION: &str = "karpenter.sh/v1";
/// Zones assumed when neither the pool nor the scenario names any.
pub const DEFAULT_ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];

/// The NodePool custom resource (cluster-scoped), `archer.dev/v1alpha1`. Its CRD in
/// `deploy/crds/nodepool.yaml` is generated from these types (see `tests/deploy_manifests.rs`).
#[derive(CustomResource, Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[kube(group = "archer.dev", version = "v1alpha1", kind = "NodePool", plural = "archernodepools", singular = "archernodepool", shortname = "anp", category = "archer", status = "NodePoolStatus")]
#[kube(printcolumn = r#"{"name":"Nodes","type":"integer","jsonPath":".status.nodes"}"#)]
#[kube(printcolumn = r#"{"name":"CPU","type":"string","jsonPath":".status.resources.cpu"}"#)]
#[kube(printcolumn = r#"{"name":"Memory","type":"string","jsonPath":".status.resources.memory"}"#)]
#[kube(printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#)]
#[kube(printcolumn = r#"{"name":"Weight","type":"integer","priority":1,"jsonPath":".spec.weight"}"#)]
#[kube(printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolSpec {
    /// What nodes of this pool look like.
    #[serde(default)]
    pub template: Template,
    /// How nodes of this pool are taken away.
    #[serde(default)]
    pub disruption: Option<Disruption>,
    /// Caps on the pool's total resources: `cpu`, `memory`, `nodes`.
    #[serde(default)]
    pub limits: BTreeMap<String, IntOrString>,
    /// Pools with higher weight are tried first.
    #[serde(default)]
    pub weight: Option<i32>,
}

/// What the pool holds now, against its limits, and whether it can be used.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolStatus {
    /// Resources of the pool's nodes and in-flight claims (`cpu`, `memory`, `pods`, `nodes`), as
    /// quantities: what `limits` is checked against.
    #[serde(default)]
    pub resources: BTreeMap<String, String>,
    /// Nodes and in-flight claims of the pool.
    #[serde(default)]
    pub nodes: i64,
    /// `Ready`: the pool's requirements can be used (and its limits are not all spent:
    /// reason `LimitsReached`).
    #[serde(default)]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disruption {
    /// `WhenEmpty`, `WhenEmptyOrUnderutilized` or `Balanced`.
    #[serde(default)]
    pub consolidation_policy: Option<String>,
    /// How long a node must be empty or underutilised first, e.g. `30s`, `Never`.
    #[serde(default)]
    pub consolidate_after: Option<String>,
    /// At most this many nodes disrupted at once (count or percentage).
    #[serde(default)]
    pub budgets: Vec<Budget>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    /// `10%` or `5`.
    pub nodes: String,
    #[serde(default)]
    pub schedule: Option<String>,
    #[serde(default)]
    pub duration: Option<String>,
    #[serde(default)]
    pub reasons: Vec<String>,
}

fn quantity_of(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct Template {
    #[serde(default)]
    pub metadata: TemplateMeta,
    #[serde(default)]
    pub spec: TemplateSpec,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct TemplateMeta {
    #[serde(default)]
    #[schemars(schema_with = "crate::validation::labels_schema")]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateSpec {
    #[serde(default)]
    pub taints: Vec<TaintDoc>,
    #[serde(default)]
    pub startup_taints: Vec<TaintDoc>,
    #[serde(default)]
    pub requirements: Vec<RequirementDoc>,
    #[serde(default)]
    pub expire_after: Option<String>,
    /// The node class its nodes launch with (`group`, `kind`, `name`): an `EC2NodeClass` for the
    /// aws provider; the kwok provider takes none.
    #[serde(default)]
    pub node_class_ref: Option<BTreeMap<String, String>>,
}

// A taint as the NodePool and NodeClaim resources write it (key, value, effect); a doc comment
// here would become a description in the generated CRDs.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
pub struct TaintDoc {
    #[schemars(length(max = 317), regex(pattern = crate::validation::QUALIFIED_NAME_PATTERN))]
    pub key: String,
    #[serde(default)]
    #[schemars(length(max = 63), regex(pattern = crate::validation::LABEL_VALUE_PATTERN))]
    pub value: Option<String>,
    #[schemars(extend("enum" = ["NoSchedule", "PreferNoSchedule", "NoExecute"]))]
    pub effect: String,
}

impl TaintDoc {
    /// The taint as Kubernetes has it on a Node: the one conversion, used for pools, claims
    /// and the nodes providers create.
    pub fn to_taint(&self) -> k8s_openapi::api::core::v1::Taint {
        k8s_openapi::api::core::v1::Taint { key: self.key.clone(), value: self.value.clone(), effect: self.effect.clone(), time_added: None }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequirementDoc {
    #[schemars(length(max = 317), regex(pattern = crate::validation::QUALIFIED_NAME_PATTERN))]
    pub key: String,
    pub operator: String,
    #[serde(default)]
    #[schemars(inner(length(max = 63), regex(pattern = crate::validation::LABEL_VALUE_PATTERN)))]
    pub values: Vec<String>,
    #[serde(default)]
    pub min_values: Option<u32>,
}

impl NodePool {
    /// The default pool when a scenario names none: any architecture, Linux, on-demand.
    pub fn default_pool() -> Self {
        NodePool::new("default", NodePoolSpec::default())
    }

    pub fn name(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }

    pub fn requirements(&self) -> Result<Requirements, RequirementError> {
        let mut r = Requirements::new();
        for q in &self.spec.template.spec.requirements {
            r.add(&q.key, &q.operator, &q.values)?;
        }
        // Karpenter's defaults: Linux, on-demand unless the pool says otherwise.
        if r.get(labels::OS).is_none() {
            r.add(labels::OS, "In", &["linux".into()])?;
        }
        if r.get(labels::KARPENTER_CAPACITY_TYPE).is_none() {
            r.add(labels::KARPENTER_CAPACITY_TYPE, "In", &[CapacityType::OnDemand.as_str().into()])?;
        }
        Ok(r)
    }

    /// The packer's view of this pool.
    pub fn to_pool(&self) -> Result<Pool, RequirementError> {
        let limits: BTreeMap<String, String> = self.spec.limits.iter().map(|(k, v)| (k.clone(), quantity_of(v))).collect();
        let mut requirements = self.requirements()?;
        // A pool plans with its own cloud's sizes only: Azure sizes carry the scale set
        // priority label, and no other cloud's do.
        if requirements.get(labels::AKS_SCALE_SET_PRIORITY).is_none() {
            let op = if self.cloud() == Cloud::Azure { "Exists" } else { "DoesNotExist" };
            requirements.add(labels::AKS_SCALE_SET_PRIORITY, op, &[])?;
        }
        Ok(Pool {
            name: self.name(),
            weight: self.spec.weight.unwrap_or(0),
            requirements,
            labels: self.spec.template.metadata.labels.clone(),
            taints: self.spec.template.spec.taints.iter().map(TaintDoc::to_taint).collect(),
            limit_cpu_millis: limits.get("cpu").and_then(|q| quantity::cpu_millis(q)),
            limit_memory_bytes: limits.get("memory").and_then(|q| quantity::value(q)),
            limit_nodes: limits.get("nodes").and_then(|q| quantity::value(q)),
            daemons: Vec::new(),
            closed: None,
            variant: Default::default(),
        })
    }

    /// Zones this pool may launch in: its zone requirement's, else its cloud's defaults (EC2:
    /// us-east-1a-c; Azure: zones 1-3 of each region its region requirement names, else of
    /// eastus, written `<region>-<n>` as AKS labels them).
    pub fn zones(&self) -> Vec<String> {
        let r = self.requirements().ok();
        if let Some(v) = r.as_ref().and_then(|r| r.get(labels::ZONE)).and_then(|z| z.values()) {
            return v.into_iter().map(String::from).collect();
        }
        if self.cloud() == Cloud::Azure {
            let regions: Vec<String> = match r.as_ref().and_then(|r| r.get(labels::REGION)).and_then(|z| z.values()) {
                Some(v) => v.into_iter().map(String::from).collect(),
                None => vec![archer_core::catalog::DEFAULT_AZURE_REGION.to_string()],
            };
            return regions.iter().flat_map(|r| (1..=3).map(move |n| format!("{r}-{n}"))).collect();
        }
        DEFAULT_ZONES.iter().map(|z| z.to_string()).collect()
    }

    /// The cloud this pool's nodes come from, by its node class: an `AKSNodeClass` (Archer's, or
    /// `karpenter.azure.com`'s) is Azure; anything else (an `EC2NodeClass`, none) is EC2.
    pub fn cloud(&self) -> Cloud {
        let class = self.spec.template.spec.node_class_ref.as_ref();
        let azure = class.is_some_and(|c| c.get("kind").is_some_and(|k| k == "AKSNodeClass") || c.get("group").is_some_and(|g| g == AZURE_GROUP));
        if azure {
            Cloud::Azure
        } else {
            Cloud::Aws
        }
    }
}

/// Karpenter on Azure's API group (its `AKSNodeClass`).
const AZURE_GROUP: &str = "karpenter.azure.com";

/// Which cloud's sizes a pool plans with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cloud {
    Aws,
    Azure,
}

/// Every priced (instance type, zone, capacity type) of the catalog in `zones`, each priced in
/// its zone's region ([`Catalog::price_in_zone`]: an Azure zone offers Azure sizes, an EC2 zone
/// EC2 types).
pub fn offerings(catalog: &Catalog, zones: &[String]) -> Vec<Offering> {
    let known = catalog.regions();
    let mut out = Vec::new();
    for t in catalog.types() {
        for cap in [CapacityType::OnDemand, CapacityType::Spot] {
            for z in zones {
                let Some(price) = catalog.price_in_zone(t, z, &known, cap) else { continue };
                out.push(Offering { instance: t.clone(), zone: z.clone(), capacity: cap, price, pool: None });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(yaml: &str) -> NodePool {
        archer_core::yaml::from_str(yaml).expect("pool")
    }

    /// A `karpenter.sh/v1` pool naming Karpenter on Azure's AKSNodeClass (or Archer's) plans Azure
    /// sizes in its region's three zones; any other pool stays on EC2.
    #[test]
    fn a_pools_node_class_picks_its_cloud_and_default_zones() {
        let aks = pool("apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: demo}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: karpenter.azure.com, kind: AKSNodeClass, name: default}\n      requirements: []\n");
        assert_eq!(aks.cloud(), Cloud::Azure);
        assert_eq!(aks.zones(), ["eastus-1", "eastus-2", "eastus-3"]);
        let ours = pool("apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: ours}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: archer.dev, kind: AKSNodeClass, name: default}\n      requirements:\n        - {key: topology.kubernetes.io/region, operator: In, values: [westeurope]}\n");
        assert_eq!(ours.cloud(), Cloud::Azure);
        assert_eq!(ours.zones(), ["westeurope-1", "westeurope-2", "westeurope-3"], "the region requirement names the region");
        let ec2 = pool("apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: ec2}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n      requirements: []\n");
        assert_eq!(ec2.cloud(), Cloud::Aws);
        assert_eq!(ec2.zones(), DEFAULT_ZONES);
        assert_eq!(NodePool::default_pool().cloud(), Cloud::Aws);
    }

    /// Each pool plans with its own cloud's sizes only, even when offerings of both are there.
    #[test]
    fn a_pool_plans_only_its_own_clouds_sizes() {
        let c = archer_core::catalog::Catalog::embedded().expect("catalog");
        let aks = pool("apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: demo}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: karpenter.azure.com, kind: AKSNodeClass, name: default}\n      requirements: []\n");
        let ec2 = NodePool::default_pool();
        let zones: Vec<String> = aks.zones().into_iter().chain(ec2.zones()).collect();
        let offers = offerings(&c, &zones);
        assert!(offers.iter().any(|o| o.instance.provider == "azure") && offers.iter().any(|o| o.instance.provider == "aws"));
        assert!(offers.iter().all(|o| (o.instance.provider == "azure") == o.zone.starts_with("eastus")), "each zone offers its own cloud's types");
        for (p, provider) in [(&aks, "azure"), (&ec2, "aws")] {
            let packer_pool = p.to_pool().expect("pool");
            let usable: Vec<_> = offers.iter().filter(|o| packer_pool.requirements.matches_map(&o.labels(&packer_pool))).collect();
            assert!(!usable.is_empty() && usable.iter().all(|o| o.instance.provider == provider), "{} plans {provider} only", p.name());
        }
    }
}
