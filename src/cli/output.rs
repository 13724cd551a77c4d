//! How a command prints its result: `-o text|json|yaml`, the same document in JSON and YAML.

use clap::ValueEnum;

#[derive(Copy, Clone, Debug, ValueEnum, PartialEq, Eq, Default)]
pub enum Output {
    /// For people: tables and sentences.
    #[default]
    Text,
    /// One JSON document.
    Json,
    /// The same document as YAML.
    Yaml,
}

impl Output {
    /// Print `doc` to standard output as JSON or YAML (text output is the command's own).
    pub fn print<T: serde::Serialize>(self, doc: &T) -> anyhow::Result<()> {
        match self {
            Output::Yaml => print!("{}", archer_core::yaml::to_string(doc)?),
            Output::Json | Output::Text => println!("{}", serde_json::to_string_pretty(doc)?),
        }
        Ok(())
    }
}
