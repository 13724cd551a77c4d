//! One layer read as a stream: its compressed bytes counted, bounded and hashed, decompressed
//! (gzip or none), and its tar entries matched against the paths wanted, keeping only the first
//! `HEAD_BYTES` of a wanted file.
//!
//! Layers are read from the top down. A wanted path is settled by the topmost layer that has it
//! or hides it: an entry at the path, a whiteout `.wh.<name>` of it or of a directory above it,
//! an entry that is not a directory above it, or an opaque marker `.wh..wh..opq` in a directory
//! above it (which hides the layers below, not its own). What a layer says is applied when the
//! layer ends, since a tar lists a layer's entries in any order.
//!
//! `tar`'s raw mode is used, with the GNU long-name and PAX records applied here: the crate reads
//! such a record whole into memory, so its size is checked first.

use std::cell::Cell;
use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read};
use std::rc::Rc;
use std::time::Instant;

use sha2::{Digest, Sha256, Sha512};

use super::elf::HEAD_BYTES;
use super::resolve::{Answer, Answers, Lookup, Node};
use super::{Bound, Undetermined};
use crate::client::ReadAllowance;

/// The largest GNU long-name or PAX record read.
const MAX_EXTENSION_BYTES: u64 = 64 * 1024;
const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// The paths one pass over the layers looks for, and what each layer has said of them so far.
#[derive(Debug, Default)]
pub(crate) struct Wanted {
    merged: Vec<Want>,
    /// path -> its want.
    exact: HashMap<String, usize>,
    /// A directory above some wanted path (`/` included) -> those wants.
    ancestors: HashMap<String, Vec<usize>>,
    /// layer -> (path -> what that layer has there): hard links' targets.
    in_layer: HashMap<usize, HashMap<String, Option<Node>>>,
}

#[derive(Debug)]
struct Want {
    path: String,
    settled: Option<Answer>,
    /// What the current layer says: the entry at the path (the last one, as tar extracts),
    hit: Option<Node>,
    /// something under the path (which makes it a directory, listed or not: parent directories
    /// need no entry of their own),
    implied_dir: bool,
    /// a whiteout of the path,
    whiteout: bool,
    /// a whiteout of, or a non-directory at, a directory above it,
    hidden: bool,
    /// an opaque marker in a directory above it.
    opaque: bool,
}

impl Wanted {
    pub(crate) fn new(lookups: Vec<Lookup>) -> Self {
        let mut w = Wanted::default();
        for l in lookups {
            match l.layer {
                Some(layer) => {
                    w.in_layer.entry(layer).or_default().insert(l.path, None);
                }
                None if w.exact.contains_key(&l.path) => {}
                None => {
                    let i = w.merged.len();
                    let mut dir = l.path.as_str();
                    while let Some((parent, _)) = dir.rsplit_once('/') {
                        let parent = if parent.is_empty() { "/" } else { parent };
                        w.ancestors.entry(parent.to_string()).or_default().push(i);
                        if parent == "/" {
                            break;
                        }
                        dir = parent;
                    }
                    w.exact.insert(l.path.clone(), i);
                    w.merged.push(Want { path: l.path, settled: None, hit: None, implied_dir: false, whiteout: false, hidden: false, opaque: false });
                }
            }
        }
        w
    }

    /// Is anything left to learn from layer `layer` or those below it?
    pub(crate) fn wants_layer(&self, layer: usize) -> bool {
        self.merged.iter().any(|w| w.settled.is_none()) || self.in_layer.keys().any(|l| *l <= layer)
    }

    fn wants_head(&self, layer: usize, path: &str) -> bool {
        self.exact.get(path).is_some_and(|i| self.merged.get(*i).is_some_and(|w| w.settled.is_none())) || self.in_layer.get(&layer).is_some_and(|m| m.contains_key(path))
    }

