use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use serde_json::json;

use super::inspect::Output;
use super::RegistryArgs;
use crate::catalog::Catalog;
use crate::core::labels;
use crate::core::packer::{Plan, Pool};
use crate::core::planner::plan_batch;
use crate::metrics::Metrics;
use crate::provisioner::scenario::{all_images, Scenario};

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
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

fn plan_json(plan: &Plan) -> serde_json::Value {
    // Pods placed on existing or in-flight nodes, grouped by node.
    let mut by_node: std::collections::BTreeMap<&str, Vec<&str>> = std::collections::BTreeMap::new();
    for (pod, node) in &plan.existing {
        by_node.entry(node).or_default().push(pod);
    }
    let existing: Vec<serde_json::Value> = by_node.into_iter().map(|(node, pods)| json!({"node": node, "pods": pods})).collect();
    json!({"nodes": plan.nodes, "existing": existing, "unschedulable": plan.unschedulable, "totalPricePerHour": round(plan.total_price_per_hour)})
}

fn round(p: f64) -> f64 {
    (p * 1e6).round() / 1e6
}

fn print_plan(title: &str, plan: &Plan) {
    println!("{title}: {} new node(s), ${:.4}/hour", plan.nodes.len(), plan.total_price_per_hour);
    if !plan.nodes.is_empty() {
        println!("  {:<14} {:<10} {:<14} {:<6} {:<11} {:<10} {:>8}  PODS", "NODE", "POOL", "TYPE", "ARCH", "ZONE", "CAPACITY", "$/HOUR");
        for n in &plan.nodes {
            println!(
                "  {:<14} {:<10} {:<14} {:<6} {:<11} {:<10} {:>8.4}  {}",
                n.name, n.pool, n.instance_type, n.arch, n.zone, n.capacity_type, n.price_per_hour, n.pods.join(", ")
            );
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
    let SimulateArgs { scenario, catalog, registry, offline, compare, output } = args;
    let text = std::fs::read_to_string(&scenario).with_context(|| format!("reading {}", scenario.display()))?;
    let s = Scenario::parse(&text)?;
    let cfg = registry.load()?;
    let catalog = Catalog::with_user_file(catalog.as_deref().or(cfg.catalog.as_deref()))?;
    let mut notes: Vec<String> = s.ignored.iter().map(|k| format!("ignored {k}")).collect();

    // Platforms: the pod's annotation, else the images (the webhook's lookup path), else unknown.
    let mut found = std::collections::BTreeMap::new();
    if !offline {
        let images = all_images(&s.pods);
        if !images.is_empty() {
            let inspector = super::inspector(&cfg, Arc::new(Metrics::new()), cfg.memory_budget())?;
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
    let inputs = s.inputs(&catalog, &found)?;
    if inputs.assumed > 0 {
        notes.push(format!("{} pod(s) with unknown image platforms were assumed to run on any architecture", inputs.assumed));
    }
    let crate::provisioner::scenario::Inputs { pending: pods, pools, offerings: offers, snapshot, .. } = inputs;
    let plan = plan_batch(&snapshot, &pods, &pools, &offers);
    // The comparison is over the pods both plans can place: pods that need arm64 are left out of
    // both sides (and listed), so the saving is like for like.
    let comparison = compare.then(|| {
        let restricted: Vec<Pool> = pools
            .iter()
            .cloned()
            .map(|mut p| {
                let _ = p.requirements.add(labels::ARCH, "NotIn", &["arm64".into()]);
                p
            })
            .collect();
        let without = plan_batch(&snapshot, &pods, &restricted, &offers);
        let needs_arm: std::collections::BTreeSet<&str> = without.unschedulable.iter().map(|u| u.pod.as_str()).collect();
        let common: Vec<_> = pods.iter().filter(|p| !needs_arm.contains(p.packer.id.as_str())).cloned().collect();
        let with = plan_batch(&snapshot, &common, &pools, &offers);
        (with, without)
    });

    match output {
        Output::Json => {
            let mut doc = plan_json(&plan);
            if let Some((with, without)) = &comparison {
                doc["compare"] = json!({
                    "withArm64": plan_json(with),
                    "withoutArm64": plan_json(without),
                    "savingsPerHour": round(without.total_price_per_hour - with.total_price_per_hour),
                });
            }
            if !notes.is_empty() {
                doc["notes"] = json!(notes);
            }
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        Output::Text => {
            print_plan("Plan", &plan);
            if let Some((with, without)) = &comparison {
                println!();
                print_plan("With arm64 forbidden", without);
                let saved = without.total_price_per_hour - with.total_price_per_hour;
                let pct = if without.total_price_per_hour > 0.0 { 100.0 * saved / without.total_price_per_hour } else { 0.0 };
                println!(
                    "\nFor the {} pod(s) both plans place: ${:.4}/hour with arm64, ${:.4}/hour without. Multi-arch placement saves ${saved:.4}/hour ({pct:.1}%), ${:.0}/month.",
                    with.nodes.iter().map(|n| n.pods.len()).sum::<usize>() + with.existing.len(),
                    with.total_price_per_hour,
                    without.total_price_per_hour,
                    saved * 730.0
                );
            }
            for n in &notes {
                println!("note: {n}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
