//! NodeClaim, `archer.dev/v1alpha1`: the record of one node Archer decided to launch, written
//! *before* the cloud provider is asked for it. The provider's create is idempotent on the claim's
//! name (the kwok provider names the Node after it; a cloud provider passes it as the client
//! token), so a crash between the two can only lead to the same launch being retried, never to a
//! second node; instances whose claim is gone are deleted by the garbage collector, so none leak.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::nodepool::{RequirementDoc, TaintDoc};
use archer_core::requirements::Requirements;

/// What the node must be. Cluster-scoped; named `<pool>-<random>` by the API server.
#[derive(CustomResource, Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[kube(group = "archer.dev", version = "v1alpha1", kind = "NodeClaim", plural = "archernodeclaims", singular = "archernodeclaim", shortname = "anc", category = "archer", status = "NodeClaimStatus")]
#[kube(printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".spec.nodePool"}"#)]
#[kube(printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.instanceType"}"#)]
#[kube(printcolumn = r#"{"name":"Zone","type":"string","jsonPath":".spec.zone"}"#)]
#[kube(printcolumn = r#"{"name":"Capacity","type":"string","jsonPath":".spec.capacityType"}"#)]
#[kube(printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.nodeName"}"#)]
#[kube(printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#)]
#[kube(printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#)]
#[kube(printcolumn = r#"{"name":"Price","type":"number","priority":1,"jsonPath":".spec.pricePerHour"}"#)]
#[kube(printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimSpec {
    /// The NodePool this node belongs to.
    pub node_pool: String,
    pub instance_type: String,
    pub zone: String,
    /// `on-demand` or `spot`.
    pub capacity_type: String,
    pub arch: String,
    pub os: String,
    /// Every label the node carries (pool template labels and the well-known ones).
    #[serde(default)]
    #[schemars(schema_with = "crate::validation::labels_schema")]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub taints: Vec<TaintDoc>,
    /// Taints removed by something else once the node is initialised.
    #[serde(default)]
    pub startup_taints: Vec<TaintDoc>,
    /// Raw capacity and what pods may use (`cpu`, `memory`, `pods`), as quantities.
    #[serde(default)]
    pub capacity: BTreeMap<String, String>,
    #[serde(default)]
    pub allocatable: BTreeMap<String, String>,
    /// The hourly price the decision was made at.
    pub price_per_hour: f64,
    /// Copied from the pool at launch (`720h`, `Never`).
    #[serde(default)]
    pub expire_after: Option<String>,
    /// Why it was launched: `provisioning` or `replacement`.
    #[serde(default)]
    pub reason: Option<String>,
    /// The node class the provider launches with (the pool's `nodeClassRef`: group, kind, name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_class_ref: Option<BTreeMap<String, String>>,
    /// The pool's requirements, plus the planned instance type when a pod of the claim asks for
    /// particular types: a provider offering other types than the planned one keeps to them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<RequirementDoc>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimStatus {
    /// The provider's id of the instance, once launched.
    #[serde(default)]
    pub provider_id: Option<String>,
    #[serde(default)]
    pub node_name: Option<String>,
    /// RFC 3339 time of the successful launch.
    #[serde(default)]
    pub launched_at: Option<String>,
    /// The last launch error, if the launch is being retried.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Failed launch attempts so far (the claim is given up after `launchAttempts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_attempts: Option<u32>,
    /// RFC 3339 time of the last failed attempt (retries back off from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_at: Option<String>,
    /// The instance type and zone the provider launched (it may choose among the claim's types).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The image the instance booted and the hash of its node class at launch (drift).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_class_hash: Option<String>,
    /// `Launched`, `Registered`, `Initialized` and `Ready` (all three), kept by the claim keeper;
    /// `Drifted` and `Disrupting` (with the reason) set when disruption takes the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

impl NodeClaim {
    pub fn name(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }

    /// The name of the claim's node: the one its launch recorded (a cloud names it after the
    /// instance), else the claim's own (kwok names the node after the claim).
    pub fn node_name(&self) -> String {
        self.status.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_else(|| self.name())
    }

    pub fn launched(&self) -> bool {
        self.status.as_ref().and_then(|s| s.provider_id.as_ref()).is_some()
    }

    /// The claim's requirements, `None` when it has none or they do not parse.
    pub fn requirements(&self) -> Option<Requirements> {
        if self.spec.requirements.is_empty() {
            return None;
        }
        let mut r = Requirements::new();
        for q in &self.spec.requirements {
            r.add(&q.key, &q.operator, &q.values).ok()?;
        }
        Some(r)
    }

    pub fn deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
}
