//! `POST /scheduler/filter` and `POST /scheduler/prioritize`: kube-scheduler's extender calls.
//! Filter drops nodes whose architecture/OS the pod's images cannot run (the safety net for pods
//! the webhook never saw); prioritize scores nodes by what the pod costs there.
//! One job each: nothing the default scheduler already checks (resources, taints) is re-checked.

pub mod metrics;
pub mod wire;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{ObjectRef, Store};

use archer_core::catalog::Catalog;
use crate::cluster::picture::Picture;
use crate::cluster::{ClusterView, PodPlatforms};
use archer_model::handoff::{self, HeldRoom};
use archer_core::labels;
use archer_core::placement::PLATFORMS_ANNOTATION;
use archer_core::platform::PlatformSet;
use archer_core::policy::{self, PolicyDefaults};
use archer_core::resources::{pod_requests, Resources};
use archer_core::scoring::{self, Candidate};
use archer_metrics::labels2;
use metrics::ExtenderMetrics;
use archer_registry::{Inspector, Keyring};
use crate::server::body::{held_body, read_body, BodyLimits};
use archer_limits::MemoryPermit;
use wire::{parse_args, FilterResult, HostPriority, Nodes};

pub struct Extender {
    pub catalog: Arc<Catalog>,
    pub inspector: Inspector,
    pub cluster: Option<ClusterView>,
    /// The cluster state and the plans, while this process provisions: the hand-off to
    /// kube-scheduler ([`archer_model::handoff`]) reads them.
    pub picture: Option<Picture>,
    /// The watch-backed Node cache for `nodeCacheCapable: true` (NodeNames) calls.
    pub nodes: Option<Store<Node>>,
    pub defaults: PolicyDefaults,
    pub base_keyring: Keyring,
    pub metrics: Arc<ExtenderMetrics>,
    /// Bound on inspecting images of a pod that carries no `archer.dev/platforms` annotation.
    pub inspection_timeout: Duration,
    /// Fraction of cost taken off the namespace's most preferred architecture.
    pub preference_bonus: f64,
    /// The body cap, read timeout and memory budget of both calls. The budget is charged three
    /// times the body: the body, what is parsed from it, and the answer echoing kept nodes.
    pub body: BodyLimits,
    /// Prices above this (USD per hour) are treated as unknown, like NaN, infinities and negatives.
    pub max_price_per_hour: f64,
    /// Facts derived from cached Nodes, by name, valid for the resourceVersion they came from.
    pub facts: FactsCache,
    /// The room plans hold, as last built ([`HeldRoom`]).
    pub held: HeldCache,
}

/// The last view of the room plans hold and when it was built, shared by filter calls for
/// [`HELD_ROOM_REFRESH`] while the plans do not change.
#[derive(Default)]
pub struct HeldCache(std::sync::Mutex<Option<(Instant, Arc<HeldRoom>)>>);

/// Per-node facts computed once per Node version, so a NodeNames call over thousands of nodes
/// is a lookup per name rather than a label walk and catalog lookup per name. Weighed in bytes
/// against [`FACTS_CACHE_BYTES`] (in the memory bound, as the webhook's caches are): an entry
/// weighs the buffers of its name, its version and its facts' strings, and
/// [`FACTS_ENTRY_OVERHEAD`]; past that the coldest go.
pub struct FactsCache(quick_cache::sync::Cache<String, Arc<CachedFacts>, FactsWeight>);

/// A node's facts, the resourceVersion of the Node they came from and the version of the
/// offerings that priced it ([`crate::cluster::picture::NodePricing::version`]; 0: none).
struct CachedFacts {
    rv: String,
    pricing: u64,
    facts: Arc<NodeFacts>,
}

/// The most the node facts cache weighs: about 4,800 nodes' facts (names of 40 characters),
/// 2,500 of the heaviest a Node gives. Counted in `Config::memory_bound_bytes`.
pub const FACTS_CACHE_BYTES: usize = 4 * 1024 * 1024;
/// The cache's structure besides its entries (shards, their tables and ghost lists).
pub const FACTS_STRUCTURE_BYTES: u64 = 256 * 1024;
/// What one entry holds besides its strings' buffers: the `Arc`s, the facts' struct, the
/// cache's slot and table (over-counted; measured by `tests/cache_weight.rs`).
pub const FACTS_ENTRY_OVERHEAD: usize = 768;

#[derive(Clone)]
struct FactsWeight;

impl quick_cache::Weighter<String, Arc<CachedFacts>> for FactsWeight {
    fn weight(&self, name: &String, e: &Arc<CachedFacts>) -> u64 {
        let f = &e.facts;
        let strings = name.capacity() + e.rv.capacity() + f.name.capacity() + [&f.arch, &f.os, &f.bad_price].iter().map(|s| s.as_ref().map_or(0, String::capacity)).sum::<usize>();
        u64::try_from(FACTS_ENTRY_OVERHEAD + strings).unwrap_or(u64::MAX)
    }
}

impl Default for FactsCache {
    fn default() -> Self {
        Self::with_capacity(FACTS_CACHE_BYTES)
    }
}

