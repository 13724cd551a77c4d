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
        Err(shape_error) => return Err(explain(body, shape_error)),
    };
    check_version(&review.api_version, &review.kind)?;
    let request = review.request.ok_or(ReviewError::NoRequest)?;
    if request.uid.is_empty() {
        return Err(ReviewError::NoUid);
    }
    Ok(request)
}

/// Only on the error path: say precisely what is wrong, without building the document (a
/// `Value` of a hostile body costs many times its size).
fn explain(body: &[u8], shape_error: serde_json::Error) -> ReviewError {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe<'a> {
        #[serde(borrow, default)]
        api_version: Option<&'a RawValue>,
        #[serde(borrow, default)]
        kind: Option<&'a RawValue>,
        #[serde(borrow, default)]
        request: Option<&'a RawValue>,
    }
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(body) {
        return ReviewError::BadJson(e);
    }
    let Ok(probe) = serde_json::from_slice::<Probe<'_>>(body) else {
        return ReviewError::WrongVersion { api_version: String::new(), kind: String::new() };
    };
    let text = |r: Option<&RawValue>| r.and_then(|r| serde_json::from_str::<String>(r.get()).ok()).unwrap_or_default();
    if let Err(e) = check_version(&text(probe.api_version), &text(probe.kind)) {
        return e;
    }
    if probe.request.is_none_or(|r| r.get() == "null") {
        return ReviewError::NoRequest;
    }
    ReviewError::BadShape(shape_error)
}

/// The answer to one review. Serialised by hand rather than with kube's `AdmissionResponse`,
/// which writes `patch` as an array of numbers: the API's wire form is a base64 string.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    pub uid: String,
    pub allowed: bool,
    /// HTTP-style code and message for denials.
    pub status: Option<(u16, String, String)>,
    /// The JSON patch, base64-encoded as the API's wire form has it.
    pub patch: Option<String>,
    pub warnings: Vec<String>,
    pub audit_annotations: std::collections::BTreeMap<String, String>,
}

/// The wire form of an answer: typed, so writing it cannot fail and builds no `Value` tree.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<&'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    audit_annotations: &'a std::collections::BTreeMap<String, String>,
}

#[derive(serde::Serialize)]
struct StatusOut<'a> {
    status: &'static str,
    code: u16,
    reason: &'a str,
    message: &'a str,
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

    /// With these patch operations (none: no patch).
    pub fn with_patch(mut self, ops: &[archer_core::patch::Op]) -> Self {
        use base64::Engine;
        self.patch = (!ops.is_empty()).then(|| base64::engine::general_purpose::STANDARD.encode(archer_core::patch::to_json(ops)));
        self
    }

    /// The `admission.k8s.io/v1` AdmissionReview carrying this answer, as JSON bytes.
    pub fn to_json(&self) -> Vec<u8> {
        self.to_json_for(&self.uid)
    }

    /// The same answer to the review `uid` (a remembered decision given to another pod).
    pub fn to_json_for(&self, uid: &str) -> Vec<u8> {
        let review = ReviewOut {
            api_version: "admission.k8s.io/v1",
            kind: "AdmissionReview",
            response: ResponseOut {
                uid,
                allowed: self.allowed,
                status: self.status.as_ref().map(|(code, reason, message)| StatusOut { status: "Failure", code: *code, reason, message }),
                patch_type: self.patch.as_ref().map(|_| "JSONPatch"),
                patch: self.patch.as_deref(),
                warnings: &self.warnings,
                audit_annotations: &self.audit_annotations,
            },
        };
        // Strings, numbers and string maps: serialising them cannot fail.
        serde_json::to_vec(&review).unwrap_or_default()
    }

    /// This answer written once for the many reviews that reuse it (a workload's replicas): its
    /// JSON before the uid's value and after it. Writing the whole answer again for each
    /// replica (the base64 patch escaped and copied) was the largest part of what a reused
    /// decision cost after its span (issue #45).
    pub fn wire(&self) -> Wire {
        const UID: &[u8] = b"\"uid\":\"\"";
        let json = self.to_json_for("");
        // The response's uid is the first one: apiVersion and kind come before it and are fixed.
        let split = json.windows(UID.len()).position(|w| w == UID).and_then(|at| Some((json.get(..at + UID.len() - 2)?, json.get(at + UID.len()..)?)));
        Wire { split: split.map(|(before, after)| (before.to_vec(), after.to_vec())) }
    }
}

/// An answer's JSON around its uid ([`Answer::wire`]); `None` if the uid was not found, which
/// [`Answer::to_json_for`] never writes.
#[derive(Debug)]
pub struct Wire {
    split: Option<(Vec<u8>, Vec<u8>)>,
}