    fn entry(&mut self, layer: usize, path: &str, node: Node) {
        let is_dir = node == Node::Dir;
        if let Some(slot) = self.in_layer.get_mut(&layer).and_then(|m| m.get_mut(path)) {
            *slot = Some(node.clone());
        }
        if !is_dir {
            self.mark_below(path, |w| w.hidden = true);
        }
        if let Some(w) = self.exact.get(path).and_then(|i| self.merged.get_mut(*i)).filter(|w| w.settled.is_none()) {
            w.hit = Some(node);
        }
    }

    /// Every directory above `path` (an entry's name, whiteouts included) is one in this layer.
    fn implied_dirs(&mut self, path: &str) {
        let mut dir = path;
        while let Some((parent, _)) = dir.rsplit_once('/') {
            if parent.is_empty() {
                break;
            }
            if let Some(w) = self.exact.get(parent).and_then(|i| self.merged.get_mut(*i)) {
                w.implied_dir = true;
            }
            dir = parent;
        }
    }

    fn whiteout(&mut self, path: &str) {
        self.mark_below(path, |w| w.hidden = true);
        if let Some(w) = self.exact.get(path).and_then(|i| self.merged.get_mut(*i)) {
            w.whiteout = true;
        }
    }

    fn opaque(&mut self, dir: &str) {
        self.mark_below(dir, |w| w.opaque = true);
    }

    fn mark_below(&mut self, dir: &str, mark: impl Fn(&mut Want)) {
        if let Some(wants) = self.ancestors.get(dir) {
            for i in wants {
                if let Some(w) = self.merged.get_mut(*i) {
                    mark(w);
                }
            }
        }
    }

    /// Apply what layer `layer` said.
    fn end_layer(&mut self, layer: usize) {
        for w in self.merged.iter_mut().filter(|w| w.settled.is_none()) {
            let node = match w.hit.take() {
                Some(node) => Some(node),
                None if w.implied_dir => Some(Node::Dir),
                None if w.whiteout || w.hidden || w.opaque => Some(Node::Absent),
                None => None,
            };
            if let Some(node) = node {
                w.settled = Some(Answer { node, layer });
            }
            (w.implied_dir, w.whiteout, w.hidden, w.opaque) = (false, false, false, false);
        }
    }

    /// Everything learnt; what no layer had is absent. Hard-link targets are answered only for
    /// the layers read.
    pub(crate) fn finish(self, answers: &mut Answers, lowest_read: usize) {
        for w in self.merged {
            let answer = w.settled.unwrap_or(Answer { node: Node::Absent, layer: 0 });
            answers.insert(Lookup { path: w.path, layer: None }, answer);
        }
        for (layer, paths) in self.in_layer.into_iter().filter(|(l, _)| *l >= lowest_read) {
            for (path, node) in paths {
                answers.insert(Lookup { path, layer: Some(layer) }, Answer { node: node.unwrap_or(Node::Absent), layer });
            }
        }
    }
}

/// Why a read stopped early: set by the readers below the decompressor and the tar parser,
/// which can only return an `io::Error`.
type StopFlag = Rc<Cell<Option<Halt>>>;

#[derive(Debug)]
enum Halt {
    Bound(Bound),
    /// The blob ran past its descriptor's size.
    Oversize,
}

/// What one layer's read is allowed.
#[derive(Debug, Clone)]
pub(crate) struct LayerBudget {
    /// Compressed size and digest from the manifest.
    pub size: u64,
    pub digest: String,
    pub allowance: ReadAllowance,
    pub uncompressed_left: u64,
    pub entries_left: u64,
    pub deadline: Instant,
}

/// How a layer's read ended.
#[derive(Debug)]
pub(crate) enum LayerEnd {
    /// Read to its end and matched its digest; `uncompressed` and `entries` were used.
    Read { uncompressed: u64, entries: u64 },
    Stopped(Undetermined),
    /// The bytes did not hash to the descriptor's digest, or ran past its size.
    DigestMismatch { actual: String },
}

