//! The comparison's workloads and NodePools: the comparison's own three (issue #29) and
//! Karpenter's performance suites (`test/suites/performance` at v1.15.0, read from v1.14.1 =
//! 6e7eab7a0f, whose shapes and thresholds are the same), each with Karpenter's own thresholds.

use archer::core::packer::Offering;
use serde_json::{json, Value};

/// The NodePool both sides run (`tests/e2e/karpenter-compare --pool`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PoolKind {
    /// Every instance type of the catalog.
    All,
    /// Karpenter's getting-started NodePool: `karpenter.k8s.aws/instance-category In [c, m, r]`,
    /// `karpenter.k8s.aws/instance-generation Gt 2`.
    GettingStarted,
}

impl PoolKind {
    pub fn parse(s: &str) -> Option<PoolKind> {
        match s {
            "all" => Some(PoolKind::All),
            "getting-started" => Some(PoolKind::GettingStarted),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PoolKind::All => "all",
            PoolKind::GettingStarted => "getting-started",
        }
    }
}

/// Karpenter's perf suites keep KWOK types under 32 CPUs (`karpenter.kwok.sh/instance-size Lt
/// 32`); the catalog's equivalent is `karpenter.k8s.aws/instance-cpu Lt 32`.
const SUITE_MAX_CPU: u32 = 32;

/// Whether an offering is one the pool allows: what Karpenter's kwok provider is given, so
/// Archer's requirements ([`NodePoolShape::requirements`]) and Karpenter's types select alike.
pub fn keeps(kind: PoolKind, suite: bool, o: &Offering) -> bool {
    let t = &o.instance;
    let category = match kind {
        PoolKind::All => true,
        PoolKind::GettingStarted => ["c", "m", "r"].contains(&t.category.as_str()) && t.generation > 2,
    };
    let suite_ok = !suite || (t.vcpu < SUITE_MAX_CPU && o.capacity.as_str() == "on-demand");
    category && suite_ok
}

/// The NodePool of one run, written for both provisioners.
pub struct NodePoolShape {
    pub kind: PoolKind,
    /// Karpenter's perf-suite pool (on-demand, under 32 CPUs, consolidateAfter 30s, budgets
    /// 100%, expireAfter Never); else the comparison's (on-demand and spot, consolidateAfter 5s,
    /// the default budget of 10%).
    pub suite: bool,
}

impl NodePoolShape {
    fn requirements(&self) -> Vec<Value> {
        let mut r = vec![
            json!({"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}),
            json!({"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}),
        ];
        r.push(if self.suite {
            json!({"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]})
        } else {
            json!({"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand", "spot"]})
        });
        r
    }

    /// Requirements only Archer's pool states (Karpenter's kwok types carry no EC2 labels:
    /// [`keeps`] filters what it is given instead).
    fn archer_requirements(&self) -> Vec<Value> {
        let mut r = Vec::new();
        if self.kind == PoolKind::GettingStarted {
            r.push(json!({"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["c", "m", "r"]}));
            r.push(json!({"key": "karpenter.k8s.aws/instance-generation", "operator": "Gt", "values": ["2"]}));
        }
        if self.suite {
            r.push(json!({"key": "karpenter.k8s.aws/instance-cpu", "operator": "Lt", "values": [SUITE_MAX_CPU.to_string()]}));
        }
        r
    }

    fn disruption(&self) -> Value {
        if self.suite {
            json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "30s", "budgets": [{"nodes": "100%"}]})
        } else {
            json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "5s"})
        }
    }

    fn template_spec(&self, requirements: Vec<Value>) -> Value {
        let mut spec = json!({"requirements": requirements});
        if self.suite {
            spec["expireAfter"] = json!("Never");
        }
        spec
    }

    pub fn keep(&self) -> Box<dyn Fn(&Offering) -> bool + Send + Sync> {
        let (kind, suite) = (self.kind, self.suite);
        Box::new(move |o| keeps(kind, suite, o))
    }

    /// Archer's `archer.dev/v1alpha1` NodePool `default`.
    pub fn archer(&self) -> Value {
        let mut req = self.requirements();
        req.extend(self.archer_requirements());
        json!({
            "apiVersion": "archer.dev/v1alpha1", "kind": "NodePool", "metadata": {"name": "default"},
            "spec": {"template": {"spec": self.template_spec(req)}, "disruption": self.disruption()}
        })
    }

    /// Karpenter's `karpenter.sh/v1` NodePool `default` on the KWOKNodeClass `default`.
    pub fn karpenter(&self) -> Value {
        let mut spec = self.template_spec(self.requirements());
        spec["nodeClassRef"] = json!({"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"});
        json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
            "spec": {"template": {"spec": spec}, "disruption": self.disruption()}
        })
    }
}

/// A Deployment of a workload.
pub struct App {
    pub name: String,
    pub repo: &'static str,
    pub archs: &'static [&'static str],
    pub replicas: i32,
    /// Replicas after the scale-down (workloads that scale down).
    pub scale_to: i32,
    pub cpu: &'static str,
    pub memory: &'static str,
    /// Extra pod spec.
    pub spec: Value,
    /// Pod annotations.
    pub annotations: Value,
}

/// What follows the scale-out.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Then {
    Nothing,
    /// Scale every Deployment to its `scale_to` and wait for the node set to settle.
    ScaleDown,
    /// Change the NodePool's template annotation `test-drift-trigger` (what Karpenter's drift
    /// suite does) so every node drifts; wait for every pod Running on replaced nodes.
    Drift,
}

