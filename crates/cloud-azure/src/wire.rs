//! What the ARM client and the token exchange share: their error, and reading an answer within a
//! bound.

/// The largest answer read (a page of 1,000 VMs is about 5 MiB).
const MAX_BODY: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ArmError {
    /// ARM answered with an error (its code and message), or an operation ended `Failed`.
    #[error("{code}: {message} (HTTP {status})")]
    Service { status: u16, code: String, message: String },
    #[error("Azure Resource Manager could not be reached: {0}")]
    Transport(String),
    #[error("unexpected answer from Azure Resource Manager: {0}")]
    Decode(String),
    #[error("no token for Azure Resource Manager: {0}")]
    Auth(String),
    #[error("{0} did not finish in time")]
    Timeout(String),
}

impl ArmError {
    /// ARM's error code (`SkuNotAvailable`, `AllocationFailed`, ...), if ARM gave one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ArmError::Service { code, .. } => Some(code),
            _ => None,
        }
    }

    pub fn message(&self) -> String {
        match self {
            ArmError::Service { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }
}

/// The body, or an error once it passes [`MAX_BODY`] (read as it arrives, never whole first).
pub(crate) async fn read_limited(mut resp: reqwest::Response) -> Result<Vec<u8>, ArmError> {
    if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(ArmError::Decode(format!("an answer of more than {MAX_BODY} bytes")));
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| ArmError::Transport(error_chain(&e)))? {
        if out.len() + chunk.len() > MAX_BODY {
            return Err(ArmError::Decode(format!("an answer of more than {MAX_BODY} bytes")));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
