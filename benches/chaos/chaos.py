"""S8 chaos: one model over two deployments while one of them fails (issue 9).

Used by `benches/run chaos` (protocol: docs/bench-protocol-s8.md). Three runs, each with a fresh
gateway (one shard, CPU 0) over two mock deployments `a` and `b` of one model (same profile),
plus a third mock as the direct baseline, all mocks and the load generator on CPU 1:

  healthy          both deployments healthy: the reference for "added p99"
  faults           `b` fails a fraction (default 30 %) of its requests with mixed faults
                   (500, 502, 503, reset, stall; a stall ends at [routing]
                   first_byte_timeout_ms), balancer `--lb` (default p2c)
  faults-weighted  the same with `lb = "weighted"` (b keeps half of the first attempts, so
                   retries and the breaker do the work p2c's latency penalty does otherwise)
  down             both healthy, then `b` is killed (SIGKILL) half-way through the window

Client view from the load generator (open loop, direct baseline interleaved, `--timeline`,
`--phase-at`, `--count-header x-ringgate-provider/x-ringgate-attempts`); gateway view from
`/metrics` (`ringgate_upstream_attempts_total`, `_failures_total`, `ringgate_retries_total`,
`ringgate_breaker_state`, `ringgate_breaker_opens_total`) scraped every 250 ms.
"""

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

FAULTS = ["500", "502", "503", "reset", "stall"]
MODEL = "mock"
SCRAPE_S = 0.25
METRIC_RE = re.compile(r"^(ringgate_[a-z_]+)\{([^}]*)\}\s+(\S+)$")
ROUTING_SERIES = ("ringgate_upstream_", "ringgate_retries_", "ringgate_fallbacks_",
                  "ringgate_breaker_", "ringgate_key_cooldowns_")
LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# ----------------------------------------------------------------------------- /metrics

def http_get(port, path, timeout=2.0):
    req = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(req)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            n = int(size_line.split(b";")[0], 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return body.decode("utf-8", "replace")


def parse_metrics(text):
    """Prometheus text → {'name{k="v",...}': value}, summed over shards."""
    out = {}
    for line in text.splitlines():
        m = METRIC_RE.match(line.strip())
        if not m:
            continue
        labels = [(k, v) for k, v in LABEL_RE.findall(m.group(2)) if k != "shard"]
        key = m.group(1) + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels)) + "}"
        try:
            out[key] = out.get(key, 0.0) + float(m.group(3))
        except ValueError:
            pass
    return out


def msum(snap, name, **labels):
    """Sum of the series `name` whose labels include `labels`."""
    tot = 0.0
    for k, v in (snap or {}).items():
        if not k.startswith(name + "{"):
            continue
        if all(f'{lk}="{lv}"' in k for lk, lv in labels.items()):
            tot += v
    return tot


def by_label(snap, name, label, **labels):
    """{value of `label`: sum} over the series `name` matching `labels`."""
    out = {}
    for k, v in (snap or {}).items():
        if not k.startswith(name + "{") or not all(f'{lk}="{lv}"' in k
                                                  for lk, lv in labels.items()):
            continue
        m = re.search(label + r'="([^"]*)"', k)
        if m and v:
            out[m.group(1)] = out.get(m.group(1), 0) + v
    return out


class Scraper:
    """Scrapes the gateway's /metrics every SCRAPE_S seconds: [(unix ms, snapshot)]."""

    def __init__(self, port):
        self.port, self.series, self.errors = port, [], 0
        self.stop_ev = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def scrape(self):
        try:
            snap = parse_metrics(http_get(self.port, "/metrics"))
        except (OSError, ValueError):
            self.errors += 1
            return None
        # Keep the routing series only (the rest of /metrics is not used here).
        snap = {k: v for k, v in snap.items() if k.startswith(ROUTING_SERIES)}
        self.series.append((time.time() * 1000, snap))
        return snap

    def _run(self):
        while not self.stop_ev.wait(SCRAPE_S):
            self.scrape()

    def stop(self):
        self.stop_ev.set()
        self.th.join()
        self.scrape()
        self.series.sort(key=lambda e: e[0])
        return self.series


