//! The command line: one file per subcommand.

mod catalog;
mod certs;
mod crds;
mod inspect;
mod output;
mod progress;
mod prices;
mod report;
mod serve;
mod simulate;
mod span_fields;
mod ungate;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::Config;

/// The version and the git revision it was built from (`build.rs`).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (revision ", env!("ARCHER_GIT_REVISION"), ")");

#[derive(Parser, Debug)]
#[command(name = "archer", version = VERSION, about = "Image-aware placement for mixed amd64/arm64 Kubernetes clusters")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format.
    #[arg(long, global = true, env = "ARCHER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter (tracing-subscriber syntax), e.g. `info,archer=debug`.
    #[arg(long, global = true, env = "ARCHER_LOG", default_value = "info")]
    pub log: String,
}

#[derive(Copy, Clone, Debug, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the admission webhook (HTTPS) and the admin endpoints (HTTP).
    Serve(Box<serve::ServeArgs>),
    /// Print each image's digest and platforms, through the webhook's own lookup path.
    Inspect(inspect::InspectArgs),
    /// Write a development CA and serving certificate.
    Certs(certs::CertsArgs),
    /// List the instance types and prices the catalog knows.
    Prices(prices::PricesArgs),
    /// Price catalogs: `archer catalog fetch` writes a region's prices from a cloud's price API.
    Catalog(catalog::CatalogArgs),
    /// Plan nodes for a scenario offline: the provisioner's deciding code, no cluster.
    Simulate(simulate::SimulateArgs),
    /// Report a cluster's arm64 readiness and cost (read-only): a live cluster or a dump.
    Report(report::ReportArgs),
    /// Remove the scheduling gate archer.dev/inspecting from every pod (Helm's pre-delete hook).
    Ungate(ungate::UngateArgs),
    /// Archer's CRDs: `archer crds migrate` moves objects to the names Karpenter does not share.
    Crds(crds::CrdsArgs),
}

/// Registry flags shared by every subcommand that reads images.
#[derive(Args, Debug, Clone, Default)]
pub struct RegistryArgs {
    /// Optional YAML config file (flags override it).
    #[arg(long, env = "ARCHER_CONFIG")]
    pub config: Option<PathBuf>,
    /// A registry reached over plain HTTP and exempt from the address guard (repeatable).
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]", env = "ARCHER_INSECURE_REGISTRIES", value_delimiter = ',')]
    pub insecure_registries: Vec<String>,
    /// A docker config.json with registry credentials.
    #[arg(long, env = "ARCHER_DOCKER_CONFIG")]
    pub docker_config: Option<PathBuf>,
}

