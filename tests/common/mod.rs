//! Shared test fixtures: a real registry (Debian's `docker-registry`, the CNCF distribution
//! server) on 127.0.0.1 with images pushed through its HTTP API, and a real `archer serve`.
#![allow(dead_code)]

pub mod acr;
pub mod arm;
pub mod moto;
pub mod price_apis;
pub mod token;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// A free port, never one this process handed out before: the kernel may give the same
/// ephemeral port to two probes in a row once the first listener is closed, and two components
/// told to listen on one port fail to start (seen once: etcd and kube-apiserver on one port).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

pub fn registry_binary() -> PathBuf {
    let p = std::env::var_os("ARCHER_TEST_REGISTRY").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/docker-registry"));
    assert!(p.exists(), "the real registry server is needed: apt-get install docker-registry (or set ARCHER_TEST_REGISTRY)");
    p
}

pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A running distribution registry; killed on drop.
pub struct Registry {
    pub host: String,
    child: Child,
    /// Where the registry keeps its blobs and manifests (another registry may serve the same).
    pub storage: PathBuf,
    _dir: tempfile::TempDir,
    creds: Option<(String, String)>,
    http: reqwest::Client,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Clone, Debug)]
pub struct Pushed {
    pub digest: String,
    pub size: usize,
    pub media_type: String,
}

impl Registry {
    pub async fn start() -> Registry {
        Self::start_with(None).await
    }

    /// A registry listening on `ip` (an address pods reach too: the e2e real node's).
    pub async fn start_on(ip: &str) -> Registry {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = dir.path().join("data");
        Self::spawn_on(ip, dir, storage, String::new(), None).await
    }

    /// Start a registry that requires basic auth (htpasswd) for everything.
    pub async fn start_with_auth(user: &str, pass: &str) -> Registry {
        Self::start_with(Some((user.to_string(), pass.to_string()))).await
    }

    async fn start_with(creds: Option<(String, String)>) -> Registry {
        let dir = tempfile::tempdir().expect("tempdir");
        let auth = creds.as_ref().map(|(u, p)| {
            let hash = bcrypt::hash(p, 4).expect("bcrypt");
            std::fs::write(dir.path().join("htpasswd"), format!("{u}:{hash}\n")).expect("htpasswd");
            format!("auth:\n  htpasswd:\n    realm: archer-test\n    path: {}\n", dir.path().join("htpasswd").display())
        });
        let storage = dir.path().join("data");
        Self::spawn(dir, storage, auth.unwrap_or_default(), creds).await
    }

    /// Serve an existing storage directory with the given `auth:` section (e.g. token auth).
    pub async fn serve_storage(storage: &Path, auth_yaml: &str) -> Registry {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::spawn(dir, storage.to_path_buf(), auth_yaml.to_string(), None).await
    }

    async fn spawn(dir: tempfile::TempDir, storage: PathBuf, auth_yaml: String, creds: Option<(String, String)>) -> Registry {
        Self::spawn_on("127.0.0.1", dir, storage, auth_yaml, creds).await
    }