/// Read one layer from `blob` (its compressed bytes), telling `wanted` what it holds.
pub(crate) fn scan_layer(blob: impl Read, layer: usize, budget: &LayerBudget, wanted: &mut Wanted) -> LayerEnd {
    let stop: StopFlag = Rc::default();
    let hasher = match Hasher::for_digest(&budget.digest) {
        Some(h) => h,
        None => return LayerEnd::Stopped(Undetermined::Unsupported(format!("layer digest {:?}", budget.digest))),
    };
    let source = Source { inner: blob, hasher, expected: budget.digest.clone(), read: 0, size: budget.size, allowance: budget.allowance.clone(), deadline: budget.deadline, stop: stop.clone() };
    let mut buffered = BufReader::new(source);
    // The compression is told by its magic bytes (media types are often generic or wrong).
    let magic: Vec<u8> = match buffered.fill_buf() {
        Ok(b) => b.iter().take(4).copied().collect(),
        Err(e) => return stopped(&stop, &e),
    };
    let decoder = if magic.starts_with(&[0x1f, 0x8b]) {
        Decoder::Gzip(flate2::bufread::MultiGzDecoder::new(buffered))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return LayerEnd::Stopped(Undetermined::Unsupported("a zstd-compressed layer".into()));
    } else {
        Decoder::Plain(buffered)
    };
    let counted = Counted { inner: decoder, read: 0, max: budget.uncompressed_left, stop: stop.clone() };
    let mut archive = tar::Archive::new(counted);
    let entries = match walk_entries(&mut archive, layer, budget, wanted, &stop) {
        Ok(n) => n,
        Err(end) => return end,
    };
    wanted.end_layer(layer);
    // The rest of the blob (the tar's padding, the compressor's trailer) is hashed, not inflated.
    let counted = archive.into_inner();
    let uncompressed = counted.read;
    let mut source = counted.inner.into_source();
    if let Err(e) = io::copy(&mut source, &mut io::sink()) {
        return stopped(&stop, &e);
    }
    match source.finish() {
        Ok(()) => LayerEnd::Read { uncompressed, entries },
        Err(actual) => LayerEnd::DigestMismatch { actual },
    }
}

fn stopped(stop: &StopFlag, e: &io::Error) -> LayerEnd {
    match stop.take() {
        Some(Halt::Oversize) => LayerEnd::DigestMismatch { actual: "a blob longer than its descriptor's size".into() },
        Some(Halt::Bound(b)) => LayerEnd::Stopped(Undetermined::OverBound(b)),
        None => LayerEnd::Stopped(Undetermined::UnreadableLayer(e.to_string())),
    }
}

