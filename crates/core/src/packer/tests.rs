use super::*;
use crate::catalog::Catalog;
use crate::quantity::MIB;

fn catalog_offerings(zones: &[&str], caps: &[CapacityType]) -> Vec<Offering> {
    let c = Catalog::embedded().expect("catalog");
    let mut out = Vec::new();
    for t in c.types() {
        for z in zones {
            for &cap in caps {
                if let Some(price) = c.price_of(t, None, cap) {
                    out.push(Offering { instance: t.clone(), zone: z.to_string(), capacity: cap, price, pool: None });
                }
            }
        }
    }
    out
}

fn pool(name: &str) -> Pool {
    Pool {
        name: name.into(),
        weight: 0,
        requirements: Requirements::new(),
        labels: BTreeMap::new(),
        taints: Vec::new(),
        limit_cpu_millis: None,
        limit_memory_bytes: None,
        limit_nodes: None,
        daemons: Vec::new(),
        closed: None,
        variant: Default::default(),
    }
}

fn pods(prefix: &str, n: usize, cpu: i64, mem_mib: i64, platforms: &str) -> Vec<PendingPod> {
    (0..n)
        .map(|i| PendingPod {
            id: format!("default/{prefix}-{i}"),
            requests: Resources::new(cpu, mem_mib * MIB, 1),
            terms: Vec::new(),
            tolerations: Vec::new(),
            platforms: Some(PlatformSet::parse_annotation(platforms).expect("platforms")),
            zone_spread: false,
            per_node_max: None,
            zone_group: None,
            preferred: Vec::new(),
            spread_group: None,
            one_per_zone: false,
            colocate: false,
            spread_keys: Vec::new(),
            extended: BTreeMap::new(),
        })
        .collect()
}

fn on_demand() -> Vec<Offering> {
    catalog_offerings(&["us-east-1a", "us-east-1b"], &[CapacityType::OnDemand])
}

#[test]
fn images_decide_the_architecture_and_price_the_type() {
    let offerings = on_demand();
    let mut all = pods("multi", 10, 500, 512, "linux/amd64,linux/arm64");
    all.extend(pods("x86", 10, 500, 512, "linux/amd64"));
    let plan = pack(&all, &[pool("default")], &offerings, &[]);
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    for n in &plan.nodes {
        let multi = n.pods.iter().any(|p| p.contains("multi"));
        let x86 = n.pods.iter().any(|p| p.contains("x86"));
        assert!(!(multi && x86 && n.arch == "arm64"), "amd64-only pods never land on arm64: {n:?}");
        if x86 {
            assert_eq!(n.arch, "amd64");
        }
    }
    assert!(plan.nodes.iter().any(|n| n.arch == "arm64" && n.pods.iter().all(|p| p.contains("multi"))), "multi-arch pods go to cheaper arm64: {:?}", plan.nodes);
    let placed: usize = plan.nodes.iter().map(|n| n.pods.len()).sum();
    assert_eq!(placed, 20);
    // A regression guard, not the target: the lower bound is fractional, and this first packer
    // does not yet mix pod shapes well (see the issue's cost-quality benchmark).
    let ratio = plan.total_price_per_hour / plan.lower_bound_per_hour;
    assert!(ratio < 1.5, "cost ratio {ratio}");
}

#[test]
fn constraints_pools_taints_and_weights() {
    let offerings = on_demand();
    // nodeSelector on instance type
    let mut p = pods("pinned", 2, 1000, 1024, "linux/arm64,linux/amd64");
    for x in &mut p {
        x.terms = vec![Requirements::new().with("node.kubernetes.io/instance-type", "c6g.xlarge")];
    }
    let plan = pack(&p, &[pool("default")], &offerings, &[]);
    assert!(plan.nodes.iter().all(|n| n.instance_type == "c6g.xlarge"), "{:?}", plan.nodes);

    // a tainted team pool is only used by pods that tolerate it; weights order pools
    let mut team = pool("team1");
    team.weight = 10;
    team.taints = vec![Taint { key: "team1".into(), value: None, effect: "NoSchedule".into(), time_added: None }];
    team.labels.insert("team".into(), "team1".into());
    let other = pods("other", 3, 250, 256, "linux/amd64");
    let plan = pack(&other, &[team.clone(), pool("default")], &offerings, &[]);
    assert!(plan.nodes.iter().all(|n| n.pool == "default"));
    let mut mine = pods("mine", 3, 250, 256, "linux/amd64");
    for x in &mut mine {
        x.tolerations = vec![serde_json::from_value(serde_json::json!({"key": "team1", "operator": "Exists", "effect": "NoSchedule"})).expect("tol")];
    }
    let plan = pack(&mine, &[pool("default"), team], &offerings, &[]);
    assert!(plan.nodes.iter().all(|n| n.pool == "team1"), "the higher-weight pool first: {:?}", plan.nodes);
}

#[test]
fn limits_are_never_exceeded_and_unfit_pods_get_reasons() {
    let offerings = on_demand();
    let mut limited = pool("small");
    limited.limit_nodes = Some(1);
    let many = pods("big", 6, 4000, 8192, "linux/amd64,linux/arm64");
    let plan = pack(&many, &[limited], &offerings, &[]);
    assert!(plan.nodes.len() <= 1);
    assert!(!plan.unschedulable.is_empty());
    assert!(plan.unschedulable.iter().all(|u| u.reason.contains("limits")), "{:?}", plan.unschedulable);

    let s390 = pods("mainframe", 1, 100, 64, "linux/s390x");
    let plan = pack(&s390, &[pool("default")], &offerings, &[]);
    assert!(plan.nodes.is_empty());
    assert!(plan.unschedulable[0].reason.contains("s390x"), "{:?}", plan.unschedulable);

    let huge = pods("huge", 1, 1_000_000, 64, "linux/amd64");
    let plan = pack(&huge, &[pool("default")], &offerings, &[]);
    assert!(plan.nodes.is_empty() && plan.unschedulable.len() == 1);
}

