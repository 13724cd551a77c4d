//! The AWS EC2 provider: instance types and zones from EC2, priced on demand by the AWS Price
//! List Query API (`prices`; the catalog's until it answers) and spot by EC2's history, EC2NodeClasses resolved into subnets, security groups and images, one
//! `CreateFleet` (type `instant`) per claim through a launch template per node class, image and
//! node shape, and every instance tagged with the cluster, the claim and the pool.
//!
//! - `nodeclass`: the EC2NodeClass resource;
//! - `resolve`: its selectors against EC2; `profile`: the instance profile of its `role`;
//! - `offerings`: instance types, zones, prices and the insufficient-capacity cache;
//! - `prices`: the Price List Query API's on-demand prices of a region;
//! - `launch`: launch templates, the fleet request and what it answers;
//! - `instances`: finding, listing and terminating this cluster's instances;
//! - `interruption`: the SQS queue of EventBridge interruption events;
//! - `ecr`: private ECR images read with Archer's own identity (the registry client's sign-in).

pub mod ecr;
pub mod interruption;
pub mod launch;
pub mod nodeclass;
pub mod offerings;
pub mod prices;
pub mod profile;
pub mod resolve;
mod instances;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kube::api::Api;
use kube::Client;

use archer_cloud_classes::{NodeClasses, ResolvedClass, Resolver};
use archer_cloud::{CloudError, CloudProvider, Instance, NodeClassReadiness};
use archer_core::catalog::Catalog;
use archer_cloud::settings::AwsConfig;
use archer_core::packer::Offering;
use archer_api::nodeclaim::NodeClaim;
use nodeclass::{EC2NodeClass, EC2NodeClassSpec, EC2NodeClassStatus};
use offerings::Book;
use resolve::Resolved;

pub(crate) const PROVIDER: &str = "aws";
/// Tags on everything Archer creates.
pub(crate) const CLUSTER_TAG: &str = "archer.dev/cluster";
pub(crate) const NODECLAIM_TAG: &str = "archer.dev/nodeclaim";
pub(crate) const NODEPOOL_TAG: &str = "archer.dev/nodepool";
pub(crate) const NODECLASS_TAG: &str = "archer.dev/ec2nodeclass";
/// A claim younger than this with no status was just written by this process: the claim keeper
/// relaunches only older ones (`worker::keep_claims`), so it cannot have been launched yet.
const FRESH_CLAIM: Duration = Duration::from_secs(5);
/// A launch template no launch used for this long (and older than that) is deleted.
const TEMPLATE_UNUSED_FOR: Duration = Duration::from_secs(3600);
/// The condition a node class reports.
const READY_CONDITION: &str = "Ready";

/// A readable message of an SDK error (of any AWS service): the service's code and message, or
/// the chain of causes of a failure to get an answer. Never the raw response (SDK errors' own
/// rendering carries it, and that overflows an Event's 1 KiB note).
pub(crate) fn sdk_error<E, R>(e: aws_sdk_ec2::error::SdkError<E, R>) -> String
where
    E: std::error::Error + aws_sdk_ec2::error::ProvideErrorMetadata + 'static,
    R: std::fmt::Debug,
{
    use aws_sdk_ec2::error::ProvideErrorMetadata;
    match (e.code(), e.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_string(),
        _ => {
            let mut out = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                out.push_str(": ");
                out.push_str(&s.to_string());
                source = s.source();
            }
            out
        }
    }
}

pub(crate) fn api_error(message: impl Into<String>) -> CloudError {
    CloudError::Api { provider: PROVIDER, message: message.into() }
}

/// The SDK's configuration from the standard chain, with the region and endpoint of the settings
/// when given. The HTTP client is rustls with ring, like the rest of Archer.
pub async fn sdk_config(settings: &AwsConfig) -> aws_config::SdkConfig {
    let http = aws_smithy_http_client::Builder::new().tls_provider(aws_smithy_http_client::tls::Provider::Rustls(aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring)).build_https();
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http);
    if let Some(r) = &settings.region {
        loader = loader.region(aws_config::Region::new(r.clone()));
    }
    if let Some(e) = &settings.endpoint {
        loader = loader.endpoint_url(e.clone());
    }
    loader.load().await
}

