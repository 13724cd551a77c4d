//! The memory bound under sustained, mixed, hostile traffic, against the release binary started
//! with the shipped config (`deploy/base/configmap.yaml`) and without `MIMALLOC_PURGE_DELAY` in its
//! environment (the binary sets its allocator's purging itself).
//!
//! 50,000 requests from 24 concurrent clients: admission reviews and extender filter and
//! prioritize calls; real images on a real registry and thousands of distinct references that
//! are not there (each one a lookup, a failure, and a cache entry), references as long as the
//! OCI spec allows and longer, large bodies (MiBs of env, annotations and full Node lists), and
//! bodies nested thousands deep in every part a decision reads. Among the extender calls, node
//! lists as kube-scheduler sends them (hundreds to thousands of names or full Nodes) and the
//! ones that make the extender build the most for their size: hundreds of thousands of tiny
//! distinct names or Nodes, and pods of tens of thousands of empty containers or volumes.
//! Then 20,000 of the extender's calls alone. Peak RSS (VmHWM, sampled throughout) must stay
//! within `Config::memory_bound_bytes` and the
//! Deployment's memory limit, and RSS after a quiet period must be back within them; no request
//! may panic or go unanswered.
//!
//! Ignored by `cargo test` (it needs a release binary): run it as
//! `cargo build --release --locked --bin archer && cargo test --locked --test sustained_load -- --ignored --nocapture --test-threads=1`
//! (`ARCHER_RELEASE_BIN` names another binary: `.ci/run` builds one without the cloud SDKs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const REQUESTS: usize = 50_000;
const CLIENTS: usize = 24;
/// One request in this many is a swollen extender call ([`swollen_calls`]).
const SWOLLEN_EVERY: usize = 250;
const MIB: u64 = 1024 * 1024;

fn release_binary() -> PathBuf {
    let bin = std::env::var_os("ARCHER_RELEASE_BIN").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/archer"));
    assert!(bin.exists(), "{} is missing: run `cargo build --release --locked --bin archer` first (or set ARCHER_RELEASE_BIN)", bin.display());
    bin
}

/// The shipped config (the ConfigMap's `config.yaml`), with the test registry marked insecure
/// (plain HTTP on loopback) so its images can be inspected.
fn shipped_config(registry_host: &str) -> (String, archer::config::Config) {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base/configmap.yaml")).expect("configmap");
    let cm: Value = archer::yaml::from_str(&manifest).expect("configmap yaml");
    let mut config: Value = archer::yaml::from_str(cm["data"]["config.yaml"].as_str().expect("config.yaml")).expect("config yaml");
    config["registry"]["insecure"] = json!([registry_host]);
    let text = serde_json::to_string(&config).expect("json");
    let parsed: archer::config::Config = serde_json::from_value(config).expect("the shipped config parses");
    (text, parsed)
}

/// JSON nested `depth` deep (objects with one unknown key, and arrays, in turn).
fn nested(depth: usize) -> String {
    let mut s = String::with_capacity(depth * 6 + 3);
    for level in 0..depth {
        s.push_str(if level % 2 == 0 { "{\"k\":" } else { "[" });
    }
    s.push_str("\"x\"");
    for level in (0..depth).rev() {
        s.push(if level % 2 == 0 { '}' } else { ']' });
    }
    s
}

/// The Deployment's memory limit (`deploy/base/deployment.yaml`), in bytes.
fn shipped_memory_limit() -> u64 {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base/deployment.yaml")).expect("deployment");
    let d: Value = archer::yaml::from_str(&manifest).expect("deployment yaml");
    let limit = d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"].as_str().expect("memory limit").to_string();
    archer::core::quantity::value(&limit).expect("quantity") as u64
}