#[test]
fn existing_room_is_used_first() {
    let node = ExistingNode {
        name: "old-1".into(),
        labels: [("kubernetes.io/arch".to_string(), "amd64".to_string()), ("kubernetes.io/os".to_string(), "linux".to_string())].into_iter().collect(),
        taints: Vec::new(),
        free: Resources::new(1000, 2048 * MIB, 10),
    };
    let plan = pack(&pods("fits", 3, 300, 256, "linux/amd64"), &[pool("default")], &on_demand(), &[node]);
    assert!(plan.nodes.is_empty(), "{:?}", plan.nodes);
    assert_eq!(plan.existing.len(), 3);
}

#[test]
fn spot_is_chosen_when_allowed_and_cheaper() {
    let offerings = catalog_offerings(&["us-east-1a"], &[CapacityType::OnDemand, CapacityType::Spot]);
    let plan = pack(&pods("web", 8, 500, 512, "linux/amd64,linux/arm64"), &[pool("default")], &offerings, &[]);
    assert!(plan.nodes.iter().all(|n| n.capacity_type == "spot"));
    let mut od_only = pool("od");
    od_only.requirements = Requirements::new().with("karpenter.sh/capacity-type", "on-demand");
    let plan = pack(&pods("web", 8, 500, 512, "linux/amd64,linux/arm64"), &[od_only], &offerings, &[]);
    assert!(plan.nodes.iter().all(|n| n.capacity_type == "on-demand"));
}

#[test]
fn daemonset_overhead_shrinks_every_node() {
    // 4 pods of 900m fit two to a 1930m node without overhead, one to a node with 200m taken.
    let mut only = pool("m6g");
    only.requirements = Requirements::new().with("node.kubernetes.io/instance-type", "m6g.large");
    let p = pods("w", 4, 900, 256, "linux/arm64");
    assert_eq!(pack(&p, &[only.clone()], &on_demand(), &[]).nodes.len(), 2);
    only.daemons = vec![DaemonLoad { selector: Requirements::new(), tolerations: Vec::new(), requests: Resources::new(200, 128 * MIB, 1) }];
    assert_eq!(pack(&p, &[only], &on_demand(), &[]).nodes.len(), 4);
}

#[test]
fn zone_spread_and_per_node_caps() {
    let offerings = catalog_offerings(&["us-east-1a", "us-east-1b", "us-east-1c"], &[CapacityType::OnDemand]);
    let mut p = pods("spread", 7, 250, 256, "linux/amd64,linux/arm64");
    for x in &mut p {
        x.zone_spread = true;
    }
    let plan = pack(&p, &[pool("default")], &offerings, &[]);
    let mut per_zone = BTreeMap::new();
    for n in &plan.nodes {
        *per_zone.entry(n.zone.clone()).or_insert(0) += n.pods.len();
    }
    assert_eq!(per_zone.len(), 3, "{per_zone:?}");
    let (min, max) = (per_zone.values().min().copied().unwrap_or(0), per_zone.values().max().copied().unwrap_or(0));
    assert!(max - min <= 1, "{per_zone:?}");

    let mut p = pods("anti", 4, 250, 256, "linux/amd64,linux/arm64");
    for x in &mut p {
        x.per_node_max = Some(1);
    }
    let plan = pack(&p, &[pool("default")], &offerings, &[]);
    assert_eq!(plan.nodes.len(), 4);
    assert!(plan.nodes.iter().all(|n| n.pods.len() == 1));
}

#[test]
fn a_zone_group_lands_in_one_zone() {
    let offerings = catalog_offerings(&["us-east-1a", "us-east-1b", "us-east-1c"], &[CapacityType::OnDemand]);
    let mut p = pods("aff", 12, 500, 512, "linux/amd64,linux/arm64");
    p.extend(pods("aff-big", 3, 3000, 4096, "linux/amd64"));
    for x in &mut p {
        x.zone_group = Some("ns|app=db".into());
    }
    let mut other = pods("free", 6, 500, 512, "linux/amd64");
    for x in &mut other {
        x.zone_spread = true;
    }
    p.extend(other);
    let plan = pack(&p, &[pool("default")], &offerings, &[]);
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    let zones: std::collections::BTreeSet<&str> = plan.nodes.iter().filter(|n| n.pods.iter().any(|p| p.contains("/aff"))).map(|n| n.zone.as_str()).collect();
    assert_eq!(zones.len(), 1, "the group shares one zone: {zones:?}");
    let free_zones: std::collections::BTreeSet<&str> = plan.nodes.iter().filter(|n| n.pods.iter().any(|p| p.contains("/free"))).map(|n| n.zone.as_str()).collect();
    assert_eq!(free_zones.len(), 3, "other pods keep their own spread");
}

#[test]
fn every_planned_node_is_the_cheapest_that_holds_its_pods() {
    let offerings = catalog_offerings(&["us-east-1a"], &[CapacityType::OnDemand]);
    let mut p = pods("a", 9, 1000, 1024, "linux/amd64");
    p.extend(pods("b", 5, 250, 3000, "linux/amd64,linux/arm64"));
    p.extend(pods("c", 3, 2000, 512, "linux/arm64"));
    let requests: BTreeMap<String, Resources> = p.iter().map(|x| (x.id.clone(), x.requests)).collect();
    let platforms: BTreeMap<String, String> = p.iter().map(|x| (x.id.clone(), x.platforms.as_ref().map(|s| s.to_annotation()).unwrap_or_default())).collect();
    let plan = pack(&p, &[pool("default")], &offerings, &[]);
    assert!(plan.unschedulable.is_empty());
    for n in &plan.nodes {
        let need = n.pods.iter().fold(Resources::default(), |acc, id| acc + requests[id]);
        let archs: Vec<&str> = n.pods.iter().map(|id| platforms[id].as_str()).collect();
        for o in &offerings {
            let runs_all = archs.iter().all(|a| a.contains(&format!("linux/{}", o.instance.arch)));
            if runs_all && need.fits(o.instance.allocatable) {
                assert!(o.price >= n.price_per_hour - 1e-12, "node {} ({}) holds {:?} but {} is cheaper and fits", n.name, n.instance_type, n.pods, o.instance.name);
            }
        }
    }
}

