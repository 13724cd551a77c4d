//! NodeOverlay, Karpenter's `karpenter.sh/v1alpha1` (alpha since v1.7), read unchanged: a user's
//! own prices (Savings Plans, reserved instances, private pricing) and extended resources for the
//! instance types its requirements select. Cluster-scoped. Archer reads the objects a Karpenter
//! user already has and writes only their status conditions (`ValidationSucceeded`, `Ready`),
//! as Karpenter does.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::nodepool::RequirementDoc;

/// What an overlay changes, and for which instance types' offerings.
#[derive(CustomResource, Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[kube(group = "karpenter.sh", version = "v1alpha1", kind = "NodeOverlay", plural = "nodeoverlays", shortname = "overlays", status = "NodeOverlayStatus")]
#[kube(printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#)]
#[kube(printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#)]
#[kube(printcolumn = r#"{"name":"Weight","type":"integer","priority":1,"jsonPath":".spec.weight"}"#)]
#[serde(rename_all = "camelCase")]
pub struct NodeOverlaySpec {
    /// Which offerings it applies to: over their instance type's well-known labels, zone and
    /// capacity type (at most 100).
    #[serde(default)]
    pub requirements: Vec<RequirementDoc>,
    /// Change to the price: `+0.1`/`-0.05` (USD per hour) or `+10%`/`-15%` (at most `-100%`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_adjustment: Option<String>,
    /// The price itself (USD per hour), in place of the provider's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<String>,
    /// Extended resources the selected instance types' nodes have (not cpu, memory,
    /// ephemeral-storage or pods): quantities, written as numbers or strings (`1`, `2Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<BTreeMap<String, IntOrString>>,
    /// Overlays are applied from the highest weight down (1 to 10000; none counts as 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeOverlayStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The CRD as Archer's chart installs it where the cluster does not serve Karpenter's: the
/// types' schema with Karpenter's rule that `price` and `priceAdjustment` exclude each other,
/// kept by Helm on upgrade and uninstall (`helm.sh/resource-policy: keep`), so overlays are
/// never deleted with Archer.
pub fn chart_crd() -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule;
    use kube::CustomResourceExt;
    let mut crd = NodeOverlay::crd();
    crd.metadata.annotations.get_or_insert_with(Default::default).insert("helm.sh/resource-policy".into(), "keep".into());
    for version in &mut crd.spec.versions {
        let spec = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()).and_then(|s| s.properties.as_mut()).and_then(|p| p.get_mut("spec"));
        if let Some(spec) = spec {
            spec.x_kubernetes_validations = Some(vec![ValidationRule { rule: "!has(self.price) || !has(self.priceAdjustment)".into(), message: Some("cannot set both 'price' and 'priceAdjustment'".into()), ..Default::default() }]);
        }
    }
    crd
}