fn walk_entries<R: Read>(archive: &mut tar::Archive<R>, layer: usize, budget: &LayerBudget, wanted: &mut Wanted, stop: &StopFlag) -> Result<u64, LayerEnd> {
    let fail = |e: io::Error| stopped(stop, &e);
    let mut count = 0u64;
    let mut long_path: Option<Vec<u8>> = None;
    let mut long_link: Option<Vec<u8>> = None;
    let mut pax_size: Option<u64> = None;
    for entry in archive.entries().map_err(fail)?.raw(true) {
        let mut entry = entry.map_err(fail)?;
        count += 1;
        if count > budget.entries_left {
            return Err(LayerEnd::Stopped(Undetermined::OverBound(Bound::Entries)));
        }
        if Instant::now() >= budget.deadline {
            return Err(LayerEnd::Stopped(Undetermined::OverBound(Bound::Deadline)));
        }
        let kind = entry.header().entry_type();
        let size = entry.header().entry_size().map_err(fail)?;
        if kind.is_gnu_longname() || kind.is_gnu_longlink() || kind.is_pax_local_extensions() || kind.is_pax_global_extensions() {
            if size > MAX_EXTENSION_BYTES {
                return Err(LayerEnd::Stopped(Undetermined::Unsupported(format!("a tar extension record of {size} bytes (at most {MAX_EXTENSION_BYTES} are read)"))));
            }
            let mut data = Vec::new();
            entry.read_to_end(&mut data).map_err(fail)?;
            if kind.is_gnu_longname() {
                long_path = Some(trim_nul(data));
            } else if kind.is_gnu_longlink() {
                long_link = Some(trim_nul(data));
            } else if kind.is_pax_local_extensions() {
                for ext in tar::PaxExtensions::new(&data) {
                    let ext = ext.map_err(fail)?;
                    match ext.key() {
                        Ok("path") => long_path = Some(ext.value_bytes().to_vec()),
                        Ok("linkpath") => long_link = Some(ext.value_bytes().to_vec()),
                        Ok("size") => pax_size = ext.value().ok().and_then(|v| v.parse().ok()),
                        _ => {}
                    }
                }
            }
            continue;
        }
        let path_bytes = long_path.take().unwrap_or_else(|| entry.header().path_bytes().into_owned());
        let link_bytes = long_link.take().or_else(|| entry.header().link_name_bytes().map(|l| l.into_owned()));
        if pax_size.take().is_some_and(|s| s != size) {
            // Raw mode skips by the header's size; a PAX size that differs would desynchronise it.
            return Err(LayerEnd::Stopped(Undetermined::Unsupported("a PAX size record unlike its header's size".into())));
        }
        let Some(path) = normalise(&path_bytes) else { continue };
        wanted.implied_dirs(&path);
        let Some((parent, name)) = path.rsplit_once('/') else { continue };
        let parent = if parent.is_empty() { "/" } else { parent };
        if name == OPAQUE {
            wanted.opaque(parent);
            continue;
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            let target = if parent == "/" { format!("/{hidden}") } else { format!("{parent}/{hidden}") };
            wanted.whiteout(&target);
            continue;
        }
        let node = match kind {
            tar::EntryType::Directory => Node::Dir,
            tar::EntryType::Regular | tar::EntryType::Continuous if path_bytes.ends_with(b"/") => Node::Dir,
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let mode = entry.header().mode().unwrap_or(0);
                let mut head = Vec::new();
                if wanted.wants_head(layer, &path) {
                    (&mut entry).take(HEAD_BYTES as u64).read_to_end(&mut head).map_err(fail)?;
                }
                Node::File { head, mode }
            }
            tar::EntryType::Symlink => match link_bytes.map(String::from_utf8) {
                Some(Ok(target)) => Node::Symlink(target),
                _ => Node::Other,
            },
            tar::EntryType::Link => match link_bytes.as_deref().and_then(normalise) {
                Some(target) => Node::Hardlink(target),
                None => Node::Other,
            },
            _ => Node::Other,
        };
        wanted.entry(layer, &path, node);
    }
    Ok(count)
}

