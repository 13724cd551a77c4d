use std::process::ExitCode;

use clap::Args;

use super::output::Output;
use serde_json::json;

use super::RegistryArgs;

#[derive(Args, Debug)]
pub struct InspectArgs {
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Image references, as written in a pod spec.
    #[arg(required = true, value_name = "IMAGE")]
    pub images: Vec<String>,
}

pub async fn run(args: InspectArgs) -> anyhow::Result<ExitCode> {
    let InspectArgs { registry, output, images } = args;
    let cfg = registry.load()?;
    let inspector = super::inspector(&cfg, crate::metrics::Metrics::new().registry.clone(), cfg.memory_budget())?;
    let keyring = super::base_keyring(&cfg)?;
    let results = inspector.inspect_each(&images, &keyring).await;
    let mut failed = false;
    let mut docs = Vec::new();
    for (image, result) in images.iter().zip(results) {
        match result {
            Ok(found) => {
                let platforms: Vec<String> = found.platforms.0.iter().map(ToString::to_string).collect();
                match output {
                    Output::Text => println!("{image}\n  digest:    {}\n  mediaType: {}\n  platforms: {}", found.digest, found.media_type, platforms.join(", ")),
                    Output::Json | Output::Yaml => docs.push(json!({"image": image, "digest": found.digest, "mediaType": found.media_type, "platforms": platforms})),
                }
            }
            Err(e) => {
                failed = true;
                match output {
                    Output::Text => println!("{image}\n  error:     {e} ({})", e.reason()),
                    Output::Json | Output::Yaml => docs.push(json!({"image": image, "error": e.to_string(), "reason": e.reason()})),
                }
            }
        }
    }
    if output != Output::Text {
        output.print(&docs)?;
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
