use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::routing::get;
use clap::Args;

use super::RegistryArgs;
use crate::cluster::picture::Picture;
use crate::cluster::ClusterView;
use crate::extender::{self, Extender};
use crate::metrics::Metrics;
use crate::server::managed_tls::{plan::Lifetimes, ManagedTls};
use crate::server::{self, admin, tls::CertStore};
use crate::webhook::{self, Webhook};

/// How often a cache that has not synced is reported (a warning, and /readyz's reason).
const SYNC_REPORT_INTERVAL: Duration = Duration::from_secs(15);

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// HTTPS listen address for /mutate (default 0.0.0.0:8443).
    #[arg(long, env = "ARCHER_LISTEN")]
    pub listen: Option<String>,
    /// Plain-HTTP listen address for /healthz, /readyz, /metrics (default 0.0.0.0:8080).
    #[arg(long, env = "ARCHER_ADMIN_LISTEN")]
    pub admin_listen: Option<String>,
    /// PEM serving certificate (chain); re-read when it changes on disk.
    #[arg(long, env = "ARCHER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the serving certificate.
    #[arg(long, env = "ARCHER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Manage the serving certificate in this Secret of Archer's namespace instead of reading
    /// files: made and rotated by Archer, its CA published in --webhook-configuration.
    #[arg(long, env = "ARCHER_TLS_SECRET", conflicts_with_all = ["tls_cert", "tls_key"], requires_all = ["webhook_configuration", "tls_service"])]
    pub tls_secret: Option<String>,
    /// The MutatingWebhookConfiguration whose caBundle the managed certificate's CA goes into.
    #[arg(long, env = "ARCHER_WEBHOOK_CONFIGURATION", requires = "tls_secret")]
    pub webhook_configuration: Option<String>,
    /// The Service the managed certificate is for (its names in Archer's namespace:
    /// NAME.NAMESPACE.svc and NAME.NAMESPACE.svc.cluster.local).
    #[arg(long, env = "ARCHER_TLS_SERVICE", requires = "tls_secret")]
    pub tls_service: Option<String>,
    /// Kubeconfig to use; without it, in-cluster credentials or the default kubeconfig are tried,
    /// and with none of those Archer runs standalone on the cluster defaults.
    #[arg(long, env = "ARCHER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Archer's own namespace (never mutated).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// A user price catalog (YAML or CSV) on top of the embedded one.
    #[arg(long, env = "ARCHER_CATALOG")]
    pub catalog: Option<PathBuf>,
    /// Also serve /scheduler/* over plain HTTP on this loopback address (co-located scheduler).
    #[arg(long, env = "ARCHER_EXTENDER_LISTEN")]
    pub extender_listen: Option<String>,
    /// Run the provisioning worker with this cloud provider: `none` (off), `kwok`, `aws` or `azure`.
    /// Only the replica holding the provisioner Lease provisions.
    #[arg(long, env = "ARCHER_CLOUD_PROVIDER")]
    pub cloud_provider: Option<String>,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    server::install_hook();
    let purge_delay_ms = super::ALLOCATOR_PURGE_DELAY_MS.load(std::sync::atomic::Ordering::Relaxed);
    tracing::info!(purge_delay_ms, "allocator returns freed memory after purge_delay_ms (MIMALLOC_PURGE_DELAY overrides)");
    let kubeconfig = args.kubeconfig.clone();
    let (cfg, tls) = configure(args)?;

    let budget = cfg.memory_budget();
    let mut metrics = Metrics::new();
    budget.register(metrics.registry_mut());
    let metrics = Arc::new(metrics);
    let health = Arc::new(admin::Health::default());
    health.set_not_ready("starting");
    let store = match &tls {
        Tls::Files { cert, key } => CertStore::load(cert, key)?,
        Tls::Managed { .. } => CertStore::placeholder()?,
    };
    let inspector = super::inspector(&cfg, metrics.registry.clone(), budget.clone())?;
    let (cluster, watch) = match super::connect(kubeconfig.as_ref()).await? {
        Some(client) => {
            let (view, watch) = ClusterView::start(client, cfg.safety_net.enabled.then_some((cfg.namespace.as_str(), cfg.safety_net.config_map.as_str())));
            (Some(view), Some(watch))
        }
        None => (None, None),
    };
    let base_keyring = super::base_keyring(&cfg)?;
    // The one place the cluster state is built (the provisioner's caches attach to it).
    let catalog = Arc::new(archer_core::catalog::Catalog::with_user_file(cfg.catalog.as_deref())?);
    let picture = cluster.clone().map(|view| Picture::new(view, cfg.defaults.clone(), catalog.clone()));
    let parts = Parts { cfg: &cfg, budget: &budget, inspector: &inspector, cluster: cluster.as_ref(), picture: picture.as_ref(), base_keyring: &base_keyring, metrics: &metrics };
    let cluster_for_safety = cluster.clone();
    let provisioning = provisioner_task(&cfg, picture.as_ref(), catalog.clone(), inspector.clone(), base_keyring.clone(), metrics.provisioner.clone())?;
    let extender_router = extender::router(parts.extender(catalog.clone()));
    let router = webhook::router(parts.webhook()).merge(extender_router.clone()).route("/healthz", get(|| async { "ok" }));

    let (trigger, shutdown) = server::shutdown_channel();
    let mut servers = Servers::start(&cfg, &store, router, extender_router, admin::router(health.clone(), metrics.clone()), shutdown, super::connection_limits(&cfg, metrics.server.clone())).await?;
    tracing::info!(standalone = cluster.is_none(), "serving");
    let (cert_ready, cert_wait) = tokio::sync::watch::channel(false);
    let reload = match tls {
        Tls::Files { .. } => {
            cert_ready.send_replace(true);
            tokio::spawn(store.clone().watch(Duration::from_secs(cfg.tls_reload_interval_seconds.max(1)), metrics.server.clone()))
        }
        Tls::Managed { secret, webhook, service } => {
            let client = cluster.as_ref().map(|c| c.client().clone()).context("--tls-secret needs a cluster (no kubeconfig or in-cluster credentials found)")?;
            let managed = ManagedTls::new(client, &cfg.namespace, &secret, &webhook, &service, MANAGED_LIFETIMES, Duration::from_secs(cfg.tls_reload_interval_seconds.max(1)), store.clone(), metrics.server.clone());
            tokio::spawn(managed.run(cert_ready))
        }
    };
    let ready = tokio::spawn(become_ready(cluster, cert_wait, health.clone()));
    // The namespace watch runs for the life of the process; if it ever ends, so does Archer.
    let mut watch = tokio::spawn(async move {
        match watch {
            Some(w) => w.await,
            None => std::future::pending().await,
        }
    });
    let mut provisioning = tokio::spawn(provisioning);
    let mut savings = tokio::spawn(savings_task(&cfg, cluster_for_safety.clone(), catalog.clone(), inspector.clone(), base_keyring.clone(), metrics.provisioner.cost.clone()));
    let mut safety = tokio::spawn(safety_task(&cfg, cluster_for_safety, inspector.clone(), base_keyring.clone(), metrics.safety.clone()));
    let outcome = tokio::select! {
        _ = terminate_signal() => {
            tracing::info!("shutdown signal received; draining");
            Ok(ExitCode::SUCCESS)
        }
        r = servers.ended() => Err(r),
        r = &mut watch => Err(anyhow::anyhow!("namespace watch stopped unexpectedly: {r:?}")),
        r = &mut provisioning => Err(anyhow::anyhow!("provisioner stopped unexpectedly: {r:?}")),
        r = &mut safety => Err(anyhow::anyhow!("the safety net stopped unexpectedly: {r:?}")),
        r = &mut savings => Err(anyhow::anyhow!("the savings reporter stopped unexpectedly: {r:?}")),
    };
    provisioning.abort();
    savings.abort();
    safety.abort();
    health.set_not_ready("shutting down");
    if outcome.is_ok() {
        // Keep accepting while the endpoints update spreads: the API server and kube-scheduler
        // still send here for a moment, and a refused connection admits a pod unpatched.
        let delay = Duration::from_secs_f64(cfg.shutdown_delay_seconds);
        tracing::info!(?delay, "not ready; still serving until the delay ends");
        tokio::time::sleep(delay).await;
    }
    trigger.trigger();
    ready.abort();
    reload.abort();
    watch.abort();
    servers.finish(Duration::from_secs(cfg.shutdown_grace_seconds)).await;
    tracing::info!("stopped");
    outcome
}

