use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use base64::Engine;
use clap::Args;
use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType};

#[derive(Args, Debug)]
pub struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key into.
    #[arg(long)]
    pub out: PathBuf,
    /// A DNS name for the serving certificate (repeatable).
    #[arg(long = "dns", value_name = "NAME")]
    pub dns: Vec<String>,
    /// An IP address for the serving certificate (repeatable).
    #[arg(long = "ip", value_name = "IP")]
    pub ip: Vec<IpAddr>,
    /// Validity in days.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
}

/// PEM of a dev CA and a serving certificate signed by it.
pub struct DevCerts {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

pub fn generate(dns: &[String], ips: &[IpAddr], days: u32) -> anyhow::Result<DevCerts> {
    let now = time::OffsetDateTime::now_utc();
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name.push(DnType::CommonName, "archer dev CA");
    let (not_before, not_after) = (now - time::Duration::minutes(5), now + time::Duration::days(i64::from(days)));
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca.self_signed(&ca_key)?;

    let mut names: Vec<String> = dns.to_vec();
    if names.is_empty() && ips.is_empty() {
        names.push("localhost".into());
    }
    let mut leaf = CertificateParams::new(names.clone())?;
    leaf.subject_alt_names.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    leaf.distinguished_name = DistinguishedName::new();
    leaf.distinguished_name.push(DnType::CommonName, names.first().cloned().unwrap_or_else(|| "archer".into()));
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let leaf_key = KeyPair::generate()?;
    let leaf_cert = leaf.signed_by(&leaf_key, &ca_cert, &ca_key)?;
    Ok(DevCerts { ca_pem: ca_cert.pem(), cert_pem: leaf_cert.pem(), key_pem: leaf_key.serialize_pem() })
}

fn write(path: &Path, contents: &str, private: bool) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

pub fn run(args: CertsArgs) -> anyhow::Result<ExitCode> {
    let CertsArgs { out, dns, ip, days } = args;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let certs = generate(&dns, &ip, days)?;
    write(&out.join("ca.crt"), &certs.ca_pem, false)?;
    write(&out.join("tls.crt"), &certs.cert_pem, false)?;
    write(&out.join("tls.key"), &certs.key_pem, true)?;
    let bundle = base64::engine::general_purpose::STANDARD.encode(certs.ca_pem.as_bytes());
    write(&out.join("ca-bundle.b64"), &bundle, false)?;
    eprintln!("wrote {0}/ca.crt, {0}/tls.crt, {0}/tls.key; caBundle (also in {0}/ca-bundle.b64):", out.display());
    println!("{bundle}");
    Ok(ExitCode::SUCCESS)
}
