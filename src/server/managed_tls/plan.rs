//! What the webhook's serving certificate should be, decided from the Secret that holds it and
//! the time: keep it, or write a new one (and why). Pure: the executor in [`super`] reads the
//! Secret, calls [`plan`], writes what it returns and publishes the CA bundle.
//!
//! The Secret holds `ca.crt` (the CA bundle: the CA that signs now first, then older CAs still
//! valid, so a CA rollover never leaves a serving certificate without a trusted issuer),
//! `ca.key` (the signing CA's key), and `tls.crt`/`tls.key` (the serving certificate).
//!
//! CAs that no longer sign (the one a rollover replaced, or those the webhook trusted when the
//! Secret had to be made anew) stay in the bundle for [`RETIRE_SECONDS`], long enough for every
//! replica to read the new certificate, and no longer than they are valid.
//!
//! Renewal is at a third of a certificate's own lifetime left (cert-manager's default
//! `renewBefore`), measured on the certificate, not the settings, so changing them never
//! churns a valid certificate.

use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use time::{Duration, OffsetDateTime};

/// The Secret's keys.
pub const CA_BUNDLE: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const CERT: &str = "tls.crt";
pub const KEY: &str = "tls.key";

/// How long a CA that no longer signs stays in the bundle (every replica reads the Secret every
/// `tlsReloadIntervalSeconds`).
pub const RETIRE_SECONDS: i64 = 3600;
/// The most CAs the webhook trusted that a new Secret keeps trusting for a while.
const MAX_KEPT: usize = 4;

/// The four PEM texts the Secret holds, and until when the CAs after the signing one stay
/// (Unix seconds; the Secret's annotation `archer.dev/older-cas-until`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Material {
    pub ca_bundle: String,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
    pub older_until: Option<i64>,
}

impl Material {
    /// What a Secret missing a key reads as.
    pub fn unusable() -> Material {
        Material { ca_bundle: String::new(), ca_key: String::new(), cert: String::new(), key: String::new(), older_until: None }
    }
}

/// How long new certificates are valid.
#[derive(Clone, Copy, Debug)]
pub struct Lifetimes {
    pub ca: Duration,
    pub cert: Duration,
}

/// Why a new Secret is written (the `reason` of `archer_tls_certificate_writes_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// No Secret yet.
    Absent,
    /// The Secret lacks a key, or its PEM does not parse, or a key does not match its
    /// certificate: everything is made anew.
    Unusable,
    /// The signing CA has a third of its lifetime left: a new CA signs, the old one stays in the
    /// bundle until it expires.
    CaRenewal,
    /// The serving certificate has a third of its lifetime left.
    CertRenewal,
    /// The serving certificate is not for the names wanted (the Service was renamed).
    NamesChanged,
    /// The serving certificate was not issued by the bundle's signing CA.
    WrongIssuer,
    /// A CA in the bundle has expired: it is dropped.
    ExpiredCa,
    /// CAs that no longer sign have been kept their hour: they are dropped.
    RetiredCa,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Absent => "absent",
            Reason::Unusable => "unusable",
            Reason::CaRenewal => "ca-renewal",
            Reason::CertRenewal => "cert-renewal",
            Reason::NamesChanged => "names-changed",
            Reason::WrongIssuer => "wrong-issuer",
            Reason::ExpiredCa => "expired-ca",
            Reason::RetiredCa => "retired-ca",
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    Keep,
    Write(Material, Reason),
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("making a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("no DNS name to issue the serving certificate for")]
    NoNames,
}

/// One certificate's facts.
struct Facts {
    der: Vec<u8>,
    pem: String,
    not_before: i64,
    not_after: i64,
    subject: Vec<u8>,
    issuer: Vec<u8>,
    spki: Vec<u8>,
    names: Vec<String>,
}

fn facts(der: &[u8]) -> Option<Facts> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let names = match cert.subject_alternative_name() {
        Ok(Some(san)) => san.value.general_names.iter().filter_map(|n| if let x509_parser::extensions::GeneralName::DNSName(d) = n { Some(d.to_string()) } else { None }).collect(),
        _ => Vec::new(),
    };
    Some(Facts {
        der: der.to_vec(),
        pem: pem_of(der),
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        subject: cert.subject().as_raw().to_vec(),
        issuer: cert.issuer().as_raw().to_vec(),
        spki: cert.public_key().raw.to_vec(),
        names,
    })
}