/// Whether the SDK's endpoint (the settings' or `AWS_ENDPOINT_URL`) may receive signed requests,
/// which carry the session token: `https`, or loopback (moto in tests).
fn check_endpoint(sdk: &aws_config::SdkConfig) -> Result<(), CloudError> {
    match sdk.endpoint_url() {
        Some(e) => archer_cloud::settings::token_endpoint("the AWS endpoint (provisioner.aws.endpoint, AWS_ENDPOINT_URL)", e).map_err(api_error),
        None => Ok(()),
    }
}

/// The offerings EC2 has in the settings' region, read once (`archer prices --cloud-provider
/// aws`): the catalog's types it offers there, with its current spot prices. Also the region.
pub async fn read_book(settings: &AwsConfig, catalog: Arc<Catalog>) -> Result<(Book, String), CloudError> {
    let sdk = sdk_config(settings).await;
    check_endpoint(&sdk)?;
    let region = sdk.region().map(|r| r.to_string()).ok_or_else(|| api_error("no AWS region: pass --region or set AWS_REGION"))?;
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let book = Book::new(catalog, region.clone(), Duration::from_secs(1));
    if settings.price_refresh_hours > 0 {
        book.refresh_on_demand(&prices::client(&sdk, settings.pricing_endpoint.as_deref())).await;
    }
    book.refresh_types(&ec2).await?;
    book.refresh_spot(&ec2).await?;
    Ok((book, region))
}

/// A node class and what it resolved to.
pub(crate) type Class = ResolvedClass<EC2NodeClassSpec, Resolved>;

pub struct Aws {
    ec2: aws_sdk_ec2::Client,
    sqs: aws_sdk_sqs::Client,
    iam: aws_sdk_iam::Client,
    /// Archer's own account, which interruption events must come from.
    sts: aws_sdk_sts::Client,
    /// The Price List Query API (on-demand prices).
    pricing: aws_sdk_pricing::Client,
    settings: AwsConfig,
    region: String,
    book: Book,
    /// Resolved node classes by name (kept by [`Aws::refresh_classes`] and the watch).
    classes: NodeClasses<EC2NodeClassSpec, Resolved>,
    /// Launch templates known to exist, and when a launch last used each.
    templates: Mutex<HashMap<String, std::time::Instant>>,
    /// Launch templates known to exist (one lookup or creation per name at a time).
    known_templates: moka::future::Cache<String, ()>,
}

