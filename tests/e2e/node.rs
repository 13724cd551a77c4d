//! A real node beside the kwok nodes: kubelet and kube-proxy built from the control plane's own
//! Kubernetes module (tests/e2e/build-components), containerd, runc and the CNI plugins from
//! Debian (installed by .ci/run), joined with its own client certificate (the Node authorizer and
//! NodeRestriction admit it as `system:node:archer-real-node` and nothing more).
//!
//! The node's address is 10.200.0.1 on the loopback interface, where the API server and
//! the test registry listen too, so pods reach both (through the `kubernetes` Service and
//! kube-proxy's rules, or directly). Pods get addresses from a bridge (10.88.0.0/16).
//!
//! What the real node cannot show: arm64 hardware (it is this machine, amd64; arm64 stays on kwok
//! nodes), a cloud's network (no VPC CNI, no load balancers), DNS (no CoreDNS), several real nodes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use crate::cluster::{spawn, Proc};
use crate::common::{free_port, Registry};

pub const NODE_IP: &str = "10.200.0.1";
pub const NODE_NAME: &str = "archer-real-node";
pub const POD_CIDR: &str = "10.88.0.0/16";
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The `kubernetes` Service's address (the range's first), in the API server's certificate.
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
const INTERFACE: &str = "lo";
const CNI_BIN: &str = "/usr/lib/cni";
const BRIDGE: &str = "archer-cni0";

/// Can this machine run a real node (root, containerd, runc, the CNI plugins, iptables)?
/// The scenarios fail with this reason rather than skip: .ci/run installs them.
pub fn missing() -> Option<String> {
    let mut missing = Vec::new();
    for (what, path) in [("containerd", "/usr/bin/containerd"), ("runc", "/usr/sbin/runc"), ("ctr", "/usr/bin/ctr"), ("CNI plugins", "/usr/lib/cni/bridge"), ("iptables", "/usr/sbin/iptables")] {
        if !Path::new(path).exists() {
            missing.push(what);
        }
    }
    let root = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false);
    if !root {
        missing.push("root");
    }
    (!missing.is_empty()).then(|| format!("the real node needs {} (apt-get install containerd runc containernetworking-plugins iptables conntrack; .ci/run installs them)", missing.join(", ")))
}

fn sh(args: &[&str]) -> bool {
    Command::new(args[0]).args(&args[1..]).output().map(|o| o.status.success()).unwrap_or(false)
}

/// The node's own address on the loopback interface (this kernel has no dummy interfaces; a
/// local address is reached from the pods' bridge all the same), forwarding on, bridged traffic
/// seen by iptables (kube-proxy's rules must apply to pod-to-Service traffic on the bridge).
/// Idempotent.
pub fn host_network() {
    let has = Command::new("ip").args(["-4", "addr", "show", "dev", INTERFACE]).output().map(|o| String::from_utf8_lossy(&o.stdout).contains(&format!("{NODE_IP}/32"))).unwrap_or(false);
    if !has {
        assert!(sh(&["ip", "addr", "add", &format!("{NODE_IP}/32"), "dev", INTERFACE]), "ip addr add {NODE_IP}/32 dev {INTERFACE}");
    }
    let _ = std::fs::write("/proc/sys/net/ipv4/ip_forward", "1");
    let _ = sh(&["modprobe", "br_netfilter"]);
    let _ = std::fs::write("/proc/sys/net/bridge/bridge-nf-call-iptables", "1");
}

