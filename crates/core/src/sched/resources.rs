//! Every resource a pod requests, as NodeResourcesFit computes it: regular containers summed,
//! restartable init containers (sidecars) added, other init containers as the peak they reach
//! on top of the sidecars started before them, plus the pod's `overhead`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

/// Resource name -> amount: `cpu` in millicores, everything else in base units (bytes, devices).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceList(pub BTreeMap<String, i64>);

impl ResourceList {
    pub fn from_api(map: Option<&BTreeMap<String, Quantity>>) -> Self {
        Self(map.iter().flat_map(|m| m.iter()).filter_map(|(k, q)| amount(k, &q.0).map(|v| (k.clone(), v))).collect())
    }

    pub fn get(&self, name: &str) -> i64 {
        self.0.get(name).copied().unwrap_or(0)
    }

    pub fn add(&mut self, other: &ResourceList) {
        for (k, v) in &other.0 {
            *self.0.entry(k.clone()).or_insert(0) += v;
        }
    }

    pub fn sub(&mut self, other: &ResourceList) {
        for (k, v) in &other.0 {
            *self.0.entry(k.clone()).or_insert(0) -= v;
        }
    }

    fn max_with(&mut self, other: &ResourceList) {
        for (k, v) in &other.0 {
            let e = self.0.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
    }

    /// The first resource of `self` (a request) that `free` cannot hold: (name, requested, free).
    /// Resources requested at zero are never checked, as kube-scheduler does.
    pub(crate) fn first_short(&self, free: &ResourceList) -> Option<(&str, i64, i64)> {
        self.0.iter().filter(|(_, v)| **v > 0).find(|(k, v)| **v > free.get(k)).map(|(k, v)| (k.as_str(), *v, free.get(k)))
    }
}

fn amount(name: &str, q: &str) -> Option<i64> {
    if name == "cpu" {
        quantity::cpu_millis(q)
    } else {
        quantity::value(q)
    }
}

/// What one container requests of every resource.
pub(crate) fn container_requests(c: &Container) -> ResourceList {
    // A limit without a request defaults the request (API defaulting; pods read back from the
    // API server already carry it, pods from YAML may not).
    let r = c.resources.as_ref();
    let mut out = ResourceList::from_api(r.and_then(|r| r.limits.as_ref()));
    for (k, v) in ResourceList::from_api(r.and_then(|r| r.requests.as_ref())).0 {
        out.0.insert(k, v);
    }
    out
}

/// What the pod requests of every resource (the `pods` slot is not included).
pub fn pod_requests(pod: &Pod) -> ResourceList {
    effective_requests(pod, &container_requests)
}

/// The one rule for a pod's requests, each container read by `container` (the scheduler's
/// non-zero defaults are applied there when a caller wants them): regular containers summed,
/// sidecars added, each other init container as the peak it reaches on top of the sidecars
/// started before it, plus the pod's overhead. Resources requested at zero are left out.
pub(crate) fn effective_requests(pod: &Pod, container: &dyn Fn(&Container) -> ResourceList) -> ResourceList {
    let Some(spec) = &pod.spec else { return ResourceList::default() };
    let mut sidecars = ResourceList::default();
    let mut init_peak = ResourceList::default();
    for c in spec.init_containers.iter().flatten() {
        let r = container(c);
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars.add(&r);
        } else {
            let mut during = sidecars.clone();
            during.add(&r);
            init_peak.max_with(&during);
        }
    }
    let mut total = ResourceList::default();
    for c in &spec.containers {
        total.add(&container(c));
    }
    total.add(&sidecars);
    total.max_with(&init_peak);
    total.add(&ResourceList::from_api(spec.overhead.as_ref()));
    total.0.retain(|_, v| *v != 0);
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    #[test]
    fn every_resource_with_the_init_sidecar_and_overhead_rules() {
        // NodeResourcesFit's own example: init containers need what the largest of them needs
        // (with the sidecars started before it), regular containers their sum plus sidecars.
        let p = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [
                {"name": "i1", "image": "x", "resources": {"requests": {"cpu": "2", "memory": "1Gi", "example.com/foo": "3"}}},
                {"name": "sc", "image": "x", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m", "nvidia.com/gpu": "1"}}},
                {"name": "i2", "image": "x", "resources": {"requests": {"cpu": "500m", "ephemeral-storage": "1Gi"}}}
            ],
            "containers": [
                {"name": "a", "image": "x", "resources": {"requests": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"}}},
                {"name": "b", "image": "x", "resources": {"limits": {"cpu": "250m", "memory": "128Mi"}}}
            ],
            "overhead": {"cpu": "10m", "memory": "1Mi"}
        }}));
        let r = pod_requests(&p);
        assert_eq!(r.get("cpu"), 2010, "the first init container's 2 cpu dominates, plus overhead");
        assert_eq!(r.get("memory"), 2 * 1024 * 1024 * 1024 + 128 * 1024 * 1024 + 1024 * 1024);
        assert_eq!(r.get("nvidia.com/gpu"), 2, "the sidecar's gpu adds to the regular containers'");
        assert_eq!(r.get("example.com/foo"), 3);
        assert_eq!(r.get("ephemeral-storage"), 1024 * 1024 * 1024);
        let nothing = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}));
        assert!(pod_requests(&nothing).0.is_empty(), "a pod that requests nothing requests nothing");
    }

    #[test]
    fn zero_requests_are_never_short() {
        let want = ResourceList([("cpu".to_string(), 500), ("nvidia.com/gpu".to_string(), 0)].into());
        let free = ResourceList([("cpu".to_string(), 1000)].into());
        assert_eq!(want.first_short(&free), None);
        let gpu = ResourceList([("nvidia.com/gpu".to_string(), 1)].into());
        assert_eq!(gpu.first_short(&free), Some(("nvidia.com/gpu", 1, 0)), "a node without the extended resource has none");
    }
}
