//! The load generator's report: the JSON document (`--json`) and the human-readable summary.
//!
//! Owns: percentiles, error breakdown, added latency (target − baseline), harness-bound flag,
//! timeline/phase/header-count sections. Must not: run requests (it reads finished `Stats`).

use std::rc::Rc;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::client::{ErrKind, Stats, Target};
use crate::timeline::Timeline;
use crate::{Config, Run};

const PCTS: [(&str, f64); 6] = [
    ("p50", 50.0),
    ("p90", 90.0),
    ("p99", 99.0),
    ("p99_9", 99.9),
    ("p99_99", 99.99),
    ("max", 100.0),
];

fn hist_json(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return json!({ "count": 0 });
    }
    let mut m = serde_json::Map::new();
    m.insert("count".into(), json!(h.len()));
    m.insert("min".into(), json!(h.min()));
    m.insert("mean".into(), json!((h.mean() * 10.0).round() / 10.0));
    m.insert("stdev".into(), json!((h.stdev() * 10.0).round() / 10.0));
    for (k, q) in PCTS {
        let v = if q >= 100.0 {
            h.max()
        } else {
            h.value_at_percentile(q)
        };
        m.insert(k.into(), json!(v));
    }
    let detail: Vec<Value> = [
        1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99,
    ]
    .iter()
    .map(|&q| json!([q, h.value_at_percentile(q)]))
    .collect();
    m.insert("percentiles".into(), Value::Array(detail));
    Value::Object(m)
}

/// Per phase of the window (split at `cuts` seconds): start/end, successes, errors and the
/// merged latency percentiles of the timeline buckets it covers.
fn phases_json(tl: &Timeline, cuts: &[f64]) -> Value {
    let mut edges: Vec<f64> = cuts.iter().copied().filter(|c| *c > 0.0).collect();
    edges.sort_by(f64::total_cmp);
    let mut out = Vec::new();
    let mut from = 0.0;
    for to in edges.iter().copied().map(Some).chain([None]) {
        let (h, ok, errors) = tl.phase(
            Duration::from_secs_f64(from),
            to.map(Duration::from_secs_f64),
        );
        out.push(json!({
            "from_s": from,
            "to_s": to,
            "ok": ok,
            "errors": errors,
            "latency_us": hist_json(&h),
        }));
        from = to.unwrap_or(from);
    }
    Value::Array(out)
}

/// Named wall-clock windows (`--windows-file`: lines `NAME FROM_UNIX_MS TO_UNIX_MS`, `#`
/// comments), read when the run is over: the merged percentiles of the timeline buckets whose
/// intended send time falls in each window (bucket granularity; clipped to the measured window).
/// Unreadable files and malformed lines are reported, not fatal: the run's data stays usable.
fn windows_json(tl: &Timeline, path: &str, window_start_unix_ms: u128) -> Value {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return json!({ "error": format!("{path}: {e}") }),
    };
    let origin = window_start_unix_ms as f64;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let parsed = match f.as_slice() {
            [name, a, b] => a
                .parse::<f64>()
                .ok()
                .zip(b.parse::<f64>().ok())
                .map(|(a, b)| (*name, a, b)),
            _ => None,
        };
        let Some((name, from_ms, to_ms)) = parsed else {
            out.push(json!({ "error": format!("bad line {line:?}") }));
            continue;
        };
        let from_s = ((from_ms - origin) / 1000.0).max(0.0);
        let to_s = ((to_ms - origin) / 1000.0).max(from_s);
        let (h, ok, errors) = tl.phase(
            Duration::from_secs_f64(from_s),
            Some(Duration::from_secs_f64(to_s)),
        );
        out.push(json!({
            "name": name,
            "from_s": (from_s * 1000.0).round() / 1000.0,
            "to_s": (to_s * 1000.0).round() / 1000.0,
            "ok": ok,
            "errors": errors,
            "latency_us": hist_json(&h),
        }));
    }
    Value::Array(out)
}

fn errors_json(st: &Stats) -> Value {
    let mut status = serde_json::Map::new();
    let (mut connect, mut timeout, mut protocol, mut io, mut incomplete) = (0, 0, 0, 0, 0);
    for (k, &n) in &st.errors {
        match k {
            ErrKind::Connect => connect += n,
            ErrKind::Timeout => timeout += n,
            ErrKind::Protocol => protocol += n,
            ErrKind::Io => io += n,
            ErrKind::IncompleteStream => incomplete += n,
            ErrKind::Status(c) => {
                status.insert(c.to_string(), json!(n));
            }
        }
    }
    json!({
        "total": st.error_count(),
        "connect": connect,
        "timeout": timeout,
        "status": status,
        "protocol": protocol,
        "io": io,
        "incomplete_stream": incomplete,
    })
}

