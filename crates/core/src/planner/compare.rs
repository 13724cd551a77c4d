//! The counterfactual: what the same pods would cost without arm64, and without spot either.
//! One pure function, read by `archer simulate --compare` and by the live savings metrics, so the
//! two can never disagree.

use super::super::labels;
use super::super::packer::{Offering, Plan, Pool};
use super::super::sched::Snapshot;
use super::{plan_batch, Pending};

/// Three plans of the same pods: as the pools allow, with arm64 forbidden, and with arm64 and
/// spot forbidden (amd64 on-demand, the baseline).
#[derive(Debug, Clone)]
pub struct Comparison {
    pub with_arm64: Plan,
    pub without_arm64: Plan,
    pub amd64_on_demand: Plan,
    /// Pods left out of all three: the baseline cannot place them (they need arm64 or spot), so
    /// the comparison stays like for like.
    pub left_out: Vec<String>,
}

impl Comparison {
    /// Per hour, what arm64 saves: the plan without arm64 less the plan with it.
    pub fn arm64_saving(&self) -> f64 {
        self.without_arm64.total_price_per_hour - self.with_arm64.total_price_per_hour
    }

    /// Per hour, what spot saves on top: amd64 on-demand less amd64 as the pools allow.
    pub fn spot_saving(&self) -> f64 {
        self.amd64_on_demand.total_price_per_hour - self.without_arm64.total_price_per_hour
    }

    pub fn baseline(&self) -> f64 {
        self.amd64_on_demand.total_price_per_hour
    }
}

fn restricted(pools: &[Pool], key: &str, operator: &str, values: &[&str]) -> Vec<Pool> {
    let values: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    pools
        .iter()
        .cloned()
        .map(|mut p| {
            // A pool whose own requirements contradict this one places nothing (its requirements
            // keep the contradiction), which is what the restriction means.
            let _ = p.requirements.add(key, operator, &values);
            p
        })
        .collect()
}

/// Plan `pods` on `snapshot` three ways (see [`Comparison`]). `on_amd64` are the same pods as
/// their owners would write them to run on amd64 (a pod its own constraints pin to arm64,
/// rewritten: `archer_model::counterfactual`; every other pod as it is), with the same ids: the
/// plans without arm64 place those.
pub fn compare(snapshot: &Snapshot, pods: &[Pending], on_amd64: &[Pending], pools: &[Pool], offerings: &[Offering]) -> Comparison {
    let amd64 = restricted(pools, labels::ARCH, "NotIn", &["arm64"]);
    let on_demand = restricted(&amd64, labels::KARPENTER_CAPACITY_TYPE, "In", &["on-demand"]);
    let baseline = plan_batch(snapshot, on_amd64, &on_demand, offerings);
    let left_out: std::collections::BTreeSet<&str> = baseline.unschedulable.iter().map(|u| u.pod.as_str()).collect();
    let placed = |list: &[Pending]| -> Vec<Pending> { list.iter().filter(|p| !left_out.contains(p.packer.id.as_str())).cloned().collect() };
    let (common, common_amd64) = (placed(pods), placed(on_amd64));
    Comparison {
        with_arm64: plan_batch(snapshot, &common, pools, offerings),
        without_arm64: plan_batch(snapshot, &common_amd64, &amd64, offerings),
        left_out: left_out.iter().map(|s| s.to_string()).collect(),
        amd64_on_demand: baseline,
    }
}
