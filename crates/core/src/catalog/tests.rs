use super::*;
use crate::resources::Resources;

#[test]
fn embedded_catalog_has_every_aws_type_with_prices() {
    let c = Catalog::embedded().expect("catalog");
    assert_eq!(c.types().iter().filter(|t| t.provider == "aws").count(), 1363);
    let m7g = c.get("m7g.large").expect("m7g.large");
    assert_eq!((m7g.arch.as_str(), m7g.vcpu, m7g.memory_mib, m7g.max_pods), ("arm64", 2, 8192, 29));
    assert_eq!(m7g.allocatable, Resources::new(1930, 6844 * 1024 * 1024, 29));
    assert_eq!(c.price("m7g.large", None, CapacityType::OnDemand), Some(0.0816));
    let spot = c.price("m7g.large", Some("us-east-1"), CapacityType::Spot).expect("spot");
    assert!((spot - 0.0816 * 0.35).abs() < 1e-9);
    assert_eq!(c.price("m7g.large", Some("eu-west-1"), CapacityType::OnDemand), None, "no price for an unknown region");
    assert_eq!(c.price("no.such", None, CapacityType::OnDemand), None);
    // 18 types (dl2q, hpc6a, ...) have no published us-east-1 price: they are known but unpriced.
    assert_eq!(c.types().iter().filter(|t| t.prices.contains_key("us-east-1")).count(), 1345);
    assert_eq!(c.price("hpc6a.48xlarge", None, CapacityType::OnDemand), None);
    assert_eq!(c.types().iter().filter(|t| t.arch == "arm64" && t.provider == "aws").count(), 396);
}

/// AKS's reservations, as Karpenter on Azure computes them: memory is the size's whole GiB less
/// 7.5% VM overhead, less kube-reserved (25% of the first 4 GiB, 20% of the next 4, 10% of the
/// next 8, 6% up to 128, 2% above) and the 750Mi eviction threshold; cpu less 6% of the first
/// core, 4% of the second, 2% of the next two and 1% of the rest.
fn aks_allocatable(vcpu: u32, gib: u64) -> (i64, i64) {
    fn brackets(amount: f64, b: &[(f64, f64)]) -> f64 {
        let (mut tax, mut lower) = (0.0, 0.0);
        for &(upper, rate) in b {
            if lower > amount {
                continue;
            }
            tax += (upper.min(amount) - lower) * rate;
            lower = upper;
        }
        tax
    }
    let gi = 1024 * 1024 * 1024_i64;
    let capacity = gib as i64 * gi - ((gib as i64 * gi) as f64 * 0.075).ceil() as i64;
    let reserved_mi = (1024.0 * brackets(gib as f64, &[(4.0, 0.25), (8.0, 0.20), (16.0, 0.10), (128.0, 0.06), (f64::MAX, 0.02)])) as i64;
    let memory = capacity - (reserved_mi + 750) * 1024 * 1024;
    let cpu = i64::from(vcpu) * 1000 - (1000.0 * brackets(f64::from(vcpu), &[(1.0, 0.06), (2.0, 0.04), (4.0, 0.02), (f64::MAX, 0.01)]) + 1e-9) as i64;
    (cpu, memory)
}

#[test]
fn embedded_azure_sizes_are_priced_in_five_regions_with_aks_allocatable() {
    let c = Catalog::embedded().expect("catalog");
    let azure: Vec<_> = c.types().iter().filter(|t| t.provider == "azure").collect();
    assert_eq!(azure.len(), 194, "the D family's v5 and v6 series");
    let regions = c.regions();
    for r in ["eastus", "eastus2", "westus2", "westeurope", "northeurope"] {
        assert_eq!(regions.get(r).map(|p| p.iter().map(String::as_str).collect::<Vec<_>>()), Some(vec!["azure"]), "{r} prices Azure sizes only");
        assert!(azure.iter().filter(|t| t.prices.contains_key(r)).count() >= 190, "{r}");
    }
    assert_eq!(regions.get("us-east-1").map(|p| p.iter().map(String::as_str).collect::<Vec<_>>()), Some(vec!["aws"]));
    for t in &azure {
        let (cpu, memory) = aks_allocatable(t.vcpu, t.memory_mib / 1024);
        assert_eq!((t.allocatable.cpu_millis, t.allocatable.memory_bytes, t.max_pods), (cpu, memory, 250), "{}", t.name);
    }
    // What Karpenter on Azure reported for a Standard_D8ls_v5 it launched (AKS workshop, module 1).
    let d8ls = c.get("Standard_D8ls_v5").expect("D8ls_v5");
    assert_eq!((d8ls.allocatable.cpu_millis, d8ls.allocatable.memory_bytes), (7820, 12_313_637_683));
    let d2pds = c.get("Standard_D2pds_v5").expect("D2pds_v5");
    assert_eq!((d2pds.arch.as_str(), d2pds.vcpu, d2pds.memory_mib, d2pds.family.as_str(), d2pds.category.as_str(), d2pds.generation), ("arm64", 2, 8192, "Dpds_v5", "D", 5));
    assert_eq!(c.price("Standard_D2pds_v5", Some("eastus"), CapacityType::OnDemand), Some(0.0904));
    assert_eq!(c.price("Standard_D2pds_v5", Some("westeurope"), CapacityType::OnDemand), Some(0.109));
    assert_eq!(c.price("Standard_D2pds_v5", None, CapacityType::OnDemand), None, "not an EC2 type: no us-east-1 price");
    assert_eq!(d2pds.facts.get("premium_storage").map(String::as_str), Some("true"));
    let d2 = c.get("Standard_D2_v5").expect("D2_v5");
    assert_eq!(d2.facts.get("premium_storage").map(String::as_str), Some("false"), "no `s`: not premium-capable");
    assert_eq!(c.get("Standard_D4pls_v6").map(|t| (t.memory_mib, t.cpu_manufacturer.as_str())), Some((8192, "microsoft")), "`l`: 2 GiB a vCPU; Cobalt 100");
    let known = c.regions();
    assert_eq!(c.price_in_zone(d2pds, "eastus-2", &known, CapacityType::OnDemand), Some(0.0904));
    let m7g = c.get("m7g.large").expect("m7g");
    assert_eq!(c.price_in_zone(m7g, "eastus-2", &known, CapacityType::OnDemand), None, "an Azure zone offers no EC2 type");
    assert_eq!(c.price_in_zone(m7g, "us-west-2a", &known, CapacityType::OnDemand), Some(0.0816), "a region without prices: us-east-1's list, as before");
    assert_eq!(c.price_in_zone(d2pds, "us-west-2a", &known, CapacityType::OnDemand), None);
}

