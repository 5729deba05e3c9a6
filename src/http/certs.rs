//! The listener's certificate and key: loaded from PEM files into a rustls `ServerConfig`
//! (ALPN `http/1.1`), held process-wide so a reload can swap them while shards keep accepting.
//!
//! Owns: [`server_config`] (read, parse and check a cert/key pair: every failure names the file
//! and what is wrong), [`TlsCerts`] (the current `Arc<ServerConfig>` and a generation number)
//! and [`Acceptors`] (a shard's acceptor, re-fetched only when the generation moved: one atomic
//! load per accepted connection). Must not: accept connections or do handshakes
//! (`tls::listener`), or be consulted per request.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use monoio_rustls::TlsAcceptor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

/// ALPN: the gateway speaks HTTP/1.1 only.
pub const ALPN: &[u8] = b"http/1.1";

/// Build a server configuration from a PEM certificate chain (leaf first) and a PEM private key
/// (PKCS#8, PKCS#1 or SEC1). Errors name the path: missing or unreadable file, no PEM block of
/// the right kind, a key that does not belong to the certificate.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, String> {
    let cert_pem = std::fs::read(cert)
        .map_err(|e| format!("tls_cert {}: cannot read: {e}", cert.display()))?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls_cert {}: not a PEM certificate: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "tls_cert {}: no PEM certificate found (expected -----BEGIN CERTIFICATE-----)",
            cert.display()
        ));
    }
    let key_pem =
        std::fs::read(key).map_err(|e| format!("tls_key {}: cannot read: {e}", key.display()))?;
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        format!(
            "tls_key {}: no PEM private key found (PKCS#8, PKCS#1 or SEC1): {e}",
            key.display()
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS server config: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| {
            let why = match e {
                rustls::Error::InconsistentKeys(_) => {
                    "the private key does not belong to the certificate".to_string()
                }
                other => other.to_string(),
            };
            format!(
                "tls_key {} / tls_cert {}: {why}",
                key.display(),
                cert.display()
            )
        })?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    // Session tickets: a returning client resumes without a full handshake.
    if let Ok(t) = rustls::crypto::ring::Ticketer::new() {
        cfg.ticketer = t;
    }
    Ok(Arc::new(cfg))
}

/// The certificate the TLS listener serves now, and where it came from. Shared by every shard.
pub struct TlsCerts {
    cert: PathBuf,
    key: PathBuf,
    current: Mutex<Arc<ServerConfig>>,
    generation: AtomicU64,
}

impl TlsCerts {
    /// Load `cert` and `key` (see [`server_config`]).
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<TlsCerts>, String> {
        let cfg = server_config(cert, key)?;
        Ok(Arc::new(TlsCerts {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: Mutex::new(cfg),
            generation: AtomicU64::new(0),
        }))
    }

    /// Read the files again (a reload). On error the current certificate stays.
    pub fn reload(&self) -> Result<(), String> {
        let cfg = server_config(&self.cert, &self.key)?;
        self.replace(cfg);
        Ok(())
    }

    /// Serve `cfg` from the next accepted connection on (connections already open keep theirs).
    pub fn replace(&self, cfg: Arc<ServerConfig>) {
        match self.current.lock() {
            Ok(mut c) => *c = cfg,
            Err(p) => *p.into_inner() = cfg,
        }
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn current(&self) -> Arc<ServerConfig> {
        match self.current.lock() {
            Ok(c) => c.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

/// One shard's acceptor for the current certificate.
pub struct Acceptors {
    certs: Arc<TlsCerts>,
    generation: Cell<u64>,
    acceptor: RefCell<TlsAcceptor>,
}

impl Acceptors {
    pub fn new(certs: Arc<TlsCerts>) -> Acceptors {
        let generation = certs.generation();
        let acceptor = TlsAcceptor::from(certs.current());
        Acceptors {
            certs,
            generation: Cell::new(generation),
            acceptor: RefCell::new(acceptor),
        }
    }

    /// The acceptor for the certificate current now (one atomic load; a lock only after a
    /// reload).
    pub fn get(&self) -> TlsAcceptor {
        let g = self.certs.generation();
        if g != self.generation.get() {
            *self.acceptor.borrow_mut() = TlsAcceptor::from(self.certs.current());
            self.generation.set(g);
        }
        self.acceptor.borrow().clone()
    }
}