/// How long the managed certificate's CA and serving certificates are valid (each renewed with a
/// third of its life left).
const MANAGED_LIFETIMES: Lifetimes = Lifetimes { ca: time::Duration::days(3650), cert: time::Duration::days(365) };

/// Where the serving certificate comes from.
enum Tls {
    /// PEM files, re-read when they change.
    Files { cert: PathBuf, key: PathBuf },
    /// A Secret Archer keeps ([`crate::server::managed_tls`]).
    Managed { secret: String, webhook: String, service: String },
}

/// The config file with the command line's flags over it, validated, and where the serving
/// certificate comes from.
fn configure(args: ServeArgs) -> anyhow::Result<(crate::config::Config, Tls)> {
    let ServeArgs { registry, listen, admin_listen, tls_cert, tls_key, tls_secret, webhook_configuration, tls_service, kubeconfig: _, namespace, catalog, extender_listen, cloud_provider } = args;
    let mut cfg = registry.load()?;
    if let Some(p) = cloud_provider {
        cfg.provisioner.cloud_provider = p;
    }
    if let Some(c) = catalog {
        cfg.catalog = Some(c);
    }
    if let Some(l) = extender_listen {
        cfg.extender.listen = Some(l);
    }
    cfg.validate()?;
    if let Some(l) = listen {
        cfg.listen = l;
    }
    if let Some(l) = admin_listen {
        cfg.admin_listen = l;
    }
    if let Some(ns) = namespace {
        cfg.namespace = ns;
    }
    if let (Some(secret), Some(webhook), Some(service)) = (tls_secret, webhook_configuration, tls_service) {
        return Ok((cfg, Tls::Managed { secret, webhook, service }));
    }
    let cert = tls_cert.or(cfg.tls_cert.clone()).context("--tls-cert is required (or tlsCert in the config file, or --tls-secret)")?;
    let key = tls_key.or(cfg.tls_key.clone()).context("--tls-key is required (or tlsKey in the config file)")?;
    Ok((cfg, Tls::Files { cert, key }))
}

