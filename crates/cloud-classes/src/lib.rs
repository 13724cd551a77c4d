//! A cloud's node classes (EC2NodeClass, AKSNodeClass), resolved against the cloud and kept
//! current, the same way for every cloud:
//! - watched: a new or changed class is resolved at once (its pools open or close without
//!   waiting), a deleted one forgotten (its pools launch nothing); a status write is no change;
//! - listed again periodically, for what changes on the cloud's side (a newly published image);
//! - its status written after each resolution.
//!
//! What a class resolves to, and how its status reads, is each provider's ([`Resolver`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use kube::api::{Api, ListParams};
use kube::core::ClusterResourceScope;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use archer_cloud::{CloudError, NodeClassReadiness};
use archer_api::nodeclaim::NodeClaim;

/// How one cloud resolves its node class kind.
#[async_trait]
pub trait Resolver: Send + Sync {
    /// The node class resource (cluster-scoped).
    type Class: Resource<DynamicType = (), Scope = ClusterResourceScope> + Clone + DeserializeOwned + Debug + Send + Sync + 'static;
    type Spec: PartialEq + Clone + Send + Sync + 'static;
    /// What a class resolved to on the cloud.
    type Resolved: Send + Sync + 'static;
    /// The kind, for messages (`EC2NodeClass`).
    const KIND: &'static str;
    /// The provider, for errors (`aws`).
    const PROVIDER: &'static str;

    fn spec(class: &Self::Class) -> &Self::Spec;
    /// Ask the cloud what the class names (never fails: what could not be resolved is a problem).
    async fn resolve(&self, class: &Self::Class) -> Self::Resolved;
    /// Why the class cannot launch now; empty when it can.
    fn problems(resolved: &Self::Resolved) -> Vec<String>;
    /// Write what the class resolved to into its status (only when it changed).
    async fn write_status(&self, api: &Api<Self::Class>, class: &Self::Class, resolved: &Self::Resolved) -> Result<(), kube::Error>;
}

/// A node class's spec and what it resolved to.
#[derive(Debug)]
pub struct ResolvedClass<S, R> {
    pub spec: S,
    pub resolved: R,
    /// When it was resolved.
    at: Instant,
}

/// The resolved node classes of one kind, by name.
pub struct NodeClasses<S, R> {
    all: ArcSwap<HashMap<String, Arc<ResolvedClass<S, R>>>>,
}

impl<S, R> Default for NodeClasses<S, R> {
    fn default() -> Self {
        NodeClasses { all: ArcSwap::from_pointee(HashMap::new()) }
    }
}

type Entry<V> = Arc<ResolvedClass<<V as Resolver>::Spec, <V as Resolver>::Resolved>>;

impl<S, R> NodeClasses<S, R> {
    pub fn get(&self, name: &str) -> Option<Arc<ResolvedClass<S, R>>> {
        self.all.load().get(name).cloned()
    }

    fn insert(&self, name: String, class: Arc<ResolvedClass<S, R>>) {
        self.all.rcu(|all| {
            let mut all = (**all).clone();
            all.insert(name.clone(), class.clone());
            all
        });
    }

    fn remove(&self, name: &str) {
        self.all.rcu(|all| all.iter().filter(|(k, _)| k.as_str() != name).map(|(k, v)| (k.clone(), v.clone())).collect::<HashMap<_, _>>());
    }

    /// Keep only the classes named, and those resolved after `since` (newer than a list taken
    /// then).
    fn retain(&self, names: &[String], since: Instant) {
        self.all.rcu(|all| all.iter().filter(|(k, c)| names.contains(k) || c.at > since).map(|(k, v)| (k.clone(), v.clone())).collect::<HashMap<_, _>>());
    }

    /// Resolve a class against the cloud and launch with it from now on.
    pub async fn resolve<V: Resolver<Spec = S, Resolved = R>>(&self, resolver: &V, class: &V::Class) -> Entry<V>
    where
        S: Clone,
    {
        let resolved = resolver.resolve(class).await;
        let entry = Arc::new(ResolvedClass { spec: V::spec(class).clone(), resolved, at: Instant::now() });
        self.insert(class.name_any(), entry.clone());
        entry
    }

    /// Resolve a class, keep it, and write its status.
    async fn resolve_and_write<V: Resolver<Spec = S, Resolved = R>>(&self, resolver: &V, api: &Api<V::Class>, class: &V::Class)
    where
        S: Clone,
    {
        let entry = self.resolve(resolver, class).await;
        if let Err(e) = resolver.write_status(api, class, &entry.resolved).await {
            tracing::warn!(nodeclass = %class.name_any(), error = %e, "could not write the node class status");
        }
    }

