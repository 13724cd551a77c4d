//! A running server picks up a rotated certificate, including the symlink swap a Kubernetes
//! Secret volume does, and keeps the old one when the new files are unusable.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing, reason = "test code: a failed expectation is a panic by design")]

mod common;

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use common::*;

/// A certificate generation valid for `days` (generations differ in their notAfter, so the
/// expiry gauge is seen to follow a reload).
fn write_generation(root: &Path, name: &str, days: u32) -> Vec<u8> {
    let gen = root.join(name);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_archer"))
        .args(["certs", "--dns", "localhost", "--ip", "127.0.0.1", "--days", &days.to_string(), "--out"])
        .arg(&gen)
        .output()
        .expect("archer certs");
    assert!(out.status.success(), "archer certs: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::read(gen.join("tls.crt")).expect("cert")
}

/// Point `..data` at a generation atomically, as the kubelet does.
fn swap_data(root: &Path, name: &str) {
    let tmp = root.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(name, &tmp).expect("symlink");
    std::fs::rename(&tmp, root.join("..data")).expect("rename");
}

/// The certificate a fresh connection is shown (a new client each time: no pooled connection,
/// no TLS session resumption that would replay the old certificate).
async fn served_cert(roots: &[std::path::PathBuf], url: &str) -> Vec<u8> {
    let mut builder = reqwest::Client::builder().tls_info(true);
    for r in roots {
        builder = builder.add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(r).expect("ca")).expect("pem"));
    }
    let client = builder.build().expect("client");
    let resp = client.get(format!("{url}/healthz")).send().await.expect("request");
    let info = resp.extensions().get::<reqwest::tls::TlsInfo>().expect("tls info");
    info.peer_certificate().expect("peer certificate").to_vec()
}

/// A certificate's notAfter, Unix seconds.
fn not_after(pem: &[u8]) -> f64 {
    let der = der_of(pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("x509");
    cert.validity().not_after.timestamp() as f64
}

fn der_of(pem: &[u8]) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::from_pem_slice(pem).expect("pem").to_vec()
}

#[tokio::test]
async fn rotated_certificate_is_served_without_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let secret = dir.path().join("secret");
    std::fs::create_dir_all(&secret).expect("dir");
    let first = write_generation(&secret, "..2026_11_22_v1", 365);
    swap_data(&secret, "..2026_11_22_v1");
    symlink("..data/tls.crt", secret.join("tls.crt")).expect("link");
    symlink("..data/tls.key", secret.join("tls.key")).expect("link");
    symlink("..data/ca.crt", secret.join("ca.crt")).expect("link");
    let second = write_generation(&secret, "..2026_11_23_v2", 730);

    let archer = Archer::start_with_certs(dir, secret.clone(), "tlsReloadIntervalSeconds: 1\n", &[]).await;
    let roots = [secret.join("..2026_11_22_v1/ca.crt"), secret.join("..2026_11_23_v2/ca.crt")];
    assert_eq!(served_cert(&roots, &archer.https).await, der_of(&first));
    // Alerts read when the served certificate expires.
    assert_eq!(archer.metric("archer_tls_certificate_expiration_timestamp_seconds").await, not_after(&first));

    // An unusable new pair (key missing) is refused and the old certificate keeps serving.
    std::fs::create_dir_all(secret.join("..broken")).expect("dir");
    std::fs::write(secret.join("..broken/tls.crt"), &second).expect("write");
    std::fs::write(secret.join("..broken/tls.key"), b"not a key").expect("write");
    swap_data(&secret, "..broken");
    let mut refused = false;
    for _ in 0..100 {
        if archer.metric("archer_tls_certificate_reloads_total{result=\"error\"}").await >= 1.0 {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused, "the broken pair should be reported");
    assert_eq!(served_cert(&roots, &archer.https).await, der_of(&first));

    swap_data(&secret, "..2026_11_23_v2");
    let mut rotated = false;
    for _ in 0..100 {
        if served_cert(&roots, &archer.https).await == der_of(&second) {
            rotated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(rotated, "the new certificate was not picked up; log:\n{}", archer.log_text());
    assert!(archer.metric("archer_tls_certificate_reloads_total{result=\"ok\"}").await >= 1.0);
    assert!(not_after(&second) > not_after(&first) + 86400.0 * 300.0, "the generations differ in their notAfter");
    assert_eq!(archer.metric("archer_tls_certificate_expiration_timestamp_seconds").await, not_after(&second), "the gauge follows the reload");
}

#[tokio::test]
async fn only_tls_12_and_newer_are_offered() {
    let archer = Archer::start("", &[]).await;
    let ca = std::fs::read(archer.certs.join("ca.crt")).expect("ca");
    let old = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).expect("pem"))
        .min_tls_version(reqwest::tls::Version::TLS_1_2)
        .max_tls_version(reqwest::tls::Version::TLS_1_2)
        .build()
        .expect("client");
    assert!(old.get(format!("{}/healthz", archer.https)).send().await.expect("TLS 1.2 works").status().is_success());
    let plain = reqwest::get(format!("{}/healthz", archer.https.replace("https://", "http://"))).await;
    assert!(plain.is_err() || !plain.expect("resp").status().is_success(), "plain HTTP is not served on the TLS port");
}
