//! Karpenter's NodeOverlays (`karpenter.sh/v1alpha1`) applied to the offerings every decision
//! reads, with Karpenter's semantics:
//! - an overlay matches an offering when every requirement admits the offering's labels (its
//!   instance type's well-known and cloud labels, zone, region, capacity type); a key the
//!   offering does not carry fails unless the operator is `NotIn` or `DoesNotExist`;
//! - overlays apply from the highest weight down, ties by name, the later name first; the
//!   first price that reaches an offering is its price, later ones do not stack;
//! - `price` replaces the price, `priceAdjustment` adds an amount (`+0.1`, `-0.05`) or a
//!   percentage (`+10%`, `-15%`); an adjusted price never goes below 0 and is not rounded;
//! - an overlay that would set the price of an offering an overlay of the same weight already
//!   reaches conflicts: it applies nowhere (`ValidationSucceeded=False`, reason `Conflict`),
//!   whatever the prices;
//! - an invalid overlay applies nowhere (reason `RuntimeValidation`).
//!
//! - an overlay whose requirements name the NodePool (`karpenter.sh/nodepool`) or a key some
//!   NodePool's template labels set is evaluated per NodePool, as Karpenter does: where it prices
//!   a pool's offering differently from the shared one, the pool gets an offering of its own
//!   (`Offering::pool`), which only it plans with.
//!
//! - `capacity` sets extended resources (`smarter-devices/fuse`, `hugepages-2Mi`) of every
//!   instance type one of whose offerings it selects, as Karpenter's store does: per instance
//!   type (and NodePool), heavier overlays first, a resource an earlier overlay set is kept; an
//!   overlay setting a resource the last overlay to reach that type set, at the same weight,
//!   conflicts. The planner counts them as kube-scheduler counts a node's extended resources,
//!   and a planned node advertises them (its NodeClaim's capacity and allocatable).
//!
//! Where Archer cannot apply an overlay as Karpenter would, it says so in the overlay's outcome
//! (its `ArcherApplied` condition, `archer simulate`'s notes).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use archer_api::nodeoverlay::NodeOverlay;
use archer_api::nodepool::NodePool;
use archer_core::labels;
use archer_core::packer::Offering;
use archer_core::requirements::Requirements;

/// How an overlay changes a price.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PriceChange {
    /// `price`: this, in place of the offering's.
    Set(f64),
    /// `priceAdjustment: +0.1` / `-0.05`.
    Add(f64),
    /// `priceAdjustment: +10%` / `-15%`.
    Percent(f64),
}

impl PriceChange {
    /// The offering's price after the change: never below 0, not rounded.
    pub fn apply(self, price: f64) -> f64 {
        match self {
            PriceChange::Set(p) => p,
            PriceChange::Add(d) => (price + d).max(0.0),
            PriceChange::Percent(pct) => (price * (1.0 + pct / 100.0)).max(0.0),
        }
    }
}

/// An unsigned decimal: digits, optionally `.` and digits after (`0.432`, `43`).
fn unsigned_decimal(s: &str) -> Option<f64> {
    let (whole, frac) = s.split_once('.').map_or((s, None), |(w, f)| (w, Some(f)));
    let digits = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit());
    (digits(whole) && frac.is_none_or(digits)).then(|| s.parse().ok()).flatten()
}

/// `\d*\.?\d+`: digits with an optional point, not ending in one (`.5`, `34.43`, `43`).
fn loose_decimal(s: &str) -> Option<f64> {
    let (whole, frac) = s.split_once('.').map_or(("", s), |(w, f)| (w, f));
    let ok = whole.bytes().all(|b| b.is_ascii_digit()) && !frac.is_empty() && frac.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| s.parse().ok()).flatten()
}

/// `spec.price`: `^\d+(\.\d+)?$`.
pub fn parse_price(s: &str) -> Result<f64, String> {
    unsigned_decimal(s).ok_or_else(|| format!("price {s:?} is not a decimal number of USD per hour (like 0.432)"))
}

