//! A claim's launch: the launch template of its node class, image and node shape (created once,
//! found again by name), then one `CreateFleet` request of type `instant` offering EC2 every
//! compatible instance type in the claim's zone, with the claim's name as the client token.

use std::collections::BTreeMap;

use aws_sdk_ec2::types::{
    DefaultTargetCapacityType, FleetLaunchTemplateConfigRequest, FleetLaunchTemplateOverridesRequest, FleetLaunchTemplateSpecificationRequest, FleetOnDemandAllocationStrategy, FleetType,
    LaunchTemplateBlockDeviceMappingRequest, LaunchTemplateEbsBlockDeviceRequest, LaunchTemplateIamInstanceProfileSpecificationRequest,
    LaunchTemplateInstanceMetadataEndpointState, LaunchTemplateInstanceMetadataOptionsRequest, LaunchTemplateInstanceMetadataProtocolIpv6, LaunchTemplateInstanceNetworkInterfaceSpecificationRequest, LaunchTemplatesMonitoringRequest,
    LaunchTemplateHttpTokensState, OnDemandOptionsRequest, RequestLaunchTemplateData, ResourceType, SpotAllocationStrategy, SpotOptionsRequest, Tag, TagSpecification, TargetCapacitySpecificationRequest, VolumeType,
};
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::nodeclass::EC2NodeClassSpec;
use crate::offerings::alternatives;
use crate::resolve::Resolved;
use crate::{api_error, sdk_error, Aws, Class, CLUSTER_TAG, NODECLAIM_TAG, NODECLASS_TAG, NODEPOOL_TAG};
use archer_core::catalog::CapacityType;
use archer_core::labels;
use archer_core::packer::Offering;
use archer_cloud::{CloudError, Instance};
use archer_api::nodeclaim::NodeClaim;

/// Error codes meaning "this offering cannot be had now": try another (Karpenter's list).
const UNAVAILABLE_CODES: &[&str] = &["InsufficientInstanceCapacity", "MaxSpotInstanceCountExceeded", "VcpuLimitExceeded", "UnfulfillableCapacity", "Unsupported", "InsufficientFreeAddressesInSubnet", "ReservationCapacityExceeded"];

