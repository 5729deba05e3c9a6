//! One upstream connection: plain TCP or rustls over TCP, behind one type that implements
//! monoio's owned-buffer read/write traits.
//!
//! Owns: connecting (with timeout), TCP_NODELAY, the TLS handshake with SNI, and the
//! before-reuse check of an idle connection (`is_quiet`).
//! Must not: speak HTTP.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::net::TcpStream;
use monoio::BufResult;
use monoio_rustls::{ClientTlsStream as TlsStream, TlsConnector};
use rustls::pki_types::ServerName;

pub enum Conn {
    Plain(TcpStream),
    /// The TLS stream and the fd of the TCP socket inside it (valid while the stream lives).
    Tls(Box<TlsStream<TcpStream>>, RawFd),
    /// The reading end of an in-memory pipe (in-process answers); read-only, never pooled.
    Pipe(super::pipe::PipeReader),
}

impl Conn {
    pub async fn connect(
        addr: SocketAddr,
        tls: Option<(&TlsConnector, &str)>,
        timeout: Duration,
    ) -> io::Result<Conn> {
        let fut = async {
            let tcp = TcpStream::connect_addr(addr).await?;
            tcp.set_nodelay(true)?;
            match tls {
                None => Ok(Conn::Plain(tcp)),
                Some((connector, host)) => {
                    let fd = tcp.as_raw_fd();
                    let name = ServerName::try_from(host.to_string())
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                    let s = connector
                        .connect(name, tcp)
                        .await
                        .map_err(|e| io::Error::other(format!("TLS handshake: {e}")))?;
                    Ok(Conn::Tls(Box::new(s), fd))
                }
            }
        };
        match monoio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
        }
    }

    /// An idle connection may carry a new request only if nothing is pending on it: bytes
    /// (a late second response, an error the peer sent after the answer) or a close. One
    /// non-blocking `MSG_PEEK` syscall. For TLS the raw socket is checked: any record arriving
    /// on an idle connection (alert, close_notify, ticket) discards it too — conservative.
    pub fn is_quiet(&self) -> bool {
        let fd = match self {
            Conn::Plain(s) => s.as_raw_fd(),
            Conn::Tls(_, fd) => *fd,
            Conn::Pipe(_) => return false,
        };
        crate::util::sock::peek(fd) == crate::util::sock::Peeked::Quiet
    }
}

impl AsyncReadRent for Conn {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Conn::Plain(s) => s.read(buf).await,
            Conn::Tls(s, _) => s.read(buf).await,
            Conn::Pipe(p) => p.read(buf).await,
        }
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Conn::Plain(s) => s.readv(buf).await,
            Conn::Tls(s, _) => s.readv(buf).await,
            Conn::Pipe(p) => p.readv(buf).await,
        }
    }
}

impl AsyncWriteRent for Conn {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Conn::Plain(s) => s.write(buf).await,
            Conn::Tls(s, _) => s.write(buf).await,
            Conn::Pipe(_) => (Err(read_only()), buf),
        }
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Conn::Plain(s) => s.writev(buf).await,
            Conn::Tls(s, _) => s.writev(buf).await,
            Conn::Pipe(_) => (Err(read_only()), buf),
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush().await,
            Conn::Tls(s, _) => s.flush().await,
            Conn::Pipe(_) => Ok(()),
        }
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.shutdown().await,
            Conn::Tls(s, _) => s.shutdown().await,
            Conn::Pipe(_) => Ok(()),
        }
    }
}

fn read_only() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "an in-memory answer pipe is read-only",
    )
}
