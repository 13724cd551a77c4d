//! `archer crds migrate`: move Archer's objects from the CRDs whose plurals Karpenter shares
//! (`nodepools`, `nodeclaims`, `ec2nodeclasses`, `aksnodeclasses` in `archer.dev`) to the ones
//! that are Archer's alone (`archernodepools`, ...). The kinds and `archer.dev/v1alpha1` stay, so
//! every manifest keeps working; only `kubectl get nodepools` stops meaning Archer's pools in a
//! cluster that also runs Karpenter (kubectl resolves a plural two groups serve to the first group
//! alphabetically, and `archer.dev` sorts before `karpenter.sh`).
//!
//! The API server lets one kind live under one plural per group, so the move cannot be a copy:
//! 1. the provisioner's Lease is taken and held (the running provisioner stops at its next renewal;
//!    the command waits the Lease's duration), so no provisioner acts on a half-moved picture;
//! 2. each old CRD's objects (spec, metadata that is not the server's, status) are written to
//!    ConfigMaps in Archer's namespace before anything is deleted;
//! 3. Nodes owned by a NodeClaim lose that owner (the garbage collector would otherwise take them
//!    with the old claims), the old CRD is deleted, the new one created (with the old one's labels
//!    and annotations, so Helm adopts it) and awaited;
//! 4. the objects are created again with their status, Nodes get their claim back as owner, the
//!    backup is deleted, the Lease released.
//!
//! A run that stops half-way resumes from the backup: run it again. The chart runs it as a
//! pre-install and pre-upgrade hook; with kustomize, run it before applying the new manifests.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

#[derive(Args, Debug)]
pub struct CrdsArgs {
    #[command(subcommand)]
    pub command: CrdsCommand,
}

#[derive(Subcommand, Debug)]
pub enum CrdsCommand {
    /// Move Archer's objects from the CRD names Karpenter shares to Archer's own (see the docs,
    /// "Upgrade"); a no-op when there is nothing to move, resumable when interrupted.
    Migrate(MigrateArgs),
}

#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// Archer's namespace: the provisioner's Lease and the backup ConfigMaps live there.
    #[arg(long, env = "POD_NAMESPACE", default_value = "archer-system")]
    pub namespace: String,
    /// The provisioner's Lease, held while objects move.
    #[arg(long, default_value = "archer-provisioner")]
    pub lease: String,
    /// The Helm release (in --namespace) that installs the new CRDs: they are created as its own
    /// (Helm's ownership label and annotations), so the install or upgrade that follows adopts
    /// them. Without it the new CRDs take the old ones' labels and annotations.
    #[arg(long, value_name = "NAME")]
    pub helm_release: Option<String>,
    /// Kubeconfig (default: in-cluster credentials, then the default kubeconfig).
    #[arg(long, env = "ARCHER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// One of Archer's kinds: its old plural and the CRD it moves to (the generated file).
struct Move {
    kind: &'static str,
    old: &'static str,
    crd: &'static str,
}

const MOVES: [Move; 4] = [
    Move { kind: "NodePool", old: "nodepools", crd: include_str!("../../deploy/crds/nodepool.yaml") },
    Move { kind: "NodeClaim", old: "nodeclaims", crd: include_str!("../../deploy/crds/nodeclaim.yaml") },
    Move { kind: "EC2NodeClass", old: "ec2nodeclasses", crd: include_str!("../../deploy/crds/ec2nodeclass.yaml") },
    Move { kind: "AKSNodeClass", old: "aksnodeclasses", crd: include_str!("../../deploy/crds/aksnodeclass.yaml") },
];

const GROUP: &str = "archer.dev";
/// Who holds the provisioner's Lease while objects move.
const HOLDER: &str = "archer-crd-migration";
/// The backup ConfigMaps' label (its value: the old plural).
const BACKUP_LABEL: &str = "archer.dev/crd-migration";
/// The most JSON one backup ConfigMap holds (the API's limit is 1 MiB per object).
const CHUNK_BYTES: usize = 512 * 1024;
/// The most ConfigMaps one kind's backup takes (the chart's hook may touch these names only).
const MAX_CHUNKS: usize = 16;
/// How long a CRD may take to go or to be served.
const CRD_WAIT: Duration = Duration::from_secs(120);