#[test]
fn user_file_adds_and_replaces_types() {
    let mut c = Catalog::embedded().expect("catalog");
    let f: CatalogFile = crate::yaml::from_str(
        r#"
defaultRegion: us-east-1
spotDiscount: 0.6
instanceTypes:
  - name: Standard_D4ps_v5
    provider: azure
    arch: arm64
    family: Dpsv5
    vcpu: 4
    memoryMib: 16384
    allocatable: {cpu: 3860m, memory: 12Gi}
    maxPods: 110
    prices: {eastus: 0.154}
  - name: m7g.large
    arch: arm64
    family: m7g
    vcpu: 2
    memoryMib: 8192
    allocatable: {cpu: 1930m, memory: 6844Mi}
    maxPods: 29
    prices: {us-east-1: 0.08}
"#,
    )
    .expect("yaml");
    c.apply(f, "test").expect("apply");
    assert_eq!(c.price("Standard_D4ps_v5", Some("eastus"), CapacityType::OnDemand), Some(0.154));
    assert_eq!(c.get("Standard_D4ps_v5").map(|t| t.allocatable.cpu_millis), Some(3860));
    assert_eq!(c.price("m7g.large", None, CapacityType::OnDemand), Some(0.08), "replaced entry");
    assert_eq!(c.len(), 1557, "both entries replaced embedded ones");
}

/// Archer's own `priceOverrides` were retired for Karpenter's NodeOverlay: a file with them is
/// refused, and the refusal carries the overlays that price the same (their pricing is checked
/// in `archer_model::overlay`'s tests).
#[test]
fn price_overrides_are_refused_with_the_node_overlays_that_replace_them() {
    let mut c = Catalog::embedded().expect("catalog");
    let f: CatalogFile = crate::yaml::from_str("priceOverrides:\n  - family: m6i\n    capacityType: on-demand\n    discount: 0.25\n  - instanceType: c6i.large\n    pricePerHour: 0.05\n  - family: Dps_v5\n    region: eastus\n    discount: 0.1\n").expect("yaml");
    let e = c.apply(f, "mine.yaml").expect_err("retired").to_string();
    assert!(e.starts_with("catalog mine.yaml: priceOverrides were retired") && e.contains("NodeOverlay"), "{e}");
    let docs: Vec<&str> = e.split("---\n").skip(1).collect();
    assert_eq!(docs.len(), 3, "{e}");
    assert!(docs[0].contains("name: catalog-price-override-1") && docs[0].contains("weight: 30") && docs[0].contains("{key: karpenter.k8s.aws/instance-family, operator: In, values: [\"m6i\"]}") && docs[0].contains("{key: karpenter.sh/capacity-type, operator: In, values: [\"on-demand\"]}") && docs[0].contains("priceAdjustment: \"-25%\""), "{}", docs[0]);
    assert!(docs[1].contains("weight: 20") && docs[1].contains("price: \"0.05\""), "{}", docs[1]);
    assert!(docs[2].contains("weight: 10") && docs[2].contains("archer.dev/instance-family") && docs[2].contains("topology.kubernetes.io/region"), "an Azure family is Archer's label: {}", docs[2]);
    assert_eq!(c.price("m6i.large", None, CapacityType::OnDemand), Some(0.096), "nothing was applied");
}

#[test]
fn bad_user_files_are_rejected() {
    let mut c = Catalog::embedded().expect("catalog");
    for bad in [
        "spotDiscount: 1.5\n",
        "priceOverrides: [{family: m6i, discount: 0.2}]\n",
        "instanceTypes: [{name: x, arch: arm64, vcpu: 1, memoryMib: 1, allocatable: {cpu: lots}, maxPods: 1, prices: {}}]\n",
    ] {
        let f: CatalogFile = crate::yaml::from_str(bad).expect("yaml shape");
        assert!(c.apply(f, "test").is_err(), "{bad}");
    }
    assert!(crate::yaml::from_str::<CatalogFile>("unknownKey: 1\n").is_err());
}

#[test]
fn csv_with_several_regions() {
    let csv = "instance_type,arch,os,family,category,generation,cpu_manufacturer,vcpu,memory_mib,gpu_count,gpu_name,allocatable_cpu,allocatable_memory,max_pods,ondemand_usd_per_hour_europe_west4,ondemand_usd_per_hour_us_central1\n\
c4a-standard-4,arm64,linux,c4a,c,4,google,4,16384,,,3920m,13Gi,110,0.2,0.18\n";
    let types = file::parse_csv("gcp", csv).expect("csv");
    assert_eq!(types[0].prices.get("europe-west4"), Some(&0.2));
    assert_eq!(types[0].prices.get("us-central1"), Some(&0.18));
    assert!(file::parse_csv("gcp", "instance_type,arch\nx,arm64\n").is_err());
}

