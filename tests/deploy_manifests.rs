//! The manifests in deploy/ decode into the real Kubernetes API types and say what the docs say.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

use std::path::Path;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::ClusterRole;

/// A file of the kustomize base (deploy/base), or else of deploy/ (provisioner/, scheduler/, crds/).
fn docs(file: &str) -> Vec<serde_json::Value> {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let path = if deploy.join("base").join(file).exists() { deploy.join("base").join(file) } else { deploy.join(file) };
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    archer::yaml::from_multiple(&text).expect("yaml")
}

fn one<T: serde::de::DeserializeOwned>(file: &str, kind: &str) -> T {
    let doc = docs(file).into_iter().find(|d| d["kind"].as_str() == Some(kind)).unwrap_or_else(|| panic!("{file} has no {kind}"));
    serde_json::from_value(doc).unwrap_or_else(|e| panic!("{file} {kind}: {e}"))
}

#[test]
fn kustomization_lists_every_manifest() {
    let k = &docs("kustomization.yaml")[0];
    let listed: Vec<&str> = k["resources"].as_array().expect("resources").iter().filter_map(|r| r.as_str()).collect();
    for f in ["namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "configmap.yaml", "safety-record.yaml", "gate-policy.yaml", "deployment.yaml", "pdb.yaml", "service.yaml", "mutatingwebhook.yaml"] {
        assert!(listed.contains(&f), "{f} missing from kustomization");
        assert!(!docs(f).is_empty());
    }
}

