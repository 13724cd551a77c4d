use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};

use super::output::Output;
use archer_core::catalog::{CapacityType, Catalog};

#[derive(Args, Debug)]
pub struct PricesArgs {
    /// Only this architecture.
    #[arg(long, value_enum)]
    pub arch: Option<Arch>,
    /// Only this instance family (m7g, c6i, ...; an Azure series: Dpds_v5, ...).
    #[arg(long)]
    pub family: Option<String>,
    /// Region for prices (default: the catalog's default region, us-east-1): the types priced
    /// there (EC2's in an AWS region, Azure's in eastus, eastus2, westus2, westeurope and
    /// northeurope); a region the catalog has no prices for is an error.
    #[arg(long)]
    pub region: Option<String>,
    /// A user catalog file (YAML or CSV) on top of the embedded one.
    #[arg(long, env = "ARCHER_CATALOG")]
    pub catalog: Option<PathBuf>,
    /// Karpenter NodeOverlays (`karpenter.sh/v1alpha1`, YAML documents, as `kubectl get
    /// nodeoverlays -o yaml` prints them) applied to the catalog's prices as the provisioner
    /// applies them: the prices shown are the overlaid ones, with the overlay that set each.
    #[arg(long)]
    pub overlays: Option<PathBuf>,
    /// A field of the overlays that their type does not have is an error (else a warning).
    #[arg(long)]
    pub strict: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// `aws`: what the EC2 provider sees (the types EC2 offers in the region, by zone, on-demand
    /// prices from the Price List Query API, EC2's spot prices); credentials and region from the
    /// standard chain (`AWS_ENDPOINT_URL` for another endpoint). Unset: the catalog alone.
    #[arg(long)]
    pub cloud_provider: Option<String>,
}

/// The architectures the catalog prices (`kubernetes.io/arch` values).
#[derive(Copy, Clone, Debug, ValueEnum, PartialEq, Eq)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    fn is(arch: Option<Arch>, of: &str) -> bool {
        arch.is_none_or(|a| of == if a == Arch::Amd64 { "amd64" } else { "arm64" })
    }
}

/// A `--family` that matches nothing is a mistake to say, not an empty table: the families
/// there are (of the architecture asked for) are listed.
fn no_such_family<'a>(family: Option<&str>, matched: usize, known: impl Iterator<Item = &'a str>) -> anyhow::Result<()> {
    match family {
        Some(f) if matched == 0 => {
            let known: std::collections::BTreeSet<&str> = known.collect();
            let list: Vec<&str> = known.into_iter().collect();
            anyhow::bail!("no instance type of family {f:?} here; the families are: {}", list.join(", "))
        }
        _ => Ok(()),
    }
}

pub async fn run(args: PricesArgs) -> anyhow::Result<ExitCode> {
    match args.cloud_provider.as_deref() {
        None => catalog_prices(args),
        #[cfg(feature = "aws")]
        Some("aws") => aws_prices(args).await,
        #[cfg(not(feature = "aws"))]
        Some("aws") => anyhow::bail!("--cloud-provider aws: this archer was built without the aws feature (cargo build --features aws)"),
        Some(other) => anyhow::bail!("--cloud-provider {other:?}: expected aws"),
    }
}

