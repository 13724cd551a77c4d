//! Well-known node labels and annotations Archer reads and writes.

pub const ARCH: &str = "kubernetes.io/arch";
pub const OS: &str = "kubernetes.io/os";
pub const HOSTNAME: &str = "kubernetes.io/hostname";
pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
pub const INSTANCE_TYPE_BETA: &str = "beta.kubernetes.io/instance-type";
pub const REGION: &str = "topology.kubernetes.io/region";
pub const REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";
pub const ZONE: &str = "topology.kubernetes.io/zone";
pub const KARPENTER_CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";
pub const CAPACITY_TYPE: &str = "archer.dev/capacity-type";
/// EKS managed node groups' capacity label (`ON_DEMAND`, `SPOT`).
pub(crate) const EKS_CAPACITY_TYPE: &str = "eks.amazonaws.com/capacityType";
/// AKS's capacity label (`spot`, `regular`), as Karpenter on Azure writes it.
pub const AKS_SCALE_SET_PRIORITY: &str = "kubernetes.azure.com/scalesetpriority";
/// The annotation a ReplicaSet's scale-down reads (lower goes first); Karpenter also counts it
/// in a pod's eviction cost.
pub const POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
/// Archer's record of the deletion cost it wrote: a pod whose cost differs from it was set by
/// someone else.
pub const ARCHER_DELETION_COST: &str = "archer.dev/deletion-cost";
/// Explicit hourly price of a node, overriding the catalog.
pub const PRICE_ANNOTATION: &str = "archer.dev/price-per-hour";
pub const KARPENTER_NODEPOOL: &str = "karpenter.sh/nodepool";
/// Karpenter's pre-v1 pool label, still selected on by older manifests.
pub const KARPENTER_PROVISIONER_NAME: &str = "karpenter.sh/provisioner-name";
pub const NODEPOOL: &str = "archer.dev/nodepool";
/// The NodeClaim a node was launched for.
pub const NODECLAIM: &str = "archer.dev/nodeclaim";
/// Pods (or nodes) with this annotation set to "true" block voluntary disruption of their node.
pub const DO_NOT_DISRUPT: &str = "archer.dev/do-not-disrupt";
pub const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// The taint put on a node being drained by consolidation or expiry.
pub const DISRUPTED_TAINT: &str = "archer.dev/disrupted";
/// On a node from launch until Archer registers it (with the rest of its batch): no pod lands on
/// part of a batch before the whole batch is there (Karpenter's taint of the same name).
pub const UNREGISTERED_TAINT: &str = "karpenter.sh/unregistered";
/// On a node launched in a batch: the other nodes of its batch (comma-separated). The extender
/// keeps pods off it while any of them is still unregistered, so a batch is seen whole.
pub const BATCH_NODES_ANNOTATION: &str = "archer.dev/batch-nodes";
/// On a NodeClaim: the pods (`namespace/name`, comma-separated) the plan that wrote it put on its
/// node, so what kube-scheduler did can be held against what was planned.
pub const PLANNED_PODS_ANNOTATION: &str = "archer.dev/planned-pods";

/// The region of a zone name: EC2's `us-east-1a` -> `us-east-1`, Azure's `eastus-2` -> `eastus`
/// (Azure region names have no dash); a region name stays as it is.
pub fn region_of(zone: &str) -> &str {
    if let Some((region, n)) = zone.rsplit_once('-') {
        if !region.contains('-') && !region.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
            return region;
        }
    }
    // `us-east-1a`: a lowercase zone letter after the region's number.
    let b = zone.as_bytes();
    match (b.last(), b.len().checked_sub(2).and_then(|i| b.get(i))) {
        (Some(c), Some(d)) if c.is_ascii_lowercase() && d.is_ascii_digit() => zone.get(..zone.len() - 1).unwrap_or(zone),
        _ => zone,
    }
}