fn pem_of(der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64.as_bytes().chunks(64).filter_map(|c| std::str::from_utf8(c).ok()).collect();
    format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", lines.join("\n"))
}

fn certs(pem: &str) -> Vec<Facts> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).filter_map(Result::ok).filter_map(|d| facts(d.as_ref())).collect()
}

/// The Secret's contents, read: the CAs (signing one first), the serving certificate, and the
/// keys; None when anything is missing, unparseable or mismatched.
struct Read {
    signing: Facts,
    older: Vec<Facts>,
    ca_key: KeyPair,
    leaf: Facts,
}

fn read(m: &Material) -> Option<Read> {
    let mut cas = certs(&m.ca_bundle).into_iter();
    let signing = cas.next()?;
    let ca_key = KeyPair::from_pem(&m.ca_key).ok()?;
    let leaf = certs(&m.cert).into_iter().next()?;
    let leaf_key = KeyPair::from_pem(&m.key).ok()?;
    (signing.spki == ca_key.public_key_der() && leaf.spki == leaf_key.public_key_der()).then(|| Read { signing, older: cas.collect(), ca_key, leaf })
}

/// Has a third or less of its lifetime left at `now`?
fn due(not_before: i64, not_after: i64, now: i64) -> bool {
    let life = (not_after - not_before).max(1);
    (not_after - now) * 3 <= life
}

fn same_names(have: &[String], want: &[String]) -> bool {
    let mut a: Vec<&str> = have.iter().map(String::as_str).collect();
    let mut b: Vec<&str> = want.iter().map(String::as_str).collect();
    a.sort_unstable();
    a.dedup();
    b.sort_unstable();
    b.dedup();
    a == b
}

/// What the Secret should hold at `now` for a serving certificate for `names`; `published` is
/// the CA bundle the webhook trusts now (what replicas serving an older certificate rely on).
pub fn plan(current: Option<&Material>, published: &[u8], names: &[String], life: Lifetimes, now: OffsetDateTime) -> Result<Plan, PlanError> {
    if names.is_empty() {
        return Err(PlanError::NoNames);
    }
    let Some(current) = current else { return fresh(published, names, life, now).map(|m| Plan::Write(m, Reason::Absent)) };
    let Some(read) = read(current) else { return fresh(published, names, life, now).map(|m| Plan::Write(m, Reason::Unusable)) };
    let t = now.unix_timestamp();
    let signing = &read.signing;
    // Older CAs stay trusted while they are valid and, when a time is set, until it passes.
    let retired = current.older_until.is_some_and(|until| t >= until);
    let older: Vec<&Facts> = read.older.iter().filter(|c| c.not_after > t && c.der != signing.der && !retired).collect();
    if due(signing.not_before, signing.not_after, t) {
        let (ca_pem, ca_key, issuer) = new_ca(life, now)?;
        let (cert, key) = new_leaf(names, life, now, &issuer, &ca_key, signing_end(&ca_pem).unwrap_or(t))?;
        let mut bundle = ca_pem;
        // The CA that signed until now stays in the bundle for a while: replicas still serving
        // its certificate stay trusted until they read the new one.
        for c in std::iter::once(signing).filter(|c| c.not_after > t).chain(older) {
            bundle.push_str(&c.pem);
        }
        return Ok(Plan::Write(Material { ca_bundle: bundle, ca_key: ca_key.serialize_pem(), cert, key, older_until: Some(t + RETIRE_SECONDS) }, Reason::CaRenewal));
    }
    let bundle = std::iter::once(signing).chain(older.iter().copied()).map(|c| c.pem.as_str()).collect::<String>();
    let reissue = if read.leaf.issuer != signing.subject {
        Some(Reason::WrongIssuer)
    } else if !same_names(&read.leaf.names, names) {
        Some(Reason::NamesChanged)
    } else if due(read.leaf.not_before, read.leaf.not_after, t) {
        Some(Reason::CertRenewal)
    } else {
        None
    };
    if let Some(reason) = reissue {
        let issuer = CertificateParams::from_ca_cert_pem(&signing.pem)?.self_signed(&read.ca_key)?;
        let (cert, key) = new_leaf(names, life, now, &issuer, &read.ca_key, signing.not_after)?;
        return Ok(Plan::Write(Material { ca_bundle: bundle, ca_key: current.ca_key.clone(), cert, key, older_until: current.older_until.filter(|_| !older.is_empty()) }, reason));
    }
    if read.older.len() != older.len() {
        let why = if retired { Reason::RetiredCa } else { Reason::ExpiredCa };
        return Ok(Plan::Write(Material { ca_bundle: bundle, older_until: current.older_until.filter(|_| !older.is_empty()), ..current.clone() }, why));
    }
    Ok(Plan::Keep)
}

