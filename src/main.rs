use clap::Parser;

fn main() -> std::process::ExitCode {
    archer::cli::main(archer::cli::Cli::parse())
}
