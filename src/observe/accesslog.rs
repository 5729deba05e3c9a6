//! The access log (`[log] access = "off" | "stdout" | "<file path>"`, default off): one JSON
//! line per request — time (RFC 3339, UTC, when the request ended), request id, key name,
//! endpoint, model, deployment, provider, status, stream, tokens, latency, overhead, time to
//! first token, upstream time, bytes in and out, attempts, and guardrail hits when some
//! guardrail matched (`guardrail_hits`: `type:count` pairs, never text). Never a body, a header value other
//! than the request id, a query string or a secret; every string is JSON-escaped.
//!
//! Each shard formats its lines into its own buffer (no locks on the request path) and hands
//! full buffers (16 KiB, or whatever is there every 100 ms) to one writer thread through a
//! bounded queue (64 buffers). When the queue is full the buffer is dropped and its lines are
//! counted (`ringgate_access_log_dropped_total`): a slow disk or a stalled stdout reader never
//! blocks a shard nor grows memory. Off, a shard holds `None` and a request pays one branch.
//!
//! Owns: `AccessLog` (the queue and writer thread), `ShardLog` (a shard's buffer), `Entry` and
//! its JSON line. Must not: block a shard (the queue is only tried, except when a shard ends)
//! or see bodies.

use std::cell::{Cell, RefCell};
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where access-log lines go (`[log] access`, see `config::log`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Off,
    Stdout,
    File(String),
}

/// A shard hands its buffer over once it holds this much.
pub const BATCH_BYTES: usize = 16 * 1024;
/// Buffers waiting for the writer, at most.
pub const QUEUE_BATCHES: usize = 64;
/// How often a shard hands over what it has.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// A buffer of whole lines and how many they are.
type Batch = (Vec<u8>, u64);

/// The process-wide access log: the queue's sending side and the dropped-lines counter.
#[derive(Clone)]
pub struct AccessLog {
    tx: SyncSender<Batch>,
    dropped: Arc<AtomicU64>,
}

impl AccessLog {
    /// Open `target` and start the writer thread; dropped lines are counted in `dropped`.
    /// `Ok(None)` when the log is off.
    pub fn start(
        target: &Target,
        dropped: Arc<AtomicU64>,
    ) -> io::Result<Option<(AccessLog, JoinHandle<()>)>> {
        let out: Box<dyn Write + Send> = match target {
            Target::Off => return Ok(None),
            Target::Stdout => Box::new(io::stdout()),
            Target::File(path) => {
                use std::os::unix::fs::OpenOptionsExt;
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o640)
                    .open(path)
                    .map_err(|e| {
                        io::Error::new(e.kind(), format!("log.access: cannot open {path}: {e}"))
                    })?;
                Box::new(f)
            }
        };
        AccessLog::start_with(out, QUEUE_BATCHES, dropped).map(Some)
    }

    /// The writer thread over `out` with a queue of `batches` buffers.
    pub fn start_with(
        out: Box<dyn Write + Send>,
        batches: usize,
        dropped: Arc<AtomicU64>,
    ) -> io::Result<(AccessLog, JoinHandle<()>)> {
        let (tx, rx) = sync_channel::<Batch>(batches);
        let d = dropped.clone();
        let h = std::thread::Builder::new()
            .name("ringgate-access-log".into())
            .spawn(move || write_batches(rx, out, &d))?;
        Ok((AccessLog { tx, dropped }, h))
    }

    /// Lines dropped so far (queue full, or the output failed).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The writer: every batch in order until every sender is gone.
fn write_batches(rx: Receiver<Batch>, mut out: Box<dyn Write + Send>, dropped: &AtomicU64) {
    for (batch, lines) in rx {
        if out.write_all(&batch).and_then(|_| out.flush()).is_err() {
            crate::observe::metrics::add_atomic(dropped, lines);
        }
    }
}

/// One shard's side of the access log (`None` inside when the log is off).
#[derive(Default)]
pub struct ShardLog {
    inner: Option<Inner>,
}

struct Inner {
    /// The queue; `None` once the shard finished (so the writer can end).
    tx: RefCell<Option<SyncSender<Batch>>>,
    dropped: Arc<AtomicU64>,
    buf: RefCell<Vec<u8>>,
    lines: Cell<u64>,
    stamp: Cell<Stamp>,
}

impl ShardLog {
    pub fn new(log: Option<AccessLog>) -> ShardLog {
        ShardLog {
            inner: log.map(|log| Inner {
                tx: RefCell::new(Some(log.tx)),
                dropped: log.dropped,
                buf: RefCell::new(Vec::with_capacity(BATCH_BYTES + 1024)),
                lines: Cell::new(0),
                stamp: Cell::new(Stamp::default()),
            }),
        }
    }