impl FactsCache {
    /// A cache of at most `bytes` by its weights.
    pub fn with_capacity(bytes: usize) -> Self {
        let items = (bytes / 256).max(16);
        Self(quick_cache::sync::Cache::with_weighter(items, bytes as u64, FactsWeight))
    }

    /// Bytes held by the cache's own weighing.
    pub fn weighted_bytes(&self) -> u64 {
        self.0.weight()
    }

    /// Entries held.
    pub fn entries(&self) -> usize {
        self.0.len()
    }

    /// Facts for each name (None: not in the node cache), computing what is missing or stale.
    pub fn lookup<S: AsRef<str>>(&self, names: &[S], store: Option<&Store<Node>>, prices: &PriceRules<'_>) -> Vec<Option<Arc<NodeFacts>>> {
        let Some(store) = store else { return vec![None; names.len()] };
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let name = name.as_ref();
            let Some(node) = store.get(&ObjectRef::new(name)) else {
                out.push(None);
                continue;
            };
            let rv = node.metadata.resource_version.as_deref().unwrap_or("");
            let pricing = prices.version();
            match self.0.get(name) {
                Some(e) if e.rv == rv && e.pricing == pricing && !rv.is_empty() => out.push(Some(e.facts.clone())),
                _ => {
                    let facts = Arc::new(NodeFacts::from_node(&node, prices));
                    self.0.insert(name.to_string(), Arc::new(CachedFacts { rv: rv.to_string(), pricing, facts: facts.clone() }));
                    out.push(Some(facts));
                }
            }
        }
        out
    }
}

pub fn router(extender: Arc<Extender>) -> Router {
    Router::new()
        .route("/scheduler/filter", post(filter))
        .route("/scheduler/prioritize", post(prioritize))
        .with_state(extender)
}

/// Where node prices come from and which ones are believed.
pub struct PriceRules<'a> {
    pub catalog: &'a Catalog,
    /// USD per hour; a price above it is absurd.
    pub max_per_hour: f64,
    /// The provisioner's offerings and claims, while this process provisions.
    pub pricing: Option<crate::cluster::picture::NodePricing>,
}

impl PriceRules<'_> {
    /// The version of the offerings prices come from (0: none).
    fn version(&self) -> u64 {
        self.pricing.as_ref().map_or(0, |p| p.version())
    }

    /// The node's price by the one rule ([`archer_model::price::node_price`]), as the provisioner,
    /// report and simulate read it: the node's annotation, the offering it is (live prices,
    /// NodeOverlays applied), the claim that made it, the catalog in its region. The offerings
    /// and claims are the provisioner's, so a process that only runs the extender prices by
    /// annotation and catalog. A price the node names that is not a finite number in
    /// `0..=max_per_hour` makes the price unknown, with the reason (it is not replaced by another:
    /// the annotation is the operator's word, and it is wrong).
    fn price(&self, node: &str, label: &dyn Fn(&str) -> Option<String>, annotation: Option<&str>) -> Result<Option<f64>, String> {
        let offerings: &[archer_core::packer::Offering] = self.pricing.as_ref().map_or(&[], |p| p.offerings.as_slice());
        let claim = self.pricing.as_ref().and_then(|p| p.claim_price(node));
        let sources = archer_model::price::Sources { offerings, catalog: Some(self.catalog), max_per_hour: self.max_per_hour };
        match archer_model::price::node_price(&sources, label, annotation, claim) {
            Ok(p) => Ok(Some(p.per_hour)),
            Err(archer_model::price::Unpriced::NotBelieved(why)) => Err(why),
            Err(archer_model::price::Unpriced::Unknown(_)) => Ok(None),
        }
    }
}

/// What a node offers the decision, from either a full Node object or the Node cache.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    pub name: String,
    pub arch: Option<String>,
    pub os: Option<String>,
    pub price: Option<f64>,
    /// Why a price the node names was not believed (it is then unknown).
    pub bad_price: Option<String>,
    pub allocatable: Resources,
}

impl NodeFacts {
    fn build(name: String, label: &dyn Fn(&str) -> Option<String>, price_annotation: Option<&str>, allocatable: Resources, prices: &PriceRules<'_>) -> Self {
        let (price, bad_price) = match prices.price(&name, label, price_annotation) {
            Ok(p) => (p, None),
            Err(why) => (None, Some(why)),
        };
        NodeFacts { arch: label(labels::ARCH), os: label(labels::OS), price, bad_price, allocatable, name }
    }

    /// The facts of a node of the request, taking its name and platform labels (no copy of
    /// what is already owned).
    pub fn from_lite(n: wire::NodeLite<'_>, prices: &PriceRules<'_>) -> Self {
        let wire::NodeLite { metadata, status } = n;
        let labels = metadata.labels.unwrap_or_default();
        let label = |k: &str| labels.get(k).map(str::to_string);
        let annotation = metadata.annotations.as_ref().and_then(|a| a.price.as_deref());
        let alloc = status.as_ref().and_then(|s| s.allocatable.as_ref());
        let q = |v: Option<&str>, f: fn(&str) -> Option<i64>| v.and_then(f).unwrap_or(0);
        let allocatable = Resources::new(
            q(alloc.and_then(|a| a.cpu.as_deref()), archer_core::quantity::cpu_millis),
            q(alloc.and_then(|a| a.memory.as_deref()), archer_core::quantity::value),
            q(alloc.and_then(|a| a.pods.as_deref()), archer_core::quantity::value),
        );
        let (price, bad_price) = match prices.price(&metadata.name, &label, annotation) {
            Ok(p) => (p, None),
            Err(why) => (None, Some(why)),
        };
        NodeFacts { name: metadata.name.into_owned(), arch: labels.arch.map(Cow::into_owned), os: labels.os.map(Cow::into_owned), price, bad_price, allocatable }
    }

