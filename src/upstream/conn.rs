//! One upstream connection: plain TCP or rustls over TCP, behind one type that implements
//! monoio's owned-buffer read/write traits.
//!
//! Owns: connecting (with timeout), TCP_NODELAY, the TLS handshake with SNI.
//! Must not: speak HTTP.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::net::TcpStream;
use monoio::BufResult;
use monoio_rustls::{ClientTlsStream as TlsStream, TlsConnector};
use rustls::pki_types::ServerName;

pub enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
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
                    let name = ServerName::try_from(host.to_string())
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                    let s = connector
                        .connect(name, tcp)
                        .await
                        .map_err(|e| io::Error::other(format!("TLS handshake: {e}")))?;
                    Ok(Conn::Tls(Box::new(s)))
                }
            }
        };
        match monoio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
        }
    }
}

impl AsyncReadRent for Conn {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Conn::Plain(s) => s.read(buf).await,
            Conn::Tls(s) => s.read(buf).await,
        }
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Conn::Plain(s) => s.readv(buf).await,
            Conn::Tls(s) => s.readv(buf).await,
        }
    }
}

impl AsyncWriteRent for Conn {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Conn::Plain(s) => s.write(buf).await,
            Conn::Tls(s) => s.write(buf).await,
        }
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Conn::Plain(s) => s.writev(buf).await,
            Conn::Tls(s) => s.writev(buf).await,
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush().await,
            Conn::Tls(s) => s.flush().await,
        }
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.shutdown().await,
            Conn::Tls(s) => s.shutdown().await,
        }
    }
}
