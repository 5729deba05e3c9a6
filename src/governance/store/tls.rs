//! TLS to the shared store (`rediss://`): the rustls client configuration, built once at start
//! from `redis_ca_file` (only the CAs in that file are trusted) or the system roots (the
//! bundled webpki roots when the system has none), and the server name every handshake checks
//! the certificate against (the URL's host: a DNS name or an IP address).
//!
//! Owns: [`Tls`] (connector + server name) and reading the CA file. Must not: connect or
//! handshake (`Store::maintain` does, within its connect deadline).

use std::sync::Arc;

use monoio_rustls::TlsConnector;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};

/// What a `rediss://` connection needs.
#[derive(Clone)]
pub struct Tls {
    pub connector: TlsConnector,
    pub name: ServerName<'static>,
}

impl Tls {
    /// The connector for `host` trusting `ca_file` (or the system roots). Errors name the
    /// file and what is wrong.
    pub fn new(host: &str, ca_file: Option<&str>) -> Result<Tls, String> {
        let mut roots = RootCertStore::empty();
        match ca_file {
            Some(path) => {
                let pem = std::fs::read(path)
                    .map_err(|e| format!("limits.redis_ca_file {path}: cannot read: {e}"))?;
                for cert in CertificateDer::pem_slice_iter(&pem) {
                    let cert = cert.map_err(|e| {
                        format!("limits.redis_ca_file {path}: not a PEM certificate: {e}")
                    })?;
                    roots
                        .add(cert)
                        .map_err(|e| format!("limits.redis_ca_file {path}: {e}"))?;
                }
                if roots.is_empty() {
                    return Err(format!(
                        "limits.redis_ca_file {path}: no PEM certificate found (expected -----BEGIN CERTIFICATE-----)"
                    ));
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS client config: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| format!("limits.redis_url: {host:?} is not a TLS server name: {e}"))?;
        Ok(Tls {
            connector: TlsConnector::from(Arc::new(cfg)),
            name,
        })
    }
}
