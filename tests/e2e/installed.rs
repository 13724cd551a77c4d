//! Archer installed as users install it: its container image (tests/e2e/build-image, pushed to
//! the test registry as an OCI index), its Helm chart's default values but for the image and the
//! test registry, on the real node (node.rs). The API server reaches the webhook through its
//! Service (kube-proxy's rules), with the chart's generated certificate; metrics are scraped
//! through the Service; an upgrade rolls Archer with every pod created meanwhile mutated; an
//! uninstall leaves no webhook configuration and no gated pod behind.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::Cluster;
use crate::node::{push_tiny, NODE_NAME};
use crate::{annotation, namespace, wait};

const RELEASE_NS: &str = "archer-system";

/// Build Archer's image from the binary under test (the same layout the Dockerfile builds) and
/// push it to the cluster's registry as an OCI index; returns the repository.
fn push_archer_image(c: &Cluster) -> String {
    let repo = format!("{}/archer", c.registry.host);
    let mut cmd = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/build-image"));
    cmd.args(["--platform", "linux/amd64", "--binary", &format!("linux/amd64={}", env!("CARGO_BIN_EXE_archer"))]);
    // An arm64 build of the same revision, when one was made (ARCHER_E2E_ARM64_BINARY).
    if let Some(arm) = std::env::var_os("ARCHER_E2E_ARM64_BINARY") {
        cmd.args(["--platform", "linux/amd64,linux/arm64", "--binary"]).arg(format!("linux/arm64={}", arm.to_string_lossy()));
    }
    cmd.arg("--out").arg(c.dir.path().join("image")).args(["--tag", "e2e", "--push", &format!("{repo}:e2e"), "--plain-http"]);
    let out = cmd.output().expect("tests/e2e/build-image");
    assert!(out.status.success(), "build-image: {}", String::from_utf8_lossy(&out.stderr));
    repo
}

fn helm(c: &Cluster, args: &[&str]) -> String {
    let out = Command::new(crate::helm::helm()).args(args).arg("--kubeconfig").arg(&c.kubeconfig).output().expect("helm");
    assert!(out.status.success(), "helm {}: {}{}", args.join(" "), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The values a user would set for this cluster: the image, and the test registry (plain HTTP).
fn values(c: &Cluster, repo: &str) -> Vec<String> {
    vec![
        "--set".into(),
        format!("image.repository={repo},image.tag=e2e,config.registry.insecure[0]={}", c.registry.host),
    ]
}

/// Every Archer pod Ready on the real node, of the current ReplicaSet only; returns their names.
async fn archer_rolled_out(client: &Client, timeout: Duration) -> Vec<String> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), RELEASE_NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), RELEASE_NS);
    let start = Instant::now();
    loop {
        let d = deployments.get("archer").await.expect("the chart's Deployment");
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let st = d.status.clone().unwrap_or_default();
        let generation_seen = st.observed_generation >= d.metadata.generation;
        let done = generation_seen && st.updated_replicas == Some(want) && st.ready_replicas == Some(want) && st.replicas == Some(want);
        if done {
            let list = pods.list(&ListParams::default().labels("app.kubernetes.io/name=archer")).await.expect("pods").items;
            let running: Vec<&Pod> = list.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
            if running.len() == want as usize {
                for p in &running {
                    assert_eq!(p.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(NODE_NAME), "Archer runs on the real node");
                }
                return running.iter().filter_map(|p| p.metadata.name.clone()).collect();
            }
        }
        let why = pods.list(&ListParams::default()).await.map(|l| l.items.iter().map(|p| format!("{} {:?}", p.metadata.name.clone().unwrap_or_default(), p.status.as_ref().map(|s| (&s.phase, &s.container_statuses)))).collect::<Vec<_>>()).unwrap_or_default();
        assert!(start.elapsed() < timeout, "Archer not rolled out after {timeout:?}: {st:?}; pods: {why:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A pod of `image` in `ns` (not meant to run: it only goes through admission).
fn probe_pod(name: &str, image: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "probe"}},
        "spec": {"containers": [{"name": "app", "image": image}], "nodeSelector": {"archer.dev/e2e-nowhere": "true"}, "terminationGracePeriodSeconds": 0}
    }))
    .expect("pod")
}

