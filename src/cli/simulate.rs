use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde_json::json;

use super::inspect::Output;
use super::RegistryArgs;
use archer_core::catalog::Catalog;
use archer_core::labels;
use archer_core::packer::Plan;
use archer_core::planner::plan_batch;
use crate::provisioner::consolidation::{self, Decision};
use archer_model::scenario::{all_images, Scenario};

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Kubernetes YAML: Deployments, Pods, NodePools, existing Nodes.
    #[arg(long)]
    pub scenario: PathBuf,
    /// A user price catalog (YAML or CSV) on top of the embedded one.
    #[arg(long, env = "ARCHER_CATALOG")]
    pub catalog: Option<PathBuf>,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Do not contact registries: images without an archer.dev/platforms annotation are assumed
    /// to run anywhere (and the plan says so).
    #[arg(long)]
    pub offline: bool,
    /// Also plan with arm64 forbidden, to show what multi-arch placement saves.
    #[arg(long)]
    pub compare: bool,
    /// Also print what consolidation would do to the scenario's nodes (which nodes go, why, what
    /// replaces them, the saving), as if every node had been stable for `consolidateAfter`.
    #[arg(long)]
    pub disruption: bool,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Consolidation's decisions on the scenario's nodes, per pool: empty nodes first, else the best
/// underutilised set, within the pool's budgets. Nodes are the pool's by their
/// `archer.dev/nodepool` or `karpenter.sh/nodepool` label; the scenario is read as if Archer had
/// launched them ([`Scenario::as_launched`]: a claim each, priced by the catalog from the node's
/// instance type, zone and capacity type), and the candidates are the worker's
/// ([`archer_model::disruption::candidates`]), every node taken as long settled.
fn disruption(s: &Scenario, inputs: &crate::provisioner::scenario::Inputs, preferences: archer_core::sched::preferences::Policy, notes: &mut Vec<String>) -> Vec<Decision> {
    use crate::provisioner::objects::{labels_of, node_leaving, node_pool_of, DisruptionSettings};
    let volumes = s.state.volumes();
    let world = consolidation::World { state: &s.state, pools: &inputs.pools, volumes: &volumes, budget: archer_core::packer::DEFAULT_BUDGET, preferences };
    let launched = s.as_launched(&inputs.offerings);
    let search = consolidation::Search::exhaustive(crate::config::ProvisionerConfig::default().min_saving_fraction());
    let mut out = Vec::new();
    for np in &s.state.pools {
        let pool = np.name();
        let settings = match DisruptionSettings::of(np) {
            Ok(x) => x,
            Err(e) => {
                notes.push(format!("NodePool {pool}: disruption settings unusable ({e}); its nodes are left alone"));
                continue;
            }
        };
        let offered = |n: &k8s_openapi::api::core::v1::Node| {
            let l = labels_of(n);
            archer_core::packer::Offering::of_node(&inputs.offerings, &|k| l.get(k).cloned()).is_some()
        };
        for n in s.state.nodes.iter().filter(|n| node_pool_of(n) == Some(pool.as_str()) && !node_leaving(n) && !offered(n)) {
            let l = labels_of(n);
            let get = |k: &str| l.get(k).cloned().unwrap_or_default();
            let capacity = archer_core::instance::CapacityType::of_node(&|k| l.get(k).cloned()).as_str();
            notes.push(format!("node {} has no catalog price ({} {} {capacity}); left alone", n.metadata.name.as_deref().unwrap_or(""), get(labels::INSTANCE_TYPE), get(labels::ZONE)));
        }
        let nodes = archer_model::disruption::candidates(&launched, &pool, Duration::ZERO);
        // As if every node had been as it is for `consolidateAfter`.
        out.extend(consolidation::consolidate_pool(&world, &pool, &settings, &nodes, &|_| true, &|_| true, search));
    }
    out
}

fn print_disruption(decisions: &[Decision]) {
    println!("\nDisruption: {} decision(s)", decisions.len());
    for d in decisions {
        println!("  pool {}: {} {} (saves ${:.4}/hour)", d.pool, d.reason, d.nodes.join(", "), d.saving_per_hour);
        for n in &d.replacements {
            println!("    replacement {} {} {} {} ${:.4}/hour: {}", n.instance_type, n.arch, n.zone, n.capacity_type, n.price_per_hour, n.pods.join(", "));
        }
        for (pod, node) in &d.moves {
            println!("    {pod} -> {node}");
        }
    }
}

fn plan_json(plan: &Plan) -> serde_json::Value {
    // Pods placed on existing or in-flight nodes, grouped by node.
    let mut by_node: std::collections::BTreeMap<&str, Vec<&str>> = std::collections::BTreeMap::new();
    for (pod, node) in &plan.existing {
        by_node.entry(node).or_default().push(pod);
    }
    let existing: Vec<serde_json::Value> = by_node.into_iter().map(|(node, pods)| json!({"node": node, "pods": pods})).collect();
    let bound = (plan.lower_bound_per_hour > 0.0).then(|| round(plan.lower_bound_per_hour));
    json!({"nodes": plan.nodes, "existing": existing, "unschedulable": plan.unschedulable, "totalPricePerHour": round(plan.total_price_per_hour), "lowerBoundPerHour": bound})
}

