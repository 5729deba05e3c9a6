//! The engine poller: one helper thread per polled engine (never a shard: a slow or hung
//! engine must not cost a core's requests anything) fetches its load signal every `poll_ms`
//! with a plain blocking HTTP/1.1 GET (`Connection: close`, connect/read timeouts, at most
//! `prom::MAX_PAGE` bytes read), normalises it (`signal::normalise`) and publishes it to the
//! engine's `EngineCell`; a refused connection, a non-200 status or a page without
//! the engine's waiting series marks the engine down (`EngineCell::fail`) until a poll
//! succeeds again — the probe back is simply the next poll. A poll that times out is slow,
//! not dead (`EngineCell::slow`): the engine keeps its last signal until that is stale, and
//! only a timeout past `stale_ms` marks it down. A 404 or 501 (the engine answers
//! but does not serve that page: llama-server without `--metrics`) is no signal, not a dead
//! engine: `EngineCell::no_signal`, routed by the gateway's own in-flight count.
//!
//! llama.cpp with a `/metrics` URL (`llama-server --metrics`): every GET of `/metrics` restarts
//! the window its throughput gauges (`prompt_tokens_seconds`, `predicted_tokens_seconds`)
//! average over, so polling it every `poll_ms` leaves an operator's Prometheus reading ~0
//! (docs/engines.md has the measurement). The poller reads `/slots` (same host) every poll
//! instead — busy slots, no side effects — and `/metrics` only while every slot is busy (the
//! only time llama.cpp defers a request) and at most once per `METRICS_EVERY`, for
//! `requests_deferred` (the other clients' queue; this gateway's own is its in-flight count).
//! An engine without `/slots` (`--no-slots`: 404/501) is polled on `/metrics` as configured.
//!
//! When the model's engines have no usable signal and `load` routes by the gateway's own view
//! (`EngineCell::routed_blind`), the poller says so once per outage in the log.
//!
//! A poller holds its cell weakly: when the last route table using the cell is gone (the
//! gateway stopped, or a reload dropped the provider), the thread ends at its next tick.
//!
//! Owns: `Target`, `spawn`, `fetch`, `METRICS_EVERY`. Must not: touch shard state or parse more than the
//! engine's page (that is `signal`/`prom`).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::prom::MAX_PAGE;
use super::signal::{normalise, now_ms, EngineCell, EngineKind, Sample};
use crate::config::endpoint::Endpoint;

/// llama.cpp `/metrics` with `/slots` beside it: read `/metrics` at most this often (and only
/// while every slot is busy), so an operator's scrapes keep most of their gauges' window.
pub const METRICS_EVERY: Duration = Duration::from_secs(1);

/// llama.cpp polled on `/slots` with `/metrics` (the configured URL) read now and then.
struct Beside {
    slots: Endpoint,
    /// `/slots` answers (false after a 404/501: poll `/metrics` as configured).
    usable: bool,
    last_metrics: Option<Instant>,
    /// `requests_deferred` at the last `/metrics` read.
    deferred: u32,
    /// `/metrics` said 404/501 (logged once).
    metrics_missing: bool,
}

impl Beside {
    fn of(kind: EngineKind, ep: &Endpoint) -> Option<Beside> {
        if kind != EngineKind::Llamacpp {
            return None;
        }
        let base = ep.base_path.strip_suffix("/metrics")?;
        let mut slots = ep.clone();
        slots.base_path = format!("{base}/slots");
        Some(Beside {
            slots,
            usable: true,
            last_metrics: None,
            deferred: 0,
            metrics_missing: false,
        })
    }
}

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
    let mut beside = cell.upgrade().and_then(|c| Beside::of(c.kind, &ep));
    let mut addr: Option<SocketAddr> = None;
    let mut failing = false;
    // whether this run of timed-out polls (the engine still in on its last signal) is logged
    let mut slow_logged = false;
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
        let sample = match (addr, beside.as_mut()) {
            (None, _) => Err(io::Error::other("cannot resolve the metrics host")),
            (Some(a), Some(b)) if b.usable => {
                let s = poll_beside(a, &ep, b, c.kind, &target);
                if !b.usable {
                    crate::observe::log::info(format_args!(
                        "engine {}: no /slots beside {}; polling /metrics every poll_ms (its \
                         throughput gauges then average over one poll only)",
                        target.provider, target.url
                    ));
                }
                s
            }
            (Some(a), _) => fetch(a, &ep, target.timeout).and_then(|page| {
                normalise(c.kind, &page, slots)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            }),
        };
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
                slow_logged = false;
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
                // a timeout is slow, not dead, while the last signal is fresh
                let down = if timed_out(&e) {
                    c.slow(now_ms())
                } else {
                    c.fail();
                    true
                };
                if down {
                    if !failing {
                        crate::observe::log::info(format_args!(
                            "engine {}: load signal failed ({}): {e}; out of lb=load until it \
                             answers",
                            target.provider, target.url
                        ));
                        // resolve again next time (the engine may have moved)
                        addr = None;
                    }
                    failing = true;
                } else if !slow_logged {
                    crate::observe::log::info(format_args!(
                        "engine {}: load signal slow ({}): {e}; kept on its last signal until \
                         it is stale_ms old",
                        target.provider, target.url
                    ));
                    slow_logged = true;
                }
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

