//! The Azure VM provider: offerings from the catalog's sizes in the region's zones, on-demand and
//! spot, priced by the Azure Retail Prices API (refreshed every `priceRefreshHours`; the
//! catalog's prices, and its spot estimate, until it answers and for the sizes it does not
//! price), a NIC and a VM per claim through Azure Resource Manager, every
//! resource tagged with the cluster, the claim, the pool and the class.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use kube::Client;

use crate::arm::{Arm, ArmError};
use crate::auth::Credential;
use crate::classes::{self, Class, Resolution};
use crate::nodeclass::{AKSNodeClass, AKSNodeClassSpec};
use crate::launch::{self, Failure};
use crate::models::{Nic, Vm, COMPUTE_API, NETWORK_API};
use archer_api::nodeclaim::NodeClaim;
use archer_cloud_classes::{NodeClasses, Resolver};
use archer_cloud::settings::AzureConfig;
use archer_cloud::prices::{LivePrices, PriceStatus, RegionPrices};
use archer_cloud::unavailable::Unavailable;
use archer_cloud::{CloudError, CloudProvider, Instance, InterruptionHandler, NodeClassReadiness};
use archer_core::catalog::{CapacityType, Catalog};
use archer_core::packer::Offering;

pub(crate) const PROVIDER: &str = "azure";
/// A claim younger than this with no status was just written by this process (see the AWS
/// provider): it cannot have been launched yet, so no lookup first.
const FRESH_CLAIM: Duration = Duration::from_secs(5);
/// How long a NIC's creation or a deletion may take.
const NETWORK_TIMEOUT: Duration = Duration::from_secs(120);

fn api_error(e: ArmError) -> CloudError {
    CloudError::Api { provider: PROVIDER, message: e.to_string() }
}

pub struct Azure {
    arm: Arm,
    settings: AzureConfig,
    kube: Client,
    catalog: Arc<Catalog>,
    /// For the Retail Prices API.
    http: reqwest::Client,
    /// The Retail Prices API's last answer.
    live: LivePrices,
    /// Every offering of the region's zones at current prices.
    all: RwLock<Arc<Vec<Offering>>>,
    unavailable: Unavailable,
    classes: NodeClasses<AKSNodeClassSpec, Resolution>,
}

