//! The scheduler extender wire format (k8s.io/kube-scheduler/extender/v1). Its Go structs carry
//! no json tags, so the keys are the Go field names; Go's decoder matches keys in any letter case,
//! so Archer accepts any case on input and answers with the exact Go names.

use std::borrow::Cow;
use std::collections::BTreeMap;

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
/// per-node parse runs on all cores for large lists. Call [`shape`] first: what this builds is
/// what it says, and nothing here is built before the caller has reserved it.
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

/// The top level's three parts as raw JSON, for the error path: a part given more than once
/// counts as given in its last non-null occurrence. Nothing is kept of other keys (a body of
/// millions of keys holds nothing more).
#[derive(Default)]
struct TopRaw<'a> {
    pod: Option<&'a RawValue>,
    nodes: Option<&'a RawValue>,
    node_names: Option<&'a RawValue>,
}

impl<'de> Deserialize<'de> for TopRaw<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = TopRaw<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut top = TopRaw::default();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    let slot = if key.eq_ignore_ascii_case("pod") {
                        &mut top.pod
                    } else if key.eq_ignore_ascii_case("nodes") {
                        &mut top.nodes
                    } else if key.eq_ignore_ascii_case("nodenames") {
                        &mut top.node_names
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        continue;
                    };
                    let raw = map.next_value::<&'de RawValue>()?;
                    if raw.get() != "null" {
                        *slot = Some(raw);
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
    let top: TopRaw<'_> = serde_json::from_slice(body).map_err(|e| ArgsError::BadJson(e.to_string()))?;
    let pod_raw = top.pod.ok_or(ArgsError::NoPod)?;
    let pod: Pod = serde_json::from_str(pod_raw.get()).map_err(ArgsError::BadPod)?;
    let nodes = if let Some(raw) = top.nodes {
        let list: NodeListIn<'_> = serde_json::from_str(raw.get()).map_err(|e| ArgsError::BadNodes(e.to_string()))?;
        Nodes::Full(parse_nodes(&list.items)?)
    } else if let Some(raw) = top.node_names {
        Nodes::Names(serde_json::from_str(raw.get()).map_err(|e| ArgsError::BadNodeNames(e.to_string()))?)
    } else {
        return Err(ArgsError::NoNodes);
    };
    Ok(Args { pod, nodes })
}

/// What a call will build from its body, known before anything is built: one pass over the
/// body that allocates nothing (but the text of an escaped key, briefly).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// The node list's items, or the node names: the larger, if both are given.
    pub nodes: usize,
    /// The most the decoded Pod can take ([`pod_cost`]).
    pub pod_bytes: usize,
}

/// The body's [`Shape`]. A body that is not JSON, or not an object at the top, is refused here
/// (`bad_json`); everything else is left to [`parse_args`] to judge.
pub fn shape(body: &[u8]) -> Result<Shape, ArgsError> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_slice(body);
    let shape = TopShape.deserialize(&mut de).and_then(|s| de.end().map(|()| s));
    shape.map_err(|e| ArgsError::BadJson(e.to_string()))
}

/// Upper bounds of what decoding a Pod's JSON into the API's typed structs takes in memory, by
/// what the JSON holds and where (the field names say which type a part decodes into):
/// - a string: its bytes and the allocator's rounding ([`heap`]);
/// - an element of a list: its slot, three times over (a vector doubles as it grows and holds
///   the old buffer while it copies), the slot being the list's element type's size: a
///   container, an ephemeral container, a volume or a container status by their fields' names,
///   a string for the lists of strings (commands, arguments, values, finalizers...), the
///   largest of the Pod's other element types ([`OTHER_ELEMENT_MAX`]) for any other list;
///   and the four slots a vector starts with;
/// - an entry of a map (labels, annotations, node selector, resource quantities, CSI volume
///   attributes, flex volume options, label selectors, and every object of a managed field's
///   `fieldsV1`, which decodes into `serde_json::Value`): its share of the tree and its key's
///   text, and a whole node for its first entry. A struct's fields take nothing beyond the
///   struct, which its list or its parent counts.
///
/// `tests/cache_weight.rs` decodes pods of the shapes that weigh least for what they take
/// (empty containers, volumes and ephemeral containers, tiny env entries, maps of one key nested
/// deep, many labels) under a counting allocator and fails if a call takes more than it reserved.
pub fn pod_cost(raw: &str) -> Result<usize, serde_json::Error> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_str(raw);
    let cost = Cost::POD.deserialize(&mut de)?;
    de.end()?;
    Ok(cost)
}