/// `spec.priceAdjustment`, by the CRD's pattern: a signed amount (`+0.1`, `-0.05`), a positive
/// percentage (`+10%`), a negative one of at most two integer digits (`-15%`, `-99.5%`), or
/// exactly `-100%`.
pub fn parse_adjustment(s: &str) -> Result<PriceChange, String> {
    let bad = || format!("priceAdjustment {s:?} is not a signed amount (+0.1, -0.05) or percentage (+10%, -15%)");
    let (sign, rest) = match s.as_bytes().first() {
        Some(b'+') => (1.0, &s[1..]),
        Some(b'-') => (-1.0, &s[1..]),
        _ => return Err(bad()),
    };
    match rest.strip_suffix('%') {
        None => loose_decimal(rest).map(|v| PriceChange::Add(sign * v)).ok_or_else(bad),
        Some(_) if s == "-100%" => Ok(PriceChange::Percent(-100.0)),
        Some(pct) if sign > 0.0 => loose_decimal(pct).map(PriceChange::Percent).ok_or_else(bad),
        Some(pct) => {
            // `-\d{1,2}(\.\d+)?%`
            let whole = pct.split_once('.').map_or(pct, |(w, _)| w);
            let fits = (1..=2).contains(&whole.len()) && unsigned_decimal(pct).is_some();
            fits.then(|| unsigned_decimal(pct).map(|v| PriceChange::Percent(-v))).flatten().ok_or_else(bad)
        }
    }
}

/// A label key as Kubernetes takes it: an optional DNS-subdomain prefix (at most 253, lowercase)
/// and `/`, then a name of at most 63 characters, alphanumeric at both ends, `-_.` inside.
fn qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = label_value(name) && !name.is_empty();
    let prefix_ok = prefix.is_none_or(|p| {
        p.len() <= 253 && p.split('.').all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') && !part.starts_with('-') && !part.ends_with('-'))
    });
    name_ok && prefix_ok
}

/// A label value: empty, or at most 63 characters, alphanumeric at both ends, `-_.` inside.
fn label_value(v: &str) -> bool {
    let bytes = v.as_bytes();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    v.is_empty() || (v.len() <= 63 && bytes.first().is_some_and(u8::is_ascii_alphanumeric) && bytes.last().is_some_and(u8::is_ascii_alphanumeric) && bytes.iter().all(inner))
}

/// Resources an overlay's `capacity` may not name (Karpenter's well-known resources).
const RESTRICTED_RESOURCES: [&str; 4] = ["cpu", "memory", "ephemeral-storage", "pods"];

/// An overlay as Archer applies it.
#[derive(Debug, Clone)]
pub struct Checked {
    pub name: String,
    pub weight: i32,
    pub requirements: Requirements,
    pub price: Option<PriceChange>,
    /// Extended resource -> amount in base units (devices, bytes).
    pub capacity: BTreeMap<String, i64>,
}

