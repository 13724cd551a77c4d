//! The structure is the documentation (docs "Layout"), so it is checked: no import cycle
//! between the modules of a crate at any depth, no type with more than 20 methods, and the pure crates free
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

/// A source file's module path: `src/webhook/memo.rs` is `["webhook", "memo"]`, a `mod.rs` is
/// its folder's, and the crate roots (`lib.rs`, `main.rs`) are `[]`.
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|l| l == "mod") || (parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main")) {
        parts.pop();
    }
    parts
}

/// The paths a `use` tree or an inline path names, from `text` just after its first `::`:
/// `a::b::{c, d::e}` gives `[a, b, c]` and `[a, b, d, e]` (only its lowercase segments count:
/// modules and the items after them).
fn path_trees(text: &str) -> Vec<Vec<String>> {
    fn tree(chars: &[char], at: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        let mut path = prefix;
        loop {
            while chars.get(*at).is_some_and(|c| c.is_whitespace()) {
                *at += 1;
            }
            if chars.get(*at) == Some(&'{') {
                *at += 1;
                loop {
                    tree(chars, at, path.clone(), out);
                    while chars.get(*at).is_some_and(|c| c.is_whitespace()) {
                        *at += 1;
                    }
                    match chars.get(*at) {
                        Some(',') => *at += 1,
                        Some('}') => {
                            *at += 1;
                            break;
                        }
                        _ => break,
                    }
                    while chars.get(*at).is_some_and(|c| c.is_whitespace()) {
                        *at += 1;
                    }
                    if chars.get(*at) == Some(&'}') {
                        *at += 1;
                        break;
                    }
                }
                return;
            }
            let name: String = chars[*at..].iter().take_while(|c| c.is_alphanumeric() || **c == '_').collect();
            if name.is_empty() {
                break;
            }
            *at += name.chars().count();
            path.push(name);
            if chars.get(*at) == Some(&':') && chars.get(*at + 1) == Some(&':') {
                *at += 2;
            } else {
                break;
            }
        }
        // Skip what follows the path in a `use` tree (`as x`, a `self`).
        while chars.get(*at).is_some_and(|c| c.is_alphanumeric() || *c == '_' || *c == ' ') {
            *at += 1;
        }
        out.push(path);
    }
    let chars: Vec<char> = text.chars().take(4096).collect();
    let mut out = Vec::new();
    tree(&chars, &mut 0, Vec::new(), &mut out);
    out
}

/// Every module of a crate and, for each, the modules its code names (`crate::a::b`,
/// `super::x`, `self::x`, resolved to the longest module path that exists). Test code
/// (`#[cfg(test)]` onwards, `tests` folders) is left out.
fn module_graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    for f in sources(src) {
        let rel = f.strip_prefix(src).expect("under src").to_string_lossy().replace('\\', "/");
        if !is_test_file(&rel) {
            files.push((module_of(&rel), f));
        }
    }
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(m, _)| m.clone()).collect();
    let resolve = |path: &[String]| (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| modules.contains(p));
    let mut g: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, f) in &files {
        let text = std::fs::read_to_string(f).expect("source");
        let code: String = text.split("#[cfg(test)]").next().unwrap_or("").lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
        let roots = ["crate::", "super::", "self::"].iter().flat_map(|r| code.match_indices(r).map(|(i, r)| (i, r.trim_end_matches(':'))));
        for (i, root) in roots.collect::<Vec<_>>() {
            // A path's root, not a segment of a longer name or path.
            if code[..i].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let i = i + root.len();
            let base: Option<Vec<String>> = match root {
                "crate" => Some(Vec::new()),
                "self" => Some(module.clone()),
                _ => {
                    let mut m = module.clone();
                    m.pop();
                    let mut rest = &code[i + 2..];
                    while let Some(r) = rest.strip_prefix("super::") {
                        m.pop();
                        rest = r;
                    }
                    Some(m)
                }
            };
            let Some(base) = base else { continue };
            let mut rest = &code[i + 2..];
            while let Some(r) = rest.strip_prefix("super::") {
                rest = r;
            }
            for tail in path_trees(rest) {
                let full: Vec<String> = base.iter().cloned().chain(tail.into_iter().filter(|s| s != "self")).collect();
                if let Some(target) = resolve(&full) {
                    if &target != module {
                        g.entry(module.clone()).or_default().insert(target);
                    }
                }
            }
        }
        g.entry(module.clone()).or_default();
    }
    g
}

