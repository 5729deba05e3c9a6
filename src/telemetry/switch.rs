//! The process's trace export as the config says *now*: a reload that changes `[telemetry]`
//! (endpoint, sample ratio, content capture, on or off) builds a new `Telemetry` — a new export
//! thread with its own bounded queue — and puts it here; each shard picks it up on its next API
//! request (one relaxed atomic load per request, `ShardTelemetry::begin`). Requests already
//! running export through the `Telemetry` they began with; when the last of them ends, its
//! queue's sender is gone and the old thread exports what it holds and ends.
//!
//! At shutdown (`flush`) the current export is taken out too, and every export thread is
//! given a bounded time to send what is queued (one try per batch, no retries).
//!
//! Owns: `Switch`. Must not: be touched by a shard but for the generation load and, when it
//! moved, one lock to take the new `Arc`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{Counts, Telemetry};
use crate::config::TelemetryConfig;

pub struct Switch {
    generation: AtomicU64,
    current: Mutex<Current>,
    counts: Arc<Counts>,
}

struct Current {
    telemetry: Option<Arc<Telemetry>>,
    config: TelemetryConfig,
    /// Export threads started, current and past (a past one ends once its queue is dropped).
    threads: Vec<JoinHandle<()>>,
    /// Exports a reload replaced, while requests that began with them still run.
    past: Vec<Weak<Telemetry>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Switch {
    /// The export `cfg` asks for (none when it names no endpoint).
    pub fn start(cfg: &TelemetryConfig, counts: Arc<Counts>) -> std::io::Result<Arc<Switch>> {
        let mut threads = Vec::new();
        let telemetry = match Telemetry::start(cfg, counts.clone())? {
            Some((t, h)) => {
                threads.push(h);
                Some(t)
            }
            None => None,
        };
        Ok(Arc::new(Switch {
            generation: AtomicU64::new(1),
            current: Mutex::new(Current {
                telemetry,
                config: cfg.clone(),
                threads,
                past: Vec::new(),
            }),
            counts,
        }))
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current export (`None`: off).
    pub fn current(&self) -> Option<Arc<Telemetry>> {
        lock(&self.current).telemetry.clone()
    }

    pub fn on(&self) -> bool {
        lock(&self.current).telemetry.is_some()
    }

    /// A reload's `[telemetry]`: `Ok(true)` when it changed and the new export runs (or it is
    /// off now), `Ok(false)` when it is the running one; an export thread that cannot start is
    /// an error and the running export stays.
    pub fn apply(&self, cfg: &TelemetryConfig) -> Result<bool, String> {
        let mut cur = lock(&self.current);
        if same(&cur.config, cfg) {
            return Ok(false);
        }
        let next = Telemetry::start(cfg, self.counts.clone()).map_err(|e| e.to_string())?;
        cur.threads.retain(|h| !h.is_finished());
        cur.past.retain(|w| w.strong_count() > 0);
        if let Some(old) = cur.telemetry.as_ref().map(Arc::downgrade) {
            cur.past.push(old);
        }
        cur.telemetry = match next {
            Some((t, h)) => {
                cur.threads.push(h);
                Some(t)
            }
            None => None,
        };
        cur.config = cfg.clone();
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }

    /// Shutdown: no new spans; every export thread sends what it holds (one try per batch)
    /// and ends, waited for at most `within`. Returns whether all of them ended in time.
    pub fn flush(&self, within: Duration) -> bool {
        let threads = {
            let mut cur = lock(&self.current);
            if let Some(t) = cur.telemetry.take() {
                t.stopping();
            }
            for t in cur.past.drain(..).filter_map(|w| w.upgrade()) {
                t.stopping();
            }
            self.generation.fetch_add(1, Ordering::AcqRel);
            std::mem::take(&mut cur.threads)
        };
        let deadline = Instant::now() + within;
        let mut done = true;
        for h in threads {
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if h.is_finished() {
                let _ = h.join();
            } else {
                done = false;
            }
        }
        done
    }
}

/// Whether two `[telemetry]` blocks configure the same export.
fn same(a: &TelemetryConfig, b: &TelemetryConfig) -> bool {
    a.otlp_endpoint == b.otlp_endpoint
        && a.service_name == b.service_name
        && a.sample_ratio.to_bits() == b.sample_ratio.to_bits()
        && a.capture_content == b.capture_content
        && a.queue_spans == b.queue_spans
        && a.headers_env == b.headers_env
        && a.content_max_bytes == b.content_max_bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering::Relaxed;

    /// A collector that answers 200 to every POST (one per connection).
    fn collector() -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                // the head, then its content-length of body
                loop {
                    let n = s.read(&mut buf).unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got);
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len: usize = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if got.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
            }
        });
        url
    }

    fn span() -> Vec<u8> {
        prost::Message::encode_to_vec(&super::super::proto::Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name: "chat m".into(),
            ..Default::default()
        })
    }

    #[test]
    fn reload_moves_the_export_and_flush_sends_what_is_queued() {
        let counts = Arc::new(Counts::default());
        let cfg = TelemetryConfig {
            otlp_endpoint: Some(collector()),
            ..TelemetryConfig::default()
        };
        let sw = Switch::start(&cfg, counts.clone()).unwrap();
        let g = sw.generation();
        assert_eq!(sw.apply(&cfg), Ok(false));
        assert_eq!(sw.generation(), g, "the same block changes nothing");
        let first = sw.current().unwrap();
        // a new ratio: a new export; the old one still takes spans of requests that began
        // with it, and both are flushed at shutdown
        let cfg2 = TelemetryConfig {
            sample_ratio: 0.5,
            ..cfg.clone()
        };
        assert_eq!(sw.apply(&cfg2), Ok(true));
        assert!(sw.generation() > g);
        let second = sw.current().unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        for _ in 0..3 {
            first.send(span());
            second.send(span());
        }
        // both queues are still held here: only the shutdown mark ends their threads
        assert!(sw.flush(Duration::from_secs(30)));
        assert_eq!(counts.exported.load(Relaxed), 6);
        assert!(sw.current().is_none());
        // off by reload
        let sw = Switch::start(&cfg, counts.clone()).unwrap();
        assert_eq!(sw.apply(&TelemetryConfig::default()), Ok(true));
        assert!(!sw.on());
    }
}