impl Azure {
    /// A provider for the settings' subscription, resource group and region, priced by the
    /// catalog until [`Azure::refresh_prices`] has the Retail Prices API's answer. Fails when no
    /// token source is configured.
    pub fn new(settings: AzureConfig, catalog: Arc<Catalog>, kube: Client) -> Result<Azure, CloudError> {
        let http = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| api_error(ArmError::Transport(e.to_string())))?;
        let credential = Credential::workload_identity(http.clone(), &settings).map_err(api_error)?;
        let arm = Arm::new(http.clone(), &settings.endpoint, credential).map_err(api_error)?;
        let unavailable = Unavailable::new(Duration::from_secs(3600));
        let azure = Azure { arm, settings, kube, catalog, http, live: LivePrices::new(crate::prices::API), all: RwLock::new(Arc::new(Vec::new())), unavailable, classes: NodeClasses::default() };
        azure.rebuild();
        Ok(azure)
    }

    /// Read the region's prices from the Retail Prices API once (when live prices are on), then
    /// fail if no size has a price: the provider can plan when this returns `Ok`.
    pub async fn start_prices(&self) -> Result<(), CloudError> {
        if self.settings.price_refresh_hours > 0 {
            self.refresh_prices().await;
        }
        if !self.all_offerings().is_empty() {
            return Ok(());
        }
        let status = self.live.status();
        let known: Vec<String> = self.catalog.regions().into_iter().filter(|(_, p)| p.contains(PROVIDER)).map(|(r, _)| r).collect();
        let why = match &status.last_error {
            Some(e) => format!("the Retail Prices API did not answer ({e})"),
            None if self.settings.price_refresh_hours == 0 => "live prices are off (priceRefreshHours 0)".to_string(),
            None => "the Retail Prices API priced none of the catalog's sizes".to_string(),
        };
        Err(CloudError::Api { provider: PROVIDER, message: format!("no Azure size has a price in {}: {why}, and the catalog prices only {}", self.settings.location, known.join(", ")) })
    }

    /// Read the region's prices from the Retail Prices API; the last ones (or the catalog's)
    /// stay when it fails. `true` when it answered.
    pub async fn refresh_prices(&self) -> bool {
        let answered = self.live.refresh(&|| self.fetch_prices()).await;
        if answered {
            self.rebuild();
        }
        answered
    }

    async fn fetch_prices(&self) -> Result<RegionPrices, crate::prices::PriceError> {
        crate::prices::fetch(&self.http, &self.settings.prices_endpoint, &self.settings.location).await
    }

    /// Where the prices come from and how old they are.
    pub fn price_status(&self) -> PriceStatus {
        self.live.status()
    }

    /// The offerings again from the current prices: each catalog size of Azure in each zone,
    /// on demand at the API's price (else the catalog's for the region), spot at the API's Spot
    /// meter (else estimated from the on-demand price by the catalog's spot discount).
    fn rebuild(&self) {
        let live = self.live.current();
        let region = &self.settings.location;
        let zones = self.settings.zones();
        let mut out = Vec::new();
        for t in self.catalog.types().iter().filter(|t| t.provider == PROVIDER) {
            let Some(list) = RegionPrices::list_price(live.as_deref(), t, region) else { continue };
            let on_demand = self.catalog.price_from(t, list, CapacityType::OnDemand);
            let spot = live.as_ref().and_then(|p| p.spot.get(&t.name).copied()).unwrap_or_else(|| self.catalog.price_from(t, list, CapacityType::Spot));
            for z in &zones {
                out.push(Offering { instance: t.clone(), zone: z.clone(), capacity: CapacityType::OnDemand, price: on_demand, pool: None });
                out.push(Offering { instance: t.clone(), zone: z.clone(), capacity: CapacityType::Spot, price: spot, pool: None });
            }
        }
        *self.all.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(out);
    }

    pub fn settings(&self) -> &AzureConfig {
        &self.settings
    }

    /// Every offering, the unavailable ones included.
    pub fn all_offerings(&self) -> Arc<Vec<Offering>> {
        self.all.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Resolve the cluster's node classes once (the provider can launch when this returns).
    pub async fn refresh_classes(&self) {
        self.classes.refresh(self, &self.kube).await;
    }

    /// Resolve a node class against Azure and launch with it from now on (what the watch does
    /// for each AKSNodeClass of the cluster).
    pub async fn use_class(&self, name: &str, spec: &AKSNodeClassSpec) -> Arc<Class> {
        self.classes.resolve(self, &AKSNodeClass::new(name, spec.clone())).await
    }

    /// Keep the prices current and the node classes resolved (watch, and a periodic pass for
    /// new images), until dropped.
    pub async fn run(self: Arc<Self>) {
        let every = Duration::from_secs(self.settings.node_class_refresh_seconds);
        let me_prices = self.clone();
        let prices = async move { me_prices.live.keep_fresh(me_prices.settings.price_refresh_hours, || me_prices.fetch_prices(), || me_prices.rebuild()).await };
        let me = self.clone();
        let refresh = async move {
            loop {
                tokio::time::sleep(every).await;
                me.refresh_classes().await;
            }
        };
        let watch = self.classes.watch(self.as_ref(), self.kube.clone());
        futures::future::join3(prices, refresh, watch).await;
    }

    /// The VM of a claim, if it was made.
    async fn vm_of(&self, claim: &str) -> Result<Option<Vm>, CloudError> {
        let vm: Option<Vm> = self.arm.get(&launch::vm_path(&self.settings, &launch::vm_name(claim)), COMPUTE_API).await.map_err(api_error)?;
        Ok(vm.filter(|v| self.claims(&v.tags, claim)))
    }

    /// The NIC of a claim's name: `Ok(true)` when it is the claim's (Archer's tags), `Ok(false)`
    /// when there is none; an error when one is there that Archer did not make for the claim.
    async fn nic_of(&self, claim: &str) -> Result<bool, CloudError> {
        let name = launch::vm_name(claim);
        let nic: Option<Nic> = self.arm.get(&launch::nic_path(&self.settings, &name), NETWORK_API).await.map_err(api_error)?;
        match nic {
            None => Ok(false),
            Some(n) if self.claims(&n.tags, claim) => Ok(true),
            Some(_) => Err(CloudError::Api { provider: PROVIDER, message: format!("a NIC named {name} exists without Archer's tags for claim {claim} (cluster {}): not Archer's, left alone", self.settings.cluster_name) }),
        }
    }

    fn ours(&self, vm: &Vm) -> bool {
        vm.tags.get(launch::CLUSTER_TAG) == Some(&self.settings.cluster_name)
    }

    /// Whether a resource's tags say Archer made it, for this cluster, for `claim`: the check
    /// before every delete (a resource of the same name without them is someone else's).
    fn claims(&self, tags: &BTreeMap<String, String>, claim: &str) -> bool {
        tags.get(launch::NODECLAIM_TAG).map(String::as_str) == Some(claim) && tags.get(launch::CLUSTER_TAG) == Some(&self.settings.cluster_name)
    }

    /// Make the claim's NIC and VM; on failure, take back what was made. Also the hash of the
    /// node class it was made with (drift).
    async fn launch(&self, claim: &NodeClaim) -> Result<(Vm, String), CloudError> {
        let (class_name, class) = self.classes.for_claim::<Azure>(claim)?;
        let image = class.resolved.images.get(&claim.spec.arch).ok_or_else(|| CloudError::Api { provider: PROVIDER, message: format!("AKSNodeClass {class_name} has no {} image", claim.spec.arch) })?;
        let subnet = class.resolved.subnet.clone().unwrap_or_default();
        let claim_name = claim.metadata.name.clone().unwrap_or_default();
        let name = launch::vm_name(&claim_name);
        // The bootstrap first: a claim or class it cannot be written from touches nothing.
        let custom_data = launch::custom_data(&self.settings, &class.spec, claim).map_err(|message| CloudError::Api { provider: PROVIDER, message })?;
        let tags = launch::tags(&self.settings, &class_name, &class.spec, claim);
        let accelerated = self.catalog.get(&claim.spec.instance_type).and_then(|t| t.facts.get("accelerated_networking").cloned()).as_deref() == Some("true");
        // A PUT would take over a NIC of the name that is not Archer's (and its tags would then
        // let a clean-up delete it): refused instead.
        self.nic_of(&claim_name).await?;
        let nic_body = launch::nic_request(&self.settings, &subnet, tags.clone(), accelerated);
        let nic: Nic = self.arm.put(&launch::nic_path(&self.settings, &name), NETWORK_API, &nic_body, NETWORK_TIMEOUT).await.map_err(api_error)?;
        let shape = launch::VmShape { settings: &self.settings, spec: &class.spec, claim, name: &name, image_id: image, nic_id: &nic.id, tags, custom_data: &custom_data };
        let body = launch::vm_request(shape);
        let timeout = Duration::from_secs(self.settings.create_timeout_seconds);
        match self.arm.put::<_, Vm>(&launch::vm_path(&self.settings, &name), COMPUTE_API, &body, timeout).await {
            Ok(vm) => Ok((vm, launch::class_hash(&class.spec))),
            Err(e) => {
                self.clean_up(&claim_name).await;
                Err(self.failed(claim, e))
            }
        }
    }

    /// What a failed creation means: offerings left out for a while (Karpenter on Azure's
    /// table, [`launch::classify`]), and the next batch plans the next one; any other error is
    /// the claim's to retry.
    fn failed(&self, claim: &NodeClaim, e: ArmError) -> CloudError {
        let (code, message) = (e.code().unwrap_or_default().to_string(), e.message());
        let capacity = CapacityType::parse(&claim.spec.capacity_type).unwrap_or(CapacityType::OnDemand);
        let why = format!("{code}: {message}");
        let Some(failure) = launch::classify(&code, &message, capacity == CapacityType::Spot) else {
            return api_error(e);
        };
        let size = &claim.spec.instance_type;
        let all = self.all_offerings();
        let (marked, ttl): (Vec<&Offering>, Duration) = match failure {
            Failure::Size { all_zones, both_capacities, ttl } => {
                (all.iter().filter(|o| &o.instance.name == size && (all_zones || o.zone == claim.spec.zone) && (both_capacities || o.capacity == capacity)).collect(), ttl)
            }
            Failure::AllSpot { ttl } => (all.iter().filter(|o| o.capacity == CapacityType::Spot).collect(), ttl),
            Failure::RegionalQuota { ttl } => (all.iter().filter(|o| o.capacity == capacity).collect(), ttl),
        };
        for o in marked {
            self.unavailable.mark_for((o.instance.name.clone(), o.zone.clone(), o.capacity), &why, ttl);
        }
        CloudError::InsufficientCapacity { provider: PROVIDER, instance_type: size.clone(), zone: claim.spec.zone.clone(), message: why }
    }

    /// Delete a failed launch's VM (if any) and its NIC, best effort (garbage collection retries
    /// what is left); only what carries Archer's tags for the claim, as [`CloudProvider::delete`].
    async fn clean_up(&self, claim: &str) {
        if let Err(e) = self.delete_owned(claim).await {
            tracing::warn!(claim, vm = %launch::vm_name(claim), error = %e, "could not delete what a failed launch made");
        }
    }

    /// Delete the claim's VM and NIC, each only if its tags say Archer made it for this cluster
    /// and claim: a resource of the same name without them is someone else's, and is kept.
    async fn delete_owned(&self, claim: &str) -> Result<(), CloudError> {
        let name = launch::vm_name(claim);
        let vm: Option<Vm> = self.arm.get(&launch::vm_path(&self.settings, &name), COMPUTE_API).await.map_err(api_error)?;
        match vm {
            Some(vm) if self.claims(&vm.tags, claim) => self.arm.delete(&launch::vm_path(&self.settings, &name), COMPUTE_API, NETWORK_TIMEOUT).await.map_err(api_error)?,
            Some(_) => tracing::warn!(claim, vm = %name, "a VM of the claim's name without Archer's tags: not Archer's, not deleted"),
            None => {}
        }
        // The NIC goes with the VM; one left by a failed launch goes now.
        let nic: Option<Nic> = self.arm.get(&launch::nic_path(&self.settings, &name), NETWORK_API).await.map_err(api_error)?;
        match nic {
            Some(n) if self.claims(&n.tags, claim) => self.arm.delete(&launch::nic_path(&self.settings, &name), NETWORK_API, NETWORK_TIMEOUT).await.map_err(api_error)?,
            Some(_) => tracing::warn!(claim, nic = %name, "a NIC of the claim's name without Archer's tags: not Archer's, not deleted"),
            None => {}
        }
        Ok(())
    }

    /// The instance a VM is.
    fn instance(&self, vm: &Vm) -> Instance {
        let zone = vm.zones.first().map(|z| format!("{}-{z}", self.settings.location));
        Instance {
            provider_id: provider_id(&vm.id),
            node_name: vm.properties.os_profile.as_ref().and_then(|o| o.computer_name.clone()).unwrap_or_else(|| vm.name.clone()),
            claim: vm.tags.get(launch::NODECLAIM_TAG).cloned().unwrap_or_default(),
            instance_type: Some(vm.properties.hardware_profile.vm_size.clone()).filter(|s| !s.is_empty()),
            zone,
            launched_at: vm.properties.time_created.as_deref().and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok()).map(std::time::SystemTime::from),
            image_id: vm.properties.storage_profile.as_ref().and_then(|s| s.image_reference.as_ref()).and_then(|i| i.community_gallery_image_id.clone()),
            node_class_hash: None,
        }
    }
}