impl Wire {
    /// The answer to the review `uid`: the same bytes [`Answer::to_json_for`] writes (`None`
    /// when the uid had no place found: the caller writes the answer itself).
    pub fn for_uid(&self, uid: &str) -> Option<Vec<u8>> {
        let (before, after) = self.split.as_ref()?;
        let mut out = Vec::with_capacity(before.len() + uid.len() + 2 + after.len());
        out.extend_from_slice(before);
        // A string always serialises (escaped); writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, uid);
        out.extend_from_slice(after);
        Some(out)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.split.as_ref().map_or(0, |(b, a)| b.len() + a.len())
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
///
/// The scheduling constraints are held as borrowed raw JSON until then, and are decoded
/// straight into their typed API structs by [`PodView::into_pod`]: no intermediate `Value`, and
/// no re-parse of anything but those slices. Every part a decision reads (metadata names, labels
/// and annotations, the constraints, containers' names and images) is decoded with the very
/// types a full `Pod` decode uses, so the two accept and refuse the same documents there: typed
/// structs have a fixed depth, and JSON nested deeper than the API's schema is a type error,
/// never a recursion-limit panic. Parts the view skips are not type-checked (kube-apiserver has
/// validated them).
pub fn pod_view(raw: &str) -> Result<PodView<'_>, serde_json::Error> {
    serde_json::from_str(raw)
}

impl PodView<'_> {
    fn constraint_bytes(&self) -> usize {
        self.spec.as_ref().map_or(0, |s| [s.node_selector, s.affinity, s.tolerations, s.image_pull_secrets, s.scheduling_gates].iter().flatten().map(|r| r.get().len()).sum())
    }

    /// Why this pod is too large to decide on, if it is.
    pub fn too_large(&self) -> Option<String> {
        let bytes = self.constraint_bytes();
        (bytes > MAX_CONSTRAINT_BYTES).then(|| format!("the pod's scheduling constraints are {bytes} bytes of JSON, over archer's {MAX_CONSTRAINT_BYTES}-byte limit"))
    }

    /// Bytes of memory the decoded pod will take, at most.
    pub fn decoded_cost(&self) -> usize {
        let containers = self.spec.as_ref().map_or(0, |s| s.containers.len() + s.init_containers.as_ref().map_or(0, Vec::len));
        self.constraint_bytes().saturating_mul(CONSTRAINT_EXPANSION).saturating_add(containers.saturating_mul(CONTAINER_COST))
    }

    /// The pod's name, or its generateName when it has none yet (a controller's pods).
    pub fn name(&self) -> &str {
        self.metadata.as_ref().and_then(|m| m.name.as_deref().or(m.generate_name.as_deref())).unwrap_or("")
    }

    /// Whether the pod carries `archer.dev/ignore: "true"`.
    pub fn ignored(&self) -> bool {
        let labels = self.metadata.as_ref().and_then(|m| m.labels.as_ref());
        labels.and_then(|l| l.0.get(archer_core::policy::IGNORE_LABEL)).is_some_and(|v| v == "true")
    }

    /// Everything the decision reads of this pod, with the namespace it is created in and the
    /// policy in force there, as a key of the decision memo ([`super::memo`]); `None` when that
    /// is longer than the memo keeps. The pod's name and everything the view skips are not in
    /// it: they do not change the decision.
    pub fn memo_key(&self, namespace: &str, policy: &archer_core::policy::Policy) -> Option<Vec<u8>> {
        let mut k = super::key::KeyWriter::default();
        k.part(namespace.as_bytes());
        policy_key(&mut k, policy);
        let meta = self.metadata.as_ref();
        k.optional(meta.and_then(|m| m.namespace.as_deref()).map(str::as_bytes));
        for map in [meta.and_then(|m| m.labels.as_ref()), meta.and_then(|m| m.annotations.as_ref())] {
            k.optional(map.map(|_| &b""[..]));
            k.count(map.map_or(0, |m| m.0.len()));
            for (key, value) in map.iter().flat_map(|m| m.0.iter()) {
                k.part(key.as_bytes()).part(value.as_bytes());
            }
        }
        let spec = self.spec.as_ref();
        k.optional(spec.map(|_| &b""[..]));
        if let Some(s) = spec {
            for raw in [s.node_selector, s.affinity, s.tolerations, s.image_pull_secrets, s.scheduling_gates] {
                k.optional(raw.map(|r| r.get().as_bytes()));
            }
            k.optional(s.service_account_name.as_deref().map(str::as_bytes));
            k.optional(s.init_containers.as_ref().map(|_| &b""[..]));
            k.count(s.init_containers.as_ref().map_or(0, Vec::len)).count(s.containers.len());
            for c in s.init_containers.iter().flatten().chain(s.containers.iter()) {
                k.part(c.name.as_bytes()).optional(c.image.as_deref().map(str::as_bytes));
            }
        }
        k.finish()
    }