def interp(series, t_ms, f):
    """f(snapshot) at time t_ms, linear between the two scrapes around it."""
    if not series:
        return 0.0
    prev = None
    for t, snap in series:
        if t >= t_ms:
            if prev is None:
                return f(snap)
            t0, v0 = prev[0], f(prev[1])
            v1 = f(snap)
            return v0 + (v1 - v0) * ((t_ms - t0) / (t - t0) if t > t0 else 1.0)
        prev = (t, snap)
    return f(series[-1][1])


# ----------------------------------------------------------------------------- processes

def start_mock(R, name, profile, faults=None, fault_rate=None, seed=None):
    port = R.free_port()
    argv = [R.RINGGATE, "mock", "--listen", f"127.0.0.1:{port}", "--profile", profile,
            "--shards", "1"]
    for f in faults or []:
        argv += ["--fault", f]
    if faults:
        argv += ["--fault-rate", str(fault_rate), "--seed", str(seed)]
    return R.Proc(name, R.pin(R.HARNESS_CPU, argv), port=port)


RUNS = ["healthy", "faults", "faults-weighted", "down"]


def gateway_config(port, a, b, o, lb):
    return f"""[server]
listen = "127.0.0.1:{port}"
shards = 1

[routing]
lb = "{lb}"
max_attempts = 3
breaker = {{ failures = {o['breaker_failures']}, cooldown_ms = {o['breaker_cooldown_ms']} }}
first_byte_timeout_ms = {o['fbt_ms']}

[[provider]]
name = "a"
kind = "openai"
base_url = "http://127.0.0.1:{a.port}/v1"

[[provider]]
name = "b"
kind = "openai"
base_url = "http://127.0.0.1:{b.port}/v1"

[[model]]
name = "{MODEL}"
deployments = [
  {{ provider = "a", upstream_model = "{MODEL}", weight = 1 }},
  {{ provider = "b", upstream_model = "{MODEL}", weight = 1 }},
]
"""


def start_gateway(R, a, b, o, lb, name, cgroup=None):
    port = R.free_port()
    cfg = os.path.join(R.tmpdir(), f"{name}-{port}.toml")
    with open(cfg, "w") as f:
        f.write(gateway_config(port, a, b, o, lb))
    chk = subprocess.run([R.RINGGATE, "check", "--config", cfg], capture_output=True, text=True)
    if chk.returncode != 0:
        raise R.HarnessError(f"ringgate check rejected the S8 config: {chk.stdout}{chk.stderr}")
    return R.Proc(name, R.pin(R.GW_CPU, [R.RINGGATE, "--config", cfg]), port=port,
                  cgroup=cgroup), cfg


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[:3]
    except OSError:
        return None


# ----------------------------------------------------------------------------- one run

