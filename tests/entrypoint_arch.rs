//! The entrypoint check against a real registry (Debian's `docker-registry`): images pushed
//! with layers built here (tar, gzip) holding hand-made ELF headers, read back by Archer's
//! registry client to the machine of the program each image runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

mod common;

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use archer::registry::{Bound, EntrypointCheck, EntrypointLimits, Inspector, Keyring, RegistryError, Undetermined};
use common::*;
use serde_json::{json, Value};

const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;

/// A 64-bit little-endian ELF executable's header (the 64 bytes the spec lays out, most of
/// them zero here) and a few bytes of "code".
fn elf(machine: u16) -> Vec<u8> {
    let mut h = vec![0u8; 64];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = 2; // ELFCLASS64
    h[5] = 1; // ELFDATA2LSB
    h[6] = 1; // EV_CURRENT
    h[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    h[18..20].copy_from_slice(&machine.to_le_bytes());
    h[20..24].copy_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&[0x90; 16]);
    h
}

enum E<'a> {
    File(&'a str, Vec<u8>),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
}

fn layer(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o755);
        h.set_size(0);
        match e {
            E::File(path, data) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, data.as_slice()).expect("file");
            }
            E::Dir(path) => {
                h.set_entry_type(tar::EntryType::Directory);
                b.append_data(&mut h, path, std::io::empty()).expect("dir");
            }
            E::Symlink(path, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                b.append_link(&mut h, path, target).expect("symlink");
            }
            E::Hardlink(path, target) => {
                h.set_entry_type(tar::EntryType::Link);
                b.append_link(&mut h, path, target).expect("hard link");
            }
        }
    }
    gzip(&b.into_inner().expect("tar"))
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip")
}

fn config(arch: &str, entrypoint: Option<&[&str]>, cmd: Option<&[&str]>, env: &[&str]) -> Value {
    json!({
        "architecture": arch,
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": []},
        "config": {"Entrypoint": entrypoint, "Cmd": cmd, "Env": env, "WorkingDir": ""}
    })
}

/// An inspector on `reg` (listed insecure) whose registry requests are counted.
fn inspector(reg: &Registry, limits: EntrypointLimits) -> (Inspector, prometheus_client::metrics::counter::Counter) {
    let guard = archer::registry::AddressGuard::new(&[], &[], std::slice::from_ref(&reg.host)).expect("guard");
    let settings = archer::registry::ClientSettings { guard: Arc::new(guard), ..Default::default() };
    let requests = prometheus_client::metrics::counter::Counter::default();
    let client = archer::registry::RegistryClient::new(settings).expect("client").count_requests_in(requests.clone());
    let metrics = Arc::new(archer::metrics::Metrics::new());
    (Inspector::new(client, &archer::registry::CacheSettings::default(), metrics.registry.clone()).with_entrypoint_limits(limits), requests)
}

async fn check(inspector: &Inspector, image: &str, digest: Option<&str>, arch: &str) -> EntrypointCheck {
    inspector.entrypoint_machine(image, digest, arch, &Keyring::default()).await.expect("checked")
}

fn machine(c: &EntrypointCheck) -> (&str, &str) {
    match c {
        EntrypointCheck::Machine { path, arch, .. } => (path.as_str(), arch.as_str()),
        other => panic!("expected a machine, got {other:?}"),
    }
}

fn undetermined(c: &EntrypointCheck) -> &Undetermined {
    match c {
        EntrypointCheck::Undetermined(u) => u,
        other => panic!("expected undetermined, got {other:?}"),
    }
}

#[tokio::test]
async fn a_lying_index_is_caught_and_an_honest_one_confirmed() {
    let reg = Registry::start().await;
    // Listed as linux/amd64, configured as amd64, but its entrypoint is an arm64 binary.
    let lying = reg.push_image_layers("app/lying", "amd64", &config("amd64", Some(&["/app"]), None, &[]), &[layer(&[E::File("app", elf(EM_AARCH64))])], true).await;
    let honest_arm = reg.push_image_layers("app/lying", "arm64", &config("arm64", Some(&["/app"]), None, &[]), &[layer(&[E::File("app", elf(EM_AARCH64))])], true).await;
    let index = reg.push_index_over("app/lying", "1", &[(&lying, "linux/amd64"), (&honest_arm, "linux/arm64")]).await;
    let honest = reg.push_image_layers("app/honest", "1", &config("amd64", Some(&["/app"]), None, &[]), &[layer(&[E::File("app", elf(EM_X86_64))])], false).await;
    let (inspector, _) = inspector(&reg, EntrypointLimits::default());

    let c = check(&inspector, &reg.image("app/lying:1"), Some(&index.digest), "amd64").await;
    assert_eq!(machine(&c), ("/app", "arm64"));
    assert!(c.foreign_to("amd64"), "an arm64 program does not run on amd64");
    assert!(matches!(&c, EntrypointCheck::Machine { digest, .. } if *digest == index.digest));
    let c = check(&inspector, &reg.image("app/lying:1"), None, "arm64").await;
    assert_eq!(machine(&c), ("/app", "arm64"));
    assert!(!c.foreign_to("arm64"));
    assert_eq!(undetermined(&check(&inspector, &reg.image("app/lying:1"), None, "s390x").await), &Undetermined::NoPlatform("s390x".into()));
    // A Docker manifest list with attestation entries: the platform's image is found, and it
    // names no program.
    reg.push_index("app/docker", "1", &["linux/amd64", "linux/arm64"], false, true).await;
    assert_eq!(undetermined(&check(&inspector, &reg.image("app/docker:1"), None, "arm64").await), &Undetermined::NoEntrypoint);

    let c = check(&inspector, &reg.image("app/honest:1"), Some(&honest.digest), "amd64").await;
    assert_eq!(machine(&c), ("/app", "amd64"));
    assert!(!c.foreign_to("amd64"));
    assert_eq!(c.outcome(), "machine");
}