/// The Node's provider id of a VM, as Azure's cloud provider writes it: `azure://` and the VM's
/// resource id, its resource group in lower case.
pub(crate) fn provider_id(vm_id: &str) -> String {
    let mut parts: Vec<String> = vm_id.split('/').map(str::to_string).collect();
    if let Some(i) = parts.iter().position(|p| p.eq_ignore_ascii_case("resourceGroups")) {
        if let Some(rg) = parts.get_mut(i + 1) {
            *rg = rg.to_ascii_lowercase();
        }
    }
    format!("azure://{}", parts.join("/"))
}

#[async_trait]
impl Resolver for Azure {
    type Class = AKSNodeClass;
    type Spec = AKSNodeClassSpec;
    type Resolved = Resolution;
    const KIND: &'static str = "AKSNodeClass";
    const PROVIDER: &'static str = PROVIDER;

    fn spec(class: &AKSNodeClass) -> &AKSNodeClassSpec {
        &class.spec
    }

    async fn resolve(&self, class: &AKSNodeClass) -> Resolution {
        classes::resolve(&self.arm, &self.settings, &class.spec).await
    }

    fn problems(resolved: &Resolution) -> Vec<String> {
        resolved.all_problems()
    }

    async fn write_status(&self, api: &kube::Api<AKSNodeClass>, class: &AKSNodeClass, resolved: &Resolution) -> Result<(), kube::Error> {
        classes::write_status(api, class, resolved).await
    }
}

