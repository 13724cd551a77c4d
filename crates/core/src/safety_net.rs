//! The safety net's decisions, pure: the record of image digests whose binary failed on an
//! architecture (learned from exec format errors, [`super::exec_format`]), what the webhook and
//! the extender subtract from an image's platforms because of it, and the rule for re-placing a
//! pod off that architecture: once per pod template and architecture per TTL, never a loop.
//!
//! Shared clusters: a tenant controls its pods' images, commands, termination messages, labels
//! and owners. So evidence counts only for the namespace it was seen in ([`Scope`]), unless
//! Archer verified it from the image itself (the entrypoint's binary is for another
//! architecture); every bound of the record has a per-namespace share; and the record is kept
//! under a byte size that fits its ConfigMap ([`SafetyRecord::fit`]).
//!
//! The runtime (`archer::safety`) keeps the record in a ConfigMap shared by the replicas, watches
//! pods, posts Events, evicts; everything it decides is decided here.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::exec_format::{Evidence, ExecFormatError};
use crate::placement::recorded_platforms;
use crate::platform::PlatformSet;

/// The scheduling gate the webhook adds in gate mode while an image is not yet inspected.
pub const GATE: &str = "archer.dev/inspecting";
/// Karpenter's annotation: a pod carrying it (`"true"`) is never disrupted; the safety net does
/// not evict it either.
pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// Longest image reference or template key the record keeps (longer ones are cut).
const MAX_TEXT: usize = 512;
/// The most bytes `record.json` may take: the API server refuses a ConfigMap whose data passes
/// 1 MiB (1,048,576 bytes), and this leaves room for the object's metadata.
pub const MAX_RECORD_BYTES: usize = 900 * 1024;

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
    /// The namespace of the pod that failed: the entry counts against its share, and holds only
    /// there unless `verified`. (An entry written before namespaces were kept has none, and
    /// holds nowhere.)
    #[serde(default)]
    pub namespace: String,
    /// Archer read the image's entrypoint binary and it is not for `arch`: the entry holds for
    /// every namespace.
    #[serde(default)]
    pub verified: bool,
    /// When it stops holding, seconds since the Unix epoch (0: an entry from before expiry was
    /// kept, which holds until the record is next written).
    #[serde(default)]
    pub expires: i64,
}

impl Broken {
    /// Whether it holds for a pod in `namespace` at `now`.
    fn holds(&self, namespace: &str, now: i64) -> bool {
        (self.verified || (!self.namespace.is_empty() && self.namespace == namespace)) && !self.expired(now)
    }

    fn expired(&self, now: i64) -> bool {
        self.expires != 0 && self.expires <= now
    }
}

/// The pods of one template were re-placed off one architecture at `at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Replaced {
    pub template: String,
    pub arch: String,
    pub at: i64,
    /// The template's namespace, whose share the entry counts against.
    #[serde(default)]
    pub namespace: String,
}

/// The record's bounds and TTLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Broken pairs kept at most, all namespaces together...
    pub max_broken: usize,
    /// ...and learned from one namespace's pods.
    pub max_broken_per_namespace: usize,
    /// Open re-placements kept at most, all namespaces together...
    pub max_replaced: usize,
    /// ...and of one namespace's templates.
    pub max_replaced_per_namespace: usize,
    pub replacement_ttl_seconds: i64,
    /// How long a broken pair holds after it was learned.
    pub broken_ttl_seconds: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_broken: 1000, max_broken_per_namespace: 50, max_replaced: 1000, max_replaced_per_namespace: 50, replacement_ttl_seconds: 3600, broken_ttl_seconds: 7 * 24 * 3600 }
    }
}

fn cut(s: &str) -> String {
    if s.len() <= MAX_TEXT {
        return s.to_string();
    }
    s[..s.floor_char_boundary(MAX_TEXT)].to_string()
}

/// Where a piece of evidence holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Only for pods in the namespace it was seen in, and why no further.
    Namespace(Unverified),
    /// For every namespace: Archer verified it from the image itself.
    Cluster,
}

