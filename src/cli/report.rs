//! `archer report`: a cluster's arm64 readiness and cost, read-only, from a live cluster or a
//! dump (`kubectl get nodes,pods -A -o yaml`). The report itself is `crate::report`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;

use super::output::Output;
use super::RegistryArgs;
use archer_core::catalog::Catalog;
use crate::cluster::ClusterView;
use archer_model::ClusterState;
use archer_core::platform::PlatformSet;
use archer_registry::{Inspector, Keyring};
use crate::report::{self, ImagePlatforms};

#[derive(Args, Debug)]
pub struct ReportArgs {
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Read a dump instead of a live cluster: `kubectl get nodes,pods -A -o yaml` (a List, or
    /// YAML documents of Nodes and Pods).
    #[arg(long, value_name = "FILE")]
    pub from_file: Option<PathBuf>,
    /// Kubeconfig of the live cluster (default: in-cluster credentials, then the default kubeconfig).
    #[arg(long, env = "ARCHER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// A user price catalog (YAML or CSV) on top of the embedded one.
    #[arg(long, env = "ARCHER_CATALOG")]
    pub catalog: Option<PathBuf>,
    /// Do not contact registries: only pods' archer.dev/platforms annotations say what images run on.
    #[arg(long)]
    pub offline: bool,
    /// A field of the dump's objects that their type does not have is an error (else a warning).
    #[arg(long)]
    pub strict: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// The cluster of a dump: a `List`'s items, or the documents themselves.
fn read_dump(text: &str, strict: bool) -> anyhow::Result<ClusterState> {
    let objects = archer_core::yaml::objects(text).context("the dump is not YAML")?;
    let (state, _ignored, unknown) = ClusterState::from_objects(objects).context("an object of the dump")?;
    super::unknown_fields(strict, &unknown)?;
    Ok(state)
}

/// Every object of a list, read page by page.
async fn list_all<K>(api: Api<K>) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    use futures::TryStreamExt;
    let pages: Vec<Vec<K>> = crate::cluster::pages(api).try_collect().await.context("listing")?;
    Ok(pages.into_iter().flatten().collect())
}

/// The live cluster's nodes and pods, and a view of it that reads pods' pull secrets.
async fn read_cluster(kubeconfig: Option<&PathBuf>) -> anyhow::Result<(ClusterState, ClusterView)> {
    let client = super::connect(kubeconfig).await?.context("no cluster to read: pass --kubeconfig, run in a cluster, or report on a dump with --from-file")?;
    let nodes = list_all(Api::<Node>::all(client.clone())).await.context("nodes")?;
    let pods = list_all(Api::<Pod>::all(client.clone())).await.context("pods")?;
    // Its watches are never driven: the report reads secrets and service accounts by GET only.
    let (view, _watches) = ClusterView::start(client, None);
    let state = ClusterState { nodes: nodes.into_iter().map(Arc::new).collect(), pods: pods.into_iter().map(Arc::new).collect(), ..Default::default() };
    Ok((state, view))
}

/// Pods that read their images with the same credentials: namespace, service account and
/// `imagePullSecrets`. Without a cluster every pod is read with the configured credentials alone.
type CredentialKey = (String, String, Vec<String>);

fn credential_key(pod: &Pod, live: bool) -> CredentialKey {
    if !live {
        return Default::default();
    }
    let (account, mut secrets) = crate::cluster::pull_secret_refs(pod);
    secrets.sort();
    (pod.metadata.namespace.clone().unwrap_or_else(|| "default".into()), account, secrets)
}

/// The images of bound pods the webhook has not annotated, inspected as the webhook does: with
/// the pod's own namespace's pull secrets (a live cluster), then the configured credentials. An
/// image one set of credentials reads is known, whichever pod it was read for.
async fn inspect_unannotated(pods: &[&Pod], inspector: &Inspector, base: &Keyring, cluster: Option<&ClusterView>) -> ImagePlatforms {
    let mut groups: BTreeMap<CredentialKey, (&Pod, BTreeSet<String>)> = BTreeMap::new();
    for pod in unannotated(pods) {
        groups.entry(credential_key(pod, cluster.is_some())).or_insert_with(|| (pod, BTreeSet::new())).1.extend(archer_core::placement::pod_images(pod));
    }
    let total: usize = groups.values().map(|(_, images)| images.len()).sum();
    let progress = super::progress::Progress::bar(total, "inspecting images");
    let found: Vec<Vec<(String, Result<PlatformSet, String>)>> = futures::stream::iter(groups.into_values())
        .map(|(pod, images)| async move {
            let images: Vec<String> = images.into_iter().collect();
            let keyring = crate::cluster::pod_keyring(cluster, base, pod.metadata.namespace.as_deref().unwrap_or("default"), pod).await;
            let results = inspector.inspect_each(&images, &keyring).await;
            images.into_iter().zip(results).map(|(i, r)| (i, r.map(|x| x.platforms.clone()).map_err(|e| e.with_reason()))).collect::<Vec<_>>()
        })
        .buffer_unordered(CREDENTIAL_GROUPS_AT_ONCE)
        .inspect(|group| progress.advance(group.len()))
        .collect()
        .await;
    progress.finish();
    let mut images = ImagePlatforms::default();
    for (image, r) in found.into_iter().flatten() {
        if !matches!(images.get(&image), Some(Ok(_))) {
            images.insert(image, r);
        }
    }
    images
}

/// The pods whose images the report reads: bound and running or pending (the only pods it
/// counts), without the webhook's `archer.dev/platforms` annotation.
fn unannotated<'a, 'b>(pods: &'b [&'a Pod]) -> impl Iterator<Item = &'a Pod> + 'b {
    pods.iter()
        .copied()
        .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()) && !archer_core::is_terminal(p))
        .filter(|p| archer_core::placement::recorded_platforms(p).is_none())
}

