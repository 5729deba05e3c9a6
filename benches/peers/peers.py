"""S7 side by side: ringgate vs nginx (plain 1-core proxy), LiteLLM (PyPI) and Portkey (npm).

Used by `benches/run peers`; install the peers first with `benches/peers/install.sh` (downloads go to
.bench-peers/ in the checkout, ignored by git; BENCH_VENVS / BENCH_NODE override). Every system runs on CPU 0 against
the same two mocks (instant for the S4-style runs, seed for the S1-style sweep) on CPU 1, driven
by the same load generator; each run interleaves the direct baseline.
"""

import os
import shutil
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_PEERS = os.path.join(os.path.dirname(os.path.dirname(HERE)), ".bench-peers")
VENVS = os.environ.get("BENCH_VENVS", os.path.join(_PEERS, "venvs"))
NODE_DIR = os.environ.get("BENCH_NODE", os.path.join(_PEERS, "node"))
PORTKEY_JS = os.path.join(NODE_DIR, "node_modules/@portkey-ai/gateway/build/start-server.js")
LITELLM = os.path.join(VENVS, "litellm/bin/litellm")
MASTER_KEY = "sk-bench-master"


class System:
    """A running gateway: url/model/headers per mock kind ("instant" | "seed")."""

    def __init__(self, name, proc, urls, models=None, headers=None, api_key="sk-bench",
                 note=""):
        self.name, self.proc, self.urls = name, proc, urls
        self.models = models or {"instant": "mock", "seed": "mock"}
        self.headers = headers or {"instant": [], "seed": []}
        self.api_key, self.note = api_key, note

    def args(self, kind):
        a = ["--model", self.models[kind], "--api-key", self.api_key]
        for h in self.headers[kind]:
            a += ["--header", h]
        return a


def start_ringgate(R, mocks):
    p = R.start_gateway([("mock", R.mock_url(mocks["instant"]) + "/v1"),
                         ("seed", R.mock_url(mocks["seed"]) + "/v1")], name="s7-ringgate")
    u = f"http://127.0.0.1:{p.port}"
    return System("ringgate", p, {"instant": u, "seed": u},
                  models={"instant": "mock", "seed": "seed"})


def start_nginx(R, mocks):
    if not shutil.which("nginx"):
        raise R.HarnessError("nginx not installed (benches/peers/install.sh)")
    pi, ps = R.free_port(), R.free_port()
    d = R.tmpdir()
    conf = os.path.join(d, "nginx.conf")
    servers = ""
    for port, m in ((pi, mocks["instant"]), (ps, mocks["seed"])):
        servers += f"""
    upstream up{port} {{ server 127.0.0.1:{m.port}; keepalive 512; keepalive_requests 1000000; }}
    server {{
        listen 127.0.0.1:{port} backlog=65535;
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://up{port};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}"""
    with open(conf, "w") as f:
        f.write(f"""master_process off;
daemon off;
worker_processes 1;
worker_rlimit_nofile 65535;
error_log {d}/nginx-error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections 60000; multi_accept on; }}
http {{
    access_log off;
    tcp_nodelay on;
    client_body_temp_path {d}/nginx-body;
    proxy_temp_path {d}/nginx-proxy;
    client_max_body_size 64m;
    client_body_buffer_size 1m;
    {servers}
}}
""")
    p = R.Proc("s7-nginx", R.pin(R.GW_CPU, ["nginx", "-c", conf, "-p", d]), port=pi)
    R.wait_port(ps, 5)
    return System("nginx", p, {"instant": f"http://127.0.0.1:{pi}",
                               "seed": f"http://127.0.0.1:{ps}"},
                  note="proxy_pass, keepalive upstream, 1 worker (master_process off)")


def start_litellm(R, mocks):
    if not os.path.exists(LITELLM):
        raise R.HarnessError(f"{LITELLM} missing (benches/peers/install.sh)")
    port = R.free_port()
    cfg = os.path.join(R.tmpdir(), "litellm.yaml")
    with open(cfg, "w") as f:
        f.write(f"""model_list:
  - model_name: mock
    litellm_params:
      model: openai/mock
      api_base: http://127.0.0.1:{mocks['instant'].port}/v1
      api_key: sk-bench
  - model_name: seed
    litellm_params:
      model: openai/seed
      api_base: http://127.0.0.1:{mocks['seed'].port}/v1
      api_key: sk-bench
litellm_settings:
  num_retries: 0
  request_timeout: 60
  set_verbose: false
general_settings:
  master_key: {MASTER_KEY}
""")
    p = R.Proc("s7-litellm", R.pin(R.GW_CPU, [LITELLM, "--config", cfg, "--host", "127.0.0.1",
                                              "--port", str(port)]),
               port=port, ready_timeout=90,
               env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
                    "PYTHONUNBUFFERED": "1"})
    u = f"http://127.0.0.1:{port}"
    return System("litellm", p, {"instant": u, "seed": u},
                  models={"instant": "mock", "seed": "seed"}, api_key=MASTER_KEY)