/// What the webhook and the extender are built from.
struct Parts<'a> {
    cfg: &'a crate::config::Config,
    budget: &'a archer_limits::MemoryBudget,
    inspector: &'a archer_registry::Inspector,
    cluster: Option<&'a ClusterView>,
    picture: Option<&'a Picture>,
    base_keyring: &'a archer_registry::Keyring,
    metrics: &'a Arc<Metrics>,
}

impl Parts<'_> {
    fn webhook(&self) -> Arc<Webhook> {
        let cfg = self.cfg;
        Arc::new(Webhook {
            defaults: cfg.defaults.clone(),
            excluded_namespaces: cfg.excluded(),
            settings: cfg.placement_settings(),
            inspector: self.inspector.clone(),
            cluster: self.cluster.cloned(),
            base_keyring: self.base_keyring.clone(),
            metrics: self.metrics.webhook.clone(),
            body: body_limits(cfg, self.budget, cfg.webhook.max_body_bytes, WEBHOOK_EXPANSION, "webhook_body"),
            decision_timeout: Duration::from_secs_f64(cfg.webhook.decision_timeout_seconds),
            memo: {
                let memo = cfg.memo_settings();
                webhook::DecisionMemo::new(memo.max_bytes, memo.per_namespace, memo.ttl, self.metrics.webhook.admission_memo_displaced.clone())
            },
            gate: (cfg.safety_net.enabled && self.cluster.is_some()).then(|| Duration::from_secs_f64(cfg.safety_net.gate_max_seconds)),
        })
    }

    fn extender(&self, catalog: Arc<archer_core::catalog::Catalog>) -> Arc<Extender> {
        let cfg = self.cfg;
        Arc::new(Extender {
            catalog,
            inspector: self.inspector.clone(),
            nodes: self.cluster.map(|c| c.nodes()),
            cluster: self.cluster.cloned(),
            picture: self.picture.cloned(),
            defaults: cfg.defaults.clone(),
            base_keyring: self.base_keyring.clone(),
            metrics: self.metrics.extender.clone(),
            inspection_timeout: Duration::from_secs_f64(cfg.extender.inspection_timeout_seconds),
            preference_bonus: cfg.extender.preference_bonus,
            body: body_limits(cfg, self.budget, cfg.extender.max_body_bytes, EXTENDER_EXPANSION, "extender_body"),
            max_price_per_hour: cfg.extender.max_price_per_hour,
            facts: Default::default(),
            held: Default::default(),
        })
    }
}