    /// Whether lines are written at all.
    #[inline]
    pub fn on(&self) -> bool {
        self.inner.is_some()
    }

    /// Append `e`'s line; hand the buffer over when it is full.
    pub fn write(&self, e: &Entry<'_>) {
        let Some(inner) = &self.inner else { return };
        let full = match inner.buf.try_borrow_mut() {
            Ok(mut buf) => {
                let mut stamp = inner.stamp.get();
                e.write_json(&mut buf, SystemTime::now(), &mut stamp);
                inner.stamp.set(stamp);
                inner.lines.set(inner.lines.get() + 1);
                buf.len() >= BATCH_BYTES
            }
            Err(_) => return,
        };
        if full {
            self.flush();
        }
    }

    /// Hand what the buffer holds to the writer, or drop it (counted) when the queue is full.
    pub fn flush(&self) {
        let Some(inner) = &self.inner else { return };
        let Some(batch) = inner.take() else { return };
        let lines = batch.1;
        let sent = match inner
            .tx
            .try_borrow()
            .ok()
            .as_deref()
            .and_then(Option::as_ref)
        {
            Some(tx) => match tx.try_send(batch) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
            },
            None => false,
        };
        if !sent {
            crate::observe::metrics::add_atomic(&inner.dropped, lines);
        }
    }

    /// The shard ends: its last lines wait for room in the queue (nothing else runs on it any
    /// more), then its end of the queue closes, so the writer ends once every shard finished.
    pub fn finish(&self) {
        let Some(inner) = &self.inner else { return };
        let batch = inner.take();
        let Some(tx) = inner.tx.try_borrow_mut().ok().and_then(|mut t| t.take()) else {
            return;
        };
        if let Some(batch) = batch {
            let lines = batch.1;
            if tx.send(batch).is_err() {
                crate::observe::metrics::add_atomic(&inner.dropped, lines);
            }
        }
    }
}

impl Inner {
    fn take(&self) -> Option<Batch> {
        let mut buf = self.buf.try_borrow_mut().ok()?;
        if buf.is_empty() {
            return None;
        }
        let batch = std::mem::replace(&mut *buf, Vec::with_capacity(BATCH_BYTES + 1024));
        Some((batch, self.lines.replace(0)))
    }
}

impl Drop for ShardLog {
    fn drop(&mut self) {
        self.finish();
    }
}

/// One request's line.
#[derive(Debug, Clone, Default)]
pub struct Entry<'a> {
    pub request_id: &'a str,
    /// The virtual key's name (never its secret).
    pub key: Option<&'a str>,
    pub endpoint: &'a str,
    /// The model the client asked for.
    pub model: Option<&'a str>,
    /// `provider/upstream_model` of the deployment that answered (or was tried last).
    pub deployment: Option<&'a str>,
    pub provider: Option<&'a str>,
    pub status: u16,
    pub stream: bool,
    /// (input, output) tokens the answer reported.
    pub tokens: Option<(u64, u64)>,
    pub latency: Duration,
    pub overhead: Duration,
    pub upstream: Duration,
    pub first_token: Option<Duration>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub attempts: u32,
    /// Guardrail hits, `type:count` pairs (written only when some guardrail matched).
    pub guardrail_hits: Option<&'a str>,
    /// The request log export's extras (`telemetry::requests`; the access log leaves them
    /// out): what the answer cost, in nano-USD, and the request's trace id.
    pub cost_nano_usd: Option<u64>,
    pub trace_id: Option<[u8; 16]>,
    /// An `/mcp` request: (method, server, tool, result), written only for those.
    pub mcp: Option<(&'a str, Option<&'a str>, Option<&'a str>, &'a str)>,
}