impl Aws {
    /// Read the region's on-demand prices (the Price List Query API, else the catalog's), EC2's
    /// instance types, zones and spot prices: the provider can plan when this returns,
    /// and launch for a node class once [`Aws::refresh_classes`] or [`Aws::use_class`] has it.
    pub async fn new(sdk: &aws_config::SdkConfig, catalog: Arc<Catalog>, settings: AwsConfig) -> Result<Aws, CloudError> {
        check_endpoint(sdk)?;
        let region = sdk.region().map(|r| r.to_string()).ok_or_else(|| api_error("no AWS region: set provisioner.aws.region or AWS_REGION"))?;
        let ec2 = aws_sdk_ec2::Client::new(sdk);
        let sqs = aws_sdk_sqs::Client::new(sdk);
        let iam = aws_sdk_iam::Client::new(sdk);
        let sts = aws_sdk_sts::Client::new(sdk);
        let pricing = prices::client(sdk, settings.pricing_endpoint.as_deref());
        let book = Book::new(catalog, region.clone(), Duration::from_secs(settings.insufficient_capacity_ttl_seconds));
        let aws = Aws { ec2, sqs, iam, sts, pricing, settings, region, book, classes: NodeClasses::default(), templates: Mutex::new(HashMap::new()), known_templates: moka::future::Cache::new(10_000) };
        if aws.settings.price_refresh_hours > 0 {
            aws.book.refresh_on_demand(&aws.pricing).await;
        }
        aws.book.refresh_types(&aws.ec2).await?;
        aws.book.refresh_spot(&aws.ec2).await?;
        Ok(aws)
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    pub fn ec2(&self) -> &aws_sdk_ec2::Client {
        &self.ec2
    }

    pub fn settings(&self) -> &AwsConfig {
        &self.settings
    }

    pub fn book(&self) -> &Book {
        &self.book
    }

    /// Read the region's on-demand prices from the Price List Query API now (as the refresh
    /// loop does every `priceRefreshHours`); `true` when it answered.
    pub async fn refresh_prices(&self) -> bool {
        self.book.refresh_on_demand(&self.pricing).await
    }

    /// Keep on-demand and spot prices and the cluster's node classes current, until dropped.
    pub async fn run(self: Arc<Self>, kube: Client) {
        let spot = Duration::from_secs(self.settings.spot_price_refresh_seconds);
        let me_prices = self.clone();
        let price_loop = async move { me_prices.book.keep_on_demand_fresh(&me_prices.pricing, me_prices.settings.price_refresh_hours).await };
        let classes = Duration::from_secs(self.settings.node_class_refresh_seconds);
        let me = self.clone();
        let (me_watch, kube_watch) = (self.clone(), kube.clone());
        let spot_loop = async move {
            loop {
                tokio::time::sleep(spot).await;
                if let Err(e) = me.book.refresh_spot(&me.ec2).await {
                    tracing::warn!(error = %e, "spot prices not refreshed; the last ones (or the catalog's estimate) stay");
                }
            }
        };
        let class_loop = async move {
            loop {
                tokio::time::sleep(classes).await;
                self.refresh_classes(&kube).await;
                if let Err(e) = launch::delete_unused_templates(&self, TEMPLATE_UNUSED_FOR).await {
                    tracing::warn!(error = %e, "launch templates not cleaned up");
                }
            }
        };
        futures::future::join4(price_loop, spot_loop, class_loop, me_watch.classes.watch(me_watch.as_ref(), kube_watch)).await;
    }

    /// Resolve a node class against EC2 and launch with it from now on.
    pub async fn use_class(&self, nc: &EC2NodeClass) -> Arc<Class> {
        self.classes.resolve(self, nc).await
    }

    /// Resolve every EC2NodeClass of the cluster and write what it resolved to into its status;
    /// node classes gone from the cluster (and not resolved since the list) are forgotten.
    pub async fn refresh_classes(&self, kube: &Client) {
        self.classes.refresh(self, kube).await;
    }
}

#[async_trait]
impl Resolver for Aws {
    type Class = EC2NodeClass;
    type Spec = EC2NodeClassSpec;
    type Resolved = Resolved;
    const KIND: &'static str = "EC2NodeClass";
    const PROVIDER: &'static str = PROVIDER;

    fn spec(class: &EC2NodeClass) -> &EC2NodeClassSpec {
        &class.spec
    }

    /// Its selectors against EC2, and the instance profile of its role.
    async fn resolve(&self, nc: &EC2NodeClass) -> Resolved {
        let mut resolved = match resolve::resolve(&self.ec2, &nc.spec, &self.settings.ami_owners).await {
            Ok(r) => r,
            Err(e) => Resolved { problems: vec![format!("EC2 could not be asked: {e}")], ..Default::default() },
        };
        if let (None, Some(role)) = (&nc.spec.instance_profile, &nc.spec.role) {
            match profile::ensure(&self.iam, &self.settings.cluster_name, &nc.name(), role).await {
                Ok(name) => resolved.instance_profile = Some(name),
                Err(e) => resolved.problems.push(format!("no instance profile for role {role}: {e}")),
            }
        }
        resolved
    }

    fn problems(resolved: &Resolved) -> Vec<String> {
        resolved.problems.clone()
    }

