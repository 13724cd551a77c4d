//! The AWS provider end to end: the real control plane, `archer serve --cloud-provider aws`
//! against moto's server (real EC2 and SQS calls), and the harness playing the kubelet and the
//! cloud controller: when moto reports a running instance of the cluster, a Node registers with
//! the instance's `providerID` (`aws:///<zone>/<id>`), name (its private DNS name), type and zone,
//! and the labels and taints the launch's user data gives the kubelet; kwok makes it Ready and
//! runs its pods. A terminated instance's Node is deleted, as the cloud node controller does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use archer::provisioner::cloud::aws::nodeclass::EC2NodeClass;
use archer::provisioner::nodeclaim::NodeClaim;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::provisioning::{claims, pool, scale};
use super::{deployment, namespace, running_pods, wait, wait_running};
use crate::cluster::Cluster;
use crate::common::moto::{Moto, CLUSTER};

const QUEUE: &str = "archer-interruptions";

const NODE_CLASS: &str = "apiVersion: archer.dev/v1alpha1\nkind: EC2NodeClass\nmetadata: {name: default}\nspec:\n  role: KarpenterNodeRole-e2e\n  amiSelectorTerms: [{alias: al2023@latest}]\n  subnetSelectorTerms: [{tags: {karpenter.sh/discovery: archer-test}}]\n  securityGroupSelectorTerms: [{tags: {karpenter.sh/discovery: archer-test}}]\n";

const AWS_POOL: &str = "apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: archer.dev, kind: EC2NodeClass, name: default}\n      requirements:\n        - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}\n        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}\n  disruption:\n    consolidationPolicy: WhenEmptyOrUnderutilized\n    consolidateAfter: 5s\n";

/// A cluster whose Archer runs the aws provider against a fresh moto (network and interruption
/// queue made), with the node class applied and Ready.
async fn aws_cluster(name: &str, extra: &[&str], env: &[(&str, &str)]) -> (Cluster, Moto) {
    aws_cluster_through(name, extra, env, false).await
}

/// [`aws_cluster`], with Archer's EC2 calls through a proxy that refuses every launch when
/// `refuse_launches` (the harness's own calls go to moto directly).
async fn aws_cluster_through(name: &str, extra: &[&str], env: &[(&str, &str)], refuse_launches: bool) -> (Cluster, Moto) {
    aws_cluster_in(name, crate::common::moto::REGION, extra, env, refuse_launches).await
}