    pub fn from_node(n: &Node, prices: &PriceRules<'_>) -> Self {
        let labels = n.metadata.labels.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k)).cloned();
        let annotation = n.metadata.annotations.as_ref().and_then(|a| a.get(labels::PRICE_ANNOTATION)).map(String::as_str);
        let allocatable = Resources::from_map(n.status.as_ref().and_then(|s| s.allocatable.as_ref()));
        Self::build(n.metadata.name.clone().unwrap_or_default(), &label, annotation, allocatable, prices)
    }
}

/// Bodies shorter than this are parsed on the worker that received them (a fraction of a
/// millisecond's work); longer ones move off it ([`cpu_bound`]).
pub const OFF_WORKER_BYTES: usize = 256 * 1024;

/// Run CPU-heavy work over `bytes` of input (parsing up to tens of MiB) without starving other
/// tasks on this worker, where the runtime allows it. Small inputs run in place: handing the
/// worker's core to another thread (`block_in_place`) for every call grew the blocking pool to
/// a hundred threads under 24 concurrent clients, and each thread's allocator heap held memory
/// of its own (1.2 GiB RSS after 4,000 prioritize calls of 60 Nodes; `tests/sustained_load.rs`).
fn cpu_bound<R>(bytes: usize, f: impl FnOnce() -> R) -> R {
    if bytes < OFF_WORKER_BYTES {
        return f();
    }
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// An answer that keeps the call's share of the memory budget until it has been sent.
fn held_response(body: Vec<u8>, budget: MemoryPermit) -> Response {
    let len = body.len();
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json".to_string()), (header::CONTENT_LENGTH, len.to_string())], held_body(body.into(), budget)).into_response()
}

/// The budget's label for what a call builds from its body.
const DECODED: &str = "extender_decoded";
/// What one call holds whatever its size: its task, its futures, its span and scratch buffers.
const CALL_BYTES: usize = 64 * 1024;

/// What a call of this shape builds from its body besides the body (charged with the body, as
/// `body.expansion` times it, for the copies of its text the call makes): a share per node
/// ([`wire::NODE_BYTES`]) and twice the decoded pod's cost (the pod, and what the checks derive
/// from it: its scheduling view, its images and their platforms). Reserved before any of it is
/// built, and held until the answer has been sent.
pub fn call_bytes(shape: &wire::Shape) -> usize {
    CALL_BYTES.saturating_add(shape.nodes.saturating_mul(wire::NODE_BYTES)).saturating_add(shape.pod_bytes.saturating_mul(2))
}

/// Read, weigh and charge a call's body: the body and what the call will build from it
/// ([`call_bytes`]) are held in the budget before anything is built. `Err`: (reason, message).
async fn admit(x: &Extender, req: Request<Body>) -> Result<(bytes::Bytes, MemoryPermit), (&'static str, String)> {
    let (body, mut budget) = read_body(req, &x.body).await.map_err(|e| (e.reason(), e.to_string()))?;
    let shape = cpu_bound(body.len(), || wire::shape(&body)).map_err(|e| (e.reason(), e.to_string()))?;
    let until = tokio::time::Instant::now() + x.body.budget_wait;
    // The call holds its body already: what it builds is added before waiting reservations.
    x.body.budget.reserve_more(&mut budget, DECODED, call_bytes(&shape), until).await.map_err(|e| ("memory_budget", format!("server busy: {e}")))?;
    Ok((body, budget))
}

/// A reason as the answer gives it: at most [`wire::MAX_REASON_BYTES`], control characters
/// (which JSON escapes six times over) as spaces, so a node's entry in the answer stays within
/// what its call reserved.
fn reason(why: String) -> String {
    let clean = |c: char| if c.is_control() { ' ' } else { c };
    if why.len() <= wire::MAX_REASON_BYTES && !why.chars().any(char::is_control) {
        return why;
    }
    let mut out = String::with_capacity(wire::MAX_REASON_BYTES);
    for c in why.chars().map(clean) {
        if out.len() + c.len_utf8() > wire::MAX_REASON_BYTES - 3 {
            out.push_str("...");
            break;
        }
        out.push(c);
    }
    out
}

fn filter_error(metrics: &ExtenderMetrics, reason: &str, message: String) -> Response {
    metrics.requests.get_or_create(&labels2("verb", "filter", "result", reason)).inc();
    tracing::warn!(verb = "filter", reason, detail = %message, "extender call with bad input");
    let r = FilterResult { error: message, ..Default::default() };
    json_response(StatusCode::OK, r.to_json())
}

impl Extender {
    fn policy_for(&self, pod: &Pod) -> policy::Policy {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        crate::cluster::namespace_policy(self.cluster.as_ref(), &self.defaults, ns).0
    }

    fn prices(&self) -> PriceRules<'_> {
        PriceRules { catalog: &self.catalog, max_per_hour: self.max_price_per_hour, pricing: self.picture.as_ref().and_then(Picture::node_pricing) }
    }

    /// The provisioning plan's node for the pod, when kube-scheduler should take only it: (that
    /// node, why the others are refused), by [`handoff::steer`] on the cluster state now. Only a
    /// process that provisions has plans; the state is built only for a pod one placed.
    fn plan_steer(&self, pod: &Pod, candidates: &[&str]) -> Option<(String, String)> {
        let picture = self.picture.as_ref()?;
        let placement = picture.plans().placement(&archer_core::pod_id(pod))?;
        tracing::Span::current().record("hint", placement.node.as_str());
        // Offered (the common case): decided on the placement alone, no state built.
        let steer = match handoff::offered(&placement, candidates) {
            Some(s) => s,
            None => handoff::steer(&picture.handoff_state()?, pod, candidates)?,
        };
        if steer.offered {
            self.metrics.planned_placements.inc();
        }
        Some((steer.node, steer.why))
    }

    /// Candidates refused to a pod kube-scheduler is free to place (no plan steers it) because
    /// their room is held for pending pods a plan put there ([`HeldRoom`]); its own planned
    /// node, if any, aside. Node name -> why.
    fn held_refusals(&self, pod: &Pod, candidates: &[&str]) -> std::collections::HashMap<String, String> {
        let Some(picture) = self.picture.as_ref() else { return Default::default() };
        let (version, placements) = picture.plans().snapshot();
        if placements.is_empty() {
            return Default::default();
        }
        let own = placements.get(&archer_core::pod_id(pod)).map(|p| p.node.as_str());
        // Built from the hand-off's state at most every HELD_ROOM_REFRESH while no plan changes.
        let held = {
            let cached = self.held.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
            match cached {
                Some((built, h)) if h.version == version && built.elapsed() < HELD_ROOM_REFRESH => h,
                _ => {
                    let Some(state) = picture.handoff_state() else { return Default::default() };
                    let h = Arc::new(cpu_bound(usize::MAX, || HeldRoom::build(&state)));
                    *self.held.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), h.clone()));
                    h
                }
            }
        };
        let set: Vec<&str> = candidates.iter().copied().filter(|c| Some(*c) != own).collect();
        let refused = held.refusals(pod, &set);
        if refused.is_empty() {
            return Default::default();
        }
        self.metrics.held_room_refusals.inc_by(refused.len() as u64);
        tracing::debug!(nodes = refused.len(), first = refused.first().map(|(_, why)| why.as_str()).unwrap_or(""), "nodes refused: room held for planned pods");
        refused.into_iter().collect()
    }

    async fn pod_platforms(&self, pod: &Pod) -> PodPlatforms {
        crate::cluster::pod_platforms(&self.inspector, self.cluster.as_ref(), &self.base_keyring, pod, self.inspection_timeout).await
    }
}