pub async fn run(args: CrdsArgs) -> anyhow::Result<ExitCode> {
    let CrdsCommand::Migrate(args) = args.command;
    let client = super::connect(args.kubeconfig.as_ref()).await?.context("archer crds migrate needs a cluster (no kubeconfig or in-cluster credentials found)")?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let backups: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
    let mut pending = Vec::new();
    for m in &MOVES {
        let old = crds.get_opt(&format!("{}.{GROUP}", m.old)).await.with_context(|| format!("reading CRD {}.{GROUP}", m.old))?;
        let backed_up = backups.get_opt(&chunk_name(m.old, 0)).await.context("reading the migration's backup")?.is_some();
        if old.is_some() || backed_up {
            pending.push((m, old));
        }
    }
    if pending.is_empty() {
        println!("nothing to migrate: Archer's CRDs already have their own names");
        return Ok(ExitCode::SUCCESS);
    }
    let fence = Fence::take(&client, &args.namespace, &args.lease).await?;
    let mut result = Ok(());
    let helm = args.helm_release.as_deref().map(|release| (release, args.namespace.as_str()));
    for (m, old) in pending {
        match migrate(&client, &backups, m, old, helm, &fence).await {
            Ok(n) => println!("{}: {} moved from {}.{GROUP} to {}", m.kind, archer_core::words::count(n, "object"), m.old, new_name(m)?),
            Err(e) => {
                result = Err(e.context(format!("migrating {}; run `archer crds migrate` again to resume from the backup", m.kind)));
                break;
            }
        }
    }
    fence.release().await;
    result.map(|()| ExitCode::SUCCESS)
}

fn new_crd(m: &Move) -> anyhow::Result<CustomResourceDefinition> {
    archer_core::yaml::from_str(m.crd).with_context(|| format!("the shipped {} CRD", m.kind))
}

fn new_name(m: &Move) -> anyhow::Result<String> {
    new_crd(m)?.metadata.name.context("the shipped CRD has a name")
}

fn resource(plural: &str, kind: &str, version: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, version, kind), plural)
}

/// Move one kind; how many objects moved.
async fn migrate(client: &Client, backups: &Api<ConfigMap>, m: &Move, old: Option<CustomResourceDefinition>, helm: Option<(&str, &str)>, fence: &Fence) -> anyhow::Result<usize> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let new = new_crd(m)?;
    let version = new.spec.versions.iter().find(|v| v.storage).map(|v| v.name.clone()).context("the shipped CRD has a storage version")?;
    let earlier = read_backup(backups, m.old).await?;
    // While the old CRD is served, its objects now are the truth (an earlier run's backup may
    // miss claims made since): back up again. Once it is being deleted, or gone, the backup is.
    let backup = match old.as_ref().filter(|c| c.metadata.deletion_timestamp.is_none()) {
        Some(old) => {
            fence.check()?;
            let objects = Api::<DynamicObject>::all_with(client.clone(), &resource(m.old, m.kind, &version)).list(&ListParams::default()).await.with_context(|| format!("listing {}.{GROUP}", m.old))?;
            let objects: Vec<Value> = objects.items.into_iter().map(|o| serde_json::to_value(o).unwrap_or(Value::Null)).filter(|v| !v.is_null()).collect();
            let mut owners = if m.kind == "NodeClaim" { node_owners(client).await? } else { Vec::new() };
            // Nodes an interrupted run took off their claim already: still theirs.
            let names: std::collections::BTreeSet<&str> = objects.iter().filter_map(|o| o.pointer("/metadata/name").and_then(Value::as_str)).collect();
            for pair in earlier.iter().flat_map(|b| b.owners.iter()) {
                if names.contains(pair.1.as_str()) && !owners.contains(pair) {
                    owners.push(pair.clone());
                }
            }
            let b = Backup { objects, owners, labels: old.metadata.labels.clone().unwrap_or_default(), annotations: old.metadata.annotations.clone().unwrap_or_default() };
            write_backup(backups, m.old, &b).await?;
            b
        }
        None => earlier.context("the old CRD is going and no backup of it is here: nothing to restore")?,
    };
    if old.is_some() {
        fence.check()?;
        if m.kind == "NodeClaim" {
            detach_nodes(client, &backup.owners).await?;
        }
        let name = format!("{}.{GROUP}", m.old);
        match crds.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("deleting CRD {name}")),
        }
        wait_for(&format!("CRD {name} to go"), || async { crds.get_opt(&name).await.ok().flatten().is_none() }).await?;
    }
    // The new CRD, with the old one's labels and annotations (Helm's ownership among them).
    let name = new.metadata.name.clone().context("the shipped CRD has a name")?;
    if crds.get_opt(&name).await?.is_none() {
        let mut crd = new.clone();
        let (mut labels, mut annotations) = (backup.labels.clone(), backup.annotations.clone());
        if let Some((release, namespace)) = helm {
            labels.insert("app.kubernetes.io/managed-by".into(), "Helm".into());
            annotations.insert("meta.helm.sh/release-name".into(), release.into());
            annotations.insert("meta.helm.sh/release-namespace".into(), namespace.into());
        }
        crd.metadata.labels = Some(labels).filter(|l| !l.is_empty());
        crd.metadata.annotations = Some(annotations).filter(|a| !a.is_empty());
        crds.create(&PostParams::default(), &crd).await.with_context(|| format!("creating CRD {name}"))?;
    }
    wait_for(&format!("CRD {name} to be served"), || async { crds.get_opt(&name).await.ok().flatten().is_some_and(|c| established(&c)) }).await?;
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource(&new.spec.names.plural, m.kind, &version));
    let mut uids = BTreeMap::new();
    for object in &backup.objects {
        let (body, status) = restorable(object);
        let name = body.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        let obj: DynamicObject = serde_json::from_value(body).with_context(|| format!("{} {name} in the backup", m.kind))?;
        let made = match api.create(&PostParams::default(), &obj).await {
            Ok(o) => o,
            // Restored by an earlier run.
            Err(kube::Error::Api(e)) if e.code == 409 => api.get(&name).await?,
            Err(e) => return Err(e).with_context(|| format!("creating {} {name}", m.kind)),
        };
        if let Some(status) = status {
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({"status": status}))).await.with_context(|| format!("restoring the status of {} {name}", m.kind))?;
        }
        uids.insert(name, made.metadata.uid.unwrap_or_default());
    }
    if m.kind == "NodeClaim" {
        reattach_nodes(client, &backup.owners, &uids, &version).await?;
    }
    delete_backup(backups, m.old).await?;
    Ok(backup.objects.len())
}

