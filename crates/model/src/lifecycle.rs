//! The claim keeper's decisions, made purely on the cluster state, the provider's instance list
//! and the time: which claims to launch (never launched: a crash between the claim and the
//! launch), which nodes to register, which claims to give up, which instances have no claim and
//! which claims have lost their instance. The launcher carries them out.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use time::OffsetDateTime;

use archer_api::nodeclaim::NodeClaim;
use archer_core::instance::Instance;

use crate::objects::{age_at, node_ready};
use crate::ClusterState;

/// One thing the claim keeper does.
#[derive(Debug, Clone)]
pub enum ClaimCommand {
    /// Launch a claim that never was (or whose last attempt is due a retry).
    Launch(Arc<NodeClaim>),
    /// Lift the unregistered taint from a Ready node whose registration was lost.
    Register { node: String },
    /// Delete a claim that cannot become a node, and its instance, saying why.
    GiveUp { claim: Arc<NodeClaim>, reason: &'static str, note: String },
    /// Terminate an instance no claim in the cache names (once the API server confirms it).
    DeleteOrphan(Instance),
    /// Delete a claim whose instance is gone.
    DeleteClaim(Arc<NodeClaim>),
}

/// How long things may take before the keeper steps in.
#[derive(Debug, Clone, Copy)]
pub struct KeeperSettings {
    /// A launched claim whose node is not registered and Ready after this is given up.
    pub registration_timeout: Duration,
    /// An instance without a claim is left alone while younger than this.
    pub garbage_grace: Duration,
}

/// A Ready node still unregistered this long after launch lost its registration task.
const LATE_REGISTRATION: Duration = Duration::from_secs(15);
/// A launched claim's instance may not be listed yet for this long.
const INSTANCE_LISTED_WITHIN: Duration = Duration::from_secs(30);
/// A claim written this recently may not be marked by its writer yet.
const JUST_WRITTEN: Duration = Duration::from_secs(10);

/// Claims never launched (or due a retry) that no one is launching: `recent` names those this
/// process wrote or launched a moment ago.
pub fn to_launch(state: &ClusterState, recent: &dyn Fn(&NodeClaim) -> bool, now: SystemTime) -> Vec<ClaimCommand> {
    let now = OffsetDateTime::from(now);
    let young = |c: &NodeClaim| c.metadata.creation_timestamp.as_ref().and_then(|t| age_at(&t.0.to_string(), now)).is_some_and(|a| a < JUST_WRITTEN);
    state.claims.iter().filter(|c| !c.launched() && !c.deleting() && !recent(c) && !young(c) && retry_due(c, now)).map(|c| ClaimCommand::Launch(c.clone())).collect()
}

/// Everything else the keeper does, given the provider's `instances`.
pub fn keep(state: &ClusterState, instances: &[Instance], settings: KeeperSettings, now: SystemTime) -> Vec<ClaimCommand> {
    let at = OffsetDateTime::from(now);
    let launched_for = |c: &NodeClaim| c.status.as_ref().and_then(|s| s.launched_at.as_deref()).and_then(|t| age_at(t, at));
    let nodes = state.nodes_by_name();
    let ready = |c: &NodeClaim| nodes.get(c.node_name().as_str()).is_some_and(|n| node_ready(n));
    let live: Vec<&Arc<NodeClaim>> = state.claims.iter().filter(|c| c.launched() && !c.deleting()).collect();
    let mut out = Vec::new();
    for c in &live {
        if launched_for(c).is_some_and(|a| a > LATE_REGISTRATION) && ready(c) {
            out.push(ClaimCommand::Register { node: c.node_name() });
        }
    }
    for c in &live {
        if launched_for(c).unwrap_or_default() > settings.registration_timeout && !ready(c) {
            let note = format!("node {} not registered and Ready {}s after launch", c.node_name(), settings.registration_timeout.as_secs());
            out.push(ClaimCommand::GiveUp { claim: Arc::clone(c), reason: "RegistrationTimeout", note });
        }
    }
    let claimed: HashSet<String> = state.claims.iter().map(|c| c.name()).collect();
    for i in instances {
        let young = i.launched_at.and_then(|t| now.duration_since(t).ok()).is_some_and(|a| a < settings.garbage_grace);
        if !claimed.contains(&i.claim) && !young {
            out.push(ClaimCommand::DeleteOrphan(i.clone()));
        }
    }
    let known: HashSet<&str> = instances.iter().map(|i| i.claim.as_str()).collect();
    for c in live.into_iter().filter(|c| !known.contains(c.name().as_str())) {
        if launched_for(c).unwrap_or_default() > INSTANCE_LISTED_WITHIN {
            out.push(ClaimCommand::DeleteClaim(Arc::clone(c)));
        }
    }
    out
}

/// Whether a claim whose launch failed is due another attempt: 10 s after the first failure,
/// doubling up to 5 minutes.
fn retry_due(c: &NodeClaim, now: OffsetDateTime) -> bool {
    let Some(s) = c.status.as_ref() else { return true };
    let attempts = s.launch_attempts.unwrap_or(0);
    if attempts == 0 {
        return true;
    }
    let wait = Duration::from_secs(10u64.saturating_mul(1 << attempts.min(6).saturating_sub(1))).min(Duration::from_secs(300));
    s.last_attempt_at.as_deref().and_then(|t| age_at(t, now)).is_none_or(|a| a >= wait)
}

#[cfg(test)]
mod tests;
