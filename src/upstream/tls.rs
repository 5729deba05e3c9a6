//! The process-wide rustls client configuration (system roots, falling back to the bundled
//! webpki roots), built once at start-up and shared read-only by every shard's connector.
//!
//! Owns: root-store loading. Must not: do handshakes (see `conn`).

use std::sync::Arc;

use rustls::ClientConfig;

/// System roots (or the bundled webpki roots when the system has none), plus the PEM
/// certificates in `extra_ca_files` (providers' `ca_file`, e.g. an internal CA in front of vLLM).
pub fn client_config(extra_ca_files: &[String]) -> Result<Arc<ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    for path in extra_ca_files {
        let pem = std::fs::read(path).map_err(|e| format!("ca_file {path}: {e}"))?;
        let mut n = 0;
        for cert in rustls_pemfile_certs(&pem) {
            roots
                .add(cert)
                .map_err(|e| format!("ca_file {path}: {e}"))?;
            n += 1;
        }
        if n == 0 {
            return Err(format!("ca_file {path}: no PEM certificate found"));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth());
    cfg.map(Arc::new)
        .map_err(|e| format!("TLS client config: {e}"))
}

/// Certificates in a PEM bundle.
fn rustls_pemfile_certs(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect()
}
