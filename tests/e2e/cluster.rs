//! A real control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler (with Archer as its extender), kwok (playing the kubelets), Archer itself, and
//! the local registry. Binaries come from `tests/e2e/build-components` (ARCHER_E2E_BIN).
//! Everything is stopped on drop; logs stay in ARCHER_E2E_LOGS (default target/e2e-logs/<test>).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use kube::Client;
use serde_json::json;

use crate::common::{free_port, make_certs, Registry};
use crate::node::{Pki, RealNode, NODE_IP};

pub const TOKEN: &str = "archer-e2e-admin-token";
/// Who Archer is on the control plane: its service account as the Helm chart makes it (release
/// `archer` in `archer-system`), with that account's permissions and nothing more.
pub const ARCHER_USER: &str = "system:serviceaccount:archer-system:archer";
/// The chart's uninstall hook's service account (`archer ungate --all`).
pub const UNGATE_USER: &str = "system:serviceaccount:archer-system:archer-ungate";

/// Who provisions on the control plane, and whether Archer's webhook and extender run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Archer alone: its provisioner (kwok provider), webhook and extender, its CRDs.
    Archer,
    /// Karpenter's own kwok controller alone (started by [`crate::karpenter`]); kube-scheduler
    /// with no extender.
    Karpenter,
    /// Karpenter provisions; Archer's webhook and extender run beside it with Archer's
    /// provisioner off and none of Archer's CRDs installed (the supported installation).
    KarpenterWithArcher,
}

impl Mode {
    /// The name the comparison reports it under.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Archer => "archer",
            Mode::Karpenter => "karpenter",
            Mode::KarpenterWithArcher => "karpenter+archer",
        }
    }

    fn runs_archer(self) -> bool {
        self != Mode::Karpenter
    }

    /// The node selector kwok manages: Archer's kwok provider labels its nodes `type=kwok`;
    /// Karpenter's labels them `kwok.x-k8s.io/node=fake`.
    fn kwok_selector(self) -> &'static str {
        match self {
            Mode::Archer => "type=kwok",
            Mode::Karpenter | Mode::KarpenterWithArcher => "kwok.x-k8s.io/node=fake",
        }
    }
}

/// How a control plane starts (see [`Cluster::start_real`]).
struct Options {
    archer_process: bool,
    real_node: bool,
    /// API Priority and Fairness on (off elsewhere): the comparison counts each controller's
    /// writes under a FlowSchema of its own.
    flow_control: bool,
}

pub(crate) struct Proc {
    /// Which component (for reports).
    pub name: &'static str,
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Cluster {
    pub logs: PathBuf,
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    /// The API server URL (for reports and raw calls).
    pub apiserver: String,
    pub registry: Registry,
    pub archer_port: u16,
    pub archer_admin: u16,
    pub certs: PathBuf,
    pub bin: PathBuf,
    /// Registries reached over plain HTTP (`--insecure-registry`).
    pub insecure: Vec<String>,
    /// Lines of Archer's `registry:` section (indented under it).
    pub registry_config: Vec<String>,
    /// Extra environment for the next `archer serve` (fault hooks).
    pub archer_env: Vec<(String, String)>,
    /// Lines added to the `provisioner:` section of Archer's config (two-space indented).
    pub provisioner_config: Vec<String>,
    /// The next `archer serve`'s cloud provider (`kwok` unless a scenario says otherwise).
    pub cloud_provider: &'static str,
    /// The provider whose permissions Archer's service account holds now (see `archer_identity`).
    identity_for: Option<&'static str>,
    archer_restarts: usize,
    archer: Option<Proc>,
    /// The real node (kubelet, containerd, kube-proxy), when started with [`Options::real_node`];
    /// stopped before the control plane.
    pub real_node: Option<RealNode>,
    /// The control plane's CA and certificates, with a real node.
    pub pki: Option<Pki>,
    // dropped in reverse order of start: scheduler, kwok, controller-manager, apiserver, etcd
    procs: Vec<Proc>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.archer.take();
        self.real_node.take();
        let mut stopped = Vec::new();
        while let Some(p) = self.procs.pop() {
            stopped.push(p.name);
            drop(p);
        }
        eprintln!("e2e: stopped {} (API server was {}); component logs: {}", stopped.join(", "), self.apiserver, self.logs.display());
    }
}