fn signing_end(ca_pem: &str) -> Option<i64> {
    certs(ca_pem).first().map(|c| c.not_after)
}

/// A new CA and serving certificate; the CAs the webhook trusts now (valid, at most
/// [`MAX_KEPT`]) stay in the bundle for [`RETIRE_SECONDS`], so replicas still serving a
/// certificate of theirs are not refused meanwhile.
fn fresh(published: &[u8], names: &[String], life: Lifetimes, now: OffsetDateTime) -> Result<Material, PlanError> {
    let t = now.unix_timestamp();
    let (mut ca_bundle, ca_key, issuer) = new_ca(life, now)?;
    let end = signing_end(&ca_bundle).unwrap_or(t);
    let (cert, key) = new_leaf(names, life, now, &issuer, &ca_key, end)?;
    let kept: Vec<Facts> = certs(&String::from_utf8_lossy(published)).into_iter().filter(|c| c.not_after > t).take(MAX_KEPT).collect();
    for c in &kept {
        ca_bundle.push_str(&c.pem);
    }
    Ok(Material { ca_bundle, ca_key: ca_key.serialize_pem(), cert, key, older_until: (!kept.is_empty()).then_some(t + RETIRE_SECONDS) })
}

/// A new self-signed CA (its PEM, key and the issuer rcgen signs with). Its name carries the
/// second it was made, so each CA's subject is its own and a certificate's issuer names one.
fn new_ca(life: Lifetimes, now: OffsetDateTime) -> Result<(String, KeyPair, rcgen::Certificate), PlanError> {
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name.push(DnType::OrganizationName, "archer");
    ca.distinguished_name.push(DnType::CommonName, format!("archer webhook CA {}", now.unix_timestamp()));
    ca.not_before = now - Duration::minutes(5);
    ca.not_after = now + life.ca;
    let key = KeyPair::generate()?;
    let cert = ca.self_signed(&key)?;
    Ok((cert.pem(), key, cert))
}