/// The listeners: HTTPS (/mutate, /scheduler/*), admin (/healthz, /readyz, /metrics) and, when
/// configured, the extender over plain HTTP on loopback.
struct Servers {
    https: tokio::task::JoinHandle<()>,
    admin: tokio::task::JoinHandle<()>,
    extender: tokio::task::JoinHandle<()>,
}

impl Servers {
    async fn start(cfg: &crate::config::Config, store: &Arc<CertStore>, router: axum::Router, extender_router: axum::Router, admin_router: axum::Router, shutdown: server::Shutdown, limits: server::ConnectionLimits) -> anyhow::Result<Servers> {
        let extender_http = match &cfg.extender.listen {
            Some(addr) => Some(server::bind(addr).await?),
            None => None,
        };
        let (https_listener, https_addr) = server::bind(&cfg.listen).await?;
        let (admin_listener, admin_addr) = server::bind(&cfg.admin_listen).await?;
        tracing::info!(%https_addr, %admin_addr, "listening");
        let https = tokio::spawn(server::serve_https(https_listener, store.server_config(), router, shutdown.clone(), limits.clone()));
        let admin = tokio::spawn(server::serve_http(admin_listener, admin_router, shutdown.clone(), limits.clone()));
        let extender = tokio::spawn(async move {
            match extender_http {
                Some((listener, addr)) => {
                    tracing::info!(%addr, "serving /scheduler/* over plain HTTP on loopback");
                    server::serve_http(listener, extender_router, shutdown, limits).await
                }
                None => shutdown.wait().await,
            }
        });
        Ok(Servers { https, admin, extender })
    }

    /// Resolves when a server stops on its own (it never should), saying which.
    async fn ended(&mut self) -> anyhow::Error {
        tokio::select! {
            r = &mut self.https => anyhow::anyhow!("HTTPS server stopped unexpectedly: {r:?}"),
            r = &mut self.admin => anyhow::anyhow!("admin server stopped unexpectedly: {r:?}"),
            r = &mut self.extender => anyhow::anyhow!("extender HTTP server stopped unexpectedly: {r:?}"),
        }
    }

    /// After shutdown was triggered: let open requests finish within `grace`.
    async fn finish(mut self, grace: Duration) {
        let _ = tokio::time::timeout(grace + Duration::from_secs(1), async {
            let _ = (&mut self.https).await;
            let _ = (&mut self.admin).await;
            let _ = (&mut self.extender).await;
        })
        .await;
    }
}

