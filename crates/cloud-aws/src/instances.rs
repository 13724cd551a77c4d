//! This cluster's instances: found by their tags, described, listed and terminated.

use aws_sdk_ec2::types::Filter;
use aws_sdk_ec2::Client;

use crate::{api_error, sdk_error, CLUSTER_TAG, NODECLAIM_TAG};
use archer_cloud::{CloudError, Instance};
use archer_api::nodeclaim::NodeClaim;

/// States of an instance that still exists (or is about to).
const LIVE: [&str; 4] = ["pending", "running", "stopping", "stopped"];

/// `aws:///<zone>/<instance id>`, as the AWS cloud provider of Kubernetes sets `spec.providerID`.
pub(crate) fn provider_id(zone: &str, id: &str) -> String {
    format!("aws:///{zone}/{id}")
}

/// The instance id of a provider id.
pub(crate) fn instance_id(provider_id: &str) -> Option<&str> {
    provider_id.rsplit('/').next().filter(|s| s.starts_with("i-"))
}

fn instance_of(i: &aws_sdk_ec2::types::Instance, claim: Option<&str>) -> Option<Instance> {
    let id = i.instance_id()?;
    let zone = i.placement().and_then(|p| p.availability_zone()).unwrap_or_default();
    let claim = claim.map(String::from).or_else(|| i.tags().iter().find(|t| t.key() == Some(NODECLAIM_TAG)).and_then(|t| t.value()).map(String::from))?;
    let node_name = i.private_dns_name().filter(|n| !n.is_empty()).map(String::from).unwrap_or_else(|| id.to_string());
    Some(Instance {
        provider_id: provider_id(zone, id),
        node_name,
        claim,
        instance_type: i.instance_type().map(|t| t.as_str().to_string()),
        zone: Some(zone.to_string()).filter(|z| !z.is_empty()),
        launched_at: i.launch_time().and_then(|t| std::time::SystemTime::try_from(*t).ok()),
        image_id: i.image_id().map(String::from),
        node_class_hash: None,
    })
}

fn live_filter() -> Filter {
    Filter::builder().name("instance-state-name").set_values(Some(LIVE.iter().map(|s| s.to_string()).collect())).build()
}

fn cluster_filter(cluster: &str) -> Filter {
    Filter::builder().name(format!("tag:{CLUSTER_TAG}")).values(cluster).build()
}

/// One instance by id.
pub(crate) async fn describe(ec2: &Client, id: &str, claim: &str) -> Result<Instance, CloudError> {
    let resp = ec2.describe_instances().instance_ids(id).send().await.map_err(|e| api_error(sdk_error(e)))?;
    resp.reservations().iter().flat_map(|r| r.instances()).find_map(|i| instance_of(i, Some(claim))).ok_or_else(|| api_error(format!("instance {id} launched but not found")))
}

/// The live instance launched for a claim, if any.
pub(crate) async fn of_claim(ec2: &Client, cluster: &str, claim: &str) -> Result<Option<Instance>, CloudError> {
    let resp = ec2
        .describe_instances()
        .filters(cluster_filter(cluster))
        .filters(Filter::builder().name(format!("tag:{NODECLAIM_TAG}")).values(claim).build())
        .filters(live_filter())
        .send()
        .await
        .map_err(|e| api_error(sdk_error(e)))?;
    Ok(resp.reservations().iter().flat_map(|r| r.instances()).find_map(|i| instance_of(i, Some(claim))))
}

/// Every live instance of the cluster that was launched for a claim.
pub(crate) async fn list(ec2: &Client, cluster: &str) -> Result<Vec<Instance>, CloudError> {
    let mut out = Vec::new();
    let mut pages = ec2.describe_instances().filters(cluster_filter(cluster)).filters(live_filter()).into_paginator().send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| api_error(sdk_error(e)))?;
        out.extend(page.reservations().iter().flat_map(|r| r.instances()).filter_map(|i| instance_of(i, None)));
    }
    Ok(out)
}

/// Terminate the claim's instances: the live ones tagged for this cluster and this claim, and
/// nothing else. The provider id recorded in the claim's status is not trusted alone (whoever can
/// write a NodeClaim's status could name any instance of the account): an instance it names
/// without Archer's tags for the claim is left running, with a warning. One already gone is not
/// an error.
pub(crate) async fn terminate_claim(ec2: &Client, cluster: &str, claim: &NodeClaim) -> Result<(), CloudError> {
    let recorded = claim.status.as_ref().and_then(|s| s.provider_id.as_deref()).and_then(instance_id).map(String::from);
    let resp = ec2
        .describe_instances()
        .filters(cluster_filter(cluster))
        .filters(Filter::builder().name(format!("tag:{NODECLAIM_TAG}")).values(claim.name()).build())
        .filters(live_filter())
        .send()
        .await
        .map_err(|e| api_error(sdk_error(e)))?;
    let ids: Vec<String> = resp.reservations().iter().flat_map(|r| r.instances()).filter_map(|i| i.instance_id().map(String::from)).collect();
    if let Some(id) = recorded.filter(|id| !ids.contains(id)) {
        tracing::warn!(claim = %claim.name(), instance = %id, "the claim's recorded instance is not live with Archer's tags for the claim: not terminated");
    }
    terminate(ec2, &ids).await
}

pub(crate) async fn terminate(ec2: &Client, ids: &[String]) -> Result<(), CloudError> {
    if ids.is_empty() {
        return Ok(());
    }
    match ec2.terminate_instances().set_instance_ids(Some(ids.to_vec())).send().await {
        Ok(_) => {
            tracing::info!(instances = ?ids, "instances terminated");
            Ok(())
        }
        Err(e) if e.as_service_error().and_then(aws_sdk_ec2::error::ProvideErrorMetadata::code).is_some_and(|c| c.starts_with("InvalidInstanceID")) => Ok(()),
        Err(e) => Err(api_error(sdk_error(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_round_trip() {
        let p = provider_id("us-east-1a", "i-0123456789abcdef0");
        assert_eq!(p, "aws:///us-east-1a/i-0123456789abcdef0");
        assert_eq!(instance_id(&p), Some("i-0123456789abcdef0"));
        assert_eq!(instance_id("kwok://node-1"), None);
    }
}
