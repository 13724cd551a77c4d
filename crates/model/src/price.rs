//! What a running node costs: one rule, and where its answer came from. The extender's scores,
//! `archer simulate`, `archer report`, the cost gauges and consolidation all read
//! [`node_price`] (the model's readers through [`crate::ClusterState::node_price`]), so no two
//! of them price the same node differently.
//!
//! The order, first that answers:
//! 1. the node's `archer.dev/price-per-hour` annotation: the operator's word on this very node.
//!    One that is not a sane number makes the price unknown, with the reason: it is not replaced
//!    by a guess, because the operator meant something and it is wrong;
//! 2. the provider's current offering for its instance type, zone and capacity type (with the
//!    user's NodeOverlays applied): what the node costs now, as Karpenter's consolidation prices
//!    a node, so a spot price that moved or an overlay added or removed counts at once;
//! 3. the price its NodeClaim was bought at (Archer's claims record it at launch), for a node
//!    whose offering is not listed now (unavailable, or no longer sold);
//! 4. the catalog, in the node's region. A node whose region the catalog has no price in is
//!    unpriced, with that reason; only a node that names no region at all is priced in the
//!    catalog's default region, and says so ([`Source::CatalogDefaultRegion`]).
//!
//! A price above the ceiling (`max_per_hour`) or not finite is not believed either.

use archer_core::catalog::Catalog;
use archer_core::instance::CapacityType;
use archer_core::labels;
use archer_core::packer::Offering;

/// Where a node's price came from (the `source` label of `archer_node_price_dollars_per_hour`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    Annotation,
    NodeClaim,
    Offering,
    Catalog,
    CatalogDefaultRegion,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Annotation => "annotation",
            Source::NodeClaim => "nodeclaim",
            Source::Offering => "offering",
            Source::Catalog => "catalog",
            Source::CatalogDefaultRegion => "catalog-default-region",
        }
    }
}

/// A node's hourly price (USD) and where it came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodePrice {
    pub per_hour: f64,
    pub source: Source,
}

/// What prices are read from, besides the node itself.
#[derive(Debug, Clone, Copy)]
pub struct Sources<'a> {
    /// The provider's offerings (for a scenario, the catalog's in the pools' zones).
    pub offerings: &'a [Offering],
    pub catalog: Option<&'a Catalog>,
    /// USD per hour; a price above it is absurd and not believed.
    pub max_per_hour: f64,
}

/// The ceiling when none is configured (the extender's `maxPricePerHour` default).
pub const DEFAULT_MAX_PER_HOUR: f64 = 1000.0;

/// The most of an annotation a reason quotes.
const QUOTED_CHARS: usize = 64;

/// Why a node has no price: a price it names that cannot be believed, or nothing that prices it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unpriced {
    #[error("{0}")]
    NotBelieved(String),
    #[error("{0}")]
    Unknown(String),
}