    async fn spawn_on(ip: &str, dir: tempfile::TempDir, storage: PathBuf, auth_yaml: String, creds: Option<(String, String)>) -> Registry {
        let port = free_port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog: {{disabled: true}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\nhttp:\n  addr: {ip}:{port}\n",
            storage.display()
        );
        config.push_str(&auth_yaml);
        let cfg_path = dir.path().join("config.yml");
        std::fs::write(&cfg_path, config).expect("config");
        let log = std::fs::File::create(dir.path().join("registry.log")).expect("log");
        let child = Command::new(registry_binary())
            .arg("serve")
            .arg(&cfg_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let reg = Registry { host: format!("{ip}:{port}"), child, storage, _dir: dir, creds, http: reqwest::Client::new() };
        for _ in 0..200 {
            if let Ok(r) = reg.http.get(format!("http://{}/v2/", reg.host)).send().await {
                if r.status().is_success() || r.status().as_u16() == 401 {
                    return reg;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("registry did not come up on {}", reg.host);
    }

    /// Freeze the registry process (SIGSTOP): connections are accepted by the kernel but never
    /// answered, a slow registry made from the real one.
    pub fn pause(&self) {
        let ok = Command::new("kill").args(["-STOP", &self.child.id().to_string()]).status().map(|s| s.success()).unwrap_or(false);
        assert!(ok, "could not pause the registry");
    }

    pub fn resume(&self) {
        let _ = Command::new("kill").args(["-CONT", &self.child.id().to_string()]).status();
    }

    pub fn stop(&mut self) {
        self.resume();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn auth(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.creds {
            Some((u, p)) => req.basic_auth(u, Some(p)),
            None => req,
        }
    }

    pub async fn push_blob(&self, repo: &str, bytes: &[u8]) -> Pushed {
        let digest = sha256(bytes);
        let start = self.auth(self.http.post(format!("http://{}/v2/{repo}/blobs/uploads/", self.host))).send().await.expect("start upload");
        assert_eq!(start.status().as_u16(), 202, "blob upload start: {:?}", start.text().await);
        let location = start.headers().get("location").and_then(|l| l.to_str().ok()).expect("location").to_string();
        let mut url = if location.starts_with("http") { location } else { format!("http://{}{location}", self.host) };
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(&format!("digest={digest}"));
        let put = self.auth(self.http.put(url)).header("content-type", "application/octet-stream").body(bytes.to_vec()).send().await.expect("put blob");
        assert_eq!(put.status().as_u16(), 201, "blob put: {:?}", put.text().await);
        Pushed { digest, size: bytes.len(), media_type: "application/octet-stream".into() }
    }

    pub async fn push_manifest(&self, repo: &str, reference: &str, media_type: &str, body: &[u8]) -> Pushed {
        let put = self
            .auth(self.http.put(format!("http://{}/v2/{repo}/manifests/{reference}", self.host)))
            .header("content-type", media_type)
            .body(body.to_vec())
            .send()
            .await
            .expect("put manifest");
        assert_eq!(put.status().as_u16(), 201, "manifest put {repo}:{reference}: {:?}", put.text().await);
        Pushed { digest: sha256(body), size: body.len(), media_type: media_type.into() }
    }

    /// Push a runnable single-platform image; its platform is only in the config blob.
    pub async fn push_image(&self, repo: &str, tag: &str, platform: &str, oci: bool) -> Pushed {
        let parts: Vec<&str> = platform.split('/').collect();
        let mut config = json!({"architecture": parts[1], "os": parts[0], "rootfs": {"type": "layers", "diff_ids": []}, "config": {}});
        if let Some(v) = parts.get(2) {
            config["variant"] = json!(v);
        }
        self.push_image_with_config(repo, tag, &serde_json::to_vec(&config).expect("json"), oci).await
    }

    pub async fn push_image_with_config(&self, repo: &str, tag: &str, config: &[u8], oci: bool) -> Pushed {
        let config_blob = self.push_blob(repo, config).await;
        let layer = self.push_blob(repo, format!("layer of {repo}:{tag} {}", hex::encode(Sha256::digest(config))).as_bytes()).await;
        let (mt, config_mt, layer_mt) = if oci {
            (OCI_MANIFEST, "application/vnd.oci.image.config.v1+json", "application/vnd.oci.image.layer.v1.tar+gzip")
        } else {
            (DOCKER_MANIFEST, "application/vnd.docker.container.image.v1+json", "application/vnd.docker.image.rootfs.diff.tar.gzip")
        };
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": mt,
            "config": {"mediaType": config_mt, "digest": config_blob.digest, "size": config_blob.size},
            "layers": [{"mediaType": layer_mt, "digest": layer.digest, "size": layer.size}]
        });
        self.push_manifest(repo, tag, mt, &serde_json::to_vec(&manifest).expect("json")).await
    }

    /// Push one image per platform, then an index (OCI) or manifest list (Docker) over them.
    /// `attestations` adds BuildKit-style attestation manifests (`unknown/unknown`).
    pub async fn push_index(&self, repo: &str, tag: &str, platforms: &[&str], oci: bool, attestations: bool) -> Pushed {
        let mut entries = Vec::new();
        for (i, p) in platforms.iter().enumerate() {
            let child = self.push_image(repo, &format!("{tag}-part{i}"), p, oci).await;
            let parts: Vec<&str> = p.split('/').collect();
            let mut platform = json!({"os": parts[0], "architecture": parts[1]});
            if let Some(v) = parts.get(2) {
                platform["variant"] = json!(v);
            }
            entries.push(json!({"mediaType": child.media_type, "digest": child.digest, "size": child.size, "platform": platform}));
            if attestations {
                let att = self.push_image_with_config(repo, &format!("{tag}-att{i}"), br#"{"architecture":"unknown","os":"unknown","rootfs":{"type":"layers","diff_ids":[]}}"#, true).await;
                entries.push(json!({
                    "mediaType": att.media_type, "digest": att.digest, "size": att.size,
                    "platform": {"os": "unknown", "architecture": "unknown"},
                    "annotations": {"vnd.docker.reference.type": "attestation-manifest", "vnd.docker.reference.digest": child.digest}
                }));
            }
        }
        let mt = if oci { OCI_INDEX } else { DOCKER_LIST };
        let index = json!({"schemaVersion": 2, "mediaType": mt, "manifests": entries});
        self.push_manifest(repo, tag, mt, &serde_json::to_vec(&index).expect("json")).await
    }

    /// Push an image made of `layers` (blobs as given: gzip when they start with gzip's magic,
    /// plain tar otherwise) with `config` as its config blob.
    pub async fn push_image_layers(&self, repo: &str, tag: &str, config: &Value, layers: &[Vec<u8>], oci: bool) -> Pushed {
        let config_blob = self.push_blob(repo, &serde_json::to_vec(config).expect("json")).await;
        let (mt, config_mt) = if oci { (OCI_MANIFEST, "application/vnd.oci.image.config.v1+json") } else { (DOCKER_MANIFEST, "application/vnd.docker.container.image.v1+json") };
        let mut descriptors = Vec::new();
        for layer in layers {
            let gz = layer.starts_with(&[0x1f, 0x8b]);
            let layer_mt = match (oci, gz) {
                (true, true) => "application/vnd.oci.image.layer.v1.tar+gzip",
                (true, false) => "application/vnd.oci.image.layer.v1.tar",
                (false, true) => "application/vnd.docker.image.rootfs.diff.tar.gzip",
                (false, false) => "application/vnd.docker.image.rootfs.diff.tar",
            };
            let blob = self.push_blob(repo, layer).await;
            descriptors.push(json!({"mediaType": layer_mt, "digest": blob.digest, "size": blob.size}));
        }
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": mt,
            "config": {"mediaType": config_mt, "digest": config_blob.digest, "size": config_blob.size},
            "layers": descriptors
        });
        self.push_manifest(repo, tag, mt, &serde_json::to_vec(&manifest).expect("json")).await
    }

    /// Push an OCI index over images already pushed, each listed under the platform given
    /// (`os/arch[/variant]`), whatever its config says.
    pub async fn push_index_over(&self, repo: &str, tag: &str, children: &[(&Pushed, &str)]) -> Pushed {
        let entries: Vec<Value> = children
            .iter()
            .map(|(child, p)| {
                let parts: Vec<&str> = p.split('/').collect();
                let mut platform = json!({"os": parts[0], "architecture": parts[1]});
                if let Some(v) = parts.get(2) {
                    platform["variant"] = json!(v);
                }
                json!({"mediaType": child.media_type, "digest": child.digest, "size": child.size, "platform": platform})
            })
            .collect();
        let index = json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries});
        self.push_manifest(repo, tag, OCI_INDEX, &serde_json::to_vec(&index).expect("json")).await
    }