/// Karpenter's validation of an overlay (the CRD's rules and its runtime validation), for
/// overlays that reach Archer without the API server's (a scenario, a dump) as well as live.
pub fn validate(o: &NodeOverlay) -> Result<Checked, String> {
    let name = o.metadata.name.clone().unwrap_or_default();
    let s = &o.spec;
    if s.price.is_some() && s.price_adjustment.is_some() {
        return Err("cannot set both 'price' and 'priceAdjustment'".into());
    }
    if s.requirements.len() > 100 {
        return Err(format!("{} requirements; at most 100", s.requirements.len()));
    }
    let weight = match s.weight {
        None => 0,
        Some(w) if (1..=10_000).contains(&w) => w,
        Some(w) => return Err(format!("weight {w} is not in 1..=10000")),
    };
    let mut requirements = Requirements::new();
    for r in &s.requirements {
        if !qualified_name(&r.key) {
            return Err(format!("invalid value: key {:?} is not a qualified name in requirements, restricted", r.key));
        }
        if let Some(v) = r.values.iter().find(|v| !label_value(v)) {
            return Err(format!("invalid value: {v:?} is not a label value in requirements, restricted"));
        }
        if r.key == "kubernetes.io/hostname" {
            return Err("invalid value: label \"kubernetes.io/hostname\" is restricted in requirements, restricted".into());
        }
        let domain = r.key.split_once('/').map_or("", |(d, _)| d);
        if (domain == "karpenter.sh" || domain.ends_with(".karpenter.sh")) && r.key != labels::KARPENTER_CAPACITY_TYPE && r.key != labels::KARPENTER_NODEPOOL {
            return Err(format!("invalid value: label domain \"karpenter.sh\" is restricted in requirements, restricted ({})", r.key));
        }
        if matches!(r.operator.as_str(), "In" | "NotIn") && r.values.is_empty() {
            return Err(format!("key {} with operator {} must have a value defined", r.key, r.operator));
        }
        if r.key == labels::KARPENTER_CAPACITY_TYPE && r.operator == "In" && !r.values.iter().any(|v| matches!(v.as_str(), "on-demand" | "spot" | "reserved")) {
            return Err(format!("invalid value: {} In {:?} names no capacity type (on-demand, spot, reserved) in requirements, restricted", r.key, r.values));
        }
        // Gt/Lt/Gte/Lte take one integer, at least 0; Gte/Lte are Gt/Lt one further out.
        let integer = || match r.values.as_slice() {
            [v] => v.parse::<i64>().ok().filter(|n| *n >= 0),
            _ => None,
        };
        let bad_integer = || format!("requirements operator 'Gt', 'Lt', 'Gte' or 'Lte' must have a single positive integer value ({})", r.key);
        let (operator, values) = match r.operator.as_str() {
            "Gt" | "Lt" => (r.operator.as_str(), vec![integer().ok_or_else(bad_integer)?.to_string()]),
            "Gte" => ("Gt", vec![(integer().ok_or_else(bad_integer)? - 1).to_string()]),
            // Lte of the largest integer bounds nothing: Exists.
            "Lte" => match integer().ok_or_else(bad_integer)?.checked_add(1) {
                Some(n) => ("Lt", vec![n.to_string()]),
                None => ("Exists", Vec::new()),
            },
            _ => (r.operator.as_str(), r.values.clone()),
        };
        requirements.add(&r.key, operator, &values).map_err(|e| format!("invalid value: {e} in requirements, restricted"))?;
    }
    let price = match (&s.price, &s.price_adjustment) {
        (Some(p), _) => Some(PriceChange::Set(parse_price(p)?)),
        (None, Some(a)) => Some(parse_adjustment(a)?),
        (None, None) => None,
    };
    let mut capacity: BTreeMap<String, i64> = BTreeMap::new();
    for (k, v) in s.capacity.iter().flatten() {
        if RESTRICTED_RESOURCES.contains(&k.as_str()) {
            return Err(format!("invalid capacity: {k} in resource, restricted"));
        }
        let amount = match v {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => Some(i64::from(*n)),
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(q) => archer_core::quantity::value(q),
        };
        match amount {
            Some(n) if n >= 0 => capacity.insert(k.clone(), n),
            _ => return Err(format!("invalid capacity: {k}: {v:?} is not a quantity")),
        };
    }
    Ok(Checked { name, weight, requirements, price, capacity })
}

/// What became of one overlay.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Applied: the offerings whose price it set (0 when it matches none, or only ones a
    /// heavier overlay already priced), and the instance types whose capacity it reached.
    Applied { offerings: usize, types: usize },
    /// Karpenter's `RuntimeValidation`.
    Invalid(String),
    /// Karpenter's `Conflict`: another overlay of the same weight reaches the same offering.
    Conflict(String),
    /// Valid, but Archer cannot apply it as Karpenter would (a cloud key its offerings lack).
    NotApplied(String),
}