#[test]
fn webhook_configuration_is_safe_by_default() {
    let m: MutatingWebhookConfiguration = one("mutatingwebhook.yaml", "MutatingWebhookConfiguration");
    let w = &m.webhooks.expect("webhooks")[0];
    assert_eq!(w.side_effects, "None");
    assert_eq!(w.failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(w.reinvocation_policy.as_deref(), Some("IfNeeded"));
    assert!(w.timeout_seconds.is_some_and(|t| (1..=10).contains(&t)));
    assert_eq!(w.admission_review_versions, vec!["v1"]);
    let svc = w.client_config.service.as_ref().expect("service");
    assert_eq!(svc.path.as_deref(), Some("/mutate"));
    let rule = &w.rules.as_ref().expect("rules")[0];
    assert_eq!(rule.operations.as_deref(), Some(&["CREATE".to_string()][..]));
    assert_eq!(rule.resources.as_deref(), Some(&["pods".to_string()][..]));
    let exprs = w.namespace_selector.as_ref().and_then(|s| s.match_expressions.clone()).expect("namespaceSelector");
    assert!(exprs.iter().any(|e| e.key == "kubernetes.io/metadata.name" && e.values.as_ref().is_some_and(|v| v.contains(&"archer-system".to_string()))));
    assert!(exprs.iter().any(|e| e.key == "archer.dev/ignore" && e.operator == "NotIn"));
}

#[test]
fn the_shipped_memory_limit_holds_the_memory_bound_and_the_grace_period_the_shutdown() {
    let cm: ConfigMap = one("configmap.yaml", "ConfigMap");
    let text = cm.data.expect("data").get("config.yaml").cloned().expect("config.yaml");
    let cfg: archer::config::Config = archer::yaml::from_str(&text).expect("archer config");
    cfg.validate().expect("valid");
    let d: Deployment = one("deployment.yaml", "Deployment");
    let pod = d.spec.expect("spec").template.spec.expect("pod");
    let limit = pod.containers[0].resources.as_ref().and_then(|r| r.limits.as_ref()).and_then(|l| l.get("memory")).expect("memory limit");
    let limit = archer::core::quantity::value(&limit.0).expect("quantity") as u64;
    // A cluster of 1,000 nodes (the docs give the formula ("Memory bound") for any size).
    let bound = cfg.memory_bound_bytes(1000);
    assert!(limit >= bound, "memory limit {} MiB is below the bound {} MiB", limit >> 20, bound >> 20);
    assert!(limit < bound * 3 / 2, "the limit is sized from the bound, not far above it");
    let env = pod.containers[0].env.clone().unwrap_or_default();
    assert!(env.iter().any(|e| e.name == "MIMALLOC_PURGE_DELAY" && e.value.as_deref() == Some("0")), "the bound assumes freed memory is returned at once");
    let grace = pod.termination_grace_period_seconds.expect("terminationGracePeriodSeconds") as f64;
    assert!(grace >= cfg.shutdown_delay_seconds + cfg.shutdown_grace_seconds as f64 + 5.0, "{grace}");
}

#[test]
fn deployment_is_hardened_and_highly_available() {
    let d: Deployment = one("deployment.yaml", "Deployment");
    let spec = d.spec.expect("spec");
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.expect("pod spec");
    assert_eq!(pod.security_context.as_ref().and_then(|s| s.run_as_non_root), Some(true));
    let c = &pod.containers[0];
    let sc = c.security_context.as_ref().expect("container securityContext");
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert!(c.readiness_probe.as_ref().and_then(|p| p.http_get.as_ref()).is_some_and(|h| h.path.as_deref() == Some("/readyz")));
    assert!(c.liveness_probe.as_ref().and_then(|p| p.http_get.as_ref()).is_some_and(|h| h.path.as_deref() == Some("/healthz")));
    let res = c.resources.as_ref().expect("resources");
    assert!(res.requests.is_some() && res.limits.is_some());
    let args = c.args.clone().unwrap_or_default();
    assert!(args.iter().any(|a| a.starts_with("--tls-cert=")) && args.iter().any(|a| a.starts_with("--config=")));

    let pdb: PodDisruptionBudget = one("pdb.yaml", "PodDisruptionBudget");
    assert!(pdb.spec.and_then(|s| s.min_available).is_some());
    let _: Service = one("service.yaml", "Service");
    let _: Namespace = one("namespace.yaml", "Namespace");
}

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> serde_json::Value {
    serde_json::json!({"apiGroups": [group], "resources": resources, "verbs": verbs})
}

const READ: &[&str] = &["get", "list", "watch"];

/// deploy/ runs the webhook, the extender, the safety net and the savings reporter, no
/// provisioner: exactly their rules
/// (docs "Deploying"). No Node writes, no NodeClaims or node classes, no deleting the webhook's
/// configuration (only the Helm chart's uninstall hook may, as its own service account), and
/// ConfigMaps only by the record's name, in Archer's namespace.
#[test]
fn rbac_is_exactly_what_the_base_runs() {
    let doc = |kind: &str| docs("rbac.yaml").into_iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("rbac.yaml has no {kind}"));
    let role: ClusterRole = serde_json::from_value(doc("ClusterRole")).expect("ClusterRole");
    assert_eq!(role.metadata.name.as_deref(), Some("archer"));
    let expected = serde_json::json!([
        rule("", &["namespaces", "nodes"], READ),
        rule("", &["serviceaccounts", "secrets"], &["get"]),
        rule("", &["pods"], &["get", "list", "watch", "patch"]),
        rule("", &["pods/eviction"], &["create"]),
        rule("", &["pods/log"], &["get"]),
        rule("apps", &["daemonsets"], READ),
        rule("karpenter.sh", &["nodepools", "nodeoverlays"], READ),
        rule("events.k8s.io", &["events"], &["create", "patch"]),
    ]);
    assert_eq!(doc("ClusterRole")["rules"], expected, "the ClusterRole's rules");
    let cfg = shipped_config();
    let record = cfg.safety_net.config_map.clone();
    let namespaced = doc("Role");
    assert_eq!(namespaced["metadata"]["namespace"], "archer-system");
    assert_eq!(
        namespaced["rules"],
        serde_json::json!([
            rule("coordination.k8s.io", &["leases"], &["get", "list", "watch", "create", "patch", "update"]),
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [record], "verbs": ["get", "list", "watch", "update"]},
        ]),
        "the Role's rules: the Leases, and the record alone among ConfigMaps"
    );
    // The record is shipped, as Archer may not create it; empty, so applying it again keeps
    // what Archer wrote.
    let shipped: ConfigMap = one("safety-record.yaml", "ConfigMap");
    assert_eq!((shipped.metadata.name.as_deref(), shipped.metadata.namespace.as_deref()), (Some(record.as_str()), Some("archer-system")));
    assert!(shipped.data.is_none() && shipped.binary_data.is_none(), "shipped without data");
    let listed = &docs("kustomization.yaml")[0]["resources"];
    assert!(listed.as_array().expect("resources").iter().any(|r| r == "safety-record.yaml"), "the record is applied with the rest");
    // Both bindings name Archer's service account.
    let sa = one::<k8s_openapi::api::core::v1::ServiceAccount>("serviceaccount.yaml", "ServiceAccount");
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        assert_eq!(doc(kind)["subjects"], serde_json::json!([{"kind": "ServiceAccount", "name": sa.metadata.name, "namespace": "archer-system"}]), "{kind}");
    }
}