    /// Resolve every class of the cluster and write its status; forget those gone from the
    /// cluster (a class the watch resolved after the list was taken is newer than the list: kept).
    pub async fn refresh<V: Resolver<Spec = S, Resolved = R>>(&self, resolver: &V, kube: &Client)
    where
        S: Clone,
    {
        let api: Api<V::Class> = Api::all(kube.clone());
        let listed_at = Instant::now();
        let list = match api.list(&ListParams::default()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(kind = V::KIND, error = %e, "cannot list the node classes");
                return;
            }
        };
        for class in &list.items {
            // The watch resolved it since the list was taken, from a spec at least as new.
            if self.get(&class.name_any()).is_some_and(|c| c.at > listed_at) {
                continue;
            }
            self.resolve_and_write(resolver, &api, class).await;
        }
        let names: Vec<String> = list.items.iter().map(|c| c.name_any()).collect();
        self.retain(&names, listed_at);
    }

    /// Resolve a class as soon as it appears or its spec changes, and forget one deleted, until
    /// dropped.
    pub async fn watch<V: Resolver<Spec = S, Resolved = R>>(&self, resolver: &V, kube: Client)
    where
        S: PartialEq + Clone,
    {
        use futures::StreamExt;
        use kube::runtime::{watcher, WatchStreamExt};
        let api: Api<V::Class> = Api::all(kube);
        let mut events = std::pin::pin!(watcher(api.clone(), watcher::Config::default()).default_backoff());
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(class) | watcher::Event::InitApply(class)) => {
                    if self.get(&class.name_any()).is_some_and(|c| &c.spec == V::spec(&class)) {
                        continue;
                    }
                    tracing::info!(kind = V::KIND, nodeclass = %class.name_any(), "node class added or changed; resolving it");
                    self.resolve_and_write(resolver, &api, &class).await;
                }
                Ok(watcher::Event::Delete(class)) => {
                    tracing::info!(kind = V::KIND, nodeclass = %class.name_any(), "node class deleted; its pools launch nothing");
                    self.remove(&class.name_any());
                }
                Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
                Err(e) => tracing::warn!(kind = V::KIND, error = %e, "node class watch error; retrying"),
            }
        }
    }

    /// Whether the class a pool names is there and ready ([`archer_cloud::CloudProvider::node_class_readiness`]).
    pub fn readiness<V: Resolver<Spec = S, Resolved = R>>(&self, node_class_ref: Option<&BTreeMap<String, String>>) -> NodeClassReadiness {
        let not_ready = |reason: &str, message: String| NodeClassReadiness::NotReady { reason: reason.into(), message };
        let Some(name) = node_class_ref.and_then(|r| r.get("name")) else {
            return not_ready("NodeClassNotFound", format!("the pool names no {} (spec.template.spec.nodeClassRef)", V::KIND));
        };
        let Some(class) = self.get(name) else {
            return not_ready("NodeClassNotFound", format!("{} {name} not found on the cluster", V::KIND));
        };
        match V::problems(&class.resolved) {
            problems if problems.is_empty() => NodeClassReadiness::Ready,
            problems => not_ready("NotResolved", format!("{} {name} is not ready: {}", V::KIND, problems.join("; "))),
        }
    }

    /// The class a claim launches with, by name, if it is there and ready.
    pub fn for_claim<V: Resolver<Spec = S, Resolved = R>>(&self, claim: &NodeClaim) -> Result<(String, Arc<ResolvedClass<S, R>>), CloudError> {
        let error = |message: String| CloudError::Api { provider: V::PROVIDER, message };
        let name = claim.spec.node_class_ref.as_ref().and_then(|r| r.get("name").cloned()).ok_or_else(|| error(format!("NodePool {} names no {} (spec.template.spec.nodeClassRef)", claim.spec.node_pool, V::KIND)))?;
        let class = self.get(&name).ok_or_else(|| error(format!("{} {name} does not exist (or is not resolved yet)", V::KIND)))?;
        let problems = V::problems(&class.resolved);
        if !problems.is_empty() {
            return Err(error(format!("{} {name} is not ready: {}", V::KIND, problems.join("; "))));
        }
        Ok((name, class))
    }
}

#[cfg(test)]
mod tests {
    //! The lookups every provider relies on, over a resolver of Namespaces (a cluster-scoped
    //! kind): the class is ready when its `team` label is set.
    use super::*;
    use k8s_openapi::api::core::v1::Namespace;

