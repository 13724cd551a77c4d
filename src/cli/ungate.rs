//! `archer ungate --all`: remove the scheduling gate `archer.dev/inspecting` from every pod that
//! carries it. Helm's pre-delete hook runs it, after removing the webhook's configuration so no
//! pod is gated after it, so an uninstalled Archer leaves no pod held; by hand it releases pods
//! a stopped Archer left gated.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

#[derive(Args, Debug)]
pub struct UngateArgs {
    /// Every pod in every namespace (the only scope there is; required so it is never run by accident).
    #[arg(long)]
    pub all: bool,
    /// Delete this MutatingWebhookConfiguration first, so no pod is gated after the sweep.
    #[arg(long, value_name = "NAME")]
    pub delete_webhook_configuration: Option<String>,
    /// Kubeconfig (default: in-cluster credentials, then the default kubeconfig: `KUBECONFIG`, else
    /// `~/.kube/config`).
    #[arg(long, env = "ARCHER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

pub async fn run(args: UngateArgs) -> anyhow::Result<ExitCode> {
    if !args.all {
        anyhow::bail!("say --all: archer ungate removes Archer's gate from every pod that carries it");
    }
    let client = super::connect(args.kubeconfig.as_ref()).await?.context("archer ungate needs a cluster (no kubeconfig or in-cluster credentials found)")?;
    if let Some(name) = &args.delete_webhook_configuration {
        use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
        match kube::Api::<MutatingWebhookConfiguration>::all(client.clone()).delete(name, &Default::default()).await {
            Ok(_) => eprintln!("deleted MutatingWebhookConfiguration {name}"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("deleting MutatingWebhookConfiguration {name}")),
        }
    }
    let released = crate::safety::ungate_all(client).await.context("listing pods")?;
    println!("released {} from the gate {}", archer_core::words::count(released, "pod"), archer_core::safety_net::GATE);
    Ok(ExitCode::SUCCESS)
}
