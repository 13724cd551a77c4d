//! Which architecture an image's program is built for, read from the image itself: the
//! platform's manifest and config, then its layers, streamed and bounded, to the file the
//! container would execute (following `PATH`, links and one `#!` interpreter), and that file's
//! ELF header.
//!
//! This is evidence a tenant cannot forge: an "exec format error" that a pod reports (its
//! termination message, its logs, a command it overrode) says something about that pod, while
//! the ELF machine of the image's own entrypoint says something about every pod of the digest.
//! Every byte that decides the answer is digest-checked: the manifest against the digest asked
//! for, the config and each layer read against the manifest's descriptors (a layer is read to its
//! end for that, though its tar is parsed only to its end-of-archive). A bound reached answers
//! `Undetermined`, never a partial guess.

mod elf;
mod layers;
mod resolve;

use std::io;
use std::time::Duration;

use futures::StreamExt;
use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest, Os};
use serde::Deserialize;
use tokio::time::Instant;
use tokio_util::io::{StreamReader, SyncIoBridge};

use crate::client::{verify_digest, ReadAllowance, RegistryClient, Repo, MANIFEST_ACCEPT};
use crate::credentials::Credential;
use crate::error::RegistryError;
use crate::reference::ImageRef;
use layers::{scan_layer, LayerBudget, LayerEnd, Wanted};
use resolve::{resolve, Answers, Program, Step, DEFAULT_PATH};

/// Memory one check holds while it reads, besides the manifests (charged as they are read):
/// the HTTP chunk in hand, the inflater's window and state, a tar header, a GNU or PAX record of
/// at most 64 KiB, and the heads of the files it looks for.
const WORKING_SET_BYTES: usize = 1024 * 1024;
const ATTESTATION_ANNOTATION: &str = "vnd.docker.reference.type";
const CONFIG_ACCEPT: &str = "application/vnd.oci.image.config.v1+json, application/vnd.docker.container.image.v1+json, */*";

/// The bounds of one check. Reaching any of them answers `Undetermined`.
#[derive(Debug, Clone)]
pub struct EntrypointLimits {
    /// Registry bytes read in all: manifests, config and every layer each pass reads.
    pub total_bytes: u64,
    /// A layer's compressed size (from its descriptor, checked before it is fetched).
    pub layer_bytes: u64,
    /// Uncompressed tar bytes parsed, all layers and passes together.
    pub uncompressed_bytes: u64,
    /// Tar entries parsed, all layers and passes together.
    pub entries: u64,
    /// Layers in the image.
    pub layers: usize,
    /// Symbolic and hard links followed while resolving one path.
    pub symlink_hops: usize,
    /// Wall time for the whole check.
    pub timeout: Duration,
}

impl Default for EntrypointLimits {
    fn default() -> Self {
        Self { total_bytes: 256 * 1024 * 1024, layer_bytes: 128 * 1024 * 1024, uncompressed_bytes: 1024 * 1024 * 1024, entries: 250_000, layers: 128, symlink_hops: 8, timeout: Duration::from_secs(60) }
    }
}

/// What an image's program is built for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntrypointCheck {
    /// The ELF file the container executes (for a script, its interpreter) runs on `arch` (a
    /// Go/OCI name: amd64, arm64, 386, arm, ppc64le...). `digest` is the manifest (or index)
    /// digest checked, `path` the ELF file read, `script` the script it interprets, if any.
    Machine { digest: String, path: String, arch: String, script: Option<String> },
    /// Nothing could be verified, and why.
    Undetermined(Undetermined),
}

impl EntrypointCheck {
    /// A short, stable label for metrics: `machine`, or the reason nothing was determined.
    pub fn outcome(&self) -> &'static str {
        match self {
            EntrypointCheck::Machine { .. } => "machine",
            EntrypointCheck::Undetermined(u) => u.reason(),
        }
    }

    /// Does the image's program certainly not run on `arch`? True only for a determined machine
    /// of another architecture. 386 programs on amd64 and arm programs on arm64 are not counted
    /// foreign: whether they run depends on the node's kernel and CPU, not on the image.
    pub fn foreign_to(&self, arch: &str) -> bool {
        match self {
            EntrypointCheck::Machine { arch: machine, .. } => machine != arch && !matches!((arch, machine.as_str()), ("amd64", "386") | ("arm64", "arm")),
            EntrypointCheck::Undetermined(_) => false,
        }
    }
}

