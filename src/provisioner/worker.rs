//! The provisioning worker (leader only): watches pending pods, batches them, packs them onto
//! existing and in-flight capacity first and onto new nodes second, writes a NodeClaim for each
//! new node *before* asking the cloud provider for it, and keeps claims and instances in step.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};

use archer_cloud::{CloudProvider, NodeClassReadiness};
use archer_api::nodeclaim::{NodeClaim, NodeClaimSpec, NodeClaimStatus};
use archer_api::nodepool::NodePool;
use archer_model::adapter as model;
use archer_model::objects::{self as state, pod_id};
use archer_model::ClusterState;
use archer_core::catalog::Catalog;
use crate::cluster::{reflect_with, ClusterView, PodPlatforms};
use crate::config::ProvisionerConfig;
use archer_core::packer::{Offering, Plan, PlannedNode, Pool};
use archer_core::packer::batch_budget;
use archer_core::planner::{plan_batch_within, Pending};
use archer_core::sched::Volumes;

use archer_core::platform::PlatformSet;
use archer_metrics::{label, Metrics};
use archer_registry::{Inspector, Keyring};

/// Set (tests only) to make the process exit right after it wrote a NodeClaim and before it asked
/// the provider for the node: the crash a restart must recover from without a second node.
pub const CRASH_AFTER_CLAIM_ENV: &str = "ARCHER_TEST_CRASH_AFTER_CLAIM";
pub const FIELD_MANAGER: &str = "archer-provisioner";
/// The claim reason of nodes bought for pending pods.
pub(super) const PROVISIONING: &str = "provisioning";
/// Event reason on a pod no NodePool can run.
pub const UNPROVISIONABLE_REASON: &str = "FailedProvisioning";

/// Watch-backed caches of what the worker reads.
#[derive(Clone)]
pub struct Stores {
    pub pods: Store<Pod>,
    pub nodes: Store<Node>,
    pub claims: Store<NodeClaim>,
    pub pools: Store<NodePool>,
    pub daemonsets: Store<DaemonSet>,
    pub claims_pv: Store<PersistentVolumeClaim>,
    pub volumes: Store<PersistentVolume>,
}

impl Stores {
    /// Start the watches; `pending` is notified whenever a pod may need capacity.
    /// `nodes`: a Node cache the process keeps already (the cluster view's), shared rather than
    /// watched twice.
    fn start(client: &Client, pending: Arc<tokio::sync::Notify>, nodes: Option<Store<Node>>, eager: Vec<String>) -> (Stores, impl std::future::Future<Output = ()> + Send + 'static) {
        let (pods, p) = reflect_with(Api::<Pod>::all(client.clone()), watcher::Config::default(), "pod", move |pod: &Pod| {
            if state::is_provisionable(pod, &eager) {
                pending.notify_one();
            }
        });
        let (nodes, n) = match nodes {
            Some(shared) => (shared, futures::future::Either::Left(futures::future::pending::<()>())),
            None => {
                let (store, watch) = reflect_with(Api::<Node>::all(client.clone()), watcher::Config::default(), "node", |_: &Node| {});
                (store, futures::future::Either::Right(watch))
            }
        };
        let (claims, c) = reflect_with(Api::<NodeClaim>::all(client.clone()), watcher::Config::default(), "nodeclaim", |_: &NodeClaim| {});
        let (pools, np) = reflect_with(Api::<NodePool>::all(client.clone()), watcher::Config::default(), "nodepool", |_: &NodePool| {});
        let (daemonsets, d) = reflect_with(Api::<DaemonSet>::all(client.clone()), watcher::Config::default(), "daemonset", |_: &DaemonSet| {});
        let (claims_pv, pvc) = reflect_with(Api::<PersistentVolumeClaim>::all(client.clone()), watcher::Config::default(), "persistentvolumeclaim", |_: &PersistentVolumeClaim| {});
        let (volumes, pv) = reflect_with(Api::<PersistentVolume>::all(client.clone()), watcher::Config::default(), "persistentvolume", |_: &PersistentVolume| {});
        let drive = async move {
            futures::future::join(futures::future::join5(p, n, c, np, d), futures::future::join(pvc, pv)).await;
        };
        (Stores { pods, nodes, claims, pools, daemonsets, claims_pv, volumes }, drive)
    }

    /// The cluster as the caches hold it now, with the namespaces the process keeps.
    pub fn state(&self, namespaces: Vec<Arc<k8s_openapi::api::core::v1::Namespace>>) -> ClusterState {
        ClusterState {
            nodes: self.nodes.state(),
            pods: self.pods.state(),
            claims: self.claims.state(),
            pools: self.pools.state(),
            namespaces,
            daemonsets: self.daemonsets.state(),
            volume_claims: self.claims_pv.state(),
            volumes: self.volumes.state(),
        }
    }

