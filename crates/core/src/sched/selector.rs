//! Label selectors (pods, namespaces) and node selector terms, matched as the API machinery does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

pub(crate) type Labels = BTreeMap<String, String>;

/// A `metav1.LabelSelector` as `LabelSelectorAsSelector` reads it: `None` selects nothing, an
/// empty selector selects everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    /// `None`: selects nothing (a nil selector).
    requirements: Option<Vec<Requirement>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
    values: Vec<String>,
    /// Where the requirement was written: matching ignores it; the packer's group model reads it
    /// ([`Selector::match_labels`], [`Selector::group_labels`], [`Selector::written_keys`]).
    source: Source,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Labels,
    Expressions,
    /// `matchLabelKeys`, resolved from the pod's own labels.
    LabelKeys,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl Selector {
    pub fn nothing() -> Self {
        Self { requirements: None }
    }

    pub fn everything() -> Self {
        Self { requirements: Some(Vec::new()) }
    }

    /// From the API type; an unknown operator selects nothing (the API server rejects it anyway).
    pub fn from_api(s: Option<&LabelSelector>) -> Self {
        let Some(s) = s else { return Self::nothing() };
        let mut reqs: Vec<Requirement> = s
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| Requirement { key: k.clone(), op: Op::In, values: vec![v.clone()], source: Source::Labels })
            .collect();
        for e in s.match_expressions.iter().flatten() {
            let op = match e.operator.as_str() {
                "In" => Op::In,
                "NotIn" => Op::NotIn,
                "Exists" => Op::Exists,
                "DoesNotExist" => Op::DoesNotExist,
                _ => return Self::nothing(),
            };
            reqs.push(Requirement { key: e.key.clone(), op, values: e.values.clone().unwrap_or_default(), source: Source::Expressions });
        }
        Self { requirements: Some(reqs) }
    }

    /// Add `key In [value]` (how `matchLabelKeys` narrows a selector to the pod's own value).
    pub(crate) fn and_equals(mut self, key: &str, value: &str) -> Self {
        if let Some(r) = &mut self.requirements {
            r.push(Requirement { key: key.into(), op: Op::In, values: vec![value.into()], source: Source::LabelKeys });
        }
        self
    }

    /// `labels.Selector.Empty()`: selects everything without saying anything.
    pub fn is_empty(&self) -> bool {
        self.requirements.as_ref().is_some_and(Vec::is_empty)
    }

    /// The selector's `matchLabels`, as written.
    pub fn match_labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.of(&[Source::Labels]).filter_map(|r| Some((r.key.as_str(), r.values.first()?.as_str())))
    }

    /// The labels a pod must carry to be selected by equality: `matchLabels` and the values
    /// `matchLabelKeys` took from the pod's own labels (a later key wins).
    pub(crate) fn group_labels(&self) -> BTreeMap<&str, &str> {
        self.of(&[Source::Labels, Source::LabelKeys]).filter_map(|r| Some((r.key.as_str(), r.values.first()?.as_str()))).collect()
    }

    /// The keys the selector names as written (`matchLabels` and `matchExpressions`), sorted,
    /// each once.
    pub(crate) fn written_keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = self.of(&[Source::Labels, Source::Expressions]).map(|r| r.key.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    fn of<'a>(&'a self, sources: &'a [Source]) -> impl Iterator<Item = &'a Requirement> + 'a {
        self.requirements.iter().flatten().filter(move |r| sources.contains(&r.source))
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        let Some(reqs) = &self.requirements else { return false };
        reqs.iter().all(|r| {
            let v = labels.get(&r.key);
            match r.op {
                Op::In => v.is_some_and(|v| r.values.contains(v)),
                Op::NotIn => v.is_none_or(|v| !r.values.contains(v)),
                Op::Exists => v.is_some(),
                Op::DoesNotExist => v.is_none(),
            }
        })
    }
}

