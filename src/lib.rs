//! Archer: image-aware placement for mixed amd64/arm64 Kubernetes clusters.
#![forbid(unsafe_code)]

pub mod catalog;
pub mod cluster;
pub mod config;
pub mod core;
pub mod extender;
pub mod limits;
pub mod metrics;
pub mod provisioner;
pub mod report;
pub mod registry;
pub mod server;
pub mod webhook;
pub mod yaml;
pub mod cli;