#[test]
fn preferred_affinity_is_honoured_when_free_and_relaxed_when_costly() {
    let offerings = catalog_offerings(&["us-east-1a", "us-east-1b", "us-east-1c"], &[CapacityType::OnDemand]);
    // Zones cost the same: the preferred zone wins.
    let mut p = pods("web", 4, 500, 512, "linux/amd64,linux/arm64");
    for x in &mut p {
        x.preferred = vec![(50, Requirements::new().with("topology.kubernetes.io/zone", "us-east-1b"))];
    }
    let plan = pack(&p, &[pool("default")], &offerings, &[]);
    assert!(!plan.nodes.is_empty() && plan.nodes.iter().all(|n| n.zone == "us-east-1b"), "{:?}", plan.nodes);
    let free = pack(&pods("web", 4, 500, 512, "linux/amd64,linux/arm64"), &[pool("default")], &offerings, &[]);
    assert!((plan.total_price_per_hour - free.total_price_per_hour).abs() < 1e-9, "honouring it cost nothing");

    // A preference for a pricier type is relaxed: the plan costs what it costs without it.
    let mut p = pods("api", 4, 500, 512, "linux/amd64,linux/arm64");
    for x in &mut p {
        x.preferred = vec![(100, Requirements::new().with("node.kubernetes.io/instance-type", "m7i.8xlarge"))];
    }
    let plan = pack(&p, &[pool("default")], &offerings, &[]);
    let free = pack(&pods("api", 4, 500, 512, "linux/amd64,linux/arm64"), &[pool("default")], &offerings, &[]);
    assert!(plan.nodes.iter().all(|n| n.instance_type != "m7i.8xlarge"));
    assert!((plan.total_price_per_hour - free.total_price_per_hour).abs() < 1e-9);
}

#[test]
fn spread_and_per_node_caps_count_a_whole_group_of_mixed_sizes() {
    let offerings = catalog_offerings(&["us-east-1a", "us-east-1b", "us-east-1c"], &[CapacityType::OnDemand]);
    // One group (one selector), three sizes: anti-affinity holds across sizes.
    let mut p = pods("s", 3, 250, 256, "linux/amd64");
    p.extend(pods("m", 3, 500, 512, "linux/amd64"));
    p.extend(pods("l", 2, 1000, 1024, "linux/amd64"));
    for x in &mut p {
        x.per_node_max = Some(1);
        x.spread_group = Some("ns|app=nginx".into());
    }
    let plan = pack(&p, &[pool("default")], &offerings, &[]);
    assert_eq!(plan.nodes.len(), 8, "{:?}", plan.nodes);
    assert!(plan.nodes.iter().all(|n| n.pods.len() == 1));

    // Zone spread over a group of mixed sizes: the group, not each size, is balanced.
    let mut p = pods("a", 4, 250, 256, "linux/amd64");
    p.extend(pods("b", 4, 500, 512, "linux/amd64"));
    p.extend(pods("c", 1, 1000, 1024, "linux/amd64"));
    for x in &mut p {
        x.zone_spread = true;
        x.spread_group = Some("ns|app=web".into());
    }
    let plan = pack(&p, &[pool("default")], &offerings, &[]);
    let mut per_zone = BTreeMap::new();
    for n in &plan.nodes {
        *per_zone.entry(n.zone.clone()).or_insert(0) += n.pods.len();
    }
    let (min, max) = (per_zone.values().min().copied().unwrap_or(0), per_zone.values().max().copied().unwrap_or(0));
    assert_eq!(per_zone.len(), 3);
    assert!(max - min <= 1, "{per_zone:?}");
}

#[test]
fn zone_anti_affinity_and_hostname_affinity_to_own_replicas() {
    let offerings = catalog_offerings(&["us-east-1a", "us-east-1b", "us-east-1c"], &[CapacityType::OnDemand]);
    let mut p = pods("zk", 5, 500, 512, "linux/amd64");
    for x in &mut p {
        x.one_per_zone = true;
    }
    let plan = pack(&p, &[pool("default")], &offerings, &[]);
    let zones: std::collections::BTreeSet<&str> = plan.nodes.iter().map(|n| n.zone.as_str()).collect();
    assert_eq!((plan.nodes.iter().map(|n| n.pods.len()).sum::<usize>(), zones.len()), (3, 3), "one per zone: {:?}", plan.nodes);
    assert_eq!(plan.unschedulable.len(), 2);
    assert!(plan.unschedulable[0].reason.contains("anti-affinity"));

    let mut p = pods("pair", 6, 1000, 1024, "linux/amd64");
    for x in &mut p {
        x.colocate = true;
    }
    let plan = pack(&p, &[pool("default")], &offerings, &[]);
    assert_eq!(plan.nodes.len(), 1, "all replicas on one node: {:?}", plan.nodes);
    assert_eq!(plan.nodes[0].pods.len(), 6);
    let mut huge = pods("huge", 4, 400_000, 1024, "linux/amd64");
    for x in &mut huge {
        x.colocate = true;
    }
    // No node holds all four: the first goes to the biggest node that holds any (as
    // kube-scheduler binds the first of a self-affine group), the rest cannot follow.
    let plan = pack(&huge, &[pool("default")], &offerings, &[]);
    assert!(plan.nodes.len() <= 1 && plan.nodes.iter().all(|n| n.pods.len() < 4), "{:?}", plan.nodes);
    assert_eq!(plan.nodes.iter().map(|n| n.pods.len()).sum::<usize>() + plan.unschedulable.len(), 4);
    assert!(plan.unschedulable.iter().all(|u| u.reason.contains("hostname") || u.reason.contains("no instance type")), "{:?}", plan.unschedulable);
}