    /// The typed pod the decision takes.
    pub fn into_pod(self) -> Result<k8s_openapi::api::core::v1::Pod, serde_json::Error> {
        use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        fn typed<T: serde::de::DeserializeOwned>(raw: Option<&RawValue>) -> Result<Option<T>, serde_json::Error> {
            raw.map(|r| serde_json::from_str::<Option<T>>(r.get())).transpose().map(Option::flatten)
        }
        let meta = self.metadata.unwrap_or_default();
        let owned = |m: Option<ArcherKeys<'_>>| m.map(|k| k.0.into_iter().map(|(k, v)| (k.into_owned(), v)).collect());
        let metadata = ObjectMeta {
            name: meta.name,
            generate_name: meta.generate_name,
            namespace: meta.namespace,
            labels: owned(meta.labels),
            annotations: owned(meta.annotations),
            ..ObjectMeta::default()
        };
        let container = |c: ContainerView| Container { name: c.name, image: c.image, ..Container::default() };
        let spec = match self.spec {
            None => None,
            Some(s) => Some(PodSpec {
                node_selector: typed(s.node_selector)?,
                affinity: typed(s.affinity)?,
                tolerations: typed(s.tolerations)?,
                image_pull_secrets: typed(s.image_pull_secrets)?,
                scheduling_gates: typed(s.scheduling_gates)?,
                service_account_name: s.service_account_name,
                containers: s.containers.into_iter().map(container).collect(),
                init_containers: s.init_containers.map(|cs| cs.into_iter().map(container).collect()),
                ..PodSpec::default()
            }),
        };
        Ok(Pod { metadata, spec, status: None })
    }
}

/// The policy's every field, in the key.
fn policy_key(k: &mut super::key::KeyWriter, p: &archer_core::policy::Policy) {
    k.part(p.mode.as_str().as_bytes()).part(p.on_inspection_failure.as_str().as_bytes());
    k.part(if p.pin_digests { b"pin" } else { b"tag" });
    k.optional(p.fallback_architecture.as_deref().map(str::as_bytes));
    k.count(p.prefer.len());
    for a in &p.prefer {
        k.part(a.as_bytes());
    }
    k.optional(p.allowed_architectures.as_ref().map(|_| &b""[..]));
    k.count(p.allowed_architectures.as_ref().map_or(0, Vec::len));
    for a in p.allowed_architectures.iter().flatten() {
        k.part(a.as_bytes());
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
    /// Other controllers' gates: gate mode appends Archer's after them, never in their place.
    #[serde(borrow, default)]
    scheduling_gates: Option<&'a RawValue>,
    #[serde(default)]
    service_account_name: Option<String>,
    #[serde(default)]
    containers: Vec<ContainerView>,
    #[serde(default)]
    init_containers: Option<Vec<ContainerView>>,
}

#[derive(Deserialize)]
struct ContainerView {
    #[serde(default)]
    name: String,
    #[serde(default)]
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
                // Every value is checked to be a string, so a value a full decode refuses is
                // refused here too; only Archer's keys are kept (and allocated).
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    if key.0.starts_with("archer.dev/") {
                        kept.insert(key.0, map.next_value::<String>()?);
                    } else {
                        map.next_value::<Str<'de>>()?;
                    }
                }
                Ok(ArcherKeys(kept))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// A JSON string, borrowed from the body when it has no escapes.
struct Str<'a>(std::borrow::Cow<'a, str>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(std::borrow::Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(std::borrow::Cow::Owned(v)))
            }
        }
        d.deserialize_str(Visit)
    }
}


#[cfg(test)]
mod view_tests {
    use super::{decision_pod, pod_view};
    use archer_core::policy::{resolve, PolicyDefaults};

