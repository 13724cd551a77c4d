//! The provisioner's model: the cluster at one moment ([`cluster::ClusterState`]) and the pure
//! decisions over it. Nothing here talks to the API server or a cloud; the runtime (`archer`'s
//! `provisioner`) builds a `ClusterState` from its watch caches, `archer simulate` from a
//! scenario or a cluster dump, and both decide with the same code:
//! - `cluster`: the objects the decisions read, and the planner's inputs made from them;
//! - `adapter`: the one reading of a Pod, Node or NodeClaim into the planner's terms;
//! - `objects`: what a single object says (a pod waits for a node, a node is ready or leaving,
//!   a pool's disruption settings);
//! - `claims`: the NodeClaim a planned node becomes; `provision`: one batch's plan and its claims
//!   from one state;
//! - `disruption`: one pass over a pool (expiry, drift, consolidation) as commands;
//! - `consolidation`: which nodes go and what replaces them; `drift`: which nodes no longer match
//!   their pool;
//! - `deletion_cost`: which pods a ReplicaSet's scale-down removes first (whole nodes empty);
//! - `lifecycle`: what the claim keeper does (launch, register, give up, clean up);
//! - `plans`: where recent plans put pending pods, and nodes that recently registered;
//! - `handoff`: the extender's hand-off to kube-scheduler (the plan's node, held room);
//! - `scenario`: ordinary Kubernetes YAML read into a `ClusterState`.
#![forbid(unsafe_code)]

pub mod adapter;
pub mod claims;
pub mod cluster;
pub mod consolidation;
pub mod counterfactual;
pub mod deletion_cost;
pub mod disruption;
pub mod drift;
pub mod handoff;
pub mod lifecycle;
pub mod objects;
pub mod overlay;
pub mod plans;
pub mod price;
pub mod provision;
pub mod scenario;

pub use cluster::ClusterState;