    /// Where the registry keeps a blob's bytes (tests tamper with them there).
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        self.storage.join("docker/registry/v2/blobs/sha256").join(&hex[..2]).join(hex).join("data")
    }

    pub fn image(&self, repo_tag: &str) -> String {
        format!("{}/{repo_tag}", self.host)
    }
}

/// Dev certificates written by the real `archer certs` command.
pub fn make_certs(dir: &Path) -> PathBuf {
    let out = Command::new(env!("CARGO_BIN_EXE_archer"))
        .args(["certs", "--out"])
        .arg(dir)
        .args(["--dns", "localhost", "--ip", "127.0.0.1"])
        .output()
        .expect("archer certs");
    assert!(out.status.success(), "archer certs failed: {}", String::from_utf8_lossy(&out.stderr));
    dir.to_path_buf()
}

/// A running `archer serve`; killed on drop.
pub struct Archer {
    pub https: String,
    pub admin: String,
    pub certs: PathBuf,
    child: Child,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
    client: reqwest::Client,
}

impl Drop for Archer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Archer {
    /// Start `archer serve` standalone with `config_yaml` (may be empty) and extra flags.
    pub async fn start(config_yaml: &str, extra: &[&str]) -> Archer {
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = make_certs(&dir.path().join("certs"));
        Self::start_with_certs(dir, certs, config_yaml, extra).await
    }

