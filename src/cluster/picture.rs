//! The one place a [`ClusterState`] is built in a running Archer: the provisioner's watch caches
//! (pods, nodes, claims, pools, DaemonSets, volumes), the cluster view's namespaces, the safety
//! record and node registrations, the plans in flight, and the cloud provider's offerings and
//! node-class readiness, all read at one moment. The provisioner's executors and the extender
//! read the same state; only a process that provisions has one (the caches and the plans are
//! the provisioner's).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use archer_cloud::{CloudProvider, NodeClassReadiness};
use archer_model::plans::Plans;
use archer_core::catalog::Catalog;
use archer_core::packer::Offering;
use archer_model::overlay::Outcome;
use archer_core::policy::PolicyDefaults;
use archer_model::ClusterState;
use archer_api::nodeclaim::NodeClaim;
use kube::runtime::reflector::Store;

use super::plans::PlanBook;
use super::stores::Stores;
use super::ClusterView;

/// The provisioner's caches and its cloud provider.
type Live = (Stores, Arc<dyn CloudProvider>);

/// What the state is built from.
#[derive(Clone)]
pub struct Picture {
    view: ClusterView,
    plans: PlanBook,
    /// The provisioner's caches and provider, while this process provisions.
    live: Arc<RwLock<Option<Live>>>,
    /// The config's policy defaults, which namespaces' annotations override.
    defaults: Arc<PolicyDefaults>,
    /// The price catalog, for nodes no claim or offering prices.
    catalog: Arc<Catalog>,
    /// The provider's offerings last overlaid, and the result: overlays are applied again only
    /// when the offerings, an overlay or a pool change.
    overlaid: Arc<Mutex<Option<Overlaid>>>,
    /// The offerings the provisioner last planned with (overlaid), and a generation that grows
    /// whenever they change: what prices a node elsewhere in the process (the extender), as the
    /// one price rule reads them.
    planned: Arc<RwLock<Generation>>,
}

/// Offerings and the generation they are (0: none yet).
type Generation = (u64, Option<Arc<Vec<Offering>>>);

/// What prices a node besides its annotation and the catalog, while this process provisions:
/// the offerings the provisioner last planned with (NodeOverlays applied, live prices) and the
/// claims' prices by the node they became ([`archer_model::price::node_price`]'s order).
pub struct NodePricing {
    pub offerings: Arc<Vec<Offering>>,
    /// Grows whenever the offerings change (never 0).
    generation: u64,
    claims: Store<NodeClaim>,
    by_node: OnceLock<HashMap<String, f64>>,
}

impl NodePricing {
    /// `generation` (at least 1) must grow whenever `offerings` change.
    pub fn new(offerings: Arc<Vec<Offering>>, generation: u64, claims: Store<NodeClaim>) -> NodePricing {
        NodePricing { offerings, generation: generation.max(1), claims, by_node: OnceLock::new() }
    }

    /// Changes whenever the offerings may have: a node's facts priced under another version
    /// are priced again.
    pub fn version(&self) -> u64 {
        self.generation
    }

    /// The price of the claim that became `node` (the claims' map is made once, on first use).
    pub fn claim_price(&self, node: &str) -> Option<f64> {
        let map = self.by_node.get_or_init(|| self.claims.state().iter().filter_map(|c| Some((c.status.as_ref()?.node_name.clone()?, c.spec.price_per_hour))).collect());
        map.get(node).copied()
    }
}

/// Offerings with NodeOverlays applied, and what they were applied from.
struct Overlaid {
    source: Arc<Vec<Offering>>,
    versions: Vec<(String, String)>,
    offerings: Arc<Vec<Offering>>,
    outcomes: BTreeMap<String, Outcome>,
}

/// The names and generations of the overlays and pools (their specs; status writes leave the
/// generation alone): what an overlaid result depends on besides the offerings.
fn versions(state: &ClusterState) -> Vec<(String, String)> {
    let of = |m: &kube::api::ObjectMeta| (m.name.clone().unwrap_or_default(), format!("{}/{}", m.uid.as_deref().unwrap_or(""), m.generation.unwrap_or(0)));
    state.overlays.iter().map(|o| of(&o.metadata)).chain(state.pools.iter().map(|p| of(&p.metadata))).collect()
}

impl Picture {
    pub fn new(view: ClusterView, defaults: PolicyDefaults, catalog: Arc<Catalog>) -> Self {
        Picture { view, plans: PlanBook::default(), live: Arc::default(), defaults: Arc::new(defaults), catalog, overlaid: Arc::default(), planned: Arc::default() }
    }

    /// The Namespace, Node and pull-secret caches.
    pub fn view(&self) -> &ClusterView {
        &self.view
    }

    /// Where plans put pending pods (the provisioner records them here).
    pub fn plans(&self) -> &PlanBook {
        &self.plans
    }

