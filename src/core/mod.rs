//! Archer's own logic, free of I/O: platforms, namespace policy, the placement decision and its patch.

pub mod labels;
pub mod packer;
pub mod patch;
pub mod placement;
pub mod platform;
pub mod planner;
pub mod policy;
pub mod quantity;
pub mod requirements;
pub mod resources;
pub mod sched;
pub mod scoring;
pub mod taints;

#[cfg(test)]
mod placement_tests;

/// A pod's key in plans, placements and hints: `namespace/name` (`default` when unset).
pub fn pod_id(p: &k8s_openapi::api::core::v1::Pod) -> String {
    format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or("default"), p.metadata.name.as_deref().unwrap_or(""))
}