/// [`aws_cluster_through`] in `region` (moto's fixtures and Archer's settings).
async fn aws_cluster_in(name: &str, region: &str, extra: &[&str], env: &[(&str, &str)], refuse_launches: bool) -> (Cluster, Moto) {
    let mut c = Cluster::start(name).await;
    let moto = Moto::start_in(region).await;
    moto.network().await;
    let sqs = aws_sdk_sqs::Client::new(&moto.sdk().await);
    sqs.create_queue().queue_name(QUEUE).send().await.expect("queue");
    let endpoint = if refuse_launches { crate::common::moto::launch_refusing_proxy(moto.endpoint.clone()).await } else { moto.endpoint.clone() };
    c.stop_archer();
    c.cloud_provider = "aws";
    c.provisioner_config = ["registrationTimeoutSeconds: 600", "garbageGraceSeconds: 5", "aws:", &format!("  clusterName: {CLUSTER}"), &format!("  region: {region}"), &format!("  endpoint: {endpoint}"), &format!("  interruptionQueue: {QUEUE}"), "  nodeClassRefreshSeconds: 2"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for line in extra {
        // A line of the same key (indented alike: `  key:` is one of `aws:`) replaces the
        // default above.
        let key = format!("{}:", line.split(':').next().unwrap_or_default());
        match c.provisioner_config.iter().position(|l| l.starts_with(&key)) {
            Some(i) => c.provisioner_config[i] = line.to_string(),
            // A new key of `aws:` goes under it; any other at the top.
            None if line.starts_with("  ") => {
                let aws = c.provisioner_config.iter().position(|l| l == "aws:").map_or(0, |i| i + 1);
                c.provisioner_config.insert(aws, line.to_string());
            }
            None => c.provisioner_config.insert(0, line.to_string()),
        }
    }
    c.archer_env = [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_EC2_METADATA_DISABLED", "true")].iter().chain(env).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    c.start_archer().await;
    let client = c.client().await;
    let nc: EC2NodeClass = archer::yaml::from_str(NODE_CLASS).expect("node class");
    Api::<EC2NodeClass>::all(client.clone()).create(&PostParams::default(), &nc).await.expect("create node class");
    let classes: Api<EC2NodeClass> = Api::all(client.clone());
    wait("the node class Ready", Duration::from_secs(60), || async {
        classes.get("default").await.ok().and_then(|n| n.status).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True") && s.subnets.len() == 3 && s.amis.len() == 2)
    })
    .await;
    (c, moto)
}

/// The harness's kubelets: registers a Node for every running instance (except those of the
/// pools in `silent`), deletes the Node of every terminated one. Stops when dropped.
struct Kubelets {
    stop: Arc<AtomicBool>,
}

impl Drop for Kubelets {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn kubelets(client: Client, moto_sdk: aws_config::SdkConfig, silent: &[&str]) -> Kubelets {
    let stop = Arc::new(AtomicBool::new(false));
    let silent: BTreeSet<String> = silent.iter().map(|s| s.to_string()).collect();
    let flag = stop.clone();
    tokio::spawn(async move {
        let ec2 = aws_sdk_ec2::Client::new(&moto_sdk);
        let nodes: Api<Node> = Api::all(client.clone());
        let claims_api: Api<NodeClaim> = Api::all(client.clone());
        let mut registered: BTreeSet<String> = BTreeSet::new();
        while !flag.load(Ordering::Relaxed) {
            let Ok(r) = ec2.describe_instances().filters(aws_sdk_ec2::types::Filter::builder().name("tag:archer.dev/cluster").values(CLUSTER).build()).send().await else {
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            };
            for i in r.reservations().iter().flat_map(|r| r.instances()) {
                let name = i.private_dns_name().unwrap_or_default().to_string();
                let state = i.state().and_then(|s| s.name()).map(|s| s.as_str().to_string()).unwrap_or_default();
                if state == "terminated" || state == "shutting-down" {
                    if registered.remove(&name) {
                        let _ = nodes.delete(&name, &DeleteParams::default()).await;
                    }
                    continue;
                }
                if state != "running" || registered.contains(&name) {
                    continue;
                }
                let claim_name = i.tags().iter().find(|t| t.key() == Some("archer.dev/nodeclaim")).and_then(|t| t.value()).unwrap_or_default();
                let Ok(Some(claim)) = claims_api.get_opt(claim_name).await else { continue };
                if silent.contains(&claim.spec.node_pool) {
                    continue;
                }
                let node = kubelet_node(&name, i, &claim);
                match nodes.create(&PostParams::default(), &node).await {
                    Ok(_) => drop(registered.insert(name)),
                    Err(kube::Error::Api(s)) if s.code == 409 => drop(registered.insert(name)),
                    Err(e) => eprintln!("kubelet {name}: {e}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    Kubelets { stop }
}

/// The Node a kubelet on this instance registers: the instance's type and zone, the claim's
/// labels and taints (the launch template's user data passes them to the kubelet) and the
/// unregistered taint.
fn kubelet_node(name: &str, i: &aws_sdk_ec2::types::Instance, claim: &NodeClaim) -> Node {
    let catalog = archer::catalog::Catalog::embedded().expect("catalog");
    let it = i.instance_type().map(|t| t.as_str().to_string()).unwrap_or_default();
    let t = catalog.get(&it).unwrap_or_else(|| panic!("{it} not in the catalog")).clone();
    let zone = i.placement().and_then(|p| p.availability_zone()).unwrap_or_default().to_string();
    let mut labels: BTreeMap<String, String> = claim.spec.labels.clone();
    for (k, v) in [
        ("kubernetes.io/hostname", name.to_string()),
        ("kubernetes.io/arch", t.arch.clone()),
        ("kubernetes.io/os", "linux".into()),
        ("node.kubernetes.io/instance-type", it.clone()),
        ("topology.kubernetes.io/zone", zone.clone()),
        ("topology.kubernetes.io/region", zone.trim_end_matches(|c: char| c.is_ascii_lowercase()).to_string()),
        ("type", "kwok".into()),
    ] {
        labels.insert(k.into(), v);
    }
    let mut taints: Vec<serde_json::Value> = claim.spec.taints.iter().chain(&claim.spec.startup_taints).map(|t| json!({"key": t.key, "value": t.value, "effect": t.effect})).collect();
    taints.push(json!({"key": "karpenter.sh/unregistered", "effect": "NoSchedule"}));
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"providerID": format!("aws:///{zone}/{}", i.instance_id().unwrap_or_default()), "taints": taints},
        "status": {
            "capacity": {"cpu": t.vcpu.to_string(), "memory": format!("{}Mi", t.memory_mib), "pods": t.max_pods.to_string()},
            "allocatable": {"cpu": t.allocatable_cpu, "memory": t.allocatable_memory, "pods": t.max_pods.to_string()}
        }
    }))
    .expect("node")
}

async fn live_instances(moto: &Moto) -> Vec<aws_sdk_ec2::types::Instance> {
    let mut all = moto.instances("running").await;
    all.extend(moto.instances("pending").await);
    all
}

/// Workshop scenario 1 with real EC2 calls: an amd64 on-demand Deployment and one pinned to
/// c6g.xlarge scaled 0 -> 2: instances of the right types launch, register and run the pods;
/// scaled to 0: the nodes go and their instances are terminated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn aws_scenario_1_scale_up_and_to_zero_with_real_ec2_calls() {
    let (c, moto) = aws_cluster("aws-scenario-1", &[], &[]).await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    let _kubelets = kubelets(client.clone(), moto.sdk().await, &[]);
    c.registry.push_index("apps/inflate", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    namespace(&client, "workshop", json!({})).await;
    pool(&client, AWS_POOL).await;
    let image = c.registry.image("apps/inflate:1");
    let spec = |selector: serde_json::Value| json!({"nodeSelector": selector, "containers": [{"name": "app", "image": image, "resources": {"requests": {"cpu": "1", "memory": "1536Mi"}}}]});
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "workshop");
    deploys.create(&PostParams::default(), &deployment("inflate-amd64", "unused", 0, spec(json!({"kubernetes.io/arch": "amd64"})))).await.expect("create");
    deploys.create(&PostParams::default(), &deployment("inflate-arm64", "unused", 0, spec(json!({"kubernetes.io/arch": "arm64", "node.kubernetes.io/instance-type": "c6g.xlarge"})))).await.expect("create");
    let t0 = Instant::now();
    scale(&client, "workshop", "inflate-amd64", 2).await;
    scale(&client, "workshop", "inflate-arm64", 2).await;
    wait_running(&client, "workshop", "inflate-amd64", 2, Duration::from_secs(120)).await;
    let arm_pods = wait_running(&client, "workshop", "inflate-arm64", 2, Duration::from_secs(120)).await;
    eprintln!("aws scenario 1: 4 pods Running on EC2 (moto) instances in {:?}", t0.elapsed());

    let instances = live_instances(&moto).await;
    let written = claims(&client).await;
    assert_eq!(instances.len(), written.len(), "one instance per claim");
    let nodes: Vec<Node> = Api::<Node>::all(client.clone()).list(&Default::default()).await.expect("nodes").items;
    for cl in &written {
        let s = cl.status.clone().expect("launched");
        let pid = s.provider_id.expect("provider id");
        assert!(pid.starts_with("aws:///us-east-1"), "{pid}");
        let node = nodes.iter().find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(pid.as_str())).expect("a node for every claim");
        assert_eq!(node.metadata.name, s.node_name, "the claim names its node");
        assert!(!node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default().iter().any(|t| t.key == "karpenter.sh/unregistered"), "registered");
    }
    for p in &arm_pods {
        let node = nodes.iter().find(|n| n.metadata.name.as_deref() == p.spec.as_ref().and_then(|s| s.node_name.as_deref())).expect("node");
        assert_eq!(node.metadata.labels.as_ref().and_then(|l| l.get("node.kubernetes.io/instance-type")).map(String::as_str), Some("c6g.xlarge"));
    }
    let arm = instances.iter().filter(|i| i.instance_type().map(|t| t.as_str()) == Some("c6g.xlarge")).count();
    assert!(arm >= 1, "a c6g.xlarge instance was launched");

    scale(&client, "workshop", "inflate-amd64", 0).await;
    scale(&client, "workshop", "inflate-arm64", 0).await;
    let t1 = Instant::now();
    loop {
        let (live, left) = (live_instances(&moto).await.len(), claims(&client).await.len());
        if live == 0 && left == 0 {
            break;
        }
        assert!(t1.elapsed() < Duration::from_secs(90), "{live} instances and {left} claims left after scaling to zero");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("aws scenario 1: scaled to 0, every instance terminated in {:?}", t1.elapsed());
    assert!(moto.instances("terminated").await.len() >= instances.len());
}

/// A spot interruption warning on the queue: the node is tainted, a replacement launched, the
/// pods evicted and running again elsewhere, the instance terminated, the message consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn aws_spot_interruption_drains_and_replaces_with_no_pod_lost() {
    let (c, moto) = aws_cluster("aws-interruption", &[], &[]).await;
    let client = c.client().await;
    let _kubelets = kubelets(client.clone(), moto.sdk().await, &[]);
    c.registry.push_image("apps/web", "1", "linux/amd64", true).await;
    namespace(&client, "shop", json!({})).await;
    pool(&client, AWS_POOL).await;
    let d = deployment("web", &c.registry.image("apps/web:1"), 3, json!({}));
    Api::<Deployment>::namespaced(client.clone(), "shop").create(&PostParams::default(), &d).await.expect("create");
    let pods = wait_running(&client, "shop", "web", 3, Duration::from_secs(120)).await;
    let victim_node = pods[0].spec.as_ref().and_then(|s| s.node_name.clone()).expect("node");
    let node: Node = Api::<Node>::all(client.clone()).get(&victim_node).await.expect("node");
    let pid = node.spec.and_then(|s| s.provider_id).expect("provider id");
    let instance = pid.rsplit('/').next().expect("id").to_string();
    let sqs = aws_sdk_sqs::Client::new(&moto.sdk().await);
    let url = sqs.get_queue_url().queue_name(QUEUE).send().await.expect("url").queue_url().map(String::from).expect("url");
    let message = json!({"version": "0", "id": "e2e-1", "detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2", "account": "123456789012", "region": "us-east-1",
        "resources": [format!("arn:aws:ec2:us-east-1:123456789012:instance/{instance}")], "detail": {"instance-id": instance, "instance-action": "terminate"}});
    sqs.send_message().queue_url(&url).message_body(message.to_string()).send().await.expect("send");
    sqs.send_message().queue_url(&url).message_body("{ not an event").send().await.expect("send");
    let nodes: Api<Node> = Api::all(client.clone());
    let t0 = Instant::now();
    wait("the interrupted node gone", Duration::from_secs(120), || async { nodes.get_opt(&victim_node).await.ok().flatten().is_none() }).await;
    wait_running(&client, "shop", "web", 3, Duration::from_secs(120)).await;
    eprintln!("aws interruption: node drained, replaced and its pods Running again in {:?}", t0.elapsed());
    let terminated: Vec<String> = moto.instances("terminated").await.iter().filter_map(|i| i.instance_id().map(String::from)).collect();
    assert!(terminated.contains(&instance), "the interrupted instance is terminated");
    let replacement: Vec<NodeClaim> = claims(&client).await.into_iter().filter(|c| c.spec.reason.as_deref() == Some("replacement")).collect();
    assert_eq!(replacement.len(), 1, "a replacement was planned and launched for the interrupted node's pods");
    let running = running_pods(&client, "shop", "web").await;
    assert!(running.iter().all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(victim_node.as_str())));
    assert!(c.archer_metric("archer_interruption_messages_total{kind=\"spot-interruption\",outcome=\"handled\"}").await >= 1.0);
    assert!(c.archer_metric("archer_interruption_messages_total{kind=\"unknown\",outcome=\"malformed\"}").await >= 1.0);
    assert!(c.archer_metric("archer_pod_evictions_total{reason=\"interrupted\"}").await >= 1.0);
    let left = sqs.receive_message().queue_url(&url).wait_time_seconds(1).send().await.expect("receive");
    assert!(left.messages().is_empty(), "both messages consumed");
}

/// A crash between writing the claim and launching it: after the restart exactly one instance
/// exists for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn aws_restart_between_claim_and_launch_makes_exactly_one_instance() {
    let (mut c, moto) = aws_cluster("aws-restart", &[], &[("ARCHER_TEST_CRASH_AFTER_CLAIM", "1")]).await;
    let client = c.client().await;
    let _kubelets = kubelets(client.clone(), moto.sdk().await, &[]);
    c.registry.push_image("apps/one", "1", "linux/amd64", true).await;
    namespace(&client, "solo", json!({})).await;
    pool(&client, AWS_POOL).await;
    Api::<Deployment>::namespaced(client.clone(), "solo").create(&PostParams::default(), &deployment("one", &c.registry.image("apps/one:1"), 1, json!({}))).await.expect("create");
    let start = Instant::now();
    while c.archer_exit().is_none() {
        assert!(start.elapsed() < Duration::from_secs(60), "archer did not reach the crash point");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(claims(&client).await.len(), 1, "the claim was written before the crash");
    assert!(live_instances(&moto).await.is_empty(), "and no instance launched");
    c.archer_env.retain(|(k, _)| k != "ARCHER_TEST_CRASH_AFTER_CLAIM");
    c.start_archer().await;
    wait_running(&client, "solo", "one", 1, Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let instances = live_instances(&moto).await;
    assert_eq!((instances.len(), claims(&client).await.len()), (1, 1), "one instance, one claim after the restart");
}

/// A launched instance whose node never registers is given up after the registration timeout:
/// the instance terminated, the claim deleted with an Event, and no runaway of launches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn aws_a_node_that_never_registers_is_cleaned_up() {
    let (c, moto) = aws_cluster("aws-never-registers", &["registrationTimeoutSeconds: 30"], &[]).await;
    let client = c.client().await;
    let _kubelets = kubelets(client.clone(), moto.sdk().await, &["default"]);
    c.registry.push_image("apps/ghost", "1", "linux/amd64", true).await;
    namespace(&client, "ghost", json!({})).await;
    pool(&client, AWS_POOL).await;
    Api::<Deployment>::namespaced(client.clone(), "ghost").create(&PostParams::default(), &deployment("ghost", &c.registry.image("apps/ghost:1"), 1, json!({}))).await.expect("create");
    wait("an instance launched", Duration::from_secs(60), || async { !live_instances(&moto).await.is_empty() }).await;
    let first: String = live_instances(&moto).await[0].instance_id().expect("id").to_string();
    let t0 = Instant::now();
    let mut most_live = 0;
    loop {
        let terminated: Vec<String> = moto.instances("terminated").await.iter().filter_map(|i| i.instance_id().map(String::from)).collect();
        most_live = most_live.max(live_instances(&moto).await.len());
        if terminated.contains(&first) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "the unregistered instance was never terminated");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("aws never-registers: instance given up after {:?}", t0.elapsed());
    assert!(most_live <= 1, "no second launch while the first waited: {most_live} live at once");
    assert!(c.archer_metric("archer_nodeclaims_given_up_total{reason=\"RegistrationTimeout\"}").await >= 1.0);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let posted = events.list(&Default::default()).await.expect("events").items;
    assert!(posted.iter().any(|e| e.reason.as_deref() == Some("RegistrationTimeout") && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("NodeClaim")), "an Event on the claim says why");
}

/// The node class changes (a new tag): the node launched under the old one drifts and is
/// replaced, the replacement Ready before the pods move, with a Drifted Event on the old claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn aws_a_changed_node_class_replaces_its_nodes_as_drifted() {
    let (c, moto) = aws_cluster("aws-drift", &[], &[]).await;
    let client = c.client().await;
    let _kubelets = kubelets(client.clone(), moto.sdk().await, &[]);
    c.registry.push_image("apps/api", "1", "linux/amd64", true).await;
    namespace(&client, "api", json!({})).await;
    pool(&client, AWS_POOL).await;
    let d = deployment("api", &c.registry.image("apps/api:1"), 2, json!({}));
    Api::<Deployment>::namespaced(client.clone(), "api").create(&PostParams::default(), &d).await.expect("create");
    wait_running(&client, "api", "api", 2, Duration::from_secs(120)).await;
    let before = claims(&client).await;
    assert_eq!(before.len(), 1);
    let old = before[0].clone();
    let old_node = old.status.as_ref().and_then(|s| s.node_name.clone()).expect("node");
    tokio::time::sleep(Duration::from_secs(6)).await; // past disruptionGraceSeconds
    let classes: Api<EC2NodeClass> = Api::all(client.clone());
    classes.patch("default", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(json!({"spec": {"tags": {"cost-center": "42"}}}))).await.expect("patch class");
    let nodes: Api<Node> = Api::all(client.clone());
    let t0 = Instant::now();
    wait("the drifted node gone", Duration::from_secs(120), || async { nodes.get_opt(&old_node).await.ok().flatten().is_none() }).await;
    let pods = wait_running(&client, "api", "api", 2, Duration::from_secs(60)).await;
    eprintln!("aws drift: node class changed, node replaced in {:?}", t0.elapsed());
    assert!(pods.iter().all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(old_node.as_str())));
    // The claim goes once its instance is terminated, which may be a moment after its Node.
    let old_name = old.metadata.name.clone();
    wait("the drifted claim gone", Duration::from_secs(30), || async { claims(&client).await.iter().all(|c| c.metadata.name != old_name) }).await;
    let after = claims(&client).await;
    assert!(after.iter().any(|c| c.spec.reason.as_deref() == Some("replacement") && c.status.as_ref().and_then(|s| s.node_class_hash.clone()) != old.status.as_ref().and_then(|s| s.node_class_hash.clone())));
    assert!(c.archer_metric("archer_disruption_decisions_total{reason=\"drifted\",result=\"taken\"}").await >= 1.0);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let posted = events.list(&Default::default()).await.expect("events").items;
    assert!(posted.iter().any(|e| e.reason.as_deref() == Some("Drifted") && e.note.as_deref().is_some_and(|n| n.contains("EC2NodeClass default changed"))), "a Drifted Event says why");
}