/// Certificates for the control plane and the node, from one CA the API server trusts for
/// clients and pods trust for the API server (kube-root-ca.crt).
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    pub fn cert(&self, name: &str) -> (PathBuf, PathBuf) {
        (self.dir.join(format!("{name}.crt")), self.dir.join(format!("{name}.key")))
    }

    pub fn make(dir: &Path) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        std::fs::create_dir_all(dir).expect("pki dir");
        let ca_key = KeyPair::generate().expect("ca key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca.distinguished_name.push(DnType::CommonName, "archer-e2e-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).expect("ca");
        std::fs::write(dir.join("ca.crt"), ca_cert.pem()).expect("ca.crt");
        let issue = |name: &str, cn: &str, org: Option<&str>, sans: Vec<String>| {
            let key = KeyPair::generate().expect("key");
            let mut p = CertificateParams::new(sans).expect("params");
            p.distinguished_name.push(DnType::CommonName, cn);
            if let Some(o) = org {
                p.distinguished_name.push(DnType::OrganizationName, o);
            }
            let cert = p.signed_by(&key, &ca_cert, &ca_key).expect("sign");
            std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).expect("crt");
            std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).expect("key");
        };
        let sans = ["127.0.0.1", NODE_IP, KUBERNETES_SERVICE_IP, "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"];
        issue("apiserver", "kube-apiserver", None, sans.iter().map(|s| s.to_string()).collect());
        issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", Some("system:masters"), Vec::new());
        issue("kubelet", &format!("system:node:{NODE_NAME}"), Some("system:nodes"), Vec::new());
        issue("kube-proxy", "system:kube-proxy", None, Vec::new());
        Pki { dir: dir.to_path_buf() }
    }

    /// A kubeconfig for a client certificate of this PKI.
    pub fn kubeconfig(&self, name: &str, server: &str) -> PathBuf {
        let (crt, key) = self.cert(name);
        let path = self.dir.join(format!("{name}.kubeconfig"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: {name}\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: {name}}}\ncurrent-context: e2e\n",
                self.ca().display(),
                crt.display(),
                key.display()
            ),
        )
        .expect("kubeconfig");
        path
    }
}

/// Debian's runc, or, where this machine lacks CAP_SYS_RESOURCE, the wrapper that clamps the
/// negative OOM scores kubelet asks for (tests/e2e/runc-without-oom-score says why).
fn runc() -> PathBuf {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok()).unwrap_or(0);
    const CAP_SYS_RESOURCE: u64 = 1 << 24;
    if effective & CAP_SYS_RESOURCE != 0 {
        PathBuf::from("/usr/sbin/runc")
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/runc-without-oom-score")
    }
}

/// The real node's processes, stopped on drop (containers first, so none outlives the test).
pub struct RealNode {
    dir: PathBuf,
    socket: PathBuf,
    procs: Vec<Proc>,
    kube_proxy: PathBuf,
}

impl Drop for RealNode {
    fn drop(&mut self) {
        // kubelet first (it would restart what is killed), then every container, then the rest.
        let kubelet = self.procs.iter().position(|p| p.name == "kubelet");
        if let Some(i) = kubelet {
            drop(self.procs.remove(i));
        }
        let sock = self.socket.display().to_string();
        let ctr = |args: &[&str]| Command::new("ctr").args(["-a", &sock, "-n", "k8s.io"]).args(args).output().ok();
        if let Some(out) = ctr(&["tasks", "ls", "-q"]) {
            for id in String::from_utf8_lossy(&out.stdout).lines().map(str::trim).filter(|l| !l.is_empty()) {
                ctr(&["tasks", "kill", "-a", "-s", "SIGKILL", id]);
            }
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                // Killed tasks stay listed (STOPPED) until removed.
                let left = ctr(&["tasks", "ls"]).map(|o| String::from_utf8_lossy(&o.stdout).contains("RUNNING")).unwrap_or(false);
                if !left {
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            for id in String::from_utf8_lossy(&out.stdout).lines().map(str::trim).filter(|l| !l.is_empty()) {
                ctr(&["tasks", "rm", "-f", id]);
            }
        }
        while let Some(p) = self.procs.pop() {
            drop(p);
        }
        // kube-proxy's rules would outlive it.
        let _ = Command::new(&self.kube_proxy).arg("--cleanup").output();
        // containerd's mounts (snapshots, sandboxes' shm, the pods' network namespaces, which
        // `netns_mounts_under_state_dir` keeps in our directory) would keep the directory, and a
        // pod's namespace its veth and address on the bridge.
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") {
            let root = format!("{}/", self.dir.display());
            let mut ours: Vec<&str> = mounts.lines().filter_map(|l| l.split(' ').nth(1)).filter(|m| m.starts_with(&root)).collect();
            ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
            for m in ours {
                let _ = Command::new("umount").arg("-l").arg(m).output();
            }
        }
        // The bridge the next node makes afresh (its pods' veths went with their namespaces).
        let _ = Command::new("ip").args(["link", "del", BRIDGE]).output();
    }
}

