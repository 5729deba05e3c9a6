//! The exporter thread: spans from the bounded queue, batched (at most 512, or what came
//! within 1 s of a batch's first span), encoded as an OTLP `ExportTraceServiceRequest` and
//! POSTed to `{otlp_endpoint}/v1/traces` (`application/x-protobuf`) over plain HTTP/1.1.
//!
//! A failed batch (no connection, a timeout, 429/502/503/504) is retried twice, 0.5 s then
//! 1 s later, while the collector had been answering; once it has failed, each later batch gets
//! one try until one succeeds. A batch that still fails, or that the collector refuses (any
//! other status), is dropped and counted `failed`. Connect timeout 2 s, each read and write
//! 5 s: a hung collector costs the thread time, never memory — meanwhile the queue fills and
//! the shards' spans are dropped and counted there.
//!
//! At shutdown (`Telemetry::stopping`: a flag and a mark in the queue) the thread stops
//! waiting: what is queued goes out in batches of up to 512, one try each, and the thread ends.
//!
//! Between a batch's first span and its end the thread polls the queue every 20 ms instead
//! of parking on it (queues of 1,024 spans and more), so a shard's `try_send` wakes nobody.
//!
//! The thread gives way to the shards (`give_way`): it runs `HELPER_NICE` steps below the
//! process's priority, so where it shares a core with a shard (every core has one by default)
//! a shard that wakes takes the core from it at once instead of waiting out a batch; and it
//! writes a batch in pieces of `WRITE_PIECE` bytes, each a syscall of its own, so the kernel
//! has a point to switch at within a large batch too.
//!
//! Owns: `start` and the thread. Must not: run on a shard, or hold more than one batch.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prost::Message;

use super::proto::{self, KeyValue, Value};
use super::wire;
use super::Counts;
use crate::config::telemetry::OtlpEndpoint;
use crate::config::TelemetryConfig;

/// The shards' side of the queue: encoded spans (`wire`), and `None`, the shutdown's mark.
pub type Queue = SyncSender<Option<Vec<u8>>>;

pub const MAX_BATCH: usize = 512;
pub const BATCH_WAIT: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const IO_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF: [Duration; 2] = [Duration::from_millis(500), Duration::from_millis(1000)];
/// Within a batch's window the queue is looked at this often (`next`), when it holds at least
/// `POLL_QUEUE` spans (4,096 by default: filled in one tick only above ~200k spans/s); a
/// smaller queue parks on the channel as before, so it is not filled while the thread sleeps.
const TICK: Duration = Duration::from_millis(20);
const POLL_QUEUE: usize = 1024;
/// The collector's answer is read up to this much (its body is not needed).
const MAX_ANSWER: usize = 64 * 1024;
/// How much lower than the process the thread runs (nice steps; `give_way`).
pub const HELPER_NICE: i32 = 10;
/// A batch is written in pieces of at most this many bytes (`Post::send`).
const WRITE_PIECE: usize = 16 * 1024;

/// Start the thread; its queue holds `queue_spans` spans.
pub fn start(
    cfg: &TelemetryConfig,
    target: OtlpEndpoint,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
) -> io::Result<(Queue, JoinHandle<()>)> {
    let (tx, rx) = sync_channel(cfg.queue_spans);
    let post = Post::new(cfg, target);
    let poll = cfg.queue_spans >= POLL_QUEUE;
    let handle = std::thread::Builder::new()
        .name("rg-telemetry".into())
        .spawn(move || {
            give_way();
            run(rx, post, &counts, &stop, poll)
        })?;
    Ok((tx, handle))
}

/// The calling thread runs `HELPER_NICE` steps below the process (at most 19): its weight
/// against a shard on the same core falls from 1:1 to about 1:10, so the scheduler hands the
/// core to a waking shard instead of letting a batch's framing and POST finish first (a c=1
/// request that arrived then waited up to a batch's time). Enough share is left to keep up
/// with a saturated shard's spans. A failure (a seccomp filter, say) leaves the priority as it
/// was: tracing works, only without the precedence.
fn give_way() {
    if let Err(e) = rustix::process::nice(HELPER_NICE) {
        eprintln!("telemetry: the export thread keeps the shards' priority ({e})");
    }
}