    async fn wait_ready(&self) {
        let _ = futures::future::join5(self.pods.wait_until_ready(), self.nodes.wait_until_ready(), self.claims.wait_until_ready(), self.pools.wait_until_ready(), self.daemonsets.wait_until_ready()).await;
        let _ = futures::future::join(self.claims_pv.wait_until_ready(), self.volumes.wait_until_ready()).await;
    }
}

pub struct Provisioner {
    pub client: Client,
    pub provider: Arc<dyn CloudProvider>,
    pub catalog: Arc<Catalog>,
    pub inspector: Inspector,
    pub cluster: Option<ClusterView>,
    pub base_keyring: Keyring,
    pub metrics: Arc<Metrics>,
    pub settings: ProvisionerConfig,
    pub(super) recorder: Recorder,
    limiter: governor::DefaultDirectRateLimiter,
    /// Last event message posted per pod uid (an unchanged reason is not posted again).
    reported: Mutex<HashMap<String, String>>,
    pub(super) stores: Stores,
    pending: Arc<tokio::sync::Notify>,
    pub(super) disruption: super::disruption::Tracker,
    /// Pending pods the last batch could place (on existing room or new nodes): consolidation
    /// waits for them to land.
    pub(super) waiting: Mutex<Vec<String>>,
    /// Claims this process wrote or launched, and when: the claim keeper, running beside the
    /// batches, leaves them alone until the claim cache has caught up with the launch's status.
    launched_here: Mutex<HashMap<String, Instant>>,
}

/// How long a claim this process wrote or launched is left to the claim cache to show launched.
const LAUNCH_SETTLE: Duration = Duration::from_secs(60);
/// NodeClaims written at once by one batch.
const CLAIM_WRITES_IN_FLIGHT: usize = 8;

/// Provider launches in flight at once.
const LAUNCHES_IN_FLIGHT: usize = 16;

/// How long a launch's own task waits for its nodes to become Ready and registers them.
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(120);

impl Drop for Provisioner {
    /// Leadership lost: the Pod cache stops being kept, so the extender stops reading it.
    fn drop(&mut self) {
        if let Some(c) = &self.cluster {
            c.attach_pods(None);
        }
    }
}