def start_portkey(R, mocks, preload=True):
    if not os.path.exists(PORTKEY_JS):
        raise R.HarnessError(f"{PORTKEY_JS} missing (benches/peers/install.sh)")
    port = R.free_port()
    argv = ["node"]
    if preload:
        argv += ["--import", "file://" + os.path.join(HERE, "portkey-preload.mjs")]
    argv += [PORTKEY_JS, f"--port={port}", "--headless"]
    p = R.Proc("s7-portkey", R.pin(R.GW_CPU, argv), port=port, cwd=NODE_DIR, ready_timeout=30)
    u = f"http://127.0.0.1:{port}"
    hdr = {k: ["x-portkey-provider: openai",
               f"x-portkey-custom-host: http://127.0.0.1:{mocks[k].port}/v1"]
           for k in ("instant", "seed")}
    return System("portkey", p, {"instant": u, "seed": u}, headers=hdr,
                  note="with the fetch preload (benches/peers/portkey-preload.mjs)" if preload
                  else "no preload")


STARTERS = {"ringgate": start_ringgate, "nginx": start_nginx, "litellm": start_litellm,
            "portkey": start_portkey}


def sweep_system(R, lg, sysm, mocks, opts):
    steps = opts.get("steps") or R.S1_STEPS
    rows, stop = [], "steps exhausted"
    D = R.mock_url(mocks["seed"])
    lg.run(sysm.urls["seed"], D, "warmup", ["--rate", 20, "--duration", 0, "--warmup", 1]
           + sysm.args("seed"))
    for rps in steps:
        if opts.get("max_rps") and rps > opts["max_rps"]:
            stop = f"--max-rps {opts['max_rps']}"
            break
        smp = R.Sampler(sysm.proc.pid)
        d = lg.run(sysm.urls["seed"], D, f"s7 {sysm.name} s1-small {rps}",
                   ["--rate", rps, "--duration", opts["step_duration"], "--warmup",
                    opts["warmup"], "--connections", min(opts["conn_cap"], max(2048, rps // 4)), "--timeout-ms", 10000]
                   + sysm.args("seed"))
        res = smp.stop()
        g, b = R.tgt(d), R.tgt(d, "baseline")
        cpu1 = res["cpu_busy_pct"].get(str(R.HARNESS_CPU))
        hb = bool(d.get("harness_bound")) or (cpu1 is not None and cpu1 >= 95)
        row = {"offered_rps": rps, "served_rps": g["served_rps"],
               "direct_served_rps": b["served_rps"], "added_us": d.get("added_us"),
               "gateway": {k: g[k] for k in ("latency_us", "errors", "error_rate", "unfinished",
                                             "completed_ok")},
               "direct": {k: b[k] for k in ("latency_us", "errors", "error_rate", "unfinished",
                                            "completed_ok")},
               "gateway_proc": res, "cpu1_busy_pct": cpu1, "harness_bound": hb, "loadgen": d}
        rows.append(row)
        ap99 = R.added(d, "latency", "p99")
        R.log(f"s7 {sysm.name} {rps:>6} rps: served {g['served_rps']} added p99 {R.fms(ap99)} ms "
              f"errors {R.errs_str(g)} cpu {res['cpu_pct']}% rss {R.fmb(res['peak_rss_bytes'])} MiB"
              f"{' HARNESS-BOUND' if hb else ''}")
        if not sysm.proc.alive():
            stop = "process exited"
            break
        if ap99 is None or ap99 > 100_000:
            stop = f"added p99 > 100 ms at {rps}"
            break
        if R.err_rate(g) > 0.001 or g.get("unfinished"):
            stop = f"errors > 0.1% at {rps}"
            break
        if R.err_rate(b) > 0.001:
            stop = f"direct baseline errors at {rps} (harness-bound)"
            row["harness_bound"] = True
            break
    return {"rows": rows, "stop_reason": stop, "ceilings": R.ceilings(rows)}


def closed_runs(R, lg, sysm, mocks, opts):
    out = []
    D = R.mock_url(mocks["instant"])
    slow = sysm.name == "litellm"
    n = min(opts["requests"], 1000) if slow else opts["requests"]
    for stream in (False, True):
        extra = sysm.args("instant") + (["--stream"] if stream else [])
        lg.run(sysm.urls["instant"], D, "warmup",
               ["--concurrency", 4, "--requests", 50 if slow else 400, "--warmup", 0.5] + extra)
        smp = R.Sampler(sysm.proc.pid)
        d = lg.run(sysm.urls["instant"], D,
                   f"s7 {sysm.name} s4 chat {'stream' if stream else 'non-stream'}",
                   ["--concurrency", 10, "--requests", n, "--warmup", 1] + extra,
                   timeout_s=600)
        res = smp.stop()
        g = R.tgt(d)
        r = {"stream": stream, "requests": n, "served_rps": g["served_rps"],
             "latency_us": g["latency_us"], "ttft_us": g["ttft_us"], "errors": g["errors"],
             "ok": g["completed_ok"], "added_us": d.get("added_us"), "gateway_proc": res,
             "loadgen": d}
        out.append(r)
        R.log(f"s7 {sysm.name} c=10 {'stream' if stream else 'non-stream'}: "
              f"{g['served_rps']}/s p50 {R.fms(R.pct(g['latency_us'], 'p50'), 3)} ms "
              f"p99 {R.fms(R.pct(g['latency_us'], 'p99'), 3)} ms errors {R.errs_str(g)} "
              f"cpu {res['cpu_pct']}%")
    return out


def run_s7(R, lg, opts, env):
    mocks = {"instant": R.start_mock("instant", "-s7"), "seed": R.start_mock("seed", "-s7")}
    systems = {}
    try:
        for name in opts["systems"]:
            if name not in STARTERS:
                raise R.HarnessError(f"unknown system {name}")
            entry = {"name": name}
            systems[name] = entry
            try:
                t0 = time.monotonic()
                sysm = STARTERS[name](R, mocks)
                entry["start_s"] = round(time.monotonic() - t0, 2)
            except R.HarnessError as e:
                entry["skipped"] = str(e)[:500]
                R.log(f"s7 {name}: skipped: {e}")
                continue
            try:
                time.sleep(0.3)
                entry["idle_rss_bytes"] = R.proc_status(sysm.proc.pid).get("VmRSS")
                entry["note"] = sysm.note
                entry["closed"] = closed_runs(R, lg, sysm, mocks, opts)
                entry["sweep"] = sweep_system(R, lg, sysm, mocks, opts)
                if name == "portkey" and entry["closed"][1]["errors"]["total"]:
                    entry["note"] += "; streaming errors even with the preload"
            except R.HarnessError as e:
                entry["failed"] = str(e)[:800]
                R.log(f"s7 {name}: failed: {e}")
            finally:
                entry["log_tail"] = sysm.proc.log_tail(400)
                sysm.proc.stop()
    finally:
        for m in mocks.values():
            m.stop()
    md, summary = render(R, systems, opts, env)
    charts = chart(R, systems, env)
    md += "\n" + "\n".join(f"![{c}]({c})" for c in charts) + "\n"
    R.write_results("s7-small", env, {"systems": systems, "charts": charts, "summary": summary,
                                      "options": R._opts_json(opts)}, md, opts)
    return 0


def _ok(e, stream):
    c = e.get("closed")
    return c[1 if stream else 0] if c else None


def render(R, systems, opts, env):
    rg = systems.get("ringgate", {})
    rows = []
    for name, e in systems.items():
        if "skipped" in e or "failed" in e:
            rows.append([name, "—", "—", "—", "—", "—", "—", "—", "—", "—",
                         (e.get("skipped") or e.get("failed"))[:120].replace("|", "/")])
            continue
        ns, st = _ok(e, False), _ok(e, True)
        c = e["sweep"]["ceilings"]

        def ratio(a, b):
            return f"{a / b:.2f}×" if a and b else "-"

        rg_ns, rg_c = _ok(rg, False) if rg.get("closed") else None, \
            (rg.get("sweep") or {}).get("ceilings", {})
        stream_cell = (f"{R.frps(st['served_rps'])} / {R.fms(R.pct(st['ttft_us'], 'p50'), 3)}"
                       if not st["errors"]["total"] else
                       f"**FAILS** ({R.errs_str({'errors': st['errors']})})")
        rows.append([
            name, R.fmb(e.get("idle_rss_bytes")),
            f"{R.frps(ns['served_rps'])}" + ("" if not ns["errors"]["total"] else
                                             f" (**errors {ns['errors']['total']}**)"),
            R.fms(R.pct(ns["latency_us"], "p50"), 3), R.fms(R.pct(ns["latency_us"], "p99"), 3),
            stream_cell, c["100ms"]["text"], c["5ms"]["text"], c["1ms"]["text"],
            f"c=10 {ratio(ns['served_rps'], rg_ns and rg_ns['served_rps'])}, ceiling "
            f"{ratio(c['100ms']['rps'], rg_c.get('100ms', {}).get('rps'))}",
            (e.get("note") or "").replace("|", "/"),
        ])
    md = R.md_header("S7 side by side — small", env,
                     "- Same run, same mocks (instant for c=10, seed for the S1 sweep) on CPU 1, "
                     "each system alone on CPU 0; direct baseline interleaved in every run.\n"
                     f"- c=10 runs: {opts['requests']:,} requests per path (LiteLLM: "
                     f"{min(opts['requests'], 1000):,}); S1 sweep: {opts['step_duration']} s steps"
                     f" after {opts['warmup']} s warm-up.\n"
                     "- Errors count as failures: a system answering non-2xx fast is not fast.\n")
    md += R.md_table(["system", "idle RSS MiB", "c=10 req/s", "c=10 p50 ms", "c=10 p99 ms",
                      "c=10 stream req/s / TTFT p50 ms", "S1 ceiling <100 ms", "< 5 ms",
                      "< 1 ms", "ratio vs ringgate", "notes"], rows) + "\n"
    summary = []
    for name, e in systems.items():
        if e.get("sweep"):
            summary.append(f"{name} {e['sweep']['ceilings']['100ms']['text']}")
    for name, e in systems.items():
        if e.get("sweep"):
            md += f"\n## {name}: S1-small sweep (stopped: {e['sweep']['stop_reason']})\n\n"
            md += R.md_table(
                ["offered", "served", "direct p99", "gw p50", "gw p99", "added p50",
                 "added p99", "errors", "CPU %", "peak RSS MiB", "harness-bound"],
                [[f"{r['offered_rps']:,}", R.frps(r["served_rps"]),
                  R.fms(R.pct(r["direct"]["latency_us"], "p99")),
                  R.fms(R.pct(r["gateway"]["latency_us"], "p50")),
                  R.fms(R.pct(r["gateway"]["latency_us"], "p99")),
                  R.fms(((r["added_us"] or {}).get("latency") or {}).get("p50"), 3),
                  R.fms(((r["added_us"] or {}).get("latency") or {}).get("p99"), 3),
                  R.errs_str({"errors": r["gateway"]["errors"],
                              "unfinished": r["gateway"]["unfinished"]}),
                  r["gateway_proc"]["cpu_pct"], R.fmb(r["gateway_proc"]["peak_rss_bytes"]),
                  "yes" if r["harness_bound"] else ""] for r in e["sweep"]["rows"]]) + "\n"
    return md, "S1-small ceilings: " + ", ".join(summary)


def chart(R, systems, env):
    ser = []
    for name, e in systems.items():
        if e.get("sweep"):
            ser.append((f"{name} added p99",
                        [(r["offered_rps"],
                          max(((r["added_us"] or {}).get("latency") or {}).get("p99", 0), 1) / 1000)
                         for r in e["sweep"]["rows"] if (r["added_us"] or {}).get("latency")],
                        False))
    c1 = R.svg_chart(os.path.join(R.RESULTS, "s7-small-added-p99.svg"),
                     "S7: added p99 vs offered RPS (seed mock, small, non-stream)", ser,
                     "offered RPS (log)", "added p99, ms (log)", logx=True, logy=True,
                     stamp=R.chart_stamp(env), hlines=[("100 ms", 100), ("5 ms", 5), ("1 ms", 1)])
    ser = [(f"{name}", [(r["offered_rps"], (r["gateway_proc"]["peak_rss_bytes"] or 0) / (1 << 20))
                        for r in e["sweep"]["rows"]], False)
           for name, e in systems.items() if e.get("sweep")]
    c2 = R.svg_chart(os.path.join(R.RESULTS, "s7-small-rss.svg"),
                     "S7: peak RSS vs offered RPS", ser, "offered RPS (log)", "peak RSS, MiB",
                     logx=True, logy=True, stamp=R.chart_stamp(env))
    return [c1, c2]
