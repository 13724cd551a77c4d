//! Path resolution in an image's filesystem, as the runtime and the kernel resolve the program
//! a container starts: `PATH` lookup, symbolic links (relative and absolute, intermediate
//! directories included), hard links, and one `#!` interpreter.
//!
//! Resolution runs over the facts learnt so far (`Lookup` -> `Answer`); when it needs one it
//! does not have, it says which (every lexical prefix of the path still to walk, so one pass
//! over the layers answers them together) and the caller reads the layers again.

use std::collections::{HashMap, VecDeque};

use super::elf::{classify, Head};
use super::{Bound, Undetermined};

/// containerd's default when the image sets no `PATH`.
pub(crate) const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// `PATH` entries tried at most (each is a separate lookup).
const MAX_PATH_ENTRIES: usize = 32;
/// The longest path resolved (Linux's `PATH_MAX`).
const MAX_PATH_LEN: usize = 4096;

/// What `path` is: in the image's merged filesystem (`layer: None`), or in one layer (a hard
/// link's target, which the tar names in the same layer).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Lookup {
    pub path: String,
    pub layer: Option<usize>,
}

impl Lookup {
    pub(crate) fn merged(path: &str) -> Self {
        Lookup { path: path.to_string(), layer: None }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    /// A regular file: its first `HEAD_BYTES` and its mode bits.
    File { head: Vec<u8>, mode: u32 },
    /// The link's target as written.
    Symlink(String),
    /// The target's absolute path in the same layer.
    Hardlink(String),
    Dir,
    /// A device, FIFO or sparse file: nothing the walk follows or reads.
    Other,
    Absent,
}

/// A fact and the layer (index in the manifest, 0 the bottom) it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub node: Node,
    pub layer: usize,
}

pub(crate) type Answers = HashMap<Lookup, Answer>;

