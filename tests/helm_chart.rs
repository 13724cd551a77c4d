//! The Helm chart (deploy/helm/archer), rendered by the real helm (built from its Go module by
//! tests/build-helm): it renders the same objects as the kustomize manifests, its values reach
//! the manifests, its schema refuses bad values, its certificate serves the webhook, and every
//! metric its dashboard and alert rules name is one a running Archer exports.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use serde_json::{json, Value};

const NAMESPACE: &str = "archer-system";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The helm binary: built once (cached under ~/.cache/archer-e2e) by tests/build-helm.
fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        if let Some(p) = std::env::var_os("ARCHER_HELM") {
            return PathBuf::from(p);
        }
        let out = Command::new(root().join("tests/build-helm")).output().expect("run tests/build-helm (needs go)");
        assert!(out.status.success(), "tests/build-helm failed: {}", String::from_utf8_lossy(&out.stderr));
        PathBuf::from(String::from_utf8(out.stdout).expect("utf-8").trim())
    })
}

/// `helm template archer deploy/helm/archer -n archer-system` with `--set`/`--set-json` flags:
/// the rendered objects, or helm's error text.
fn render(flags: &[&str]) -> Result<Vec<Value>, String> {
    let out = Command::new(helm())
        .args(["template", "archer"])
        .arg(root().join("deploy/helm/archer"))
        .args(["--namespace", NAMESPACE])
        .args(flags)
        .output()
        .expect("run helm");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let docs: Vec<Value> = archer::yaml::from_multiple(&text).expect("helm renders YAML");
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn rendered(flags: &[&str]) -> Vec<Value> {
    render(flags).unwrap_or_else(|e| panic!("helm template {flags:?}: {e}"))
}

fn find(objects: &[Value], kind: &str, name: &str) -> Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no {kind} {name} among {:?}", keys(objects)))
}

fn typed<T: serde::de::DeserializeOwned>(objects: &[Value], kind: &str, name: &str) -> T {
    serde_json::from_value(find(objects, kind, name)).unwrap_or_else(|e| panic!("{kind} {name}: {e}"))
}

fn keys(objects: &[Value]) -> BTreeSet<(String, String)> {
    objects.iter().map(|o| (o["kind"].as_str().unwrap_or("").to_string(), o["metadata"]["name"].as_str().unwrap_or("").to_string())).collect()
}

