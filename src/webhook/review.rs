//! Decoding an AdmissionReview body, with a precise error for each way it can be wrong.

use kube::core::admission::{AdmissionRequest, AdmissionReview};
use kube::core::DynamicObject;

pub type Request = AdmissionRequest<DynamicObject>;

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("body is not JSON: {0}")]
    BadJson(serde_json::Error),
    #[error("expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got {api_version:?} {kind:?}")]
    WrongVersion { api_version: String, kind: String },
    #[error("AdmissionReview does not match the admission.k8s.io/v1 schema: {0}")]
    BadShape(serde_json::Error),
    #[error("AdmissionReview has no request")]
    NoRequest,
    #[error("AdmissionReview request has no uid")]
    NoUid,
}

impl ReviewError {
    pub fn reason(&self) -> &'static str {
        match self {
            ReviewError::BadJson(_) => "bad_json",
            ReviewError::WrongVersion { .. } => "wrong_version",
            ReviewError::BadShape(_) => "bad_shape",
            ReviewError::NoRequest => "no_request",
            ReviewError::NoUid => "no_uid",
        }
    }
}

pub fn decode(body: &[u8]) -> Result<Request, ReviewError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(ReviewError::BadJson)?;
    let api_version = value.get("apiVersion").and_then(|v| v.as_str()).unwrap_or_default();
    let kind = value.get("kind").and_then(|v| v.as_str()).unwrap_or_default();
    if api_version != "admission.k8s.io/v1" || kind != "AdmissionReview" {
        return Err(ReviewError::WrongVersion { api_version: api_version.into(), kind: kind.into() });
    }
    if value.get("request").is_none_or(|r| r.is_null()) {
        return Err(ReviewError::NoRequest);
    }
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(value).map_err(ReviewError::BadShape)?;
    let request: Request = review.try_into().map_err(|_| ReviewError::NoRequest)?;
    if request.uid.is_empty() {
        return Err(ReviewError::NoUid);
    }
    Ok(request)
}

/// The answer to one review. Serialised by hand rather than with kube's `AdmissionResponse`,
/// which writes `patch` as an array of numbers: the API's wire form is a base64 string.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    pub uid: String,
    pub allowed: bool,
    /// HTTP-style code and message for denials.
    pub status: Option<(u16, String, String)>,
    pub patch: Option<json_patch::Patch>,
    pub warnings: Vec<String>,
    pub audit_annotations: std::collections::BTreeMap<String, String>,
}

impl Answer {
    pub fn allow(uid: &str) -> Self {
        Self { uid: uid.to_string(), allowed: true, ..Default::default() }
    }

    pub fn deny(mut self, message: &str) -> Self {
        self.allowed = false;
        self.status = Some((403, "Forbidden".into(), message.to_string()));
        self.patch = None;
        self
    }

    pub fn to_review(&self) -> serde_json::Value {
        use base64::Engine;
        let mut response = serde_json::json!({"uid": self.uid, "allowed": self.allowed});
        if let Some((code, reason, message)) = &self.status {
            response["status"] = serde_json::json!({"status": "Failure", "code": code, "reason": reason, "message": message});
        }
        if let Some(p) = &self.patch {
            let bytes = serde_json::to_vec(p).unwrap_or_default();
            response["patchType"] = "JSONPatch".into();
            response["patch"] = base64::engine::general_purpose::STANDARD.encode(bytes).into();
        }
        if !self.warnings.is_empty() {
            response["warnings"] = serde_json::json!(self.warnings);
        }
        if !self.audit_annotations.is_empty() {
            response["auditAnnotations"] = serde_json::json!(self.audit_annotations);
        }
        serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
    }
}
