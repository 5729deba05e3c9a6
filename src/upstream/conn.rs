//! One upstream connection: plain TCP or rustls over TCP, behind one type that implements
//! monoio's owned-buffer read/write traits.
//!
//! Owns: connecting (with timeout), TCP_NODELAY, the TLS handshake with SNI, and the
//! before-reuse check of an idle connection (`is_quiet`). An idle plain connection keeps one
//! read armed ([`Conn::arm`]): a close or stray bytes complete that read while the connection
//! sits in the pool, so the check before reuse is a look at the read's state (no syscall), and
//! the same read then receives the answer's first bytes ([`Conn::armed_read`]) — the way nginx,
//! pingora and Envoy watch an idle keep-alive upstream. TLS connections keep the one
//! `MSG_PEEK` of the raw socket (a record may arrive that rustls must see first).
//! Must not: speak HTTP.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent, OwnedReadHalf, OwnedWriteHalf, Splitable};
use monoio::net::TcpStream;
use monoio::BufResult;
use monoio_rustls::{ClientTlsStream as TlsStream, TlsConnector};
use rustls::pki_types::ServerName;

use super::slow::Slow;

/// The read armed on an idle plain connection: it yields the read half back with the bytes it
/// read into the buffer it was given (`Ok(0)`: the peer closed).
type ArmedRead = Pin<Box<dyn Future<Output = (OwnedReadHalf<TcpStream>, ReadResult)>>>;
type ReadResult = (io::Result<usize>, Vec<u8>);

/// Largest buffer an idle connection keeps for its armed read (a larger one — a stream's, grown
/// past it — is freed and replaced by a fresh [`ARMED_BUF`] one: idle connections hold little
/// memory). A small answer's 4 KiB buffer stays with its connection, request after request.
pub const ARMED_BUF_MAX: usize = 4 * 1024;
/// Size of the buffer an idle connection's armed read gets when none is handed over.
pub const ARMED_BUF: usize = 2 * 1024;

pub enum Conn {
    Plain(TcpStream),
    /// A plain connection with one read armed (it was idle in the pool): writes go through the
    /// write half; the read (`None` once lost to a timeout) yields the answer's first bytes.
    /// Both are `Option`s only so [`Conn::armed_read`] can take them apart in place; the fd.
    Armed(Option<OwnedWriteHalf<TcpStream>>, Option<ArmedRead>, RawFd),
    /// A plain connection after its first armed read: kept split (the halves' shared cell is
    /// allocated once per connection, not per request); the fd for `is_quiet`.
    Halves(OwnedReadHalf<TcpStream>, OwnedWriteHalf<TcpStream>, RawFd),
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

