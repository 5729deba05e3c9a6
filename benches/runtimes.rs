//! Runtime decision-record bench: runs ONE server variant on the current thread and prints its
//! address, so an outside load generator (wrk, `benches/loadgen`) can measure it.
//!
//! ```text
//! cargo bench --bench runtimes --no-run
//! taskset -c 0 target/release/deps/runtimes-<hash> --variant monoio-uring-flags --mode responder
//! taskset -c 0 target/release/deps/runtimes-<hash> --variant monoio-epoll --mode proxy \
//!     --upstream 127.0.0.1:PORT
//! cargo bench --bench runtimes --features glommio-bench --no-run   # for --variant glommio
//! ```
//!
//! The HTTP logic (request parsing, pipelining, the keep-alive proxy and its upstream pool) is
//! written once, generic over a tiny [`Conn`] trait; only accept loops and socket adapters differ
//! per runtime. Results and the decision: `bench-results/runtimes.md`.

use std::cell::RefCell;
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::rc::Rc;

const USAGE: &str = "\
ringgate runtime bench: one server variant, address printed on stdout

USAGE:
  runtimes --variant VARIANT --mode responder [--listen ADDR]
  runtimes --variant VARIANT --mode proxy --upstream HOST:PORT [--listen ADDR]

  --variant   monoio-uring-flags | monoio-uring | monoio-epoll | glommio
              (glommio needs `--features glommio-bench`)
  --mode      responder: fixed 200 JSON response to any request (keep-alive, pipelining)
              proxy: 1-core keep-alive HTTP/1.1 reverse proxy to --upstream
  --listen    bind address                                   [127.0.0.1:0]
";

/// Bytes requested per read; the read buffer grows by this much when it is full.
const READ_CHUNK: usize = 8 * 1024;
/// Largest request or response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Largest Content-Length accepted (request or response).
const MAX_BODY: usize = 16 * 1024 * 1024;
/// Idle upstream connections kept per proxy.
const MAX_IDLE_UPSTREAM: usize = 1024;

const RESPONDER_BODY: &str = r#"{"id":"bench-1","object":"chat.completion","model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#;
const BAD_GATEWAY: &[u8] =
    b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
const BAD_REQUEST: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

#[derive(Clone, Copy, Debug)]
enum Variant {
    MonoioUringFlags,
    MonoioUring,
    MonoioEpoll,
    Glommio,
}