fn file_docs(relative: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(root().join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"));
    archer::yaml::from_multiple(&text).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// The kustomize base's objects, as `kubectl apply -k deploy/` would create them (the
/// Namespace and the CRDs aside: Helm users create the namespace, and the chart's crds/ is
/// checked byte for byte by tests/deploy_manifests.rs).
fn kustomize_base() -> Vec<Value> {
    let k = &file_docs("deploy/base/kustomization.yaml")[0];
    let mut objects = Vec::new();
    for r in k["resources"].as_array().expect("resources").iter().filter_map(Value::as_str) {
        if r == "../crds" || r == "namespace.yaml" {
            continue;
        }
        objects.extend(file_docs(&format!("deploy/base/{r}")));
    }
    objects
}

const HELM_ONLY_KEYS: [&str; 5] = ["app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "helm.sh/chart", "app.kubernetes.io/version", "checksum/config"];

/// What may differ between the two by design: Helm's own labels (also in selectors), the config
/// checksum that rolls the pods, and the config file's comments and layout (compared parsed).
fn normalize(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for k in HELM_ONLY_KEYS {
                map.remove(k);
            }
            if map.get("annotations").is_some_and(|a| a.as_object().is_some_and(|a| a.is_empty())) {
                map.remove("annotations");
            }
            if let Some(Value::String(text)) = map.get("config.yaml") {
                let parsed: Value = archer::yaml::from_str(text).expect("config.yaml parses");
                map.insert("config.yaml".into(), parsed);
            }
            map.values_mut().for_each(normalize);
            // A map emptied above goes too (a template's `annotations: {checksum}`).
            map.retain(|k, v| !(k == "annotations" && v.as_object().is_some_and(|a| a.is_empty())));
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}

/// Helm hooks (the uninstall hook) have no kustomize counterpart: nothing runs on `kubectl delete -k`.
fn is_hook(v: &Value) -> bool {
    v["metadata"]["annotations"].get("helm.sh/hook").is_some()
}

/// Karpenter's NodeOverlay CRD, which the chart installs where the cluster does not serve it
/// (the kustomize base leaves it to the user: deploy/crds/nodeoverlay.yaml), and Archer's own
/// CRDs, which `deploy/` applies from deploy/crds/ (the chart's copies are checked against those
/// files by tests/deploy_manifests.rs and below).
fn is_overlay_crd(v: &Value) -> bool {
    v["kind"] == "CustomResourceDefinition" && (v["metadata"]["name"] == "nodeoverlays.karpenter.sh" || v["metadata"]["name"].as_str().is_some_and(|n| n.ends_with(".archer.dev")))
}

fn assert_same_objects(mut chart: Vec<Value>, mut kustomize: Vec<Value>) {
    chart.retain(|o| !is_hook(o) && !is_overlay_crd(o));
    chart.iter_mut().for_each(normalize);
    kustomize.iter_mut().for_each(normalize);
    assert_eq!(keys(&chart), keys(&kustomize), "the chart and kustomize render different objects");
    for k in &kustomize {
        let (kind, name) = (k["kind"].as_str().unwrap_or(""), k["metadata"]["name"].as_str().unwrap_or(""));
        let c = find(&chart, kind, name);
        assert_eq!(&c, k, "{kind} {name} differs between the chart and kustomize");
    }
}

/// The kustomize base has no uninstall hook, so its gate policy lets only Archer's service
/// account remove the gate: the chart renders the same with `ungateOnUninstall=false` (with the
/// hook, its own service account is let too: `the_gate_policy_lets_only_archer_remove_its_gate`).
#[test]
fn the_chart_with_a_provided_certificate_renders_exactly_the_kustomize_base() {
    assert_same_objects(rendered(&["--set", "tls.mode=secret,ungateOnUninstall=false"]), kustomize_base());
}

#[test]
fn the_chart_with_cert_manager_renders_exactly_the_cert_manager_overlay() {
    let mut overlay = kustomize_base();
    overlay.extend(file_docs("deploy/cert-manager/certificate.yaml"));
    // The overlay's patch, applied as kustomize does.
    let k = &file_docs("deploy/cert-manager/kustomization.yaml")[0];
    let patch_text = k["patches"][0]["patch"].as_str().expect("patch");
    let patch: json_patch::Patch = serde_json::from_value(archer::yaml::from_str::<Value>(patch_text).expect("patch yaml")).expect("json patch");
    let webhook = overlay.iter_mut().find(|o| o["kind"] == "MutatingWebhookConfiguration").expect("webhook");
    json_patch::patch(webhook, &patch).expect("patch applies");
    for o in overlay.iter_mut().filter(|o| o["apiVersion"].as_str().is_some_and(|a| a.starts_with("cert-manager.io"))) {
        o["metadata"]["namespace"] = NAMESPACE.into();
    }
    let mut chart = rendered(&["--set", "tls.mode=certManager,ungateOnUninstall=false"]);
    // The chart labels what it creates; the overlay's two cert-manager objects carry none.
    for o in chart.iter_mut().filter(|o| o["apiVersion"].as_str().is_some_and(|a| a.starts_with("cert-manager.io"))) {
        o["metadata"].as_object_mut().expect("metadata").remove("labels");
    }
    assert_same_objects(chart, overlay);
}

fn archer_config(objects: &[Value]) -> archer::config::Config {
    let cm: ConfigMap = typed(objects, "ConfigMap", "archer-config");
    let text = cm.data.and_then(|d| d.get("config.yaml").cloned()).expect("config.yaml");
    let cfg: archer::config::Config = archer::yaml::from_str(&text).unwrap_or_else(|e| panic!("the chart's config is not Archer's: {e}\n{text}"));
    cfg.validate().expect("the chart's config validates");
    cfg
}

#[test]
fn provisioner_values_become_the_config_files_provisioner_section() {
    let cfg = archer_config(&rendered(&[]));
    assert_eq!(cfg.provisioner.cloud_provider, "none");
    assert_eq!(cfg.provisioner.preference_policy, archer::core::sched::preferences::Policy::Respect);
    let objects = rendered(&[
        "--set",
        "provisioner.cloudProvider=aws,provisioner.aws.clusterName=prod-eu,provisioner.aws.region=eu-west-1,provisioner.maxLaunchesPerMinute=250,provisioner.preferencePolicy=Ignore",
        "--set-json",
        r#"provisioner.zones=["eu-west-1a","eu-west-1b"]"#,
    ]);
    let cfg = archer_config(&objects);
    assert_eq!(cfg.provisioner.cloud_provider, "aws");
    assert_eq!(cfg.provisioner.max_launches_per_minute, 250);
    assert_eq!(cfg.provisioner.preference_policy, archer::core::sched::preferences::Policy::Ignore);
    assert_eq!(cfg.provisioner.zones, vec!["eu-west-1a".to_string(), "eu-west-1b".to_string()]);
    let aws = &cfg.provisioner.aws;
    assert_eq!((aws.cluster_name.as_str(), aws.region.as_deref()), ("prod-eu", Some("eu-west-1")));
    // A changed config rolls the pods.
    let checksum = |o: &[Value]| find(o, "Deployment", "archer")["spec"]["template"]["metadata"]["annotations"]["checksum/config"].clone();
    assert_ne!(checksum(&objects), checksum(&rendered(&[])));
}

#[test]
fn non_default_values_reach_the_manifests() {
    let objects = rendered(&[
        "--set",
        "replicas=3,webhook.failurePolicy=Fail,webhook.timeoutSeconds=10,config.webhook.decisionTimeoutSeconds=8,image.tag=0.2.0,podDisruptionBudget.enabled=false,logFormat=text",
        "--set",
        "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::111122223333:role/archer",
        "--set-json",
        r#"webhook.excludedNamespaces=["kube-system","monitoring"]"#,
        "--set-json",
        r#"webhook.objectSelector={"matchLabels":{"archer.dev/opt-in":"true"}}"#,
        "--set-json",
        r#"resources={"requests":{"cpu":"250m","memory":"128Mi"},"limits":{"memory":"512Mi"}}"#,
        "--set-json",
        r#"nodeSelector={"kubernetes.io/os":"linux"}"#,
    ]);
    let d: Deployment = typed(&objects, "Deployment", "archer");
    let spec = d.spec.expect("spec");
    assert_eq!(spec.replicas, Some(3));
    let pod = spec.template.spec.expect("pod");
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some("ghcr.io/archer-dev/archer:0.2.0"));
    assert!(c.args.as_ref().expect("args").contains(&"--log-format=text".to_string()));
    let r = c.resources.as_ref().expect("resources");
    assert_eq!(r.limits.as_ref().and_then(|l| l.get("memory")).map(|q| q.0.as_str()), Some("512Mi"));
    assert_eq!(r.requests.as_ref().and_then(|l| l.get("cpu")).map(|q| q.0.as_str()), Some("250m"));
    assert_eq!(pod.node_selector.as_ref().and_then(|n| n.get("kubernetes.io/os")).map(String::as_str), Some("linux"));
    let m: MutatingWebhookConfiguration = typed(&objects, "MutatingWebhookConfiguration", "archer");
    let w = &m.webhooks.expect("webhooks")[0];
    assert_eq!((w.failure_policy.as_deref(), w.timeout_seconds), (Some("Fail"), Some(10)));
    let excluded = w.namespace_selector.as_ref().and_then(|s| s.match_expressions.as_ref()).and_then(|e| e.iter().find(|e| e.key == "kubernetes.io/metadata.name")).and_then(|e| e.values.clone());
    assert_eq!(excluded, Some(vec!["kube-system".to_string(), "monitoring".to_string(), NAMESPACE.to_string()]));
    assert_eq!(w.object_selector.as_ref().and_then(|s| s.match_labels.as_ref()).and_then(|l| l.get("archer.dev/opt-in")).map(String::as_str), Some("true"));
    let sa: ServiceAccount = typed(&objects, "ServiceAccount", "archer");
    assert_eq!(sa.metadata.annotations.and_then(|a| a.get("eks.amazonaws.com/role-arn").cloned()).as_deref(), Some("arn:aws:iam::111122223333:role/archer"));
    assert!(!objects.iter().any(|o| o["kind"] == "PodDisruptionBudget"), "podDisruptionBudget.enabled=false");
    assert_eq!(archer_config(&objects).webhook.decision_timeout_seconds, 8.0);
}

/// Karpenter's NodeOverlay CRD comes with the chart where the cluster does not serve it, kept on
/// upgrade and uninstall; where it is served (Karpenter's chart installed it), or when turned off,
/// the chart leaves it alone.
#[test]
fn the_chart_installs_the_nodeoverlay_crd_only_where_it_is_not_served() {
    let crds = |flags: &[&str]| rendered(flags).into_iter().filter(|o| is_overlay_crd(o) && o["metadata"]["name"] == "nodeoverlays.karpenter.sh").collect::<Vec<_>>();
    let installed = crds(&[]);
    assert_eq!(installed.len(), 1);
    assert_eq!(installed[0]["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");
    let file = &file_docs("deploy/crds/nodeoverlay.yaml")[0];
    assert_eq!(&installed[0], file, "the chart's copy is the generated one");
    assert!(crds(&["--api-versions", "karpenter.sh/v1alpha1/NodeOverlay"]).is_empty(), "Karpenter's own is served");
    assert!(crds(&["--set", "nodeOverlays.installCRD=false"]).is_empty());
}

#[test]
fn the_second_scheduler_consults_the_charts_service() {
    let objects = rendered(&["--set", "extender.secondScheduler.enabled=true,extender.secondScheduler.schedulerName=cheap,extender.secondScheduler.weight=5"]);
    let cm: ConfigMap = typed(&objects, "ConfigMap", "archer-scheduler-config");
    let cfg: Value = archer::yaml::from_str(cm.data.and_then(|d| d.get("config.yaml").cloned()).as_deref().expect("config")).expect("yaml");
    assert_eq!(cfg["profiles"][0]["schedulerName"], "cheap");
    let ext = &cfg["extenders"][0];
    assert_eq!(ext["urlPrefix"], "https://archer.archer-system.svc:443/scheduler");
    assert_eq!((ext["weight"].as_i64(), ext["nodeCacheCapable"].as_bool(), ext["ignorable"].as_bool()), (Some(5), Some(true), Some(true)));
    let d: Deployment = typed(&objects, "Deployment", "archer-scheduler");
    let pod = d.spec.and_then(|s| s.template.spec).expect("pod");
    assert!(pod.containers[0].command.as_ref().expect("command").iter().any(|a| a == "--config=/etc/archer-scheduler/config.yaml"));
    // Its pods are planned as soon as they are created, like the default scheduler's.
    assert_eq!(archer_config(&objects).provisioner.scheduler_names, ["default-scheduler", "cheap"]);
    assert_eq!(archer_config(&rendered(&[])).provisioner.scheduler_names, ["default-scheduler"]);
    assert!(rendered(&[]).iter().all(|o| o["metadata"]["name"] != "archer-scheduler"), "off by default");
}

/// The second scheduler follows the cluster's version (EKS's suffix dropped); a given image is
/// held to Kubernetes' version skew policy: the same minor version or one older, never newer.
#[test]
fn the_second_schedulers_image_follows_the_cluster_or_is_held_to_the_skew_policy() {
    let image = |flags: &[&str]| -> Result<String, String> {
        let objects = render(&[&["--set", "extender.secondScheduler.enabled=true"], flags].concat())?;
        let d: Deployment = typed(&objects, "Deployment", "archer-scheduler");
        Ok(d.spec.and_then(|s| s.template.spec).expect("pod").containers[0].image.clone().expect("image"))
    };
    assert_eq!(image(&["--kube-version", "v1.31.2"]).expect("render"), "registry.k8s.io/kube-scheduler:v1.31.2");
    assert_eq!(image(&["--kube-version", "v1.30.9-eks-1552ad0"]).expect("render"), "registry.k8s.io/kube-scheduler:v1.30.9");
    let pinned = "extender.secondScheduler.image=registry.example.com/kube-scheduler:v1.33.5";
    assert_eq!(image(&["--kube-version", "v1.34.1", "--set", pinned]).expect("one minor older"), "registry.example.com/kube-scheduler:v1.33.5");
    assert_eq!(image(&["--kube-version", "v1.33.0", "--set", pinned]).expect("the same minor"), "registry.example.com/kube-scheduler:v1.33.5");
    let newer = image(&["--kube-version", "v1.32.3", "--set", pinned]).expect_err("newer than the cluster");
    assert!(newer.contains("is kube-scheduler 1.33, but the cluster runs Kubernetes 1.32.3"), "{newer}");
    assert!(image(&["--kube-version", "v1.35.0", "--set", pinned]).is_err(), "two minor versions older");
    let by_digest = "extender.secondScheduler.image=registry.example.com/kube-scheduler@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    assert!(image(&["--kube-version", "v1.35.0", "--set", by_digest]).is_ok(), "a digest says no version to check");
}

/// Replicas spread over zones and nodes; `hostNetwork` with its ports and DNS policy; an existing
/// service account; extra volumes and mounts; the NetworkPolicy.
#[test]
fn the_pods_spread_over_zones_and_run_on_the_host_network_when_asked() {
    let pod = |objects: &[Value]| find(objects, "Deployment", "archer")["spec"]["template"]["spec"].clone();
    let p = pod(&rendered(&[]));
    let keys: Vec<&str> = p["topologySpreadConstraints"].as_array().expect("spread").iter().filter_map(|c| c["topologyKey"].as_str()).collect();
    assert_eq!(keys, ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]);
    assert!(p["hostNetwork"].is_null() && p["dnsPolicy"].is_null());

    let objects = rendered(&["--set", "hostNetwork=true,ports.https=9443,ports.admin=9080"]);
    let p = pod(&objects);
    assert_eq!((p["hostNetwork"].as_bool(), p["dnsPolicy"].as_str()), (Some(true), Some("ClusterFirstWithHostNet")));
    let c = &p["containers"][0];
    let ports: Vec<i64> = c["ports"].as_array().expect("ports").iter().filter_map(|p| p["containerPort"].as_i64()).collect();
    assert_eq!(ports, [9443, 9080]);
    let args: Vec<&str> = c["args"].as_array().expect("args").iter().filter_map(Value::as_str).collect();
    assert!(args.contains(&"--listen=0.0.0.0:9443") && args.contains(&"--admin-listen=0.0.0.0:9080"), "{args:?}");
    // The Service and the probes follow by the ports' names.
    let svc = find(&objects, "Service", "archer");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "https");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "admin");

    let objects = rendered(&["--set", "serviceAccount.create=false,serviceAccount.name=platform-archer", "--set-json", r#"extraVolumes=[{"name":"ca","configMap":{"name":"corp-ca"}}]"#, "--set-json", r#"extraVolumeMounts=[{"name":"ca","mountPath":"/etc/ssl/corp"}]"#]);
    assert!(objects.iter().all(|o| o["kind"] != "ServiceAccount" || o["metadata"]["name"] != "platform-archer"), "not created");
    let p = pod(&objects);
    assert_eq!(p["serviceAccountName"], "platform-archer");
    assert!(p["volumes"].as_array().expect("volumes").iter().any(|v| v["name"] == "ca" && v["configMap"]["name"] == "corp-ca"));
    assert!(p["containers"][0]["volumeMounts"].as_array().expect("mounts").iter().any(|m| m["mountPath"] == "/etc/ssl/corp"));
    let binding = objects.iter().find(|o| o["kind"] == "ClusterRoleBinding" && o["subjects"][0]["kind"] == "ServiceAccount").expect("binding");
    assert_eq!(binding["subjects"][0]["name"], "platform-archer", "the chart's RBAC binds the existing account");

    assert!(rendered(&[]).iter().all(|o| o["kind"] != "NetworkPolicy"), "off by default");
    let objects = rendered(&["--set", "networkPolicy.enabled=true,ports.https=9443", "--set-json", r#"networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]"#]);
    let np = find(&objects, "NetworkPolicy", "archer");
    assert_eq!(np["spec"]["podSelector"]["matchLabels"], find(&objects, "Deployment", "archer")["spec"]["selector"]["matchLabels"]);
    assert_eq!(np["spec"]["ingress"][0]["ports"][0]["port"], 9443);
    assert_eq!(np["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"], "0.0.0.0/0", "the API server's addresses are not known: open by default");
    assert_eq!(np["spec"]["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "monitoring");
    assert_eq!(np["spec"]["egress"], json!([{}]), "registries and cloud APIs are anywhere");
}

#[test]
fn bad_values_are_refused_with_a_clear_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["--set", "webhook.failurePolicy=Sometimes"], "'/webhook/failurePolicy': value must be one of 'Ignore', 'Fail'"),
        (&["--set", "webhook.timeoutSeconds=40"], "'/webhook/timeoutSeconds': maximum"),
        (&["--set", "replicas=0"], "'/replicas': minimum"),
        (&["--set", "replica=2"], "additional properties 'replica' not allowed"),
        (&["--set", "tls.mode=selfsigned"], "'/tls/mode': value must be one of 'managed', 'certManager', 'secret', 'generate'"),
        (&["--set", "provisioner.cloudProvider=gcp"], "'/provisioner/cloudProvider': value must be one of 'none', 'kwok', 'aws', 'azure'"),
        (&["--set", "gatePolicy.enable=false"], "additional properties 'enable' not allowed"),
        (&["--set", "provisioner.cloudProvider=aws"], "missing property 'aws'"),
        (&["--set", "provisioner.cloudProvider=aws,provisioner.aws.region=eu-west-1"], "missing property 'clusterName'"),
        (&["--set", "config.provisioner.cloudProvider=kwok"], "/config"),
        (&["--set", "config.defaults.mode=strict"], "'/config/defaults/mode': value must be one of"),
        (&["--set", "tls.mode=secret,tls.caBundle=not base64!"], "'/tls/caBundle'"),
        (&["--set", "config.webhook.decisionTimeoutSeconds=6"], "config.webhook.decisionTimeoutSeconds (6) must be below webhook.timeoutSeconds (5)"),
        (&["--set", "ports.https=70000"], "'/ports/https': maximum"),
        (&["--set", "crds.instal=true"], "additional properties 'instal' not allowed"),
    ];
    for (flags, message) in cases {
        match render(flags) {
            Ok(_) => panic!("{flags:?} was accepted"),
            Err(e) => assert!(e.contains(message), "{flags:?}: expected {message:?} in:\n{e}"),
        }
    }
}

fn rules_file() -> Value {
    archer::yaml::from_str(&std::fs::read_to_string(root().join("deploy/helm/archer/rules/archer.rules.yaml")).expect("rules")).expect("rules yaml")
}

fn dashboard_file() -> Value {
    serde_json::from_str(&std::fs::read_to_string(root().join("deploy/helm/archer/dashboards/archer.json")).expect("dashboard")).expect("dashboard json")
}

#[test]
fn monitoring_objects_carry_the_repositorys_rules_and_dashboard() {
    let none = rendered(&[]);
    assert!(none.iter().all(|o| !["ServiceMonitor", "PrometheusRule"].contains(&o["kind"].as_str().unwrap_or(""))), "off by default");
    let objects = rendered(&["--set", "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,metrics.dashboard.enabled=true,metrics.prometheusRule.labels.release=kube-prometheus"]);
    let rule = find(&objects, "PrometheusRule", "archer");
    assert_eq!(rule["spec"], rules_file());
    assert_eq!(rule["metadata"]["labels"]["release"], "kube-prometheus");
    let sm = find(&objects, "ServiceMonitor", "archer");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    let service = find(&objects, "Service", "archer");
    assert!(service["spec"]["ports"].as_array().expect("ports").iter().any(|p| p["name"] == "metrics"));
    assert_eq!(sm["spec"]["selector"]["matchLabels"], service["spec"]["selector"]);
    let cm = find(&objects, "ConfigMap", "archer-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let dashboard: Value = serde_json::from_str(cm["data"]["archer.json"].as_str().expect("archer.json")).expect("json");
    assert_eq!(dashboard, dashboard_file());
    // Dashboards shared by many clusters and jobs: every series is selected by both variables.
    let names: Vec<&str> = dashboard["templating"]["list"].as_array().expect("variables").iter().filter_map(|v| v["name"].as_str()).collect();
    assert!(names.contains(&"cluster") && names.contains(&"job"), "{names:?}");
    fn exprs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => m.iter().for_each(|(k, v)| if k == "expr" { out.extend(v.as_str().map(String::from)) } else { exprs(v, out) }),
            Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    exprs(&dashboard, &mut all);
    for e in &all {
        for (at, _) in e.match_indices("archer_") {
            let name_end = e[at..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(e.len(), |n| at + n);
            assert!(e[name_end..].starts_with(r#"{cluster=~"$cluster", job=~"$job""#), "{} in {e} lacks the cluster and job matchers", &e[at..name_end]);
        }
    }
    // Archer down (no replica scraped), a lease nobody holds, and a certificate about to expire.
    let rules = rules_file();
    let expr_of = |alert: &str| rules["groups"][0]["rules"].as_array().expect("rules").iter().find(|r| r["alert"] == alert).and_then(|r| r["expr"].as_str()).unwrap_or_else(|| panic!("no alert {alert}")).to_string();
    assert!(expr_of("ArcherDown").starts_with("absent(archer_build_info"));
    assert!(expr_of("ArcherNoLeader").contains("archer_provisioner_leader_candidate") && expr_of("ArcherNoLeader").contains("archer_safety_net_leader_candidate") && expr_of("ArcherNoLeader").contains("archer_savings_leader_candidate"));
    assert!(expr_of("ArcherCertificateExpiresSoon").contains("archer_tls_certificate_expiration_timestamp_seconds"));
    // Every alert links its runbook page (tests/docs.rs holds the pages).
    for r in rules_file()["groups"][0]["rules"].as_array().expect("rules") {
        let alert = r["alert"].as_str().expect("alert");
        let url = r["annotations"]["runbook_url"].as_str().expect("runbook_url");
        assert!(url.ends_with(&format!("/runbooks/{}.html", alert.to_lowercase())), "{alert}: {url}");
    }
}

/// Every `archer_*` series a PromQL expression in the rules or the dashboard reads.
fn named_series() -> BTreeSet<String> {
    let mut exprs: Vec<String> = rules_file()["groups"].as_array().expect("groups").iter().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default()).filter_map(|r| r["expr"].as_str().map(String::from)).collect();
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(e)) = m.get("expr") {
                    out.push(e.clone());
                }
                m.values().for_each(|v| walk(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&dashboard_file(), &mut exprs);
    assert!(exprs.len() > 20, "the dashboard and rules hold expressions");
    let mut names = BTreeSet::new();
    for e in exprs {
        let mut rest = e.as_str();
        while let Some(i) = rest.find("archer_") {
            let tail = &rest[i..];
            let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
            names.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    names
}

/// The series names a /metrics page can hold, from its `# TYPE` lines (a family with no
/// samples yet still has one): counters as `_total`, histograms as `_bucket`/`_sum`/`_count`.
fn exported_series(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
        let series: Vec<String> = match kind {
            "counter" => vec![format!("{name}_total")],
            "histogram" => ["_bucket", "_sum", "_count"].iter().map(|s| format!("{name}{s}")).collect(),
            _ => vec![name.to_string()],
        };
        for s in series {
            out.insert(s, kind.to_string());
        }
    }
    out
}

#[tokio::test]
async fn every_metric_the_dashboard_and_rules_name_is_exported() {
    let archer = common::Archer::start("", &[]).await;
    let exported = exported_series(&archer.metrics().await);
    let named = named_series();
    let missing: Vec<&String> = named.iter().filter(|n| !exported.contains_key(*n)).collect();
    assert!(missing.is_empty(), "named in the dashboard or rules but not exported: {missing:?}");
    // The cost and savings families the issue names.
    for n in ["archer_nodes_cost_per_hour_dollars", "archer_savings_per_hour_dollars", "archer_baseline_cost_per_hour_dollars", "archer_provisioned_pod_startup_duration_seconds_bucket"] {
        assert!(named.contains(n), "{n} is on no panel or rule");
    }
}

/// tls.mode generate: the Secret's certificate is signed by the webhook's caBundle and valid for
/// the Service's DNS name; Archer serves it, on the chart's own config file.
#[tokio::test]
async fn the_generated_certificate_serves_the_webhook_service() {
    let objects = rendered(&["--set", "tls.mode=generate"]);
    let secret: Secret = typed(&objects, "Secret", "archer-tls");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = secret.data.expect("data");
    let m: MutatingWebhookConfiguration = typed(&objects, "MutatingWebhookConfiguration", "archer");
    let ca_bundle = m.webhooks.expect("webhooks")[0].client_config.ca_bundle.clone().expect("caBundle");
    assert_eq!(ca_bundle.0, data["ca.crt"].0, "the caBundle is the CA in the Secret");
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).expect("certs dir");
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        std::fs::write(certs.join(key), &data[key].0).expect("write");
    }
    let cm: ConfigMap = typed(&objects, "ConfigMap", "archer-config");
    let config = cm.data.and_then(|d| d.get("config.yaml").cloned()).expect("config");
    let archer = common::Archer::start_with_certs(dir, certs, &config, &[]).await;
    let port = archer.https.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()).expect("port");
    let host = "archer.archer-system.svc";
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca_bundle.0).expect("ca"))
        .resolve(host, std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .build()
        .expect("client");
    let review = common::review("CREATE", &common::pod("p", &["registry.invalid/app:1"]));
    let r = client.post(format!("https://{host}:{port}/mutate")).json(&review).send().await.expect("TLS to the service name with the chart's CA");
    assert_eq!(r.status(), 200);
    // The same CA does not vouch for another name.
    let other = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca_bundle.0).expect("ca"))
        .resolve("other.archer-system.svc", std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .build()
        .expect("client");
    assert!(other.get(format!("https://other.archer-system.svc:{port}/mutate")).send().await.is_err());
}

/// Before install and upgrade, a hook runs `archer crds migrate` (moving objects off the CRD names
/// Karpenter shares) under an account of its own: CRDs deleted and read only by the old and new
/// names, backups only by their names (never Archer's config), the provisioner's Lease by name.
/// With `crds.install: false` (beside Karpenter) there is no hook, and the running Deployment's
/// account never touches a CRD.
#[test]
fn a_hook_moves_archers_objects_to_their_own_crd_names() {
    let objects = rendered(&["--set", "provisioner.leaseName=my-lease"]);
    let job = find(&objects, "Job", "archer-crd-migration");
    assert_eq!(job["metadata"]["annotations"]["helm.sh/hook"], "pre-install,pre-upgrade");
    let args: Vec<&str> = job["spec"]["template"]["spec"]["containers"][0]["args"].as_array().expect("args").iter().filter_map(Value::as_str).collect();
    assert_eq!(args, ["crds", "migrate", "--namespace", NAMESPACE, "--lease", "my-lease", "--helm-release", "archer"]);
    assert_eq!(job["spec"]["template"]["spec"]["serviceAccountName"], "archer-crd-migration");
    let cluster = find(&objects, "ClusterRole", "archer-crd-migration");
    for r in cluster["rules"].as_array().expect("rules") {
        let verbs: Vec<&str> = r["verbs"].as_array().expect("verbs").iter().filter_map(Value::as_str).collect();
        if r["resources"][0] == "customresourcedefinitions" && verbs != ["create"] {
            let names: Vec<&str> = r["resourceNames"].as_array().expect("CRDs by name").iter().filter_map(Value::as_str).collect();
            assert!(names.iter().all(|n| n.ends_with(".archer.dev")), "{names:?}");
        }
    }
    let role = find(&objects, "Role", "archer-crd-migration");
    for r in role["rules"].as_array().expect("rules") {
        let verbs: Vec<&str> = r["verbs"].as_array().expect("verbs").iter().filter_map(Value::as_str).collect();
        if verbs != ["create"] {
            let names: Vec<&str> = r["resourceNames"].as_array().expect("by name").iter().filter_map(Value::as_str).collect();
            assert!(names.iter().all(|n| n.starts_with("archer-crd-migration-") || *n == "my-lease"), "{names:?}");
            assert!(names.len() == 64 || names == ["my-lease"], "16 backup chunks for each of 4 kinds: {}", names.len());
        }
    }
    assert!(find(&objects, "ClusterRole", "archer")["rules"].as_array().expect("rules").iter().all(|r| r["apiGroups"][0] != "apiextensions.k8s.io"), "the Deployment's account touches no CRD");
    let beside = rendered(&["--set", "crds.install=false"]);
    assert!(beside.iter().all(|o| !o["metadata"]["name"].as_str().unwrap_or("").contains("crd-migration")), "no hook without Archer's CRDs");
}

/// tls.mode managed (the default): no Secret and no caBundle rendered (Archer writes both at run
/// time, and an upgrade leaves what it wrote alone); Archer is told the Secret, the webhook
/// configuration and the Service, and mounts no certificate; the second scheduler still mounts
/// the Secret's `ca.crt` to verify the extender.
#[test]
fn the_managed_certificate_is_left_to_archer() {
    let objects = rendered(&["--set", "extender.secondScheduler.enabled=true"]);
    assert!(objects.iter().all(|o| o["kind"] != "Secret"), "no Secret rendered: {:?}", keys(&objects));
    let m = find(&objects, "MutatingWebhookConfiguration", "archer");
    assert!(m["webhooks"][0]["clientConfig"].get("caBundle").is_none(), "no caBundle rendered: {}", m["webhooks"][0]["clientConfig"]);
    assert!(m["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].is_null());
    let pod = &find(&objects, "Deployment", "archer")["spec"]["template"]["spec"];
    let args: Vec<&str> = pod["containers"][0]["args"].as_array().expect("args").iter().filter_map(Value::as_str).collect();
    for want in ["--tls-secret=archer-tls", "--webhook-configuration=archer", "--tls-service=archer"] {
        assert!(args.contains(&want), "{want} in {args:?}");
    }
    assert!(!args.iter().any(|a| a.starts_with("--tls-cert") || a.starts_with("--tls-key")), "{args:?}");
    assert!(pod["volumes"].as_array().expect("volumes").iter().all(|v| v["name"] != "tls"), "no certificate volume");
    let scheduler = &find(&objects, "Deployment", "archer-scheduler")["spec"]["template"]["spec"];
    assert!(scheduler["volumes"].as_array().expect("volumes").iter().any(|v| v["secret"]["secretName"] == "archer-tls"), "the second scheduler reads the CA from the managed Secret");
}

/// The supported installation beside Karpenter (docs "Beside Karpenter"): the webhook and
/// extender, the provisioner off, and none of Archer's CRDs (`crds.install: false`).
#[test]
fn the_beside_karpenter_values_run_the_webhook_and_extender_with_the_provisioner_off() {
    let values = root().join("deploy/helm/archer/values-beside-karpenter.yaml");
    let objects = rendered(&["-f", values.to_str().expect("utf-8 path")]);
    assert_eq!(archer_config(&objects).provisioner.cloud_provider, "none");
    assert!(objects.iter().any(|o| o["kind"] == "MutatingWebhookConfiguration"), "the webhook is registered");
    assert!(objects.iter().all(|o| o["kind"] != "CustomResourceDefinition"), "no CRD: {:?}", keys(&objects));
}

/// Archer's CRDs are templates (Helm never upgrades crds/): rendered by default, each the
/// generated file with the chart's labels and `helm.sh/resource-policy: keep`, so an upgrade
/// updates them and an uninstall leaves them and their objects; `crds.keep: false` lets Helm
/// delete them, `crds.install: false` leaves them out.
#[test]
fn the_crds_are_templates_that_upgrades_update_and_uninstalls_keep() {
    let crds = |flags: &[&str]| -> Vec<Value> { rendered(flags).into_iter().filter(|o| o["kind"] == "CustomResourceDefinition" && o["metadata"]["name"].as_str().is_some_and(|n| n.ends_with(".archer.dev"))).collect() };
    let installed = crds(&[]);
    let files: Vec<std::path::PathBuf> = std::fs::read_dir(root().join("deploy/crds")).expect("deploy/crds").filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.file_name().is_some_and(|n| n != "kustomization.yaml" && n != "nodeoverlay.yaml")).collect();
    assert_eq!(installed.len(), files.len(), "every CRD of deploy/crds/: {:?}", keys(&installed));
    assert!(!root().join("deploy/helm/archer/crds").exists(), "nothing in crds/, which Helm never upgrades");
    for file in files {
        let want = &archer::yaml::from_multiple::<Value>(&std::fs::read_to_string(&file).expect("crd")).expect("yaml")[0];
        let name = want["metadata"]["name"].as_str().expect("name");
        let got = installed.iter().find(|c| c["metadata"]["name"] == name).unwrap_or_else(|| panic!("{name} rendered"));
        assert_eq!(got["spec"], want["spec"], "{name}: the generated schema, unchanged");
        assert_eq!(got["metadata"]["annotations"]["helm.sh/resource-policy"], "keep", "{name}");
        assert_eq!(got["metadata"]["labels"]["app.kubernetes.io/managed-by"], "Helm", "{name}");
    }
    assert!(crds(&["--set", "crds.keep=false"]).iter().all(|c| c["metadata"]["annotations"]["helm.sh/resource-policy"].is_null()));
    assert!(crds(&["--set", "crds.install=false"]).is_empty());
}

/// `helm uninstall` first runs a Job that deletes the webhook's configuration and then releases
/// every pod from the gate (`archer ungate --all`), under a service account of its own created
/// for the uninstall only (hooks that come before the Job); its pod is not one of the
/// Deployment's (the Service and the PodDisruptionBudget must not count it), and
/// `ungateOnUninstall: false` leaves it out.
#[test]
fn uninstalling_runs_archer_ungate_before_anything_is_removed() {
    let objects = rendered(&["--set", "tls.mode=secret"]);
    let job = find(&objects, "Job", "archer-ungate");
    assert_eq!(job["metadata"]["annotations"]["helm.sh/hook"], "pre-delete");
    let pod = &job["spec"]["template"];
    assert_eq!(pod["spec"]["serviceAccountName"], "archer-ungate", "the hook's own service account, not the Deployment's");
    assert_eq!(pod["spec"]["containers"][0]["args"], json!(["ungate", "--all", "--delete-webhook-configuration", "archer"]));
    let webhook = find(&objects, "MutatingWebhookConfiguration", "archer");
    assert_eq!(webhook["metadata"]["name"], "archer", "the configuration the hook deletes is the chart's");
    let selector = find(&objects, "Deployment", "archer")["spec"]["selector"]["matchLabels"].clone();
    let labels = &pod["metadata"]["labels"];
    assert!(selector.as_object().expect("selector").iter().any(|(k, v)| labels.get(k) != Some(v)), "the hook's pod is not selected by the Deployment's selector");
    // Its service account and permissions exist for the uninstall only, created before the Job.
    let weight = |o: &Value| o["metadata"]["annotations"]["helm.sh/hook-weight"].as_str().and_then(|w| w.parse::<i32>().ok()).expect("hook weight");
    for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"] {
        let o = find(&objects, kind, "archer-ungate");
        assert_eq!(o["metadata"]["annotations"]["helm.sh/hook"], "pre-delete", "{kind}");
        assert!(weight(&o) < weight(&job), "{kind} is created before the Job");
    }
    assert_eq!(find(&objects, "ServiceAccount", "archer-ungate")["metadata"]["namespace"], NAMESPACE);
    let binding = find(&objects, "ClusterRoleBinding", "archer-ungate");
    assert_eq!(binding["roleRef"]["name"], "archer-ungate");
    assert_eq!(binding["subjects"], json!([{"kind": "ServiceAccount", "name": "archer-ungate", "namespace": NAMESPACE}]));
    assert_eq!(find(&objects, "ClusterRole", "archer-ungate")["rules"], json!(ungate_rules("archer")), "list and patch pods, delete its own webhook configuration, nothing else");
    let without = rendered(&["--set", "tls.mode=secret", "--set", "ungateOnUninstall=false"]);
    assert!(!without.iter().any(|o| is_hook(o) && o["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"), "ungateOnUninstall: false renders no uninstall hook");
    assert!(!without.iter().any(|o| o["metadata"]["name"] == "archer-ungate"), "nor its service account and permissions");
}

const READ: &[&str] = &["get", "list", "watch"];

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": [group], "resources": resources, "verbs": verbs})
}

fn named_rule(group: &str, resources: &[&str], names: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": [group], "resources": resources, "resourceNames": names, "verbs": verbs})
}

/// What the uninstall hook's service account may do: `archer ungate --all
/// --delete-webhook-configuration <webhook>`.
fn ungate_rules(webhook: &str) -> Vec<Value> {
    vec![rule("", &["pods"], &["list", "patch"]), named_rule("admissionregistration.k8s.io", &["mutatingwebhookconfigurations"], &[webhook], &["delete"])]
}

/// The ClusterRole's rules of a release: every replica's reads, then pods and evictions for the
/// safety net or the provisioner, then the provisioner's own (`provisioner` = the verbs on
/// nodes), then the node classes, then Events.
/// `safety_net`: the log tails of containers that exited at once, read by the safety net alone.
/// The savings reporter (the provisioner off, the default `config.savings.enabled`): pods read
/// (unless the pod rules already grant it), DaemonSets, Karpenter's NodePools and NodeOverlays.
fn cluster_rules(pods: bool, provisioner: Option<&[&str]>, classes: Option<&str>) -> Vec<Value> {
    cluster_rules_with(pods, pods, provisioner, classes, provisioner.is_none())
}

fn cluster_rules_with(pods: bool, safety_net: bool, provisioner: Option<&[&str]>, classes: Option<&str>, savings: bool) -> Vec<Value> {
    let mut rules = vec![rule("", &["namespaces", "nodes"], READ), rule("", &["serviceaccounts", "secrets"], &["get"]), managed_tls_rule()];
    if pods {
        rules.extend([rule("", &["pods"], &["get", "list", "watch", "patch"]), rule("", &["pods/eviction"], &["create"])]);
    }
    if safety_net {
        rules.push(rule("", &["pods/log"], &["get"]));
    }
    if let Some(node_verbs) = provisioner {
        rules.extend([
            rule("", &["nodes"], node_verbs),
            rule("apps", &["daemonsets"], READ),
            rule("", &["persistentvolumeclaims", "persistentvolumes"], READ),
            rule("archer.dev", &["archernodepools"], READ),
            rule("archer.dev", &["archernodepools/status"], &["patch"]),
            rule("archer.dev", &["archernodeclaims"], &["get", "list", "watch", "create", "delete"]),
            rule("archer.dev", &["archernodeclaims/status"], &["patch"]),
            rule("karpenter.sh", &["nodeoverlays"], READ),
            rule("karpenter.sh", &["nodeoverlays/status"], &["patch"]),
        ]);
    }
    if savings {
        if !pods {
            rules.push(rule("", &["pods"], READ));
        }
        rules.extend([rule("apps", &["daemonsets"], READ), rule("karpenter.sh", &["nodepools", "nodeoverlays"], READ)]);
    }
    if let Some(plural) = classes {
        rules.extend([rule("archer.dev", &[plural], READ), rule("archer.dev", &[&format!("{plural}/status")], &["patch"])]);
    }
    if pods {
        rules.push(rule("events.k8s.io", &["events"], &["create", "patch"]));
    }
    rules
}

/// `tls.mode: managed` (the default): the release's own webhook configuration, by name, to
/// publish the CA in its caBundle.
fn managed_tls_rule() -> Value {
    named_rule("admissionregistration.k8s.io", &["mutatingwebhookconfigurations"], &["archer"], &["get", "patch"])
}

/// The Role's rules in Archer's namespace: its Leases, and the safety net's record by name.
fn namespace_rules(record: Option<&str>) -> Vec<Value> {
    let mut rules = vec![rule("coordination.k8s.io", &["leases"], &["get", "list", "watch", "create", "patch", "update"])];
    if let Some(name) = record {
        rules.push(named_rule("", &["configmaps"], &[name], &["get", "list", "watch", "update"]));
    }
    rules
}

/// Each mode is granted exactly what it runs (docs "Deploying"): the whole rule lists, in
/// order. `nodes: create/delete` with kwok alone; each cloud's node classes with that cloud
/// alone; no provisioner rule with the provisioner off; ConfigMaps only by the record's name;
/// no Role at all when nothing holds a Lease; nobody but the uninstall hook deletes the webhook's
/// configuration.
#[test]
fn each_mode_is_granted_exactly_the_rules_it_needs() {
    let beside = root().join("deploy/helm/archer/values-beside-karpenter.yaml");
    let beside = beside.to_str().expect("utf-8 path");
    let record = Some("archer-safety-net");
    let kwok: &[&str] = &["create", "patch", "delete"];
    let cloud: &[&str] = &["patch"];
    /// A mode's name, its `--set` values, and the exact ClusterRole and Role rules it gets.
    type Mode<'a> = (&'a str, Vec<&'a str>, Vec<Value>, Option<Vec<Value>>);
    let modes: Vec<Mode> = vec![
        ("webhook, extender and safety net (the defaults)", vec![], cluster_rules(true, None, None), Some(namespace_rules(record))),
        ("beside Karpenter", vec!["-f", beside], cluster_rules(true, None, None), Some(namespace_rules(record))),
        ("webhook, extender and savings", vec!["--set", "config.safetyNet.enabled=false"], cluster_rules(false, None, None), Some(namespace_rules(None))),
        ("webhook and extender only", vec!["--set", "config.safetyNet.enabled=false,config.savings.enabled=false"], cluster_rules_with(false, false, None, None, false), None),
        ("kwok provisioner", vec!["--set", "provisioner.cloudProvider=kwok"], cluster_rules(true, Some(kwok), None), Some(namespace_rules(record))),
        ("kwok provisioner, no safety net", vec!["--set", "provisioner.cloudProvider=kwok,config.safetyNet.enabled=false"], cluster_rules_with(true, false, Some(kwok), None, false), Some(namespace_rules(None))),
        ("aws provisioner", vec!["--set", "provisioner.cloudProvider=aws,provisioner.aws.clusterName=prod"], cluster_rules(true, Some(cloud), Some("archerec2nodeclasses")), Some(namespace_rules(record))),
        ("azure provisioner", vec!["--set", "provisioner.cloudProvider=azure"], cluster_rules(true, Some(cloud), Some("archeraksnodeclasses")), Some(namespace_rules(record))),
        ("another record name", vec!["--set", "config.safetyNet.configMap=archer-record"], cluster_rules(true, None, None), Some(namespace_rules(Some("archer-record")))),
        ("a certificate of the user's", vec!["--set", "tls.mode=secret"], cluster_rules(true, None, None).into_iter().filter(|r| *r != managed_tls_rule()).collect(), Some(namespace_rules(record))),
    ];
    for (mode, flags, cluster, namespaced) in modes {
        let objects = rendered(&flags);
        assert_eq!(find(&objects, "ClusterRole", "archer")["rules"], json!(cluster), "{mode}: the ClusterRole");
        let binding = find(&objects, "ClusterRoleBinding", "archer");
        assert_eq!(binding["subjects"], json!([{"kind": "ServiceAccount", "name": "archer", "namespace": NAMESPACE}]), "{mode}");
        let role = objects.iter().find(|o| o["kind"] == "Role" && o["metadata"]["name"] == "archer-leader-election").cloned();
        // tls.mode managed: the certificate's Secret, created, then read and replaced by name.
        let tls_role = objects.iter().find(|o| o["kind"] == "Role" && o["metadata"]["name"] == "archer-tls");
        if flags.contains(&"tls.mode=secret") {
            assert!(tls_role.is_none(), "{mode}: no Secret to manage, yet {tls_role:?}");
        } else {
            let tls_role = tls_role.unwrap_or_else(|| panic!("{mode}: no Role for the managed certificate"));
            assert_eq!(tls_role["rules"], json!([rule("", &["secrets"], &["create"]), named_rule("", &["secrets"], &["archer-tls"], &["get", "update"])]), "{mode}");
            assert_eq!(find(&objects, "RoleBinding", "archer-tls")["subjects"], json!([{"kind": "ServiceAccount", "name": "archer", "namespace": NAMESPACE}]), "{mode}");
        }
        match &namespaced {
            Some(rules) => {
                let role = role.unwrap_or_else(|| panic!("{mode}: no Role"));
                assert_eq!((role["metadata"]["name"].as_str(), role["metadata"]["namespace"].as_str()), (Some("archer-leader-election"), Some(NAMESPACE)), "{mode}");
                assert_eq!(role["rules"], json!(rules), "{mode}: the Role");
                let binding = find(&objects, "RoleBinding", "archer-leader-election");
                assert_eq!(binding["subjects"], json!([{"kind": "ServiceAccount", "name": "archer", "namespace": NAMESPACE}]), "{mode}");
            }
            None => {
                assert!(role.is_none(), "{mode}: nothing holds a Lease, yet a Role: {role:?}");
                assert!(!objects.iter().any(|o| o["kind"] == "RoleBinding" && o["metadata"]["name"] == "archer-leader-election"), "{mode}");
            }
        }
        // The record the Role names is shipped (Archer cannot create it), and nothing more.
        let records: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] != "archer-config").collect();
        let record_name = records.iter().map(|o| o["metadata"]["name"].as_str().unwrap_or("")).collect::<Vec<_>>();
        let named = namespaced.iter().flatten().filter_map(|r| r["resourceNames"][0].as_str()).collect::<Vec<_>>();
        assert_eq!(record_name, named, "{mode}: the shipped record is the one the Role names");
        for r in records {
            assert_eq!(r["metadata"]["namespace"], NAMESPACE, "{mode}");
            assert!(r.get("data").is_none() && r.get("binaryData").is_none(), "{mode}: shipped empty, so an upgrade never resets what Archer wrote: {r}");
        }
        // Only the uninstall hook's account deletes the webhook's configuration.
        for o in objects.iter().filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role") {
            let deletes = o["rules"].as_array().expect("rules").iter().any(|r| r["resources"].as_array().is_some_and(|r| r.iter().any(|r| r == "mutatingwebhookconfigurations")) && r["verbs"].as_array().is_some_and(|v| v.iter().any(|v| v == "delete")));
            assert_eq!(deletes, o["metadata"]["name"] == "archer-ungate", "{mode}: {}", o["metadata"]["name"]);
        }
        // Every rule a Role or ClusterRole holds, nothing more: no wildcard, secrets by name.
        for o in objects.iter().filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role") {
            for r in o["rules"].as_array().expect("rules") {
                assert!(!r.to_string().contains("\"*\""), "{mode}: a wildcard in {r}");
            }
        }
    }
}

