//! Property-based fuzzing of everything Archer decodes from callers: AdmissionReviews (and the
//! pod view inside them), ExtenderArgs, image references and resource quantities. Arbitrary
//! input never panics; well-formed input decodes to what was encoded. The case counts are
//! bounded so the suite stays quick under `cargo test`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

use proptest::prelude::*;
use serde_json::{json, Value};

/// Arbitrary JSON of bounded depth and size, biased toward the shapes the decoders expect.
fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
        "\\PC{0,12}".prop_map(Value::String),
        prop_oneof![Just("Pod"), Just("v1"), Just("CREATE"), Just("admission.k8s.io/v1"), Just("AdmissionReview"), Just("nginx:1")].prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let keys = prop_oneof![
            Just("apiVersion".to_string()), Just("kind".to_string()), Just("request".to_string()), Just("uid".to_string()),
            Just("object".to_string()), Just("metadata".to_string()), Just("spec".to_string()), Just("containers".to_string()),
            Just("image".to_string()), Just("Pod".to_string()), Just("Nodes".to_string()), Just("NodeNames".to_string()),
            Just("items".to_string()), Just("labels".to_string()), Just("annotations".to_string()), Just("operation".to_string()),
            "[a-zA-Z./]{1,10}",
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(keys, inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn config() -> ProptestConfig {
    ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn admission_reviews_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512), doc in arb_json()) {
        let _ = archer::webhook::decode(&bytes);
        let text = serde_json::to_vec(&doc).expect("json");
        if let Ok(r) = archer::webhook::decode(&text) {
            prop_assert!(!r.uid.is_empty());
            if let Some(o) = r.object {
                if let Ok(view) = archer::webhook::pod_view(o.get()) {
                    let _ = view.too_large();
                    let _ = view.decoded_cost();
                    let _ = view.into_pod();
                }
            }
        }
        let mut review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE", "object": doc}});
        let text = serde_json::to_vec(&review).expect("json");
        let r = archer::webhook::decode(&text);
        prop_assert!(r.is_ok(), "a well-formed review with any object decodes: {:?}", r.err());
        review["request"]["uid"] = json!(42);
        let bad = serde_json::to_vec(&review).expect("json");
        let e = archer::webhook::decode(&bad).expect_err("a numeric uid is refused");
        prop_assert!(!e.reason().is_empty());
    }

    #[test]
    fn well_formed_reviews_round_trip(uid in "[a-f0-9-]{1,36}", ns in "[a-z0-9-]{0,20}", images in prop::collection::vec("[a-z0-9]{1,8}(/[a-z0-9]{1,8})?(:[a-z0-9.]{1,6})?", 0..5)) {
        let containers: Vec<Value> = images.iter().enumerate().map(|(i, im)| json!({"name": format!("c{i}"), "image": im, "env": [{"name": "A", "value": "b"}]})).collect();
        let pod = json!({"metadata": {"name": "p", "namespace": ns, "annotations": {"x": "y"}}, "spec": {"containers": containers}});
        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": ns, "operation": "CREATE", "object": pod}});
        let text = serde_json::to_vec(&review).expect("json");
        let r = archer::webhook::decode(&text).expect("decodes");
        prop_assert_eq!(&r.uid, &uid);
        let pod = archer::webhook::pod_view(r.object.expect("object").get()).expect("view").into_pod().expect("pod");
        let got: Vec<String> = pod.spec.expect("spec").containers.into_iter().filter_map(|c| c.image).collect();
        prop_assert_eq!(got, images);
        prop_assert_eq!(pod.metadata.annotations.map(|a| a.len()), Some(0));
    }

    #[test]
    fn extender_args_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512), doc in arb_json()) {
        let _ = archer::extender::wire::parse_args(&bytes);
        let text = serde_json::to_vec(&doc).expect("json");
        if let Err(e) = archer::extender::wire::parse_args(&text) {
            prop_assert!(!e.reason().is_empty());
        }
        let args = json!({"Pod": {"metadata": {"name": "p"}, "spec": {"containers": []}}, "Nodes": {"items": [doc]}});
        let _ = archer::extender::wire::parse_args(&serde_json::to_vec(&args).expect("json"));
    }

    #[test]
    fn node_names_round_trip(names in prop::collection::vec("[a-z0-9.-]{1,30}", 0..20), case in 0usize..3) {
        let key = ["NodeNames", "nodenames", "NODENAMES"][case];
        let args = json!({"Pod": {"metadata": {"name": "p"}, "spec": {"containers": []}}, key: names});
        let text = serde_json::to_vec(&args).expect("json");
        let parsed = archer::extender::wire::parse_args(&text).expect("parses");
        match parsed.nodes {
            archer::extender::wire::Nodes::Names(got) => prop_assert_eq!(got, names),
            archer::extender::wire::Nodes::Full(_) => prop_assert!(false, "names expected"),
        }
    }

    #[test]
    fn image_references_never_panic(s in "\\PC{0,80}", t in "[a-zA-Z0-9:/@._\\[\\]-]{0,80}") {
        let _ = archer::registry::ImageRef::parse(&s);
        let _ = archer::registry::ImageRef::parse(&t);
    }

    #[test]
    fn image_references_round_trip(
        registry in prop_oneof![Just(None), Just(Some("ghcr.io".to_string())), Just(Some("localhost:5000".to_string())), Just(Some("[::1]:5000".to_string())), "[a-z]{1,8}\\.[a-z]{2,4}(:[1-9][0-9]{0,3})?".prop_map(Some)],
        path in "[a-z0-9]{1,10}(/[a-z0-9]{1,10}){0,2}",
        tag in prop::option::of("[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,20}"),
        digest in prop::option::of("[a-f0-9]{64}"),
    ) {
        let mut s = match &registry { Some(r) => format!("{r}/{path}"), None => path.clone() };
        if let Some(t) = &tag { s.push(':'); s.push_str(t); }
        if let Some(d) = &digest { s.push_str("@sha256:"); s.push_str(d); }
        let parsed = archer::registry::ImageRef::parse(&s).map_err(|e| TestCaseError::fail(format!("{s}: {e}")))?;
        let again = archer::registry::ImageRef::parse(&parsed.to_string()).map_err(|e| TestCaseError::fail(format!("{parsed}: {e}")))?;
        prop_assert_eq!(parsed.to_string(), again.to_string());
        prop_assert_eq!(parsed.digest.is_some(), digest.is_some());
        if registry.is_none() {
            prop_assert_eq!(parsed.registry.as_str(), "docker.io");
        }
    }

    #[test]
    fn quantities_never_panic(s in "\\PC{0,40}", t in "[-+]?[0-9.]{0,25}(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|e[-+]?[0-9]{1,3}|E[0-9]{1,3})?") {
        let _ = archer::core::quantity::cpu_millis(&s);
        let _ = archer::core::quantity::value(&s);
        let _ = archer::core::quantity::cpu_millis(&t);
        let _ = archer::core::quantity::value(&t);
    }

    #[test]
    fn quantities_parse_exactly(n in 0i64..1_000_000, suffix in 0usize..6) {
        let (text, bytes) = match suffix {
            0 => (format!("{n}"), n),
            1 => (format!("{n}Ki"), n * 1024),
            2 => (format!("{n}Mi"), n * 1024 * 1024),
            3 => (format!("{n}k"), n * 1000),
            4 => (format!("{n}M"), n * 1_000_000),
            _ => (format!("{n}e3"), n * 1000),
        };
        prop_assert_eq!(archer::core::quantity::value(&text), Some(bytes));
        prop_assert_eq!(archer::core::quantity::cpu_millis(&format!("{n}m")), Some(n));
        prop_assert_eq!(archer::core::quantity::cpu_millis(&format!("{n}")), Some(n * 1000));
    }
}