fn established(crd: &CustomResourceDefinition) -> bool {
    let conditions = crd.status.as_ref().and_then(|s| s.conditions.as_ref());
    let ok = |t: &str| conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == t && c.status == "True"));
    ok("Established") && ok("NamesAccepted")
}

async fn wait_for<F, Fut>(what: &str, mut done: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    while !done().await {
        if start.elapsed() > CRD_WAIT {
            anyhow::bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// What is restored of an object: everything but what the server sets (uid, resourceVersion,
/// creation time, generation, managed fields), and its status apart (a create drops it).
fn restorable(object: &Value) -> (Value, Option<Value>) {
    let mut body = object.clone();
    let status = body.as_object_mut().and_then(|o| o.remove("status")).filter(|s| !s.is_null());
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in ["uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds"] {
            meta.remove(k);
        }
    }
    (body, status)
}

/// A kind's backup: its objects, the Nodes its NodeClaims owned (node, claim), and the old
/// CRD's labels and annotations.
#[derive(serde::Serialize, serde::Deserialize, Default, Debug, PartialEq)]
struct Backup {
    objects: Vec<Value>,
    owners: Vec<(String, String)>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

/// The backup as ConfigMaps' texts: chunks of at most [`CHUNK_BYTES`] each.
fn chunks(b: &Backup) -> Result<Vec<String>, serde_json::Error> {
    let head = serde_json::to_string(&Backup { objects: Vec::new(), owners: b.owners.clone(), labels: b.labels.clone(), annotations: b.annotations.clone() })?;
    let mut out = vec![head];
    let mut current: Vec<&Value> = Vec::new();
    let mut size = 0;
    for o in &b.objects {
        let n = serde_json::to_string(o)?.len();
        if !current.is_empty() && size + n > CHUNK_BYTES {
            out.push(serde_json::to_string(&current)?);
            (current, size) = (Vec::new(), 0);
        }
        current.push(o);
        size += n;
    }
    if !current.is_empty() {
        out.push(serde_json::to_string(&current)?);
    }
    Ok(out)
}

fn from_chunks(texts: &[String]) -> Result<Backup, serde_json::Error> {
    let Some((head, rest)) = texts.split_first() else { return Ok(Backup::default()) };
    let mut b: Backup = serde_json::from_str(head)?;
    for t in rest {
        b.objects.extend(serde_json::from_str::<Vec<Value>>(t)?);
    }
    Ok(b)
}

fn chunk_name(old: &str, i: usize) -> String {
    format!("archer-crd-migration-{old}-{i}")
}

async fn write_backup(api: &Api<ConfigMap>, old: &str, b: &Backup) -> anyhow::Result<()> {
    let texts = chunks(b)?;
    if texts.len() > MAX_CHUNKS {
        anyhow::bail!("{} objects take {} ConfigMaps to back up, more than the {MAX_CHUNKS} this command may write", b.objects.len(), texts.len());
    }
    // The head last: a backup without its head is incomplete and written again.
    for (i, text) in texts.iter().enumerate().rev() {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": chunk_name(old, i), "labels": {BACKUP_LABEL: old}, "annotations": {"archer.dev/chunks": texts.len().to_string()}},
            "data": {"backup.json": text}
        }))?;
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let mut cm = cm;
                cm.metadata.resource_version = api.get(&chunk_name(old, i)).await.context("writing the backup")?.metadata.resource_version;
                api.replace(&chunk_name(old, i), &PostParams::default(), &cm).await.context("writing the backup")?;
            }
            Err(e) => return Err(e).context("writing the backup"),
        }
    }
    // Chunks an earlier, larger backup left.
    for i in texts.len()..MAX_CHUNKS {
        match api.delete(&chunk_name(old, i), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).context("deleting an old backup chunk"),
        }
    }
    Ok(())
}

