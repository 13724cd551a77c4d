//! moto's server (PyPI `moto[server]`), a real server speaking the EC2 and SQS APIs, on loopback,
//! seeded with EKS-style AL2023 images for both architectures (`MOTO_AMIS_PATH`), and a VPC with
//! one tagged subnet per zone and tagged security groups.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aws_sdk_ec2::types::{Filter, ResourceType, Tag, TagSpecification};

pub const REGION: &str = "us-east-1";
pub const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];
pub const DISCOVERY_TAG: &str = "karpenter.sh/discovery";
pub const CLUSTER: &str = "archer-test";
/// The account moto answers as (its default; STS `GetCallerIdentity` names it).
pub const ACCOUNT: &str = "123456789012";
/// The arm64 images, oldest first (the newest must win).
pub const ARM_AMIS: [&str; 2] = ["ami-0a1a2023a0000001", "ami-0a1a2023a0000002"];
pub const AMD_AMI: &str = "ami-0a1a2023b0000001";
/// IAM roles `network()` makes for node classes to name.
pub const NODE_ROLES: [&str; 3] = ["KarpenterNodeRole-test", "KarpenterNodeRole-e2e", "NodeRole-2"];

pub fn moto_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("ARCHER_TEST_MOTO") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let cached = home.join(".cache/archer-test/moto/bin/moto_server");
    assert!(cached.exists(), "moto's server is needed: python3 -m venv ~/.cache/archer-test/moto && ~/.cache/archer-test/moto/bin/pip install 'moto[server]' (.ci/run does; or set ARCHER_TEST_MOTO)");
    cached
}

fn images_json() -> String {
    let img = |id: &str, name: &str, arch: &str, created: &str| {
        serde_json::json!({"ami_id": id, "name": name, "architecture": arch, "creation_date": created, "state": "available", "public": true, "owner_id": "602401143452",
            "image_location": format!("amazon/{name}"), "root_device_type": "ebs", "root_device_name": "/dev/xvda", "virtualization_type": "hvm", "hypervisor": "xen", "description": name})
    };
    serde_json::to_string(&[
        img(ARM_AMIS[0], "amazon-eks-node-al2023-arm64-standard-1.34-v20251001", "arm64", "2025-10-01T00:00:00.000Z"),
        img(ARM_AMIS[1], "amazon-eks-node-al2023-arm64-standard-1.34-v20251101", "arm64", "2025-11-01T00:00:00.000Z"),
        img(AMD_AMI, "amazon-eks-node-al2023-x86_64-standard-1.34-v20251101", "x86_64", "2025-11-01T00:00:00.000Z"),
        img("ami-0b0771e0000000001", "bottlerocket-aws-k8s-1.34-x86_64-v1.50.0-abcdef", "x86_64", "2025-11-01T00:00:00.000Z"),
    ])
    .expect("json")
}

/// A running moto server; killed on drop.
pub struct Moto {
    pub endpoint: String,
    /// The region the fixtures and the provider's settings use (moto keeps regions apart).
    pub region: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Static test credentials, in the environment the SDK's standard chain reads.
pub fn test_credentials() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (k, v) in [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_REGION", REGION), ("AWS_EC2_METADATA_DISABLED", "true")] {
            // Set before any thread of the test reads the environment (a Once, first thing).
            std::env::set_var(k, v);
        }
    });
}

impl Moto {
    pub async fn start() -> Moto {
        Self::start_in(REGION).await
    }