/// JSON nested `depth` levels deep, by arrays, objects or both in turn, around a string.
fn nested(depth: usize, shape: usize) -> String {
    let mut open = String::new();
    let mut close = String::new();
    for level in 0..depth {
        let object = match shape % 3 {
            0 => false,
            1 => true,
            _ => level % 2 == 0,
        };
        if object {
            open.push_str("{\"k\":");
            close.insert(0, '}');
        } else {
            open.push('[');
            close.insert(0, ']');
        }
    }
    format!("{open}\"x\"{close}")
}

/// The parts of a pod the decision view reads, each with `deep` put in the place a hostile
/// review would nest it.
fn pod_with_deep(part: usize, deep: &str) -> String {
    let (metadata, spec) = match part % 9 {
        0 => (String::new(), format!(r#""nodeSelector":{deep},"#)),
        1 => (String::new(), format!(r#""nodeSelector":{{"a":{deep}}},"#)),
        2 => (String::new(), format!(r#""affinity":{deep},"#)),
        3 => (String::new(), format!(r#""affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":{{"nodeSelectorTerms":[{{"matchExpressions":[{{"key":"a","operator":"In","values":{deep}}}]}}]}}}}}},"#)),
        4 => (String::new(), format!(r#""tolerations":{deep},"#)),
        5 => (String::new(), format!(r#""tolerations":[{{"key":{deep}}}],"#)),
        6 => (String::new(), format!(r#""imagePullSecrets":[{deep}],"#)),
        7 => (format!(r#""labels":{{"app":{deep}}},"#), String::new()),
        _ => (format!(r#""annotations":{{"archer.dev/x":"y","other":{deep}}},"#), String::new()),
    };
    format!(r#"{{"metadata":{{{metadata}"name":"p"}},"spec":{{{spec}"containers":[{{"name":"c","image":"nginx"}}]}}}}"#)
}

/// Decode as the webhook does (review, view, typed pod); never panics. Returns whether the pod
/// decoded, and whether a full typed decode of the same object accepts it.
fn webhook_and_full_decode(object: &str) -> (bool, bool) {
    let review = format!(r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","kind":{{"group":"","version":"v1","kind":"Pod"}},"operation":"CREATE","object":{object}}}}}"#);
    let ours = match archer::webhook::decode(review.as_bytes()) {
        Ok(r) => r.object.is_some_and(|o| archer::webhook::pod_view(o.get()).ok().and_then(|v| v.into_pod().ok()).is_some()),
        Err(_) => false,
    };
    let full = serde_json::from_str::<k8s_openapi::api::core::v1::Pod>(object).is_ok();
    (ours, full)
}

#[test]
fn deep_nesting_in_every_part_the_view_reads_is_answered_without_a_panic_and_as_a_full_decode_answers() {
    for part in 0..9 {
        for depth in [1, 2, 10, 126, 127, 128, 129, 130, 500, 20_000] {
            for shape in 0..3 {
                let object = pod_with_deep(part, &nested(depth, shape));
                let (ours, full) = webhook_and_full_decode(&object);
                assert_eq!(ours, full, "part {part}, depth {depth}, shape {shape}: the view and a full decode disagree");
            }
        }
        // The plain string (depth 0) is what a real pod has in most of these places.
        let (ours, full) = webhook_and_full_decode(&pod_with_deep(part, "\"x\""));
        assert_eq!(ours, full, "part {part} with a string");
    }
    // The value the old view passed through raw and re-parsed with json!, which panicked at
    // serde_json's recursion limit: an affinity whose unknown field nests 200 deep. Unknown
    // fields are skipped, as a full decode skips them, so both accept it.
    assert_eq!(webhook_and_full_decode(&pod_with_deep(2, &nested(200, 1))), (true, true));
    // Nesting where the schema wants a map is a type error for both.
    assert_eq!(webhook_and_full_decode(&pod_with_deep(2, &nested(200, 0))), (false, false));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn deeply_nested_values_never_panic_and_agree_with_a_full_decode(part in 0usize..9, depth in 0usize..3_000, shape in 0usize..3) {
        let object = pod_with_deep(part, &nested(depth, shape));
        let (ours, full) = webhook_and_full_decode(&object);
        prop_assert_eq!(ours, full);
    }
}