/// The backup of `old`, when a complete one is there.
async fn read_backup(api: &Api<ConfigMap>, old: &str) -> anyhow::Result<Option<Backup>> {
    let text = |c: &ConfigMap| c.data.as_ref().and_then(|d| d.get("backup.json").cloned());
    let Some(head) = api.get_opt(&chunk_name(old, 0)).await.context("reading the backup")? else { return Ok(None) };
    let count: usize = head.metadata.annotations.as_ref().and_then(|a| a.get("archer.dev/chunks")).and_then(|n| n.parse().ok()).unwrap_or(1).min(MAX_CHUNKS);
    let mut texts = vec![text(&head).with_context(|| format!("the backup of {old} has no data"))?];
    for i in 1..count {
        let chunk = api.get_opt(&chunk_name(old, i)).await.context("reading the backup")?;
        texts.push(chunk.as_ref().and_then(text).with_context(|| format!("backup chunk {i} of {old} is missing"))?);
    }
    Ok(Some(from_chunks(&texts)?))
}

/// Delete the backup, head first: a backup without its head is never read, so stopping half-way
/// leaves chunks the next backup overwrites, never a head that names a missing chunk.
async fn delete_backup(api: &Api<ConfigMap>, old: &str) -> anyhow::Result<()> {
    for i in 0..MAX_CHUNKS {
        match api.delete(&chunk_name(old, i), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).context("deleting the backup"),
        }
    }
    Ok(())
}

fn owned_by_claim(node: &Node) -> Option<String> {
    node.metadata.owner_references.iter().flatten().find(|o| o.kind == "NodeClaim" && o.api_version.starts_with(&format!("{GROUP}/"))).map(|o| o.name.clone())
}

/// Nodes a NodeClaim of Archer's owns (kwok's Node objects), as (node, claim).
async fn node_owners(client: &Client) -> anyhow::Result<Vec<(String, String)>> {
    let nodes = Api::<Node>::all(client.clone()).list(&ListParams::default()).await.context("listing nodes")?;
    Ok(nodes.items.iter().filter_map(|n| Some((n.metadata.name.clone()?, owned_by_claim(n)?))).collect())
}

/// Take each claim off its Nodes' owners, so deleting the old claims deletes no Node.
async fn detach_nodes(client: &Client, owners: &[(String, String)]) -> anyhow::Result<()> {
    let api = Api::<Node>::all(client.clone());
    for (node, _) in owners {
        let Some(n) = api.get_opt(node).await? else { continue };
        let kept: Vec<_> = n.metadata.owner_references.clone().unwrap_or_default().into_iter().filter(|o| !(o.kind == "NodeClaim" && o.api_version.starts_with(&format!("{GROUP}/")))).collect();
        api.patch(node, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"ownerReferences": kept}}))).await.with_context(|| format!("taking node {node} off its NodeClaim"))?;
    }
    Ok(())
}

