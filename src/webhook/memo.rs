//! Decisions remembered for a short while, so the replicas of one workload are decided once.
//!
//! The pods of a ReplicaSet, StatefulSet or Job reach the webhook identical in everything the
//! decision reads: namespace and policy, Archer's own labels and annotations, the scheduling
//! constraints, the service account and pull secrets, and the images in order. The first two
//! are decided in full (view, typed decode, image inspection, decision, patch): the first only
//! marks its inputs as seen ([`DecisionMemo::seen_before`]), so a pod whose inputs no other pod
//! shares costs the memo nothing; the second's answer is kept, keyed by exactly those inputs, and
//! the next ones with the same inputs get it with their own uid. Only answers built from successful inspections and without policy warnings are kept: a
//! failure says nothing lasting about the image, and a warning names annotation values the key
//! does not hold.
//!
//! Bounded in bytes and in time: entries are weighed (the key and the answer counted) against
//! `decisionCacheMaxBytes`, and an entry older than the TTL is never reused. Every namespace has
//! a share of those bytes (`decisionCacheMaxBytesPerNamespace`, a quarter by default): a
//! namespace at its share makes room among its own answers (expired ones first, then its oldest,
//! until it holds half its share), counted in `archer_admission_memo_displaced_total`. So no
//! namespace holds more than its share, and one tenant's stream of distinct pods cannot fill the
//! memo; the cache's own eviction, once it (or one of its shards) is full, is still shared by
//! every namespace's answers. The TTL is at most
//! the tag cache's, so a reused decision is never older than the platforms it came from could
//! be. A key longer than [`MAX_KEY_BYTES`](super::key::MAX_KEY_BYTES) (pods with very large constraints) is not kept. The
//! cache is quick_cache's: an evicted answer is freed at once (moka defers freeing removed
//! entries to an epoch collector, which held twice this budget again in `tests/cache_weight.rs`).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use quick_cache::sync::Cache;
use quick_cache::{Lifecycle, Weighter};

pub use super::key::MAX_KEY_BYTES;

use super::review::{Answer, Wire};

/// What one entry holds besides its key and answer strings: the cache's slot, the `Arc`, the
/// answer's own struct and its maps' nodes (over-counted).
const ENTRY_OVERHEAD: usize = 768;
/// A namespace's slot in the per-namespace accounting besides its name: the boxed name's
/// allocation and the map's bucket (at its load factor), over-counted.
const NAMESPACE_SLOT: usize = 96;
/// Slots of the seen-once filter ([`DecisionMemo::seen_before`]): one key's hash each.
const SEEN_SLOTS: usize = 4096;
/// The cache's structure besides its entries (shards, their tables and ghost lists), and the
/// seen-once filter's slots.
pub const STRUCTURE_BYTES: u64 = 256 * 1024 + (SEEN_SLOTS * std::mem::size_of::<u64>()) as u64;
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

type Entries = Cache<Vec<u8>, Arc<Remembered>, Weigh, RandomState, Evictions>;

#[derive(Clone)]
pub struct DecisionMemo {
    cache: Option<Arc<Entries>>,
    ttl: Duration,
    /// Bytes each namespace's answers hold now (the memo's own weighing).
    held: Arc<Mutex<HashMap<Box<[u8]>, u64>>>,
    /// A namespace's share of the bytes.
    per_namespace: u64,
    /// Answers a namespace's newer ones displaced at its share.
    displaced: Counter,
    /// The heaviest answer the cache admits (its shards' hot target) and the share allows.
    heaviest: u64,
    /// One namespace makes room at a time; the others waiting see whether they still need to.
    making_room: Arc<Mutex<()>>,
    /// The keys decided once, by hash: an answer is kept the second time its inputs are decided.
    seen: Arc<[AtomicU64]>,
    hasher: RandomState,
}

