use std::time::Duration;

/// Why an image could not be inspected. The variant name is the `reason` label of the
/// inspection-failure metric, so keep them short and stable.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    InvalidReference(#[from] super::reference::ReferenceError),
    #[error("refusing to contact {0}")]
    Forbidden(String),
    #[error("registry {0} is not on the allow list")]
    NotAllowed(String),
    #[error("registry denied access (HTTP {status}){hint}")]
    Unauthorized { status: u16, hint: String },
    #[error("manifest or blob not found (HTTP 404) at {0}")]
    NotFound(String),
    #[error("registry lookup timed out after {0:?}")]
    Timeout(Duration),
    #[error("response larger than the {0}-byte limit")]
    TooLarge(usize),
    #[error("content digest mismatch: asked for {expected}, got {actual}")]
    DigestMismatch { expected: String, actual: String },
    #[error("malformed registry response: {0}")]
    Malformed(String),
    #[error("registry rate limit (HTTP 429) outlasts the deadline")]
    RateLimited,
    #[error("registry unavailable: {0}")]
    Unavailable(String),
    #[error("the pod's images together exceed the per-pod limit on registry bytes")]
    PodBytesExceeded,
    #[error("archer is at its memory budget: {0}")]
    Busy(String),
    /// Archer's own identity could not sign in to the registry (its cloud's token exchange).
    #[error("no {identity} credential for {registry}: {why}")]
    Identity { identity: &'static str, registry: String, why: String },
    /// Archer's own identity was still signing in at the pod's deadline: a timeout, of the
    /// sign-in rather than the registry (which was not asked yet).
    #[error("no {identity} credential for {registry} yet: the sign-in had not ended by the pod's deadline (waited {waited:?}); it goes on, and the pods after this one are read with its credential")]
    SigningIn { identity: &'static str, registry: String, waited: Duration },
}

impl RegistryError {
    /// Every [`RegistryError::reason`].
    pub const REASONS: [&'static str; 14] = [
        "invalid_reference", "forbidden_address", "not_allowed", "unauthorized", "not_found", "timeout", "too_large", "digest_mismatch", "malformed", "rate_limited", "unavailable", "pod_bytes_exceeded", "memory_budget", "identity",
    ];

    /// The error as a pod's `archer.dev/inspection-error` and `archer report` say it: its reason
    /// in brackets, then the message (`[unauthorized] registry denied access (HTTP 401)`), so an
    /// annotation cut at its bound keeps the reason.
    pub fn with_reason(&self) -> String {
        format!("[{}] {self}", self.reason())
    }

    /// The first reason [`RegistryError::with_reason`] wrote in `text`, if it is one of
    /// [`RegistryError::REASONS`] (the text may be a pod's annotation, which its tenant can write).
    pub fn reason_in(text: &str) -> Option<&'static str> {
        text.split('[').skip(1).filter_map(|after| after.split_once(']')).find_map(|(key, _)| Self::REASONS.iter().copied().find(|r| *r == key))
    }

    pub fn reason(&self) -> &'static str {
        match self {
            RegistryError::InvalidReference(_) => "invalid_reference",
            RegistryError::Forbidden(_) => "forbidden_address",
            RegistryError::NotAllowed(_) => "not_allowed",
            RegistryError::Unauthorized { .. } => "unauthorized",
            RegistryError::NotFound(_) => "not_found",
            RegistryError::Timeout(_) | RegistryError::SigningIn { .. } => "timeout",
            RegistryError::TooLarge(_) => "too_large",
            RegistryError::DigestMismatch { .. } => "digest_mismatch",
            RegistryError::Malformed(_) => "malformed",
            RegistryError::RateLimited => "rate_limited",
            RegistryError::Unavailable(_) => "unavailable",
            RegistryError::PodBytesExceeded => "pod_bytes_exceeded",
            RegistryError::Busy(_) => "memory_budget",
            RegistryError::Identity { .. } => "identity",
        }
    }

    /// The deadline ended it: the registry's answer, or Archer's identity's sign-in, had not come
    /// (a gate-mode pod is held for the gate controller to finish).
    pub fn is_timeout(&self) -> bool {
        matches!(self, RegistryError::Timeout(_) | RegistryError::SigningIn { .. })
    }

    /// Worth trying the next endpoint (a mirror failing falls back to the origin).
    pub(crate) fn is_endpoint_failure(&self) -> bool {
        matches!(
            self,
            RegistryError::Unavailable(_) | RegistryError::NotFound(_) | RegistryError::RateLimited | RegistryError::Unauthorized { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::RegistryError;

    #[test]
    fn every_reason_is_listed_and_read_back() {
        let all = [
            RegistryError::Forbidden(String::new()),
            RegistryError::NotAllowed(String::new()),
            RegistryError::Unauthorized { status: 401, hint: String::new() },
            RegistryError::NotFound(String::new()),
            RegistryError::Timeout(std::time::Duration::ZERO),
            RegistryError::TooLarge(1),
            RegistryError::DigestMismatch { expected: String::new(), actual: String::new() },
            RegistryError::Malformed(String::new()),
            RegistryError::RateLimited,
            RegistryError::Unavailable(String::new()),
            RegistryError::PodBytesExceeded,
            RegistryError::Busy(String::new()),
            RegistryError::Identity { identity: "ecr", registry: "r".into(), why: "w".into() },
            RegistryError::SigningIn { identity: "ecr", registry: "r".into(), waited: std::time::Duration::from_millis(4000) },
        ];
        for e in &all {
            assert!(RegistryError::REASONS.contains(&e.reason()), "{}", e.reason());
            assert_eq!(RegistryError::reason_in(&format!("image \"x\": {}", e.with_reason())), Some(e.reason()));
        }
        assert_eq!(RegistryError::reason_in("image \"x\": [made-up] whatever"), None, "only known reasons");
        assert_eq!(RegistryError::reason_in("no brackets"), None);
        assert_eq!(RegistryError::reason_in("image \"[::1]:5000/a\": [timeout] registry lookup timed out…"), Some("timeout"), "the first known one, whatever is cut after it");
    }
}
