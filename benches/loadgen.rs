//! ringgate open-loop load generator (a `harness = false` bench target).
//!
//! `cargo bench --bench loadgen -- --target http://127.0.0.1:8080 --rate 1000 --duration 20`
//!
//! * Open loop by default: request `i` is due at `t0 + i / rate` whatever the responses do, and
//!   its latency is measured from that intended time (coordinated-omission safe). Connections come
//!   from a keep-alive pool grown on demand up to `--connections`; waiting for one counts.
//! * Closed loop with `--concurrency N` (and optionally `--requests M`).
//! * With `--baseline URL` requests alternate target/baseline on one arrival process and the
//!   report includes the added latency (target − baseline) at each percentile.
//! * SSE-aware for `--stream`: time to the first content token, inter-event gaps, terminal events.
//! * Optionally results over time (`--timeline MS`), merged per phase (`--phase-at`) or per
//!   named wall-clock window (`--windows-file`, e.g. each node's restart in a rolling upgrade),
//!   and response-header value counts (`--count-header NAME`, e.g. which deployment answered),
//!   see `loadgen/timeline.rs`.
//!
//! Run with `--help` for all options.

#[path = "loadgen/client.rs"]
mod client;
#[path = "loadgen/proto.rs"]
mod proto;
#[path = "loadgen/report.rs"]
mod report;
#[path = "loadgen/timeline.rs"]
mod timeline;

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use client::{Pool, Shared, Stats, Target};
use proto::{RequestSpec, Size, Workload};
use timeline::Timeline;

const USAGE: &str = "\
ringgate load generator (open loop, coordinated-omission safe)

USAGE:
  cargo bench --bench loadgen -- --target URL [OPTIONS]
  target/release/deps/loadgen-* --target URL [OPTIONS]

TARGETS:
  --target URL          base URL of the system under test, e.g. http://127.0.0.1:8080
  --baseline URL        optional direct baseline (e.g. the mock); requests alternate
                        target/baseline and the report adds target - baseline