/// How long one view of the room plans hold serves filter calls while no placement changes. A
/// pod binding meanwhile counts the same on its node, held or bound.
const HELD_ROOM_REFRESH: Duration = Duration::from_millis(250);


/// Why pods must not land on `name` yet: another node of its launch batch is still unregistered
/// (the scheduler would otherwise pack a batch meant to spread onto its first node to come up).
fn batch_registering(store: &Store<Node>, name: &str) -> Option<String> {
    let node = store.get(&kube::runtime::reflector::ObjectRef::new(name))?;
    let siblings = node.metadata.annotations.as_ref()?.get(labels::BATCH_NODES_ANNOTATION)?;
    siblings
        .split(',')
        .filter(|s| !s.is_empty())
        .find(|s| store.get(&kube::runtime::reflector::ObjectRef::new(s)).is_some_and(|n| archer_core::taints::node_has_taint(&n, labels::UNREGISTERED_TAINT)))
        .map(|s| format!("node {s} of the same launch batch is still registering"))
}

/// Why `node` cannot run the pod, or `None` when it can (or its architecture is unknown).
fn unrunnable_reason(node: &NodeFacts, all: &PlatformSet, per_image: &[(String, PlatformSet)]) -> Option<String> {
    let arch = node.arch.as_deref()?;
    let os = node.os.as_deref().unwrap_or("linux");
    let runs = |set: &PlatformSet| runs_on(set, Some(os), arch);
    if runs(all) {
        return None;
    }
    let culprits: Vec<String> = per_image.iter().filter(|(_, p)| !runs(p)).map(|(i, p)| format!("image {i} supports {p}")).collect();
    let why = if culprits.is_empty() { format!("the pod's images support {all} ({PLATFORMS_ANNOTATION})") } else { culprits.join("; ") };
    Some(format!("{why}; node is {os}/{arch}"))
}

/// Whether a node of `os` (Linux when unlabelled) and `arch` runs a platform of `set`.
fn runs_on(set: &PlatformSet, os: Option<&str>, arch: &str) -> bool {
    let os = os.unwrap_or("linux");
    set.0.iter().any(|p| p.architecture == arch && p.os == os)
}