const fn max_of(sizes: &[usize]) -> usize {
    match sizes {
        [] => 0,
        [first, rest @ ..] => {
            let m = max_of(rest);
            if *first > m {
                *first
            } else {
                m
            }
        }
    }
}

/// The largest element type of the Pod's lists but containers, volumes and container statuses.
pub const OTHER_ELEMENT_MAX: usize = {
    use k8s_openapi::api::core::v1 as c;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as m;
    use std::mem::size_of;
    max_of(&[
        size_of::<c::EnvVar>(),
        size_of::<c::EnvFromSource>(),
        size_of::<c::VolumeMount>(),
        size_of::<c::VolumeDevice>(),
        size_of::<c::ContainerPort>(),
        size_of::<c::ContainerResizePolicy>(),
        size_of::<c::ContainerRestartRule>(),
        size_of::<c::KeyToPath>(),
        size_of::<c::DownwardAPIVolumeFile>(),
        size_of::<c::VolumeProjection>(),
        size_of::<c::Toleration>(),
        size_of::<c::TopologySpreadConstraint>(),
        size_of::<c::PodAffinityTerm>(),
        size_of::<c::WeightedPodAffinityTerm>(),
        size_of::<c::NodeSelectorTerm>(),
        size_of::<c::NodeSelectorRequirement>(),
        size_of::<c::PreferredSchedulingTerm>(),
        size_of::<c::LocalObjectReference>(),
        size_of::<c::HostAlias>(),
        size_of::<c::HTTPHeader>(),
        size_of::<c::PodDNSConfigOption>(),
        size_of::<c::Sysctl>(),
        size_of::<c::PodReadinessGate>(),
        size_of::<c::PodSchedulingGate>(),
        size_of::<c::PodResourceClaim>(),
        size_of::<c::PodResourceClaimStatus>(),
        size_of::<c::PodCondition>(),
        size_of::<c::PodIP>(),
        size_of::<c::HostIP>(),
        size_of::<c::ResourceClaim>(),
        size_of::<c::ResourceStatus>(),
        size_of::<c::ResourceHealth>(),
        size_of::<c::VolumeMountStatus>(),
        size_of::<c::ContainerExtendedResourceRequest>(),
        size_of::<m::OwnerReference>(),
        size_of::<m::ManagedFieldsEntry>(),
        size_of::<m::LabelSelectorRequirement>(),
        size_of::<serde_json::Value>(),
        size_of::<String>(),
    ])
};

/// The size of an element of the list under `key`.
fn element_slot(key: &str) -> usize {
    use k8s_openapi::api::core::v1 as c;
    use std::mem::size_of;
    match key {
        "containers" | "initContainers" => size_of::<c::Container>(),
        "ephemeralContainers" => size_of::<c::EphemeralContainer>(),
        "volumes" => size_of::<c::Volume>(),
        "containerStatuses" | "initContainerStatuses" | "ephemeralContainerStatuses" => size_of::<c::ContainerStatus>(),
        k if STRING_LISTS.contains(&k) => size_of::<String>(),
        _ => OTHER_ELEMENT_MAX,
    }
}

/// The Pod's fields that are lists of strings (or numbers).
const STRING_LISTS: [&str; 16] = [
    "command", "args", "finalizers", "values", "matchLabelKeys", "mismatchLabelKeys", "nameservers", "searches", "add", "drop", "accessModes", "portals", "monitors", "hostnames",
    "namespaces", "supplementalGroups",
];
/// The Pod's fields that decode into maps.
const MAP_FIELDS: [&str; 10] = ["labels", "annotations", "nodeSelector", "overhead", "limits", "requests", "allocatedResources", "volumeAttributes", "options", "matchLabels"];
/// A `Value`'s size: an element of a list in `fieldsV1`.
const VALUE_SLOT: usize = std::mem::size_of::<serde_json::Value>();
/// A map's first node (a B-tree leaf of 11 entries of a string key and a `Value`), and its
/// table's share per entry after the first.
const MAP_NODE: usize = 768;
const MAP_ENTRY: usize = 192;