/// Why a detection holds only in its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unverified {
    /// The message is the container's own (its termination message or log tail).
    ContainersOwnMessage,
    /// The pod sets the container's `command` or `args`: the binary that failed is its choice.
    CommandOverridden,
    /// The pod mounts a volume over the image's entrypoint.
    VolumeOverEntrypoint,
    /// Archer could not read the image's entrypoint binary (or did not try).
    NotVerified,
    /// The entrypoint's binary is for the node's architecture after all.
    BinaryMatches,
}

impl Scope {
    /// The `scope` label of `archer_exec_format_learned_total` and the Event's words.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Cluster => "cluster",
            Scope::Namespace(_) => "namespace",
        }
    }

    pub fn why(self) -> &'static str {
        match self {
            Scope::Cluster => "verified from the image: its entrypoint's binary is for another architecture",
            Scope::Namespace(Unverified::ContainersOwnMessage) => "the message is the container's own output",
            Scope::Namespace(Unverified::CommandOverridden) => "the pod overrides the image's command",
            Scope::Namespace(Unverified::VolumeOverEntrypoint) => "the pod mounts a volume over the image's entrypoint",
            Scope::Namespace(Unverified::NotVerified) => "the image's entrypoint binary could not be read",
            Scope::Namespace(Unverified::BinaryMatches) => "the image's entrypoint binary is for this architecture",
        }
    }
}

/// What Archer read in the image for a failing container: the path its entrypoint resolves to
/// (symlinks and a `#!` interpreter followed) and the architecture of that ELF binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entrypoint {
    pub path: String,
    pub arch: String,
}

fn container_of<'a>(pod: &'a Pod, name: &str) -> Option<&'a k8s_openapi::api::core::v1::Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name)
}

/// Why a detection cannot hold beyond its namespace whatever the image holds, or `None` when
/// reading the image's entrypoint may make it cluster-wide (so only then is the image read).
pub fn unverifiable(pod: &Pod, error: &ExecFormatError) -> Option<Unverified> {
    // A container's own message never widens; a quick exit's log may, by the image's binary.
    if error.evidence == Evidence::Container {
        return Some(Unverified::ContainersOwnMessage);
    }
    let overridden = container_of(pod, &error.container).is_none_or(|c| c.command.as_ref().is_some_and(|v| !v.is_empty()) || c.args.as_ref().is_some_and(|v| !v.is_empty()));
    overridden.then_some(Unverified::CommandOverridden)
}

/// Where the evidence of `error` (on a node of `arch`) holds, given what was read of the image's
/// entrypoint.
pub fn scope(pod: &Pod, error: &ExecFormatError, arch: &str, entrypoint: Option<&Entrypoint>) -> Scope {
    if let Some(why) = unverifiable(pod, error) {
        return Scope::Namespace(why);
    }
    let Some(found) = entrypoint else { return Scope::Namespace(Unverified::NotVerified) };
    let covered = |mount: &str| {
        let mount = mount.trim_end_matches('/');
        mount.is_empty() || found.path == mount || found.path.strip_prefix(mount).is_some_and(|rest| rest.starts_with('/'))
    };
    let mounts = container_of(pod, &error.container).and_then(|c| c.volume_mounts.as_ref());
    if mounts.iter().flat_map(|m| m.iter()).any(|m| covered(&m.mount_path)) {
        return Scope::Namespace(Unverified::VolumeOverEntrypoint);
    }
    if runs_on(&found.arch, arch) {
        return Scope::Namespace(Unverified::BinaryMatches);
    }
    Scope::Cluster
}

/// Whether a binary for `binary` may run on a node of `node`: 32-bit x86 on amd64 and 32-bit Arm
/// on arm64 depend on the node's kernel and CPU, not on the image, so they never verify a failure.
fn runs_on(binary: &str, node: &str) -> bool {
    binary == node || (node == "amd64" && binary == "386") || (node == "arm64" && binary == "arm")
}

