//! The `ringgate` binary: `serve` (default), `check`, `doctor`, `mock`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use mimalloc::MiMalloc;
use ringgate::config::Config;
use ringgate::mock::engine::{EngineKind, EngineSpec};
use ringgate::mock::{fault, Profile};
use ringgate::runtime::DriverChoice;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

const USAGE: &str = "\
ringgate — a thread-per-core LLM gateway

USAGE:
  ringgate [serve] [--config FILE] [--listen ADDR] [--shards N]
                                                     run the gateway (no config: built-in default;
                                                     --listen / --shards win over the file's
                                                     server.listen / server.shards)
  ringgate check --config FILE                       validate a config file: every problem (with
                                                     its line) and what serve would refuse
                                                     (exit 1 if any)
  ringgate doctor [--config FILE]                    is this box ready? kernel, io_uring, limits,
                                                     memory, CPUs, sysctls, config, providers
                                                     (exit 1 when something must be fixed)
  ringgate mock [--listen ADDR] [--profile instant|seed|paced] [--shards N]
                [--fault FAULT]... [--fault-rate R] [--fault-model M] [--fault-path P] [--seed S]
                                                     run the upstream simulator; --fault (repeat
                                                     to mix) breaks R (default 1.0) of the requests
                                                     (only model M / paths under P); a request's
                                                     x-mock-fault header does the same per request.
                                                     FAULT: 429[:retry-after=N] 500 502 503 reset
                                                     close garbage stall stall-mid-head
                                                     stall-mid-body cut-after=N cut-close-after=N
                                                     error-after=N malformed slow-first-byte=MS
                                                     short-length bad-chunk huge-header huge-body
                                                     extra-bytes[=MS] (or: upstream model named
                                                     mock-fault-FAULT, with _ for =)
  ringgate mock --engine vllm|sglang|llamacpp [--slots N] [--tpot-ms MS] [--prefill-us US]
                [--kv-tokens N] [--cache-blocks N] [--batch-slowdown F] [--model-name M]
                [--metrics] [--no-slots] [--load-ms MS]
                [--listen ADDR]                      simulate an inference engine under load:
                                                     N concurrent sequences (default 8), a FIFO
                                                     queue, decode slowing with the batch, a
                                                     prefix cache, the engine's own GET /metrics
                                                     (llama.cpp: GET /slots, /v1/models, /props,
                                                     /metrics only with --metrics, 503 for the
                                                     first --load-ms, as llama-server)
  ringgate --version | --help
";

fn main() -> ExitCode {
    no_transparent_huge_pages();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match args.first().map(String::as_str) {
        Some("serve") | Some("check") | Some("mock") | Some("doctor") => {
            (args[0].as_str(), &args[1..])
        }
        Some("--help") | Some("-h") | Some("help") => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        // the size of one request's future (boxed once per request; benches/README.md)
        Some("--request-future-bytes") => {
            println!("{}", ringgate::pipeline::request_future_bytes());
            return ExitCode::SUCCESS;
        }
        Some("--version") | Some("-V") => {
            println!("ringgate {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        _ => ("serve", &args[..]),
    };
    let opts = match Opts::parse(rest) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ringgate: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match cmd {
        "check" => check(&opts),
        "doctor" => doctor(&opts),
        "mock" => mock(&opts),
        _ => serve(&opts),
    }
}

/// Transparent huge pages off for this process, before the shards allocate anything: mimalloc
/// advises THP on its arenas, and then a few live objects keep whole 2 MiB pages resident, so
/// RSS follows the allocator's address space instead of live memory (S3 large in a 256 MiB
/// cgroup: idle RSS 10 → 4 MiB, peak 229 → 200 MiB, cgroup peak at the limit → 209 MiB). The
/// memory invariant in docs/memory.md assumes this. Setting `MIMALLOC_ALLOW_THP` (to anything)
/// leaves the choice to mimalloc.
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        let _ = rustix::thread::disable_transparent_huge_pages(true);
    }
}