/// Why an image's program could not be determined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Undetermined {
    #[error("the image index lists no linux/{0} image")]
    NoPlatform(String),
    #[error("the image sets neither an entrypoint nor a command")]
    NoEntrypoint,
    #[error("{path}: {why}")]
    NotFound { path: String, why: &'static str },
    #[error("{path} is neither an ELF file nor a #! script")]
    NotElfOrScript { path: String },
    #[error("{path}: {why}")]
    UnusableElf { path: String, why: String },
    #[error("{script} names {interpreter} as its interpreter, itself a script (one interpreter is followed)")]
    InterpreterIsScript { script: String, interpreter: String },
    #[error("not read: {0}")]
    Unsupported(String),
    #[error("a layer could not be read: {0}")]
    UnreadableLayer(String),
    #[error("over the bound on {}", .0.label())]
    OverBound(Bound),
}

impl Undetermined {
    /// A short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Undetermined::NoPlatform(_) => "no_platform",
            Undetermined::NoEntrypoint => "no_entrypoint",
            Undetermined::NotFound { .. } => "not_found",
            Undetermined::NotElfOrScript { .. } => "not_elf",
            Undetermined::UnusableElf { .. } => "unusable_elf",
            Undetermined::InterpreterIsScript { .. } => "interpreter_is_script",
            Undetermined::Unsupported(_) => "unsupported",
            Undetermined::UnreadableLayer(_) => "unreadable_layer",
            Undetermined::OverBound(b) => b.label(),
        }
    }
}

/// The bounds of `EntrypointLimits`, and the passes over the layers the links cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    TotalBytes,
    LayerBytes,
    UncompressedBytes,
    Entries,
    Layers,
    SymlinkHops,
    /// Passes over the layers: each link or interpreter whose target is not yet known costs one,
    /// so this follows from `symlink_hops`.
    Passes,
    Deadline,
}

impl Bound {
    pub fn label(&self) -> &'static str {
        match self {
            Bound::TotalBytes => "total_bytes",
            Bound::LayerBytes => "layer_bytes",
            Bound::UncompressedBytes => "uncompressed_bytes",
            Bound::Entries => "entries",
            Bound::Layers => "layers",
            Bound::SymlinkHops => "symlink_hops",
            Bound::Passes => "passes",
            Bound::Deadline => "deadline",
        }
    }
}

fn over(b: Bound) -> EntrypointCheck {
    EntrypointCheck::Undetermined(Undetermined::OverBound(b))
}

impl RegistryClient {
    /// Read `image` (its digest, when it names one, is checked) for linux/`arch` and determine
    /// its program's machine, within `limits` and by `deadline`. Registry failures are errors; what the image
    /// does not let Archer determine, bounds included, is `Undetermined`.
    pub(crate) async fn entrypoint_machine(&self, image: &ImageRef, arch: &str, cred: Option<&Credential>, limits: &EntrypointLimits, deadline: Instant) -> Result<EntrypointCheck, RegistryError> {
        let _working_set = match self.settings().budget.reserve("registry", WORKING_SET_BYTES, deadline).await {
            Ok(p) => p,
            Err(e) => return Err(RegistryError::Busy(e.to_string())),
        };
        let allowance = ReadAllowance::new(usize::try_from(limits.total_bytes).unwrap_or(usize::MAX));
        let endpoints = self.endpoints(image)?;
        let mut last = None;
        for (i, endpoint) in endpoints.iter().enumerate() {
            let is_origin = i + 1 == endpoints.len();
            let repo = self.repo(&endpoint.host, image, if endpoint.credential { cred } else { None }, deadline, &allowance)?;
            let check = Check { repo, arch, limits, deadline, allowance: &allowance, uncompressed_left: limits.uncompressed_bytes, entries_left: limits.entries };
            match tokio::time::timeout_at(deadline, check.run(image)).await {
                Err(_) | Ok(Err(RegistryError::Timeout(_))) => return Ok(over(Bound::Deadline)),
                Ok(Err(RegistryError::PodBytesExceeded)) => return Ok(over(Bound::TotalBytes)),
                Ok(Ok(found)) => return Ok(found),
                Ok(Err(e)) if !is_origin && e.is_endpoint_failure() => {
                    tracing::debug!(mirror = %endpoint.host, error = %e, "mirror failed, trying the next endpoint");
                    last = Some(e);
                }
                Ok(Err(e)) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| RegistryError::Unavailable("no endpoint".into())))
    }
}