    pub async fn start_with_certs(dir: tempfile::TempDir, certs: PathBuf, config_yaml: &str, extra: &[&str]) -> Archer {
        Self::spawn(dir, certs, config_yaml, extra).ready().await
    }

    /// Wait (up to 10 s) until `/readyz` answers 200.
    pub async fn ready(self) -> Archer {
        let archer = self;
        for _ in 0..400 {
            if let Ok(r) = reqwest::get(format!("{}/readyz", archer.admin)).await {
                if r.status().is_success() {
                    return archer;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("archer did not become ready; log:\n{}", archer.log_text());
    }

    /// Start `archer serve` (`extra` may name a kubeconfig) without waiting for it to be ready.
    pub fn spawn(dir: tempfile::TempDir, certs: PathBuf, config_yaml: &str, extra: &[&str]) -> Archer {
        // As deploy/base/deployment.yaml runs it: freed memory goes back to the OS at once.
        Self::spawn_binary(Path::new(env!("CARGO_BIN_EXE_archer")), dir, certs, config_yaml, extra, Some("0"))
    }

    /// Start `binary serve`, with `MIMALLOC_PURGE_DELAY` set to `purge_delay` or unset.
    pub fn spawn_binary(binary: &Path, dir: tempfile::TempDir, certs: PathBuf, config_yaml: &str, extra: &[&str], purge_delay: Option<&str>) -> Archer {
        let config = dir.path().join("config.yaml");
        std::fs::write(&config, config_yaml).expect("config");
        let log = dir.path().join("archer.log");
        let (hp, ap) = (free_port(), free_port());
        let mut command = Command::new(binary);
        match purge_delay {
            Some(v) => command.env("MIMALLOC_PURGE_DELAY", v),
            None => command.env_remove("MIMALLOC_PURGE_DELAY"),
        };
        let child = command
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .args(["--listen", &format!("127.0.0.1:{hp}"), "--admin-listen", &format!("127.0.0.1:{ap}")])
            .arg("--tls-cert")
            .arg(certs.join("tls.crt"))
            .arg("--tls-key")
            .arg(certs.join("tls.key"))
            .args(extra)
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("ARCHER_LOG", "info,archer=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start archer serve");
        let ca = std::fs::read(certs.join("ca.crt")).expect("ca");
        let client = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).expect("ca pem"))
            .build()
            .expect("client");
        Archer { https: format!("https://127.0.0.1:{hp}"), admin: format!("http://127.0.0.1:{ap}"), certs, child, log, _dir: dir, client }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory now and at its peak (VmRSS, VmHWM), in bytes.
    pub fn rss(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()).unwrap_or(0) * 1024
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// Send SIGTERM.
    pub fn terminate(&self) {
        let ok = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status().expect("kill");
        assert!(ok.success());
    }

    /// Wait up to `limit` for the process to exit; its exit status.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let until = std::time::Instant::now() + limit;
        while std::time::Instant::now() < until {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// POST a raw body to /mutate: (status, JSON body).
    pub async fn post_raw(&self, body: Vec<u8>) -> (u16, Value) {
        let r = self.client.post(format!("{}/mutate", self.https)).header("content-type", "application/json").body(body).send().await.expect("post");
        let status = r.status().as_u16();
        let text = r.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("response is not JSON ({e}): {text}")))
    }

    /// Send a pod CREATE review; returns the response and the pod with the patch applied.
    pub async fn admit(&self, pod: &Value) -> (Value, Value) {
        self.admit_review(review("CREATE", pod)).await
    }

    pub async fn admit_review(&self, review: Value) -> (Value, Value) {
        let uid = review["request"]["uid"].clone();
        let pod = review["request"]["object"].clone();
        let (status, body) = self.post_raw(serde_json::to_vec(&review).expect("json")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(body["kind"], "AdmissionReview");
        let response = body["response"].clone();
        assert_eq!(response["uid"], uid, "the uid must be echoed");
        let mut patched = pod;
        if let Some(p) = response["patch"].as_str() {
            assert_eq!(response["patchType"], "JSONPatch");
            let bytes = base64::engine::general_purpose::STANDARD.decode(p).expect("patch is base64");
            let patch: json_patch::Patch = serde_json::from_slice(&bytes).expect("patch is a JSON patch");
            json_patch::patch(&mut patched, &patch).expect("patch applies");
        }
        (response, patched)
    }

    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.admin)).await.expect("metrics").text().await.expect("text")
    }

    /// The value of one sample line (`name{labels}`), 0 when absent.
    pub async fn metric(&self, sample: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .find_map(|l| l.strip_prefix(sample).and_then(|rest| rest.trim().parse::<f64>().ok()))
            .unwrap_or(0.0)
    }
}