#[derive(Default)]
struct Opts {
    config: Option<String>,
    listen: Option<String>,
    profile: Option<String>,
    shards: Option<usize>,
    // `mock` only: the fault plan.
    faults: Vec<String>,
    fault_rate: Option<String>,
    fault_model: Option<String>,
    fault_path: Option<String>,
    seed: Option<String>,
    // `mock --engine` only: the simulated engine.
    engine: Option<String>,
    engine_knobs: Vec<(String, String)>,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Opts, String> {
        let mut o = Opts::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let (key, inline) = match a.split_once('=') {
                Some((k, v)) => (k, Some(v.to_string())),
                None => (a.as_str(), None),
            };
            let mut val = || {
                inline
                    .clone()
                    .or_else(|| it.next().cloned())
                    .ok_or(format!("{key} needs a value"))
            };
            match key {
                "--config" | "-c" => o.config = Some(val()?),
                "--listen" | "-l" => o.listen = Some(val()?),
                "--profile" => o.profile = Some(val()?),
                "--shards" => {
                    o.shards = Some(val()?.parse().map_err(|_| "--shards needs a number")?)
                }
                "--fault" => o.faults.push(val()?),
                "--fault-rate" => o.fault_rate = Some(val()?),
                "--fault-model" => o.fault_model = Some(val()?),
                "--fault-path" => o.fault_path = Some(val()?),
                "--seed" => o.seed = Some(val()?),
                "--engine" => o.engine = Some(val()?),
                "--slots" | "--tpot-ms" | "--prefill-us" | "--kv-tokens" | "--batch-slowdown"
                | "--cache-blocks" | "--model-name" | "--load-ms" => {
                    let v = val()?;
                    o.engine_knobs.push((key.to_string(), v));
                }
                "--metrics" | "--no-slots" => o.engine_knobs.push((key.to_string(), String::new())),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(o)
    }
}

fn load(opts: &Opts) -> Result<Config, ExitCode> {
    let path = opts
        .config
        .clone()
        .or_else(|| std::env::var("RINGGATE_CONFIG").ok());
    let mut cfg = match path {
        Some(p) => Config::load(&p).map_err(|errs| {
            for e in errs {
                eprintln!("{p}: {e}");
            }
            ExitCode::from(1)
        })?,
        None => Config::embedded(),
    };
    // the overrides are remembered in the config: a reload lays them over the new text too
    let mut origin = cfg.origin.clone();
    origin.listen = opts.listen.clone();
    origin.shards = opts.shards;
    origin.apply(&mut cfg);
    Ok(cfg)
}

fn serve(opts: &Opts) -> ExitCode {
    let t0 = Instant::now();
    let mut cfg = match load(opts) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if cfg.server.state_dir.is_none() {
        // the binary keeps state under the user's data dir by default, one dir per config file
        // (the library keeps it in memory)
        let mut origin = cfg.origin.clone();
        let dir = ringgate::governance::state::serve_dir(&cfg);
        if let Some(note) = dir
            .as_deref()
            .filter(|_| ringgate::governance::state::wanted(&cfg))
            .and_then(ringgate::governance::state::legacy_note)
        {
            ringgate::observe::log::info(format_args!("warning: {note}"));
        }
        origin.state_dir = dir.map(|d| d.display().to_string());
        origin.apply(&mut cfg);
    }
    for w in cfg.start_warnings() {
        ringgate::observe::log::info(format_args!("warning: {w}"));
    }
    let models: Vec<String> = cfg
        .models
        .iter()
        .map(|m| m.name.get_ref().clone())
        .collect();
    // Signal handlers go in before the listeners open, so no signal arriving once the port
    // answers can take the default action (SIGHUP's would kill the process).
    let signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ]);
    let keys_in_config = cfg.keys.len();
    match ringgate::server::start(cfg) {
        Ok(running) => {
            let tls = running
                .tls_addr
                .map(|a| format!(" and https://{a}"))
                .unwrap_or_default();
            let auth = match (running.keys_checked, running.admin_addr.is_some()) {
                (true, _) => format!("auth keys ({keys_in_config} in the config)"),
                (false, true) => "auth none until a key is made through the admin API".into(),
                (false, false) => "auth none".into(),
            };
            ringgate::observe::log::info(format_args!(
                "listening on http://{}{tls} with {} shard(s), models [{}], {auth}, started in {:?}",
                running.addr,
                running.shards,
                models.join(", "),
                t0.elapsed()
            ));
            if let Some(a) = running.admin_addr {
                ringgate::observe::log::info(format_args!("admin listening on http://{a}"));
            }
            if let Some(f) = &running.state_file {
                ringgate::observe::log::info(format_args!("state in {}", f.display()));
            }
            // SIGTERM/SIGINT: stop accepting, close idle connections, let in-flight requests
            // finish (bounded by the drain timeout), then exit (after `POST /admin/drain` the
            // process waits for this). SIGHUP: reload the config file (`reload`).
            let shutdown = running.shutdown.clone();
            let exit = running.exit.clone();
            let reloader = running.reloader.clone();
            match signals {
                Ok(mut signals) => {
                    std::thread::spawn(move || {
                        for sig in signals.forever() {
                            if sig == signal_hook::consts::SIGHUP {
                                // the outcome is logged (and counted) by the reloader
                                let _ = reloader.reload("SIGHUP");
                                continue;
                            }
                            ringgate::observe::log::info(format_args!("signal {sig}: draining"));
                            shutdown.fire();
                            exit.fire();
                            break;
                        }
                    });
                }
                Err(e) => eprintln!("ringgate: cannot install signal handlers: {e}"),
            }
            running.wait();
            ringgate::observe::log::info(format_args!("stopped"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ringgate: cannot start: {e}");
            ExitCode::from(1)
        }
    }
}

fn check(opts: &Opts) -> ExitCode {
    let Some(path) = &opts.config else {
        eprintln!("ringgate check: --config FILE is required");
        return ExitCode::from(2);
    };
    // every problem: the file's (each with its line), then what `serve` would refuse at start
    let (loaded, errors) = Config::load_all(path);
    let mut problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
    if let Some((cfg, _)) = &loaded {
        problems.extend(serve_refusals(cfg));
    }
    for p in &problems {
        eprintln!("{path}: {p}");
    }
    if let Some((cfg, _)) = &loaded {
        for w in cfg.warnings() {
            eprintln!("{path}: warning: {w}");
        }
    }
    match &loaded {
        Some((cfg, _)) if problems.is_empty() => {
            println!(
                "{path}: ok ({} provider(s), {} model(s))",
                cfg.providers.len(),
                cfg.models.len()
            );
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{path}: {} problem(s) found", problems.len());
            ExitCode::from(1)
        }
    }
}

/// What `serve` would refuse at start about `cfg` beyond the file's own rules: the exposure
/// rule, the TLS certificate and key, the state directory (`state::check_dir`, the check
/// `serve` and `doctor` run too).
fn serve_refusals(cfg: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(addr) = cfg.listen_addr() {
        if let Err(e) = ringgate::governance::exposure::check(cfg, addr) {
            out.push(e);
        }
    }
    if let (Some(_), Some(c), Some(k)) = (
        &cfg.server.tls_listen,
        &cfg.server.tls_cert,
        &cfg.server.tls_key,
    ) {
        let (c, k) = (c.get_ref(), k.get_ref());
        if let Err(e) = ringgate::server::tls::server_config(c.as_ref(), k.as_ref()) {
            out.push(e.to_string());
        }
    }
    if ringgate::governance::state::wanted(cfg) {
        if let Some(dir) = ringgate::governance::state::serve_dir(cfg) {
            if let Err(e) = ringgate::governance::state::check_dir(&dir) {
                out.push(e);
            }
        }
    }
    out
}

fn doctor(opts: &Opts) -> ExitCode {
    let report = ringgate::control::doctor::run(opts.config.as_deref());
    print!("{}", report.render());
    if report.problems() > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn mock(opts: &Opts) -> ExitCode {
    let listen = opts
        .listen
        .clone()
        .unwrap_or_else(|| "127.0.0.1:9000".into());
    let Ok(addr) = listen.parse() else {
        eprintln!("ringgate mock: bad --listen {listen:?}");
        return ExitCode::from(2);
    };
    let profile_name = opts.profile.clone().unwrap_or_else(|| "instant".into());
    let Some(profile) = Profile::parse(&profile_name) else {
        eprintln!("ringgate mock: unknown profile {profile_name:?} (instant, seed, paced)");
        return ExitCode::from(2);
    };
    let plan = match fault_plan(opts) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ringgate mock: {e}");
            return ExitCode::from(2);
        }
    };
    let faults = if plan.is_empty() {
        String::new()
    } else {
        format!(", faults {}", opts.faults.join(" "))
    };
    let engine = match engine_spec(opts) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("ringgate mock: {e}");
            return ExitCode::from(2);
        }
    };
    let what = match &engine {
        Some(e) => format!("engine {} with {} slots", e.kind.as_str(), e.slots),
        None => format!("profile {profile_name}{faults}"),
    };
    let driver = DriverChoice::resolve("auto");
    let shards = opts.shards.unwrap_or(1);
    match ringgate::mock::server::start_full(addr, profile, shards, driver, plan, engine) {
        Ok(m) => {
            ringgate::observe::log::info(format_args!(
                "mock listening on http://{} ({what})",
                m.addr
            ));
            m.wait();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ringgate mock: cannot start: {e}");
            ExitCode::from(1)
        }
    }
}