/// Karpenter's limits for one phase of a suite (None: not asserted by the suite).
#[derive(Clone, Copy, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    pub seconds: Option<f64>,
    pub cpu_utilisation: Option<f64>,
    pub memory_utilisation: Option<f64>,
    #[serde(rename = "p95MemoryMiB")]
    pub p95_memory_mib: f64,
    pub average_cores: f64,
}

const fn limits(seconds: Option<f64>, util: Option<(f64, f64)>, p95_memory_mib: f64, average_cores: f64) -> Limits {
    let (cpu_utilisation, memory_utilisation) = match util {
        Some((c, m)) => (Some(c), Some(m)),
        None => (None, None),
    };
    Limits { seconds, cpu_utilisation, memory_utilisation, p95_memory_mib, average_cores }
}

/// A suite's thresholds: the scale-out, then the scale-down's consolidation or the drift.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Threshold {
    pub suite: &'static str,
    #[serde(rename = "scaleOut")]
    pub out: Limits,
    #[serde(rename = "then", skip_serializing_if = "Option::is_none")]
    pub then: Option<Limits>,
}

pub struct Workload {
    pub name: &'static str,
    pub apps: Vec<App>,
    pub then: Then,
    /// Karpenter's perf-suite NodePool (see [`NodePoolShape::suite`]).
    pub suite_pool: bool,
    pub threshold: Option<Threshold>,
}

const MIN: f64 = 60.0;

/// basic_test.go: scale-out < 2m, utilisation > 0.53 cpu / 0.65 memory, P95 < 260 MB, < 0.50
/// cores; consolidation to 700 < 20m, 260 MB, 0.25 cores.
const BASIC: Threshold = Threshold { suite: "basic", out: limits(Some(2.0 * MIN), Some((0.53, 0.65)), 260.0, 0.50), then: Some(limits(Some(20.0 * MIN), None, 260.0, 0.25)) };
/// host_name_spreading_test.go.
const HOSTNAME: Threshold = Threshold { suite: "hostname spreading", out: limits(Some(5.0 * MIN), Some((0.38, 0.40)), 680.0, 1.15), then: Some(limits(None, Some((0.38, 0.40)), 575.0, 1.00)) };
/// wide_deployments_test.go.
const WIDE: Threshold = Threshold { suite: "wide deployments", out: limits(Some(5.0 * MIN), Some((0.20, 0.20)), 370.0, 0.70), then: Some(limits(Some(40.0 * MIN), Some((0.20, 0.20)), 340.0, 0.30)) };
/// do_no_disrupt_test.go.
const DO_NOT_DISRUPT: Threshold = Threshold { suite: "do-not-disrupt", out: limits(Some(4.0 * MIN), Some((0.38, 0.40)), 645.0, 1.10), then: Some(limits(Some(35.0 * MIN), Some((0.38, 0.40)), 585.0, 0.80)) };
/// drift_performance_test.go.
const DRIFT: Threshold = Threshold { suite: "drift", out: limits(Some(5.0 * MIN), None, 425.0, 0.70), then: Some(limits(Some(50.0 * MIN), None, 470.0, 1.05)) };

