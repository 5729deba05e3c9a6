//! The TLS client listener of one shard: accept on its SO_REUSEPORT socket, charge the
//! connection like a plain one, complete the handshake within a deadline, then hand the
//! connection to the same per-connection loop as plain ones (`pipeline::serve_connection`).
//!
//! Owns: what the TLS port does with an accepted connection (the loop itself is
//! `runtime::accept_loop`), the handshake deadline, refusing plain HTTP sent to the TLS port
//! (a 400 that says to use https, then close), and the TLS counters. Must not: parse requests
//! (beyond recognising a plain-HTTP first byte) or hold anything shared across shards except
//! the certificate (`certs::TlsCerts`).
//!
//! Caps: a connection counts in `ringgate_connections_open`, `max_connections` and
//! `max_connections_per_address` from accept, handshake included, and holds `connection_reserve` + [`TLS_CONNECTION_EXTRA`] of the
//! budget until it closes (the TLS layer keeps two 16 KiB record buffers per connection). Over
//! the cap a few connections per shard still get a (shorter) handshake so `/healthz` and
//! `/readyz` answer; the rest are closed at once — a refusal cannot be written before a
//! handshake.

use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::time::Duration;

use monoio::net::TcpStream;

use crate::admit::connection::TLS_CONNECTION_EXTRA;
use crate::error::{Error, ErrorShape, Kind};
use crate::http::certs::Acceptors;
use crate::http::conn::ClientConn;
use crate::http::stream::ClientStream;
pub use crate::observe::metrics::tls::TlsStats;
use crate::observe::metrics::{bump, dec};
use crate::pipeline;
use crate::pipeline::shard::Shard;
use crate::runtime::shutdown::Shutdown;
use crate::server::accept::{self, Verdict};

/// Handshake deadline for an over-the-cap connection given one (`accept::Verdict::Probe`).
const OVER_CAP_HANDSHAKE: Duration = Duration::from_millis(1000);

/// Accept TLS connections on `std_listener` until `shutdown` fires, then close it. Connections
/// already accepted finish like plain ones (the shard's drain covers them: they are counted in
/// `connections`).
pub async fn accept_loop(
    std_listener: std::net::TcpListener,
    shard: Rc<Shard>,
    acceptors: Acceptors,
    handshake_timeout: Duration,
    shutdown: Shutdown,
) {
    let name = format!("shard {} (tls)", shard.id);
    let acceptors = Rc::new(acceptors);
    crate::runtime::accept_loop(&name, std_listener, &shutdown, |stream, peer| {
        on_accept(stream, peer, &shard, &acceptors, handshake_timeout)
    })
    .await;
}

fn on_accept(
    stream: TcpStream,
    addr: std::net::SocketAddr,
    shard: &Rc<Shard>,
    acceptors: &Rc<Acceptors>,
    handshake_timeout: Duration,
) {
    if shard.draining.is_fired() {
        return;
    }
    let _ = stream.set_nodelay(true);
    let peer = crate::admit::peer::Peer::of(addr.ip());
    let verdict = accept::admit(shard, peer, TLS_CONNECTION_EXTRA);
    let shard = shard.clone();
    let acceptors = acceptors.clone();
    match verdict {
        Verdict::Serve(held) => {
            monoio::spawn(async move {
                // Counted as open from accept: the handshake is under the cap and the drain.
                // A drain ends handshakes in progress at once.
                bump(&shard.metrics.connections);
                let conn = monoio::select! {
                    _ = shard.draining.wait() => None,
                    c = handshake(stream, &shard, &acceptors, handshake_timeout) => c,
                };
                dec(&shard.metrics.connections);
                if let Some(mut conn) = conn {
                    conn.peer = Some(peer);
                    pipeline::serve_connection(conn, shard).await;
                }
                drop(held);
            });
        }
        Verdict::Probe => {
            shard.over_cap.set(shard.over_cap.get() + 1);
            monoio::spawn(async move {
                let wait = handshake_timeout.min(OVER_CAP_HANDSHAKE);
                let conn = handshake(stream, &shard, &acceptors, wait).await;
                shard.over_cap.set(shard.over_cap.get().saturating_sub(1));
                if let Some(mut conn) = conn {
                    conn.peer = Some(peer);
                    pipeline::serve_over_cap(conn, shard).await;
                }
            });
        }
        // a refusal cannot be written before a handshake
        Verdict::Refuse => bump(&shard.metrics.connections_refused),
    }
}

