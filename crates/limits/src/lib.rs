//! Limits that hold together under concurrency: one memory budget, in bytes, that request bodies,
//! extender node lists and registry reads all draw from. No HTTP server here: the registry
//! client draws from the budget too, and reaches no web framework through it (the server's
//! bounded body reading is `archer::server::body`).
//!
//! Every consumer reserves what it will hold (its bytes times an expansion factor for what it
//! builds from them) before it holds it, and gives it back when the request or lookup ends. When
//! the budget is spent a consumer waits a bounded time, then is refused with a clear answer.
//!
//! Reservations wait in arrival order, and a waiting reservation holds none of the budget: it
//! takes all it asked for at once, when that fits and no earlier one still waits. A consumer
//! that already holds part of the budget and needs more for the same work
//! ([`MemoryBudget::reserve_more`]) does not queue behind new arrivals: it takes the room as
//! soon as there is enough. So work part way done always finishes, and gives its room back,
//! rather than waiting for room that only its own end would free.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use archer_metrics::{label, Labels};

/// Permits are KiB, so one reservation (a u32 of permits) can name up to 4 TiB.
const UNIT: usize = 1024;

/// The shared memory budget. Cheap to clone; every clone draws from the same pool.
#[derive(Clone)]
pub struct MemoryBudget {
    inner: Arc<Inner>,
}

struct Inner {
    /// The room left, in units; only ever taken whole (`try_acquire`), never waited on.
    sem: Arc<Semaphore>,
    total_units: u32,
    /// The tickets of the reservations waiting, in arrival order.
    queue: Mutex<VecDeque<u64>>,
    next_ticket: AtomicU64,
    /// Woken when room is given back or the queue's head leaves.
    changed: Notify,
    in_use: Gauge,
    refusals: Family<Labels, Counter>,
}

impl std::fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBudget").field("total_bytes", &self.total_bytes()).field("in_use_bytes", &self.in_use_bytes()).finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// One reservation larger than the whole budget: it could never be granted.
    #[error("{asked} bytes exceed the whole memory budget of {total} bytes")]
    Larger { asked: usize, total: usize },
    /// The budget stayed spent for as long as the caller could wait.
    #[error("the memory budget ({total} bytes) stayed spent for {waited:?}; try again")]
    Exhausted { total: usize, waited: Duration },
}

/// Bytes held from the budget; given back when dropped.
#[derive(Default)]
pub struct MemoryPermit {
    permit: Option<OwnedSemaphorePermit>,
    budget: Option<Arc<Inner>>,
}

impl std::fmt::Debug for MemoryPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPermit").field("bytes", &self.bytes()).finish()
    }
}

impl MemoryPermit {
    /// Hold `other`'s bytes too, until this permit is dropped.
    pub fn absorb(&mut self, mut other: MemoryPermit) {
        match (&mut self.permit, other.permit.take()) {
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (None, Some(theirs)) => {
                self.permit = Some(theirs);
                self.budget = other.budget.take();
            }
            _ => {}
        }
    }

    pub fn bytes(&self) -> usize {
        self.permit.as_ref().map_or(0, |p| p.num_permits() * UNIT)
    }
}

impl Drop for MemoryPermit {
    fn drop(&mut self) {
        if let (Some(p), Some(b)) = (self.permit.take(), &self.budget) {
            b.in_use.dec_by((p.num_permits() * UNIT) as i64);
            drop(p);
            b.changed.notify_waiters();
        }
    }
}

/// A waiting reservation's place in the queue, given up when it is granted, refused or
/// dropped (the request went away).
struct Place<'a> {
    inner: &'a Inner,
    ticket: u64,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut queue = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
        let was_head = queue.front() == Some(&self.ticket);
        queue.retain(|t| *t != self.ticket);
        drop(queue);
        if was_head {
            self.inner.changed.notify_waiters();
        }
    }
}

impl MemoryBudget {
    pub fn new(total_bytes: usize) -> Self {
        let total_units = u32::try_from(total_bytes.div_ceil(UNIT)).unwrap_or(u32::MAX).max(1);
        Self {
            inner: Arc::new(Inner {
                sem: Arc::new(Semaphore::new(total_units as usize)),
                total_units,
                queue: Mutex::new(VecDeque::new()),
                next_ticket: AtomicU64::new(0),
                changed: Notify::new(),
                in_use: Gauge::default(),
                refusals: Family::default(),
            }),
        }
    }

    /// A budget so large it never refuses (tools and tests that are not servers).
    pub fn unlimited() -> Self {
        Self::new(u32::MAX as usize * UNIT)
    }