/// The simulated engine from `--engine` and its knobs (`None` without `--engine`).
fn engine_spec(opts: &Opts) -> Result<Option<EngineSpec>, String> {
    let Some(kind) = &opts.engine else {
        if let Some((k, _)) = opts.engine_knobs.first() {
            return Err(format!("{k} needs --engine"));
        }
        return Ok(None);
    };
    let kind = EngineKind::parse(kind)
        .ok_or(format!("unknown engine {kind:?} (vllm, sglang, llamacpp)"))?;
    let num = |k: &str, v: &str| {
        v.parse::<f64>()
            .ok()
            .filter(|n| n.is_finite() && *n >= 0.0)
            .ok_or(format!("{k} needs a number"))
    };
    let slots = match opts.engine_knobs.iter().find(|(k, _)| k == "--slots") {
        Some((k, v)) => v
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=4096).contains(n))
            .ok_or(format!("{k} needs a number from 1 to 4096"))?,
        None => 8,
    };
    let mut spec = EngineSpec::new(kind, slots);
    for (k, v) in &opts.engine_knobs {
        match k.as_str() {
            "--tpot-ms" => spec.tpot = Duration::from_secs_f64(num(k, v)? / 1e3),
            "--prefill-us" => spec.prefill_per_token = Duration::from_secs_f64(num(k, v)? / 1e6),
            "--kv-tokens" => spec.kv_tokens = num(k, v)?.max(1.0) as u64,
            "--cache-blocks" => spec.cache_blocks = num(k, v)? as usize,
            "--batch-slowdown" => spec.batch_slowdown = num(k, v)?,
            "--model-name" => spec.model_name = v.clone(),
            "--load-ms" => spec.load_time = Duration::from_secs_f64(num(k, v)? / 1e3),
            "--metrics" => spec.metrics = true,
            "--no-slots" => spec.slots_page = false,
            _ => {}
        }
    }
    Ok(Some(spec))
}

/// The mock's per-process fault plan from `--fault`, `--fault-rate`, `--fault-model`,
/// `--fault-path` and `--seed`.
fn fault_plan(opts: &Opts) -> Result<fault::Plan, String> {
    let faults = opts
        .faults
        .iter()
        .map(|f| fault::Fault::parse(f).map_err(|e| format!("--fault: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let seed = match &opts.seed {
        Some(s) => s.parse().map_err(|_| "--seed needs a whole number")?,
        None => 0,
    };
    if faults.is_empty() {
        let limits = [&opts.fault_rate, &opts.fault_model, &opts.fault_path];
        if limits.iter().any(|o| o.is_some()) {
            return Err("--fault-rate/--fault-model/--fault-path need --fault".into());
        }
        return Ok(fault::Plan::default());
    }
    let rate = match &opts.fault_rate {
        Some(r) => r
            .parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or("--fault-rate needs a number from 0 to 1")?,
        None => 1.0,
    };
    Ok(fault::Plan {
        rules: vec![fault::Rule {
            faults,
            rate,
            model: opts.fault_model.clone(),
            path: opts.fault_path.clone(),
        }],
        seed,
    })
}