pub fn build_report(cfg: &Config, targets: &[Rc<Target>], run: &Run, driver: &str) -> Value {
    let closed = cfg.concurrency.is_some();
    let n = targets.len() as f64;
    let per_target = if cfg.split { cfg.rate / n } else { cfg.rate };
    let window_s = run
        .window
        .1
        .saturating_duration_since(run.window.0)
        .as_secs_f64();
    let mut tj = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let st = t.stats.borrow();
        let pool = t.pool.borrow();
        let served = if closed {
            let end = run.last_done[i].unwrap_or(run.window.1);
            let s = end.saturating_duration_since(run.window.0).as_secs_f64();
            if s > 0.0 {
                st.ok as f64 / s
            } else {
                0.0
            }
        } else if window_s > 0.0 {
            st.ok_in_window as f64 / window_s
        } else {
            0.0
        };
        let attempted = st.ok + st.error_count();
        tj.push(json!({
            "name": t.name,
            "url": t.url,
            "offered_rps": if closed { Value::Null } else { json!(per_target) },
            "served_rps": (served * 10.0).round() / 10.0,
            "scheduled": st.scheduled,
            "completed_ok": st.ok,
            "completed_ok_in_window": st.ok_in_window,
            "unfinished": st.scheduled.saturating_sub(attempted),
            "error_rate": if attempted > 0 { st.error_count() as f64 / attempted as f64 } else { 0.0 },
            "errors": errors_json(&st),
            "latency_us": hist_json(&st.latency),
            "ttfb_us": hist_json(&st.ttfb),
            "ttft_us": hist_json(&st.ttft),
            "inter_chunk_us": hist_json(&st.gaps),
            "send_lag_us": hist_json(&st.send_lag),
            "connections": { "opened": pool.opened_total, "peak_open": pool.peak_open },
            "stale_retries": st.stale_retries,
            "body_bytes_in": st.bytes_in,
            "warmup": { "ok": st.warmup_ok, "errors": st.warmup_err },
            "timeline": st.timeline.as_ref().map(Timeline::to_json),
            "phases": st.timeline.as_ref().map(|tl| phases_json(tl, &cfg.phases)),
            "windows": match (st.timeline.as_ref(), cfg.windows_file.as_deref()) {
                (Some(tl), Some(p)) => windows_json(tl, p, run.window_start_unix_ms),
                _ => Value::Null,
            },
            "header_counts": if cfg.count_headers.is_empty() {
                Value::Null
            } else {
                st.headers.to_json(&cfg.count_headers)
            },
        }));
    }
    let added = if targets.len() == 2 {
        let (a, b) = (targets[0].stats.borrow(), targets[1].stats.borrow());
        let diff = |x: &Histogram<u64>, y: &Histogram<u64>| -> Value {
            if x.is_empty() || y.is_empty() {
                return Value::Null;
            }
            let mut m = serde_json::Map::new();
            for (k, q) in [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99_9", 99.9)] {
                m.insert(
                    k.into(),
                    json!(x.value_at_percentile(q) as i64 - y.value_at_percentile(q) as i64),
                );
            }
            m.insert(
                "mean".into(),
                json!(((x.mean() - y.mean()) * 10.0).round() / 10.0),
            );
            Value::Object(m)
        };
        json!({
            "latency": diff(&a.latency, &b.latency),
            "ttfb": diff(&a.ttfb, &b.ttfb),
            "ttft": diff(&a.ttft, &b.ttft),
            "inter_chunk": diff(&a.gaps, &b.gaps),
        })
    } else {
        Value::Null
    };
    // The generator could not keep its own schedule: results are harness-bound.
    let worst_lag_p99 = targets
        .iter()
        .map(|t| t.stats.borrow().send_lag.value_at_percentile(99.0))
        .max()
        .unwrap_or(0);
    let harness_bound =
        !closed && (worst_lag_p99 > 1_000 || run.cpu_busy_pct.is_some_and(|p| p > 90.0));
    json!({
        "tool": "ringgate-loadgen",
        "schema": 1,
        "label": cfg.label,
        "started_unix_ms": run.started_unix_ms as u64,
        "window_start_unix_ms": run.window_start_unix_ms as u64,
        "driver": driver,
        "mode": if closed { "closed" } else { "open" },
        "config": {
            "target": cfg.target,
            "baseline": cfg.baseline,
            "workload": cfg.workload.name(),
            "stream": cfg.stream,
            "size": cfg.size.name(),
            "input_tokens": cfg.size.input_tokens(),
            "output_tokens": cfg.output_tokens.unwrap_or(cfg.size.output_tokens()),
            "request_bytes": targets[0].request.len(),
            "model": cfg.model,
            "headers": cfg.headers,
            "rate_per_target": if closed { Value::Null } else { json!(per_target) },
            "rate_total": if closed { Value::Null } else { json!(per_target * n) },
            "split": cfg.split,
            "duration_s": cfg.duration,
            "warmup_s": cfg.warmup,
            "concurrency": cfg.concurrency,
            "requests": cfg.requests,
            "connections_max": cfg.connections,
            "timeout_ms": cfg.timeout_ms,
            "idle_timeout_ms": cfg.idle_timeout_ms,
        },
        "window_s": (window_s * 1000.0).round() / 1000.0,
        "elapsed_s": (run.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
        "loadgen_cpu_pct": run.cpu_busy_pct.map(|p| (p * 10.0).round() / 10.0),
        "send_lag_p99_us": worst_lag_p99,
        "harness_bound": harness_bound,
        "targets": tj,
        "added_us": added,
    })
}

