//! What the comparison measures beyond pods and prices, as Karpenter's perf suites do:
//! the controllers' resident memory (P95 of samples) and average cores per phase, node
//! utilisation at a phase's end, and each controller's API writes, counted by the API server.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Api, Client};
use serde_json::json;

/// One sample of the controllers (summed): resident MiB and CPU seconds so far.
#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    rss_mib: f64,
    cpu_seconds: f64,
}

fn rss_and_cpu(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok()).unwrap_or(0.0);
    (rss_kib / 1024.0, crate::scale::usage(pid).1)
}

/// Samples the controllers' processes every second (Karpenter's poller: every 5 s from
/// `/metrics`; `process_resident_memory_bytes` is the same VmRSS).
pub struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

/// A phase's figures for the controllers, as Karpenter's suites report them.
#[derive(Debug, Default, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    #[serde(rename = "p95MemoryMiB")]
    pub p95_memory_mib: f64,
    pub average_cores: f64,
    pub cpu_seconds: f64,
}

impl Sampler {
    pub fn start(pids: Vec<u32>) -> Sampler {
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let into = samples.clone();
        let task = tokio::spawn(async move {
            loop {
                let (rss_mib, cpu_seconds) = pids.iter().map(|&p| rss_and_cpu(p)).fold((0.0, 0.0), |(m, c), (r, s)| (m + r, c + s));
                into.lock().expect("samples").push(Sample { at: Instant::now(), rss_mib, cpu_seconds });
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Sampler { samples, task }
    }

    /// The controllers' P95 resident memory and average cores between `from` and `to`.
    pub fn usage(&self, from: Instant, to: Instant) -> Usage {
        let samples = self.samples.lock().expect("samples");
        let inside: Vec<Sample> = samples.iter().copied().filter(|s| s.at >= from && s.at <= to).collect();
        let mut rss: Vec<f64> = inside.iter().map(|s| s.rss_mib).collect();
        rss.sort_by(f64::total_cmp);
        let p95 = if rss.is_empty() { 0.0 } else { rss[((rss.len() as f64 * 0.95).ceil() as usize).saturating_sub(1).min(rss.len() - 1)] };
        // CPU from the last sample before the phase to the last inside it.
        let before = samples.iter().rev().find(|s| s.at <= from).or(inside.first());
        let (cpu_seconds, average_cores) = match (before, inside.last()) {
            (Some(a), Some(b)) if b.at > a.at => (b.cpu_seconds - a.cpu_seconds, (b.cpu_seconds - a.cpu_seconds) / (b.at - a.at).as_secs_f64()),
            _ => (0.0, 0.0),
        };
        Usage { p95_memory_mib: p95, average_cores, cpu_seconds }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The verbs that write.
const WRITES: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

fn flow_schema_name(controller: &str) -> String {
    format!("compare-writes-{controller}")
}

/// Classify `user`'s writes under a FlowSchema of their own, so the API server's
/// `apiserver_flowcontrol_dispatched_requests_total{flow_schema}` counts them. The priority
/// level is `workload-high` for both controllers (about 100 seats here, which neither fills; the
/// exempt level dispatches without counting). Reads keep their usual schemas.
/// `exempt_reads`: the user's other requests go to the exempt level (Karpenter's, which it had
/// as `system:masters` before).
pub async fn count_writes(client: &Client, controller: &str, user: &str, exempt_reads: bool) {
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource { group: "flowcontrol.apiserver.k8s.io".into(), version: "v1".into(), api_version: "flowcontrol.apiserver.k8s.io/v1".into(), kind: "FlowSchema".into(), plural: "flowschemas".into() },
    );
    let schema = json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": flow_schema_name(controller)},
        "spec": {
            // Before every suggested schema (leader election, service accounts, global default).
            "matchingPrecedence": 50,
            "priorityLevelConfiguration": {"name": "workload-high"},
            "rules": [{
                "subjects": [{"kind": "User", "user": {"name": user}}],
                "resourceRules": [{"verbs": WRITES, "apiGroups": ["*"], "resources": ["*"], "clusterScope": true, "namespaces": ["*"]}]
            }]
        }
    });
    api.create(&PostParams::default(), &serde_json::from_value(schema).expect("flow schema")).await.expect("create the FlowSchema");
    if exempt_reads {
        // Its other requests stay exempt, as they were in `system:masters`.
        let reads = json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": format!("compare-reads-{controller}")},
            "spec": {
                "matchingPrecedence": 60,
                "priorityLevelConfiguration": {"name": "exempt"},
                "rules": [{
                    "subjects": [{"kind": "User", "user": {"name": user}}],
                    "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": true, "namespaces": ["*"]}],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]
                }]
            }
        });
        api.create(&PostParams::default(), &serde_json::from_value(reads).expect("flow schema")).await.expect("create the FlowSchema");
    }
}