/// What the first byte a client sent says.
enum First {
    /// A TLS record (a handshake starts with 0x16).
    Tls,
    /// An ASCII letter: a plain HTTP request line.
    PlainHttp,
    /// Closed, reset, or a first byte that starts neither TLS nor HTTP.
    Gone,
}

/// The handshake, within `deadline`. `None`: failed, timed out or plain HTTP (answered);
/// counted either way.
async fn handshake(
    stream: TcpStream,
    shard: &Shard,
    acceptors: &Acceptors,
    deadline: Duration,
) -> Option<ClientConn> {
    let stats = &shard.tls;
    let fd = stream.as_raw_fd();
    let first = monoio::time::timeout(deadline, first_byte(&stream)).await;
    match first {
        Ok(First::Tls) => {}
        Ok(First::PlainHttp) => {
            bump(&stats.plain_http);
            refuse_plain_http(stream, shard).await;
            return None;
        }
        Ok(First::Gone) => {
            bump(&stats.errors);
            return None;
        }
        Err(_) => {
            bump(&stats.timeouts);
            return None;
        }
    }
    let acceptor = acceptors.get();
    match monoio::time::timeout(deadline, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => {
            bump(&stats.handshakes);
            Some(ClientConn::pooled(
                ClientStream::tls(tls, fd),
                &shard.read_bufs,
            ))
        }
        Ok(Err(_)) => {
            bump(&stats.errors);
            None
        }
        Err(_) => {
            bump(&stats.timeouts);
            None
        }
    }
}

/// Wait for the client's first byte and look at it without consuming it.
async fn first_byte(stream: &TcpStream) -> First {
    loop {
        if stream.readable(false).await.is_err() {
            return First::Gone;
        }
        match peek_byte(stream.as_raw_fd()) {
            Peek::Byte(0x16) => return First::Tls,
            Peek::Byte(b) if b.is_ascii_uppercase() => return First::PlainHttp,
            // Neither: not a client we can talk to.
            Peek::Byte(_) => return First::Gone,
            Peek::Nothing => continue,
            Peek::Closed => return First::Gone,
        }
    }
}

enum Peek {
    Byte(u8),
    Nothing,
    Closed,
}

fn peek_byte(fd: RawFd) -> Peek {
    use nix::errno::Errno;
    use nix::sys::socket::{recv, MsgFlags};
    let mut b = [0u8; 1];
    loop {
        return match recv(fd, &mut b, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
            Ok(0) => Peek::Closed,
            Ok(_) => Peek::Byte(b[0]),
            Err(Errno::EAGAIN) => Peek::Nothing,
            Err(Errno::EINTR) => continue,
            Err(_) => Peek::Closed,
        };
    }
}

/// Plain HTTP on the TLS port: read the request head (briefly), answer 400 in plain HTTP
/// saying to use https, close.
async fn refuse_plain_http(stream: TcpStream, shard: &Shard) {
    let mut conn = ClientConn::pooled(ClientStream::Plain(stream), &shard.read_bufs);
    let wait = shard.limits.header_timeout.min(OVER_CAP_HANDSHAKE);
    let limits = crate::http::conn::Limits {
        idle_timeout: wait,
        header_timeout: wait,
        ..shard.limits
    };
    let _ = conn.read_head(&limits).await;
    let e = Error::new(
        Kind::BadRequest,
        "this port speaks TLS: send the request with https://",
    );
    shard
        .sink(false)
        .error(&mut conn, &e, ErrorShape::OpenAi)
        .await;
}