def one_run(R, lg, kind, o, opts):
    """kind: one of RUNS. Returns the run's raw record."""
    profile = o["profile"]
    lb = "weighted" if kind == "faults-weighted" else o["lb"]
    a = start_mock(R, f"s8-{kind}-a", profile)
    b = (start_mock(R, f"s8-{kind}-b", profile, FAULTS, o["fault_rate"], o["seed"])
         if kind.startswith("faults") else start_mock(R, f"s8-{kind}-b", profile))
    d = start_mock(R, f"s8-{kind}-direct", profile)
    cg = R.MemCgroup(opts["mem_limit"]) if opts["cgroup"] else None
    gw, cfg_path = start_gateway(R, a, b, o, lb, f"s8-{kind}", cgroup=cg)
    G, D = f"http://127.0.0.1:{gw.port}", R.mock_url(d)
    rec = {"run": kind, "lb": lb, "config": open(cfg_path).read(), "loadavg_before": loadavg(),
           "mocks": {"a": a.port, "b": b.port, "direct": d.port}}
    try:
        for m, what in ((gw, "gateway"), (d, "direct")):
            ok, why = R.supports(m.port, "chat")
            if not ok:
                raise R.HarnessError(f"s8 {kind}: {what} does not answer chat: {why}")
        # Connections and the p2c estimates warm up at a low rate first (not measured).
        R.Loadgen(lg.path).run(G, D, "s8 warmup", ["--rate", 100, "--duration", 0,
                                                   "--warmup", 1, "--timeout-ms", 5000])
        half = o["duration"] / 2
        out = os.path.join(R.tmpdir(), f"s8-{kind}.json")
        argv = R.pin(R.HARNESS_CPU, [
            lg.path, "--target", G, "--baseline", D, "--json", out, "--quiet",
            "--label", f"s8 {kind}", "--rate", o["rate"], "--duration", o["duration"],
            "--warmup", o["warmup"], "--connections", opts["conn_cap"],
            "--timeout-ms", o["timeout_ms"], "--timeline", o["bucket_ms"],
            "--phase-at", half, "--count-header", "x-ringgate-provider",
            "--count-header", "x-ringgate-attempts"])
        argv = [str(x) for x in argv]
        scraper = Scraper(gw.port)
        smp = R.Sampler(gw.pid)
        t_launch = time.time() * 1000
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        kill_unix_ms, kill_snap = None, None
        if kind == "down":
            # The window starts ~20 ms after the generator's start plus the warm-up.
            at = t_launch + 20 + (o["warmup"] + half) * 1000
            time.sleep(max(0.0, (at - time.time() * 1000) / 1000))
            kill_snap = scraper.scrape()  # the counters at the kill: "after the kill" is exact
            kill_unix_ms = time.time() * 1000
            os.killpg(b.p.pid, signal.SIGKILL)
            b.p.wait(5)
        _, err = p.communicate(timeout=o["warmup"] + o["duration"] + o["timeout_ms"] / 1000 + 60)
        res = smp.stop()
        series = scraper.stop()
        if p.returncode != 0 or not os.path.exists(out):
            raise R.HarnessError(f"loadgen failed ({p.returncode}): {' '.join(argv)}\n{err[-1500:]}")
        with open(out) as f:
            lgd = json.load(f)
        lgd["_argv"] = " ".join(argv)
        rec.update({"loadgen": lgd, "gateway_proc": res, "gateway_alive": gw.alive(),
                    "scrapes": series, "scrape_errors": scraper.errors,
                    "kill_unix_ms": kill_unix_ms, "kill_snapshot": kill_snap,
                    "loadavg_after": loadavg(),
                    "cgroup": cg.stats() if cg else {"available": False}})
    finally:
        for proc in (gw, a, b, d):
            proc.stop()
        if cg:
            cg.remove()
    return rec


# ----------------------------------------------------------------------------- analysis

def routing_counts(rec):
    """Gateway-side counts over the measured window (interpolated between scrapes) and in
    total (warm-up included), per deployment."""
    series, lgd = rec["scrapes"], rec["loadgen"]
    w0 = lgd["window_start_unix_ms"]
    dep = {"a": f"a/{MODEL}", "b": f"b/{MODEL}"}

    def window(f):
        return max(0.0, interp(series, float("inf"), f) - interp(series, w0, f))

    out = {"available": bool(series) and any(
        k.startswith("ringgate_upstream_attempts_total") for k in series[-1][1])}
    for name, label in dep.items():
        out[f"attempts_{name}"] = round(window(
            lambda s, lb=label: msum(s, "ringgate_upstream_attempts_total", deployment=lb)))
        out[f"failures_{name}"] = round(window(
            lambda s, lb=label: msum(s, "ringgate_upstream_failures_total", deployment=lb)))
        out[f"breaker_opens_{name}"] = round(window(
            lambda s, lb=label: msum(s, "ringgate_breaker_opens_total", deployment=lb)))
        last = series[-1][1] if series else {}
        reasons = by_label(last, "ringgate_upstream_failures_total", "reason", deployment=label)
        out[f"failures_{name}_by_reason"] = {
            r: round(window(lambda s, lb=label, rr=r: msum(
                s, "ringgate_upstream_failures_total", deployment=lb, reason=rr)))
            for r in reasons}
        out[f"failures_{name}_by_reason_total"] = by_label(
            last, "ringgate_upstream_failures_total", "reason", deployment=label)
        out[f"attempts_{name}_total"] = msum(last, "ringgate_upstream_attempts_total",
                                             deployment=label)
    if rec.get("kill_snapshot") is not None and series:
        # Scraped synchronously just before the SIGKILL.
        for what, name in (("attempts", "ringgate_upstream_attempts_total"),
                           ("failures", "ringgate_upstream_failures_total")):
            out[f"{what}_b_after_kill"] = round(
                msum(series[-1][1], name, deployment=dep["b"])
                - msum(rec["kill_snapshot"], name, deployment=dep["b"]))
        out["breaker_opens_b_after_kill"] = round(
            msum(series[-1][1], "ringgate_breaker_opens_total", deployment=dep["b"])
            - msum(rec["kill_snapshot"], "ringgate_breaker_opens_total", deployment=dep["b"]))
    last = series[-1][1] if series else {}
    out["retries"] = round(window(lambda s: msum(s, "ringgate_retries_total", model=MODEL)))
    out["retries_by_reason_total"] = by_label(last, "ringgate_retries_total", "reason",
                                              model=MODEL)
    out["upstream_retry_once"] = round(window(
        lambda s: msum(s, "ringgate_upstream_retries_total")))
    return out