WORKLOAD:
  --workload NAME       chat | responses | messages              [chat]
  --stream              request SSE streaming (stream: true)
  --size NAME           small | medium | large                   [small]
                        input 200/2000/20000 tokens (4 B/token), output 100/500/1000
  --model NAME          model field                              [mock]
  --output-tokens N     max output tokens (overrides the size's) [size]
  --api-key KEY         bearer / x-api-key value                 [sk-bench]
  --header 'NAME: VALUE' extra request header (repeatable; sent to every target)
LOAD:
  --rate RPS            open-loop arrival rate PER TARGET        [100]
  --split               --rate is the total over both targets (each gets rate/2)
  --duration SECS       measured window                          [10]
  --warmup SECS         warm-up before the window (discarded)    [2]
  --concurrency N       closed loop instead: N workers per target
  --requests N          closed loop: stop after N measured requests per target
  --connections N       max keep-alive connections per target    [2048]
  --timeout-ms MS       per-request deadline from intended send  [30000]
  --idle-timeout-ms MS  streams: max gap between reads           [10000]
OUTPUT:
  --json PATH           write raw results as JSON
  --timeline MS         also report ok/errors/p50/p99 per MS-wide interval of intended
                        send time (measured window only)
  --phase-at SECS       with --timeline: also report merged percentiles per phase of the
                        window split at these offsets (repeatable, e.g. before/after a fault)
  --windows-file PATH   with --timeline: at the end, read lines 'NAME FROM_UNIX_MS TO_UNIX_MS'
                        from PATH (written during the run, e.g. when each node of a fleet
                        restarted) and report merged percentiles per named window
  --count-header NAME   count the values of this response header per target (repeatable)
  --label TEXT          free-form label copied into the JSON
  --quiet               no human-readable summary
ENV:
  MONOIO_FORCE_LEGACY_DRIVER=1   use epoll instead of io_uring
";

struct Config {
    target: String,
    baseline: Option<String>,
    workload: Workload,
    stream: bool,
    size: Size,
    model: String,
    output_tokens: Option<usize>,
    api_key: String,
    headers: Vec<String>,
    rate: f64,
    split: bool,
    duration: f64,
    warmup: f64,
    concurrency: Option<usize>,
    requests: Option<u64>,
    connections: usize,
    timeout_ms: u64,
    idle_timeout_ms: u64,
    json: Option<String>,
    label: Option<String>,
    quiet: bool,
    timeline_ms: Option<u64>,
    phases: Vec<f64>,
    windows_file: Option<String>,
    count_headers: Vec<String>,
}

fn parse_args(args: &[String]) -> Result<Option<Config>, String> {
    let mut c = Config {
        target: String::new(),
        baseline: None,
        workload: Workload::Chat,
        stream: false,
        size: Size::Small,
        model: "mock".into(),
        output_tokens: None,
        api_key: "sk-bench".into(),
        headers: Vec::new(),
        rate: 100.0,
        split: false,
        duration: 10.0,
        warmup: 2.0,
        concurrency: None,
        requests: None,
        connections: 2048,
        timeout_ms: 30_000,
        idle_timeout_ms: 10_000,
        json: None,
        label: None,
        quiet: false,
        timeline_ms: None,
        phases: Vec::new(),
        windows_file: None,
        count_headers: Vec::new(),
    };
    let mut it = args.iter();
    fn val<'a>(it: &mut std::slice::Iter<'a, String>, flag: &str) -> Result<&'a str, String> {
        it.next()
            .map(String::as_str)
            .ok_or_else(|| format!("{flag} needs a value"))
    }
    fn num<T: std::str::FromStr>(s: &str, flag: &str) -> Result<T, String> {
        s.parse().map_err(|_| format!("{flag}: bad number {s:?}"))
    }
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v)),
            _ => (a.as_str(), None),
        };
        let v = |it: &mut std::slice::Iter<'_, String>| -> Result<String, String> {
            match inline {
                Some(x) => Ok(x.to_string()),
                None => val(it, flag).map(str::to_string),
            }
        };
        match flag {
            "--bench" => {} // passed by `cargo bench`
            "-h" | "--help" => return Ok(None),
            "--target" => c.target = v(&mut it)?,
            "--baseline" => c.baseline = Some(v(&mut it)?),
            "--workload" => {
                let s = v(&mut it)?;
                c.workload = Workload::parse(&s).ok_or(format!("unknown workload {s:?}"))?;
            }
            "--stream" => c.stream = true,
            "--size" => {
                let s = v(&mut it)?;
                c.size = Size::parse(&s).ok_or(format!("unknown size {s:?}"))?;
            }
            "--model" => c.model = v(&mut it)?,
            "--output-tokens" => {
                let n = v(&mut it)?;
                c.output_tokens = Some(
                    n.parse()
                        .map_err(|_| format!("bad --output-tokens {n:?}"))?,
                );
            }
            "--api-key" => c.api_key = v(&mut it)?,
            "--header" => {
                let h = v(&mut it)?;
                let ok = h
                    .split_once(':')
                    .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_graphic()))
                    && !h.contains(['\r', '\n']);
                if !ok {
                    return Err(format!("--header: expected 'Name: value', got {h:?}"));
                }
                c.headers.push(h);
            }
            "--rate" => c.rate = num(&v(&mut it)?, flag)?,
            "--split" => c.split = true,
            "--duration" => c.duration = num(&v(&mut it)?, flag)?,
            "--warmup" => c.warmup = num(&v(&mut it)?, flag)?,
            "--concurrency" => c.concurrency = Some(num(&v(&mut it)?, flag)?),
            "--requests" => c.requests = Some(num(&v(&mut it)?, flag)?),
            "--connections" => c.connections = num(&v(&mut it)?, flag)?,
            "--timeout-ms" => c.timeout_ms = num(&v(&mut it)?, flag)?,
            "--idle-timeout-ms" => c.idle_timeout_ms = num(&v(&mut it)?, flag)?,
            "--json" => c.json = Some(v(&mut it)?),
            "--label" => c.label = Some(v(&mut it)?),
            "--quiet" => c.quiet = true,
            "--timeline" => c.timeline_ms = Some(num(&v(&mut it)?, flag)?),
            "--phase-at" => c.phases.push(num(&v(&mut it)?, flag)?),
            "--windows-file" => c.windows_file = Some(v(&mut it)?),
            "--count-header" => c.count_headers.push(v(&mut it)?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if c.target.is_empty() {
        return Ok(None);
    }
    if c.concurrency.is_none() && !(c.rate > 0.0 && c.rate.is_finite()) {
        return Err("--rate must be > 0".into());
    }
    if c.concurrency == Some(0) {
        return Err("--concurrency must be > 0".into());
    }
    if c.requests.is_some() && c.concurrency.is_none() {
        return Err("--requests needs --concurrency (closed loop)".into());
    }
    if !(c.duration >= 0.0 && c.warmup >= 0.0) {
        return Err("--duration/--warmup must be >= 0".into());
    }
    if c.timeline_ms == Some(0) {
        return Err("--timeline must be > 0 ms".into());
    }
    if !c.phases.is_empty() && c.timeline_ms.is_none() {
        return Err("--phase-at needs --timeline".into());
    }
    if c.windows_file.is_some() && c.timeline_ms.is_none() {
        return Err("--windows-file needs --timeline".into());
    }
    if c.phases.iter().any(|p| !(p.is_finite() && *p >= 0.0)) {
        return Err("--phase-at must be >= 0 seconds".into());
    }
    Ok(Some(c))
}