/// The namespace holding the most entries of `items` (by `namespace_of`), and its oldest entry's
/// index; ties go to the namespace whose oldest entry is oldest.
fn largest_share<T>(items: &[T], namespace_of: impl Fn(&T) -> &str, at: impl Fn(&T) -> i64) -> Option<(String, usize)> {
    let mut counts: BTreeMap<&str, (usize, i64, usize)> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let e = counts.entry(namespace_of(item)).or_insert((0, i64::MAX, i));
        e.0 += 1;
        if at(item) < e.1 {
            e.1 = at(item);
            e.2 = i;
        }
    }
    counts.into_iter().max_by(|a, b| (a.1 .0, std::cmp::Reverse(a.1 .1)).cmp(&(b.1 .0, std::cmp::Reverse(b.1 .1)))).map(|(ns, (_, _, i))| (ns.to_string(), i))
}

fn oldest_of<T>(items: &[T], pick: impl Fn(&T) -> bool, at: impl Fn(&T) -> i64) -> Option<usize> {
    items.iter().enumerate().filter(|(_, t)| pick(t)).min_by_key(|(_, t)| at(t)).map(|(i, _)| i)
}

impl SafetyRecord {
    /// The architectures `digest` was found not to run on, for pods in `namespace` at `now`.
    fn broken_arches(&self, digest: &str, namespace: &str, now: i64) -> BTreeSet<&str> {
        self.broken.iter().filter(|b| b.digest == digest && b.holds(namespace, now)).map(|b| b.arch.as_str()).collect()
    }

    /// `platforms` without the architectures found broken for `digest` (for pods in `namespace`
    /// at `now`), and those removed.
    pub fn exclude(&self, digest: &str, namespace: &str, now: i64, platforms: &PlatformSet) -> (PlatformSet, Vec<String>) {
        let broken = self.broken_arches(digest, namespace, now);
        if broken.is_empty() {
            return (platforms.clone(), Vec::new());
        }
        let removed = platforms.architectures().into_iter().filter(|a| broken.contains(a.as_str())).collect();
        (platforms.retain_architectures(|a| !broken.contains(a)), removed)
    }

    /// `platforms` without the architectures found broken for any of `digests` (the digests a
    /// pod's images resolved to, for pods in `namespace` at `now`).
    pub fn exclude_all<I: IntoIterator<Item = String>>(&self, digests: I, namespace: &str, now: i64, platforms: &PlatformSet) -> PlatformSet {
        let mut broken = BTreeSet::new();
        for digest in digests {
            broken.extend(self.broken_arches(&digest, namespace, now));
        }
        platforms.retain_architectures(|a| !broken.contains(a))
    }

    /// Whether an entry that holds in `namespace` names `image` as a pod named it (the extender
    /// then checks its digest).
    pub fn mentions_image(&self, image: &str, namespace: &str, now: i64) -> bool {
        self.broken.iter().any(|b| b.image == image && b.holds(namespace, now))
    }

    /// Remember a broken pair; false when it was known. A namespace at its share loses its own
    /// oldest entry; a full record loses the oldest entry of the namespace holding the most. So
    /// no namespace's pods keep another's from being learned. A forgotten pair is learned again
    /// from the next failure, and the no-loop rule does not depend on it.
    pub fn learn(&mut self, mut entry: Broken, limits: &Limits) -> bool {
        let now = entry.at;
        self.broken.retain(|b| !b.expired(now));
        let known = |b: &Broken| b.digest == entry.digest && b.arch == entry.arch && (b.verified || (!entry.verified && b.namespace == entry.namespace));
        if self.broken.iter().any(known) {
            return false;
        }
        if entry.verified {
            // A verified pair holds everywhere: the namespace's own entries for it are redundant.
            self.broken.retain(|b| !(b.digest == entry.digest && b.arch == entry.arch));
        }
        entry.image = cut(&entry.image);
        entry.digest = cut(&entry.digest);
        entry.namespace = cut(&entry.namespace);
        entry.expires = now.saturating_add(limits.broken_ttl_seconds.max(1));
        let mine = self.broken.iter().filter(|b| b.namespace == entry.namespace).count();
        if mine >= limits.max_broken_per_namespace.max(1) {
            if let Some(i) = oldest_of(&self.broken, |b| b.namespace == entry.namespace, |b| b.at) {
                self.broken.remove(i);
            }
        }
        while self.broken.len() >= limits.max_broken.max(1) {
            let Some((_, i)) = largest_share(&self.broken, |b| &b.namespace, |b| b.at) else { break };
            self.broken.remove(i);
        }
        self.broken.push(entry);
        true
    }