/// For each module, the graph between its children: child `a` names child `b` when any module
/// at or under `a` names one at or under `b` (a module naming its own parent or child is how a
/// module and its parts talk, and is not an edge between siblings).
fn sibling_graphs(g: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
    let mut out: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, targets) in g {
        for to in targets {
            let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
            if common < from.len() && common < to.len() {
                out.entry(from[..common].to_vec()).or_default().entry(from[common].clone()).or_default().insert(to[common].clone());
            }
        }
    }
    out
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
fn no_crate_has_an_import_cycle_between_its_modules_at_any_depth() {
    let mut seen = 0;
    for src in crate_dirs() {
        for (parent, g) in sibling_graphs(&module_graph(&src)) {
            seen += g.len();
            assert!(cycle(&g).is_none(), "{}: modules of `{}` import each other: {:?}", src.display(), if parent.is_empty() { "crate".to_string() } else { parent.join("::") }, cycle(&g));
        }
    }
    assert!(seen > 50, "the check sees the modules' imports ({seen} edges' sources)");
    // The check sees a cycle when there is one, and the paths it reads as a compiler would.
    let looped: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a")].into_iter().map(|(x, y)| (x.to_string(), BTreeSet::from([y.to_string()]))).collect();
    assert_eq!(cycle(&looped).map(|c| c.len()), Some(4));
    let v = |s: &str| s.split("::").map(str::to_string).collect::<Vec<_>>();
    assert_eq!(path_trees("a::b::{c, d::{e, f}};"), vec![v("a::b::c"), v("a::b::d::e"), v("a::b::d::f")]);
    assert_eq!(path_trees("memo::KeyWriter::default()"), vec![v("memo::KeyWriter::default")]);
    assert_eq!(module_of("webhook/memo.rs"), v("webhook::memo"));
    assert_eq!(module_of("webhook/mod.rs"), v("webhook"));
    assert!(module_of("lib.rs").is_empty());
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("w")).expect("mkdir");
    std::fs::write(dir.path().join("lib.rs"), "mod w;").expect("write");
    std::fs::write(dir.path().join("w/mod.rs"), "mod a; mod b; use self::a::X;").expect("write");
    std::fs::write(dir.path().join("w/a.rs"), "use super::b::{Y,\n    Z};").expect("write");
    std::fs::write(dir.path().join("w/b.rs"), "fn f() { crate::w::a::g() }").expect("write");
    let nested = sibling_graphs(&module_graph(dir.path()));
    assert_eq!(nested.get(&v("w")).and_then(cycle), Some(vec!["a".to_string(), "b".to_string(), "a".to_string()]), "{nested:?}");
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

/// The names of the packages `krate` depends on in a normal build (`cargo tree`), itself
/// included.
fn dependency_names(krate: &str) -> BTreeSet<String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(&cargo).args(["tree", "--locked", "-p", krate, "-e", "normal", "--prefix", "none"]).current_dir(env!("CARGO_MANIFEST_DIR")).output().expect("cargo tree");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8(out.stdout).expect("utf-8");
    tree.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect()
}

#[test]
fn the_pure_crates_depend_on_no_runtime() {
    for krate in ["archer-core", "archer-model"] {
        let names = dependency_names(krate);
        assert!(names.contains("k8s-openapi"), "{krate}: {names:?}");
        for runtime in ["tokio", "kube-client", "kube-runtime", "hyper", "reqwest", "axum", "aws-config", "aws-sdk-ec2"] {
            assert!(!names.contains(runtime), "{krate} depends on {runtime}: {names:?}");
        }
    }
}