/// Where and how batches go: the request head (all but the length), resource and scope.
struct Post {
    target: OtlpEndpoint,
    head: Vec<u8>,
    /// The encoded `Resource` and `InstrumentationScope`, framed into every batch.
    resource: Vec<u8>,
    scope: Vec<u8>,
}

impl Post {
    fn new(cfg: &TelemetryConfig, target: OtlpEndpoint) -> Post {
        let mut head = Vec::new();
        let host = if target.host.contains(':') {
            format!("[{}]:{}", target.host, target.port)
        } else {
            format!("{}:{}", target.host, target.port)
        };
        let _ = write!(
            head,
            "POST {}/v1/traces HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/x-protobuf\r\nconnection: close\r\nuser-agent: ringgate/{}\r\n",
            target.prefix,
            env!("CARGO_PKG_VERSION")
        );
        for (name, var) in &cfg.headers_env {
            match std::env::var(var) {
                Ok(v) if !v.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) => {
                    let _ = write!(head, "{name}: {v}\r\n");
                }
                _ => eprintln!(
                    "telemetry: headers_env {name:?}: environment variable {var} is not set (or not a header value); the header is not sent"
                ),
            }
        }
        let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        let mut attrs = vec![
            KeyValue::new("service.name", Value::String(cfg.service_name.clone())),
            KeyValue::new(
                "service.version",
                Value::String(env!("CARGO_PKG_VERSION").into()),
            ),
        ];
        if !host_name.is_empty() {
            attrs.push(KeyValue::new("host.name", Value::String(host_name)));
        }
        Post {
            target,
            head,
            resource: proto::Resource { attributes: attrs }.encode_to_vec(),
            scope: proto::InstrumentationScope {
                name: "ringgate".into(),
                version: env!("CARGO_PKG_VERSION").into(),
            }
            .encode_to_vec(),
        }
    }

    /// The POST of an `ExportTraceServiceRequest` of one `ResourceSpans` with one `ScopeSpans`
    /// holding `spans` (each already an encoded `Span`): head, `content-length` and body in one
    /// buffer, each span's bytes copied once (the lengths of the nested messages are known
    /// before their bytes are written).
    fn request(&self, spans: &[Vec<u8>]) -> Vec<u8> {
        let scope_spans = wire::framed_len(self.scope.len())
            + spans
                .iter()
                .map(|s| wire::framed_len(s.len()))
                .sum::<usize>();
        let rs = wire::framed_len(self.resource.len()) + wire::framed_len(scope_spans);
        let body = wire::framed_len(rs);
        let mut req = Vec::with_capacity(self.head.len() + 40 + body);
        req.extend_from_slice(&self.head);
        let _ = write!(req, "content-length: {body}\r\n\r\n");
        let start = req.len();
        wire::field(&mut req, 1, rs);
        wire::frame(&mut req, 1, &self.resource);
        wire::field(&mut req, 2, scope_spans);
        wire::frame(&mut req, 1, &self.scope);
        for s in spans {
            wire::frame(&mut req, 2, s);
        }
        debug_assert_eq!(req.len() - start, body);
        req
    }

    /// One POST of `req` (`request`): the status the collector answered.
    fn send(&self, req: &[u8]) -> io::Result<u16> {
        let addr = (self.target.host.as_str(), self.target.port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))?;
        let mut s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        let _ = s.set_nodelay(true);
        for piece in req.chunks(WRITE_PIECE) {
            s.write_all(piece)?;
        }
        // the status line is all that is needed; read until it is whole, bounded
        let mut buf = vec![0u8; 1024];
        let mut n = 0;
        let mut total = 0;
        loop {
            if let Some(end) = buf[..n].windows(2).position(|w| w == b"\r\n") {
                return parse_status(&buf[..end]);
            }
            if n == buf.len() || total >= MAX_ANSWER {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "status line too long",
                ));
            }
            let r = s.read(&mut buf[n..])?;
            if r == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no answer"));
            }
            n += r;
            total += r;
        }
    }
}

