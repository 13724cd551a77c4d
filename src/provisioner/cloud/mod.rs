//! Where nodes come from. The provisioner only talks to [`CloudProvider`]; each cloud is a module
//! of its own (`kwok` ships; EC2 or Azure would be a sibling implementing the same trait).

pub mod kwok;

use async_trait::async_trait;

use super::nodeclaim::NodeClaim;
use crate::core::packer::Offering;

#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    #[error("{provider}: {message}")]
    Api { provider: &'static str, message: String },
    /// The offering cannot be had right now (capacity, quota): try another.
    #[error("{provider}: insufficient capacity for {instance_type} in {zone}: {message}")]
    InsufficientCapacity { provider: &'static str, instance_type: String, zone: String, message: String },
}

/// A running (or starting) instance the provider knows of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub provider_id: String,
    /// The Node it registers as.
    pub node_name: String,
    /// The NodeClaim it was launched for.
    pub claim: String,
}

#[async_trait]
pub trait CloudProvider: Send + Sync {
    fn name(&self) -> &'static str;
    /// Every (instance type, zone, capacity type) this provider can launch, with its price.
    fn offerings(&self) -> Vec<Offering>;
    /// Launch the node for `claim`. Idempotent on the claim's name: calling it again for a claim
    /// that was already launched returns the same instance and launches nothing.
    async fn create(&self, claim: &NodeClaim) -> Result<Instance, CloudError>;
    /// Terminate the instance of `claim`; an instance already gone is not an error.
    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError>;
    /// Every instance this provider launched (for garbage collection of leaked instances).
    async fn list(&self) -> Result<Vec<Instance>, CloudError>;
}