impl Variant {
    fn parse(s: &str) -> Result<Self, String> {
        Ok(match s {
            "monoio-uring-flags" => Self::MonoioUringFlags,
            "monoio-uring" => Self::MonoioUring,
            "monoio-epoll" => Self::MonoioEpoll,
            "glommio" => Self::Glommio,
            other => return Err(format!("unknown --variant {other:?}")),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::MonoioUringFlags => "monoio-uring-flags",
            Self::MonoioUring => "monoio-uring",
            Self::MonoioEpoll => "monoio-epoll",
            Self::Glommio => "glommio",
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Responder,
    Proxy { upstream: SocketAddr },
}

struct Args {
    variant: Variant,
    mode: Mode,
    listen: SocketAddr,
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut variant = None;
    let mut mode = None;
    let mut upstream: Option<SocketAddr> = None;
    let mut listen: SocketAddr = "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--variant" => variant = Some(Variant::parse(&value()?)?),
            "--mode" => mode = Some(value()?),
            "--upstream" => {
                let v = value()?;
                upstream = Some(v.parse().map_err(|e| format!("--upstream {v:?}: {e}"))?);
            }
            "--listen" => {
                let v = value()?;
                listen = v.parse().map_err(|e| format!("--listen {v:?}: {e}"))?;
            }
            // `cargo bench` passes `--bench` to harness = false targets.
            "--bench" => {}
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let variant = variant.ok_or("--variant is required")?;
    let mode = match mode.as_deref() {
        Some("responder") => Mode::Responder,
        Some("proxy") => Mode::Proxy {
            upstream: upstream.ok_or("--mode proxy needs --upstream HOST:PORT")?,
        },
        Some(other) => return Err(format!("unknown --mode {other:?}")),
        None => return Err("--mode is required".into()),
    };
    Ok(Args {
        variant,
        mode,
        listen,
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&args) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match args.variant {
        Variant::MonoioUringFlags | Variant::MonoioUring | Variant::MonoioEpoll => {
            monoio_rt::run(&args)
        }
        Variant::Glommio => run_glommio(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "error: {} ({}): {e}",
                args.variant.name(),
                mode_name(args.mode)
            );
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "glommio-bench")]
fn run_glommio(args: &Args) -> io::Result<()> {
    glommio_rt::run(args)
}

#[cfg(not(feature = "glommio-bench"))]
fn run_glommio(_args: &Args) -> io::Result<()> {
    eprintln!(
        "error: --variant glommio needs the `glommio-bench` feature: \
         cargo bench --bench runtimes --features glommio-bench"
    );
    std::process::exit(2);
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Responder => "responder",
        Mode::Proxy { .. } => "proxy",
    }
}

/// Printed once the listener is bound; scripts read the address from this line.
fn announce(variant: Variant, mode: Mode, addr: SocketAddr) {
    let mut out = io::stdout().lock();
    let _ = writeln!(
        out,
        "listening http://{addr} variant={} mode={}",
        variant.name(),
        mode_name(mode)
    );
    let _ = out.flush();
}

fn responder_bytes() -> Rc<[u8]> {
    let mut r = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        RESPONDER_BODY.len()
    )
    .into_bytes();
    r.extend_from_slice(RESPONDER_BODY.as_bytes());
    r.into()
}

// ---------------------------------------------------------------------------------------------
// Runtime-neutral I/O surface
// ---------------------------------------------------------------------------------------------

/// The two socket operations the HTTP logic needs. Implemented for monoio's ownership-passing
/// streams and glommio's poll-based streams.
trait Conn: Sized {
    /// Reads at least one byte appended to `buf` (growing it if full); `Ok(0)` is EOF.
    async fn read_more(&mut self, buf: &mut Vec<u8>) -> io::Result<usize>;
    /// Writes all of `buf`, handing the buffer back for reuse.
    async fn write_all_buf(&mut self, buf: Vec<u8>) -> (io::Result<()>, Vec<u8>);
}

/// An upstream connection the proxy can open.
trait Connect: Conn {
    async fn connect(addr: SocketAddr) -> io::Result<Self>;
}

fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1 framing (httparse)
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Framed {
    head_len: usize,
    body_len: usize,
    close: bool,
    /// Request method is HEAD (its response has no body whatever Content-Length says).
    head_method: bool,
}

impl Framed {
    fn total(&self) -> usize {
        self.head_len + self.body_len
    }
}

/// Content-Length / Connection / Transfer-Encoding from a parsed head.
fn framing_headers(headers: &[httparse::Header<'_>], http10: bool) -> io::Result<(usize, bool)> {
    let mut body_len = 0usize;
    let mut close = http10;
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or_else(|| invalid("bad content-length"))?;
            if v > MAX_BODY {
                return Err(invalid("body too large"));
            }
            body_len = v;
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(invalid("transfer-encoding not supported by this bench"));
        } else if h.name.eq_ignore_ascii_case("connection") {
            if h.value.eq_ignore_ascii_case(b"close") {
                close = true;
            } else if h.value.eq_ignore_ascii_case(b"keep-alive") {
                close = false;
            }
        }
    }
    Ok((body_len, close))
}

/// `Ok(None)` until a whole request (head and Content-Length body) is in `buf`.
fn parse_request(buf: &[u8]) -> io::Result<Option<Framed>> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(invalid("request head too large"))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(invalid("malformed request head")),
    };
    let (body_len, close) = framing_headers(req.headers, req.version == Some(0))?;
    let framed = Framed {
        head_len,
        body_len,
        close,
        head_method: req.method == Some("HEAD"),
    };
    Ok((buf.len() >= framed.total()).then_some(framed))
}