/// The filter's answer for one node.
enum Verdict {
    Keep,
    /// Not this node now (another plan's, room held for other pods, not registered yet).
    Fails(String),
    /// The pod's images cannot run on this node's platform, ever.
    Unrunnable(String),
}

/// What the filter checks each candidate node against, read once per request.
struct NodeChecks<'a> {
    /// The node a live plan put the pod on, and why the others are refused.
    steer: Option<(String, String)>,
    /// Nodes whose free room is held for pods a plan put there.
    held: std::collections::HashMap<String, String>,
    all: Option<&'a PlatformSet>,
    per_image: &'a [(String, PlatformSet)],
    /// `all` less what the pod's namespace's policy forbids ([`policy::Policy::placeable`],
    /// the planner's rule too), when it forbids anything.
    placeable: Option<(PlatformSet, Vec<String>)>,
}

impl<'a> NodeChecks<'a> {
    fn new(x: &Extender, pod: &Pod, names: &[&str], all: Option<&'a PlatformSet>, per_image: &'a [(String, PlatformSet)]) -> NodeChecks<'a> {
        let policy = x.policy_for(pod);
        let placeable = all.zip(policy.placement_architectures()).map(|(a, allowed)| (policy.placeable(a), allowed.to_vec()));
        let steer = x.plan_steer(pod, names);
        if let Some((planned, _)) = &steer {
            tracing::Span::current().record("planned", planned.as_str());
        }
        let held = if steer.is_none() { x.held_refusals(pod, names) } else { Default::default() };
        NodeChecks { steer, held, all, per_image, placeable }
    }

    /// The plan's steer first, then held room, then the images' platforms; a node that passes
    /// is kept unless `registering` says its batch is still coming up (the plan's own pod never
    /// waits for that).
    fn verdict(&self, name: &str, facts: Option<&NodeFacts>, registering: &dyn Fn(&str) -> Option<String>) -> Verdict {
        if let Some((planned, why)) = &self.steer {
            if name != planned {
                return Verdict::Fails(why.clone());
            }
        }
        if let Some(why) = self.held.get(name) {
            return Verdict::Fails(why.clone());
        }
        let Some(facts) = facts else { return Verdict::Fails("node not found in Archer's node cache".into()) };
        if let Some(why) = self.all.and_then(|a| unrunnable_reason(facts, a, self.per_image)) {
            return Verdict::Unrunnable(why);
        }
        if let Some((placeable, allowed)) = &self.placeable {
            if let Some(arch) = facts.arch.as_deref().filter(|arch| !runs_on(placeable, facts.os.as_deref(), arch)) {
                return Verdict::Unrunnable(format!("the namespace allows only {} ({}); node is {arch}", allowed.join(","), policy::ALLOWED_ARCHITECTURES));
            }
        }
        match self.steer.is_none().then(|| registering(name)).flatten() {
            Some(why) => Verdict::Fails(why),
            None => Verdict::Keep,
        }
    }
}

#[tracing::instrument(skip_all, fields(pod = tracing::field::Empty, namespace = tracing::field::Empty, nodes = tracing::field::Empty, planned = tracing::field::Empty, hint = tracing::field::Empty))]
async fn filter(State(x): State<Arc<Extender>>, req: Request<Body>) -> Response {
    let started = Instant::now();
    // Held until the answer is sent: the body, the parsed pod and node list, and the answer.
    let (body, budget) = match admit(&x, req).await {
        Ok(b) => b,
        Err((reason, message)) => return filter_error(&x.metrics, reason, message),
    };
    let args = match cpu_bound(body.len(), || parse_args(&body)) {
        Ok(a) => a,
        Err(e) => return filter_error(&x.metrics, e.reason(), e.to_string()),
    };
    let span = tracing::Span::current();
    span.record("pod", args.pod.metadata.name.as_deref().unwrap_or(""));
    span.record("namespace", args.pod.metadata.namespace.as_deref().unwrap_or(""));
    let platforms = x.pod_platforms(&args.pod).await;
    let mut result = FilterResult::default();
    let (all, per_image) = match &platforms {
        PodPlatforms::Known { all, per_image, .. } => (Some(all), per_image.as_slice()),
        PodPlatforms::Unknown(why) => {
            tracing::info!(reason = %why, "pod platforms unknown; keeping every node");
            (None, &[][..])
        }
    };
    let mut removed = 0u64;
    let mut record = |result: &mut FilterResult<'_>, name: String, verdict: Verdict| match verdict {
        Verdict::Keep => {}
        Verdict::Fails(why) => {
            result.failed_nodes.insert(name, reason(why));
        }
        Verdict::Unrunnable(why) => {
            removed += 1;
            result.failed_and_unresolvable.insert(name, reason(why));
        }
    };
    match args.nodes {
        Nodes::Full(nodes) => {
            span.record("nodes", nodes.len());
            let checks = {
                let names: Vec<&str> = nodes.iter().map(|n| n.lite.metadata.name.as_ref()).collect();
                NodeChecks::new(&x, &args.pod, &names, all, per_image)
            };
            let mut keep = Vec::with_capacity(nodes.len());
            let prices = x.prices();
            for n in nodes {
                let raw = n.raw;
                let facts = NodeFacts::from_lite(n.lite, &prices);
                match checks.verdict(&facts.name, Some(&facts), &|_| None) {
                    Verdict::Keep => keep.push(raw),
                    v => record(&mut result, facts.name, v),
                }
            }
            result.nodes = Some(keep);
        }
        Nodes::Names(names) => {
            span.record("nodes", names.len());
            let facts = x.facts.lookup(&names, x.nodes.as_ref(), &x.prices());
            let checks = {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                NodeChecks::new(&x, &args.pod, &names, all, per_image)
            };
            // Other pods wait for a node's whole batch to register (the plan's own pod does not).
            let registering = |name: &str| x.nodes.as_ref().and_then(|store| batch_registering(store, name));
            let mut keep = Vec::with_capacity(names.len());
            for (name, facts) in names.into_iter().zip(facts) {
                match checks.verdict(&name, facts.as_deref(), &registering) {
                    Verdict::Keep => keep.push(name),
                    v => record(&mut result, name, v),
                }
            }
            result.node_names = Some(keep);
        }
    }
    x.metrics.filtered_nodes.inc_by(removed);
    x.metrics.requests.get_or_create(&labels2("verb", "filter", "result", "ok")).inc();
    x.metrics.filter_seconds.observe(started.elapsed().as_secs_f64());
    tracing::debug!(removed, elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "filter answered");
    held_response(result.to_json(), budget)
}

