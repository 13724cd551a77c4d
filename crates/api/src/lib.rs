//! The custom resources Archer reads and writes, as data: `NodePool` (read in Archer's group and
//! as Karpenter's `karpenter.sh/v1`), `NodeClaim`, and the status conditions both carry. Turning a
//! NodePool into the planner's `Pool` and offerings lives here too, beside the fields it reads.

pub mod apply;
pub mod conditions;
pub mod nodeclaim;
pub mod nodeoverlay;
pub mod nodepool;
pub mod validation;