static UID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A real-shaped AdmissionReview for a pod.
pub fn review(operation: &str, pod: &Value) -> Value {
    let n = UID.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("7a3c2b1e-0000-4000-8000-{n:012}"),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"].clone(),
            "namespace": pod["metadata"]["namespace"].clone(),
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller", "uid": "1", "groups": ["system:serviceaccounts"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

/// A pod as the API server hands it to admission (defaults filled in).
pub fn pod(name: &str, images: &[&str]) -> Value {
    let containers: Vec<Value> = images
        .iter()
        .enumerate()
        .map(|(i, img)| json!({"name": format!("c{i}"), "image": img, "imagePullPolicy": "IfNotPresent", "resources": {}, "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "labels": {"app": name}},
        "spec": {
            "containers": containers,
            "restartPolicy": "Always",
            "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "securityContext": {},
            "terminationGracePeriodSeconds": 30,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ]
        },
        "status": {}
    })
}

pub fn required_terms(pod: &Value) -> Value {
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].clone()
}

pub fn arch_values(pod: &Value) -> Vec<Vec<String>> {
    required_terms(pod)
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|t| {
            t["matchExpressions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .filter(|e| e["key"] == "kubernetes.io/arch")
                .flat_map(|e| e["values"].as_array().cloned().unwrap_or_default())
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .collect()
}

/// A realistic Node object for an instance type of the embedded catalog.
pub fn node_json(name: &str, instance_type: &str, zone: &str, capacity_type: &str) -> Value {
    static CATALOG: std::sync::OnceLock<archer::catalog::Catalog> = std::sync::OnceLock::new();
    let catalog = CATALOG.get_or_init(|| archer::catalog::Catalog::embedded().expect("catalog"));
    let t = catalog.get(instance_type).unwrap_or_else(|| panic!("{instance_type} not in the catalog"));
    let mut taints = vec![];
    if t.arch == "arm64" {
        taints.push(json!({"key": "kubernetes.io/arch", "value": "arm64", "effect": "NoSchedule"}));
    }
    json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": format!("00000000-0000-4000-8000-{:012x}", name.len() * 7919 + name.bytes().map(u64::from).sum::<u64>() as usize),
            "resourceVersion": "12345",
            "creationTimestamp": "2026-11-22T10:00:00Z",
            "labels": {
                "kubernetes.io/arch": t.arch, "kubernetes.io/os": "linux", "kubernetes.io/hostname": name,
                "beta.kubernetes.io/arch": t.arch, "beta.kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": instance_type,
                "topology.kubernetes.io/region": "us-east-1", "topology.kubernetes.io/zone": zone,
                "karpenter.sh/capacity-type": capacity_type, "karpenter.sh/nodepool": "default",
                "karpenter.k8s.aws/instance-family": t.family, "karpenter.k8s.aws/instance-cpu": t.vcpu.to_string()
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"}
        },
        "spec": {"providerID": format!("aws:///{zone}/i-{name}"), "taints": taints},
        "status": {
            "capacity": {"cpu": t.vcpu.to_string(), "memory": format!("{}Mi", t.memory_mib), "pods": t.max_pods.to_string(), "ephemeral-storage": "20959212Ki"},
            "allocatable": {"cpu": t.allocatable_cpu, "memory": t.allocatable_memory, "pods": t.max_pods.to_string(), "ephemeral-storage": "18242267924"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": "2026-11-22T10:05:00Z", "lastTransitionTime": "2026-11-22T10:00:00Z", "reason": "KubeletHasSufficientMemory", "message": "kubelet has sufficient memory available"},
                {"type": "DiskPressure", "status": "False", "lastHeartbeatTime": "2026-11-22T10:05:00Z", "lastTransitionTime": "2026-11-22T10:00:00Z", "reason": "KubeletHasNoDiskPressure", "message": "kubelet has no disk pressure"},
                {"type": "PIDPressure", "status": "False", "lastHeartbeatTime": "2026-11-22T10:05:00Z", "lastTransitionTime": "2026-11-22T10:00:00Z", "reason": "KubeletHasSufficientPID", "message": "kubelet has sufficient PID available"},
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-22T10:05:00Z", "lastTransitionTime": "2026-11-22T10:00:30Z", "reason": "KubeletReady", "message": "kubelet is posting ready status"}
            ],
            "addresses": [{"type": "InternalIP", "address": "10.0.12.34"}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"machineID": "ec2abc", "systemUUID": "ec2abc", "bootID": "b1", "kernelVersion": "6.1.112-124.190.amzn2023", "osImage": "Amazon Linux 2023.6.20241010", "containerRuntimeVersion": "containerd://1.7.22", "kubeletVersion": "v1.34.4", "kubeProxyVersion": "v1.34.4", "operatingSystem": "linux", "architecture": t.arch},
            "images": [
                {"names": ["public.ecr.aws/eks/aws-load-balancer-controller@sha256:1a2b"], "sizeBytes": 67000000},
                {"names": ["registry.k8s.io/kube-proxy@sha256:3c4d"], "sizeBytes": 30000000}
            ]
        }
    })
}