    /// Prepare a connection for the pool: a plain one gets one read armed into `buf` (a fresh
    /// [`ARMED_BUF`] one if `buf` is larger than [`ARMED_BUF_MAX`] or smaller than that),
    /// submitted now; others are unchanged.
    pub fn arm(self, mut buf: Vec<u8>) -> Conn {
        let (mut r, w, fd) = match self {
            Conn::Plain(s) => {
                let fd = s.as_raw_fd();
                let (r, w) = s.into_split();
                (r, w, fd)
            }
            Conn::Halves(r, w, fd) => (r, w, fd),
            other => return other,
        };
        if buf.capacity() > ARMED_BUF_MAX || buf.capacity() < ARMED_BUF {
            buf = Vec::with_capacity(ARMED_BUF);
        }
        // a read into a `Vec` fills it from the start, up to its capacity
        buf.clear();
        let mut read: ArmedRead = Box::pin(async move {
            let (res, buf) = r.read(buf).await;
            (r, (res, buf))
        });
        // The first poll submits the read (io_uring) or registers interest (epoll); a
        // completion found here means the connection is already unusable.
        match read.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Pending => Conn::Armed(Some(w), Some(read), fd),
            Poll::Ready(_) => Conn::Armed(Some(w), None, fd),
        }
    }

    /// An idle connection may carry a new request only if nothing is pending on it: bytes
    /// (a late second response, an error the peer sent after the answer) or a close. An armed
    /// plain connection: its read has not completed (polled once, no syscall under io_uring).
    /// TLS: one non-blocking `MSG_PEEK` of the raw socket; any record arriving on an idle
    /// connection (alert, close_notify, ticket) discards it too — conservative.
    pub fn is_quiet(&mut self) -> bool {
        let fd = match self {
            Conn::Armed(_, read, _) => {
                let Some(r) = read.as_mut() else {
                    return false;
                };
                if r.as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
                    .is_pending()
                {
                    return true;
                }
                // completed (bytes, close or error): never polled again
                *read = None;
                return false;
            }
            Conn::Plain(s) => s.as_raw_fd(),
            Conn::Halves(_, _, fd) | Conn::Tls(_, fd) => *fd,
            Conn::Pipe(_) => return false,
        };
        crate::util::sock::peek(fd) == crate::util::sock::Peeked::Quiet
    }

    /// The armed read's outcome, waited for until `deadline`: `None` when no read is armed
    /// (read with `read` as usual). `Some(Ok(n))`: `n` bytes are in `buf` (the armed read's
    /// buffer, now the caller's; `0`: the peer closed); the connection is plain again.
    /// `watch`: fired at its instant if the read is still waiting then — by the deadline's own
    /// timer entry, set first to the earlier instant and then moved on to the deadline.
    pub async fn armed_read(
        &mut self,
        buf: &mut Vec<u8>,
        deadline: Instant,
        watch: Option<(&Slow, Instant)>,
    ) -> Option<io::Result<usize>> {
        let Conn::Armed(_, read, _) = self else {
            return None;
        };
        let Some(mut fut) = read.take() else {
            return Some(Err(io::Error::other("the armed read was lost")));
        };
        let watch = watch.filter(|(s, at)| *at < deadline && !s.is_due());
        let first_wake = watch.map_or(deadline, |(_, at)| at);
        let mut timer = std::pin::pin!(monoio::time::sleep_until(first_wake.into()));
        let read = std::future::poll_fn(|cx| {
            if let Poll::Ready(done) = fut.as_mut().poll(cx) {
                return Poll::Ready(Some(done));
            }
            while timer.as_mut().poll(cx).is_ready() {
                match watch {
                    Some((s, _)) if !s.is_due() => {
                        s.fire();
                        timer.as_mut().reset(deadline.into());
                    }
                    _ => return Poll::Ready(None),
                }
            }
            Poll::Pending
        });
        let Some((half, (res, got))) = read.await else {
            return Some(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "read timed out",
            )));
        };
        *buf = got;
        let Conn::Armed(w, _, fd) = self else {
            return Some(res);
        };
        let fd = *fd;
        let Some(w) = w.take() else {
            return Some(Err(io::Error::other(
                "the armed connection's write half is lost",
            )));
        };
        *self = Conn::Halves(half, w, fd);
        Some(res)
    }
}

impl AsyncReadRent for Conn {
    async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Conn::Plain(s) => s.read(buf).await,
            Conn::Halves(r, _, _) => r.read(buf).await,
            Conn::Armed(..) => (Err(armed()), buf),
            Conn::Tls(s, _) => s.read(buf).await,
            Conn::Pipe(p) => p.read(buf).await,
        }
    }

    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Conn::Plain(s) => s.readv(buf).await,
            Conn::Halves(r, _, _) => r.readv(buf).await,
            Conn::Armed(..) => (Err(armed()), buf),
            Conn::Tls(s, _) => s.readv(buf).await,
            Conn::Pipe(p) => p.readv(buf).await,
        }
    }
}

impl AsyncWriteRent for Conn {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Conn::Plain(s) => s.write(buf).await,
            Conn::Armed(Some(w), _, _) | Conn::Halves(_, w, _) => w.write(buf).await,
            Conn::Armed(None, _, _) => (Err(armed()), buf),
            Conn::Tls(s, _) => s.write(buf).await,
            Conn::Pipe(_) => (Err(read_only()), buf),
        }
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        match self {
            Conn::Plain(s) => s.writev(buf).await,
            Conn::Armed(Some(w), _, _) | Conn::Halves(_, w, _) => w.writev(buf).await,
            Conn::Armed(None, _, _) => (Err(armed()), buf),
            Conn::Tls(s, _) => s.writev(buf).await,
            Conn::Pipe(_) => (Err(read_only()), buf),
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush().await,
            Conn::Armed(Some(w), _, _) | Conn::Halves(_, w, _) => w.flush().await,
            Conn::Armed(None, _, _) => Err(armed()),
            Conn::Tls(s, _) => s.flush().await,
            Conn::Pipe(_) => Ok(()),
        }
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.shutdown().await,
            Conn::Armed(Some(w), _, _) | Conn::Halves(_, w, _) => w.shutdown().await,
            Conn::Armed(None, _, _) => Err(armed()),
            Conn::Tls(s, _) => s.shutdown().await,
            Conn::Pipe(_) => Ok(()),
        }
    }
}

/// A read on an armed connection goes through [`Conn::armed_read`] first.
fn armed() -> io::Error {
    io::Error::other("armed upstream connection: its armed read comes first")
}

