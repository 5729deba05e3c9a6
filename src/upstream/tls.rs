//! The process-wide rustls client configuration (system roots, falling back to the bundled
//! webpki roots), built once at start-up and shared read-only by every shard's connector.
//!
//! Owns: root-store loading. Must not: do handshakes (see `conn`).

use std::sync::Arc;

use rustls::ClientConfig;

pub fn client_config() -> Arc<ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth());
    match cfg {
        Ok(c) => Arc::new(c),
        Err(_) => Arc::new(
            ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        ),
    }
}