#[tokio::test]
async fn cmd_along_path_symlinks_hard_links_and_scripts_are_followed() {
    let reg = Registry::start().await;
    let (inspector, _) = inspector(&reg, EntrypointLimits::default());
    // A base layer laid out like Debian's since bookworm: /bin -> usr/bin, sh -> dash.
    let base = layer(&[E::Dir("usr/"), E::Dir("usr/bin/"), E::Symlink("bin", "usr/bin"), E::File("usr/bin/dash", elf(EM_AARCH64)), E::Symlink("usr/bin/sh", "dash"), E::Dir("opt/"), E::Dir("opt/bin/")]);

    // Cmd, no entrypoint, found along the image's PATH (the first entry has no such file).
    let pushed = reg.push_image_layers("path/cmd", "1", &config("amd64", None, Some(&["app", "--serve"]), &["HOME=/", "PATH=/opt/bin:/usr/local/bin:/usr/bin"]), &[base.clone(), layer(&[E::File("usr/local/bin/app", elf(EM_AARCH64))])], true).await;
    assert_eq!(machine(&check(&inspector, &reg.image("path/cmd:1"), Some(&pushed.digest), "amd64").await), ("/usr/local/bin/app", "arm64"));

    // A relative symlink in an upper layer to a file in a lower one, reached through /bin -> usr/bin.
    let pushed = reg.push_image_layers("path/link", "1", &config("amd64", Some(&["/bin/app"]), None, &[]), &[base.clone(), layer(&[E::Dir("usr/lib/app/"), E::File("usr/lib/app/app", elf(EM_X86_64))]), layer(&[E::Symlink("usr/bin/app", "../lib/app/app")])], true).await;
    assert_eq!(machine(&check(&inspector, &reg.image("path/link:1"), Some(&pushed.digest), "amd64").await), ("/usr/lib/app/app", "amd64"));

    // A hard link, as busybox's applets are.
    let pushed = reg.push_image_layers("path/hard", "1", &config("amd64", None, Some(&["sh"]), &["PATH=/bin"]), &[layer(&[E::Dir("bin/"), E::File("bin/busybox", elf(EM_AARCH64)), E::Hardlink("bin/sh", "bin/busybox")])], false).await;
    assert_eq!(machine(&check(&inspector, &reg.image("path/hard:1"), Some(&pushed.digest), "amd64").await), ("/bin/sh", "arm64"));

    // A #!/bin/sh script: /bin/sh is read (through both links), not the script.
    let pushed = reg.push_image_layers("path/script", "1", &config("amd64", Some(&["/entrypoint.sh"]), Some(&["run"]), &[]), &[base.clone(), layer(&[E::File("entrypoint.sh", b"#!/bin/sh\nexec \"$@\"\n".to_vec())])], true).await;
    match check(&inspector, &reg.image("path/script:1"), Some(&pushed.digest), "amd64").await {
        EntrypointCheck::Machine { path, arch, script, .. } => assert_eq!((path.as_str(), arch.as_str(), script.as_deref()), ("/usr/bin/dash", "arm64", Some("/entrypoint.sh"))),
        other => panic!("{other:?}"),
    }

    // A script whose interpreter is itself a script: one interpreter is followed, no more.
    let pushed = reg.push_image_layers("path/script2", "1", &config("amd64", Some(&["/run"]), None, &[]), &[base, layer(&[E::File("run", b"#!/usr/local/bin/wrapper\n".to_vec()), E::File("usr/local/bin/wrapper", b"#!/bin/sh\n".to_vec())])], true).await;
    assert!(matches!(undetermined(&check(&inspector, &reg.image("path/script2:1"), Some(&pushed.digest), "amd64").await), Undetermined::InterpreterIsScript { .. }));
}

