//! Offerings that answered "no capacity" (or "no quota"), left out of plans for a while: the next
//! batch then plans the next cheapest offering instead of asking for the same one again. Every
//! provider keeps one.

use std::sync::Arc;
use std::time::Duration;

use archer_core::catalog::CapacityType;
use archer_core::packer::Offering;

/// Key of an offering: instance type, zone, capacity type.
pub type OfferingKey = (String, String, CapacityType);

pub struct Unavailable {
    cache: moka::sync::Cache<OfferingKey, String>,
}

impl Unavailable {
    /// Entries expire `ttl` after they were marked; at most 100,000 are kept.
    pub fn new(ttl: Duration) -> Self {
        Unavailable { cache: moka::sync::Cache::builder().time_to_live(ttl).max_capacity(100_000).build() }
    }

    /// Leave an offering out of plans for the TTL.
    pub fn mark(&self, key: OfferingKey, why: &str) {
        tracing::warn!(instance_type = %key.0, zone = %key.1, capacity = key.2.as_str(), reason = why, "offering unavailable for a while");
        self.cache.insert(key, why.to_string());
    }

    pub fn contains(&self, key: &OfferingKey) -> bool {
        self.cache.contains_key(key)
    }

    /// `all` without the offerings marked unavailable (`all` itself when none is).
    pub fn filter(&self, all: Arc<Vec<Offering>>) -> Arc<Vec<Offering>> {
        if self.cache.iter().next().is_none() {
            return all;
        }
        Arc::new(all.iter().filter(|o| !self.cache.contains_key(&(o.instance.name.clone(), o.zone.clone(), o.capacity))).cloned().collect())
    }
}
