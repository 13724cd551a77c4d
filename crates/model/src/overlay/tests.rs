//! Karpenter's own NodeOverlay cases, ported: the validation table of
//! `pkg/apis/v1alpha1/nodeoverlay_validation_test.go`, and the application cases of
//! `pkg/controllers/nodeoverlay/suite_test.go` and `store_test.go`, those keyed on the NodePool
//! included (priced per pool).
#![allow(clippy::expect_used, clippy::indexing_slicing, reason = "test code")]

use super::*;
use std::collections::BTreeMap;
use archer_core::catalog::Catalog;
use archer_core::instance::CapacityType;
use serde_json::json;

fn overlay(name: &str, spec: serde_json::Value) -> Arc<NodeOverlay> {
    Arc::new(serde_json::from_value(json!({"apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay", "metadata": {"name": name}, "spec": spec})).expect("overlay"))
}

fn valid(spec: serde_json::Value) -> bool {
    validate(&overlay("o", spec)).is_ok()
}

fn req(key: &str, operator: &str, values: &[&str]) -> serde_json::Value {
    json!({"key": key, "operator": operator, "values": values})
}

/// `it` is an instance type of the embedded catalog; offerings in zone `z` at `price`.
fn offering(it: &str, zone: &str, capacity: CapacityType, price: f64) -> Offering {
    static CATALOG: std::sync::LazyLock<Catalog> = std::sync::LazyLock::new(|| Catalog::embedded().expect("catalog"));
    let catalog = &*CATALOG;
    Offering { instance: catalog.get(it).expect("type").clone(), zone: zone.into(), capacity, price, pool: None }
}

fn prices(o: &Overlaid) -> Vec<f64> {
    o.offerings.iter().map(|o| (o.price * 1e6).round() / 1e6).collect()
}

use CapacityType::{OnDemand, Spot};

#[test]
fn requirements_validate_as_karpenters() {
    let base = |r: serde_json::Value| json!({"requirements": [r]});
    assert!(!valid(base(req("Test", "In", &[]))), "In with no values");
    assert!(!valid(base(req("Test", "NotIn", &[]))), "NotIn with no values");
    for key in ["Test", "test.com/Test", "test.com.com/test", "key-only"] {
        assert!(valid(base(req(key, "Exists", &[]))), "{key}");
    }
    for key in ["test.com.com}", "Test.com/test", "test/test/test", "test/", "/test"] {
        assert!(!valid(base(req(key, "Exists", &[]))), "{key}");
    }
    assert!(valid(base(req("karpenter.sh/nodepool", "In", &["x"]))));
    assert!(!valid(base(req("karpenter.sh/test", "In", &["test"]))), "the karpenter.sh domain is restricted");
    assert!(!valid(base(req("kubernetes.io/hostname", "In", &["a"]))), "hostname is restricted");
    for key in ["kubernetes.io/test", "k8s.io/test", "subdomain.kubernetes.io/test", "subdomain.k8s.io/test"] {
        assert!(valid(base(req(key, "In", &["test"]))), "{key}");
    }
    let zone = labels::ZONE;
    for op in ["Gt", "Lt", "Gte", "Lte"] {
        assert!(valid(base(req(zone, op, &["1"]))), "{op} [1]");
        for values in [&[][..], &["1", "2"][..], &["a"][..], &["-1"][..]] {
            assert!(!valid(base(req(zone, op, values))), "{op} {values:?}");
        }
    }
    assert!(valid(base(req(zone, "In", &["test"]))) && valid(base(req(zone, "NotIn", &["1"]))) && valid(base(req(zone, "Exists", &[]))));
    assert!(!valid(base(req(zone, "unknown", &["a"]))), "unknown operator");
    assert!(valid(json!({"requirements": [req(zone, "In", &["test", "foo"]), req(zone, "NotIn", &["test", "bar"])]})));
    assert!(!valid(base(req(labels::KARPENTER_CAPACITY_TYPE, "In", &["sometimes"]))), "capacity-type In names none");
    let many: Vec<_> = (0..101).map(|i| req(&format!("k{i}"), "Exists", &[])).collect();
    assert!(!valid(json!({"requirements": many})), "at most 100");
}

