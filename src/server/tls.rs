//! The serving certificate: re-read from disk while running, or installed by the managed
//! certificate ([`super::managed_tls`]) from the Secret it keeps.
//!
//! Files are polled (not watched with inotify) and compared by content, so the symlink swap a
//! Kubernetes Secret volume does (`..data` -> a new timestamped directory) is picked up. A bad
//! new pair is logged and counted, and the old one keeps serving.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};

use archer_metrics::label;
use super::metrics::ServerMetrics;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: no PEM certificate found")]
    NoCertificate { path: PathBuf },
    #[error("{path}: no usable PEM private key: {reason}")]
    BadKey { path: PathBuf, reason: String },
    #[error("certificate and key do not match: {0}")]
    Mismatch(String),
}

pub struct CertStore {
    /// The files it is read from; empty paths when Archer manages the certificate.
    cert_path: PathBuf,
    key_path: PathBuf,
    current: ArcSwap<CertifiedKey>,
    fingerprint: std::sync::Mutex<[u8; 32]>,
}

impl fmt::Debug for CertStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertStore").field("cert", &self.cert_path).field("key", &self.key_path).finish()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.into(), source })
}

fn fingerprint(cert: &[u8], key: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(cert);
    h.update([0]);
    h.update(key);
    h.finalize().into()
}

fn parse(cert_path: &Path, cert_pem: &[u8], key_path: &Path, key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem).filter_map(Result::ok).collect();
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path: cert_path.into() });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::BadKey { path: key_path.into(), reason: e.to_string() })?;
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(chain, key, &provider).map_err(|e| TlsError::Mismatch(e.to_string()))?;
    Ok(certified)
}

/// The leaf certificate's notAfter, in Unix seconds.
fn not_after(certified: &CertifiedKey) -> Option<i64> {
    let leaf = certified.cert.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    Some(cert.validity().not_after.timestamp())
}

impl CertStore {
    /// When the certificate served now expires (Unix seconds).
    pub fn expires_at(&self) -> Option<i64> {
        not_after(&self.current.load())
    }

    /// Load the pair once; fails when it is unusable (the server cannot start without one).
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<Self>, TlsError> {
        let (c, k) = (read(cert_path)?, read(key_path)?);
        let certified = parse(cert_path, &c, key_path, &k)?;
        Ok(Arc::new(Self {
            cert_path: cert_path.into(),
            key_path: key_path.into(),
            current: ArcSwap::from_pointee(certified),
            fingerprint: std::sync::Mutex::new(fingerprint(&c, &k)),
        }))
    }

    /// A store serving a throwaway self-signed certificate no client trusts, until
    /// [`CertStore::install`] puts the managed one in (the process is not ready until then).
    pub fn placeholder() -> Result<Arc<Self>, TlsError> {
        let generated = rcgen::generate_simple_self_signed(vec!["archer-placeholder.invalid".to_string()]).map_err(|e| TlsError::Mismatch(e.to_string()))?;
        let (c, k) = (generated.cert.pem().into_bytes(), generated.key_pair.serialize_pem().into_bytes());
        let certified = parse(Path::new("placeholder"), &c, Path::new("placeholder"), &k)?;
        Ok(Arc::new(Self { cert_path: PathBuf::new(), key_path: PathBuf::new(), current: ArcSwap::from_pointee(certified), fingerprint: std::sync::Mutex::new(fingerprint(&c, &k)) }))
    }

    /// Serve this PEM pair from now on; `Ok(true)` when it differs from the one served. A pair
    /// that does not parse or match is refused and the old one keeps serving.
    pub fn install(&self, cert: &[u8], key: &[u8], from: &str) -> Result<bool, TlsError> {
        let fp = fingerprint(cert, key);
        let mut last = self.fingerprint.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *last == fp {
            return Ok(false);
        }
        let certified = parse(Path::new(from), cert, Path::new(from), key)?;
        self.current.store(Arc::new(certified));
        *last = fp;
        Ok(true)
    }

    /// Re-read the files; `Ok(true)` when a new pair was installed.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let (c, k) = (read(&self.cert_path)?, read(&self.key_path)?);
        self.install(&c, &k, &self.cert_path.display().to_string())
    }

    /// Poll the files until the process ends.
    pub async fn watch(self: Arc<Self>, every: Duration, metrics: Arc<ServerMetrics>) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let expiry = |store: &Self| {
            if let Some(at) = store.expires_at() {
                metrics.cert_expiration.set(at);
            }
        };
        expiry(&self);
        loop {
            tick.tick().await;
            match self.reload() {
                Ok(true) => {
                    expiry(&self);
                    metrics.cert_reloads.get_or_create(&label("result", "ok")).inc();
                    tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded");
                }
                Ok(false) => {}
                Err(e) => {
                    metrics.cert_reloads.get_or_create(&label("result", "error")).inc();
                    tracing::warn!(error = %e, "serving certificate changed on disk but cannot be used; keeping the old one");
                }
            }
        }
    }

    pub fn server_config(self: &Arc<Self>) -> Arc<ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        // Both versions are in the ring provider, so this cannot fail.
        let builder = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .unwrap_or_else(|_| unreachable!("TLS 1.2 and 1.3 are supported by ring"));
        let mut cfg = builder.with_no_client_auth().with_cert_resolver(self.clone());
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(cfg)
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}
