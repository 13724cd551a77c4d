//! The safety net's decisions, pure: the record of image digests whose binary failed on an
//! architecture (learned from exec format errors, [`super::exec_format`]), what the webhook and
//! the extender subtract from an image's platforms because of it, and the rule for re-placing a
//! pod off that architecture: once per pod template and architecture per TTL, never a loop.
//!
//! The runtime (`archer::safety`) keeps the record in a ConfigMap shared by the replicas, watches
//! pods, posts Events, evicts; everything it decides is decided here.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::exec_format::ExecFormatError;
use crate::placement::recorded_platforms;
use crate::platform::PlatformSet;

/// The scheduling gate the webhook adds in gate mode while an image is not yet inspected.
pub const GATE: &str = "archer.dev/inspecting";
/// Longest image reference or template key the record keeps (longer ones are cut).
const MAX_TEXT: usize = 512;

/// What Archer has learned, as the ConfigMap holds it (`record.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SafetyRecord {
    #[serde(default)]
    pub broken: Vec<Broken>,
    #[serde(default)]
    pub replaced: Vec<Replaced>,
}

/// An image digest whose binary does not run on an architecture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Broken {
    pub digest: String,
    pub arch: String,
    /// The image as the failing pod named it.
    pub image: String,
    /// When it was learned, seconds since the Unix epoch.
    pub at: i64,
}

/// The pods of one template were re-placed off one architecture at `at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Replaced {
    pub template: String,
    pub arch: String,
    pub at: i64,
}

/// The record's bounds and the no-loop TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_broken: usize,
    pub max_replaced: usize,
    pub replacement_ttl_seconds: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_broken: 1000, max_replaced: 1000, replacement_ttl_seconds: 3600 }
    }
}

fn cut(s: &str) -> String {
    if s.len() <= MAX_TEXT {
        return s.to_string();
    }
    s[..s.floor_char_boundary(MAX_TEXT)].to_string()
}

impl SafetyRecord {
    /// The architectures `digest` was found not to run on.
    pub fn broken_arches(&self, digest: &str) -> BTreeSet<&str> {
        self.broken.iter().filter(|b| b.digest == digest).map(|b| b.arch.as_str()).collect()
    }

    /// `platforms` without the architectures found broken for `digest`, and those removed.
    pub fn exclude(&self, digest: &str, platforms: &PlatformSet) -> (PlatformSet, Vec<String>) {
        let broken = self.broken_arches(digest);
        if broken.is_empty() {
            return (platforms.clone(), Vec::new());
        }
        let removed = platforms.architectures().into_iter().filter(|a| broken.contains(a.as_str())).collect();
        (platforms.retain_architectures(|a| !broken.contains(a)), removed)
    }

    /// Whether an entry names `image` as a pod named it (the extender then checks its digest).
    pub fn mentions_image(&self, image: &str) -> bool {
        self.broken.iter().any(|b| b.image == image)
    }

    /// Remember a broken pair; false when it was known. When full the oldest entry leaves: a
    /// forgotten pair is learned again from the next failure, and the no-loop rule does not
    /// depend on it.
    pub fn learn(&mut self, mut entry: Broken, limits: &Limits) -> bool {
        if self.broken.iter().any(|b| b.digest == entry.digest && b.arch == entry.arch) {
            return false;
        }
        entry.image = cut(&entry.image);
        entry.digest = cut(&entry.digest);
        while self.broken.len() >= limits.max_broken.max(1) {
            if let Some(oldest) = self.broken.iter().enumerate().min_by_key(|(_, b)| b.at).map(|(i, _)| i) {
                self.broken.remove(oldest);
            }
        }
        self.broken.push(entry);
        true
    }

    /// The no-loop rule for one pod of `template` failing on `arch`, created at `created`
    /// (whole seconds, as the API keeps it). The first failure opens a re-placement, recorded
    /// at `now`; the pods of its round are each re-placed. A pod is of the round if it was
    /// created before the re-placement opened, or in the same second unless it was admitted
    /// with `arch` already excluded (`admitted_without_arch`): a replacement admitted without the
    /// architecture that fails on it anyway shows the exclusion did not hold, and a pod created
    /// later is a replacement. Neither is re-placed again within the TTL. A full record refuses
    /// new re-placements rather than forget one.
    pub fn replacement(&mut self, template: &str, arch: &str, created: i64, admitted_without_arch: bool, now: i64, limits: &Limits) -> Verdict {
        let ttl = limits.replacement_ttl_seconds;
        self.replaced.retain(|r| now - r.at < ttl);
        if let Some(open) = self.replaced.iter().find(|r| r.template == template && r.arch == arch) {
            let of_round = created < open.at || (created == open.at && !admitted_without_arch);
            return if of_round { Verdict::Replace } else { Verdict::Skip(Why::AlreadyReplaced) };
        }
        if self.replaced.len() >= limits.max_replaced.max(1) {
            return Verdict::Skip(Why::RecordFull);
        }
        self.replaced.push(Replaced { template: cut(template), arch: arch.to_string(), at: now });
        Verdict::Replace
    }
}