/// With a provisioner (deploy/provisioner/<provider>.yaml on top of the base), exactly its rules:
/// Node objects created and deleted by kwok alone, each cloud's node classes by that cloud alone.
#[test]
fn each_provisioner_adds_exactly_its_rules() {
    let provisioner = |node_verbs: &[&str]| {
        vec![
            rule("", &["nodes"], node_verbs),
            rule("", &["persistentvolumeclaims", "persistentvolumes"], READ),
            rule("archer.dev", &["archernodepools"], READ),
            rule("archer.dev", &["archernodepools/status"], &["patch"]),
            rule("archer.dev", &["archernodeclaims"], &["get", "list", "watch", "create", "delete"]),
            rule("archer.dev", &["archernodeclaims/status"], &["patch"]),
            rule("karpenter.sh", &["nodeoverlays/status"], &["patch"]),
        ]
    };
    let classes = |plural: &str| [rule("archer.dev", &[plural], READ), rule("archer.dev", &[&format!("{plural}/status")], &["patch"])];
    let kwok = provisioner(&["create", "patch", "delete"]);
    let aws: Vec<_> = provisioner(&["patch"]).into_iter().chain(classes("archerec2nodeclasses")).collect();
    let azure: Vec<_> = provisioner(&["patch"]).into_iter().chain(classes("archeraksnodeclasses")).collect();
    for (provider, expected) in [("kwok", kwok), ("aws", aws), ("azure", azure)] {
        let file = format!("provisioner/{provider}.yaml");
        let role = docs(&file).into_iter().find(|d| d["kind"] == "ClusterRole").unwrap_or_else(|| panic!("{file}: no ClusterRole"));
        let _: ClusterRole = serde_json::from_value(role.clone()).expect("a ClusterRole");
        assert_eq!(role["rules"], serde_json::json!(expected), "{file}");
    }
}

/// The gate policy and its binding decode as the API's types, refuse pod updates only, and let
/// Archer's own service account (serviceaccount.yaml, in archer-system) remove the gate.
#[test]
fn the_gate_policy_names_archers_service_account() {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
    let policy: ValidatingAdmissionPolicy = one("gate-policy.yaml", "ValidatingAdmissionPolicy");
    let binding: ValidatingAdmissionPolicyBinding = one("gate-policy.yaml", "ValidatingAdmissionPolicyBinding");
    let spec = policy.spec.expect("spec");
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    let rules = spec.match_constraints.and_then(|m| m.resource_rules).expect("resourceRules");
    assert_eq!(rules.len(), 1);
    assert_eq!((rules[0].operations.as_deref(), rules[0].resources.as_deref()), (Some(&["UPDATE".to_string()][..]), Some(&["pods".to_string()][..])));
    let sa = one::<k8s_openapi::api::core::v1::ServiceAccount>("serviceaccount.yaml", "ServiceAccount");
    let user = format!("'system:serviceaccount:{}:{}'", sa.metadata.namespace.expect("namespace"), sa.metadata.name.expect("name"));
    let validations = spec.validations.expect("validations");
    assert!(validations[0].expression.ends_with(&format!("request.userInfo.username in [{user}]")), "{}", validations[0].expression);
    let binding = binding.spec.expect("spec");
    assert_eq!(binding.policy_name.as_deref(), policy.metadata.name.as_deref());
    assert_eq!(binding.validation_actions.as_deref(), Some(&["Deny".to_string()][..]));
    let listed = &docs("kustomization.yaml")[0]["resources"];
    assert!(listed.as_array().expect("resources").iter().any(|r| r == "gate-policy.yaml"));
}

