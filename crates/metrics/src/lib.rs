//! What every component's metrics share: the label set they are keyed by, and the registry they
//! are registered into. Each component defines and registers its own families (the webhook's in
//! `webhook::metrics`, the registry client's in `archer_registry::metrics`, ...); the process
//! hands each one the registry with the prefix `archer` ([`root`]), or a sub-registry with its
//! own prefix under it. The names families are exported under are a contract (dashboards, alert
//! rules, runbooks), so a component that has always exported `archer_<name>` keeps registering
//! into the root.

use prometheus_client::encoding::text::encode as encode_text;
use prometheus_client::registry::Registry;

pub type Labels = Vec<(&'static str, String)>;

/// The process's registry: every family Archer exports is named `archer_*`.
pub fn root() -> Registry {
    Registry::with_prefix("archer")
}

/// `registry` in the Prometheus text format.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode_text(&mut out, registry);
    out
}

pub fn label(key: &'static str, value: impl Into<String>) -> Labels {
    vec![(key, value.into())]
}

pub fn labels2(k1: &'static str, v1: impl Into<String>, k2: &'static str, v2: impl Into<String>) -> Labels {
    vec![(k1, v1.into()), (k2, v2.into())]
}
