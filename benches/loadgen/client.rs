//! Connection pool, one-request execution and per-target statistics.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use crate::proto::{self, Framing, ProtoError, SseEvent, SseScanner};
use crate::timeline::{HeaderTally, Timeline};

/// Initial per-connection read buffer; grows when a response needs more.
const READ_BUF: usize = 8 * 1024;

/// One keep-alive connection and its read buffer.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
    sse: SseScanner,
    /// Number of requests already completed on this connection.
    uses: u64,
}

impl Conn {
    fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            buf: Vec::with_capacity(READ_BUF),
            start: 0,
            sse: SseScanner::default(),
            uses: 0,
        }
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Read more bytes, appending to the buffer. Returns 0 on EOF.
    async fn fill(&mut self) -> io::Result<usize> {
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.buf.capacity() - self.buf.len() < READ_BUF / 4 {
            self.buf.drain(..self.start);
            self.start = 0;
            if self.buf.capacity() - self.buf.len() < READ_BUF / 4 {
                let grow = self.buf.capacity().max(READ_BUF);
                self.buf.reserve(grow);
            }
        }
        let buf = std::mem::take(&mut self.buf);
        let (len, cap) = (buf.len(), buf.capacity());
        let (res, slice) = self.stream.read(buf.slice_mut(len..cap)).await;
        self.buf = slice.into_inner();
        res
    }
}

/// A waiting acquirer's hand-off slot.
#[derive(Default)]
struct Waiter {
    grant: RefCell<Option<Grant>>,
    waker: Cell<Option<Waker>>,
}

enum Grant {
    Idle(Conn),
    /// Permission to open a new connection (counted in `open` already).
    Open,
}

/// Keep-alive pool for one target, grown on demand up to `max` connections.
pub struct Pool {
    pub addr: SocketAddr,
    idle: Vec<Conn>,
    open: usize,
    max: usize,
    waiters: VecDeque<Rc<Waiter>>,
    pub opened_total: u64,
    pub peak_open: usize,
}

impl Pool {
    pub fn new(addr: SocketAddr, max: usize) -> Rc<RefCell<Self>> {
        Rc::new(RefCell::new(Self {
            addr,
            idle: Vec::new(),
            open: 0,
            max: max.max(1),
            waiters: VecDeque::new(),
            opened_total: 0,
            peak_open: 0,
        }))
    }

    /// Give `grant` to the oldest waiter; returns it back when nobody waits.
    fn hand_to_waiter(&mut self, grant: Grant) -> Option<Grant> {
        match self.waiters.pop_front() {
            Some(w) => {
                *w.grant.borrow_mut() = Some(grant);
                if let Some(wk) = w.waker.take() {
                    wk.wake();
                }
                None
            }
            None => Some(grant),
        }
    }

    fn release(&mut self, conn: Conn) {
        if let Some(Grant::Idle(c)) = self.hand_to_waiter(Grant::Idle(conn)) {
            self.idle.push(c);
        }
    }

    fn discard_slot(&mut self) {
        if self.hand_to_waiter(Grant::Open).is_some() {
            self.open -= 1;
        }
    }
}

struct WaitGrant(Rc<Waiter>);

impl Future for WaitGrant {
    type Output = Grant;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Grant> {
        if let Some(g) = self.0.grant.borrow_mut().take() {
            return Poll::Ready(g);
        }
        self.0.waker.set(Some(cx.waker().clone()));
        Poll::Pending
    }
}

async fn acquire(pool: &Rc<RefCell<Pool>>) -> Grant {
    let w = {
        let mut p = pool.borrow_mut();
        if let Some(c) = p.idle.pop() {
            return Grant::Idle(c);
        }
        if p.open < p.max {
            p.open += 1;
            p.peak_open = p.peak_open.max(p.open);
            return Grant::Open;
        }
        let w = Rc::new(Waiter::default());
        p.waiters.push_back(w.clone());
        w
    };
    WaitGrant(w).await
}

/// A pool slot held by one request; returns the connection (or frees the slot) on drop.
struct Lease {
    pool: Rc<RefCell<Pool>>,
    conn: Option<Conn>,
    reusable: bool,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut p = self.pool.borrow_mut();
        match self.conn.take() {
            Some(c) if self.reusable => p.release(c),
            _ => p.discard_slot(),
        }
    }
}

