//! Namespace placement policy: annotations on the namespace over cluster-wide defaults.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

const MODE: &str = "archer.dev/mode";
const PREFER: &str = "archer.dev/prefer";
/// The architectures a namespace's pods may be placed on (comma-separated; unset: any).
pub const ALLOWED_ARCHITECTURES: &str = "archer.dev/allowed-architectures";
const ON_INSPECTION_FAILURE: &str = "archer.dev/on-inspection-failure";
const FALLBACK_ARCHITECTURE: &str = "archer.dev/fallback-architecture";
/// `"true"`: the patch rewrites each image reference to the digest that was inspected.
const PIN_DIGESTS: &str = "archer.dev/pin-digests";
/// `"false"`: a pod whose binary fails with an exec format error gets only the Event.
const REPLACE_ON_EXEC_FORMAT_ERROR: &str = "archer.dev/replace-on-exec-format-error";
/// Label that opts a namespace (via the webhook's namespaceSelector) or a pod (objectSelector) out.
pub const IGNORE_LABEL: &str = "archer.dev/ignore";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Leave pods untouched.
    Off,
    /// Record the platforms found, change nothing else.
    Observe,
    /// Patch affinity and tolerations.
    #[default]
    Enforce,
    /// As `enforce`; and when an image is not inspected within the admission deadline, hold the
    /// pod behind the scheduling gate `archer.dev/inspecting` until it is, instead of failing open.
    Gate,
}

impl Mode {
    /// Whether Archer patches the pod's placement (`enforce` and `gate`).
    pub fn enforces(self) -> bool {
        matches!(self, Mode::Enforce | Mode::Gate)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum FailurePolicy {
    /// Admit unpatched (or pinned to the fallback architecture) with a warning.
    #[default]
    FailOpen,
    /// Deny with a message naming the image and the cause.
    FailClosed,
}

macro_rules! kebab_enum_str {
    ($t:ty { $($v:ident => $s:literal),+ }) => {
        impl FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s.trim() {
                    $($s => Ok(Self::$v),)+
                    other => Err(format!("unknown value {other:?} (want one of: {})", [$($s),+].join(", "))),
                }
            }
        }
        impl $t {
            /// The value as annotations and the config file spell it.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$v => $s,)+ }
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
kebab_enum_str!(Mode { Off => "off", Observe => "observe", Enforce => "enforce", Gate => "gate" });
kebab_enum_str!(FailurePolicy { FailOpen => "fail-open", FailClosed => "fail-closed" });

/// The cluster-wide defaults (from the config file) a namespace's annotations override.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct PolicyDefaults {
    pub mode: Mode,
    pub prefer: Vec<String>,
    /// Empty: every architecture is allowed.
    pub allowed_architectures: Vec<String>,
    pub on_inspection_failure: FailurePolicy,
    pub fallback_architecture: Option<String>,
    /// Rewrite image references to the inspected digest (off by default: see the docs, "Image inspection").
    pub pin_digests: bool,
    /// Evict a controller's pod once when its binary fails with an exec format error.
    pub replace_on_exec_format_error: bool,
}

impl Default for PolicyDefaults {
    fn default() -> Self {
        Self {
            mode: Mode::Enforce,
            prefer: vec!["arm64".into(), "amd64".into()],
            allowed_architectures: Vec::new(),
            on_inspection_failure: FailurePolicy::FailOpen,
            fallback_architecture: None,
            pin_digests: false,
            replace_on_exec_format_error: true,
        }
    }
}

/// The effective policy for one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub mode: Mode,
    pub prefer: Vec<String>,
    pub allowed_architectures: Option<Vec<String>>,
    pub on_inspection_failure: FailurePolicy,
    pub fallback_architecture: Option<String>,
    pub pin_digests: bool,
    pub replace_on_exec_format_error: bool,
}

impl Policy {
    pub fn allows(&self, arch: &str) -> bool {
        self.allowed_architectures.as_ref().is_none_or(|a| a.iter().any(|x| x == arch))
    }

    /// The architectures this namespace's pods may be placed on, when its policy restricts
    /// them: `allowedArchitectures` under a mode that changes placement (enforce, gate). Under
    /// observe or off Archer changes no pod's placement, so nothing is restricted (`None`).
    pub fn placement_architectures(&self) -> Option<&[String]> {
        if self.mode.enforces() {
            self.allowed_architectures.as_deref()
        } else {
            None
        }
    }

    /// `platforms` less those of architectures [`Policy::placement_architectures`] leaves out:
    /// what a pod of this namespace may be placed on. The one rule the planner (through
    /// `ClusterState::pod_platforms`) and the extender's filter apply, so a pod the webhook could
    /// not constrain (its inspection failed open, or it was admitted before the policy) is
    /// neither planned nor bound onto an architecture its namespace forbids.
    pub fn placeable(&self, platforms: &crate::platform::PlatformSet) -> crate::platform::PlatformSet {
        match self.placement_architectures() {
            Some(allowed) => platforms.retain_architectures(|a| allowed.iter().any(|x| x == a)),
            None => platforms.clone(),
        }
    }