fn shipped_config() -> archer::config::Config {
    let cm: ConfigMap = one("configmap.yaml", "ConfigMap");
    let text = cm.data.expect("data").get("config.yaml").cloned().expect("config.yaml");
    archer::yaml::from_str(&text).expect("archer config")
}

#[test]
fn shipped_config_is_a_valid_archer_config() {
    let cm: ConfigMap = one("configmap.yaml", "ConfigMap");
    let text = cm.data.expect("data").get("config.yaml").cloned().expect("config.yaml");
    let cfg: archer::config::Config = archer::yaml::from_str(&text).expect("archer config");
    cfg.validate().expect("valid");
    assert_eq!(cfg.defaults, archer::core::policy::PolicyDefaults::default(), "the shipped defaults are the documented defaults");
}

fn extender_of(cfg: &serde_json::Value) -> serde_json::Value {
    assert_eq!(cfg["apiVersion"].as_str(), Some("kubescheduler.config.k8s.io/v1"));
    assert_eq!(cfg["kind"].as_str(), Some("KubeSchedulerConfiguration"));
    cfg["extenders"][0].clone()
}

fn check_extender(e: &serde_json::Value) {
    assert!(e["urlPrefix"].as_str().is_some_and(|u| u.starts_with("https://") && u.ends_with("/scheduler")));
    assert_eq!(e["filterVerb"].as_str(), Some("filter"));
    assert_eq!(e["prioritizeVerb"].as_str(), Some("prioritize"));
    assert_eq!(e["enableHTTPS"].as_bool(), Some(true));
    assert!(e["tlsConfig"]["caFile"].as_str().is_some());
    assert_eq!(e["nodeCacheCapable"].as_bool(), Some(true));
    assert_eq!(e["ignorable"].as_bool(), Some(true));
    assert!(e["weight"].as_i64().is_some_and(|w| w > 0));
    assert!(e["httpTimeout"].as_str().is_some());
}

#[test]
fn scheduler_configurations_register_the_extender_both_ways() {
    let default = &docs("scheduler/kube-scheduler-config.yaml")[0];
    check_extender(&extender_of(default));
    assert_eq!(default["profiles"][0]["schedulerName"].as_str(), Some("default-scheduler"));

    let cm: ConfigMap = one("scheduler/second-scheduler.yaml", "ConfigMap");
    let text = cm.data.expect("data").get("config.yaml").cloned().expect("config.yaml");
    let second: serde_json::Value = archer::yaml::from_str(&text).expect("yaml");
    check_extender(&extender_of(&second));
    assert_eq!(second["profiles"][0]["schedulerName"].as_str(), Some("archer-scheduler"));
    let d: Deployment = one("scheduler/second-scheduler.yaml", "Deployment");
    assert!(d.spec.and_then(|s| s.template.spec).is_some_and(|p| p.containers[0].command.clone().unwrap_or_default().iter().any(|c| c.starts_with("--config="))));
}

