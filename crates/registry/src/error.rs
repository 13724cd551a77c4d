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
}

impl RegistryError {
    pub fn reason(&self) -> &'static str {
        match self {
            RegistryError::InvalidReference(_) => "invalid_reference",
            RegistryError::Forbidden(_) => "forbidden_address",
            RegistryError::NotAllowed(_) => "not_allowed",
            RegistryError::Unauthorized { .. } => "unauthorized",
            RegistryError::NotFound(_) => "not_found",
            RegistryError::Timeout(_) => "timeout",
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

    /// Worth trying the next endpoint (a mirror failing falls back to the origin).
    pub(crate) fn is_endpoint_failure(&self) -> bool {
        matches!(
            self,
            RegistryError::Unavailable(_) | RegistryError::NotFound(_) | RegistryError::RateLimited | RegistryError::Unauthorized { .. }
        )
    }
}
