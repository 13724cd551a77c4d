//! The structure is the documentation (README "Layout"), so it is checked: no import cycle
//! between the modules of a crate, no type with more than 20 methods, and the pure crates free
//! of the runtime (no tokio, kube client, HTTP or cloud SDK anywhere below them).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(sources(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

fn is_test_file(rel: &str) -> bool {
    rel.contains("tests") || rel.ends_with("_tests.rs")
}

/// The crate's top-level modules and the ones each imports (`crate::x`, or `super::x` from a
/// file at the crate's root).
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in sources(src) {
        let rel = f.strip_prefix(src).expect("under src").to_string_lossy().replace('\\', "/");
        if is_test_file(&rel) {
            continue;
        }
        let parts: Vec<&str> = rel.split('/').collect();
        let module = parts[0].trim_end_matches(".rs").to_string();
        let at_root = parts.len() == 1 || (parts.len() == 2 && parts[1] == "mod.rs");
        let text = std::fs::read_to_string(&f).expect("source");
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for prefix in if at_root { vec!["crate::", "super::"] } else { vec!["crate::"] } {
                for (i, _) in line.match_indices(prefix) {
                    let name: String = line[i + prefix.len()..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
                    if !name.is_empty() && name != module && name != "tests" {
                        g.entry(module.clone()).or_default().insert(name);
                    }
                }
            }
        }
    }
    g
}

fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(g: &BTreeMap<String, BTreeSet<String>>, n: &str, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(g, m, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys().find_map(|n| visit(g, n, &mut Vec::new(), &mut done))
}

fn crate_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![root.join("src")];
    for e in std::fs::read_dir(root.join("crates")).expect("crates").flatten() {
        dirs.push(e.path().join("src"));
    }
    dirs.sort();
    dirs
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    for src in crate_dirs() {
        let g = module_graph(&src);
        assert!(cycle(&g).is_none(), "{}: modules import each other: {:?}", src.display(), cycle(&g));
    }
    // The check sees a cycle when there is one.
    let looped: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a")].into_iter().map(|(x, y)| (x.to_string(), BTreeSet::from([y.to_string()]))).collect();
    assert_eq!(cycle(&looped).map(|c| c.len()), Some(4));
}

#[test]
fn no_type_has_more_than_twenty_methods() {
    let mut methods: BTreeMap<String, usize> = BTreeMap::new();
    for src in crate_dirs() {
        for f in sources(&src) {
            let rel = f.to_string_lossy().to_string();
            if is_test_file(&rel) {
                continue;
            }
            let text = std::fs::read_to_string(&f).expect("source");
            let mut current: Option<String> = None;
            for line in text.lines() {
                if let Some(rest) = line.strip_prefix("impl") {
                    // `impl Foo {`, `impl<T> Foo<T> {`; trait impls count for their trait's
                    // methods, which the type must have anyway, so they are left out.
                    let head = rest.split('{').next().unwrap_or("");
                    current = (!head.contains(" for ")).then(|| head.split_whitespace().last().unwrap_or("").split('<').next().unwrap_or("").to_string()).filter(|t| !t.is_empty());
                } else if line.starts_with('}') {
                    current = None;
                } else if let Some(t) = &current {
                    let l = line.trim_start_matches("    ");
                    if line.starts_with("    ") && !line.starts_with("     ") && (l.starts_with("fn ") || l.starts_with("pub fn ") || l.starts_with("pub(crate) fn ") || l.starts_with("pub(super) fn ") || l.starts_with("async fn ") || l.starts_with("pub async fn ") || l.starts_with("pub(super) async fn ") || l.starts_with("pub(crate) async fn ") || l.starts_with("pub const fn ") || l.starts_with("const fn ")) {
                        *methods.entry(format!("{}::{t}", src.display())).or_default() += 1;
                    }
                }
            }
        }
    }
    assert!(methods.values().any(|n| *n >= 10), "the count sees methods: {methods:?}");
    let big: Vec<_> = methods.iter().filter(|(_, n)| **n > 20).collect();
    assert!(big.is_empty(), "types over 20 methods (split them): {big:?}");
}

#[test]
fn the_pure_crates_depend_on_no_runtime() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    for krate in ["archer-core", "archer-model"] {
        let out = std::process::Command::new(&cargo).args(["tree", "--locked", "-p", krate, "-e", "normal", "--prefix", "none"]).current_dir(env!("CARGO_MANIFEST_DIR")).output().expect("cargo tree");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let tree = String::from_utf8(out.stdout).expect("utf-8");
        let names: BTreeSet<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
        assert!(names.contains("k8s-openapi"), "{krate}: {names:?}");
        for runtime in ["tokio", "kube-client", "kube-runtime", "hyper", "reqwest", "axum", "aws-config", "aws-sdk-ec2"] {
            assert!(!names.contains(runtime), "{krate} depends on {runtime}: {names:?}");
        }
    }
}