#[test]
fn prices_and_adjustments_validate_as_karpenters() {
    assert!(!valid(json!({"price": "0.432", "priceAdjustment": "+10%"})), "both at once");
    for p in ["+42", ".5", "42.", "42%", "3,14", "1e10", "0x42", "forty-two", "42a", "42 ", " 42", "42.0.0", "-", ".", "-.42", "-100.0%", "-101.1%", "-129"] {
        assert!(!valid(json!({"price": p})), "price {p:?}");
    }
    for p in ["43", "34.43"] {
        assert!(valid(json!({"price": p})), "price {p:?}");
    }
    for a in ["1%", "1", "1.3", "-100.0%", "-101.1%", "-5.%", "+1e3", "10%", "+", "-%"] {
        assert!(!valid(json!({"priceAdjustment": a})), "priceAdjustment {a:?}");
    }
    for a in ["+1%", "-1%", "-100%", "+100.102%", "+298%", "+43", "-43", "+34.43", "-34.43", "+.5", "-129", "+42", "-99.99%", "-0%", "+0"] {
        assert!(valid(json!({"priceAdjustment": a})), "priceAdjustment {a:?}");
    }
    assert!(valid(json!({"capacity": {"smarter-devices/fuse": "1"}})));
    for r in ["cpu", "memory", "pods", "ephemeral-storage"] {
        assert!(!valid(json!({"capacity": {r: "1"}})), "capacity {r}");
    }
    assert!(!valid(json!({"weight": 0})) && !valid(json!({"weight": 10001})) && valid(json!({"weight": 1})) && valid(json!({"weight": 10000})));
}

/// store_test.go: `+0.01` on 0.096, `+10%`, `-5%`; and the floor at 0.
#[test]
fn adjustments_add_an_amount_or_a_percentage_and_never_go_below_zero() {
    let o = [offering("m7g.large", "test-zone-1", OnDemand, 0.096)];
    let adjusted = |a: &str| prices(&apply(&[overlay("o", json!({"priceAdjustment": a}))], &[], &o))[0];
    assert_eq!(adjusted("+0.01"), 0.106);
    assert_eq!(adjusted("+10%"), 0.1056);
    assert_eq!(adjusted("-5%"), 0.0912);
    assert_eq!(adjusted("-1"), 0.0, "floored at 0");
    assert_eq!(adjusted("-100%"), 0.0);
    assert_eq!(prices(&apply(&[overlay("o", json!({"price": "13234.223"}))], &[], &o))[0], 13234.223, "a price replaces it");
    assert_eq!(prices(&apply(&[], &[], &o))[0], 0.096, "no overlays: unchanged");
}

/// suite_test.go's offerings: spot/z1 1.02, on-demand/z2 2.02, spot/z3 3.02, on-demand/z4 4.02
/// (Karpenter's fourth is `reserved`, which Archer does not buy).
fn four() -> Vec<Offering> {
    vec![offering("m7g.large", "test-zone-1", Spot, 1.02), offering("m7g.large", "test-zone-2", OnDemand, 2.02), offering("m7g.large", "test-zone-3", Spot, 3.02), offering("m7g.large", "test-zone-4", OnDemand, 4.02)]
}

fn outcome(o: &Overlaid, name: &str) -> &'static str {
    o.outcomes.get(name).map(|x| x.condition().1).expect("an outcome")
}

