//! The provisioning worker's deciding code, shared with `archer simulate`: scenarios (ordinary
//! Kubernetes YAML) and NodePools turned into packer inputs.
//! Still to come: the pending-pod watch and batching, the kwok provider, leader election,
//! disruption (see the open issue).

pub mod nodepool;
pub mod scenario;