fn trim_nul(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

/// A tar entry's name as an absolute path: `./usr/bin/`, `usr/bin` and `/usr/bin` are all
/// `/usr/bin`. None for the root, for a name that is not UTF-8 (no wanted path, which comes from
/// JSON, can equal or lie under it) or that climbs with `..`.
fn normalise(name: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(name).ok()?;
    let mut out = String::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            p => {
                out.push('/');
                out.push_str(p);
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

enum Hasher {
    Sha256(Sha256),
    Sha512(Sha512),
}

impl Hasher {
    fn for_digest(digest: &str) -> Option<Self> {
        match digest.split_once(':')?.0 {
            "sha256" => Some(Hasher::Sha256(Sha256::new())),
            "sha512" => Some(Hasher::Sha512(Sha512::new())),
            _ => None,
        }
    }

    fn update(&mut self, b: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(b),
            Hasher::Sha512(h) => h.update(b),
        }
    }

    fn finish(self) -> String {
        match self {
            Hasher::Sha256(h) => format!("sha256:{}", hex::encode(h.finalize())),
            Hasher::Sha512(h) => format!("sha512:{}", hex::encode(h.finalize())),
        }
    }
}

/// The compressed bytes: at most the descriptor's size, each drawn from the check's byte
/// allowance, hashed, and none after the deadline.
struct Source<R> {
    inner: R,
    hasher: Hasher,
    expected: String,
    read: u64,
    size: u64,
    allowance: ReadAllowance,
    deadline: Instant,
    stop: StopFlag,
}

impl<R: Read> Source<R> {
    fn halt(&self, why: Halt) -> io::Error {
        let msg = format!("layer read stopped: {why:?}");
        self.stop.set(Some(why));
        io::Error::other(msg)
    }

    /// Ok when the blob had exactly its descriptor's size and digest; else what it had.
    fn finish(self) -> Result<(), String> {
        let actual = self.hasher.finish();
        if self.read != self.size {
            return Err(format!("{actual} ({} bytes, not the descriptor's {})", self.read, self.size));
        }
        if actual != self.expected {
            return Err(actual);
        }
        Ok(())
    }
}

impl<R: Read> Read for Source<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if Instant::now() >= self.deadline {
            return Err(self.halt(Halt::Bound(Bound::Deadline)));
        }
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.size {
            return Err(self.halt(Halt::Oversize));
        }
        if !self.allowance.take(n) {
            return Err(self.halt(Halt::Bound(Bound::TotalBytes)));
        }
        self.hasher.update(buf.get(..n).unwrap_or_default());
        Ok(n)
    }
}

enum Decoder<R: BufRead> {
    Plain(R),
    Gzip(flate2::bufread::MultiGzDecoder<R>),
}

impl<R: BufRead> Decoder<R> {
    fn into_inner(self) -> R {
        match self {
            Decoder::Plain(r) => r,
            Decoder::Gzip(d) => d.into_inner(),
        }
    }
}

impl<S: Read> Decoder<BufReader<S>> {
    /// The compressed source (whatever the buffer held was hashed when it was read).
    fn into_source(self) -> S {
        self.into_inner().into_inner()
    }
}

impl<R: BufRead> Read for Decoder<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Decoder::Plain(r) => r.read(buf),
            Decoder::Gzip(d) => d.read(buf),
        }
    }
}

/// The uncompressed bytes, at most `max`.
struct Counted<R> {
    inner: R,
    read: u64,
    max: u64,
    stop: StopFlag,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.max {
            self.stop.set(Some(Halt::Bound(Bound::UncompressedBytes)));
            return Err(io::Error::other("over the uncompressed-bytes bound"));
        }
        Ok(n)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Write;
    use std::time::Duration;

    use super::super::elf::tests::elf_header;
    use super::*;

