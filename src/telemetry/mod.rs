//! OpenTelemetry traces of the gateway's API requests (`[telemetry]`, docs/telemetry.md): one
//! SERVER span per API request with the GenAI semantic-convention attributes, one CLIENT child
//! span per upstream attempt, W3C trace context in (the caller's `traceparent` is the parent)
//! and out (each attempt carries a `traceparent` naming its CLIENT span), head sampling that
//! honours a caller's sampled flag, exported over OTLP/HTTP by one helper thread (`export`).
//!
//! A shard only builds finished spans and *tries* the bounded queue: a full queue drops the
//! span and counts it, so a slow, failing or hung collector never blocks a shard nor grows
//! memory. Off (no `otlp_endpoint`), a shard holds `None` and a request pays one branch; a
//! request that is not sampled and has no caller context allocates nothing.
//!
//! Owns: `Telemetry` (process-wide), `ShardTelemetry`, `Request` (one request's span state,
//! boxed in its `Trace`), `Attempt`. Must not: do IO on a shard, block, or keep content unless
//! `capture_content` is on (then truncated to `content_max_bytes`).

pub mod context;
pub mod export;
pub mod proto;
pub mod requests;
mod span;
pub mod switch;
mod wire;

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use crate::config::TelemetryConfig;
use context::{Context, Ids};

pub use span::{operation, request_ended, Ended};

pub use crate::observe::metrics::process::SpanCounts as Counts;

/// The process's trace export: the queue's sending side and its settings.
pub struct Telemetry {
    /// Spans (each an encoded OTLP `Span`, `wire`), and `None`: the shutdown's mark (export
    /// what is queued, then end).
    tx: SyncSender<Option<Vec<u8>>>,
    pub counts: Arc<Counts>,
    /// Sampled when a fresh random `u64` is below this (`u64::MAX` with ratio 1: always).
    bound: u64,
    always: bool,
    pub capture: bool,
    pub content_max: usize,
    /// Shutdown: the export thread stops retrying.
    stop: Arc<AtomicBool>,
}