/// The node's price by the rule in this module's documentation. `label` reads the node's
/// labels, `annotation` is its `archer.dev/price-per-hour`, `claim_price` what its NodeClaim
/// paid (0 or absent: none).
pub fn node_price(sources: &Sources<'_>, label: &dyn Fn(&str) -> Option<String>, annotation: Option<&str>, claim_price: Option<f64>) -> Result<NodePrice, Unpriced> {
    let sane = |p: f64| p.is_finite() && (0.0..=sources.max_per_hour).contains(&p);
    let believed = |per_hour: f64, source: Source| {
        if sane(per_hour) {
            Ok(NodePrice { per_hour, source })
        } else {
            Err(Unpriced::NotBelieved(format!("{} price {per_hour} is not in 0..={} USD/h", source.as_str(), sources.max_per_hour)))
        }
    };
    if let Some(a) = annotation {
        return match a.trim().parse::<f64>() {
            Ok(p) if sane(p) => Ok(NodePrice { per_hour: p, source: Source::Annotation }),
            _ => {
                let quoted: String = a.chars().take(QUOTED_CHARS).collect();
                let cut = if quoted.len() < a.len() { "..." } else { "" };
                Err(Unpriced::NotBelieved(format!("{} {quoted:?}{cut} is not a price in 0..={} USD/h", labels::PRICE_ANNOTATION, sources.max_per_hour)))
            }
        };
    }
    if let Some(o) = Offering::of_node(sources.offerings, label) {
        return believed(o.price, Source::Offering);
    }
    if let Some(p) = claim_price.filter(|p| *p > 0.0) {
        return believed(p, Source::NodeClaim);
    }
    let Some(instance_type) = label(labels::INSTANCE_TYPE).or_else(|| label(labels::INSTANCE_TYPE_BETA)) else {
        return Err(Unpriced::Unknown("the node has no instance-type label".into()));
    };
    let Some(catalog) = sources.catalog else {
        return Err(Unpriced::Unknown(format!("no offering of {instance_type} at hand, and no catalog")));
    };
    let capacity = CapacityType::of_node(label);
    let region = label(labels::REGION).or_else(|| label(labels::REGION_BETA)).or_else(|| label(labels::ZONE).map(|z| labels::region_of(&z).to_string()));
    match region {
        Some(region) => match catalog.price(&instance_type, Some(&region), capacity) {
            Some(p) => believed(p, Source::Catalog),
            None if catalog.get(&instance_type).is_none() => Err(Unpriced::Unknown(format!("the catalog does not know {instance_type}"))),
            None => Err(Unpriced::Unknown(format!("the catalog has no price for {instance_type} in {region}"))),
        },
        None => match catalog.price(&instance_type, None, capacity) {
            Some(p) => believed(p, Source::CatalogDefaultRegion),
            None => Err(Unpriced::Unknown(format!("the catalog does not know {instance_type}"))),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, reason = "test code")]
    use super::*;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn price(sources: &Sources<'_>, l: &BTreeMap<String, String>, annotation: Option<&str>, claim: Option<f64>) -> Result<NodePrice, Unpriced> {
        node_price(sources, &|k| l.get(k).cloned(), annotation, claim)
    }

    #[test]
    fn the_first_source_that_answers_prices_the_node() {
        let catalog = Catalog::embedded().expect("catalog");
        let offerings = Offering::embedded_on_demand();
        let listed = catalog.price("m7g.large", Some("us-east-1"), CapacityType::OnDemand).expect("listed");
        let offered = Offering::find(&offerings, "m7g.large", "us-east-1a", "on-demand").expect("offered").price;
        let all = Sources { offerings: &offerings, catalog: Some(&catalog), max_per_hour: DEFAULT_MAX_PER_HOUR };
        let node = labels(&[(labels::INSTANCE_TYPE, "m7g.large"), (labels::ZONE, "us-east-1a"), (labels::REGION, "us-east-1"), (labels::KARPENTER_CAPACITY_TYPE, "on-demand")]);
        assert_eq!(price(&all, &node, Some(" 0.5 "), Some(0.2)), Ok(NodePrice { per_hour: 0.5, source: Source::Annotation }));
        assert_eq!(price(&all, &node, None, Some(0.2)), Ok(NodePrice { per_hour: offered, source: Source::Offering }), "the price now, not the price then");
        let catalog_only = Sources { offerings: &[], ..all };
        assert_eq!(price(&catalog_only, &node, None, Some(0.2)), Ok(NodePrice { per_hour: 0.2, source: Source::NodeClaim }), "no offering listed now: what the claim paid");
        assert_eq!(price(&catalog_only, &node, None, Some(0.0)), Ok(NodePrice { per_hour: listed, source: Source::Catalog }), "a claim of no price names none");
        assert_eq!(price(&catalog_only, &node, None, None), Ok(NodePrice { per_hour: listed, source: Source::Catalog }));
        let unlabelled = labels(&[(labels::INSTANCE_TYPE, "m7g.large")]);
        assert_eq!(price(&catalog_only, &unlabelled, None, None), Ok(NodePrice { per_hour: listed, source: Source::CatalogDefaultRegion }), "no region named: the default's, said");
        assert_eq!(price(&Sources { catalog: None, ..catalog_only }, &node, None, None).map_err(|e| e.to_string()), Err("no offering of m7g.large at hand, and no catalog".into()));
    }

    #[test]
    fn a_region_without_prices_is_unpriced_and_says_so() {
        let catalog = Catalog::embedded().expect("catalog");
        let sources = Sources { offerings: &[], catalog: Some(&catalog), max_per_hour: DEFAULT_MAX_PER_HOUR };
        let eu = labels(&[(labels::INSTANCE_TYPE, "m7g.large"), (labels::ZONE, "eu-west-1a")]);
        assert_eq!(price(&sources, &eu, None, None), Err(Unpriced::Unknown("the catalog has no price for m7g.large in eu-west-1".into())), "the zone names the region");
        let unknown = labels(&[(labels::INSTANCE_TYPE, "x9.huge"), (labels::REGION, "us-east-1")]);
        assert_eq!(price(&sources, &unknown, None, None), Err(Unpriced::Unknown("the catalog does not know x9.huge".into())));
    }

    /// A price the node names that is not a sane number makes it unpriced, not the catalog's.
    #[test]
    fn prices_that_are_not_believed_say_why() {
        let catalog = Catalog::embedded().expect("catalog");
        let sources = Sources { offerings: &[], catalog: Some(&catalog), max_per_hour: 10.0 };
        let node = labels(&[(labels::INSTANCE_TYPE, "m7g.large"), (labels::REGION, "us-east-1")]);
        for bad in ["NaN", "-1", "1e9", "inf", "cheap"] {
            let err = price(&sources, &node, Some(bad), None).expect_err(bad).to_string();
            assert!(err.contains(labels::PRICE_ANNOTATION) && err.contains("0..=10"), "{bad}: {err}");
        }
        let long = "9".repeat(500);
        assert!(price(&sources, &node, Some(&long), None).expect_err("long").to_string().contains("..."), "quoted in part");
        assert!(matches!(price(&sources, &node, None, Some(50.0)), Err(Unpriced::NotBelieved(_))), "a claim above the ceiling");
    }

    /// Karpenter's, Archer's, EKS managed node groups' and AKS's capacity labels all read the
    /// same; no label is on-demand.
    #[test]
    fn the_capacity_type_of_karpenter_archer_eks_and_aks_nodes() {
        let catalog = Catalog::embedded().expect("catalog");
        let sources = Sources { offerings: &[], catalog: Some(&catalog), max_per_hour: DEFAULT_MAX_PER_HOUR };
        let od = catalog.price("m7g.large", Some("us-east-1"), CapacityType::OnDemand).expect("price");
        let spot = catalog.price("m7g.large", Some("us-east-1"), CapacityType::Spot).expect("price");
        assert!(spot < od);
        let with = |key: &str, value: &str| price(&sources, &labels(&[(labels::INSTANCE_TYPE, "m7g.large"), (labels::REGION, "us-east-1"), (key, value)]), None, None).map(|p| p.per_hour);
        assert_eq!(with(labels::KARPENTER_CAPACITY_TYPE, "spot"), Ok(spot));
        assert_eq!(with(labels::CAPACITY_TYPE, "spot"), Ok(spot));
        assert_eq!(with("eks.amazonaws.com/capacityType", "SPOT"), Ok(spot));
        assert_eq!(with("eks.amazonaws.com/capacityType", "ON_DEMAND"), Ok(od));
        assert_eq!(with(labels::AKS_SCALE_SET_PRIORITY, "spot"), Ok(spot));
        assert_eq!(with(labels::AKS_SCALE_SET_PRIORITY, "regular"), Ok(od));
        assert_eq!(with("unrelated", "spot"), Ok(od), "no capacity label: on-demand");
        let both = labels(&[(labels::INSTANCE_TYPE, "m7g.large"), (labels::REGION, "us-east-1"), (labels::KARPENTER_CAPACITY_TYPE, "reserved"), ("eks.amazonaws.com/capacityType", "SPOT")]);
        assert_eq!(price(&sources, &both, None, None).map(|p| p.per_hour), Ok(spot), "a value Archer does not sell gives way to the next label");
    }
}
