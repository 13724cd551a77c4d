//! `archer catalog fetch`: a region's prices from a cloud's own price API, written as a catalog
//! file for `--catalog`, so offline commands price any region from the cloud's list rather than
//! from us-east-1's.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

use archer_core::catalog::Catalog;

#[derive(Args, Debug)]
pub struct CatalogArgs {
    #[command(subcommand)]
    pub command: CatalogCommand,
}

#[derive(Subcommand, Debug)]
pub enum CatalogCommand {
    /// Write a catalog file with a region's prices from the cloud's price API.
    Fetch(FetchArgs),
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cloud {
    /// The AWS Price List Query API (GetProducts): on-demand Linux prices; credentials from the
    /// standard chain (spot prices stay EC2's, read live by the provider).
    Aws,
    /// The Azure Retail Prices API (public; no credentials): pay-as-you-go and Spot.
    Azure,
}

#[derive(Args, Debug)]
pub struct FetchArgs {
    #[arg(long, value_enum)]
    pub cloud: Cloud,
    /// The region (AWS: like eu-west-1; Azure: an ARM region name, like westus3).
    #[arg(long)]
    pub region: String,
    /// Where to write the catalog file (default: standard output).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The price API's address (a stand-in's, for tests or a proxy).
    #[arg(long, env = "ARCHER_PRICES_ENDPOINT")]
    pub endpoint: Option<String>,
    /// A user catalog file (YAML or CSV) on top of the embedded one: the facts of the types.
    #[arg(long, env = "ARCHER_CATALOG")]
    pub catalog: Option<PathBuf>,
}

/// A region's EC2 on-demand prices from the Price List Query API.
#[cfg(feature = "aws")]
async fn aws(args: &FetchArgs) -> anyhow::Result<(crate::prices::Fetched, String)> {
    let settings = crate::config::AwsConfig { endpoint: args.endpoint.clone(), ..Default::default() };
    let sdk = archer_cloud_aws::sdk_config(&settings).await;
    let fetched = archer_cloud_aws::prices::on_demand(&archer_cloud_aws::prices::client(&sdk, None), &args.region).await?;
    Ok((fetched, "the AWS Price List Query API (GetProducts, AmazonEC2)".into()))
}

#[cfg(not(feature = "aws"))]
async fn aws(_: &FetchArgs) -> anyhow::Result<(crate::prices::Fetched, String)> {
    anyhow::bail!("--cloud aws: this archer was built without the aws feature (cargo build --features aws)")
}

/// A region's Azure VM prices from the Retail Prices API.
#[cfg(feature = "azure")]
async fn azure(http: &reqwest::Client, args: &FetchArgs) -> anyhow::Result<(crate::prices::Fetched, String)> {
    use archer_cloud_azure::prices;
    let endpoint = args.endpoint.clone().unwrap_or_else(|| prices::ENDPOINT.to_string());
    Ok((prices::fetch(http, &endpoint, &args.region).await?, format!("the Azure Retail Prices API ({endpoint})")))
}

#[cfg(not(feature = "azure"))]
async fn azure(_: &reqwest::Client, _: &FetchArgs) -> anyhow::Result<(crate::prices::Fetched, String)> {
    anyhow::bail!("--cloud azure: this archer was built without the azure feature (cargo build --features azure)")
}

pub async fn run(args: CatalogArgs) -> anyhow::Result<ExitCode> {
    let CatalogCommand::Fetch(args) = args.command;
    let catalog = Catalog::with_user_file(args.catalog.as_deref())?;
    let http = reqwest::Client::builder().timeout(std::time::Duration::from_secs(60)).build().context("building the HTTP client")?;
    let (fetched, source) = match args.cloud {
        Cloud::Aws => aws(&args).await?,
        Cloud::Azure => azure(&http, &args).await?,
    };
    let (file, unknown) = crate::prices::catalog_file(&catalog, &fetched);
    let at = k8s_openapi::jiff::Timestamp::now();
    let yaml = archer_core::yaml::to_string(&file).context("writing the catalog file")?;
    let text = format!("# Prices in {} from {source}, fetched {at}: archer catalog fetch\n{yaml}", fetched.region);
    match &args.out {
        Some(path) => std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?,
        None => print!("{text}"),
    }
    let spot = file.instance_types.iter().filter(|t| t.spot_discount.is_some()).count();
    eprintln!("{} instance types priced in {} ({spot} with spot prices), {} pages", file.instance_types.len(), fetched.region, fetched.pages);
    if !unknown.is_empty() {
        eprintln!("{} priced sizes the catalog has no facts for, left out: {}", unknown.len(), unknown.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}
