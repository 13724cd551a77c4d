//! AKSNodeClasses resolved against Azure: the newest AKS node image of the class's family for
//! each architecture, and its subnet, written into each class's status (`images`, and the
//! conditions `ImagesReady`, `SubnetsReady`, `Ready`). Kept current by
//! [`archer_cloud_classes`], as EC2NodeClasses are.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeSelectorRequirement;
use kube::api::Api;
use kube::ResourceExt;

use crate::arm::Arm;
use crate::image;
use crate::nodeclass::{AKSNodeClass, AKSNodeClassSpec, AKSNodeClassStatus, ImageFamily, NodeImage};
use archer_cloud_classes::ResolvedClass;
use archer_cloud::settings::AzureConfig;

const ARCHES: [&str; 2] = ["amd64", "arm64"];

/// What a node class resolved to.
#[derive(Debug, Clone)]
pub struct Resolution {
    /// The image id per architecture.
    pub images: BTreeMap<String, String>,
    pub subnet: Option<String>,
    /// Why an architecture has no image (`ImagesReady`) ...
    pub image_problems: Vec<String>,
    /// ... and why there is no subnet (`SubnetsReady`).
    pub subnet_problems: Vec<String>,
}

impl Resolution {
    pub fn ready(&self) -> bool {
        self.image_problems.is_empty() && self.subnet_problems.is_empty()
    }

    /// Every problem, said in one line.
    pub fn problems(&self) -> String {
        self.all_problems().join("; ")
    }

    pub(crate) fn all_problems(&self) -> Vec<String> {
        self.image_problems.iter().chain(&self.subnet_problems).cloned().collect()
    }
}

/// A node class and what it resolved to.
pub(crate) type Class = ResolvedClass<AKSNodeClassSpec, Resolution>;

/// Resolve a class: an image per architecture, a subnet.
pub async fn resolve(arm: &Arm, settings: &AzureConfig, spec: &AKSNodeClassSpec) -> Resolution {
    let family = spec.image_family.unwrap_or(ImageFamily::Ubuntu);
    let mut images = BTreeMap::new();
    let mut image_problems = Vec::new();
    for arch in ARCHES {
        let (gallery, definition) = image::definition(family, arch);
        match image::newest(arm, &settings.subscription_id, &settings.location, gallery, definition).await {
            Ok(id) => drop(images.insert(arch.to_string(), id)),
            Err(e) => image_problems.push(format!("no {arch} image of {definition}: {e}")),
        }
    }
    let subnet = spec.vnet_subnet_id.clone().or_else(|| settings.subnet_id.clone());
    let subnet_problems = if subnet.is_none() { vec!["no subnet: set the class's vnetSubnetID or provisioner.azure.subnetID".to_string()] } else { Vec::new() };
    Resolution { images, subnet, image_problems, subnet_problems }
}

/// The status: the images, and the conditions (their transition times kept while unchanged);
/// written only when it changed.
pub(crate) async fn write_status(api: &Api<AKSNodeClass>, nc: &AKSNodeClass, class: &Resolution) -> Result<(), kube::Error> {
    let old = nc.status.clone().unwrap_or_default();
    let mut conditions = old.conditions.clone();
    let generation = nc.metadata.generation;
    let set = |conditions: &mut Vec<_>, kind: &str, problems: &[String], reason_ok: &str, reason_bad: &str| {
        let (status, reason, message) = if problems.is_empty() { ("True", reason_ok, String::new()) } else { ("False", reason_bad, problems.join("; ")) };
        archer_api::conditions::set(conditions, kind, status, reason, &message, generation);
    };
    set(&mut conditions, "ImagesReady", &class.image_problems, "ImagesResolved", "ImagesNotFound");
    set(&mut conditions, "SubnetsReady", &class.subnet_problems, "SubnetsReady", "SubnetNotSet");
    let all = class.all_problems();
    set(&mut conditions, "Ready", &all, "Ready", "NotReady");
    let images = class
        .images
        .iter()
        .map(|(arch, id)| NodeImage { id: id.clone(), requirements: vec![NodeSelectorRequirement { key: "kubernetes.io/arch".into(), operator: "In".into(), values: Some(vec![arch.clone()]) }] })
        .collect();
    let new = AKSNodeClassStatus { conditions, images, kubernetes_version: old.kubernetes_version.clone() };
    if new == old {
        return Ok(());
    }
    let (params, patch) = archer_api::apply::status::<AKSNodeClass>(&nc.name_any(), nc.metadata.resource_version.as_deref(), &new);
    api.patch_status(&nc.name_any(), &params, &patch).await.map(|_| ())
}