fn read_only() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "an in-memory answer pipe is read-only",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A connected pair: the gateway side (armed) and the peer's std socket.
    async fn pair() -> (Conn, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let c = Conn::connect(addr, None, Duration::from_secs(5))
            .await
            .unwrap();
        let (peer, _) = l.accept().unwrap();
        (c.arm(Vec::with_capacity(ARMED_BUF)), peer)
    }

    /// Poll `is_quiet` (letting the driver reap completions in between) until it says `want`.
    async fn quiet_becomes(c: &mut Conn, want: bool) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if c.is_quiet() == want {
                return true;
            }
            monoio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    }

    #[monoio::test(driver = "iouring", enable_timer = true)]
    async fn an_armed_connection_sees_stray_bytes_and_close_iouring() {
        sees_stray_bytes_and_close().await
    }

    #[monoio::test(driver = "legacy", enable_timer = true)]
    async fn an_armed_connection_sees_stray_bytes_and_close_epoll() {
        sees_stray_bytes_and_close().await
    }

    #[monoio::test(driver = "iouring", enable_timer = true)]
    async fn the_armed_read_receives_the_next_answer_iouring() {
        receives_the_next_answer().await
    }

    #[monoio::test(driver = "legacy", enable_timer = true)]
    async fn the_armed_read_receives_the_next_answer_epoll() {
        receives_the_next_answer().await
    }

    #[monoio::test(driver = "iouring", enable_timer = true)]
    async fn the_armed_read_fires_the_watch_then_times_out_iouring() {
        fires_the_watch_then_times_out().await
    }

    #[monoio::test(driver = "legacy", enable_timer = true)]
    async fn the_armed_read_fires_the_watch_then_times_out_epoll() {
        fires_the_watch_then_times_out().await
    }

    /// A silent peer: the watch's instant fires it (one timer entry, moved on), the deadline
    /// still ends the read; an answer before the watch's instant leaves it unfired.
    async fn fires_the_watch_then_times_out() {
        let (mut c, _peer) = pair().await;
        let slow = Slow::new(Duration::from_millis(20));
        let start = Instant::now();
        let deadline = start + Duration::from_secs(1);
        let watch = Some((&slow, start + slow.after()));
        let mut buf = Vec::new();
        let r = c.armed_read(&mut buf, deadline, watch).await.unwrap();
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert!(slow.is_due(), "the watch fired on the way");
        assert!(
            Instant::now() >= deadline,
            "the deadline, not the watch, ended the read"
        );

        let (mut c, mut peer) = pair().await;
        peer.write_all(b"fast").unwrap();
        let slow = Slow::new(Duration::from_secs(5));
        let start = Instant::now();
        let watch = Some((&slow, start + slow.after()));
        let n = c
            .armed_read(&mut buf, start + Duration::from_secs(10), watch)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"fast");
        assert!(!slow.is_due(), "a fast answer never fires the watch");
    }

    async fn sees_stray_bytes_and_close() {
        let (mut c, mut peer) = pair().await;
        assert!(matches!(c, Conn::Armed(Some(_), Some(_), _)));
        assert!(c.is_quiet(), "nothing pending yet");
        peer.write_all(b"HTTP/1.1 200 OK\r\n").unwrap();
        assert!(
            quiet_becomes(&mut c, false).await,
            "stray bytes complete the armed read"
        );
        assert!(!c.is_quiet(), "and it stays unusable");

        let (mut c, peer) = pair().await;
        drop(peer);
        assert!(
            quiet_becomes(&mut c, false).await,
            "a close completes the armed read"
        );
    }

    /// ... and the connection is usable as a plain one after it (kept split), armed again.
    async fn receives_the_next_answer() {
        let (mut c, mut peer) = pair().await;
        assert!(c.is_quiet());
        let (r, _) = c.write(b"GET / HTTP/1.1\r\n\r\n".to_vec()).await;
        assert_eq!(
            r.unwrap(),
            18,
            "writes go through the write half while the read waits"
        );
        let mut req = [0u8; 18];
        peer.read_exact(&mut req).unwrap();
        peer.write_all(b"answer").unwrap();
        let mut buf = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let n = c
            .armed_read(&mut buf, deadline, None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"answer");
        assert!(matches!(c, Conn::Halves(..)));
        assert!(c.armed_read(&mut buf, deadline, None).await.is_none());
        peer.write_all(b" more").unwrap();
        let (r, b) = c.read(Vec::with_capacity(16)).await;
        assert_eq!(&b[..r.unwrap()], b" more");
        let mut c = c.arm(b);
        assert!(c.is_quiet(), "armed again, from its halves");
        peer.write_all(b"x").unwrap();
        assert!(quiet_becomes(&mut c, false).await);
    }
}