impl Entry<'_> {
    /// Append the JSON line (with its `\n`), stamped `now` (`stamp` caches the date and time
    /// of the current second: most lines format only their milliseconds).
    pub fn write_json(&self, out: &mut Vec<u8>, now: SystemTime, stamp: &mut Stamp) {
        out.extend_from_slice(b"{\"time\":\"");
        stamp.write(out, now);
        out.extend_from_slice(b"\",\"request_id\":");
        string(out, Some(self.request_id));
        out.extend_from_slice(b",\"key\":");
        string(out, self.key);
        out.extend_from_slice(b",\"endpoint\":");
        string(out, Some(self.endpoint));
        out.extend_from_slice(b",\"model\":");
        string(out, self.model);
        out.extend_from_slice(b",\"deployment\":");
        string(out, self.deployment);
        out.extend_from_slice(b",\"provider\":");
        string(out, self.provider);
        out.extend_from_slice(b",\"status\":");
        int(out, u64::from(self.status));
        out.extend_from_slice(if self.stream {
            b",\"stream\":true"
        } else {
            b",\"stream\":false"
        });
        match self.tokens {
            Some((i, o)) => {
                out.extend_from_slice(b",\"tokens_in\":");
                int(out, i);
                out.extend_from_slice(b",\"tokens_out\":");
                int(out, o);
            }
            None => out.extend_from_slice(b",\"tokens_in\":null,\"tokens_out\":null"),
        }
        out.extend_from_slice(b",\"latency_ms\":");
        millis(out, Some(self.latency));
        out.extend_from_slice(b",\"overhead_ms\":");
        millis(out, Some(self.overhead));
        out.extend_from_slice(b",\"upstream_ms\":");
        millis(out, Some(self.upstream));
        out.extend_from_slice(b",\"ttft_ms\":");
        millis(out, self.first_token);
        out.extend_from_slice(b",\"bytes_in\":");
        int(out, self.bytes_in);
        out.extend_from_slice(b",\"bytes_out\":");
        int(out, self.bytes_out);
        out.extend_from_slice(b",\"attempts\":");
        int(out, u64::from(self.attempts));
        if let Some(h) = self.guardrail_hits {
            out.extend_from_slice(b",\"guardrail_hits\":");
            string(out, Some(h));
        }
        if let Some(c) = self.cost_nano_usd {
            out.extend_from_slice(b",\"cost_usd\":");
            int(out, c / 1_000_000_000);
            out.push(b'.');
            let mut frac = c % 1_000_000_000;
            let mut d = [b'0'; 9];
            for slot in d.iter_mut().rev() {
                *slot = b'0' + (frac % 10) as u8;
                frac /= 10;
            }
            out.extend_from_slice(&d);
        }
        if let Some(t) = &self.trace_id {
            out.extend_from_slice(b",\"trace_id\":\"");
            for b in t {
                out.push(b"0123456789abcdef"[(b >> 4) as usize]);
                out.push(b"0123456789abcdef"[(b & 15) as usize]);
            }
            out.push(b'"');
        }
        if let Some((method, server, tool, result)) = self.mcp {
            out.extend_from_slice(b",\"mcp_method\":");
            string(out, Some(method));
            out.extend_from_slice(b",\"mcp_server\":");
            string(out, server);
            out.extend_from_slice(b",\"mcp_tool\":");
            string(out, tool);
            out.extend_from_slice(b",\"mcp_result\":");
            string(out, Some(result));
        }
        out.extend_from_slice(b"}\n");
    }
}

/// A decimal integer, without `fmt`.
fn int(out: &mut Vec<u8>, v: u64) {
    crate::util::decimal::push_u64(out, v);
}

/// `d` in milliseconds with microsecond precision (`1.234`), or `null`.
fn millis(out: &mut Vec<u8>, d: Option<Duration>) {
    match d {
        Some(d) => {
            let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
            int(out, us / 1000);
            let frac = us % 1000;
            out.extend_from_slice(&[
                b'.',
                b'0' + (frac / 100) as u8,
                b'0' + (frac / 10 % 10) as u8,
                b'0' + (frac % 10) as u8,
            ]);
        }
        None => out.extend_from_slice(b"null"),
    }
}

/// A JSON string (quotes, backslashes and control characters escaped), or `null`.
fn string(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => crate::error::push_json_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

/// The RFC 3339 date and time of one second (`2026-12-01T04:24:06`), kept while lines of that
/// second are written.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stamp {
    secs: u64,
    text: [u8; 19],
    set: bool,
}

impl Stamp {
    /// `2026-12-01T04:24:06.123Z` for `t`.
    fn write(&mut self, out: &mut Vec<u8>, t: SystemTime) {
        let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = d.as_secs();
        if !self.set || secs != self.secs {
            let mut text = Vec::with_capacity(19);
            let s = secs as i64;
            let (y, m, day) = crate::util::date::civil_from_days(s.div_euclid(86_400));
            let s = s.rem_euclid(86_400);
            let _ = write!(
                text,
                "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}",
                s / 3600,
                s / 60 % 60,
                s % 60
            );
            if text.len() == 19 {
                self.text.copy_from_slice(&text);
                self.secs = secs;
                self.set = true;
            } else {
                // a year past 9999: not cached
                out.extend_from_slice(&text);
                millis_z(out, d.subsec_millis());
                return;
            }
        }
        out.extend_from_slice(&self.text);
        millis_z(out, d.subsec_millis());
    }
}