    pub fn total_bytes(&self) -> usize {
        self.inner.total_units as usize * UNIT
    }

    pub fn in_use_bytes(&self) -> usize {
        (self.inner.total_units as usize - self.inner.sem.available_permits()) * UNIT
    }

    /// The gauge of bytes held and the counter of refusals by consumer, for the metrics registry.
    fn metric_families(&self) -> (Gauge, Family<Labels, Counter>) {
        (self.inner.in_use.clone(), self.inner.refusals.clone())
    }

    /// Export the budget's size, the bytes held now and the refusals by consumer.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        let (in_use, refusals) = self.metric_families();
        registry.register("memory_budget_in_use_bytes", "Bytes of the shared memory budget held now", in_use);
        registry.register("memory_budget_refusals", "Reservations the memory budget refused, by consumer", refusals);
        let total = Gauge::<i64>::default();
        total.set(i64::try_from(self.total_bytes()).unwrap_or(i64::MAX));
        registry.register("memory_budget_bytes", "Size of the shared memory budget", total);
    }

    fn refuse(&self, consumer: &'static str, bytes: usize, e: BudgetError) -> BudgetError {
        self.inner.refusals.get_or_create(&label("consumer", consumer)).inc();
        tracing::warn!(consumer, bytes, in_use = self.in_use_bytes(), error = %e, "memory budget refused a reservation");
        e
    }

    /// The units of `bytes`, or why they can never be granted.
    fn units(&self, consumer: &'static str, bytes: usize) -> Result<u32, BudgetError> {
        u32::try_from(bytes.div_ceil(UNIT))
            .ok()
            .filter(|u| *u <= self.inner.total_units)
            .ok_or_else(|| self.refuse(consumer, bytes, BudgetError::Larger { asked: bytes, total: self.total_bytes() }))
    }

    fn take(&self, units: u32) -> Option<MemoryPermit> {
        let permit = self.inner.sem.clone().try_acquire_many_owned(units).ok()?;
        self.inner.in_use.inc_by((units as usize * UNIT) as i64);
        Some(MemoryPermit { permit: Some(permit), budget: Some(self.inner.clone()) })
    }

    /// Reserve `bytes` for `consumer` (a metric label: `webhook_body`, `extender_body`,
    /// `registry`), waiting in arrival order until `until` at the latest.
    pub async fn reserve(&self, consumer: &'static str, bytes: usize, until: Instant) -> Result<MemoryPermit, BudgetError> {
        let units = self.units(consumer, bytes)?;
        if units == 0 {
            return Ok(MemoryPermit::default());
        }
        let started = Instant::now();
        let place = {
            let mut queue = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            if queue.is_empty() {
                if let Some(p) = self.take(units) {
                    return Ok(p);
                }
            }
            let ticket = self.inner.next_ticket.fetch_add(1, Ordering::Relaxed);
            queue.push_back(ticket);
            Place { inner: &self.inner, ticket }
        };
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let queue = self.inner.queue.lock().unwrap_or_else(|e| e.into_inner());
                if queue.front() == Some(&place.ticket) {
                    if let Some(p) = self.take(units) {
                        drop(queue);
                        drop(place);
                        return Ok(p);
                    }
                }
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                drop(place);
                return Err(self.refuse(consumer, bytes, BudgetError::Exhausted { total: self.total_bytes(), waited: started.elapsed() }));
            }
        }
    }

    /// Add `bytes` for `consumer` to `held`, which the caller already holds for the same work:
    /// taken as soon as there is room, before reservations that wait (they hold nothing, and
    /// the work part way done gives all its room back when it ends). Waits until `until` at the
    /// latest.
    pub async fn reserve_more(&self, held: &mut MemoryPermit, consumer: &'static str, bytes: usize, until: Instant) -> Result<(), BudgetError> {
        let units = self.units(consumer, bytes)?;
        if units == 0 {
            return Ok(());
        }
        let started = Instant::now();
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(p) = self.take(units) {
                held.absorb(p);
                return Ok(());
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                return Err(self.refuse(consumer, bytes, BudgetError::Exhausted { total: self.total_bytes(), waited: started.elapsed() }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soon(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    #[tokio::test]
    async fn reservations_wait_for_room_then_are_refused() {
        let b = MemoryBudget::new(10 * UNIT);
        let first = b.reserve("t", 6 * UNIT, soon(10)).await.expect("room");
        assert_eq!(b.in_use_bytes(), 6 * UNIT);
        let err = b.reserve("t", 6 * UNIT, soon(50)).await.expect_err("no room");
        assert!(matches!(err, BudgetError::Exhausted { .. }), "{err}");
        assert_eq!(b.metric_families().1.get_or_create(&label("consumer", "t")).get(), 1);
        // Room freed while waiting is granted.
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.reserve("t", 6 * UNIT, soon(2000)).await.map(|p| p.bytes()) })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        assert_eq!(waiter.await.expect("join"), Ok(6 * UNIT));
        assert_eq!(b.in_use_bytes(), 0, "dropped permits give their bytes back");
        assert_eq!(b.metric_families().0.get(), 0);
    }

    #[tokio::test]
    async fn a_reservation_larger_than_the_budget_is_refused_at_once() {
        let b = MemoryBudget::new(4 * UNIT);
        let started = std::time::Instant::now();
        assert!(matches!(b.reserve("t", 5 * UNIT, soon(5000)).await, Err(BudgetError::Larger { .. })));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(b.reserve("t", 0, soon(0)).await.expect("empty").bytes(), 0);
    }

    #[tokio::test]
    async fn absorbed_permits_are_held_together() {
        let b = MemoryBudget::new(8 * UNIT);
        let mut p = MemoryPermit::default();
        p.absorb(b.reserve("t", 2 * UNIT, soon(10)).await.expect("a"));
        p.absorb(b.reserve("t", 3 * UNIT, soon(10)).await.expect("b"));
        assert_eq!((p.bytes(), b.in_use_bytes()), (5 * UNIT, 5 * UNIT));
        drop(p);
        assert_eq!(b.in_use_bytes(), 0);
        assert_eq!(b.metric_families().0.get(), 0);
    }

    #[tokio::test]
    async fn a_waiting_reservation_holds_nothing_and_work_under_way_gets_more_first() {
        let b = MemoryBudget::new(10 * UNIT);
        let mut first = b.reserve("t", 6 * UNIT, soon(10)).await.expect("room");
        // A reservation that does not fit waits, holding none of the 4 units left...
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.reserve("t", 6 * UNIT, soon(3000)).await.map(|p| p.bytes()) })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(b.in_use_bytes(), 6 * UNIT, "the waiter holds nothing while it waits");
        // ...so the work under way gets the 2 more it needs at once, rather than waiting for
        // room that only its own end would free.
        let started = std::time::Instant::now();
        b.reserve_more(&mut first, "t", 2 * UNIT, soon(3000)).await.expect("more");
        assert!(started.elapsed() < Duration::from_millis(500));
        assert_eq!((first.bytes(), b.in_use_bytes()), (8 * UNIT, 8 * UNIT));
        drop(first);
        assert_eq!(waiter.await.expect("join"), Ok(6 * UNIT));
        assert_eq!(b.in_use_bytes(), 0);
        // More than there is at all is refused at once; more than there is now, after the wait.
        let mut p = b.reserve("t", 8 * UNIT, soon(10)).await.expect("room");
        assert!(matches!(b.reserve_more(&mut p, "t", 11 * UNIT, soon(5000)).await, Err(BudgetError::Larger { .. })));
        assert!(matches!(b.reserve_more(&mut p, "t", 4 * UNIT, soon(30)).await, Err(BudgetError::Exhausted { .. })));
        assert_eq!(p.bytes(), 8 * UNIT);
    }

    #[tokio::test]
    async fn reservations_are_granted_in_arrival_order() {
        let b = MemoryBudget::new(10 * UNIT);
        let held = b.reserve("t", 8 * UNIT, soon(10)).await.expect("room");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        // A large one first, then a small one that would fit now: the small one waits its turn.
        for (name, units) in [("large", 9), ("small", 1)] {
            let (b, order) = (b.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let p = b.reserve("t", units * UNIT, soon(3000)).await.expect("granted");
                order.lock().expect("order").push(name);
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(p);
            }));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(b.in_use_bytes(), 8 * UNIT, "nothing granted while the large one waits");
        drop(held);
        for t in tasks {
            t.await.expect("join");
        }
        assert_eq!(*order.lock().expect("order"), vec!["large", "small"]);
        // A reservation that gives up leaves the queue: the next one is not stuck behind it.
        let held = b.reserve("t", 8 * UNIT, soon(10)).await.expect("room");
        assert!(b.reserve("t", 9 * UNIT, soon(20)).await.is_err());
        assert_eq!(b.reserve("t", 2 * UNIT, soon(20)).await.map(|p| p.bytes()), Ok(2 * UNIT));
        drop(held);
    }
}