#[test]
fn pods_that_request_nothing_are_placed_and_count_against_max_pods() {
    // The most common manifest there is: a Deployment whose containers set no requests.
    // kube-scheduler fits it on any node with a free pod slot, so the packer must too.
    let offerings = on_demand();
    let p = pods("plain", 30, 0, 0, "linux/amd64,linux/arm64");
    let plan = pack(&p, &[pool("default")], &offerings, &[]);
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    let placed: usize = plan.nodes.iter().map(|n| n.pods.len()).sum();
    assert_eq!(placed, 30);
    let catalog = Catalog::embedded().expect("catalog");
    for n in &plan.nodes {
        let t = catalog.get(&n.instance_type).expect("type");
        assert!(n.pods.len() as i64 <= t.max_pods, "{} pods on {} (max pods {})", n.pods.len(), n.instance_type, t.max_pods);
    }
    assert!(plan.total_price_per_hour > 0.0 && plan.lower_bound_per_hour > 0.0, "their pod slots are priced");
}

#[test]
fn pool_requirements_on_custom_keys_label_the_node_and_template_labels_are_kept() {
    // Karpenter: a NodePool requirement on a key no instance type sets becomes a node label, so
    // the pool is usable and pods selecting that label land on it.
    let offerings = on_demand();
    let mut team = pool("team");
    team.requirements = Requirements::new().with("example.com/team", "blue");
    let mut p = pods("blue", 2, 500, 512, "linux/amd64,linux/arm64");
    for x in &mut p {
        x.terms = vec![Requirements::new().with("example.com/team", "blue")];
    }
    let plan = pack(&p, &[team.clone()], &offerings, &[]);
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    assert!(plan.nodes.iter().all(|n| n.pool == "team"));
    // A template label on a well-known key is kept: only offerings that carry it are used.
    let mut arm_only = pool("arm");
    arm_only.labels.insert("kubernetes.io/arch".into(), "arm64".into());
    let plan = pack(&pods("any", 4, 500, 512, "linux/amd64,linux/arm64"), &[arm_only.clone()], &offerings, &[]);
    assert!(!plan.nodes.is_empty() && plan.nodes.iter().all(|n| n.arch == "arm64"), "{:?}", plan.nodes);
    // ... and an amd64-only pod cannot use that pool.
    let plan = pack(&pods("x86", 1, 500, 512, "linux/amd64"), &[arm_only], &offerings, &[]);
    assert_eq!(plan.unschedulable.len(), 1);
}

#[test]
fn a_pool_at_its_limits_falls_through_to_the_next_by_weight() {
    // Karpenter: pools are tried by weight; when the heaviest cannot launch (limits), the pods
    // go to the next pool that fits them instead of staying Pending.
    let offerings = on_demand();
    let mut first = pool("first");
    first.weight = 10;
    first.limit_nodes = Some(1);
    first.limit_cpu_millis = Some(4000);
    let second = pool("second");
    let p = pods("web", 12, 1000, 1024, "linux/amd64,linux/arm64");
    let plan = pack(&p, &[first.clone(), second.clone()], &offerings, &[]);
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    let on_first: Vec<_> = plan.nodes.iter().filter(|n| n.pool == "first").collect();
    assert_eq!(on_first.len(), 1, "the heavier pool is used up to its limit: {:?}", plan.nodes);
    assert!(plan.nodes.iter().any(|n| n.pool == "second"));
    let placed: usize = plan.nodes.iter().map(|n| n.pods.len()).sum();
    assert_eq!(placed, 12);
    // With nowhere to fall through, the limit's reason stays.
    let plan = pack(&p, &[first], &offerings, &[]);
    assert!(plan.unschedulable.iter().all(|u| u.reason.contains("pool limits reached")) && !plan.unschedulable.is_empty());
}

/// A small fixed-seed generator (xorshift64*), so every run checks the same instances.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// An instance type of `vcpu` and `gib` (all allocatable), `max_pods` pods, at `price`.
fn synthetic(i: usize, vcpu: u32, gib: u64, max_pods: i64, price: f64) -> Offering {
    let t = crate::catalog::InstanceType {
        name: format!("t{i}"),
        provider: "test".into(),
        arch: "amd64".into(),
        os: "linux".into(),
        family: "t".into(),
        category: "t".into(),
        generation: 1,
        cpu_manufacturer: "test".into(),
        vcpu,
        memory_mib: gib * 1024,
        gpu_count: 0,
        gpu_name: String::new(),
        allocatable: Resources::new(i64::from(vcpu) * 1000, gib as i64 * 1024 * MIB, max_pods),
        allocatable_cpu: vcpu.to_string(),
        allocatable_memory: format!("{gib}Gi"),
        max_pods,
        prices: BTreeMap::new(),
        spot_discount: None,
        facts: BTreeMap::new(),
        extended: BTreeMap::new(),
    };
    Offering { instance: Arc::new(t), zone: "us-east-1a".into(), capacity: CapacityType::OnDemand, price, pool: None }
}

/// The cheapest set of nodes for `pods` by exhaustive search: each pod (largest first) onto a
/// node already opened or onto a new node of each type, pruned by the best price found.
fn exhaustive(pods: &[PendingPod], offerings: &[Offering]) -> f64 {
    fn go(pods: &[Resources], offerings: &[Offering], open: &mut Vec<(usize, Resources)>, cost: f64, best: &mut f64) {
        if cost >= *best - 1e-12 {
            return;
        }
        let Some((&pod, rest)) = pods.split_first() else {
            *best = cost;
            return;
        };
        for k in 0..open.len() {
            if pod.fits(open[k].1) {
                open[k].1 = open[k].1 - pod;
                go(rest, offerings, open, cost, best);
                open[k].1 = open[k].1 + pod;
            }
        }
        for (t, o) in offerings.iter().enumerate() {
            let room = o.instance.allocatable;
            // Nodes of one type are opened in a fixed order: a new one never precedes an empty one.
            if pod.fits(room) && !open.iter().any(|&(u, left)| u == t && left == room) {
                open.push((t, room - pod));
                go(rest, offerings, open, cost + o.price, best);
                open.pop();
            }
        }
    }
    let mut sizes: Vec<Resources> = pods.iter().map(|p| Resources::new(p.requests.cpu_millis, p.requests.memory_bytes, 1)).collect();
    sizes.sort_by(|a, b| b.cmp(a));
    let mut best = f64::INFINITY;
    go(&sizes, offerings, &mut Vec::new(), 0.0, &mut best);
    best
}

