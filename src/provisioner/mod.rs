//! The provisioning worker and its deciding code (shared with `archer simulate`):
//! - `nodepool`, `nodeclaim`: the NodePool and NodeClaim custom resources;
//! - `model`: the one adapter from Kubernetes objects to the planner's inputs (pending pods,
//!   the cluster snapshot), used by the worker, consolidation and simulate;
//! - `scenario`: ordinary Kubernetes YAML read into those objects (simulate);
//! - `state`: the cluster as the deciding code sees it (pending pods, free room, pool usage);
//! - `worker`: pending-pod watch, batching, launching, claim keeping;
//! - `consolidation`: which nodes to remove or replace, decided purely (worker and simulate);
//! - `disruption`: the clocks, budgets and actions around those decisions (taint, evict, delete);
//! - `cloud`: the cloud-provider trait and the kwok provider;
//! - `leader`: the Lease that makes one replica the provisioner.

pub mod cloud;
pub mod conditions;
pub mod consolidation;
mod cost;
pub mod disruption;
pub mod drift;
pub mod leader;
pub mod model;
pub mod nodeclaim;
pub mod nodepool;
pub mod scenario;
pub mod state;
mod status;
pub mod worker;

pub use worker::Provisioner;
