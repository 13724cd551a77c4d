//! The listeners' metric families: connections, timeouts, panics, certificate reloads.

use archer_metrics::Labels;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The listeners' families: connections, timeouts, panics, certificate reloads.
#[derive(Default)]
pub struct ServerMetrics {
    /// Connections closed at once because the listener was at its connection cap.
    pub connections_refused: Counter,
    /// Connections closed to make room for a new one at the cap, by what the closed one was
    /// doing (handshake, headers, body, idle).
    pub connections_displaced: Family<Labels, Counter>,
    /// Request handlers that panicked (answered 500), by route.
    pub panics: Family<Labels, Counter>,
    /// Connections closed by a timeout, by phase (handshake, headers, idle).
    pub connection_timeouts: Family<Labels, Counter>,
    /// Connections open now.
    pub connections_open: Gauge,
    /// Serving-certificate reloads by result (ok, error).
    pub cert_reloads: Family<Labels, Counter>,
    /// When the certificate served now expires (its notAfter, Unix seconds; cert-manager's
    /// `certmanager_certificate_expiration_timestamp_seconds` in kind).
    pub cert_expiration: Gauge,
    /// Managed certificate Secrets written, by reason (absent, cert-renewal, ca-renewal, ...).
    pub cert_writes: Family<Labels, Counter>,
}

impl ServerMetrics {
    /// The families, registered into `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        m.register(registry);
        m
    }

    fn register(&self, r: &mut Registry) {
        r.register("connections_displaced", "Connections closed to make room for a new one at the connection cap, by what the closed one was doing (handshake, headers, body, idle)", self.connections_displaced.clone());
        r.register("panics", "Request handlers that panicked and were answered 500, by route", self.panics.clone());
        r.register("connections_refused", "Connections closed at once because the listener was at its connection cap", self.connections_refused.clone());
        r.register("connection_timeouts", "Connections closed by a timeout, by phase", self.connection_timeouts.clone());
        r.register("connections_open", "Connections open now", self.connections_open.clone());
        r.register("tls_certificate_reloads", "Serving certificate reloads, by result", self.cert_reloads.clone());
        r.register("tls_certificate_writes", "Webhook certificate Secrets written by Archer (tls.mode managed), by reason: absent, unusable, cert-renewal, ca-renewal, names-changed, wrong-issuer, expired-ca", self.cert_writes.clone());
        r.register("tls_certificate_expiration_timestamp_seconds", "When the serving certificate in use expires (its notAfter), Unix seconds", self.cert_expiration.clone());
    }
}
