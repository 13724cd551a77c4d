//! What `kubectl get` shows: NodeClaim conditions (Launched, Registered, Initialized, Ready, and
//! Drifted / Disrupting when disruption takes the node), NodePool status (resources in use
//! against limits, node count, Ready), and the Events of their transitions. Deciding is pure
//! ([`claim_conditions`], [`pool_status`]); the writer patches only what changed, with the
//! resourceVersion it read, so it never overwrites a condition written in between.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::EventType;
use kube::{Api, Resource};

use archer_cloud::NodeClassReadiness;
use archer_api::conditions;
use archer_api::nodeoverlay::NodeOverlay;
use archer_api::nodeclaim::{NodeClaim, NodeClaimStatus};
use archer_api::nodepool::{NodePool, NodePoolStatus};
use archer_model::objects as state;
use std::sync::Arc;
use std::time::Duration;

use super::context::{Action, Context, ReconcileError};
use archer_core::labels;

pub(super) const LAUNCHED: &str = "Launched";
pub(super) const REGISTERED: &str = "Registered";
pub(super) const INITIALIZED: &str = "Initialized";
pub(super) const READY: &str = "Ready";
/// A NodePool's condition on its node class (Karpenter's `NodeClassReady`).
const NODE_CLASS_READY: &str = "NodeClassReady";
pub const DRIFTED: &str = "Drifted";
pub const DISRUPTING: &str = "Disrupting";

/// The claim's lifecycle conditions given its node (`None`: not registered): its current
/// conditions with Launched, Registered, Initialized and Ready brought up to date.
pub(super) fn claim_conditions(claim: &NodeClaim, node: Option<&Node>) -> Vec<Condition> {
    let status = claim.status.clone().unwrap_or_default();
    let mut c = status.conditions.clone();
    let generation = claim.metadata.generation;
    let mut set = |t: &str, s: &str, reason: &str, message: String| {
        conditions::set(&mut c, t, s, reason, &message, generation);
    };
    match (&status.provider_id, &status.last_error) {
        (Some(id), _) => set(LAUNCHED, "True", "Launched", format!("{id} ({} in {})", status.instance_type.as_deref().unwrap_or(&claim.spec.instance_type), status.zone.as_deref().unwrap_or(&claim.spec.zone))),
        (None, Some(e)) => set(LAUNCHED, "False", "LaunchFailed", format!("attempt {}: {e}", status.launch_attempts.unwrap_or(1))),
        (None, None) => set(LAUNCHED, "Unknown", "Launching", String::new()),
    }
    let launched = status.provider_id.is_some();
    match node {
        Some(n) => set(REGISTERED, "True", "Registered", format!("node {}", n.metadata.name.as_deref().unwrap_or(""))),
        None if launched => set(REGISTERED, "Unknown", "AwaitingRegistration", String::new()),
        None => set(REGISTERED, "Unknown", "NotLaunched", String::new()),
    }
    let startup: Vec<&str> = claim.spec.startup_taints.iter().map(|t| t.key.as_str()).filter(|k| node.is_some_and(|n| state::has_taint(n, k))).collect();
    match node {
        None => set(INITIALIZED, "Unknown", "NotRegistered", String::new()),
        Some(n) if !state::node_ready(n) => set(INITIALIZED, "False", "NodeNotReady", "the node's Ready condition is not True".into()),
        Some(n) if state::has_taint(n, labels::UNREGISTERED_TAINT) => set(INITIALIZED, "Unknown", "AwaitingRegistrationTaintRemoval", format!("taint {} still on the node", labels::UNREGISTERED_TAINT)),
        Some(_) if !startup.is_empty() => set(INITIALIZED, "Unknown", "StartupTaints", format!("startup taints still on the node: {}", startup.join(", "))),
        Some(_) => set(INITIALIZED, "True", "Initialized", String::new()),
    }
    // Ready: all three True; else the first that is not, with its reason.
    let first_not = [LAUNCHED, REGISTERED, INITIALIZED].into_iter().find_map(|t| c.iter().find(|x| x.type_ == t && x.status != "True").cloned());
    match first_not {
        None => conditions::set(&mut c, READY, "True", "Ready", "", generation),
        Some(x) => conditions::set(&mut c, READY, if x.status == "False" { "False" } else { "Unknown" }, &x.reason, &format!("{}: {}", x.type_, x.message), generation),
    };
    c
}

