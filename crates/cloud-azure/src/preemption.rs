//! Spot evictions, learned the way Karpenter on Azure learns them: an agent on each spot node
//! polls the Instance Metadata Service's Scheduled Events and, on a `Preempt` event (about 30 s
//! of notice), sets the Node condition `PreemptionScheduled=True`. Every such node of an Azure
//! VM is handed to the provisioner at once, as a spot interruption: its pods leave now, and
//! replacements are launched for them.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

use archer_cloud::{InterruptionHandler, Interruption};

/// The Node condition the node agent sets (Karpenter on Azure's `SpotConditionPreemptionScheduled`).
const CONDITION: &str = "PreemptionScheduled";
const KIND: &str = "spot-interruption";
/// Nodes remembered as handled (forgotten all at once past this).
const REMEMBERED: usize = 10_000;

/// The VM name of a node whose preemption is scheduled, if it is an Azure VM's.
pub(crate) fn preempted(node: &Node) -> Option<String> {
    let provider_id = node.spec.as_ref()?.provider_id.as_deref()?;
    if !provider_id.starts_with("azure://") {
        return None;
    }
    let scheduled = node.status.as_ref()?.conditions.as_ref()?.iter().any(|c| c.type_ == CONDITION && c.status == "True");
    scheduled.then(|| provider_id.rsplit('/').next().unwrap_or_default().to_string()).filter(|n| !n.is_empty())
}

/// Until dropped: each node newly marked is handed to `handler` once.
pub(crate) async fn run(kube: Client, handler: Arc<dyn InterruptionHandler>) {
    let api: Api<Node> = Api::all(kube);
    let mut handled: BTreeSet<String> = BTreeSet::new();
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff().applied_objects());
    while let Some(event) = events.next().await {
        let node = match event {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "node watch error (spot evictions); retrying");
                continue;
            }
        };
        let Some(vm) = preempted(&node) else { continue };
        if handled.contains(&vm) {
            continue;
        }
        if handled.len() >= REMEMBERED {
            handled.clear();
        }
        tracing::warn!(node = %node.name_any(), vm = %vm, "spot VM preemption scheduled; its pods are moved now");
        let notice = Interruption { kind: KIND, instance_ids: vec![vm.clone()], replace_first: false };
        match handler.interrupted(notice).await {
            Ok(()) => {
                handled.insert(vm);
                handler.count(KIND, "handled");
            }
            Err(e) => {
                tracing::warn!(node = %node.name_any(), error = %e, "spot eviction not handled; retried at the node's next change");
                handler.count(KIND, "failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(provider_id: &str, condition: Option<&str>) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "aks-x"},
            "spec": {"providerID": provider_id},
            "status": {"conditions": condition.map(|s| vec![serde_json::json!({"type": CONDITION, "status": s})]).unwrap_or_default()}
        }))
        .expect("node")
    }

    #[test]
    fn only_an_azure_vm_whose_preemption_is_scheduled_is_preempted() {
        let id = "azure:///subscriptions/s/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachines/aks-default-abc";
        assert_eq!(preempted(&node(id, Some("True"))).as_deref(), Some("aks-default-abc"));
        assert_eq!(preempted(&node(id, Some("False"))), None);
        assert_eq!(preempted(&node(id, None)), None);
        assert_eq!(preempted(&node("aws:///us-east-1a/i-1", Some("True"))), None);
    }
}