/// Error kinds, counted separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrKind {
    Connect,
    Timeout,
    Status(u16),
    Protocol,
    Io,
    IncompleteStream,
}

/// Timings of one successful request, all measured from the intended send time.
pub struct Outcome {
    pub done: Instant,
    pub ttfb: Duration,
    pub ttft: Option<Duration>,
}

pub struct Shared {
    /// Called after every request (open loop: wakes the scheduler if an arrival is due).
    pub poke: Option<Box<dyn Fn()>>,
    pub stream: bool,
    pub timeout: Duration,
    pub idle_timeout: Duration,
    /// Response headers whose values are counted (`--count-header`); empty: none.
    pub count_headers: Vec<String>,
}

fn hist() -> Histogram<u64> {
    // 1 µs .. 60 s, 3 significant digits; the bounds are valid so this cannot fail.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn rec(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record((d.as_micros() as u64).max(1));
}

/// Per-target statistics (measured phase only).
pub struct Stats {
    pub latency: Histogram<u64>,
    pub ttfb: Histogram<u64>,
    pub ttft: Histogram<u64>,
    pub gaps: Histogram<u64>,
    pub send_lag: Histogram<u64>,
    pub scheduled: u64,
    pub ok: u64,
    pub ok_in_window: u64,
    pub errors: BTreeMap<ErrKind, u64>,
    pub warmup_ok: u64,
    pub warmup_err: u64,
    pub stale_retries: u64,
    pub bytes_in: u64,
    /// `--timeline`: outcomes per interval of intended send time.
    pub timeline: Option<Timeline>,
    /// `--count-header`: response-header value counts.
    pub headers: HeaderTally,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            latency: hist(),
            ttfb: hist(),
            ttft: hist(),
            gaps: hist(),
            send_lag: hist(),
            scheduled: 0,
            ok: 0,
            ok_in_window: 0,
            errors: BTreeMap::new(),
            warmup_ok: 0,
            warmup_err: 0,
            stale_retries: 0,
            bytes_in: 0,
            timeline: None,
            headers: HeaderTally::default(),
        }
    }
}

