//! The provisioner (leader only): it builds the shared [`Context`] and its executors, and runs
//! them until leadership is lost. The executors:
//! - [`Batcher`](super::batch::Batcher): pending pods, batched and planned;
//! - [`Launcher`](super::launch::Launcher): NodeClaims written, launched, registered and kept
//!   in step with the cloud's instances;
//! - [`StatusWriter`](super::status::StatusWriter): NodeClaim and NodePool status;
//! - [`Disrupter`](super::disruption::Disrupter): consolidation, expiry, drift, interruptions;
//! - [`CostReporter`](super::cost::CostReporter): the cost and savings metrics;
//! - [`DeletionCosts`](super::deletion_cost::DeletionCosts): pod deletion costs, so scale-downs
//!   empty whole nodes (`podDeletionCost`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::events::{Recorder, Reporter};
use kube::Client;

use archer_cloud::CloudProvider;
use super::metrics::ProvisionerMetrics;
use archer_registry::{Inspector, Keyring};

use super::batch::Batcher;
use super::context::{run_loop, Context};
use super::cost::CostReporter;
use super::deletion_cost::DeletionCosts;
use super::disruption::{Disrupter, Interruptions};
use super::launch::Launcher;
use super::status::StatusWriter;
use crate::cluster::stores::Stores;
use crate::cluster::picture::Picture;
use crate::config::ProvisionerConfig;

pub struct Provisioner {
    ctx: Arc<Context>,
    batcher: Arc<Batcher>,
    launcher: Arc<Launcher>,
    status: Arc<StatusWriter>,
    disrupter: Arc<Disrupter>,
    cost: Arc<CostReporter>,
}

impl Drop for Provisioner {
    /// Leadership lost: the Pod cache stops being kept, so the extender stops reading it.
    fn drop(&mut self) {
        self.ctx.picture.attach(None);
    }
}

impl Provisioner {
    /// Build the worker and the future that drives its watches.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        provider: Arc<dyn CloudProvider>,
        inspector: Inspector,
        picture: Picture,
        base_keyring: Keyring,
        metrics: Arc<ProvisionerMetrics>,
        settings: ProvisionerConfig,
    ) -> (Arc<Self>, impl std::future::Future<Output = ()> + Send + 'static) {
        let pending = Arc::new(tokio::sync::Notify::new());
        let (stores, watches) = Stores::start(&client, pending.clone(), Some(picture.view().nodes()), settings.scheduler_names.clone());
        let reporter = Reporter { controller: "archer-provisioner".into(), instance: std::env::var("POD_NAME").ok() };
        picture.attach(Some((stores.clone(), provider.clone())));
        let ctx = Arc::new(Context { recorder: Recorder::new(client.clone(), reporter), client, provider, inspector, picture, base_keyring, metrics, settings, stores, waiting: Mutex::new(Vec::new()) });
        let launcher = Arc::new(Launcher::new(ctx.clone()));
        let status = Arc::new(StatusWriter::new(ctx.clone()));
        let p = Arc::new(Self {
            batcher: Arc::new(Batcher::new(ctx.clone(), launcher.clone(), pending)),
            disrupter: Arc::new(Disrupter::new(ctx.clone(), launcher.clone(), status.clone())),
            cost: Arc::new(CostReporter::new(ctx.clone())),
            launcher,
            status,
            ctx,
        });
        (p, watches)
    }

    /// Run the executors until the future is dropped: the batches, the claim lifecycle (status,
    /// then the claim keeper), disruption and the cost metrics, each a task of its own, so a long
    /// disruption pass never holds a provisioning batch back; dropping the future (leadership
    /// lost) stops them all.
    pub async fn run(self: Arc<Self>) {
        let ctx = self.ctx.clone();
        ctx.stores.wait_ready().await;
        tracing::info!(provider = ctx.provider.name(), offerings = ctx.provider.offerings().len(), "provisioner started");
        let retry = Duration::from_secs(5);
        let lifecycle = {
            let (status, launcher, ctx) = (self.status.clone(), self.launcher.clone(), ctx.clone());
            async move {
                run_loop("lifecycle", &ctx.metrics, retry, || async {
                    status.write_statuses().await?;
                    launcher.keep_claims().await
                })
                .await
            }
        };
        let disruption = {
            let (disrupter, ctx) = (self.disrupter.clone(), ctx.clone());
            async move {
                let first = Duration::from_secs_f64(ctx.settings.disruption_interval_seconds);
                tracing::debug!(interval = ?first, "disruption loop started");
                tokio::time::sleep(first).await;
                run_loop("disruption", &ctx.metrics, retry, || disrupter.reconcile()).await
            }
        };
        let mut tasks = AbortOnDrop(vec![tokio::spawn(self.batcher.clone().run()), tokio::spawn(lifecycle), tokio::spawn(disruption), tokio::spawn(self.cost.clone().run())]);
        if ctx.settings.pod_deletion_cost {
            let (costs, ctx) = (DeletionCosts::new(ctx.clone()), ctx.clone());
            tasks.0.push(tokio::spawn(async move { run_loop("deletion_cost", &ctx.metrics, retry, || costs.reconcile()).await }));
        }
        if let Some(notices) = ctx.provider.interruptions(Arc::new(Interruptions(self.disrupter.clone()))) {
            tasks.0.push(tokio::spawn(notices));
        }
        let (ended, _, _) = futures::future::select_all(tasks.0.iter_mut().collect::<Vec<_>>()).await;
        tracing::error!(outcome = ?ended.err(), "a provisioner loop ended; stopping the others");
    }
}

/// Tasks aborted when this is dropped (the provisioner's loops live as long as its leadership).
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}