/// Ready once the serving certificate is the real one and the namespace and node caches have
/// synced (at once when standalone). While they have not, /readyz and a warning say which.
async fn become_ready(cluster: Option<ClusterView>, mut cert: tokio::sync::watch::Receiver<bool>, health: Arc<admin::Health>) {
    while tokio::time::timeout(SYNC_REPORT_INTERVAL, cert.wait_for(|ready| *ready)).await.is_err() {
        health.set_not_ready("waiting for the managed webhook certificate");
        tracing::warn!("the managed webhook certificate is not served yet; not ready");
    }
    if let Some(view) = &cluster {
        while tokio::time::timeout(SYNC_REPORT_INTERVAL, view.wait_ready()).await.is_err() {
            let waiting = view.unsynced();
            health.set_not_ready(&format!("waiting for the first list of {}", waiting.join(", ")));
            tracing::warn!(?waiting, "caches not synced yet; not ready");
        }
    }
    health.set_ready();
    tracing::info!("ready");
}

/// What a review's body costs the budget: the body and the filtered view parsed from it (the
/// decoded pod's own cost is reserved separately once its size is known).
const WEBHOOK_EXPANSION: usize = 3;
/// What an extender call's body costs: the body, the node list parsed from it, and the answer
/// that echoes the kept nodes.
const EXTENDER_EXPANSION: usize = 3;

fn body_limits(cfg: &crate::config::Config, budget: &archer_limits::MemoryBudget, max_bytes: usize, expansion: usize, consumer: &'static str) -> crate::server::body::BodyLimits {
    crate::server::body::BodyLimits {
        max_bytes,
        expansion,
        read_timeout: Duration::from_secs_f64(cfg.limits.body_read_timeout_seconds),
        budget_wait: Duration::from_secs_f64(cfg.limits.budget_wait_seconds),
        budget: budget.clone(),
        consumer,
    }
}

/// The provisioning worker under leader election, or a future that never ends when it is off.
fn provisioner_task(
    cfg: &crate::config::Config,
    picture: Option<&Picture>,
    catalog: Arc<archer_core::catalog::Catalog>,
    inspector: archer_registry::Inspector,
    base_keyring: archer_registry::Keyring,
    metrics: Arc<crate::provisioner::metrics::ProvisionerMetrics>,
) -> anyhow::Result<std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>>> {
    let settings = cfg.provisioner.clone();
    if !settings.enabled() {
        return Ok(Box::pin(std::future::pending()));
    }
    let Some(picture) = picture.cloned() else {
        anyhow::bail!("--cloud-provider {} needs a cluster (no kubeconfig or in-cluster credentials found)", settings.cloud_provider);
    };
    let client = picture.view().client().clone();
    let namespace = cfg.namespace.clone();
    let lease_client = client.clone();
    Ok(Box::pin(async move {
        let provider: Arc<dyn archer_cloud::CloudProvider> = match settings.cloud_provider.as_str() {
            "kwok" => Arc::new(archer_cloud_kwok::Kwok::new(client.clone(), catalog.clone(), settings.zones.clone())),
            #[cfg(feature = "aws")]
            "aws" => {
                use archer_cloud_aws as aws;
                let sdk = aws::sdk_config(&settings.aws).await;
                let provider = Arc::new(aws::Aws::new(&sdk, catalog.clone(), settings.aws.clone()).await?);
                provider.refresh_classes(&client).await;
                tracing::info!(region = provider.region(), cluster = %settings.aws.cluster_name, offerings = provider.book().all().len(), prices = provider.book().price_status().source, "AWS provider ready");
                tokio::spawn(provider.clone().run(client.clone()));
                provider
            }
            #[cfg(not(feature = "aws"))]
            "aws" => anyhow::bail!("cloudProvider aws: this archer was built without the aws feature (cargo build --features aws)"),
            #[cfg(feature = "azure")]
            "azure" => {
                let provider = Arc::new(archer_cloud_azure::Azure::new(settings.azure.clone(), catalog.clone(), client.clone())?);
                provider.start_prices().await?;
                provider.refresh_classes().await;
                tracing::info!(location = %settings.azure.location, resource_group = %settings.azure.resource_group, cluster = %settings.azure.cluster_name, offerings = provider.all_offerings().len(), prices = provider.price_status().source, "Azure provider ready");
                tokio::spawn(provider.clone().run());
                provider
            }
            #[cfg(not(feature = "azure"))]
            "azure" => anyhow::bail!("cloudProvider azure: this archer was built without the azure feature (cargo build --features azure)"),
            other => anyhow::bail!("unknown cloud provider {other:?}"),
        };
        let lease = settings.lease_name.clone();
        let duration = Duration::from_secs(settings.lease_duration_seconds);
        let leader_metrics = metrics.clone();
        let work = move || {
            let (worker, watches) = crate::provisioner::Provisioner::new(client.clone(), provider.clone(), inspector.clone(), picture.clone(), base_keyring.clone(), metrics.clone(), settings.clone());
            async move {
                tokio::select! {
                    _ = watches => tracing::error!("provisioner watches ended"),
                    _ = worker.run() => {}
                }
            }
        };
        crate::cluster::leader::while_leader(lease_client, &namespace, &lease, duration, (&leader_metrics.leader, &leader_metrics.candidate), work).await?;
        Ok(())
    }))
}