#[test]
fn equal_weights_that_reach_the_same_offering_conflict_and_the_earlier_name_loses() {
    let zone = labels::ZONE;
    let ct = labels::KARPENTER_CAPACITY_TYPE;
    let cases = [
        // (overlay-a's requirements, overlay-b's, conflict?)
        (req(labels::ARCH, "In", &["arm64"]), req(ct, "Exists", &[]), true),
        (req(labels::ARCH, "In", &["arm64"]), req(labels::OS, "In", &["ios"]), false),
        (req(zone, "In", &["test-zone-1", "test-zone-4"]), req(ct, "Exists", &[]), true),
        (req(ct, "Exists", &[]), req(ct, "In", &["spot"]), true),
        (req(zone, "In", &["test-zone-6", "test-zone-4"]), req(ct, "In", &["spot"]), false),
        (req(zone, "In", &["test-zone-1", "test-zone-4"]), req(ct, "In", &["spot"]), true),
        (req(labels::INSTANCE_TYPE, "In", &["m7g.large"]), req(labels::INSTANCE_TYPE, "NotIn", &["m7g.large"]), false),
    ];
    for (a, b, conflict) in cases {
        for (pa, pb) in [(json!({"price": "1.03"}), json!({"price": "23"})), (json!({"priceAdjustment": "+54"}), json!({"priceAdjustment": "-2"})), (json!({"price": "100"}), json!({"price": "100"}))] {
            let mut sa = json!({"requirements": [a.clone()], "weight": 10});
            let mut sb = json!({"requirements": [b.clone()], "weight": 10});
            sa.as_object_mut().expect("spec").extend(pa.as_object().expect("price").clone());
            sb.as_object_mut().expect("spec").extend(pb.as_object().expect("price").clone());
            let o = apply(&[overlay("overlay-a", sa), overlay("overlay-b", sb)], &[], &four());
            let expected = if conflict { "Conflict" } else { "ValidationSucceeded" };
            assert_eq!((outcome(&o, "overlay-a"), outcome(&o, "overlay-b")), (expected, "ValidationSucceeded"), "{a} vs {b}");
        }
    }
    // Different weights never conflict; the heavier one prices what both reach.
    let o = apply(&[overlay("heavy", json!({"price": "34", "weight": 20})), overlay("light", json!({"price": "2", "weight": 10, "requirements": [req(zone, "In", &["test-zone-1"])]}))], &[], &four());
    assert_eq!((outcome(&o, "heavy"), outcome(&o, "light")), ("ValidationSucceeded", "ValidationSucceeded"));
    assert_eq!(prices(&o), [34.0, 34.0, 34.0, 34.0]);
    assert_eq!(o.outcomes["light"], Outcome::Applied { offerings: 0, types: 0 });
}

#[test]
fn an_overlay_prices_only_the_offerings_its_requirements_select() {
    let ct = labels::KARPENTER_CAPACITY_TYPE;
    let zone = labels::ZONE;
    let two = [offering("m7g.large", "test-zone-1", Spot, 1.02), offering("m7g.large", "test-zone-1", OnDemand, 5.02)];
    let on_demand = |p: serde_json::Value| {
        let mut s = json!({"requirements": [req(ct, "In", &["on-demand"])], "weight": 10});
        s.as_object_mut().expect("spec").extend(p.as_object().expect("p").clone());
        prices(&apply(&[overlay("o", s)], &[], &two))
    };
    assert_eq!(on_demand(json!({"price": "12321.32"})), [1.02, 12321.32]);
    assert_eq!(on_demand(json!({"priceAdjustment": "+1000"})), [1.02, 1005.02]);
    let zones = [offering("m7g.large", "test-zone-1", Spot, 1.02), offering("m7g.large", "test-zone-2", Spot, 5.02)];
    let in_z1 = |p: serde_json::Value| {
        let mut s = json!({"requirements": [req(zone, "In", &["test-zone-1"])]});
        s.as_object_mut().expect("spec").extend(p.as_object().expect("p").clone());
        prices(&apply(&[overlay("o", s)], &[], &zones))
    };
    assert_eq!(in_z1(json!({"price": "121.421"})), [121.421, 5.02]);
    assert_eq!(in_z1(json!({"priceAdjustment": "+1000"})), [1001.02, 5.02]);
    // An instance type no offering has: nothing changes.
    assert_eq!(prices(&apply(&[overlay("o", json!({"price": "9", "requirements": [req(labels::INSTANCE_TYPE, "In", &["default-instance-type-not-found"])]}))], &[], &zones)), [1.02, 5.02]);
}