impl RegistryArgs {
    /// The config file (or defaults) with these flags applied.
    pub fn load(&self) -> anyhow::Result<Config> {
        let Self { config, insecure_registries, docker_config } = self;
        let mut cfg = match config {
            Some(p) => Config::load(p)?,
            None => Config::default(),
        };
        for r in insecure_registries {
            if !cfg.registry.insecure.contains(r) {
                cfg.registry.insecure.push(r.clone());
            }
        }
        if let Some(d) = docker_config {
            cfg.registry.docker_config = Some(d.clone());
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Fields of the manifests a command read that their types do not have (with their path): each
/// a warning on standard error, or under `--strict` one error naming them all.
fn unknown_fields(strict: bool, found: &[String]) -> anyhow::Result<()> {
    if found.is_empty() {
        return Ok(());
    }
    if strict {
        anyhow::bail!("unknown fields (--strict): {}", found.join("; "));
    }
    for f in found {
        eprintln!("warning: unknown field {f}: ignored (--strict makes this an error)");
    }
    Ok(())
}

/// The allocator's purge delay in force, in milliseconds, as the binary set it (-1: never
/// purges; `i64::MIN`: not set by a binary, as in tests of the library).
pub static ALLOCATOR_PURGE_DELAY_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(i64::MIN);

/// Colour only on a terminal, and never when `NO_COLOR` is set to anything but empty
/// (no-color.org).
fn colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

fn init_tracing(format: LogFormat, filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour(std::io::IsTerminal::is_terminal(&std::io::stderr()), std::env::var_os("NO_COLOR")));
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).fmt_fields(span_fields::SpanFields).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Threads the runtime keeps for blocking work and for work moved off a worker
/// (`block_in_place`), at most (tokio's default is 512). Each thread's allocator heap holds
/// memory of its own until the thread ends: under sustained concurrent load an unbounded pool
/// grew to a hundred threads and held hundreds of MiB (`tests/sustained_load.rs`). Past the
/// bound, blocking work waits for a thread.
const MAX_BLOCKING_THREADS: usize = 16;

pub fn main(cli: Cli) -> ExitCode {
    let Cli { command, log_format, log } = cli;
    init_tracing(log_format, &log);
    if rustls::crypto::ring::default_provider().install_default().is_err() {
        eprintln!("error: a rustls crypto provider was already installed");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().max_blocking_threads(MAX_BLOCKING_THREADS).build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match command {
            Command::Serve(a) => serve::run(*a).await,
            Command::Inspect(a) => inspect::run(a).await,
            Command::Certs(a) => certs::run(a),
            Command::Prices(a) => prices::run(a).await,
            Command::Catalog(a) => catalog::run(a).await,
            Command::Simulate(a) => simulate::run(a).await,
            Command::Report(a) => report::run(a).await,
            Command::Ungate(a) => ungate::run(a).await,
            Command::Crds(a) => crds::run(a).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes, `: `-joined, each cause said once: an error whose message already
/// ends with its source's (`NodePool a: requirement on k: unknown operator`) is not followed by
/// that source again. A cause that merely appears somewhere earlier (`denied` inside an image
/// name) is kept.
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || out == text || out.ends_with(&format!(": {text}")) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Build the shared registry lookup path from a config.
pub fn inspector(cfg: &Config, metrics: std::sync::Arc<archer_registry::metrics::RegistryMetrics>, budget: archer_limits::MemoryBudget) -> anyhow::Result<archer_registry::Inspector> {
    let client = archer_registry::RegistryClient::new(client_settings(cfg, budget)?)
        .map_err(anyhow::Error::msg)?
        .count_requests_in(metrics.registry_requests.clone());
    let inspector = archer_registry::Inspector::new(client, &cache_settings(cfg), metrics);
    Ok(with_identities(inspector, cfg))
}

/// The inspector signing in to the clouds' private registries with Archer's own identity (each
/// cloud's only when built with its feature).
fn with_identities(inspector: archer_registry::Inspector, cfg: &Config) -> archer_registry::Inspector {
    with_acr(with_ecr(inspector, cfg), cfg)
}

#[cfg(feature = "aws")]
fn with_ecr(inspector: archer_registry::Inspector, cfg: &Config) -> archer_registry::Inspector {
    if !cfg.registry.ecr.enabled {
        return inspector;
    }
    inspector.with_identity(std::sync::Arc::new(archer_cloud_aws::ecr::Ecr::from_chain(cfg.registry.ecr.endpoint.clone())))
}

#[cfg(not(feature = "aws"))]
fn with_ecr(inspector: archer_registry::Inspector, cfg: &Config) -> archer_registry::Inspector {
    if cfg.registry.ecr.enabled {
        tracing::debug!("built without the aws feature: private ECR images are read with pull secrets only");
    }
    inspector
}

#[cfg(feature = "azure")]
fn with_acr(inspector: archer_registry::Inspector, cfg: &Config) -> archer_registry::Inspector {
    let a = &cfg.registry.acr;
    if !a.enabled {
        return inspector;
    }
    let settings = crate::config::AzureConfig { tenant_id: a.tenant_id.clone(), client_id: a.client_id.clone(), federated_token_file: a.federated_token_file.clone(), authority_host: a.authority_host.clone(), ..Default::default() };
    inspector.with_identity(std::sync::Arc::new(archer_cloud_azure::acr::Acr::from_workload_identity(&settings)))
}

#[cfg(not(feature = "azure"))]
fn with_acr(inspector: archer_registry::Inspector, cfg: &Config) -> archer_registry::Inspector {
    if cfg.registry.acr.enabled {
        tracing::debug!("built without the azure feature: private ACR images are read with pull secrets only");
    }
    inspector
}

/// The registry client's settings from the config's `registry` section; its reads draw from
/// `budget` (the config builds no registry type).
pub fn client_settings(cfg: &Config, budget: archer_limits::MemoryBudget) -> anyhow::Result<archer_registry::ClientSettings> {
    let r = &cfg.registry;
    let extra_ca_pem = match &r.ca_file {
        Some(p) => Some(std::fs::read(p).with_context(|| format!("reading registry.caFile {}", p.display()))?),
        None => None,
    };
    let guard = archer_registry::AddressGuard::new(&r.deny, &r.allow, &r.insecure).map_err(|e| anyhow::anyhow!("registry: {e}"))?;
    let (hosts, extra_ca_pem) = registry_hosts(r, &guard, extra_ca_pem)?;
    Ok(archer_registry::ClientSettings {
        guard: std::sync::Arc::new(guard),
        hosts,
        max_body_bytes: r.max_manifest_bytes,
        connect_timeout: std::time::Duration::from_secs_f64(r.timeout_seconds.min(2.0)),
        extra_ca_pem,
        budget,
    })
}

/// Each registry's hosts, and the CA bundle with the hosts tree's CA files added.
type HostsAndCa = (std::collections::BTreeMap<String, archer_registry::hosts::RegistryHosts>, Option<Vec<u8>>);

/// Each registry's mirrors and server: `registry.mirrors`, then a `hosts.toml` tree's
/// (`registry.hostsDir`), whose CA files join the trusted bundle. A plain-HTTP host must be one
/// of `registry.insecure`, and an `https://` one must not be (the client reaches those over HTTP).
fn registry_hosts(r: &crate::config::RegistryConfig, guard: &archer_registry::AddressGuard, mut ca: Option<Vec<u8>>) -> anyhow::Result<HostsAndCa> {
    use archer_registry::hosts::{Mirror, RegistryHosts};
    let mut hosts: std::collections::BTreeMap<String, RegistryHosts> = std::collections::BTreeMap::new();
    for (registry, mirrors) in &r.mirrors {
        let key = archer_registry::reference::normalise_registry(registry).unwrap_or_else(|| registry.clone());
        let entry = hosts.entry(key).or_default();
        entry.mirrors.extend(mirrors.iter().map(|m| Mirror { host: archer_registry::reference::normalise_registry(m).unwrap_or_else(|| m.clone()), resolve: true, plain_http: guard.is_insecure(m) }));
    }
    if let Some(dir) = &r.hosts_dir {
        let read = archer_registry::hosts::read_dir(dir).with_context(|| format!("registry.hostsDir {}", dir.display()))?;
        for (registry, h) in read.registries {
            for m in h.mirrors.iter().chain(&h.server) {
                match (m.plain_http, guard.is_insecure(&m.host)) {
                    (true, false) => anyhow::bail!("registry.hostsDir: {registry} names http://{}: list it in registry.insecure to reach it over plain HTTP", m.host),
                    (false, true) => anyhow::bail!("registry.hostsDir: {registry} names https://{}, which registry.insecure reaches over plain HTTP", m.host),
                    _ => {}
                }
            }
            let entry = hosts.entry(registry).or_default();
            entry.mirrors.extend(h.mirrors);
            entry.server = h.server;
        }
        for f in read.ca_files {
            let pem = std::fs::read(&f).with_context(|| format!("registry.hostsDir: reading CA {}", f.display()))?;
            let bundle = ca.get_or_insert_with(Vec::new);
            bundle.push(b'\n');
            bundle.extend(pem);
        }
    }
    Ok((hosts, ca))
}

/// The image cache's settings from the config's `registry` section.
pub fn cache_settings(cfg: &Config) -> archer_registry::CacheSettings {
    let r = &cfg.registry;
    let secs = std::time::Duration::from_secs_f64;
    archer_registry::CacheSettings {
        capacity: r.cache_capacity,
        max_bytes: r.cache_max_bytes,
        failure_max_bytes: r.failure_cache_max_bytes,
        failure_ttl: secs(r.failure_cache_ttl_seconds),
        timeout_ttl: secs(r.timeout_cache_ttl_seconds),
        tag_ttl: std::time::Duration::from_secs(r.tag_cache_ttl_seconds),
        lookup_timeout: secs(r.timeout_seconds),
        per_pod_concurrency: r.max_concurrent_lookups_per_pod,
        per_pod_bytes: r.max_bytes_per_pod,
    }
}

/// Credentials from the configured docker config file, if any.
pub fn base_keyring(cfg: &Config) -> anyhow::Result<archer_registry::Keyring> {
    match &cfg.registry.docker_config {
        Some(p) => {
            let bytes = std::fs::read(p).map_err(|e| anyhow::anyhow!("reading docker config {}: {e}", p.display()))?;
            let mounted = archer_registry::Keyring::parse(&bytes).map_err(|e| anyhow::anyhow!("docker config {}: {e}", p.display()))?;
            // The fallback wherever it is used: Archer's own cloud identity comes before it.
            Ok(archer_registry::Keyring::default().with_fallback(mounted))
        }
        None => Ok(archer_registry::Keyring::default()),
    }
}

/// A client from `kubeconfig`, else in-cluster credentials or the default kubeconfig; `None` when
/// there is no cluster to talk to.
pub(super) async fn connect(kubeconfig: Option<&PathBuf>) -> anyhow::Result<Option<kube::Client>> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => match kube::Config::infer().await {
            Ok(c) => c,
            Err(e) => {
                tracing::info!(reason = %e, "no cluster configured: running standalone on the cluster defaults");
                return Ok(None);
            }
        },
    };
    Ok(Some(kube::Client::try_from(config).context("building the Kubernetes client")?))
}

/// The listeners' limits from the config's plain settings (the config builds no server type).
pub fn connection_limits(cfg: &crate::config::Config, metrics: std::sync::Arc<crate::server::metrics::ServerMetrics>) -> crate::server::ConnectionLimits {
    let s = cfg.connection_settings();
    crate::server::ConnectionLimits { max_connections: s.max_connections, handshake_timeout: s.handshake_timeout, header_read_timeout: s.header_read_timeout, idle_timeout: s.idle_timeout, grace: s.grace, metrics }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_chain_says_each_cause_once() {
        let inner = anyhow::anyhow!("unknown operator \"Inn\"");
        let quoted = inner.context("requirement on kubernetes.io/arch: unknown operator \"Inn\"").context("NodePool default");
        assert_eq!(error_chain(&quoted), "NodePool default: requirement on kubernetes.io/arch: unknown operator \"Inn\"");
        let plain = anyhow::anyhow!("connection refused").context("reading 127.0.0.1:5000/a").context("inspecting a");
        assert_eq!(error_chain(&plain), "inspecting a: reading 127.0.0.1:5000/a: connection refused");
        let elsewhere = anyhow::anyhow!("denied").context("reading registry.example.com/denied/app:1");
        assert_eq!(error_chain(&elsewhere), "reading registry.example.com/denied/app:1: denied", "a cause quoted elsewhere, not at the end, is kept");
    }

    #[test]
    fn colour_only_on_a_terminal_and_not_with_no_color() {
        assert!(colour(true, None));
        assert!(!colour(false, None), "piped");
        assert!(!colour(true, Some("1".into())));
        assert!(colour(true, Some("".into())), "NO_COLOR set but empty does not count (no-color.org)");
    }

    /// The registry section becomes the client's and cache's own settings here, not in the config.
    #[test]
    fn the_registry_section_becomes_the_clients_settings() {
        let cfg: Config = archer_core::yaml::from_str("registry:\n  insecure: [\"127.0.0.1:5000\"]\n  timeoutSeconds: 1.5\n  caFile: /nonexistent/ca.pem\n").expect("config");
        let err = client_settings(&cfg, archer_limits::MemoryBudget::unlimited()).map(|_| ()).expect_err("unreadable caFile");
        assert!(format!("{err:#}").contains("registry.caFile /nonexistent/ca.pem"), "{err:#}");
        let cfg = Config { registry: crate::config::RegistryConfig { ca_file: None, ..cfg.registry }, ..cfg };
        assert!(client_settings(&cfg, archer_limits::MemoryBudget::unlimited()).expect("client").guard.is_insecure("127.0.0.1:5000"));
        assert_eq!(cache_settings(&cfg).lookup_timeout, std::time::Duration::from_millis(1500));
    }
}