    /// One tar entry of a test layer.
    pub(crate) enum E<'a> {
        File(&'a str, Vec<u8>),
        Dir(&'a str),
        Symlink(&'a str, &'a str),
        Hardlink(&'a str, &'a str),
    }

    pub(crate) fn tar_of(entries: &[E]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for e in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o755);
            match e {
                E::File(path, data) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(data.len() as u64);
                    b.append_data(&mut h, path, data.as_slice()).expect("file");
                }
                E::Dir(path) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    b.append_data(&mut h, path, io::empty()).expect("dir");
                }
                E::Symlink(path, target) | E::Hardlink(path, target) => {
                    h.set_entry_type(if matches!(e, E::Symlink(..)) { tar::EntryType::Symlink } else { tar::EntryType::Link });
                    h.set_size(0);
                    b.append_link(&mut h, path, target).expect("link");
                }
            }
        }
        b.into_inner().expect("tar")
    }

    pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(bytes).expect("gzip");
        e.finish().expect("gzip")
    }

    fn budget(blob: &[u8]) -> LayerBudget {
        LayerBudget { size: blob.len() as u64, digest: format!("sha256:{}", hex::encode(Sha256::digest(blob))), allowance: ReadAllowance::new(1 << 30), uncompressed_left: 1 << 30, entries_left: 1 << 20, deadline: Instant::now() + Duration::from_secs(60) }
    }

    /// Scan `layers` (bottom first) from the top for `paths`, as one pass does; the layers read.
    fn pass(layers: &[Vec<u8>], lookups: Vec<Lookup>) -> (Answers, Vec<usize>) {
        let mut wanted = Wanted::new(lookups);
        let mut read = Vec::new();
        let mut lowest = layers.len();
        for (i, blob) in layers.iter().enumerate().rev() {
            if !wanted.wants_layer(i) {
                break;
            }
            match scan_layer(blob.as_slice(), i, &budget(blob), &mut wanted) {
                LayerEnd::Read { .. } => {}
                other => panic!("layer {i}: {other:?}"),
            }
            read.push(i);
            lowest = i;
        }
        let mut answers = Answers::new();
        wanted.finish(&mut answers, lowest);
        (answers, read)
    }

    fn merged(paths: &[&str]) -> Vec<Lookup> {
        paths.iter().map(|p| Lookup::merged(p)).collect()
    }

    fn node<'a>(a: &'a Answers, path: &str) -> &'a Node {
        &a.get(&Lookup::merged(path)).expect("answered").node
    }

    fn arm64() -> Vec<u8> {
        let mut b = elf_header(2, 1, 2, 183);
        b.extend_from_slice(&[0xaa; 1000]);
        b
    }

    fn amd64() -> Vec<u8> {
        elf_header(2, 1, 2, 62)
    }

    #[test]
    fn the_topmost_layer_wins_and_lower_layers_are_not_read() {
        let layers = [gzip(&tar_of(&[E::Dir("usr/"), E::File("usr/app", amd64()), E::Dir("var/")])), gzip(&tar_of(&[E::File("./usr/app", arm64())])), tar_of(&[E::File("etc/other", b"x".to_vec())])];
        let (a, read) = pass(&layers, merged(&["/var", "/usr/app"]));
        assert_eq!(read, [2, 1, 0], "/var is settled only by the bottom layer");
        assert_eq!(a[&Lookup::merged("/var")], Answer { node: Node::Dir, layer: 0 });
        match node(&a, "/usr/app") {
            Node::File { head, mode } => {
                assert_eq!(head.len(), HEAD_BYTES, "only the head of a wanted file is kept");
                assert_eq!(&head[..20], &arm64()[..20]);
                assert_eq!(*mode, 0o755);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(a[&Lookup::merged("/usr/app")].layer, 1);
        let (_, read) = pass(&layers, merged(&["/usr/app"]));
        assert_eq!(read, [2, 1], "the layer below the one that settles it is not read");
    }

    #[test]
    fn whiteouts_and_opaque_directories_hide_what_is_below() {
        let bottom = gzip(&tar_of(&[E::Dir("opt/"), E::File("opt/app", amd64()), E::File("opt/keep", amd64()), E::File("app", amd64())]));
        let (a, _) = pass(&[bottom.clone(), tar_of(&[E::File(".wh.app", vec![])])], merged(&["/app", "/opt/app"]));
        assert_eq!(node(&a, "/app"), &Node::Absent, "a whiteout deletes the file");
        assert!(matches!(node(&a, "/opt/app"), Node::File { .. }), "a whiteout of another name does not");
        let (a, _) = pass(&[bottom.clone(), tar_of(&[E::File(".wh.opt", vec![])])], merged(&["/opt/app"]));
        assert_eq!(node(&a, "/opt/app"), &Node::Absent, "a whiteout of a directory deletes what is in it");
        let (a, _) = pass(&[bottom.clone(), tar_of(&[E::Dir("opt/"), E::File("opt/.wh..wh..opq", vec![]), E::File("opt/keep", arm64())])], merged(&["/opt/app", "/opt/keep"]));
        assert_eq!(node(&a, "/opt/app"), &Node::Absent, "an opaque directory hides the layers below");
        assert!(matches!(node(&a, "/opt/keep"), Node::File { head, .. } if head[18] == 183), "but not its own layer");
        let (a, _) = pass(&[bottom, tar_of(&[E::Symlink("opt", "/srv")])], merged(&["/opt", "/opt/app"]));
        assert_eq!(node(&a, "/opt"), &Node::Symlink("/srv".into()));
        assert_eq!(node(&a, "/opt/app"), &Node::Absent, "a directory replaced by a link hides its old contents");
    }

    #[test]
    fn directories_need_no_entry_of_their_own() {
        // Only the file is listed; its parents exist all the same, in that layer.
        let layers = [tar_of(&[E::Symlink("usr", "/elsewhere")]), tar_of(&[E::File("usr/local/bin/app", arm64())])];
        let (a, read) = pass(&layers, merged(&["/usr", "/usr/local", "/usr/local/bin", "/usr/local/bin/app"]));
        assert_eq!(read, [1], "the upper layer settles all four");
        assert_eq!(node(&a, "/usr"), &Node::Dir, "the lower layer's link is hidden");
        assert_eq!(node(&a, "/usr/local"), &Node::Dir);
        assert_eq!(node(&a, "/usr/local/bin"), &Node::Dir);
        assert!(matches!(node(&a, "/usr/local/bin/app"), Node::File { .. }));
        // A whiteout, or an opaque marker, is something under its directory too.
        let (a, _) = pass(&[tar_of(&[E::File("opt/x", vec![])]), tar_of(&[E::File("opt/.wh.x", vec![]), E::File("srv/.wh..wh..opq", vec![])])], merged(&["/opt", "/srv"]));
        assert_eq!((node(&a, "/opt"), node(&a, "/srv")), (&Node::Dir, &Node::Dir));
    }

    #[test]
    fn hard_links_are_answered_in_their_own_layer() {
        let layer = tar_of(&[E::Dir("bin/"), E::File("bin/busybox", arm64()), E::Hardlink("bin/sh", "bin/busybox")]);
        let (a, _) = pass(std::slice::from_ref(&layer), merged(&["/bin/sh"]));
        assert_eq!(node(&a, "/bin/sh"), &Node::Hardlink("/bin/busybox".into()));
        let (a, _) = pass(&[layer.clone(), tar_of(&[E::File("unrelated", vec![])])], vec![Lookup { path: "/bin/busybox".into(), layer: Some(0) }]);
        assert!(matches!(&a[&Lookup { path: "/bin/busybox".into(), layer: Some(0) }].node, Node::File { head, .. } if head[18] == 183));
    }

    #[test]
    fn long_names_from_gnu_and_pax_records_are_applied() {
        let long = format!("opt/{}/app", "d".repeat(150));
        let gnu = tar_of(&[E::File(&long, arm64())]);
        let (a, _) = pass(&[gnu], merged(&[&format!("/{long}")]));
        assert!(matches!(node(&a, &format!("/{long}")), Node::File { .. }), "GNU long name");

        let mut b = tar::Builder::new(Vec::new());
        b.append_pax_extensions([("path", format!("/{long}").as_bytes())]).expect("pax");
        let mut h = tar::Header::new_ustar();
        h.set_path("truncated").expect("path");
        h.set_size(64);
        h.set_mode(0o755);
        h.set_cksum();
        b.append(&h, amd64().as_slice()).expect("entry");
        let pax = b.into_inner().expect("tar");
        let (a, _) = pass(&[pax], merged(&[&format!("/{long}"), "/truncated"]));
        assert!(matches!(node(&a, &format!("/{long}")), Node::File { .. }), "PAX path");
        assert_eq!(node(&a, "/truncated"), &Node::Absent, "the header's own name is replaced");
    }

    #[test]
    fn an_oversized_extension_record_is_not_read() {
        let mut b = tar::Builder::new(Vec::new());
        let big = "x".repeat(100 * 1024);
        b.append_pax_extensions([("comment", big.as_bytes())]).expect("pax");
        let blob = b.into_inner().expect("tar");
        let mut wanted = Wanted::new(merged(&["/app"]));
        assert!(matches!(scan_layer(blob.as_slice(), 0, &budget(&blob), &mut wanted), LayerEnd::Stopped(Undetermined::Unsupported(m)) if m.contains("extension record")));
    }

    #[test]
    fn every_bound_stops_the_read() {
        let zeros = gzip(&tar_of(&[E::File("big", vec![0; 4 << 20]), E::File("app", arm64())]));
        assert!(zeros.len() < 64 * 1024, "a small blob that inflates to 4 MiB");
        let scan = |blob: &[u8], b: LayerBudget| scan_layer(blob, 0, &b, &mut Wanted::new(merged(&["/app"])));
        let over = |end: LayerEnd| match end {
            LayerEnd::Stopped(Undetermined::OverBound(b)) => b,
            other => panic!("{other:?}"),
        };
        assert_eq!(over(scan(&zeros, LayerBudget { uncompressed_left: 1 << 20, ..budget(&zeros) })), Bound::UncompressedBytes);
        let many = tar_of(&(0..10).map(|_| E::Dir("d/")).collect::<Vec<_>>());
        assert_eq!(over(scan(&many, LayerBudget { entries_left: 5, ..budget(&many) })), Bound::Entries);
        assert_eq!(over(scan(&zeros, LayerBudget { allowance: ReadAllowance::new(zeros.len() / 2), ..budget(&zeros) })), Bound::TotalBytes);
        assert_eq!(over(scan(&zeros, LayerBudget { deadline: Instant::now(), ..budget(&zeros) })), Bound::Deadline);
        assert!(matches!(scan(&zeros, budget(&zeros)), LayerEnd::Read { uncompressed, entries: 2 } if uncompressed > 4 << 20));
    }

    #[test]
    fn a_blob_unlike_its_descriptor_is_a_digest_mismatch() {
        let blob = gzip(&tar_of(&[E::File("app", arm64())]));
        let scan = |b: LayerBudget| scan_layer(blob.as_slice(), 0, &b, &mut Wanted::new(merged(&["/app"])));
        let other = format!("sha256:{}", "0".repeat(64));
        assert!(matches!(scan(LayerBudget { digest: other, ..budget(&blob) }), LayerEnd::DigestMismatch { .. }));
        assert!(matches!(scan(LayerBudget { size: blob.len() as u64 - 10, ..budget(&blob) }), LayerEnd::DigestMismatch { .. }), "longer than its descriptor");
        assert!(matches!(scan(LayerBudget { size: blob.len() as u64 + 10, ..budget(&blob) }), LayerEnd::DigestMismatch { .. }), "shorter than its descriptor");
    }

    #[test]
    fn zstd_and_garbage_layers_are_not_guessed_at() {
        let zstd = [0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0];
        assert!(matches!(scan_layer(zstd.as_slice(), 0, &budget(&zstd), &mut Wanted::new(vec![])), LayerEnd::Stopped(Undetermined::Unsupported(_))));
        let garbage = vec![7u8; 1024];
        assert!(matches!(scan_layer(garbage.as_slice(), 0, &budget(&garbage), &mut Wanted::new(vec![])), LayerEnd::Stopped(Undetermined::UnreadableLayer(_))));
    }

    #[test]
    fn tar_names_normalise_to_absolute_paths() {
        assert_eq!(normalise(b"./usr/bin/"), Some("/usr/bin".into()));
        assert_eq!(normalise(b"usr//bin/./x"), Some("/usr/bin/x".into()));
        assert_eq!(normalise(b"/etc"), Some("/etc".into()));
        assert_eq!(normalise(b"./"), None);
        assert_eq!(normalise(b"../etc/passwd"), None);
        assert_eq!(normalise(b"a/\xff"), None);
    }
}
