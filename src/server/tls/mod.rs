//! TLS termination on the client side: an optional second listener (`server.tls_listen`) next
//! to the plain one, on every shard (SO_REUSEPORT, like the plain one), serving the PEM
//! certificate and key from `server.tls_cert` / `server.tls_key` with ALPN `http/1.1`.
//!
//! Owns: `certs` (loading, the current certificate, per-shard acceptors) and `listener` (the
//! per-shard accept loop and handshake); [`bind`] sets both up at start. Must not: change how
//! requests are served — after the handshake a TLS connection is an ordinary `ClientConn`
//! (`http::stream::ClientStream::Tls`) on the same pipeline.

pub mod listener;

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::Path;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use crate::http::certs::{self, server_config, TlsCerts};
pub use listener::TlsStats;

use crate::config::Config;
use crate::pipeline::shard::Shard;
use crate::runtime::shutdown::Shutdown;

/// The bound TLS listeners (one per shard) and the certificate they serve.
pub struct TlsListeners {
    pub addr: SocketAddr,
    pub certs: Arc<TlsCerts>,
    handshake_timeout: Duration,
    listeners: Mutex<Vec<Option<StdListener>>>,
}

/// Load the certificate and bind `n` listeners when `server.tls_listen` is set. Errors name
/// the file or address.
pub fn bind(cfg: &Config, n: usize) -> io::Result<Option<Arc<TlsListeners>>> {
    let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidInput, e);
    let Some(addr) = cfg.tls_listen_addr().map_err(invalid)? else {
        return Ok(None);
    };
    let (Some(cert), Some(key)) = (&cfg.server.tls_cert, &cfg.server.tls_key) else {
        return Err(invalid(
            "server.tls_listen needs tls_cert and tls_key".into(),
        ));
    };
    let certs =
        TlsCerts::load(Path::new(cert.get_ref()), Path::new(key.get_ref())).map_err(invalid)?;
    let (listeners, bound) = crate::runtime::bind_listeners(addr, n)?;
    Ok(Some(Arc::new(TlsListeners {
        addr: bound,
        certs,
        handshake_timeout: Duration::from_millis(cfg.server.tls_handshake_timeout_ms),
        listeners: Mutex::new(listeners.into_iter().map(Some).collect()),
    })))
}

impl TlsListeners {
    /// Start shard `id`'s TLS accept loop (a task on that shard) until `shutdown`.
    pub fn start_shard(&self, id: usize, shard: &Rc<Shard>, shutdown: &Shutdown) {
        let listener = match self.listeners.lock() {
            Ok(mut l) => l.get_mut(id).and_then(Option::take),
            Err(_) => None,
        };
        let Some(listener) = listener else { return };
        monoio::spawn(listener::accept_loop(
            listener,
            shard.clone(),
            certs::Acceptors::new(self.certs.clone()),
            self.handshake_timeout,
            shutdown.clone(),
        ));
    }
}