    /// The no-loop rule for one pod of `template` (in `namespace`) failing on `arch`, created at
    /// `created` (whole seconds, as the API keeps it). The first failure opens a re-placement,
    /// recorded at `now`; the pods of its round are each re-placed. A pod is of the round if it
    /// was created before the re-placement opened, or in the same second unless it was admitted
    /// with `arch` already excluded (`admitted_without_arch`): a replacement admitted without the
    /// architecture that fails on it anyway shows the exclusion did not hold, and a pod created
    /// later is a replacement. Neither is re-placed again within the TTL.
    ///
    /// A namespace at its share is refused new re-placements rather than forget one of its own.
    /// When the whole record is full, a namespace under its share takes the place of the oldest
    /// re-placement of the namespace holding the most (whose templates may then be re-placed
    /// once more within the TTL: only that namespace pays for its flood).
    #[allow(clippy::too_many_arguments, reason = "the rule's inputs, each a plain value")]
    pub fn replacement(&mut self, template: &str, namespace: &str, arch: &str, created: i64, admitted_without_arch: bool, now: i64, limits: &Limits) -> Verdict {
        let ttl = limits.replacement_ttl_seconds;
        self.replaced.retain(|r| now - r.at < ttl);
        let template = cut(template);
        if let Some(open) = self.replaced.iter().find(|r| r.template == template && r.arch == arch) {
            let of_round = created < open.at || (created == open.at && !admitted_without_arch);
            return if of_round { Verdict::Replace } else { Verdict::Skip(Why::AlreadyReplaced) };
        }
        let namespace = cut(namespace);
        if self.replaced.iter().filter(|r| r.namespace == namespace).count() >= limits.max_replaced_per_namespace.max(1) {
            return Verdict::Skip(Why::RecordFull);
        }
        while self.replaced.len() >= limits.max_replaced.max(1) {
            match largest_share(&self.replaced, |r| &r.namespace, |r| r.at) {
                Some((largest, i)) if largest != namespace => {
                    self.replaced.remove(i);
                }
                _ => return Verdict::Skip(Why::RecordFull),
            }
        }
        self.replaced.push(Replaced { template, arch: arch.to_string(), at: now, namespace });
        Verdict::Replace
    }

    /// Keep the record within `max_bytes` of JSON: while it is larger, the oldest entry of the
    /// namespace holding the most goes (broken pairs and re-placements alike). Checked before
    /// every write, so the ConfigMap never passes the API server's size limit whatever its
    /// entries hold (escapes included). Returns how many entries went.
    pub fn fit(&mut self, max_bytes: usize) -> usize {
        let mut broken: Vec<usize> = self.broken.iter().map(json_len).collect();
        let mut replaced: Vec<usize> = self.replaced.iter().map(json_len).collect();
        // `{"broken":[` `],"replaced":[` `]}` and the commas between entries.
        let total = |b: &[usize], r: &[usize]| 27 + b.iter().sum::<usize>() + r.iter().sum::<usize>() + b.len().saturating_sub(1) + r.len().saturating_sub(1);
        let mut dropped = 0;
        while total(&broken, &replaced) > max_bytes && !(broken.is_empty() && replaced.is_empty()) {
            let mut namespaces: BTreeMap<&str, usize> = BTreeMap::new();
            for ns in self.broken.iter().map(|b| b.namespace.as_str()).chain(self.replaced.iter().map(|r| r.namespace.as_str())) {
                *namespaces.entry(ns).or_default() += 1;
            }
            let Some(largest) = namespaces.into_iter().max_by_key(|(_, n)| *n).map(|(ns, _)| ns.to_string()) else { break };
            let b = oldest_of(&self.broken, |b| b.namespace == largest, |b| b.at);
            let r = oldest_of(&self.replaced, |r| r.namespace == largest, |r| r.at);
            let at = |b: Option<&Broken>, r: Option<&Replaced>| (b.map(|b| b.at), r.map(|r| r.at));
            let replaced_older = matches!(at(b.and_then(|i| self.broken.get(i)), r.and_then(|i| self.replaced.get(i))), (Some(b), Some(r)) if r < b);
            match (b, r) {
                (Some(_), Some(r)) if replaced_older => {
                    self.replaced.remove(r);
                    replaced.remove(r);
                }
                (Some(b), _) => {
                    self.broken.remove(b);
                    broken.remove(b);
                }
                (None, Some(r)) => {
                    self.replaced.remove(r);
                    replaced.remove(r);
                }
                (None, None) => break,
            }
            dropped += 1;
        }
        dropped
    }
}