/// A CRD in deploy/crds/ and in the Helm chart's crds/ must equal the one generated from the Rust types; regenerate with
/// `ARCHER_UPDATE_CRDS=1 cargo test --test deploy_manifests`.
fn generated_crd(file: &str, source: &str, crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition) -> String {
    let generated = format!("# Generated from {source}: ARCHER_UPDATE_CRDS=1 cargo test --test deploy_manifests\n{}", serde_saphyr::to_string(crd).expect("yaml"));
    // Kustomize's copy and the Helm chart's.
    for dir in ["deploy/crds", "deploy/helm/archer/files/crds"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join(file);
        if std::env::var_os("ARCHER_UPDATE_CRDS").is_some() {
            std::fs::write(&path, &generated).expect("write crd");
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{dir}/{file}: {e}"));
        assert_eq!(on_disk, generated, "{dir}/{file} is stale: regenerate it");
    }
    generated
}

#[test]
fn nodeclaim_crd_is_generated_from_the_types() {
    use kube::CustomResourceExt;
    let on_disk = generated_crd("nodeclaim.yaml", "crates/api/src/nodeclaim.rs", &archer::provisioner::nodeclaim::NodeClaim::crd());
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition = archer::yaml::from_str(&on_disk).expect("crd");
    assert_eq!((crd.spec.group.as_str(), crd.spec.scope.as_str(), crd.spec.names.kind.as_str()), ("archer.dev", "Cluster", "NodeClaim"));
    assert!(crd.spec.versions[0].subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(), "status subresource");
    let k: serde_json::Value = archer::yaml::from_str(&std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/crds/kustomization.yaml")).expect("kustomization")).expect("yaml");
    let resources: Vec<&str> = k["resources"].as_array().expect("resources").iter().filter_map(|r| r.as_str()).collect();
    assert!(resources.contains(&"nodeclaim.yaml") && resources.contains(&"nodepool.yaml"));
}

/// Karpenter's NodeOverlay CRD as Archer ships it: for kustomize users to apply where Karpenter's
/// is absent (deploy/crds/nodeoverlay.yaml, not in the base), and in the chart's files/ for the
/// template that installs it unless the cluster serves it; regenerated like the others.
#[test]
fn nodeoverlay_crd_is_generated_from_the_types() {
    let crd = archer::provisioner::nodeoverlay::chart_crd();
    let generated = format!("# Generated from crates/api/src/nodeoverlay.rs: ARCHER_UPDATE_CRDS=1 cargo test --test deploy_manifests\n{}", serde_saphyr::to_string(&crd).expect("yaml"));
    for file in ["deploy/crds/nodeoverlay.yaml", "deploy/helm/archer/files/nodeoverlay-crd.yaml"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        if std::env::var_os("ARCHER_UPDATE_CRDS").is_some() {
            std::fs::write(&path, &generated).expect("write crd");
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}")), generated, "{file} is stale: regenerate it");
    }
    assert_eq!((crd.metadata.name.as_deref(), crd.spec.group.as_str(), crd.spec.scope.as_str(), crd.spec.names.kind.as_str()), (Some("nodeoverlays.karpenter.sh"), "karpenter.sh", "Cluster", "NodeOverlay"));
    assert_eq!(crd.spec.names.short_names.as_deref(), Some(&["overlays".to_string()][..]));
    assert_eq!(crd.metadata.annotations.as_ref().and_then(|a| a.get("helm.sh/resource-policy")).map(String::as_str), Some("keep"));
    let schema = serde_json::to_string(&crd.spec.versions[0].schema).expect("schema");
    for field in ["requirements", "priceAdjustment", "price", "capacity", "weight", "!has(self.price) || !has(self.priceAdjustment)"] {
        assert!(schema.contains(field), "schema lacks {field}");
    }
    let k: serde_json::Value = archer::yaml::from_str(&std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/crds/kustomization.yaml")).expect("kustomization")).expect("yaml");
    assert!(!k["resources"].as_array().expect("resources").iter().any(|r| r == "nodeoverlay.yaml"), "Karpenter's CRD is not in the base: Karpenter users have it");
}

#[test]
fn nodepool_crd_is_generated_from_the_types() {
    use kube::CustomResourceExt;
    let on_disk = generated_crd("nodepool.yaml", "crates/api/src/nodepool.rs", &archer::provisioner::nodepool::NodePool::crd());
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition = archer::yaml::from_str(&on_disk).expect("crd");
    assert_eq!(crd.spec.group, "archer.dev");
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.names.kind, "NodePool");
    assert_eq!(crd.spec.versions[0].name, "v1alpha1");
    let schema = serde_json::to_string(&crd.spec.versions[0].schema).expect("schema");
    for field in ["requirements", "startupTaints", "expireAfter", "consolidationPolicy", "consolidateAfter", "budgets", "limits", "weight"] {
        assert!(schema.contains(field), "schema lacks {field}");
    }
    // A Karpenter v1 NodePool ports by changing its apiVersion.
    let ported: archer::provisioner::nodepool::NodePool = archer::yaml::from_str(
        "apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  template:\n    metadata: {labels: {team: a}}\n    spec:\n      requirements:\n        - {key: karpenter.sh/capacity-type, operator: In, values: [spot]}\n      expireAfter: 720h\n      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n  disruption:\n    consolidationPolicy: WhenEmptyOrUnderutilized\n    consolidateAfter: 1m\n    budgets: [{nodes: \"10%\"}]\n  limits: {cpu: 1000, memory: 1000Gi}\n  weight: 10\n",
    )
    .expect("a Karpenter NodePool");
    let pool = ported.to_pool().expect("pool");
    assert_eq!((pool.limit_cpu_millis, pool.weight), (Some(1_000_000), 10));
}

#[test]
#[cfg(feature = "aws")]
fn ec2nodeclass_crd_is_generated_from_the_types() {
    use kube::CustomResourceExt;
    let on_disk = generated_crd("ec2nodeclass.yaml", "crates/cloud-aws/src/nodeclass.rs", &archer::provisioner::cloud::aws::nodeclass::EC2NodeClass::crd());
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition = archer::yaml::from_str(&on_disk).expect("crd");
    assert_eq!((crd.spec.group.as_str(), crd.spec.scope.as_str(), crd.spec.names.kind.as_str(), crd.spec.names.plural.as_str()), ("archer.dev", "Cluster", "EC2NodeClass", "archerec2nodeclasses"));
    assert!(crd.spec.versions[0].subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(), "status subresource");
    let schema = serde_json::to_string(&crd.spec.versions[0].schema).expect("schema");
    // Karpenter's field names, so a node class ports by changing its apiVersion.
    for field in ["subnetSelectorTerms", "securityGroupSelectorTerms", "amiSelectorTerms", "instanceProfile", "userData", "blockDeviceMappings", "metadataOptions", "httpTokens", "kmsKeyID", "associatePublicIPAddress"] {
        assert!(schema.contains(field), "schema lacks {field}");
    }
    let k: serde_json::Value = archer::yaml::from_str(&std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/crds/kustomization.yaml")).expect("kustomization")).expect("yaml");
    assert!(k["resources"].as_array().expect("resources").iter().any(|r| r.as_str() == Some("ec2nodeclass.yaml")));
}

#[test]
fn aksnodeclass_crd_is_generated_from_the_types() {
    use kube::CustomResourceExt;
    let on_disk = generated_crd("aksnodeclass.yaml", "crates/cloud-azure/src/nodeclass.rs", &archer::provisioner::cloud::azure::nodeclass::AKSNodeClass::crd());
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition = archer::yaml::from_str(&on_disk).expect("crd");
    assert_eq!((crd.spec.group.as_str(), crd.spec.scope.as_str(), crd.spec.names.kind.as_str(), crd.spec.names.plural.as_str()), ("archer.dev", "Cluster", "AKSNodeClass", "archeraksnodeclasses"));
    assert!(crd.spec.versions[0].subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(), "status subresource");
    let schema = serde_json::to_string(&crd.spec.versions[0].schema).expect("schema");
    // Karpenter on Azure's field names, so a node class ports by changing its apiVersion.
    for field in ["imageFamily", "osDiskSizeGB", "vnetSubnetID", "tags", "maxPods", "kubelet", "security", "encryptionAtHost", "imageGCHighThresholdPercent", "fipsMode", "conditions"] {
        assert!(schema.contains(field), "schema lacks {field}");
    }
    for bound in ["\"minimum\":30", "\"maximum\":2048", "\"maximum\":250", "AzureLinux"] {
        assert!(schema.contains(bound), "schema lacks {bound}");
    }
    let k: serde_json::Value = archer::yaml::from_str(&std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/crds/kustomization.yaml")).expect("kustomization")).expect("yaml");
    assert!(k["resources"].as_array().expect("resources").iter().any(|r| r.as_str() == Some("aksnodeclass.yaml")));
}

/// The IAM policy in deploy/aws/ allows every AWS API call the provider makes and nothing else
/// (beyond what those calls need: RunInstances and CreateTags for CreateFleet, PassRole for the
/// node role).
#[test]
#[cfg(feature = "aws")]
fn the_aws_iam_policy_is_exactly_what_the_provider_calls() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let policy: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("deploy/aws/iam-policy.json")).expect("policy")).expect("json");
    let mut allowed: std::collections::BTreeSet<String> = Default::default();
    for s in policy["Statement"].as_array().expect("statements") {
        assert_eq!(s["Effect"], "Allow");
        match &s["Action"] {
            serde_json::Value::String(a) => drop(allowed.insert(a.clone())),
            serde_json::Value::Array(list) => allowed.extend(list.iter().filter_map(|a| a.as_str()).map(String::from)),
            other => panic!("Action {other}"),
        }
        let resource = s["Resource"].to_string();
        assert!(!resource.contains("\"*\"") || s["Condition"].is_object(), "an unconditioned wildcard resource: {s}");
    }
    let mut called: std::collections::BTreeSet<String> = Default::default();
    for entry in std::fs::read_dir(dir.join("crates/cloud-aws/src")).expect("aws sources") {
        let text = std::fs::read_to_string(entry.expect("entry").path()).expect("source");
        for (i, _) in text.match_indices("()") {
            // `ec2.describe_images()` / `sqs.receive_message()`: the operation before `()`.
            let before = &text[..i];
            let start = before.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |s| s + 1);
            let op = &before[start..];
            if ["clone", "send", "build", "into_paginator"].contains(&op) {
                continue;
            }
            let Some(receiver) = before[..start].strip_suffix('.') else { continue };
            let receiver = receiver.trim_end();
            let service = if receiver.ends_with("sqs") {
                "sqs"
            } else if receiver.ends_with("iam") {
                "iam"
            } else if receiver.ends_with("pricing") {
                "pricing"
            } else if receiver.ends_with("ec2") || receiver.ends_with("ec2()") {
                "ec2"
            } else {
                continue;
            };
            let pascal: String = op.split('_').map(|w| { let mut c = w.chars(); c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default() }).collect();
            called.insert(format!("{service}:{pascal}"));
        }
    }
    assert!(called.contains("ec2:CreateFleet") && called.contains("sqs:ReceiveMessage") && called.contains("pricing:GetProducts"), "the scan found the calls: {called:?}");
    for c in &called {
        assert!(allowed.contains(c), "the provider calls {c} but the policy does not allow it");
    }
    assert!(!allowed.iter().any(|a| a.starts_with("ecr:")), "reading private ECR images is deploy/aws/iam-policy-ecr.json's, for every mode");
    // RunInstances and CreateTags come with CreateFleet, PassRole with the node role, and
    // TagInstanceProfile with CreateInstanceProfile's tags.
    let implied = ["ec2:RunInstances", "ec2:CreateTags", "iam:PassRole", "iam:TagInstanceProfile"];
    for a in &allowed {
        assert!(called.contains(a) || implied.contains(&a.as_str()), "the policy allows {a}, which the provider never calls");
    }
}

