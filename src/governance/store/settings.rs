//! The store's settings (`Settings`, read once from `[limits]`) and how a connection is opened
//! with them (`open`: TCP, and TLS for `rediss://`).
//!
//! Owns: `Settings`, `Conn`, `open`. Must not: speak RESP or keep connection state (`Store`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use monoio::net::TcpStream;

use super::{tls, CONNECT_TIMEOUT};
use crate::config::limits::{LimitsConfig, RedisUrl};

/// TCP connect to `addr` and, for `rediss://`, the TLS handshake (the certificate checked
/// against `name`, default the URL's host), within `CONNECT_TIMEOUT`.
pub(super) async fn open(
    s: &Settings,
    addr: SocketAddr,
    name: Option<&str>,
) -> Result<Conn, String> {
    let fut = async {
        let stream = TcpStream::connect_addr(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        let Some(tls) = &s.tls else {
            return Ok(Conn::Plain(stream));
        };
        let server = match name {
            Some(n) => rustls::pki_types::ServerName::try_from(n.to_string())
                .map_err(|e| format!("TLS: {n:?} is not a server name: {e}"))?,
            None => tls.name.clone(),
        };
        match tls.connector.connect(server, stream).await {
            Ok(s) => Ok(Conn::Tls(Box::new(s))),
            Err(e) => Err(format!("TLS handshake: {}", std::io::Error::from(e))),
        }
    };
    match monoio::time::timeout(CONNECT_TIMEOUT, fut).await {
        Ok(r) => r,
        Err(_) => Err("connect timed out".into()),
    }
}

/// The process-wide store settings, read once at start.
#[derive(Clone)]
pub struct Settings {
    /// For logs (no password).
    pub url: RedisUrl,
    pub addr: SocketAddr,
    pub timeout: Duration,
    pub lease: Duration,
    pub prefix: Box<str>,
    pub closed: bool,
    /// This process's part of each shard's instance name (random).
    pub process: Box<str>,
    /// `rediss://`: the connector and the name the certificate must carry.
    pub tls: Option<tls::Tls>,
    /// `redis_cluster = true`: `addr` is a seed node of a Cluster.
    pub cluster: bool,
    /// `mode = "leased"`: request windows are leased (`governance::lease`).
    pub leased: bool,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Settings({}, {})", self.url, self.addr)
    }
}

impl Settings {
    /// `None` for the local store. Resolves the host once (blocking: call before the shards
    /// start) and reads `redis_password_env`.
    pub fn from_config(l: &LimitsConfig) -> Result<Option<Settings>, String> {
        if !l.shared() {
            return Ok(None);
        }
        let mut url = l.url().map_err(|e| format!("limits.redis_url: {e}"))?;
        if let Some(env) = &l.redis_password_env {
            if let Ok(p) = std::env::var(env.get_ref()) {
                url.password = Some(p);
            }
        }
        let tls = match url.tls {
            true => Some(tls::Tls::new(
                &url.host,
                l.redis_ca_file.as_ref().map(|c| c.get_ref().as_str()),
            )?),
            false => None,
        };
        let addr = (url.host.as_str(), url.port)
            .to_socket_addrs()
            .map_err(|e| format!("limits.redis_url {url}: cannot resolve the host: {e}"))?
            .next()
            .ok_or_else(|| format!("limits.redis_url {url}: the host has no address"))?;
        let mut rnd = [0u8; 8];
        let process =
            match ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut rnd) {
                Ok(()) => u64::from_ne_bytes(rnd),
                Err(_) => {
                    let nanos = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.subsec_nanos());
                    (u64::from(std::process::id()) << 32) | u64::from(nanos)
                }
            };
        Ok(Some(Settings {
            url,
            addr,
            timeout: Duration::from_millis(*l.redis_timeout_ms.get_ref()),
            lease: Duration::from_millis(*l.redis_lease_ms.get_ref()),
            prefix: l.redis_prefix.get_ref().as_str().into(),
            closed: l.closed(),
            process: format!("{process:016x}").into(),
            tls,
            cluster: l.cluster(),
            leased: l.leased(),
        }))
    }
}

/// A connection to the store: plain TCP or TLS over it.
pub(super) enum Conn {
    Plain(TcpStream),
    Tls(Box<monoio_rustls::ClientTlsStream<TcpStream>>),
}
