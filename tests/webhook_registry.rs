//! `archer serve` over real HTTPS, with real AdmissionReview bodies, against a real registry.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

mod common;

use base64::Engine;
use common::*;
use serde_json::json;

struct Fixture {
    reg: Registry,
    archer: Archer,
}

/// A registry holding every kind of image the webhook must understand, and Archer in front of it.
async fn fixture(config: &str) -> Fixture {
    let reg = Registry::start().await;
    reg.push_index("multi/oci", "1.0", &["linux/amd64", "linux/arm64"], true, false).await;
    reg.push_index("multi/docker", "2.0", &["linux/arm/v7", "linux/s390x"], false, false).await;
    reg.push_image("single/oci-arm64", "1", "linux/arm64", true).await;
    reg.push_image("single/docker-amd64", "1", "linux/amd64", false).await;
    reg.push_index("multi/attested", "1", &["linux/amd64", "linux/arm64"], true, true).await;
    reg.push_index("multi/windows", "1", &["linux/amd64", "windows/amd64"], true, false).await;
    let config = format!("registry:\n  insecure: [\"{}\"]\n{config}", reg.host);
    let archer = Archer::start(&config, &[]).await;
    Fixture { reg, archer }
}

#[tokio::test]
async fn oci_index_multi_arch_pod_is_patched_toward_arm64() {
    let f = fixture("").await;
    let image = f.reg.image("multi/oci:1.0");
    let (resp, patched) = f.archer.admit(&pod("web", &[&image])).await;
    assert_eq!(resp["allowed"], true);
    assert_eq!(arch_values(&patched), vec![vec!["amd64", "arm64"]]);
    assert_eq!(
        patched["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]["matchExpressions"][0]["values"],
        json!(["arm64"])
    );
    let tolerations = patched["spec"]["tolerations"].as_array().expect("tolerations");
    assert_eq!(tolerations.len(), 3, "the two defaults plus the arm64 taint toleration");
    assert_eq!(tolerations[2], json!({"key": "kubernetes.io/arch", "operator": "Equal", "value": "arm64", "effect": "NoSchedule"}));
    assert_eq!(patched["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64,linux/arm64");
    assert_eq!(patched["metadata"]["annotations"]["archer.dev/decision"], "enforced");
    assert_eq!(resp["auditAnnotations"]["decision"], "enforced");

    // Reinvocation on our own output changes nothing.
    let (resp2, twice) = f.archer.admit(&patched).await;
    assert!(resp2.get("patch").is_none(), "{resp2}");
    assert_eq!(twice, patched);
}

#[tokio::test]
async fn docker_list_keeps_variants_and_single_arch_images_read_the_config_blob() {
    let f = fixture("").await;
    let (_, p) = f.archer.admit(&pod("a", &[&f.reg.image("multi/docker:2.0")])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/arm/v7,linux/s390x");
    assert_eq!(arch_values(&p), vec![vec!["arm", "s390x"]], "arm/v7 is arm, never arm64");

    let (_, p) = f.archer.admit(&pod("b", &[&f.reg.image("single/oci-arm64:1")])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/arm64");
    assert_eq!(arch_values(&p), vec![vec!["arm64"]]);
    assert!(p["spec"]["tolerations"].as_array().is_some_and(|t| t.iter().any(|t| t["value"] == "arm64")));

    let (_, p) = f.archer.admit(&pod("c", &[&f.reg.image("single/docker-amd64:1")])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64");
    assert_eq!(arch_values(&p), vec![vec!["amd64"]]);
    assert!(!p["spec"]["tolerations"].as_array().is_some_and(|t| t.iter().any(|t| t["value"] == "arm64")), "no arm64 toleration for an amd64-only pod");
}

#[tokio::test]
async fn attestations_are_skipped_windows_gets_its_own_term_and_containers_intersect() {
    let f = fixture("").await;
    let (_, p) = f.archer.admit(&pod("att", &[&f.reg.image("multi/attested:1")])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64,linux/arm64");

    let (_, p) = f.archer.admit(&pod("win", &[&f.reg.image("multi/windows:1")])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64,windows/amd64");
    let terms = required_terms(&p);
    assert_eq!(terms.as_array().map(Vec::len), Some(2));
    assert_eq!(terms[1]["matchExpressions"][1], json!({"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]}));

    // An init container that is amd64-only narrows a multi-arch app to amd64.
    let mut two = pod("mixed", &[&f.reg.image("multi/oci:1.0")]);
    two["spec"]["initContainers"] = json!([{"name": "init", "image": f.reg.image("single/docker-amd64:1")}]);
    let (_, p) = f.archer.admit(&two).await;
    assert_eq!(arch_values(&p), vec![vec!["amd64"]]);
}

#[tokio::test]
async fn digest_references_are_resolved_and_verified() {
    let f = fixture("").await;
    let pushed = f.reg.push_index("pinned/app", "v3", &["linux/amd64", "linux/arm64"], true, false).await;
    let image = format!("{}:v3@{}", f.reg.image("pinned/app"), pushed.digest);
    let (_, p) = f.archer.admit(&pod("pinned", &[&image])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64,linux/arm64");

    // `archer inspect` goes the same way and reports the digest.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_archer"))
        .args(["inspect", "--insecure-registry", &f.reg.host, "--output", "json", &f.reg.image("pinned/app:v3"), &f.reg.image("single/oci-arm64:1")])
        .output()
        .expect("archer inspect");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc[0]["digest"], json!(pushed.digest));
    assert_eq!(doc[0]["mediaType"], json!(OCI_INDEX));
    assert_eq!(doc[0]["platforms"], json!(["linux/amd64", "linux/arm64"]));
    assert_eq!(doc[1]["platforms"], json!(["linux/arm64"]));
    assert_eq!(doc[1]["mediaType"], json!(OCI_MANIFEST));

    let text = std::process::Command::new(env!("CARGO_BIN_EXE_archer"))
        .args(["inspect", "--insecure-registry", &f.reg.host, &f.reg.image("multi/docker:2.0")])
        .output()
        .expect("archer inspect");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("platforms: linux/arm/v7, linux/s390x"), "{text}");
}

#[tokio::test]
async fn tag_lookups_are_cached_and_concurrent_lookups_coalesce() {
    // The decision memo off: every admission goes to the image cache.
    let f = fixture("webhook:\n  decisionCacheMaxBytes: 0\n").await;
    f.reg.push_index("hot/app", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    let image = f.reg.image("hot/app:1");
    let misses_before = f.archer.metric("archer_image_lookups_total{result=\"miss\"}").await;
    let requests_before = f.archer.metric("archer_registry_requests_total").await;
    let pods: Vec<_> = (0..16).map(|i| pod(&format!("hot-{i}"), &[&image])).collect();
    let answers = futures::future::join_all(pods.iter().map(|p| f.archer.admit(p))).await;
    for (_, p) in &answers {
        assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64,linux/arm64");
    }
    let requests = f.archer.metric("archer_registry_requests_total").await - requests_before;
    assert_eq!(requests, 1.0, "16 concurrent admissions of one tag make one manifest request");
    // Later lookups are cache hits.
    let hits_before = f.archer.metric("archer_image_lookups_total{result=\"hit\"}").await;
    f.archer.admit(&pod("hot-later", &[&image])).await;
    assert_eq!(f.archer.metric("archer_image_lookups_total{result=\"hit\"}").await - hits_before, 1.0);
    assert!(f.archer.metric("archer_image_lookups_total{result=\"miss\"}").await > misses_before);
}

/// Image lookups of every result (hits, misses, failures) so far.
async fn image_lookups(archer: &Archer) -> f64 {
    let m = archer.metrics().await;
    m.lines().filter(|l| l.starts_with("archer_image_lookups_total")).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

#[tokio::test]
async fn replicas_reuse_the_decision_and_pods_with_other_inputs_do_not() {
    let f = fixture("").await;
    let image = f.reg.image("multi/oci:1.0");
    let reused = "archer_admission_decisions_reused_total";
    let archer = &f.archer;
    let (first, patched) = archer.admit(&pod("web-1", &[&image])).await;
    assert_eq!(arch_values(&patched), vec![vec!["amd64", "arm64"]]);
    assert_eq!(archer.metric(reused).await, 0.0);

    // The second replica is decided too (the first only marked its inputs as seen), and its
    // answer is kept: the same answer.
    let (decided, _) = archer.admit(&pod("web-2", &[&image])).await;
    assert_eq!(archer.metric(reused).await, 0.0, "a workload's second pod is decided, not reused");
    assert_eq!((&decided["patch"], &decided["auditAnnotations"]), (&first["patch"], &first["auditAnnotations"]));
    let enforced = archer.metric("archer_admission_reviews_total{outcome=\"enforced\"}").await;
    let looked_up = image_lookups(archer).await;

    // A replica after it: same inputs, another name and uid (admit checks the uid is its own).
    let (second, twin) = archer.admit(&pod("web-2b", &[&image])).await;
    assert_eq!(archer.metric(reused).await, 1.0);
    assert_eq!(image_lookups(archer).await, looked_up, "a reused decision looks nothing up");
    assert_eq!((&second["patch"], &second["auditAnnotations"], &second["allowed"]), (&first["patch"], &first["auditAnnotations"], &first["allowed"]));
    assert_eq!(twin["spec"], patched["spec"]);
    assert_eq!(archer.metric("archer_admission_reviews_total{outcome=\"enforced\"}").await, enforced + 1.0, "counted under its outcome");

    // Other inputs are decided afresh: a toleration of its own, another namespace, another image.
    let mut tolerating = pod("web-3", &[&image]);
    tolerating["spec"]["tolerations"] = json!([{"key": "kubernetes.io/arch", "operator": "Equal", "value": "arm64", "effect": "NoSchedule"}]);
    let (own, _) = archer.admit(&tolerating).await;
    assert_ne!(own["patch"], first["patch"], "the toleration is already there: a different patch");
    let mut elsewhere = pod("web-4", &[&image]);
    elsewhere["metadata"]["namespace"] = json!("other");
    archer.admit(&elsewhere).await;
    let (arm, _) = archer.admit(&pod("web-5", &[&f.reg.image("single/oci-arm64:1")])).await;
    assert_eq!(arm["auditAnnotations"]["platforms"], "linux/arm64");
    assert_eq!(archer.metric(reused).await, 1.0, "no other pod reused a decision");

    // A failed inspection is never reused: the next pod asks again (here the failure cache).
    let missing = f.reg.image("missing/app:1");
    archer.admit(&pod("gone-1", &[&missing])).await;
    let (again, _) = archer.admit(&pod("gone-2", &[&missing])).await;
    assert!(again["warnings"].to_string().contains("could not inspect"), "{again}");
    assert_eq!(archer.metric(reused).await, 1.0);
}

#[tokio::test]
async fn private_repository_needs_credentials() {
    let reg = Registry::start_with_auth("puller", "s3cret-pass").await;
    reg.push_index("private/app", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    let image = reg.image("private/app:1");

    // Without credentials: admitted unchanged (fail-open) with a warning and an annotation.
    let plain = Archer::start(&format!("registry:\n  insecure: [\"{}\"]\n", reg.host), &[]).await;
    let (resp, p) = plain.admit(&pod("anon", &[&image])).await;
    assert_eq!(resp["allowed"], true);
    assert!(resp["warnings"][0].as_str().is_some_and(|w| w.contains("denied access")), "{resp}");
    assert_eq!(p["metadata"]["annotations"]["archer.dev/decision"], "inspection-failed");
    assert!(p["spec"].get("affinity").is_none());
    assert_eq!(plain.metric("archer_image_inspection_failures_total{reason=\"unauthorized\"}").await, 1.0);

    // With a mounted docker config: inspected.
    let dir = tempfile::tempdir().expect("tmp");
    let auth = base64::engine::general_purpose::STANDARD.encode("puller:s3cret-pass");
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, json!({"auths": {reg.host.clone(): {"auth": auth}}}).to_string()).expect("write");
    let authed = Archer::start(&format!("registry:\n  insecure: [\"{}\"]\n", reg.host), &["--docker-config", cfg.to_str().expect("utf8")]).await;
    let (_, p) = authed.admit(&pod("authed", &[&image])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64,linux/arm64");
}

#[tokio::test]
async fn non_pods_updates_subresources_and_dry_run() {
    let f = fixture("").await;
    let image = f.reg.image("multi/oci:1.0");
    let p = pod("x", &[&image]);

    let (resp, _) = f.archer.admit_review(review("UPDATE", &p)).await;
    assert_eq!(resp["allowed"], true);
    assert!(resp.get("patch").is_none());

    let mut sub = review("CREATE", &p);
    sub["request"]["subResource"] = json!("binding");
    let (resp, _) = f.archer.admit_review(sub).await;
    assert!(resp.get("patch").is_none());

    let mut cm = review("CREATE", &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "shop"}}));
    cm["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "ConfigMap"});
    let (resp, _) = f.archer.admit_review(cm).await;
    assert_eq!(resp["allowed"], true);
    assert!(resp.get("patch").is_none());

    let mut dry = review("CREATE", &p);
    dry["request"]["dryRun"] = json!(true);
    let (resp, patched) = f.archer.admit_review(dry).await;
    assert!(resp.get("patch").is_some(), "dry run gets the same answer");
    assert_eq!(arch_values(&patched), vec![vec!["amd64", "arm64"]]);

    // Opted-out pods and excluded namespaces are left alone.
    let mut ignored = p.clone();
    ignored["metadata"]["labels"]["archer.dev/ignore"] = json!("true");
    let (resp, _) = f.archer.admit(&ignored).await;
    assert!(resp.get("patch").is_none());
    let mut system = p.clone();
    system["metadata"]["namespace"] = json!("kube-system");
    let (resp, _) = f.archer.admit(&system).await;
    assert!(resp.get("patch").is_none());
}

#[tokio::test]
async fn cluster_defaults_from_the_config_file_apply_in_standalone_mode() {
    let f = fixture("defaults:\n  mode: observe\n  prefer: [amd64, arm64]\n").await;
    let (_, p) = f.archer.admit(&pod("obs", &[&f.reg.image("multi/oci:1.0")])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/decision"], "observed");
    assert!(p["spec"].get("affinity").is_none());
}

#[tokio::test]
async fn bearer_token_flow_anonymous_and_with_credentials() {
    // Images are pushed through an open registry; a second real registry serves the same storage
    // behind token auth.
    let open = Registry::start().await;
    open.push_index("public/app", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    open.push_image("private/app", "1", "linux/arm64", true).await;
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = common::token::TokenService::start(dir.path(), "private/", "puller", "pw").await;
    let guarded = Registry::serve_storage(&open.storage, &tokens.auth_yaml).await;
    // The token realm is on 127.0.0.1 too, so it is listed as insecure like the registry.
    let realm_host = tokens.realm.trim_start_matches("http://").trim_end_matches("/token").to_string();
    let config = format!("registry:\n  insecure: [\"{}\", \"{}\"]\n", guarded.host, realm_host);

    let archer = Archer::start(&config, &[]).await;
    let (_, p) = archer.admit(&pod("pub", &[&guarded.image("public/app:1")])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64,linux/arm64");
    let (_, p) = archer.admit(&pod("priv", &[&guarded.image("private/app:1")])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/decision"], "inspection-failed", "{p}");
    {
        let seen = tokens.seen.lock().expect("lock");
        assert!(seen.iter().any(|(scope, basic)| scope == "repository:public/app:pull" && !basic), "{seen:?}");
    }

    let cfg_dir = tempfile::tempdir().expect("tmp");
    let cfg = cfg_dir.path().join("config.json");
    let auth = base64::engine::general_purpose::STANDARD.encode("puller:pw");
    std::fs::write(&cfg, json!({"auths": {guarded.host.clone(): {"auth": auth}}}).to_string()).expect("write");
    let authed = Archer::start(&config, &["--docker-config", cfg.to_str().expect("utf8")]).await;
    let (_, p) = authed.admit(&pod("priv", &[&guarded.image("private/app:1")])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/arm64");
    let seen = tokens.seen.lock().expect("lock");
    assert!(seen.iter().any(|(scope, basic)| scope == "repository:private/app:pull" && *basic), "credentials go to the token service: {seen:?}");
}

#[tokio::test]
async fn mirrors_are_tried_before_the_registry() {
    let mirror = Registry::start().await;
    mirror.push_index("team/app", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    // The origin does not exist; the mirror answers for it.
    let config = format!("registry:\n  insecure: [\"{0}\"]\n  mirrors:\n    registry.invalid: [\"{0}\"]\n  timeoutSeconds: 2\n", mirror.host);
    let archer = Archer::start(&config, &[]).await;
    let (_, p) = archer.admit(&pod("mirrored", &["registry.invalid/team/app:1"])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/amd64,linux/arm64", "{p}");
}

/// `pinDigests` rewrites each tag reference to the digest that was inspected (init containers
/// too); a reference that names a digest is left alone; reinvocation changes nothing.
#[tokio::test]
async fn pinned_digests_are_the_inspected_ones() {
    let f = fixture("defaults:\n  pinDigests: true\n").await;
    let digest = f.reg.push_index("multi/pinned", "3", &["linux/amd64", "linux/arm64"], true, false).await.digest;
    let by_digest = format!("{}@{digest}", f.reg.image("multi/pinned"));
    let mut p = pod("pinned", &[&f.reg.image("multi/pinned:3"), &by_digest]);
    p["spec"]["initContainers"] = json!([{"name": "init", "image": f.reg.image("multi/oci:1.0")}]);
    let (resp, patched) = f.archer.admit(&p).await;
    assert_eq!(resp["allowed"], true);
    assert_eq!(patched["spec"]["containers"][0]["image"], json!(format!("{}@{digest}", f.reg.image("multi/pinned:3"))));
    assert_eq!(patched["spec"]["containers"][1]["image"], json!(by_digest), "already a digest");
    let init = patched["spec"]["initContainers"][0]["image"].as_str().expect("init image");
    assert!(init.starts_with(&format!("{}@sha256:", f.reg.image("multi/oci:1.0"))), "{init}");
    let (again, twice) = f.archer.admit(&patched).await;
    assert!(again.get("patch").is_none(), "{again}");
    assert_eq!(twice, patched);
}

/// Gate mode without a cluster has no gate controller to release pods: a registry that does not
/// answer in time is the fail-open admission it would be in enforce mode, never a held pod.
#[tokio::test]
async fn gate_mode_without_its_controller_never_holds_a_pod() {
    let f = fixture("defaults:\n  mode: gate\nwebhook:\n  decisionTimeoutSeconds: 1\n").await;
    f.reg.pause();
    let (resp, patched) = f.archer.admit(&pod("slow", &[&f.reg.image("multi/oci:1.0")])).await;
    f.reg.resume();
    assert_eq!(resp["allowed"], true);
    assert!(patched["spec"].get("schedulingGates").is_none(), "{patched}");
    assert_eq!(patched["metadata"]["annotations"]["archer.dev/decision"], "inspection-failed");
}

/// A private ECR image with no pull secret (issue #43): Archer reads it with its own AWS
/// identity (the standard chain; here moto's `GetAuthorizationToken`, whose token is
/// `AWS:<account>-auth-token`) against the real `docker-registry` with htpasswd for that user,
/// the ECR host name reaching it through a `hosts.toml` `server` (Archer's own mirror
/// configuration, not `/etc/hosts`). Without the identity, or when it fails, the pod says why in
/// `archer.dev/inspection-error`, and `archer_registry_auth_failures_total{registry,reason}`
/// counts it: never a silent no-op.
#[tokio::test]
async fn a_private_ecr_image_without_a_pull_secret_is_read_with_archers_aws_identity() {
    let moto = common::moto::Moto::start().await;
    let reg = Registry::start_with_auth("AWS", "123456789012-auth-token").await;
    reg.push_image("team/app", "1", "linux/arm64", true).await;
    // A registry that refuses the identity's token (a role that cannot read it).
    let other = Registry::start_with_auth("AWS", "mounted-pass").await;
    other.push_image("team/app", "1", "linux/arm64", true).await;
    // Another account's registry: the region's token reaches every registry the principal may.
    let ecr = "111122223333.dkr.ecr.eu-west-1.amazonaws.com";
    let hosts = tempfile::tempdir().expect("tmp");
    std::fs::create_dir(hosts.path().join(ecr)).expect("dir");
    std::fs::write(hosts.path().join(ecr).join("hosts.toml"), format!("server = \"http://{}\"\n", reg.host)).expect("write");
    let second = "222233334444.dkr.ecr.eu-west-1.amazonaws.com";
    std::fs::create_dir(hosts.path().join(second)).expect("dir");
    std::fs::write(hosts.path().join(second).join("hosts.toml"), format!("server = \"http://{}\"\n", other.host)).expect("write");
    let config = |ecr_settings: &str| format!("registry:\n  insecure: [\"{}\", \"{}\"]\n  hostsDir: {}\n  timeoutSeconds: 3\n  ecr:\n{ecr_settings}", reg.host, other.host, hosts.path().display());
    let image = format!("{ecr}/team/app:1");

    let archer = Archer::start(&config(&format!("    endpoint: {}\n", moto.endpoint)), &[]).await;
    let (resp, p) = archer.admit(&pod("ecr", &[&image])).await;
    assert_eq!(resp["allowed"], true);
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/arm64", "{resp}");
    assert_eq!(arch_values(&p), [vec!["arm64".to_string()]], "decided as a public image would be");

    // The registry refusing the identity's token takes the mounted docker config's: the next
    // credential is tried, as the kubelet tries them.
    let docker = tempfile::tempdir().expect("tmp");
    let auth = base64::engine::general_purpose::STANDARD.encode("AWS:mounted-pass");
    std::fs::write(docker.path().join("config.json"), json!({"auths": {second: {"auth": auth}}}).to_string()).expect("write");
    let both = Archer::start(&config(&format!("    endpoint: {}\n", moto.endpoint)), &["--docker-config", docker.path().join("config.json").to_str().expect("utf8")]).await;
    let (resp, p) = both.admit(&pod("refused-then-mounted", &[&format!("{second}/team/app:1")])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/arm64", "{resp}");

    // The identity off: the registry asks for a credential Archer does not have.
    let off = Archer::start(&config("    enabled: false\n"), &[]).await;
    let (_, p) = off.admit(&pod("no-identity", &[&image])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/decision"], "inspection-failed");
    let why = p["metadata"]["annotations"]["archer.dev/inspection-error"].as_str().unwrap_or_default().to_string();
    assert!(why.contains(ecr) && why.contains("denied access"), "{why}");
    assert_eq!(off.metric(&format!("archer_registry_auth_failures_total{{registry=\"{ecr}\",reason=\"no_credential\"}}")).await, 1.0);

    // The identity failing (no ECR endpoint answers): said, with the identity's own reason.
    let dead = format!("http://127.0.0.1:{}", free_port());
    let failing = Archer::start(&config(&format!("    endpoint: {dead}\n")), &[]).await;
    let (_, p) = failing.admit(&pod("failing", &[&image])).await;
    let why = p["metadata"]["annotations"]["archer.dev/inspection-error"].as_str().unwrap_or_default().to_string();
    assert!(why.contains(&format!("no ecr credential for {ecr}")) && why.contains("GetAuthorizationToken in eu-west-1"), "{why}");
    assert_eq!(failing.metric(&format!("archer_registry_auth_failures_total{{registry=\"{ecr}\",reason=\"identity\"}}")).await, 1.0);
}

/// A private ACR image with no pull secret (issue #43): Archer's workload identity token (from
/// the local Entra stand-in) is exchanged at the registry's `/oauth2/exchange` for an ACR
/// refresh token, which the registry's challenge trades at `/oauth2/token` for a pull-scoped
/// token the real `docker-registry` verifies; every request is checked against ACR's data-plane
/// model. The login server's name reaches the local registry through a `hosts.toml` `server`.
/// One exchange serves many pods (kept by the refresh token's expiry). Without the identity's
/// settings the pod says why.
#[tokio::test]
async fn a_private_acr_image_without_a_pull_secret_is_read_with_archers_workload_identity() {
    use common::arm::{ArmServer, ACR_TOKEN, CLIENT_ID, TENANT};
    let arm = ArmServer::start().await;
    let open = Registry::start().await;
    open.push_image("team/api", "2", "linux/arm64", true).await;
    let dir = tempfile::tempdir().expect("tmp");
    let login = "archertest.azurecr.io";
    let acr = common::acr::Acr::start(dir.path(), &open.storage, login, ACR_TOKEN, TENANT).await;
    let hosts = tempfile::tempdir().expect("tmp");
    std::fs::create_dir(hosts.path().join(login)).expect("dir");
    std::fs::write(hosts.path().join(login).join("hosts.toml"), format!("server = \"http://{}\"\n", acr.host)).expect("write");
    let config = |acr_settings: &str| format!("registry:\n  insecure: [\"{}\"]\n  hostsDir: {}\n  timeoutSeconds: 3\n  ecr:\n    enabled: false\n  acr:\n{acr_settings}", acr.host, hosts.path().display());
    let identity = format!(
        "    tenantId: {TENANT}\n    clientId: {CLIENT_ID}\n    federatedTokenFile: {}\n    authorityHost: {}\n",
        arm.token_file.path().display(),
        arm.endpoint
    );
    let image = format!("{login}/team/api:2");

    let archer = Archer::start(&config(&identity), &[]).await;
    for name in ["acr-a", "acr-b"] {
        let (resp, p) = archer.admit(&pod(name, &[&image])).await;
        assert_eq!(p["metadata"]["annotations"]["archer.dev/platforms"], "linux/arm64", "{resp}");
        assert_eq!(arch_values(&p), [vec!["arm64".to_string()]]);
    }
    assert!(acr.violations().is_empty(), "requests ACR's model refuses: {:?}", acr.violations());
    assert!(arm.violations().is_empty(), "{:?}", arm.violations());
    assert_eq!(acr.exchanges(), 1, "one exchange, kept for the refresh token's lifetime");

    // No workload identity settings: said on the pod, counted as the identity's failure.
    let bare = Archer::start(&config("    enabled: true\n"), &[]).await;
    let (_, p) = bare.admit(&pod("no-identity", &[&image])).await;
    let why = p["metadata"]["annotations"]["archer.dev/inspection-error"].as_str().unwrap_or_default().to_string();
    assert!(why.contains(&format!("[identity] no acr credential for {login}")), "{why}");
    assert_eq!(bare.metric(&format!("archer_registry_auth_failures_total{{registry=\"{login}\",reason=\"identity\"}}")).await, 1.0);
}

/// A `hosts.toml` tree is held to the address guard (issue #43): a plain-HTTP mirror that is not
/// one of `registry.insecure` stops Archer at start with a message naming it, as does a
/// `skip_verify` it cannot honour; an `https://` mirror on a guarded address (loopback here) is
/// refused at the lookup, and the pod says why.
#[tokio::test]
async fn hosts_toml_mirrors_stay_behind_the_address_guard() {
    let reg = Registry::start().await;
    reg.push_index("team/app", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    let write = |text: &str| {
        let hosts = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(hosts.path().join("registry.example.invalid")).expect("dir");
        std::fs::write(hosts.path().join("registry.example.invalid").join("hosts.toml"), text).expect("write");
        hosts
    };
    for (text, says) in [
        (format!("[host.\"http://{}\"]\n", reg.host), format!("names http://{}: list it in registry.insecure", reg.host)),
        (format!("[host.\"https://{}\"]\n  skip_verify = true\n", reg.host), "skip_verify is not supported".to_string()),
    ] {
        let hosts = write(&text);
        let dir = tempfile::tempdir().expect("tmp");
        let certs = make_certs(&dir.path().join("certs"));
        let mut archer = Archer::spawn(dir, certs, &format!("registry:\n  hostsDir: {}\n", hosts.path().display()), &[]);
        let status = archer.wait_exit(std::time::Duration::from_secs(10)).await.expect("archer refuses to start");
        assert!(!status.success());
        assert!(archer.log_text().contains(&says), "{says}: {}", archer.log_text());
    }
    // https to 127.0.0.1, not listed insecure: the guard refuses the loopback address.
    let hosts = write(&format!("[host.\"https://{}\"]\n", reg.host));
    let archer = Archer::start(&format!("registry:\n  hostsDir: {}\n  timeoutSeconds: 2\n", hosts.path().display()), &[]).await;
    let (_, p) = archer.admit(&pod("guarded", &["registry.example.invalid/team/app:1"])).await;
    assert_eq!(p["metadata"]["annotations"]["archer.dev/decision"], "inspection-failed");
    assert!(p["metadata"]["annotations"]["archer.dev/inspection-error"].as_str().is_some_and(|e| e.contains("refusing to contact") || e.contains("forbidden_address")), "{p}");
}
