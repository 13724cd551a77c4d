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