/// The node's shape a template carries: labels and taints the kubelet registers with. Labels the
/// kubelet or the instance sets itself (type, zone, architecture) are left out, so one template
/// serves every instance type of a fleet request.
fn kubelet_labels(claim: &NodeClaim) -> BTreeMap<String, String> {
    claim.spec.labels.iter().filter(|(k, _)| !offering_specific(k)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn offering_specific(key: &str) -> bool {
    key.contains("kubernetes.io/") || key.contains("k8s.io/") || key.starts_with("karpenter.k8s.aws/instance") || key == "archer.dev/instance-family"
}

fn kubelet_taints(claim: &NodeClaim) -> Vec<String> {
    let mut t: Vec<String> = claim.spec.taints.iter().chain(&claim.spec.startup_taints).map(|t| format!("{}={}:{}", t.key, t.value.clone().unwrap_or_default(), t.effect)).collect();
    // NoSchedule, as the kwok provider's nodes: with NoExecute the taint-eviction controller can
    // delete a pod kube-scheduler binds the moment Archer lifts the taint (issue #14).
    t.push(format!("{}=:NoSchedule", labels::UNREGISTERED_TAINT));
    t
}

/// The user data: for AL2023 (by alias or family) a nodeadm NodeConfig registering the node with
/// the pool's labels and taints and the unregistered taint, and the cluster section from the
/// settings when `clusterEndpoint` is set, followed by the node class's own user data (nodeadm
/// merges the documents, so without the settings the class supplies the cluster section);
/// otherwise the class's user data as given.
pub(crate) fn user_data(spec: &EC2NodeClassSpec, claim: &NodeClaim, settings: &archer_cloud::settings::AwsConfig) -> Option<String> {
    let al2023 = spec.ami_family.as_deref().is_some_and(|f| f.eq_ignore_ascii_case("al2023")) || spec.ami_selector_terms.iter().any(|t| t.alias.as_deref().is_some_and(|a| a.to_ascii_lowercase().starts_with("al2023")));
    if !al2023 {
        return spec.user_data.clone();
    }
    let node_labels: Vec<String> = kubelet_labels(claim).iter().map(|(k, v)| format!("{k}={v}")).collect();
    let flags = [format!("--node-labels={}", node_labels.join(",")), format!("--register-with-taints={}", kubelet_taints(claim).join(","))];
    let mut config = serde_json::json!({"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": {"kubelet": {"flags": flags}}});
    if let Some(endpoint) = &settings.cluster_endpoint {
        let mut cluster = serde_json::Map::new();
        cluster.insert("name".into(), settings.cluster_name.clone().into());
        cluster.insert("apiServerEndpoint".into(), endpoint.clone().into());
        if let Some(ca) = &settings.cluster_ca_bundle {
            cluster.insert("certificateAuthority".into(), ca.clone().into());
        }
        if let Some(cidr) = &settings.cluster_cidr {
            cluster.insert("cidr".into(), cidr.clone().into());
        }
        if let Some(spec) = config.get_mut("spec").and_then(serde_json::Value::as_object_mut) {
            spec.insert("cluster".into(), cluster.into());
        }
    }
    let boundary = "//ARCHER";
    let mut out = format!("MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"{boundary}\"\n\n--{boundary}\nContent-Type: application/node.eks.aws\n\n{config}\n");
    if let Some(u) = &spec.user_data {
        let kind = if u.trim_start().starts_with("#!") { "text/x-shellscript" } else { "application/node.eks.aws" };
        out.push_str(&format!("\n--{boundary}\nContent-Type: {kind}\n\n{u}\n"));
    }
    out.push_str(&format!("\n--{boundary}--\n"));
    Some(out)
}

/// The launch template's name: the cluster, the node class and a hash of everything the template
/// holds, so a change in any of them makes a new template and never edits one in use.
fn template_name(cluster: &str, class: &str, data: &str) -> String {
    let hash = hex::encode(Sha256::digest(data.as_bytes()).get(..8).unwrap_or_default());
    format!("archer/{cluster}/{class}/{hash}")
}

fn gib(quantity: &str) -> Option<i32> {
    let bytes = archer_core::quantity::value(quantity)?;
    i32::try_from((bytes + (1 << 30) - 1) >> 30).ok()
}

fn template_data(spec: &EC2NodeClassSpec, class: &Resolved, claim: &NodeClaim, settings: &archer_cloud::settings::AwsConfig) -> Result<RequestLaunchTemplateData, CloudError> {
    // The labels and taints become kubelet flags in the user data: held to Kubernetes' syntax
    // first, whatever the CRD let through (a space or newline would be another flag).
    archer_api::validation::node_shape(&claim.spec.labels, claim.spec.taints.iter().chain(&claim.spec.startup_taints).map(|t| (t.key.as_str(), t.value.as_deref(), t.effect.as_str()))).map_err(|e| api_error(format!("NodeClaim {} cannot be written into the node's user data: {e}", claim.name())))?;
    let ami = class.ami(&claim.spec.arch).ok_or_else(|| api_error(format!("EC2NodeClass resolved no {} image", claim.spec.arch)))?;
    let profile = class.instance_profile.clone().ok_or_else(|| api_error("EC2NodeClass has neither role nor instanceProfile"))?;
    let md = spec.metadata_options.clone().unwrap_or_default();
    let metadata = LaunchTemplateInstanceMetadataOptionsRequest::builder()
        .http_tokens(LaunchTemplateHttpTokensState::from(md.http_tokens.as_deref().unwrap_or("required")))
        .http_endpoint(LaunchTemplateInstanceMetadataEndpointState::from(md.http_endpoint.as_deref().unwrap_or("enabled")))
        .http_protocol_ipv6(LaunchTemplateInstanceMetadataProtocolIpv6::from(md.http_protocol_ipv6.as_deref().unwrap_or("disabled")))
        .http_put_response_hop_limit(md.http_put_response_hop_limit.unwrap_or(1))
        .build();
    let mut b = RequestLaunchTemplateData::builder()
        .image_id(&ami.id)
        .iam_instance_profile(LaunchTemplateIamInstanceProfileSpecificationRequest::builder().name(profile).build())
        .metadata_options(metadata)
        .monitoring(LaunchTemplatesMonitoringRequest::builder().enabled(spec.detailed_monitoring.unwrap_or(false)).build());
    let groups: Vec<String> = class.security_groups.iter().map(|g| g.id.clone()).collect();
    b = match spec.associate_public_ip_address {
        Some(public) => b.network_interfaces(LaunchTemplateInstanceNetworkInterfaceSpecificationRequest::builder().device_index(0).associate_public_ip_address(public).set_groups(Some(groups)).build()),
        None => b.set_security_group_ids(Some(groups)),
    };
    if let Some(u) = user_data(spec, claim, settings) {
        b = b.user_data(base64::engine::general_purpose::STANDARD.encode(u));
    }
    for m in &spec.block_device_mappings {
        let mut d = LaunchTemplateBlockDeviceMappingRequest::builder().device_name(&m.device_name);
        if let Some(e) = &m.ebs {
            let size = match e.volume_size.as_deref() {
                Some(q) => Some(gib(q).ok_or_else(|| api_error(format!("blockDeviceMappings {}: volumeSize {q:?} is not a size", m.device_name)))?),
                None => None,
            };
            d = d.ebs(
                LaunchTemplateEbsBlockDeviceRequest::builder()
                    .set_volume_size(size)
                    .set_volume_type(e.volume_type.as_deref().map(VolumeType::from))
                    .set_iops(e.iops)
                    .set_throughput(e.throughput)
                    .set_encrypted(e.encrypted)
                    .set_kms_key_id(e.kms_key_id.clone())
                    .set_delete_on_termination(Some(e.delete_on_termination.unwrap_or(true)))
                    .set_snapshot_id(e.snapshot_id.clone())
                    .build(),
            );
        }
        b = b.block_device_mappings(d.build());
    }
    Ok(b.build())
}

fn tags(aws: &Aws, class: &str, claim: Option<&NodeClaim>, extra: &BTreeMap<String, String>) -> Vec<Tag> {
    let mut t: BTreeMap<String, String> = extra.clone();
    t.insert(CLUSTER_TAG.into(), aws.settings.cluster_name.clone());
    t.insert(NODECLASS_TAG.into(), class.into());
    if let Some(c) = claim {
        t.insert(NODECLAIM_TAG.into(), c.name());
        t.insert(NODEPOOL_TAG.into(), c.spec.node_pool.clone());
        t.insert("Name".into(), c.name());
        t.insert(format!("kubernetes.io/cluster/{}", aws.settings.cluster_name), "owned".into());
    }
    t.into_iter().map(|(k, v)| Tag::builder().key(k).value(v).build()).collect()
}

/// The claim's launch template, created when no template of that name exists yet. Concurrent
/// launches of one shape wait for one lookup (and creation) instead of racing.
pub(crate) async fn ensure_template(aws: &Aws, class_name: &str, class: &Class, claim: &NodeClaim) -> Result<String, CloudError> {
    let data = template_data(&class.spec, &class.resolved, claim, &aws.settings)?;
    let name = template_name(&aws.settings.cluster_name, class_name, &format!("{data:?}"));
    aws.known_templates.try_get_with(name.clone(), create_template(aws, &name, class_name, class, data)).await.map_err(|e| api_error(e.to_string()))?;
    aws.templates.lock().unwrap_or_else(|e| e.into_inner()).insert(name.clone(), std::time::Instant::now());
    Ok(name)
}

async fn create_template(aws: &Aws, name: &str, class_name: &str, class: &Class, data: RequestLaunchTemplateData) -> Result<(), CloudError> {
    let found = aws.ec2.describe_launch_templates().launch_template_names(name).send().await;
    let exists = match found {
        Ok(r) => !r.launch_templates().is_empty(),
        Err(e) if e.as_service_error().and_then(aws_sdk_ec2::error::ProvideErrorMetadata::code).is_some_and(|c| c.contains("NotFound")) => false,
        Err(e) => return Err(api_error(sdk_error(e))),
    };
    if !exists {
        let spec = TagSpecification::builder().resource_type(ResourceType::LaunchTemplate).set_tags(Some(tags(aws, class_name, None, &class.spec.tags))).build();
        match aws.ec2.create_launch_template().launch_template_name(name).launch_template_data(data).tag_specifications(spec).send().await {
            Ok(_) => tracing::info!(template = %name, "launch template created"),
            // Made meanwhile by another launch of the same shape.
            Err(e) if e.as_service_error().and_then(aws_sdk_ec2::error::ProvideErrorMetadata::code).is_some_and(|c| c.contains("AlreadyExists")) => {}
            Err(e) => return Err(api_error(sdk_error(e))),
        }
    }
    Ok(())
}

/// Delete this cluster's launch templates no launch has used for `unused_for` (since this
/// process started, for those made before it) and created longer ago than that: a template still
/// needed is made again by the next launch. Returns the names deleted.
pub async fn delete_unused_templates(aws: &Aws, unused_for: std::time::Duration) -> Result<Vec<String>, CloudError> {
    let mut deleted = Vec::new();
    let mut pages = aws.ec2.describe_launch_templates().filters(aws_sdk_ec2::types::Filter::builder().name(format!("tag:{CLUSTER_TAG}")).values(&aws.settings.cluster_name).build()).into_paginator().send();
    let mut found = Vec::new();
    while let Some(page) = pages.next().await {
        found.extend(page.map_err(|e| api_error(sdk_error(e)))?.launch_templates().to_vec());
    }
    for t in found {
        let Some(name) = t.launch_template_name() else { continue };
        let recent = aws.templates.lock().unwrap_or_else(|e| e.into_inner()).get(name).is_some_and(|at| at.elapsed() < unused_for);
        let young = t.create_time().and_then(|c| std::time::SystemTime::try_from(*c).ok()).and_then(|c| c.elapsed().ok()).is_none_or(|age| age < unused_for);
        if recent || young {
            continue;
        }
        match aws.ec2.delete_launch_template().launch_template_name(name).send().await {
            Ok(_) => {
                tracing::info!(template = name, "unused launch template deleted");
                aws.templates.lock().unwrap_or_else(|e| e.into_inner()).remove(name);
                aws.known_templates.invalidate(name).await;
                deleted.push(name.to_string());
            }
            Err(e) => tracing::warn!(template = name, error = %sdk_error(e), "could not delete an unused launch template"),
        }
    }
    Ok(deleted)
}

/// The instance types offered for a claim (see [`alternatives`]).
fn instance_types(aws: &Aws, claim: &NodeClaim) -> Vec<String> {
    let all = aws.book.offerings();
    let Some(planned) = Offering::find(&all, &claim.spec.instance_type, &claim.spec.zone, &claim.spec.capacity_type) else {
        return vec![claim.spec.instance_type.clone()];
    };
    let reqs = claim.requirements();
    let min_values = claim.spec.requirements.iter().filter(|r| r.key == labels::INSTANCE_TYPE).filter_map(|r| r.min_values).max().unwrap_or(0) as usize;
    let allowed = |o: &Offering| {
        let l = |k: &str| match k {
            labels::INSTANCE_TYPE => Some(o.instance.name.clone()),
            "karpenter.k8s.aws/instance-family" | "archer.dev/instance-family" => Some(o.instance.family.clone()),
            "karpenter.k8s.aws/instance-category" => Some(o.instance.category.clone()),
            "karpenter.k8s.aws/instance-generation" => Some(o.instance.generation.to_string()),
            "karpenter.k8s.aws/instance-cpu" => Some(o.instance.vcpu.to_string()),
            "karpenter.k8s.aws/instance-memory" => Some(o.instance.memory_mib.to_string()),
            other => claim.spec.labels.get(other).cloned(),
        };
        reqs.as_ref().is_none_or(|r| r.matches(&l))
    };
    alternatives(&all, planned, &allowed, aws.settings.price_margin_percent / 100.0, min_values)
}

/// Launch the claim's instance: one instant fleet over its instance types and its zone's subnets.
pub(crate) async fn fleet(aws: &Aws, template: &str, class: &Resolved, claim: &NodeClaim) -> Result<Instance, CloudError> {
    let capacity = CapacityType::parse(&claim.spec.capacity_type).unwrap_or(CapacityType::OnDemand);
    let subnets = class.subnets_in(&claim.spec.zone);
    if subnets.is_empty() {
        return Err(CloudError::InsufficientCapacity { provider: crate::PROVIDER, instance_type: claim.spec.instance_type.clone(), zone: claim.spec.zone.clone(), message: "the node class has no subnet in this zone".into() });
    }
    let types = instance_types(aws, claim);
    let overrides: Vec<FleetLaunchTemplateOverridesRequest> = types
        .iter()
        .enumerate()
        .flat_map(|(i, t)| subnets.iter().map(move |s| FleetLaunchTemplateOverridesRequest::builder().instance_type(aws_sdk_ec2::types::InstanceType::from(t.as_str())).subnet_id(&s.id).priority(i as f64).build()))
        .collect();
    let config = FleetLaunchTemplateConfigRequest::builder()
        .launch_template_specification(FleetLaunchTemplateSpecificationRequest::builder().launch_template_name(template).version("$Latest").build())
        .set_overrides(Some(overrides))
        .build();
    let class_name = claim.spec.node_class_ref.as_ref().and_then(|r| r.get("name").cloned()).unwrap_or_default();
    let class_tags = tags(aws, &class_name, Some(claim), &BTreeMap::new());
    let tag_specs = [ResourceType::Instance, ResourceType::Volume, ResourceType::Fleet].map(|r| TagSpecification::builder().resource_type(r).set_tags(Some(class_tags.clone())).build());
    let (default_type, req) = match capacity {
        CapacityType::OnDemand => (DefaultTargetCapacityType::OnDemand, aws.ec2.create_fleet().on_demand_options(OnDemandOptionsRequest::builder().allocation_strategy(FleetOnDemandAllocationStrategy::LowestPrice).build())),
        CapacityType::Spot => (DefaultTargetCapacityType::Spot, aws.ec2.create_fleet().spot_options(SpotOptionsRequest::builder().allocation_strategy(SpotAllocationStrategy::PriceCapacityOptimized).build())),
    };
    let resp = req
        .r#type(FleetType::Instant)
        .client_token(claim.name())
        .target_capacity_specification(TargetCapacitySpecificationRequest::builder().total_target_capacity(1).default_target_capacity_type(default_type).build())
        .launch_template_configs(config)
        .set_tag_specifications(Some(tag_specs.to_vec()))
        .send()
        .await
        .map_err(|e| api_error(sdk_error(e)))?;
    let launched = resp.instances().iter().find_map(|i| i.instance_ids().first().cloned());
    let Some(id) = launched else {
        let errors: Vec<(String, String, Option<String>)> = resp
            .errors()
            .iter()
            .map(|e| (e.error_code().unwrap_or_default().to_string(), e.error_message().unwrap_or_default().to_string(), e.launch_template_and_overrides().and_then(|o| o.overrides()).and_then(|o| o.instance_type()).map(|t| t.as_str().to_string())))
            .collect();
        let message = errors.iter().map(|(c, m, _)| format!("{c}: {m}")).collect::<Vec<_>>().join("; ");
        if !errors.is_empty() && errors.iter().all(|(c, _, _)| UNAVAILABLE_CODES.contains(&c.as_str())) {
            // Every type offered failed for capacity: none of them in this zone for a while.
            let failed: Vec<String> = errors.iter().filter_map(|(_, _, t)| t.clone()).collect();
            let failed = if failed.is_empty() { types.clone() } else { failed };
            for t in &failed {
                aws.book.mark_unavailable((t.clone(), claim.spec.zone.clone(), capacity), &message);
            }
            return Err(CloudError::InsufficientCapacity { provider: crate::PROVIDER, instance_type: failed.join(","), zone: claim.spec.zone.clone(), message });
        }
        return Err(api_error(format!("CreateFleet launched nothing: {}", if message.is_empty() { "no error given".into() } else { message })));
    };
    crate::instances::describe(&aws.ec2, &id, &claim.name()).await
}

/// A hash of a node class's spec: a claim launched under another one has drifted.
pub(crate) fn class_hash(spec: &EC2NodeClassSpec) -> String {
    hex::encode(Sha256::digest(serde_json::to_string(spec).unwrap_or_default().as_bytes()).get(..8).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> NodeClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": "default-abc"},
            "spec": {"nodePool": "default", "instanceType": "m6g.large", "zone": "us-east-1a", "capacityType": "spot", "arch": "arm64", "os": "linux",
                     "labels": {"kubernetes.io/arch": "arm64", "node.kubernetes.io/instance-type": "m6g.large", "karpenter.sh/capacity-type": "spot", "team": "a",
                                "karpenter.k8s.aws/instance-family": "m6g", "archer.dev/nodepool": "default"},
                     "taints": [{"key": "team", "value": "a", "effect": "NoSchedule"}], "pricePerHour": 0.03}
        }))
        .expect("claim")
    }

    #[test]
    fn al2023_user_data_registers_with_the_pools_labels_and_taints() {
        let spec: EC2NodeClassSpec = serde_json::from_value(serde_json::json!({"amiSelectorTerms": [{"alias": "al2023@latest"}], "userData": "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec: {cluster: {name: demo}}"})).expect("spec");
        let none = archer_cloud::settings::AwsConfig::default();
        let u = user_data(&spec, &claim(), &none).expect("user data");
        assert!(u.contains("--node-labels=archer.dev/nodepool=default,karpenter.sh/capacity-type=spot,team=a\""), "{u}");
        assert!(u.contains("--register-with-taints=team=a:NoSchedule,karpenter.sh/unregistered=:NoSchedule"), "{u}");
        assert!(u.contains("spec: {cluster: {name: demo}}"), "the class's own part follows: {u}");
        assert!(!u.contains("instance-type") && !u.contains("instance-family"), "offering labels stay out of the template: {u}");
        // Other families get the class's user data as it is.
        let custom: EC2NodeClassSpec = serde_json::from_value(serde_json::json!({"amiSelectorTerms": [{"id": "ami-1"}], "userData": "#!/bin/bash\necho hi"})).expect("spec");
        assert_eq!(user_data(&custom, &claim(), &none).as_deref(), Some("#!/bin/bash\necho hi"));
        assert!(!u.contains("apiServerEndpoint"), "no cluster section without the settings");
        // With the cluster's endpoint, CA and CIDR in the settings, a node class needs no user data.
        let settings = archer_cloud::settings::AwsConfig { cluster_name: "demo".into(), cluster_endpoint: Some("https://ABC.gr7.us-east-1.eks.amazonaws.com".into()), cluster_ca_bundle: Some("LS0tLS1CRUdJTg==".into()), cluster_cidr: Some("10.100.0.0/16".into()), ..Default::default() };
        let bare: EC2NodeClassSpec = serde_json::from_value(serde_json::json!({"amiSelectorTerms": [{"alias": "al2023@latest"}]})).expect("spec");
        let u = user_data(&bare, &claim(), &settings).expect("user data");
        assert!(u.contains(r#""cluster":{"apiServerEndpoint":"https://ABC.gr7.us-east-1.eks.amazonaws.com","certificateAuthority":"LS0tLS1CRUdJTg==","cidr":"10.100.0.0/16","name":"demo"}"#), "{u}");
    }

    #[test]
    fn template_names_change_with_their_contents() {
        assert_eq!(template_name("demo", "default", "a"), template_name("demo", "default", "a"));
        assert_ne!(template_name("demo", "default", "a"), template_name("demo", "default", "b"));
        assert!(template_name("demo", "default", "a").starts_with("archer/demo/default/"));
        assert_eq!(gib("100Gi"), Some(100));
        assert_eq!(gib("20G"), Some(19));
    }
}