/// Small instances (up to 12 pods of up to 4 shapes, up to 6 instance types): the plan is within
/// 2% of the exact optimum, the LP lower bound is at most the optimum, and every node holds its
/// pods.
#[test]
fn plans_are_within_two_percent_of_the_optimum_on_small_instances() {
    let mut rng = Rng(2026);
    let mut exact = 0;
    for case in 0..40 {
        let types = 2 + rng.below(5) as usize;
        let offerings: Vec<Offering> = (0..types)
            .map(|i| {
                let vcpu = [1u32, 2, 4, 8][rng.below(4) as usize];
                let gib = u64::from(vcpu) * [1u64, 2, 4, 8][rng.below(4) as usize];
                // Prices per vCPU and GiB that differ by type, so families compete.
                let price = f64::from(vcpu) * (0.02 + rng.below(20) as f64 * 0.002) + gib as f64 * (0.003 + rng.below(10) as f64 * 0.0005);
                synthetic(i, vcpu, gib, 110, (price * 1e4).round() / 1e4)
            })
            .collect();
        let largest = offerings.iter().map(|o| o.instance.allocatable).max().expect("types");
        let mut all = Vec::new();
        let shapes = 1 + rng.below(4) as usize;
        for s in 0..shapes {
            let cpu = [250, 500, 750, 1000, 1500, 2000][rng.below(6) as usize].min(largest.cpu_millis);
            let mem = [256, 512, 1024, 2048, 3072, 4096][rng.below(6) as usize].min(largest.memory_bytes / MIB);
            let n = 1 + rng.below(4) as usize;
            all.extend(pods(&format!("s{s}"), n, cpu, mem, "linux/amd64"));
        }
        all.truncate(12);
        // Every pod must fit the largest type in both dimensions at once.
        all.retain(|p| offerings.iter().any(|o| p.requests.fits(o.instance.allocatable)));
        let optimum = exhaustive(&all, &offerings);
        let plan = pack(&all, &[pool("default")], &offerings, &[]);
        assert!(plan.unschedulable.is_empty(), "case {case}: {:?}", plan.unschedulable);
        let placed: usize = plan.nodes.iter().map(|n| n.pods.len()).sum();
        assert_eq!(placed, all.len(), "case {case}");
        for n in &plan.nodes {
            let o = offerings.iter().find(|o| o.instance.name == n.instance_type).expect("offering");
            let used = n.pods.iter().fold(Resources::default(), |acc, id| acc + all.iter().find(|p| &p.id == id).map(|p| Resources::new(p.requests.cpu_millis, p.requests.memory_bytes, 1)).unwrap_or_default());
            assert!(used.fits(o.instance.allocatable), "case {case}: node {n:?} overfull: {used:?}");
        }
        assert!(plan.lower_bound_per_hour > 0.0, "case {case}: a bound");
        assert!(plan.lower_bound_per_hour <= optimum * (1.0 + 1e-9), "case {case}: bound {} above the optimum {optimum}", plan.lower_bound_per_hour);
        assert!(plan.total_price_per_hour >= optimum * (1.0 - 1e-9), "case {case}: the plan {} beats the optimum {optimum}", plan.total_price_per_hour);
        assert!(plan.total_price_per_hour <= optimum * 1.02 + 1e-9, "case {case}: plan {} vs optimum {optimum} ({} pods, {} types): {:?}", plan.total_price_per_hour, all.len(), offerings.len(), plan.nodes);
        if (plan.total_price_per_hour - optimum).abs() <= 1e-9 * optimum {
            exact += 1;
        }
    }
    eprintln!("{exact} of 40 small instances planned at the exact optimum");
}

/// A class of `n` pods of `cpu` millis and `gib` GiB that may use every offering of pool 0.
fn class_of(name: &str, n: usize, cpu: i64, gib: i64, offerings: &[Offering], per_node_max: Option<usize>) -> Class {
    let slots: Vec<Slot> = (0..offerings.len()).map(|oi| (0, oi)).collect();
    Class {
        pods: (0..n).map(|i| format!("{name}-{i}")).collect(),
        requests: Resources::new(cpu, gib * 1024 * MIB, 1),
        offerings: slots.clone(),
        lower_bound: 0.0,
        zone_spread: false,
        per_node_max,
        zone_group: None,
        spread_group: None,
        one_per_zone: false,
        colocate: false,
        preference: Default::default(),
        mask: slots.into_iter().collect(),
        extended: BTreeMap::new(),
        fallback: Vec::new(),
    }
}

/// Each draft's pods fit its offering, and every pod of `classes` is on exactly one draft.
fn assert_feasible(drafts: &[Draft], classes: &[Class], offerings: &[Offering]) {
    let mut seen: Vec<&String> = drafts.iter().flat_map(|d| d.items.iter().flat_map(|(_, p)| p)).collect();
    for d in drafts {
        assert!(d.used(classes).fits(offerings[d.oi].instance.allocatable), "node {} overfull", offerings[d.oi].instance.name);
    }
    seen.sort();
    let mut all: Vec<&String> = classes.iter().flat_map(|c| &c.pods).collect();
    all.sort();
    assert_eq!(seen, all);
}

#[test]
fn a_node_of_the_wrong_kind_is_split_into_two_cheaper_nodes() {
    // Four 3.5-cpu pods on a 16-vCPU memory-heavy node ($1.00) fit two 8-vCPU nodes ($0.30 each).
    let offerings = vec![synthetic(0, 16, 128, 110, 1.0), synthetic(1, 8, 16, 110, 0.3)];
    let room = |_: usize, oi: usize| offerings[oi].instance.allocatable;
    let classes = vec![class_of("a", 4, 3500, 4, &offerings, None)];
    let mut drafts = vec![Draft { pi: 0, oi: 0, items: vec![(0, classes[0].pods.clone())] }];
    split::split_nodes(&mut drafts, &classes, &offerings, &room);
    assert_eq!(drafts.len(), 2);
    assert!(drafts.iter().all(|d| d.oi == 1));
    assert_feasible(&drafts, &classes, &offerings);

    // No saving, no split: two nodes of $0.60 cost more than the one.
    let dear = vec![synthetic(0, 16, 128, 110, 1.0), synthetic(1, 8, 16, 110, 0.6)];
    let room = |_: usize, oi: usize| dear[oi].instance.allocatable;
    let mut drafts = vec![Draft { pi: 0, oi: 0, items: vec![(0, classes[0].pods.clone())] }];
    split::split_nodes(&mut drafts, &classes, &dear, &room);
    assert_eq!(drafts.len(), 1);

    // A per-node cap counts per node: such a node is left whole.
    let capped = vec![class_of("a", 4, 3500, 4, &offerings, Some(4))];
    let room = |_: usize, oi: usize| offerings[oi].instance.allocatable;
    let mut drafts = vec![Draft { pi: 0, oi: 0, items: vec![(0, capped[0].pods.clone())] }];
    split::split_nodes(&mut drafts, &capped, &offerings, &room);
    assert_eq!(drafts.len(), 1);
}