/// Writes the API server has dispatched for each controller so far, from its `/metrics`.
pub async fn writes(apiserver: &str, controllers: &[&str]) -> BTreeMap<String, f64> {
    let http = reqwest::Client::builder().danger_accept_invalid_certs(true).build().expect("http");
    let text = match http.get(format!("{apiserver}/metrics")).bearer_auth(crate::cluster::TOKEN).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    controllers
        .iter()
        .map(|c| {
            let label = format!("flow_schema=\"{}\"", flow_schema_name(c));
            let n: f64 = text.lines().filter(|l| l.starts_with("apiserver_flowcontrol_dispatched_requests_total{") && l.contains(&label)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum();
            (c.to_string(), n)
        })
        .collect()
}

/// A quantity as Karpenter's suite sums it: cores, or bytes (the core's parser).
fn quantity(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>, cpu: bool) -> f64 {
    let Some(q) = q else { return 0.0 };
    if cpu {
        archer::core::quantity::cpu_millis(&q.0).map_or(0.0, |m| m as f64 / 1000.0)
    } else {
        archer::core::quantity::value(&q.0).map_or(0.0, |b| b as f64)
    }
}

/// Node utilisation as Karpenter's suites compute it (test/pkg/environment monitor): for each
/// node of a NodePool, the requests of the pods bound to it over its allocatable; the mean
/// over nodes, cpu and memory.
pub async fn utilisation(client: &Client) -> (f64, f64) {
    let nodes: Vec<Node> = super::live_nodes(client).await;
    let pods: Vec<Pod> = Api::<Pod>::all(client.clone()).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    let mut requested: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for p in &pods {
        let Some(spec) = &p.spec else { continue };
        let Some(node) = &spec.node_name else { continue };
        let e = requested.entry(node.clone()).or_default();
        for c in &spec.containers {
            let r = c.resources.as_ref().and_then(|r| r.requests.as_ref());
            e.0 += quantity(r.and_then(|r| r.get("cpu")), true);
            e.1 += quantity(r.and_then(|r| r.get("memory")), false);
        }
    }
    let per_node: Vec<(f64, f64)> = nodes
        .iter()
        .filter_map(|n| {
            let alloc = n.status.as_ref()?.allocatable.as_ref()?;
            let (cpu, mem) = (quantity(alloc.get("cpu"), true), quantity(alloc.get("memory"), false));
            let used = requested.get(n.metadata.name.as_ref()?).copied().unwrap_or_default();
            (cpu > 0.0 && mem > 0.0).then(|| (used.0 / cpu, used.1 / mem))
        })
        .collect();
    if per_node.is_empty() {
        return (0.0, 0.0);
    }
    let n = per_node.len() as f64;
    (per_node.iter().map(|u| u.0).sum::<f64>() / n, per_node.iter().map(|u| u.1).sum::<f64>() / n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    #[test]
    fn quantities_read_as_karpenters_suite_sums_them() {
        assert_eq!(quantity(Some(&Quantity("900m".into())), true), 0.9);
        assert_eq!(quantity(Some(&Quantity("4".into())), true), 4.0);
        assert_eq!(quantity(Some(&Quantity("3100Mi".into())), false), 3100.0 * 1024.0 * 1024.0);
        assert_eq!(quantity(Some(&Quantity("28Gi".into())), false), 28.0 * 1024.0 * 1024.0 * 1024.0);
        assert_eq!(quantity(Some(&Quantity("1000Ki".into())), false), 1024.0 * 1000.0);
    }
}
