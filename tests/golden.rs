//! `archer simulate`'s output, byte for byte, on every scenario under `tests/golden/`: the
//! shipped examples and the scenarios of `tests/simulate.rs` and `tests/karpenter_scheduling.rs`,
//! each planned with `--offline --compare --disruption`, as text and as JSON. The files were
//! written by the binary before the workspace redesign (#27); a change to the deciding code that
//! moves any plan shows here as a diff. `ARCHER_BLESS=1 cargo test --test golden` rewrites them
//! after an intended change (review the diff).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

use std::path::{Path, PathBuf};

fn scenarios() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir).expect("tests/golden").filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == "yaml")).collect();
    v.sort();
    v
}

fn simulate(scenario: &Path, format: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_archer"))
        .args(["simulate", "--offline", "--compare", "--disruption", "--output", format, "--scenario"])
        .arg(scenario)
        .env_remove("ARCHER_CATALOG")
        .env_remove("ARCHER_CONFIG")
        .output()
        .expect("run archer");
    assert!(out.status.success(), "{}: {}", scenario.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 output")
}

#[test]
fn simulate_prints_exactly_what_it_printed_before() {
    let bless = std::env::var_os("ARCHER_BLESS").is_some();
    let all = scenarios();
    assert!(all.len() >= 100, "the golden scenarios are there ({} found)", all.len());
    // One run costs about a second in a debug build: the runs share the machine's cores.
    let jobs: Vec<(&PathBuf, &str, &str)> = all.iter().flat_map(|s| [(s, "text", "txt"), (s, "json", "json")]).collect();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let differ = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((s, format, ext)) = jobs.get(i) else { break };
                let got = simulate(s, format);
                let file = s.with_extension(ext);
                if bless {
                    std::fs::write(&file, &got).expect("write golden");
                    continue;
                }
                let want = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                if got != want {
                    let line = got.lines().zip(want.lines()).position(|(a, b)| a != b).unwrap_or(got.lines().count().min(want.lines().count()));
                    differ.lock().unwrap().push(format!("{} (first difference at line {})", file.display(), line + 1));
                }
            });
        }
    });
    let mut differ = differ.into_inner().unwrap();
    differ.sort();
    assert!(differ.is_empty(), "simulate's output changed for {} file(s):\n{}", differ.len(), differ.join("\n"));
}