/// A serving certificate for `names`, valid for the lifetime but never past its CA (`ca_end`).
fn new_leaf(names: &[String], life: Lifetimes, now: OffsetDateTime, issuer: &rcgen::Certificate, issuer_key: &KeyPair, ca_end: i64) -> Result<(String, String), PlanError> {
    let mut leaf = CertificateParams::new(names.to_vec())?;
    leaf.distinguished_name = DistinguishedName::new();
    leaf.distinguished_name.push(DnType::CommonName, names.first().cloned().unwrap_or_default());
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = now - Duration::minutes(5);
    let end = now + life.cert;
    leaf.not_after = OffsetDateTime::from_unix_timestamp(ca_end).map_or(end, |ca| end.min(ca));
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, issuer, issuer_key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;

    const LIFE: Lifetimes = Lifetimes { ca: Duration::days(3650), cert: Duration::days(365) };

    fn names() -> Vec<String> {
        vec!["archer.archer-system.svc".to_string(), "archer.archer-system.svc.cluster.local".to_string()]
    }

    fn t0() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).expect("time")
    }

    fn written(p: Plan) -> (Material, Reason) {
        match p {
            Plan::Write(m, r) => (m, r),
            Plan::Keep => panic!("expected a write"),
        }
    }

    /// A TLS client trusting `bundle` accepts `cert` for the first name: verified by rustls's
    /// own webpki verifier, at `now`.
    fn trusted(bundle: &str, cert: &str, name: &str, now: OffsetDateTime) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(bundle.as_bytes()).filter_map(Result::ok) {
            let _ = roots.add(c);
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(std::sync::Arc::new(roots), provider).build().expect("verifier");
        let chain: Vec<CertificateDer> = CertificateDer::pem_slice_iter(cert.as_bytes()).filter_map(Result::ok).collect();
        let at = rustls_pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(now.unix_timestamp() as u64));
        let server = rustls_pki_types::ServerName::try_from(name.to_string()).expect("name");
        verifier.verify_server_cert(&chain[0], &chain[1..], &server, &[], at).is_ok()
    }

    #[test]
    fn an_absent_secret_gets_a_ca_and_a_certificate_it_signs_for_the_names() {
        let (m, why) = written(plan(None, b"", &names(), LIFE, t0()).expect("plan"));
        assert_eq!(why, Reason::Absent);
        for n in names() {
            assert!(trusted(&m.ca_bundle, &m.cert, &n, t0()), "{n}");
        }
        assert!(!trusted(&m.ca_bundle, &m.cert, "other.archer-system.svc", t0()));
        assert_eq!(plan(Some(&m), b"", &names(), LIFE, t0()).expect("plan"), Plan::Keep, "the same Secret is kept");
        // Another replica reading it a day later keeps it too: every replica serves one pair.
        assert_eq!(plan(Some(&m), b"", &names(), LIFE, t0() + Duration::days(1)).expect("plan"), Plan::Keep);
    }

    #[test]
    fn a_broken_secret_is_made_anew() {
        let (good, _) = written(plan(None, b"", &names(), LIFE, t0()).expect("plan"));
        let (other, _) = written(plan(None, b"", &names(), LIFE, t0()).expect("plan"));
        for broken in [
            Material { cert: "garbage".into(), ..good.clone() },
            Material { ca_key: String::new(), ..good.clone() },
            Material { key: other.key.clone(), ..good.clone() },
            Material { ca_key: other.ca_key.clone(), ..good.clone() },
        ] {
            let (m, why) = written(plan(Some(&broken), b"", &names(), LIFE, t0()).expect("plan"));
            assert_eq!(why, Reason::Unusable);
            assert!(trusted(&m.ca_bundle, &m.cert, &names()[0], t0()));
        }
    }

    #[test]
    fn the_serving_certificate_is_renewed_at_a_third_of_its_life_by_the_same_ca() {
        let (m, _) = written(plan(None, b"", &names(), LIFE, t0()).expect("plan"));
        assert_eq!(plan(Some(&m), b"", &names(), LIFE, t0() + Duration::days(240)).expect("plan"), Plan::Keep, "two thirds of a year in");
        let at = t0() + Duration::days(250);
        let (renewed, why) = written(plan(Some(&m), b"", &names(), LIFE, at).expect("plan"));
        assert_eq!(why, Reason::CertRenewal);
        assert_eq!((&renewed.ca_bundle, &renewed.ca_key), (&m.ca_bundle, &m.ca_key), "the CA and the bundle are unchanged: nothing to publish");
        assert_ne!(renewed.cert, m.cert);
        assert!(trusted(&m.ca_bundle, &renewed.cert, &names()[0], at));
        assert!(trusted(&m.ca_bundle, &renewed.cert, &names()[0], at + Duration::days(360)), "a year more");
    }

    #[test]
    fn new_names_get_a_new_certificate() {
        let (m, _) = written(plan(None, b"", &names(), LIFE, t0()).expect("plan"));
        let renamed = vec!["archer2.ops.svc".to_string()];
        let (n, why) = written(plan(Some(&m), b"", &renamed, LIFE, t0()).expect("plan"));
        assert_eq!(why, Reason::NamesChanged);
        assert!(trusted(&m.ca_bundle, &n.cert, "archer2.ops.svc", t0()));
        assert!(!trusted(&m.ca_bundle, &n.cert, &names()[0], t0()));
        // The same names in another order are the same names.
        let reordered: Vec<String> = names().into_iter().rev().collect();
        assert_eq!(plan(Some(&m), b"", &reordered, LIFE, t0()).expect("plan"), Plan::Keep);
    }

    #[test]
    fn a_ca_rollover_keeps_the_old_ca_trusted_for_an_hour_then_drops_it() {
        let life = Lifetimes { ca: Duration::days(30), cert: Duration::days(20) };
        let (m, _) = written(plan(None, b"", &names(), life, t0()).expect("plan"));
        // The serving certificate is renewed (a third of 20 days left) before the CA is due,
        // and then runs to the CA's end.
        let (m2, why) = written(plan(Some(&m), b"", &names(), life, t0() + Duration::days(14)).expect("plan"));
        assert_eq!(why, Reason::CertRenewal);
        let roll_at = t0() + Duration::days(20);
        let (rolled, why) = written(plan(Some(&m2), b"", &names(), life, roll_at).expect("plan"));
        assert_eq!(why, Reason::CaRenewal);
        assert_ne!(rolled.ca_key, m2.ca_key);
        assert_eq!(certs(&rolled.ca_bundle).len(), 2, "the new CA and the old one");
        // A client with the new bundle trusts both the old replicas' certificate and the new one.
        assert!(trusted(&rolled.ca_bundle, &m2.cert, &names()[0], roll_at));
        assert!(trusted(&rolled.ca_bundle, &rolled.cert, &names()[0], roll_at));
        assert!(!trusted(&m2.ca_bundle, &rolled.cert, &names()[0], roll_at), "the new CA is new");
        assert_eq!(plan(Some(&rolled), b"", &names(), life, roll_at + Duration::minutes(50)).expect("plan"), Plan::Keep);
        // An hour on, every replica serves the new certificate: the old CA leaves the bundle;
        // the signing CA and certificate stay.
        let later = roll_at + Duration::minutes(61);
        let (pruned, why) = written(plan(Some(&rolled), b"", &names(), life, later).expect("plan"));
        assert_eq!(why, Reason::RetiredCa);
        assert_eq!((certs(&pruned.ca_bundle).len(), pruned.older_until), (1, None));
        assert_eq!((&pruned.cert, &pruned.ca_key), (&rolled.cert, &rolled.ca_key));
        assert!(trusted(&pruned.ca_bundle, &pruned.cert, &names()[0], later));
        assert_eq!(plan(Some(&pruned), b"", &names(), life, later).expect("plan"), Plan::Keep);
        // Without a time (a Secret of an earlier release), an older CA stays until it expires.
        let untimed = Material { older_until: None, ..rolled.clone() };
        assert_eq!(plan(Some(&untimed), b"", &names(), life, later).expect("plan"), Plan::Keep);
        let (pruned, why) = written(plan(Some(&untimed), b"", &names(), life, t0() + Duration::days(31)).expect("plan"));
        assert_eq!((why, certs(&pruned.ca_bundle).len()), (Reason::ExpiredCa, 1));
    }

    /// A Secret made anew (deleted, or collected with a recreated webhook configuration) keeps
    /// the CAs the webhook trusts now for an hour: replicas that still serve a certificate of
    /// theirs until they read the new Secret are not refused meanwhile.
    #[test]
    fn a_secret_made_anew_keeps_the_published_cas_for_an_hour() {
        let (first, _) = written(plan(None, b"", &names(), LIFE, t0()).expect("plan"));
        let (again, why) = written(plan(None, first.ca_bundle.as_bytes(), &names(), LIFE, t0()).expect("plan"));
        assert_eq!(why, Reason::Absent);
        assert_eq!(certs(&again.ca_bundle).len(), 2);
        assert!(trusted(&again.ca_bundle, &first.cert, &names()[0], t0()), "the old replicas' certificate");
        assert!(trusted(&again.ca_bundle, &again.cert, &names()[0], t0()), "the new one");
        let (pruned, why) = written(plan(Some(&again), b"", &names(), LIFE, t0() + Duration::minutes(61)).expect("plan"));
        assert_eq!(why, Reason::RetiredCa);
        assert!(!trusted(&pruned.ca_bundle, &first.cert, &names()[0], t0()), "the old CA is gone");
        // Garbage in the published bundle is ignored.
        let (m, _) = written(plan(None, b"not a certificate", &names(), LIFE, t0()).expect("plan"));
        assert_eq!((certs(&m.ca_bundle).len(), m.older_until), (1, None));
    }

    #[test]
    fn a_certificate_never_outlives_its_ca() {
        let life = Lifetimes { ca: Duration::days(30), cert: Duration::days(365) };
        let (m, _) = written(plan(None, b"", &names(), life, t0()).expect("plan"));
        let leaf = certs(&m.cert).remove(0);
        let ca = certs(&m.ca_bundle).remove(0);
        assert!(leaf.not_after <= ca.not_after);
    }

    #[test]
    fn no_names_is_an_error() {
        assert!(matches!(plan(None, b"", &[], LIFE, t0()), Err(PlanError::NoNames)));
    }
}