/// `cpu` millis and `memory` bytes as Kubernetes quantities (`3500m`, `4`, `1536Mi`, `2Gi`).
fn cpu_quantity(millis: i64) -> String {
    if millis % 1000 == 0 {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

fn memory_quantity(bytes: i64) -> String {
    const UNITS: [(&str, i64); 3] = [("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];
    UNITS.iter().find(|(_, u)| bytes != 0 && bytes % u == 0).map(|(s, u)| format!("{}{s}", bytes / u)).unwrap_or_else(|| bytes.to_string())
}

/// The pool's status from its claims (launched and in flight, as its limits count them) and its
/// node class's readiness (`NodeClassReady`, as Karpenter writes it; a pool whose class is not
/// ready is not Ready).
pub(super) fn pool_status(np: &NodePool, claims: &[&NodeClaim], class: &NodeClassReadiness) -> NodePoolStatus {
    let name = np.metadata.name.clone().unwrap_or_default();
    let (cpu, memory, nodes) = state::pool_usage(&name, claims);
    let pods: i64 = claims.iter().filter(|c| c.spec.node_pool == name && !c.deleting()).filter_map(|c| c.spec.capacity.get("pods")?.parse::<i64>().ok()).sum();
    let resources = [("cpu", cpu_quantity(cpu)), ("memory", memory_quantity(memory)), ("pods", pods.to_string()), ("nodes", nodes.to_string())].into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let mut c = np.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let generation = np.metadata.generation;
    match class {
        NodeClassReadiness::NotUsed => {}
        NodeClassReadiness::Ready => {
            conditions::set(&mut c, NODE_CLASS_READY, "True", "Ready", "", generation);
        }
        NodeClassReadiness::NotReady { reason, message } => {
            conditions::set(&mut c, NODE_CLASS_READY, "False", reason, message, generation);
        }
    }
    match (np.to_pool(), class) {
        (Err(e), _) => {
            conditions::set(&mut c, READY, "False", "InvalidRequirements", &e.to_string(), generation);
        }
        (Ok(_), NodeClassReadiness::NotReady { message, .. }) => {
            conditions::set(&mut c, READY, "False", "NodeClassNotReady", &format!("{message}; no node is launched for this pool"), generation);
        }
        (Ok(pool), _) => {
            let spent: Vec<&str> = [("cpu", pool.limit_cpu_millis.is_some_and(|l| cpu >= l)), ("memory", pool.limit_memory_bytes.is_some_and(|l| memory >= l)), ("nodes", pool.limit_nodes.is_some_and(|l| nodes >= l))]
                .into_iter()
                .filter_map(|(k, spent)| spent.then_some(k))
                .collect();
            let message = if spent.is_empty() { String::new() } else { format!("limits reached: {}; no more nodes are launched for this pool", spent.join(", ")) };
            conditions::set(&mut c, READY, "True", if spent.is_empty() { "Ready" } else { "LimitsReached" }, &message, generation);
        }
    }
    NodePoolStatus { resources, nodes, conditions: c }
}

fn status_of<'a>(c: &'a [Condition], t: &str) -> Option<&'a str> {
    conditions::status(c, t)
}

/// The status writer: brings every claim's and pool's status up to date on each pass.
pub struct StatusWriter {
    ctx: Arc<Context>,
}

impl StatusWriter {
    pub fn new(ctx: Arc<Context>) -> Self {
        StatusWriter { ctx }
    }

    /// Bring every claim's and pool's status up to date, with an Event for each transition.
    pub async fn write_statuses(&self) -> Result<Action, ReconcileError> {
        let claims = self.ctx.stores.claims.state();
        for claim in claims.iter().filter(|c| !c.deleting()) {
            let node = self.ctx.stores.nodes.get(&kube::runtime::reflector::ObjectRef::new(&claim.node_name()));
            let new = claim_conditions(claim, node.as_deref());
            let old = claim.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
            if new == old {
                continue;
            }
            for (t, reason) in [(REGISTERED, "Registered"), (INITIALIZED, "Initialized")] {
                if status_of(&new, t) == Some("True") && status_of(&old, t) != Some("True") {
                    self.ctx.post_event(&claim.object_ref(&()), EventType::Normal, reason, "Launching", &format!("node {}", claim.node_name())).await;
                }
            }
            self.patch_claim_conditions(claim, new).await;
        }
        let claims: Vec<&NodeClaim> = claims.iter().map(|c| c.as_ref()).collect();
        for np in self.ctx.stores.pools.state().iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let new = pool_status(np, &claims, &self.ctx.provider.node_class_readiness(np.spec.template.spec.node_class_ref.as_ref()));
            let old = np.status.clone().unwrap_or_default();
            if new == old {
                continue;
            }
            let ready = |s: &NodePoolStatus| s.conditions.iter().find(|c| c.type_ == READY).map(|c| (c.status.clone(), c.reason.clone()));
            if let Some((status, reason)) = ready(&new).filter(|r| Some(r) != ready(&old).as_ref()) {
                let message = new.conditions.iter().find(|c| c.type_ == READY).map(|c| c.message.clone()).unwrap_or_default();
                let kind = if status == "True" && reason == "Ready" { EventType::Normal } else { EventType::Warning };
                self.ctx.post_event(&np.object_ref(&()), kind, &reason, "Provisioning", if message.is_empty() { "the pool can be used" } else { &message }).await;
            }
            let (params, patch) = archer_api::apply::status::<NodePool>(&np.name(), np.metadata.resource_version.as_deref(), &new);
            if let Err(e) = Api::<NodePool>::all(self.ctx.client.clone()).patch_status(&np.name(), &params, &patch).await {
                tracing::debug!(pool = %np.name(), error = %e, "could not write the pool's status; next pass");
            }
        }
        self.write_overlay_statuses().await;
        Ok(Action::requeue(Duration::from_secs_f64(self.ctx.settings.disruption_interval_seconds.min(10.0))))
    }

    /// Each NodeOverlay's conditions as this pass applied it: Karpenter's `ValidationSucceeded`
    /// and `Ready`, and Archer's `ArcherApplied` (written only where they changed).
    async fn write_overlay_statuses(&self) {
        if self.ctx.stores.overlays.state().is_empty() {
            return;
        }
        let state = self.ctx.state();
        for o in &state.overlays {
            let name = o.metadata.name.clone().unwrap_or_default();
            let Some(outcome) = state.overlay_outcomes.get(&name) else { continue };
            let old = o.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
            let mut new = old.clone();
            let mut changed = false;
            for (type_, status, reason, message) in outcome.conditions() {
                changed |= archer_api::conditions::set(&mut new, type_, status, reason, &message, o.metadata.generation);
            }
            if !changed {
                continue;
            }
            let status = archer_api::nodeoverlay::NodeOverlayStatus { conditions: new };
            let (params, patch) = archer_api::apply::status::<NodeOverlay>(&name, o.metadata.resource_version.as_deref(), &status);
            if let Err(e) = Api::<NodeOverlay>::all(self.ctx.client.clone()).patch_status(&name, &params, &patch).await {
                tracing::debug!(overlay = %name, error = %e, "could not write the overlay's status; next pass");
            }
        }
    }

    /// Write a claim's conditions (its whole status, the rest as read), guarded by the
    /// resourceVersion they were computed from.
    async fn patch_claim_conditions(&self, claim: &NodeClaim, conditions: Vec<Condition>) -> bool {
        let status = NodeClaimStatus { conditions, ..claim.status.clone().unwrap_or_default() };
        let (params, patch) = archer_api::apply::status::<NodeClaim>(&claim.name(), claim.metadata.resource_version.as_deref(), &status);
        match Api::<NodeClaim>::all(self.ctx.client.clone()).patch_status(&claim.name(), &params, &patch).await {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(claim = %claim.name(), error = %e, "could not write the claim's conditions; next pass");
                false
            }
        }
    }

    /// Set one condition on a claim (Drifted, Disrupting) from a fresh read, retried on a
    /// conflict, with an Event saying why.
    pub async fn mark_claim(&self, claim: &str, type_: &str, reason: &str, message: &str) {
        let api: Api<NodeClaim> = Api::all(self.ctx.client.clone());
        for _ in 0..3 {
            let Ok(Some(fresh)) = api.get_opt(claim).await else { return };
            let mut c = fresh.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
            if !conditions::set(&mut c, type_, "True", reason, message, fresh.metadata.generation) {
                return;
            }
            if self.patch_claim_conditions(&fresh, c).await {
                self.ctx.post_event(&fresh.object_ref(&()), EventType::Normal, reason, type_, message).await;
                self.ctx.post_pool_event(&fresh.spec.node_pool, EventType::Normal, reason, type_, &format!("node claim {claim}: {message}")).await;
                return;
            }
        }
    }
}