    /// What it resolved to and a Ready condition (its transition time kept while the status
    /// stays the same); written only when it changed.
    async fn write_status(&self, api: &Api<EC2NodeClass>, nc: &EC2NodeClass, r: &Resolved) -> Result<(), kube::Error> {
        let old = nc.status.clone().unwrap_or_default();
        let (status, reason, message) = if r.ready() { ("True", "Resolved", "every selector resolved".to_string()) } else { ("False", "NotResolved", r.problems.join("; ")) };
        let mut conditions = old.conditions.clone();
        archer_api::conditions::set(&mut conditions, READY_CONDITION, status, reason, &message, nc.metadata.generation);
        let new = EC2NodeClassStatus { subnets: r.subnets.clone(), security_groups: r.security_groups.clone(), amis: r.amis.clone(), instance_profile: r.instance_profile.clone(), conditions };
        if new == old {
            return Ok(());
        }
        let (params, patch) = archer_api::apply::status::<EC2NodeClass>(&nc.name(), nc.metadata.resource_version.as_deref(), &new);
        api.patch_status(&nc.name(), &params, &patch).await.map(|_| ())
    }
}

#[async_trait]
impl CloudProvider for Aws {
    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn node_class_readiness(&self, node_class_ref: Option<&BTreeMap<String, String>>) -> NodeClassReadiness {
        self.classes.readiness::<Aws>(node_class_ref)
    }

    fn offerings(&self) -> Arc<Vec<Offering>> {
        self.book.offerings()
    }

    fn prices(&self) -> Option<archer_cloud::prices::PriceStatus> {
        Some(self.book.price_status())
    }

    async fn create(&self, claim: &NodeClaim) -> Result<Instance, CloudError> {
        // A claim written moments ago and never tried is launched straight away (the client token
        // still guards it); any other may have been launched before a crash or a lost answer:
        // its instance is looked up by tag first, so a retry never makes a second one.
        let fresh = claim.status.is_none() && claim.metadata.creation_timestamp.as_ref().is_some_and(|t| t.0.duration_until(k8s_openapi::jiff::Timestamp::now()).as_secs_f64() < FRESH_CLAIM.as_secs_f64());
        if !fresh {
            if let Some(i) = instances::of_claim(&self.ec2, &self.settings.cluster_name, &claim.name()).await? {
                tracing::info!(claim = %claim.name(), provider_id = %i.provider_id, "instance already launched for this claim");
                return Ok(i);
            }
        }
        let (class_name, class) = self.classes.for_claim::<Aws>(claim)?;
        let template = launch::ensure_template(self, &class_name, &class, claim).await?;
        let mut instance = launch::fleet(self, &template, &class.resolved, claim).await?;
        instance.node_class_hash = Some(launch::class_hash(&class.spec));
        Ok(instance)
    }

    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        instances::terminate_claim(&self.ec2, &self.settings.cluster_name, claim).await
    }

    async fn list(&self) -> Result<Vec<Instance>, CloudError> {
        instances::list(&self.ec2, &self.settings.cluster_name).await
    }

    fn drifted(&self, claim: &NodeClaim) -> Option<String> {
        let name = claim.spec.node_class_ref.as_ref()?.get("name")?;
        let class = self.classes.get(name)?;
        let status = claim.status.as_ref()?;
        if status.node_class_hash.as_deref().is_some_and(|h| h != launch::class_hash(&class.spec)) {
            return Some(format!("EC2NodeClass {name} changed"));
        }
        let current = class.resolved.ami(&claim.spec.arch)?;
        match status.image_id.as_deref() {
            Some(image) if image != current.id => Some(format!("image {image} was replaced by {} in EC2NodeClass {name}", current.id)),
            _ => None,
        }
    }

    fn interruptions(&self, handler: Arc<dyn archer_cloud::InterruptionHandler>) -> Option<futures::future::BoxFuture<'static, ()>> {
        let queue = self.settings.interruption_queue.clone()?;
        Some(Box::pin(interruption::run(self.sqs.clone(), self.sts.clone(), queue, self.settings.interruption_max_receives, handler)))
    }
}