/// Give each Node its restored claim back as owner.
async fn reattach_nodes(client: &Client, owners: &[(String, String)], uids: &BTreeMap<String, String>, version: &str) -> anyhow::Result<()> {
    let api = Api::<Node>::all(client.clone());
    for (node, claim) in owners {
        let (Some(n), Some(uid)) = (api.get_opt(node).await?, uids.get(claim)) else { continue };
        if owned_by_claim(&n).is_some() {
            continue;
        }
        let mut refs = n.metadata.owner_references.clone().unwrap_or_default();
        refs.push(k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference { api_version: format!("{GROUP}/{version}"), kind: "NodeClaim".into(), name: claim.clone(), uid: uid.clone(), ..Default::default() });
        api.patch(node, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"ownerReferences": refs}}))).await.with_context(|| format!("giving node {node} its NodeClaim back"))?;
    }
    Ok(())
}

/// The provisioner's Lease, held by this command: the provisioner holding it now stops at its
/// next renewal, and no replica takes it until it is released. It is renewed (at the version
/// read, so a write by anyone else in between is a conflict, not lost) well within the shortest
/// lease a replica may hold; once a renewal finds another holder or fails, the hold is lost and
/// [`Fence::check`] stops the migration before its next destructive step.
struct Fence {
    api: Api<Lease>,
    name: String,
    lost: std::sync::Arc<std::sync::atomic::AtomicBool>,
    renew: tokio::task::JoinHandle<()>,
}

/// How long this command's hold lasts without a renewal.
const HOLD_SECONDS: i32 = 60;
/// How often it is renewed: a replica's renewal may set a shorter duration (its own) once
/// before it finds the Lease taken, and the shortest a replica may hold is 2 s.
const RENEW_EVERY: Duration = Duration::from_secs(1);