fn ms(v: &Value, k: &str) -> String {
    match v.get(k).and_then(Value::as_i64) {
        Some(us) => format!("{:>9.3}", us as f64 / 1000.0),
        None => format!("{:>9}", "-"),
    }
}

pub fn print_summary(r: &Value) {
    let c = &r["config"];
    println!(
        "ringgate loadgen: {} mode, {} {}{} size={} driver={} window={}s cpu={}%",
        r["mode"].as_str().unwrap_or("?"),
        c["workload"].as_str().unwrap_or("?"),
        if c["stream"].as_bool() == Some(true) {
            "stream"
        } else {
            "non-stream"
        },
        match c["concurrency"].as_u64() {
            Some(n) => format!(" concurrency={n}"),
            None => format!(" rate={}/s per target", c["rate_per_target"]),
        },
        c["size"].as_str().unwrap_or("?"),
        r["driver"].as_str().unwrap_or("?"),
        r["window_s"],
        r["loadgen_cpu_pct"],
    );
    println!(
        "{:<10} {:<14} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "target", "metric (ms)", "p50", "p90", "p99", "p99.9", "max", "mean", "count"
    );
    let targets = r["targets"].as_array().cloned().unwrap_or_default();
    for t in &targets {
        let name = t["name"].as_str().unwrap_or("?");
        for (metric, key) in [
            ("latency", "latency_us"),
            ("ttfb", "ttfb_us"),
            ("ttft", "ttft_us"),
            ("inter-chunk", "inter_chunk_us"),
            ("send-lag", "send_lag_us"),
        ] {
            let h = &t[key];
            if h["count"].as_u64().unwrap_or(0) == 0 {
                continue;
            }
            let mean = h["mean"]
                .as_f64()
                .map(|m| format!("{:>9.3}", m / 1000.0))
                .unwrap_or_default();
            println!(
                "{:<10} {:<14} {} {} {} {} {} {} {:>9}",
                name,
                metric,
                ms(h, "p50"),
                ms(h, "p90"),
                ms(h, "p99"),
                ms(h, "p99_9"),
                ms(h, "max"),
                mean,
                h["count"]
            );
        }
        let e = &t["errors"];
        println!(
            "{:<10} offered={} served={}/s ok={} unfinished={} errors={} (connect={} timeout={} status={} protocol={} io={} incomplete_stream={}) conns opened={} peak={}",
            name,
            t["offered_rps"],
            t["served_rps"],
            t["completed_ok"],
            t["unfinished"],
            e["total"],
            e["connect"],
            e["timeout"],
            e["status"],
            e["protocol"],
            e["io"],
            e["incomplete_stream"],
            t["connections"]["opened"],
            t["connections"]["peak_open"],
        );
    }
    if r["harness_bound"].as_bool() == Some(true) {
        println!(
            "WARNING: the load generator fell behind its schedule (send-lag p99 {} us, cpu {}%): \
             results are harness-bound",
            r["send_lag_p99_us"], r["loadgen_cpu_pct"]
        );
    }
    if let Some(a) = r["added_us"].as_object() {
        for (k, v) in a {
            if v.is_null() {
                continue;
            }
            println!(
                "added {:<12} (ms) p50={} p90={} p99={} p99.9={}",
                k,
                ms(v, "p50").trim(),
                ms(v, "p90").trim(),
                ms(v, "p99").trim(),
                ms(v, "p99_9").trim()
            );
        }
    }
}
