//! Image references, resolved the way the container runtime resolves them.
//!
//! `nginx` is `docker.io/library/nginx:latest`; `name:tag@sha256:...` means the digest;
//! a first path component with a `.` or `:`, `localhost`, or a bracketed IPv6 literal is a registry.

use std::fmt;

const DEFAULT_REGISTRY: &str = "docker.io";
/// The OCI distribution spec's bounds: a name (registry host, `/`, repository) of at most 255
/// characters, a tag of at most 128, and a digest (sha512 is the longest Archer accepts).
const MAX_NAME_LEN: usize = 255;
const MAX_TAG_LEN: usize = 128;
const MAX_DIGEST_LEN: usize = "sha512:".len() + 128;
/// The longest reference the spec allows: `name:tag@digest`.
const MAX_REFERENCE_LEN: usize = MAX_NAME_LEN + 1 + MAX_TAG_LEN + 1 + MAX_DIGEST_LEN;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageRef {
    /// `docker.io`, `ghcr.io`, `127.0.0.1:5000`, `[::1]:5000`.
    pub registry: String,
    /// `library/nginx`.
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:<hex>`.
    pub digest: Option<String>,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ReferenceError {
    #[error("image reference is empty")]
    Empty,
    #[error("image reference is longer than the {MAX_REFERENCE_LEN} bytes the OCI distribution spec allows")]
    TooLong,
    #[error("image reference {0:?} names a repository longer than the {MAX_NAME_LEN} characters the OCI distribution spec allows (registry host included)")]
    NameTooLong(String),
    #[error("image reference {0:?} contains a character that is not allowed")]
    BadCharacter(String),
    #[error("image reference {0:?} has an invalid registry host")]
    BadRegistry(String),
    #[error("image reference {0:?} has an invalid repository path")]
    BadRepository(String),
    #[error("image reference {0:?} has an invalid tag")]
    BadTag(String),
    #[error("image reference {0:?} has an invalid digest (want sha256:<64 hex> or sha512:<128 hex>)")]
    BadDigest(String),
}

impl ImageRef {
    pub fn parse(input: &str) -> Result<Self, ReferenceError> {
        let s = input;
        if s.is_empty() {
            return Err(ReferenceError::Empty);
        }
        if s.len() > MAX_REFERENCE_LEN {
            return Err(ReferenceError::TooLong);
        }
        if !s.chars().all(|c| c.is_ascii_graphic()) {
            return Err(ReferenceError::BadCharacter(s.to_string()));
        }
        let (name_tag, digest) = match s.split_once('@') {
            Some((n, d)) => (n, Some(parse_digest(d, s)?)),
            None => (s, None),
        };
        // The tag is after the last ':' that follows the last '/'.
        let last_slash = name_tag.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name_tag[last_slash..].rfind(':') {
            Some(i) => {
                let at = last_slash + i;
                (&name_tag[..at], Some(name_tag[at + 1..].to_string()))
            }
            None => (name_tag, None),
        };
        if let Some(t) = &tag {
            if !valid_tag(t) {
                return Err(ReferenceError::BadTag(s.to_string()));
            }
        }
        let (registry, repository) = split_registry(name, s)?;
        if registry.len() + 1 + repository.len() > MAX_NAME_LEN {
            return Err(ReferenceError::NameTooLong(s.chars().take(64).collect::<String>() + "..."));
        }
        if !valid_repository(&repository) {
            return Err(ReferenceError::BadRepository(s.to_string()));
        }
        Ok(ImageRef { registry, repository, tag, digest })
    }

    /// The tag or digest to ask the registry for: the digest wins, then the tag, then `latest`.
    pub fn reference(&self) -> &str {
        self.digest.as_deref().or(self.tag.as_deref()).unwrap_or("latest")
    }

    /// The host to send API requests to (Docker Hub's API lives on another name).
    #[cfg(test)]
    pub(crate) fn api_host(&self) -> &str {
        api_host(&self.registry)
    }

    /// `registry/repository` without tag or digest.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }
}

pub(crate) fn api_host(registry: &str) -> &str {
    if registry == DEFAULT_REGISTRY {
        "registry-1.docker.io"
    } else {
        registry
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        if self.tag.is_none() && self.digest.is_none() {
            f.write_str(":latest")?;
        }
        Ok(())
    }
}

fn parse_digest(d: &str, whole: &str) -> Result<String, ReferenceError> {
    let bad = || ReferenceError::BadDigest(whole.to_string());
    let (alg, hex) = d.split_once(':').ok_or_else(bad)?;
    let want = match alg {
        "sha256" => 64,
        "sha512" => 128,
        _ => return Err(bad()),
    };
    if hex.len() != want || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(bad());
    }
    Ok(d.to_string())
}

fn valid_tag(t: &str) -> bool {
    let mut chars = t.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric() || c == '_')
        && t.len() <= MAX_TAG_LEN
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-')
}

fn split_registry(name: &str, whole: &str) -> Result<(String, String), ReferenceError> {
    let (first, rest) = match name.split_once('/') {
        Some((f, r)) => (f, Some(r)),
        None => (name, None),
    };
    let is_registry = rest.is_some()
        && (first.contains('.') || first.contains(':') || first == "localhost" || first.starts_with('['));
    if !is_registry {
        let repository = if rest.is_none() { format!("library/{name}") } else { name.to_string() };
        return Ok((DEFAULT_REGISTRY.to_string(), repository));
    }
    let registry = normalise_registry(first).ok_or_else(|| ReferenceError::BadRegistry(whole.to_string()))?;
    let mut repository = rest.unwrap_or_default().to_string();
    if registry == DEFAULT_REGISTRY && !repository.contains('/') {
        repository = format!("library/{repository}");
    }
    Ok((registry, repository))
}

/// Validate a `host[:port]` (or `[v6]:port`) registry name; Docker Hub aliases become `docker.io`.
pub fn normalise_registry(host: &str) -> Option<String> {
    let host = host.trim().trim_end_matches('/');
    let host = host.strip_prefix("https://").or_else(|| host.strip_prefix("http://")).unwrap_or(host);
    let host = host.split('/').next().unwrap_or_default();
    if host.is_empty() {
        return None;
    }
    let (hostname, port) = if let Some(v6) = host.strip_prefix('[') {
        let (addr, after) = v6.split_once(']')?;
        addr.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (format!("[{addr}]"), port)
    } else {
        match host.rsplit_once(':') {
            Some((h, p)) => (h.to_ascii_lowercase(), Some(p)),
            None => (host.to_ascii_lowercase(), None),
        }
    };
    if let Some(p) = port {
        if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) || p.parse::<u32>().ok()? > 65535 {
            return None;
        }
    }
    if !hostname.starts_with('[') {
        let labels_ok = hostname
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && !l.starts_with('-') && !l.ends_with('-') && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        if !labels_ok || hostname.len() > 253 {
            return None;
        }
    }
    let hostname = match hostname.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => DEFAULT_REGISTRY.to_string(),
        _ => hostname,
    };
    Some(match port {
        Some(p) => format!("{hostname}:{p}"),
        None => hostname,
    })
}

fn valid_repository(repo: &str) -> bool {
    // path-component ::= [a-z0-9]+ (separator [a-z0-9]+)*, separator ::= [_.] | __ | -+
    !repo.is_empty()
        && repo.len() <= 255
        && repo.split('/').all(|c| {
            !c.is_empty()
                && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'_' || b == b'-')
                && c.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
                && c.as_bytes().last().is_some_and(u8::is_ascii_alphanumeric)
                && !c.contains("..")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> ImageRef {
        ImageRef::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }
    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn docker_hub_defaults() {
        let r = p("nginx");
        assert_eq!((r.registry.as_str(), r.repository.as_str(), r.reference()), ("docker.io", "library/nginx", "latest"));
        assert_eq!(r.to_string(), "docker.io/library/nginx:latest");
        assert_eq!(r.api_host(), "registry-1.docker.io");
        let r = p("bitnami/redis:7.2");
        assert_eq!((r.registry.as_str(), r.repository.as_str(), r.reference()), ("docker.io", "bitnami/redis", "7.2"));
        assert_eq!(p("index.docker.io/nginx").repository, "library/nginx");
        assert_eq!(p("docker.io/library/nginx:1.27").to_string(), "docker.io/library/nginx:1.27");
    }

    #[test]
    fn registries_ports_localhost_and_ipv6() {
        let r = p("ghcr.io/org/team/app:v1");
        assert_eq!((r.registry.as_str(), r.repository.as_str()), ("ghcr.io", "org/team/app"));
        let r = p("localhost:5000/app");
        assert_eq!((r.registry.as_str(), r.repository.as_str(), r.reference()), ("localhost:5000", "app", "latest"));
        let r = p("localhost/app:1");
        assert_eq!(r.registry, "localhost");
        let r = p("127.0.0.1:5000/a/b:tag");
        assert_eq!((r.registry.as_str(), r.repository.as_str(), r.reference()), ("127.0.0.1:5000", "a/b", "tag"));
        let r = p("[::1]:5000/app:2");
        assert_eq!((r.registry.as_str(), r.repository.as_str(), r.reference()), ("[::1]:5000", "app", "2"));
        let r = p("[fe80::1]/app");
        assert_eq!(r.registry, "[fe80::1]");
        // A first component without '.', ':' or localhost is a Hub namespace, not a host.
        assert_eq!(p("myorg/app").registry, "docker.io");
    }

    #[test]
    fn digests_win_over_tags() {
        let r = p(&format!("nginx:1.27@{D}"));
        assert_eq!(r.tag.as_deref(), Some("1.27"));
        assert_eq!(r.reference(), D);
        let r = p(&format!("registry.example.com:443/app@{D}"));
        assert_eq!((r.tag.clone(), r.reference()), (None, D));
        assert_eq!(r.to_string(), format!("registry.example.com:443/app@{D}"));
    }

    #[test]
    fn hostile_and_malformed_references_are_rejected() {
        for bad in [
            "",
            "   ",
            "Nginx",
            "nginx:",
            "nginx:-bad",
            "nginx@sha256:abc",
            "nginx@md5:0123",
            "nginx:tag with space",
            "reg.example.com:99999/app",
            "reg.example.com:80a/app",
            "[not-ipv6]:5000/app",
            "reg.example.com/../etc/passwd",
            "reg.example.com/app/",
            "reg.example.com//app",
            "app\u{0}",
            "app\n",
            "-reg.example.com/app",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(ImageRef::parse(&"a".repeat(2000)), Err(ReferenceError::TooLong));
        assert!(ImageRef::parse(&format!("app:{}", "t".repeat(129))).is_err());
    }

    #[test]
    fn registry_normalisation() {
        assert_eq!(normalise_registry("https://index.docker.io/v1/").as_deref(), Some("docker.io"));
        assert_eq!(normalise_registry("Registry.Example.com:5000").as_deref(), Some("registry.example.com:5000"));
        assert_eq!(normalise_registry("[::1]:5000").as_deref(), Some("[::1]:5000"));
        assert_eq!(normalise_registry("bad host"), None);
    }

    /// Where a maintained parser applies, Archer's agrees with it: `oci-spec`'s `Reference`
    /// (distribution's grammar and normalisation) on registry, repository, tag and digest. Archer
    /// keeps its own parser because that grammar refuses what the container runtime pulls: a
    /// bracketed IPv6 registry (`[::1]:5000/app`); the last case checks it still does, so this
    /// parser can go when the crate takes them.
    #[test]
    fn agrees_with_oci_specs_reference_where_it_applies() {
        use oci_spec::distribution::Reference;
        let digest = format!("sha256:{}", "a".repeat(64));
        for s in [
            "nginx".to_string(),
            "nginx:1.27".into(),
            "library/nginx".into(),
            "docker.io/nginx".into(),
            "index.docker.io/library/nginx:latest".into(),
            "ghcr.io/org/team/app:v1.2.3".into(),
            "localhost/app".into(),
            "localhost:5000/app:dev".into(),
            "127.0.0.1:5000/a/b/c".into(),
            "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/app:1".into(),
            "myregistry.azurecr.io/team/api:2".into(),
            format!("quay.io/org/app@{digest}"),
            format!("quay.io/org/app:1@{digest}"),
            "user/repo_name-with.dots__and_underscores:tag_1.0-rc".into(),
        ] {
            let ours = ImageRef::parse(&s).unwrap_or_else(|e| panic!("{s}: {e}"));
            let theirs = Reference::try_from(s.as_str()).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(ours.registry, theirs.registry(), "{s}");
            assert_eq!(ours.repository, theirs.repository(), "{s}");
            assert_eq!(ours.reference(), theirs.digest().or(theirs.tag()).unwrap_or("latest"), "{s}");
        }
        for bad in ["", "a//b", "app:", "app@sha256:short", "-lead/app"] {
            assert!(ImageRef::parse(bad).is_err() && Reference::try_from(bad).is_err(), "both refuse {bad:?}");
        }
        assert!(ImageRef::parse("[::1]:5000/app:1").is_ok() && Reference::try_from("[::1]:5000/app:1").is_err(), "oci-spec now takes IPv6 registries: use it");
    }

}
