use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde_json::json;

use super::output::Output;
use super::RegistryArgs;
use archer_core::catalog::Catalog;
use archer_core::labels;
use archer_core::packer::Plan;
use archer_core::planner::compare::Comparison;
use archer_core::planner::plan_batch;
use archer_core::words::{count, usd, usd_whole};
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
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Exit with status 3 when the plan leaves any pod unschedulable (after printing it), so a
    /// pipeline can gate on it.
    #[arg(long)]
    pub fail_on_unschedulable: bool,
    /// A field of the scenario's objects that their type does not have (a misspelt `wieght`) is
    /// an error; without it, a warning on standard error.
    #[arg(long)]
    pub strict: bool,
}

/// The exit status of `--fail-on-unschedulable` when a pod is left unschedulable (1 is an
/// error, 2 a usage error).
pub const UNSCHEDULABLE_EXIT: u8 = 3;

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
    println!("\nDisruption: {}", count(decisions.len(), "decision"));
    for d in decisions {
        println!("  pool {}: {} {} (saves {}/hour)", d.pool, d.reason, d.nodes.join(", "), usd(d.saving_per_hour));
        for n in &d.replacements {
            println!("    replacement {} {} {} {} {}/hour: {}", n.instance_type, n.arch, n.zone, n.capacity_type, usd(n.price_per_hour), n.pods.join(", "));
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
    json!({"pods": pods_in(plan), "nodes": plan.nodes, "existing": existing, "unschedulable": plan.unschedulable, "totalPricePerHour": round(plan.total_price_per_hour), "lowerBoundPerHour": bound})
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
        format!("at the lower bound ({}/hour): no plan is cheaper", usd(bound))
    } else {
        format!("within {gap:.1}% of the lower bound ({}/hour): no plan for these pods costs less than the bound", usd(bound))
    })
}

/// Six decimals, and never `-0.0` (an empty plan's sum).
fn round(p: f64) -> f64 {
    archer_core::words::money((p * 1e6).round() / 1e6)
}

