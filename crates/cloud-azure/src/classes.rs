//! AKSNodeClasses resolved against Azure: the newest AKS node image of the class's family for
//! each architecture, and its subnet. Written into each class's status (`images`, and the
//! conditions `ImagesReady`, `SubnetsReady`, `Ready`), watched so that a new or changed class
//! opens its pools at once, and resolved again periodically (a newly published image).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::NodeSelectorRequirement;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::arm::Arm;
use crate::image;
use crate::nodeclass::{AKSNodeClass, AKSNodeClassSpec, AKSNodeClassStatus, ImageFamily, NodeImage};
use archer_cloud::settings::AzureConfig;

pub const ARCHES: [&str; 2] = ["amd64", "arm64"];

/// A node class and what it resolved to.
#[derive(Debug, Clone)]
pub struct Class {
    pub spec: AKSNodeClassSpec,
    /// The image id per architecture.
    pub images: BTreeMap<String, String>,
    pub subnet: Option<String>,
    /// Why an architecture has no image (`ImagesReady`) ...
    pub image_problems: Vec<String>,
    /// ... and why there is no subnet (`SubnetsReady`).
    pub subnet_problems: Vec<String>,
    /// When it was resolved.
    pub at: Instant,
}

impl Class {
    pub fn ready(&self) -> bool {
        self.image_problems.is_empty() && self.subnet_problems.is_empty()
    }

    /// Every problem, said in one line.
    pub fn problems(&self) -> String {
        self.image_problems.iter().chain(&self.subnet_problems).cloned().collect::<Vec<_>>().join("; ")
    }
}

/// Resolved classes by name.
#[derive(Default)]
pub struct Classes {
    all: ArcSwap<HashMap<String, Arc<Class>>>,
}

impl Classes {
    pub fn get(&self, name: &str) -> Option<Arc<Class>> {
        self.all.load().get(name).cloned()
    }

    pub(crate) fn insert(&self, name: String, class: Arc<Class>) {
        self.all.rcu(|all| {
            let mut all = (**all).clone();
            all.insert(name.clone(), class.clone());
            all
        });
    }

    /// Keep only the classes named, and those resolved after `since`.
    fn retain(&self, names: &[String], since: Instant) {
        self.all.rcu(|all| all.iter().filter(|(k, c)| names.contains(k) || c.at > since).map(|(k, v)| (k.clone(), v.clone())).collect::<HashMap<_, _>>());
    }

    fn remove(&self, name: &str) {
        self.all.rcu(|all| all.iter().filter(|(k, _)| k.as_str() != name).map(|(k, v)| (k.clone(), v.clone())).collect::<HashMap<_, _>>());
    }
}

/// Resolve a class: an image per architecture, a subnet.
pub async fn resolve(arm: &Arm, settings: &AzureConfig, spec: &AKSNodeClassSpec) -> Class {
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
    Class { spec: spec.clone(), images, subnet, image_problems, subnet_problems, at: Instant::now() }
}

/// Resolve a class, keep it, and write its status.
pub async fn refresh_one(arm: &Arm, settings: &AzureConfig, classes: &Classes, api: &Api<AKSNodeClass>, nc: &AKSNodeClass) {
    let class = Arc::new(resolve(arm, settings, &nc.spec).await);
    classes.insert(nc.name_any(), class.clone());
    if let Err(e) = write_status(api, nc, &class).await {
        tracing::warn!(nodeclass = %nc.name_any(), error = %e, "could not write the node class status");
    }
}

/// Resolve every class of the cluster; forget those gone.
pub async fn refresh_all(arm: &Arm, settings: &AzureConfig, classes: &Classes, kube: &Client) {
    let api: Api<AKSNodeClass> = Api::all(kube.clone());
    let listed_at = Instant::now();
    let list = match api.list(&ListParams::default()).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list AKSNodeClasses");
            return;
        }
    };
    for nc in &list.items {
        if classes.get(&nc.name_any()).is_some_and(|c| c.at > listed_at) {
            continue;
        }
        refresh_one(arm, settings, classes, &api, nc).await;
    }
    let names: Vec<String> = list.items.iter().map(|n| n.name_any()).collect();
    classes.retain(&names, listed_at);
}

/// Resolve a class as soon as it appears or its spec changes; forget one deleted.
pub async fn watch(arm: &Arm, settings: &AzureConfig, classes: &Classes, kube: Client) {
    use futures::StreamExt;
    use kube::runtime::{watcher, WatchStreamExt};
    let api: Api<AKSNodeClass> = Api::all(kube);
    let mut events = std::pin::pin!(watcher(api.clone(), watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(nc) | watcher::Event::InitApply(nc)) => {
                if classes.get(&nc.name_any()).is_some_and(|c| c.spec == nc.spec) {
                    continue;
                }
                tracing::info!(nodeclass = %nc.name_any(), "node class added or changed; resolving it");
                refresh_one(arm, settings, classes, &api, &nc).await;
            }
            Ok(watcher::Event::Delete(nc)) => {
                tracing::info!(nodeclass = %nc.name_any(), "node class deleted; its pools launch nothing");
                classes.remove(&nc.name_any());
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(e) => tracing::warn!(error = %e, "AKSNodeClass watch error; retrying"),
        }
    }
}

/// The status: the images, and the conditions (their transition times kept while unchanged);
/// written only when it changed.
async fn write_status(api: &Api<AKSNodeClass>, nc: &AKSNodeClass, class: &Class) -> Result<(), kube::Error> {
    let old = nc.status.clone().unwrap_or_default();
    let mut conditions = old.conditions.clone();
    let generation = nc.metadata.generation;
    let set = |conditions: &mut Vec<_>, kind: &str, problems: &[String], reason_ok: &str, reason_bad: &str| {
        let (status, reason, message) = if problems.is_empty() { ("True", reason_ok, String::new()) } else { ("False", reason_bad, problems.join("; ")) };
        archer_api::conditions::set(conditions, kind, status, reason, &message, generation);
    };
    set(&mut conditions, "ImagesReady", &class.image_problems, "ImagesResolved", "ImagesNotFound");
    set(&mut conditions, "SubnetsReady", &class.subnet_problems, "SubnetsReady", "SubnetNotSet");
    let all: Vec<String> = class.image_problems.iter().chain(&class.subnet_problems).cloned().collect();
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
    api.patch_status(&nc.name_any(), &PatchParams::default(), &Patch::Merge(serde_json::json!({"status": new}))).await.map(|_| ())
}