fn parse_status(line: &[u8]) -> io::Result<u16> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad status line");
    if !line.starts_with(b"HTTP/1.") || line.len() < 12 || line[8] != b' ' {
        return Err(bad());
    }
    std::str::from_utf8(&line[9..12])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)
}

fn retryable(r: &io::Result<u16>) -> bool {
    match r {
        Ok(s) => matches!(s, 429 | 502 | 503 | 504),
        Err(_) => true,
    }
}

/// The next queued item: waiting up to `wait` (`None`: until one comes), or — once the
/// process is stopping — only what is already queued. With `poll`, a bounded wait looks at the
/// queue every `TICK` instead of parking on it: a parked receiver makes every shard's
/// `try_send` wake it (a futex call on the shard per span); polled, only a batch's first span
/// does.
fn next(
    rx: &Receiver<Option<Vec<u8>>>,
    stop: &AtomicBool,
    wait: Option<Duration>,
    poll: bool,
) -> Result<Option<Vec<u8>>, RecvTimeoutError> {
    let stopped = |e| match e {
        TryRecvError::Empty => RecvTimeoutError::Timeout,
        TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
    };
    if stop.load(Ordering::Acquire) {
        return rx.try_recv().map_err(stopped);
    }
    match wait {
        Some(w) if poll => {
            let until = Instant::now() + w;
            loop {
                match rx.try_recv() {
                    Err(TryRecvError::Empty) => {}
                    r => return r.map_err(stopped),
                }
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() || stop.load(Ordering::Acquire) {
                    return rx.try_recv().map_err(stopped);
                }
                std::thread::sleep(left.min(TICK));
            }
        }
        Some(w) => rx.recv_timeout(w),
        None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
    }
}