impl Provisioner {
    /// Build the worker and the future that drives its watches.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        provider: Arc<dyn CloudProvider>,
        catalog: Arc<Catalog>,
        inspector: Inspector,
        cluster: Option<ClusterView>,
        base_keyring: Keyring,
        metrics: Arc<Metrics>,
        settings: ProvisionerConfig,
    ) -> (Arc<Self>, impl std::future::Future<Output = ()> + Send + 'static) {
        let pending = Arc::new(tokio::sync::Notify::new());
        let (stores, watches) = Stores::start(&client, pending.clone(), cluster.as_ref().map(ClusterView::nodes), settings.scheduler_names.clone());
        let per_minute = std::num::NonZeroU32::new(settings.max_launches_per_minute).unwrap_or(std::num::NonZeroU32::MIN);
        let reporter = Reporter { controller: "archer-provisioner".into(), instance: std::env::var("POD_NAME").ok() };
        if let Some(c) = &cluster {
            c.attach_pods(Some(stores.pods.clone()));
        }
        let p = Arc::new(Self {
            recorder: Recorder::new(client.clone(), reporter),
            limiter: governor::RateLimiter::direct(governor::Quota::per_minute(per_minute)),
            reported: Mutex::new(HashMap::new()),
            launched_here: Mutex::new(HashMap::new()),
            client,
            provider,
            catalog,
            inspector,
            cluster,
            base_keyring,
            metrics,
            settings,
            stores,
            pending,
            disruption: Default::default(),
            waiting: Default::default(),
        });
        (p, watches)
    }

    /// Run the batching loop, the claim keeper, disruption and the cost metrics until the future
    /// is dropped. Each runs as a task of its own, so a long disruption pass never holds a
    /// provisioning batch back; dropping the future (leadership lost) stops them all.
    pub async fn run(self: Arc<Self>) {
        self.stores.wait_ready().await;
        tracing::info!(provider = self.provider.name(), offerings = self.provider.offerings().len(), "provisioner started");
        let mut tasks = AbortOnDrop(vec![tokio::spawn(self.clone().batch_loop()), tokio::spawn(self.clone().claim_loop()), tokio::spawn(self.clone().disruption_loop()), tokio::spawn(self.clone().cost_loop())]);
        if let Some(notices) = self.provider.interruptions(Arc::new(super::disruption::Interruptions(self.clone()))) {
            tasks.0.push(tokio::spawn(notices));
        }
        let (ended, _, _) = futures::future::select_all(tasks.0.iter_mut().collect::<Vec<_>>()).await;
        tracing::error!(outcome = ?ended.err(), "a provisioner loop ended; stopping the others");
    }

    async fn batch_loop(self: Arc<Self>) {
        let idle = Duration::from_secs_f64(self.settings.batch_idle_seconds);
        let max = Duration::from_secs_f64(self.settings.batch_max_seconds);
        loop {
            // A pending pod, or the periodic resync (pods that stay pending send no events).
            tokio::select! {
                _ = self.pending.notified() => {}
                _ = tokio::time::sleep(max) => {}
            }
            let opened = tokio::time::Instant::now();
            loop {
                let deadline = (tokio::time::Instant::now() + idle).min(opened + max);
                tokio::select! {
                    _ = self.pending.notified() => continue,
                    _ = tokio::time::sleep_until(deadline) => break,
                }
            }
            self.provision_once().await;
        }
    }

    /// Platforms of a pending pod: the webhook's annotation, else its images, else unknown
    /// (assumed to run anywhere).
    pub(super) async fn platforms(&self, pod: &Pod) -> Option<PlatformSet> {
        match crate::cluster::pod_platforms(&self.inspector, self.cluster.as_ref(), &self.base_keyring, pod, self.inspector.lookup_timeout() * 2).await {
            PodPlatforms::Known { all, .. } => Some(all),
            PodPlatforms::Unknown(why) => {
                tracing::info!(pod = %pod_id(pod), reason = %why, "platforms unknown; the pod is assumed to run on any architecture");
                None
            }
        }
    }

    /// The cluster at this moment, from the watch caches.
    pub(super) fn state(&self) -> ClusterState {
        self.stores.state(self.cluster.as_ref().map(|c| c.namespaces()).unwrap_or_default())
    }

    /// The planner's view of pods (platforms resolved concurrently), through the one adapter.
    /// Each carries the node an earlier plan put it on: this process's latest plan, else the
    /// live claims' record (after a restart).
    pub(super) async fn pending_pods<P: std::borrow::Borrow<Pod> + Sync>(&self, state: &ClusterState, pods: &[P], volumes: &Volumes) -> Vec<Pending> {
        let claimed = &state.planned_nodes();
        join_all(pods.iter().map(|p| async move {
            let p: &Pod = p.borrow();
            let platforms = self.platforms(p).await;
            let mut pending = model::pending(p, platforms, volumes, self.settings.preference_policy);
            let latest = match &self.cluster {
                Some(c) => c.planned_node(&pending.packer.id).await.map(|(node, _)| node),
                None => None,
            };
            pending.planned = latest.or_else(|| claimed.get(&pending.packer.id).cloned());
            pending
        }))
        .await
    }

    /// The state's pools as the packer takes them: a pool whose node class the provider says is
    /// not ready is closed.
    pub(super) fn pools(&self, state: &ClusterState) -> Vec<Pool> {
        let closed = |np: &NodePool| match self.provider.node_class_readiness(np.spec.template.spec.node_class_ref.as_ref()) {
            NodeClassReadiness::NotReady { message, .. } => Some(message),
            NodeClassReadiness::Ready | NodeClassReadiness::NotUsed => None,
        };
        state.packer_pools(&closed)
    }

    /// One batch: decide and launch.
    #[tracing::instrument(skip_all, fields(pods = tracing::field::Empty, nodes = tracing::field::Empty))]
    pub async fn provision_once(self: &Arc<Self>) {
        let started = Instant::now();
        let Some((pending, covered, plan)) = self.decide().await else { return };
        self.metrics.provisioner_batches.inc();
        // kube-scheduler goes on binding pods while the batch is decided: nodes bought for pods
        // bound meanwhile would stay (partly) empty. Decide once more on the cluster as it is
        // now; what is bound even then leaves the plan.
        let (pending, covered, plan) = match self.gone_from(&plan) {
            gone if gone.is_empty() => (pending, covered, plan),
            gone => {
                tracing::info!(gone = gone.len(), "pods of the batch were bound or deleted while it was decided; deciding again");
                match self.decide().await {
                    Some(again) => again,
                    None => return,
                }
            }
        };
        tracing::Span::current().record("pods", pending.len());
        let plan = {
            let gone = self.gone_from(&plan);
            plan.without(&gone)
        };
        if !plan.nodes.is_empty() && plan.lower_bound_per_hour > 0.0 {
            self.metrics.plan_cost_ratio.observe(plan.total_price_per_hour / plan.lower_bound_per_hour);
        }
        tracing::Span::current().record("nodes", plan.nodes.len());
        tracing::info!(
            pending = pending.len(),
            on_existing = plan.existing.len(),
            new_nodes = plan.nodes.len(),
            unschedulable = plan.unschedulable.len(),
            price_per_hour = plan.total_price_per_hour,
            "batch decided"
        );
        for (pod, node) in &plan.existing {
            tracing::debug!(pod = %pod, node = %node, "placed on room the cluster already has");
        }
        if let Some(cluster) = &self.cluster {
            for (pod, node) in &plan.existing {
                cluster.plan_placed(vec![pod.clone()], node).await;
            }
            cluster.plan_forgotten(plan.unschedulable.iter().map(|u| u.pod.clone()).collect()).await;
        }
        {
            let unplaceable: HashSet<&str> = plan.unschedulable.iter().map(|u| u.pod.as_str()).collect();
            let placeable = pending.iter().map(|p| pod_id(p)).filter(|id| !unplaceable.contains(id.as_str())).chain(covered.iter().cloned()).collect();
            *self.waiting.lock().unwrap_or_else(|e| e.into_inner()) = placeable;
        }
        let by_id: HashMap<String, &Arc<Pod>> = pending.iter().map(|p| (pod_id(p), p)).collect();
        for u in &plan.unschedulable {
            if let Some(p) = by_id.get(&u.pod) {
                self.report_unprovisionable(p, &u.reason).await;
            }
        }
        self.launch_plan(&plan.nodes, PROVISIONING).await;
        self.metrics.provisioner_batch_seconds.observe(started.elapsed().as_secs_f64());
    }

    /// What a batch would do on the cluster as the caches have it now: the pods it plans (those
    /// a live plan already covers aside), the covered ones, the plan. `None`: nothing pending.
    async fn decide(&self) -> Option<(Vec<Arc<Pod>>, HashSet<String>, Plan)> {
        let state = self.state();
        // Pods a live plan already placed on a node still coming are not planned again.
        let (pending, covered) = state.provisionable(&self.settings.scheduler_names);
        if pending.is_empty() {
            return None;
        }
        let pools = self.pools(&state);
        let snapshot = state.snapshot(&pools, &|_| false);
        let batch: Vec<Pending> = self.pending_pods(&state, &pending, &state.volumes()).await;
        let offerings = &self.provider.offerings();
        let plan = if pools.is_empty() {
            Plan { unschedulable: batch.iter().map(|p| archer_core::packer::Unschedulable { pod: p.packer.id.clone(), reason: "no NodePool exists".into() }).collect(), ..Default::default() }
        } else {
            tokio::task::block_in_place(|| plan_batch_within(&snapshot, &batch, &pools, offerings, batch_budget(self.settings.packing_budget(), batch.len())))
        };
        Some((pending, covered, plan))
    }

    /// The pods the plan places that the Pod cache no longer has pending (bound, deleted).
    fn gone_from(&self, plan: &Plan) -> HashSet<String> {
        let placed = plan.nodes.iter().flat_map(|n| n.pods.iter()).chain(plan.existing.keys());
        placed
            .filter(|id| {
                let Some((ns, name)) = id.split_once('/') else { return false };
                self.stores.pods.get(&kube::runtime::reflector::ObjectRef::new(name).within(ns)).is_none_or(|p| !state::is_provisionable(&p, &self.settings.scheduler_names))
            })
            .cloned()
            .collect()
    }

    async fn report_unprovisionable(&self, pod: &Pod, reason: &str) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let note = format!("no NodePool can run this pod: {reason}");
        {
            let mut seen = self.reported.lock().unwrap_or_else(|e| e.into_inner());
            if seen.get(&uid) == Some(&note) {
                return;
            }
            seen.insert(uid, note.clone());
        }
        self.metrics.unprovisionable_pods.inc();
        tracing::warn!(pod = %pod_id(pod), reason, "no node launched for the pod");
        self.post_event(&pod.object_ref(&()), EventType::Warning, UNPROVISIONABLE_REASON, "Provisioning", &note).await;
    }

    /// Write a claim per planned node, then launch them. Returns the names of the claims written,
    /// once the claim cache shows them.
    pub(super) async fn launch_plan(self: &Arc<Self>, nodes: &[PlannedNode], reason: &str) -> Vec<String> {
        // The cap is a safety valve on provisioning; a consolidation's replacements are bounded by
        // the pool's disruption budget instead, and never wait behind provisioning's launches.
        let capped = reason == PROVISIONING;
        let mut allowed = Vec::with_capacity(nodes.len());
        for (i, planned) in nodes.iter().enumerate() {
            if capped && self.limiter.check().is_err() {
                self.metrics.launches_rate_limited.inc_by((nodes.len() - i) as u64);
                tracing::warn!(deferred = nodes.len() - i, per_minute = self.settings.max_launches_per_minute, "launch cap reached; the rest wait for the next batch");
                break;
            }
            allowed.push(planned);
        }
        // Written concurrently, a few at a time.
        let writes: Vec<_> = allowed.into_iter().filter_map(|p| Some((p, self.claim_for(p, reason)?))).map(|(planned, claim)| self.write_claim(planned, claim)).collect();
        let mut claims: Vec<NodeClaim> = futures::stream::iter(writes).buffer_unordered(CLAIM_WRITES_IN_FLIGHT).filter_map(std::future::ready).collect().await;
        let names: Vec<String> = claims.iter().map(|c| c.name()).collect();
        if names.len() > 1 {
            for c in claims.iter_mut() {
                let me = c.name();
                let siblings: Vec<&str> = names.iter().map(String::as_str).filter(|n| *n != me).collect();
                c.metadata.annotations.get_or_insert_with(Default::default).insert(archer_core::labels::BATCH_NODES_ANNOTATION.into(), siblings.join(","));
            }
        }
        self.post_launch_events(&claims, reason).await;
        // Launched concurrently too, a bounded number at a time (a cloud API has its own limits).
        let launches: Vec<_> = claims.iter().map(|c| self.launch(c)).collect();
        futures::stream::iter(launches).buffer_unordered(LAUNCHES_IN_FLIGHT).collect::<Vec<()>>().await;
        if !names.is_empty() {
            let me = self.clone();
            let batch = names.clone();
            tokio::spawn(async move { me.register_each(batch).await });
        }
        self.wait_seen(&names).await;
        names
    }

    /// Register each node of a batch as soon as it is Ready (a slow node holds back none of the
    /// others). Pods the plan put on a node bind there as it comes up; the extender keeps pods
    /// the plan did not place off a node while others of its batch are still registering, so a
    /// batch meant to spread is not packed onto its first node.
    async fn register_each(&self, batch: Vec<String>) {
        let deadline = Instant::now() + REGISTRATION_TIMEOUT;
        let mut left: Vec<String> = batch;
        while !left.is_empty() {
            let nodes = self.stores.nodes.state();
            let claims = self.stores.claims.state();
            let node_of = |b: &str| claims.iter().find(|c| c.name() == b).map(|c| c.node_name()).unwrap_or_else(|| b.to_string());
            let (up, waiting): (Vec<String>, Vec<String>) = left.into_iter().partition(|b| match nodes.iter().find(|n| n.metadata.name.as_deref() == Some(node_of(b).as_str())) {
                Some(n) => state::node_ready(n),
                // Gone (or never launched): nothing to register.
                None => !claims.iter().any(|c| c.name() == *b && c.launched()),
            });
            let up_nodes: Vec<String> = up.iter().map(|b| node_of(b)).collect();
            join_all(up_nodes.iter().map(|n| self.register(n))).await;
            left = waiting;
            if Instant::now() >= deadline {
                // The claim keeper lifts the taint once such a node is Ready.
                tracing::warn!(nodes = ?left, "nodes not Ready in time; left to the claim keeper");
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Lift the unregistered taint from a node (the node joins the cluster for scheduling).
    pub(super) async fn register(&self, node: &str) {
        if self.remove_taint(node, archer_core::labels::UNREGISTERED_TAINT).await {
            tracing::info!(node, "node registered");
        }
    }

    /// Remove the taint `key` from a node: a JSON patch that tests the taint is still at the index
    /// it was read from, so it neither conflicts with kwok's status updates nor removes a taint
    /// someone added meanwhile (retried on a failed test). True when this call removed it.
    pub(super) async fn remove_taint(&self, node: &str, key: &str) -> bool {
        let api: Api<Node> = Api::all(self.client.clone());
        for _ in 0..5 {
            let n = match api.get_opt(node).await {
                Ok(Some(n)) => n,
                Ok(None) => return false,
                Err(e) => {
                    tracing::debug!(node, key, error = %e, "taint removal deferred");
                    return false;
                }
            };
            let taints: Vec<_> = n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
            let Some(i) = taints.iter().position(|t| t.key == key) else { return false };
            let ops = serde_json::json!([
                {"op": "test", "path": format!("/spec/taints/{i}/key"), "value": key},
                {"op": "remove", "path": format!("/spec/taints/{i}")}
            ]);
            let Ok(patch) = serde_json::from_value::<json_patch::Patch>(ops) else { return false };
            match api.patch(node, &PatchParams::default(), &Patch::<()>::Json(patch)).await {
                Ok(_) => return true,
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422 => continue,
                Err(e) => {
                    tracing::debug!(node, key, error = %e, "taint removal deferred");
                    return false;
                }
            }
        }
        false
    }

    /// The claim for one planned node.
    fn claim_for(&self, planned: &PlannedNode, reason: &str) -> Option<NodeClaim> {
        let np = self.stores.pools.state().into_iter().find(|p| p.name() == planned.pool)?;
        let pool = np.to_pool().ok()?;
        let offerings = self.provider.offerings();
        let offering = Offering::find(&offerings, &planned.instance_type, &planned.zone, &planned.capacity_type)?;
        let t = &offering.instance;
        let with_gpus = |mut m: BTreeMap<String, String>, gpus: u32| {
            if gpus > 0 {
                m.insert(archer_core::packer::GPU_RESOURCE.to_string(), gpus.to_string());
            }
            m
        };
        let q = |cpu_millis: i64, mem: i64, pods: i64| BTreeMap::from([("cpu".to_string(), format!("{cpu_millis}m")), ("memory".to_string(), format!("{}Ki", mem / 1024)), ("pods".to_string(), pods.to_string())]);
        let taint = |t: &archer_api::nodepool::TaintDoc| t.clone();
        Some(NodeClaim {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}-", planned.pool)),
                annotations: Some(BTreeMap::from([
                    (archer_core::labels::PLANNED_PODS_ANNOTATION.to_string(), planned.pods.join(",")),
                    (archer_model::drift::POOL_HASH_ANNOTATION.to_string(), archer_model::drift::pool_hash(&np)),
                ])),
                labels: Some(BTreeMap::from([(archer_core::labels::NODEPOOL.to_string(), planned.pool.clone()), (archer_core::labels::KARPENTER_NODEPOOL.to_string(), planned.pool.clone())])),
                ..Default::default()
            },
            spec: NodeClaimSpec {
                node_pool: planned.pool.clone(),
                instance_type: t.name.clone(),
                zone: offering.zone.clone(),
                capacity_type: planned.capacity_type.clone(),
                arch: t.arch.clone(),
                os: t.os.clone(),
                labels: offering.labels(&pool),
                taints: np.spec.template.spec.taints.iter().map(taint).collect(),
                startup_taints: np.spec.template.spec.startup_taints.iter().map(taint).collect(),
                capacity: with_gpus(q(i64::from(t.vcpu) * 1000, t.memory_mib as i64 * 1024 * 1024, t.max_pods), t.gpu_count),
                allocatable: with_gpus(q(t.allocatable.cpu_millis, t.allocatable.memory_bytes, t.allocatable.pods), t.gpu_count),
                price_per_hour: offering.price,
                expire_after: np.spec.template.spec.expire_after.clone(),
                reason: Some(reason.into()),
                node_class_ref: np.spec.template.spec.node_class_ref.clone(),
                requirements: self.claim_requirements(&np, planned),
            },
            status: None,
        })
    }

    /// The pool's requirements, and the planned instance type as a requirement when a planned pod
    /// selects on anything but the node's architecture, OS, zone, region, capacity type or pool:
    /// a provider may then launch no other type than the one planned.
    fn claim_requirements(&self, pool: &NodePool, planned: &PlannedNode) -> Vec<archer_api::nodepool::RequirementDoc> {
        let mut r = pool.spec.template.spec.requirements.clone();
        let pods = self.stores.pods.state();
        let wanted: HashSet<&str> = planned.pods.iter().map(String::as_str).collect();
        let pins = pods.iter().filter(|p| wanted.contains(pod_id(p).as_str())).any(|p| model::selects_on_instance_shape(p));
        if pins {
            r.push(archer_api::nodepool::RequirementDoc { key: archer_core::labels::INSTANCE_TYPE.into(), operator: "In".into(), values: vec![planned.instance_type.clone()], min_values: None });
        }
        r
    }

    /// Write one planned node's NodeClaim.
    async fn write_claim(&self, planned: &PlannedNode, claim: NodeClaim) -> Option<NodeClaim> {
        match Api::<NodeClaim>::all(self.client.clone()).create(&PostParams::default(), &claim).await {
            Ok(c) => {
                // Before anything else can see it: the claim keeper leaves it to us.
                self.mark_ours(&c.name());
                tracing::info!(claim = %c.name(), pool = %planned.pool, instance_type = %planned.instance_type, zone = %planned.zone, capacity = %planned.capacity_type, pods = planned.pods.len(), "node claimed");
                if std::env::var_os(CRASH_AFTER_CLAIM_ENV).is_some() {
                    tracing::error!(claim = %c.name(), "{CRASH_AFTER_CLAIM_ENV} set: exiting between claim and launch");
                    std::process::exit(70);
                }
                Some(c)
            }
            Err(e) => {
                tracing::warn!(pool = %planned.pool, error = %e, "could not write the NodeClaim; the pods wait for the next batch");
                None
            }
        }
    }

    /// A claim this process wrote or is launching: the claim keeper leaves it alone for a while.
    fn mark_ours(&self, name: &str) {
        let mut here = self.launched_here.lock().unwrap_or_else(|e| e.into_inner());
        here.retain(|_, at| at.elapsed() < LAUNCH_SETTLE);
        here.insert(name.to_string(), Instant::now());
    }

    /// Ask the provider for the claim's node and record the result on the claim.
    #[tracing::instrument(skip_all, fields(claim = %claim.name()))]
    pub(super) async fn launch(&self, claim: &NodeClaim) {
        self.mark_ours(&claim.name());
        let api: Api<NodeClaim> = Api::all(self.client.clone());
        let status = match self.provider.create(claim).await {
            Ok(i) => {
                self.metrics.nodes_launched.get_or_create(&label("pool", claim.spec.node_pool.clone())).inc();
                tracing::info!(node = %i.node_name, provider_id = %i.provider_id, "node launched");
                let what = format!("{} ({} in {}, {}) for node {}", i.provider_id, i.instance_type.as_deref().unwrap_or(&claim.spec.instance_type), i.zone.as_deref().unwrap_or(&claim.spec.zone), claim.spec.capacity_type, i.node_name);
                self.post_event(&claim.object_ref(&()), EventType::Normal, "Launched", "Launching", &what).await;
                if let Some(cluster) = &self.cluster {
                    let planned = claim.metadata.annotations.as_ref().and_then(|a| a.get(archer_core::labels::PLANNED_PODS_ANNOTATION)).cloned().unwrap_or_default();
                    let pods: Vec<String> = planned.split(',').filter(|p| !p.is_empty()).map(String::from).collect();
                    cluster.plan_placed(pods, &i.node_name).await;
                }
                NodeClaimStatus { provider_id: Some(i.provider_id), node_name: Some(i.node_name), launched_at: Some(now_rfc3339()), instance_type: i.instance_type, zone: i.zone, image_id: i.image_id, node_class_hash: i.node_class_hash, ..Default::default() }
            }
            Err(e) => {
                self.metrics.launch_errors.get_or_create(&label("provider", self.provider.name())).inc();
                tracing::warn!(error = %e, "launch failed");
                if matches!(e, archer_cloud::CloudError::InsufficientCapacity { .. }) {
                    // Give the pods back to the next batch, which picks another offering.
                    let _ = api.delete(&claim.name(), &DeleteParams::default()).await;
                    return;
                }
                let attempts = claim.status.as_ref().and_then(|s| s.launch_attempts).unwrap_or(0) + 1;
                if attempts >= self.settings.launch_attempts {
                    let times = if attempts == 1 { "once".to_string() } else { format!("{attempts} times") };
                    self.give_up(claim, "LaunchFailed", &format!("launch failed {times}, the claim is deleted and its pods planned again: {e}")).await;
                    return;
                }
                self.post_event(&claim.object_ref(&()), EventType::Warning, "LaunchFailed", "Launching", &format!("attempt {attempts} of {}: {e}", self.settings.launch_attempts)).await;
                NodeClaimStatus { last_error: Some(e.to_string()), launch_attempts: Some(attempts), last_attempt_at: Some(now_rfc3339()), ..Default::default() }
            }
        };
        if let Err(e) = api.patch_status(&claim.name(), &PatchParams::default(), &Patch::Merge(serde_json::json!({"status": status}))).await {
            tracing::warn!(error = %e, "could not record the launch on the claim; the claim keeper retries (the launch is idempotent)");
        }
    }

    /// Delete a claim that cannot become a node (with a Warning Event on it saying why) and its
    /// instance, if any: it stops counting as room and against the pool's limits.
    async fn give_up(&self, claim: &NodeClaim, reason: &str, note: &str) {
        tracing::warn!(claim = %claim.name(), reason, note, "claim given up");
        self.metrics.claims_given_up.get_or_create(&label("reason", reason)).inc();
        self.post_event(&claim.object_ref(&()), EventType::Warning, reason, "Launching", note).await;
        self.post_pool_event(&claim.spec.node_pool, EventType::Warning, reason, "Launching", &format!("node claim {}: {note}", claim.name())).await;
        if let Err(e) = self.provider.delete(claim).await {
            tracing::warn!(claim = %claim.name(), error = %e, "could not terminate the instance; garbage collection will");
        }
        let _ = Api::<NodeClaim>::all(self.client.clone()).delete(&claim.name(), &DeleteParams::default()).await;
    }

    /// Wait (briefly) until the claim cache shows what was just written, so the next batch sees
    /// the in-flight capacity and the pool usage.
    async fn wait_seen(&self, names: &[String]) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let have: HashSet<String> = self.stores.claims.state().iter().map(|c| c.name()).collect();
            if names.iter().all(|n| have.contains(n)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Keep claims and instances in step: launch claims that never were (a crash between the
    /// claim and the launch), delete instances without a claim, drop claims whose instance is gone.
    async fn claim_loop(self: Arc<Self>) {
        let interval = Duration::from_secs_f64(self.settings.disruption_interval_seconds.min(10.0));
        loop {
            self.keep_claims().await;
            tokio::time::sleep(interval).await;
        }
    }

    pub async fn keep_claims(&self) {
        self.write_statuses().await;
        let api: Api<NodeClaim> = Api::all(self.client.clone());
        let claims = self.stores.claims.state();
        let recent = |c: &NodeClaim| {
            let ours = self.launched_here.lock().unwrap_or_else(|e| e.into_inner()).get(&c.name()).is_some_and(|at| at.elapsed() < LAUNCH_SETTLE);
            // Or written a moment ago (the watch can show a claim before its writer marks it).
            let young = c.metadata.creation_timestamp.as_ref().and_then(|t| state::age_of(&t.0.to_string())).is_some_and(|a| a < Duration::from_secs(10));
            ours || young
        };
        for c in claims.iter().filter(|c| !c.launched() && !c.deleting() && !recent(c) && retry_due(c)) {
            tracing::info!(claim = %c.name(), "claim was never launched (restart?); launching it now");
            self.launch(c).await;
        }
        let instances = match self.provider.list().await {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list instances");
                return;
            }
        };
        let known: HashSet<&str> = instances.iter().map(|i| i.claim.as_str()).collect();
        // Ready nodes still unregistered a while after launch (their launch's registration task
        // was lost to a restart, or gave up): register them.
        for c in claims.iter().filter(|c| c.launched() && !c.deleting()) {
            let late = c.status.as_ref().and_then(|s| s.launched_at.as_deref()).and_then(state::age_of).is_some_and(|a| a > Duration::from_secs(15));
            let node = c.status.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            if late && self.stores.nodes.get(&kube::runtime::reflector::ObjectRef::new(&node)).is_some_and(|n| state::node_ready(&n)) {
                self.register(&node).await;
            }
        }
        // Launched but never registered, or registered and never Ready: given up.
        let timeout = Duration::from_secs(self.settings.registration_timeout_seconds);
        for c in claims.iter().filter(|c| c.launched() && !c.deleting()) {
            let age = c.status.as_ref().and_then(|s| s.launched_at.as_deref()).and_then(state::age_of).unwrap_or_default();
            let node = c.status.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            let ready = self.stores.nodes.get(&kube::runtime::reflector::ObjectRef::new(&node)).is_some_and(|n| state::node_ready(&n));
            if age > timeout && !ready {
                self.give_up(c, "RegistrationTimeout", &format!("node {node} not registered and Ready {}s after launch", timeout.as_secs())).await;
            }
        }
        let grace = Duration::from_secs(self.settings.garbage_grace_seconds);
        for i in &instances {
            if claims.iter().any(|c| c.name() == i.claim) {
                continue;
            }
            if i.launched_at.and_then(|t| t.elapsed().ok()).is_some_and(|a| a < grace) {
                continue;
            }
            // The cache may lag a claim written a moment ago: ask the API server.
            if let Ok(None) = api.get_opt(&i.claim).await {
                tracing::warn!(node = %i.node_name, claim = %i.claim, "instance without a claim; deleting it");
                let orphan = NodeClaim { metadata: ObjectMeta { name: Some(i.claim.clone()), ..Default::default() }, spec: Default::default(), status: None };
                if self.provider.delete(&orphan).await.is_ok() {
                    self.metrics.nodes_terminated.get_or_create(&label("reason", "garbage")).inc();
                }
            }
        }
        for c in claims.iter().filter(|c| c.launched() && !c.deleting() && !known.contains(c.name().as_str())) {
            let age = c.status.as_ref().and_then(|s| s.launched_at.as_deref()).and_then(state::age_of).unwrap_or_default();
            if age > Duration::from_secs(30) {
                tracing::warn!(claim = %c.name(), "the claim's instance is gone; deleting the claim");
                let _ = api.delete(&c.name(), &DeleteParams::default()).await;
            }
        }
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

/// Whether a claim whose launch failed is due another attempt: 10 s after the first failure,
/// doubling up to 5 minutes.
fn retry_due(c: &NodeClaim) -> bool {
    let Some(s) = c.status.as_ref() else { return true };
    let attempts = s.launch_attempts.unwrap_or(0);
    if attempts == 0 {
        return true;
    }
    let wait = Duration::from_secs(10u64.saturating_mul(1 << attempts.min(6).saturating_sub(1))).min(Duration::from_secs(300));
    s.last_attempt_at.as_deref().and_then(state::age_of).is_none_or(|a| a >= wait)
}

pub(super) fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

#[cfg(test)]
mod retry_tests {
    use super::*;

    fn failed(attempts: u32, ago_secs: i64) -> NodeClaim {
        let at = time::OffsetDateTime::now_utc() - time::Duration::seconds(ago_secs);
        NodeClaim {
            metadata: Default::default(),
            spec: Default::default(),
            status: Some(NodeClaimStatus { launch_attempts: Some(attempts), last_attempt_at: at.format(&time::format_description::well_known::Rfc3339).ok(), ..Default::default() }),
        }
    }

    #[test]
    fn failed_launches_are_retried_with_a_doubling_backoff() {
        assert!(retry_due(&NodeClaim { metadata: Default::default(), spec: Default::default(), status: None }), "never tried");
        assert!(!retry_due(&failed(1, 5)) && retry_due(&failed(1, 11)), "10 s after the first failure");
        assert!(!retry_due(&failed(2, 15)) && retry_due(&failed(2, 21)), "20 s after the second");
        assert!(!retry_due(&failed(4, 70)) && retry_due(&failed(4, 81)), "80 s after the fourth");
        assert!(!retry_due(&failed(9, 200)) && retry_due(&failed(9, 301)), "at most 5 minutes");
    }
}
