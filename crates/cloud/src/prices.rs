//! Prices a provider reads from its cloud's own price API while it runs (the AWS Price List
//! Query API, the Azure Retail Prices API): the last answer, when it came, and since when the
//! refreshes have been failing. Until the first answer (or when live prices are off) the
//! provider prices from the catalog, and says so.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

/// Where the on-demand prices a provider plans with come from.
pub const CATALOG: &str = "catalog";

/// After a failed refresh the next try comes after this long (or the period, if shorter).
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(600);

/// One region's prices, as a cloud's price API gave them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RegionPrices {
    pub region: String,
    /// On-demand Linux USD per hour, by instance type (VM size) name.
    pub on_demand: BTreeMap<String, f64>,
    /// Spot USD per hour by the same names, where the API prices spot (Azure's `Spot` meters).
    pub spot: BTreeMap<String, f64>,
    /// Pages read.
    pub pages: usize,
}

impl RegionPrices {
    /// An instance type's on-demand list price in `region`: this answer's where it prices the
    /// type, else the catalog's for the region (before the first answer, `live` is `None`).
    pub fn list_price(live: Option<&RegionPrices>, t: &archer_core::catalog::InstanceType, region: &str) -> Option<f64> {
        live.and_then(|p| p.on_demand.get(&t.name).copied()).or_else(|| t.prices.get(region).copied())
    }
}

/// What a provider's prices are now: for its metrics, `archer prices` and the logs.
#[derive(Debug, Clone, PartialEq)]
pub struct PriceStatus {
    /// The price API asked (`price-list-api`, `retail-prices-api`).
    pub api: &'static str,
    /// Where the on-demand prices in use come from: `api`, or [`CATALOG`] before its first
    /// answer (or with live prices off).
    pub source: &'static str,
    /// When the prices in use were read from the API.
    pub refreshed_at: Option<SystemTime>,
    /// Since when every refresh has failed (`None`: the last one succeeded, or none was tried).
    pub failing_since: Option<SystemTime>,
    pub last_error: Option<String>,
    /// Failed refreshes since the start.
    pub failures: u64,
    /// Instance types the last answer priced on demand.
    pub priced: usize,
}

/// The last answer of a price API, shared by the provider's planning and its refresh loop.
pub struct LivePrices {
    state: RwLock<(Option<Arc<RegionPrices>>, PriceStatus)>,
}

impl LivePrices {
    pub fn new(api: &'static str) -> LivePrices {
        let status = PriceStatus { api, source: CATALOG, refreshed_at: None, failing_since: None, last_error: None, failures: 0, priced: 0 };
        LivePrices { state: RwLock::new((None, status)) }
    }

    /// The last answer, if there was one.
    pub fn current(&self) -> Option<Arc<RegionPrices>> {
        self.state.read().unwrap_or_else(|e| e.into_inner()).0.clone()
    }

    pub fn status(&self) -> PriceStatus {
        self.state.read().unwrap_or_else(|e| e.into_inner()).1.clone()
    }

    /// A refresh answered: its prices are used from now on.
    pub fn succeeded(&self, prices: RegionPrices, at: SystemTime) {
        let mut s = self.state.write().unwrap_or_else(|e| e.into_inner());
        s.1.source = s.1.api;
        s.1.refreshed_at = Some(at);
        s.1.failing_since = None;
        s.1.last_error = None;
        s.1.priced = prices.on_demand.len();
        s.0 = Some(Arc::new(prices));
    }

    /// A refresh failed: the last answer (or the catalog) stays.
    pub fn failed(&self, error: String, at: SystemTime) {
        let mut s = self.state.write().unwrap_or_else(|e| e.into_inner());
        s.1.failing_since.get_or_insert(at);
        s.1.last_error = Some(error);
        s.1.failures += 1;
    }

