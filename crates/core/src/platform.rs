//! Platforms (os/arch[/variant]) and the intersection over a pod's images.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// One platform an image can run on, normalised the way the container runtime matches them:
/// `aarch64` is `arm64`, `arm64/v8` is plain `arm64`, `x86_64` is `amd64`. Other variants are kept,
/// so `arm/v7` never matches `arm64`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid platform {0:?}: expected os/arch[/variant]")]
pub struct PlatformParseError(pub String);

impl Platform {
    pub fn new(os: &str, architecture: &str, variant: Option<&str>) -> Self {
        let os = os.trim().to_ascii_lowercase();
        let mut architecture = architecture.trim().to_ascii_lowercase();
        let mut variant = variant
            .map(|v| v.trim().to_ascii_lowercase())
            .filter(|v| !v.is_empty());
        match architecture.as_str() {
            "aarch64" => architecture = "arm64".into(),
            "x86_64" | "x86-64" => architecture = "amd64".into(),
            "armhf" => {
                architecture = "arm".into();
                variant.get_or_insert_with(|| "v7".into());
            }
            "armel" => {
                architecture = "arm".into();
                variant.get_or_insert_with(|| "v6".into());
            }
            _ => {}
        }
        if architecture == "arm64" && variant.as_deref() == Some("v8") {
            variant = None;
        }
        Self { os, architecture, variant }
    }

    /// Could a node ever be labelled with this platform? `kubernetes.io/os` and
    /// `kubernetes.io/arch` are Go's GOOS and GOARCH of the kubelet, and variants are short
    /// tokens (`v7`, `v8.2`, `rva22u64`); an entry naming anything else can never be scheduled.
    fn is_schedulable(&self) -> bool {
        let variant_ok = self.variant.as_deref().is_none_or(|v| v.len() <= 16 && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '.'));
        KNOWN_OS.contains(&self.os.as_str()) && KNOWN_ARCH.contains(&self.architecture.as_str()) && variant_ok
    }

    /// Attestation manifests and other non-runnable entries of an index.
    fn is_unknown(&self) -> bool {
        self.os == "unknown" || self.architecture == "unknown" || self.os.is_empty() || self.architecture.is_empty()
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.variant {
            Some(v) => write!(f, "{}/{}/{}", self.os, self.architecture, v),
            None => write!(f, "{}/{}", self.os, self.architecture),
        }
    }
}

impl FromStr for Platform {
    type Err = PlatformParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.trim().split('/').collect();
        let ok = |p: &&str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
        match parts.as_slice() {
            [os, arch] if ok(os) && ok(arch) => Ok(Platform::new(os, arch, None)),
            [os, arch, variant] if ok(os) && ok(arch) && ok(variant) => Ok(Platform::new(os, arch, Some(variant))),
            _ => Err(PlatformParseError(s.to_string())),
        }
    }
}

/// Go's GOOS values (what kubelet puts in `kubernetes.io/os`).
const KNOWN_OS: &[&str] = &["aix", "android", "darwin", "dragonfly", "freebsd", "illumos", "ios", "js", "linux", "netbsd", "openbsd", "plan9", "solaris", "wasip1", "windows"];
/// Go's GOARCH values (what kubelet puts in `kubernetes.io/arch`).
const KNOWN_ARCH: &[&str] = &["386", "amd64", "arm", "arm64", "loong64", "mips", "mipsle", "mips64", "mips64le", "ppc64", "ppc64le", "riscv64", "s390x", "wasm"];

/// At most this many platforms are kept per image; a larger index is summarised to os/arch.
/// With only Go's values allowed that bounds the `archer.dev/platforms` annotation to a few KiB,
/// far under the API server's 256 KiB for all of a pod's annotations.
pub const MAX_PLATFORMS: usize = 64;

/// A sorted set of platforms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlatformSet(pub BTreeSet<Platform>);

/// Collecting skips unknown (attestation) entries.
impl FromIterator<Platform> for PlatformSet {
    fn from_iter<I: IntoIterator<Item = Platform>>(it: I) -> Self {
        Self(it.into_iter().filter(|p| !p.is_unknown()).collect())
    }
}

impl PlatformSet {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn intersect(&self, other: &PlatformSet) -> PlatformSet {
        PlatformSet(self.0.intersection(&other.0).cloned().collect())
    }

    /// Intersection over all sets; `None` when there are no sets at all.
    pub fn intersect_all<'a, I: IntoIterator<Item = &'a PlatformSet>>(sets: I) -> Option<PlatformSet> {
        let mut iter = sets.into_iter();
        let first = iter.next()?.clone();
        Some(iter.fold(first, |acc, s| acc.intersect(s)))
    }

    /// Values of `kubernetes.io/arch` this set can run on.
    pub fn architectures(&self) -> BTreeSet<String> {
        self.0.iter().map(|p| p.architecture.clone()).collect()
    }

    /// Values of `kubernetes.io/os` this set can run on.
    pub(crate) fn operating_systems(&self) -> BTreeSet<String> {
        self.0.iter().map(|p| p.os.clone()).collect()
    }

    /// Architectures runnable under one operating system.
    pub fn architectures_for_os(&self, os: &str) -> BTreeSet<String> {
        self.0.iter().filter(|p| p.os == os).map(|p| p.architecture.clone()).collect()
    }

