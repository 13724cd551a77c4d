//! Node-label requirements: a pod's nodeSelector and required node affinity, a NodePool's
//! `requirements`, and the labels an instance-type offering would carry, in one algebra.
//! Operators are Kubernetes' (In, NotIn, Exists, DoesNotExist, Gt, Lt). Requirements on one key
//! are intersected; `compatible` asks whether some node could satisfy two sets at once.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
}

impl Operator {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" => Operator::Gt,
            "Lt" => Operator::Lt,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementError {
    #[error("requirement on {key}: unknown operator {operator:?}")]
    Operator { key: String, operator: String },
    #[error("requirement on {key}: {operator} needs exactly one integer value")]
    Integer { key: String, operator: String },
    #[error("requirement on {key}: In needs at least one value")]
    Empty { key: String },
}

/// What one key may be: the intersection of every requirement on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyConstraint {
    /// `Some(set)`: only these values; `None`: any value not excluded.
    allowed: Option<BTreeSet<String>>,
    excluded: BTreeSet<String>,
    /// The label must be present / must be absent / either.
    exists: Option<bool>,
    greater_than: Option<i64>,
    less_than: Option<i64>,
}

impl KeyConstraint {
    pub(crate) fn admits(&self, value: Option<&str>) -> bool {
        match value {
            None => self.exists != Some(true) && self.allowed.is_none() && self.greater_than.is_none() && self.less_than.is_none(),
            Some(v) => {
                self.exists != Some(false)
                    && self.allowed.as_ref().is_none_or(|a| a.contains(v))
                    && !self.excluded.contains(v)
                    && self.greater_than.is_none_or(|g| v.parse::<i64>().is_ok_and(|n| n > g))
                    && self.less_than.is_none_or(|l| v.parse::<i64>().is_ok_and(|n| n < l))
            }
        }
    }

    fn intersect(&self, o: &KeyConstraint) -> KeyConstraint {
        let allowed = match (&self.allowed, &o.allowed) {
            (Some(a), Some(b)) => Some(a.intersection(b).cloned().collect()),
            (Some(a), None) | (None, Some(a)) => Some(a.clone()),
            (None, None) => None,
        };
        let exists = match (self.exists, o.exists) {
            (Some(a), Some(b)) if a != b => Some(a), // contradictory; `is_empty` reports it
            (a, b) => a.or(b),
        };
        let contradictory_exists = matches!((self.exists, o.exists), (Some(a), Some(b)) if a != b);
        let mut k = KeyConstraint {
            allowed,
            excluded: self.excluded.union(&o.excluded).cloned().collect(),
            exists,
            greater_than: self.greater_than.max(o.greater_than),
            less_than: match (self.less_than, o.less_than) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        };
        if contradictory_exists {
            k.allowed = Some(BTreeSet::new());
        }
        k
    }

    /// No value (and not absence either) can satisfy this.
    fn is_empty(&self) -> bool {
        let requires_value = self.exists == Some(true) || self.allowed.is_some() || self.greater_than.is_some() || self.less_than.is_some();
        if self.exists == Some(false) && requires_value {
            return true;
        }
        if let (Some(g), Some(l)) = (self.greater_than, self.less_than) {
            if l - g <= 1 {
                return true;
            }
        }
        match &self.allowed {
            Some(a) => !a.iter().any(|v| self.admits(Some(v))),
            None => false,
        }
    }

    /// The values this constraint allows, when it lists them.
    pub fn values(&self) -> Option<Vec<&str>> {
        self.allowed.as_ref().map(|a| a.iter().filter(|v| self.admits(Some(v))).map(String::as_str).collect())
    }
}

/// Requirements ANDed over keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirements {
    keys: BTreeMap<String, KeyConstraint>,
}

