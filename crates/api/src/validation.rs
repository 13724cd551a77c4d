//! What a node's labels and taints may be, as Kubernetes defines them: label keys and taint keys
//! are qualified names (`[prefix/]name`, the prefix a DNS subdomain), label and taint values are
//! label values, a taint's effect one of three. The CRDs say the same through patterns (and a CEL
//! rule for map keys, which a pattern cannot reach); the providers check again at launch, since
//! a NodePool or NodeClaim written past the CRD (an older CRD, a direct etcd write) reaches the
//! node's bootstrap all the same, where a newline or a space becomes another kubelet flag.

use std::collections::BTreeMap;


/// A label or taint value: empty, or up to 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
pub(crate) const LABEL_VALUE_PATTERN: &str = "^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$";
/// A label or taint key: a qualified name, `[DNS subdomain/]name`.
pub(crate) const QUALIFIED_NAME_PATTERN: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$";
/// The longest qualified name: a 253-character prefix, `/`, a 63-character name.
const QUALIFIED_NAME_MAX: usize = 317;
/// A taint's effects.
const TAINT_EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];
/// Labels a pool or claim may carry at most (Karpenter's NodePool has the same bound; it keeps
/// the CEL rule on the keys within the API server's cost budget).
const MAX_LABELS: usize = 100;

fn name_part_ok(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=63).contains(&b.len())
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn dns_subdomain_ok(s: &str) -> bool {
    (1..=253).contains(&s.len())
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty() && b.first().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit()) && b.last().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit()) && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// Why `key` is not a qualified name (a label's or a taint's key), if it is not.
pub fn qualified_name(key: &str) -> Result<(), String> {
    let ok = match key.split_once('/') {
        Some((prefix, name)) => dns_subdomain_ok(prefix) && name_part_ok(name),
        None => name_part_ok(key),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{key:?} is not a qualified name ([DNS subdomain/]name of at most 63 of [A-Za-z0-9._-], alphanumeric at both ends)"))
    }
}

/// Why `value` is not a label value, if it is not.
pub fn label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || name_part_ok(value) {
        Ok(())
    } else {
        Err(format!("{value:?} is not a label value (at most 63 of [A-Za-z0-9._-], alphanumeric at both ends)"))
    }
}

/// Why a set of labels cannot go on a node, if it cannot.
pub fn labels(labels: &BTreeMap<String, String>) -> Result<(), String> {
    for (k, v) in labels {
        qualified_name(k).map_err(|e| format!("label key {e}"))?;
        label_value(v).map_err(|e| format!("label {k}: value {e}"))?;
    }
    Ok(())
}

/// Why a taint (key, value, effect) cannot go on a node, if it cannot.
pub(crate) fn taint(key: &str, value: Option<&str>, effect: &str) -> Result<(), String> {
    qualified_name(key).map_err(|e| format!("taint key {e}"))?;
    label_value(value.unwrap_or_default()).map_err(|e| format!("taint {key}: value {e}"))?;
    if !TAINT_EFFECTS.contains(&effect) {
        return Err(format!("taint {key}: effect {effect:?} is not one of {}", TAINT_EFFECTS.join(", ")));
    }
    Ok(())
}

/// Why a node of these labels and taints (key, value, effect) cannot be registered, if it
/// cannot: what a provider checks before writing them into a node's bootstrap.
pub fn node_shape<'a>(node_labels: &BTreeMap<String, String>, taints: impl IntoIterator<Item = (&'a str, Option<&'a str>, &'a str)>) -> Result<(), String> {
    labels(node_labels)?;
    taints.into_iter().try_for_each(|(k, v, e)| taint(k, v, e))
}

/// The schema of a labels map in the CRDs: values by pattern, keys by a CEL rule (OpenAPI
/// schemas of CRDs have no `propertyNames`), at most [`MAX_LABELS`] of them.
pub(crate) fn labels_schema(_generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    // The pattern has no backslash, so it reads the same inside a CEL string literal.
    let rule = format!("self.all(k, size(k) <= {QUALIFIED_NAME_MAX} && k.matches('{QUALIFIED_NAME_PATTERN}'))");
    schemars::json_schema!({
        "type": "object",
        "maxProperties": MAX_LABELS,
        "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN},
        "x-kubernetes-validations": [{"rule": rule, "message": "label keys must be qualified names ([DNS subdomain/]name of at most 63 of [A-Za-z0-9._-], alphanumeric at both ends)"}]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_label_syntax_is_what_passes() {
        for ok in ["team", "karpenter.sh/capacity-type", "node.kubernetes.io/instance-type", "a", "A_b.c-D", "x.y-z.example.com/Name_1"] {
            assert_eq!(qualified_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", "team\n--kubeconfig=/tmp/x", "a b", "-team", "team-", "a/b/c", "Example.com/x", "/x", "x/", "a=b", "a,b", &"x".repeat(64), &format!("{}/x", "a".repeat(254))] {
            assert!(qualified_name(bad).is_err(), "{bad:?}");
        }
        for ok in ["", "demo", "us-east-1a", "m6g.large", "Standard_D2pls_v6", &"v".repeat(63)] {
            assert_eq!(label_value(ok), Ok(()), "{ok}");
        }
        for bad in ["a\n--register-node=false", "a b", "a,b=c", "a\"", "$(id)", "-a", &"v".repeat(64)] {
            assert!(label_value(bad).is_err(), "{bad:?}");
        }
        assert_eq!(taint("dedicated", Some("demo"), "NoSchedule"), Ok(()));
        assert_eq!(taint("karpenter.sh/unregistered", None, "NoExecute"), Ok(()));
        assert!(taint("dedicated", Some("demo"), "NoSchedule --x").unwrap_err().contains("effect"));
        assert!(taint("dedicated", Some("a\n--b"), "NoSchedule").unwrap_err().contains("value"));
        assert!(taint("a b", None, "NoSchedule").unwrap_err().contains("taint key"));
        let labels: BTreeMap<String, String> = [("team".to_string(), "a\n--node-ip=1.2.3.4".to_string())].into();
        assert!(node_shape(&labels, []).unwrap_err().contains("label team: value"));
    }
}