/// A launch that cannot succeed (EC2 refuses every CreateFleet, through a proxy: moto launches
/// whatever it is asked to) is given up after `launchAttempts` with a LaunchFailed Event on the
/// claim and no instance; an instance
/// tagged for the cluster with no claim (leaked by a crash, or made by hand) is terminated once
/// older than `garbageGraceSeconds`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn aws_failed_launches_and_leaked_instances_are_cleaned_up() {
    let (c, moto) = aws_cluster_through("aws-cleanup", &["launchAttempts: 1"], &[], true).await;
    let client = c.client().await;
    let _kubelets = kubelets(client.clone(), moto.sdk().await, &[]);
    // A leaked instance: the cluster's tag, a claim that does not exist.
    let ec2 = aws_sdk_ec2::Client::new(&moto.sdk().await);
    let tags = aws_sdk_ec2::types::TagSpecification::builder()
        .resource_type(aws_sdk_ec2::types::ResourceType::Instance)
        .tags(aws_sdk_ec2::types::Tag::builder().key("archer.dev/cluster").value(CLUSTER).build())
        .tags(aws_sdk_ec2::types::Tag::builder().key("archer.dev/nodeclaim").value("leaked-claim").build())
        .build();
    let leaked = ec2.run_instances().image_id(crate::common::moto::AMD_AMI).instance_type(aws_sdk_ec2::types::InstanceType::T3Micro).min_count(1).max_count(1).tag_specifications(tags).send().await.expect("run");
    let leaked_id = leaked.instances()[0].instance_id().expect("id").to_string();

    c.registry.push_image("apps/nowhere", "1", "linux/amd64", true).await;
    namespace(&client, "nowhere", json!({})).await;
    pool(&client, AWS_POOL).await;
    Api::<Deployment>::namespaced(client.clone(), "nowhere").create(&PostParams::default(), &deployment("nowhere", &c.registry.image("apps/nowhere:1"), 1, json!({}))).await.expect("create");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    // Each failed attempt is a LaunchFailed Event on the claim; giving up is one on the pool too.
    let failed_on = |kind: &'static str| {
        let events = events.clone();
        async move {
            events.list(&Default::default()).await.map(|l| l.items).unwrap_or_default().iter().any(|e| {
                e.reason.as_deref() == Some("LaunchFailed") && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some(kind) && e.note.as_deref().is_some_and(|n| n.contains("UnauthorizedOperation") || n.contains("not authorized"))
            })
        }
    };
    wait("a LaunchFailed Event on the pool (the claim given up)", Duration::from_secs(90), || failed_on("NodePool")).await;
    assert!(failed_on("NodeClaim").await, "the claim's attempts have Events of their own");
    let given_up: Vec<String> = events.list(&Default::default()).await.map(|l| l.items).unwrap_or_default().into_iter().filter(|e| e.reason.as_deref() == Some("LaunchFailed") && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("NodePool")).filter_map(|e| e.note).collect();
    assert!(!given_up.is_empty() && given_up.iter().all(|n| n.contains("launch failed once, the claim is deleted")), "{given_up:?}");
    assert!(c.archer_metric("archer_nodeclaims_given_up_total{reason=\"LaunchFailed\"}").await >= 1.0);
    wait("the leaked instance terminated", Duration::from_secs(60), || async { moto.instances("terminated").await.iter().any(|i| i.instance_id() == Some(leaked_id.as_str())) }).await;
    assert!(live_instances(&moto).await.is_empty(), "no instance for the failing pool, and the leaked one gone");
}

