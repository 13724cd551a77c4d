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
//! be. A key longer than [`MAX_KEY_BYTES`] (pods with very large constraints) is not kept. The
//! cache is quick_cache's: an evicted answer is freed at once (moka defers freeing removed
//! entries to an epoch collector, which held twice this budget again in `tests/cache_weight.rs`).

use std::collections::hash_map::RandomState;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quick_cache::sync::Cache;

use super::review::Answer;

/// Keys longer than this are not remembered: such pods are rare, and each would take much of
/// the budget.
pub const MAX_KEY_BYTES: usize = 4096;
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

    pub fn insert(&self, key: Vec<u8>, answer: Answer, outcome: &'static str) {
        if let Some(c) = &self.cache {
            c.insert(key, Arc::new(Remembered { answer, outcome, at: Instant::now() }));
        }
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
            + a.status.as_ref().map_or(0, |(_, reason, message)| reason.len() + message.len());
        u64::try_from(ENTRY_OVERHEAD + key.len() + strings).unwrap_or(u64::MAX)
    }
}

/// Writes the inputs of a decision into a key, each part length-prefixed so that no two
/// different inputs write the same bytes.
#[derive(Default)]
pub struct KeyWriter(Vec<u8>);

impl KeyWriter {
    pub fn part(&mut self, bytes: &[u8]) -> &mut Self {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        self.0.extend_from_slice(&len.to_le_bytes());
        self.0.extend_from_slice(bytes);
        self
    }

    /// An optional part: absent and empty are different inputs.
    pub fn optional(&mut self, bytes: Option<&[u8]>) -> &mut Self {
        match bytes {
            None => self.0.push(0),
            Some(b) => {
                self.0.push(1);
                self.part(b);
            }
        }
        self
    }

    /// How many parts a list that follows has.
    pub fn count(&mut self, n: usize) -> &mut Self {
        self.0.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
        self
    }

    /// The key, unless it grew past [`MAX_KEY_BYTES`].
    pub fn finish(self) -> Option<Vec<u8>> {
        (self.0.len() <= MAX_KEY_BYTES).then_some(self.0)
    }

    /// Bytes written so far.
    #[cfg(test)]
    fn written(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(patch: &str) -> Answer {
        Answer { patch: Some(patch.into()), ..Answer::allow("") }
    }

    #[test]
    fn parts_are_length_prefixed_so_different_splits_differ() {
        let mut a = KeyWriter::default();
        a.part(b"ab").part(b"c");
        let mut b = KeyWriter::default();
        b.part(b"a").part(b"bc");
        assert_ne!(a.finish(), b.finish());
        let mut absent = KeyWriter::default();
        absent.optional(None);
        let mut empty = KeyWriter::default();
        empty.optional(Some(b""));
        assert_ne!(absent.finish(), empty.finish());
    }

    #[test]
    fn keys_over_the_limit_are_not_kept() {
        let mut k = KeyWriter::default();
        k.part(&vec![b'x'; MAX_KEY_BYTES]);
        assert!(k.written() > MAX_KEY_BYTES);
        assert!(k.finish().is_none());
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