/// A node's fields a `matchFields` term may name (only `metadata.name` exists).
pub(crate) struct NodeFields<'a> {
    pub name: &'a str,
    pub labels: &'a Labels,
}

/// A required node selector: the terms are ORed; a term's expressions and fields are ANDed; a
/// term with neither matches nothing.
pub(crate) fn node_matches_terms(terms: &[NodeSelectorTerm], node: &NodeFields<'_>) -> bool {
    terms.iter().any(|t| term_matches(t, node))
}

fn term_matches(term: &NodeSelectorTerm, node: &NodeFields<'_>) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs.iter().all(|e| node_requirement_matches(e, node.labels.get(&e.key).map(String::as_str)))
        && fields.iter().all(|f| f.key == "metadata.name" && node_requirement_matches(f, Some(node.name)))
}

fn node_requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |v: Option<&str>| v.and_then(|v| v.parse::<i64>().ok());
    let bound = || (values.len() == 1).then(|| values[0].parse::<i64>().ok()).flatten();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => matches!((number(value), bound()), (Some(v), Some(b)) if v > b),
        "Lt" => matches!((number(value), bound()), (Some(v), Some(b)) if v < b),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn nil_selects_nothing_and_empty_selects_everything() {
        let l = labels(&[("app", "web")]);
        assert!(!Selector::from_api(None).matches(&l));
        assert!(Selector::from_api(Some(&LabelSelector::default())).matches(&l));
        assert!(Selector::from_api(Some(&LabelSelector::default())).is_empty());
    }

    #[test]
    fn match_labels_and_expressions_are_anded() {
        let s = LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: Some(vec![
                LabelSelectorRequirement { key: "tier".into(), operator: "NotIn".into(), values: Some(vec!["db".into()]) },
                LabelSelectorRequirement { key: "team".into(), operator: "Exists".into(), values: None },
            ]),
        };
        let s = Selector::from_api(Some(&s));
        assert!(s.matches(&labels(&[("app", "web"), ("team", "a")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("team", "a"), ("tier", "db")])));
        assert!(!s.matches(&labels(&[("app", "web")])));
        assert!(s.clone().and_equals("pod-template-hash", "1").matches(&labels(&[("app", "web"), ("team", "a"), ("pod-template-hash", "1")])));
        assert!(!s.and_equals("pod-template-hash", "1").matches(&labels(&[("app", "web"), ("team", "a"), ("pod-template-hash", "2")])));
    }

    #[test]
    fn node_terms_follow_the_api_rules() {
        let l = labels(&[("zone", "a"), ("cpu", "8")]);
        let node = NodeFields { name: "n1", labels: &l };
        let expr = |k: &str, op: &str, v: &[&str]| NodeSelectorRequirement { key: k.into(), operator: op.into(), values: Some(v.iter().map(|s| s.to_string()).collect()) };
        let term = |e: Vec<NodeSelectorRequirement>| NodeSelectorTerm { match_expressions: Some(e), match_fields: None };
        assert!(node_matches_terms(&[term(vec![expr("zone", "In", &["a", "b"])])], &node));
        assert!(node_matches_terms(&[term(vec![expr("zone", "In", &["b"])]), term(vec![expr("cpu", "Gt", &["4"])])], &node), "terms are ORed");
        assert!(!node_matches_terms(&[term(vec![expr("zone", "In", &["a"]), expr("cpu", "Lt", &["4"])])], &node), "expressions are ANDed");
        assert!(!node_matches_terms(&[NodeSelectorTerm::default()], &node), "an empty term matches nothing");
        assert!(node_matches_terms(&[term(vec![expr("gpu", "DoesNotExist", &[])])], &node));
        assert!(!node_matches_terms(&[term(vec![expr("cpu", "Gt", &["x"])])], &node), "Gt needs one integer");
        let by_name = NodeSelectorTerm { match_expressions: None, match_fields: Some(vec![expr("metadata.name", "In", &["n1"])]) };
        assert!(node_matches_terms(&[by_name], &node));
    }
}
