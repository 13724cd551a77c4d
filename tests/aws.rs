//! The AWS EC2 provider against moto's server (a real server speaking EC2 and SQS): node class
//! resolution, offerings and spot prices, launches (overrides, tags, client token, one instance
//! per claim), termination, listing, interruption messages through SQS, and (through a small
//! fault-injecting proxy, for the one fault moto cannot produce) insufficient capacity.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

mod common;

use std::sync::{Arc, Mutex};

use archer::catalog::{CapacityType, Catalog};
use archer::provisioner::cloud::aws::interruption::{self, Kind, Outcome};
use archer::provisioner::cloud::aws::nodeclass::EC2NodeClass;
use archer::provisioner::cloud::aws::Aws;
use archer::provisioner::cloud::{CloudError, CloudProvider, NodeClassReadiness};
use archer::provisioner::nodeclaim::NodeClaim;
use common::moto::*;

fn node_class(extra: serde_json::Value) -> EC2NodeClass {
    let mut spec = serde_json::json!({
        "role": "KarpenterNodeRole-test",
        "amiSelectorTerms": [{"alias": "al2023@latest"}],
        "subnetSelectorTerms": [{"tags": {DISCOVERY_TAG: CLUSTER}}],
        "securityGroupSelectorTerms": [{"tags": {DISCOVERY_TAG: CLUSTER}}, {"name": "extra"}],
        "tags": {"team": "platform"},
        "blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"volumeSize": "50Gi", "volumeType": "gp3", "encrypted": true}}]
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value(serde_json::json!({"apiVersion": "archer.dev/v1alpha1", "kind": "EC2NodeClass", "metadata": {"name": "default"}, "spec": spec})).expect("node class")
}

fn claim(name: &str, instance_type: &str, arch: &str, zone: &str, capacity: &str) -> NodeClaim {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": name},
        "spec": {"nodePool": "general", "instanceType": instance_type, "zone": zone, "capacityType": capacity, "arch": arch, "os": "linux",
                 "labels": {"kubernetes.io/arch": arch, "karpenter.sh/capacity-type": capacity, "team": "a"},
                 "taints": [], "pricePerHour": 0.077,
                 "nodeClassRef": {"group": "archer.dev", "kind": "EC2NodeClass", "name": "default"},
                 "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": [arch]}]}
    }))
    .expect("claim")
}