    /// The provisioner's caches and provider while this process provisions; `None` when it
    /// stops (leadership lost: its plans are no longer followed either).
    pub fn attach(&self, live: Option<Live>) {
        if live.is_none() {
            self.plans.clear();
            self.planned.write().unwrap_or_else(|e| e.into_inner()).1 = None;
        }
        *self.live.write().unwrap_or_else(|e| e.into_inner()) = live;
    }

    /// The cluster at this moment, when this process provisions.
    pub fn state(&self) -> Option<ClusterState> {
        let (stores, provider) = self.live.read().unwrap_or_else(|e| e.into_inner()).clone()?;
        Some(self.state_of(&stores, provider.as_ref()))
    }

    /// What the extender's hand-off reads ([`archer_model::handoff`]: nodes, pods, claims and
    /// the plans), when this process provisions: the state without the provider's offerings,
    /// the pools' readiness and the safety record, which the hand-off does not read and which
    /// cost the most to copy.
    pub fn handoff_state(&self) -> Option<ClusterState> {
        let stores = self.live.read().unwrap_or_else(|e| e.into_inner()).as_ref()?.0.clone();
        Some(self.objects(&stores))
    }

    /// What prices nodes now besides their annotations and the catalog, when this process
    /// provisions.
    pub fn node_pricing(&self) -> Option<NodePricing> {
        let (stores, provider) = self.live.read().unwrap_or_else(|e| e.into_inner()).clone()?;
        if let (generation, Some(offerings)) = self.planned.read().unwrap_or_else(|e| e.into_inner()).clone() {
            return Some(NodePricing::new(offerings, generation, stores.claims));
        }
        // No plan yet: the provider's offerings, as the first plan would start from.
        let (generation, offerings) = self.remember(provider.offerings());
        Some(NodePricing::new(offerings, generation, stores.claims))
    }

    /// Make `offerings` the ones nodes are priced by (a new generation when they differ from the
    /// last ones); the generation and the offerings in use.
    fn remember(&self, offerings: Arc<Vec<Offering>>) -> (u64, Arc<Vec<Offering>>) {
        let mut planned = self.planned.write().unwrap_or_else(|e| e.into_inner());
        // The last ones are still held here, so an equal pointer is the same offerings.
        if !planned.1.as_ref().is_some_and(|p| Arc::ptr_eq(p, &offerings)) {
            planned.0 += 1;
            planned.1 = Some(offerings);
        }
        (planned.0, planned.1.clone().unwrap_or_default())
    }

    /// The cluster at this moment from these caches and this provider.
    pub fn state_of(&self, stores: &Stores, provider: &dyn CloudProvider) -> ClusterState {
        let mut state = self.objects(stores);
        self.overlay(&mut state, provider.offerings());
        self.remember(state.offerings.clone());
        state.safety = self.view.safety_record().get();
        // A pool whose node class is not ready gets no new node: its pods fall through to the
        // next pool by weight, as Karpenter skips a NodePool that is not Ready.
        state.closed_pools = state
            .pools
            .iter()
            .filter_map(|np| match provider.node_class_readiness(np.spec.template.spec.node_class_ref.as_ref()) {
                NodeClassReadiness::NotReady { message, .. } => Some((np.name(), message)),
                NodeClassReadiness::Ready | NodeClassReadiness::NotUsed => None,
            })
            .collect();
        state
    }

    /// `state`'s offerings: `offerings` with its NodeOverlays applied, from the last result
    /// while nothing it depends on changed.
    fn overlay(&self, state: &mut ClusterState, offerings: Arc<Vec<Offering>>) {
        let mut cached = self.overlaid.lock().unwrap_or_else(|e| e.into_inner());
        if state.overlays.is_empty() {
            *cached = None;
            state.overlay_offerings(offerings);
            return;
        }
        let versions = versions(state);
        if let Some(c) = cached.as_ref().filter(|c| Arc::ptr_eq(&c.source, &offerings) && c.versions == versions) {
            state.offerings = c.offerings.clone();
            state.overlay_outcomes = c.outcomes.clone();
            return;
        }
        state.overlay_offerings(offerings.clone());
        *cached = Some(Overlaid { source: offerings, versions, offerings: state.offerings.clone(), outcomes: state.overlay_outcomes.clone() });
    }

    /// The caches' objects, the namespaces and the policy defaults, the plans and the time.
    fn objects(&self, stores: &Stores) -> ClusterState {
        let (version, placements) = self.plans.snapshot();
        let mut state = stores.state(self.view.namespaces());
        state.plans = Plans::new(version, super::monotonic_ms(), placements, self.view.registrations().snapshot());
        state.now_ms = super::unix_now_ms();
        state.policy_defaults = self.defaults.clone();
        state.catalog = Some(self.catalog.clone());
        state
    }
}