#[tracing::instrument(skip_all, fields(pod = tracing::field::Empty, namespace = tracing::field::Empty, nodes = tracing::field::Empty))]
async fn prioritize(State(x): State<Arc<Extender>>, req: Request<Body>) -> Response {
    let started = Instant::now();
    // HostPriorityList has no error field: bad input is answered with an empty list (every node
    // neutral), counted and logged, so scheduling never stalls on Archer.
    let empty = || json_response(StatusCode::OK, b"[]".to_vec());
    let bad = |reason: &str, error: &dyn std::fmt::Display| {
        x.metrics.requests.get_or_create(&labels2("verb", "prioritize", "result", reason)).inc();
        tracing::warn!(reason, %error, "prioritize call with bad input");
        empty()
    };
    let (body, budget) = match admit(&x, req).await {
        Ok(b) => b,
        Err((reason, message)) => return bad(reason, &message),
    };
    let args = match cpu_bound(body.len(), || parse_args(&body)) {
        Ok(a) => a,
        Err(e) => return bad(e.reason(), &e),
    };
    let span = tracing::Span::current();
    span.record("pod", args.pod.metadata.name.as_deref().unwrap_or(""));
    span.record("namespace", args.pod.metadata.namespace.as_deref().unwrap_or(""));
    let facts: Vec<NodeFacts> = match args.nodes {
        Nodes::Full(nodes) => {
            let prices = x.prices();
            nodes.into_iter().map(|n| NodeFacts::from_lite(n.lite, &prices)).collect()
        }
        Nodes::Names(names) => x
            .facts
            .lookup(&names, x.nodes.as_ref(), &x.prices())
            .into_iter()
            .zip(names)
            .map(|(f, name)| match f {
                Some(f) => (*f).clone(),
                None => NodeFacts { name, arch: None, os: None, price: None, bad_price: None, allocatable: Resources::default() },
            })
            .collect(),
    };
    span.record("nodes", facts.len());
    for f in facts.iter().filter(|f| f.bad_price.is_some()) {
        x.metrics.invalid_prices.inc();
        tracing::warn!(node = %f.name, reason = f.bad_price.as_deref().unwrap_or(""), "node price not believed; scored as unknown");
    }
    let unknown = facts.iter().filter(|f| f.price.is_none()).count() as u64;
    x.metrics.unknown_price_nodes.inc_by(unknown);
    let policy = x.policy_for(&args.pod);
    let request = pod_requests(&args.pod, true);
    let candidates: Vec<Candidate> = facts
        .into_iter()
        .map(|f| Candidate { name: f.name, arch: f.arch, price: f.price, allocatable: f.allocatable })
        .collect();
    let mut scores = scoring::score(request, &candidates, &policy, x.preference_bonus);
    // The node the provisioner's plan put this pod on scores highest; the others keep their
    // order at half weight. kube-scheduler then binds the pod where the plan counted on it.
    let planned = x.picture.as_ref().and_then(|p| p.plans().placement(&archer_core::pod_id(&args.pod))).map(|at| at.node);
    if let Some(planned) = planned {
        if candidates.iter().any(|c| c.name == planned) {
            for (c, s) in candidates.iter().zip(scores.iter_mut()) {
                *s = if c.name == planned { scoring::MAX_SCORE } else { *s / 2 };
            }
        }
    }
    let list: Vec<HostPriority> = candidates.into_iter().zip(scores).map(|(c, score)| HostPriority { host: c.name, score }).collect();
    x.metrics.requests.get_or_create(&labels2("verb", "prioritize", "result", "ok")).inc();
    x.metrics.prioritize_seconds.observe(started.elapsed().as_secs_f64());
    held_response(wire::priorities_json(&list), budget)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::{reflector, watcher};

    fn node(name: &str, unregistered: bool, batch: &str) -> Node {
        let taints = unregistered.then(|| vec![k8s_openapi::api::core::v1::Taint { key: labels::UNREGISTERED_TAINT.into(), effect: "NoSchedule".into(), ..Default::default() }]);
        Node {
            metadata: kube::api::ObjectMeta { name: Some(name.into()), annotations: Some([(labels::BATCH_NODES_ANNOTATION.to_string(), batch.to_string())].into()), ..Default::default() },
            spec: Some(k8s_openapi::api::core::v1::NodeSpec { taints, ..Default::default() }),
            ..Default::default()
        }
    }

    fn store(nodes: Vec<Node>) -> Store<Node> {
        let mut writer = reflector::store::Writer::<Node>::default();
        for n in nodes {
            writer.apply_watcher_event(&watcher::Event::Apply(n));
        }
        writer.as_reader()
    }

    #[test]
    fn a_registered_node_waits_for_the_rest_of_its_batch() {
        let s = store(vec![node("a", false, "b,c"), node("b", true, "a,c"), node("c", false, "a,b")]);
        assert_eq!(batch_registering(&s, "a").as_deref(), Some("node b of the same launch batch is still registering"));
        assert_eq!(batch_registering(&s, "c").as_deref(), Some("node b of the same launch batch is still registering"));
        // Once b registers (or is gone), a takes pods.
        let s = store(vec![node("a", false, "b,c"), node("b", false, "a,c"), node("c", false, "a,b")]);
        assert_eq!(batch_registering(&s, "a"), None);
        let s = store(vec![node("a", false, "b")]);
        assert_eq!(batch_registering(&s, "a"), None);
    }

    fn heavy_node(i: usize) -> Node {
        let meta = serde_json::json!({"name": format!("{i:06}{}", "n".repeat(200)), "resourceVersion": format!("{}", 1000 + i),
            "labels": {labels::ARCH: "a".repeat(63), labels::OS: "o".repeat(63)}, "annotations": {labels::PRICE_ANNOTATION: "p".repeat(4000)}});
        Node { metadata: serde_json::from_value(meta).expect("meta"), ..Default::default() }
    }

    #[test]
    fn the_facts_cache_is_weighed_in_bytes_and_stays_within_its_share() {
        let catalog = Catalog::embedded().expect("catalog");
        let prices = PriceRules { catalog: &catalog, max_per_hour: 1000.0, pricing: None };
        let nodes: Vec<Node> = (0..2000).map(heavy_node).collect();
        let names: Vec<String> = nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
        let s = store(nodes);
        const SHARE: usize = 256 * 1024;
        let cache = FactsCache::with_capacity(SHARE);
        for chunk in names.chunks(100) {
            // Every name is answered, cached or not.
            let facts = cache.lookup(chunk, Some(&s), &prices);
            assert!(facts.iter().zip(chunk).all(|(f, n)| f.as_ref().is_some_and(|f| &f.name == n && f.bad_price.is_some())));
        }
        // An entry weighs at least its strings: 2 x 206 (name) + 2 x 63 + the reason.
        let entry = FACTS_ENTRY_OVERHEAD + 2 * 206 + 2 * 63 + 100;
        assert!(cache.weighted_bytes() <= SHARE as u64, "{} weighed", cache.weighted_bytes());
        assert!(cache.entries() <= SHARE / entry && cache.entries() > SHARE / entry / 4, "{} entries of about {entry} bytes kept", cache.entries());
        // The reason quotes a bounded part of the annotation.
        let f = cache.lookup(&names[..1], Some(&s), &prices).remove(0).expect("facts");
        assert!(f.bad_price.as_ref().is_some_and(|r| r.len() < 200 && r.contains("...")), "{:?}", f.bad_price);
    }

    /// The extender prices a node by the same rule and sources as the provisioner: in a region the
    /// catalog does not price (eu-west-1), by the offering it is (live prices, overlays applied),
    /// else by the claim it came from; and again once the offerings change. Before, it read only
    /// the annotation and the catalog, and these nodes had no price.
    #[test]
    fn nodes_are_priced_by_the_provisioners_offerings_and_claims() {
        let catalog = Catalog::embedded().expect("catalog");
        let node = |name: &str, it: &str| {
            let meta = serde_json::json!({"name": name, "resourceVersion": "7", "labels": {labels::ARCH: "arm64", labels::INSTANCE_TYPE: it, labels::ZONE: "eu-west-1a", labels::KARPENTER_CAPACITY_TYPE: "on-demand"}});
            Node { metadata: serde_json::from_value(meta).expect("meta"), ..Default::default() }
        };
        let s = store(vec![node("a", "c7g.large"), node("b", "m7g.large")]);
        let offering = |price: f64| archer_core::packer::Offering { instance: catalog.get("c7g.large").expect("c7g").clone(), zone: "eu-west-1a".into(), capacity: archer_core::instance::CapacityType::OnDemand, price, pool: None };
        let mut claims = reflector::store::Writer::<archer_api::nodeclaim::NodeClaim>::default();
        let claim: archer_api::nodeclaim::NodeClaim = serde_json::from_value(serde_json::json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": "c-b"},
            "spec": {"nodePool": "p", "instanceType": "m7g.large", "zone": "eu-west-1a", "capacityType": "on-demand", "arch": "arm64", "os": "linux", "pricePerHour": 0.0892}, "status": {"nodeName": "b"}})).expect("claim");
        claims.apply_watcher_event(&watcher::Event::Apply(claim));
        let claims = claims.as_reader();
        let cache = FactsCache::default();
        let price = |pricing: Option<crate::cluster::picture::NodePricing>| {
            let rules = PriceRules { catalog: &catalog, max_per_hour: 1000.0, pricing };
            cache.lookup(&["a", "b"], Some(&s), &rules).into_iter().map(|f| f.and_then(|f| f.price)).collect::<Vec<_>>()
        };
        assert_eq!(price(None), [None, None], "the catalog has no eu-west-1 prices");
        let offerings = Arc::new(vec![offering(0.0624)]);
        let live = crate::cluster::picture::NodePricing::new(offerings.clone(), 1, claims.clone());
        assert_eq!(price(Some(live)), [Some(0.0624), Some(0.0892)], "the offering; the claim");
        // New offerings (a refresh, an overlay) price the same Node version again.
        assert_eq!(price(Some(crate::cluster::picture::NodePricing::new(Arc::new(vec![offering(0.078)]), 2, claims.clone())))[0], Some(0.078));
    }

    #[test]
    fn reasons_are_cut_and_cleaned() {
        assert_eq!(reason("node is linux/arm64".into()), "node is linux/arm64");
        let long = reason(format!("image {} supports linux/amd64", "é".repeat(1000)));
        assert!(long.len() <= wire::MAX_REASON_BYTES && long.ends_with("...") && long.starts_with("image éé"), "{}", long.len());
        assert_eq!(reason("a\u{1}b\nc".into()), "a b c");
    }

    fn extender(budget: archer_limits::MemoryBudget) -> Arc<Extender> {
        let cfg = crate::config::Config::default();
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let client = archer_registry::RegistryClient::new(crate::cli::client_settings(&cfg, budget.clone()).expect("settings")).expect("client");
        Arc::new(Extender {
            catalog: Arc::new(Catalog::embedded().expect("catalog")),
            inspector: Inspector::new(client, &crate::cli::cache_settings(&cfg), metrics.registry.clone()),
            cluster: None,
            picture: None,
            nodes: None,
            defaults: cfg.defaults.clone(),
            base_keyring: Keyring::default(),
            metrics: metrics.extender.clone(),
            inspection_timeout: Duration::from_secs(1),
            preference_bonus: cfg.extender.preference_bonus,
            body: BodyLimits { max_bytes: cfg.extender.max_body_bytes, expansion: 3, read_timeout: Duration::from_secs(5), budget_wait: Duration::from_millis(100), budget, consumer: "extender_body" },
            max_price_per_hour: cfg.extender.max_price_per_hour,
            facts: FactsCache::default(),
            held: HeldCache::default(),
        })
    }

    async fn call(x: &Arc<Extender>, path: &str, body: String) -> serde_json::Value {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let req = Request::post(path).header(header::CONTENT_LENGTH, body.len()).body(Body::from(body)).expect("request");
        let r = router(x.clone()).oneshot(req).await.expect("call");
        let bytes = r.into_body().collect().await.expect("body").to_bytes();
        serde_json::from_slice(&bytes).expect("json")
    }

    #[tokio::test]
    async fn a_call_reserves_what_its_nodes_and_pod_will_take_before_building_them() {
        let budget = archer_limits::MemoryBudget::new(16 << 20);
        let x = extender(budget.clone());
        let pod = r#"{"metadata":{"name":"p","annotations":{"archer.dev/platforms":"linux/amd64"}},"spec":{"containers":[{"name":"c","image":"app:1"}]}}"#;
        // A few names: answered, and every byte given back once the answer is read.
        let v = call(&x, "/scheduler/filter", format!(r#"{{"Pod":{pod},"NodeNames":["a","b"]}}"#)).await;
        assert_eq!(v["Error"], "", "{v}");
        assert_eq!(v["FailedNodes"]["a"], "node not found in Archer's node cache");
        assert_eq!(budget.in_use_bytes(), 0);
        // 20,000 names are 200 KB of body but more than the budget once listed and answered.
        let names = (0..20_000).map(|i| format!("\"{i}\"")).collect::<Vec<_>>().join(",");
        let v = call(&x, "/scheduler/filter", format!(r#"{{"Pod":{pod},"NodeNames":[{names}]}}"#)).await;
        assert!(v["Error"].as_str().is_some_and(|e| e.contains("memory budget")), "{v}");
        // So is a pod of 10,000 empty volumes (30 KB of JSON).
        let volumes = vec!["{}"; 10_000].join(",");
        let v = call(&x, "/scheduler/prioritize", format!(r#"{{"Pod":{{"spec":{{"volumes":[{volumes}]}}}},"NodeNames":["a"]}}"#)).await;
        assert_eq!(v, serde_json::json!([]));
        for verb in ["filter", "prioritize"] {
            assert_eq!(x.metrics.requests.get_or_create(&labels2("verb", verb, "result", "memory_budget")).get(), 1, "{verb}");
        }
        assert_eq!(budget.in_use_bytes(), 0);
    }
}
