"""CPU per request (docs/bench-protocol.md): the headline efficiency figure.

Used by `benches/run cpu`. The gateway's own user+system CPU time (utime + stime of
/proc/PID/stat, all threads) divided by the requests it handled, next to nginx `proxy_pass`
(1 worker, the reference for a plain 1-core HTTP proxy doing no JSON work) and the direct
baseline (load generator → mock, interleaved in the same load-generator run: its latency, and
the mock's own CPU per request), for S1 small (seed mock, open loop at fixed rates) and S4 (instant
mock, closed loop c=10, six workloads). Each proxy runs alone on CPU 0; mocks and the load
generator on CPU 1. Trials are interleaved (random order of systems within each workload, per
trial) because the machine is shared. The count of requests includes the load generator's
warm-up (the CPU sample covers the whole run); /proc/PID/task/*/schedstat (ns run time) is
recorded next to the tick-based figure as a cross-check of the 10 ms tick resolution.

The implied 1-core ceiling is 10^6 / (CPU µs per request): the request rate one fully busy core
would sustain on this machine if nothing else limited it. It does not depend on how fast the
load generator is, unlike the harness-bound "≥ N RPS" figures.
"""

import os
import random
import statistics
import subprocess
import sys
import time

S1_RATES = [1000, 4000]
S4_REQUESTS = 40000
# (dialect, stream, translated): every dialect passes through (ringgate: an openai-kind provider
# for Chat and Responses, an anthropic-kind one for Messages, the same mock), as nginx does;
# plus Messages translated to Chat and back (ringgate only: nginx cannot do that).
WORKLOADS_S4 = ([(dl, s, False) for dl in ("chat", "responses", "messages") for s in (False, True)]
                + [("messages", s, True) for s in (False, True)])


def sched_ns(pid):
    total = 0
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    except OSError:
        return None
    return total


def attempted(t):
    """Every request the target saw in this load-generator run (warm-up included)."""
    w = t.get("warmup") or {}
    return (t["completed_ok"] + t["errors"]["total"] + (w.get("ok") or 0)
            + (w.get("errors") or 0))


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[:3]
    except OSError:
        return ["?"] * 3


def measure(R, lg, sysm, kind, mock, args, label, model=()):
    pids = {"proxy": sysm.proc.pid, "mock": mock.pid}
    t0 = {k: (R.proc_cpu_ticks(p), sched_ns(p)) for k, p in pids.items()}
    la = loadavg()
    w0 = time.monotonic()
    # A later --model wins over the system's own.
    d = lg.run(sysm.urls[kind], R.mock_url(mock), label, args + sysm.args(kind) + list(model),
               timeout_s=900)
    wall = time.monotonic() - w0
    t1 = {k: (R.proc_cpu_ticks(p), sched_ns(p)) for k, p in pids.items()}
    g, b = R.tgt(d), R.tgt(d, "baseline")
    n_proxy, n_direct = attempted(g), attempted(b)
    out = {"label": label, "system": sysm.name, "wall_s": round(wall, 2), "loadavg": la,
           "requests_proxy": n_proxy, "requests_direct": n_direct,
           "errors_proxy": g["errors"]["total"], "errors_direct": b["errors"]["total"],
           "served_rps": g["served_rps"], "direct_served_rps": b["served_rps"],
           "latency_us": {k: R.pct(g["latency_us"], k) for k in ("p50", "p99")},
           "direct_latency_us": {k: R.pct(b["latency_us"], k) for k in ("p50", "p99")},
           "added_us": d.get("added_us"), "loadgen": d}
    for k in pids:
        (a0, s0), (a1, s1) = t0[k], t1[k]
        n = n_proxy if k == "proxy" else n_proxy + n_direct
        ticks = (a1 - a0) if a0 is not None and a1 is not None else None
        out[f"{k}_cpu_ticks"] = ticks
        out[f"{k}_cpu_us_per_req"] = (ticks / R.CLK * 1e6 / n) if ticks is not None and n else None
        out[f"{k}_sched_us_per_req"] = ((s1 - s0) / 1e3 / n) if s0 is not None and s1 is not None \
            and n else None
    return out


