//! The README's first command builds Archer with no cloud SDK: `--no-default-features` leaves out
//! every `archer-cloud-*` crate but kwok's, and what remains still plans. This test builds that
//! binary in a target directory of its own (a second build of Archer's dependencies, minutes on
//! two cores), so plain `cargo test` leaves it out; `.ci/run` runs it with `--ignored`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

use std::path::Path;
use std::process::Command;

fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

#[test]
fn without_a_cloud_no_sdk_is_in_the_dependency_graph() {
    let out = cargo().args(["tree", "--locked", "-p", "archer", "--no-default-features", "-e", "normal", "--prefix", "none"]).output().expect("cargo tree");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8(out.stdout).expect("utf-8");
    assert!(tree.contains("archer-core") && tree.contains("archer-cloud-kwok"), "{tree}");
    let clouds: Vec<&str> = tree.lines().filter(|l| l.starts_with("aws-") || l.starts_with("archer-cloud-aws")).collect();
    assert!(clouds.is_empty(), "cloud crates without a cloud asked for: {clouds:?}");
    // With the default features, the AWS provider is there (the image and the chart use them).
    let out = cargo().args(["tree", "--locked", "-p", "archer", "-e", "normal", "--prefix", "none"]).output().expect("cargo tree");
    assert!(String::from_utf8_lossy(&out.stdout).lines().any(|l| l.starts_with("aws-sdk-ec2")));
    // The Azure crate is there either way (its AKSNodeClass plans Azure pools), its VM provider
    // only with the default features.
    let provider = |args: &[&str]| {
        let out = cargo().args(["tree", "--locked", "-p", "archer", "-e", "normal", "-f", "{p} [{f}]", "--prefix", "none"]).args(args).output().expect("cargo tree");
        let tree = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = tree.lines().find(|l| l.starts_with("archer-cloud-azure ")).map(str::to_string);
        assert!(line.is_some(), "the Azure crate is in the graph: {tree}");
        line.is_some_and(|l| l.contains("provider"))
    };
    assert!(!provider(&["--no-default-features"]), "no ARM client without a cloud");
    assert!(provider(&[]), "the default build has the Azure VM provider");
}

#[test]
#[ignore = "builds Archer again without default features in its own target directory (minutes), or takes ARCHER_NO_CLOUD_BIN; .ci/run runs it"]
fn simulate_builds_and_plans_without_any_cloud_sdk() {
    // `.ci/run` builds the cloudless binary once, in release for the sustained-load test, and
    // hands it here (ARCHER_NO_CLOUD_BIN): the same features, one build of the dependencies fewer.
    let bin = match std::env::var_os("ARCHER_NO_CLOUD_BIN") {
        Some(bin) => std::path::PathBuf::from(bin),
        None => {
            let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/no-cloud");
            let started = std::time::Instant::now();
            let status = cargo().args(["build", "--locked", "--no-default-features", "--bin", "archer"]).env("CARGO_TARGET_DIR", &target).status().expect("cargo build");
            assert!(status.success(), "cargo build --no-default-features failed");
            eprintln!("built archer without a cloud in {:.0} s", started.elapsed().as_secs_f64());
            target.join("debug/archer")
        }
    };
    let features = Command::new(&bin).args(["prices", "--cloud-provider", "aws"]).output().expect("run archer");
    assert!(String::from_utf8_lossy(&features.stderr).contains("built without the aws feature"), "{} is a build without a cloud", bin.display());
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/simulate-inflate-workshop-plan");
    let out = Command::new(&bin)
        .args(["simulate", "--offline", "--compare", "--disruption", "--output", "text", "--scenario"])
        .arg(golden.with_extension("yaml"))
        .output()
        .expect("run archer");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), std::fs::read_to_string(golden.with_extension("txt")).expect("golden"), "the cloudless build plans as the full one");
    let out = Command::new(&bin).args(["prices", "--cloud-provider", "aws"]).output().expect("run archer");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("built without the aws feature"), "{}", String::from_utf8_lossy(&out.stderr));
}