    /// A moto whose fixtures (`network`, `instances`) and settings are in `region`.
    pub async fn start_in(region: &str) -> Moto {
        test_credentials();
        let dir = tempfile::tempdir().expect("tempdir");
        let amis = dir.path().join("amis.json");
        std::fs::write(&amis, images_json()).expect("amis");
        let port = super::free_port();
        let child = Command::new(moto_binary())
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("MOTO_AMIS_PATH", &amis)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let endpoint = format!("http://127.0.0.1:{port}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(std::time::Instant::now() < deadline, "moto did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Moto { endpoint, region: region.to_string(), child, _dir: dir }
    }

    pub fn settings(&self) -> archer::config::AwsConfig {
        self.settings_in(&self.region)
    }

    /// The region's three zones.
    pub fn zones(&self) -> Vec<String> {
        ["a", "b", "c"].iter().map(|z| format!("{}{z}", self.region)).collect()
    }

    /// The provider's settings for `region` (moto keeps each region's resources apart).
    pub fn settings_in(&self, region: &str) -> archer::config::AwsConfig {
        archer::config::AwsConfig { cluster_name: CLUSTER.into(), region: Some(region.into()), endpoint: Some(self.endpoint.clone()), ..Default::default() }
    }

    pub async fn sdk(&self) -> aws_config::SdkConfig {
        archer::provisioner::cloud::aws::sdk_config(&self.settings()).await
    }

    /// A VPC with one subnet per zone and two security groups, all tagged for discovery (and one
    /// untagged subnet that must not be picked), and the IAM roles of `NODE_ROLES`. Returns the
    /// subnet ids by zone.
    pub async fn network(&self) -> Vec<(String, String)> {
        let ec2 = aws_sdk_ec2::Client::new(&self.sdk().await);
        let tag = |r: ResourceType| TagSpecification::builder().resource_type(r).tags(Tag::builder().key(DISCOVERY_TAG).value(CLUSTER).build()).build();
        let vpc = ec2.create_vpc().cidr_block("10.0.0.0/16").send().await.expect("vpc").vpc().and_then(|v| v.vpc_id().map(String::from)).expect("vpc id");
        let mut subnets = Vec::new();
        let zones = self.zones();
        for (i, z) in zones.iter().enumerate() {
            let s = ec2.create_subnet().vpc_id(&vpc).cidr_block(format!("10.0.{i}.0/24")).availability_zone(z).tag_specifications(tag(ResourceType::Subnet)).send().await.expect("subnet");
            subnets.push((z.to_string(), s.subnet().and_then(|s| s.subnet_id().map(String::from)).expect("subnet id")));
        }
        ec2.create_subnet().vpc_id(&vpc).cidr_block("10.0.9.0/24").availability_zone(&zones[0]).send().await.expect("untagged subnet");
        ec2.create_security_group().group_name("nodes").description("nodes").vpc_id(&vpc).tag_specifications(tag(ResourceType::SecurityGroup)).send().await.expect("sg");
        ec2.create_security_group().group_name("extra").description("extra").vpc_id(&vpc).send().await.expect("sg");
        // The node roles the tests' node classes name.
        let iam = aws_sdk_iam::Client::new(&self.sdk().await);
        let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
        for role in NODE_ROLES {
            iam.create_role().role_name(role).assume_role_policy_document(trust).send().await.expect("role");
        }
        subnets
    }

    /// Instances of the test cluster in a state, by id.
    pub async fn instances(&self, state: &str) -> Vec<aws_sdk_ec2::types::Instance> {
        let ec2 = aws_sdk_ec2::Client::new(&self.sdk().await);
        let r = ec2
            .describe_instances()
            .filters(Filter::builder().name("tag:archer.dev/cluster").values(CLUSTER).build())
            .filters(Filter::builder().name("instance-state-name").values(state).build())
            .send()
            .await
            .expect("describe");
        r.reservations().iter().flat_map(|r| r.instances().to_vec()).collect()
    }
}

/// Pass one request through to `upstream` (moto) and its answer back: the body of the small
/// proxies that count calls or inject the faults moto cannot produce.
pub async fn forward(http: &reqwest::Client, upstream: &str, method: http::Method, uri: &http::Uri, headers: &http::HeaderMap, body: axum::body::Bytes) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut req = http.request(method, format!("{upstream}{uri}")).body(body);
    for (k, v) in headers {
        if k != http::header::HOST {
            req = req.header(k, v);
        }
    }
    match req.send().await {
        Ok(r) => {
            let status = r.status();
            let ct = r.headers().get(http::header::CONTENT_TYPE).cloned();
            let mut resp = (status, r.bytes().await.unwrap_or_default()).into_response();
            if let Some(ct) = ct {
                resp.headers_mut().insert(http::header::CONTENT_TYPE, ct);
            }
            resp
        }
        Err(e) => (http::StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}

/// A proxy in front of moto that refuses every CreateFleet with EC2's `UnauthorizedOperation`
/// (moto launches whatever it is asked to), and passes everything else through.
pub async fn launch_refusing_proxy(upstream: String) -> String {
    use axum::response::IntoResponse;
    let http = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |method: http::Method, uri: http::Uri, headers: http::HeaderMap, body: axum::body::Bytes| {
        let (http, upstream) = (http.clone(), upstream.clone());
        async move {
            if String::from_utf8_lossy(&body).contains("Action=CreateFleet") {
                let xml = r#"<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>UnauthorizedOperation</Code><Message>You are not authorized to perform this operation.</Message></Error></Errors><RequestID>r-1</RequestID></Response>"#;
                return (http::StatusCode::FORBIDDEN, [(http::header::CONTENT_TYPE, "text/xml")], xml).into_response();
            }
            forward(&http, &upstream, method, &uri, &headers, body).await
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}
