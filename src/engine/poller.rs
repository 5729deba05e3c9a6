//! The engine poller: one helper thread per polled engine (never a shard: a slow or hung
//! engine must not cost a core's requests anything) fetches its load signal every `poll_ms`
//! with a plain blocking HTTP/1.1 GET (`Connection: close`, connect/read timeouts, at most
//! `prom::MAX_PAGE` bytes read), normalises it (`signal::normalise`) and publishes it to the
//! engine's `EngineCell`; a refused connection, a timeout, a non-200 status or a page without
//! the engine's waiting series marks the engine down (`EngineCell::fail`) until a poll
//! succeeds again — the probe back is simply the next poll. A 404 or 501 (the engine answers
//! but does not serve that page: llama-server without `--metrics`) is no signal, not a dead
//! engine: `EngineCell::no_signal`, routed by the gateway's own in-flight count.
//!
//! When the model's engines have no usable signal and `load` routes by the gateway's own view
//! (`EngineCell::routed_blind`), the poller says so once per outage in the log.
//!
//! A poller holds its cell weakly: when the last route table using the cell is gone (the
//! gateway stopped, or a reload dropped the provider), the thread ends at its next tick.
//!
//! Owns: `Target`, `spawn`, `fetch`. Must not: touch shard state or parse more than the
//! engine's page (that is `signal`/`prom`).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::prom::MAX_PAGE;
use super::signal::{normalise, now_ms, EngineCell};
use crate::config::endpoint::Endpoint;

/// Where and how often to poll one engine.
#[derive(Debug, Clone)]
pub struct Target {
    /// The provider's name (thread name, log lines).
    pub provider: String,
    pub url: String,
    pub poll: Duration,
    /// Connect + read budget of one poll.
    pub timeout: Duration,
}

/// Start polling `target` into `cell` on a helper thread.
pub fn spawn(target: Target, cell: &Arc<EngineCell>) -> io::Result<()> {
    let weak: Weak<EngineCell> = Arc::downgrade(cell);
    let ep =
        Endpoint::parse(&target.url).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    std::thread::Builder::new()
        .name(format!("poll-{}", target.provider))
        .spawn(move || run(target, ep, weak))?;
    Ok(())
}

fn run(target: Target, ep: Endpoint, cell: Weak<EngineCell>) {
    let slots = ep.base_path.ends_with("/slots");
    let mut addr: Option<SocketAddr> = None;
    let mut failing = false;
    // blind routes (no usable signal, `load`) seen so far, and whether this outage's are logged
    let mut blind_seen = 0u64;
    let mut blind_logged = false;
    loop {
        let t0 = Instant::now();
        let Some(c) = cell.upgrade() else { return };
        if addr.is_none() {
            addr = (ep.host.as_str(), ep.port)
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next());
        }
        let got = match addr {
            Some(a) => fetch(a, &ep, target.timeout),
            None => Err(io::Error::other("cannot resolve the metrics host")),
        };
        let sample = got.and_then(|page| {
            normalise(c.kind, &page, slots)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        });
        match sample {
            Ok(s) => {
                c.publish(s, now_ms());
                if failing {
                    crate::observe::log::info(format_args!(
                        "engine {}: load signal back ({})",
                        target.provider, target.url
                    ));
                }
                failing = false;
                blind_logged = false;
            }
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                c.no_signal(now_ms());
                if !failing {
                    crate::observe::log::info(format_args!(
                        "engine {}: load signal {}: {e}; routed by the gateway's own in-flight \
                         count until it serves one (`ringgate doctor` names the flag)",
                        target.provider, target.url
                    ));
                }
                failing = true;
            }
            Err(e) => {
                c.fail();
                if !failing {
                    crate::observe::log::info(format_args!(
                        "engine {}: load signal failed ({}): {e}; out of lb=load until it answers",
                        target.provider, target.url
                    ));
                    // resolve again next time (the engine may have moved)
                    addr = None;
                }
                failing = true;
            }
        }
        let blind = c.blind_routes.load(std::sync::atomic::Ordering::Relaxed);
        if blind > blind_seen && !blind_logged {
            crate::observe::log::info(format_args!(
                "engine {}: no usable load signal; lb=load routes to it by the gateway's own \
                 in-flight count until its metrics answer (ringgate_engine_blind_routes_total)",
                target.provider
            ));
            blind_logged = true;
        }
        blind_seen = blind;
        drop(c);
        std::thread::sleep(target.poll.saturating_sub(t0.elapsed()));
    }
}

