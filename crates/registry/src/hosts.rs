//! Registry hosts in containerd's `hosts.toml` model (`config_path`, e.g.
//! `/etc/containerd/certs.d`): a directory per registry (`docker.io`, `registry.example:5000`,
//! `_default` for the others) holding a `hosts.toml`:
//!
//! ```toml
//! server = "https://registry.example"          # where the registry itself is reached
//! [host."https://mirror.example"]              # mirrors, tried first, in order
//!   capabilities = ["pull", "resolve"]
//!   ca = "/etc/certs/mirror-ca.pem"
//! ```
//!
//! As containerd does: the mirrors are tried in the order written, and a mirror is asked to
//! resolve a tag only with the `resolve` capability (`pull` is enough for a digest); a host
//! without a scheme is `https://`; capabilities are read case-insensitively; a relative `ca`
//! path is the registry folder's; a registry folder without a `hosts.toml` means that registry
//! is reached directly (not through `_default`). `server` stands for the registry: the server of
//! the registry's own `hosts.toml` is sent the image's pull credential (and Archer's identity
//! signs in there), `_default`'s and mirrors never are. What Archer cannot honour is refused when
//! the tree is read, never skipped: `skip_verify` (add the CA instead), `override_path`, client
//! certificates, headers, paths on a host. `dial_timeout` is accepted and left to the client's
//! own connect bound.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::reference::normalise_registry;

/// One mirror of a registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// `host[:port]`.
    pub host: String,
    /// May resolve a tag (else it is asked for digests only).
    pub resolve: bool,
    /// Its URL is `http://`: it must be one of the insecure registries.
    pub plain_http: bool,
}

/// One registry's hosts: its mirrors, in order, and the host standing for it (`server`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryHosts {
    pub mirrors: Vec<Mirror>,
    pub server: Option<Mirror>,
}

/// What a `hosts.toml` tree says: per registry (`_default` for every registry without its own),
/// its hosts; and the CA bundles it names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hosts {
    pub registries: BTreeMap<String, RegistryHosts>,
    pub ca_files: Vec<PathBuf>,
}

/// The registry name `_default` stands for: every registry without a directory of its own.
pub const DEFAULT: &str = "_default";

