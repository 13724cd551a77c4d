//! The provisioner's runtime (leader only): it acts on what the pure model decides.
//! - `worker`: the watch caches, batching, launching, claim keeping;
//! - `disruption`: the clocks, budgets and actions around consolidation's decisions (taint,
//!   evict, delete), expiry, drift and interruptions;
//! - `status`: NodePool and NodeClaim status conditions and Events; `cost`: the cost and savings
//!   metrics (the Lease that makes one replica the provisioner is `crate::cluster::leader`).
//!
//! The deciding code is crate `archer-model` (the cluster at one moment, the adapter, the
//! consolidation and drift decisions, scenarios) over `archer-core`'s planner; the custom
//! resources are crate `archer-api`; the clouds are crates `archer-cloud-*`. They are
//! re-exported here under the names the tests use.

mod batch;
mod context;
mod cost;
mod deletion_cost;
mod disruption;
mod launch;
pub mod metrics;
mod nodes;
mod quiet;
mod status;
pub mod worker;

pub use archer_api::{conditions, nodeclaim, nodeoverlay, nodepool};
pub use archer_model::{adapter, consolidation, drift, objects, scenario, ClusterState};
pub use worker::Provisioner;

/// The cloud-provider trait and the providers compiled in (`aws` with the cargo feature).
pub mod cloud {
    pub use archer_cloud::*;
    #[cfg(feature = "aws")]
    pub use archer_cloud_aws as aws;
    pub use archer_cloud_kwok as kwok;
    pub use archer_cloud_azure as azure;
}
