//! YAML as Archer reads it (config, catalog files, scenarios, cluster dumps): YAML 1.2 core
//! scalars, so `y`, `on` and `no` stay strings and `0755` or `1_000` are not numbers where the
//! type is not known, with serde-saphyr's default budget against alias bombs and huge documents.

use serde::de::DeserializeOwned;

pub use serde_saphyr::Error;

fn options() -> serde_saphyr::Options {
    let mut o = serde_saphyr::Options::default();
    o.strict_booleans = true;
    o.leading_zero_numbers_as_strings = true;
    o.underscored_numbers_as_strings = true;
    o
}

/// One YAML document.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    serde_saphyr::from_str_with_options(text, options())
}

/// `value` as one YAML document (what Archer writes: a fetched catalog file).
pub fn to_string<T: serde::Serialize>(value: &T) -> Result<String, serde_saphyr::ser::Error> {
    serde_saphyr::to_string(value)
}

/// Every document of a `---`-separated stream.
pub fn from_multiple<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, Error> {
    serde_saphyr::from_multiple_with_options(text, options())
}

/// Every object of a `---`-separated stream of Kubernetes objects: a document, or the items of
/// a list as `kubectl get -o yaml` prints several objects (`kind: List`) or the API returns them
/// (`NodeList`, `PodList`: items without a kind of their own take the list's).
pub fn objects(text: &str) -> Result<Vec<serde_json::Value>, Error> {
    Ok(from_multiple::<serde_json::Value>(text)?.into_iter().flat_map(list_items).collect())
}

/// A document, or a list's items.
fn list_items(doc: serde_json::Value) -> Vec<serde_json::Value> {
    let kind = doc.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
    let Some(item_kind) = kind.strip_suffix("List") else { return vec![doc] };
    let Some(items) = doc.get("items").and_then(|i| i.as_array()) else { return vec![doc] };
    let api = doc.get("apiVersion").cloned().unwrap_or_default();
    items
        .iter()
        .cloned()
        .map(|mut item| {
            if let Some(fields) = item.as_object_mut().filter(|f| !f.contains_key("kind") && !item_kind.is_empty()) {
                fields.insert("kind".into(), item_kind.into());
                fields.insert("apiVersion".into(), api.clone());
            }
            item
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn scalars_are_read_as_yaml_1_2_core() {
        let v: serde_json::Value = super::from_str("a: y\nb: on\nc: no\nd: true\ne: 0755\nf: 1_000\ng: 3\nh: 500m\n").expect("yaml");
        assert_eq!(v, serde_json::json!({"a": "y", "b": "on", "c": "no", "d": true, "e": "0755", "f": "1_000", "g": 3, "h": "500m"}));
        let docs: Vec<serde_json::Value> = super::from_multiple("a: 1\n---\nb: 2\n").expect("yaml");
        assert_eq!(docs.len(), 2);
    }

    #[test]
    fn lists_are_read_as_their_items() {
        let text = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Node, metadata: {name: a}}\n- {apiVersion: v1, kind: Pod, metadata: {name: p}}\n---\napiVersion: v1\nkind: PodList\nitems:\n- {metadata: {name: q}}\n---\n{apiVersion: v1, kind: Service, metadata: {name: s}}\n";
        let kinds: Vec<(String, String)> = super::objects(text).expect("yaml").iter().map(|o| (o["kind"].as_str().unwrap_or("").to_string(), o["metadata"]["name"].as_str().unwrap_or("").to_string())).collect();
        let want = [("Node", "a"), ("Pod", "p"), ("Pod", "q"), ("Service", "s")].map(|(k, n)| (k.to_string(), n.to_string()));
        assert_eq!(kinds, want);
    }

    #[test]
    fn an_alias_bomb_is_refused() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let prev = i - 1;
            text.push_str(&format!("a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"));
        }
        assert!(super::from_str::<serde_json::Value>(&text).is_err());
    }
}
