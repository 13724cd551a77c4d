//! The same workload written for amd64, for the comparison (`archer simulate --compare` and the
//! savings metrics): a pod its own constraints pin to arm64 (a `kubernetes.io/arch: arm64`
//! nodeSelector, or required node-affinity `In` terms naming arm64 alone) is compared as the pod
//! its owner would write to run it on amd64, as Karpenter on Azure's arm64 workshop does by
//! editing its Deployment. Pods whose images do not run on amd64 are not rewritten: the
//! comparison leaves them out.

use k8s_openapi::api::core::v1::Pod;

use archer_core::labels::ARCH;
use archer_core::planner::Pending;
use archer_core::platform::PlatformSet;

/// `pod` rewritten for amd64 when its own constraints pin it to arm64 and its images (when known)
/// run on amd64; `None` otherwise (it is compared as it is).
pub(crate) fn on_amd64(pod: &Pod, platforms: Option<&PlatformSet>) -> Option<Pod> {
    if platforms.is_some_and(|p| !p.architectures().contains("amd64")) {
        return None;
    }
    let mut out = pod.clone();
    let spec = out.spec.as_mut()?;
    let mut pinned = false;
    if let Some(v) = spec.node_selector.as_mut().and_then(|s| s.get_mut(ARCH)).filter(|v| v.as_str() == "arm64") {
        *v = "amd64".into();
        pinned = true;
    }
    let required = spec.affinity.as_mut().and_then(|a| a.node_affinity.as_mut()).and_then(|n| n.required_during_scheduling_ignored_during_execution.as_mut());
    for term in required.into_iter().flat_map(|r| r.node_selector_terms.iter_mut()) {
        for e in term.match_expressions.iter_mut().flatten() {
            if e.key == ARCH && e.operator == "In" && e.values.as_deref() == Some(&["arm64".to_string()][..]) {
                e.values = Some(vec!["amd64".into()]);
                pinned = true;
            }
        }
    }
    pinned.then_some(out)
}

/// The comparison's pending pod for the amd64 plans: `pod` rewritten ([`on_amd64`]) and made by
/// `make` (the caller's adapter call) under `as_is`'s id when it is pinned to arm64; `as_is`
/// itself otherwise. Simulate and the savings metrics both build their lists with it.
pub fn pending_on_amd64(pod: &Pod, platforms: Option<&PlatformSet>, as_is: &Pending, make: impl FnOnce(&Pod) -> Pending) -> Pending {
    match on_amd64(pod, platforms) {
        Some(rewritten) => make(&rewritten).with_id(&as_is.packer.id),
        None => as_is.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).expect("pod")
    }

    #[test]
    fn an_arm64_pin_is_compared_as_the_same_pod_on_amd64() {
        let p = pod(json!({"nodeSelector": {"kubernetes.io/arch": "arm64", "aks-karpenter": "demo"}, "containers": []}));
        let amd = on_amd64(&p, None).expect("rewritten");
        let sel = amd.spec.and_then(|s| s.node_selector).expect("selector");
        assert_eq!(sel.get("kubernetes.io/arch").map(String::as_str), Some("amd64"));
        assert_eq!(sel.get("aks-karpenter").map(String::as_str), Some("demo"), "the rest stays");
        let affinity = pod(json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}]}]}}}, "containers": []}));
        let rewritten = serde_json::to_value(on_amd64(&affinity, None).expect("rewritten")).expect("json");
        assert_eq!(rewritten["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"], json!(["amd64"]));
    }

    #[test]
    fn unpinned_pods_and_arm64_only_images_are_left_as_they_are() {
        assert!(on_amd64(&pod(json!({"containers": []})), None).is_none(), "not pinned");
        let either = pod(json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64", "amd64"]}]}]}}}, "containers": []}));
        assert!(on_amd64(&either, None).is_none(), "already allows amd64");
        let pinned = pod(json!({"nodeSelector": {"kubernetes.io/arch": "arm64"}, "containers": []}));
        let arm_only: PlatformSet = ["linux/arm64".parse().expect("platform")].into_iter().collect();
        assert!(on_amd64(&pinned, Some(&arm_only)).is_none(), "its images do not run on amd64");
    }
}
