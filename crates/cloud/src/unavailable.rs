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
    /// Why, and for how long from when it was marked.
    cache: moka::sync::Cache<OfferingKey, (String, Duration)>,
    ttl: Duration,
}

/// Each entry lives as long as it was marked for (marked again: from then).
struct AsMarked;

impl moka::Expiry<OfferingKey, (String, Duration)> for AsMarked {
    fn expire_after_create(&self, _key: &OfferingKey, value: &(String, Duration), _at: std::time::Instant) -> Option<Duration> {
        Some(value.1)
    }

    fn expire_after_update(&self, _key: &OfferingKey, value: &(String, Duration), _at: std::time::Instant, _left: Option<Duration>) -> Option<Duration> {
        Some(value.1)
    }
}

impl Unavailable {
    /// Entries marked with [`Unavailable::mark`] expire `ttl` after; at most 100,000 are kept.
    pub fn new(ttl: Duration) -> Self {
        Unavailable { cache: moka::sync::Cache::builder().expire_after(AsMarked).max_capacity(100_000).build(), ttl }
    }

    /// Leave an offering out of plans for the default TTL.
    pub fn mark(&self, key: OfferingKey, why: &str) {
        self.mark_for(key, why, self.ttl);
    }

    /// Leave an offering out of plans for `ttl`.
    pub fn mark_for(&self, key: OfferingKey, why: &str, ttl: Duration) {
        tracing::warn!(instance_type = %key.0, zone = %key.1, capacity = key.2.as_str(), reason = why, ttl_seconds = ttl.as_secs(), "offering unavailable for a while");
        self.cache.insert(key, (why.to_string(), ttl));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_entry_lives_as_long_as_it_was_marked_for() {
        let u = Unavailable::new(Duration::from_secs(3600));
        let key = |t: &str| (t.to_string(), "z1".to_string(), CapacityType::Spot);
        u.mark_for(key("short"), "test", Duration::from_millis(50));
        u.mark(key("long"), "test");
        assert!(u.contains(&key("short")) && u.contains(&key("long")));
        std::thread::sleep(Duration::from_millis(120));
        assert!(!u.contains(&key("short")), "expired after its own TTL");
        assert!(u.contains(&key("long")), "the default TTL still runs");
    }
}
