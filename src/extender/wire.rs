//! The scheduler extender wire format (k8s.io/kube-scheduler/extender/v1). Its Go structs carry
//! no json tags, so the keys are the Go field names; Go's decoder matches keys in any letter case,
//! so Archer accepts any case on input and answers with the exact Go names.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error("body is not a JSON object: {0}")]
    BadJson(String),
    #[error("ExtenderArgs has no Pod")]
    NoPod,
    #[error("ExtenderArgs.Pod is not a v1 Pod: {0}")]
    BadPod(serde_json::Error),
    #[error("ExtenderArgs has neither Nodes nor NodeNames")]
    NoNodes,
    #[error("ExtenderArgs.Nodes is not a v1 NodeList: {0}")]
    BadNodes(String),
    #[error("ExtenderArgs.NodeNames is not a list of names: {0}")]
    BadNodeNames(String),
}

impl ArgsError {
    pub fn reason(&self) -> &'static str {
        match self {
            ArgsError::BadJson(_) => "bad_json",
            ArgsError::NoPod => "no_pod",
            ArgsError::BadPod(_) => "bad_pod",
            ArgsError::NoNodes => "no_nodes",
            ArgsError::BadNodes(_) => "bad_nodes",
            ArgsError::BadNodeNames(_) => "bad_node_names",
        }
    }
}

/// The few fields of a Node the extender needs, borrowed from the request body.
#[derive(Debug, Deserialize)]
pub struct NodeLite<'a> {
    #[serde(borrow)]
    pub metadata: MetaLite<'a>,
    #[serde(borrow, default)]
    pub status: Option<StatusLite<'a>>,
}

#[derive(Debug, Deserialize)]
pub struct MetaLite<'a> {
    #[serde(borrow, default)]
    pub name: Cow<'a, str>,
    #[serde(borrow, default)]
    pub labels: Option<LabelsLite<'a>>,
    #[serde(borrow, default)]
    pub annotations: Option<AnnotationsLite<'a>>,
}

/// Only the labels the extender reads; serde skips the rest without allocating.
#[derive(Debug, Deserialize, Default)]
pub struct LabelsLite<'a> {
    #[serde(borrow, default, rename = "kubernetes.io/arch")]
    pub arch: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "kubernetes.io/os")]
    pub os: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "node.kubernetes.io/instance-type")]
    pub instance_type: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "beta.kubernetes.io/instance-type")]
    pub instance_type_beta: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "topology.kubernetes.io/region")]
    pub region: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "failure-domain.beta.kubernetes.io/region")]
    pub region_beta: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "karpenter.sh/capacity-type")]
    pub karpenter_capacity_type: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "archer.dev/capacity-type")]
    pub capacity_type: Option<Cow<'a, str>>,
}

impl LabelsLite<'_> {
    pub fn get(&self, key: &str) -> Option<&str> {
        use archer_core::labels as l;
        let v = match key {
            l::ARCH => &self.arch,
            l::OS => &self.os,
            l::INSTANCE_TYPE => &self.instance_type,
            l::INSTANCE_TYPE_BETA => &self.instance_type_beta,
            l::REGION => &self.region,
            l::REGION_BETA => &self.region_beta,
            l::KARPENTER_CAPACITY_TYPE => &self.karpenter_capacity_type,
            l::CAPACITY_TYPE => &self.capacity_type,
            _ => return None,
        };
        v.as_deref()
    }
}

#[derive(Debug, Deserialize, Default)]
pub struct AnnotationsLite<'a> {
    #[serde(borrow, default, rename = "archer.dev/price-per-hour")]
    pub price: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
pub struct StatusLite<'a> {
    #[serde(borrow, default)]
    pub allocatable: Option<AllocatableLite<'a>>,
}

#[derive(Debug, Deserialize, Default)]
pub struct AllocatableLite<'a> {
    #[serde(borrow, default)]
    pub cpu: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub memory: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub pods: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct NodeListIn<'a> {
    #[serde(borrow, default)]
    items: Vec<&'a RawValue>,
}

/// One node of the request: its raw JSON (echoed back verbatim) and the parsed facts.
pub struct NodeIn<'a> {
    pub raw: &'a str,
    pub lite: NodeLite<'a>,
}

pub enum Nodes<'a> {
    /// nodeCacheCapable: false.
    Full(Vec<NodeIn<'a>>),
    /// nodeCacheCapable: true.
    Names(Vec<String>),
}

pub struct Args<'a> {
    pub pod: Pod,
    pub nodes: Nodes<'a>,
}