/// Credential groups inspected at once (each inspects its images `perPodConcurrency` at a time).
const CREDENTIAL_GROUPS_AT_ONCE: usize = 4;

pub async fn run(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let ReportArgs { registry, from_file, kubeconfig, catalog, offline, strict, output } = args;
    let (state, cluster) = match &from_file {
        Some(path) => (read_dump(&std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?, strict)?, None),
        None => {
            let (state, view) = read_cluster(kubeconfig.as_ref()).await?;
            (state, Some(view))
        }
    };
    let pods = archer_model::cluster::refs(&state.pods);
    let cfg = registry.load()?;
    let catalog = Catalog::with_user_file(catalog.as_deref().or(cfg.catalog.as_deref()))?;
    let images = if offline {
        let wanted: BTreeSet<String> = unannotated(&pods).flat_map(archer_core::placement::pod_images).collect();
        wanted.into_iter().map(|i| (i, Err("not inspected (--offline)".to_string()))).collect()
    } else {
        let inspector = super::inspector(&cfg, crate::metrics::Metrics::new().registry.clone(), cfg.memory_budget())?;
        inspect_unannotated(&pods, &inspector, &super::base_keyring(&cfg)?, cluster.as_ref()).await
    };
    let report = tokio::task::block_in_place(|| report::build(&state, &images, &catalog));
    match output {
        Output::Json | Output::Yaml => output.print(&report)?,
        Output::Text => print!("{}", report::render_text(&report)),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_share_a_credential_group_only_with_the_same_namespace_account_and_secrets() {
        let pod = |ns: &str, sa: Option<&str>, secrets: &[&str]| -> Pod {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p", "namespace": ns}, "spec": {"serviceAccountName": sa, "imagePullSecrets": secrets.iter().map(|s| serde_json::json!({"name": s})).collect::<Vec<_>>(), "containers": []}})).expect("pod")
        };
        let key = |p: &Pod| credential_key(p, true);
        assert_eq!(key(&pod("a", None, &["x", "y"])), key(&pod("a", Some("default"), &["y", "x"])), "order of secrets, the default account");
        assert_ne!(key(&pod("a", None, &["x"])), key(&pod("b", None, &["x"])), "another namespace's secret of the same name");
        assert_ne!(key(&pod("a", None, &["x"])), key(&pod("a", Some("builder"), &["x"])));
        assert_ne!(key(&pod("a", None, &["x"])), key(&pod("a", None, &[])));
        assert_eq!(credential_key(&pod("a", None, &["x"]), false), credential_key(&pod("b", Some("s"), &[]), false), "a dump: the docker config alone");
    }

    #[test]
    fn a_kubectl_list_and_plain_documents_both_read() {
        let list = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata: {name: a}\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: p, namespace: d}\n- apiVersion: v1\n  kind: Service\n  metadata: {name: s}\n";
        let state = read_dump(list, true).expect("list");
        assert_eq!((state.nodes.len(), state.pods.len()), (1, 1));
        let docs = "apiVersion: v1\nkind: Node\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: b}\n";
        assert_eq!(read_dump(docs, true).expect("docs").nodes.len(), 2);
        assert!(read_dump("kind: Pod\nspec: 3\n", false).is_err(), "a malformed pod is an error, not skipped");
    }
}
