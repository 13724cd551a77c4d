//! The claim keeper's decisions on recorded cluster states, at a fixed time.

use super::*;
use k8s_openapi::api::core::v1::Node;
use serde_json::json;

/// 2026-01-01T00:10:00Z.
fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_226_200)
}

/// An RFC 3339 time `secs` before [`now`].
fn ago(secs: u64) -> String {
    let t = OffsetDateTime::from(now() - Duration::from_secs(secs));
    t.format(&time::format_description::well_known::Rfc3339).expect("format")
}

fn claim(name: &str, created_ago: u64, status: serde_json::Value) -> Arc<NodeClaim> {
    Arc::new(
        serde_json::from_value(json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": name, "creationTimestamp": ago(created_ago)},
            "spec": {"nodePool": "general", "instanceType": "m7g.large", "zone": "us-east-1a", "capacityType": "on-demand", "arch": "arm64", "os": "linux", "pricePerHour": 0.08},
            "status": status}))
        .expect("claim"),
    )
}

fn launched(name: &str, secs_ago: u64) -> Arc<NodeClaim> {
    claim(name, secs_ago + 5, json!({"providerId": format!("kwok://{name}"), "nodeName": name, "launchedAt": ago(secs_ago)}))
}

fn node(name: &str, ready: bool) -> Arc<Node> {
    Arc::new(serde_json::from_value(json!({"metadata": {"name": name}, "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})).expect("node"))
}

fn instance(claim: &str, secs_ago: u64) -> Instance {
    Instance { provider_id: format!("kwok://{claim}"), node_name: claim.into(), claim: claim.into(), instance_type: None, zone: None, launched_at: Some(now() - Duration::from_secs(secs_ago)), image_id: None, node_class_hash: None }
}

const SETTINGS: KeeperSettings = KeeperSettings { registration_timeout: Duration::from_secs(600), garbage_grace: Duration::from_secs(120) };

fn names(cmds: &[ClaimCommand]) -> Vec<String> {
    cmds.iter()
        .map(|c| match c {
            ClaimCommand::Launch(c) => format!("launch {}", c.name()),
            ClaimCommand::Register { node } => format!("register {node}"),
            ClaimCommand::GiveUp { claim, reason, .. } => format!("give up {} {reason}", claim.name()),
            ClaimCommand::DeleteOrphan(i) => format!("orphan {}", i.claim),
            ClaimCommand::DeleteClaim(c) => format!("delete {}", c.name()),
        })
        .collect()
}

#[test]
fn a_claim_never_launched_is_launched_unless_just_written_or_being_launched_here() {
    let state = ClusterState {
        claims: vec![claim("lost", 60, json!(null)), claim("fresh", 3, json!(null)), claim("mine", 60, json!(null)), launched("up", 100), claim("failed-now", 60, json!({"launchAttempts": 2, "lastAttemptAt": ago(5)})), claim("failed-long-ago", 600, json!({"launchAttempts": 2, "lastAttemptAt": ago(25)}))],
        ..Default::default()
    };
    let cmds = to_launch(&state, &|c| c.name() == "mine", now());
    assert_eq!(names(&cmds), ["launch lost", "launch failed-long-ago"], "a second failure waits 20 s");
}

#[test]
fn failed_launches_are_retried_with_a_doubling_backoff() {
    let at = OffsetDateTime::from(now());
    let failed = |attempts: u32, secs: u64| claim("c", 900, json!({"launchAttempts": attempts, "lastAttemptAt": ago(secs)}));
    assert!(retry_due(&claim("c", 900, json!(null)), at), "never tried");
    assert!(!retry_due(&failed(1, 5), at) && retry_due(&failed(1, 11), at), "10 s after the first failure");
    assert!(!retry_due(&failed(2, 15), at) && retry_due(&failed(2, 21), at), "20 s after the second");
    assert!(!retry_due(&failed(4, 70), at) && retry_due(&failed(4, 81), at), "80 s after the fourth");
    assert!(!retry_due(&failed(9, 200), at) && retry_due(&failed(9, 301), at), "at most 5 minutes");
}

#[test]
fn late_nodes_are_registered_and_nodes_that_never_came_are_given_up() {
    let state = ClusterState {
        claims: vec![launched("late", 60), launched("just", 5), launched("never", 700), launched("slow-but-ready", 700)],
        nodes: vec![node("late", true), node("just", true), node("slow-but-ready", true)],
        ..Default::default()
    };
    let instances = ["late", "just", "never", "slow-but-ready"].map(|c| instance(c, 60));
    let cmds = keep(&state, &instances, SETTINGS, now());
    assert_eq!(names(&cmds), ["register late", "register slow-but-ready", "give up never RegistrationTimeout"]);
    let ClaimCommand::GiveUp { note, .. } = &cmds[2] else { panic!("{cmds:?}") };
    assert_eq!(note, "node never not registered and Ready 600s after launch");
}

#[test]
fn instances_without_claims_and_claims_without_instances_are_cleaned_up_after_their_grace() {
    let state = ClusterState { claims: vec![launched("kept", 60), launched("lost-instance", 60), launched("listing-lags", 10), claim("deleting", 60, json!(null))], ..Default::default() };
    let mut deleting = (*state.claims[3]).clone();
    deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let state = ClusterState { claims: vec![state.claims[0].clone(), state.claims[1].clone(), state.claims[2].clone(), Arc::new(deleting)], ..state };
    let instances = [instance("kept", 60), instance("orphan", 300), instance("young-orphan", 30), instance("deleting", 300)];
    let cmds = keep(&state, &instances, SETTINGS, now());
    assert_eq!(names(&cmds), ["orphan orphan", "delete lost-instance"], "a young orphan waits; a deleting claim still names its instance; a listing that lags is given 30 s");
}
