//! The AKS node images a node class boots: each image family is an image definition per
//! architecture in AKS's public community galleries, and a node boots the newest version of it
//! (`/CommunityGalleries/<gallery>/images/<definition>/versions/<version>`), as Karpenter on
//! Azure's nodes do. A newer version published there makes older nodes drifted.

use crate::arm::{Arm, ArmError};
use crate::models::{ImageVersion, GALLERY_API};
use crate::nodeclass::ImageFamily;

/// AKS's public galleries (facts: their public names).
const UBUNTU_GALLERY: &str = "AKSUbuntu-38d80f77-467a-481f-a8d4-09b6d4220bd2";
const AZURE_LINUX_GALLERY: &str = "AKSAzureLinux-f7c7cda5-1c9a-4bdc-a222-9614c968580b";

/// The gallery and image definition of a family for an architecture (Gen2 VMs: every D-series
/// v5 and v6 size is one). `Ubuntu` is Ubuntu 22.04, as NAP's default.
pub(crate) fn definition(family: ImageFamily, arch: &str) -> (&'static str, &'static str) {
    let arm = arch == "arm64";
    match family {
        ImageFamily::Ubuntu | ImageFamily::Ubuntu2204 => (UBUNTU_GALLERY, if arm { "2204gen2arm64containerd" } else { "2204gen2containerd" }),
        ImageFamily::Ubuntu2404 => (UBUNTU_GALLERY, if arm { "2404gen2arm64containerd" } else { "2404gen2containerd" }),
        ImageFamily::AzureLinux => (AZURE_LINUX_GALLERY, if arm { "V3gen2arm64" } else { "V3gen2" }),
    }
}

/// The id of the newest version of a definition that is not excluded from "latest".
pub(crate) async fn newest(arm: &Arm, subscription: &str, location: &str, gallery: &str, definition: &str) -> Result<String, ArmError> {
    let path = format!("/subscriptions/{subscription}/providers/Microsoft.Compute/locations/{location}/communityGalleries/{gallery}/images/{definition}/versions");
    let versions: Vec<ImageVersion> = arm.list(&path, GALLERY_API).await?;
    pick(&versions).map(|v| id(gallery, definition, &v.name)).ok_or_else(|| ArmError::Decode(format!("no usable version of {definition} in {gallery} ({location})")))
}

/// The newest version: by publication date, then by version name (`202611.10.0`), numerically.
pub fn pick(versions: &[ImageVersion]) -> Option<&ImageVersion> {
    let key = |v: &ImageVersion| (v.properties.published_date.clone().unwrap_or_default(), v.name.split('.').map(|p| p.parse::<u64>().unwrap_or(0)).collect::<Vec<_>>());
    versions.iter().filter(|v| !v.name.is_empty() && v.properties.exclude_from_latest != Some(true)).max_by_key(|v| key(v))
}

pub(crate) fn id(gallery: &str, definition: &str, version: &str) -> String {
    format!("/CommunityGalleries/{gallery}/images/{definition}/versions/{version}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::ImageVersionProperties;

    fn v(name: &str, date: &str, excluded: bool) -> ImageVersion {
        ImageVersion { name: name.into(), identifier: None, properties: ImageVersionProperties { published_date: Some(date.into()), exclude_from_latest: Some(excluded) } }
    }

    #[test]
    fn the_newest_published_version_not_excluded_wins() {
        let all = [v("202610.01.0", "2026-10-01T00:00:00Z", false), v("202611.10.0", "2026-11-10T00:00:00Z", false), v("202611.20.0", "2026-11-20T00:00:00Z", true)];
        assert_eq!(pick(&all).map(|v| v.name.as_str()), Some("202611.10.0"));
        let same_day = [v("202611.9.0", "2026-11-10T00:00:00Z", false), v("202611.10.0", "2026-11-10T00:00:00Z", false)];
        assert_eq!(pick(&same_day).map(|v| v.name.as_str()), Some("202611.10.0"), "numerically, not as text");
        assert!(pick(&[v("1", "2026-01-01T00:00:00Z", true)]).is_none());
    }

    #[test]
    fn each_family_has_an_image_per_architecture() {
        assert_eq!(definition(ImageFamily::Ubuntu, "arm64"), (UBUNTU_GALLERY, "2204gen2arm64containerd"));
        assert_eq!(definition(ImageFamily::Ubuntu2404, "amd64"), (UBUNTU_GALLERY, "2404gen2containerd"));
        assert_eq!(definition(ImageFamily::AzureLinux, "arm64"), (AZURE_LINUX_GALLERY, "V3gen2arm64"));
        assert_eq!(id(UBUNTU_GALLERY, "2204gen2containerd", "202611.10.0"), "/CommunityGalleries/AKSUbuntu-38d80f77-467a-481f-a8d4-09b6d4220bd2/images/2204gen2containerd/versions/202611.10.0");
    }
}
