//! Unix-socket upstreams: a co-located engine reached at `base_url = "unix:/run/vllm.sock:/v1"`
//! (the form: `config::endpoint::UNIX`), skipping the loopback TCP stack (no handshake, no
//! segments, no Nagle or delayed ACKs).
//!
//! The connected socket is carried in monoio's `TcpStream`, which is a stream-socket fd wrapper
//! under both drivers (reads and writes are `recv` / `send` / `writev` / `shutdown`, family
//! agnostic), so a Unix connection is a `Conn::Plain` like a TCP one: the same pool, the same
//! armed read on an idle connection (a close or stray bytes evict it before reuse) and the same
//! retry-before-first-byte rule — one code path, not a copy. Nothing TCP-only (`set_nodelay`,
//! `peer_addr`) is ever called on it. No unsafe code: the fd moves through `OwnedFd`.
//!
//! Owns: connecting to the socket. Must not: speak HTTP or keep connections (the pool does).

use std::io;
use std::os::fd::OwnedFd;

use monoio::net::TcpStream;
use socket2::{Domain, SockAddr, Socket, Type};

/// Connect to the Unix socket at `path`, without blocking the shard: a Unix `connect` completes
/// at once or fails at once (`ENOENT`: no socket; `ECONNREFUSED`: nobody listens;
/// `EAGAIN`: the engine's accept backlog is full), so no timeout is needed.
pub fn connect(path: &str) -> io::Result<TcpStream> {
    let sock = Socket::new(Domain::UNIX, Type::STREAM.nonblocking().cloexec(), None)?;
    match sock.connect(&SockAddr::unix(path)?) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the engine's accept backlog is full",
            ))
        }
        Err(e) => return Err(e),
    }
    // As monoio makes its own sockets: non-blocking for epoll, blocking under io_uring (the
    // ring polls a socket whose operation would block).
    if !monoio::utils::is_legacy() {
        sock.set_nonblocking(false)?;
    }
    TcpStream::from_std(std::net::TcpStream::from(OwnedFd::from(sock)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
    use std::io::{Read, Write};

    fn socket_path(tag: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("rg-unix-{}-{tag}.sock", std::process::id()))
    }

    async fn round_trip(tag: &str) {
        let path = socket_path(tag);
        let _ = std::fs::remove_file(&path);
        let p = path.to_str().unwrap().to_string();
        let e = connect(&p).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "no socket yet: {e}");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut s = connect(&p).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        let (r, _) = s.write_all(b"ping".to_vec()).await;
        r.unwrap();
        let mut got = [0u8; 4];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        peer.write_all(b"pong").unwrap();
        let (n, buf) = s.read(Vec::with_capacity(16)).await;
        assert_eq!(&buf[..n.unwrap()], b"pong");
        drop(peer);
        let (n, _) = s.read(Vec::with_capacity(16)).await;
        assert_eq!(n.unwrap(), 0, "the engine's close reads as EOF");
        drop(l);
        let e = connect(&p).unwrap_err();
        assert_eq!(
            e.kind(),
            io::ErrorKind::ConnectionRefused,
            "a stale socket file, nobody listening: {e}"
        );
        let _ = std::fs::remove_file(&path);
    }

    #[monoio::test(driver = "iouring", enable_timer = true)]
    async fn connects_reads_writes_and_sees_eof_iouring() {
        round_trip("iouring").await
    }

    #[monoio::test(driver = "legacy", enable_timer = true)]
    async fn connects_reads_writes_and_sees_eof_epoll() {
        round_trip("epoll").await
    }
}