/// `Ok(None)` until a whole response is in `buf`. 1xx interim responses are not supported.
fn parse_response(buf: &[u8], head_request: bool) -> io::Result<Option<Framed>> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(invalid("response head too large"))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(invalid("malformed response head")),
    };
    let code = resp.code.unwrap_or(0);
    if (100..200).contains(&code) {
        return Err(invalid("interim responses not supported by this bench"));
    }
    let (mut body_len, close) = framing_headers(resp.headers, resp.version == Some(0))?;
    if head_request || code == 204 || code == 304 {
        body_len = 0;
    }
    let framed = Framed {
        head_len,
        body_len,
        close,
        head_method: head_request,
    };
    Ok((buf.len() >= framed.total()).then_some(framed))
}

// ---------------------------------------------------------------------------------------------
// Responder
// ---------------------------------------------------------------------------------------------

/// Fixed 200 response to every request; pipelined requests are answered in one write.
async fn serve_responder<C: Conn>(mut conn: C, response: Rc<[u8]>) -> io::Result<()> {
    let mut inbuf = Vec::with_capacity(READ_CHUNK);
    let mut out = Vec::with_capacity(response.len() * 2);
    loop {
        let mut consumed = 0;
        let mut close = false;
        loop {
            match parse_request(&inbuf[consumed..]) {
                Ok(Some(req)) => {
                    consumed += req.total();
                    out.extend_from_slice(&response);
                    if req.close {
                        close = true;
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    out.extend_from_slice(BAD_REQUEST);
                    let (_, _) = conn.write_all_buf(out).await;
                    return Err(e);
                }
            }
        }
        if consumed > 0 {
            inbuf.drain(..consumed);
        }
        if !out.is_empty() {
            let (res, back) = conn.write_all_buf(out).await;
            out = back;
            out.clear();
            res?;
        }
        if close || conn.read_more(&mut inbuf).await? == 0 {
            return Ok(());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Proxy
// ---------------------------------------------------------------------------------------------

/// Idle keep-alive upstream connections (single-threaded: one per runtime).
struct Pool<U> {
    addr: SocketAddr,
    idle: RefCell<Vec<U>>,
}

impl<U: Connect> Pool<U> {
    fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            idle: RefCell::new(Vec::new()),
        }
    }

    /// A pooled connection (`true`: reused, may be stale) or a fresh one.
    async fn get(&self) -> io::Result<(U, bool)> {
        let pooled = self.idle.borrow_mut().pop();
        match pooled {
            Some(u) => Ok((u, true)),
            None => Ok((U::connect(self.addr).await?, false)),
        }
    }

    fn put(&self, u: U) {
        let mut idle = self.idle.borrow_mut();
        if idle.len() < MAX_IDLE_UPSTREAM {
            idle.push(u);
        }
    }
}

/// Reads one whole response into `buf` (cleared first). `Ok(keep_alive)`.
async fn read_response<U: Conn>(
    up: &mut U,
    buf: &mut Vec<u8>,
    head_request: bool,
) -> io::Result<bool> {
    buf.clear();
    loop {
        if let Some(resp) = parse_response(buf, head_request)? {
            // Anything past the response would be an unsolicited second response.
            let keep = !resp.close && buf.len() == resp.total();
            buf.truncate(resp.total());
            return Ok(keep);
        }
        if up.read_more(buf).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "upstream closed mid-response",
            ));
        }
    }
}