impl DecisionMemo {
    /// A memo of at most `max_bytes`, at most `per_namespace` of them (or all, if more) any one
    /// namespace's, entries kept `ttl`; a zero bound or TTL turns it off. Answers displaced at a
    /// namespace's share are counted in `displaced`.
    pub fn new(max_bytes: u64, per_namespace: u64, ttl: Duration, displaced: Counter) -> Self {
        if max_bytes == 0 || per_namespace == 0 || ttl.is_zero() {
            return Self::off();
        }
        let items = usize::try_from(max_bytes / TYPICAL_ENTRY).unwrap_or(usize::MAX).max(16);
        let cache = Cache::with(items, max_bytes, Weigh, RandomState::new(), Evictions);
        let per_namespace = per_namespace.min(max_bytes);
        // quick_cache refuses an item heavier than a shard's hot target (97% of the shard).
        let heaviest = (cache.shard_capacity() / 100 * 97).min(per_namespace);
        let seen = (0..SEEN_SLOTS).map(|_| AtomicU64::new(0)).collect();
        Self { cache: Some(Arc::new(cache)), ttl, held: Default::default(), per_namespace, displaced, heaviest, making_room: Default::default(), seen, hasher: RandomState::new() }
    }

    pub fn off() -> Self {
        Self {
            cache: None,
            ttl: Duration::ZERO,
            held: Default::default(),
            per_namespace: 0,
            displaced: Counter::default(),
            heaviest: 0,
            making_room: Default::default(),
            seen: Arc::new([]),
            hasher: RandomState::new(),
        }
    }

    /// Whether a decision under `key` was made before (and its answer is worth keeping): the
    /// first decision of a workload's pods only marks its key, the second keeps its answer for
    /// the replicas after it. A pod whose inputs are its own (a one-off pod, a stream of
    /// distinct ones) so costs no entry, no weighing and no room made for it (issue #45: keeping
    /// such answers was an eighth of what deciding a new pod cost), and cannot push a
    /// workload's answers out. The filter is a fixed table of hashes: a key another overwrote
    /// before its second decision costs that workload one more decision, never a wrong answer
    /// (the answer is always the memo's, under the full key).
    pub fn seen_before(&self, key: &[u8]) -> bool {
        self.seen_slot(key).is_some_and(|(slot, hash)| self.seen.get(slot).is_some_and(|s| s.swap(hash, Ordering::Relaxed) == hash))
    }

    /// The filter's slot for `key` and the hash it holds there (never 0, an empty slot's value);
    /// `None` when the memo is off.
    fn seen_slot(&self, key: &[u8]) -> Option<(usize, u64)> {
        if self.seen.is_empty() {
            return None;
        }
        let hash = self.hasher.hash_one(key) | 1;
        Some((usize::try_from(hash >> 32).unwrap_or(0) % self.seen.len(), hash))
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
        let Some(c) = &self.cache else { return kept };
        let weight = Weigh.weight(&key, &kept);
        if weight > self.heaviest {
            return kept;
        }
        let namespace = namespace_of(&key);
        let over = {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            let mine = match held.get_mut(namespace) {
                Some(mine) => mine,
                None => held.entry(namespace.into()).or_insert(0),
            };
            *mine += weight;
            *mine > self.per_namespace
        };
        if over {
            let _one = self.making_room.lock().unwrap_or_else(|e| e.into_inner());
            if self.held_by(namespace) > self.per_namespace {
                self.make_room(c, namespace, &key);
            }
        }
        // Every insert goes through `insert_with_lifecycle` with an `Evicted` of its own: the
        // plain `insert` would drop what the cache lets go of unaccounted.
        let mut evicted = Evicted::default();
        c.insert_with_lifecycle(key, Arc::clone(&kept), &mut evicted);
        // Answers the cache let go of (evicted, replaced, or this one refused), released outside
        // its lock.
        for (k, r) in evicted.0 {
            self.release(namespace_of(&k), Weigh.weight(&k, &r));
        }
        kept
    }