impl RealNode {
    /// Start containerd, kubelet and kube-proxy for the API server at `apiserver` (reached at
    /// NODE_IP), pulling from `registry` (plain HTTP, on NODE_IP) with its `pause` image as the
    /// pod sandbox. Returns once the Node is Ready.
    pub async fn start(cluster: &crate::cluster::Cluster, pki: &Pki, apiserver_port: u16, pause: &str) -> RealNode {
        let (client, bin, logs, dir, registry) = (&cluster.client().await, cluster.bin.as_path(), cluster.logs.as_path(), cluster.dir.path(), &cluster.registry);
        if let Some(why) = missing() {
            panic!("{why}");
        }
        host_network();
        for b in ["kubelet", "kube-proxy"] {
            assert!(bin.join(b).exists(), "{b} missing in {}: tests/e2e/build-components builds it", bin.display());
        }
        let dir = dir.join("node");
        std::fs::create_dir_all(&dir).expect("node dir");
        let socket = dir.join("containerd.sock");
        let mut procs = Vec::new();

        // containerd: its own root, state and socket; the registry through hosts.toml (plain HTTP).
        let certs_d = dir.join("certs.d").join(&registry.host);
        std::fs::create_dir_all(&certs_d).expect("certs.d");
        std::fs::write(certs_d.join("hosts.toml"), format!("server = \"http://{0}\"\n\n[host.\"http://{0}\"]\n  capabilities = [\"pull\", \"resolve\"]\n", registry.host)).expect("hosts.toml");
        let cni_conf = dir.join("cni");
        std::fs::create_dir_all(&cni_conf).expect("cni conf dir");
        std::fs::write(
            cni_conf.join("10-archer-e2e.conflist"),
            serde_json::to_string_pretty(&serde_json::json!({
                "cniVersion": "0.4.0",
                "name": "archer-e2e",
                "plugins": [
                    {"type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": true, "hairpinMode": true,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": dir.join("ipam").display().to_string()}},
                    {"type": "portmap", "capabilities": {"portMappings": true}},
                    {"type": "loopback"}
                ]
            }))
            .expect("json"),
        )
        .expect("cni conf");
        let containerd_config = dir.join("containerd.toml");
        std::fs::write(
            &containerd_config,
            format!(
                "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\n[grpc]\n  address = \"{sock}\"\n\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{pause}\"\n  netns_mounts_under_state_dir = true\n  [plugins.\"io.containerd.grpc.v1.cri\".cni]\n    bin_dir = \"{CNI_BIN}\"\n    conf_dir = \"{cni}\"\n  [plugins.\"io.containerd.grpc.v1.cri\".registry]\n    config_path = \"{certs}\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n    runtime_type = \"io.containerd.runc.v2\"\n    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n      BinaryName = \"{runc}\"\n",
                root = dir.join("containerd-root").display(),
                state = dir.join("containerd-state").display(),
                sock = socket.display(),
                cni = cni_conf.display(),
                certs = dir.join("certs.d").display(),
                runc = runc().display(),
            ),
        )
        .expect("containerd config");
        let mut containerd = Command::new("containerd");
        containerd.arg("--config").arg(&containerd_config);
        procs.push(spawn("containerd", logs, containerd));
        let start = Instant::now();
        while !socket.exists() {
            assert!(start.elapsed() < Duration::from_secs(30), "containerd did not start; see {}", logs.display());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // kubelet: its own client certificate (system:node:<name>), x509 clients of the CA only.
        let server = format!("https://{NODE_IP}:{apiserver_port}");
        let kubelet_config = dir.join("kubelet.yaml");
        let (kubelet_port, healthz) = (free_port(), free_port());
        std::fs::write(
            &kubelet_config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nauthentication:\n  anonymous: {{enabled: false}}\n  webhook: {{enabled: false}}\n  x509: {{clientCAFile: {ca}}}\nauthorization: {{mode: AlwaysAllow}}\ncgroupDriver: cgroupfs\ncontainerRuntimeEndpoint: unix://{sock}\nfailSwapOn: false\nfailCgroupV1: false\naddress: {NODE_IP}\nport: {kubelet_port}\nreadOnlyPort: 0\nhealthzBindAddress: 127.0.0.1\nhealthzPort: {healthz}\nresolvConf: \"\"\nserializeImagePulls: false\nimageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\nevictionHard: {{memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}}\nnodeStatusUpdateFrequency: 4s\nsyncFrequency: 5s\nmaxPods: 50\n",
                ca = pki.ca().display(),
                sock = socket.display(),
            ),
        )
        .expect("kubelet config");
        let mut kubelet = Command::new(bin.join("kubelet"));
        kubelet
            .arg(format!("--config={}", kubelet_config.display()))
            .arg(format!("--kubeconfig={}", pki.kubeconfig("kubelet", &server).display()))
            .arg(format!("--root-dir={}", dir.join("kubelet").display()))
            .arg(format!("--cert-dir={}", dir.join("kubelet-pki").display()))
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg(format!("--node-ip={NODE_IP}"))
            .arg("--node-labels=archer.dev/e2e-node=real")
            .arg("--v=2");
        procs.push(spawn("kubelet", logs, kubelet));

        // kube-proxy: iptables mode, its own identity (system:kube-proxy, bound to node-proxier).
        let proxy_config = dir.join("kube-proxy.yaml");
        std::fs::write(
            &proxy_config,
            format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclientConnection:\n  kubeconfig: {kc}\nmode: iptables\nclusterCIDR: {POD_CIDR}\nhostnameOverride: {NODE_NAME}\nbindAddress: {NODE_IP}\nhealthzBindAddress: 127.0.0.1:{h}\nmetricsBindAddress: 127.0.0.1:{m}\nconntrack:\n  maxPerCore: 0\n",
                kc = pki.kubeconfig("kube-proxy", &server).display(),
                h = free_port(),
                m = free_port(),
            ),
        )
        .expect("kube-proxy config");
        let mut proxy = Command::new(bin.join("kube-proxy"));
        proxy.arg(format!("--config={}", proxy_config.display())).arg("--v=2");
        procs.push(spawn("kube-proxy", logs, proxy));

        let node = RealNode { dir: dir.clone(), socket, procs, kube_proxy: bin.join("kube-proxy") };
        let nodes: Api<Node> = Api::all(client.clone());
        let start = Instant::now();
        loop {
            let ready = nodes.get_opt(NODE_NAME).await.ok().flatten().and_then(|n| n.status).and_then(|s| s.conditions).is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(120), "the real node did not become Ready; see {}/kubelet.log and containerd.log", logs.display());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        node
    }
}