def start_ringgate(R, peers, mocks):
    """The gateway with passthrough routes for every dialect: model `mock` (Chat, Responses:
    openai-kind provider), `mock-anthropic` (Messages: anthropic-kind provider), `seed`."""
    port = R.free_port()
    inst, seed = R.mock_url(mocks["instant"]), R.mock_url(mocks["seed"])
    cfg = os.path.join(R.tmpdir(), f"cpu-ringgate-{port}.toml")
    with open(cfg, "w") as f:
        f.write(f"""[server]
listen = "127.0.0.1:{port}"
shards = 1

[[provider]]
name = "instant"
kind = "openai"
base_url = "{inst}/v1"

[[provider]]
name = "instant-anthropic"
kind = "anthropic"
base_url = "{inst}"

[[provider]]
name = "seed"
kind = "openai"
base_url = "{seed}/v1"

[[model]]
name = "mock"
provider = "instant"

[[model]]
name = "mock-anthropic"
provider = "instant-anthropic"
upstream_model = "mock"

[[model]]
name = "seed"
provider = "seed"
""")
    p = R.Proc("cpu-ringgate", R.pin(R.GW_CPU, [R.RINGGATE, "--config", cfg]), port=port,
               env=R.GATEWAY_ENV)
    u = f"http://127.0.0.1:{port}"
    return peers.System("ringgate", p, {"instant": u, "seed": u},
                        models={"instant": "mock", "seed": "seed"})