/// What the image runs: `Entrypoint[0]`, or `Cmd[0]` without one, with its working directory
/// and `PATH`.
#[derive(Debug, Clone)]
pub(crate) struct Program {
    pub name: String,
    pub workdir: String,
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Read the layers for these.
    Need(Vec<Lookup>),
    /// The ELF file read (`path`), its architecture, and the script it interprets, if any.
    Machine { path: String, arch: &'static str, script: Option<String> },
    Undetermined(Undetermined),
}

/// One step of resolving `program` with what `answers` holds.
pub(crate) fn resolve(program: &Program, answers: &Answers, max_hops: usize) -> Step {
    let found = match find_program(program, answers, max_hops) {
        Ok(f) => f,
        Err(step) => return step,
    };
    match classify(&found.head) {
        Head::Elf(arch) => Step::Machine { path: found.path, arch, script: None },
        Head::ElfUnusable(why) => Step::Undetermined(Undetermined::UnusableElf { path: found.path, why }),
        Head::Unknown => Step::Undetermined(Undetermined::NotElfOrScript { path: found.path }),
        Head::Script(interpreter) => {
            let at = absolute(&interpreter, &program.workdir);
            let script = found.path;
            let elf = match walk(&at, answers, max_hops) {
                Walk::Found(f) => f,
                Walk::Need(n) => return Step::Need(n),
                Walk::Missing(why) => return Step::Undetermined(Undetermined::NotFound { path: at, why }),
                Walk::Over(b) => return Step::Undetermined(Undetermined::OverBound(b)),
            };
            match classify(&elf.head) {
                Head::Elf(arch) => Step::Machine { path: elf.path, arch, script: Some(script) },
                Head::ElfUnusable(why) => Step::Undetermined(Undetermined::UnusableElf { path: elf.path, why }),
                Head::Script(_) => Step::Undetermined(Undetermined::InterpreterIsScript { script, interpreter: elf.path }),
                Head::Unknown => Step::Undetermined(Undetermined::NotElfOrScript { path: elf.path }),
            }
        }
    }
}

#[derive(Debug)]
struct Found {
    path: String,
    head: Vec<u8>,
    mode: u32,
}

/// The program's file: a name with a `/` is a path (relative to the working directory); a bare
/// name is the first executable regular file along `PATH`, as Go's `exec.LookPath` in runc.
fn find_program(program: &Program, answers: &Answers, max_hops: usize) -> Result<Found, Step> {
    let name = program.name.as_str();
    if name.is_empty() {
        return Err(Step::Undetermined(Undetermined::NoEntrypoint));
    }
    if name.contains('/') {
        let at = absolute(name, &program.workdir);
        return match walk(&at, answers, max_hops) {
            Walk::Found(f) => Ok(f),
            Walk::Need(n) => Err(Step::Need(n)),
            Walk::Missing(why) => Err(Step::Undetermined(Undetermined::NotFound { path: at, why })),
            Walk::Over(b) => Err(Step::Undetermined(Undetermined::OverBound(b))),
        };
    }
    // Candidates in PATH order; one that needs facts not yet learnt holds up the later ones
    // (an earlier hit wins), but their lookups join the same pass.
    let mut needs: Vec<Lookup> = Vec::new();
    for dir in program.path.split(':').take(MAX_PATH_ENTRIES) {
        let dir = if dir.is_empty() { "." } else { dir };
        let at = absolute(&format!("{dir}/{name}"), &program.workdir);
        match walk(&at, answers, max_hops) {
            Walk::Need(n) => needs.extend(n.into_iter().filter(|l| !needs.contains(l)).collect::<Vec<_>>()),
            Walk::Found(f) if f.mode & 0o111 != 0 => {
                if needs.is_empty() {
                    return Ok(f);
                }
                break;
            }
            Walk::Found(_) | Walk::Missing(_) => {}
            Walk::Over(b) => {
                if needs.is_empty() {
                    return Err(Step::Undetermined(Undetermined::OverBound(b)));
                }
                break;
            }
        }
    }
    if needs.is_empty() {
        Err(Step::Undetermined(Undetermined::NotFound { path: name.to_string(), why: "no executable of that name on PATH" }))
    } else {
        Err(Step::Need(needs))
    }
}

#[derive(Debug)]
enum Walk {
    Need(Vec<Lookup>),
    Found(Found),
    Missing(&'static str),
    Over(Bound),
}

/// Resolve an absolute path component by component: `..` goes up from where the walk is (after
/// links, as the kernel does), a symbolic link's target replaces the component (from the root
/// when absolute), and a hard link reads its target in its own layer.
fn walk(start: &str, answers: &Answers, max_hops: usize) -> Walk {
    if start.len() > MAX_PATH_LEN {
        return Walk::Missing("path longer than PATH_MAX");
    }
    let mut queue: VecDeque<String> = start.split('/').filter(|c| !c.is_empty()).map(str::to_string).collect();
    let mut at: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(c) = queue.pop_front() {
        match c.as_str() {
            "." => continue,
            ".." => {
                at.pop();
                continue;
            }
            _ => at.push(c),
        }
        let path = join(&at);
        if path.len() > MAX_PATH_LEN {
            return Walk::Missing("path longer than PATH_MAX");
        }
        let Some(answer) = answers.get(&Lookup::merged(&path)) else {
            return Walk::Need(lexical_prefixes(&at, &queue));
        };
        match &answer.node {
            Node::Absent => return Walk::Missing("no such file"),
            Node::Other => return Walk::Missing("not a regular file"),
            Node::Dir => {}
            Node::Symlink(target) => {
                hops += 1;
                if hops > max_hops {
                    return Walk::Over(Bound::SymlinkHops);
                }
                at.pop();
                if target.is_empty() {
                    return Walk::Missing("empty symbolic link");
                }
                if target.starts_with('/') {
                    at.clear();
                }
                for part in target.split('/').rev().filter(|p| !p.is_empty()) {
                    queue.push_front(part.to_string());
                }
            }
            Node::File { head, mode } => {
                if !queue.is_empty() {
                    return Walk::Missing("a path component is not a directory");
                }
                return Walk::Found(Found { path, head: head.clone(), mode: *mode });
            }
            Node::Hardlink(target) => {
                if !queue.is_empty() {
                    return Walk::Missing("a path component is not a directory");
                }
                hops += 1;
                if hops > max_hops {
                    return Walk::Over(Bound::SymlinkHops);
                }
                let lookup = Lookup { path: target.clone(), layer: Some(answer.layer) };
                return match answers.get(&lookup).map(|a| &a.node) {
                    None => Walk::Need(vec![lookup]),
                    Some(Node::File { head, mode }) => Walk::Found(Found { path, head: head.clone(), mode: *mode }),
                    Some(_) => Walk::Missing("a hard link whose target is not a regular file in its layer"),
                };
            }
        }
    }
    Walk::Missing("a directory")
}

/// `at` and each longer path made by appending the queued components, up to the first `..`.
fn lexical_prefixes(at: &[String], queue: &VecDeque<String>) -> Vec<Lookup> {
    let mut parts = at.to_vec();
    let mut out = vec![Lookup::merged(&join(&parts))];
    for c in queue {
        match c.as_str() {
            "." => continue,
            ".." => break,
            _ => {
                parts.push(c.clone());
                out.push(Lookup::merged(&join(&parts)));
            }
        }
    }
    out
}

fn join(parts: &[String]) -> String {
    let mut s = String::new();
    for p in parts {
        s.push('/');
        s.push_str(p);
    }
    if s.is_empty() {
        s.push('/');
    }
    s
}

/// `path` made absolute against the working directory (`/` when the image sets none).
pub(crate) fn absolute(path: &str, workdir: &str) -> String {
    if path.starts_with('/') {
        return path.to_string();
    }
    let wd = if workdir.starts_with('/') { workdir.trim_end_matches('/') } else { "" };
    format!("{wd}/{path}")
}

#[cfg(test)]
mod tests {
    use super::super::elf::tests::elf_header;
    use super::*;