impl Outcome {
    /// `ValidationSucceeded`'s status, reason and message, as Karpenter sets them: an overlay
    /// Archer does not apply is still valid.
    pub fn condition(&self) -> (&'static str, &'static str, String) {
        match self {
            Outcome::Applied { .. } | Outcome::NotApplied(_) => ("True", "ValidationSucceeded", String::new()),
            Outcome::Invalid(why) => ("False", "RuntimeValidation", why.clone()),
            Outcome::Conflict(_) => ("False", "Conflict", "conflict with another overlay".into()),
        }
    }

    /// Archer's own `ArcherApplied` condition: status, reason (`Applied`, `NotApplied`, or
    /// Karpenter's reason when it is invalid or conflicts) and message.
    pub fn archer_applied(&self) -> (&'static str, &'static str, String) {
        match self {
            Outcome::Applied { offerings, types: 0 } => ("True", "Applied", format!("prices {offerings} offering(s)")),
            Outcome::Applied { offerings, types } => ("True", "Applied", format!("prices {offerings} offering(s); sets the capacity of {types} instance type(s)")),
            Outcome::NotApplied(why) => ("False", "NotApplied", why.clone()),
            Outcome::Invalid(_) | Outcome::Conflict(_) => {
                let (_, reason, message) = self.condition();
                ("False", reason, message)
            }
        }
    }

    /// The overlay's status conditions: Karpenter's `ValidationSucceeded` and `Ready` (which
    /// follows it), and Archer's own `ArcherApplied`, which says what Archer does with it
    /// (beside Karpenter, each writes its own and they agree on Karpenter's two).
    pub fn conditions(&self) -> Vec<(&'static str, &'static str, &'static str, String)> {
        let (status, reason, message) = self.condition();
        let ready = if status == "True" { ("True", "Ready", String::new()) } else { ("False", "UnhealthyDependents", "ValidationSucceeded=False".to_string()) };
        let archer = self.archer_applied();
        vec![("ValidationSucceeded", status, reason, message), ("Ready", ready.0, ready.1, ready.2), ("ArcherApplied", archer.0, archer.1, archer.2)]
    }
}

/// The offerings with the overlays applied, what became of each overlay (by name), and which
/// overlay priced each offering that one priced (by its index in the offerings).
#[derive(Debug, Clone, Default)]
pub struct Overlaid {
    pub offerings: Vec<Offering>,
    pub outcomes: BTreeMap<String, Outcome>,
    pub priced_by: HashMap<usize, String>,
}