#[test]
fn two_partly_filled_nodes_are_merged_into_one_within_caps() {
    // Two $0.30 nodes each a third full: one of them holds both.
    let offerings = vec![synthetic(0, 8, 16, 110, 0.3), synthetic(1, 2, 4, 110, 0.1)];
    let room = |_: usize, oi: usize| offerings[oi].instance.allocatable;
    let classes = vec![class_of("a", 2, 3000, 4, &offerings, None)];
    let split_pods = |c: &Class| vec![Draft { pi: 0, oi: 0, items: vec![(0, vec![c.pods[0].clone()])] }, Draft { pi: 0, oi: 0, items: vec![(0, vec![c.pods[1].clone()])] }];
    let mut drafts = split_pods(&classes[0]);
    merge::merge_pairs(&mut drafts, &classes, &offerings, &room);
    assert_eq!(drafts.len(), 1);
    assert_eq!(drafts[0].oi, 0);
    assert_feasible(&drafts, &classes, &offerings);

    // One pod per node (required anti-affinity to its own replicas): never merged.
    let capped = vec![class_of("a", 2, 3000, 4, &offerings, Some(1))];
    let mut drafts = split_pods(&capped[0]);
    merge::merge_pairs(&mut drafts, &capped, &offerings, &room);
    assert_eq!(drafts.len(), 2);
}

#[test]
fn pods_bound_while_the_plan_was_made_leave_it_and_emptied_nodes_are_not_bought() {
    let node = |name: &str, price: f64, pods: &[&str]| PlannedNode { name: name.into(), pool: "p".into(), instance_type: "t".into(), arch: "arm64".into(), zone: "z".into(), capacity_type: "on-demand".into(), price_per_hour: price, pods: pods.iter().map(|p| p.to_string()).collect(), labels: Default::default() };
    let plan = Plan {
        nodes: vec![node("a", 1.0, &["ns/1", "ns/2"]), node("b", 2.0, &["ns/3"])],
        existing: [("ns/4".to_string(), "old".to_string()), ("ns/5".to_string(), "old".to_string())].into(),
        unschedulable: vec![Unschedulable { pod: "ns/6".into(), reason: "r".into() }],
        total_price_per_hour: 3.0,
        lower_bound_per_hour: 2.5,
    };
    assert_eq!(plan.clone().without(&Default::default()), plan, "nothing gone: the same plan");
    let gone: std::collections::HashSet<String> = ["ns/2", "ns/3", "ns/4", "ns/6"].iter().map(|s| s.to_string()).collect();
    let left = plan.without(&gone);
    assert_eq!(left.nodes, vec![node("a", 1.0, &["ns/1"])], "b had only a gone pod: not bought");
    assert_eq!(left.existing.keys().collect::<Vec<_>>(), vec!["ns/5"]);
    assert!(left.unschedulable.is_empty());
    assert_eq!(left.total_price_per_hour, 1.0);
    assert_eq!(left.lower_bound_per_hour, 0.0);
}

#[test]
fn the_offering_keys_are_exactly_the_labels_an_offering_sets() {
    let offerings = Offering::embedded_on_demand();
    let Some(o) = offerings.first() else { panic!("the embedded catalog has offerings") };
    let plain = Pool { name: "p".into(), weight: 0, requirements: Requirements::new(), labels: Default::default(), taints: Vec::new(), limit_cpu_millis: None, limit_memory_bytes: None, limit_nodes: None, daemons: Vec::new(), closed: None, variant: Default::default() };
    let labels = o.labels(&plain);
    let keys: std::collections::BTreeSet<&str> = labels.keys().map(String::as_str).collect();
    let listed: std::collections::BTreeSet<&str> = OFFERING_KEYS.iter().chain(crate::cloud_labels::AWS_KEYS.iter()).copied().collect();
    assert_eq!(keys, listed);
    assert!(keys.iter().all(|k| Offering::sets_label(k)));
    assert!(!Offering::sets_label("capacity.spread"));
}