    const AMD64: u16 = 62;
    const ARM64: u16 = 183;

    fn elf(machine: u16) -> Node {
        Node::File { head: elf_header(2, 1, 2, machine), mode: 0o755 }
    }

    fn facts(entries: &[(&str, Node)]) -> Answers {
        entries.iter().map(|(p, n)| (Lookup::merged(p), Answer { node: n.clone(), layer: 0 })).collect()
    }

    fn program(name: &str) -> Program {
        Program { name: name.into(), workdir: "/".into(), path: DEFAULT_PATH.into() }
    }

    /// Resolve with a filesystem given whole: every lookup not listed is absent.
    fn run(program: &Program, fs: &[(&str, Node)]) -> (Step, usize) {
        let mut answers = facts(fs);
        let mut passes = 0;
        loop {
            match resolve(program, &answers, 8) {
                Step::Need(lookups) => {
                    passes += 1;
                    assert!(passes < 20, "resolution does not progress: {lookups:?}");
                    for l in lookups {
                        answers.entry(l).or_insert(Answer { node: Node::Absent, layer: 0 });
                    }
                }
                done => return (done, passes),
            }
        }
    }

    fn machine(step: &Step) -> Option<(&str, &str)> {
        match step {
            Step::Machine { path, arch, .. } => Some((path.as_str(), *arch)),
            _ => None,
        }
    }

    #[test]
    fn an_absolute_entrypoint_is_read_directly() {
        let (step, passes) = run(&program("/app"), &[("/app", elf(ARM64))]);
        assert_eq!(machine(&step), Some(("/app", "arm64")));
        assert_eq!(passes, 0, "everything was known");
        let (step, _) = run(&program("/usr/bin/app"), &[("/usr", Node::Dir), ("/usr/bin", Node::Dir), ("/usr/bin/app", elf(AMD64))]);
        assert_eq!(machine(&step), Some(("/usr/bin/app", "amd64")));
    }