#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    #[error("reading {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0}: {1}")]
    Invalid(PathBuf, String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostsFile {
    server: Option<String>,
    capabilities: Option<Vec<String>>,
    ca: Option<OneOrMany>,
    skip_verify: Option<bool>,
    #[allow(dead_code, reason = "accepted, as containerd takes it; the client's connect bound applies")]
    dial_timeout: Option<String>,
    #[serde(default)]
    host: toml::map::Map<String, toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostEntry {
    capabilities: Option<Vec<String>>,
    ca: Option<OneOrMany>,
    skip_verify: Option<bool>,
    #[allow(dead_code, reason = "accepted, as containerd takes it; the client's connect bound applies")]
    dial_timeout: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// Read every `<dir>/<registry>/hosts.toml` under `dir`. A registry folder without one (certs
/// only) reaches its registry directly, as containerd's does.
pub fn read_dir(dir: &Path) -> Result<Hosts, HostsError> {
    let mut hosts = Hosts::default();
    let entries = std::fs::read_dir(dir).map_err(|e| HostsError::Read(dir.to_path_buf(), e))?;
    let mut names: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_dir()).collect();
    names.sort();
    for path in names {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let file = path.join("hosts.toml");
        let registry = if name == DEFAULT { DEFAULT.to_string() } else { normalise_registry(&name).ok_or_else(|| HostsError::Invalid(file.clone(), format!("{name:?} is not a registry host")))? };
        if !file.is_file() {
            hosts.registries.insert(registry, RegistryHosts::default());
            continue;
        }
        let text = std::fs::read_to_string(&file).map_err(|e| HostsError::Read(file.clone(), e))?;
        let before = hosts.ca_files.len();
        parse(&mut hosts, &registry, &text).map_err(|why| HostsError::Invalid(file.clone(), why))?;
        // A relative `ca` is the registry folder's.
        for ca in hosts.ca_files.iter_mut().skip(before) {
            if ca.is_relative() {
                *ca = path.join(&*ca);
            }
        }
    }
    Ok(hosts)
}

/// Add one registry's `hosts.toml` to `hosts`.
pub fn parse(hosts: &mut Hosts, registry: &str, text: &str) -> Result<(), String> {
    let file: HostsFile = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut own = RegistryHosts::default();
    if file.skip_verify == Some(true) {
        return Err("skip_verify is not supported: add the server's CA (ca, or registry.caFile) instead".into());
    }
    if let Some(server) = &file.server {
        let (host, plain_http) = host_of(server)?;
        if file.capabilities.as_ref().is_some_and(|c| !c.iter().any(|x| x.eq_ignore_ascii_case("pull"))) {
            return Err(format!("server {server}: without the pull capability Archer could read nothing from it"));
        }
        own.server = Some(Mirror { host, resolve: true, plain_http });
    }
    hosts.ca_files.extend(file.ca.map(OneOrMany::into_vec).unwrap_or_default().into_iter().map(PathBuf::from));
    for (url, entry) in file.host {
        let entry: HostEntry = entry.try_into().map_err(|e: toml::de::Error| format!("host {url:?}: {e}"))?;
        if entry.skip_verify == Some(true) {
            return Err(format!("host {url:?}: skip_verify is not supported: add its CA (ca) instead"));
        }
        let (host, plain_http) = host_of(&url)?;
        // containerd's default: every capability.
        let caps: Vec<String> = entry.capabilities.unwrap_or_else(|| vec!["pull".into(), "resolve".into(), "push".into()]).into_iter().map(|c| c.to_ascii_lowercase()).collect();
        if let Some(c) = caps.iter().find(|c| !["pull", "resolve", "push"].contains(&c.as_str())) {
            return Err(format!("host {url:?}: unknown capability {c:?}"));
        }
        hosts.ca_files.extend(entry.ca.map(OneOrMany::into_vec).unwrap_or_default().into_iter().map(PathBuf::from));
        if caps.iter().any(|c| c == "pull") {
            own.mirrors.push(Mirror { host, resolve: caps.iter().any(|c| c == "resolve"), plain_http });
        }
    }
    hosts.registries.insert(registry.to_string(), own);
    Ok(())
}

/// `https://host[:port]` or `http://host[:port]` (no path; no scheme is `https://`, as containerd
/// reads it): the host and whether it is plain HTTP.
fn host_of(url: &str) -> Result<(String, bool), String> {
    let full = if url.contains("://") { url.to_string() } else { format!("https://{url}") };
    let parsed = url::Url::parse(&full).map_err(|e| format!("{url:?}: {e}"))?;
    let plain_http = match parsed.scheme() {
        "https" => false,
        "http" => true,
        other => return Err(format!("{url:?}: scheme {other} (https or http)")),
    };
    if !matches!(parsed.path(), "" | "/" | "/v2" | "/v2/") || parsed.query().is_some() || !parsed.username().is_empty() {
        return Err(format!("{url:?}: a path, query or user on a host is not supported"));
    }
    let host = normalise_registry(&full).ok_or_else(|| format!("{url:?} names no host"))?;
    Ok((host, plain_http))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_in_order_with_their_capabilities_and_the_server() {
        let mut h = Hosts::default();
        let text = r#"
server = "https://registry-1.docker.io"
[host."https://mirror-b.example"]
  capabilities = ["pull", "resolve"]
[host."https://mirror-a.example:5000"]
  capabilities = ["pull"]
  ca = ["/etc/a.pem", "/etc/b.pem"]
[host."http://push-only.example"]
  capabilities = ["push"]
[host."https://all.example"]
"#;
        parse(&mut h, "docker.io", text).expect("valid");
        let m = |host: &str, resolve: bool| Mirror { host: host.into(), resolve, plain_http: false };
        assert_eq!(h.registries["docker.io"].mirrors, [m("mirror-b.example", true), m("mirror-a.example:5000", false), m("all.example", true)], "the written order, push-only left out");
        assert_eq!(h.registries["docker.io"].server, Some(m("docker.io", true)), "Docker Hub's API host, normalised");
        assert_eq!(h.ca_files, [PathBuf::from("/etc/a.pem"), PathBuf::from("/etc/b.pem")]);
    }

    #[test]
    fn scheme_less_hosts_are_https_capabilities_any_case_and_relative_cas_the_folders() {
        let mut h = Hosts::default();
        parse(&mut h, "r.example", "[host.\"mirror.example:5000\"]\n  capabilities = [\"Pull\", \"RESOLVE\"]\n  dial_timeout = \"3s\"\n").expect("valid");
        assert_eq!(h.registries["r.example"].mirrors, [Mirror { host: "mirror.example:5000".into(), resolve: true, plain_http: false }]);
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(dir.path().join("r.example")).expect("dir");
        std::fs::write(dir.path().join("r.example").join("hosts.toml"), "[host.\"https://m.example\"]\n  ca = \"mirror-ca.pem\"\n").expect("write");
        assert_eq!(read_dir(dir.path()).expect("read").ca_files, [dir.path().join("r.example").join("mirror-ca.pem")]);
    }

    #[test]
    fn what_archer_cannot_honour_is_refused() {
        for (text, says) in [
            ("server = \"https://r.example\"\nskip_verify = true\n", "skip_verify"),
            ("[host.\"https://m.example\"]\n  skip_verify = true\n", "skip_verify"),
            ("[host.\"https://m.example/prefix\"]\n", "path"),
            ("[host.\"https://m.example\"]\n  override_path = true\n", "override_path"),
            ("[host.\"https://m.example\"]\n  capabilities = [\"fetch\"]\n", "capability"),
            ("[host.\"ftp://m.example\"]\n", "scheme"),
            ("server = \"https://r.example\"\nclient = \"/c.pem\"\n", "client"),
            ("not toml", ""),
        ] {
            let err = parse(&mut Hosts::default(), "r.example", text).expect_err(text);
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn a_tree_is_read_by_registry_directory_and_default() {
        let dir = tempfile::tempdir().expect("tmp");
        for (name, text) in [("docker.io", "[host.\"https://m.example\"]\n"), ("r.example:5000", "server = \"http://127.0.0.1:5001\"\n"), ("_default", "[host.\"https://any.example\"]\n")] {
            std::fs::create_dir(dir.path().join(name)).expect("dir");
            std::fs::write(dir.path().join(name).join("hosts.toml"), text).expect("write");
        }
        std::fs::create_dir(dir.path().join("empty.example")).expect("dir");
        let h = read_dir(dir.path()).expect("read");
        assert_eq!(h.registries.keys().collect::<Vec<_>>(), ["_default", "docker.io", "empty.example", "r.example:5000"]);
        assert_eq!(h.registries["empty.example"], RegistryHosts::default(), "a folder without hosts.toml: reached directly, not through _default");
        assert_eq!(h.registries["r.example:5000"].server, Some(Mirror { host: "127.0.0.1:5001".into(), resolve: true, plain_http: true }));
        assert!(h.registries["r.example:5000"].mirrors.is_empty());
    }
}