fn micro_now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl Fence {
    async fn take(client: &Client, namespace: &str, name: &str) -> anyhow::Result<Fence> {
        let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let their = match api.get_opt(name).await.context("reading the provisioner's Lease")? {
            Some(mut lease) => {
                let spec = lease.spec.get_or_insert_with(Default::default);
                let their = spec.lease_duration_seconds.unwrap_or(15);
                spec.holder_identity = Some(HOLDER.into());
                spec.lease_duration_seconds = Some(HOLD_SECONDS);
                (spec.acquire_time, spec.renew_time) = (Some(micro_now()), Some(micro_now()));
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                api.replace(name, &PostParams::default(), &lease).await.context("taking the provisioner's Lease")?;
                their
            }
            // No Lease yet: made held, so a replica that starts meanwhile waits.
            None => {
                let lease: Lease = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"holderIdentity": HOLDER, "leaseDurationSeconds": HOLD_SECONDS, "acquireTime": micro_now(), "renewTime": micro_now(), "leaseTransitions": 0}}))?;
                api.create(&PostParams::default(), &lease).await.context("creating the provisioner's Lease, held")?;
                0
            }
        };
        let lost = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let renew = tokio::spawn(Self::keep(api.clone(), name.to_string(), lost.clone()));
        // The holder renews within its lease duration and stops when it finds the Lease taken.
        println!("holding the provisioner's Lease {namespace}/{name}; waiting {their} s for its holder to stop");
        tokio::time::sleep(Duration::from_secs(u64::try_from(their.max(0)).unwrap_or(15) + 2)).await;
        let fence = Fence { api, name: name.to_string(), lost, renew };
        fence.check()?;
        Ok(fence)
    }

    /// Renew until aborted; mark the hold lost when the Lease is someone else's or cannot be
    /// renewed.
    async fn keep(api: Api<Lease>, name: String, lost: std::sync::Arc<std::sync::atomic::AtomicBool>) {
        loop {
            tokio::time::sleep(RENEW_EVERY).await;
            let renewed = async {
                let mut lease = api.get(&name).await?;
                let spec = lease.spec.get_or_insert_with(Default::default);
                if spec.holder_identity.as_deref() != Some(HOLDER) {
                    return Ok::<bool, kube::Error>(false);
                }
                spec.renew_time = Some(micro_now());
                spec.lease_duration_seconds = Some(HOLD_SECONDS);
                api.replace(&name, &PostParams::default(), &lease).await?;
                Ok(true)
            };
            match renewed.await {
                Ok(true) => {}
                // A replica's renewal in between (it has not seen the Lease taken yet): again.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Ok(false) => {
                    eprintln!("error: the provisioner's Lease {name} was taken from this migration");
                    lost.store(true, std::sync::atomic::Ordering::SeqCst);
                    return;
                }
                Err(e) => {
                    eprintln!("error: renewing the provisioner's Lease {name}: {e}");
                    lost.store(true, std::sync::atomic::Ordering::SeqCst);
                    return;
                }
            }
        }
    }

    /// Fails once the hold was lost: nothing destructive is done without it.
    fn check(&self) -> anyhow::Result<()> {
        if self.lost.load(std::sync::atomic::Ordering::SeqCst) {
            anyhow::bail!("the provisioner's Lease {} is no longer held by this migration", self.name);
        }
        Ok(())
    }

    /// Give the Lease up as the replicas' own library does (holder and times emptied): they take
    /// it at once.
    async fn release(self) {
        self.renew.abort();
        let patch = json!({"spec": {"holderIdentity": null, "acquireTime": null, "renewTime": null, "leaseDurationSeconds": null}});
        if let Err(e) = self.api.patch(&self.name, &PatchParams::default(), &Patch::Strategic(patch)).await {
            eprintln!("warning: releasing the provisioner's Lease {}: {e}; it expires in {HOLD_SECONDS} s", self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_new_crds_keep_the_kinds_and_group_under_names_karpenter_does_not_use() {
        let karpenter = ["nodepools", "nodeclaims", "ec2nodeclasses", "aksnodeclasses", "nodeoverlays"];
        for m in &MOVES {
            let crd = new_crd(m).expect("crd");
            assert_eq!((crd.spec.group.as_str(), crd.spec.names.kind.as_str()), (GROUP, m.kind), "the kind and group stay: every manifest keeps working");
            let names = &crd.spec.names;
            let all: Vec<&str> = std::iter::once(names.plural.as_str()).chain(names.singular.as_deref()).chain(names.short_names.iter().flatten().map(String::as_str)).collect();
            for n in &all {
                assert!(!karpenter.contains(n) && !karpenter.iter().any(|k| k.trim_end_matches('s') == *n), "{n} is Karpenter's too");
            }
            assert_eq!(names.plural, format!("archer{}", m.old));
            assert_eq!(names.categories.as_deref(), Some(&["archer".to_string()][..]), "`kubectl get archer` lists them all");
        }
    }

    #[test]
    fn a_restored_object_drops_what_the_server_sets_and_keeps_the_rest() {
        let o = json!({
            "apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim",
            "metadata": {"name": "c", "uid": "1", "resourceVersion": "9", "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 3, "managedFields": [{}],
                         "labels": {"a": "b"}, "annotations": {"x": "y"}, "finalizers": ["f"]},
            "spec": {"nodePool": "default"}, "status": {"nodeName": "n", "providerID": "kwok://n"}
        });
        let (body, status) = restorable(&o);
        assert_eq!(body, json!({"apiVersion": "archer.dev/v1alpha1", "kind": "NodeClaim", "metadata": {"name": "c", "labels": {"a": "b"}, "annotations": {"x": "y"}, "finalizers": ["f"]}, "spec": {"nodePool": "default"}}));
        assert_eq!(status, Some(json!({"nodeName": "n", "providerID": "kwok://n"})));
        assert_eq!(restorable(&json!({"metadata": {"name": "p"}, "spec": {}})).1, None);
    }

    #[test]
    fn a_backup_splits_into_chunks_and_reads_back_whole() {
        let big = "x".repeat(200 * 1024);
        let b = Backup {
            objects: (0..7).map(|i| json!({"metadata": {"name": format!("o{i}")}, "spec": {"pad": big}})).collect(),
            owners: vec![("node-a".into(), "claim-a".into())],
            labels: BTreeMap::from([("app.kubernetes.io/managed-by".into(), "Helm".into())]),
            annotations: BTreeMap::from([("meta.helm.sh/release-name".into(), "archer".into())]),
        };
        let texts = chunks(&b).expect("chunks");
        assert!(texts.len() >= 4, "7 objects of 200 KiB in chunks of 512 KiB, and the head: {}", texts.len());
        assert!(texts.iter().all(|t| t.len() <= CHUNK_BYTES + 210 * 1024), "each under the API's object limit");
        assert_eq!(from_chunks(&texts).expect("read"), b);
        assert_eq!(from_chunks(&chunks(&Backup::default()).expect("chunks")).expect("read"), Backup::default());
    }
}