#[tokio::test]
async fn the_upper_layer_wins_and_a_whiteout_deletes() {
    let reg = Registry::start().await;
    let (inspector, _) = inspector(&reg, EntrypointLimits::default());
    let bottom = layer(&[E::File("app", elf(EM_X86_64))]);
    let pushed = reg.push_image_layers("layers/over", "1", &config("amd64", Some(&["/app"]), None, &[]), &[bottom.clone(), layer(&[E::File("app", elf(EM_AARCH64))])], true).await;
    assert_eq!(machine(&check(&inspector, &reg.image("layers/over:1"), Some(&pushed.digest), "amd64").await), ("/app", "arm64"));
    let pushed = reg.push_image_layers("layers/deleted", "1", &config("amd64", Some(&["/app"]), None, &[]), &[bottom, layer(&[E::File(".wh.app", vec![])])], true).await;
    let c = check(&inspector, &reg.image("layers/deleted:1"), Some(&pushed.digest), "amd64").await;
    assert!(matches!(undetermined(&c), Undetermined::NotFound { path, .. } if path == "/app"), "{c:?}");
    assert_eq!(c.outcome(), "not_found");
    assert!(!c.foreign_to("amd64"), "nothing determined is never evidence");
}

#[tokio::test]
async fn byte_bounds_stop_before_reading_what_they_forbid() {
    let reg = Registry::start().await;
    // 1 MiB that does not compress, under the program's layer.
    let noise: Vec<u8> = (0..1u32 << 18).flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes()).collect();
    let big = layer(&[E::File("noise", noise)]);
    assert!(big.len() > 1 << 20);
    let pushed = reg.push_image_layers("bounds/big", "1", &config("amd64", Some(&["/app"]), None, &[]), &[big, layer(&[E::File("other", vec![1])])], true).await;
    let image = reg.image("bounds/big:1");

    let (small, requests) = inspector(&reg, EntrypointLimits { layer_bytes: 256 * 1024, ..Default::default() });
    let c = check(&small, &image, Some(&pushed.digest), "amd64").await;
    assert_eq!(undetermined(&c), &Undetermined::OverBound(Bound::LayerBytes));
    assert_eq!(c.outcome(), "layer_bytes");
    assert_eq!(requests.get(), 3, "the manifest, the config and the top layer: the big layer is never asked for");

    let (small, _) = inspector(&reg, EntrypointLimits { total_bytes: 512 * 1024, ..Default::default() });
    assert_eq!(undetermined(&check(&small, &image, Some(&pushed.digest), "amd64").await), &Undetermined::OverBound(Bound::TotalBytes));

    // 16 MiB of zeros gzip to a few dozen KiB: the uncompressed bound stops the inflating.
    let bomb = layer(&[E::File("zeros", vec![0; 16 << 20]), E::File("app", elf(EM_AARCH64))]);
    assert!(bomb.len() < 256 * 1024, "{}", bomb.len());
    let pushed = reg.push_image_layers("bounds/bomb", "1", &config("amd64", Some(&["/app"]), None, &[]), &[bomb], true).await;
    let (small, _) = inspector(&reg, EntrypointLimits { uncompressed_bytes: 4 << 20, ..Default::default() });
    assert_eq!(undetermined(&check(&small, &reg.image("bounds/bomb:1"), Some(&pushed.digest), "amd64").await), &Undetermined::OverBound(Bound::UncompressedBytes));
    let (roomy, _) = inspector(&reg, EntrypointLimits::default());
    assert_eq!(machine(&check(&roomy, &reg.image("bounds/bomb:1"), Some(&pushed.digest), "amd64").await), ("/app", "arm64"), "within the bound it is read");

    let many: Vec<String> = (0..50).map(|i| format!("f{i}")).collect();
    let entries: Vec<E> = many.iter().map(|n| E::File(n, vec![])).chain([E::File("app", elf(EM_AARCH64))]).collect();
    let pushed = reg.push_image_layers("bounds/entries", "1", &config("amd64", Some(&["/app"]), None, &[]), &[layer(&entries)], true).await;
    let (small, _) = inspector(&reg, EntrypointLimits { entries: 20, ..Default::default() });
    assert_eq!(undetermined(&check(&small, &reg.image("bounds/entries:1"), Some(&pushed.digest), "amd64").await), &Undetermined::OverBound(Bound::Entries));

    let layers: Vec<Vec<u8>> = (0..5).map(|i| layer(&[E::File(&format!("l{i}"), vec![])])).collect();
    let pushed = reg.push_image_layers("bounds/layers", "1", &config("amd64", Some(&["/app"]), None, &[]), &layers, true).await;
    let (small, _) = inspector(&reg, EntrypointLimits { layers: 4, ..Default::default() });
    assert_eq!(undetermined(&check(&small, &reg.image("bounds/layers:1"), Some(&pushed.digest), "amd64").await), &Undetermined::OverBound(Bound::Layers));

    let chain = layer(&[E::Symlink("a", "b"), E::Symlink("b", "c"), E::Symlink("c", "d"), E::File("d", elf(EM_AARCH64))]);
    let pushed = reg.push_image_layers("bounds/hops", "1", &config("amd64", Some(&["/a"]), None, &[]), &[chain], true).await;
    let (small, _) = inspector(&reg, EntrypointLimits { symlink_hops: 2, ..Default::default() });
    assert_eq!(undetermined(&check(&small, &reg.image("bounds/hops:1"), Some(&pushed.digest), "amd64").await), &Undetermined::OverBound(Bound::SymlinkHops));
    assert_eq!(machine(&check(&roomy, &reg.image("bounds/hops:1"), Some(&pushed.digest), "amd64").await), ("/d", "arm64"));
}