    /// Keep only the platforms whose architecture passes `keep`.
    pub(crate) fn retain_architectures(&self, keep: impl Fn(&str) -> bool) -> PlatformSet {
        PlatformSet(self.0.iter().filter(|p| keep(&p.architecture)).cloned().collect())
    }

    /// The platforms of an image index as a node could run them: entries no node can carry are
    /// dropped, and past [`MAX_PLATFORMS`] variants are dropped (os/arch kept). The flag says
    /// whether anything was dropped.
    pub fn schedulable_summary(self) -> (PlatformSet, bool) {
        let before = self.0.len();
        let kept: BTreeSet<Platform> = self.0.into_iter().filter(Platform::is_schedulable).collect();
        let mut dropped = kept.len() != before;
        if kept.len() <= MAX_PLATFORMS {
            return (PlatformSet(kept), dropped);
        }
        dropped = true;
        (PlatformSet(kept.into_iter().map(|p| Platform { variant: None, ..p }).collect()), dropped)
    }

    /// The annotation form: `linux/amd64,linux/arm64`, sorted.
    pub fn to_annotation(&self) -> String {
        self.to_string()
    }

    pub fn parse_annotation(value: &str) -> Result<PlatformSet, PlatformParseError> {
        let mut set = BTreeSet::new();
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            set.insert(part.parse::<Platform>()?);
        }
        Ok(PlatformSet(set))
    }
}

/// The annotation form ([`PlatformSet::to_annotation`]), each platform written in place.
impl fmt::Display for PlatformSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hostile_indexes_are_summarised_to_what_nodes_can_run() {
        // 100k distinct platforms: made-up architectures, and endless variants of real ones.
        let mut all: Vec<Platform> = (0..50_000).map(|i| Platform::new("linux", &format!("arch{i}"), None)).collect();
        all.extend((0..50_000).map(|i| Platform::new("linux", "arm64", Some(&format!("v{i}")))));
        all.push(Platform::new("linux", "amd64", None));
        let (set, dropped) = PlatformSet::from_iter(all).schedulable_summary();
        assert!(dropped);
        assert_eq!(set.to_annotation(), "linux/amd64,linux/arm64");
        let every: Vec<Platform> = KNOWN_OS.iter().flat_map(|os| KNOWN_ARCH.iter().flat_map(move |a| (0..20).map(move |v| Platform::new(os, a, Some(&format!("v{v}")))))).collect();
        let (set, _) = PlatformSet::from_iter(every).schedulable_summary();
        assert!(set.to_annotation().len() < 8 * 1024, "bounded: {} bytes", set.to_annotation().len());
        // Ordinary indexes pass untouched.
        let ordinary = PlatformSet::from_iter(["linux/amd64", "linux/arm64", "linux/arm/v7", "windows/amd64"].map(|p| p.parse::<Platform>().expect("p")));
        assert_eq!(ordinary.clone().schedulable_summary(), (ordinary, false));
        assert!(!Platform::new("linux", "arm", Some("v7; rm -rf")).is_schedulable());
    }

    use super::*;

    fn set(s: &str) -> PlatformSet {
        PlatformSet::parse_annotation(s).expect("valid")
    }

    #[test]
    fn normalises_aliases_but_keeps_arm_variants() {
        assert_eq!(Platform::new("linux", "aarch64", None).to_string(), "linux/arm64");
        assert_eq!(Platform::new("linux", "arm64", Some("v8")).to_string(), "linux/arm64");
        assert_eq!(Platform::new("Linux", "x86_64", None).to_string(), "linux/amd64");
        assert_eq!(Platform::new("linux", "arm", Some("v7")).to_string(), "linux/arm/v7");
        assert_ne!(Platform::new("linux", "arm", Some("v7")), Platform::new("linux", "arm64", None));
    }

    #[test]
    fn intersection_over_containers() {
        let a = set("linux/amd64,linux/arm64,linux/s390x");
        let b = set("linux/arm64,linux/amd64");
        let c = set("linux/arm64,linux/arm/v7");
        let all = PlatformSet::intersect_all([&a, &b, &c]).expect("non-empty input");
        assert_eq!(all.to_annotation(), "linux/arm64");
        let none = PlatformSet::intersect_all([&set("linux/amd64"), &set("linux/arm64")]).expect("input");
        assert!(none.is_empty());
        assert!(PlatformSet::intersect_all(std::iter::empty()).is_none());
    }

    #[test]
    fn annotation_round_trip_is_sorted() {
        let s = set("linux/arm64, linux/amd64 ,windows/amd64");
        assert_eq!(s.to_annotation(), "linux/amd64,linux/arm64,windows/amd64");
        assert_eq!(set(&s.to_annotation()), s);
        assert!(PlatformSet::parse_annotation("linux").is_err());
        assert!(PlatformSet::parse_annotation("linux/amd64/v2/x").is_err());
        assert!(PlatformSet::parse_annotation("linux/am d64").is_err());
    }

    #[test]
    fn unknown_entries_are_dropped() {
        let s = PlatformSet::from_iter([Platform::new("unknown", "unknown", None), Platform::new("linux", "amd64", None)]);
        assert_eq!(s.to_annotation(), "linux/amd64");
        assert_eq!(s.architectures().into_iter().collect::<Vec<_>>(), vec!["amd64"]);
    }
}
