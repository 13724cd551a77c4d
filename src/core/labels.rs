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
/// Explicit hourly price of a node, overriding the catalog.
pub const PRICE_ANNOTATION: &str = "archer.dev/price-per-hour";