/// The pods a plan is for: those on its new nodes, on nodes already there, and unschedulable.
fn pods_in(plan: &Plan) -> usize {
    plan.nodes.iter().map(|n| n.pods.len()).sum::<usize>() + plan.existing.len() + plan.unschedulable.len()
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

/// `title`, then what the plan does with its pods: `for 40 pods: 12 new nodes, $0.5136/hour (2
/// pods unschedulable)`.
fn print_plan(title: &str, plan: &Plan, elsewhere: &BTreeMap<String, String>, default_region: &str) {
    let unschedulable = match plan.unschedulable.len() {
        0 => String::new(),
        n => format!(" ({} unschedulable)", count(n, "pod")),
    };
    println!("{title} for {}: {}, {}/hour{unschedulable}", count(pods_in(plan), "pod"), count(plan.nodes.len(), "new node"), usd(plan.total_price_per_hour));
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
                "  {:<wn$} {:<wp$} {:<wt$} {:<6} {:<11} {:<10} {:>8}  {}{}",
                n.name, n.pool, n.instance_type, n.arch, n.zone, n.capacity_type, usd(n.price_per_hour).trim_start_matches('$'), n.pods.join(", "), elsewhere_suffix(elsewhere, &n.zone, default_region)
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

/// The comparison, over the same pods in each of its plans, and saying which pods those are
/// against the headline plan's.
fn print_comparison(c: &Comparison, plan: &Plan, elsewhere: &BTreeMap<String, String>, default_region: &str) {
    let same = pods_in(&c.with_arm64);
    println!();
    print_plan("With arm64 forbidden", &c.without_arm64, elsewhere, default_region);
    let all = pods_in(plan);
    if c.left_out.is_empty() {
        println!("\nComparison over the same {} as the plan:", count(same, "pod"));
    } else {
        let nowhere: std::collections::BTreeSet<&str> = plan.unschedulable.iter().map(|u| u.pod.as_str()).collect();
        let (unplaced, need): (Vec<&str>, Vec<&str>) = c.left_out.iter().map(String::as_str).partition(|p| nowhere.contains(p));
        let mut why = Vec::new();
        if !need.is_empty() {
            why.push(format!("{} only arm64 or spot can run ({})", count(need.len(), "pod"), need.join(", ")));
        }
        if !unplaced.is_empty() {
            why.push(format!("{} no plan can place ({})", count(unplaced.len(), "pod"), unplaced.join(", ")));
        }
        println!("\nComparison over the same {} in every line: the plan's {all} less {}:", count(same, "pod"), why.join(" and "));
    }
    // The pods left out are in none of the lines (a plan may still list them as unschedulable).
    let line = |what: &str, p: &Plan| {
        let stuck = p.unschedulable.iter().filter(|u| !c.left_out.contains(&u.pod)).count();
        let unschedulable = if stuck == 0 { String::new() } else { format!(", {} unschedulable", count(stuck, "pod")) };
        println!("  {what:<24} {}/hour ({}{unschedulable})", usd(p.total_price_per_hour), count(p.nodes.len(), "new node"));
    };
    line("with arm64:", &c.with_arm64);
    line("with arm64 forbidden:", &c.without_arm64);
    line("amd64 on-demand only:", &c.amd64_on_demand);
    // Compared and shown as printed, to the cent's hundredth: a saving that prints as $0.0000 is
    // none, and a share that rounds to 0.0% is not shown.
    let printed = |x: f64| archer_core::words::money((x * 1e4).round() / 1e4);
    let (arm64, spot, baseline) = (printed(c.arm64_saving()), printed(c.spot_saving()), c.baseline());
    let share = |saving: f64, of: f64| {
        let pct = if of > 0.0 { (1000.0 * saving / of).round() / 10.0 } else { 0.0 };
        if pct == 0.0 { String::new() } else { format!(" ({pct:.1}%)") }
    };
    println!("Multi-arch placement saves {}/hour{}, {}/month.", usd(arm64), share(arm64, c.without_arm64.total_price_per_hour), usd_whole(arm64 * 730.0));
    if spot == 0.0 {
        println!("Spot saves nothing more on these pods; against amd64 on-demand the saving in all is {}/month.", usd_whole(arm64 * 730.0));
    } else if spot < 0.0 {
        println!(
            "Spot saves nothing here: amd64 on-demand alone costs {}/hour, {}/hour less than amd64 with the pools' capacity types (the pods' constraints place them differently).",
            usd(baseline),
            usd(-spot)
        );
    } else {
        println!("Spot saves {}/hour more{}; against amd64 on-demand ({}/hour) the saving in all is {}/month.", usd(spot), share(spot, baseline), usd(baseline), usd_whole((arm64 + spot) * 730.0));
    }
}

pub async fn run(args: SimulateArgs) -> anyhow::Result<ExitCode> {
    let SimulateArgs { scenario, catalog, registry, offline, compare, disruption: disrupt, output, fail_on_unschedulable, strict } = args;
    let text = std::fs::read_to_string(&scenario).with_context(|| format!("reading {}", scenario.display()))?;
    let mut s = Scenario::parse(&text).with_context(|| format!("reading the scenario {}", scenario.display()))?;
    super::unknown_fields(strict, &s.unknown_fields)?;
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
            let progress = super::progress::Progress::spinner(&format!("inspecting {}", count(images.len(), "image")));
            let results = inspector.inspect_each(&images, &keyring).await;
            progress.finish();
            for (image, r) in images.iter().zip(results) {
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
        notes.push(format!("{} with unknown image platforms {} assumed to run on any architecture", count(inputs.assumed, "pod"), if inputs.assumed == 1 { "was" } else { "were" }));
    }
    let decisions = if disrupt { Some(disruption(&s, &inputs, cfg.provisioner.preference_policy, &mut notes)) } else { None };
    let archer_model::scenario::Inputs { pending: pods, pools, offerings: offers, snapshot, on_amd64, .. } = inputs;
    let progress = super::progress::Progress::spinner(&format!("planning {}{}", count(pods.len(), "pod"), if compare { ", four ways" } else { "" }));
    let plan = plan_batch(&snapshot, &pods, &pools, &offers);
    // The comparison is over the pods every plan can place: pods that need arm64 (or spot) are
    // left out of all of them (and listed), so the saving is like for like. The live savings
    // metrics read the same function.
    let comparison = compare.then(|| archer_core::planner::compare::compare(&snapshot, &pods, &on_amd64, &pools, &offers));
    progress.finish();

    match output {
        Output::Json | Output::Yaml => {
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
            output.print(&doc)?;
        }
        Output::Text => {
            print_plan("Plan", &plan, &elsewhere, &catalog.default_region);
            if let Some(c) = &comparison {
                print_comparison(c, &plan, &elsewhere, &catalog.default_region);
            }
            if let Some(d) = &decisions {
                print_disruption(d);
            }
            for n in &notes {
                println!("note: {n}");
            }
        }
    }
    if fail_on_unschedulable && !plan.unschedulable.is_empty() {
        eprintln!("{} unschedulable (--fail-on-unschedulable)", count(plan.unschedulable.len(), "pod"));
        return Ok(ExitCode::from(UNSCHEDULABLE_EXIT));
    }
    Ok(ExitCode::SUCCESS)
}
