//! Archer: image-aware placement for mixed amd64/arm64 Kubernetes clusters. This crate is the
//! runtime and the binary: the webhook, the extender, the provisioner's watches and executors, the
//! HTTPS server and the CLI. The deciding code, the custom resources, the registry client and
//! the clouds are crates of their own under `crates/` (docs "Layout"); they are re-exported
//! here under their old paths for the integration tests and benchmarks.
#![forbid(unsafe_code)]

pub use archer_core as core;
pub use archer_core::{catalog, yaml};
pub use archer_limits as limits;
pub use archer_registry as registry;

pub mod admission;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod cost;
pub mod extender;
pub mod metrics;
pub mod prices;
pub mod provisioner;
pub mod report;
pub mod safety;
pub mod server;
pub mod webhook;