/// Apply `overlays` to `offerings` (Karpenter's semantics, this module's documentation);
/// `pools` tell which keys depend on the NodePool.
pub fn apply(overlays: &[Arc<NodeOverlay>], pools: &[Arc<NodePool>], offerings: &[Offering]) -> Overlaid {
    let mut out = Overlaid { offerings: offerings.to_vec(), ..Default::default() };
    if overlays.is_empty() {
        return out;
    }
    let mut checked: Vec<Checked> = Vec::new();
    for o in overlays {
        match validate(o) {
            Ok(c) => checked.push(c),
            Err(why) => {
                out.outcomes.insert(o.metadata.name.clone().unwrap_or_default(), Outcome::Invalid(why));
            }
        }
    }
    // Heaviest first; equal weights by name, the later name first (Karpenter's OrderByWeight).
    checked.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| b.name.cmp(&a.name)));
    let pool_keys: BTreeSet<String> = pools.iter().flat_map(|p| p.spec.template.metadata.labels.keys().cloned()).chain([labels::KARPENTER_NODEPOOL.to_string(), labels::NODEPOOL.to_string()]).collect();
    let own_labels: Vec<BTreeMap<String, String>> = offerings.iter().map(|o| o.own_labels().map(|(k, v)| (k.to_string(), v)).collect()).collect();
    // The cloud's well-known keys the offerings carry: a requirement on another key of a cloud's
    // domain (Karpenter labels more than Archer does, `instance-size`, `instance-hypervisor`) would
    // match nothing (`In`) or everything (`NotIn`), so such an overlay is said not applied.
    let carried: BTreeSet<String> = own_labels.iter().flat_map(|l| l.keys().cloned()).collect();
    let cloud_key = |k: &str| ["karpenter.k8s.aws/", "karpenter.azure.com/", "kubernetes.azure.com/"].iter().any(|d| k.starts_with(d)) && !carried.contains(k);
    // Where prices are decided: the shared offerings, and (when an overlay depends on the
    // NodePool) each pool's, their labels with the pool's name and template labels, as
    // Karpenter evaluates overlays per NodePool.
    let per_pool = checked.iter().any(|c| c.requirements.keys().any(|k| pool_keys.contains(k)));
    let mut contexts = Vec::new();
    if per_pool {
        for p in pools {
            let name = p.metadata.name.clone().unwrap_or_default();
            let labels = own_labels
                .iter()
                .map(|l| {
                    let mut l = l.clone();
                    l.extend(p.spec.template.metadata.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
                    l.insert(labels::KARPENTER_NODEPOOL.to_string(), name.clone());
                    l.insert(labels::NODEPOOL.to_string(), name.clone());
                    l
                })
                .collect();
            contexts.push(Context::new(Some(name), labels, offerings));
        }
    }
    // The shared context first, its labels moved rather than copied.
    contexts.insert(0, Context::new(None, own_labels, offerings));
    for c in checked {
        if let Some(key) = c.requirements.keys().find(|k| cloud_key(k)) {
            let why = format!("Archer's offerings do not carry {key}, so its requirement could not select them as Karpenter's would");
            out.outcomes.insert(c.name, Outcome::NotApplied(why));
            continue;
        }
        let matched: Vec<Vec<usize>> = contexts.iter().map(|x| x.labels.iter().enumerate().filter(|(_, l)| c.requirements.matches_map(l)).map(|(i, _)| i).collect()).collect();
        // The instance types it reaches, per context: all of a type's offerings get its
        // capacity when it selects one of them (Karpenter's all-or-nothing per type).
        let types: Vec<BTreeSet<&str>> = matched.iter().map(|m| m.iter().filter_map(|&i| offerings.get(i)).map(|o| o.instance.name.as_str()).collect()).collect();
        // A conflict in any context keeps the overlay out of every one (Karpenter validates an
        // overlay over every NodePool before storing it for any).
        let price_conflict = || c.price.is_some().then(|| contexts.iter().zip(&matched).find_map(|(x, m)| m.iter().find(|i| x.reached.get(i) == Some(&c.weight)).map(|i| x.priced_by.get(i).cloned().unwrap_or_default()))).flatten();
        let capacity_conflict = || contexts.iter().zip(&types).find_map(|(x, ts)| ts.iter().find_map(|t| x.capacity.get(*t).and_then(|set| set.conflicts(&c))));
        if let Some(other) = price_conflict().or_else(capacity_conflict) {
            out.outcomes.insert(c.name, Outcome::Conflict(other));
            continue;
        }
        let mut priced: BTreeSet<usize> = BTreeSet::new();
        if let Some(change) = c.price {
            for (x, m) in contexts.iter_mut().zip(&matched) {
                for &i in m {
                    if x.reached.insert(i, c.weight).is_none() {
                        if let Some(p) = x.prices.get_mut(i) {
                            *p = change.apply(*p);
                        }
                        x.priced_by.insert(i, c.name.clone());
                        priced.insert(i);
                    }
                }
            }
        }
        let mut sized: BTreeSet<&str> = BTreeSet::new();
        if !c.capacity.is_empty() {
            for (x, ts) in contexts.iter_mut().zip(&types) {
                for t in ts {
                    x.capacity.entry(t.to_string()).or_default().set(&c);
                    sized.insert(t);
                }
            }
        }
        out.outcomes.insert(c.name, Outcome::Applied { offerings: priced.len(), types: sized.len() });
    }
    let mut contexts = contexts.into_iter();
    if let Some(shared) = contexts.next() {
        let mut sized = Sized::default();
        for (o, p) in out.offerings.iter_mut().zip(&shared.prices) {
            o.price = *p;
            o.instance = sized.instance(&o.instance, shared.capacity.get(&o.instance.name));
        }
        // A pool's own offering wherever its price or its type's capacity differs from the
        // shared one.
        for x in contexts {
            let pool: Option<Arc<str>> = x.pool.as_deref().map(Arc::from);
            let mut own = Sized::default();
            for (i, (p, base)) in x.prices.iter().zip(&shared.prices).enumerate() {
                let Some(o) = offerings.get(i) else { continue };
                let capacity = x.capacity.get(&o.instance.name);
                if p.to_bits() == base.to_bits() && capacity.map(|c| &c.merged) == shared.capacity.get(&o.instance.name).map(|c| &c.merged) {
                    continue;
                }
                if let Some(by) = x.priced_by.get(&i) {
                    out.priced_by.insert(out.offerings.len(), by.clone());
                }
                out.offerings.push(Offering { price: *p, pool: pool.clone(), instance: own.instance(&o.instance, capacity), ..o.clone() });
            }
        }
        out.priced_by.extend(shared.priced_by);
    }
    out
}