/// Parse ExtenderArgs. The node list of a `nodeCacheCapable: false` call is tens of MiB: each
/// node is kept as its raw text (to echo back) plus the handful of fields Archer reads, and the
/// per-node parse runs on all cores for large lists.
pub fn parse_args(body: &[u8]) -> Result<Args<'_>, ArgsError> {
    // One pass over the body: the node list's items are split out as it is read.
    let Ok(top) = serde_json::from_slice::<TopIn<'_>>(body) else {
        return parse_args_slowly(body);
    };
    let pod_raw = top.pod.ok_or(ArgsError::NoPod)?;
    let pod: Pod = serde_json::from_str(pod_raw.get()).map_err(ArgsError::BadPod)?;
    let nodes = if let Some(list) = top.nodes {
        Nodes::Full(parse_nodes(&list.items)?)
    } else if let Some(raw) = top.node_names {
        Nodes::Names(serde_json::from_str(raw.get()).map_err(|e| ArgsError::BadNodeNames(e.to_string()))?)
    } else {
        return Err(ArgsError::NoNodes);
    };
    Ok(Args { pod, nodes })
}

/// The top level of ExtenderArgs, keys matched in any letter case, `null` meaning absent.
struct TopIn<'a> {
    pod: Option<&'a RawValue>,
    nodes: Option<NodeListIn<'a>>,
    node_names: Option<&'a RawValue>,
}

impl<'de> Deserialize<'de> for TopIn<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = TopIn<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("ExtenderArgs")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut top = TopIn { pod: None, nodes: None, node_names: None };
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    if key.eq_ignore_ascii_case("pod") {
                        top.pod = Some(map.next_value::<&'de RawValue>()?).filter(|r| r.get() != "null");
                    } else if key.eq_ignore_ascii_case("nodes") {
                        top.nodes = map.next_value::<Option<NodeListIn<'de>>>()?;
                    } else if key.eq_ignore_ascii_case("nodenames") {
                        top.node_names = Some(map.next_value::<&'de RawValue>()?).filter(|r| r.get() != "null");
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(top)
            }
        }
        d.deserialize_map(V)
    }
}

/// The error path: say precisely which part of the body is wrong.
fn parse_args_slowly(body: &[u8]) -> Result<Args<'_>, ArgsError> {
    let top: HashMap<Cow<'_, str>, &RawValue> = serde_json::from_slice(body).map_err(|e| ArgsError::BadJson(e.to_string()))?;
    let field = |name: &str| top.iter().find(|(k, v)| k.eq_ignore_ascii_case(name) && v.get() != "null").map(|(_, v)| *v);
    let pod_raw = field("Pod").ok_or(ArgsError::NoPod)?;
    let pod: Pod = serde_json::from_str(pod_raw.get()).map_err(ArgsError::BadPod)?;
    let nodes = if let Some(raw) = field("Nodes") {
        let list: NodeListIn<'_> = serde_json::from_str(raw.get()).map_err(|e| ArgsError::BadNodes(e.to_string()))?;
        Nodes::Full(parse_nodes(&list.items)?)
    } else if let Some(raw) = field("NodeNames") {
        Nodes::Names(serde_json::from_str(raw.get()).map_err(|e| ArgsError::BadNodeNames(e.to_string()))?)
    } else {
        return Err(ArgsError::NoNodes);
    };
    Ok(Args { pod, nodes })
}

const PARALLEL_PARSE_MIN: usize = 512;

fn parse_nodes<'a>(items: &[&'a RawValue]) -> Result<Vec<NodeIn<'a>>, ArgsError> {
    let one = |item: &&'a RawValue| -> Result<NodeIn<'a>, ArgsError> {
        let raw: &'a str = item.get();
        let lite: NodeLite<'a> = serde_json::from_str(raw).map_err(|e| ArgsError::BadNodes(e.to_string()))?;
        Ok(NodeIn { raw, lite })
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    if items.len() < PARALLEL_PARSE_MIN || threads < 2 {
        return items.iter().map(one).collect();
    }
    let chunk = items.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = items.chunks(chunk).map(|c| scope.spawn(move || c.iter().map(one).collect::<Result<Vec<_>, _>>())).collect();
        let mut out = Vec::with_capacity(items.len());
        for h in handles {
            out.extend(h.join().map_err(|_| ArgsError::BadNodes("node parser thread panicked".into()))??);
        }
        Ok(out)
    })
}

/// `ExtenderFilterResult`, with the Go field names. Kept nodes of a full-Node call are the raw
/// text of the request's items, written back verbatim (no re-parse, no re-encode).
#[derive(Debug, Default)]
pub struct FilterResult<'a> {
    pub nodes: Option<Vec<&'a str>>,
    pub node_names: Option<Vec<String>>,
    pub failed_nodes: BTreeMap<String, String>,
    pub failed_and_unresolvable: BTreeMap<String, String>,
    pub error: String,
}

