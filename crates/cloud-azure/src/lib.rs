//! Azure. Today: the `AKSNodeClass` custom resource ([`nodeclass`]), so a pool names its Azure
//! settings the way Karpenter on Azure's do; the sizes, prices and labels are the catalog's
//! (`archer_core::catalog`, `archer_core::cloud_labels`). The VM provider (launches through Azure
//! Resource Manager) is not built yet: issue #30.

pub mod nodeclass;