/// Change a claim's status from a fresh read: `change` turns the status as read into the whole
/// new one (`None`: nothing to write), applied under Archer's field manager and guarded by that
/// read; a conflict (someone wrote between) reads again, at most three times.
pub async fn apply_claim_status(api: &Api<NodeClaim>, name: &str, change: impl Fn(&NodeClaimStatus) -> Option<NodeClaimStatus>) -> Result<(), kube::Error> {
    let mut last = None;
    for _ in 0..3 {
        let Some(fresh) = api.get_opt(name).await? else { return Ok(()) };
        let old = fresh.status.clone().unwrap_or_default();
        let Some(new) = change(&old) else { return Ok(()) };
        let (params, patch) = archer_api::apply::status::<NodeClaim>(name, fresh.metadata.resource_version.as_deref(), &new);
        match api.patch_status(name, &params, &patch).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => last = Some(kube::Error::Api(e)),
            Err(e) => return Err(e),
        }
    }
    last.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use archer_api::nodeclaim::NodeClaimStatus;

    fn claim(status: Option<NodeClaimStatus>) -> NodeClaim {
        let mut c = NodeClaim::new("default-abc", Default::default());
        c.spec.node_pool = "default".into();
        c.spec.instance_type = "m7g.large".into();
        c.spec.zone = "us-east-1a".into();
        c.spec.startup_taints = vec![archer_api::nodepool::TaintDoc { key: "example.com/agent".into(), value: None, effect: "NoSchedule".into() }];
        c.status = status;
        c
    }

    fn node(ready: bool, taints: &[&str]) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "default-abc"},
            "spec": {"taints": taints.iter().map(|k| serde_json::json!({"key": k, "effect": "NoSchedule"})).collect::<Vec<_>>()},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .expect("node")
    }

    fn get<'a>(c: &'a [Condition], t: &str) -> (&'a str, &'a str) {
        c.iter().find(|x| x.type_ == t).map(|x| (x.status.as_str(), x.reason.as_str())).unwrap_or_else(|| panic!("no {t} in {c:?}"))
    }

    #[test]
    fn a_claim_goes_launching_launched_registered_initialized_ready() {
        let c = claim_conditions(&claim(None), None);
        assert_eq!((get(&c, LAUNCHED), get(&c, REGISTERED), get(&c, READY)), (("Unknown", "Launching"), ("Unknown", "NotLaunched"), ("Unknown", "Launching")));
        let failed = claim(Some(NodeClaimStatus { last_error: Some("quota".into()), launch_attempts: Some(2), ..Default::default() }));
        let c = claim_conditions(&failed, None);
        assert_eq!(get(&c, LAUNCHED), ("False", "LaunchFailed"));
        assert_eq!(get(&c, READY), ("False", "LaunchFailed"));
        let launched = claim(Some(NodeClaimStatus { provider_id: Some("kwok://default-abc".into()), node_name: Some("default-abc".into()), ..Default::default() }));
        let c = claim_conditions(&launched, None);
        assert_eq!((get(&c, LAUNCHED).0, get(&c, REGISTERED), get(&c, READY).1), ("True", ("Unknown", "AwaitingRegistration"), "AwaitingRegistration"));
        let c = claim_conditions(&launched, Some(&node(false, &[])));
        assert_eq!((get(&c, REGISTERED).0, get(&c, INITIALIZED), get(&c, READY).0), ("True", ("False", "NodeNotReady"), "False"));
        let c = claim_conditions(&launched, Some(&node(true, &[labels::UNREGISTERED_TAINT])));
        assert_eq!(get(&c, INITIALIZED), ("Unknown", "AwaitingRegistrationTaintRemoval"));
        let c = claim_conditions(&launched, Some(&node(true, &["example.com/agent"])));
        assert_eq!(get(&c, INITIALIZED), ("Unknown", "StartupTaints"));
        let c = claim_conditions(&launched, Some(&node(true, &[])));
        assert_eq!((get(&c, INITIALIZED), get(&c, READY)), (("True", "Initialized"), ("True", "Ready")));
    }

    #[test]
    fn conditions_set_by_disruption_are_kept() {
        let mut status = NodeClaimStatus { provider_id: Some("kwok://x".into()), ..Default::default() };
        conditions::set(&mut status.conditions, DISRUPTING, "True", "Underutilized", "replaced by 1 cheaper node", None);
        let c = claim_conditions(&claim(Some(status)), Some(&node(true, &[])));
        assert_eq!(get(&c, DISRUPTING), ("True", "Underutilized"));
        assert_eq!(c.len(), 5);
    }

    #[test]
    fn pool_status_counts_claims_against_limits() {
        let np: NodePool = archer_core::yaml::from_str("apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  limits: {cpu: \"4\"}\n").expect("pool");
        let mut a = claim(None);
        a.spec.capacity = [("cpu", "2"), ("memory", "8Gi"), ("pods", "29")].into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let s = pool_status(&np, &[&a], &NodeClassReadiness::NotUsed);
        assert_eq!((s.nodes, s.resources["cpu"].as_str(), s.resources["memory"].as_str(), s.resources["pods"].as_str()), (1, "2", "8Gi", "29"));
        assert_eq!(get(&s.conditions, READY), ("True", "Ready"));
        let s = pool_status(&np, &[&a, &a], &NodeClassReadiness::NotUsed);
        assert_eq!((s.resources["cpu"].as_str(), get(&s.conditions, READY)), ("4", ("True", "LimitsReached")));
        let bad: NodePool = archer_core::yaml::from_str("apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: bad}\nspec:\n  template:\n    spec:\n      requirements: [{key: kubernetes.io/arch, operator: Gt, values: [arm64]}]\n").expect("pool");
        assert_eq!(get(&pool_status(&bad, &[], &NodeClassReadiness::NotUsed).conditions, READY).0, "False");
        assert_eq!((cpu_quantity(3500), memory_quantity(1536 << 20)), ("3500m".to_string(), "1536Mi".to_string()));
    }

    #[test]
    fn a_pool_whose_node_class_is_not_ready_is_not_ready() {
        let np: NodePool = archer_core::yaml::from_str("apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: default}\nspec: {}\n").expect("pool");
        let s = pool_status(&np, &[], &NodeClassReadiness::NotUsed);
        assert!(s.conditions.iter().all(|c| c.type_ != NODE_CLASS_READY), "kwok has no node classes: no condition");
        let s = pool_status(&np, &[], &NodeClassReadiness::Ready);
        assert_eq!((get(&s.conditions, NODE_CLASS_READY), get(&s.conditions, READY)), (("True", "Ready"), ("True", "Ready")));
        let missing = NodeClassReadiness::NotReady { reason: "NodeClassNotFound".into(), message: "EC2NodeClass gone not found on the cluster".into() };
        let s = pool_status(&np, &[], &missing);
        assert_eq!((get(&s.conditions, NODE_CLASS_READY), get(&s.conditions, READY)), (("False", "NodeClassNotFound"), ("False", "NodeClassNotReady")));
        let message = &s.conditions.iter().find(|c| c.type_ == READY).expect("ready").message;
        assert!(message.starts_with("EC2NodeClass gone not found on the cluster"), "{message}");
    }
}
