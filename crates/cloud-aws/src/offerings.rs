//! What EC2 can launch here and at what price: the instance types EC2 offers in the region
//! (`DescribeInstanceTypes`) in the zones it offers them (`DescribeInstanceTypeOfferings`) that
//! the catalog knows, priced on demand by the AWS Price List Query API (refreshed every
//! `priceRefreshHours`; the catalog's prices for the region until its first answer), spot from
//! `DescribeSpotPriceHistory` (refreshed every `spotPriceRefreshSeconds`), else estimated from
//! the on-demand price. Offerings that answered "insufficient capacity" are left out until their
//! entry in a TTL cache expires.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use aws_sdk_ec2::types::LocationType;
use aws_sdk_ec2::Client;

use crate::resolve::kube_arch;
use crate::{api_error, sdk_error};
use archer_core::catalog::{CapacityType, Catalog, InstanceType};
use archer_core::packer::Offering;
use archer_cloud::prices::{LivePrices, PriceStatus};
use archer_cloud::CloudError;

pub use archer_cloud::unavailable::OfferingKey;

pub struct Book {
    catalog: Arc<Catalog>,
    region: String,
    /// On-demand prices from the Price List Query API.
    live: LivePrices,
    /// Types EC2 offers here that the catalog knows, with their zones.
    types: ArcSwap<Vec<(Arc<InstanceType>, Vec<String>)>>,
    /// Latest spot price by (type, zone).
    spot: ArcSwap<HashMap<(String, String), f64>>,
    /// Every offering at current prices.
    all: ArcSwap<Vec<Offering>>,
    unavailable: archer_cloud::unavailable::Unavailable,
}

impl Book {
    pub fn new(catalog: Arc<Catalog>, region: String, unavailable_ttl: Duration) -> Book {
        Book {
            catalog,
            region,
            live: LivePrices::new(crate::prices::API),
            types: ArcSwap::from_pointee(Vec::new()),
            spot: ArcSwap::from_pointee(HashMap::new()),
            all: ArcSwap::from_pointee(Vec::new()),
            unavailable: archer_cloud::unavailable::Unavailable::new(unavailable_ttl),
        }
    }

    /// Offerings that can be launched now (the unavailable ones left out).
    pub fn offerings(&self) -> Arc<Vec<Offering>> {
        self.unavailable.filter(self.all.load_full())
    }

    /// Every offering at current prices, the unavailable ones included.
    pub fn all(&self) -> Arc<Vec<Offering>> {
        self.all.load_full()
    }

    /// Leave an offering out of plans for the cache's TTL.
    pub(crate) fn mark_unavailable(&self, key: OfferingKey, why: &str) {
        self.unavailable.mark(key, why);
    }

    /// EC2's latest spot price of a type in a zone, if it gave one.
    pub fn spot_price(&self, instance_type: &str, zone: &str) -> Option<f64> {
        self.spot.load().get(&(instance_type.to_string(), zone.to_string())).copied()
    }

    /// Where the on-demand prices come from and how old they are.
    pub fn price_status(&self) -> PriceStatus {
        self.live.status()
    }

    /// Read the region's on-demand prices from the Price List Query API; the last ones (or the
    /// catalog's) stay when it fails. `true` when it answered.
    pub(crate) async fn refresh_on_demand(&self, pricing: &aws_sdk_pricing::Client) -> bool {
        let answered = self.live.refresh(&|| crate::prices::on_demand(pricing, &self.region)).await;
        if answered {
            self.rebuild();
        }
        answered
    }

    /// Keep the on-demand prices current, every `hours` (0: never), until dropped.
    pub(crate) async fn keep_on_demand_fresh(&self, pricing: &aws_sdk_pricing::Client, hours: u64) {
        self.live.keep_fresh(hours, || crate::prices::on_demand(pricing, &self.region), || self.rebuild()).await;
    }