/// Archer's metrics as Prometheus scrapes them: through the Service's `metrics` port, at its
/// ClusterIP (kube-proxy's rules on this host).
async fn scrape(client: &Client) -> String {
    let svc = Api::<Service>::namespaced(client.clone(), RELEASE_NS).get("archer").await.expect("the chart's Service");
    let ip = svc.spec.and_then(|s| s.cluster_ip).expect("a ClusterIP");
    let r = reqwest::Client::builder().pool_max_idle_per_host(0).build().expect("client").get(format!("http://{ip}:8080/metrics")).timeout(Duration::from_secs(5)).send().await.expect("metrics through the Service");
    assert!(r.status().is_success());
    r.text().await.expect("metrics")
}

fn sample(text: &str, name: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok())).sum()
}

/// The pod's log, read through the API server from the real kubelet.
async fn log_of(client: &Client, ns: &str, pod: &str) -> String {
    Api::<Pod>::namespaced(client.clone(), ns).logs(pod, &Default::default()).await.unwrap_or_default()
}

/// The managed certificate's Secret, written by Archer, and its CA, which the webhook's caBundle
/// must be: the CA.
async fn managed_certificate(client: &Client) -> Vec<u8> {
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), RELEASE_NS).get("archer-tls").await.expect("the managed Secret");
    assert_eq!(secret.metadata.labels.as_ref().and_then(|l| l.get("app.kubernetes.io/managed-by")).map(String::as_str), Some("archer"), "written by Archer, not rendered by Helm");
    let ca = secret.data.expect("data")["ca.crt"].0.clone();
    let config = Api::<MutatingWebhookConfiguration>::all(client.clone()).get("archer").await.expect("webhook configuration");
    let bundle = config.webhooks.expect("webhooks")[0].client_config.ca_bundle.clone().expect("a caBundle").0;
    assert_eq!(bundle, ca, "the caBundle is the managed CA");
    ca
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane and a real node: run tests/e2e/run installed_"]
async fn installed_by_its_chart_on_a_real_node() {
    let c = Cluster::start_real("installed-chart", false).await;
    let client = c.client().await;
    let tiny = c.dir.path().join("tiny");
    // The tests' own images: a multi-arch index (real amd64 and arm64 binaries).
    let amd = push_tiny(&c.registry, &tiny, "e2e/tiny", "amd64", "amd64", "amd64", &[]).await;
    let arm = push_tiny(&c.registry, &tiny, "e2e/tiny", "arm64", "arm64", "arm64", &[]).await;
    c.registry.push_index_over("e2e/tiny", "multi", &[(&amd, "linux/amd64"), (&arm, "linux/arm64")]).await;
    let multi = c.registry.image("e2e/tiny:multi");

    // Install: the image from the test registry, the chart's defaults (the managed certificate).
    let repo = push_archer_image(&c);
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/archer");
    let chart = chart.to_string_lossy().to_string();
    let mut install = vec!["install", "archer", &chart, "--namespace", RELEASE_NS, "--create-namespace", "--wait", "--timeout", "180s"];
    let v = values(&c, &repo);
    install.extend(v.iter().map(String::as_str));
    helm(&c, &install);
    let first = archer_rolled_out(&client, Duration::from_secs(120)).await;
    assert_eq!(first.len(), 2, "the chart's two replicas");
    // tls.mode managed: Archer wrote the Secret (under the chart's RBAC) and published its CA.
    let managed_ca = managed_certificate(&client).await;

    // A workload pod: mutated by the webhook through its Service, run by the real node.
    namespace(&client, "apps", json!({"archer.dev/prefer": "amd64,arm64"})).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "multi"},
        "spec": {"containers": [{"name": "app", "image": multi}], "terminationGracePeriodSeconds": 0}
    }))
    .expect("pod");
    // `helm install --wait` returns once the replicas are Ready; kube-proxy programs the
    // Service's new endpoints a moment later, and until then the API server cannot reach the
    // webhook (failurePolicy Ignore admits unmutated). Wait for a dry run to be mutated.
    wait("the webhook reachable through its Service", Duration::from_secs(30), || async {
        let dry = PostParams { dry_run: true, ..Default::default() };
        pods.create(&dry, &probe_pod("reachable", &multi)).await.is_ok_and(|p| annotation(&p, "archer.dev/platforms").is_some())
    })
    .await;
    // Archer's own image, as its webhook reads it: both architectures when CI built arm64 too.
    let own = pods.create(&PostParams { dry_run: true, ..Default::default() }, &probe_pod("archer-itself", &format!("{repo}:e2e"))).await.expect("dry run");
    let expected = if std::env::var_os("ARCHER_E2E_ARM64_BINARY").is_some() { "linux/amd64,linux/arm64" } else { "linux/amd64" };
    assert_eq!(annotation(&own, "archer.dev/platforms"), Some(expected), "Archer's image index");
    let created = pods.create(&PostParams::default(), &pod).await.expect("create");
    assert_eq!(annotation(&created, "archer.dev/platforms"), Some("linux/amd64,linux/arm64"), "mutated by the installed webhook: {:?}", created.metadata.annotations);
    wait("the multi-arch pod Running on the real node", Duration::from_secs(90), || async {
        pods.get("multi").await.ok().and_then(|p| p.status).and_then(|s| s.phase).as_deref() == Some("Running")
    })
    .await;
    let running = pods.get("multi").await.expect("pod");
    assert_eq!(running.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(NODE_NAME));
    wait("its log", Duration::from_secs(30), || async { log_of(&client, "apps", "multi").await.contains("arch=amd64") }).await;

    // Metrics through the Service: the admission above was counted by one of the replicas.
    let text = scrape(&client).await;
    assert!(text.contains(&format!("archer_build_info{{version=\"{}\"", env!("CARGO_PKG_VERSION"))), "Archer's metrics through the Service: {text}");

    // An upgrade that changes a value rolls both replicas; pods created all along are each
    // mutated: none refused, none let through unmutated.
    let stop = Arc::new(AtomicBool::new(false));
    let (made, refused, skipped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let creator = {
        let (pods, stop, made, refused, skipped, multi) = (pods.clone(), stop.clone(), made.clone(), refused.clone(), skipped.clone(), multi.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                match pods.create(&PostParams::default(), &probe_pod(&format!("probe-{i}"), &multi)).await {
                    Ok(p) if annotation(&p, "archer.dev/platforms").is_some() => {
                        made.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {
                        skipped.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("refused: {e}");
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut upgrade = vec!["upgrade", "archer", &chart, "--namespace", RELEASE_NS, "--reuse-values", "--set", "config.preferredWeight=60"];
    upgrade.extend(["--wait", "--timeout", "180s"]);
    helm(&c, &upgrade);
    let second = archer_rolled_out(&client, Duration::from_secs(180)).await;
    assert!(second.iter().all(|p| !first.contains(p)), "every replica replaced: {first:?} → {second:?}");
    assert_eq!(managed_certificate(&client).await, managed_ca, "the upgrade kept the CA Archer made, and its caBundle");
    // The old pods' last connections drain after they leave the endpoints.
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, Ordering::Relaxed);
    creator.await.expect("creator");
    let (made, refused, skipped) = (made.load(Ordering::Relaxed), refused.load(Ordering::Relaxed), skipped.load(Ordering::Relaxed));
    eprintln!("during the upgrade: {made} pods mutated, {refused} refused, {skipped} admitted unmutated");
    assert!(made > 20, "pods were created all along the roll: {made}");
    assert_eq!((refused, skipped), (0, 0), "no admission refused or skipped while Archer rolled");
    // Each scrape is a new connection, which kube-proxy sends to either replica; the API server
    // keeps one connection, so one replica may have answered every review.
    let mut answered = 0.0f64;
    for _ in 0..10 {
        answered = answered.max(sample(&scrape(&client).await, "archer_admission_reviews_total"));
    }
    assert!(answered > 0.0, "the new replicas answered reviews, counted and scraped through the Service");

    // Uninstall: the hook removes the webhook configuration, then every pod's gate.
    let gated: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "held"},
        "spec": {"schedulingGates": [{"name": "archer.dev/inspecting"}], "containers": [{"name": "app", "image": multi}], "terminationGracePeriodSeconds": 0}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &gated).await.expect("a gated pod");
    helm(&c, &["uninstall", "archer", "--namespace", RELEASE_NS, "--wait", "--timeout", "180s"]);
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let left: Vec<String> = webhooks.list(&ListParams::default()).await.expect("webhooks").items.into_iter().filter_map(|w| w.metadata.name).filter(|n| n.contains("archer")).collect();
    assert!(left.is_empty(), "no webhook configuration left: {left:?}");
    let all: Api<Pod> = Api::all(client.clone());
    let still_gated: Vec<String> = all.list(&ListParams::default()).await.expect("pods").items.into_iter().filter(|p| crate::safety_net::gates(p).iter().any(|g| g == "archer.dev/inspecting")).filter_map(|p| p.metadata.name).collect();
    assert!(still_gated.is_empty(), "no pod gated after uninstall: {still_gated:?}");
    // The managed Secret went with the webhook configuration it is owned by.
    let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), RELEASE_NS);
    wait("the managed Secret garbage-collected", Duration::from_secs(60), || async { secrets.get_opt("archer-tls").await.ok().flatten().is_none() }).await;
    let _ = pods.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
}