    /// Ask `fetch` once and record the answer; `true` when it answered.
    pub async fn refresh<F, Fut, E>(&self, fetch: &F) -> bool
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<RegionPrices, E>>,
        E: std::fmt::Display,
    {
        let api = self.status().api;
        match fetch().await {
            Ok(prices) => {
                tracing::info!(api, region = %prices.region, priced = prices.on_demand.len(), spot = prices.spot.len(), pages = prices.pages, "prices read");
                self.succeeded(prices, SystemTime::now());
                true
            }
            Err(e) => {
                let status = self.status();
                tracing::warn!(api, error = %e, source = status.source, "prices not refreshed; the last ones stay");
                self.failed(e.to_string(), SystemTime::now());
                false
            }
        }
    }

    /// Refresh every `hours` (a provider's `priceRefreshHours`; 0: never, and this never
    /// returns) until dropped (the first refresh is the caller's, at start); after a failure,
    /// again within ten minutes. `changed` runs after each answer.
    pub async fn keep_fresh<F, Fut, E>(&self, hours: u64, fetch: F, changed: impl Fn())
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<RegionPrices, E>>,
        E: std::fmt::Display,
    {
        if hours == 0 {
            return std::future::pending().await;
        }
        let every = Duration::from_secs(hours.saturating_mul(3600));
        let mut wait = every;
        loop {
            tokio::time::sleep(wait).await;
            if self.refresh(&fetch).await {
                changed();
                wait = every;
            } else {
                wait = every.min(RETRY_AFTER_FAILURE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prices(n: usize) -> RegionPrices {
        RegionPrices { region: "eu-west-1".into(), on_demand: (0..n).map(|i| (format!("t{i}"), 0.1)).collect(), ..Default::default() }
    }

    #[test]
    fn the_status_says_where_prices_come_from_and_since_when_refreshes_fail() {
        let live = LivePrices::new("price-list-api");
        let (t0, t1, t2, t3) = (SystemTime::UNIX_EPOCH, SystemTime::UNIX_EPOCH + Duration::from_secs(10), SystemTime::UNIX_EPOCH + Duration::from_secs(20), SystemTime::UNIX_EPOCH + Duration::from_secs(30));
        assert_eq!((live.status().source, live.current()), (CATALOG, None), "the catalog until the first answer");
        live.failed("throttled".into(), t0);
        live.failed("throttled again".into(), t1);
        let s = live.status();
        assert_eq!((s.source, s.failing_since, s.failures, s.last_error.as_deref()), (CATALOG, Some(t0), 2, Some("throttled again")), "failing since the first failure");
        live.succeeded(prices(3), t2);
        let s = live.status();
        assert_eq!((s.source, s.refreshed_at, s.failing_since, s.priced), ("price-list-api", Some(t2), None, 3));
        live.failed("down".into(), t3);
        let s = live.status();
        assert_eq!((s.source, s.refreshed_at, s.failing_since), ("price-list-api", Some(t2), Some(t3)), "the last answer stays");
        assert_eq!(live.current().map(|p| p.on_demand.len()), Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn refreshes_come_on_the_clock_and_sooner_after_a_failure() {
        let live = Arc::new(LivePrices::new("retail-prices-api"));
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let start = tokio::time::Instant::now();
        let (l, c) = (live.clone(), calls.clone());
        let task = tokio::spawn(async move {
            let fetch = || {
                let c = c.clone();
                async move {
                    let mut calls = c.lock().unwrap_or_else(|e| e.into_inner());
                    calls.push(start.elapsed().as_secs());
                    if calls.len() == 2 { Err("HTTP 503") } else { Ok(prices(calls.len())) }
                }
            };
            l.keep_fresh(12, fetch, || {}).await;
        });
        tokio::time::sleep(Duration::from_secs(25 * 3600)).await;
        task.abort();
        // 12 h: answered; 24 h: failed; ten minutes later: answered.
        assert_eq!(*calls.lock().unwrap_or_else(|e| e.into_inner()), [43_200, 86_400, 87_000]);
        assert_eq!((live.status().failing_since, live.status().failures), (None, 1));
    }
}
