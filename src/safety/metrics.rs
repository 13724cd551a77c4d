//! The safety net's metric families.

use archer_metrics::Labels;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The safety net: exec format errors seen, re-placements, and the scheduling gate.
#[derive(Default)]
pub struct SafetyNetMetrics {
    /// `archer_exec_format_errors_total{namespace,arch}`: pods found failing for their binary's architecture.
    pub exec_format_errors: Family<Labels, Counter>,
    /// What was done about each, by outcome (evicted, bare_pod, disabled, already_replaced, ...).
    pub replacements: Family<Labels, Counter>,
    /// Pods held behind `archer.dev/inspecting` now.
    pub gated_pods: Gauge,
    /// Gates removed, by outcome (decided, bound, swept).
    pub gate_releases: Family<Labels, Counter>,
    /// 1 while this replica holds the safety net's lease.
    pub leader: Gauge,
    /// 1 while this replica campaigns for the safety net's lease (the safety net is on).
    pub candidate: Gauge,
    /// `archer_exec_format_learned_total{scope}`: broken pairs learned, for the failing pod's
    /// namespace only or (verified from the image) for every namespace.
    pub learned: Family<Labels, Counter>,
    /// `archer_exec_format_verifications_total{outcome}`: reads of a failing image's entrypoint
    /// binary (read, undetermined, error, timeout).
    pub verifications: Family<Labels, Counter>,
    /// `archer_safety_record_entries_dropped_total`: entries the record's byte bound pushed out.
    pub record_entries_dropped: Counter,
    /// `archer_exec_format_detections_dropped_total`: failing pods not queued (their namespace's
    /// share of the detector's queue was full); seen again at their next status change.
    pub detections_dropped: Counter,
    /// `archer_pod_evictions_total{reason}`: the drains' counter, registered by the provisioner
    /// and handed over, so the safety net's evictions count under `reason="exec_format_error"`.
    pub pod_evictions: Family<Labels, Counter>,
}

impl SafetyNetMetrics {
    /// The families, registered into `registry`; evictions count in `pod_evictions`, the
    /// provisioner's family of the same name.
    pub fn new(registry: &mut Registry, pod_evictions: Family<Labels, Counter>) -> Self {
        let m = SafetyNetMetrics { pod_evictions, ..Self::default() };
        m.register(registry);
        m
    }

    fn register(&self, root: &mut Registry) {
        root.register("exec_format_errors", "Pods admitted by Archer found failing with an exec format error, by namespace and the node's architecture", self.exec_format_errors.clone());
        root.register("exec_format_replacements", "What the safety net did about a pod failing with an exec format error, by outcome", self.replacements.clone());
        root.register("gated_pods", "Pods held behind the scheduling gate archer.dev/inspecting now", self.gated_pods.clone());
        root.register("gate_releases", "Scheduling gates archer.dev/inspecting removed, by outcome (decided, bound, swept)", self.gate_releases.clone());
        root.register("safety_net_leader", "1 while this replica holds the safety net's lease", self.leader.clone());
        root.register("safety_net_leader_candidate", "1 while this replica campaigns for the safety net's lease", self.candidate.clone());
        root.register("exec_format_learned", "Broken (digest, architecture) pairs learned, by scope: the failing pod's namespace, or every namespace when verified from the image", self.learned.clone());
        root.register("exec_format_verifications", "Reads of a failing image's entrypoint binary to verify an exec format error, by outcome", self.verifications.clone());
        root.register("safety_record_entries_dropped", "Entries of the safety net's record pushed out by its byte bound", self.record_entries_dropped.clone());
        root.register("exec_format_detections_dropped", "Failing pods not queued for the detector because their namespace's share was full", self.detections_dropped.clone());
    }
}