/// Layers go down: the model decides on what the clouds report (instances) without depending on
/// the crate that defines how a cloud is driven, and the core depends on no Archer crate.
#[test]
fn the_model_sits_below_the_clouds() {
    let model = dependency_names("archer-model");
    assert!(model.contains("archer-core") && model.contains("archer-api"), "{model:?}");
    for above in ["archer-cloud", "archer-cloud-aws", "archer-cloud-azure", "archer-cloud-kwok", "archer-registry", "archer-metrics", "archer-limits"] {
        assert!(!model.contains(above), "archer-model depends on {above}: {model:?}");
    }
    let core = dependency_names("archer-core");
    let archer: Vec<&String> = core.iter().filter(|n| n.starts_with("archer-") && n.as_str() != "archer-core").collect();
    assert!(archer.is_empty(), "archer-core depends on {archer:?}");
}

/// The registry client draws from the memory budget; the budget's crate brings no web
/// framework with it, so neither does the registry client.
#[test]
fn the_registry_client_reaches_no_web_framework() {
    for krate in ["archer-limits", "archer-registry"] {
        let names = dependency_names(krate);
        assert!(names.contains("tokio"), "{krate}: {names:?}");
        for server in ["axum", "axum-core"] {
            assert!(!names.contains(server), "{krate} depends on {server}: {names:?}");
        }
    }
}

/// The config builds plain settings, which each component turns into its own types: it names
/// another module of the binary only for a constant (a size its memory bound adds up).
#[test]
fn the_config_builds_plain_settings() {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config.rs")).expect("config.rs");
    let mut named = Vec::new();
    // Components' types are built from the config by the CLI (`cli::client_settings`,
    // `cli::connection_limits`, ...); the config names another crate's type only to validate a
    // field (the registry's address guard parses `deny`, `allow` and `insecure`).
    for (i, _) in text.match_indices("archer_registry::") {
        let path: String = text[i..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':' || *c == '{' || *c == ',' || *c == ' ').collect();
        for item in path.trim_start_matches("archer_registry::").trim_start_matches('{').split(',').map(|p| p.trim().rsplit("::").next().unwrap_or("").trim()) {
            let constant = !item.is_empty() && item.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            let type_name = item.chars().next().is_some_and(|c| c.is_ascii_uppercase());
            if type_name && !constant && item != "AddressGuard" {
                named.push(format!("archer_registry::{item}"));
            }
        }
    }
    for (i, _) in text.match_indices("crate::") {
        let path: String = text[i..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
        let last = path.rsplit("::").next().unwrap_or("");
        let constant = !last.is_empty() && last.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !constant {
            named.push(path);
        }
    }
    assert!(named.is_empty(), "src/config.rs builds or names components' types: {named:?}");
}

/// Each component defines and registers its own metric families (`<component>/metrics.rs`,
/// `new(&mut Registry)`) and is handed only those: no component's code names the process-wide
/// `Metrics`, which only the CLI assembles and `/metrics` renders.
#[test]
fn each_component_registers_its_own_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in ["src/webhook", "src/extender", "src/server", "src/provisioner", "src/safety", "crates/registry/src"] {
        let text = std::fs::read_to_string(root.join(dir).join("metrics.rs")).unwrap_or_else(|e| panic!("{dir}/metrics.rs: {e}"));
        assert!(text.contains("pub fn new(registry: &mut Registry"), "{dir}/metrics.rs registers nothing of its own");
    }
    let shared = std::fs::read_to_string(root.join("crates/metrics/src/lib.rs")).expect("archer-metrics");
    assert!(!shared.contains("pub struct"), "archer-metrics defines a component's families");
    let mut whole = Vec::new();
    for file in sources(&root.join("src")) {
        let rel = file.strip_prefix(root).expect("under root").to_string_lossy().replace('\\', "/");
        if rel.starts_with("src/cli/") || rel == "src/metrics.rs" || is_test_file(&rel) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("source");
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        if code.contains("metrics::Metrics") {
            whole.push(rel);
        }
    }
    assert!(whole.is_empty(), "components handed every component's metrics: {whole:?}");
}