/// A rule list as single grants: (group, resource, name or "", verb).
fn grants(rules: &Value) -> BTreeSet<(String, String, String, String)> {
    let mut out = BTreeSet::new();
    for r in rules.as_array().expect("rules") {
        let strings = |key: &str| r[key].as_array().map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect::<Vec<_>>()).unwrap_or_default();
        let names = if r.get("resourceNames").is_some() { strings("resourceNames") } else { vec![String::new()] };
        for g in strings("apiGroups") {
            for res in strings("resources") {
                for n in &names {
                    for v in strings("verbs") {
                        out.insert((g.clone(), res.clone(), n.clone(), v));
                    }
                }
            }
        }
    }
    out
}

/// With kustomize, a provisioner's rules are deploy/provisioner/<provider>.yaml on top of
/// deploy/base/rbac.yaml: together exactly what the chart grants with that provider.
#[test]
fn the_kustomize_provisioner_rules_add_up_to_the_charts() {
    let base = grants(&find(&file_docs("deploy/base/rbac.yaml"), "ClusterRole", "archer")["rules"]);
    // The kustomize base serves a certificate it is given (tls.mode secret).
    for (provider, flags) in [("kwok", "tls.mode=secret,provisioner.cloudProvider=kwok"), ("aws", "tls.mode=secret,provisioner.cloudProvider=aws,provisioner.aws.clusterName=prod"), ("azure", "tls.mode=secret,provisioner.cloudProvider=azure")] {
        let docs = file_docs(&format!("deploy/provisioner/{provider}.yaml"));
        let extra = grants(&find(&docs, "ClusterRole", "archer-provisioner")["rules"]);
        assert!(extra.is_disjoint(&base), "{provider}: only what the base lacks");
        let binding = find(&docs, "ClusterRoleBinding", "archer-provisioner");
        assert_eq!(binding["roleRef"]["name"], "archer-provisioner");
        assert_eq!(binding["subjects"], json!([{"kind": "ServiceAccount", "name": "archer", "namespace": NAMESPACE}]));
        let chart = grants(&find(&rendered(&["--set", flags]), "ClusterRole", "archer")["rules"]);
        let kustomize: BTreeSet<_> = base.union(&extra).cloned().collect();
        // The base's savings reporter reads Karpenter's NodePools; with a provisioner on, that
        // grant stays (kustomize adds, it does not take away) and is the only difference.
        let savings_only: BTreeSet<_> = ["get", "list", "watch"].iter().map(|v| ("karpenter.sh".to_string(), "nodepools".to_string(), String::new(), v.to_string())).collect();
        let want: BTreeSet<_> = chart.union(&savings_only).cloned().collect();
        assert_eq!(kustomize, want, "{provider}: deploy/base/rbac.yaml and deploy/provisioner/{provider}.yaml against the chart");
    }
}

