//! The git revision `archer --version` prints: ARCHER_GIT_REVISION when set (the Dockerfile's
//! build argument, a release pipeline), else the checkout's HEAD, else "unknown".

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=ARCHER_GIT_REVISION");
    let revision = std::env::var("ARCHER_GIT_REVISION").ok().filter(|r| !r.trim().is_empty()).or_else(head).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=ARCHER_GIT_REVISION={}", revision.trim());
}

/// HEAD's short hash, "-dirty" never added (a build is not a release); rebuilt when HEAD moves.
fn head() -> Option<String> {
    let git = Path::new(".git");
    if !git.exists() {
        return None;
    }
    println!("cargo:rerun-if-changed=.git/HEAD");
    // HEAD's log moves with every commit and checkout, whether the branch's ref is loose or packed.
    if git.join("logs/HEAD").exists() {
        println!("cargo:rerun-if-changed=.git/logs/HEAD");
    }
    if let Ok(head) = std::fs::read_to_string(git.join("HEAD")) {
        // A missing path would rerun this script on every build: packed refs have no file.
        if let Some(reference) = head.trim().strip_prefix("ref: ").filter(|r| git.join(r).exists()) {
            println!("cargo:rerun-if-changed=.git/{reference}");
        }
    }
    let out = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|s| !s.is_empty())
}