fn spread(key: &str, app: &str) -> Value {
    json!({"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": app}}})
}

fn anti(app: &str) -> Value {
    json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": app}}}]}})
}

const MULTI: &[&str] = &["amd64", "arm64"];

#[allow(clippy::too_many_arguments, reason = "a table row")]
fn app(name: &str, replicas: i32, scale_to: i32, cpu: &'static str, memory: &'static str, spec: Value, annotations: Value, scale: f64) -> App {
    let n = |r: i32| ((f64::from(r) * scale).round() as i32).max(1);
    App { name: name.to_string(), repo: "apps/perf", archs: MULTI, replicas: n(replicas), scale_to: n(scale_to), cpu, memory, spec, annotations }
}

/// Every workload; replicas scaled by `scale` (1.0: the suites' own sizes; ARCHER_COMPARE_PODS /
/// 1000 for a smaller run).
pub fn workloads(scale: f64) -> Vec<Workload> {
    let none = || json!({});
    let hostname = |a: &str| json!({"topologySpreadConstraints": [spread("kubernetes.io/hostname", a)]});
    let basic = |name: &'static str, then: Then| Workload {
        name,
        apps: vec![app("small", 500, 350, "900m", "3100Mi", none(), none(), scale), app("large", 500, 350, "3500m", "28Gi", none(), none(), scale)],
        then,
        suite_pool: false,
        threshold: Some(BASIC),
    };
    let shop = |name: &str, repo: &'static str, archs: &'static [&'static str], replicas: i32, cpu: &'static str, memory: &'static str, spec: Value| App {
        name: name.to_string(),
        repo,
        archs,
        replicas,
        scale_to: replicas,
        cpu,
        memory,
        spec,
        annotations: json!({}),
    };
    let zone = |a: &str| json!({"topologySpreadConstraints": [spread("topology.kubernetes.io/zone", a)]});
    let mixed = Workload {
        name: "mixed",
        apps: vec![
            shop("web", "apps/web", MULTI, 30, "500m", "1Gi", zone("web")),
            shop("legacy", "apps/legacy", &["amd64"], 20, "1", "2Gi", json!({})),
            shop("ml", "apps/ml", &["arm64"], 10, "2", "4Gi", json!({})),
            shop("db", "apps/db", &["amd64"], 3, "1", "4Gi", json!({"affinity": anti("db")})),
            shop("cache", "apps/cache", MULTI, 6, "250m", "512Mi", zone("cache")),
        ],
        then: Then::Nothing,
        suite_pool: false,
        threshold: None,
    };
    // wide_deployments_test.go: 30 Deployments, zone spread on all, hostname anti-affinity on
    // 1-3, hostname spread on 4-6; 35 replicas (1-20) or 30 (21-30), then 25 or 20.
    const WIDE_CPU: [&str; 30] = [
        "240m", "450m", "650m", "900m", "1400m", "1900m", "2400m", "2800m", "3300m", "3700m", "2300m", "900m", "1300m", "2800m", "1800m", "1850m", "3300m", "3800m", "225m", "450m", "700m", "900m", "1300m", "1800m", "2400m", "2800m", "3400m", "3800m", "3300m", "2800m",
    ];
    const WIDE_MEMORY: [&str; 30] = [
        "300Mi", "400Mi", "700Mi", "1Gi", "2Gi", "4Gi", "8Gi", "4Gi", "16Gi", "10Gi", "64Gi", "30Gi", "32Gi", "32Gi", "30Gi", "20Gi", "30Gi", "300Mi", "500Mi", "750Mi", "1Gi", "2Gi", "4Gi", "8Gi", "16Gi", "32Gi", "28Gi", "64Gi", "13Gi", "24Gi",
    ];
    let wide_apps = (0..30)
        .map(|i| {
            let name = format!("wide-deployment-{}", i + 1);
            let mut spec = json!({"topologySpreadConstraints": [spread("topology.kubernetes.io/zone", &name)]});
            if i < 3 {
                spec["affinity"] = anti(&name);
            } else if i < 6 {
                spec["topologySpreadConstraints"] = json!([spread("topology.kubernetes.io/zone", &name), spread("kubernetes.io/hostname", &name)]);
            }
            let (replicas, scale_to) = if i < 20 { (35, 25) } else { (30, 20) };
            app(&name, replicas, scale_to, WIDE_CPU[i], WIDE_MEMORY[i], spec, json!({}), scale)
        })
        .collect();
    let dnd = json!({"karpenter.sh/do-not-disrupt": "true"});
    vec![
        basic("perf", Then::Nothing),
        mixed,
        basic("consolidation", Then::ScaleDown),
        Workload {
            name: "hostname-spread",
            apps: vec![app("small", 500, 350, "900m", "3100Mi", hostname("small"), none(), scale), app("large", 500, 350, "3500m", "28Gi", none(), none(), scale)],
            then: Then::ScaleDown,
            suite_pool: true,
            threshold: Some(HOSTNAME),
        },
        Workload { name: "wide-deployments", apps: wide_apps, then: Then::ScaleDown, suite_pool: true, threshold: Some(WIDE) },
        Workload {
            name: "do-not-disrupt",
            apps: vec![
                app("small", 500, 250, "900m", "3100Mi", hostname("small"), none(), scale),
                app("large", 500, 250, "3500m", "28Gi", none(), none(), scale),
                app("do-not-disrupt", 100, 100, "900m", "450Mi", none(), dnd, scale),
            ],
            then: Then::ScaleDown,
            suite_pool: true,
            threshold: Some(DO_NOT_DISRUPT),
        },
        Workload {
            name: "drift",
            apps: vec![app("hostname-spread", 300, 300, "900m", "3100Mi", hostname("hostname-spread"), none(), scale), app("standard", 300, 300, "3500m", "28Gi", none(), none(), scale)],
            then: Then::Drift,
            suite_pool: true,
            threshold: Some(DRIFT),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suites_have_karpenters_sizes() {
        let w = workloads(1.0);
        let total = |name: &str| w.iter().find(|w| w.name == name).map(|w| (w.apps.iter().map(|a| a.replicas).sum::<i32>(), w.apps.iter().map(|a| a.scale_to).sum::<i32>()));
        assert_eq!(total("perf"), Some((1000, 700)));
        assert_eq!(total("hostname-spread"), Some((1000, 700)));
        assert_eq!(total("wide-deployments"), Some((1000, 700)));
        assert_eq!(total("do-not-disrupt"), Some((1100, 600)));
        assert_eq!(total("drift"), Some((600, 600)));
    }

    #[test]
    fn getting_started_keeps_c_m_r_after_generation_2_on_both_sides() {
        let catalog = archer::catalog::Catalog::embedded().expect("catalog");
        let zones: Vec<String> = crate::karpenter::ZONES.iter().map(|z| z.to_string()).collect();
        let offerings = archer::provisioner::nodepool::offerings(&catalog, &zones);
        let kept: Vec<&Offering> = offerings.iter().filter(|o| keeps(PoolKind::GettingStarted, false, o)).collect();
        assert!(!kept.is_empty() && kept.len() < offerings.len());
        assert!(kept.iter().all(|o| ["c", "m", "r"].contains(&o.instance.category.as_str()) && o.instance.generation > 2));
        assert!(!kept.iter().any(|o| o.instance.name.starts_with("u7i") || o.instance.name.starts_with("m1.")));
        // Archer's pool says the same in requirements its planner reads.
        let shape = NodePoolShape { kind: PoolKind::GettingStarted, suite: true };
        let pool = shape.archer();
        let keys: Vec<&str> = pool["spec"]["template"]["spec"]["requirements"].as_array().expect("reqs").iter().filter_map(|r| r["key"].as_str()).collect();
        assert!(keys.contains(&"karpenter.k8s.aws/instance-category") && keys.contains(&"karpenter.k8s.aws/instance-generation") && keys.contains(&"karpenter.k8s.aws/instance-cpu"));
        assert!(offerings.iter().filter(|o| keeps(PoolKind::GettingStarted, true, o)).all(|o| o.instance.vcpu < 32 && o.capacity.as_str() == "on-demand"));
    }
}