impl Stats {
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// A target: its address, prebuilt request and statistics.
pub struct Target {
    pub name: &'static str,
    pub url: String,
    pub request: &'static [u8],
    pub pool: Rc<RefCell<Pool>>,
    pub stats: RefCell<Stats>,
}

/// Gap recorder used while reading a stream.
struct StreamTimes {
    ttft: Option<Duration>,
    last_event: Option<Instant>,
    terminal: Option<Instant>,
}

/// Execute one request whose intended send time is `sched`; record into the target's stats.
/// `measured` selects whether results count (false during warm-up).
/// `window` is the measurement window used for the served-rate count.
pub async fn run_request(
    target: Rc<Target>,
    shared: Rc<Shared>,
    sched: Instant,
    measured: bool,
    window: (Instant, Instant),
) {
    let deadline = sched + shared.timeout;
    let mut result = exchange_with_retry(&target, &shared, sched, deadline, measured).await;
    // Under load, completions are frequent: let them poke the open-loop scheduler so it does
    // not depend on the ticker thread's wake-ups.
    if let Some(poke) = &shared.poke {
        poke();
    }
    if let Ok(o) = &result {
        if o.done > deadline {
            result = Err(ErrKind::Timeout);
        }
    }
    let mut st = target.stats.borrow_mut();
    if let Ok(o) = &result {
        // Served rate counts every success completing inside the window, whenever scheduled.
        if o.done >= window.0 && o.done < window.1 {
            st.ok_in_window += 1;
        }
    }
    if !measured {
        match result {
            Ok(_) => st.warmup_ok += 1,
            Err(_) => st.warmup_err += 1,
        }
        return;
    }
    if let Some(tl) = st.timeline.as_mut() {
        tl.record(sched, result.as_ref().ok().map(|o| o.done - sched));
    }
    match result {
        Ok(o) => {
            st.ok += 1;
            rec(&mut st.latency, o.done - sched);
            rec(&mut st.ttfb, o.ttfb);
            if let Some(t) = o.ttft {
                rec(&mut st.ttft, t);
            }
        }
        Err(e) => *st.errors.entry(e).or_insert(0) += 1,
    }
}

async fn exchange_with_retry(
    target: &Target,
    shared: &Shared,
    sched: Instant,
    deadline: Instant,
    measured: bool,
) -> Result<Outcome, ErrKind> {
    // A reused keep-alive connection may have been closed by the server while idle: retry once
    // on a fresh connection when nothing at all came back.
    for attempt in 0..2 {
        let grant = acquire(&target.pool).await;
        let now = Instant::now();
        if attempt == 0 && measured {
            rec(
                &mut target.stats.borrow_mut().send_lag,
                now.saturating_duration_since(sched),
            );
        }
        if now >= deadline {
            let mut lease = Lease {
                pool: target.pool.clone(),
                conn: None,
                reusable: false,
            };
            if let Grant::Idle(c) = grant {
                lease.conn = Some(c);
                lease.reusable = true;
            }
            return Err(ErrKind::Timeout);
        }
        let mut lease = Lease {
            pool: target.pool.clone(),
            conn: None,
            reusable: false,
        };
        let reused = match grant {
            // The retry goes out on a fresh connection: another pooled one may have been closed
            // by the same idle timeout as the first (seen behind HAProxy's keep-alive timeout).
            // Its slot is kept; the connection is dropped and `exchange` opens a new one.
            Grant::Idle(c) if attempt > 0 => {
                drop(c);
                false
            }
            Grant::Idle(c) => {
                lease.conn = Some(c);
                true
            }
            Grant::Open => false,
        };
        let fut = exchange(target, shared, &mut lease, sched, measured);
        let res = monoio::time::timeout_at(monoio::time::Instant::from_std(deadline), fut).await;
        match res {
            Err(_) => return Err(ErrKind::Timeout),
            Ok(Err(Failure::Stale)) if reused && attempt == 0 => {
                if measured {
                    target.stats.borrow_mut().stale_retries += 1;
                }
                continue;
            }
            Ok(Err(Failure::Stale)) => return Err(ErrKind::Io),
            Ok(Err(Failure::Kind(k))) => return Err(k),
            Ok(Ok(o)) => return Ok(o),
        }
    }
    Err(ErrKind::Io)
}

enum Failure {
    /// Connection closed/reset before any response byte (retryable once on a reused conn).
    Stale,
    Kind(ErrKind),
}

impl From<ProtoError> for Failure {
    fn from(_: ProtoError) -> Self {
        Failure::Kind(ErrKind::Protocol)
    }
}

async fn exchange(
    target: &Target,
    shared: &Shared,
    lease: &mut Lease,
    sched: Instant,
    measured: bool,
) -> Result<Outcome, Failure> {
    if lease.conn.is_none() {
        let addr = target.pool.borrow().addr;
        let stream = TcpStream::connect_addr(addr)
            .await
            .map_err(|_| Failure::Kind(ErrKind::Connect))?;
        let _ = stream.set_nodelay(true);
        target.pool.borrow_mut().opened_total += 1;
        lease.conn = Some(Conn::new(stream));
    }
    let conn = match lease.conn.as_mut() {
        Some(c) => c,
        None => return Err(Failure::Kind(ErrKind::Connect)),
    };
    let (res, _) = conn.stream.write_all(target.request).await;
    if res.is_err() {
        return Err(Failure::Stale);
    }

    // Response head.
    let head = loop {
        if let Some(h) = proto::parse_head(conn.pending())? {
            if (100..200).contains(&h.status) {
                conn.start += h.head_len; // skip interim responses
                continue;
            }
            if measured && !shared.count_headers.is_empty() {
                let values = proto::header_values(conn.pending(), &shared.count_headers);
                target.stats.borrow_mut().headers.record(values);
            }
            conn.start += h.head_len;
            break h;
        }
        let got_any = conn.start != conn.buf.len();
        match conn.fill().await {
            Ok(0) | Err(_) if !got_any => return Err(Failure::Stale),
            Ok(0) | Err(_) => return Err(Failure::Kind(ErrKind::Protocol)),
            Ok(_) => {}
        }
    };
    let ttfb = Instant::now().saturating_duration_since(sched);
    let status = head.status;
    let is_sse = shared.stream && (200..300).contains(&status);
    let mut keep_alive = head.keep_alive;
    let mut times = StreamTimes {
        ttft: None,
        last_event: None,
        terminal: None,
    };
    conn.sse.reset();
    let mut gaps: Vec<u64> = Vec::new();
    let mut body_bytes: u64 = 0;
    let mut framing = head.framing;
    let mut remaining_len = match framing {
        Framing::Length(n) => n,
        _ => 0,
    };
    let mut eof = false;
    loop {
        // Consume what is buffered.
        let now = Instant::now();
        let data_start = conn.start;
        let (consumed, done) = consume(
            &mut framing,
            &mut remaining_len,
            &conn.buf[data_start..],
            &mut conn.sse,
            is_sse,
            now,
            sched,
            &mut times,
            &mut gaps,
            &mut body_bytes,
            eof,
        )?;
        conn.start += consumed;
        if done || (times.terminal.is_some() && matches!(framing, Framing::UntilClose)) {
            if matches!(framing, Framing::UntilClose) {
                keep_alive = false;
            }
            break;
        }
        if eof {
            // Body not complete and the peer closed.
            if times.terminal.is_some() {
                keep_alive = false;
                break;
            }
            if is_sse {
                return Err(Failure::Kind(ErrKind::IncompleteStream));
            }
            return Err(Failure::Kind(ErrKind::Protocol));
        }
        let r = if is_sse {
            match monoio::time::timeout(shared.idle_timeout, conn.fill()).await {
                Ok(r) => r,
                Err(_) if times.terminal.is_some() => {
                    keep_alive = false;
                    break;
                }
                Err(_) => return Err(Failure::Kind(ErrKind::IncompleteStream)),
            }
        } else {
            conn.fill().await
        };
        match r {
            Ok(0) => eof = true,
            Ok(_) => {}
            Err(_) if is_sse => return Err(Failure::Kind(ErrKind::IncompleteStream)),
            Err(_) => return Err(Failure::Kind(ErrKind::Io)),
        }
    }
    let done_at = Instant::now();
    conn.uses += 1;
    if keep_alive && conn.start == conn.buf.len() {
        lease.reusable = true;
    }
    if measured {
        let mut st = target.stats.borrow_mut();
        st.bytes_in += body_bytes;
        for g in &gaps {
            st.gaps.saturating_record((*g).max(1));
        }
    }
    if !(200..300).contains(&status) {
        return Err(Failure::Kind(ErrKind::Status(status)));
    }
    if is_sse {
        if times.terminal.is_none() {
            return Err(Failure::Kind(ErrKind::IncompleteStream));
        }
        return Ok(Outcome {
            done: times.terminal.unwrap_or(done_at),
            ttfb,
            ttft: times.ttft,
        });
    }
    Ok(Outcome {
        done: done_at,
        ttfb,
        ttft: None,
    })
}

fn on_sse(ev: SseEvent, now: Instant, sched: Instant, t: &mut StreamTimes, gaps: &mut Vec<u64>) {
    match ev {
        SseEvent::Terminal => {
            if t.terminal.is_none() {
                t.terminal = Some(now);
            }
        }
        SseEvent::Content | SseEvent::Other => {
            if t.ttft.is_none() {
                if ev == SseEvent::Content {
                    t.ttft = Some(now.saturating_duration_since(sched));
                    t.last_event = Some(now);
                }
                return;
            }
            if let Some(last) = t.last_event {
                gaps.push(now.saturating_duration_since(last).as_micros() as u64);
            }
            t.last_event = Some(now);
        }
    }
}

/// Feed buffered body bytes through the framing decoder. Returns (consumed, body_complete).
#[allow(clippy::too_many_arguments)]
fn consume(
    framing: &mut Framing,
    remaining_len: &mut u64,
    input: &[u8],
    sse: &mut SseScanner,
    is_sse: bool,
    now: Instant,
    sched: Instant,
    times: &mut StreamTimes,
    gaps: &mut Vec<u64>,
    body_bytes: &mut u64,
    eof: bool,
) -> Result<(usize, bool), ProtoError> {
    let mut sink = |chunk: &[u8]| {
        *body_bytes += chunk.len() as u64;
        if is_sse && times.terminal.is_none() {
            sse.feed(chunk, &mut |ev| on_sse(ev, now, sched, times, gaps));
        }
    };
    match framing {
        Framing::Empty => Ok((0, true)),
        Framing::Length(_) => {
            let take = (*remaining_len).min(input.len() as u64) as usize;
            sink(&input[..take]);
            *remaining_len -= take as u64;
            Ok((take, *remaining_len == 0))
        }
        Framing::Chunked(c) => {
            let n = c.feed(input, &mut sink)?;
            Ok((n, c.is_done()))
        }
        Framing::UntilClose => {
            sink(input);
            Ok((input.len(), eof))
        }
    }
}