    /// Where a type's on-demand price comes from: the Price List Query API, or the catalog.
    pub fn on_demand_source(&self, instance_type: &str) -> &'static str {
        match self.live.current() {
            Some(p) if p.on_demand.contains_key(instance_type) => crate::prices::API,
            _ => archer_cloud::prices::CATALOG,
        }
    }

    /// The type's on-demand list price here: the Price List Query API's once it answered (for
    /// the types it prices), else the catalog's for the region.
    fn list_price(&self, t: &InstanceType, live: Option<&archer_cloud::prices::RegionPrices>) -> Option<f64> {
        archer_cloud::prices::RegionPrices::list_price(live, t, &self.region)
    }

    pub fn is_unavailable(&self, key: &OfferingKey) -> bool {
        self.unavailable.contains(key)
    }

    /// Read the region's instance types and their zones again.
    pub(crate) async fn refresh_types(&self, ec2: &Client) -> Result<(), CloudError> {
        let mut zones: HashMap<String, BTreeSet<String>> = HashMap::new();
        let mut pages = ec2.describe_instance_type_offerings().location_type(LocationType::AvailabilityZone).into_paginator().send();
        while let Some(page) = pages.next().await {
            for o in page.map_err(|e| api_error(sdk_error(e)))?.instance_type_offerings() {
                if let (Some(t), Some(z)) = (o.instance_type(), o.location()) {
                    zones.entry(t.as_str().to_string()).or_default().insert(z.to_string());
                }
            }
        }
        let mut types = Vec::new();
        let (mut unknown, mut disagree) = (0, 0);
        let mut pages = ec2.describe_instance_types().into_paginator().send();
        while let Some(page) = pages.next().await {
            for it in page.map_err(|e| api_error(sdk_error(e)))?.instance_types() {
                let Some(name) = it.instance_type().map(|t| t.as_str().to_string()) else { continue };
                let Some(t) = self.catalog.get(&name) else {
                    unknown += 1;
                    continue;
                };
                // EC2 is the authority on what the type is: a catalog row that disagrees is skipped.
                let archs: Vec<&str> = it.processor_info().map(|p| p.supported_architectures().iter().filter_map(|a| kube_arch(a.as_str())).collect()).unwrap_or_default();
                let vcpus = it.v_cpu_info().and_then(|v| v.default_v_cpus());
                if !archs.contains(&t.arch.as_str()) || vcpus.is_some_and(|v| v as u32 != t.vcpu) {
                    disagree += 1;
                    continue;
                }
                let z: Vec<String> = zones.get(&name).map(|z| z.iter().cloned().collect()).unwrap_or_default();
                if !z.is_empty() {
                    types.push((t.clone(), z));
                }
            }
        }
        self.types.store(Arc::new(types));
        self.rebuild();
        let priced = self.types.load().iter().filter(|(t, _)| self.list_price(t, self.live.current().as_deref()).is_some()).count();
        let status = self.live.status();
        if priced == 0 {
            let why = match (status.source, &status.last_error) {
                (archer_cloud::prices::CATALOG, Some(e)) => format!("the Price List Query API did not answer ({e}) and the catalog has no {} prices", self.region),
                (archer_cloud::prices::CATALOG, None) => format!("live prices are off (priceRefreshHours 0) and the catalog has no {} prices", self.region),
                _ => "the Price List Query API priced none of them".to_string(),
            };
            return Err(api_error(format!("EC2 offers no instance type with a price in {}: {why}", self.region)));
        }
        tracing::info!(types = self.types.load().len(), priced, unknown, disagree, region = %self.region, prices = status.source, "EC2 instance types read");
        Ok(())
    }

    /// Read the current spot prices (Linux) and rebuild the offerings.
    pub(crate) async fn refresh_spot(&self, ec2: &Client) -> Result<(), CloudError> {
        let names: Vec<String> = self.types.load().iter().map(|(t, _)| t.name.clone()).collect();
        let mut spot: HashMap<(String, String), (String, f64)> = HashMap::new();
        // EC2 takes at most a few hundred types a request; ask in chunks.
        for chunk in names.chunks(100) {
            let mut pages = ec2
                .describe_spot_price_history()
                .start_time(aws_sdk_ec2::primitives::DateTime::from(std::time::SystemTime::now()))
                .product_descriptions("Linux/UNIX")
                .product_descriptions("Linux/UNIX (Amazon VPC)")
                .set_instance_types(Some(chunk.iter().map(|n| aws_sdk_ec2::types::InstanceType::from(n.as_str())).collect()))
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                for h in page.map_err(|e| api_error(sdk_error(e)))?.spot_price_history() {
                    let (Some(t), Some(z), Some(p)) = (h.instance_type(), h.availability_zone(), h.spot_price().and_then(|p| p.parse::<f64>().ok())) else { continue };
                    if !(p.is_finite() && p > 0.0) {
                        continue;
                    }
                    let when = h.timestamp().map(|t| t.to_string()).unwrap_or_default();
                    let e = spot.entry((t.as_str().to_string(), z.to_string())).or_insert((when.clone(), p));
                    if when > e.0 {
                        *e = (when, p);
                    }
                }
            }
        }
        tracing::info!(prices = spot.len(), "spot prices read");
        self.spot.store(Arc::new(spot.into_iter().map(|(k, (_, p))| (k, p)).collect()));
        self.rebuild();
        Ok(())
    }

    fn rebuild(&self) {
        let spot = self.spot.load();
        let live = self.live.current();
        let mut out = Vec::new();
        for (t, zones) in self.types.load().iter() {
            let Some(list) = self.list_price(t, live.as_deref()) else { continue };
            let on_demand = self.catalog.price_from(t, list, CapacityType::OnDemand);
            let estimate = self.catalog.price_from(t, list, CapacityType::Spot);
            for z in zones {
                out.push(Offering { instance: t.clone(), zone: z.clone(), capacity: CapacityType::OnDemand, price: on_demand, pool: None });
                let p = spot.get(&(t.name.clone(), z.clone())).copied().unwrap_or(estimate);
                out.push(Offering { instance: t.clone(), zone: z.clone(), capacity: CapacityType::Spot, price: p, pool: None });
            }
        }
        self.all.store(Arc::new(out));
    }
}

