//! The address guard: which hosts the registry client may talk to.
//!
//! Registry names come from pod specs, i.e. from users: without a guard, `169.254.169.254/x`
//! would make Archer fetch cloud metadata. Names are checked after resolution (so DNS cannot
//! smuggle a forbidden address in) and again on every redirect.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::{Host, Url};

use super::error::RegistryError;
use super::reference::normalise_registry;

pub const MAX_REDIRECTS: usize = 3;
const EC2_IPV6_METADATA: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

#[derive(Debug, Clone, Default)]
pub struct AddressGuard {
    /// Extra networks to refuse (CIDRs from the config's deny list).
    deny_networks: Vec<IpNet>,
    /// Registry names to refuse (from the deny list).
    deny_registries: HashSet<String>,
    /// When non-empty, only these registries may be contacted.
    allow_registries: HashSet<String>,
    /// `host[:port]` of registries reached over plain HTTP, exempt from the address checks.
    insecure: HashSet<String>,
}

impl AddressGuard {
    /// `deny` entries are CIDRs / IPs or registry names; `allow` and `insecure` are registry names.
    pub fn new(deny: &[String], allow: &[String], insecure: &[String]) -> Result<Self, String> {
        let mut g = AddressGuard::default();
        for d in deny {
            if let Ok(net) = d.parse::<IpNet>() {
                g.deny_networks.push(net);
            } else if let Ok(ip) = d.parse::<IpAddr>() {
                g.deny_networks.push(IpNet::from(ip));
            } else {
                g.deny_registries.insert(normalise_registry(d).ok_or_else(|| format!("deny list entry {d:?} is neither a CIDR nor a host"))?);
            }
        }
        for a in allow {
            g.allow_registries.insert(normalise_registry(a).ok_or_else(|| format!("allow list entry {a:?} is not a registry host"))?);
        }
        for i in insecure {
            g.insecure.insert(normalise_registry(i).ok_or_else(|| format!("insecure registry {i:?} is not a host[:port]"))?);
        }
        Ok(g)
    }

    pub fn is_insecure(&self, registry: &str) -> bool {
        self.insecure.contains(registry)
    }

    /// May Archer ask this registry (by name) at all?
    pub fn check_registry(&self, registry: &str) -> Result<(), RegistryError> {
        if self.deny_registries.contains(registry) || self.deny_registries.contains(host_of(registry)) {
            return Err(RegistryError::Forbidden(format!("{registry} (on the deny list)")));
        }
        if !self.allow_registries.is_empty() && !self.allow_registries.contains(registry) && !self.is_insecure(registry) {
            return Err(RegistryError::NotAllowed(registry.to_string()));
        }
        Ok(())
    }