def timeline_points(rec, target="target"):
    t = R_tgt(rec["loadgen"], target)
    return (t or {}).get("timeline", {}).get("buckets", [])


def R_tgt(d, name):
    for t in d.get("targets", []):
        if t["name"] == name:
            return t
    return None


def metric_rate_series(rec):
    """Per scrape interval: (t s from window start, % of attempts to b, % of b attempts
    failing, b breaker open 0/100)."""
    series, w0 = rec["scrapes"], rec["loadgen"]["window_start_unix_ms"]
    pts = []
    for (t0, s0), (t1, s1) in zip(series, series[1:]):
        aa = (msum(s1, "ringgate_upstream_attempts_total", deployment=f"a/{MODEL}")
              - msum(s0, "ringgate_upstream_attempts_total", deployment=f"a/{MODEL}"))
        ab = (msum(s1, "ringgate_upstream_attempts_total", deployment=f"b/{MODEL}")
              - msum(s0, "ringgate_upstream_attempts_total", deployment=f"b/{MODEL}"))
        fb = (msum(s1, "ringgate_upstream_failures_total", deployment=f"b/{MODEL}")
              - msum(s0, "ringgate_upstream_failures_total", deployment=f"b/{MODEL}"))
        st = msum(s1, "ringgate_breaker_state", deployment=f"b/{MODEL}")
        x = (t1 - w0) / 1000
        pts.append((x, 100 * ab / (aa + ab) if aa + ab else None,
                    100 * fb / ab if ab else None, 100.0 if st == 1 else 0.0))
    return pts


def summarize(rec, healthy):
    lgd = rec["loadgen"]
    g, dct = R_tgt(lgd, "target"), R_tgt(lgd, "baseline")
    hg = R_tgt(healthy["loadgen"], "target") if healthy else None

    def p(h, k):
        return h.get(k) if h and h.get("count") else None

    s = {
        "run": rec["run"], "lb": rec["lb"], "offered_rps": g["offered_rps"], "served_rps": g["served_rps"],
        "scheduled": g["scheduled"], "ok": g["completed_ok"],
        "errors": g["errors"], "unfinished": g["unfinished"], "error_rate": g["error_rate"],
        "gw_p50_us": p(g["latency_us"], "p50"), "gw_p99_us": p(g["latency_us"], "p99"),
        "gw_p99_9_us": p(g["latency_us"], "p99_9"), "gw_max_us": p(g["latency_us"], "max"),
        "direct_p99_us": p(dct["latency_us"], "p99"),
        "added_p99_vs_direct_us": ((lgd.get("added_us") or {}).get("latency") or {}).get("p99"),
        "added_p99_vs_healthy_us": (p(g["latency_us"], "p99") - p(hg["latency_us"], "p99"))
        if hg and p(g["latency_us"], "p99") is not None and p(hg["latency_us"], "p99")
        is not None else None,
        "header_counts": g.get("header_counts"),
        "routing": routing_counts(rec),
        "gateway_cpu_pct": rec["gateway_proc"]["cpu_pct"],
        "cpu_busy_pct": rec["gateway_proc"]["cpu_busy_pct"],
        "loadgen_cpu_pct": lgd.get("loadgen_cpu_pct"),
        "harness_bound": lgd.get("harness_bound"), "send_lag_p99_us": lgd.get("send_lag_p99_us"),
        "send_lag_max_ms": stall_ms(rec),
        "loadavg_before": rec["loadavg_before"], "loadavg_after": rec["loadavg_after"],
        "gateway_alive": rec["gateway_alive"],
    }
    if rec.get("kill_unix_ms"):
        s["kill_at_s"] = round((rec["kill_unix_ms"] - lgd["window_start_unix_ms"]) / 1000, 3)
    phases = []
    for ph_g, ph_d in zip(g.get("phases") or [], dct.get("phases") or []):
        pg, pd = p(ph_g["latency_us"], "p99"), p(ph_d["latency_us"], "p99")
        phases.append({"from_s": ph_g["from_s"], "to_s": ph_g["to_s"], "ok": ph_g["ok"],
                       "errors": ph_g["errors"], "gw_p50_us": p(ph_g["latency_us"], "p50"),
                       "gw_p99_us": pg, "direct_p99_us": pd,
                       "added_p99_vs_direct_us": pg - pd if pg is not None and pd is not None
                       else None})
    s["phases"] = phases
    return s