/// One check on one endpoint.
struct Check<'a> {
    repo: Repo<'a>,
    arch: &'a str,
    limits: &'a EntrypointLimits,
    deadline: Instant,
    allowance: &'a ReadAllowance,
    uncompressed_left: u64,
    entries_left: u64,
}

/// Enough of a manifest to tell an index from an image manifest.
#[derive(Deserialize)]
struct ManifestKind {
    #[serde(default, rename = "schemaVersion")]
    schema_version: Option<u32>,
    #[serde(default)]
    manifests: Option<serde::de::IgnoredAny>,
}

impl Check<'_> {
    async fn run(mut self, image: &ImageRef) -> Result<EntrypointCheck, RegistryError> {
        let (digest, manifest) = match self.platform_manifest(image).await? {
            Ok(found) => found,
            Err(why) => return Ok(EntrypointCheck::Undetermined(why)),
        };
        let program = match self.program(&manifest).await? {
            Ok(p) => p,
            Err(why) => return Ok(EntrypointCheck::Undetermined(why)),
        };
        let layers = manifest.layers();
        if layers.len() > self.limits.layers {
            return Ok(over(Bound::Layers));
        }
        tracing::debug!(program = %program.name, layers = layers.len(), "looking for the entrypoint in the layers");
        let max_passes = 2 * (self.limits.symlink_hops + 2);
        let mut answers = Answers::new();
        let mut passes = 0;
        loop {
            match resolve(&program, &answers, self.limits.symlink_hops) {
                Step::Machine { path, arch, script } => return Ok(EntrypointCheck::Machine { digest, path, arch: arch.to_string(), script }),
                Step::Undetermined(why) => return Ok(EntrypointCheck::Undetermined(why)),
                Step::Need(lookups) => {
                    passes += 1;
                    if passes > max_passes {
                        return Ok(over(Bound::Passes));
                    }
                    if let Err(why) = self.pass(layers, lookups, &mut answers).await? {
                        return Ok(EntrypointCheck::Undetermined(why));
                    }
                }
            }
        }
    }

    /// The image manifest for linux/`arch`, and the digest of what `image` names.
    async fn platform_manifest(&mut self, image: &ImageRef) -> Result<Result<(String, ImageManifest), Undetermined>, RegistryError> {
        let path = format!("v2/{}/manifests/{}", self.repo.repository(), image.reference());
        let (_, body) = self.repo.get(&path, MANIFEST_ACCEPT).await?;
        let digest = match image.digest.as_deref() {
            Some(d) => {
                verify_digest(d, &body)?;
                d.to_string()
            }
            None => format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&body))),
        };
        let kind: ManifestKind = serde_json::from_slice(&body).map_err(|e| RegistryError::Malformed(format!("manifest: {e}")))?;
        if kind.schema_version == Some(1) {
            return Ok(Err(Undetermined::Unsupported("a Docker schema 1 manifest".into())));
        }
        if kind.manifests.is_none() {
            return Ok(Ok((digest, parse_manifest(&body)?)));
        }
        let index: ImageIndex = serde_json::from_slice(&body).map_err(|e| RegistryError::Malformed(format!("image index: {e}")))?;
        let Some(entry) = index.manifests().iter().find(|d| self.is_platform(d)) else {
            return Ok(Err(Undetermined::NoPlatform(self.arch.to_string())));
        };
        let child = entry.digest().to_string();
        let path = format!("v2/{}/manifests/{child}", self.repo.repository());
        let (_, body) = self.repo.get(&path, MANIFEST_ACCEPT).await?;
        verify_digest(&child, &body)?;
        let kind: ManifestKind = serde_json::from_slice(&body).map_err(|e| RegistryError::Malformed(format!("manifest: {e}")))?;
        if kind.manifests.is_some() {
            return Ok(Err(Undetermined::Unsupported("an index nested in an index".into())));
        }
        Ok(Ok((digest, parse_manifest(&body)?)))
    }

    fn is_platform(&self, d: &Descriptor) -> bool {
        let attestation = d.annotations().as_ref().is_some_and(|a| a.contains_key(ATTESTATION_ANNOTATION));
        !attestation && d.platform().as_ref().is_some_and(|p| *p.os() == Os::Linux && p.architecture().to_string() == self.arch)
    }

    /// The program the image runs, from its config.
    async fn program(&mut self, manifest: &ImageManifest) -> Result<Result<Program, Undetermined>, RegistryError> {
        let digest = manifest.config().digest().to_string();
        let path = format!("v2/{}/blobs/{digest}", self.repo.repository());
        let (_, body) = self.repo.get(&path, CONFIG_ACCEPT).await?;
        verify_digest(&digest, &body)?;
        let config: ImageConfiguration = serde_json::from_slice(&body).map_err(|e| RegistryError::Malformed(format!("image config: {e}")))?;
        let Some(c) = config.config() else {
            return Ok(Err(Undetermined::NoEntrypoint));
        };
        let first = |v: &Option<Vec<String>>| v.as_ref().and_then(|v| v.first()).cloned();
        let Some(name) = first(c.entrypoint()).or_else(|| first(c.cmd())) else {
            return Ok(Err(Undetermined::NoEntrypoint));
        };
        let path = c.env().iter().flatten().find_map(|e| e.strip_prefix("PATH=")).unwrap_or(DEFAULT_PATH).to_string();
        let workdir = c.working_dir().clone().filter(|w| !w.is_empty()).unwrap_or_else(|| "/".into());
        Ok(Ok(Program { name, workdir, path }))
    }

    /// Read the layers from the top down until `lookups` are all answered.
    async fn pass(&mut self, layers: &[Descriptor], lookups: Vec<resolve::Lookup>, answers: &mut Answers) -> Result<Result<(), Undetermined>, RegistryError> {
        let mut wanted = Wanted::new(lookups);
        let mut lowest = layers.len();
        for (index, layer) in layers.iter().enumerate().rev() {
            if !wanted.wants_layer(index) {
                break;
            }
            let size = layer.size();
            if size > self.limits.layer_bytes {
                tracing::debug!(layer = index, size, bound = self.limits.layer_bytes, "layer over the per-layer bound, not read");
                return Ok(Err(Undetermined::OverBound(Bound::LayerBytes)));
            }
            if size > self.allowance.remaining() as u64 {
                return Ok(Err(Undetermined::OverBound(Bound::TotalBytes)));
            }
            let digest = layer.digest().to_string();
            let path = format!("v2/{}/blobs/{digest}", self.repo.repository());
            let resp = self.repo.open(&path, "*/*").await?;
            let stream = Box::pin(resp.bytes_stream().map(|chunk| chunk.map_err(io::Error::other)));
            let blob = SyncIoBridge::new(StreamReader::new(stream));
            let budget = LayerBudget { size, digest: digest.clone(), allowance: self.allowance.clone(), uncompressed_left: self.uncompressed_left, entries_left: self.entries_left, deadline: self.deadline.into_std() };
            let (end, back) = tokio::task::spawn_blocking(move || {
                let end = scan_layer(blob, index, &budget, &mut wanted);
                (end, wanted)
            })
            .await
            .map_err(|e| RegistryError::Unavailable(format!("reading layer {digest}: {e}")))?;
            wanted = back;
            match end {
                LayerEnd::Read { uncompressed, entries } => {
                    self.uncompressed_left = self.uncompressed_left.saturating_sub(uncompressed);
                    self.entries_left = self.entries_left.saturating_sub(entries);
                    lowest = index;
                }
                LayerEnd::Stopped(why) => return Ok(Err(why)),
                LayerEnd::DigestMismatch { actual } => return Err(RegistryError::DigestMismatch { expected: digest, actual }),
            }
        }
        wanted.finish(answers, lowest);
        Ok(Ok(()))
    }
}

fn parse_manifest(body: &[u8]) -> Result<ImageManifest, RegistryError> {
    serde_json::from_slice(body).map_err(|e| RegistryError::Malformed(format!("image manifest: {e}")))
}