fn kubectl(c: &Cluster, args: &[&str]) -> String {
    let out = Command::new(c.bin.join("kubectl")).arg("--kubeconfig").arg(&c.kubeconfig).args(args).output().expect("kubectl (tests/e2e/build-components builds it)");
    assert!(out.status.success(), "kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Every kustomization under deploy/, found by walking it.
fn kustomizations(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("deploy/").flatten() {
        let path = entry.path();
        if path.is_dir() {
            kustomizations(&path, found);
        } else if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
            found.push(path.parent().expect("a directory").to_path_buf());
        }
    }
}

/// Every kustomize overlay under deploy/ renders with the real kustomize (kubectl's, built from
/// the control plane's module), and the installs apply to the real API server: deploy/ as is, and
/// deploy/cert-manager/ against cert-manager's own CRDs (from its Go module), the webhook's
/// caBundle left to cert-manager's injector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run installed_"]
async fn installed_by_kustomize_every_overlay_renders_and_applies() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let c = Cluster::start_mode("installed-kustomize", &[], crate::cluster::Mode::Karpenter, Vec::new()).await;
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let mut dirs = Vec::new();
    kustomizations(&deploy, &mut dirs);
    dirs.sort();
    assert!(dirs.len() >= 4, "deploy/, base, crds, cert-manager: {dirs:?}");
    for dir in &dirs {
        let rendered = kubectl(&c, &["kustomize", &dir.to_string_lossy()]);
        let docs: Vec<serde_json::Value> = archer::yaml::from_multiple(&rendered).expect("yaml");
        assert!(!docs.is_empty(), "{} renders objects", dir.display());
    }
    let overlay: Vec<serde_json::Value> = archer::yaml::from_multiple(&kubectl(&c, &["kustomize", &deploy.join("cert-manager").to_string_lossy()])).expect("yaml");
    let kinds: Vec<&str> = overlay.iter().filter_map(|o| o["kind"].as_str()).collect();
    for kind in ["Certificate", "Issuer", "Deployment", "MutatingWebhookConfiguration", "CustomResourceDefinition"] {
        assert!(kinds.contains(&kind), "the cert-manager overlay renders a {kind}: {kinds:?}");
    }

    // cert-manager's CRDs, then the overlay, as a user applies them.
    let cert_manager = std::fs::read_dir(&c.bin).expect("bin").flatten().map(|e| e.path()).find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("cert-manager-"))).expect("cert-manager's CRDs: tests/e2e/build-components fetches them");
    kubectl(&c, &["apply", "--server-side", "-f", &cert_manager.join("crds").to_string_lossy()]);
    kubectl(&c, &["wait", "--for", "condition=established", "crd", "--all", "--timeout=60s"]);
    kubectl(&c, &["apply", "--server-side", "-k", &deploy.join("cert-manager").to_string_lossy()]);
    // The plain install validates too (after the overlay made its namespace: a dry run makes none).
    kubectl(&c, &["apply", "--server-side", "--dry-run=server", "-k", &deploy.to_string_lossy()]);

    let client = c.client().await;
    let certificate = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"), "certificates");
    let cert = Api::<DynamicObject>::namespaced_with(client.clone(), RELEASE_NS, &certificate).list(&ListParams::default()).await.expect("certificates").items;
    assert_eq!(cert.len(), 1, "the serving certificate's request, for cert-manager to issue");
    let issued_to = cert[0].data["spec"]["secretName"].as_str().unwrap_or_default().to_string();
    let deployment = Api::<Deployment>::namespaced(client.clone(), RELEASE_NS).get("archer").await.expect("the Deployment");
    let volumes = serde_json::to_string(&deployment.spec.and_then(|s| s.template.spec).map(|s| s.volumes)).unwrap_or_default();
    assert!(volumes.contains(&issued_to), "Archer mounts the Secret cert-manager writes ({issued_to}): {volumes}");
    let webhook = Api::<MutatingWebhookConfiguration>::all(client.clone()).get("archer").await.expect("the webhook configuration");
    let inject = webhook.metadata.annotations.and_then(|a| a.get("cert-manager.io/inject-ca-from").cloned());
    assert_eq!(inject.as_deref(), Some(format!("{RELEASE_NS}/{}", cert[0].metadata.name.clone().unwrap_or_default()).as_str()), "cert-manager's injector fills the caBundle from the Certificate");
}