/// What `len` bytes take on the heap: the bytes, the allocator's rounding up to its size class
/// (under an eighth), and its smallest block.
pub const fn heap(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        len + len / 8 + 16
    }
}

/// Weighs one JSON value of a Pod ([`pod_cost`]) where it stands.
#[derive(Clone, Copy)]
struct Cost {
    /// The size of an element of a list here.
    slot: usize,
    /// An object here is a map.
    map: bool,
    /// Inside a `serde_json::Value`: every object a map, every element a `Value`.
    dynamic: bool,
}

impl Cost {
    const POD: Cost = Cost { slot: OTHER_ELEMENT_MAX, map: false, dynamic: false };
    const DYNAMIC: Cost = Cost { slot: VALUE_SLOT, map: true, dynamic: true };

    /// Where the value of `key` stands.
    fn field(self, key: &str) -> Cost {
        if self.dynamic || key == "fieldsV1" {
            return Cost::DYNAMIC;
        }
        Cost { slot: element_slot(key), map: MAP_FIELDS.contains(&key), dynamic: false }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Cost {
    type Value = usize;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Cost {
    type Value = usize;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_i64<E>(self, _: i64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_u64<E>(self, _: u64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_f64<E>(self, _: f64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_unit<E>(self) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_str<E>(self, v: &str) -> Result<usize, E> {
        Ok(heap(v.len()))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        // An element is a struct of the list's type (or a `Value`, in `fieldsV1`).
        let element = if self.dynamic { Cost::DYNAMIC } else { Cost::POD };
        let mut bytes = 0usize;
        let mut any = false;
        while let Some(e) = seq.next_element_seed(element)? {
            bytes = bytes.saturating_add(e).saturating_add(3 * self.slot);
            any = true;
        }
        if any {
            bytes = bytes.saturating_add(4 * self.slot.min(1024));
        }
        Ok(bytes)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
        let mut bytes = 0usize;
        let mut first = true;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let value = map.next_value_seed(self.field(&key))?;
            bytes = bytes.saturating_add(value);
            if self.map {
                let node = if first { MAP_NODE } else { 0 };
                bytes = bytes.saturating_add(node + MAP_ENTRY).saturating_add(heap(key.len()));
                first = false;
            }
        }
        Ok(bytes)
    }
}

/// Reads the top level of a body for its [`Shape`], keys matched as [`TopIn`] matches them.
struct TopShape;

impl<'de> serde::de::DeserializeSeed<'de> for TopShape {
    type Value = Shape;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Shape, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for TopShape {
    type Value = Shape;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExtenderArgs")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        let mut shape = Shape::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key.eq_ignore_ascii_case("pod") {
                shape.pod_bytes = shape.pod_bytes.max(map.next_value_seed(Cost::POD)?);
            } else if key.eq_ignore_ascii_case("nodes") {
                shape.nodes = shape.nodes.max(map.next_value_seed(Items)?);
            } else if key.eq_ignore_ascii_case("nodenames") {
                shape.nodes = shape.nodes.max(map.next_value_seed(Count)?);
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(shape)
    }
}

/// The elements of an array (0 for anything else).
struct Count;

impl<'de> serde::de::DeserializeSeed<'de> for Count {
    type Value = usize;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Count {
    type Value = usize;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut n = 0usize;
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
            n += 1;
        }
        Ok(n)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
        while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
        Ok(0)
    }
    fn visit_bool<E>(self, _: bool) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_i64<E>(self, _: i64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_u64<E>(self, _: u64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_f64<E>(self, _: f64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_str<E>(self, _: &str) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_unit<E>(self) -> Result<usize, E> {
        Ok(0)
    }
}

/// The items of a NodeList (the larger count if `items` is given twice; 0 for anything else).
struct Items;

impl<'de> serde::de::DeserializeSeed<'de> for Items {
    type Value = usize;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Items {
    type Value = usize;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a NodeList")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
        let mut n = 0usize;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == "items" {
                n = n.max(map.next_value_seed(Count)?);
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(n)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(0)
    }
    fn visit_bool<E>(self, _: bool) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_i64<E>(self, _: i64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_u64<E>(self, _: u64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_f64<E>(self, _: f64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_str<E>(self, _: &str) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_unit<E>(self) -> Result<usize, E> {
        Ok(0)
    }
}

const PARALLEL_PARSE_MIN: usize = 512;

fn parse_nodes<'a>(items: &[&'a RawValue]) -> Result<Vec<NodeIn<'a>>, ArgsError> {
    let one = |item: &&'a RawValue| -> Result<NodeIn<'a>, ArgsError> {
        let raw: &'a str = item.get();
        let lite: NodeLite<'a> = serde_json::from_str(raw).map_err(|e| ArgsError::BadNodes(e.to_string()))?;
        Ok(NodeIn { raw, lite })
    };
    // Each list is allocated at its final size: what the call reserved for its nodes
    // ([`NODE_BYTES`]) counts one of them, and one more while the parallel parse's parts are joined.
    let all = |items: &[&'a RawValue]| -> Result<Vec<NodeIn<'a>>, ArgsError> {
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            out.push(one(item)?);
        }
        Ok(out)
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    if items.len() < PARALLEL_PARSE_MIN || threads < 2 {
        return all(items);
    }
    let chunk = items.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = items.chunks(chunk).map(|c| scope.spawn(move || all(c))).collect();
        let mut out = Vec::with_capacity(items.len());
        for h in handles {
            out.extend(h.join().map_err(|_| ArgsError::BadNodes("node parser thread panicked".into()))??);
        }
        Ok(out)
    })
}

/// What one node of a call holds at most besides the text of its body, from its parse to its
/// answer: its item and its parsed fields (twice while a parallel parse is joined), its name in
/// the candidates and in the answer, its entry in `FailedNodes` with a reason of at most
/// [`MAX_REASON_BYTES`] and that reason in the answer's JSON, or its facts, candidate, score and
/// `HostPriority` for prioritize; and the allocator's smallest block for each of its strings.
/// Measured against the heap by `tests/cache_weight.rs`.
pub const NODE_BYTES: usize = 3 * 16 + 2 * std::mem::size_of::<NodeIn<'static>>() + 2 * MAX_REASON_BYTES + 256;

/// The longest reason given for one node; longer ones are cut.
pub const MAX_REASON_BYTES: usize = 512;

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

/// Writes plain data (strings, lists, string maps) as JSON: cannot fail for these types.
fn write_json<T: Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    if serde_json::to_writer(&mut *out, v).is_err() {
        out.extend_from_slice(b"null");
    }
}

/// The length of `v`'s JSON, without building it.
fn json_len<T: Serialize + ?Sized>(v: &T) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Counter(0);
    match serde_json::to_writer(&mut c, v) {
        Ok(()) => c.0,
        Err(_) => 4,
    }
}

impl FilterResult<'_> {
    /// The answer's JSON, written into one buffer of its exact size (no buffer grows, so the
    /// answer takes no more than its length while it is built).
    pub fn to_json(&self) -> Vec<u8> {
        const LIST_HEAD: &[u8] = br#"{"apiVersion":"v1","kind":"NodeList","metadata":{},"items":["#;
        let nodes_len = self.nodes.as_ref().map_or(4, |n| LIST_HEAD.len() + n.iter().map(|s| s.len() + 1).sum::<usize>() + 2);
        let len = 100 + nodes_len + json_len(&self.node_names) + json_len(&self.failed_nodes) + json_len(&self.failed_and_unresolvable) + json_len(&self.error);
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(b"{\"Nodes\":");
        match &self.nodes {
            None => out.extend_from_slice(b"null"),
            Some(items) => {
                out.extend_from_slice(LIST_HEAD);
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
        write_json(&mut out, &self.node_names);
        out.extend_from_slice(b",\"FailedNodes\":");
        write_json(&mut out, &self.failed_nodes);
        out.extend_from_slice(b",\"FailedAndUnresolvableNodes\":");
        write_json(&mut out, &self.failed_and_unresolvable);
        out.extend_from_slice(b",\"Error\":");
        write_json(&mut out, &self.error);
        out.push(b'}');
        out
    }
}

/// The JSON of prioritize's answer, in one buffer of its exact size.
pub fn priorities_json(list: &[HostPriority]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json_len(list));
    write_json(&mut out, list);
    out
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

    #[test]
    fn a_body_is_weighed_without_building_it() {
        let pod = |containers: usize| format!(r#"{{"metadata":{{"name":"p","labels":{{"a":"b"}}}},"spec":{{"containers":[{}]}}}}"#, vec![r#"{"name":"c","image":"i"}"#; containers].join(","));
        let s = shape(format!(r#"{{"pod":{},"NODENAMES":["a","b","c"]}}"#, pod(1)).as_bytes()).expect("shape");
        assert_eq!(s.nodes, 3);
        let one = s.pod_bytes;
        let container = std::mem::size_of::<k8s_openapi::api::core::v1::Container>();
        // A container is weighed as one, three times over (a growing list), with its strings.
        let ten = shape(format!(r#"{{"Pod":{},"Nodes":{{"kind":"NodeList","items":[{{}},{{}}]}}}}"#, pod(10)).as_bytes()).expect("shape");
        assert_eq!(ten.nodes, 2);
        assert!(ten.pod_bytes >= one + 9 * 3 * container && ten.pod_bytes < one + 9 * 4 * container, "{one} {}", ten.pod_bytes);
        // A map's entries are weighed; a struct's fields are not.
        let labels = |n: usize| format!(r#"{{"Pod":{{"metadata":{{"labels":{{{}}}}}}},"NodeNames":[]}}"#, (0..n).map(|i| format!(r#""k{i}":"v""#)).collect::<Vec<_>>().join(","));
        assert!(shape(labels(100).as_bytes()).expect("shape").pod_bytes >= 100 * MAP_ENTRY);
        let fields = shape(br#"{"Pod":{"spec":{"hostname":"h","subdomain":"s","nodeName":"n"}},"NodeNames":[]}"#).expect("shape");
        assert_eq!(fields.pod_bytes, 3 * heap(1));
        // Both lists given, or one twice: the larger counts. Null and other types count nothing.
        let s = shape(br#"{"Pod":{},"Nodes":{"items":[1,2,3]},"NodeNames":["a"],"nodes":{"items":[1]}}"#).expect("shape");
        assert_eq!(s.nodes, 3);
        assert_eq!(shape(br#"{"Pod":null,"Nodes":null,"NodeNames":7}"#).expect("shape"), Shape::default());
        // Not JSON, not an object, or trailing bytes: refused before anything is built.
        for bad in [&b"nope"[..], b"[1,2]", br#"{"Pod":{}} x"#, br#"{"Pod":{"#] {
            assert_eq!(shape(bad).expect_err("bad").reason(), "bad_json");
        }
    }

    #[test]
    fn the_error_path_names_the_bad_part() {
        // Nodes that are not a NodeList, after many other keys.
        let keys = (0..1000).map(|i| format!(r#""k{i}":{i}"#)).collect::<Vec<_>>().join(",");
        let body = format!(r#"{{{keys},"Pod":{{"metadata":{{"name":"p"}}}},"Nodes":5}}"#);
        assert_eq!(parse_args(body.as_bytes()).err().map(|e| e.reason()), Some("bad_nodes"));
        // A later null does not hide an earlier part on this path either.
        let body = br#"{"Pod":{"metadata":{"name":"p"}},"pod":null,"Nodes":{"items":{}}}"#;
        assert_eq!(parse_args(body).err().map(|e| e.reason()), Some("bad_nodes"));
        let body = br#"{"Pod":{"metadata":{"name":"p"}},"Nodes":{"items":7},"NodeNames":["a"]}"#;
        assert_eq!(parse_args(body).err().map(|e| e.reason()), Some("bad_nodes"));
    }

    #[test]
    fn answers_are_built_at_their_size() {
        let mut failed = BTreeMap::new();
        failed.insert("n\u{1}2".to_string(), "why \"quoted\" \\".to_string());
        let r = FilterResult { nodes: Some(vec![r#"{"metadata":{"name":"n1"}}"#]), failed_nodes: failed, error: "e\u{7f}".into(), ..Default::default() };
        let json = r.to_json();
        assert!(json.capacity() <= json.len() + 100, "{} for {}", json.capacity(), json.len());
        let v: serde_json::Value = serde_json::from_slice(&json).expect("json");
        assert_eq!(v["FailedNodes"]["n\u{1}2"], "why \"quoted\" \\");
        let list = priorities_json(&[HostPriority { host: "a\"b".into(), score: 3 }]);
        assert_eq!(list.capacity(), list.len());
        assert_eq!(serde_json::from_slice::<Vec<HostPriority>>(&list).expect("json"), vec![HostPriority { host: "a\"b".into(), score: 3 }]);
    }
}