/// A NodePool whose EC2NodeClass does not exist is not Ready (`NodeClassReady=False`,
/// `NodeClassNotFound`) and buys nothing: its pods fall through to the next pool by weight, as
/// Karpenter skips a NodePool that is not Ready. Once the class exists and resolves, the heavier
/// pool is used again. The periodic refresh is set to 10 minutes here, longer than any wait: the
/// classes are resolved when the watch sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn aws_a_pool_whose_node_class_is_missing_is_skipped_for_the_next_by_weight() {
    let (c, moto) = aws_cluster("aws-nodeclass-missing", &["  nodeClassRefreshSeconds: 600"], &[]).await;
    let client = c.client().await;
    let _kubelets = kubelets(client.clone(), moto.sdk().await, &[]);
    pool(&client, &AWS_POOL.replace("metadata: {name: default}", "metadata: {name: preferred}").replace("name: default}\n      requirements", "name: later}\n      requirements").replace("spec:\n  template:", "spec:\n  weight: 50\n  template:")).await;
    pool(&client, AWS_POOL).await;
    let pools: Api<archer::provisioner::nodepool::NodePool> = Api::all(client.clone());
    let condition = |name: &'static str, t: &'static str| {
        let pools = pools.clone();
        async move { pools.get(name).await.ok().and_then(|p| p.status).and_then(|s| s.conditions.into_iter().find(|c| c.type_ == t)).map(|c| (c.status, c.reason)) }
    };
    wait("the preferred pool not Ready: its node class is missing", Duration::from_secs(60), || async {
        condition("preferred", "NodeClassReady").await == Some(("False".into(), "NodeClassNotFound".into())) && condition("preferred", "Ready").await == Some(("False".into(), "NodeClassNotReady".into()))
    })
    .await;
    assert_eq!(condition("default", "NodeClassReady").await, Some(("True".into(), "Ready".into())));

    c.registry.push_image("apps/fallthrough", "1", "linux/amd64", true).await;
    namespace(&client, "fallthrough", json!({})).await;
    let spec = json!({"containers": [{"name": "app", "image": c.registry.image("apps/fallthrough:1"), "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]});
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "fallthrough");
    deploys.create(&PostParams::default(), &deployment("web", "unused", 2, spec.clone())).await.expect("create");
    wait_running(&client, "fallthrough", "web", 2, Duration::from_secs(120)).await;
    let written = claims(&client).await;
    assert!(!written.is_empty() && written.iter().all(|cl| cl.spec.node_pool == "default"), "every claim from the lighter pool: {:?}", written.iter().map(|cl| &cl.spec.node_pool).collect::<Vec<_>>());

    // The class appears and resolves: the heavier pool is Ready and takes the next pods.
    let later: EC2NodeClass = archer::yaml::from_str(&NODE_CLASS.replace("metadata: {name: default}", "metadata: {name: later}")).expect("node class");
    Api::<EC2NodeClass>::all(client.clone()).create(&PostParams::default(), &later).await.expect("create node class");
    wait("the preferred pool Ready", Duration::from_secs(60), || async { condition("preferred", "Ready").await.is_some_and(|(s, _)| s == "True") }).await;
    // Kept off web's nodes, so they need a new node (existing room would take them first).
    let mut apart = spec;
    apart["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}});
    deploys.create(&PostParams::default(), &deployment("api", "unused", 2, apart)).await.expect("create");
    wait_running(&client, "fallthrough", "api", 2, Duration::from_secs(120)).await;
    let preferred = claims(&client).await.into_iter().filter(|cl| cl.spec.node_pool == "preferred").count();
    assert!(preferred >= 1, "the heavier pool launches once its class is ready");

    // The class deleted: the pool is not Ready again, before any periodic refresh.
    Api::<EC2NodeClass>::all(client.clone()).delete("later", &Default::default()).await.expect("delete node class");
    wait("the preferred pool not Ready once its class is deleted", Duration::from_secs(60), || async { condition("preferred", "NodeClassReady").await == Some(("False".into(), "NodeClassNotFound".into())) }).await;
}

/// Live prices in a region the embedded catalog does not price, and Karpenter's NodeOverlay
/// applied live (issue #42): the AWS provider against moto in eu-west-1 takes its on-demand
/// prices from the local Price List Query API (checked against botocore's model) and launches
/// there; `-20%` on the c7g family makes the pending pod's node a c7g (else c6g is the cheaper),
/// bought at the overlaid price, and the overlay's status says it was applied; deleting the
/// overlay lets consolidation replace the c7g instance with the now cheaper c6g. The metrics say
/// where the prices came from. Then (issue #43) a pod of a private ECR image with no pull secret
/// is decided onto arm64 with Archer's own AWS identity (moto's `GetAuthorizationToken`), and a
/// registry reachable only through a `hosts.toml` mirror is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane: run tests/e2e/run"]
async fn aws_in_eu_west_1_live_prices_and_a_nodeoverlay_move_provisioning_and_consolidation() {
    use crate::common::price_apis::PriceList;
    use crate::provisioning::{archer_nodes, label, metric_sum, node_of, with_requests};
    use archer::provisioner::nodeoverlay::NodeOverlay;
    const C6G: f64 = 0.0730;
    const C7G: f64 = 0.0780;
    let list = PriceList::start(&[("c6g.large", "0.0730000000"), ("c7g.large", "0.0780000000"), ("m6i.large", "0.1070000000")]).await;
    let pricing = format!("  pricingEndpoint: {}", list.endpoint);
    let (c, moto) = aws_cluster_in("aws-eu-west-1", "eu-west-1", &[&pricing], &[], false).await;
    c.register_webhook(c.archer_port).await;
    let client = c.client().await;
    let _kubelets = kubelets(client.clone(), moto.sdk().await, &[]);
    assert!(list.refused().is_empty(), "requests botocore's model refuses: {:?}", list.refused());
    assert!(list.bodies.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|b| b["Filters"].to_string().contains("eu-west-1")), "asked for eu-west-1's prices");
    // The metrics say the prices are the API's, and when they were read.
    wait("the price metrics", Duration::from_secs(30), || async {
        metric_sum(&c, "archer_prices_source_info{provider=\"aws\",source=\"price-list-api\"}").await == 1.0 && metric_sum(&c, "archer_prices_refreshed_timestamp_seconds").await > 1.7e9
    })
    .await;

    c.registry.push_image("apps/arm", "1", "linux/arm64", true).await;
    namespace(&client, "shop", json!({})).await;
    pool(&client, "apiVersion: archer.dev/v1alpha1\nkind: NodePool\nmetadata: {name: graviton}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: archer.dev, kind: EC2NodeClass, name: default}\n      requirements:\n        - {key: node.kubernetes.io/instance-type, operator: In, values: [c7g.large, c6g.large]}\n        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}\n        - {key: topology.kubernetes.io/zone, operator: In, values: [eu-west-1a]}\n  disruption:\n    consolidationPolicy: WhenEmptyOrUnderutilized\n    consolidateAfter: 3s\n    budgets: [{nodes: \"100%\"}]\n").await;
    let overlays = Api::<NodeOverlay>::all(client.clone());
    let overlay: NodeOverlay = archer::yaml::from_str("apiVersion: karpenter.sh/v1alpha1\nkind: NodeOverlay\nmetadata: {name: graviton-savings}\nspec:\n  requirements:\n    - {key: karpenter.k8s.aws/instance-family, operator: In, values: [c7g]}\n  priceAdjustment: \"-20%\"\n  weight: 10\n").expect("overlay");
    overlays.create(&PostParams::default(), &overlay).await.expect("create overlay");
    // The provisioner's watch sees it before the pod comes: its status says so.
    let condition = |o: &NodeOverlay, t: &str| o.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == t)).map(|c| (c.status.clone(), c.reason.clone()));
    wait("the overlay's status", Duration::from_secs(60), || async { overlays.get("graviton-savings").await.ok().is_some_and(|o| condition(&o, "ArcherApplied").is_some()) }).await;
    let o = overlays.get("graviton-savings").await.expect("overlay");
    assert_eq!(condition(&o, "ValidationSucceeded"), Some(("True".into(), "ValidationSucceeded".into())));
    assert_eq!(condition(&o, "Ready"), Some(("True".into(), "Ready".into())));
    assert_eq!(condition(&o, "ArcherApplied"), Some(("True".into(), "Applied".into())));

    let t0 = Instant::now();
    let d = with_requests(deployment("arm", &c.registry.image("apps/arm:1"), 1, json!({})), "500m", "1Gi");
    Api::<Deployment>::namespaced(client.clone(), "shop").create(&PostParams::default(), &d).await.expect("create");
    wait_running(&client, "shop", "arm", 1, Duration::from_secs(120)).await;
    let nodes = archer_nodes(&client).await;
    assert_eq!(nodes.iter().map(|n| label(n, "node.kubernetes.io/instance-type")).collect::<Vec<_>>(), ["c7g.large"]);
    let written = claims(&client).await;
    let bought: Vec<f64> = written.iter().map(|c| c.spec.price_per_hour).collect();
    assert!(bought.len() == 1 && (bought[0] - C7G * 0.8).abs() < 1e-9, "bought at the overlaid eu-west-1 price: {bought:?}");
    let pid = written[0].status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
    assert!(pid.starts_with("aws:///eu-west-1a/"), "launched in eu-west-1: {pid}");
    eprintln!("eu-west-1: a c7g.large at ${:.4}/h (the API's {C7G} less 20%) Running in {:?}", bought[0], t0.elapsed());

    // Without the overlay the c6g is cheaper, and consolidation replaces the instance.
    overlays.delete("graviton-savings", &Default::default()).await.expect("delete overlay");
    let t0 = Instant::now();
    loop {
        let live: Vec<Node> = archer_nodes(&client).await.into_iter().filter(|n| n.metadata.deletion_timestamp.is_none()).collect();
        let types: Vec<&str> = live.iter().map(|n| label(n, "node.kubernetes.io/instance-type")).collect();
        let running = running_pods(&client, "shop", "arm").await;
        if types == ["c6g.large"] && running.len() == 1 && running.iter().all(|p| live.iter().any(|n| n.metadata.name.as_deref() == Some(node_of(p).as_str()))) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(180), "not consolidated onto c6g after the overlay went: {types:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let bought: Vec<f64> = claims(&client).await.iter().map(|c| c.spec.price_per_hour).collect();
    assert!(bought.iter().any(|p| (p - C6G).abs() < 1e-9), "the c6g at the API's price: {bought:?}");
    wait("the c7g instance terminated", Duration::from_secs(90), || async { live_instances(&moto).await.iter().all(|i| i.instance_type().map(|t| t.as_str()) != Some("c7g.large")) }).await;
    eprintln!("eu-west-1: consolidated onto c6g.large once the overlay went, in {:?}", t0.elapsed());

    // Private ECR, no pull secret (issue #43): the real registry with htpasswd for moto's
    // GetAuthorizationToken user stands for `<account>.dkr.ecr.eu-west-1.amazonaws.com` through
    // hosts.toml's `server`; a registry reachable only through a mirror (`[host]`) beside it.
    use crate::private_registries::{admitted, restart_with_hosts, HostsFile};
    let mut c = c;
    let private = crate::common::Registry::start_with_auth("AWS", "123456789012-auth-token").await;
    private.push_image("team/app", "1", "linux/arm64", true).await;
    c.registry.push_index("team/mirrored", "1", &["linux/amd64", "linux/arm64"], true, false).await;
    let ecr = "123456789012.dkr.ecr.eu-west-1.amazonaws.com";
    let files = [
        HostsFile { registry: ecr.into(), text: format!("server = \"http://{}\"\n", private.host) },
        HostsFile { registry: "registry.example.invalid".into(), text: format!("[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n", c.registry.host) },
    ];
    restart_with_hosts(&mut c, &files, std::slice::from_ref(&private.host), &["ecr:".to_string(), format!("  endpoint: {}", moto.endpoint)]).await;
    namespace(&client, "private", json!({})).await;
    let (mut platforms, mut arch, mut error) = admitted(&c, "private", "ecr", &format!("{ecr}/team/app:1")).await;
    // moto answers one request at a time (Python's GIL): behind the restarted Archer's first
    // DescribeInstanceTypes, its GetAuthorizationToken can take longer than the pod's 4 s. Then
    // the first pod says the sign-in had not ended, the sign-in goes on, and the next pod is read
    // with its credential (issue #45's CI failure); any other answer is judged as it is.
    if error.as_deref().is_some_and(|e| e.contains("[timeout] no ecr credential for") && e.contains("the sign-in had not ended")) {
        eprintln!("eu-west-1: the first ECR pod waited on the sign-in ({error:?}); the next is read with its credential");
        (platforms, arch, error) = admitted(&c, "private", "ecr-again", &format!("{ecr}/team/app:1")).await;
    }
    assert_eq!((platforms.as_deref(), arch, error), (Some("linux/arm64"), vec!["arm64".to_string()], None), "a private ECR image decided as a public one");
    let (platforms, _, error) = admitted(&c, "private", "mirrored", "registry.example.invalid/team/mirrored:1").await;
    assert_eq!((platforms.as_deref(), error), (Some("linux/amd64,linux/arm64"), None), "read through its mirror, the registry itself unreachable");
    eprintln!("eu-west-1: a private ECR image with no pull secret decided onto arm64; a mirror-only registry read");
}