#[tokio::test]
async fn a_registry_that_stops_answering_meets_the_deadline() {
    let reg = Registry::start().await;
    let pushed = reg.push_image_layers("slow/app", "1", &config("amd64", Some(&["/app"]), None, &[]), &[layer(&[E::File("app", elf(EM_AARCH64))])], true).await;
    let (inspector, _) = inspector(&reg, EntrypointLimits { timeout: Duration::from_secs(1), ..Default::default() });
    reg.pause();
    let started = Instant::now();
    let c = check(&inspector, &reg.image("slow/app:1"), Some(&pushed.digest), "amd64").await;
    reg.resume();
    assert_eq!(undetermined(&c), &Undetermined::OverBound(Bound::Deadline));
    assert!(started.elapsed() < Duration::from_secs(3), "answered by the deadline: {:?}", started.elapsed());
    // A deadline is this moment's answer, not kept: the next check reads the image.
    assert_eq!(machine(&check(&inspector, &reg.image("slow/app:1"), Some(&pushed.digest), "amd64").await), ("/app", "arm64"));
}

#[tokio::test]
async fn a_tampered_layer_is_a_digest_mismatch_not_an_answer() {
    let reg = Registry::start().await;
    let noise: Vec<u8> = (0..64u32).flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes()).collect();
    let honest = layer(&[E::File("app", elf(EM_X86_64)), E::File("noise", noise)]);
    let digest = sha256(&honest);
    let pushed = reg.push_image_layers("tamper/app", "1", &config("amd64", Some(&["/app"]), None, &[]), &[honest], true).await;
    // A well-formed layer with an arm64 binary instead, padded to the same size: the registry
    // serves what its storage holds.
    let path = reg.blob_path(&digest);
    let original = std::fs::read(&path).expect("blob");
    let mut forged = layer(&[E::File("app", elf(EM_AARCH64))]);
    assert!(forged.len() <= original.len());
    forged.resize(original.len(), 0);
    std::fs::write(&path, &forged).expect("tamper");
    let (inspector, _) = inspector(&reg, EntrypointLimits::default());
    match inspector.entrypoint_machine(&reg.image("tamper/app:1"), Some(&pushed.digest), "amd64", &Keyring::default()).await {
        Err(RegistryError::DigestMismatch { expected, .. }) => assert_eq!(expected, digest),
        other => panic!("a layer unlike its digest must not answer: {other:?}"),
    }
}

#[tokio::test]
async fn a_private_repository_is_read_with_the_pull_secret() {
    let reg = Registry::start_with_auth("puller", "s3cret-pass").await;
    let pushed = reg.push_image_layers("private/app", "1", &config("amd64", Some(&["/app"]), None, &[]), &[layer(&[E::File("app", elf(EM_AARCH64))])], true).await;
    let (inspector, requests) = inspector(&reg, EntrypointLimits::default());
    let secret = json!({"auths": {reg.host.clone(): {"username": "puller", "password": "s3cret-pass"}}});
    let keyring = Keyring::parse(secret.to_string().as_bytes()).expect("keyring");
    let image = reg.image("private/app:1");
    match inspector.entrypoint_machine(&image, Some(&pushed.digest), "amd64", &Keyring::default()).await {
        Err(RegistryError::Unauthorized { status: 401, .. }) => {}
        other => panic!("without the secret: {other:?}"),
    }
    let c = inspector.entrypoint_machine(&image, Some(&pushed.digest), "amd64", &keyring).await.expect("with the secret");
    assert_eq!(machine(&c), ("/app", "arm64"));
    // What a digest holds never changes: a second check is answered without the registry.
    let before = requests.get();
    let again = inspector.entrypoint_machine(&image, Some(&pushed.digest), "amd64", &keyring).await.expect("again");
    assert_eq!(again, c);
    assert_eq!(requests.get(), before, "kept per digest");
}