    struct ByLabel;

    #[async_trait]
    impl Resolver for ByLabel {
        type Class = Namespace;
        type Spec = Option<BTreeMap<String, String>>;
        type Resolved = Option<String>;
        const KIND: &'static str = "TestClass";
        const PROVIDER: &'static str = "test";

        fn spec(class: &Namespace) -> &Self::Spec {
            &class.metadata.labels
        }

        async fn resolve(&self, class: &Namespace) -> Option<String> {
            class.labels().get("team").cloned()
        }

        fn problems(resolved: &Option<String>) -> Vec<String> {
            if resolved.is_some() { Vec::new() } else { vec!["no team".into()] }
        }

        async fn write_status(&self, _: &Api<Namespace>, _: &Namespace, _: &Option<String>) -> Result<(), kube::Error> {
            Ok(())
        }
    }

    fn class(name: &str, team: Option<&str>) -> Namespace {
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.into());
        ns.metadata.labels = team.map(|t| BTreeMap::from([("team".to_string(), t.to_string())]));
        ns
    }

    fn claim_for(class: Option<&str>) -> NodeClaim {
        let spec = serde_json::json!({"nodePool": "p", "instanceType": "m", "zone": "z", "capacityType": "on-demand", "arch": "amd64", "os": "linux", "pricePerHour": 0.1,
            "nodeClassRef": class.map(|c| serde_json::json!({"name": c}))});
        NodeClaim::new("c", serde_json::from_value(spec).expect("spec"))
    }

    #[tokio::test]
    async fn readiness_and_the_class_of_a_claim_follow_what_each_class_resolved_to() {
        let classes: NodeClasses<Option<BTreeMap<String, String>>, Option<String>> = NodeClasses::default();
        let r = |name: &str| BTreeMap::from([("name".to_string(), name.to_string())]);
        assert!(matches!(classes.readiness::<ByLabel>(Some(&r("a"))), NodeClassReadiness::NotReady { reason, message } if reason == "NodeClassNotFound" && message == "TestClass a not found on the cluster"));
        assert!(matches!(classes.readiness::<ByLabel>(None), NodeClassReadiness::NotReady { message, .. } if message.contains("names no TestClass")));
        classes.resolve(&ByLabel, &class("a", Some("red"))).await;
        classes.resolve(&ByLabel, &class("b", None)).await;
        assert_eq!(classes.readiness::<ByLabel>(Some(&r("a"))), NodeClassReadiness::Ready);
        assert!(matches!(classes.readiness::<ByLabel>(Some(&r("b"))), NodeClassReadiness::NotReady { reason, message } if reason == "NotResolved" && message == "TestClass b is not ready: no team"));
        let (name, a) = classes.for_claim::<ByLabel>(&claim_for(Some("a"))).expect("a is ready");
        assert_eq!((name.as_str(), a.resolved.as_deref()), ("a", Some("red")));
        let err = |c: Option<&str>| classes.for_claim::<ByLabel>(&claim_for(c)).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(err(Some("b")), "test: TestClass b is not ready: no team");
        assert_eq!(err(Some("c")), "test: TestClass c does not exist (or is not resolved yet)");
        assert_eq!(err(None), "test: NodePool p names no TestClass (spec.template.spec.nodeClassRef)");
        // A class resolved again replaces what it resolved to; one removed is gone.
        classes.resolve(&ByLabel, &class("b", Some("blue"))).await;
        assert_eq!(classes.readiness::<ByLabel>(Some(&r("b"))), NodeClassReadiness::Ready);
        classes.remove("b");
        assert!(classes.get("b").is_none() && classes.get("a").is_some());
    }

    #[tokio::test]
    async fn a_refresh_forgets_classes_gone_from_the_list_but_keeps_those_resolved_since() {
        let classes: NodeClasses<Option<BTreeMap<String, String>>, Option<String>> = NodeClasses::default();
        classes.resolve(&ByLabel, &class("old", Some("x"))).await;
        classes.resolve(&ByLabel, &class("listed", Some("x"))).await;
        let listed_at = Instant::now();
        classes.resolve(&ByLabel, &class("new", Some("x"))).await;
        classes.retain(&["listed".to_string()], listed_at);
        assert!(classes.get("old").is_none(), "gone from the list");
        assert!(classes.get("listed").is_some() && classes.get("new").is_some(), "listed, or resolved after the list");
    }
}
