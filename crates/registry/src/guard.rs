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

pub(crate) const MAX_REDIRECTS: usize = 3;
/// Cloud metadata and host-agent addresses outside the link-local ranges (which are refused
/// whole): AWS IMDS over IPv6, GCP's IPv6 metadata server, Alibaba Cloud's metadata server,
/// Azure's wire server (168.63.129.16, which also answers instance metadata and health probes)
/// and Oracle Cloud's legacy metadata address.
const METADATA_ADDRESSES: [IpAddr; 5] = [
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V6(Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V4(std::net::Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V4(std::net::Ipv4Addr::new(168, 63, 129, 16)),
    IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 0, 192)),
];

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

    /// Is `registry` (as an image reference names it: host, or host:port) listed as insecure?
    /// Exactly: an entry with a port covers that port only, one without covers no other port.
    pub fn is_insecure(&self, registry: &str) -> bool {
        self.insecure.contains(registry)
    }

    /// Does `url` address an insecure registry's exact host:port? A URL without a port uses its
    /// scheme's default, which only an entry without a port names.
    pub(crate) fn is_insecure_url(&self, url: &Url) -> bool {
        let host = match url.host() {
            Some(Host::Ipv6(v6)) => format!("[{v6}]"),
            Some(h) => h.to_string(),
            None => return false,
        };
        match url.port() {
            Some(p) => self.insecure.contains(&format!("{host}:{p}")),
            None => self.insecure.contains(&host),
        }
    }

    /// May Archer ask this registry (by name) at all?
    pub(crate) fn check_registry(&self, registry: &str) -> Result<(), RegistryError> {
        if self.deny_registries.contains(registry) || self.deny_registries.contains(host_of(registry)) {
            return Err(RegistryError::Forbidden(format!("{registry} (on the deny list)")));
        }
        if !self.allow_registries.is_empty() && !self.allow_registries.contains(registry) && !self.is_insecure(registry) {
            return Err(RegistryError::NotAllowed(registry.to_string()));
        }
        Ok(())
    }

    /// Reason an address is refused, if it is.
    fn forbidden_ip(&self, ip: IpAddr) -> Option<&'static str> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        let builtin = match ip {
            IpAddr::V4(v4) if v4.is_loopback() => Some("loopback"),
            IpAddr::V4(v4) if v4.is_link_local() => Some("link-local/metadata"),
            IpAddr::V4(v4) if v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast() => Some("not a unicast address"),
            IpAddr::V6(v6) if v6.is_loopback() => Some("loopback"),
            ip if METADATA_ADDRESSES.contains(&ip) => Some("cloud metadata"),
            IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => Some("link-local"),
            IpAddr::V6(v6) if v6.is_unspecified() || v6.is_multicast() => Some("not a unicast address"),
            _ => None,
        };
        builtin.or_else(|| self.deny_networks.iter().any(|n| n.contains(&ip)).then_some("on the deny list"))
    }

    /// Check a URL before it is requested (first request, token realm, every redirect).
    /// IP literals are checked here; names are checked by [`GuardedResolver`] after resolution.
    pub(crate) fn check_url(&self, url: &Url) -> Result<(), RegistryError> {
        let host_port = match (url.host_str(), url.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            (None, _) => return Err(RegistryError::Forbidden(format!("{url} (no host)"))),
        };
        if self.is_insecure_url(url) {
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

    /// A name some insecure registry is listed under (at one port or the default one).
    pub(crate) fn name_exempt(&self, name: &str) -> bool {
        self.insecure.iter().any(|i| host_of(i).trim_start_matches('[').trim_end_matches(']') == name.trim_start_matches('[').trim_end_matches(']'))
    }
}

fn host_of(registry: &str) -> &str {
    if registry.starts_with('[') {
        return registry.split(']').next().map(|h| h.trim_start_matches('[')).unwrap_or(registry);
    }
    registry.rsplit_once(':').map_or(registry, |(h, _)| h)
}

/// DNS resolution that refuses names resolving to forbidden addresses. A name with any
/// forbidden address is refused whole, so round-robin DNS cannot slip one in. A resolver
/// sees no port, so the one that exempts insecure registries' names (`exempt_insecure`) serves
/// only requests to their exact host:port (see `RegistryClient`).
#[derive(Clone)]
pub(crate) struct GuardedResolver {
    pub guard: Arc<AddressGuard>,
    pub exempt_insecure: bool,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = self.guard.clone();
        let exempt_insecure = self.exempt_insecure;
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if !(exempt_insecure && guard.name_exempt(&host)) {
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
            "https://100.100.100.200/v2/",
            "https://168.63.129.16/v2/",
            "https://192.0.0.192/v2/",
            "https://[fd20:ce::254]/v2/",
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
    fn an_insecure_entry_covers_exactly_its_host_and_port() {
        let g = AddressGuard::new(&[], &[], &["localhost:5000".into(), "plain.example".into()]).expect("guard");
        // The listed host:port only; no other port of the host, and not the host's default port.
        assert!(g.is_insecure("localhost:5000"));
        assert!(!g.is_insecure("localhost:6000") && !g.is_insecure("localhost"));
        assert!(g.is_insecure_url(&url("http://localhost:5000/v2/")));
        for other in ["https://localhost:6000/v2/", "https://localhost/v2/", "http://localhost/v2/", "http://localhost:6000/v2/"] {
            assert!(!g.is_insecure_url(&url(other)), "{other}");
        }
        // An entry without a port covers the scheme's default port only.
        assert!(g.is_insecure_url(&url("http://plain.example/v2/")) && g.is_insecure_url(&url("http://plain.example:80/v2/")));
        assert!(!g.is_insecure_url(&url("http://plain.example:8080/v2/")));
        assert!(g.check_url(&url("http://plain.example:8080/v2/")).is_err(), "plain HTTP to an unlisted port");
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
        let r = GuardedResolver { guard: Arc::new(AddressGuard::default()), exempt_insecure: true };
        let name: Name = "localhost".parse().expect("name");
        let err = r.resolve(name).await.err().expect("localhost must be refused");
        assert!(err.to_string().contains("refusing to contact localhost"), "{err}");
        let guard = Arc::new(AddressGuard::new(&[], &[], &["localhost:5000".into()]).expect("guard"));
        let exempt = GuardedResolver { guard: guard.clone(), exempt_insecure: true };
        assert!(exempt.resolve("localhost".parse().expect("name")).await.is_ok());
        // The client for every other URL never exempts the name.
        let strict = GuardedResolver { guard, exempt_insecure: false };
        assert!(strict.resolve("localhost".parse().expect("name")).await.is_err());
    }
}