    /// `namespace` is past its share with an answer under `adding` on its way in: its expired
    /// answers go, then its oldest, until it holds at most half its share with the new one.
    fn make_room(&self, c: &Entries, namespace: &[u8], adding: &[u8]) {
        let mut ages: Vec<(Instant, u64)> = Vec::new();
        for (k, r) in c.iter() {
            if namespace_of(&k) == namespace && k != adding {
                ages.push((r.at, Weigh.weight(&k, &r)));
            }
        }
        ages.sort_by_key(|(at, _)| *at);
        let mut held = self.held_by(namespace);
        let target = self.per_namespace / 2;
        let mut cutoff = None;
        for (at, w) in &ages {
            if held <= target && at.elapsed() < self.ttl {
                break;
            }
            held = held.saturating_sub(*w);
            cutoff = Some(*at);
        }
        let Some(cutoff) = cutoff else { return };
        let freed = std::cell::Cell::new((0u64, 0u64));
        c.retain(|k, r| {
            let goes = r.at <= cutoff && namespace_of(k) == namespace && k.as_slice() != adding;
            if goes {
                let (n, bytes) = freed.get();
                freed.set((n + 1, bytes + Weigh.weight(k, r)));
            }
            !goes
        });
        let (n, bytes) = freed.get();
        self.displaced.inc_by(n);
        self.release(namespace, bytes);
    }

