//! Where nodes come from. The provisioner only talks to [`CloudProvider`]; each cloud is a crate
//! of its own implementing it (`archer-cloud-kwok`, `archer-cloud-aws`), compiled into the binary
//! by a cargo feature.

pub mod prices;
pub mod settings;
pub mod unavailable;

use std::sync::Arc;

use async_trait::async_trait;

use archer_api::nodeclaim::NodeClaim;
use archer_core::packer::Offering;

#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    #[error("{provider}: {message}")]
    Api { provider: &'static str, message: String },
    /// The offering cannot be had right now (capacity, quota): try another.
    #[error("{provider}: insufficient capacity for {instance_type} in {zone}: {message}")]
    InsufficientCapacity { provider: &'static str, instance_type: String, zone: String, message: String },
}

/// A running (or starting) instance the provider knows of: a plain record, defined below the
/// model (which decides on it) and named here for the providers that make it.
pub use archer_core::instance::Instance;

/// A notice that instances are being taken away (spot interruption, maintenance, stop).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interruption {
    /// Metric and log label: `spot-interruption`, `scheduled-change`, ...
    pub kind: &'static str,
    /// The provider's instance ids (the last part of a provider id).
    pub instance_ids: Vec<String>,
    /// Whether there is time to wait for replacements before evicting (maintenance days ahead),
    /// or the pods must leave now (a two-minute spot warning, a stopping instance).
    pub replace_first: bool,
}

/// What acts on interruption notices (the provisioner).
#[async_trait]
pub trait InterruptionHandler: Send + Sync {
    /// Take the instances' nodes out: taint, launch replacements, drain, delete. `Ok` once that
    /// has started for each of them (the notice may then be forgotten).
    async fn interrupted(&self, notice: Interruption) -> Result<(), String>;
    /// Count one notice by kind and outcome (`handled`, `ignored`, `malformed`, `failed`,
    /// `dropped`).
    fn count(&self, kind: &str, outcome: &str);
    /// Count one message deleted without being acted on, by why: `foreign_source`,
    /// `foreign_account` (not an event Archer trusts), `max_receives` (failed too often).
    fn dropped(&self, reason: &str);
}

/// Whether a pool's node class lets it launch (Karpenter's NodePool condition `NodeClassReady`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeClassReadiness {
    /// The provider has no node classes (kwok): the condition is not written.
    NotUsed,
    Ready,
    NotReady { reason: String, message: String },
}

#[async_trait]
pub trait CloudProvider: Send + Sync {
    fn name(&self) -> &'static str;
    /// Whether the node class a pool names (`spec.template.spec.nodeClassRef`) is there and
    /// ready. A pool whose class is not gets no new node: its pods fall through to the next pool
    /// by weight, as Karpenter skips a NodePool that is not Ready.
    fn node_class_readiness(&self, _node_class_ref: Option<&std::collections::BTreeMap<String, String>>) -> NodeClassReadiness {
        NodeClassReadiness::NotUsed
    }
    /// Every (instance type, zone, capacity type) this provider can launch now, with its price
    /// (read at each batch: prices and availability change).
    fn offerings(&self) -> Arc<Vec<Offering>>;
    /// Launch the node for `claim`. Idempotent on the claim's name: calling it again for a claim
    /// that was already launched returns the same instance and launches nothing.
    async fn create(&self, claim: &NodeClaim) -> Result<Instance, CloudError>;
    /// Terminate the instance of `claim`; an instance already gone is not an error.
    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError>;
    /// Every instance this provider launched (for garbage collection of leaked instances).
    async fn list(&self) -> Result<Vec<Instance>, CloudError>;
    /// A future delivering the provider's interruption notices to `handler` until dropped;
    /// `None` when the provider has none (or none is configured).
    fn interruptions(&self, _handler: Arc<dyn InterruptionHandler>) -> Option<futures::future::BoxFuture<'static, ()>> {
        None
    }
    /// Why the claim's node no longer matches what this provider would launch for it now (its
    /// node class changed, a newer image replaced its image), if it does not.
    fn drifted(&self, _claim: &NodeClaim) -> Option<String> {
        None
    }
    /// Where the prices of its offerings come from and how old they are, when the provider
    /// reads them from its cloud's price API (`None`: the catalog's only, as kwok).
    fn prices(&self) -> Option<prices::PriceStatus> {
        None
    }
}