/// The gate policy (docs "Safety net"): pod updates that take `archer.dev/inspecting` away are
/// refused unless Archer's service account, or the uninstall hook's, sends them. Its names follow
/// the release's; `gatePolicy.enabled=false` leaves it out, as does a release with no safety net
/// (nothing gates pods then). What the API server makes of it: tests/e2e/gate_policy.rs.
#[test]
fn the_gate_policy_lets_only_archer_remove_its_gate() {
    let removers = |objects: &[Value], name: &str| -> String {
        let policy = find(objects, "ValidatingAdmissionPolicy", name);
        assert_eq!(policy["apiVersion"], "admissionregistration.k8s.io/v1");
        assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        assert_eq!(policy["spec"]["matchConstraints"]["resourceRules"], json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}]));
        let binding = find(objects, "ValidatingAdmissionPolicyBinding", name);
        assert_eq!((binding["spec"]["policyName"].as_str(), &binding["spec"]["validationActions"]), (Some(name), &json!(["Deny"])));
        let expression = policy["spec"]["validations"][0]["expression"].as_str().expect("expression").to_string();
        expression.rsplit_once(" in [").map(|(_, l)| l.trim_end_matches(']').to_string()).unwrap_or_else(|| panic!("no removers in {expression}"))
    };
    let objects = rendered(&[]);
    assert_eq!(removers(&objects, "archer-gate"), "'system:serviceaccount:archer-system:archer', 'system:serviceaccount:archer-system:archer-ungate'");
    assert_eq!(removers(&rendered(&["--set", "ungateOnUninstall=false"]), "archer-gate"), "'system:serviceaccount:archer-system:archer'");
    let other = rendered(&["--set", "fullnameOverride=tenant-archer,serviceAccount.name=placer"]);
    assert_eq!(removers(&other, "tenant-archer-gate"), "'system:serviceaccount:archer-system:placer', 'system:serviceaccount:archer-system:tenant-archer-ungate'");
    assert_eq!(find(&other, "Job", "tenant-archer-ungate")["spec"]["template"]["spec"]["serviceAccountName"], "tenant-archer-ungate");
    for off in ["gatePolicy.enabled=false", "config.safetyNet.enabled=false"] {
        let objects = rendered(&["--set", off]);
        assert!(!objects.iter().any(|o| o["kind"].as_str().is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))), "{off}: no gate policy");
    }
}