/// Disjoint overlays of one weight both apply; of two weights the heavier prices the offerings
/// both reach, and adjustments do not stack.
#[test]
fn heavier_overlays_price_first_and_adjustments_do_not_stack() {
    let zone = labels::ZONE;
    let ct = labels::KARPENTER_CAPACITY_TYPE;
    let three = [offering("m7g.large", "test-zone-1", Spot, 1.02), offering("m7g.large", "test-zone-2", OnDemand, 2.02), offering("m7g.large", "test-zone-4", OnDemand, 4.02)];
    let o = apply(&[overlay("zones", json!({"requirements": [req(zone, "In", &["test-zone-2", "test-zone-4"])], "weight": 10, "price": "121.421"})), overlay("spot", json!({"requirements": [req(ct, "In", &["spot"])], "weight": 10, "price": "165.421"}))], &[], &three);
    assert_eq!(prices(&o), [165.421, 121.421, 121.421]);
    let o = apply(&[overlay("zones", json!({"requirements": [req(zone, "In", &["test-zone-2", "test-zone-4"])], "weight": 10, "priceAdjustment": "+201"})), overlay("spot", json!({"requirements": [req(ct, "In", &["spot"])], "weight": 10, "priceAdjustment": "-0.5"}))], &[], &three);
    assert_eq!(prices(&o), [0.52, 203.02, 205.02]);
    let o = apply(&[overlay("a-test-100", json!({"requirements": [req(zone, "In", &["test-zone-2"])], "weight": 20, "priceAdjustment": "+201"})), overlay("b-test-100", json!({"requirements": [req(zone, "In", &["test-zone-2", "test-zone-4"])], "weight": 10, "priceAdjustment": "-1.5"}))], &[], &three);
    assert_eq!(prices(&o), [1.02, 203.02, 2.52], "zone 2 takes the heavier overlay's only");
}