impl Requirements {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, key: &str, operator: &str, values: &[String]) -> Result<(), RequirementError> {
        let op = Operator::parse(operator).ok_or_else(|| RequirementError::Operator { key: key.into(), operator: operator.into() })?;
        let mut k = KeyConstraint::default();
        let int = || -> Result<i64, RequirementError> {
            match values {
                [v] => v.parse().map_err(|_| RequirementError::Integer { key: key.into(), operator: operator.into() }),
                _ => Err(RequirementError::Integer { key: key.into(), operator: operator.into() }),
            }
        };
        match op {
            Operator::In => {
                if values.is_empty() {
                    return Err(RequirementError::Empty { key: key.into() });
                }
                k.allowed = Some(values.iter().cloned().collect());
            }
            Operator::NotIn => k.excluded = values.iter().cloned().collect(),
            Operator::Exists => k.exists = Some(true),
            Operator::DoesNotExist => k.exists = Some(false),
            Operator::Gt => k.greater_than = Some(int()?),
            Operator::Lt => k.less_than = Some(int()?),
        }
        let merged = self.keys.get(key).map_or(k.clone(), |existing| existing.intersect(&k));
        self.keys.insert(key.to_string(), merged);
        Ok(())
    }

    /// Requirement `key In [value]`.
    pub fn with(mut self, key: &str, value: &str) -> Self {
        let _ = self.add(key, "In", &[value.to_string()]);
        self
    }

    pub fn from_node_selector(selector: &BTreeMap<String, String>) -> Self {
        selector.iter().fold(Requirements::new(), |r, (k, v)| r.with(k, v))
    }

    pub fn from_expressions(exprs: &[NodeSelectorRequirement]) -> Result<Self, RequirementError> {
        let mut r = Requirements::new();
        for e in exprs {
            r.add(&e.key, &e.operator, e.values.as_deref().unwrap_or(&[]))?;
        }
        Ok(r)
    }

    pub(crate) fn from_term(term: &NodeSelectorTerm) -> Result<Self, RequirementError> {
        Self::from_expressions(term.match_expressions.as_deref().unwrap_or(&[]))
    }

    pub fn get(&self, key: &str) -> Option<&KeyConstraint> {
        self.keys.get(key)
    }

    /// The keys constrained, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    pub(crate) fn intersect(&self, other: &Requirements) -> Requirements {
        let mut keys = self.keys.clone();
        for (k, c) in &other.keys {
            let merged = keys.get(k).map_or(c.clone(), |e| e.intersect(c));
            keys.insert(k.clone(), merged);
        }
        Requirements { keys }
    }

    /// Some label set satisfies both.
    pub(crate) fn compatible(&self, other: &Requirements) -> bool {
        !self.intersect(other).keys.values().any(KeyConstraint::is_empty)
    }

    /// A node with exactly these labels satisfies every requirement.
    pub fn matches(&self, labels: &dyn Fn(&str) -> Option<String>) -> bool {
        self.keys.iter().all(|(k, c)| c.admits(labels(k).as_deref()))
    }

    /// Labels a node made under these requirements carries for keys that list their values, as
    /// Karpenter labels a NodePool's custom requirement keys: the first value each allows.
    pub(crate) fn implied_labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.keys.iter().filter_map(|(k, c)| c.values().and_then(|v| v.first().copied()).map(|v| (k.as_str(), v)))
    }

    pub fn matches_map(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches(&|k| labels.get(k).cloned())
    }

    /// The first key no value can satisfy, for error messages.
    #[cfg(test)]
    fn conflict_with(&self, other: &Requirements) -> Option<String> {
        self.intersect(other).keys.into_iter().find(|(_, c)| c.is_empty()).map(|(k, _)| k)
    }
}