# ----------------------------------------------------------------------------- report

def fpct(x, digits=3):
    return "-" if x is None else f"{100 * x:.{digits}f} %"


def md_report(R, env, o, sums, runs):
    ms = R.fms
    lines = [
        f"- Load: open loop, {o['rate']:,} RPS to the gateway (and {o['rate']:,} RPS to the "
        f"direct baseline mock, interleaved), chat non-stream small, {o['duration']:g} s "
        f"measured after {o['warmup']:g} s warm-up (plus 1 s at 100 RPS before), "
        f"client timeout {o['timeout_ms']} ms.",
        f"- Deployments: model `{MODEL}` → `a` and `b` (two `ringgate mock --profile "
        f"{o['profile']}` processes, weight 1 each), `lb = \"{o['lb']}\"`, max_attempts 3, "
        f"breaker {{ failures = {o['breaker_failures']}, cooldown_ms = "
        f"{o['breaker_cooldown_ms']} }}, first_byte_timeout_ms = {o['fbt_ms']}; one shard "
        f"(CPU 0); mocks + load generator on CPU 1.",
        f"- `faults`: `b` runs `--fault {' --fault '.join(FAULTS)} --fault-rate "
        f"{o['fault_rate']} --seed {o['seed']}` (each fault equally likely among the failing "
        f"{100 * o['fault_rate']:g} %; a stall ends at the first-byte timeout). `down`: `b` "
        f"is SIGKILLed half-way through the measured window.",
        f"- Machine load (`/proc/loadavg` 1/5/15 min) before each run: "
        + "; ".join(f"{s['run']} {' '.join(s['loadavg_before'] or ['?'])}" for s in sums)
        + f" on {env['cpus']} CPUs shared with other jobs: absolute tails are noisy.",
        "",
        "## Client view",
        "",
        "Latencies in ms. *vs direct*: gateway − direct baseline at p99 in the same run "
        "(interleaved); *vs healthy*: this run's gateway p99 − the `healthy` run's. Send lag: "
        "how late the load generator sent (its own CPU); above 1 ms at p99 the run is marked "
        "harness-bound (here: CPU contention from other jobs on the shared machine).",
        "",
    ]
    rows = []
    for s in sums:
        rows.append([s["run"], R.frps(s["served_rps"]), f"{s['scheduled']:,}",
                     f"{s['errors']['total']} ({fpct(s['error_rate'])})",
                     R.errs_str({"errors": s["errors"], "unfinished": s["unfinished"]}),
                     ms(s["gw_p50_us"], 3), ms(s["gw_p99_us"], 3), ms(s["gw_p99_9_us"], 3),
                     ms(s["gw_max_us"], 1), ms(s["direct_p99_us"], 3),
                     ms(s["added_p99_vs_direct_us"], 3), ms(s["added_p99_vs_healthy_us"], 3),
                     s["gateway_cpu_pct"],
                     f"{ms(s['send_lag_p99_us'], 2)} / {s['send_lag_max_ms']:.1f}"
                     + (" (harness-bound)" if s["harness_bound"] else "")])
    lines.append(R.md_table(["run", "served/s", "requests", "client errors", "kinds",
                             "gw p50", "gw p99", "gw p99.9", "gw max", "direct p99",
                             "added p99 vs direct", "added p99 vs healthy", "gw CPU %",
                             "loadgen send lag p99 / max"], rows))
    lines += ["", "Per half of the measured window (split at "
              f"{o['duration'] / 2:g} s; `down` kills `b` at the split):", ""]
    rows = []
    for s in sums:
        for ph in s["phases"]:
            n = ph["ok"] + ph["errors"]
            rows.append([s["run"], f"{ph['from_s']:g}–{ph['to_s'] if ph['to_s'] is not None else o['duration']:g} s",
                         f"{n:,}", f"{ph['errors']} ({fpct(ph['errors'] / n if n else None)})",
                         ms(ph["gw_p50_us"], 3), ms(ph["gw_p99_us"], 3),
                         ms(ph["direct_p99_us"], 3), ms(ph["added_p99_vs_direct_us"], 3)])
    lines.append(R.md_table(["run", "phase", "requests", "client errors", "gw p50", "gw p99",
                             "direct p99", "added p99 vs direct"], rows))
    lines += ["", "## Gateway view (from `/metrics`)", "",
              "Measured window only (counters interpolated at the window start between 250 ms "
              "scrapes; the end is a scrape after the last response). *answered by* counts "
              "the `x-ringgate-provider` header of the client responses; *attempts header* "
              "the `x-ringgate-attempts` values.", ""]
    rows = []
    for s in sums:
        r = s["routing"]
        hc = s["header_counts"] or {}
        prov = hc.get("x-ringgate-provider") or {}
        att = hc.get("x-ringgate-attempts") or {}
        if not r["available"]:
            rows.append([s["run"]] + ["n/a (no routing series on /metrics)"] + [""] * 6
                        + [", ".join(f"{k}: {v:,}" for k, v in sorted(prov.items())),
                           ", ".join(f"{k}: {v:,}" for k, v in sorted(att.items()))])
            continue
        reasons = r.get("failures_b_by_reason", r["failures_b_by_reason_total"])
        rows.append([s["run"], f"{r['attempts_a']:,}", f"{r['attempts_b']:,}",
                     f"{r['failures_b']:,}",
                     ", ".join(f"{k}: {int(v):,}" for k, v in sorted(reasons.items()) if v)
                     or "-",
                     f"{r['retries']:,}", r["breaker_opens_b"], f"{r['upstream_retry_once']:,}",
                     ", ".join(f"{k}: {v:,}" for k, v in sorted(prov.items())),
                     ", ".join(f"{k}: {v:,}" for k, v in sorted(att.items()))])
    lines.append(R.md_table(["run", "attempts → a", "attempts → b (reached b)", "b failed",
                             "b failures by reason", "retries",
                             "b breaker opens", "upstream retry-once", "answered by",
                             "attempts header"], rows))
    kills = [s for s in sums if s.get("kill_at_s") is not None]
    for s in kills:
        r = s["routing"]
        lines += ["", f"`{s['run']}`: `b` was killed at {s['kill_at_s']:.3f} s into the window; "
                  + (f"after that {r['attempts_b_after_kill']:,} attempts reached it, "
                     f"{r['failures_b_after_kill']:,} failed, its breaker opened "
                     f"{r['breaker_opens_b_after_kill']} times (counters scraped just before "
                     "the kill and after the run)." if "attempts_b_after_kill" in r
                     else "routing series n/a.")]
    return "\n".join(lines) + "\n"


