//! Azure. Always: the `AKSNodeClass` custom resource ([`nodeclass`]), so a pool names its Azure
//! settings the way Karpenter on Azure's do; the sizes, prices and labels are the catalog's
//! (`archer_core::catalog`, whose facts give each cloud's well-known labels). With the `provider` feature (the
//! binary's `azure`), the VM provider, which launches through Azure Resource Manager:
//!
//! - `auth`: workload identity tokens; `arm`: the thin ARM client (pages, long-running
//!   operations, errors, retries); `wire`: their error and bounded answers; `models`: the
//!   resource bodies;
//! - `image`: AKS node images per family and architecture; `classes`: AKSNodeClasses resolved
//!   and their status;
//! - `launch`: names, tags, NIC and VM bodies, the node's bootstrap, failure meanings (pure);
//! - `prices`: the Azure Retail Prices API (on-demand and Spot, any region);
//! - `provider`: the [`archer_cloud::CloudProvider`]; `preemption`: spot evictions;
//! - `acr`: private ACR images read with Archer's own workload identity (the registry client's
//!   sign-in).

pub mod nodeclass;

#[cfg(feature = "provider")]
pub mod acr;
#[cfg(feature = "provider")]
pub mod arm;
#[cfg(feature = "provider")]
pub mod auth;
#[cfg(feature = "provider")]
pub mod classes;
#[cfg(feature = "provider")]
pub mod image;
#[cfg(feature = "provider")]
pub mod launch;
#[cfg(feature = "provider")]
mod models;
#[cfg(feature = "provider")]
mod preemption;
#[cfg(feature = "provider")]
pub mod prices;
#[cfg(feature = "provider")]
pub mod provider;
#[cfg(feature = "provider")]
mod wire;

#[cfg(feature = "provider")]
pub use provider::Azure;
