//! The kwok provider: a "launch" creates a real Node object in the API (named after the claim,
//! with the claim's labels, taints, capacity and allocatable, and the kwok annotation), which the
//! kwok controller then marks Ready and whose pods it runs. Deleting the instance deletes the Node.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, ObjectMeta};
use kube::{Api, Client, Resource};

use archer_cloud::{CloudError, CloudProvider, Instance};
use archer_core::catalog::Catalog;
use archer_core::labels;
use archer_core::packer::Offering;
use archer_api::nodeclaim::NodeClaim;
use archer_api::nodepool::offerings;

const PROVIDER: &str = "kwok";
/// kwok manages nodes carrying this label (`--manage-nodes-with-label-selector=type=kwok`) ...
const MANAGED_LABEL: (&str, &str) = ("type", "kwok");
/// ... or this annotation (its default selector).
const MANAGED_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

pub struct Kwok {
    client: Client,
    offerings: Arc<Vec<Offering>>,
}

impl Kwok {
    pub fn new(client: Client, catalog: Arc<Catalog>, zones: Vec<String>) -> Self {
        Self { client, offerings: Arc::new(offerings(&catalog, &zones)) }
    }

    fn api(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }
}

fn quantities(m: &BTreeMap<String, String>) -> BTreeMap<String, Quantity> {
    m.iter().map(|(k, v)| (k.clone(), Quantity(v.clone()))).collect()
}

fn api_error(e: kube::Error) -> CloudError {
    CloudError::Api { provider: PROVIDER, message: e.to_string() }
}

fn instance(node: &Node) -> Option<Instance> {
    let claim = node.metadata.labels.as_ref()?.get(labels::NODECLAIM)?.clone();
    let name = node.metadata.name.clone()?;
    let get = |k: &str| node.metadata.labels.as_ref().and_then(|l| l.get(k).cloned());
    let launched_at = node.metadata.creation_timestamp.as_ref().map(|t| std::time::SystemTime::from(t.0));
    Some(Instance {
        provider_id: node.spec.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_else(|| format!("kwok://{name}")),
        node_name: name,
        claim,
        instance_type: get(labels::INSTANCE_TYPE),
        zone: get(labels::ZONE),
        launched_at,
        image_id: None,
        node_class_hash: None,
    })
}

/// The Node a claim becomes.
fn node_for(claim: &NodeClaim) -> Node {
    let name = claim.name();
    let mut node_labels = claim.spec.labels.clone();
    node_labels.insert(labels::HOSTNAME.into(), name.clone());
    node_labels.insert(labels::NODECLAIM.into(), name.clone());
    node_labels.insert(MANAGED_LABEL.0.into(), MANAGED_LABEL.1.into());
    let mut taints: Vec<Taint> = claim.spec.taints.iter().chain(&claim.spec.startup_taints).map(archer_api::nodepool::TaintDoc::to_taint).collect();
    // NoSchedule, not Karpenter's NoExecute: kube-scheduler may bind a pod the moment the taint
    // is lifted, while kube-controller-manager's taint-eviction controller still sees the taint
    // and deletes that pod (measured at scale, issue #14). Nothing else binds to a new node.
    taints.push(Taint { key: labels::UNREGISTERED_TAINT.into(), value: None, effect: "NoSchedule".into(), time_added: None });
    let mut annotations = BTreeMap::from([(MANAGED_ANNOTATION.0.to_string(), MANAGED_ANNOTATION.1.to_string())]);
    if let Some(b) = claim.metadata.annotations.as_ref().and_then(|a| a.get(labels::BATCH_NODES_ANNOTATION)) {
        annotations.insert(labels::BATCH_NODES_ANNOTATION.into(), b.clone());
    }
    let owner = claim.meta().uid.clone().map(|uid| OwnerReference {
        api_version: "archer.dev/v1alpha1".into(),
        kind: "NodeClaim".into(),
        name: name.clone(),
        uid,
        block_owner_deletion: Some(true),
        controller: None,
    });
    Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(node_labels),
            annotations: Some(annotations),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(NodeSpec { provider_id: Some(format!("kwok://{name}")), taints: Some(taints), ..Default::default() }),
        status: Some(NodeStatus { capacity: Some(quantities(&claim.spec.capacity)), allocatable: Some(quantities(&claim.spec.allocatable)), ..Default::default() }),
    }
}

#[async_trait]
impl CloudProvider for Kwok {
    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn offerings(&self) -> Arc<Vec<Offering>> {
        self.offerings.clone()
    }

    async fn create(&self, claim: &NodeClaim) -> Result<Instance, CloudError> {
        let node = node_for(claim);
        match self.api().create(&archer_api::apply::post_params(), &node).await {
            Ok(n) => instance(&n).ok_or_else(|| CloudError::Api { provider: PROVIDER, message: "created node has no claim label".into() }),
            // Launched before (a retry after a crash or a lost response): the same instance.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let n = self.api().get(&claim.name()).await.map_err(api_error)?;
                instance(&n).filter(|i| i.claim == claim.name()).ok_or_else(|| CloudError::Api { provider: PROVIDER, message: format!("node {} exists and belongs to another claim", claim.name()) })
            }
            Err(e) => Err(api_error(e)),
        }
    }

    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        match self.api().delete(&claim.name(), &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(api_error(e)),
        }
    }

    async fn list(&self) -> Result<Vec<Instance>, CloudError> {
        let nodes = self.api().list(&ListParams::default().labels(&format!("{},{}={}", labels::NODECLAIM, MANAGED_LABEL.0, MANAGED_LABEL.1))).await.map_err(api_error)?;
        Ok(nodes.items.iter().filter_map(instance).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_node_starts_unregistered_without_a_taint_that_evicts() {
        let claim: NodeClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": "default-abc", "uid": "u1"},
            "spec": {"nodePool": "default", "instanceType": "m6g.large", "zone": "us-east-1a", "capacityType": "spot", "arch": "arm64", "os": "linux",
                     "labels": {"kubernetes.io/arch": "arm64"}, "taints": [{"key": "team", "value": "a", "effect": "NoSchedule"}],
                     "startupTaints": [{"key": "cni-not-ready", "effect": "NoSchedule"}],
                     "capacity": {"cpu": "2", "memory": "8Gi", "pods": "29"}, "allocatable": {"cpu": "1930m", "memory": "7Gi", "pods": "29"}, "pricePerHour": 0.03}
        }))
        .expect("claim");
        let node = node_for(&claim);
        let taints: Vec<(String, String)> = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default().into_iter().map(|t| (t.key, t.effect)).collect();
        assert_eq!(
            taints,
            [("team".to_string(), "NoSchedule".to_string()), ("cni-not-ready".into(), "NoSchedule".into()), (labels::UNREGISTERED_TAINT.into(), "NoSchedule".into())]
        );
        let node_labels = node.metadata.labels.clone().unwrap_or_default();
        assert_eq!(node_labels.get(labels::HOSTNAME).map(String::as_str), Some("default-abc"));
        assert_eq!(node_labels.get("kubernetes.io/arch").map(String::as_str), Some("arm64"));
    }
}