    const POD: &str = r#"{"metadata":{"name":"web-7f9c-abcde","generateName":"web-7f9c-","namespace":"shop","labels":{"app":"web","pod-template-hash":"7f9c"},"annotations":{"note":"x"}},
        "spec":{"tolerations":[{"key":"k","operator":"Exists"}],"containers":[{"name":"app","image":"example.com/app:1","env":[{"name":"A","value":"1"}]}]}}"#;

    fn key(raw: &str, namespace: &str) -> Option<Vec<u8>> {
        let policy = resolve(&PolicyDefaults::default(), &Default::default()).0;
        pod_view(raw).expect("view").memo_key(namespace, &policy)
    }

    #[test]
    fn replicas_share_a_memo_key_and_every_input_of_the_decision_changes_it() {
        let base = key(POD, "shop").expect("key");
        // What the decision does not read: the name, other labels and annotations, env.
        let replica = POD.replace("web-7f9c-abcde", "web-7f9c-zzzzz").replace("\"app\":\"web\"", "\"app\":\"other\"").replace("\"A\",\"value\":\"1\"", "\"A\",\"value\":\"2\"");
        assert_eq!(key(&replica, "shop").as_ref(), Some(&base));
        let changed = [
            POD.replace("example.com/app:1", "example.com/app:2"),
            POD.replace("\"name\":\"app\"", "\"name\":\"main\""),
            POD.replace("\"operator\":\"Exists\"", "\"operator\":\"Equal\""),
            POD.replace("\"note\":\"x\"", "\"archer.dev/decision\":\"enforced\""),
            POD.replace("\"app\":\"web\"", "\"archer.dev/ignore\":\"false\""),
            POD.replace("\"spec\":{", "\"spec\":{\"nodeSelector\":{\"a\":\"b\"},"),
            POD.replace("\"spec\":{", "\"spec\":{\"serviceAccountName\":\"builder\","),
            POD.replace("\"spec\":{", "\"spec\":{\"imagePullSecrets\":[{\"name\":\"s\"}],"),
            POD.replace("\"spec\":{", "\"spec\":{\"initContainers\":[],"),
            POD.replace("\"spec\":{", "\"spec\":{\"schedulingGates\":[{\"name\":\"example.com/quota\"}],"),
            POD.replace(",\"annotations\":{\"note\":\"x\"}", ""),
        ];
        for c in &changed {
            assert_ne!(key(c, "shop").as_ref(), Some(&base), "{c}");
        }
        assert_ne!(key(POD, "other").as_ref(), Some(&base));
        let policy = resolve(&PolicyDefaults::default(), &[("archer.dev/prefer".to_string(), "amd64".to_string())].into()).0;
        assert_ne!(pod_view(POD).expect("view").memo_key("shop", &policy).as_ref(), Some(&base));
        // Constraints too large for a key are never remembered.
        let large = POD.replace("\"spec\":{", &format!("\"spec\":{{\"nodeSelector\":{{\"a\":\"{}\"}},", "v".repeat(5000)));
        assert!(key(&large, "shop").is_none());
    }

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

    #[test]
    fn gate_mode_keeps_another_controllers_gate_and_appends_its_own() {
        let raw = r#"{"metadata":{"name":"p","namespace":"ns"},"spec":{"schedulingGates":[{"name":"example.com/quota"}],"containers":[{"name":"c","image":"nginx"}]}}"#;
        let mut pod = decision_pod(raw).expect("pod");
        let ops = archer_core::patch::add_scheduling_gate(&mut pod, archer_core::safety_net::GATE);
        // Applied to the pod as the API server holds it, as the API server applies a JSON patch.
        let mut stored: serde_json::Value = serde_json::from_str(raw).expect("json");
        let patch: json_patch::Patch = serde_json::from_slice(&archer_core::patch::to_json(&ops)).expect("patch");
        json_patch::patch(&mut stored, &patch).expect("applies");
        assert_eq!(stored["spec"]["schedulingGates"], serde_json::json!([{"name": "example.com/quota"}, {"name": "archer.dev/inspecting"}]), "both gates, the other controller's first");
    }
}

#[cfg(test)]
mod wire_tests {
    use super::Answer;

    #[test]
    fn a_remembered_answer_written_for_a_uid_is_the_answer_written_for_it() {
        let mut patched = Answer::allow("first").with_patch(&[]);
        patched.patch = Some("W3sib3AiOiJhZGQifV0=".into());
        patched.warnings = vec!["a \"quoted\" warning\n".into()];
        patched.audit_annotations.insert("decision".into(), "enforced".into());
        let denied = Answer::allow("first").deny("images share no platform: \"uid\":\"\"");
        let plain = Answer::allow("");
        for answer in [patched, denied, plain] {
            let wire = answer.wire();
            for uid in ["705ab4f5-6393-11e8-b7cc-42010a800002", "", "odd \"uid\" \\ \u{1} é", "\"uid\":\"\""] {
                assert_eq!(wire.for_uid(uid).map(String::from_utf8), Some(String::from_utf8(answer.to_json_for(uid))), "uid {uid:?}");
            }
        }
    }
}