/// An Azure size's node carries Karpenter on Azure's labels, and no EC2 ones.
#[test]
fn azure_offerings_carry_the_labels_karpenter_on_azure_writes() {
    let c = crate::catalog::Catalog::embedded().expect("catalog");
    let t = c.get("Standard_D2pds_v5").expect("size").clone();
    let plain = Pool { name: "p".into(), weight: 0, requirements: Requirements::new(), labels: Default::default(), taints: Vec::new(), limit_cpu_millis: None, limit_memory_bytes: None, limit_nodes: None, daemons: Vec::new(), closed: None, variant: Default::default() };
    let spot = Offering { instance: t.clone(), zone: "eastus-2".into(), capacity: CapacityType::Spot, price: 0.03, pool: None };
    let labels = spot.labels(&plain);
    let get = |k: &str| labels.get(k).map(String::as_str);
    assert_eq!(get("karpenter.azure.com/sku-name"), Some("Standard_D2pds_v5"));
    assert_eq!(get("karpenter.azure.com/sku-family"), Some("D"));
    assert_eq!(get("karpenter.azure.com/sku-series"), Some("Dpds_v5"));
    assert_eq!(get("karpenter.azure.com/sku-version"), Some("5"));
    assert_eq!(get("karpenter.azure.com/sku-cpu"), Some("2"));
    assert_eq!(get("karpenter.azure.com/sku-memory"), Some("8192"), "MiB");
    assert_eq!(get("kubernetes.azure.com/sku-cpu"), Some("2"));
    assert_eq!(get("kubernetes.azure.com/sku-memory"), Some("8192"));
    assert_eq!(get("karpenter.azure.com/sku-networking-accelerated"), Some("true"));
    assert_eq!(get("karpenter.azure.com/sku-storage-premium-capable"), Some("true"));
    assert_eq!(get("karpenter.azure.com/sku-gpu-count"), Some("0"));
    assert_eq!(get("kubernetes.azure.com/scalesetpriority"), Some("spot"));
    assert_eq!(get("topology.kubernetes.io/zone"), Some("eastus-2"));
    assert_eq!(get("topology.kubernetes.io/region"), Some("eastus"));
    assert!(!labels.keys().any(|k| k.starts_with("karpenter.k8s.aws/")), "no EC2 labels");
    assert_eq!(Offering { capacity: CapacityType::OnDemand, ..spot.clone() }.labels(&plain).get("kubernetes.azure.com/scalesetpriority").map(String::as_str), Some("regular"));
    assert!(labels.keys().all(|k| Offering::sets_label(k)), "every key an offering sets is known as one");
    // A pool selects on them with Karpenter's operators.
    let mut r = Requirements::new();
    r.add("karpenter.azure.com/sku-family", "In", &["D".into()]).expect("req");
    r.add("karpenter.azure.com/sku-cpu", "Lt", &["5".into()]).expect("req");
    assert!(r.matches_map(&labels));
    r.add("karpenter.azure.com/sku-cpu", "Gt", &["2".into()]).expect("req");
    assert!(!r.matches_map(&labels), "2 vCPU is not above 2");
    // A size with an ephemeral OS disk fact carries the label; the catalog's embedded sizes lack the fact.
    let mut with_disk = (*t).clone();
    with_disk.facts.insert("ephemeral_os_max_gb".into(), "75".into());
    let disk = Offering { instance: std::sync::Arc::new(with_disk), ..spot };
    assert_eq!(disk.labels(&plain).get("karpenter.azure.com/sku-storage-ephemeralos-maxsize").map(String::as_str), Some("75"));
}

#[test]
fn zones_name_their_regions_in_both_clouds() {
    assert_eq!(region_of("us-east-1a"), "us-east-1");
    assert_eq!(region_of("us-east-1"), "us-east-1");
    assert_eq!(region_of("eastus-2"), "eastus");
    assert_eq!(region_of("eastus2-1"), "eastus2");
    assert_eq!(region_of("westeurope"), "westeurope");
}

#[test]
fn at_equal_price_per_pod_fewer_larger_nodes_win() {
    // Sizes priced exactly by their room (0.0125 per pod slot of 1 cpu/1 GiB), the smallest
    // listed first: the plan costs the same whichever it takes, and takes the largest.
    let offerings: Vec<Offering> = [(1u32, 1u64, 0.0125), (2, 2, 0.025), (4, 4, 0.05), (8, 8, 0.1)].iter().enumerate().map(|(i, &(c, g, p))| synthetic(i, c, g, 110, p)).collect();
    let plan = pack(&pods("web", 16, 1000, 1024, "linux/amd64"), &[pool("default")], &offerings, &[]);
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    assert!((plan.total_price_per_hour - 0.2).abs() < 1e-9, "{}", plan.total_price_per_hour);
    assert_eq!(plan.nodes.iter().map(|n| n.instance_type.as_str()).collect::<Vec<_>>(), ["t3", "t3"]);
    // The price reported is the offering's, not the tie-break's.
    assert!(plan.nodes.iter().all(|n| n.price_per_hour == 0.1));
}

/// A pool's own offering (a NodeOverlay priced it for that pool alone) replaces the shared one of
/// the same type, zone and capacity type in that pool only: pool `a` plans m6g.large at its own
/// price (dearer there, so c6g.large wins), pool `b` at the shared price.
#[test]
fn a_pools_own_offering_prices_that_pool_alone() {
    let c = Catalog::embedded().expect("catalog");
    let offering = |name: &str, price: f64, pool: Option<&str>| Offering { instance: c.get(name).expect("type").clone(), zone: "us-east-1a".into(), capacity: CapacityType::OnDemand, price, pool: pool.map(Arc::from) };
    let offerings = vec![offering("m6g.large", 0.05, None), offering("c6g.large", 0.06, None), offering("m6g.large", 0.5, Some("a"))];
    let pod = pods("p", 1, 500, 1024, "linux/arm64");
    let only = |name: &str| Pool { weight: 10, ..pool(name) };
    let plan = pack(&pod, &[only("a")], &offerings, &[]);
    assert_eq!(plan.nodes.iter().map(|n| (n.instance_type.as_str(), n.price_per_hour)).collect::<Vec<_>>(), [("c6g.large", 0.06)], "pool a: its own m6g price");
    let plan = pack(&pod, &[only("b")], &offerings, &[]);
    assert_eq!(plan.nodes.iter().map(|n| (n.instance_type.as_str(), n.price_per_hour)).collect::<Vec<_>>(), [("m6g.large", 0.05)], "pool b: the shared price; a's own is not b's");
    // Finding a node's offering by its pool.
    assert_eq!(Offering::find_for_pool(&offerings, "a", "m6g.large", "us-east-1a", "on-demand").map(|o| o.price), Some(0.5));
    assert_eq!(Offering::find_for_pool(&offerings, "b", "m6g.large", "us-east-1a", "on-demand").map(|o| o.price), Some(0.05));
    assert_eq!(Offering::find(&offerings, "m6g.large", "us-east-1a", "on-demand").map(|o| o.price), Some(0.05));
    let labels: BTreeMap<&str, &str> = [(crate::labels::INSTANCE_TYPE, "m6g.large"), (crate::labels::ZONE, "us-east-1a"), (crate::labels::KARPENTER_NODEPOOL, "a")].into();
    assert_eq!(Offering::of_node(&offerings, &|k| labels.get(k).map(|v| v.to_string())).map(|o| o.price), Some(0.5));
}