    /// Rank of an architecture in the preference order (lower is better; unlisted last).
    pub(crate) fn preference_rank(&self, arch: &str) -> usize {
        self.prefer.iter().position(|p| p == arch).unwrap_or(self.prefer.len())
    }
}

/// A namespace annotation Archer could not use; the default stands in its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyWarning {
    pub annotation: &'static str,
    pub message: String,
}

impl fmt::Display for PolicyWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "namespace annotation {}: {}; using the cluster default", self.annotation, self.message)
    }
}

fn boolean(value: &str) -> Result<bool, String> {
    match value.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("{other:?} is not \"true\" or \"false\"")),
    }
}

fn arch_list(value: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for a in value.split(',').map(|a| a.trim().to_ascii_lowercase()).filter(|a| !a.is_empty()) {
        if !a.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') || a.len() > 32 {
            return Err(format!("{a:?} is not an architecture name"));
        }
        if !out.contains(&a) {
            out.push(a);
        }
    }
    if out.is_empty() {
        return Err("empty list".into());
    }
    Ok(out)
}

/// Resolve a namespace's policy. Bad annotation values never fail the pod: they fall back to
/// the defaults and come back as warnings the webhook passes on to the user.
pub fn resolve(defaults: &PolicyDefaults, annotations: &BTreeMap<String, String>) -> (Policy, Vec<PolicyWarning>) {
    let mut warnings = Vec::new();
    let take = |key: &'static str| -> Option<&String> { annotations.get(key) };
    let mut warn = |annotation: &'static str, message: String| warnings.push(PolicyWarning { annotation, message });

    let mode = match take(MODE).map(|v| v.parse::<Mode>()) {
        Some(Ok(m)) => m,
        Some(Err(e)) => {
            warn(MODE, e);
            defaults.mode
        }
        None => defaults.mode,
    };
    let prefer = match take(PREFER).map(|v| arch_list(v)) {
        Some(Ok(p)) => p,
        Some(Err(e)) => {
            warn(PREFER, e);
            defaults.prefer.clone()
        }
        None => defaults.prefer.clone(),
    };
    let default_allowed = (!defaults.allowed_architectures.is_empty()).then(|| defaults.allowed_architectures.clone());
    let allowed_architectures = match take(ALLOWED_ARCHITECTURES).map(|v| arch_list(v)) {
        Some(Ok(a)) => Some(a),
        Some(Err(e)) => {
            warn(ALLOWED_ARCHITECTURES, e);
            default_allowed
        }
        None => default_allowed,
    };
    let on_inspection_failure = match take(ON_INSPECTION_FAILURE).map(|v| v.parse::<FailurePolicy>()) {
        Some(Ok(f)) => f,
        Some(Err(e)) => {
            warn(ON_INSPECTION_FAILURE, e);
            defaults.on_inspection_failure
        }
        None => defaults.on_inspection_failure,
    };
    let fallback_architecture = match take(FALLBACK_ARCHITECTURE).map(|v| arch_list(v)) {
        Some(Ok(list)) if list.len() == 1 => list.into_iter().next(),
        Some(Ok(_)) => {
            warn(FALLBACK_ARCHITECTURE, "exactly one architecture expected".into());
            defaults.fallback_architecture.clone()
        }
        Some(Err(e)) => {
            warn(FALLBACK_ARCHITECTURE, e);
            defaults.fallback_architecture.clone()
        }
        None => defaults.fallback_architecture.clone(),
    };
    let mut flag = |key: &'static str, default: bool| match take(key).map(|v| boolean(v)) {
        Some(Ok(b)) => b,
        Some(Err(e)) => {
            warn(key, e);
            default
        }
        None => default,
    };
    let pin_digests = flag(PIN_DIGESTS, defaults.pin_digests);
    let replace_on_exec_format_error = flag(REPLACE_ON_EXEC_FORMAT_ERROR, defaults.replace_on_exec_format_error);
    (Policy { mode, prefer, allowed_architectures, on_inspection_failure, fallback_architecture, pin_digests, replace_on_exec_format_error }, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn defaults_apply_without_annotations() {
        let (p, w) = resolve(&PolicyDefaults::default(), &BTreeMap::new());
        assert!(w.is_empty());
        assert_eq!(p.mode, Mode::Enforce);
        assert_eq!(p.prefer, vec!["arm64", "amd64"]);
        assert_eq!(p.allowed_architectures, None);
        assert_eq!(p.on_inspection_failure, FailurePolicy::FailOpen);
        assert!(p.allows("s390x"));
    }

    #[test]
    fn only_a_mode_that_changes_placement_restricts_where_pods_go() {
        let both = crate::platform::PlatformSet::parse_annotation("linux/amd64,linux/arm64").expect("set");
        let amd64 = crate::platform::PlatformSet::parse_annotation("linux/amd64").expect("set");
        for (mode, expected) in [("enforce", &amd64), ("gate", &amd64), ("observe", &both), ("off", &both)] {
            let (p, w) = resolve(&PolicyDefaults::default(), &ann(&[(MODE, mode), (ALLOWED_ARCHITECTURES, "amd64")]));
            assert!(w.is_empty(), "{w:?}");
            assert_eq!(&p.placeable(&both), expected, "{mode}");
        }
        let (open, _) = resolve(&PolicyDefaults::default(), &BTreeMap::new());
        assert_eq!(open.placement_architectures(), None);
        assert_eq!(open.placeable(&both), both, "no allowedArchitectures: every architecture");
    }

    #[test]
    fn annotations_override_defaults() {
        let (p, w) = resolve(
            &PolicyDefaults::default(),
            &ann(&[
                (MODE, "observe"),
                (PREFER, "amd64, arm64"),
                (ALLOWED_ARCHITECTURES, "amd64,arm64,amd64"),
                (ON_INSPECTION_FAILURE, "fail-closed"),
                (FALLBACK_ARCHITECTURE, "amd64"),
            ]),
        );
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(p.mode, Mode::Observe);
        assert_eq!(p.prefer, vec!["amd64", "arm64"]);
        assert_eq!(p.allowed_architectures, Some(vec!["amd64".to_string(), "arm64".to_string()]));
        assert!(!p.allows("s390x"));
        assert_eq!(p.on_inspection_failure, FailurePolicy::FailClosed);
        assert_eq!(p.fallback_architecture.as_deref(), Some("amd64"));
        assert!(!p.pin_digests && p.replace_on_exec_format_error, "the defaults");
        assert_eq!(p.preference_rank("amd64"), 0);
        assert_eq!(p.preference_rank("riscv64"), 2);
    }

    #[test]
    fn bad_values_fall_back_with_warnings() {
        let defaults = PolicyDefaults { mode: Mode::Observe, ..Default::default() };
        let (p, w) = resolve(
            &defaults,
            &ann(&[(MODE, "yes-please"), (PREFER, " , "), (ON_INSPECTION_FAILURE, "explode"), (FALLBACK_ARCHITECTURE, "amd64,arm64")]),
        );
        assert_eq!(p.mode, Mode::Observe);
        assert_eq!(p.prefer, vec!["arm64", "amd64"]);
        assert_eq!(p.on_inspection_failure, FailurePolicy::FailOpen);
        assert_eq!(p.fallback_architecture, None);
        let names: Vec<_> = w.iter().map(|w| w.annotation).collect();
        assert_eq!(names, vec![MODE, PREFER, ON_INSPECTION_FAILURE, FALLBACK_ARCHITECTURE]);
        assert!(w[0].to_string().contains("yes-please"));
    }

    #[test]
    fn gate_mode_and_the_safety_net_flags() {
        let (p, w) = resolve(&PolicyDefaults::default(), &ann(&[(MODE, "gate"), (PIN_DIGESTS, "true"), (REPLACE_ON_EXEC_FORMAT_ERROR, "false")]));
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(p.mode, Mode::Gate);
        assert!(p.mode.enforces() && Mode::Enforce.enforces() && !Mode::Observe.enforces() && !Mode::Off.enforces());
        assert!(p.pin_digests);
        assert!(!p.replace_on_exec_format_error);
        let (p, w) = resolve(&PolicyDefaults::default(), &ann(&[(PIN_DIGESTS, "yes")]));
        assert!(!p.pin_digests);
        assert_eq!(w.iter().map(|w| w.annotation).collect::<Vec<_>>(), vec![PIN_DIGESTS]);
        let d: PolicyDefaults = crate::yaml::from_str("mode: gate\npinDigests: true\nreplaceOnExecFormatError: false\n").expect("yaml");
        assert_eq!((d.mode, d.pin_digests, d.replace_on_exec_format_error), (Mode::Gate, true, false));
    }

    #[test]
    fn config_defaults_parse_from_yaml() {
        let d: PolicyDefaults = crate::yaml::from_str("mode: observe\nprefer: [amd64]\nonInspectionFailure: fail-closed\n").expect("yaml");
        assert_eq!(d.mode, Mode::Observe);
        assert_eq!(d.prefer, vec!["amd64"]);
        assert_eq!(d.on_inspection_failure, FailurePolicy::FailClosed);
        assert!(crate::yaml::from_str::<PolicyDefaults>("modd: off\n").is_err());
    }
}
