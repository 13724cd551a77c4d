//! `archer report`: a cluster's arm64 readiness and cost, read-only, from a live cluster or a
//! dump (`kubectl get nodes,pods -A -o yaml`). The report itself is `crate::report`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::Api;
use serde_json::Value;

use super::inspect::Output;
use super::RegistryArgs;
use crate::catalog::Catalog;
use crate::metrics::Metrics;
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
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// Nodes and pods of a dump: a `List`'s items, or the documents themselves.
fn read_dump(text: &str) -> anyhow::Result<(Vec<Node>, Vec<Pod>)> {
    let docs: Vec<Value> = crate::yaml::from_multiple(text).context("the dump is not YAML")?;
    let mut objects = Vec::new();
    for d in docs {
        match d["items"].as_array() {
            Some(items) if d["kind"] == "List" || d["kind"].as_str().is_some_and(|k| k.ends_with("List")) => objects.extend(items.iter().cloned()),
            _ => objects.push(d),
        }
    }
    let (mut nodes, mut pods) = (Vec::new(), Vec::new());
    for o in objects {
        match o["kind"].as_str() {
            Some("Node") => nodes.push(serde_json::from_value(o).context("a Node in the dump")?),
            Some("Pod") => pods.push(serde_json::from_value(o).context("a Pod in the dump")?),
            _ => {}
        }
    }
    Ok((nodes, pods))
}

/// Every page of a list (500 at a time, as kubectl does).
async fn list_all<K>(api: Api<K>) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.context("listing")?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => params = params.continue_token(&c),
            None => return Ok(out),
        }
    }
}

async fn read_cluster(kubeconfig: Option<&PathBuf>) -> anyhow::Result<(Vec<Node>, Vec<Pod>)> {
    let client = super::connect(kubeconfig).await?.context("no cluster to read: pass --kubeconfig, run in a cluster, or report on a dump with --from-file")?;
    let nodes = list_all(Api::<Node>::all(client.clone())).await.context("nodes")?;
    let pods = list_all(Api::<Pod>::all(client)).await.context("pods")?;
    Ok((nodes, pods))
}

pub async fn run(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let ReportArgs { registry, from_file, kubeconfig, catalog, offline, output } = args;
    let (nodes, pods) = match &from_file {
        Some(path) => read_dump(&std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?)?,
        None => read_cluster(kubeconfig.as_ref()).await?,
    };
    let cfg = registry.load()?;
    let catalog = Catalog::with_user_file(catalog.as_deref().or(cfg.catalog.as_deref()))?;
    // The images of pods the webhook has not annotated, inspected as the webhook does.
    let mut images: ImagePlatforms = Default::default();
    let wanted: Vec<String> = pods
        .iter()
        .filter(|p| crate::provisioner::model::annotated_platforms(p).is_none())
        .flat_map(crate::core::placement::pod_images)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if offline {
        images.extend(wanted.into_iter().map(|i| (i, Err("not inspected (--offline)".to_string()))));
    } else if !wanted.is_empty() {
        let inspector = super::inspector(&cfg, Arc::new(Metrics::new()), cfg.memory_budget())?;
        let keyring = super::base_keyring(&cfg)?;
        for (image, r) in wanted.iter().zip(inspector.inspect_each(&wanted, &keyring).await) {
            images.insert(image.clone(), r.map(|i| i.platforms.clone()).map_err(|e| e.to_string()));
        }
    }
    let report = tokio::task::block_in_place(|| report::build(&nodes, &pods, &images, &catalog));
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Text => print!("{}", report::render_text(&report)),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubectl_list_and_plain_documents_both_read() {
        let list = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata: {name: a}\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: p, namespace: d}\n- apiVersion: v1\n  kind: Service\n  metadata: {name: s}\n";
        let (nodes, pods) = read_dump(list).expect("list");
        assert_eq!((nodes.len(), pods.len()), (1, 1));
        let docs = "apiVersion: v1\nkind: Node\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: b}\n";
        assert_eq!(read_dump(docs).expect("docs").0.len(), 2);
        assert!(read_dump("kind: Pod\nspec: 3\n").is_err(), "a malformed pod is an error, not skipped");
    }
}
