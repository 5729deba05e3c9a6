//! The byte stream under a client connection: plain TCP, or TLS (rustls through monoio-rustls)
//! after the listener's handshake (`tls::listener`). One enum behind monoio's owned-buffer
//! read/write traits, so framing code stays the same for both; the plain path costs one branch.
//!
//! Owns: `ClientStream`, and keeping a TLS stream safe to drop mid-operation: monoio-rustls
//! lends its internal buffer to the socket operation, so a read or write future dropped while
//! pending (a timeout, a drain) leaves that stream unusable — every later operation on it fails
//! with an error instead of reaching the TLS layer (which would panic). Callers close such a
//! connection anyway. Must not: speak HTTP, or hold buffers for idle plain connections (the
//! idle path in `conn` reads plain sockets with a cancelable read and no buffer).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::net::TcpStream;
use monoio::BufResult;
use monoio_rustls::ServerTlsStream;

/// A client connection's stream.
pub enum ClientStream {
    Plain(TcpStream),
    /// Boxed: a TLS stream (and its futures) is large; plain connections do not pay for it.
    Tls(Box<TlsClient>),
}

/// A server-side TLS stream, the fd of its TCP socket, and whether a cancelled operation has
/// left it unusable.
pub struct TlsClient {
    stream: ServerTlsStream<TcpStream>,
    fd: RawFd,
    /// A read was dropped while pending: its buffer is gone, no further read may run.
    read_broken: bool,
    /// A write was dropped while pending: no further read or write may run (a read may write
    /// an alert).
    write_broken: bool,
}

/// How often a TLS connection whose answer is pending upstream checks whether its client left
/// (plain connections are woken by readiness instead; see [`ClientStream::wait_closed`]).
const TLS_CLOSE_POLL: Duration = Duration::from_millis(250);

impl ClientStream {
    /// A TLS stream after a completed handshake; `fd` is its TCP socket's.
    pub fn tls(stream: ServerTlsStream<TcpStream>, fd: RawFd) -> ClientStream {
        ClientStream::Tls(Box::new(TlsClient {
            stream,
            fd,
            read_broken: false,
            write_broken: false,
        }))
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, ClientStream::Tls(_))
    }

    /// Resolves when the client has closed or reset the connection; stays pending while it is
    /// silent or has sent more bytes (bytes are only peeked at, never read). Plain sockets are
    /// watched by readiness; TLS ones are peeked at every 250 ms. Known limit: a TLS client that
    /// closes with a close_notify record first (data, to a peek) is not noticed here — only
    /// when a write to it fails; clients that just close or reset (most SDKs' cancels) are.
    pub async fn wait_closed(&self) {
        use crate::util::sock::{peek, Peeked};
        match self {
            ClientStream::Plain(s) => loop {
                if s.readable(false).await.is_err() {
                    return;
                }
                match peek(s.as_raw_fd()) {
                    Peeked::Closed => return,
                    Peeked::Quiet => continue,
                    Peeked::Data => std::future::pending::<()>().await,
                }
            },
            ClientStream::Tls(t) => loop {
                match peek(t.fd) {
                    Peeked::Closed => return,
                    Peeked::Quiet => monoio::time::sleep(TLS_CLOSE_POLL).await,
                    Peeked::Data => std::future::pending::<()>().await,
                }
            },
        }
    }
}

impl From<TcpStream> for ClientStream {
    fn from(s: TcpStream) -> Self {
        ClientStream::Plain(s)
    }
}

impl AsRawFd for ClientStream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            ClientStream::Plain(s) => s.as_raw_fd(),
            ClientStream::Tls(t) => t.fd,
        }
    }
}

fn broken() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "TLS connection unusable after a cancelled operation",
    )
}

impl TlsClient {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        if self.read_broken || self.write_broken {
            return (Err(broken()), buf);
        }
        self.read_broken = true;
        let r = self.stream.read(buf).await;
        self.read_broken = false;
        r
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        if self.read_broken || self.write_broken {
            return (Err(broken()), buf);
        }
        self.read_broken = true;
        let r = self.stream.readv(buf).await;
        self.read_broken = false;
        r
    }

    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        if self.write_broken {
            return (Err(broken()), buf);
        }
        self.write_broken = true;
        let r = self.stream.write(buf).await;
        self.write_broken = false;
        r
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        if self.write_broken {
            return (Err(broken()), buf);
        }
        self.write_broken = true;
        let r = self.stream.writev(buf).await;
        self.write_broken = false;
        r
    }

    async fn flush(&mut self) -> io::Result<()> {
        if self.write_broken {
            return Err(broken());
        }
        self.write_broken = true;
        let r = self.stream.flush().await;
        self.write_broken = false;
        r
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        if self.write_broken {
            return Err(broken());
        }
        self.write_broken = true;
        let r = self.stream.shutdown().await;
        self.write_broken = false;
        r
    }
}

impl AsyncReadRent for ClientStream {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ClientStream::Plain(s) => s.read(buf).await,
            ClientStream::Tls(t) => Box::pin(t.read(buf)).await,
        }
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ClientStream::Plain(s) => s.readv(buf).await,
            ClientStream::Tls(t) => Box::pin(t.readv(buf)).await,
        }
    }
}

impl AsyncWriteRent for ClientStream {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ClientStream::Plain(s) => s.write(buf).await,
            ClientStream::Tls(t) => Box::pin(t.write(buf)).await,
        }
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            ClientStream::Plain(s) => s.writev(buf).await,
            ClientStream::Tls(t) => Box::pin(t.writev(buf)).await,
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        match self {
            ClientStream::Plain(s) => s.flush().await,
            ClientStream::Tls(t) => Box::pin(t.flush()).await,
        }
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            ClientStream::Plain(s) => s.shutdown().await,
            ClientStream::Tls(t) => Box::pin(t.shutdown()).await,
        }
    }
}