/// How far the plan's new nodes are from the lower bound no plan can beat, for people.
fn bound_line(plan: &Plan) -> Option<String> {
    if plan.nodes.is_empty() {
        return None;
    }
    let bound = plan.lower_bound_per_hour;
    if bound <= 0.0 {
        return Some("lower bound: not known for this plan (the packer's time budget ran out, or some pods could not be placed)".into());
    }
    let gap = 100.0 * (plan.total_price_per_hour / bound - 1.0);
    Some(if gap < 0.05 {
        format!("at the lower bound (${bound:.4}/hour): no plan is cheaper")
    } else {
        format!("within {gap:.1}% of the lower bound (${bound:.4}/hour): no plan for these pods costs less than the bound")
    })
}

fn round(p: f64) -> f64 {
    (p * 1e6).round() / 1e6
}

/// Zones of the scenario's pools whose region the catalog has no prices in, with that region:
/// their offerings are priced in the catalog's default region, which every line that uses one
/// says (simulate plans on rather than refusing, and never silently).
fn priced_elsewhere(s: &Scenario, catalog: &Catalog) -> BTreeMap<String, String> {
    let known = catalog.regions();
    s.state
        .pools
        .iter()
        .flat_map(|np| np.zones())
        .filter_map(|z| {
            let region = archer_core::labels::region_of(&z).to_string();
            (!known.contains_key(&region)).then_some((z, region))
        })
        .collect()
}

/// What a plan's line says of a node priced in another region than its zone's.
fn elsewhere_suffix(elsewhere: &BTreeMap<String, String>, zone: &str, default_region: &str) -> String {
    match elsewhere.get(zone) {
        Some(region) => format!("  [priced as {default_region}: the catalog has no {region} prices; pass --catalog with them]"),
        None => String::new(),
    }
}

fn print_plan(title: &str, plan: &Plan, elsewhere: &BTreeMap<String, String>, default_region: &str) {
    println!("{title}: {} new node(s), ${:.4}/hour", plan.nodes.len(), plan.total_price_per_hour);
    if let Some(line) = bound_line(plan) {
        println!("  {line}");
    }
    if !plan.nodes.is_empty() {
        // Columns as wide as their longest value (Azure's size names are longer than EC2's).
        let width = |min: usize, f: &dyn Fn(&archer_core::packer::PlannedNode) -> usize| plan.nodes.iter().map(f).max().unwrap_or(0).max(min);
        let (wn, wp, wt) = (width(14, &|n| n.name.len()), width(10, &|n| n.pool.len()), width(14, &|n| n.instance_type.len()));
        println!("  {:<wn$} {:<wp$} {:<wt$} {:<6} {:<11} {:<10} {:>8}  PODS", "NODE", "POOL", "TYPE", "ARCH", "ZONE", "CAPACITY", "$/HOUR");
        for n in &plan.nodes {
            println!(
                "  {:<wn$} {:<wp$} {:<wt$} {:<6} {:<11} {:<10} {:>8.4}  {}{}",
                n.name, n.pool, n.instance_type, n.arch, n.zone, n.capacity_type, n.price_per_hour, n.pods.join(", "), elsewhere_suffix(elsewhere, &n.zone, default_region)
            );
        }
        // Values chosen for keys a pool's requirements leave open (`key In [a,b,c]`).
        for n in plan.nodes.iter().filter(|n| !n.labels.is_empty()) {
            let labels: Vec<String> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            println!("  {} labels: {}", n.name, labels.join(", "));
        }
    }
    for (pod, node) in &plan.existing {
        println!("  {pod} -> existing node {node}");
    }
    for u in &plan.unschedulable {
        println!("  unschedulable {}: {}", u.pod, u.reason);
    }
}

