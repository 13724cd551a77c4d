//! The instance profile of a node class given by `role` (as Karpenter does): one profile per
//! cluster and role, named `archer_<cluster>_<hash of the role>`, created with the cluster's tag
//! and holding exactly that role. A profile of that name without the tag is not Archer's: its
//! roles are never removed.

use sha2::{Digest, Sha256};

use crate::{CLUSTER_TAG, NODECLASS_TAG};

/// The profile's name for a role (IAM names: at most 128 of `[\w+=,.@-]`).
pub fn profile_name(cluster: &str, role: &str) -> String {
    let hash = hex::encode(Sha256::digest(role.as_bytes()).get(..6).unwrap_or_default());
    let cluster: String = cluster.chars().filter(|c| c.is_ascii_alphanumeric() || "+=,.@-_".contains(*c)).take(100).collect();
    format!("archer_{cluster}_{hash}")
}

fn iam_error<E: std::error::Error + aws_sdk_iam::error::ProvideErrorMetadata + 'static, R: std::fmt::Debug>(e: aws_sdk_iam::error::SdkError<E, R>) -> String {
    crate::sdk_error(e)
}

/// The instance profile holding `role`, made (or corrected) when needed; its name.
pub(crate) async fn ensure(iam: &aws_sdk_iam::Client, cluster: &str, class: &str, role: &str) -> Result<String, String> {
    let name = profile_name(cluster, role);
    let found = match iam.get_instance_profile().instance_profile_name(&name).send().await {
        Ok(r) => r.instance_profile().cloned(),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_entity_exception()) => None,
        Err(e) => return Err(iam_error(e)),
    };
    let roles: Vec<String> = match found {
        // Its roles are removed below when they are not `role`: only from a profile Archer made.
        Some(p) if !p.tags().iter().any(|t| t.key() == CLUSTER_TAG && t.value() == cluster) => {
            return Err(format!("instance profile {name} exists without Archer's tag {CLUSTER_TAG}={cluster}: not Archer's, left alone (name one in instanceProfile instead)"));
        }
        Some(p) => p.roles().iter().map(|r| r.role_name().to_string()).collect(),
        None => {
            let tags = [aws_sdk_iam::types::Tag::builder().key(CLUSTER_TAG).value(cluster).build(), aws_sdk_iam::types::Tag::builder().key(NODECLASS_TAG).value(class).build()];
            iam.create_instance_profile().instance_profile_name(&name).set_tags(Some(tags.into_iter().collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?)).send().await.map_err(iam_error)?;
            tracing::info!(profile = %name, role, "instance profile created");
            Vec::new()
        }
    };
    if roles.iter().any(|r| r == role) {
        return Ok(name);
    }
    for other in &roles {
        iam.remove_role_from_instance_profile().instance_profile_name(&name).role_name(other).send().await.map_err(iam_error)?;
    }
    iam.add_role_to_instance_profile().instance_profile_name(&name).role_name(role).send().await.map_err(iam_error)?;
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_names_are_per_cluster_and_role_and_valid_for_iam() {
        let a = profile_name("demo", "KarpenterNodeRole-demo");
        assert!(a.starts_with("archer_demo_") && a.len() <= 128);
        assert_ne!(a, profile_name("demo", "OtherRole"));
        assert_ne!(a, profile_name("prod", "KarpenterNodeRole-demo"));
        assert!(profile_name("we!rd/name", "r").starts_with("archer_werdname_"));
    }
}