/// Overlays keyed on the NodePool, as Karpenter's `Instance Type Controller` cases have them:
/// priced per pool (each pool whose price differs gets an offering of its own), no conflict
/// between two overlays of one weight on different pools, a pool's template label selecting its
/// pool only.
#[test]
fn overlays_keyed_on_the_nodepool_price_that_pool_alone() {
    let np = |name: &str, labels: serde_json::Value| -> Arc<NodePool> {
        Arc::new(serde_json::from_value(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": {"template": {"metadata": {"labels": labels}, "spec": {"requirements": []}}}})).expect("pool"))
    };
    let pools = [np("np1", json!({})), np("np2", json!({"test-label": "test-value"}))];
    let one = [offering("m6g.large", "test-zone-1", OnDemand, 1.02)];
    let by_pool = |name: &str, pool: &str, change: serde_json::Value| {
        let mut spec = json!({"requirements": [req("karpenter.sh/nodepool", "In", &[pool])], "weight": 10});
        spec.as_object_mut().expect("spec").extend(change.as_object().expect("change").clone());
        overlay(name, spec)
    };
    // Karpenter's "mutually exclusive weights" table: np1's price; np2 keeps the list price.
    for (change, expected) in [(json!({"price": "13234.223"}), 13234.223), (json!({"priceAdjustment": "+1000"}), 1001.02)] {
        let o = apply(&[by_pool("a", "np1", change)], &pools, &one);
        assert_eq!(o.offerings.iter().map(|x| (x.pool.as_deref().map(str::to_string), (x.price * 1e6).round() / 1e6)).collect::<Vec<_>>(), [(None, 1.02), (Some("np1".to_string()), expected)]);
        assert!(matches!(o.outcomes["a"], Outcome::Applied { offerings: 1, types: 0 }), "{:?}", o.outcomes);
    }
    // "for all nodepools": one overlay per pool, same weight: no conflict, each its own price.
    let o = apply(&[by_pool("a", "np1", json!({"priceAdjustment": "+1000"})), by_pool("b", "np2", json!({"priceAdjustment": "+2500"}))], &pools, &one);
    assert!(o.outcomes.values().all(|x| matches!(x, Outcome::Applied { .. })), "{:?}", o.outcomes);
    let own = |o: &Overlaid, pool: &str| o.offerings.iter().find(|x| x.pool.as_deref() == Some(pool)).map(|x| (x.price * 1e6).round() / 1e6);
    assert_eq!((own(&o, "np1"), own(&o, "np2"), prices(&o)[0]), (Some(1001.02), Some(2501.02), 1.02));
    // "only ... labels defined in the overlay requirements": np2's template label.
    let o = apply(&[overlay("by-label", json!({"requirements": [req("test-label", "In", &["test-value"])], "weight": 10, "priceAdjustment": "+1000"}))], &pools, &one);
    assert_eq!((own(&o, "np1"), own(&o, "np2"), prices(&o)[0]), (None, Some(1001.02), 1.02));
    // NotIn a pool: the shared price moves, and the pool left out keeps the list price as its own.
    let o = apply(&[overlay("not-np1", json!({"requirements": [req("karpenter.sh/nodepool", "NotIn", &["np1"])], "priceAdjustment": "+1"}))], &pools, &one);
    assert_eq!((own(&o, "np1"), own(&o, "np2"), prices(&o)[0]), (Some(1.02), None, 2.02));
    // Two overlays of one weight reaching one offering of one pool still conflict.
    let o = apply(&[by_pool("a", "np1", json!({"price": "1"})), overlay("z", json!({"requirements": [req("karpenter.sh/nodepool", "In", &["np1"])], "weight": 10, "price": "2"}))], &pools, &one);
    assert_eq!((outcome(&o, "z"), outcome(&o, "a")), ("ValidationSucceeded", "Conflict"), "the later name goes first (Karpenter's order), the other conflicts: {:?}", o.outcomes);
}

/// What Archer does not do as Karpenter does is said, not skipped silently: a key of the cloud's
/// domain Archer's offerings do not carry is not matched.
#[test]
fn what_archer_cannot_apply_is_said() {
    // Karpenter's "pricing and capacity adjustment from two overlays on the same instance type"
    // in one overlay: both apply, and the condition says so.
    let o = apply(&[overlay("fuse", json!({"capacity": {"smarter-devices/fuse": "1"}, "priceAdjustment": "+1000.0"}))], &[], &four());
    assert_eq!(o.outcomes["fuse"], Outcome::Applied { offerings: 4, types: 1 });
    assert_eq!(o.outcomes["fuse"].archer_applied(), ("True", "Applied", "prices 4 offering(s); sets the capacity of 1 instance type(s)".to_string()));
    assert_eq!(prices(&o), [1001.02, 1002.02, 1003.02, 1004.02]);
    assert!(o.offerings.iter().all(|x| x.instance.extended_resource("smarter-devices/fuse") == 1));
    // A key of the cloud's domain Archer's offerings do not carry is said, not matched.
    let o = apply(&[overlay("size", json!({"requirements": [req("karpenter.k8s.aws/instance-size", "NotIn", &["large"])], "price": "1"}))], &[], &four());
    assert!(matches!(&o.outcomes["size"], Outcome::NotApplied(why) if why.contains("instance-size")), "{:?}", o.outcomes);
    assert_eq!(prices(&o), [1.02, 2.02, 3.02, 4.02]);
    // Capacity written as a number (as the API returns it) reads as a quantity.
    let fuse = overlay("fuse", json!({"capacity": {"smarter-devices/fuse": 1, "hugepages-2Mi": "100Mi"}}));
    assert_eq!(validate(&fuse).expect("valid").capacity, BTreeMap::from([("hugepages-2Mi".to_string(), 100 * 1024 * 1024), ("smarter-devices/fuse".to_string(), 1)]));
    assert!(!valid(json!({"capacity": {"smarter-devices/fuse": "lots"}})), "a capacity that is no quantity is invalid");
    // Lte of the largest integer bounds nothing (no overflow).
    assert!(valid(json!({"requirements": [req("karpenter.k8s.aws/instance-generation", "Lte", &["9223372036854775807"])]})));
    // An invalid overlay applies nowhere, and says why.
    let o = apply(&[overlay("bad", json!({"requirements": [req("karpenter.sh/test", "In", &["x"])], "price": "1"}))], &[], &four());
    assert_eq!(outcome(&o, "bad"), "RuntimeValidation");
    let ready = o.outcomes["bad"].conditions().into_iter().find(|c| c.0 == "Ready").expect("Ready");
    assert_eq!((ready.1, ready.2, ready.3.as_str()), ("False", "UnhealthyDependents", "ValidationSucceeded=False"));
    assert_eq!(prices(&o), [1.02, 2.02, 3.02, 4.02]);
}

/// The NodeOverlays a retired catalog `priceOverrides` file is refused with price what its rules
/// priced, first rule first: a family's on-demand discount (spot untouched), a fixed rate for one
/// type in both capacity types, and an Azure family by Archer's family label.
#[test]
fn the_overlays_replacing_retired_price_overrides_price_as_the_rules_did() {
    let mut c = Catalog::embedded().expect("catalog");
    let file: archer_core::catalog::CatalogFile = archer_core::yaml::from_str("priceOverrides:\n  - instanceType: m6i.xlarge\n    pricePerHour: 0.1\n  - family: m6i\n    capacityType: on-demand\n    discount: 0.25\n  - family: Dps_v5\n    discount: 0.1\n").expect("yaml");
    let refusal = c.apply(file, "mine.yaml").expect_err("retired").to_string();
    let yaml = refusal.split_once("---\n").map(|(_, y)| y).expect("overlays");
    let overlays: Vec<Arc<NodeOverlay>> = archer_core::yaml::objects(yaml).expect("yaml").into_iter().map(|v| Arc::new(serde_json::from_value(v).expect("a NodeOverlay"))).collect();
    assert_eq!(overlays.len(), 3);
    assert!(overlays.iter().all(|o| validate(o).is_ok()), "valid as Karpenter validates");
    let all = [
        offering("m6i.large", "us-east-1a", OnDemand, 0.096),
        offering("m6i.large", "us-east-1a", Spot, 0.04),
        offering("m6i.xlarge", "us-east-1a", OnDemand, 0.192),
        offering("m6i.xlarge", "us-east-1a", Spot, 0.08),
        offering("Standard_D2ps_v5", "eastus-1", OnDemand, 0.077),
        offering("Standard_D2s_v5", "eastus-1", OnDemand, 0.096),
    ];
    let out = apply(&overlays, &[], &all);
    // m6i.xlarge: the first rule (its fixed rate) wins over the family's discount, as before.
    assert_eq!(prices(&out), [0.072, 0.04, 0.1, 0.1, 0.0693, 0.096]);
}

/// Karpenter's instance types of `suite_test.go` by their roles: `default-instance-type`,
/// `small-instance-type`, `gpu-vendor-instance-type` (here three types of the embedded catalog,
/// one on-demand offering each).
fn three() -> Vec<Offering> {
    vec![offering("m7g.large", "test-zone-1", OnDemand, 1.0), offering("m7g.medium", "test-zone-1", OnDemand, 0.5), offering("g5g.xlarge", "test-zone-1", OnDemand, 3.0)]
}
const DEFAULT: &str = "m7g.large";
const SMALL: &str = "m7g.medium";
const GPU: &str = "g5g.xlarge";

fn with_capacity(name: &str, types: (&str, &[&str]), weight: i32, capacity: serde_json::Value) -> Arc<NodeOverlay> {
    overlay(name, json!({"requirements": [req(labels::INSTANCE_TYPE, types.0, types.1)], "weight": weight, "capacity": capacity}))
}

/// One type's amount of `resource` after the overlays (the shared offering's).
fn amount(o: &Overlaid, it: &str, resource: &str) -> i64 {
    o.offerings.iter().find(|x| x.pool.is_none() && x.instance.name == it).map(|x| x.instance.extended_resource(resource)).expect("offering")
}

/// `suite_test.go`'s "Capacity Adjustment" validation cases: two overlays of one weight setting
/// one resource of one type conflict (the earlier name, which Karpenter reaches second), even
/// when they set the same amount; different resources, exclusive requirements or different
/// weights do not; and a conflict is with the last overlay to set the type, not the first.
#[test]
fn capacity_overlays_conflict_as_karpenters() {
    let fuse = |n: &str| json!({"smarter-devices/fuse": n});
    // (overlays, each one's expected reason)
    type Case<'a> = (Vec<Arc<NodeOverlay>>, &'a [(&'a str, &'a str)]);
    let cases: [Case; 6] = [
        // "should fail with conflicting capacity overlays with overlapping requirements"
        (vec![with_capacity("overlay-a", ("In", &[DEFAULT, SMALL]), 10, fuse("1")), with_capacity("overlay-b", ("In", &[DEFAULT, GPU]), 10, fuse("54"))], &[("overlay-a", "Conflict"), ("overlay-b", "ValidationSucceeded")]),
        // "... with multiple overlays": the one that conflicts is the last to set the type.
        (
            vec![
                with_capacity("conflicting-overlay-1", ("In", &[DEFAULT, SMALL]), 10, json!({"hugepage-1Gi": "2Gi"})),
                with_capacity("good-overlay-1", ("In", &[DEFAULT]), 10, fuse("1")),
                with_capacity("conflicting-overlay-2", ("In", &[DEFAULT]), 10, json!({"hugepage-1Gi": "3Gi"})),
            ],
            &[("conflicting-overlay-1", "Conflict"), ("good-overlay-1", "ValidationSucceeded"), ("conflicting-overlay-2", "ValidationSucceeded")],
        ),
        // "... are the same overlays with overlapping requirements": equal amounts conflict too.
        (vec![with_capacity("overlay-a", ("In", &[DEFAULT, SMALL]), 10, fuse("54")), with_capacity("overlay-b", ("In", &[DEFAULT, GPU]), 10, fuse("54"))], &[("overlay-a", "Conflict"), ("overlay-b", "ValidationSucceeded")]),
        // "... with mutually exclusive requirements"
        (vec![with_capacity("overlay-a", ("In", &[DEFAULT]), 10, fuse("54")), with_capacity("overlay-b", ("NotIn", &[DEFAULT]), 10, fuse("5"))], &[("overlay-a", "ValidationSucceeded"), ("overlay-b", "ValidationSucceeded")]),
        // "... with mutually exclusive weights"
        (vec![with_capacity("overlay-a", ("In", &[DEFAULT]), 10, fuse("55")), with_capacity("overlay-b", ("In", &[DEFAULT, GPU]), 20, fuse("5"))], &[("overlay-a", "ValidationSucceeded"), ("overlay-b", "ValidationSucceeded")]),
        // "should pass with non conflicting capacity overlays with overlapping requirements"
        (vec![with_capacity("overlay-a", ("In", &[DEFAULT]), 10, fuse("55")), with_capacity("overlay-b", ("In", &[DEFAULT, GPU]), 20, json!({"smarter-devices/buz": "5"}))], &[("overlay-a", "ValidationSucceeded"), ("overlay-b", "ValidationSucceeded")]),
    ];
    for (overlays, expected) in cases {
        let o = apply(&overlays, &[], &three());
        for (name, reason) in expected {
            assert_eq!(outcome(&o, name), *reason, "{name}: {:?}", o.outcomes);
        }
    }
    // A capacity conflict keeps the overlay's price out too (no partial application).
    let o = apply(&[with_capacity("b", ("In", &[DEFAULT]), 10, fuse("1")), overlay("a", json!({"requirements": [req(labels::INSTANCE_TYPE, "In", &[DEFAULT])], "weight": 10, "capacity": fuse("2"), "price": "9"}))], &[], &three());
    assert_eq!((outcome(&o, "a"), amount(&o, DEFAULT, "smarter-devices/fuse")), ("Conflict", 1));
    assert_eq!(prices(&o), [1.0, 0.5, 3.0]);
}

/// `suite_test.go`'s "Instance Type Controller" capacity cases: an overlay gives the types it
/// selects its resources and no other type; several overlays' resources add up on one type;
/// the heavier overlay's amount wins; an invalid overlay gives nothing; a NodePool's overlay
/// sizes that pool's offerings alone; an overlay that conflicts on one type gives no type
/// anything.
#[test]
fn capacity_overlays_size_the_types_they_select_as_karpenters() {
    let fuse = |n: &str| json!({"smarter-devices/fuse": n});
    // "should apply capacity adjustments for instances types" / "... that do not overlap"
    let o = apply(&[with_capacity("a", ("In", &[DEFAULT]), 10, fuse("1"))], &[], &three());
    assert_eq!([DEFAULT, SMALL, GPU].map(|t| amount(&o, t, "smarter-devices/fuse")), [1, 0, 0]);
    // "should update capacity for instance types from multiple overlays"
    let o = apply(&[with_capacity("a", ("In", &[DEFAULT, SMALL]), 10, fuse("1")), with_capacity("b", ("In", &[DEFAULT, GPU]), 20, json!({"hugepages-2Mi": "100Mi"}))], &[], &three());
    assert_eq!([DEFAULT, SMALL, GPU].map(|t| (amount(&o, t, "smarter-devices/fuse"), amount(&o, t, "hugepages-2Mi"))), [(1, 100 << 20), (1, 0), (0, 100 << 20)]);
    // "should apply higher weight overlay when multiple overlays match the same instance type"
    let o = apply(&[with_capacity("light", ("In", &[DEFAULT]), 10, fuse("1")), with_capacity("heavy", ("In", &[DEFAULT]), 20, fuse("8"))], &[], &three());
    assert_eq!(amount(&o, DEFAULT, "smarter-devices/fuse"), 8);
    // An overlay may set a type's GPUs: it replaces the catalog's count, as `lo.Assign` does.
    let o = apply(&[with_capacity("gpus", ("In", &[GPU]), 10, json!({"nvidia.com/gpu": "4"}))], &[], &three());
    assert_eq!((amount(&o, GPU, "nvidia.com/gpu"), three()[2].instance.extended_resource("nvidia.com/gpu")), (4, 1));
    // "should not apply capacity adjustments for invalid overlay"
    let o = apply(&[with_capacity("bad", ("In", &[DEFAULT]), 10, json!({"memory": "1Gi", "smarter-devices/fuse": "1"}))], &[], &three());
    assert_eq!((outcome(&o, "bad"), amount(&o, DEFAULT, "smarter-devices/fuse")), ("RuntimeValidation", 0));
    // "should that there is not a partial application for instance types": b conflicts with a
    // on DEFAULT, so SMALL gets nothing from it either.
    let o = apply(&[with_capacity("b", ("In", &[DEFAULT]), 10, fuse("1")), with_capacity("a", ("In", &[DEFAULT, SMALL]), 10, fuse("2"))], &[], &three());
    assert_eq!((outcome(&o, "a"), amount(&o, SMALL, "smarter-devices/fuse")), ("Conflict", 0));
    // "should only apply override for nodepool that defined in the overlay requirements"
    let np = |name: &str| -> Arc<NodePool> { Arc::new(serde_json::from_value(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": {"template": {"spec": {"requirements": []}}}})).expect("pool")) };
    let pools = [np("np1"), np("np2")];
    let for_np1 = overlay("np1-fuse", json!({"requirements": [req("karpenter.sh/nodepool", "In", &["np1"])], "weight": 10, "capacity": fuse("3")}));
    let o = apply(std::slice::from_ref(&for_np1), &pools, &three());
    let own: Vec<(String, i64, f64)> = o.offerings.iter().filter(|x| x.pool.is_some()).map(|x| (format!("{}/{}", x.pool.as_deref().unwrap_or(""), x.instance.name), x.instance.extended_resource("smarter-devices/fuse"), x.price)).collect();
    assert_eq!(own, [(format!("np1/{DEFAULT}"), 3, 1.0), (format!("np1/{SMALL}"), 3, 0.5), (format!("np1/{GPU}"), 3, 3.0)], "np1's own offerings, at the shared price");
    assert_eq!([DEFAULT, SMALL, GPU].map(|t| amount(&o, t, "smarter-devices/fuse")), [0, 0, 0], "np2 and the shared offerings get nothing");
    // "should pass with conflicting capcaity update overlays for all nodepools": one per pool.
    let for_np2 = overlay("np2-fuse", json!({"requirements": [req("karpenter.sh/nodepool", "In", &["np2"])], "weight": 10, "capacity": fuse("5")}));
    let o = apply(&[for_np1, for_np2], &pools, &three());
    assert!(o.outcomes.values().all(|x| matches!(x, Outcome::Applied { types: 3, .. })), "{:?}", o.outcomes);
    let of_pool = |pool: &str| o.offerings.iter().find(|x| x.pool.as_deref() == Some(pool) && x.instance.name == DEFAULT).map(|x| x.instance.extended_resource("smarter-devices/fuse"));
    assert_eq!((of_pool("np1"), of_pool("np2")), (Some(3), Some(5)));
}