/// GET the page (status 200 required; chunked or length-framed or read to close).
pub fn fetch(addr: SocketAddr, ep: &Endpoint, timeout: Duration) -> io::Result<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_nodelay(true)?;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "metrics poll timed out"))
    };
    s.set_write_timeout(Some(left()?))?;
    let path = if ep.base_path.is_empty() {
        "/"
    } else {
        &ep.base_path
    };
    let req = format!(
        "GET {path} HTTP/1.1\r\nhost: {}\r\naccept: text/plain, application/json\r\nuser-agent: ringgate\r\nconnection: close\r\n\r\n",
        ep.host_header
    );
    s.write_all(req.as_bytes())?;
    let mut buf = Vec::with_capacity(8192);
    let mut chunk = [0u8; 16384];
    loop {
        s.set_read_timeout(Some(left()?))?;
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_PAGE + 64 * 1024 {
            break;
        }
        if let Some(page) = complete(&buf)? {
            return Ok(page);
        }
    }
    complete(&buf)?
        .or_else(|| body_to_close(&buf))
        .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "metrics page cut short"))
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// The body once the response is complete (`None`: read more).
fn complete(buf: &[u8]) -> io::Result<Option<Vec<u8>>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut headers);
    let head = match r.parse(buf).map_err(|_| bad("bad metrics response head"))? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok(None),
    };
    match r.code {
        Some(200) => {}
        // the engine is up and does not serve this page (llama-server without `--metrics`)
        Some(c @ (404 | 501)) => {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("metrics status {c}: the engine does not serve its load signal there"),
            ))
        }
        c => return Err(bad(&format!("metrics status {}", c.unwrap_or(0)))),
    }
    let body = &buf[head..];
    let mut length = None;
    let mut chunked = false;
    for h in r.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok());
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = h.value.eq_ignore_ascii_case(b"chunked");
        }
    }
    if chunked {
        return Ok(dechunk(body));
    }
    match length {
        Some(n) if body.len() >= n => Ok(Some(body[..n].to_vec())),
        _ => Ok(None),
    }
}

/// A read-to-close body (no length, not chunked).
fn body_to_close(buf: &[u8]) -> Option<Vec<u8>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut headers);
    match r.parse(buf).ok()? {
        httparse::Status::Complete(n) if r.code == Some(200) => Some(buf[n..].to_vec()),
        _ => None,
    }
}

/// A complete chunked body, or `None` while the last chunk has not arrived.
fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(b.len());
    loop {
        let line_end = b.windows(2).position(|w| w == b"\r\n")?;
        let size_txt = std::str::from_utf8(&b[..line_end]).ok()?;
        let size_txt = size_txt.split(';').next()?.trim();
        let size = usize::from_str_radix(size_txt, 16).ok()?;
        b = &b[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if b.len() < size + 2 || out.len() + size > MAX_PAGE {
            return None;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framings() {
        let l = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabc";
        assert_eq!(complete(l).unwrap(), Some(b"abc".to_vec()));
        let c =
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n";
        assert_eq!(complete(c).unwrap(), Some(b"abc".to_vec()));
        let partial = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n";
        assert_eq!(complete(partial).unwrap(), None);
        assert!(complete(b"HTTP/1.1 501 Not Implemented\r\ncontent-length: 0\r\n\r\n").is_err());
        let close = b"HTTP/1.0 200 OK\r\n\r\nxyz";
        assert_eq!(body_to_close(close), Some(b"xyz".to_vec()));
    }
}