/// Whether a failing pod is re-placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Replace,
    Skip(Why),
}

/// Why a failing pod gets only the Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// No controller owns it: nothing would create its replacement.
    BarePod,
    /// The namespace says `archer.dev/replace-on-exec-format-error: "false"`.
    Disabled,
    /// Its template was re-placed off this architecture within the TTL, after it was created.
    AlreadyReplaced,
    RecordFull,
    /// Its images run on no architecture that has not failed: a replacement could go nowhere.
    NoArchitectureLeft,
}

impl Verdict {
    /// The `outcome` label of `archer_exec_format_replacements_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Replace => "evicted",
            Verdict::Skip(Why::BarePod) => "bare_pod",
            Verdict::Skip(Why::Disabled) => "disabled",
            Verdict::Skip(Why::AlreadyReplaced) => "already_replaced",
            Verdict::Skip(Why::RecordFull) => "record_full",
            Verdict::Skip(Why::NoArchitectureLeft) => "no_architecture_left",
        }
    }
}

/// The key of a pod's template: its namespace, its controller, and the revision the controller
/// stamps on it (`pod-template-hash`, `controller-revision-hash`, a Job's controller uid), else
/// the controller's uid. `None` for a pod no controller owns.
pub fn template_key(pod: &Pod) -> Option<String> {
    let owner = pod.metadata.owner_references.as_ref()?.iter().find(|o| o.controller == Some(true))?;
    let labels = pod.metadata.labels.as_ref();
    let revision = ["pod-template-hash", "controller-revision-hash", "batch.kubernetes.io/controller-uid", "controller-uid"]
        .iter()
        .find_map(|k| labels.and_then(|l| l.get(*k)))
        .unwrap_or(&owner.uid);
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
    Some(format!("{namespace}/{}/{}/{revision}", owner.kind, owner.name))
}

/// What one failing pod teaches and what is done about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Pairs learned now (already-known ones are not repeated).
    pub learned: Vec<Broken>,
    pub verdict: Verdict,
}

/// A pod (admitted by Archer) on a node of `arch` reports `errors`, each with the digest the
/// runtime resolved (errors without one are skipped by the caller's resolution). Learn the
/// broken pairs into `record` and decide whether the pod is re-placed.
pub fn on_exec_format_errors(pod: &Pod, arch: &str, errors: &[ExecFormatError], replace_enabled: bool, record: &mut SafetyRecord, now: i64, limits: &Limits) -> Finding {
    let mut learned = Vec::new();
    for e in errors {
        let Some(digest) = e.digest.as_deref() else { continue };
        let entry = Broken { digest: digest.to_string(), arch: arch.to_string(), image: e.image.clone(), at: now };
        if record.learn(entry.clone(), limits) {
            learned.push(entry);
        }
    }
    let verdict = replacement_verdict(pod, arch, errors, replace_enabled, record, now, limits);
    Finding { learned, verdict }
}

fn replacement_verdict(pod: &Pod, arch: &str, errors: &[ExecFormatError], replace_enabled: bool, record: &mut SafetyRecord, now: i64, limits: &Limits) -> Verdict {
    let Some(template) = template_key(pod) else { return Verdict::Skip(Why::BarePod) };
    if !replace_enabled {
        return Verdict::Skip(Why::Disabled);
    }
    // The webhook's record of the pod's platforms, less every architecture its failing images
    // are known not to run on.
    let recorded = recorded_platforms(pod);
    let admitted_without_arch = recorded.as_ref().is_some_and(|p| !p.architectures().contains(arch));
    if let Some(platforms) = recorded {
        let mut left = platforms.architectures();
        left.remove(arch);
        for digest in errors.iter().filter_map(|e| e.digest.as_deref()) {
            for broken in record.broken_arches(digest) {
                left.remove(broken);
            }
        }
        if left.is_empty() {
            return Verdict::Skip(Why::NoArchitectureLeft);
        }
    }
    let created = pod.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0.as_second());
    record.replacement(&template, arch, created, admitted_without_arch, now, limits)
}

#[cfg(test)]
mod tests;
