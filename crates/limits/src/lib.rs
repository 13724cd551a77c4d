//! Limits that hold together under concurrency: one memory budget, in bytes, that request bodies,
//! extender node lists and registry reads all draw from, and bounded request-body reading.
//!
//! Every consumer reserves what it will hold (its bytes times an expansion factor for what it
//! builds from them) before it holds it, and gives it back when the request or lookup ends. When
//! the budget is spent a consumer waits a bounded time, then is refused with a clear answer.

mod body;

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

pub use body::{read_body, BodyError, BodyLimits};

use archer_metrics::{label, Labels};

/// Permits are KiB, so one reservation (a u32 of permits) can name up to 4 TiB.
const UNIT: usize = 1024;

/// The shared memory budget. Cheap to clone; every clone draws from the same pool.
#[derive(Clone)]
pub struct MemoryBudget {
    inner: Arc<Inner>,
}

struct Inner {
    sem: Arc<Semaphore>,
    total_units: u32,
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
#[derive(Debug, Default)]
pub struct MemoryPermit {
    permit: Option<OwnedSemaphorePermit>,
    in_use: Option<Gauge>,
}

impl MemoryPermit {
    /// Hold `other`'s bytes too, until this permit is dropped.
    pub fn absorb(&mut self, mut other: MemoryPermit) {
        match (&mut self.permit, other.permit.take()) {
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (None, Some(theirs)) => {
                self.permit = Some(theirs);
                self.in_use = other.in_use.take();
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
        if let (Some(p), Some(g)) = (&self.permit, &self.in_use) {
            g.dec_by((p.num_permits() * UNIT) as i64);
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
    pub fn metric_families(&self) -> (Gauge, Family<Labels, Counter>) {
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

    /// Reserve `bytes` for `consumer` (a metric label: `webhook_body`, `extender_body`,
    /// `registry`), waiting until `until` at the latest.
    pub async fn reserve(&self, consumer: &'static str, bytes: usize, until: Instant) -> Result<MemoryPermit, BudgetError> {
        let units = bytes.div_ceil(UNIT);
        if units == 0 {
            return Ok(MemoryPermit::default());
        }
        let refuse = |e: BudgetError| {
            self.inner.refusals.get_or_create(&label("consumer", consumer)).inc();
            tracing::warn!(consumer, bytes, in_use = self.in_use_bytes(), error = %e, "memory budget refused a reservation");
            e
        };
        let Some(units) = u32::try_from(units).ok().filter(|u| *u <= self.inner.total_units) else {
            return Err(refuse(BudgetError::Larger { asked: bytes, total: self.total_bytes() }));
        };
        let started = Instant::now();
        let acquire = self.inner.sem.clone().acquire_many_owned(units);
        match tokio::time::timeout_at(until, acquire).await {
            Ok(Ok(permit)) => {
                self.inner.in_use.inc_by((units as usize * UNIT) as i64);
                Ok(MemoryPermit { permit: Some(permit), in_use: Some(self.inner.in_use.clone()) })
            }
            // The semaphore is never closed; treat it like a timeout all the same.
            Ok(Err(_)) | Err(_) => Err(refuse(BudgetError::Exhausted { total: self.total_bytes(), waited: started.elapsed() })),
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
}