/// What overlays' `capacity` set of one instance type in one context (Karpenter's
/// `capacityUpdate`): every resource set so far, and the resources and weight of the last
/// overlay to set any (the only ones a later overlay can conflict with).
#[derive(Debug, Default)]
struct CapacitySet {
    merged: BTreeMap<String, i64>,
    last: Option<(i32, String, BTreeSet<String>)>,
}

impl CapacitySet {
    /// The overlay `c` conflicts with (by name): the last to set this type's capacity, at `c`'s
    /// weight, setting a resource `c` sets too.
    fn conflicts(&self, c: &Checked) -> Option<String> {
        let (weight, name, resources) = self.last.as_ref()?;
        (*weight == c.weight && c.capacity.keys().any(|k| resources.contains(k))).then(|| name.clone())
    }

    /// Add `c`'s capacity: resources an earlier (heavier) overlay set are kept.
    fn set(&mut self, c: &Checked) {
        for (k, v) in &c.capacity {
            self.merged.entry(k.clone()).or_insert(*v);
        }
        self.last = Some((c.weight, c.name.clone(), c.capacity.keys().cloned().collect()));
    }
}

/// Instance types with overlays' capacity assigned over their own, one copy per type.
#[derive(Default)]
struct Sized {
    made: HashMap<String, Arc<archer_core::instance::InstanceType>>,
}

impl Sized {
    fn instance(&mut self, t: &Arc<archer_core::instance::InstanceType>, capacity: Option<&CapacitySet>) -> Arc<archer_core::instance::InstanceType> {
        let Some(c) = capacity.filter(|c| !c.merged.is_empty()) else { return t.clone() };
        self.made
            .entry(t.name.clone())
            .or_insert_with(|| {
                let mut sized = (**t).clone();
                sized.extended.extend(c.merged.iter().map(|(k, v)| (k.clone(), *v)));
                Arc::new(sized)
            })
            .clone()
    }
}

/// The prices overlays decide in one place: the shared offerings, or one NodePool's.
struct Context {
    pool: Option<String>,
    labels: Vec<BTreeMap<String, String>>,
    prices: Vec<f64>,
    /// Per offering: the weight of the last overlay that reached it (Karpenter's lowestWeight).
    reached: HashMap<usize, i32>,
    priced_by: HashMap<usize, String>,
    /// Per instance type: what overlays' `capacity` set of it.
    capacity: HashMap<String, CapacitySet>,
}

impl Context {
    fn new(pool: Option<String>, labels: Vec<BTreeMap<String, String>>, offerings: &[Offering]) -> Context {
        Context { pool, labels, prices: offerings.iter().map(|o| o.price).collect(), reached: HashMap::new(), priced_by: HashMap::new(), capacity: HashMap::new() }
    }
}

#[cfg(test)]
mod tests;
