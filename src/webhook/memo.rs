//! Decisions remembered for a short while, so the replicas of one workload are decided once.
//!
//! The pods of a ReplicaSet, StatefulSet or Job reach the webhook identical in everything the
//! decision reads: namespace and policy, Archer's own labels and annotations, the scheduling
//! constraints, the service account and pull secrets, and the images in order. The first one is
//! decided in full (view, typed decode, image inspection, decision, patch); the answer is kept,
//! keyed by exactly those inputs, and the next ones with the same inputs get it with their own
//! uid. Only answers built from successful inspections and without policy warnings are kept: a
//! failure says nothing lasting about the image, and a warning names annotation values the key
//! does not hold.
//!
//! Bounded in bytes and in time: entries are weighed (the key and the answer counted) against
//! `decisionCacheMaxBytes`, and an entry older than the TTL is never reused. The TTL is at most
//! the tag cache's, so a reused decision is never older than the platforms it came from could
//! be. A key longer than [`MAX_KEY_BYTES`](super::key::MAX_KEY_BYTES) (pods with very large constraints) is not kept. The
//! cache is quick_cache's: an evicted answer is freed at once (moka defers freeing removed
//! entries to an epoch collector, which held twice this budget again in `tests/cache_weight.rs`).

use std::collections::hash_map::RandomState;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quick_cache::sync::Cache;

pub use super::key::MAX_KEY_BYTES;

use super::review::{Answer, Wire};

/// What one entry holds besides its key and answer strings: the cache's slot, the `Arc`, the
/// answer's own struct and its maps' nodes (over-counted).
const ENTRY_OVERHEAD: usize = 768;
/// The cache's structure besides its entries (shards, their tables and ghost lists).
pub const STRUCTURE_BYTES: u64 = 256 * 1024;
/// A typical entry's weight, for sizing the cache's tables.
const TYPICAL_ENTRY: u64 = 2048;

/// An answer kept for reuse, with the outcome it was counted under.
#[derive(Debug)]
pub struct Remembered {
    pub answer: Answer,
    /// The answer's JSON, written once ([`Answer::wire`]): each review that reuses it gets it
    /// with its own uid.
    pub wire: Wire,
    pub outcome: &'static str,
    at: Instant,
}

type Entries = Cache<Vec<u8>, Arc<Remembered>, Weigh, RandomState>;

#[derive(Clone)]
pub struct DecisionMemo {
    cache: Option<Arc<Entries>>,
    ttl: Duration,
}

impl DecisionMemo {
    /// A memo of at most `max_bytes`, entries kept `ttl`; either zero turns it off.
    pub fn new(max_bytes: u64, ttl: Duration) -> Self {
        if max_bytes == 0 || ttl.is_zero() {
            return Self::off();
        }
        let items = usize::try_from(max_bytes / TYPICAL_ENTRY).unwrap_or(usize::MAX).max(16);
        let cache = Cache::with(items, max_bytes, Weigh, RandomState::new(), Default::default());
        Self { cache: Some(Arc::new(cache)), ttl }
    }

    pub fn off() -> Self {
        Self { cache: None, ttl: Duration::ZERO }
    }

    /// Whether answers are kept at all (a key is only worth building then).
    pub fn enabled(&self) -> bool {
        self.cache.is_some()
    }

    /// The answer kept under `key`, unless it is older than the TTL.
    pub fn get(&self, key: &[u8]) -> Option<Arc<Remembered>> {
        self.cache.as_ref()?.get(key).filter(|r| r.at.elapsed() < self.ttl)
    }

    /// Keep `answer` (written once, [`Answer::wire`]) under `key`; what is kept, which also
    /// answers the review it was decided for.
    pub fn insert(&self, key: Vec<u8>, answer: Answer, outcome: &'static str) -> Arc<Remembered> {
        let kept = Arc::new(Remembered { wire: answer.wire(), answer, outcome, at: Instant::now() });
        if let Some(c) = &self.cache {
            c.insert(key, Arc::clone(&kept));
        }
        kept
    }

    /// Answers held now.
    pub fn entries(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.len())
    }

    /// Bytes held by the memo's own weighing.
    pub fn weighted_bytes(&self) -> u64 {
        self.cache.as_ref().map_or(0, |c| c.weight())
    }
}

#[derive(Clone)]
struct Weigh;

impl quick_cache::Weighter<Vec<u8>, Arc<Remembered>> for Weigh {
    fn weight(&self, key: &Vec<u8>, r: &Arc<Remembered>) -> u64 {
        let a = &r.answer;
        let strings = a.patch.as_ref().map_or(0, String::len)
            + a.warnings.iter().map(String::len).sum::<usize>()
            + a.audit_annotations.iter().map(|(k, v)| k.len() + v.len() + 64).sum::<usize>()
            + a.status.as_ref().map_or(0, |(_, reason, message)| reason.len() + message.len())
            + r.wire.bytes();
        u64::try_from(ENTRY_OVERHEAD + key.len() + strings).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(patch: &str) -> Answer {
        Answer { patch: Some(patch.into()), ..Answer::allow("") }
    }

    #[test]
    fn remembers_within_its_byte_budget_and_forgets_after_its_ttl() {
        let memo = DecisionMemo::new(64 * 1024, Duration::from_millis(200));
        memo.insert(b"k".to_vec(), answer("cGF0Y2g="), "enforced");
        let got = memo.get(b"k").expect("remembered");
        assert_eq!((got.answer.patch.as_deref(), got.outcome), (Some("cGF0Y2g="), "enforced"));
        assert!(memo.get(b"other").is_none());
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(memo.entries(), 1, "still held, not evicted");
        assert!(memo.get(b"k").is_none(), "but never reused past its TTL");

        // Far more than the budget holds: the weights stay within it.
        let memo = DecisionMemo::new(64 * 1024, Duration::from_secs(60));
        for i in 0..1000u32 {
            memo.insert(i.to_le_bytes().to_vec(), answer(&"p".repeat(1000)), "enforced");
        }
        assert!(memo.weighted_bytes() <= 64 * 1024, "{}", memo.weighted_bytes());
        assert!(memo.entries() < 64, "{}", memo.entries());
    }

    #[test]
    fn zero_bytes_or_ttl_turn_it_off() {
        for memo in [DecisionMemo::new(0, Duration::from_secs(10)), DecisionMemo::new(1 << 20, Duration::ZERO), DecisionMemo::off()] {
            assert!(!memo.enabled());
            memo.insert(b"k".to_vec(), answer("x"), "enforced");
            assert!(memo.get(b"k").is_none());
        }
        assert!(DecisionMemo::new(1 << 20, Duration::from_secs(10)).enabled());
    }
}