impl fmt::Display for Requirements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .keys
            .iter()
            .map(|(k, c)| match (&c.allowed, c.exists) {
                (Some(a), _) => format!("{k} in [{}]", a.iter().cloned().collect::<Vec<_>>().join(",")),
                (None, Some(false)) => format!("!{k}"),
                (None, _) if !c.excluded.is_empty() => format!("{k} notin [{}]", c.excluded.iter().cloned().collect::<Vec<_>>().join(",")),
                _ => k.clone(),
            })
            .collect();
        f.write_str(&parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(spec: &[(&str, &str, &[&str])]) -> Requirements {
        let mut out = Requirements::new();
        for (k, op, vals) in spec {
            out.add(k, op, &vals.iter().map(|v| v.to_string()).collect::<Vec<_>>()).expect("valid");
        }
        out
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn every_operator_matches_labels() {
        let node = labels(&[("kubernetes.io/arch", "arm64"), ("karpenter.k8s.aws/instance-cpu", "8"), ("zone", "a")]);
        assert!(r(&[("kubernetes.io/arch", "In", &["arm64", "amd64"])]).matches_map(&node));
        assert!(!r(&[("kubernetes.io/arch", "NotIn", &["arm64"])]).matches_map(&node));
        assert!(r(&[("zone", "Exists", &[])]).matches_map(&node));
        assert!(!r(&[("gpu", "Exists", &[])]).matches_map(&node));
        assert!(r(&[("gpu", "DoesNotExist", &[])]).matches_map(&node));
        assert!(r(&[("karpenter.k8s.aws/instance-cpu", "Gt", &["4"]), ("karpenter.k8s.aws/instance-cpu", "Lt", &["16"])]).matches_map(&node));
        assert!(!r(&[("karpenter.k8s.aws/instance-cpu", "Gt", &["8"])]).matches_map(&node));
        assert!(!r(&[("missing", "Gt", &["1"])]).matches_map(&node), "Gt needs the label");
        assert!(r(&[("missing", "NotIn", &["x"])]).matches_map(&node), "NotIn admits absence");
    }

    #[test]
    fn compatibility_of_pod_and_pool() {
        let pool = r(&[("kubernetes.io/arch", "In", &["amd64", "arm64"]), ("karpenter.sh/capacity-type", "In", &["spot", "on-demand"])]);
        assert!(pool.compatible(&r(&[("kubernetes.io/arch", "In", &["arm64"])])));
        assert!(!pool.compatible(&r(&[("kubernetes.io/arch", "In", &["s390x"])])));
        assert_eq!(pool.conflict_with(&r(&[("kubernetes.io/arch", "NotIn", &["amd64", "arm64"])])).as_deref(), Some("kubernetes.io/arch"));
        assert!(!r(&[("team", "Exists", &[])]).compatible(&r(&[("team", "DoesNotExist", &[])])));
        assert!(!r(&[("cpu", "Gt", &["8"])]).compatible(&r(&[("cpu", "Lt", &["9"])])));
        assert!(r(&[("cpu", "Gt", &["8"])]).compatible(&r(&[("cpu", "Lt", &["10"])])));
        assert!(r(&[("cpu", "Gt", &["8"])]).compatible(&r(&[("cpu", "In", &["12"])])));
        assert!(!r(&[("cpu", "Gt", &["8"])]).compatible(&r(&[("cpu", "In", &["4"])])));
        let both = pool.intersect(&r(&[("kubernetes.io/arch", "NotIn", &["amd64"])]));
        assert_eq!(both.get("kubernetes.io/arch").and_then(|c| c.values()), Some(vec!["arm64"]));
    }

    #[test]
    fn invalid_requirements_are_errors() {
        let mut x = Requirements::new();
        assert!(x.add("k", "Like", &[]).is_err());
        assert!(x.add("k", "Gt", &["ten".into()]).is_err());
        assert!(x.add("k", "Gt", &[]).is_err());
        assert!(x.add("k", "In", &[]).is_err());
    }

    #[test]
    fn from_pod_shapes() {
        let sel = Requirements::from_node_selector(&labels(&[("kubernetes.io/arch", "amd64"), ("karpenter.sh/capacity-type", "on-demand")]));
        assert!(sel.matches_map(&labels(&[("kubernetes.io/arch", "amd64"), ("karpenter.sh/capacity-type", "on-demand")])));
        assert!(!sel.matches_map(&labels(&[("kubernetes.io/arch", "amd64")])));
        let term: NodeSelectorTerm = serde_json::from_value(serde_json::json!({"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}]})).expect("term");
        let t = Requirements::from_term(&term).expect("term");
        assert!(t.to_string().contains("topology.kubernetes.io/zone in [us-east-1a]"));
    }
}