pub async fn run(args: SimulateArgs) -> anyhow::Result<ExitCode> {
    let SimulateArgs { scenario, catalog, registry, offline, compare, disruption: disrupt, output } = args;
    let text = std::fs::read_to_string(&scenario).with_context(|| format!("reading {}", scenario.display()))?;
    let mut s = Scenario::parse(&text)?;
    let cfg = registry.load()?;
    let catalog = Catalog::with_user_file(catalog.as_deref().or(cfg.catalog.as_deref()))?;
    let mut notes: Vec<String> = s.ignored.iter().map(|k| format!("ignored {k}")).collect();

    // Platforms: the pod's annotation, else the images (the webhook's lookup path), else unknown.
    let mut found = std::collections::BTreeMap::new();
    if !offline {
        // Pods that consolidation would move are inspected too.
        let mut all = s.pods.clone();
        if disrupt {
            all.extend(s.bound().map(|p| archer_model::scenario::ScenarioPod { id: archer_model::objects::pod_id(p), pod: p.clone() }));
        }
        let images = all_images(&all);
        if !images.is_empty() {
            let inspector = super::inspector(&cfg, crate::metrics::Metrics::new().registry.clone(), cfg.memory_budget())?;
            let keyring = super::base_keyring(&cfg)?;
            for (image, r) in images.iter().zip(inspector.inspect_each(&images, &keyring).await) {
                match r {
                    Ok(i) => {
                        found.insert(image.clone(), i.platforms.clone());
                    }
                    Err(e) => notes.push(format!("could not inspect {image} ({e}); assumed to run anywhere")),
                }
            }
        }
    }
    s.state.platforms = found;
    // Namespaces in the scenario resolve their policy over the config's defaults, as live; nodes
    // are priced by the one rule with this catalog.
    s.state.policy_defaults = std::sync::Arc::new(cfg.defaults.clone());
    s.state.catalog = Some(std::sync::Arc::new(catalog.clone()));
    let elsewhere = priced_elsewhere(&s, &catalog);
    for (zone, region) in &elsewhere {
        notes.push(format!("zone {zone}: the catalog has no {region} prices, so its nodes are priced as {}; pass --catalog with {region} prices", catalog.default_region));
    }
    let inputs = s.inputs(&catalog, cfg.provisioner.preference_policy)?;
    // NodeOverlays the plan's prices do not reflect as Karpenter's would, each said.
    for (name, outcome) in &s.state.overlay_outcomes {
        let (_, reason, message) = outcome.archer_applied();
        if reason != "Applied" {
            notes.push(format!("NodeOverlay {name}: not applied ({reason}){}", if message.is_empty() { String::new() } else { format!(": {message}") }));
        }
    }
    if inputs.assumed > 0 {
        notes.push(format!("{} pod(s) with unknown image platforms were assumed to run on any architecture", inputs.assumed));
    }
    let decisions = if disrupt { Some(disruption(&s, &inputs, cfg.provisioner.preference_policy, &mut notes)) } else { None };
    let archer_model::scenario::Inputs { pending: pods, pools, offerings: offers, snapshot, on_amd64, .. } = inputs;
    let plan = plan_batch(&snapshot, &pods, &pools, &offers);
    // The comparison is over the pods every plan can place: pods that need arm64 (or spot) are
    // left out of all of them (and listed), so the saving is like for like. The live savings
    // metrics read the same function.
    let comparison = compare.then(|| archer_core::planner::compare::compare(&snapshot, &pods, &on_amd64, &pools, &offers));

    match output {
        Output::Json => {
            let mut doc = serde_json::Map::new();
            if let serde_json::Value::Object(fields) = plan_json(&plan) {
                doc = fields;
            }
            if let Some(c) = &comparison {
                doc.insert("compare".into(), json!({
                    "withArm64": plan_json(&c.with_arm64),
                    "withoutArm64": plan_json(&c.without_arm64),
                    "amd64OnDemand": plan_json(&c.amd64_on_demand),
                    "savingsPerHour": round(c.arm64_saving()),
                    "spotSavingsPerHour": round(c.spot_saving()),
                    "baselinePerHour": round(c.baseline()),
                    "leftOut": c.left_out,
                }));
            }
            if let Some(d) = &decisions {
                doc.insert("disruption".into(), json!(d));
            }
            if !notes.is_empty() {
                doc.insert("notes".into(), json!(notes));
            }
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        Output::Text => {
            print_plan("Plan", &plan, &elsewhere, &catalog.default_region);
            if let Some(c) = &comparison {
                println!();
                print_plan("With arm64 forbidden", &c.without_arm64, &elsewhere, &catalog.default_region);
                let (with, without) = (c.with_arm64.total_price_per_hour, c.without_arm64.total_price_per_hour);
                let saved = c.arm64_saving();
                let pct = if without > 0.0 { 100.0 * saved / without } else { 0.0 };
                println!(
                    "\nFor the {} pod(s) every plan places: ${with:.4}/hour with arm64, ${without:.4}/hour without. Multi-arch placement saves ${saved:.4}/hour ({pct:.1}%), ${:.0}/month.",
                    c.with_arm64.nodes.iter().map(|n| n.pods.len()).sum::<usize>() + c.with_arm64.existing.len(),
                    saved * 730.0
                );
                println!(
                    "Against amd64 on-demand (${:.4}/hour), spot saves ${:.4}/hour more: ${:.0}/month in all.",
                    c.baseline(),
                    c.spot_saving(),
                    (c.arm64_saving() + c.spot_saving()) * 730.0
                );
                if !c.left_out.is_empty() {
                    println!("Left out of the comparison (need arm64 or spot): {}", c.left_out.join(", "));
                }
            }
            if let Some(d) = &decisions {
                print_disruption(d);
            }
            for n in &notes {
                println!("note: {n}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
