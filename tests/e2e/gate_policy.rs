//! The gate policy on the real API server (`tests/e2e/run multi_tenant_gate`): the harness applies
//! the Helm chart's ValidatingAdmissionPolicy with Archer's RBAC (cluster.rs), and runs Archer as
//! its service account. A tenant free to do anything to its own pods cannot take Archer's
//! scheduling gate off one, nor can a cluster admin; Archer's service account and the uninstall
//! hook's can, and every other update or deletion of a gated pod goes through.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::{namespace, wait};
use crate::cluster::{Cluster, ARCHER_USER, UNGATE_USER};

const GATE: &str = "archer.dev/inspecting";
const QUOTA: &str = "example.com/quota";
const TENANT: &str = "tenant";
/// What the policy says when it refuses (deploy/helm/archer/templates/gate-policy.yaml).
const REFUSAL: &str = "only Archer removes the scheduling gate archer.dev/inspecting";

fn gates(p: &Pod) -> Vec<String> {
    p.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()).map(|g| g.iter().map(|g| g.name.clone()).collect()).unwrap_or_default()
}

/// The tenant may do anything to pods in its own namespace, and nothing elsewhere.
async fn tenant_owns_namespace(admin: &Client, ns: &str) {
    let role: Role = serde_json::from_value(json!({"metadata": {"name": "pods"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]}))
    .expect("role");
    Api::<Role>::namespaced(admin.clone(), ns).create(&PostParams::default(), &role).await.expect("create role");
    let binding: RoleBinding = serde_json::from_value(json!({"metadata": {"name": "pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT}]}))
    .expect("binding");
    Api::<RoleBinding>::namespaced(admin.clone(), ns).create(&PostParams::default(), &binding).await.expect("create binding");
}

fn pod(name: &str, gates: &[&str], image: &str) -> Pod {
    let gates: Vec<serde_json::Value> = gates.iter().map(|g| json!({"name": g})).collect();
    let mut spec = json!({"containers": [{"name": "app", "image": image}], "terminationGracePeriodSeconds": 0});
    if !gates.is_empty() {
        spec["schedulingGates"] = json!(gates);
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("pod")
}

/// A JSON patch that takes `gate`, the pod's `i`th, off it (testing it is there): what
/// `kubectl patch --type=json` sends, and Archer too.
async fn remove_gate(api: &Api<Pod>, name: &str, gate: &str, i: usize) -> Result<Pod, kube::Error> {
    let ops = json!([{"op": "test", "path": format!("/spec/schedulingGates/{i}/name"), "value": gate}, {"op": "remove", "path": format!("/spec/schedulingGates/{i}")}]);
    let patch: json_patch::Patch = serde_json::from_value(ops).expect("json patch");
    api.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch)).await
}

fn assert_refused(result: Result<Pod, kube::Error>, who: &str) {
    match result {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 403, "{who}: {s:?}");
            assert!(s.message.contains(REFUSAL) && s.message.contains("archer-gate"), "{who}: refused by the gate policy: {}", s.message);
        }
        Ok(p) => panic!("{who} removed Archer's gate: {:?}", gates(&p)),
        Err(e) => panic!("{who}: {e}"),
    }
}

/// A tenant's patch removing `archer.dev/inspecting` from its own pod is refused by the policy on
/// the real API server (so is a cluster admin's, and a merge patch emptying the gates), though
/// RBAC lets the tenant patch the pod: its other updates (a label, another controller's gate) and
/// deleting a gated pod go through, as does any update of a pod without gates. Archer's service
/// account removes the gate, the uninstall hook's too, and the Archer the harness runs (as its
/// service account) releases a held pod itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn multi_tenant_gate_removal_is_refused() {
    let mut c = Cluster::start("multi-tenant-gate").await;
    let admin = c.client().await;
    Api::<ValidatingAdmissionPolicy>::all(admin.clone()).get("archer-gate").await.expect("the chart's gate policy is applied");
    c.registry.push_index("apps/web", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    let image = c.registry.image("apps/web:1");
    namespace(&admin, "evil", json!({})).await;
    tenant_owns_namespace(&admin, "evil").await;
    // Nothing but this test touches the gates until Archer is started again.
    c.stop_archer();

    let tenant: Api<Pod> = Api::namespaced(c.client_as(TENANT).await, "evil");
    for p in [pod("held", &[GATE, QUOTA], &image), pod("other", &[QUOTA], &image), pod("plain", &[], &image), pod("doomed", &[GATE], &image), pod("direct", &[GATE], &image), pod("hook", &[GATE], &image)] {
        tenant.create(&PostParams::default(), &p).await.expect("the tenant creates its pods (gated or not)");
    }

    // Refused: the tenant's JSON patch, its merge patch emptying the gates, the admin's patch.
    assert_refused(remove_gate(&tenant, "held", GATE, 0).await, "the tenant");
    assert_refused(tenant.patch("held", &PatchParams::default(), &Patch::Merge(json!({"spec": {"schedulingGates": []}}))).await, "the tenant's merge patch");
    assert_refused(remove_gate(&Api::namespaced(admin.clone(), "evil"), "held", GATE, 0).await, "a cluster admin");
    assert_eq!(gates(&tenant.get("held").await.expect("held")), [GATE, QUOTA], "both gates stay");

    // Allowed: another gate taken off, a label on the gated pod, a pod without gates, a deletion.
    let held = remove_gate(&tenant, "held", QUOTA, 1).await.expect("the tenant removes another controller's gate");
    assert_eq!(gates(&held), [GATE]);
    let labelled = tenant.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"team": "evil"}}}))).await.expect("any other update of a gated pod");
    assert_eq!(gates(&labelled), [GATE]);
    let other = remove_gate(&tenant, "other", QUOTA, 0).await.expect("a pod without Archer's gate is the tenant's");
    assert!(gates(&other).is_empty());
    tenant.patch("plain", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"team": "evil"}}}))).await.expect("a pod that never had gates");
    tenant.delete("doomed", &DeleteParams::default()).await.expect("deleting a gated pod is no update");

    // Archer's service account, and the uninstall hook's, remove it.
    let as_archer: Api<Pod> = Api::namespaced(c.client_as(ARCHER_USER).await, "evil");
    assert!(gates(&remove_gate(&as_archer, "direct", GATE, 0).await.expect("Archer's service account removes its gate")).is_empty());
    let as_hook: Api<Pod> = Api::namespaced(c.client_as(UNGATE_USER).await, "evil");
    assert!(gates(&remove_gate(&as_hook, "hook", GATE, 0).await.expect("the uninstall hook's service account removes it")).is_empty());

    // The running Archer (its service account) releases the pod it finds held when it starts.
    c.start_archer().await;
    wait("Archer releases the held pod", Duration::from_secs(60), || async { tenant.get("held").await.is_ok_and(|p| gates(&p).is_empty()) }).await;
    let released = tenant.get("held").await.expect("held");
    let by = released.metadata.managed_fields.iter().flatten().filter_map(|m| m.manager.as_deref()).collect::<Vec<_>>();
    assert!(by.contains(&"archer"), "released by Archer's gate controller (under its one field manager): {by:?}");
}