/// Extender calls that make the extender build the most for their size (each several times
/// its share of the budget once built, so each must be weighed before it is built): the
/// body's bytes are few for what they list.
fn swollen_calls(registry: &str) -> Vec<(&'static str, Vec<u8>)> {
    let list = |n: usize, item: &dyn Fn(usize) -> String| (0..n).map(item).collect::<Vec<_>>().join(",");
    let pod = |spec: &str| format!(r#"{{"metadata":{{"name":"swollen","namespace":"shop","annotations":{{"archer.dev/platforms":"linux/amd64"}}}},"spec":{spec}}}"#);
    let small = pod(&format!(r#"{{"containers":[{{"name":"c","image":"{registry}/load/amd:1"}}]}}"#));
    let mut calls = Vec::new();
    for (k, path) in ["/scheduler/filter", "/scheduler/prioritize"].into_iter().enumerate() {
        // Tiny distinct names (nodeCacheCapable: true), none of them known.
        calls.push((path, format!(r#"{{"Pod":{small},"NodeNames":[{}]}}"#, list(800_000, &|i| format!("\"{k}{i:x}\""))).into_bytes()));
        // Tiny Nodes the pod cannot run on.
        calls.push((path, format!(r#"{{"Pod":{small},"Nodes":{{"items":[{}]}}}}"#, list(250_000, &|i| format!(r#"{{"metadata":{{"name":"{k}{i:x}","labels":{{"kubernetes.io/arch":"arm64"}}}}}}"#))).into_bytes()));
        // Pods of empty containers, volumes and ephemeral containers.
        calls.push((path, format!(r#"{{"Pod":{},"NodeNames":["node-1"]}}"#, pod(&format!(r#"{{"volumes":[{}]}}"#, list(60_000, &|_| "{}".into())))).into_bytes()));
        calls.push((path, format!(r#"{{"Pod":{},"NodeNames":["node-1"]}}"#, pod(&format!(r#"{{"containers":[{}],"ephemeralContainers":[{}]}}"#, list(40_000, &|_| "{}".into()), list(40_000, &|_| "{}".into())))).into_bytes()));
        // The same shapes small enough to be served: 20,000 names or Nodes, 2,000 volumes.
        calls.push((path, format!(r#"{{"Pod":{small},"NodeNames":[{}]}}"#, list(20_000, &|i| format!("\"{k}{i:x}\""))).into_bytes()));
        calls.push((path, format!(r#"{{"Pod":{small},"Nodes":{{"items":[{}]}}}}"#, list(20_000, &|i| format!(r#"{{"metadata":{{"name":"{k}{i:x}","labels":{{"kubernetes.io/arch":"arm64"}}}}}}"#))).into_bytes()));
        calls.push((path, format!(r#"{{"Pod":{},"NodeNames":["node-1"]}}"#, pod(&format!(r#"{{"volumes":[{}]}}"#, list(2_000, &|_| "{}".into())))).into_bytes()));
    }
    calls
}

/// What the clients send: bodies built once (the large ones) or per request (small, varied).
struct Workload {
    registry: String,
    big_review: Vec<u8>,
    big_filter: Vec<u8>,
    swollen: Vec<(&'static str, Vec<u8>)>,
    /// Full Node objects, serialised once.
    nodes: Vec<String>,
    node_names: Vec<String>,
}

/// ExtenderArgs with full Nodes, spliced from serialised parts (cheap per request).
fn full_args(pod: &Value, nodes: &[String]) -> Vec<u8> {
    format!(r#"{{"Pod":{pod},"Nodes":{{"kind":"NodeList","apiVersion":"v1","metadata":{{}},"items":[{}]}},"NodeNames":null}}"#, nodes.join(",")).into_bytes()
}

impl Workload {
    /// A reference: real images, distinct missing ones, spec-long ones and over-long ones.
    fn image(&self, i: usize) -> String {
        let r = &self.registry;
        match i % 10 {
            0..=2 => format!("{r}/load/multi:{}", i % 4),
            3 => format!("{r}/load/amd:1"),
            4..=6 => format!("{r}/load/missing-{i}:v{}", i % 7),
            7 => {
                // As long as the spec allows: a 255-character name and a 128-character tag.
                let path = format!("load/{}", "a".repeat(255 - r.len() - 1 - 5 - 8));
                format!("{r}/{path}{i:08}:{}", "t".repeat(128))
            }
            8 => format!("{r}/load/{}:1", "b".repeat(600 + i % 1000)),
            _ => format!("{r}/load/missing-{i}@sha256:{}", "0".repeat(64)),
        }
    }

    fn pod(&self, i: usize) -> Value {
        let images: Vec<String> = (0..1 + i % 4).map(|k| self.image(i * 7 + k)).collect();
        let refs: Vec<&str> = images.iter().map(String::as_str).collect();
        let mut p = pod(&format!("load-{i}"), &refs);
        p["metadata"]["labels"]["pod-template-hash"] = json!(format!("h{}", i % 97));
        p
    }

    /// A review nested deep in one of the parts a decision reads.
    fn deep_review(&self, i: usize) -> Vec<u8> {
        let deep = nested(1000 + (i * 37) % 9000);
        let body = serde_json::to_string(&review("CREATE", &self.pod(i))).expect("json");
        let (at, with) = match i % 5 {
            0 => ("\"tolerations\":", format!("\"tolerations\":[{{\"key\":{deep}}}],\"x-tolerations\":")),
            1 => ("\"tolerations\":", format!("\"affinity\":{{\"nodeAffinity\":{deep}}},\"tolerations\":")),
            2 => ("\"tolerations\":", format!("\"nodeSelector\":{{\"a\":{deep}}},\"tolerations\":")),
            3 => ("\"labels\":{", format!("\"labels\":{{\"deep\":{deep},")),
            _ => ("\"tolerations\":", format!("\"imagePullSecrets\":[{{\"name\":\"s\",\"x\":{deep}}}],\"tolerations\":")),
        };
        body.replacen(at, &with, 1).into_bytes()
    }

    /// The `i`th request of the extender-only load: the mixed load's extender calls alone.
    fn extender_request(&self, i: usize) -> (&'static str, Vec<u8>) {
        self.request((i / 7) * 20 + 12 + i % 7)
    }

    fn request(&self, i: usize) -> (&'static str, Vec<u8>) {
        if i % SWOLLEN_EVERY == SWOLLEN_EVERY / 2 {
            let (path, body) = &self.swollen[(i / SWOLLEN_EVERY) % self.swollen.len()];
            return (path, body.clone());
        }
        match i % 20 {
            0..=8 => ("/mutate", serde_json::to_vec(&review("CREATE", &self.pod(i))).expect("json")),
            9 | 10 => ("/mutate", self.deep_review(i)),
            11 => ("/mutate", if i % 100 == 11 { self.big_review.clone() } else { serde_json::to_vec(&review("CREATE", &self.pod(i))).expect("json") }),
            12..=14 => {
                let names: Vec<&str> = self.node_names.iter().take(50 + i % 1500).map(String::as_str).collect();
                ("/scheduler/filter", serde_json::to_vec(&extender_args_names(&self.pod(i), &names)).expect("json"))
            }
            15 | 16 => {
                let nodes = &self.nodes[..(5 + i % 120).min(self.nodes.len())];
                ("/scheduler/prioritize", full_args(&self.pod(i), nodes))
            }
            17 => ("/scheduler/filter", if i % 100 == 17 { self.big_filter.clone() } else { full_args(&self.pod(i), &self.nodes[..20]) }),
            18 => {
                let mut body = String::from_utf8(full_args(&self.pod(i), &self.nodes[..3])).expect("utf-8");
                body = body.replacen("\"metadata\":{", &format!("\"metadata\":{{\"deep\":{},", nested(2000 + i % 5000)), 1);
                ("/scheduler/filter", body.into_bytes())
            }
            _ => ("/mutate", format!("{{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"request\":{}}}", nested(500 + i % 3000)).into_bytes()),
        }
    }
}

/// Samples RSS every 50 ms until stopped; the highest VmRSS seen. Past `kill_above` the process
/// is killed (SIGKILL, as the kernel's OOM killer would at the Deployment's limit): the test has
/// failed, and the machine it runs on is spared the rest.
fn sample_rss(pid: u32, stop: Arc<AtomicUsize>, highest: Arc<AtomicU64>, kill_above: u64) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while stop.load(Ordering::SeqCst) == 0 {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let rss = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()).unwrap_or(0) * 1024;
            highest.fetch_max(rss, Ordering::SeqCst);
            if rss > kill_above {
                let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the release binary; .ci/run builds it and runs this test"]
async fn fifty_thousand_mixed_hostile_requests_stay_within_the_memory_bound() {
    let metrics = load(REQUESTS, Workload::request).await;
    // The load did exercise the caches and the refusals it was meant to.
    let sample = |name: &str| metrics.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok())).unwrap_or(0.0);
    assert!(sample("archer_image_lookups_total{result=\"miss\"}") >= 1000.0, "distinct references were looked up:\n{metrics}");
    assert!(sample("archer_image_inspection_failures_total{reason=\"invalid_reference\"}") >= 100.0, "over-long references were refused before any lookup:\n{metrics}");
}

/// The extender's calls alone, as kube-scheduler and a hostile client send them: with nothing
/// else to share the process, each call's own memory shows. (Every small call once moved off
/// its worker thread, growing the blocking pool to a hundred threads whose allocator heaps held
/// 650 MiB, twice the Deployment's limit, within 3,000 calls.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the release binary; .ci/run builds it and runs this test"]
async fn twenty_thousand_extender_calls_stay_within_the_memory_bound() {
    let metrics = load(20_000, Workload::extender_request).await;
    assert!(metrics.contains(r#"archer_extender_requests_total{verb="prioritize",result="ok"}"#), "{metrics}");
    assert!(!metrics.contains("archer_admission_reviews_total{"), "no admission review was sent:\n{metrics}");
}

/// Send `requests` requests (`pick` gives the `i`th) from [`CLIENTS`] clients to the release
/// binary started with the shipped config; check the memory bound throughout and after a quiet
/// period, and that every request was answered without a panic. The metrics at the end.
async fn load(requests: usize, pick: fn(&Workload, usize) -> (&'static str, Vec<u8>)) -> String {
    let binary = release_binary();
    let reg = Registry::start().await;
    reg.push_index("load/multi", "0", &["linux/amd64", "linux/arm64"], true, false).await;
    for tag in ["1", "2", "3"] {
        reg.push_index("load/multi", tag, &["linux/amd64", "linux/arm64", "linux/arm/v7"], false, true).await;
    }
    reg.push_image("load/amd", "1", "linux/amd64", true).await;
    let (config_text, config) = shipped_config(&reg.host);
    // Standalone: no Node cache, so the bound's node term is zero. The Deployment's limit is
    // sized for a cluster's Node cache on top, so it is the looser of the two: both must hold.
    let limit = shipped_memory_limit();
    let bound = config.memory_bound_bytes(0).min(limit);

    let dir = tempfile::tempdir().expect("tempdir");
    let certs = make_certs(&dir.path().join("certs"));
    let archer = Archer::spawn_binary(&binary, dir, certs, &config_text, &["--log", "info", "--log-format", "json"], None).ready().await;
    assert!(archer.log_text().contains("\"purge_delay_ms\":0"), "the binary sets its allocator's purge delay itself:\n{}", archer.log_text().lines().take(5).collect::<Vec<_>>().join("\n"));
    let (resting, _) = archer.rss();

    let nodes: Vec<Value> = (0..2000).map(|i| node_json(&format!("node-{i}"), ["m6g.large", "m6i.large", "c7g.xlarge", "r6i.2xlarge"][i % 4], ["us-east-1a", "us-east-1b", "us-east-1c"][i % 3], if i % 5 == 0 { "spot" } else { "on-demand" })).collect();
    let big_filter = serde_json::to_vec(&extender_args_full(&pod("big", &[&reg.image("load/multi:0")]), &nodes)).expect("json");
    let mut big = pod("big", &[&reg.image("load/multi:1")]);
    big["metadata"]["annotations"] = json!({"blob": "y".repeat(3 * MIB as usize)});
    big["spec"]["containers"][0]["env"] = json!((0..20_000).map(|i| json!({"name": format!("V{i}"), "value": "z".repeat(40)})).collect::<Vec<_>>());
    let big_review = serde_json::to_vec(&review("CREATE", &big)).expect("json");
    let nodes = nodes.iter().map(|n| serde_json::to_string(n).expect("json")).collect();
    let swollen = swollen_calls(&reg.host);
    let workload = Arc::new(Workload { registry: reg.host.clone(), big_review, big_filter, swollen, node_names: (0..2000).map(|i| format!("node-{i}")).collect(), nodes });

    let stop = Arc::new(AtomicUsize::new(0));
    let highest = Arc::new(AtomicU64::new(0));
    let sampler = sample_rss(archer.pid(), stop.clone(), highest.clone(), 2 * limit);
    let ca = reqwest::Certificate::from_pem(&std::fs::read(archer.certs.join("ca.crt")).expect("ca")).expect("pem");
    let next = Arc::new(AtomicUsize::new(0));
    let statuses = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<(String, u16), usize>::new()));
    let started = Instant::now();
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        // Some clients speak HTTP/2, most HTTP/1.1, as kube-apiserver and kube-scheduler do.
        let mut builder = reqwest::Client::builder().add_root_certificate(ca.clone()).timeout(Duration::from_secs(30));
        if c % 4 != 0 {
            builder = builder.http1_only();
        }
        let client = builder.build().expect("client");
        let (workload, next, statuses, https, highest) = (workload.clone(), next.clone(), statuses.clone(), archer.https.clone(), highest.clone());
        clients.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    break;
                }
                let (path, body) = pick(&workload, i);
                let r = client.post(format!("{https}{path}")).header("content-type", "application/json").body(body).send().await;
                let status = match r {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        let _ = r.bytes().await;
                        s
                    }
                    Err(e) => {
                        let rss = highest.load(Ordering::SeqCst);
                        assert!(rss <= 2 * limit, "RSS reached {} MiB, twice the Deployment's {} MiB limit: archer was killed (request {i} to {path})", rss / MIB, limit / MIB);
                        panic!("request {i} to {path} was not answered: {e}")
                    }
                };
                *statuses.lock().unwrap().entry((path.to_string(), status)).or_default() += 1;
            }
        }));
    }
    for c in clients {
        c.await.expect("client");
    }
    let took = started.elapsed();
    let (_, hwm_loaded) = archer.rss();
    // A quiet period: tag TTLs have not run out, so the caches stay full; what is freed is the
    // requests' memory.
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(1, Ordering::SeqCst);
    sampler.join().expect("sampler");
    let (after, hwm) = archer.rss();
    let metrics = archer.metrics().await;
    let statuses = statuses.lock().unwrap().clone();
    eprintln!(
        "{requests} requests from {CLIENTS} clients in {took:.1?} ({:.0}/s): statuses {statuses:?}\n\
         RSS at rest {} MiB, peak (VmHWM) {} MiB, highest sampled {} MiB, after 5 s quiet {} MiB; bound {} MiB (memory_bound_bytes {} MiB, Deployment limit {} MiB)",
        requests as f64 / took.as_secs_f64(),
        resting / MIB,
        hwm / MIB,
        highest.load(Ordering::SeqCst) / MIB,
        after / MIB,
        bound / MIB,
        config.memory_bound_bytes(0) / MIB,
        limit / MIB
    );
    for line in metrics.lines().filter(|l| {
        ["archer_image_lookups_total", "archer_memory_budget_refusals_total", "archer_bad_requests_total", "archer_admission_reviews_total", "archer_extender_requests_total"].iter().any(|m| l.starts_with(m))
    }) {
        eprintln!("  {line}");
    }
    assert_eq!(statuses.values().sum::<usize>(), requests, "every request was answered");
    assert!(!statuses.keys().any(|(_, s)| *s >= 500 && *s != 503), "no request failed inside Archer: {statuses:?}");
    assert!(!metrics.lines().any(|l| l.starts_with("archer_panics_total{")), "no handler panicked:\n{metrics}");
    assert!(!archer.log_text().contains("panicked"), "no panic was logged");
    assert!(hwm_loaded <= bound && hwm <= bound, "peak RSS {} MiB over the bound of {} MiB", hwm / MIB, bound / MIB);
    assert!(after <= bound, "RSS after the quiet period {} MiB over the bound of {} MiB", after / MIB, bound / MIB);
    metrics
}
