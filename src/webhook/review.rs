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

/// Scheduling constraints (nodeSelector, affinity, tolerations, pull secrets) larger than this
/// are not decided on: no real pod comes near it, and decoded they cost ~45x their JSON.
pub const MAX_CONSTRAINT_BYTES: usize = 512 * 1024;
/// What one decoded byte of constraints costs in memory, decoded, copied and patched (measured
/// worst case: tiny tolerations and match expressions).
const CONSTRAINT_EXPANSION: usize = 48;
/// What one container costs decoded (a Container is a large struct even when nearly empty).
const CONTAINER_COST: usize = 4 * 1024;

/// The pod as the decision reads it, parsed from the review's raw object without the parts no
/// decision looks at (container commands, env, volumes, probes, other annotations...). Decoded
/// whole, a pod costs up to 40 times its JSON (many tiny strings); this view costs what
/// [`PodView::decoded_cost`] says, which the webhook reserves from the memory budget first.
pub fn pod_view(raw: &str) -> Result<PodView<'_>, serde_json::Error> {
    serde_json::from_str(raw)
}

impl PodView<'_> {
    fn constraint_bytes(&self) -> usize {
        self.spec.as_ref().map_or(0, |s| [s.node_selector, s.affinity, s.tolerations, s.image_pull_secrets].iter().flatten().map(|r| r.get().len()).sum())
    }

    /// Why this pod is too large to decide on, if it is.
    pub fn too_large(&self) -> Option<String> {
        let bytes = self.constraint_bytes();
        (bytes > MAX_CONSTRAINT_BYTES).then(|| format!("the pod's scheduling constraints are {bytes} bytes of JSON, over archer's {MAX_CONSTRAINT_BYTES}-byte limit"))
    }

    /// Bytes of memory the decoded pod will take, at most.
    pub fn decoded_cost(&self) -> usize {
        let containers = self.spec.as_ref().map_or(0, |s| s.containers.len() + s.init_containers.as_ref().map_or(0, Vec::len));
        self.constraint_bytes() * CONSTRAINT_EXPANSION + containers * CONTAINER_COST
    }

    /// The typed pod the decision takes.
    pub fn into_pod(self) -> Result<k8s_openapi::api::core::v1::Pod, serde_json::Error> {
        let meta = self.metadata.unwrap_or_default();
        let pod = serde_json::json!({
            "metadata": {
                "name": meta.name, "generateName": meta.generate_name, "namespace": meta.namespace,
                "labels": meta.labels.map(|m| m.0), "annotations": meta.annotations.map(|m| m.0),
            },
            "spec": self.spec.map(|s| serde_json::json!({
                "nodeSelector": s.node_selector, "affinity": s.affinity, "tolerations": s.tolerations,
                "imagePullSecrets": s.image_pull_secrets, "serviceAccountName": s.service_account_name,
                "containers": s.containers, "initContainers": s.init_containers,
            })),
        });
        serde_json::from_value(pod)
    }
}

/// Parse and build in one go.
#[cfg(test)]
fn decision_pod(raw: &str) -> Result<k8s_openapi::api::core::v1::Pod, serde_json::Error> {
    pod_view(raw)?.into_pod()
}

#[derive(Deserialize)]
pub struct PodView<'a> {
    #[serde(borrow, default)]
    metadata: Option<MetaView<'a>>,
    #[serde(borrow, default)]
    spec: Option<SpecView<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct MetaView<'a> {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(borrow, default)]
    labels: Option<ArcherKeys<'a>>,
    #[serde(borrow, default)]
    annotations: Option<ArcherKeys<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecView<'a> {
    #[serde(borrow, default)]
    node_selector: Option<&'a RawValue>,
    #[serde(borrow, default)]
    affinity: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tolerations: Option<&'a RawValue>,
    #[serde(borrow, default)]
    image_pull_secrets: Option<&'a RawValue>,
    #[serde(default)]
    service_account_name: Option<String>,
    #[serde(default)]
    containers: Vec<ContainerView>,
    #[serde(default)]
    init_containers: Option<Vec<ContainerView>>,
}

#[derive(Deserialize, serde::Serialize)]
struct ContainerView {
    #[serde(default)]
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image: Option<String>,
}

/// A string map of which only Archer's own keys (`archer.dev/...`) are kept; the map's presence
/// is kept too, since a patch adds to an existing map and creates a missing one.
struct ArcherKeys<'a>(std::collections::BTreeMap<std::borrow::Cow<'a, str>, String>);

impl<'de: 'a, 'a> Deserialize<'de> for ArcherKeys<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = ArcherKeys<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut kept = std::collections::BTreeMap::new();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key.starts_with("archer.dev/") {
                        kept.insert(key, map.next_value::<String>()?);
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(ArcherKeys(kept))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

impl serde::Serialize for ArcherKeys<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter())
    }
}

#[cfg(test)]
mod view_tests {
    use super::decision_pod;

    #[test]
    fn the_decision_view_keeps_what_decisions_read_and_drops_the_rest() {
        let raw = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns",
            "labels":{"app":"web","archer.dev/ignore":"true"},"annotations":{"other":"x","archer.dev/platforms":"linux/amd64"}},
            "spec":{"nodeSelector":{"kubernetes.io/arch":"amd64"},"serviceAccountName":"sa",
            "imagePullSecrets":[{"name":"s"}],"tolerations":[{"key":"k","operator":"Exists"}],
            "affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"a","operator":"Exists"}]}]}}},
            "containers":[{"name":"c","image":"nginx","env":[{"name":"A","value":"b"}],"args":["x"]}],
            "initContainers":[{"name":"i","image":"busybox"}]}}"#;
        let pod = decision_pod(raw).expect("pod");
        assert_eq!(pod.metadata.name.as_deref(), Some("p"));
        let labels = pod.metadata.labels.expect("labels kept as a map");
        assert_eq!((labels.len(), labels.get("archer.dev/ignore").map(String::as_str)), (1, Some("true")));
        let annotations = pod.metadata.annotations.expect("annotations");
        assert_eq!(annotations.len(), 1, "only archer.dev/ annotations are kept");
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.containers[0].image.as_deref(), Some("nginx"));
        assert!(spec.containers[0].env.is_none() && spec.containers[0].args.is_none());
        assert_eq!(spec.init_containers.expect("init")[0].image.as_deref(), Some("busybox"));
        assert_eq!(spec.node_selector.expect("selector")["kubernetes.io/arch"], "amd64");
        assert!(spec.affinity.is_some() && spec.tolerations.is_some() && spec.image_pull_secrets.is_some());
        assert_eq!(spec.service_account_name.as_deref(), Some("sa"));
        // An annotation map with no Archer keys is still present (a patch adds to it).
        let pod = decision_pod(r#"{"metadata":{"annotations":{"a":"b"}},"spec":{"containers":[]}}"#).expect("pod");
        assert_eq!(pod.metadata.annotations.map(|a| a.len()), Some(0));
        assert!(decision_pod(r#"{"spec":{"containers":"nope"}}"#).is_err());
    }
}
