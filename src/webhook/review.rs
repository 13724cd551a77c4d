//! Decoding an AdmissionReview body, with a precise error for each way it can be wrong.
//!
//! The review is parsed once; the object stays raw JSON until the handler knows it is a pod,
//! and is then decoded straight into a typed Pod (no intermediate `Value` tree).

use serde::Deserialize;
use serde_json::value::RawValue;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn<'a> {
    api_version: String,
    kind: String,
    #[serde(borrow, default)]
    request: Option<Request<'a>>,
}

#[derive(Debug, Deserialize, Default)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

/// The parts of an `admission.k8s.io/v1` AdmissionRequest Archer uses.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request<'a> {
    pub uid: String,
    pub kind: GroupVersionKind,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: String,
    #[serde(default)]
    pub dry_run: Option<bool>,
    #[serde(borrow, default)]
    pub object: Option<&'a RawValue>,
}

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

fn check_version(api_version: &str, kind: &str) -> Result<(), ReviewError> {
    if api_version != "admission.k8s.io/v1" || kind != "AdmissionReview" {
        return Err(ReviewError::WrongVersion { api_version: api_version.into(), kind: kind.into() });
    }
    Ok(())
}

pub fn decode(body: &[u8]) -> Result<Request<'_>, ReviewError> {
    let review: ReviewIn<'_> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(shape_error) => {
            // Only on the error path: say precisely what is wrong.
            let value: serde_json::Value = serde_json::from_slice(body).map_err(ReviewError::BadJson)?;
            let field = |k: &str| value.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_string();
            check_version(&field("apiVersion"), &field("kind"))?;
            if value.get("request").is_none_or(|r| r.is_null()) {
                return Err(ReviewError::NoRequest);
            }
            return Err(ReviewError::BadShape(shape_error));
        }
    };
    check_version(&review.api_version, &review.kind)?;
    let request = review.request.ok_or(ReviewError::NoRequest)?;
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