    fn held_by(&self, namespace: &[u8]) -> u64 {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).get(namespace).copied().unwrap_or(0)
    }

    fn release(&self, namespace: &[u8], bytes: u64) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mine) = held.get_mut(namespace) {
            *mine = mine.saturating_sub(bytes);
            if *mine == 0 {
                held.remove(namespace);
            }
        }
    }

    /// Bytes the answers of `namespace` hold now.
    #[cfg(test)]
    fn namespace_bytes(&self, namespace: &str) -> u64 {
        self.held_by(&namespace_of_name(namespace))
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

/// The namespace a key is for: its first part ([`super::key`]; the review writes the namespace
/// first), length prefix included.
fn namespace_of(key: &[u8]) -> &[u8] {
    let len = key.get(..4).and_then(|b| <[u8; 4]>::try_from(b).ok()).map_or(0, |b| u32::from_le_bytes(b) as usize);
    len.checked_add(4).and_then(|end| key.get(..end)).unwrap_or(key)
}

/// How `namespace` begins a key.
#[cfg(test)]
fn namespace_of_name(namespace: &str) -> Vec<u8> {
    let mut k = super::key::KeyWriter::default();
    k.part(namespace.as_bytes());
    k.finish().unwrap_or_default()
}

/// What the cache let go of during one insert.
#[derive(Default)]
struct Evicted(Vec<(Vec<u8>, Arc<Remembered>)>);

/// Hands what the cache lets go of to the insert that caused it ([`DecisionMemo::insert`]).
#[derive(Clone)]
struct Evictions;

impl Lifecycle<Vec<u8>, Arc<Remembered>> for Evictions {
    type RequestState = Evicted;

    fn on_evict(&self, state: &mut Evicted, key: Vec<u8>, val: Arc<Remembered>) {
        state.0.push((key, val));
    }
}

#[derive(Clone)]
struct Weigh;

impl Weighter<Vec<u8>, Arc<Remembered>> for Weigh {
    fn weight(&self, key: &Vec<u8>, r: &Arc<Remembered>) -> u64 {
        let a = &r.answer;
        let strings = a.patch.as_ref().map_or(0, String::len)
            + a.warnings.iter().map(String::len).sum::<usize>()
            + a.audit_annotations.iter().map(|(k, v)| k.len() + v.len() + 64).sum::<usize>()
            + a.status.as_ref().map_or(0, |(_, reason, message)| reason.len() + message.len())
            + r.wire.bytes();
        // The namespace's slot in the memo's per-namespace accounting, counted with each of its
        // answers (at most one slot per answer held).
        let accounting = NAMESPACE_SLOT + namespace_of(key).len();
        u64::try_from(ENTRY_OVERHEAD + accounting + key.len() + strings).unwrap_or(u64::MAX)
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
        let memo = DecisionMemo::new(64 * 1024, 64 * 1024, Duration::from_millis(200), Counter::default());
        memo.insert(b"k".to_vec(), answer("cGF0Y2g="), "enforced");
        let got = memo.get(b"k").expect("remembered");
        assert_eq!((got.answer.patch.as_deref(), got.outcome), (Some("cGF0Y2g="), "enforced"));
        assert!(memo.get(b"other").is_none());
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(memo.entries(), 1, "still held, not evicted");
        assert!(memo.get(b"k").is_none(), "but never reused past its TTL");

        // Far more than the budget holds: the weights stay within it.
        let memo = DecisionMemo::new(64 * 1024, 64 * 1024, Duration::from_secs(60), Counter::default());
        for i in 0..1000u32 {
            memo.insert(i.to_le_bytes().to_vec(), answer(&"p".repeat(1000)), "enforced");
        }
        assert!(memo.weighted_bytes() <= 64 * 1024, "{}", memo.weighted_bytes());
        assert!(memo.entries() < 64, "{}", memo.entries());
    }

    #[test]
    fn an_answer_is_worth_keeping_the_second_time_its_inputs_are_decided() {
        let memo = DecisionMemo::new(1 << 20, 1 << 18, Duration::from_secs(60), Counter::default());
        assert!(!memo.seen_before(b"web"), "a workload's first pod only marks its key");
        assert!(memo.seen_before(b"web"), "its second is kept for the replicas after it");
        // A stream of one-off pods marks keys and keeps nothing.
        let one_offs = (0..10_000u32).filter(|i| memo.seen_before(&i.to_le_bytes())).count();
        assert_eq!(one_offs, 0);
        // 64 workloads, each in a slot of its own, decided in turn: every second pod is kept.
        let slot = |k: &[u8]| memo.seen_slot(k).map(|(slot, _)| slot);
        let mut taken = std::collections::BTreeSet::new();
        let workloads: Vec<[u8; 4]> = (1_000_000..2_000_000u32).map(u32::to_le_bytes).filter(|w| slot(w).is_some_and(|s| taken.insert(s))).take(64).collect();
        for w in &workloads {
            assert!(!memo.seen_before(w));
        }
        let kept = workloads.iter().filter(|w| memo.seen_before(&w[..])).count();
        assert_eq!(kept, 64, "{kept} of 64 workloads' second pods are kept");
        // Two sharing a slot, decided in turn: each overwrites the other's mark, so each is
        // only decided again, never given the other's answer.
        let first = 3_000_000u32.to_le_bytes();
        let twin = (3_000_001..4_000_000u32).map(u32::to_le_bytes).find(|k| slot(k) == slot(&first)).expect("a key in the same slot");
        for _ in 0..3 {
            assert!(!memo.seen_before(&first) && !memo.seen_before(&twin));
        }
        assert!(!DecisionMemo::off().seen_before(b"web") && !DecisionMemo::off().seen_before(b"web"), "an off memo keeps nothing");
    }

    #[test]
    fn zero_bytes_or_ttl_turn_it_off() {
        for memo in [DecisionMemo::new(0, 1 << 20, Duration::from_secs(10), Counter::default()), DecisionMemo::new(1 << 20, 0, Duration::from_secs(10), Counter::default()), DecisionMemo::new(1 << 20, 1 << 20, Duration::ZERO, Counter::default()), DecisionMemo::off()] {
            assert!(!memo.enabled());
            memo.insert(b"k".to_vec(), answer("x"), "enforced");
            assert!(memo.get(b"k").is_none());
        }
        assert!(DecisionMemo::new(1 << 20, 1 << 18, Duration::from_secs(10), Counter::default()).enabled());
    }

    /// A key for `namespace`, as the review writes one (the namespace first).
    fn key(namespace: &str, i: u32) -> Vec<u8> {
        let mut k = super::super::key::KeyWriter::default();
        k.part(namespace.as_bytes()).part(&i.to_le_bytes());
        k.finish().expect("a short key")
    }

    #[test]
    fn a_namespace_past_its_share_displaces_its_own_answers_never_another_namespaces() {
        let displaced = Counter::default();
        let share = 16 * 1024;
        let memo = DecisionMemo::new(256 * 1024, share, Duration::from_secs(60), displaced.clone());
        for i in 0..8 {
            memo.insert(key("quiet", i), answer("cXVpZXQ="), "enforced");
        }
        let quiet = memo.namespace_bytes("quiet");
        assert!(quiet > 0 && quiet <= share, "{quiet}");
        // Another namespace's stream of distinct pods, many times the whole memo.
        for i in 0..2000 {
            memo.insert(key("noisy", i), answer(&"n".repeat(600)), "enforced");
            assert!(memo.namespace_bytes("noisy") <= share, "at {i}: {}", memo.namespace_bytes("noisy"));
        }
        for i in 0..8 {
            assert!(memo.get(&key("quiet", i)).is_some(), "quiet's answer {i} is still kept");
        }
        assert_eq!(memo.namespace_bytes("quiet"), quiet);
        // The noisy namespace keeps its newest answers, and what it let go of is counted.
        assert!(memo.get(&key("noisy", 1999)).is_some());
        assert!(memo.get(&key("noisy", 0)).is_none());
        assert!(displaced.get() > 1000, "{}", displaced.get());
        // The accounting matches what the cache holds.
        let held: u64 = memo.cache.as_ref().map_or(0, |c| c.iter().map(|(k, r)| Weigh.weight(&k, &r)).sum());
        assert_eq!(held, memo.namespace_bytes("quiet") + memo.namespace_bytes("noisy"));
        assert_eq!(held, memo.weighted_bytes());
    }

    #[test]
    fn expired_answers_go_first_when_a_namespace_needs_room() {
        let memo = DecisionMemo::new(1 << 20, 16 * 1024, Duration::from_millis(100), Counter::default());
        let weight = |i| Weigh.weight(&key("ns", i), &Arc::new(Remembered { wire: answer("eA==").wire(), answer: answer("eA=="), outcome: "enforced", at: Instant::now() }));
        let fits = (16 * 1024 / weight(0)) as u32;
        for i in 0..fits {
            memo.insert(key("ns", i), answer("eA=="), "enforced");
        }
        std::thread::sleep(Duration::from_millis(150));
        // One fresh answer past the share: every expired one goes, the fresh ones stay.
        memo.insert(key("ns", 1000), answer("eA=="), "enforced");
        memo.insert(key("ns", 1001), answer("eA=="), "enforced");
        assert_eq!(memo.entries(), 2);
        assert!(memo.get(&key("ns", 1000)).is_some() && memo.get(&key("ns", 1001)).is_some());
        assert_eq!(memo.namespace_bytes("ns"), 2 * weight(1000));
    }

    #[test]
    fn the_accounting_follows_evictions_and_replacements_by_the_cache_itself() {
        // A memo smaller than the share: the cache's own bound evicts, and the counts follow.
        let memo = DecisionMemo::new(32 * 1024, 1 << 20, Duration::from_secs(60), Counter::default());
        for i in 0..500 {
            memo.insert(key(if i % 2 == 0 { "a" } else { "b" }, i), answer(&"p".repeat(300)), "enforced");
        }
        // The same key again replaces its answer.
        memo.insert(key("a", 0), answer("c2hvcnQ="), "enforced");
        memo.insert(key("a", 0), answer("c2hvcnQ="), "enforced");
        let held: u64 = memo.cache.as_ref().map_or(0, |c| c.iter().map(|(k, r)| Weigh.weight(&k, &r)).sum());
        assert_eq!(held, memo.namespace_bytes("a") + memo.namespace_bytes("b"));
        assert!(held <= 32 * 1024);
        // An answer too heavy for the whole memo is refused, and not counted.
        memo.insert(key("c", 0), answer(&"p".repeat(64 * 1024)), "enforced");
        assert_eq!(memo.namespace_bytes("c"), 0);
    }
}