/// `deploy/aws/iam-policy-ecr.json` (every mode reads images: the webhook, the extender, the
/// safety net, the provisioner) allows exactly the ECR API calls Archer makes
/// (`crates/cloud-aws/src/ecr.rs`) and the two its registry reads need (manifests:
/// `BatchGetImage`; config and layer blobs: `GetDownloadUrlForLayer`), images alone by resource;
/// `GetAuthorizationToken` has no resource-level permission.
#[test]
#[cfg(feature = "aws")]
fn the_ecr_policy_is_exactly_what_reading_private_images_needs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let policy: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("deploy/aws/iam-policy-ecr.json")).expect("policy")).expect("json");
    let mut allowed: std::collections::BTreeMap<String, String> = Default::default();
    for s in policy["Statement"].as_array().expect("statements") {
        assert_eq!(s["Effect"], "Allow");
        let actions: Vec<String> = match &s["Action"] {
            serde_json::Value::String(a) => vec![a.clone()],
            serde_json::Value::Array(list) => list.iter().filter_map(|a| a.as_str()).map(String::from).collect(),
            other => panic!("Action {other}"),
        };
        for a in actions {
            allowed.insert(a, s["Resource"].as_str().expect("one resource").to_string());
        }
    }
    let source = std::fs::read_to_string(dir.join("crates/cloud-aws/src/ecr.rs")).expect("source");
    let called: std::collections::BTreeSet<String> = source
        .match_indices("ecr.")
        .filter_map(|(i, _)| {
            let op: String = source[i + 4..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            source[i + 4 + op.len()..].starts_with("()").then(|| format!("ecr:{}", op.split('_').map(|w| { let mut c = w.chars(); c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default() }).collect::<String>()))
        })
        .collect();
    assert_eq!(called, ["ecr:GetAuthorizationToken".to_string()].into(), "the scan found the call");
    let expected: std::collections::BTreeMap<String, String> = [
        ("ecr:GetAuthorizationToken", "*"),
        ("ecr:BatchGetImage", "arn:aws:ecr:*:*:repository/*"),
        ("ecr:GetDownloadUrlForLayer", "arn:aws:ecr:*:*:repository/*"),
    ]
    .into_iter()
    .map(|(a, r)| (a.to_string(), r.to_string()))
    .collect();
    assert_eq!(allowed, expected);
}