fn run(rx: Receiver<Option<Vec<u8>>>, post: Post, counts: &Counts, stop: &AtomicBool, poll: bool) {
    let mut healthy = true;
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        match next(&rx, stop, None, poll) {
            Ok(Some(s)) => batch.push(s),
            Ok(None) => continue, // the shutdown mark: `stop` is set, what is queued follows
            Err(_) => return,     // disconnected, or stopping with nothing left
        }
        let deadline = Instant::now() + BATCH_WAIT;
        let mut last = false;
        while batch.len() < MAX_BATCH {
            let wait = deadline.saturating_duration_since(Instant::now());
            match next(&rx, stop, Some(wait), poll) {
                Ok(Some(s)) => batch.push(s),
                Ok(None) => continue,
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    last = true;
                    break;
                }
            }
        }
        let n = batch.len() as u64;
        let body = post.request(&batch);
        batch.clear();
        let was_healthy = healthy;
        let mut r = post.send(&body);
        if healthy {
            for pause in BACKOFF {
                if !retryable(&r) || last || stop.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::sleep(pause);
                r = post.send(&body);
            }
        }
        match r {
            Ok(200..=299) => {
                healthy = true;
                counts.exported.fetch_add(n, Ordering::Relaxed);
            }
            Ok(status) => {
                // a collector that answers but refuses is not down: retry next time again
                healthy = !retryable(&Ok(status));
                if was_healthy {
                    eprintln!("telemetry: the collector answered {status}; {n} spans dropped (counted in ringgate_telemetry_spans_total)");
                }
                counts.failed.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => {
                if was_healthy {
                    eprintln!("telemetry: export failed ({e}); {n} spans dropped (counted in ringgate_telemetry_spans_total)");
                }
                healthy = false;
                counts.failed.fetch_add(n, Ordering::Relaxed);
            }
        }
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK").unwrap(), 200);
        assert_eq!(parse_status(b"HTTP/1.0 503 x").unwrap(), 503);
        assert!(parse_status(b"HTTP/2 200").is_err());
        assert!(parse_status(b"garbage").is_err());
        assert!(
            retryable(&Ok(503))
                && !retryable(&Ok(400))
                && retryable(&Err(io::ErrorKind::Other.into()))
        );
    }

    /// The framed POST decodes as the `ExportTraceServiceRequest` prost builds from the same
    /// parts, and its `content-length` is its body's (spans of sizes whose lengths take one,
    /// two and three varint bytes, so the nested lengths cross varint widths too).
    #[test]
    fn a_batch_is_the_request_prost_encodes() {
        let cfg = TelemetryConfig {
            otlp_endpoint: Some("http://127.0.0.1:4318/otel".into()),
            service_name: "svc".into(),
            ..TelemetryConfig::default()
        };
        let target = crate::config::telemetry::parse_endpoint("http://127.0.0.1:4318/otel")
            .expect("endpoint");
        let post = Post::new(&cfg, target);
        let span = |name: String| proto::Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name,
            kind: proto::KIND_SERVER,
            start_time_unix_nano: 1,
            end_time_unix_nano: 2,
            ..Default::default()
        };
        let spans: Vec<proto::Span> = [1usize, 100, 200, 20_000, 3]
            .iter()
            .map(|&n| span("x".repeat(n)))
            .collect();
        for n in [0, 1, spans.len()] {
            let encoded: Vec<Vec<u8>> = spans[..n].iter().map(|s| s.encode_to_vec()).collect();
            let req = post.request(&encoded);
            let split = req
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .expect("head end")
                + 4;
            let head = std::str::from_utf8(&req[..split]).expect("head");
            assert!(
                head.starts_with("POST /otel/v1/traces HTTP/1.1\r\n"),
                "{head}"
            );
            let body = &req[split..];
            assert!(head.contains(&format!("content-length: {}\r\n", body.len())));
            let theirs = proto::ExportTraceServiceRequest {
                resource_spans: vec![proto::ResourceSpans {
                    resource: Some(proto::Resource::decode(&post.resource[..]).expect("res")),
                    scope_spans: vec![proto::ScopeSpans {
                        scope: Some(proto::InstrumentationScope {
                            name: "ringgate".into(),
                            version: env!("CARGO_PKG_VERSION").into(),
                        }),
                        spans: spans[..n].to_vec(),
                    }],
                }],
            };
            assert_eq!(body, theirs.encode_to_vec());
            let back = proto::ExportTraceServiceRequest::decode(body).expect("decodes");
            assert_eq!(back, theirs);
        }
    }

    /// The export thread runs `HELPER_NICE` below the thread that started it (Linux keeps a
    /// nice value per thread; /proc shows it in field 19 of the thread's stat).
    #[test]
    fn the_export_thread_gives_way() {
        fn nice_of(stat: &str) -> Option<i32> {
            stat.rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(16)?
                .parse()
                .ok()
        }
        let own = nice_of(&std::fs::read_to_string("/proc/thread-self/stat").expect("stat"))
            .expect("own nice");
        let want = (own + HELPER_NICE).min(19);
        let cfg = TelemetryConfig {
            otlp_endpoint: Some("http://127.0.0.1:9".into()),
            ..TelemetryConfig::default()
        };
        let target = crate::config::telemetry::parse_endpoint("http://127.0.0.1:9").expect("ep");
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, handle) = start(&cfg, target, Arc::default(), stop.clone()).expect("started");
        // the thread's own nice, read from its task (other tests' export threads, if any,
        // are the same code); it is set first thing, waited for without a tight bound
        let ours = |t: &std::fs::DirEntry| {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            (comm.trim() == "rg-telemetry")
                .then(|| nice_of(&stat))
                .flatten()
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            seen = std::fs::read_dir("/proc/self/task")
                .expect("tasks")
                .flatten()
                .filter_map(|t| ours(&t))
                .collect();
            if !seen.is_empty() && seen.iter().all(|&n| n == want) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Release);
        drop(tx);
        handle.join().expect("export thread");
        assert!(
            !seen.is_empty() && seen.iter().all(|&n| n == want),
            "{seen:?} want {want}"
        );
    }
}