    /// Reason an address is refused, if it is.
    pub fn forbidden_ip(&self, ip: IpAddr) -> Option<&'static str> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        let builtin = match ip {
            IpAddr::V4(v4) if v4.is_loopback() => Some("loopback"),
            IpAddr::V4(v4) if v4.is_link_local() => Some("link-local/metadata"),
            IpAddr::V4(v4) if v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast() => Some("not a unicast address"),
            IpAddr::V6(v6) if v6.is_loopback() => Some("loopback"),
            IpAddr::V6(v6) if v6 == EC2_IPV6_METADATA => Some("cloud metadata"),
            IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => Some("link-local"),
            IpAddr::V6(v6) if v6.is_unspecified() || v6.is_multicast() => Some("not a unicast address"),
            _ => None,
        };
        builtin.or_else(|| self.deny_networks.iter().any(|n| n.contains(&ip)).then_some("on the deny list"))
    }

    /// Check a URL before it is requested (first request, token realm, every redirect).
    /// IP literals are checked here; names are checked by [`GuardedResolver`] after resolution.
    pub fn check_url(&self, url: &Url) -> Result<(), RegistryError> {
        let host_port = match (url.host_str(), url.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            (None, _) => return Err(RegistryError::Forbidden(format!("{url} (no host)"))),
        };
        let exempt = self.insecure.contains(&host_port) || url.host_str().is_some_and(|h| self.insecure.contains(h));
        if exempt {
            return Ok(());
        }
        if url.scheme() != "https" {
            return Err(RegistryError::Forbidden(format!("{url} (plain HTTP to a registry not listed as insecure)")));
        }
        let ip = match url.host() {
            Some(Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
            Some(Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
            _ => None,
        };
        if let Some(ip) = ip {
            if let Some(why) = self.forbidden_ip(ip) {
                return Err(RegistryError::Forbidden(format!("{ip} ({why})")));
            }
        }
        if let Some(h) = url.host_str() {
            if self.deny_registries.contains(h) || self.deny_registries.contains(&host_port) {
                return Err(RegistryError::Forbidden(format!("{host_port} (on the deny list)")));
            }
        }
        Ok(())
    }

    /// A name exempt from address checks (an insecure registry named by host, any port).
    fn name_exempt(&self, name: &str) -> bool {
        self.insecure.iter().any(|i| host_of(i) == name)
    }
}

fn host_of(registry: &str) -> &str {
    if registry.starts_with('[') {
        return registry.split(']').next().map(|h| h.trim_start_matches('[')).unwrap_or(registry);
    }
    registry.rsplit_once(':').map_or(registry, |(h, _)| h)
}

/// DNS resolution that refuses names resolving to forbidden addresses. A name with any
/// forbidden address is refused whole, so round-robin DNS cannot slip one in.
#[derive(Clone)]
pub struct GuardedResolver(pub Arc<AddressGuard>);

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if !guard.name_exempt(&host) {
                if let Some((ip, why)) = addrs.iter().find_map(|a| guard.forbidden_ip(a.ip()).map(|w| (a.ip(), w))) {
                    let err: Box<dyn std::error::Error + Send + Sync> = format!("refusing to contact {host}: resolves to {ip} ({why})").into();
                    return Err(err);
                }
            }
            let addrs: Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).expect("url")
    }

    #[test]
    fn metadata_link_local_and_loopback_are_refused() {
        let g = AddressGuard::new(&[], &[], &[]).expect("guard");
        for u in [
            "https://169.254.169.254/v2/",
            "https://127.0.0.1/v2/",
            "https://[::1]/v2/",
            "https://[fe80::1]/v2/",
            "https://[fd00:ec2::254]/v2/",
            "https://[::ffff:169.254.169.254]/v2/",
            "https://0.0.0.0/v2/",
            "http://registry.example.com/v2/",
        ] {
            assert!(matches!(g.check_url(&url(u)), Err(RegistryError::Forbidden(_))), "{u} must be refused");
        }
        assert!(g.check_url(&url("https://10.1.2.3/v2/")).is_ok(), "private registries are fine");
        assert!(g.check_url(&url("https://registry.example.com/v2/")).is_ok());
    }

    #[test]
    fn insecure_registries_are_exempt_and_plain_http() {
        let g = AddressGuard::new(&[], &[], &["127.0.0.1:5000".into(), "localhost:5001".into()]).expect("guard");
        assert!(g.check_url(&url("http://127.0.0.1:5000/v2/")).is_ok());
        assert!(g.check_url(&url("http://127.0.0.1:5002/v2/")).is_err(), "only the listed port");
        assert!(g.is_insecure("127.0.0.1:5000"));
        assert!(g.name_exempt("localhost"));
    }

    #[test]
    fn deny_and_allow_lists() {
        let g = AddressGuard::new(&["10.0.0.0/8".into(), "evil.example.com".into()], &["ghcr.io".into()], &[]).expect("guard");
        assert!(g.check_url(&url("https://10.1.2.3/v2/")).is_err());
        assert!(g.check_registry("evil.example.com").is_err());
        assert!(matches!(g.check_registry("docker.io"), Err(RegistryError::NotAllowed(_))));
        assert!(g.check_registry("ghcr.io").is_ok());
        assert!(AddressGuard::new(&["not a host".into()], &[], &[]).is_err());
    }

    #[tokio::test]
    async fn resolver_refuses_names_that_resolve_to_loopback() {
        let r = GuardedResolver(Arc::new(AddressGuard::default()));
        let name: Name = "localhost".parse().expect("name");
        let err = r.resolve(name).await.err().expect("localhost must be refused");
        assert!(err.to_string().contains("refusing to contact localhost"), "{err}");
        let exempt = GuardedResolver(Arc::new(AddressGuard::new(&[], &[], &["localhost:5000".into()]).expect("guard")));
        assert!(exempt.resolve("localhost".parse().expect("name")).await.is_ok());
    }
}