/// The image (Dockerfile, and tests/e2e/build-image which builds the same without Docker) runs
/// as the chart and the base run it: user 65532, the binary as the entrypoint (the manifests pass
/// `serve` as args), and it says what it was built from.
#[test]
fn the_image_runs_as_the_manifests_run_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).expect("Dockerfile");
    let script = std::fs::read_to_string(root.join("tests/e2e/build-image")).expect("build-image");
    for needed in ["USER 65532:65532", "ENTRYPOINT [\"/archer\"]", "FROM --platform=$BUILDPLATFORM", "distroless/cc-debian12:nonroot", "ARCHER_GIT_REVISION", "org.opencontainers.image.revision", "org.opencontainers.image.source", "org.opencontainers.image.version"] {
        assert!(dockerfile.contains(needed), "the Dockerfile has {needed}");
    }
    for needed in ["NONROOT = 65532", "\"Entrypoint\": [\"/archer\"]", "org.opencontainers.image.revision", "org.opencontainers.image.source", "org.opencontainers.image.version", "linux/arm64"] {
        assert!(script.contains(needed), "tests/e2e/build-image has {needed}");
    }
    let deployment: k8s_openapi::api::apps::v1::Deployment = one("deployment.yaml", "Deployment");
    let pod = deployment.spec.and_then(|s| s.template.spec).expect("pod spec");
    let security = pod.security_context.expect("pod security context");
    assert_eq!((security.run_as_user, security.run_as_non_root), (Some(65532), Some(true)));
    let container = &pod.containers[0];
    assert!(container.command.is_none(), "the image's entrypoint runs");
    assert_eq!(container.args.as_ref().and_then(|a| a.first()).map(String::as_str), Some("serve"));
    assert_eq!(container.security_context.as_ref().and_then(|s| s.read_only_root_filesystem), Some(true));
}