def run_cpu(R, lg, opts, env):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "s7"))
    import peers  # noqa: E402  (benches/peers/peers.py: the same nginx and ringgate setups as S7)
    trials = opts.get("trials") or 2
    dur = opts["step_duration"]
    warm = opts["warmup"]
    rates = opts.get("steps") or S1_RATES
    n_s4 = opts["requests"] if opts.get("requests_set") else S4_REQUESTS
    mocks = {"instant": R.start_mock("instant", "-cpu"), "seed": R.start_mock("seed", "-cpu")}
    systems = []
    runs = []
    idle = {}
    try:
        systems = [start_ringgate(R, peers, mocks), peers.start_nginx(R, mocks)]
        # Warm every path once (connections, pools), then a 5 s idle sample: what a proxy
        # burns doing nothing would otherwise be charged to requests.
        for s in systems:
            for kind in ("instant", "seed"):
                lg.run(s.urls[kind], R.mock_url(mocks[kind]), "warmup",
                       ["--concurrency", 4, "--requests", 400, "--warmup", 0.5] + s.args(kind))
        c0 = {s.name: R.proc_cpu_ticks(s.proc.pid) for s in systems}
        time.sleep(5)
        idle = {s.name: (R.proc_cpu_ticks(s.proc.pid) - c0[s.name]) / R.CLK / 5 * 100
                for s in systems}
        work = [("s1-small", r) for r in rates] + [("s4", w) for w in WORKLOADS_S4]
        for trial in range(1, trials + 1):
            for scen, w in work:
                order = list(systems)
                random.shuffle(order)
                for s in order:
                    if scen == "s4" and w[2] and s.name != "ringgate":
                        continue  # translation: ringgate only
                    model = []
                    if scen == "s1-small":
                        kind = "seed"
                        args = ["--rate", w, "--duration", dur, "--warmup", warm, "--size",
                                "small", "--connections",
                                min(opts["conn_cap"], max(2048, w // 4)), "--timeout-ms", 10000]
                        wl = f"S1 small {w:,} RPS"
                    else:
                        kind = "instant"
                        dl, st, tr = w
                        args = ["--workload", dl, "--concurrency", 10, "--requests", n_s4,
                                "--warmup", 1] + (["--stream"] if st else [])
                        wl = (f"S4 {dl} {'stream' if st else 'non-stream'}"
                              + (" (translated via Chat)" if tr else ""))
                        if dl == "messages" and not tr and s.name == "ringgate":
                            model = ["--model", "mock-anthropic"]
                    m = measure(R, lg, s, kind, mocks[kind], args, f"cpu {wl} {s.name} t{trial}",
                                model)
                    m.update({"scenario": scen, "workload": wl, "trial": trial})
                    runs.append(m)
                    R.log(f"cpu t{trial} {wl} {s.name}: {fmt(m['proxy_cpu_us_per_req'])} µs/req "
                          f"(sched {fmt(m['proxy_sched_us_per_req'])}), mock "
                          f"{fmt(m['mock_cpu_us_per_req'])} µs/req, {m['requests_proxy']:,} req, "
                          f"errors {m['errors_proxy']}, load {' '.join(m['loadavg'])}")
    finally:
        for s in systems:
            s.proc.stop()
        for m in mocks.values():
            m.stop()
    return render(R, opts, env, runs, idle, trials, dur, warm, n_s4)


def fmt(x, d=2):
    return "-" if x is None else f"{x:.{d}f}"


def agg(vals):
    v = [x for x in vals if x is not None]
    if not v:
        return None, None, None
    return statistics.median(v), min(v), max(v)


def render(R, opts, env, runs, idle, trials, dur, warm, n_s4):
    env = dict(env)
    env["placement"] = (f"proxy under test alone on CPU {R.GW_CPU} (ringgate shards = 1; nginx "
                        f"1 worker, master_process off); mocks + load generator on CPU "
                        f"{R.HARNESS_CPU}")
    env["nginx"] = _nginx_version()
    workloads = []
    for r in runs:
        if r["workload"] not in workloads:
            workloads.append(r["workload"])
    rows, summary_rows = [], []
    headline = {}
    for wl in workloads:
        rr = [r for r in runs if r["workload"] == wl]
        cell = {}
        for sysname in ("ringgate", "nginx"):
            xs = [r for r in rr if r["system"] == sysname]
            cell[sysname] = {
                "cpu": agg([r["proxy_cpu_us_per_req"] for r in xs]),
                "sched": agg([r["proxy_sched_us_per_req"] for r in xs]),
                "mock": agg([r["mock_cpu_us_per_req"] for r in xs]),
                "p99": agg([r["latency_us"]["p99"] for r in xs]),
                "dp99": agg([r["direct_latency_us"]["p99"] for r in xs]),
                "rps": agg([r["served_rps"] for r in xs]),
                "errors": sum(r["errors_proxy"] for r in xs),
                "n": sum(r["requests_proxy"] for r in xs),
                "hb": sum(1 for r in xs if r["loadgen"].get("harness_bound")),
                "runs": len(xs),
            }
        rg, ng = cell["ringgate"], cell["nginx"]
        headline[wl] = {k: {"cpu_us_per_req_median": v["cpu"][0],
                            "cpu_us_per_req_range": [v["cpu"][1], v["cpu"][2]],
                            "sched_us_per_req_median": v["sched"][0],
                            "one_core_ceiling_rps": (1e6 / v["cpu"][0]) if v["cpu"][0] else None,
                            "requests": v["n"], "errors": v["errors"]}
                        for k, v in cell.items()}
        mock_med = agg([r["mock_cpu_us_per_req"] for r in rr])[0]
        headline[wl]["direct_mock_cpu_us_per_req"] = mock_med

        def rng(a):
            return f"{fmt(a[0])} ({fmt(a[1])}–{fmt(a[2])})" if a[0] is not None else "-"

        def ceil(a):
            return f"{1e6 / a[0]:,.0f}" if a[0] else "-"

        summary_rows.append([wl, f"**{fmt(rg['cpu'][0])}**", fmt(ng["cpu"][0]),
                             f"{rg['cpu'][0] / ng['cpu'][0]:.2f}×" if rg["cpu"][0] and ng["cpu"][0]
                             else "-", fmt(mock_med), f"**{ceil(rg['cpu'])}**", ceil(ng["cpu"])])
        for sysname, v in (("ringgate", rg), ("nginx", ng)):
            if not v["runs"]:
                continue
            rows.append([wl, sysname, rng(v["cpu"]), rng(v["sched"]), rng(v["mock"]),
                         f"{v['n']:,}", v["errors"], R.frps(v["rps"][0]),
                         R.fms(v["p99"][0], 3), R.fms(v["dp99"][0], 3),
                         f"{v['hb']} of {v['runs']}"])
    las = [float(r["loadavg"][0]) for r in runs if r["loadavg"][0] != "?"]
    md = R.md_header(
        "CPU per request — ringgate vs nginx proxy_pass vs direct", env,
        f"- CPU µs per request = Δ(utime + stime) of the proxy process (/proc/PID/stat, "
        f"{R.CLK} ticks/s) ÷ the requests it handled in that run (warm-up included); "
        "cross-check: Δ of /proc/PID/task/*/schedstat run time (ns)\n"
        f"- S1 small: seed mock, open loop, {dur:g} s measured after {warm:g} s warm-up per rate; "
        f"S4: instant mock, closed loop c=10, {n_s4:,} requests per workload; direct baseline "
        "interleaved in every load-generator run (its mock's CPU per request is the direct "
        f"column); {trials} trials, systems in random order within each workload and trial\n"
        f"- **Shared machine**: other builders were compiling during this run (load average "
        f"{min(las) if las else '?'}–{max(las) if las else '?'} on 2 CPUs while measuring); CPU "
        "time per request is much less sensitive to that than latency or throughput, but not "
        "immune (cache and frequency effects): the ranges over trials are shown\n"
        f"- Idle CPU of each proxy over 5 s before measuring: "
        + ", ".join(f"{k} {v:.2f} %" for k, v in idle.items()) + "\n\n")
    md += "## Headline (median over trials)\n\n" + R.md_table(
        ["workload", "ringgate CPU µs/req", "nginx CPU µs/req", "ringgate / nginx",
         "direct: mock CPU µs/req", "ringgate 1-core ceiling req/s", "nginx 1-core ceiling req/s"],
        summary_rows) + "\n"
    md += ("\nThe 1-core ceiling is 10^6 ÷ CPU µs per request: what one fully busy core would "
           "serve if nothing else limited it. The mock column is the upstream's own cost per "
           "request (a `ringgate mock` process answering the direct and the proxied requests). "
           "Every dialect passes through in ringgate (Chat and Responses to an openai-kind "
           "provider, Messages to an anthropic-kind one; only `model` is read, the answer is "
           "vetted and relayed), as nginx passes bytes; \"translated via Chat\" is Anthropic "
           "Messages in, OpenAI Chat to the mock, translated back — work nginx does not do.\n")
    md += "\n## All systems (median, range over trials)\n\n" + R.md_table(
        ["workload", "system", "CPU µs/req (stat)", "CPU µs/req (schedstat)",
         "mock CPU µs/req", "requests", "errors", "served req/s", "p99 ms", "direct p99 ms",
         "harness-bound runs"], rows) + "\n"
    md += ("\nHarness-bound: the load generator fell behind its open-loop schedule (send lag p99 "
           "> 1 ms) or was CPU-bound; latency and served rate then describe the harness as much "
           "as the proxy, but the CPU per request still counts every request the proxy handled. "
           "Runs with errors are not comparable (the requests counted include failed ones).\n")
    summary = "; ".join(
        f"{wl}: ringgate {fmt(h['ringgate']['cpu_us_per_req_median'])} µs vs nginx "
        f"{fmt(h['nginx']['cpu_us_per_req_median'])} µs"
        for wl, h in headline.items() if wl.startswith(("S1", "S4 chat non")))
    R.write_results("cpu-per-request", env, {"headline": headline, "runs": runs, "idle_cpu_pct": idle,
                                             "summary": summary,
                                             "options": R._opts_json(opts)}, md, opts)
    bad = sum(r["errors_proxy"] for r in runs)
    return 0 if not bad else 1


def _nginx_version():
    try:
        return subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip()
    except OSError:
        return "?"