/// The safety net's controllers under their own lease, or a future that never ends when they
/// are off (or there is no cluster).
fn safety_task(cfg: &crate::config::Config, cluster: Option<ClusterView>, inspector: archer_registry::Inspector, base_keyring: archer_registry::Keyring, metrics: Arc<crate::safety::metrics::SafetyNetMetrics>) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>> {
    let Some(cluster) = cluster.filter(|_| cfg.safety_net.enabled) else { return Box::pin(std::future::pending()) };
    let client = cluster.client().clone();
    let net = crate::safety::SafetyNet::new(cluster, cfg, inspector, base_keyring, metrics.clone());
    let (namespace, lease) = (cfg.namespace.clone(), cfg.safety_net.lease_name.clone());
    let duration = Duration::from_secs(cfg.safety_net.lease_duration_seconds);
    Box::pin(async move {
        let work = move || net.clone().run();
        crate::cluster::leader::while_leader(client, &namespace, &lease, duration, (&metrics.leader, &metrics.candidate), work).await?;
        Ok(())
    })
}

/// The savings reporter under its own lease while Archer does not provision (the provisioner
/// reports cost and savings itself), or a future that never ends.
fn savings_task(
    cfg: &crate::config::Config,
    cluster: Option<ClusterView>,
    catalog: Arc<archer_core::catalog::Catalog>,
    inspector: archer_registry::Inspector,
    keyring: archer_registry::Keyring,
    metrics: Arc<crate::cost::metrics::CostMetrics>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>> {
    let Some(view) = cluster.filter(|_| cfg.savings.enabled && !cfg.provisioner.enabled()) else { return Box::pin(std::future::pending()) };
    let client = view.client().clone();
    let reporter = Arc::new(crate::cost::savings::SavingsReporter {
        client: client.clone(),
        view,
        catalog,
        defaults: Arc::new(cfg.defaults.clone()),
        policy: cfg.provisioner.preference_policy,
        inspector,
        keyring,
        metrics: metrics.clone(),
        every: Duration::from_secs_f64(cfg.savings.interval_seconds),
    });
    let (namespace, lease) = (cfg.namespace.clone(), cfg.savings.lease_name.clone());
    let duration = Duration::from_secs(cfg.savings.lease_duration_seconds);
    Box::pin(async move {
        let work = move || reporter.clone().run();
        crate::cluster::leader::while_leader(client, &namespace, &lease, duration, (&metrics.savings_leader, &metrics.savings_candidate), work).await?;
        Ok(())
    })
}

async fn terminate_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops Archer");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