/// The tests' own image binary (tests/e2e/images/tiny) for `arch`, built static with Go once
/// per cluster into `dir`.
pub fn tiny_binary(dir: &Path, arch: &str) -> Vec<u8> {
    let out = dir.join(format!("tiny-{arch}"));
    if !out.exists() {
        std::fs::create_dir_all(dir).expect("tiny dir");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/images/tiny");
        let status = Command::new("go")
            .args(["build", "-trimpath", "-ldflags", "-s -w", "-o"])
            .arg(&out)
            .arg(".")
            .current_dir(&src)
            .env("CGO_ENABLED", "0")
            .env("GOOS", "linux")
            .env("GOARCH", arch)
            .env("GOFLAGS", "")
            .env("GOTOOLCHAIN", "local")
            .status()
            .expect("go build (Go is needed for the tests' images)");
        assert!(status.success(), "go build tests/e2e/images/tiny for {arch}");
    }
    std::fs::read(&out).expect("tiny binary")
}

/// A layer (plain tar) holding `binary` as /tiny.
fn tiny_layer(binary: &[u8]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(binary.len() as u64);
    header.set_mode(0o755);
    header.set_mtime(0);
    header.set_cksum();
    tar.append_data(&mut header, "tiny", binary).expect("tar");
    tar.into_inner().expect("tar")
}

/// Push an image whose config says `config_arch` and whose /tiny is the `binary_arch` build
/// (the two differ for a lying image), run as `/tiny <args>`.
pub async fn push_tiny(registry: &Registry, dir: &Path, repo: &str, tag: &str, config_arch: &str, binary_arch: &str, args: &[&str]) -> crate::common::Pushed {
    let layer = tiny_layer(&tiny_binary(dir, binary_arch));
    let diff_id = crate::common::sha256(&layer);
    let config = serde_json::json!({
        "architecture": config_arch, "os": "linux",
        "config": {"Entrypoint": ["/tiny"], "Cmd": args, "User": "65532:65532"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]}
    });
    registry.push_image_layers(repo, tag, &config, &[layer], true).await
}

/// The real node's sandbox image (`/tiny pause`), returned as a reference for containerd.
pub async fn push_tiny_images(registry: &Registry, dir: &Path) -> String {
    push_tiny(registry, dir, "e2e/pause", "1", "amd64", "amd64", &["pause"]).await;
    registry.image("e2e/pause:1")
}