/// `helm lint` passes, with the defaults and with every mode's values.
#[test]
fn helm_lint_passes() {
    for flags in [&[][..], &["-f", "deploy/helm/archer/values-beside-karpenter.yaml"][..], &["--set", "provisioner.cloudProvider=kwok,tls.mode=certManager,networkPolicy.enabled=true,extender.secondScheduler.enabled=true"][..]] {
        let out = Command::new(helm()).current_dir(root()).args(["lint", "--strict", "deploy/helm/archer"]).args(flags).output().expect("run helm");
        assert!(out.status.success(), "helm lint {flags:?}:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
}

/// Rendering twice gives the same objects (Argo CD and `helm template | kubectl apply` would
/// otherwise see a change on every sync) where the certificate is Archer's own (the default,
/// `managed`: made at run time), cert-manager's or the user's. `tls.mode: generate` mints a CA
/// at render time and cannot: see the docs ("Install").
#[test]
fn rendering_twice_gives_the_same_objects() {
    let (a, b) = (rendered(&[]), rendered(&[]));
    assert_eq!(a, b, "the defaults");
    for mode in ["managed", "certManager", "secret"] {
        let flags = ["--set", &format!("tls.mode={mode}")];
        let (a, b) = (rendered(&flags), rendered(&flags));
        assert_eq!(a, b, "tls.mode={mode}");
    }
}

/// A release upgraded with `--reuse-values` from a chart without this one's new values carries
/// none of them: the templates take the defaults rather than failing, dropping the
/// ServiceAccount, or leaving the ports empty.
#[test]
fn values_a_previous_chart_did_not_have_take_their_defaults() {
    let objects = rendered(&["--set", "crds=null,ports=null,networkPolicy=null,serviceAccount.create=null,hostNetwork=null"]);
    assert!(objects.iter().any(|o| o["kind"] == "ServiceAccount" && o["metadata"]["name"] == "archer"), "the ServiceAccount is kept");
    assert!(objects.iter().any(|o| o["kind"] == "CustomResourceDefinition" && o["metadata"]["name"] == "archernodepools.archer.dev"));
    let c = &find(&objects, "Deployment", "archer")["spec"]["template"]["spec"]["containers"][0];
    let ports: Vec<i64> = c["ports"].as_array().expect("ports").iter().filter_map(|p| p["containerPort"].as_i64()).collect();
    assert_eq!(ports, [8443, 8080]);
    assert!(objects.iter().all(|o| o["kind"] != "NetworkPolicy"));
}