def chart(R, env, o, runs, sums, path):
    """One SVG, a row per disturbed run: latency over time (the healthy run's as reference)
    and client errors / routing over time; the fault window shaded."""
    by = {r["run"]: r for r in runs}
    kill = {s["run"]: s.get("kill_at_s") for s in sums}
    tmp = R.tmpdir()
    dur, step = o["duration"], o["bucket_ms"] / 1000
    panels = []

    def lat(rec, label, key, dashed=False, target="target"):
        return (f"{label} {key[:-3].replace('_', '.')}",
                [(b["t_s"] + step / 2, b[key] / 1000) for b in timeline_points(rec, target)
                 if b.get(key)], dashed)

    def errors(rec):
        return ("client error %", [(b["t_s"] + step / 2, 100 * b["errors"] / (b["ok"] + b["errors"]))
                                   for b in timeline_points(rec) if b["ok"] + b["errors"]], False)

    def routing(rec):
        pts = [p for p in metric_rate_series(rec) if -0.5 <= p[0] <= dur + 0.5]
        return [("% attempts → b", [(x, y) for x, y, _, _ in pts], False),
                ("% of b attempts failed", [(x, y) for x, _, y, _ in pts], True),
                ("b breaker open (=100)", [(x, y) for x, _, _, y in pts], True)]

    for kind in [k for k in RUNS if k != "healthy" and k in by]:
        rec = by[kind]
        if kind == "down":
            span = [(kill.get(kind) or dur / 2, dur, "b killed")]
        else:
            span = [(0, dur, f"b fails {100 * o['fault_rate']:g} % (mixed)")]
        ser = [lat(rec, kind, "p50_us", True), lat(rec, kind, "p99_us")]
        if "healthy" in by:
            ser.append(lat(by["healthy"], "healthy", "p99_us", True))
        ser.append(lat(rec, "direct", "p99_us", True, "baseline"))
        title = f"S8 {kind} (lb {rec['lb']})"
        panels.append(R.svg_chart(os.path.join(tmp, f"s8-{kind}-lat.svg"),
                                  f"{title}: latency per {o['bucket_ms']} ms", ser,
                                  "seconds into the measured window", "latency, ms (log)",
                                  logy=True, vspans=span))
        panels.append(R.svg_chart(os.path.join(tmp, f"s8-{kind}-err.svg"),
                                  f"{title}: errors and routing", [errors(rec)] + routing(rec),
                                  "seconds into the measured window", "%", vspans=span,
                                  gaps=True))
    W, H = 760, 430
    rows = (len(panels) + 1) // 2
    total_h = H * rows + 24
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{total_h}" '
           f'viewBox="0 0 {2 * W} {total_h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{2 * W}" height="{total_h}" fill="white"/>']
    for i, name in enumerate(panels):
        body = open(os.path.join(tmp, name)).read()
        out.append(body.replace("<svg ", f'<svg x="{(i % 2) * W}" y="{(i // 2) * H}" ', 1))
    out.append(f'<text x="6" y="{total_h - 8}" font-size="9" fill="#666">'
               f'{R._esc(R.chart_stamp(env))}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return os.path.basename(path)


# ----------------------------------------------------------------------------- entry

STALL_MS = 250


def stall_ms(rec):
    """The load generator's worst send lag (ms) over both targets: how long the harness
    itself could not send at some point."""
    return max(((t.get("send_lag_us") or {}).get("max") or 0) / 1000
               for t in rec["loadgen"].get("targets", []))


def smoke_verdict(R, sums):
    """0 when every run served its clients without errors, the gateway survived and `b`
    really was attempted and failed (so the failure paths ran); else 1."""
    bad = []
    for s in sums:
        r = s["routing"]
        if s["errors"]["total"] or s["unfinished"]:
            bad.append(f"{s['run']}: client errors {R.errs_str({'errors': s['errors'], 'unfinished': s['unfinished']})}")
        if not s["gateway_alive"]:
            bad.append(f"{s['run']}: gateway exited")
        if not r["available"]:
            bad.append(f"{s['run']}: no routing series on /metrics")
        elif not r["failures_b"] and not r["failures_b_by_reason_total"]:
            bad.append(f"{s['run']}: b never failed (faults not injected?)")
        R.log(f"s8 smoke {s['run']}: errors {s['errors']['total']}, b attempts "
              f"{r.get('attempts_b')}, b failures {r.get('failures_b')}, retries {r.get('retries')}")
    if bad:
        R.log("S8 SMOKE FAILED: " + "; ".join(bad))
        return 1
    R.log("s8 smoke ok")
    return 0


def run_s8(R, lg, opts, env):
    if opts.get("render_only"):
        return render_only(R, opts)
    o = {
        "rate": opts.get("rate") or 2000,
        "duration": opts["duration"] if opts.get("duration_set") else 20.0,
        "warmup": opts["warmup"],
        "profile": opts.get("profile") or "instant",
        "fault_rate": opts.get("fault_rate", 0.3),
        "seed": opts.get("seed", 42),
        "fbt_ms": opts.get("fbt_ms", 250),
        "breaker_failures": 5,
        "breaker_cooldown_ms": opts.get("cooldown_ms", 10000),
        "lb": opts.get("lb") or "p2c",
        "timeout_ms": 10000,
        "bucket_ms": 250,
    }
    kinds = [k for k in RUNS if k in (opts.get("runs") or RUNS)]
    if opts.get("smoke"):
        # A few seconds, nothing written: the failure paths must keep clients error-free.
        # Weighted in both runs: p2c may keep b out for the whole short window, and then the
        # failure paths would not run at all.
        o.update({"rate": opts.get("rate") or 200, "duration": 2.0, "warmup": 0.5,
                  "lb": "weighted"})
        kinds = ["faults-weighted", "down"]
    env["loadavg_before"] = loadavg()
    env["uptime"] = R.sh(["uptime"])
    R.log(f"s8: uptime {env['uptime']}")
    runs, discarded = [], []
    for kind in kinds:
        rec = one_run(R, lg, kind, o, opts)
        lag = stall_ms(rec)
        if lag > STALL_MS:
            # The whole VM (not the gateway) stopped: the load generator itself could not send
            # for this long. Such a run measures the host; run it once more, keep both.
            R.log(f"s8 {kind}: harness stalled (send lag max {lag:.0f} ms), running it again")
            discarded.append({"run": kind, "send_lag_max_ms": lag, "record": rec})
            rec = one_run(R, lg, kind, o, opts)
        rec["send_lag_max_ms"] = stall_ms(rec)
        runs.append(rec)
        g = R_tgt(rec["loadgen"], "target")
        R.log(f"s8 {kind}: served {g['served_rps']}/s errors {R.errs_str(g)} p99 "
              f"{R.fms(g['latency_us'].get('p99'), 3)} ms added p99 vs direct "
              f"{R.fms(R.added(rec['loadgen'], 'latency', 'p99'), 3)} ms "
              f"loadavg {rec['loadavg_before']}")
    if opts.get("smoke"):
        healthy = next((r for r in runs if r["run"] == "healthy"), None)
        return smoke_verdict(R, [summarize(r, healthy) for r in runs])
    return publish(R, env, o, runs, discarded, opts)


def render_only(R, opts):
    """Rewrite s8-chaos.{md,svg} (and the JSON's derived fields) from the raw runs already in
    bench-results/s8-chaos.json: no measurement, the recorded environment is kept."""
    name = "s8-chaos" + (f"-{opts['tag']}" if opts.get("tag") else "")
    old = R.load_result(name)
    if not old or not old.get("runs"):
        raise R.HarnessError(f"no raw runs in bench-results/{name}.json to render")
    env = old["environment"]
    return publish(R, env, old["options"], old["runs"], old.get("discarded_runs") or [], opts)


def publish(R, env, o, runs, discarded, opts):
    healthy = next((r for r in runs if r["run"] == "healthy"), None)
    sums = [summarize(r, healthy) for r in runs]
    name = "s8-chaos"
    base = name + (f"-{opts['tag']}" if opts.get("tag") else "")
    svg = chart(R, env, o, runs, sums, os.path.join(R.RESULTS, base + ".svg"))
    md = R.md_header("S8 chaos: two deployments, one failing", env, "") + md_report(
        R, env, o, sums, runs) + f"\n![{svg}]({svg})\n"
    if discarded:
        md += ("\nRe-run after a harness stall (the load generator's own send lag exceeded "
               f"{STALL_MS} ms, i.e. the VM stopped; kept in the JSON under `discarded_runs`): "
               + ", ".join(f"{d['run']} ({d['send_lag_max_ms']:.0f} ms)" for d in discarded)
               + ".\n")
    by = {s["run"]: s for s in sums}
    parts = []
    for k in RUNS[1:]:
        s = by.get(k)
        if s:
            r = s["routing"]
            if not r["available"]:
                reached = "routing metrics n/a"
            elif "attempts_b_after_kill" in r:
                reached = (f"{r['attempts_b_after_kill']:,} attempts reached b after the kill "
                           f"({r['failures_b_after_kill']:,} failed)")
            else:
                reached = f"{r['attempts_b']:,} attempts reached b ({r['failures_b']:,} failed)"
            parts.append(f"{k}: client errors {fpct(s['error_rate'], 2)}, p99/p99.9 "
                         f"{R.fms(s['gw_p99_us'], 1)}/{R.fms(s['gw_p99_9_us'], 1)} ms (healthy "
                         f"{R.fms(by['healthy']['gw_p99_us'], 1) if 'healthy' in by else '-'}/"
                         f"{R.fms(by['healthy']['gw_p99_9_us'], 1) if 'healthy' in by else '-'}), "
                         + reached)
    summary = f"{o['rate']:,} RPS, {o['profile']} mocks: " + "; ".join(parts)
    R.write_results(name, env, {"summary": summary, "charts": [svg], "options": o,
                                "runs_summary": sums, "runs": runs,
                                "discarded_runs": discarded}, md, opts)
    bad = [s["run"] for s in sums if not s["gateway_alive"]]
    if bad:
        R.log(f"s8: gateway died in {bad}")
        return 1
    return 0