async fn provider(moto: &Moto) -> Aws {
    let catalog = Arc::new(Catalog::embedded().expect("catalog"));
    Aws::new(&moto.sdk().await, catalog, moto.settings()).await.expect("provider")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_class_resolves_its_subnets_groups_and_the_newest_image_per_architecture() {
    let moto = Moto::start().await;
    let subnets = moto.network().await;
    let aws = provider(&moto).await;
    let class = aws.use_class(&node_class(serde_json::json!({}))).await;
    let r = &class.resolved;
    assert!(r.ready(), "problems: {:?}", r.problems);
    let mut got: Vec<(String, String)> = r.subnets.iter().map(|s| (s.zone.clone(), s.id.clone())).collect();
    got.sort();
    assert_eq!(got, subnets, "the tagged subnets, one per zone, and not the untagged one");
    let mut groups: Vec<String> = r.security_groups.iter().filter_map(|g| g.name.clone()).collect();
    groups.sort();
    assert_eq!(groups, ["extra", "nodes"]);
    assert_eq!(r.ami("arm64").map(|a| a.id.as_str()), Some(ARM_AMIS[1]), "the newest arm64 image");
    assert_eq!(r.ami("amd64").map(|a| a.id.as_str()), Some(AMD_AMI));
    assert!(r.instance_profile.as_deref().is_some_and(|p| p.starts_with("archer_archer-test_")), "the role's instance profile: {:?}", r.instance_profile);
    // A NodePool naming it can launch; one naming another class or none cannot (NodeClassReady).
    let class_ref = |name: &str| [("group", "archer.dev"), ("kind", "EC2NodeClass"), ("name", name)].into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>();
    assert_eq!(aws.node_class_readiness(Some(&class_ref("default"))), NodeClassReadiness::Ready);
    let not_ready = |r: NodeClassReadiness| match r {
        NodeClassReadiness::NotReady { reason, message } => (reason, message),
        other => panic!("not ready expected: {other:?}"),
    };
    assert_eq!(not_ready(aws.node_class_readiness(Some(&class_ref("other")))), ("NodeClassNotFound".to_string(), "EC2NodeClass other not found on the cluster".to_string()));
    assert_eq!(not_ready(aws.node_class_readiness(None)).0, "NodeClassNotFound");

    // A selector that matches nothing makes the class not ready, saying which.
    let broken = aws.use_class(&node_class(serde_json::json!({"subnetSelectorTerms": [{"tags": {"nope": "nothing"}}], "amiSelectorTerms": [{"alias": "bottlerocket@latest"}]}))).await;
    assert!(!broken.resolved.ready());
    assert!(broken.resolved.problems.iter().any(|p| p.contains("subnetSelectorTerm") && p.contains("nope")), "{:?}", broken.resolved.problems);
    assert_eq!(broken.resolved.ami("arm64"), None, "no arm64 Bottlerocket image exists");
    assert!(broken.resolved.ami("amd64").is_some());
    let (reason, message) = not_ready(aws.node_class_readiness(Some(&class_ref("default"))));
    assert!(reason == "NotResolved" && message.starts_with("EC2NodeClass default is not ready: ") && message.contains("nope"), "{reason}: {message}");
    let c = claim("general-broken", "m6g.large", "arm64", "us-east-1a", "on-demand");
    let err = aws.create(&c).await.expect_err("a launch with a class that is not ready");
    assert!(err.to_string().contains("not ready"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offerings_are_ec2s_types_and_zones_at_catalog_and_ec2_spot_prices() {
    let moto = Moto::start().await;
    let aws = provider(&moto).await;
    let catalog = Catalog::embedded().expect("catalog");
    let all = aws.offerings();
    let find = |t: &str, z: &str, c: CapacityType| all.iter().find(|o| o.instance.name == t && o.zone == z && o.capacity == c).map(|o| o.price);
    assert_eq!(find("m6g.large", "us-east-1a", CapacityType::OnDemand), catalog.price("m6g.large", Some(REGION), CapacityType::OnDemand));
    // moto's spot price history gives every type 0.00001: read from EC2, not the estimate.
    assert_eq!(find("m6g.large", "us-east-1a", CapacityType::Spot), Some(0.00001));
    assert_eq!(aws.book().spot_price("m6g.large", "us-east-1a"), Some(0.00001));
    let zones: std::collections::BTreeSet<&str> = all.iter().map(|o| o.zone.as_str()).collect();
    assert!(ZONES.iter().all(|z| zones.contains(z)), "{zones:?}");
    assert!(all.iter().all(|o| catalog.get(&o.instance.name).is_some()), "only types the catalog prices");
    assert!(all.iter().any(|o| o.instance.arch == "arm64") && all.iter().any(|o| o.instance.arch == "amd64"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_launches_one_tagged_instance_and_a_repeated_launch_returns_it() {
    let moto = Moto::start().await;
    let subnets = moto.network().await;
    let aws = provider(&moto).await;
    aws.use_class(&node_class(serde_json::json!({}))).await;
    let c = claim("general-abcde", "m6g.large", "arm64", "us-east-1b", "on-demand");
    let first = aws.create(&c).await.expect("launch");
    assert!(first.provider_id.starts_with("aws:///us-east-1b/i-"), "{}", first.provider_id);
    assert_eq!((first.claim.as_str(), first.instance_type.as_deref(), first.zone.as_deref()), ("general-abcde", Some("m6g.large"), Some("us-east-1b")));
    // Launched again (a retry, a restart between claim and launch): the same instance.
    let again = aws.create(&c).await.expect("relaunch");
    assert_eq!(again.provider_id, first.provider_id);
    let running = moto.instances("running").await;
    assert_eq!(running.len(), 1, "exactly one instance for the claim");
    let i = &running[0];
    let tag = |k: &str| i.tags().iter().find(|t| t.key() == Some(k)).and_then(|t| t.value()).map(String::from);
    assert_eq!(tag("archer.dev/cluster").as_deref(), Some(CLUSTER));
    assert_eq!(tag("archer.dev/nodeclaim").as_deref(), Some("general-abcde"));
    assert_eq!(tag("archer.dev/nodepool").as_deref(), Some("general"));
    assert_eq!(tag("Name").as_deref(), Some("general-abcde"));
    assert_eq!(i.image_id(), Some(ARM_AMIS[1]), "the arm64 image for an arm64 claim");
    let zone_subnet = subnets.iter().find(|(z, _)| z == "us-east-1b").map(|(_, s)| s.as_str());
    assert_eq!(i.subnet_id(), zone_subnet, "a subnet of the claim's zone");
    // The launch template of the class carries the node's settings.
    let ec2 = aws.ec2();
    let templates = ec2.describe_launch_templates().send().await.expect("templates");
    let names: Vec<&str> = templates.launch_templates().iter().filter_map(|t| t.launch_template_name()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].starts_with("archer/archer-test/default/"), "{names:?}");
    let version = ec2.describe_launch_template_versions().launch_template_name(names[0]).send().await.expect("versions");
    let data = version.launch_template_versions()[0].launch_template_data().expect("data");
    assert_eq!(data.image_id(), Some(ARM_AMIS[1]));
    assert_eq!(data.metadata_options().and_then(|m| m.http_tokens()).map(|t| t.as_str()), Some("required"), "IMDSv2 by default");
    assert_eq!(data.block_device_mappings()[0].ebs().and_then(|e| e.volume_size()), Some(50));
    let user_data = data.user_data().map(|u| String::from_utf8(base64_decode(u)).expect("utf-8")).unwrap_or_default();
    assert!(user_data.contains("--register-with-taints=karpenter.sh/unregistered=:NoSchedule"), "{user_data}");

    // A second claim of the same shape reuses the template; an amd64 one gets its own.
    aws.create(&claim("general-fghij", "m6g.large", "arm64", "us-east-1a", "on-demand")).await.expect("second");
    aws.create(&claim("general-klmno", "m6i.large", "amd64", "us-east-1a", "on-demand")).await.expect("amd64");
    let templates = ec2.describe_launch_templates().send().await.expect("templates");
    assert_eq!(templates.launch_templates().len(), 2);
    let listed = aws.list().await.expect("list");
    let mut claims: Vec<&str> = listed.iter().map(|i| i.claim.as_str()).collect();
    claims.sort();
    assert_eq!(claims, ["general-abcde", "general-fghij", "general-klmno"]);

    // Termination, by the claim's recorded provider id; terminating again is not an error.
    let mut launched = c.clone();
    launched.status = Some(archer::provisioner::nodeclaim::NodeClaimStatus { provider_id: Some(first.provider_id.clone()), ..Default::default() });
    aws.delete(&launched).await.expect("terminate");
    aws.delete(&launched).await.expect("terminate again");
    let listed = aws.list().await.expect("list");
    assert!(!listed.iter().any(|i| i.claim == "general-abcde"), "terminated instances are not listed");
    assert_eq!(moto.instances("terminated").await.len(), 1);
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).expect("base64")
}

fn trust(max_receives: u32) -> interruption::Trust {
    interruption::Trust { account: ACCOUNT.into(), max_receives }
}

/// An EventBridge event of `source` and `account` about one instance.
fn spot_event(source: &str, account: &str, instance: &str) -> String {
    serde_json::json!({"version": "0", "id": instance, "detail-type": "EC2 Spot Instance Interruption Warning", "source": source, "account": account, "region": "us-east-1",
        "resources": [format!("arn:aws:ec2:us-east-1:{account}:instance/{instance}")], "detail": {"instance-id": instance, "instance-action": "terminate"}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interruption_messages_are_acted_on_then_deleted_and_bad_ones_counted() {
    let moto = Moto::start().await;
    let sqs = aws_sdk_sqs::Client::new(&moto.sdk().await);
    let url = sqs.create_queue().queue_name("archer-interruption").attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, "1").send().await.expect("queue").queue_url().map(String::from).expect("url");
    assert_eq!(interruption::queue_url(&sqs, "archer-interruption").await.as_deref(), Ok(url.as_str()));
    let spot = spot_event("aws.ec2", ACCOUNT, "i-0123");
    for body in [spot.as_str(), "{ not json", r#"{"source":"aws.s3","detail-type":"Object Created","detail":{}}"#] {
        sqs.send_message().queue_url(&url).message_body(body).send().await.expect("send");
    }
    // The first handler fails: the spot message stays on the queue and comes back.
    let failing = |_: interruption::Interruption| async { Err::<(), String>("no replacement yet".into()) };
    let mut outcomes = Vec::new();
    while outcomes.len() < 3 {
        outcomes.extend(interruption::receive_once(&sqs, &url, 1, &trust(5), failing).await.expect("receive"));
    }
    outcomes.sort_by_key(|(_, o)| o.as_str());
    assert_eq!(outcomes, [("unknown", Outcome::Dropped(interruption::Dropped::ForeignSource)), ("spot-interruption", Outcome::Failed), ("unknown", Outcome::Malformed)]);
    // Then acted on and deleted.
    let seen: Arc<Mutex<Vec<interruption::Interruption>>> = Arc::default();
    let record = |i: interruption::Interruption| {
        let seen = seen.clone();
        async move {
            seen.lock().expect("lock").push(i);
            Ok::<(), String>(())
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while seen.lock().expect("lock").is_empty() {
        assert!(std::time::Instant::now() < deadline, "the failed message never came back");
        interruption::receive_once(&sqs, &url, 1, &trust(5), record).await.expect("receive");
    }
    assert_eq!(seen.lock().expect("lock")[0], interruption::Interruption { kind: Kind::SpotInterruption, instance_ids: vec!["i-0123".into()] });
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let left = sqs.receive_message().queue_url(&url).wait_time_seconds(1).send().await.expect("receive");
    assert!(left.messages().is_empty(), "handled, dropped and malformed messages are deleted");
}

/// What the provider's interruption loop hands the provisioner, recorded.
#[derive(Default)]
struct Recorder {
    notices: Mutex<Vec<String>>,
    dropped: Mutex<Vec<String>>,
    counted: Mutex<Vec<(String, String)>>,
}

#[async_trait::async_trait]
impl archer::provisioner::cloud::InterruptionHandler for Recorder {
    async fn interrupted(&self, notice: archer::provisioner::cloud::Interruption) -> Result<(), String> {
        let poison = notice.instance_ids.iter().any(|i| i == "i-poison");
        self.notices.lock().expect("lock").extend(notice.instance_ids);
        if poison {
            return Err("the node cannot be taken out".into());
        }
        Ok(())
    }
    fn count(&self, kind: &str, outcome: &str) {
        self.counted.lock().expect("lock").push((kind.into(), outcome.into()));
    }
    fn dropped(&self, reason: &str) {
        self.dropped.lock().expect("lock").push(reason.into());
    }
}

/// The provider's interruption loop (the account from STS, moto's) acts only on EC2 and Health
/// events of its own account: an event of another source or account, whatever instance it names,
/// is deleted and counted without reaching the provisioner; a message whose handling keeps
/// failing is deleted on its `interruptionMaxReceives`-th receive, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interruption_messages_of_another_source_or_account_and_poison_ones_are_dropped_and_counted() {
    let moto = Moto::start().await;
    let sqs = aws_sdk_sqs::Client::new(&moto.sdk().await);
    let url = sqs.create_queue().queue_name("archer-interruption").attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, "1").send().await.expect("queue").queue_url().map(String::from).expect("url");
    for body in [spot_event("aws.s3", ACCOUNT, "i-foreign-source"), spot_event("tenant.forged", ACCOUNT, "i-forged-source"), spot_event("aws.ec2", "999999999999", "i-foreign-account"), spot_event("aws.ec2", ACCOUNT, "i-poison"), spot_event("aws.ec2", ACCOUNT, "i-ours")] {
        sqs.send_message().queue_url(&url).message_body(body).send().await.expect("send");
    }
    let catalog = Arc::new(Catalog::embedded().expect("catalog"));
    let settings = archer::config::AwsConfig { interruption_queue: Some("archer-interruption".into()), interruption_max_receives: 3, ..moto.settings() };
    let aws = Aws::new(&moto.sdk().await, catalog, settings).await.expect("provider");
    let recorder = Arc::new(Recorder::default());
    let reader = tokio::spawn(aws.interruptions(recorder.clone()).expect("an interruption loop"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while recorder.dropped.lock().expect("lock").len() < 4 {
        assert!(std::time::Instant::now() < deadline, "dropped so far: {:?}; notices: {:?}", recorder.dropped.lock().expect("lock"), recorder.notices.lock().expect("lock"));
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    reader.abort();
    let mut dropped = recorder.dropped.lock().expect("lock").clone();
    dropped.sort();
    assert_eq!(dropped, ["foreign_account", "foreign_source", "foreign_source", "max_receives"]);
    let notices = recorder.notices.lock().expect("lock").clone();
    assert!(notices.iter().all(|i| i == "i-poison" || i == "i-ours"), "no untrusted message reached the provisioner: {notices:?}");
    assert_eq!(notices.iter().filter(|i| *i == "i-poison").count(), 3, "the poison message was tried interruptionMaxReceives times, then dropped: {notices:?}");
    assert_eq!(notices.iter().filter(|i| *i == "i-ours").count(), 1);
    let counted = recorder.counted.lock().expect("lock").clone();
    assert_eq!(counted.iter().filter(|(_, o)| o == "dropped").count(), 4, "{counted:?}");
    let left = sqs.receive_message().queue_url(&url).wait_time_seconds(1).send().await.expect("receive");
    assert!(left.messages().is_empty(), "every message deleted: {:?}", left.messages());
}

/// A proxy in front of moto that answers every CreateFleet with EC2's insufficient-capacity
/// error for each type offered (moto cannot produce it), and passes everything else through.
async fn capacity_failing_proxy(upstream: String) -> String {
    use axum::body::Bytes;
    use axum::response::IntoResponse;
    let http = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |method: http::Method, uri: http::Uri, headers: http::HeaderMap, body: Bytes| {
        let (http, upstream) = (http.clone(), upstream.clone());
        async move {
            let text = String::from_utf8_lossy(&body).to_string();
            if text.contains("Action=CreateFleet") {
                let types: Vec<String> = text.split('&').filter(|kv| kv.contains("Overrides") && kv.contains("InstanceType=")).filter_map(|kv| kv.split('=').nth(1).map(String::from)).collect();
                let items: String = types.iter().map(|t| format!("<item><errorCode>InsufficientInstanceCapacity</errorCode><errorMessage>We currently do not have sufficient {t} capacity</errorMessage><launchTemplateAndOverrides><overrides><instanceType>{t}</instanceType></overrides></launchTemplateAndOverrides><lifecycle>on-demand</lifecycle></item>")).collect();
                let xml = format!(r#"<CreateFleetResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r-1</requestId><fleetId>fleet-1</fleetId><errorSet>{items}</errorSet><fleetInstanceSet/></CreateFleetResponse>"#);
                return ([(http::header::CONTENT_TYPE, "text/xml")], xml).into_response();
            }
            common::moto::forward(&http, &upstream, method, &uri, &headers, body).await
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insufficient_capacity_leaves_the_offered_types_out_of_plans_for_a_while() {
    let moto = Moto::start().await;
    moto.network().await;
    let proxy = capacity_failing_proxy(moto.endpoint.clone()).await;
    let mut settings = moto.settings();
    settings.endpoint = Some(proxy);
    settings.price_margin_percent = 10.0;
    let catalog = Arc::new(Catalog::embedded().expect("catalog"));
    let sdk = archer::provisioner::cloud::aws::sdk_config(&settings).await;
    let aws = Aws::new(&sdk, catalog, settings).await.expect("provider");
    aws.use_class(&node_class(serde_json::json!({}))).await;
    let key = |t: &str| (t.to_string(), "us-east-1a".to_string(), CapacityType::OnDemand);
    let offered = |t: &str| aws.offerings().iter().any(|o| (o.instance.name.clone(), o.zone.clone(), o.capacity) == key(t));
    assert!(offered("m6g.large"));
    let err = aws.create(&claim("general-ice", "m6g.large", "arm64", "us-east-1a", "on-demand")).await.expect_err("no capacity");
    let CloudError::InsufficientCapacity { instance_type, zone, .. } = &err else { panic!("expected insufficient capacity, got {err}") };
    assert_eq!(zone, "us-east-1a");
    assert!(instance_type.split(',').any(|t| t == "m6g.large"), "{instance_type}");
    assert!(!offered("m6g.large"), "the failed offering is left out of plans");
    for t in instance_type.split(',') {
        assert!(aws.book().is_unavailable(&key(t)), "{t}");
    }
    // Other zones and the other capacity type of the same type stay available.
    assert!(aws.offerings().iter().any(|o| o.instance.name == "m6g.large" && o.zone == "us-east-1b" && o.capacity == CapacityType::OnDemand));
    assert!(aws.offerings().iter().any(|o| o.instance.name == "m6g.large" && o.zone == "us-east-1a" && o.capacity == CapacityType::Spot));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_node_class_or_a_newer_image_drifts_the_claim() {
    let moto = Moto::start().await;
    moto.network().await;
    let catalog = Arc::new(Catalog::embedded().expect("catalog"));
    let mut settings = moto.settings();
    settings.ami_owners = vec!["amazon".into(), "self".into()];
    let aws = Aws::new(&moto.sdk().await, catalog, settings).await.expect("provider");
    let nc = node_class(serde_json::json!({}));
    aws.use_class(&nc).await;
    let mut c = claim("general-drift", "m6i.large", "amd64", "us-east-1a", "on-demand");
    let i = aws.create(&c).await.expect("launch");
    assert_eq!(i.image_id.as_deref(), Some(AMD_AMI));
    c.status = Some(archer::provisioner::nodeclaim::NodeClaimStatus { provider_id: Some(i.provider_id.clone()), image_id: i.image_id.clone(), node_class_hash: i.node_class_hash.clone(), ..Default::default() });
    assert_eq!(aws.drifted(&c), None, "just launched");

    // The node class changes (a new tag): drifted.
    let mut retagged = nc.clone();
    retagged.spec.tags.insert("cost-center".into(), "42".into());
    aws.use_class(&retagged).await;
    assert!(aws.drifted(&c).is_some_and(|r| r.contains("EC2NodeClass default changed")), "{:?}", aws.drifted(&c));
    aws.use_class(&nc).await;
    assert_eq!(aws.drifted(&c), None);

    // A newer image of the alias appears (made from the instance, as an image pipeline would):
    // the class resolves to it and the claim's node has drifted.
    let id = i.provider_id.rsplit('/').next().expect("id").to_string();
    aws.ec2().create_image().instance_id(&id).name("amazon-eks-node-al2023-x86_64-standard-1.34-v20261201").send().await.expect("image");
    let class = aws.use_class(&nc).await;
    let newest = class.resolved.ami("amd64").expect("amd64 image").id.clone();
    assert_ne!(newest, AMD_AMI, "the newer image wins");
    assert!(aws.drifted(&c).is_some_and(|r| r.contains(&newest)), "{:?}", aws.drifted(&c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_launch_templates_are_deleted_and_used_ones_kept() {
    let moto = Moto::start().await;
    moto.network().await;
    let aws = provider(&moto).await;
    aws.use_class(&node_class(serde_json::json!({}))).await;
    aws.create(&claim("general-t1", "m6g.large", "arm64", "us-east-1a", "on-demand")).await.expect("launch");
    aws.create(&claim("general-t2", "m6i.large", "amd64", "us-east-1a", "on-demand")).await.expect("launch");
    let count = || async { aws.ec2().describe_launch_templates().send().await.expect("templates").launch_templates().len() };
    assert_eq!(count().await, 2);
    // Used a moment ago: kept.
    let kept = archer::provisioner::cloud::aws::launch::delete_unused_templates(&aws, std::time::Duration::from_secs(3600)).await.expect("clean up");
    assert!(kept.is_empty());
    assert_eq!(count().await, 2);
    // Unused for longer than the limit (zero here): deleted, and made again by the next launch.
    let deleted = archer::provisioner::cloud::aws::launch::delete_unused_templates(&aws, std::time::Duration::ZERO).await.expect("clean up");
    assert_eq!(deleted.len(), 2);
    assert_eq!(count().await, 0);
    aws.create(&claim("general-t3", "m6g.large", "arm64", "us-east-1b", "on-demand")).await.expect("launch");
    assert_eq!(count().await, 1);
}

/// `archer prices --cloud-provider aws` prints what the provider sees, EC2's spot prices marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prices_command_shows_what_the_aws_provider_sees() {
    let moto = Moto::start().await;
    let endpoint = moto.endpoint.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_archer"))
            .args(["prices", "--cloud-provider", "aws", "--region", "us-east-1", "--family", "m6g", "--output", "json"])
            .env("AWS_ENDPOINT_URL", endpoint)
            .output()
    })
    .await
    .expect("join")
    .expect("run archer prices");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("json");
    let find = |capacity: &str| rows.iter().find(|r| r["instanceType"] == "m6g.large" && r["zone"] == "us-east-1a" && r["capacityType"] == capacity).cloned().expect("row");
    assert_eq!((find("spot")["priceSource"].as_str(), find("spot")["pricePerHour"].as_f64()), (Some("ec2"), Some(0.00001)));
    let catalog = Catalog::embedded().expect("catalog");
    assert_eq!(find("on-demand")["pricePerHour"].as_f64(), catalog.price("m6g.large", Some(REGION), CapacityType::OnDemand));
    assert!(rows.iter().all(|r| r["instanceType"].as_str().is_some_and(|t| t.starts_with("m6g."))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_gets_an_instance_profile_holding_exactly_that_role() {
    let moto = Moto::start().await;
    moto.network().await;
    let iam = aws_sdk_iam::Client::new(&moto.sdk().await);
    let aws = provider(&moto).await;
    let class = aws.use_class(&node_class(serde_json::json!({}))).await;
    assert!(class.resolved.ready(), "{:?}", class.resolved.problems);
    let name = class.resolved.instance_profile.clone().expect("profile");
    assert!(name.starts_with("archer_archer-test_"), "{name}");
    let roles = |p: aws_sdk_iam::operation::get_instance_profile::GetInstanceProfileOutput| p.instance_profile().map(|p| p.roles().iter().map(|r| r.role_name().to_string()).collect::<Vec<_>>()).unwrap_or_default();
    assert_eq!(roles(iam.get_instance_profile().instance_profile_name(&name).send().await.expect("profile")), ["KarpenterNodeRole-test"]);
    // Resolved again: the same profile, nothing added.
    assert_eq!(aws.use_class(&node_class(serde_json::json!({}))).await.resolved.instance_profile.as_deref(), Some(name.as_str()));
    assert_eq!(roles(iam.get_instance_profile().instance_profile_name(&name).send().await.expect("profile")), ["KarpenterNodeRole-test"]);
    // Launches use it.
    aws.create(&claim("general-prof", "m6g.large", "arm64", "us-east-1a", "on-demand")).await.expect("launch");
    let t = aws.ec2().describe_launch_templates().send().await.expect("templates");
    let tname = t.launch_templates()[0].launch_template_name().expect("name").to_string();
    let v = aws.ec2().describe_launch_template_versions().launch_template_name(&tname).send().await.expect("versions");
    let data = v.launch_template_versions()[0].launch_template_data().expect("data");
    assert_eq!(data.iam_instance_profile().and_then(|p| p.name()), Some(name.as_str()));
    // Another role: another profile. A role that does not exist: the class is not ready, saying so.
    let other = aws.use_class(&node_class(serde_json::json!({"role": "NodeRole-2"}))).await;
    assert_ne!(other.resolved.instance_profile.as_deref(), Some(name.as_str()));
    let missing = aws.use_class(&node_class(serde_json::json!({"role": "NoSuchRole"}))).await;
    assert!(missing.resolved.problems.iter().any(|p| p.contains("no instance profile for role NoSuchRole")), "{:?}", missing.resolved.problems);
}

/// A claim's deletion terminates only an instance tagged for the cluster and the claim: the
/// provider id in a claim's status (which whoever can write NodeClaims can set) cannot make
/// Archer terminate an instance it did not launch for that claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_claim_terminates_only_an_instance_tagged_for_it() {
    let moto = Moto::start().await;
    let subnets = moto.network().await;
    let ec2 = aws_sdk_ec2::Client::new(&moto.sdk().await);
    let run = |tags: Vec<(&'static str, &'static str)>| {
        let (ec2, subnet) = (ec2.clone(), subnets[0].1.clone());
        async move {
            let mut r = ec2.run_instances().image_id(AMD_AMI).instance_type(aws_sdk_ec2::types::InstanceType::M6iLarge).min_count(1).max_count(1).subnet_id(subnet);
            if !tags.is_empty() {
                let mut spec = aws_sdk_ec2::types::TagSpecification::builder().resource_type(aws_sdk_ec2::types::ResourceType::Instance);
                for (k, v) in tags {
                    spec = spec.tags(aws_sdk_ec2::types::Tag::builder().key(k).value(v).build());
                }
                r = r.tag_specifications(spec.build());
            }
            r.send().await.expect("run").instances()[0].instance_id().expect("id").to_string()
        }
    };
    let stranger = run(vec![]).await;
    let other_claims = run(vec![("archer.dev/cluster", CLUSTER), ("archer.dev/nodeclaim", "general-other")]).await;
    let aws = provider(&moto).await;
    let state = |id: String| {
        let ec2 = ec2.clone();
        async move { ec2.describe_instances().instance_ids(id).send().await.expect("describe").reservations()[0].instances()[0].state().and_then(|s| s.name()).map(|n| n.as_str().to_string()) }
    };
    for id in [&stranger, &other_claims] {
        let mut c = claim("general-forged", "m6i.large", "amd64", "us-east-1a", "on-demand");
        c.status = Some(archer::provisioner::nodeclaim::NodeClaimStatus { provider_id: Some(format!("aws:///us-east-1a/{id}")), ..Default::default() });
        aws.delete(&c).await.expect("nothing of the claim's to terminate");
        assert_eq!(state(id.clone()).await.as_deref(), Some("running"), "{id} is not the claim's: left running");
    }
    // The claim's own instance (tagged at launch) is terminated, found by its tags.
    let own = run(vec![("archer.dev/cluster", CLUSTER), ("archer.dev/nodeclaim", "general-forged")]).await;
    let mut c = claim("general-forged", "m6i.large", "amd64", "us-east-1a", "on-demand");
    c.status = Some(archer::provisioner::nodeclaim::NodeClaimStatus { provider_id: Some(format!("aws:///us-east-1a/{stranger}")), ..Default::default() });
    aws.delete(&c).await.expect("terminate");
    assert_eq!(state(own).await.as_deref(), Some("terminated"));
    assert_eq!(state(stranger).await.as_deref(), Some("running"));
}

/// An instance profile of the name Archer would use, not tagged as Archer's, keeps its roles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_profile_archer_did_not_make_keeps_its_roles() {
    let moto = Moto::start().await;
    moto.network().await;
    let iam = aws_sdk_iam::Client::new(&moto.sdk().await);
    let name = archer::provisioner::cloud::aws::profile::profile_name(CLUSTER, "NodeRole-2");
    iam.create_instance_profile().instance_profile_name(&name).send().await.expect("profile");
    iam.add_role_to_instance_profile().instance_profile_name(&name).role_name("KarpenterNodeRole-test").send().await.expect("role");
    let aws = provider(&moto).await;
    let class = aws.use_class(&node_class(serde_json::json!({"role": "NodeRole-2"}))).await;
    assert!(class.resolved.problems.iter().any(|p| p.contains(&name) && p.contains("not Archer's")), "{:?}", class.resolved.problems);
    let roles: Vec<String> = iam.get_instance_profile().instance_profile_name(&name).send().await.expect("profile").instance_profile().map(|p| p.roles().iter().map(|r| r.role_name().to_string()).collect()).unwrap_or_default();
    assert_eq!(roles, ["KarpenterNodeRole-test"], "its role is not removed");
}

/// Signed requests carry the session token: a plain-http endpoint that is not loopback is
/// refused before any request (moto on 127.0.0.1, as every test here uses, is accepted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_aws_endpoint_off_loopback_is_refused() {
    test_credentials();
    let settings = archer::config::AwsConfig { cluster_name: CLUSTER.into(), region: Some(REGION.into()), endpoint: Some("http://ec2.example.com".into()), ..Default::default() };
    let sdk = archer::provisioner::cloud::aws::sdk_config(&settings).await;
    let err = Aws::new(&sdk, Arc::new(Catalog::embedded().expect("catalog")), settings.clone()).await.err().expect("refused");
    assert!(err.to_string().contains("http://ec2.example.com") && err.to_string().contains("clear text"), "{err}");
    assert!(settings.validate().is_err_and(|e| e.contains("provisioner.aws.endpoint")));
}

/// A label that would be another kubelet flag in the user data is refused at launch, before
/// anything is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_label_with_a_newline_is_refused_before_launch() {
    let moto = Moto::start().await;
    moto.network().await;
    let aws = provider(&moto).await;
    aws.use_class(&node_class(serde_json::json!({}))).await;
    let mut c = claim("general-inject", "m6g.large", "arm64", "us-east-1a", "on-demand");
    c.spec.labels.insert("team".into(), "a\n--node-ip=6.6.6.6".into());
    let err = aws.create(&c).await.expect_err("refused");
    assert!(err.to_string().contains("label team") && err.to_string().contains("not a label value"), "{err}");
    assert!(moto.instances("running").await.is_empty());
    assert!(aws.ec2().describe_launch_templates().send().await.expect("templates").launch_templates().is_empty(), "no template written");
}

/// The provider in a region the embedded catalog does not price (it has EC2's us-east-1 list
/// only): on-demand prices come from the Price List Query API (a stand-in checking every request
/// against botocore's model), so it plans and can launch in eu-west-1; a later answer moves the
/// prices; a failing API keeps the last answer and says since when. Before live prices the
/// provider refused to start here ("EC2 offers no instance type the catalog prices in
/// eu-west-1").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_eu_west_1_on_demand_prices_come_from_the_price_list_api() {
    use common::price_apis::PriceList;
    let moto = Moto::start_in("eu-west-1").await;
    let list = PriceList::start(&[("m7g.large", "0.0892000000"), ("c7g.large", "0.0803000000"), ("m6i.large", "0.1070000000")]).await;
    let catalog = Arc::new(Catalog::embedded().expect("catalog"));
    assert_eq!(catalog.price("m7g.large", Some("eu-west-1"), CapacityType::OnDemand), None, "the catalog does not price eu-west-1");
    let settings = archer::config::AwsConfig { pricing_endpoint: Some(list.endpoint.clone()), ..moto.settings() };
    let sdk = archer::provisioner::cloud::aws::sdk_config(&settings).await;
    let aws = Aws::new(&sdk, catalog.clone(), settings.clone()).await.expect("a provider in eu-west-1");
    assert!(list.refused().is_empty(), "requests botocore's model refuses: {:?}", list.refused());
    let body = list.bodies.lock().unwrap()[0].clone();
    let filter = |f: &str| body["Filters"].as_array().expect("filters").iter().find(|x| x["Field"] == f).map(|x| x["Value"].clone());
    assert_eq!((filter("regionCode"), filter("operatingSystem"), filter("tenancy"), filter("preInstalledSw"), filter("capacitystatus")), (Some("eu-west-1".into()), Some("Linux".into()), Some("Shared".into()), Some("NA".into()), Some("Used".into())));

    let all = aws.offerings();
    let find = |t: &str, c: CapacityType| all.iter().find(|o| o.instance.name == t && o.zone == "eu-west-1a" && o.capacity == c).map(|o| o.price);
    assert_eq!(find("m7g.large", CapacityType::OnDemand), Some(0.0892), "the API's eu-west-1 price, not us-east-1's 0.0816");
    assert_eq!(find("c7g.large", CapacityType::OnDemand), Some(0.0803));
    let types: std::collections::BTreeSet<&str> = all.iter().map(|o| o.instance.name.as_str()).collect();
    assert_eq!(types, ["c7g.large", "m6i.large", "m7g.large"].into(), "only what something prices here");
    assert!(all.iter().all(|o| o.zone.starts_with("eu-west-1")), "EC2's eu-west-1 zones");
    let status = aws.prices().expect("a status");
    assert_eq!((status.source, status.priced, status.failing_since), ("price-list-api", 3, None));
    assert_eq!(aws.book().on_demand_source("m7g.large"), "price-list-api");

    // The next answer moves the prices (the loop does this every priceRefreshHours).
    list.set_prices(&[("m7g.large", "0.0700000000"), ("c7g.large", "0.0803000000"), ("m6i.large", "0.1070000000")]);
    assert!(aws.refresh_prices().await);
    assert_eq!(aws.offerings().iter().find(|o| o.instance.name == "m7g.large" && o.capacity == CapacityType::OnDemand).map(|o| o.price), Some(0.07));

    // The API failing: the last answer stays, and the status says since when.
    list.down.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(!aws.refresh_prices().await);
    let status = aws.prices().expect("a status");
    assert_eq!((status.source, status.failures), ("price-list-api", 1));
    assert!(status.failing_since.is_some() && status.last_error.as_deref().is_some_and(|e| e.contains("ServiceUnavailable")), "{status:?}");
    assert_eq!(aws.offerings().iter().find(|o| o.instance.name == "m7g.large" && o.capacity == CapacityType::OnDemand).map(|o| o.price), Some(0.07));

    // A provider starting while the API is down, in a region nothing else prices, refuses to
    // start and says why; in us-east-1 it plans with the catalog's prices and says so.
    let err = Aws::new(&sdk, catalog.clone(), settings.clone()).await.err().expect("nothing prices eu-west-1");
    assert!(err.to_string().contains("eu-west-1") && err.to_string().contains("Price List Query API did not answer"), "{err}");
    let east = archer::config::AwsConfig { pricing_endpoint: Some(list.endpoint.clone()), ..moto.settings_in(REGION) };
    let aws = Aws::new(&archer::provisioner::cloud::aws::sdk_config(&east).await, catalog.clone(), east).await.expect("us-east-1 from the catalog");
    let status = aws.prices().expect("a status");
    assert_eq!(status.source, "catalog");
    assert!(status.failing_since.is_some());
    assert_eq!(aws.offerings().iter().find(|o| o.instance.name == "m6g.large" && o.capacity == CapacityType::OnDemand).map(|o| o.price), catalog.price("m6g.large", Some(REGION), CapacityType::OnDemand));
}