/// ExtenderArgs with full Node objects (nodeCacheCapable: false).
pub fn extender_args_full(pod: &Value, nodes: &[Value]) -> Value {
    json!({"Pod": pod, "Nodes": {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": nodes}, "NodeNames": null})
}

/// ExtenderArgs with node names only (nodeCacheCapable: true).
pub fn extender_args_names(pod: &Value, names: &[&str]) -> Value {
    json!({"Pod": pod, "Nodes": null, "NodeNames": names})
}

pub fn with_requests(mut pod: Value, cpu: &str, memory: &str) -> Value {
    if let Some(cs) = pod["spec"]["containers"].as_array_mut() {
        for c in cs {
            c["resources"] = json!({"requests": {"cpu": cpu, "memory": memory}});
        }
    }
    pod
}

pub fn with_annotation(mut pod: Value, key: &str, value: &str) -> Value {
    pod["metadata"]["annotations"] = json!({key: value});
    pod
}

impl Archer {
    pub async fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self.client.post(format!("{}{path}", self.https)).json(body).send().await.expect("post");
        let status = r.status().as_u16();
        let text = r.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")))
    }
}

/// The extender with the default config and the embedded catalog, standalone (no cluster),
/// answering NodeNames calls from `nodes`, its calls drawing from `budget`.
pub fn extender(
    nodes: Option<kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Node>>,
    budget: archer::limits::MemoryBudget,
    metrics: std::sync::Arc<archer::metrics::Metrics>,
) -> std::sync::Arc<archer::extender::Extender> {
    use std::sync::Arc;
    let cfg = archer::config::Config::default();
    let client = archer::registry::RegistryClient::new(archer::cli::client_settings(&cfg, budget.clone()).expect("settings")).expect("client");
    Arc::new(archer::extender::Extender {
        catalog: Arc::new(archer::catalog::Catalog::embedded().expect("catalog")),
        inspector: archer::registry::Inspector::new(client, &archer::cli::cache_settings(&cfg), metrics.registry.clone()),
        cluster: None,
        picture: None,
        nodes,
        defaults: cfg.defaults.clone(),
        base_keyring: Default::default(),
        metrics: metrics.extender.clone(),
        inspection_timeout: Duration::from_secs(1),
        preference_bonus: cfg.extender.preference_bonus,
        body: archer::server::body::BodyLimits {
            max_bytes: cfg.extender.max_body_bytes,
            expansion: 3,
            read_timeout: Duration::from_secs(10),
            budget_wait: Duration::from_secs(2),
            budget,
            consumer: "extender_body",
        },
        max_price_per_hour: cfg.extender.max_price_per_hour,
        facts: Default::default(),
        held: Default::default(),
    })
}

/// The extender (standalone defaults, the embedded catalog) over real HTTPS in this process,
/// answering NodeNames calls from `nodes` (kube-runtime's reflector Store type). Returns the
/// port, a client trusting its CA, and the guard that keeps the certificates alive.
pub async fn serve_extender_in_process(nodes: kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Node>) -> (u16, reqwest::Client, tempfile::TempDir) {
    let (port, http, dir, _) = serve_extender_with_metrics(nodes).await;
    (port, http, dir)
}

/// As [`serve_extender_in_process`], also returning the server's metrics.
pub async fn serve_extender_with_metrics(
    nodes: kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Node>,
) -> (u16, reqwest::Client, tempfile::TempDir, std::sync::Arc<archer::metrics::Metrics>) {
    use std::sync::Arc;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let metrics = Arc::new(archer::metrics::Metrics::new());
    let server_metrics = metrics.clone();
    let cfg = archer::config::Config::default();
    let ext = extender(Some(nodes), cfg.memory_budget(), metrics);
    let dir = tempfile::tempdir().expect("tmp");
    let certs = make_certs(dir.path());
    let tls = archer::server::tls::CertStore::load(&certs.join("tls.crt"), &certs.join("tls.key")).expect("certs");
    let (listener, addr) = archer::server::bind("127.0.0.1:0").await.expect("bind");
    let (stop, shutdown) = archer::server::shutdown_channel();
    // The server lives as long as the test process; the trigger is leaked on purpose.
    std::mem::forget(stop);
    let limits = archer::cli::connection_limits(&cfg, server_metrics.server.clone());
    tokio::spawn(archer::server::serve_https(listener, tls.server_config(), archer::extender::router(ext), shutdown, limits));
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(certs.join("ca.crt")).expect("ca")).expect("pem"))
        .build()
        .expect("client");
    (addr.port(), http, dir, server_metrics)
}
