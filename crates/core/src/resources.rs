//! What a pod asks of a node: its effective requests, as the scheduler computes them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::quantity;

/// The scheduler scores a container without requests as if it asked for this much
/// (kube-scheduler's non-zero defaults), so "free" pods still have a size.
pub const DEFAULT_CPU_MILLIS: i64 = 100;
pub const DEFAULT_MEMORY_BYTES: i64 = 200 * quantity::MIB;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Resources {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub pods: i64,
}

impl Resources {
    pub fn new(cpu_millis: i64, memory_bytes: i64, pods: i64) -> Self {
        Self { cpu_millis, memory_bytes, pods }
    }

    pub fn from_map(map: Option<&BTreeMap<String, Quantity>>) -> Self {
        let get = |k: &str, f: fn(&str) -> Option<i64>| map.and_then(|m| m.get(k)).and_then(|q| f(&q.0)).unwrap_or(0);
        Resources { cpu_millis: get("cpu", quantity::cpu_millis), memory_bytes: get("memory", quantity::value), pods: get("pods", quantity::value) }
    }

    pub fn max(self, o: Resources) -> Resources {
        Resources { cpu_millis: self.cpu_millis.max(o.cpu_millis), memory_bytes: self.memory_bytes.max(o.memory_bytes), pods: self.pods.max(o.pods) }
    }

    /// Every dimension fits within `capacity`.
    pub fn fits(self, capacity: Resources) -> bool {
        self.cpu_millis <= capacity.cpu_millis && self.memory_bytes <= capacity.memory_bytes && self.pods <= capacity.pods
    }

    /// The larger of the CPU and memory shares of `of` this takes (0..).
    pub fn dominant_share(self, of: Resources) -> f64 {
        let cpu = if of.cpu_millis > 0 { self.cpu_millis as f64 / of.cpu_millis as f64 } else { f64::INFINITY };
        let mem = if of.memory_bytes > 0 { self.memory_bytes as f64 / of.memory_bytes as f64 } else { f64::INFINITY };
        cpu.max(mem)
    }
}

impl std::ops::Add for Resources {
    type Output = Resources;
    fn add(self, o: Resources) -> Resources {
        Resources { cpu_millis: self.cpu_millis + o.cpu_millis, memory_bytes: self.memory_bytes + o.memory_bytes, pods: self.pods + o.pods }
    }
}

impl std::ops::Sub for Resources {
    type Output = Resources;
    fn sub(self, o: Resources) -> Resources {
        Resources { cpu_millis: self.cpu_millis - o.cpu_millis, memory_bytes: self.memory_bytes - o.memory_bytes, pods: self.pods - o.pods }
    }
}

fn container_requests(c: &Container, non_zero: bool) -> Resources {
    let r = Resources::from_map(c.resources.as_ref().and_then(|r| r.requests.as_ref()).or_else(|| c.resources.as_ref().and_then(|r| r.limits.as_ref())));
    if non_zero {
        Resources {
            cpu_millis: if r.cpu_millis == 0 { DEFAULT_CPU_MILLIS } else { r.cpu_millis },
            memory_bytes: if r.memory_bytes == 0 { DEFAULT_MEMORY_BYTES } else { r.memory_bytes },
            pods: 0,
        }
    } else {
        Resources { pods: 0, ..r }
    }
}

/// The pod's effective request: the larger of (regular + sidecar containers) and each plain init
/// container (with the sidecars started before it), plus pod overhead, and one pod slot.
/// `non_zero` applies the scheduler's defaults to containers that request nothing.
pub fn pod_requests(pod: &Pod, non_zero: bool) -> Resources {
    let Some(spec) = &pod.spec else { return Resources::new(0, 0, 1) };
    let mut sidecars = Resources::default();
    let mut init_peak = Resources::default();
    for c in spec.init_containers.iter().flatten() {
        let r = container_requests(c, non_zero);
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars = sidecars + r;
        } else {
            init_peak = init_peak.max(sidecars + r);
        }
    }
    let regular = spec.containers.iter().fold(Resources::default(), |acc, c| acc + container_requests(c, non_zero)) + sidecars;
    let overhead = Resources::from_map(spec.overhead.as_ref());
    Resources { pods: 1, ..regular.max(init_peak) + Resources { pods: 0, ..overhead } }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn effective_requests_follow_the_scheduler() {
        let p = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [
                {"name": "init", "image": "x", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}},
                {"name": "sidecar", "image": "x", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
            ],
            "containers": [
                {"name": "a", "image": "x", "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}},
                {"name": "b", "image": "x", "resources": {"limits": {"cpu": "250m", "memory": "128Mi"}}}
            ],
            "overhead": {"cpu": "10m", "memory": "1Mi"}
        }}));
        let r = pod_requests(&p, false);
        assert_eq!(r.cpu_millis, 2010, "the init container dominates CPU");
        assert_eq!(r.memory_bytes, 1024 * quantity::MIB + quantity::MIB);
        assert_eq!(r.pods, 1);

        let empty = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a", "image": "x"}]}}));
        assert_eq!(pod_requests(&empty, false), Resources::new(0, 0, 1));
        assert_eq!(pod_requests(&empty, true), Resources::new(DEFAULT_CPU_MILLIS, DEFAULT_MEMORY_BYTES, 1));
    }

    #[test]
    fn dominant_share_takes_the_scarcer_resource() {
        let node = Resources::new(2000, 8 * quantity::GIB, 29);
        assert_eq!(Resources::new(1000, quantity::GIB, 1).dominant_share(node), 0.5);
        assert_eq!(Resources::new(100, 4 * quantity::GIB, 1).dominant_share(node), 0.5);
        assert!(Resources::new(1, 1, 1).fits(node));
        assert!(!Resources::new(3000, 1, 1).fits(node));
    }
}
