//! What a pod asks of a node: its effective requests, as the scheduler computes them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::quantity;
use crate::sched::resources::{container_requests, effective_requests};

/// The scheduler scores a container without requests as if it asked for this much
/// (kube-scheduler's non-zero defaults), so "free" pods still have a size.
const DEFAULT_CPU_MILLIS: i64 = 100;
const DEFAULT_MEMORY_BYTES: i64 = 200 * quantity::MIB;

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
    pub(crate) fn dominant_share(self, of: Resources) -> f64 {
        let cpu = if of.cpu_millis > 0 { self.cpu_millis as f64 / of.cpu_millis as f64 } else { f64::INFINITY };
        let mem = if of.memory_bytes > 0 { self.memory_bytes as f64 / of.memory_bytes as f64 } else { f64::INFINITY };
        cpu.max(mem)
    }
}

/// For people: `cpu 1.5, memory 512Mi` (the pod slot left out), in the units `kubectl` prints.
impl std::fmt::Display for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cpu = if self.cpu_millis % 1000 == 0 { format!("{}", self.cpu_millis / 1000) } else { format!("{}m", self.cpu_millis) };
        let mem = self.memory_bytes;
        let memory = [("Gi", quantity::GIB), ("Mi", quantity::MIB), ("Ki", 1024)]
            .iter()
            .find(|(_, unit)| mem != 0 && mem % unit == 0)
            .map_or_else(|| mem.to_string(), |(suffix, unit)| format!("{}{suffix}", mem / unit));
        write!(f, "cpu {cpu}, memory {memory}")
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

/// The pod's effective request of cpu and memory, by the one rule
/// ([`crate::sched::resources::effective_requests`]), and one pod slot. `non_zero` applies the
/// scheduler's defaults to containers that request no cpu or no memory.
pub fn pod_requests(pod: &Pod, non_zero: bool) -> Resources {
    let container = |c: &Container| {
        let mut r = container_requests(c);
        if non_zero {
            for (k, default) in [("cpu", DEFAULT_CPU_MILLIS), ("memory", DEFAULT_MEMORY_BYTES)] {
                if r.get(k) == 0 {
                    r.0.insert(k.to_string(), default);
                }
            }
        }
        r
    };
    let all = effective_requests(pod, &container);
    Resources { cpu_millis: all.get("cpu"), memory_bytes: all.get("memory"), pods: 1 }
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
    fn a_limit_defaults_the_request_of_its_own_resource_only() {
        // As the API server defaults a container's requests: per resource, from its limits.
        let p = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "image": "x", "resources": {"requests": {"cpu": "300m"}, "limits": {"cpu": "1", "memory": "512Mi"}}},
            {"name": "b", "image": "x", "resources": {"requests": {"memory": "64Mi"}}}
        ]}}));
        assert_eq!(pod_requests(&p, false), Resources::new(300, 576 * quantity::MIB, 1), "a's memory comes from its limit, its cpu from its request");
        assert_eq!(pod_requests(&p, true), Resources::new(300 + DEFAULT_CPU_MILLIS, 576 * quantity::MIB, 1), "b asks no cpu: the scheduler's default");
        let all = crate::sched::resources::pod_requests(&p);
        assert_eq!((all.get("cpu"), all.get("memory")), (300, 576 * quantity::MIB), "the one rule, read for every resource");
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