/// JSON of plain data (strings, lists, string maps): cannot fail for these types.
fn plain_json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_else(|_| b"null".to_vec())
}

impl FilterResult<'_> {
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.nodes.as_ref().map_or(256, |n| n.iter().map(|s| s.len() + 1).sum::<usize>() + 256));
        out.extend_from_slice(b"{\"Nodes\":");
        match &self.nodes {
            None => out.extend_from_slice(b"null"),
            Some(items) => {
                out.extend_from_slice(br#"{"apiVersion":"v1","kind":"NodeList","metadata":{},"items":["#);
                for (i, raw) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(raw.as_bytes());
                }
                out.extend_from_slice(b"]}");
            }
        }
        out.extend_from_slice(b",\"NodeNames\":");
        out.extend(plain_json(&self.node_names));
        out.extend_from_slice(b",\"FailedNodes\":");
        out.extend(plain_json(&self.failed_nodes));
        out.extend_from_slice(b",\"FailedAndUnresolvableNodes\":");
        out.extend(plain_json(&self.failed_and_unresolvable));
        out.extend_from_slice(b",\"Error\":");
        out.extend(plain_json(&self.error));
        out.push(b'}');
        out
    }
}

/// `HostPriority`, with the Go field names.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostPriority {
    #[serde(rename = "Host")]
    pub host: String,
    #[serde(rename = "Score")]
    pub score: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_in_any_case_and_null_means_absent() {
        let body = br#"{"pod": {"metadata": {"name": "p"}}, "NODES": null, "nodenames": ["a", "b"]}"#;
        let args = parse_args(body).expect("args");
        assert_eq!(args.pod.metadata.name.as_deref(), Some("p"));
        assert!(matches!(args.nodes, Nodes::Names(ref n) if n == &["a", "b"]));
        let body = br#"{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": {"name": "n1", "labels": {"kubernetes.io/arch": "arm64"}}, "status": {"allocatable": {"cpu": "2"}}}]}}"#;
        let args = parse_args(body).expect("args");
        let Nodes::Full(nodes) = args.nodes else { panic!("full nodes expected") };
        assert_eq!(nodes[0].lite.metadata.name, "n1");
        assert!(nodes[0].raw.starts_with("{\"metadata\""));
    }

    #[test]
    fn bad_args_have_reasons() {
        for (body, reason) in [
            (&b"nope"[..], "bad_json"),
            (br#"{"Nodes": {"items": []}}"#, "no_pod"),
            (br#"{"Pod": {"metadata": {"name": "p"}}}"#, "no_nodes"),
            (br#"{"Pod": {"spec": {"containers": 5}}, "NodeNames": []}"#, "bad_pod"),
            (br#"{"Pod": {}, "NodeNames": [1, 2]}"#, "bad_node_names"),
            (br#"{"Pod": {}, "Nodes": {"items": [{"metadata": 7}]}}"#, "bad_nodes"),
        ] {
            let err = parse_args(body).err().unwrap_or_else(|| panic!("{} should fail", String::from_utf8_lossy(body)));
            assert_eq!(err.reason(), reason, "{err}");
        }
    }

    #[test]
    fn results_use_go_field_names() {
        let r = FilterResult { node_names: Some(vec!["a".into()]), ..Default::default() };
        let v: serde_json::Value = serde_json::from_slice(&r.to_json()).expect("json");
        assert_eq!(v, serde_json::json!({"Nodes": null, "NodeNames": ["a"], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}));
        let mut failed = BTreeMap::new();
        failed.insert("n2".to_string(), "why \"quoted\"".to_string());
        let r = FilterResult { nodes: Some(vec![r#"{"metadata":{"name":"n1"}}"#, r#"{"metadata":{"name":"n3"}}"#]), failed_and_unresolvable: failed, ..Default::default() };
        let v: serde_json::Value = serde_json::from_slice(&r.to_json()).expect("json");
        assert_eq!(v["Nodes"]["items"][1]["metadata"]["name"], "n3");
        assert_eq!(v["Nodes"]["kind"], "NodeList");
        assert_eq!(v["FailedAndUnresolvableNodes"]["n2"], "why \"quoted\"");
        let h = serde_json::to_value(HostPriority { host: "n".into(), score: 7 }).expect("json");
        assert_eq!(h, serde_json::json!({"Host": "n", "Score": 7}));
    }
}