/// The offerings the AWS provider would plan with.
#[cfg(feature = "aws")]
async fn aws_prices(args: PricesArgs) -> anyhow::Result<ExitCode> {
    let PricesArgs { arch, family, region, catalog, output, .. } = args;
    let c = std::sync::Arc::new(Catalog::with_user_file(catalog.as_deref())?);
    let settings = crate::config::AwsConfig { region, ..Default::default() };
    let (book, region) = archer_cloud_aws::read_book(&settings, c).await?;
    let status = book.price_status();
    let said = match (status.refreshed_at, &status.last_error) {
        (Some(at), _) => format!("on-demand prices: the AWS Price List Query API, read {}", k8s_openapi::jiff::Timestamp::try_from(at).map(|t| t.to_string()).unwrap_or_default()),
        (None, Some(e)) => format!("on-demand prices: the catalog's (the AWS Price List Query API did not answer: {e})"),
        (None, None) => "on-demand prices: the catalog's".to_string(),
    };
    let all = book.all();
    let of_arch: Vec<_> = all.iter().filter(|o| Arch::is(arch, &o.instance.arch)).collect();
    let mut rows: Vec<_> = of_arch.iter().copied().filter(|o| family.as_deref().is_none_or(|f| f == o.instance.family)).collect();
    no_such_family(family.as_deref(), rows.len(), of_arch.iter().map(|o| o.instance.family.as_str()))?;
    rows.sort_by(|a, b| a.price.total_cmp(&b.price).then_with(|| (&a.instance.name, &a.zone, a.capacity).cmp(&(&b.instance.name, &b.zone, b.capacity))));
    let source = |o: &archer_core::packer::Offering| match o.capacity {
        CapacityType::OnDemand => book.on_demand_source(&o.instance.name),
        CapacityType::Spot if book.spot_price(&o.instance.name, &o.zone).is_some() => "ec2",
        CapacityType::Spot => "estimate",
    };
    match output {
        Output::Json | Output::Yaml => {
            let docs: Vec<_> = rows
                .iter()
                .map(|o| serde_json::json!({"instanceType": o.instance.name, "arch": o.instance.arch, "zone": o.zone, "capacityType": o.capacity.as_str(), "pricePerHour": o.price, "priceSource": source(o), "region": region}))
                .collect();
            output.print(&docs)?;
        }
        Output::Text => {
            println!("{:<20} {:<6} {:<14} {:<10} {:>10} {:<8}", "TYPE", "ARCH", "ZONE", "CAPACITY", "$/HOUR", "SOURCE");
            for o in &rows {
                println!("{:<20} {:<6} {:<14} {:<10} {:>10.5} {:<8}", o.instance.name, o.instance.arch, o.zone, o.capacity.as_str(), o.price, source(o));
            }
            eprintln!("{} offerings of {} instance types, region {region}; {said}", rows.len(), rows.iter().map(|o| &o.instance.name).collect::<std::collections::BTreeSet<_>>().len());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The NodeOverlays of a YAML file (documents, or a `List`); anything else in it is an error.
fn read_overlays(path: &std::path::Path, strict: bool) -> anyhow::Result<Vec<std::sync::Arc<archer_api::nodeoverlay::NodeOverlay>>> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (state, ignored, unknown) = archer_model::ClusterState::from_objects(archer_core::yaml::objects(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?)?;
    super::unknown_fields(strict, &unknown)?;
    if let Some(other) = ignored.first() {
        anyhow::bail!("{}: {other} is not a NodeOverlay (karpenter.sh/v1alpha1)", path.display());
    }
    Ok(state.overlays)
}

/// The zone a region's prices are shown for when overlays are applied (its first zone).
fn first_zone(region: &str, provider: &str) -> String {
    if provider == "azure" { format!("{region}-1") } else { format!("{region}a") }
}

fn catalog_prices(args: PricesArgs) -> anyhow::Result<ExitCode> {
    let PricesArgs { arch, family, region, catalog, output, overlays, strict, .. } = args;
    let c = Catalog::with_user_file(catalog.as_deref())?;
    let region = region.unwrap_or_else(|| c.default_region.clone());
    let known = c.regions();
    if !known.contains_key(&region) {
        let list: Vec<&str> = known.keys().map(String::as_str).collect();
        anyhow::bail!("the catalog has no prices for region {region:?} (it has: {}); add them with --catalog (for an Azure region, `archer catalog fetch --cloud azure --region {region} --out FILE` writes one)", list.join(", "));
    }
    let of_arch: Vec<_> = c.types().iter().filter(|t| t.prices.contains_key(&region) && Arch::is(arch, &t.arch)).collect();
    let mut rows: Vec<_> = of_arch
        .iter()
        .copied()
        .filter(|t| family.as_deref().is_none_or(|f| f == t.family))
        .map(|t| {
            let od = c.price_of(t, Some(&region), CapacityType::OnDemand);
            let spot = c.price_of(t, Some(&region), CapacityType::Spot);
            (t.clone(), od, spot)
        })
        .collect();
    no_such_family(family.as_deref(), rows.len(), of_arch.iter().map(|t| t.family.as_str()))?;
    // Overlays, as the provisioner applies them to offerings (in the region's first zone).
    let mut by: std::collections::HashMap<(String, CapacityType), String> = Default::default();
    // Extended resources overlays' `capacity` gives each type.
    let mut sized: std::collections::HashMap<String, std::collections::BTreeMap<String, i64>> = Default::default();
    if let Some(path) = &overlays {
        let overlays = read_overlays(path, strict)?;
        let offerings: Vec<archer_core::packer::Offering> = rows
            .iter()
            .flat_map(|(t, od, spot)| {
                let zone = first_zone(&region, &t.provider);
                [(CapacityType::OnDemand, *od), (CapacityType::Spot, *spot)].into_iter().filter_map(move |(c, p)| Some(archer_core::packer::Offering { instance: t.clone(), zone: zone.clone(), capacity: c, price: p?, pool: None }))
            })
            .collect();
        let overlaid = archer_model::overlay::apply(&overlays, &[], &offerings);
        let prices: std::collections::HashMap<(String, CapacityType), f64> = overlaid.offerings.iter().map(|o| ((o.instance.name.clone(), o.capacity), o.price)).collect();
        for (i, name) in &overlaid.priced_by {
            if let Some(o) = offerings.get(*i) {
                by.insert((o.instance.name.clone(), o.capacity), name.clone());
            }
        }
        sized.extend(overlaid.offerings.iter().filter(|o| !o.instance.extended.is_empty()).map(|o| (o.instance.name.clone(), o.instance.extended.clone())));
        for (t, od, spot) in &mut rows {
            *od = od.and(prices.get(&(t.name.clone(), CapacityType::OnDemand)).copied());
            *spot = spot.and(prices.get(&(t.name.clone(), CapacityType::Spot)).copied());
        }
        for (name, outcome) in &overlaid.outcomes {
            let (_, applied, why) = outcome.archer_applied();
            if applied != "Applied" {
                eprintln!("NodeOverlay {name}: not applied ({applied}: {why})");
            }
        }
    }
    let overlay_of = |t: &str, c: CapacityType| by.get(&(t.to_string(), c)).cloned();
    rows.sort_by(|a, b| a.1.unwrap_or(f64::INFINITY).total_cmp(&b.1.unwrap_or(f64::INFINITY)).then_with(|| a.0.name.cmp(&b.0.name)));
    match output {
        Output::Json | Output::Yaml => {
            let docs: Vec<_> = rows
                .iter()
                .map(|(t, od, spot)| serde_json::json!({
                    "instanceType": t.name, "provider": t.provider, "arch": t.arch, "os": t.os, "family": t.family,
                    "vcpu": t.vcpu, "memoryMib": t.memory_mib, "allocatableCpu": t.allocatable_cpu,
                    "allocatableMemory": t.allocatable_memory, "maxPods": t.max_pods, "region": region,
                    "onDemandPerHour": od, "spotPerHour": spot,
                    "onDemandOverlay": overlay_of(&t.name, CapacityType::OnDemand), "spotOverlay": overlay_of(&t.name, CapacityType::Spot),
                    "overlayCapacity": sized.get(&t.name),
                }))
                .collect();
            output.print(&docs)?;
        }
        Output::Text => {
            let overlay_column = |t: &str| {
                let prices = match (overlay_of(t, CapacityType::OnDemand), overlay_of(t, CapacityType::Spot)) {
                    (None, None) => String::new(),
                    (Some(a), Some(b)) if a == b => format!("  {a}"),
                    (a, b) => format!("  {}/{}", a.unwrap_or_else(|| "-".into()), b.unwrap_or_else(|| "-".into())),
                };
                let capacity = sized.get(t).map(|c| format!("  capacity: {}", c.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))).unwrap_or_default();
                format!("{prices}{capacity}")
            };
            let header = if overlays.is_some() { "  OVERLAY" } else { "" };
            println!("{:<20} {:<6} {:>5} {:>9} {:>10} {:>11} {:>5} {:>10} {:>10} {:>10}{header}", "TYPE", "ARCH", "VCPU", "MEM(MiB)", "ALLOC CPU", "ALLOC MEM", "PODS", "ON-DEMAND", "SPOT(est)", "$/vCPU-h");
            let fmt = |p: &Option<f64>| p.map_or("-".to_string(), |p| format!("{p:.4}"));
            for (t, od, spot) in &rows {
                let per_cpu = od.map_or("-".to_string(), |p| format!("{:.4}", p / f64::from(t.vcpu.max(1))));
                println!(
                    "{:<20} {:<6} {:>5} {:>9} {:>10} {:>11} {:>5} {:>10} {:>10} {:>10}{}",
                    t.name, t.arch, t.vcpu, t.memory_mib, t.allocatable_cpu, t.allocatable_memory, t.max_pods, fmt(od), fmt(spot), per_cpu, overlay_column(&t.name)
                );
            }
            eprintln!("{} instance types, region {region}", rows.len());
        }
    }
    Ok(ExitCode::SUCCESS)
}