/// `http://host:port/prefix` → (socket address, Host header, path prefix).
fn parse_url(url: &str) -> Result<(SocketAddr, String, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// URLs are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let has_port = if authority.starts_with('[') {
        authority.contains("]:")
    } else {
        authority.contains(':')
    };
    let with_port = if has_port {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let addr = with_port
        .to_socket_addrs()
        .map_err(|e| format!("{url}: {e}"))?
        .next()
        .ok_or_else(|| format!("{url}: no address"))?;
    Ok((
        addr,
        authority.to_string(),
        path.trim_end_matches('/').to_string(),
    ))
}

/// Cross-thread precise ticker: wakes the scheduler task at the arrival times (std sleep has
/// ~50 µs slack; monoio's timer wheel has 1 ms granularity, too coarse for sub-ms latencies).
struct Tick {
    waker: Mutex<Option<Waker>>,
    /// Arrivals issued so far by the scheduler task.
    issued: AtomicU64,
    stop: AtomicBool,
}

/// Scheduler state visible to request tasks (same thread), for the completion "poke".
#[derive(Default)]
struct SchedCtl {
    sched: Cell<Option<Schedule>>,
    issued: Cell<u64>,
    waker: RefCell<Option<Waker>>,
}

impl SchedCtl {
    fn poke(&self) {
        if let Some(s) = self.sched.get() {
            if s.due(Instant::now()) > self.issued.get() {
                if let Some(w) = self.waker.borrow().as_ref() {
                    w.wake_by_ref();
                }
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Schedule {
    t0: Instant,
    interval_ns: f64,
    total: u64,
}

impl Schedule {
    fn at(&self, i: u64) -> Instant {
        self.t0 + Duration::from_nanos((i as f64 * self.interval_ns) as u64)
    }
    /// Number of requests due at `now`.
    fn due(&self, now: Instant) -> u64 {
        if now < self.t0 {
            return 0;
        }
        let k = ((now - self.t0).as_nanos() as f64 / self.interval_ns).floor() as u64 + 1;
        // Guard against float rounding: make sure `at(k-1) <= now`.
        let k = if k > 0 && self.at(k - 1) > now {
            k - 1
        } else {
            k
        };
        k.min(self.total)
    }
}

fn spawn_ticker(tick: Arc<Tick>, s: Schedule) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        // Default timer slack is 50 µs; ask for 1 µs so arrivals stay on schedule.
        // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer slack.
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
        }
        // Low rates (interval >= 100 µs): wake the runtime exactly at each arrival.
        // High rates: request completions poke the scheduler on time by themselves, and a
        // thread switch per arrival would cost more than the requests; the ticker is then a
        // safety net that checks `period` after the oldest pending arrival and adapts
        // (100 .. 250 µs) to how often it was actually needed.
        let interval = Duration::from_nanos(s.interval_ns as u64);
        let exact = interval >= Duration::from_micros(100);
        let (min_period, max_period) = (Duration::from_micros(100), Duration::from_micros(250));
        let mut period = min_period;
        let spacing = Duration::from_micros(50);
        let mut last = s.t0.checked_sub(spacing).unwrap_or(s.t0);
        // Arrivals already covered by an earlier wake-up.
        let mut covered = 0u64;
        let (mut loops, mut wakes) = (0u64, 0u64);
        loop {
            loops += 1;
            if tick.stop.load(Ordering::Relaxed) {
                break;
            }
            let k = tick.issued.load(Ordering::Acquire).max(covered);
            if k >= s.total {
                break;
            }
            let target = if exact {
                s.at(k).max(last + spacing)
            } else {
                (s.at(k) + period).max(last + period)
            };
            let now = Instant::now();
            if target > now {
                std::thread::sleep(target - now);
            }
            last = target;
            if tick.issued.load(Ordering::Acquire) <= k {
                wakes += 1;
                wake(&tick);
                covered = s.due(target).max(k + 1);
                period = (period / 2).max(min_period);
            } else {
                period = (period * 2).min(max_period);
            }
        }
        if std::env::var_os("LOADGEN_DEBUG").is_some() {
            eprintln!("ticker: {loops} loops, {wakes} wakes");
        }
    })
}