/// Extended resources other than GPUs (a NodeOverlay's `capacity`) bound every phase of the
/// packer: the relaxation's fourth dimension (the fuse pods, where the device and not the cpu
/// is what runs out), the greedy pass for a class that asks for two resources, and the split,
/// merge and right-sizing of planned nodes. No node holds more than its type offers, and pods
/// never land on a type without the resource however cheap it is.
#[test]
fn overlay_capacity_bounds_every_node() {
    let sized = |i: usize, vcpu: u32, gib: u64, price: f64, extended: &[(&str, i64)]| {
        let mut o = synthetic(i, vcpu, gib, 110, price);
        let mut t = (*o.instance).clone();
        t.extended = extended.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        o.instance = Arc::new(t);
        o
    };
    let offerings = vec![
        sized(0, 4, 16, 0.20, &[("smarter-devices/fuse", 2)]),
        sized(1, 8, 32, 0.45, &[("smarter-devices/fuse", 8), ("example.com/dongle", 1)]),
        sized(2, 16, 64, 0.30, &[]),
    ];
    let with = |mut p: Vec<PendingPod>, extended: &[(&str, i64)]| {
        for x in &mut p {
            x.extended = extended.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        }
        p
    };
    let mut all = with(pods("fuse", 30, 500, 512, "linux/amd64"), &[("smarter-devices/fuse", 1)]);
    all.extend(with(pods("both", 2, 500, 512, "linux/amd64"), &[("smarter-devices/fuse", 1), ("example.com/dongle", 1)]));
    all.extend(pods("plain", 20, 1000, 2048, "linux/amd64"));
    all.extend(with(pods("fpga", 1, 500, 512, "linux/amd64"), &[("example.com/fpga", 1)]));
    let plan = pack(&all, &[pool("default")], &offerings, &[]);
    assert_eq!(plan.unschedulable.iter().map(|u| u.pod.as_str()).collect::<Vec<_>>(), ["default/fpga-0"], "{:?}", plan.unschedulable);
    assert!(plan.unschedulable[0].reason.contains("example.com/fpga"), "{:?}", plan.unschedulable);
    for n in &plan.nodes {
        let o = offerings.iter().find(|o| o.instance.name == n.instance_type).expect("offering");
        let mut used: BTreeMap<&str, i64> = BTreeMap::new();
        for id in &n.pods {
            let p = all.iter().find(|p| &p.id == id).expect("pod");
            for (k, v) in &p.extended {
                *used.entry(k).or_insert(0) += v;
            }
        }
        for (k, v) in &used {
            assert!(*v <= o.instance.extended_resource(k), "{} holds {v} {k}, its type offers {}: {n:?}", n.instance_type, o.instance.extended_resource(k));
        }
    }
    let on = |prefix: &str| plan.nodes.iter().filter(|n| n.pods.iter().any(|p| p.contains(prefix))).map(|n| n.instance_type.as_str()).collect::<std::collections::BTreeSet<_>>();
    assert!(!on("fuse").contains("t2"), "{:?}", plan.nodes);
    assert_eq!(on("both"), ["t1"].into(), "{:?}", plan.nodes);
    let fuse_nodes = plan.nodes.iter().filter(|n| n.pods.iter().any(|p| p.contains("fuse") || p.contains("both"))).count();
    assert!(fuse_nodes >= 4, "32 fuse pods need at least four nodes of eight devices: {:?}", plan.nodes);
}

#[test]
fn launchable_offerings_are_those_a_pool_admits_on_the_keys_an_offering_sets_and_every_one_a_plan_buys() {
    let offerings = on_demand();
    let names = |pools: &[Pool]| launchable(pools, &offerings).map(|o| (o.instance.name.clone(), o.zone.clone())).collect::<std::collections::BTreeSet<_>>();
    let mut gs = pool("getting-started");
    gs.requirements = Requirements::from_expressions(&[
        k8s_openapi::api::core::v1::NodeSelectorRequirement { key: "karpenter.k8s.aws/instance-category".into(), operator: "In".into(), values: Some(vec!["c".into(), "m".into(), "r".into()]) },
        k8s_openapi::api::core::v1::NodeSelectorRequirement { key: "topology.kubernetes.io/zone".into(), operator: "In".into(), values: Some(vec!["us-east-1b".into()]) },
    ])
    .expect("requirements");
    let kept = names(std::slice::from_ref(&gs));
    assert!(!kept.is_empty());
    for o in &offerings {
        let admitted = gs.requirements.matches_map(&o.labels(&gs));
        assert_eq!(kept.contains(&(o.instance.name.clone(), o.zone.clone())), admitted, "{} in {}", o.instance.name, o.zone);
    }
    // A custom key is not read: the planner's copies of the pool for its values buy from the
    // same offerings.
    let mut team = gs.clone();
    team.requirements = gs.requirements.intersect(&Requirements::from_expressions(&[k8s_openapi::api::core::v1::NodeSelectorRequirement { key: "example.com/tier".into(), operator: "In".into(), values: Some(vec!["1".into(), "2".into()]) }]).expect("requirements"));
    assert_eq!(names(std::slice::from_ref(&team)), kept);
    // Two pools: either's offerings.
    assert_eq!(names(&[gs, pool("any")]).len(), offerings.len());
    // A pool's own offering is another pool's only if it is that pool's.
    let mut own = offerings[0].clone();
    own.pool = Some("other".into());
    let only_own = [own];
    assert_eq!(launchable(&[pool("any")], &only_own).count(), 0);
    assert_eq!(launchable(&[pool("other")], &only_own).count(), 1);
    // Whatever a plan buys is launchable.
    let plan = pack(&pods("a", 30, 1500, 6000, "linux/amd64,linux/arm64"), &[team.clone()], &offerings, &[]);
    assert!(!plan.nodes.is_empty());
    for n in &plan.nodes {
        assert!(kept.contains(&(n.instance_type.clone(), n.zone.clone())), "{n:?}");
    }
}
