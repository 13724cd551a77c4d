//! One pod's placement decision: its images inspected within a deadline, less what the safety
//! net learned about their digests, through the core's decision, with the digest pins where
//! the namespace asks for them. The webhook decides pods as they are created; the safety net's
//! gate controller decides the pods the webhook held behind `archer.dev/inspecting`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use crate::cluster::ClusterView;
use archer_core::patch;
use archer_core::placement::{self, Decision, ImageFinding, PlacementSettings};
use archer_core::policy::Policy;
use archer_registry::{Inspector, Keyring, RegistryError};

/// What a decision reads besides the pod.
pub struct Deciding<'a> {
    pub inspector: &'a Inspector,
    pub cluster: Option<&'a ClusterView>,
    pub base_keyring: &'a Keyring,
    pub settings: &'a PlacementSettings,
}

pub struct Decided {
    /// The decision, its patch with the digest pins.
    pub decision: Decision,
    /// Every image was inspected (only such decisions may be remembered).
    pub inspected: bool,
    /// An image's lookup ran out of time (gate mode holds such pods rather than fail open).
    pub timed_out: bool,
}

/// Decide `pod`, created in `namespace` under `policy`, by `deadline`.
pub async fn decide(d: &Deciding<'_>, pod: &Pod, namespace: &str, policy: &Policy, deadline: Instant) -> Decided {
    let images = placement::pod_images(pod);
    // Reading pull secrets counts against the same deadline; past it the mounted config is used.
    let keyring = match tokio::time::timeout_at(deadline, crate::cluster::pod_keyring(d.cluster, d.base_keyring, namespace, pod)).await {
        Ok(k) => k,
        Err(_) => d.base_keyring.clone(),
    };
    let results = d.inspector.inspect_all(&images, &keyring, deadline).await;
    let record = d.cluster.map(|c| c.safety_record().get()).unwrap_or_default();
    let now = crate::cluster::unix_now();
    let timed_out = results.iter().any(|r| r.as_ref().is_err_and(RegistryError::is_timeout));
    let mut digests = BTreeMap::new();
    let mut learned = Vec::new();
    let findings: Vec<ImageFinding> = images
        .iter()
        .zip(results)
        .map(|(image, r)| {
            let platforms = r.map(|found| {
                digests.insert(image.clone(), found.digest.clone());
                let (left, removed) = record.exclude(&found.digest, namespace, now, &found.platforms);
                if !removed.is_empty() {
                    learned.push(format!("archer excludes {} for image {image}: its binary ({}) failed there with an exec format error", removed.join(","), found.digest));
                }
                left
            });
            ImageFinding { image: image.clone(), platforms: platforms.map_err(|e| e.with_reason()) }
        })
        .collect();
    let inspected = findings.iter().all(|f| f.platforms.is_ok());
    let mut decision = placement::decide(pod, policy, &findings, d.settings);
    decision.warnings.extend(learned);
    if policy.pin_digests && policy.mode.enforces() && decision.denied.is_none() {
        decision.patch.extend(patch::pin_images(&mut pod.clone(), &digests));
    }
    Decided { decision, inspected, timed_out }
}