fn wake(tick: &Tick) {
    let g = tick.waker.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(w) = g.as_ref() {
        w.wake_by_ref();
    }
}

/// CPU time (ns) of this process (all threads, including exited io_uring workers).
fn process_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the ")" of the command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Some((utime + stime) * 1_000_000_000 / hz)
}

struct Run {
    started_unix_ms: u128,
    /// Start of the measured window (time axis origin of `--timeline`), Unix ms.
    window_start_unix_ms: u128,
    window: (Instant, Instant),
    elapsed: Duration,
    cpu_busy_pct: Option<f64>,
    last_done: Vec<Option<Instant>>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = match parse_args(&args) {
        Ok(Some(c)) => c,
        Ok(None) => {
            print!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("loadgen: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    let code = match real_main(cfg) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("loadgen: {e}");
            1
        }
    };
    // Exit without tearing down the runtime's leftover tasks.
    std::process::exit(code);
}

type Runtime = monoio::FusionRuntime<
    monoio::time::TimeDriver<monoio::IoUringDriver>,
    monoio::time::TimeDriver<monoio::LegacyDriver>,
>;

/// io_uring with COOP_TASKRUN|SINGLE_ISSUER (much faster here), else a plain ring, else epoll.
fn build_runtime() -> std::io::Result<(Runtime, &'static str)> {
    let legacy = !monoio::utils::detect_uring();
    if !legacy {
        let mut urb = io_uring::IoUring::builder();
        urb.setup_coop_taskrun().setup_single_issuer();
        if let Ok(rt) = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .with_entries(4096)
            .uring_builder(urb)
            .build()
        {
            return Ok((rt, "io_uring(coop_taskrun,single_issuer)"));
        }
    }
    let rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .enable_timer()
        .with_entries(4096)
        .build()?;
    Ok((rt, if legacy { "epoll(legacy)" } else { "io_uring" }))
}

fn real_main(cfg: Config) -> Result<(), String> {
    let spec = RequestSpec {
        workload: cfg.workload,
        stream: cfg.stream,
        size: cfg.size,
        model: &cfg.model,
        output_tokens: cfg.output_tokens,
        api_key: &cfg.api_key,
        headers: &cfg.headers,
    };
    let mut urls = vec![("target", cfg.target.clone())];
    if let Some(b) = &cfg.baseline {
        urls.push(("baseline", b.clone()));
    }
    let mut targets = Vec::new();
    for (name, url) in &urls {
        let (addr, host, prefix) = parse_url(url)?;
        let req: &'static [u8] =
            Box::leak(proto::build_request(&spec, &host, &prefix).into_boxed_slice());
        targets.push(Rc::new(Target {
            name,
            url: url.clone(),
            request: req,
            pool: Pool::new(addr, cfg.connections),
            stats: RefCell::new(Stats::default()),
        }));
    }
    let ctl = Rc::new(SchedCtl::default());
    let poke_ctl = ctl.clone();
    let shared = Rc::new(Shared {
        poke: if cfg.concurrency.is_none() {
            Some(Box::new(move || poke_ctl.poke()))
        } else {
            None
        },
        stream: cfg.stream,
        timeout: Duration::from_millis(cfg.timeout_ms),
        idle_timeout: Duration::from_millis(cfg.idle_timeout_ms),
        count_headers: cfg.count_headers.clone(),
    });
    let (mut rt, driver) = build_runtime().map_err(|e| format!("runtime: {e}"))?;
    let run = rt.block_on(async {
        if cfg.concurrency.is_some() {
            closed_loop(&cfg, &targets, &shared).await
        } else {
            open_loop(&cfg, &targets, &shared, &ctl).await
        }
    });
    let report = report::build_report(&cfg, &targets, &run, driver);
    if !cfg.quiet {
        report::print_summary(&report);
    }
    if let Some(path) = &cfg.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

async fn open_loop(
    cfg: &Config,
    targets: &[Rc<Target>],
    shared: &Rc<Shared>,
    ctl: &SchedCtl,
) -> Run {
    let n = targets.len() as f64;
    let per_target = if cfg.split { cfg.rate / n } else { cfg.rate };
    let combined = per_target * n;
    let warm_n = (cfg.warmup * combined).round() as u64;
    let total = warm_n + (cfg.duration * combined).round() as u64;
    let sched = Schedule {
        t0: Instant::now() + Duration::from_millis(20),
        interval_ns: 1e9 / combined,
        total,
    };
    let window = (sched.at(warm_n), sched.at(total));
    let window_start_unix_ms = start_timelines(cfg, targets, window.0);
    let tick = Arc::new(Tick {
        waker: Mutex::new(None),
        issued: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    ctl.sched.set(Some(sched));
    let ticker = spawn_ticker(tick.clone(), sched);
    let started_unix_ms = unix_ms();
    let inflight = Rc::new(Cell::new(0u64));
    let mut cpu0 = None;
    let mut issued = 0u64;
    while issued < total {
        let due = poll_fn(|cx| {
            {
                let mut local = ctl.waker.borrow_mut();
                if !local.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *local = Some(cx.waker().clone());
                    let mut g = tick.waker.lock().unwrap_or_else(PoisonError::into_inner);
                    *g = Some(cx.waker().clone());
                }
            }
            let due = sched.due(Instant::now());
            if due > issued {
                Poll::Ready(due)
            } else {
                Poll::Pending
            }
        })
        .await;
        for i in issued..due {
            if i == warm_n {
                cpu0 = process_cpu_ns();
            }
            let t = &targets[(i % targets.len() as u64) as usize];
            let measured = i >= warm_n;
            if measured {
                t.stats.borrow_mut().scheduled += 1;
            }
            inflight.set(inflight.get() + 1);
            let (t, sh, inf) = (t.clone(), shared.clone(), inflight.clone());
            let at = sched.at(i);
            monoio::spawn(async move {
                client::run_request(t, sh, at, measured, window).await;
                inf.set(inf.get() - 1);
            });
        }
        issued = due;
        ctl.issued.set(issued);
        tick.issued.store(issued, Ordering::Release);
    }
    tick.stop.store(true, Ordering::Relaxed);
    let _ = ticker.join();
    let cpu1 = process_cpu_ns();
    let end_issue = Instant::now();
    // Drain: every request has its own deadline; wait for them (bounded).
    let drain_deadline = end_issue + shared.timeout + Duration::from_secs(1);
    while inflight.get() > 0 && Instant::now() < drain_deadline {
        monoio::time::sleep(Duration::from_millis(2)).await;
    }
    let cpu_busy_pct = match (cpu0, cpu1) {
        (Some(a), Some(b)) => {
            let wall = end_issue.saturating_duration_since(window.0).as_nanos() as f64;
            (wall > 0.0).then(|| (b.saturating_sub(a)) as f64 / wall * 100.0)
        }
        _ => None,
    };
    Run {
        started_unix_ms,
        window_start_unix_ms,
        window,
        elapsed: Instant::now() - sched.t0,
        cpu_busy_pct,
        last_done: vec![None; targets.len()],
    }
}

async fn closed_loop(cfg: &Config, targets: &[Rc<Target>], shared: &Rc<Shared>) -> Run {
    let conc = cfg.concurrency.unwrap_or(1);
    let t0 = Instant::now();
    let measure_start = t0 + Duration::from_secs_f64(cfg.warmup);
    let measure_end = if cfg.requests.is_some() {
        measure_start + Duration::from_secs(365 * 24 * 3600)
    } else {
        measure_start + Duration::from_secs_f64(cfg.duration)
    };
    let window = (measure_start, measure_end);
    let window_start_unix_ms = start_timelines(cfg, targets, measure_start);
    let started_unix_ms = unix_ms();
    let claimed: Vec<Rc<Cell<u64>>> = targets.iter().map(|_| Rc::new(Cell::new(0))).collect();
    let last_done: Vec<Rc<Cell<Option<Instant>>>> =
        targets.iter().map(|_| Rc::new(Cell::new(None))).collect();
    let cpu_mark: Rc<Cell<Option<u64>>> = Rc::new(Cell::new(None));
    let cpu_marked = Rc::new(Cell::new(false));
    let mut handles = Vec::new();
    for (ti, t) in targets.iter().enumerate() {
        for _ in 0..conc {
            let (t, sh) = (t.clone(), shared.clone());
            let (claimed, last) = (claimed[ti].clone(), last_done[ti].clone());
            let (cpu_mark, cpu_marked) = (cpu_mark.clone(), cpu_marked.clone());
            let limit = cfg.requests;
            handles.push(monoio::spawn(async move {
                loop {
                    let now = Instant::now();
                    let measured = now >= measure_start;
                    if measured {
                        if !cpu_marked.get() {
                            cpu_marked.set(true);
                            cpu_mark.set(process_cpu_ns());
                        }
                        match limit {
                            Some(m) if claimed.get() >= m => break,
                            None if now >= measure_end => break,
                            _ => {}
                        }
                        claimed.set(claimed.get() + 1);
                        t.stats.borrow_mut().scheduled += 1;
                    }
                    client::run_request(t.clone(), sh.clone(), now, measured, window).await;
                    if measured {
                        last.set(Some(Instant::now()));
                    }
                }
            }));
        }
    }
    for h in handles {
        h.await;
    }
    let end = Instant::now();
    let cpu_busy_pct = match (cpu_mark.get(), process_cpu_ns()) {
        (Some(a), Some(b)) => {
            let wall = end.saturating_duration_since(measure_start).as_nanos() as f64;
            (wall > 0.0).then(|| b.saturating_sub(a) as f64 / wall * 100.0)
        }
        _ => None,
    };
    Run {
        started_unix_ms,
        window_start_unix_ms,
        window: (measure_start, end),
        elapsed: end - t0,
        cpu_busy_pct,
        last_done: last_done.iter().map(|c| c.get()).collect(),
    }
}

/// Give every target a timeline starting at `origin` (with `--timeline`); returns `origin` as
/// Unix milliseconds, so other tools can place their own events on the same time axis.
fn start_timelines(cfg: &Config, targets: &[Rc<Target>], origin: Instant) -> u128 {
    if let Some(ms) = cfg.timeline_ms {
        for t in targets {
            t.stats.borrow_mut().timeline = Some(Timeline::new(origin, Duration::from_millis(ms)));
        }
    }
    let now = Instant::now();
    let now_unix = unix_ms();
    if origin >= now {
        now_unix + origin.duration_since(now).as_millis()
    } else {
        now_unix.saturating_sub(now.duration_since(origin).as_millis())
    }
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}
