//! The registry client's and image inspector's metric families.

use archer_metrics::Labels;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The registry client's and image inspector's families.
#[derive(Default)]
pub struct RegistryMetrics {
    /// Image lookups by result: hit, miss, error.
    pub image_lookups: Family<Labels, Counter>,
    /// Failed image inspections by reason (timeout, not_found, forbidden_address, ...).
    pub inspection_failures: Family<Labels, Counter>,
    /// Registry HTTP exchanges that got a response (manifests, blobs, tokens, retries included).
    pub registry_requests: Counter,
    /// Failures to sign in to a registry, by registry and reason (denied, no_credential,
    /// identity).
    pub auth_failures: Family<Labels, Counter>,
}

impl RegistryMetrics {
    /// The families, registered into `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        m.register(registry);
        m
    }

    fn register(&self, r: &mut Registry) {
        r.register("image_lookups", "Image platform lookups, by cache result", self.image_lookups.clone());
        r.register("image_inspection_failures", "Images that could not be inspected, by reason", self.inspection_failures.clone());
        r.register("registry_requests", "Registry HTTP requests answered (manifests, blobs, tokens)", self.registry_requests.clone());
        r.register("registry_auth_failures", "Failures to sign in to a registry, by registry and reason (denied, no_credential, identity)", self.auth_failures.clone());
    }
}