/// Whether a poll's error is its time budget running out (connect, write or read), rather
/// than the engine refusing, resetting or answering wrongly.
fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// One poll of a llama.cpp engine with `/slots` beside its `/metrics` (see the module doc):
/// `/slots` always, `/metrics` while every slot is busy and `METRICS_EVERY` has passed.
fn poll_beside(
    a: SocketAddr,
    metrics: &Endpoint,
    b: &mut Beside,
    kind: EngineKind,
    target: &Target,
) -> io::Result<Sample> {
    let timeout = target.timeout;
    let page = match fetch(a, &b.slots, timeout) {
        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
            b.usable = false;
            let page = fetch(a, metrics, timeout)?;
            return normalise(kind, &page, false)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e));
        }
        other => other?,
    };
    let mut s =
        normalise(kind, &page, true).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if s.running < s.slots {
        // a free slot: llama.cpp defers nothing
        b.deferred = 0;
    } else if b.last_metrics.is_none_or(|t| t.elapsed() >= METRICS_EVERY) {
        b.last_metrics = Some(Instant::now());
        let read = fetch(a, metrics, timeout).and_then(|page| {
            normalise(kind, &page, false).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        });
        match read {
            Ok(m) => {
                b.deferred = m.waiting;
                b.metrics_missing = false;
            }
            // `/slots` answered: the engine is up; its queue is judged by the gateway's own
            // in-flight count until `/metrics` answers (`doctor` names the flag)
            Err(e) => {
                if !b.metrics_missing {
                    crate::observe::log::info(format_args!(
                        "engine {}: {} unreadable ({e}); its queue is judged by this \
                         gateway's in-flight count",
                        target.provider, target.url
                    ));
                }
                b.metrics_missing = true;
                b.deferred = 0;
            }
        }
    }
    s.waiting = b.deferred;
    Ok(s)
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
    use std::net::TcpListener;
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::mpsc;

    /// A vLLM-like metrics server on port 0: each accepted poll is answered as `plan` says for
    /// its number, each on its own thread (`true`: the page; `false`: held unanswered for 1.5 s,
    /// then closed).
    fn metrics_server(plan: fn(usize) -> bool) -> (SocketAddr, mpsc::Receiver<usize>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for (i, s) in l.incoming().enumerate() {
                let Ok(mut s) = s else { return };
                let _ = tx.send(i);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf);
                    if plan(i) {
                        let body = "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.5\n";
                        let _ = write!(
                            s,
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                    } else {
                        std::thread::sleep(Duration::from_millis(1_500));
                    }
                });
            }
        });
        (addr, rx)
    }

    fn poll(addr: SocketAddr, stale_ms: u64) -> Arc<EngineCell> {
        let cell = Arc::new(EngineCell::new(EngineKind::Vllm, true, stale_ms));
        let target = Target {
            provider: "p".into(),
            url: format!("http://{addr}/metrics"),
            poll: Duration::from_millis(20),
            timeout: Duration::from_millis(300),
        };
        spawn(target, &cell).unwrap();
        cell
    }

    /// Wait (unbounded by the clock: CI is a loaded box; the test harness times out) until
    /// the server has seen poll `n`, checking `each` on the cell meanwhile.
    fn until_poll(
        rx: &mpsc::Receiver<usize>,
        n: usize,
        cell: &EngineCell,
        each: impl Fn(&EngineCell),
    ) {
        loop {
            each(cell);
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(i) if i >= n => return,
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => panic!("server gone"),
            }
        }
    }

    #[test]
    fn a_timed_out_poll_keeps_a_fresh_engine_in() {
        // polls 0–2 answer, 3 hangs past the poll's budget, then they answer again
        let (addr, rx) = metrics_server(|i| i != 3);
        // stale after 30 s: the one slow poll cannot age the signal that far
        let cell = poll(addr, 30_000);
        let up = |c: &EngineCell| {
            if c.polls_ok.load(Relaxed) > 0 {
                assert!(c.view(now_ms()).up, "one slow poll took a fresh engine out");
            }
        };
        until_poll(&rx, 6, &cell, up);
        assert!(
            cell.polls_failed.load(Relaxed) >= 1,
            "the slow poll was not counted"
        );
        assert!(cell.polls_ok.load(Relaxed) >= 4);
    }

    #[test]
    fn a_hung_engine_goes_down_once_its_signal_is_stale() {
        // poll 0 answers; from then on every poll hangs
        let (addr, rx) = metrics_server(|i| i == 0);
        let cell = poll(addr, 1_000);
        until_poll(&rx, 1, &cell, |_| {});
        while cell.view(now_ms()).up {
            std::thread::sleep(Duration::from_millis(20));
        }
        // down only once the signal is older than stale_ms, after a timed-out poll
        let v = cell.view(now_ms());
        assert!(v.age_ms > 1_000, "down while its signal was fresh: {v:?}");
        assert!(cell.polls_failed.load(Relaxed) >= 1);
    }

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