fn millis_z(out: &mut Vec<u8>, ms: u32) {
    out.extend_from_slice(&[
        b'.',
        b'0' + (ms / 100 % 10) as u8,
        b'0' + (ms / 10 % 10) as u8,
        b'0' + (ms % 10) as u8,
        b'Z',
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::sync::Mutex;

    fn entry() -> Entry<'static> {
        Entry {
            request_id: "rg-0-00000abc-1",
            key: Some("team \"a\""),
            endpoint: "chat_completions",
            model: Some("gpt\n4o\u{1}é"),
            deployment: Some("openai/gpt-4o"),
            provider: Some("openai"),
            status: 200,
            stream: true,
            tokens: Some((12, 34)),
            latency: Duration::from_micros(12_345),
            overhead: Duration::from_micros(67),
            upstream: Duration::from_micros(12_000),
            first_token: None,
            bytes_in: 100,
            bytes_out: 2000,
            attempts: 1,
            guardrail_hits: None,
            cost_nano_usd: None,
            trace_id: None,
            mcp: None,
        }
    }

    #[test]
    fn line_is_one_json_object_with_every_field() {
        let mut out = Vec::new();
        let t = UNIX_EPOCH + Duration::from_millis(1_796_099_198_305);
        entry().write_json(&mut out, t, &mut Stamp::default());
        assert_eq!(out.last(), Some(&b'\n'));
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["time"], "2026-12-01T04:26:38.305Z");
        assert_eq!(v["key"], "team \"a\"");
        assert_eq!(v["model"], "gpt\n4o\u{1}é");
        assert_eq!(v["latency_ms"], 12.345);
        assert_eq!(v["overhead_ms"], 0.067);
        assert_eq!(v["ttft_ms"], serde_json::Value::Null);
        assert_eq!(v["tokens_in"], 12);
        assert_eq!(v["tokens_out"], 34);
        assert_eq!(v["stream"], true);
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "time",
                "request_id",
                "key",
                "endpoint",
                "model",
                "deployment",
                "provider",
                "status",
                "stream",
                "tokens_in",
                "tokens_out",
                "latency_ms",
                "overhead_ms",
                "upstream_ms",
                "ttft_ms",
                "bytes_in",
                "bytes_out",
                "attempts"
            ]
        );
        let none = Entry {
            key: None,
            tokens: None,
            ..entry()
        };
        let mut out = Vec::new();
        let mut stamp = Stamp::default();
        none.write_json(&mut out, t, &mut stamp);
        // the cached second, and a new one
        let mut again = Vec::new();
        none.write_json(&mut again, t + Duration::from_millis(1), &mut stamp);
        let v2: serde_json::Value = serde_json::from_slice(&again).unwrap();
        assert_eq!(v2["time"], "2026-12-01T04:26:38.306Z");
        let mut next = Vec::new();
        none.write_json(&mut next, t + Duration::from_millis(700), &mut stamp);
        let v3: serde_json::Value = serde_json::from_slice(&next).unwrap();
        assert_eq!(v3["time"], "2026-12-01T04:26:39.005Z");
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert!(v["key"].is_null() && v["tokens_in"].is_null() && v["tokens_out"].is_null());
    }

    /// A writer that blocks until told to go on, then records what it got.
    struct Gate {
        go: Mutex<std::sync::mpsc::Receiver<()>>,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let _ = self.go.lock().unwrap().recv();
            self.got.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_writer_drops_and_counts_instead_of_blocking() {
        let (go_tx, go_rx) = channel();
        let got = Arc::new(Mutex::new(Vec::new()));
        let gate = Gate {
            go: Mutex::new(go_rx),
            got: got.clone(),
        };
        let dropped = Arc::new(AtomicU64::new(0));
        let (log, writer) = AccessLog::start_with(Box::new(gate), 1, dropped).unwrap();
        let shard = ShardLog::new(Some(log.clone()));
        // Each flush hands over one line: the writer takes the first and stalls in it, the
        // queue holds one more, every later one is dropped and counted.
        let t0 = std::time::Instant::now();
        for _ in 0..50 {
            shard.write(&entry());
            shard.flush();
        }
        assert!(t0.elapsed() < Duration::from_secs(1), "the shard blocked");
        let dropped = log.dropped();
        assert!((47..=49).contains(&dropped), "dropped {dropped}");
        // Let the writer go: what was not dropped arrives whole, once the senders are gone.
        drop(shard);
        drop(log);
        for _ in 0..100 {
            let _ = go_tx.send(());
        }
        writer.join().unwrap();
        let text = String::from_utf8(got.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count() as u64, 50 - dropped);
        for l in text.lines() {
            serde_json::from_str::<serde_json::Value>(l).unwrap();
        }
    }
}