#[async_trait]
impl CloudProvider for Azure {
    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn node_class_readiness(&self, node_class_ref: Option<&BTreeMap<String, String>>) -> NodeClassReadiness {
        self.classes.readiness::<Azure>(node_class_ref)
    }

    fn offerings(&self) -> Arc<Vec<Offering>> {
        self.unavailable.filter(self.all_offerings())
    }

    fn prices(&self) -> Option<PriceStatus> {
        Some(self.live.status())
    }

    async fn create(&self, claim: &NodeClaim) -> Result<Instance, CloudError> {
        let claim_name = claim.metadata.name.clone().unwrap_or_default();
        let fresh = claim.status.is_none() && claim.metadata.creation_timestamp.as_ref().is_some_and(|t| t.0.duration_until(k8s_openapi::jiff::Timestamp::now()).as_secs_f64() < FRESH_CLAIM.as_secs_f64());
        if !fresh {
            if let Some(vm) = self.vm_of(&claim_name).await? {
                if vm.properties.provisioning_state.as_deref() != Some("Failed") {
                    tracing::info!(claim = %claim_name, vm = %vm.name, "VM already made for this claim");
                    return Ok(self.instance(&vm));
                }
                // A failed VM is made again by the PUT below (the same name).
            }
        }
        let (vm, class_hash) = self.launch(claim).await?;
        Ok(Instance { node_class_hash: Some(class_hash), ..self.instance(&vm) })
    }

    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        self.delete_owned(claim.metadata.name.as_deref().unwrap_or_default()).await
    }

    async fn list(&self) -> Result<Vec<Instance>, CloudError> {
        let path = format!("/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines", self.settings.subscription_id, self.settings.resource_group);
        let vms: Vec<Vm> = self.arm.list(&path, COMPUTE_API).await.map_err(api_error)?;
        Ok(vms.iter().filter(|v| self.ours(v) && v.tags.contains_key(launch::NODECLAIM_TAG)).map(|v| self.instance(v)).collect())
    }

    fn interruptions(&self, handler: Arc<dyn InterruptionHandler>) -> Option<futures::future::BoxFuture<'static, ()>> {
        Some(Box::pin(crate::preemption::run(self.kube.clone(), handler)))
    }

    fn drifted(&self, claim: &NodeClaim) -> Option<String> {
        let name = claim.spec.node_class_ref.as_ref()?.get("name")?;
        let class = self.classes.get(name)?;
        let status = claim.status.as_ref()?;
        if status.node_class_hash.as_deref().is_some_and(|h| h != launch::class_hash(&class.spec)) {
            return Some(format!("AKSNodeClass {name} changed"));
        }
        let current = class.resolved.images.get(&claim.spec.arch)?;
        match status.image_id.as_deref() {
            Some(image) if image != current => Some(format!("image {image} was replaced by {current} in AKSNodeClass {name}")),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_are_the_cloud_providers_with_the_resource_group_in_lower_case() {
        assert_eq!(
            provider_id("/subscriptions/s1/resourceGroups/MC_rg_aks_eastus/providers/Microsoft.Compute/virtualMachines/aks-default-x"),
            "azure:///subscriptions/s1/resourceGroups/mc_rg_aks_eastus/providers/Microsoft.Compute/virtualMachines/aks-default-x"
        );
    }
}