/// The instance types a launch offers EC2 for a claim, cheapest first: the planned type, then
/// every other type of the same architecture and OS, offered in the claim's zone and capacity
/// type, with at least the planned type's allocatable cpu, memory, pods and GPUs (so every pod
/// that fits the plan fits), allowed by the claim's requirements, within `margin` (a fraction) of
/// the planned price. A requirement's `minValues` on the instance type widens the list past the
/// margin until it has that many types.
pub(crate) fn alternatives(offerings: &[Offering], planned: &Offering, allowed: &dyn Fn(&Offering) -> bool, margin: f64, min_values: usize) -> Vec<String> {
    let p = &planned.instance;
    let mut fits: Vec<&Offering> = offerings
        .iter()
        .filter(|o| o.zone == planned.zone && o.capacity == planned.capacity && o.instance.name != p.name)
        .filter(|o| o.instance.arch == p.arch && o.instance.os == p.os && o.instance.gpu_count >= p.gpu_count)
        .filter(|o| {
            let (a, b) = (&o.instance.allocatable, &p.allocatable);
            a.cpu_millis >= b.cpu_millis && a.memory_bytes >= b.memory_bytes && a.pods >= b.pods
        })
        .filter(|o| allowed(o))
        .collect();
    fits.sort_by(|a, b| a.price.total_cmp(&b.price).then_with(|| a.instance.name.cmp(&b.instance.name)));
    let ceiling = planned.price * (1.0 + margin);
    let mut out = vec![p.name.clone()];
    for o in fits {
        if o.price <= ceiling || out.len() < min_values {
            out.push(o.instance.name.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offering(c: &Catalog, name: &str, price: f64) -> Offering {
        Offering { instance: c.get(name).expect("type").clone(), zone: "us-east-1a".into(), capacity: CapacityType::OnDemand, price, pool: None }
    }

    #[test]
    fn alternatives_fit_the_planned_node_within_the_margin() {
        let c = Catalog::embedded().expect("catalog");
        let planned = offering(&c, "m6g.large", 0.077);
        let all = vec![
            planned.clone(),
            offering(&c, "m7g.large", 0.0816),  // same shape, 6% dearer: in
            offering(&c, "m6g.xlarge", 0.154),  // bigger but 100% dearer: out
            offering(&c, "c6g.large", 0.068),   // cheaper but half the memory: out
            offering(&c, "m6i.large", 0.096),   // amd64: out
            offering(&c, "r6g.large", 0.1008),  // more memory, 31% dearer: out at 20%
        ];
        let any = |_: &Offering| true;
        assert_eq!(alternatives(&all, &planned, &any, 0.2, 0), ["m6g.large", "m7g.large"]);
        assert_eq!(alternatives(&all, &planned, &any, 0.4, 0), ["m6g.large", "m7g.large", "r6g.large"]);
        // minValues 3 widens the list past the margin, cheapest next.
        assert_eq!(alternatives(&all, &planned, &any, 0.2, 3), ["m6g.large", "m7g.large", "r6g.large"]);
        // The claim's requirements still hold.
        let no_m7 = |o: &Offering| !o.instance.name.starts_with("m7g");
        assert_eq!(alternatives(&all, &planned, &no_m7, 0.4, 0), ["m6g.large", "r6g.large"]);
    }
}