    #[test]
    fn one_pass_asks_for_every_prefix_of_a_path() {
        match resolve(&program("/usr/local/bin/app"), &Answers::new(), 8) {
            Step::Need(l) => assert_eq!(l.iter().map(|l| l.path.as_str()).collect::<Vec<_>>(), ["/usr", "/usr/local", "/usr/local/bin", "/usr/local/bin/app"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bare_names_go_along_path_and_skip_non_executables() {
        let fs = [("/usr", Node::Dir), ("/usr/local", Node::Dir), ("/usr/local/bin", Node::Dir), ("/usr/local/bin/app", Node::File { head: elf_header(2, 1, 2, AMD64), mode: 0o644 }), ("/usr/bin", Node::Dir), ("/usr/bin/app", elf(ARM64))];
        let (step, _) = run(&program("app"), &fs);
        assert_eq!(machine(&step), Some(("/usr/bin/app", "arm64")), "the non-executable earlier on PATH is skipped");
        let p = Program { name: "app".into(), workdir: "/".into(), path: "/opt:/usr/bin".into() };
        assert_eq!(machine(&run(&p, &fs).0), Some(("/usr/bin/app", "arm64")));
        let (step, _) = run(&program("nothing"), &fs);
        assert!(matches!(step, Step::Undetermined(Undetermined::NotFound { .. })), "{step:?}");
    }

    #[test]
    fn relative_names_and_empty_path_entries_use_the_working_directory() {
        let fs = [("/srv", Node::Dir), ("/srv/run", elf(ARM64))];
        let p = Program { name: "./run".into(), workdir: "/srv".into(), path: DEFAULT_PATH.into() };
        assert_eq!(machine(&run(&p, &fs).0), Some(("/srv/run", "arm64")));
        let p = Program { name: "run".into(), workdir: "/srv/".into(), path: "/usr/bin::".into() };
        assert_eq!(machine(&run(&p, &fs).0), Some(("/srv/run", "arm64")));
    }

    #[test]
    fn symlinks_relative_absolute_and_in_directories_are_followed() {
        // Debian since bookworm: /bin -> usr/bin, /usr/bin/sh -> dash.
        let fs = [("/bin", Node::Symlink("usr/bin".into())), ("/usr", Node::Dir), ("/usr/bin", Node::Dir), ("/usr/bin/sh", Node::Symlink("dash".into())), ("/usr/bin/dash", elf(AMD64))];
        assert_eq!(machine(&run(&program("/bin/sh"), &fs).0), Some(("/usr/bin/dash", "amd64")));
        let fs = [("/usr", Node::Dir), ("/usr/bin", Node::Dir), ("/usr/bin/app", Node::Symlink("../lib/app/app".into())), ("/usr/lib", Node::Dir), ("/usr/lib/app", Node::Dir), ("/usr/lib/app/app", elf(ARM64))];
        assert_eq!(machine(&run(&program("/usr/bin/app"), &fs).0), Some(("/usr/lib/app/app", "arm64")));
        let fs = [("/app", Node::Symlink("/opt/./x/../app".into())), ("/opt", Node::Dir), ("/opt/x", Node::Dir), ("/opt/app", elf(ARM64))];
        assert_eq!(machine(&run(&program("/app"), &fs).0), Some(("/opt/app", "arm64")));
    }

    #[test]
    fn dot_dot_after_a_symlinked_directory_goes_up_from_its_target() {
        // /a/link -> /x/y ; /a/link/../f is /x/f, not /a/f.
        let fs = [("/a", Node::Dir), ("/a/link", Node::Symlink("/x/y".into())), ("/x", Node::Dir), ("/x/y", Node::Dir), ("/x/f", elf(ARM64)), ("/a/f", elf(AMD64))];
        assert_eq!(machine(&run(&program("/a/link/../f"), &fs).0), Some(("/x/f", "arm64")));
    }

    #[test]
    fn symlink_loops_and_long_chains_stop_at_the_bound() {
        let fs = [("/a", Node::Symlink("/b".into())), ("/b", Node::Symlink("/a".into()))];
        assert_eq!(run(&program("/a"), &fs).0, Step::Undetermined(Undetermined::OverBound(Bound::SymlinkHops)));
        let mut chain: Vec<(String, Node)> = (0..9).map(|i| (format!("/l{i}"), Node::Symlink(format!("/l{}", i + 1)))).collect();
        chain.push(("/l9".into(), elf(AMD64)));
        let fs: Vec<(&str, Node)> = chain.iter().map(|(p, n)| (p.as_str(), n.clone())).collect();
        assert_eq!(run(&program("/l0"), &fs).0, Step::Undetermined(Undetermined::OverBound(Bound::SymlinkHops)), "9 hops > 8");
        assert_eq!(machine(&run(&program("/l1"), &fs).0), Some(("/l9", "amd64")), "8 hops are allowed");
    }

    #[test]
    fn hard_links_read_their_target_in_their_own_layer() {
        let mut answers = facts(&[("/bin", Node::Dir)]);
        answers.insert(Lookup::merged("/bin/sh"), Answer { node: Node::Hardlink("/bin/busybox".into()), layer: 3 });
        let want = Lookup { path: "/bin/busybox".into(), layer: Some(3) };
        assert_eq!(resolve(&program("/bin/sh"), &answers, 8), Step::Need(vec![want.clone()]));
        answers.insert(want, Answer { node: elf(ARM64), layer: 3 });
        assert_eq!(machine(&resolve(&program("/bin/sh"), &answers, 8)), Some(("/bin/sh", "arm64")));
    }

    #[test]
    fn scripts_follow_their_interpreter_once() {
        let script = |i: &str| Node::File { head: format!("#!{i}\nexec app\n").into_bytes(), mode: 0o755 };
        let fs = [("/run.sh", script("/bin/sh")), ("/bin", Node::Dir), ("/bin/sh", elf(ARM64))];
        match run(&program("/run.sh"), &fs).0 {
            Step::Machine { path, arch, script } => assert_eq!((path.as_str(), arch, script.as_deref()), ("/bin/sh", "arm64", Some("/run.sh"))),
            other => panic!("{other:?}"),
        }
        let fs = [("/run.sh", script("/bin/wrapper")), ("/bin", Node::Dir), ("/bin/wrapper", script("/bin/sh")), ("/bin/sh", elf(ARM64))];
        assert!(matches!(run(&program("/run.sh"), &fs).0, Step::Undetermined(Undetermined::InterpreterIsScript { .. })));
        let fs = [("/run.sh", script("/bin/missing"))];
        assert!(matches!(run(&program("/run.sh"), &fs).0, Step::Undetermined(Undetermined::NotFound { .. })));
        let fs = [("/data", Node::File { head: b"hello".to_vec(), mode: 0o755 })];
        assert!(matches!(run(&program("/data"), &fs).0, Step::Undetermined(Undetermined::NotElfOrScript { .. })));
    }

    #[test]
    fn files_used_as_directories_and_directories_as_programs_are_not_found() {
        let fs = [("/app", elf(AMD64)), ("/dir", Node::Dir)];
        assert!(matches!(run(&program("/app/x"), &fs).0, Step::Undetermined(Undetermined::NotFound { .. })));
        assert!(matches!(run(&program("/dir"), &fs).0, Step::Undetermined(Undetermined::NotFound { .. })));
        assert_eq!(run(&program(""), &fs).0, Step::Undetermined(Undetermined::NoEntrypoint));
    }
}