impl Telemetry {
    /// Start the exporter thread when `[telemetry]` names an endpoint (`Ok(None)` otherwise).
    pub fn start(
        cfg: &TelemetryConfig,
        counts: Arc<Counts>,
    ) -> std::io::Result<Option<(Arc<Telemetry>, std::thread::JoinHandle<()>)>> {
        let Some(url) = &cfg.otlp_endpoint else {
            return Ok(None);
        };
        let target = crate::config::telemetry::parse_endpoint(url)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, handle) = export::start(cfg, target, counts.clone(), stop.clone())?;
        let ratio = cfg.sample_ratio.clamp(0.0, 1.0);
        Ok(Some((
            Arc::new(Telemetry {
                tx,
                counts,
                bound: (ratio * u64::MAX as f64) as u64,
                always: ratio >= 1.0,
                capture: cfg.capture_content,
                content_max: cfg.content_max_bytes,
                stop,
            }),
            handle,
        )))
    }

    /// The process is stopping: what is queued gets one try per batch, then the export thread
    /// ends (the mark wakes it; when the queue is full it is not waiting anyway).
    pub fn stopping(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.tx.try_send(None);
    }

    /// Queue a finished span; a full queue drops it (counted), never waits.
    fn send(&self, s: Vec<u8>) {
        match self.tx.try_send(Some(s)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

/// A shard's handle: the process's export as of the last API request (a reload moves the
/// `Switch`'s generation) and the shard's own id source.
pub struct ShardTelemetry {
    switch: Arc<switch::Switch>,
    seen: Cell<u64>,
    current: RefCell<Option<Arc<Telemetry>>>,
    ids: Ids,
}

impl ShardTelemetry {
    pub fn new(switch: Arc<switch::Switch>) -> ShardTelemetry {
        ShardTelemetry {
            seen: Cell::new(switch.generation()),
            current: RefCell::new(switch.current()),
            switch,
            ids: Ids::new(),
        }
    }

    /// The export, following a reload (one atomic load; a lock only when it moved).
    fn now(&self) -> Option<Arc<Telemetry>> {
        let g = self.switch.generation();
        if g != self.seen.get() {
            self.seen.set(g);
            *self.current.borrow_mut() = self.switch.current();
        }
        self.current.borrow().clone()
    }

    pub fn capture(&self) -> Option<usize> {
        let cur = self.current.borrow();
        let t = cur.as_deref()?;
        t.capture.then_some(t.content_max)
    }

    /// A new API request with the caller's `traceparent` / `tracestate` header values: its
    /// span state when it is sampled (the caller's flag, else `sample_ratio`) or has a caller
    /// context to pass on; `None` (nothing allocated) otherwise.
    pub fn begin(
        &self,
        traceparent: Option<&[u8]>,
        tracestate: Option<&[u8]>,
        method: &'static str,
        path: &[u8],
        operation: &'static str,
    ) -> Option<Box<Request>> {
        let tel = self.now()?;
        let parent = traceparent.and_then(context::parse_traceparent);
        let sampled = match parent {
            Some((_, _, flag)) => flag,
            None => tel.always || self.ids.next_u64() < tel.bound,
        };
        if !sampled && parent.is_none() {
            return None;
        }
        let ctx = Context {
            trace_id: parent.map(|p| p.0).unwrap_or_else(|| self.ids.trace_id()),
            span_id: self.ids.span_id(),
            parent: parent.map(|p| p.1),
            sampled,
            state: parent.and(tracestate).and_then(context::valid_tracestate),
        };
        Some(Box::new(Request {
            tel,
            ctx,
            method,
            operation,
            cache_tokens: (None, None),
            path: String::from_utf8_lossy(&path[..path.len().min(256)]).into(),
            request_model: None,
            params: Params::default(),
            attempts: Vec::new(),
            cache: None,
            input: None,
            error: None,
            usage: None,
            answer: None,
            tool_span: None,
        }))
    }

    /// An upstream attempt starts: its CLIENT span's id, and the `traceparent` line it sends
    /// appended to `lines`.
    pub fn attempt(&self, req: &mut Request, a: Attempt, lines: &mut Vec<u8>) {
        let mut a = a;
        a.span_id = self.ids.span_id();
        context::upstream_lines(lines, &req.ctx, &a.span_id);
        if req.attempts.len() < MAX_ATTEMPT_SPANS {
            req.attempts.push(a);
        }
    }
}

/// A traced (sampled) request's answer is read for its span: its usage (an unkeyed request gets
/// a `Grant::unkeyed` that only reads), id, finish reasons and, with `capture_content`, text.
/// Nothing for requests that are not traced.
pub fn read_answer<'g>(
    req: Option<&Request>,
    tel: &Option<ShardTelemetry>,
    grant: &mut Option<crate::governance::Grant<'g>>,
    gov: &'g crate::governance::Governance,
) {
    let (Some(req), Some(tel)) = (req, tel) else {
        return;
    };
    if req.ctx.sampled {
        grant
            .get_or_insert_with(|| crate::governance::Grant::unkeyed(gov))
            .usage()
            .observe(tel.capture());
    }
}

/// A traced MCP request: the `traceparent` line its forwarded `tools/call` carries, naming the
/// CLIENT span `request_ended` exports for that call (`None`: not traced).
pub fn tool_call(req: Option<&mut Request>, tel: &Option<ShardTelemetry>) -> Option<Vec<u8>> {
    let (req, tel) = (req?, tel.as_ref()?);
    let span = tel.ids.span_id();
    let mut lines = Vec::with_capacity(72);
    context::upstream_lines(&mut lines, &req.ctx, &span);
    req.tool_span = Some(span);
    Some(lines)
}

/// CLIENT spans kept per request (a retry storm does not grow a request's state without end).
pub const MAX_ATTEMPT_SPANS: usize = 16;

/// Sampling parameters the request asked for (`gen_ai.request.*`).
#[derive(Debug, Clone, Default)]
pub struct Params {
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
}

/// One API request's span state (see the module doc).
#[derive(Debug, Clone)]
pub struct Request {
    /// The export it began with (a reload meanwhile does not move it).
    tel: Arc<Telemetry>,
    pub ctx: Context,
    pub method: &'static str,
    /// `gen_ai.operation.name`.
    pub operation: &'static str,
    /// (cache-read, cache-creation) input tokens the answer reported.
    pub cache_tokens: (Option<u64>, Option<u64>),
    /// `url.path` (at most 256 bytes).
    pub path: Box<str>,
    pub request_model: Option<Box<str>>,
    pub params: Params,
    pub attempts: Vec<Attempt>,
    /// `ringgate.cache`: `hit` or `miss` when the response cache looked.
    pub cache: Option<&'static str>,
    /// `capture_content`: the request body, truncated.
    pub input: Option<Box<str>>,
    /// `error.type` of a failure answered by the gateway.
    pub error: Option<&'static str>,
    /// (input, output) tokens the answer reported (keyed or not).
    pub usage: Option<(u64, u64)>,
    /// What the answer said about itself (id, finish reasons, text).
    pub answer: Option<Box<crate::observe::answer::Facts>>,
    /// An MCP request's CLIENT span for its forwarded `tools/call`.
    pub tool_span: Option<[u8; 8]>,
}

impl Request {
    /// What the routed body says: the model and its sampling parameters; with capture on, the
    /// body itself (truncated on a character boundary).
    pub fn routed(
        &mut self,
        model: &str,
        dialect: crate::dialect::Dialect,
        body: &[u8],
        capture: Option<usize>,
    ) {
        self.request_model = Some(model.into());
        self.params = span::params_of(dialect, body);
        if let Some(max) = capture {
            let text = String::from_utf8_lossy(&body[..body.len().min(max)]);
            let mut text = text.into_owned();
            while text.len() > max {
                text.pop();
            }
            self.input = Some(text.into());
        }
    }

    /// The answer was relayed or translated: what its scan read.
    pub fn answered(&mut self, scan: &mut crate::governance::usage::UsageScan) {
        self.usage = scan.io();
        self.cache_tokens = scan.cached();
        self.answer = scan.take_facts();
    }

    /// The last attempt ended: its status, or how it failed, and why it was retried.
    pub fn attempt_ended(
        &mut self,
        status: Option<u16>,
        error: Option<&'static str>,
        retry: Option<&'static str>,
    ) {
        if let Some(a) = self.attempts.last_mut() {
            a.end = Some(Instant::now());
            a.status = status;
            a.error = error;
            a.retry = retry;
        }
    }
}

/// One upstream attempt's CLIENT span.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub span_id: [u8; 8],
    pub start: Instant,
    pub end: Option<Instant>,
    /// (`server.address`, `server.port`); `None` for the in-process mock. A Unix-socket
    /// upstream is (its socket path, 0): the semantic conventions' `server.address` for a
    /// Unix domain socket is its path, with no port and `network.transport = "unix"`.
    pub server: Option<(Box<str>, u16)>,
    pub deployment: Box<str>,
    pub provider: &'static str,
    pub model: Box<str>,
    pub status: Option<u16>,
    pub error: Option<&'static str>,
    pub retry: Option<&'static str>,
}

impl Attempt {
    pub fn new(dep: &crate::route::Deployment, model: &str) -> Attempt {
        Attempt {
            span_id: [0; 8],
            start: Instant::now(),
            end: None,
            server: dep.provider.endpoint.as_ref().map(|e| match &e.unix {
                Some(path) => (path.as_str().into(), 0),
                None => (e.host.as_str().into(), e.port),
            }),
            deployment: dep.label.as_str().into(),
            provider: span::provider_name(dep.provider.kind),
            model: model.into(),
            status: None,
            error: None,
            retry: None,
        }
    }
}