/// Keep-alive HTTP/1.1 reverse proxy connection: one request at a time, forwarded verbatim to a
/// pooled upstream connection; the response (framed by Content-Length) is written back verbatim.
async fn serve_proxy<C: Conn, U: Connect>(mut client: C, pool: Rc<Pool<U>>) -> io::Result<()> {
    let mut inbuf = Vec::with_capacity(READ_CHUNK);
    let mut upbuf = Vec::with_capacity(READ_CHUNK);
    loop {
        let req = loop {
            match parse_request(&inbuf) {
                Ok(Some(req)) => break req,
                Ok(None) => {}
                Err(e) => {
                    let (_, _) = client.write_all_buf(BAD_REQUEST.to_vec()).await;
                    return Err(e);
                }
            }
            if client.read_more(&mut inbuf).await? == 0 {
                return Ok(());
            }
        };
        // Split off any pipelined bytes; `inbuf` now holds exactly this request.
        let tail = inbuf.split_off(req.total());
        let mut retried = false;
        let outcome = loop {
            let (mut up, reused) = match pool.get().await {
                Ok(u) => u,
                Err(e) => break Err(e),
            };
            let (res, back) = up.write_all_buf(inbuf).await;
            inbuf = back;
            let res = match res {
                Ok(()) => read_response(&mut up, &mut upbuf, req.head_method).await,
                Err(e) => Err(e),
            };
            match res {
                Ok(keep) => {
                    if keep {
                        pool.put(up);
                    }
                    break Ok(());
                }
                // A pooled connection the upstream closed while idle: retry once on a new one.
                Err(_) if reused && !retried && upbuf.is_empty() => retried = true,
                Err(e) => break Err(e),
            }
        };
        inbuf.clear();
        inbuf.extend_from_slice(&tail);
        if let Err(e) = outcome {
            let (_, _) = client.write_all_buf(BAD_GATEWAY.to_vec()).await;
            return Err(e);
        }
        let (res, back) = client.write_all_buf(upbuf).await;
        upbuf = back;
        res?;
        if req.close {
            return Ok(());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// monoio (io_uring with task-run flags, default io_uring, epoll)
// ---------------------------------------------------------------------------------------------

mod monoio_rt {
    use super::*;
    use monoio::buf::IoBufMut;
    use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
    use monoio::net::{ListenerOpts, TcpListener, TcpStream};
    use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};

    impl Conn for TcpStream {
        async fn read_more(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
            if buf.capacity() - buf.len() < READ_CHUNK / 2 {
                buf.reserve(READ_CHUNK);
            }
            let (len, cap) = (buf.len(), buf.capacity());
            let owned = std::mem::take(buf);
            let (res, slice) = self.read(owned.slice_mut(len..cap)).await;
            *buf = slice.into_inner();
            res
        }

        async fn write_all_buf(&mut self, buf: Vec<u8>) -> (io::Result<()>, Vec<u8>) {
            let (res, buf) = self.write_all(buf).await;
            (res.map(|_| ()), buf)
        }
    }

    impl Connect for TcpStream {
        async fn connect(addr: SocketAddr) -> io::Result<Self> {
            let s = TcpStream::connect_addr(addr).await?;
            s.set_nodelay(true)?;
            Ok(s)
        }
    }

    pub(super) fn run(args: &Args) -> io::Result<()> {
        let (variant, mode, listen) = (args.variant, args.mode, args.listen);
        let main = async move { serve(variant, mode, listen).await };
        match variant {
            Variant::MonoioUringFlags => {
                // Kernels < 5.19 reject these flags; the product falls back to the plain ring,
                // then epoll (src/runtime/). The bench reports the error instead.
                let mut urb = io_uring::IoUring::builder();
                urb.setup_coop_taskrun().setup_single_issuer();
                RuntimeBuilder::<IoUringDriver>::new()
                    .uring_builder(urb)
                    .enable_timer()
                    .build()?
                    .block_on(main)
            }
            Variant::MonoioUring => RuntimeBuilder::<IoUringDriver>::new()
                .enable_timer()
                .build()?
                .block_on(main),
            Variant::MonoioEpoll => RuntimeBuilder::<LegacyDriver>::new()
                .enable_timer()
                .build()?
                .block_on(main),
            Variant::Glommio => Err(io::Error::other("not a monoio variant")),
        }
    }

    async fn serve(variant: Variant, mode: Mode, listen: SocketAddr) -> io::Result<()> {
        // SO_REUSEPORT off: a stale bench on the same port must make this one fail, not share.
        let listener =
            TcpListener::bind_with_config(listen, &ListenerOpts::new().reuse_port(false))?;
        announce(variant, mode, listener.local_addr()?);
        let response = responder_bytes();
        let pool = match mode {
            Mode::Proxy { upstream } => Some(Rc::new(Pool::<TcpStream>::new(upstream))),
            Mode::Responder => None,
        };
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    eprintln!("accept: {e}");
                    monoio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            match &pool {
                Some(pool) => {
                    monoio::spawn(serve_proxy(stream, Rc::clone(pool)));
                }
                None => {
                    monoio::spawn(serve_responder(stream, Rc::clone(&response)));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// glommio (feature `glommio-bench`)
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "glommio-bench")]
mod glommio_rt {
    use super::*;
    use futures_lite::{AsyncReadExt, AsyncWriteExt};
    use glommio::net::{TcpListener, TcpStream};
    use glommio::{LocalExecutorBuilder, Placement};

    /// glommio registers its buffers and panics without this much locked memory.
    const MIN_MEMLOCK: libc::rlim_t = 512 * 1024;

    impl Conn for TcpStream {
        async fn read_more(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
            let start = buf.len();
            buf.resize(start + READ_CHUNK, 0);
            let res = self.read(&mut buf[start..]).await;
            buf.truncate(start + res.as_ref().map_or(0, |n| *n));
            res
        }

        async fn write_all_buf(&mut self, buf: Vec<u8>) -> (io::Result<()>, Vec<u8>) {
            let res = self.write_all(&buf).await;
            (res, buf)
        }
    }

    impl Connect for TcpStream {
        async fn connect(addr: SocketAddr) -> io::Result<Self> {
            let s = TcpStream::connect(addr).await.map_err(io::Error::from)?;
            s.set_nodelay(true).map_err(io::Error::from)?;
            Ok(s)
        }
    }

    fn check_memlock() -> io::Result<()> {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the valid `lim` we pass.
        if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if lim.rlim_cur != libc::RLIM_INFINITY && lim.rlim_cur < MIN_MEMLOCK {
            return Err(io::Error::other(format!(
                "RLIMIT_MEMLOCK is {} bytes; glommio needs >= {MIN_MEMLOCK} (ulimit -l 512)",
                lim.rlim_cur
            )));
        }
        Ok(())
    }

    pub(super) fn run(args: &Args) -> io::Result<()> {
        check_memlock()?;
        let (variant, mode, listen) = (args.variant, args.mode, args.listen);
        // Placement::Unbound: pinning is done from outside with `taskset`, as for monoio.
        let ex = LocalExecutorBuilder::new(Placement::Unbound)
            .name("runtimes-bench")
            .make()
            .map_err(io::Error::from)?;
        ex.run(serve(variant, mode, listen))
    }

    async fn serve(variant: Variant, mode: Mode, listen: SocketAddr) -> io::Result<()> {
        // glommio always sets SO_REUSEPORT; bind port 0 (the default) to avoid sharing a port.
        let listener = TcpListener::bind(listen).map_err(io::Error::from)?;
        announce(
            variant,
            mode,
            listener.local_addr().map_err(io::Error::from)?,
        );
        let response = responder_bytes();
        let pool = match mode {
            Mode::Proxy { upstream } => Some(Rc::new(Pool::<TcpStream>::new(upstream))),
            Mode::Responder => None,
        };
        loop {
            let stream = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("accept: {e}");
                    glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            match &pool {
                Some(pool) => glommio::spawn_local(serve_proxy(stream, Rc::clone(pool))).detach(),
                None => {
                    glommio::spawn_local(serve_responder(stream, Rc::clone(&response))).detach()
                }
            };
        }
    }
}