fn bin_dir() -> PathBuf {
    let dir = std::env::var_os("ARCHER_E2E_BIN").map(PathBuf::from).expect("ARCHER_E2E_BIN: run tests/e2e/run (it builds the components)");
    for b in ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"] {
        assert!(dir.join(b).exists(), "{b} missing in {}", dir.display());
    }
    dir
}

pub(crate) fn spawn(name: &'static str, logs: &Path, mut cmd: Command) -> Proc {
    let log = std::fs::File::create(logs.join(format!("{name}.log"))).expect("log file");
    let err = log.try_clone().expect("log clone");
    let child = cmd.stdout(Stdio::from(log)).stderr(Stdio::from(err)).spawn().unwrap_or_else(|e| panic!("start {name}: {e}"));
    Proc { name, child }
}

async fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("timed out waiting for {what}");
}

fn tcp_open(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

impl Cluster {
    pub async fn start(test: &str) -> Cluster {
        Self::start_with(test, &[]).await
    }

    /// Start with extra registries Archer reaches over plain HTTP (e.g. a private one).
    pub async fn start_with(test: &str, extra_insecure: &[&str]) -> Cluster {
        Self::start_mode(test, extra_insecure, Mode::Archer, Vec::new()).await
    }

    /// Start the control plane for `mode` (Karpenter itself is started by the caller, after its
    /// CRDs: [`crate::karpenter::start`]), Archer's config with `provisioner_config` lines
    /// (replacing the e2e clocks of the same keys).
    pub async fn start_mode(test: &str, extra_insecure: &[&str], mode: Mode, provisioner_config: Vec<String>) -> Cluster {
        Self::start_opts(test, extra_insecure, mode, provisioner_config, Options { archer_process: mode.runs_archer(), real_node: false, flow_control: false }).await
    }

    /// [`Cluster::start_mode`] with API Priority and Fairness on, so
    /// `apiserver_flowcontrol_dispatched_requests_total{flow_schema}` counts requests by the
    /// FlowSchemas a test adds (the comparison's writes per controller).
    pub async fn start_mode_with_flow_control(test: &str, mode: Mode, provisioner_config: Vec<String>) -> Cluster {
        Self::start_opts(test, &[], mode, provisioner_config, Options { archer_process: mode.runs_archer(), real_node: false, flow_control: true }).await
    }

    /// A control plane with a real node (node.rs) beside the kwok nodes: the API server listens
    /// on the node's address too, with a certificate pods verify, the Node authorizer and
    /// NodeRestriction; the registry listens on the node's address. `archer_process`: Archer runs
    /// as a process beside the control plane (the webhook registered by URL, the scheduler's
    /// extender), else not at all (the installed_* scenarios install it with its chart).
    pub async fn start_real(test: &str, archer_process: bool) -> Cluster {
        Self::start_opts(test, &[], Mode::Archer, Vec::new(), Options { archer_process, real_node: true, flow_control: false }).await
    }

    async fn start_opts(test: &str, extra_insecure: &[&str], mode: Mode, provisioner_config: Vec<String>, opts: Options) -> Cluster {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let bin = bin_dir();
        let root = std::env::var_os("ARCHER_E2E_LOGS").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/e2e-logs"));
        let logs = root.join(test);
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs).expect("logs dir");
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();

        // Service-account signing key (ECDSA), static admin token.
        let sa = rcgen::KeyPair::generate().expect("sa key");
        std::fs::write(d.join("sa.key"), sa.serialize_pem()).expect("sa.key");
        std::fs::write(d.join("sa.pub"), sa.public_key_pem()).expect("sa.pub");
        std::fs::write(d.join("tokens.csv"), format!("{TOKEN},admin,admin-uid,system:masters\n")).expect("tokens");

        let (etcd_port, peer_port, api_port) = (free_port(), free_port(), free_port());
        let mut procs = Vec::new();
        let mut etcd = Command::new(bin.join("etcd"));
        etcd.args([
            "--data-dir",
            &d.join("etcd").display().to_string(),
            "--listen-client-urls",
            &format!("http://127.0.0.1:{etcd_port}"),
            "--advertise-client-urls",
            &format!("http://127.0.0.1:{etcd_port}"),
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
            "--initial-cluster",
            &format!("default=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync",
            "--quota-backend-bytes",
            "1073741824",
        ]);
        procs.push(spawn("etcd", &logs, etcd));
        wait_for("etcd", Duration::from_secs(30), || tcp_open(etcd_port)).await;

        if opts.real_node {
            // The node's address, where the API server and the registry listen too.
            crate::node::host_network();
        }
        let pki = opts.real_node.then(|| Pki::make(&d.join("pki")));
        let mut api = Command::new(bin.join("kube-apiserver"));
        if let Some(pki) = &pki {
            let (crt, key) = pki.cert("apiserver");
            let (kc, kk) = pki.cert("apiserver-kubelet-client");
            api.args([
                "--bind-address=0.0.0.0".to_string(),
                format!("--advertise-address={NODE_IP}"),
                format!("--tls-cert-file={}", crt.display()),
                format!("--tls-private-key-file={}", key.display()),
                format!("--client-ca-file={}", pki.ca().display()),
                "--authorization-mode=Node,RBAC".to_string(),
                "--enable-admission-plugins=NodeRestriction".to_string(),
                format!("--kubelet-client-certificate={}", kc.display()),
                format!("--kubelet-client-key={}", kk.display()),
                "--kubelet-preferred-address-types=InternalIP".to_string(),
            ]);
        } else {
            api.args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--authorization-mode=RBAC"]);
        }
        api.args([
            &format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            &format!("--secure-port={api_port}"),
            &format!("--cert-dir={}", d.join("apiserver").display()),
            &format!("--token-auth-file={}", d.join("tokens.csv").display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            &format!("--service-account-key-file={}", d.join("sa.pub").display()),
            &format!("--service-account-signing-key-file={}", d.join("sa.key").display()),
            &format!("--service-cluster-ip-range={}", crate::node::SERVICE_CIDR),
            "--allow-privileged=true",
            &format!("--enable-priority-and-fairness={}", opts.flow_control),
            "--watch-cache=true",
        ]);
        procs.push(spawn("kube-apiserver", &logs, api));
        let kubeconfig = d.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: https://127.0.0.1:{api_port}\n    insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: {TOKEN}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: admin}}\ncurrent-context: e2e\n"
            ),
        )
        .expect("kubeconfig");
        let apiserver = format!("https://127.0.0.1:{api_port}");
        let http = reqwest::Client::builder().danger_accept_invalid_certs(true).build().expect("client");
        let start = Instant::now();
        loop {
            let ready = http.get(format!("{apiserver}/readyz")).bearer_auth(TOKEN).send().await.map(|r| r.status().is_success()).unwrap_or(false);
            if ready {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(90), "kube-apiserver did not become ready; see {}", logs.display());
            tokio::time::sleep(Duration::from_millis(300)).await;
        }

        let mut kcm = Command::new(bin.join("kube-controller-manager"));
        kcm.args([
            &format!("--kubeconfig={}", kubeconfig.display()),
            &format!("--service-account-private-key-file={}", d.join("sa.key").display()),
            "--use-service-account-credentials=false",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            &format!("--secure-port={}", free_port()),
            "--controllers=*,-nodeipam,-cloud-node-lifecycle,-route,-service-lb-controller,-persistentvolume-binder,-attachdetach",
            "--concurrent-deployment-syncs=10",
            "--concurrent-replicaset-syncs=10",
            // Production control planes raise the client rate limit (20/s by default, which
            // alone takes ~15 s to create 300 pods); what the scale scenario measures is Archer.
            "--kube-api-qps=200",
            "--kube-api-burst=400",
        ]);
        if let Some(pki) = &pki {
            // kube-root-ca.crt: what pods verify the API server with.
            kcm.arg(format!("--root-ca-file={}", pki.ca().display()));
        }
        procs.push(spawn("kube-controller-manager", &logs, kcm));

        let mut kwok = Command::new(bin.join("kwok"));
        kwok.args([
            &format!("--kubeconfig={}", kubeconfig.display()),
            &format!("--manage-nodes-with-label-selector={}", mode.kwok_selector()),
            "--node-lease-duration-seconds=40",
            "--cidr=10.244.0.1/16",
            "--node-ip=10.0.0.10",
            &format!("--node-port={}", free_port()),
            &format!("--server-address=127.0.0.1:{}", free_port()),
        ]);
        kwok.env("HOME", d);
        procs.push(spawn("kwok", &logs, kwok));

        let registry = if opts.real_node { Registry::start_on(NODE_IP).await } else { Registry::start().await };
        let certs = make_certs(&d.join("archer-certs"));
        let (archer_port, archer_admin) = (free_port(), free_port());
        let insecure: Vec<String> = std::iter::once(registry.host.clone()).chain(extra_insecure.iter().map(|s| s.to_string())).collect();
        let cloud_provider = if mode == Mode::Archer { "kwok" } else { "none" };
        let mut cluster = Cluster { logs, kubeconfig, apiserver, registry, archer_port, archer_admin, certs, bin, archer: None, procs, dir, insecure, archer_env: Vec::new(), registry_config: Vec::new(), provisioner_config, cloud_provider, identity_for: None, archer_restarts: 0, real_node: None, pki };
        if let Some(pki) = &cluster.pki {
            let pause = crate::node::push_tiny_images(&cluster.registry, &cluster.dir.path().join("tiny")).await;
            let node = RealNode::start(&cluster, pki, api_port, &pause).await;
            cluster.real_node = Some(node);
        }
        if mode == Mode::Archer && opts.archer_process {
            cluster.install_crds().await;
        }
        if opts.archer_process {
            cluster.archer_namespace().await;
            cluster.start_archer().await;
        }
        cluster.start_scheduler(opts.archer_process).await;
        cluster
    }

    pub async fn client(&self) -> Client {
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("config");
        Client::try_from(cfg).expect("client")
    }

    /// A client acting as `user` (the admin impersonates it): that user's permissions, and the
    /// name admission sees. A service account's name (`system:serviceaccount:<ns>:<name>`) gets
    /// its groups too, as with its own token.
    pub async fn client_as(&self, user: &str) -> Client {
        let kc = kube::config::Kubeconfig::read_from(self.kubeconfig_as(user)).expect("kubeconfig");
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("config");
        Client::try_from(cfg).expect("client")
    }

    /// A kubeconfig acting as `user` (for a process: `archer serve`, `archer ungate`).
    pub fn kubeconfig_as(&self, user: &str) -> PathBuf {
        let text = std::fs::read_to_string(&self.kubeconfig).expect("kubeconfig");
        let path = self.dir.path().join(format!("kubeconfig-{}", user.replace(':', "-")));
        let with_user = text.replace(&format!("    token: {TOKEN}\n"), &format!("    token: {TOKEN}\n    as: {user}\n"));
        assert_ne!(with_user, text, "the admin kubeconfig has its token line");
        std::fs::write(&path, with_user).expect("kubeconfig");
        path
    }

    /// Archer's identity as the Helm chart installs it, for the current cloud provider: its
    /// service account and the uninstall hook's, their RBAC, the safety net's record and the gate
    /// policy (release `archer` in `archer-system`), so Archer runs with the permissions the
    /// chart gives it and its gate is one only it removes. Applied again when the provider changes.
    async fn archer_identity(&mut self) {
        if self.identity_for == Some(self.cloud_provider) {
            return;
        }
        let mut flags = vec![format!("provisioner.cloudProvider={}", self.cloud_provider)];
        if self.cloud_provider == "aws" {
            flags.push("provisioner.aws.clusterName=e2e".into());
        }
        let flags = flags.join(",");
        let kinds = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"];
        let objects: Vec<serde_json::Value> = crate::helm::render("archer-system", &["--set", &flags])
            .into_iter()
            .filter(|o| kinds.contains(&o["kind"].as_str().unwrap_or("")) || (o["kind"] == "ConfigMap" && o["metadata"]["name"] == "archer-safety-net"))
            .collect();
        assert!(objects.iter().any(|o| o["kind"] == "ValidatingAdmissionPolicy"), "the chart renders the gate policy");
        let client = self.client().await;
        crate::helm::apply(&client, &objects).await;
        // RBAC takes effect within moments; Archer must not start before (its Lease would be refused).
        let archer = self.client_as(ARCHER_USER).await;
        let start = Instant::now();
        loop {
            let record = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(archer.clone(), "archer-system").get("archer-safety-net").await;
            let nodes = kube::Api::<k8s_openapi::api::core::v1::Node>::all(archer.clone()).list(&kube::api::ListParams::default().limit(1)).await;
            if record.is_ok() && nodes.is_ok() {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "Archer's permissions not in effect: {record:?} {nodes:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.identity_for = Some(self.cloud_provider);
    }

    /// Archer's CRDs (NodePool, NodeClaim, EC2NodeClass, AKSNodeClass) and Karpenter's NodeOverlay
    /// from deploy/crds, Established.
    async fn install_crds(&self) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/crds");
        self.install_crd_files(&["nodepool.yaml", "nodeclaim.yaml", "ec2nodeclass.yaml", "aksnodeclass.yaml", "nodeoverlay.yaml"].map(|f| dir.join(f))).await;
    }

    /// Archer's namespace (its provisioner Lease lives there; the webhook leaves it alone).
    async fn archer_namespace(&self) {
        let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({"metadata": {"name": "archer-system"}})).expect("ns");
        kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(self.client().await).create(&Default::default(), &ns).await.expect("archer-system namespace");
    }

    /// Apply CRDs (YAML files) and wait for each to be Established.
    pub async fn install_crd_files(&self, files: &[PathBuf]) {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(self.client().await);
        for file in files {
            let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let crd: CustomResourceDefinition = archer::yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let name = crd.metadata.name.clone().expect("crd name");
            crds.create(&Default::default(), &crd).await.unwrap_or_else(|e| panic!("the API server refuses {}: {e}", file.display()));
            let start = Instant::now();
            loop {
                let established = crds.get(&name).await.ok().and_then(|c| c.status).and_then(|s| s.conditions).is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"));
                if established {
                    break;
                }
                assert!(start.elapsed() < Duration::from_secs(60), "CRD {name} not Established");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// Keep a process (Karpenter) running with the control plane, its log beside the others'.
    pub fn spawn_component(&mut self, name: &'static str, cmd: Command) -> u32 {
        let p = spawn(name, &self.logs, cmd);
        let pid = p.child.id();
        self.procs.push(p);
        pid
    }

    /// The Archer process's id (to read its memory and CPU time from /proc).
    pub fn archer_pid(&self) -> Option<u32> {
        self.archer.as_ref().map(|p| p.child.id())
    }

    /// Has the Archer process exited (and with what code)?
    pub fn archer_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.archer.as_mut().and_then(|p| p.child.try_wait().ok().flatten())
    }

    /// `archer serve` with the kwok provider and short batching/disruption clocks, on these ports.
    fn archer_command(&self, port: u16, admin: u16, pod_name: &str) -> Command {
        let config = self.dir.path().join("archer.yaml");
        // The e2e clocks, each replaced by a `provisioner_config` line for the same key.
        let defaults = ["batchIdleSeconds: 1", "batchMaxSeconds: 3", "disruptionIntervalSeconds: 2", "drainTimeoutSeconds: 120", "disruptionGraceSeconds: 5", "consolidationValidationSeconds: 2", "leaseDurationSeconds: 4"];
        let key = |l: &str| l.split(':').next().unwrap_or("").trim().to_string();
        let given: std::collections::BTreeSet<String> = self.provisioner_config.iter().map(|l| key(l)).collect();
        let lines: String = defaults.iter().map(|d| d.to_string()).filter(|d| !given.contains(&key(d))).chain(self.provisioner_config.iter().cloned()).map(|l| format!("  {l}\n")).collect();
        // The safety net's e2e clocks: a short gate bound and lease, an inspection per second.
        let safety = "safetyNet:\n  leaseDurationSeconds: 4\n  gateMaxSeconds: 20\n  gateInspectionTimeoutSeconds: 3\n  gateRetrySeconds: 1\n";
        // The savings reporter's (provisioner off): a short lease, a computation every 2 seconds.
        let safety = format!("{safety}savings:\n  leaseDurationSeconds: 4\n  intervalSeconds: 2\n");
        let registry: String = if self.registry_config.is_empty() { String::new() } else { std::iter::once("registry:\n".to_string()).chain(self.registry_config.iter().map(|l| format!("  {l}\n"))).collect() };
        std::fs::write(&config, format!("{safety}{registry}provisioner:\n  cloudProvider: {}\n{lines}", self.cloud_provider)).expect("archer config");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_archer"));
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .args(["--namespace", "archer-system"])
            .envs(self.archer_env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--admin-listen", &format!("127.0.0.1:{admin}")])
            .arg("--tls-cert")
            .arg(self.certs.join("tls.crt"))
            .arg("--tls-key")
            .arg(self.certs.join("tls.key"))
            .arg("--kubeconfig")
            .arg(self.kubeconfig_as(ARCHER_USER))
            .args(["--insecure-registry", &self.insecure.join(",")])
            .env("POD_NAME", pod_name)
            // ARCHER_E2E_LOG widens it for one run (e.g. `,aws_smithy_runtime=debug`).
            .env("ARCHER_LOG", std::env::var("ARCHER_E2E_LOG").unwrap_or_else(|_| "info,archer=debug".into()));
        cmd
    }

    async fn wait_ready(&self, admin: u16) {
        let start = Instant::now();
        let mut last = String::from("no answer");
        loop {
            if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{admin}/readyz")).await {
                if r.status().is_success() {
                    break;
                }
                last = r.text().await.unwrap_or_default();
            }
            assert!(start.elapsed() < Duration::from_secs(60), "archer did not become ready ({last}); see {}", self.logs.display());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Start (or restart) the main `archer serve`, as its service account.
    pub async fn start_archer(&mut self) {
        self.archer_identity().await;
        let log_name: &'static str = if self.archer_restarts == 0 { "archer" } else { "archer-restarted" };
        self.archer_restarts += 1;
        let cmd = self.archer_command(self.archer_port, self.archer_admin, log_name);
        self.archer = Some(spawn(log_name, &self.logs, cmd));
        self.wait_ready(self.archer_admin).await;
    }

    /// A second replica (its own ports, the same cluster and Lease); returns it and its admin port.
    pub async fn start_replica(&self, name: &'static str) -> (Proc, u16) {
        let (port, admin) = (free_port(), free_port());
        let proc = spawn(name, &self.logs, self.archer_command(port, admin, name));
        self.wait_ready(admin).await;
        (proc, admin)
    }

    /// One sample of Archer's metrics (0 when absent).
    pub async fn archer_metric(&self, sample: &str) -> f64 {
        metric_at(self.archer_admin, sample).await
    }

    pub fn stop_archer(&mut self) {
        self.archer.take();
    }

    async fn start_scheduler(&mut self, extender: bool) {
        let port = self.archer_port;
        let mut cfg = format!(
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: {}\nleaderElection:\n  leaderElect: false\nprofiles:\n- schedulerName: default-scheduler\n",
            self.kubeconfig.display()
        );
        if extender {
            cfg.push_str(&format!(
                "extenders:\n- urlPrefix: https://127.0.0.1:{port}/scheduler\n  filterVerb: filter\n  prioritizeVerb: prioritize\n  weight: 3\n  enableHTTPS: true\n  tlsConfig:\n    caFile: {}\n  httpTimeout: 5s\n  nodeCacheCapable: true\n  ignorable: true\n",
                self.certs.join("ca.crt").display()
            ));
        }
        let path = self.dir.path().join("scheduler.yaml");
        std::fs::write(&path, cfg).expect("scheduler config");
        let mut cmd = Command::new(self.bin.join("kube-scheduler"));
        cmd.args([&format!("--config={}", path.display()), "--bind-address=127.0.0.1", &format!("--secure-port={}", free_port()), "--v=2"]);
        self.procs.push(spawn("kube-scheduler", &self.logs, cmd));
    }

    /// Register Archer's webhook with the API server (URL form, caBundle for 127.0.0.1).
    pub async fn register_webhook(&self, port: u16) {
        let ca = std::fs::read(self.certs.join("ca.crt")).expect("ca");
        let bundle = base64::engine::general_purpose::STANDARD.encode(ca);
        let mwc: k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration = serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "archer"},
            "webhooks": [{
                "name": "pods.archer.dev",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Ignore",
                "timeoutSeconds": 5,
                "reinvocationPolicy": "IfNeeded",
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/mutate"), "caBundle": bundle},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "archer-system"]},
                    {"key": "archer.dev/ignore", "operator": "NotIn", "values": ["true"]}
                ]}
            }]
        }))
        .expect("mwc");
        let api: kube::Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> = kube::Api::all(self.client().await);
        let _ = api.delete("archer", &Default::default()).await;
        api.create(&Default::default(), &mwc).await.expect("create webhook configuration");
    }
}

/// One sample of the metrics on an admin port (0 when absent or unreachable).
pub async fn metric_at(admin: u16, sample: &str) -> f64 {
    let Ok(r) = reqwest::get(format!("http://127.0.0.1:{admin}/metrics")).await else { return 0.0 };
    let text = r.text().await.unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix(sample).and_then(|r| r.trim().parse().ok())).unwrap_or(0.0)
}