/// The JSON size of one entry, as `serde_json` writes it.
fn json_len<T: Serialize>(v: &T) -> usize {
    serde_json::to_vec(v).map_or(usize::MAX / 4, |v| v.len())
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
    /// It carries `karpenter.sh/do-not-disrupt: "true"`.
    DoNotDisrupt,
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
            Verdict::Skip(Why::DoNotDisrupt) => "do_not_disrupt",
        }
    }
}

/// The key of a pod's template: its namespace, its controller, and the revision the controller
/// stamps on it (`pod-template-hash`, `controller-revision-hash`, a Job's controller uid), else
/// the controller's uid. `None` for a pod no controller owns.
fn template_key(pod: &Pod) -> Option<String> {
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

/// One failing container's error and where its evidence holds ([`scope`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detection {
    pub error: ExecFormatError,
    pub scope: Scope,
}

/// A pod (admitted by Archer) on a node of `arch` reports `detections`, each with the digest the
/// runtime resolved (errors without one are skipped by the caller's resolution). Learn the
/// broken pairs into `record` (for the pod's namespace, or for all where verified) and decide
/// whether the pod is re-placed.
pub fn on_exec_format_errors(pod: &Pod, arch: &str, detections: &[Detection], replace_enabled: bool, record: &mut SafetyRecord, now: i64, limits: &Limits) -> Finding {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
    let mut learned = Vec::new();
    for d in detections {
        let Some(digest) = d.error.digest.as_deref() else { continue };
        let entry = Broken { digest: digest.to_string(), arch: arch.to_string(), image: d.error.image.clone(), at: now, namespace: namespace.to_string(), verified: d.scope == Scope::Cluster, expires: 0 };
        if record.learn(entry, limits) {
            if let Some(kept) = record.broken.last() {
                learned.push(kept.clone());
            }
        }
    }
    let verdict = replacement_verdict(pod, arch, detections, replace_enabled, record, now, limits);
    Finding { learned, verdict }
}

fn replacement_verdict(pod: &Pod, arch: &str, detections: &[Detection], replace_enabled: bool, record: &mut SafetyRecord, now: i64, limits: &Limits) -> Verdict {
    let Some(template) = template_key(pod) else { return Verdict::Skip(Why::BarePod) };
    if !replace_enabled {
        return Verdict::Skip(Why::Disabled);
    }
    if pod.metadata.annotations.as_ref().and_then(|a| a.get(DO_NOT_DISRUPT)).is_some_and(|v| v == "true") {
        return Verdict::Skip(Why::DoNotDisrupt);
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
    // The webhook's record of the pod's platforms, less every architecture its failing images
    // are known not to run on (in this namespace).
    let recorded = recorded_platforms(pod);
    let admitted_without_arch = recorded.as_ref().is_some_and(|p| !p.architectures().contains(arch));
    if let Some(platforms) = recorded {
        let mut left = platforms.architectures();
        left.remove(arch);
        for digest in detections.iter().filter_map(|d| d.error.digest.as_deref()) {
            for broken in record.broken_arches(digest, namespace, now) {
                left.remove(broken);
            }
        }
        if left.is_empty() {
            return Verdict::Skip(Why::NoArchitectureLeft);
        }
    }
    let created = pod.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0.as_second());
    record.replacement(&template, namespace, arch, created, admitted_without_arch, now, limits)
}

#[cfg(test)]
mod tests;
