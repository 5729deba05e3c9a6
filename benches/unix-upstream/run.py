#!/usr/bin/env python3
"""Unix-socket vs TCP-loopback upstream (issue 23, "options that change the kernel work").

USAGE
  benches/unix-upstream/run.py [--bin PATH] [--loadgen PATH] [--duration SECS] [--trials N]
                               [--quick] [--json FILE] [--out FILE.md]

One ringgate (shards = 1) alone on CPU 0 with four models: `small-tcp` / `small-unix` and
`paced-tcp` / `paced-unix`. Each pair reaches the *same* upstream server, once over TCP
loopback (`base_url = "http://127.0.0.1:PORT/v1"`) and once over a Unix socket
(`base_url = "unix:/tmp/…/small.sock:/v1"`): nginx on CPU 1 listens on both for each server,
`small` answering a fixed chat completion itself (`return 200`), `paced` proxying (keepalive,
no buffering) to `ringgate mock --profile paced` (one event every 20 ms, 100 output tokens).
Only the gateway's upstream socket family differs between the two models of a pair.

Cells, each trial interleaved (tcp, unix, unix, tcp, ...) so load drift hits both:
  small   wrk -t1 -c50, small non-stream requests, CPU µs per request
  paced   loadgen --stream, c = 200 streams, CPU µs per SSE event, inter-event gap p99
CPU = utime + stime of the gateway (/proc/PID/stat) over the cell. The load average is
printed per cell. Prints a Markdown table (and writes it to --out); --json keeps raw figures.
"""

import importlib.machinery
import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
_loader = importlib.machinery.SourceFileLoader("bench_run", os.path.join(ROOT, "benches", "run"))
_spec = importlib.util.spec_from_loader("bench_run", _loader)
R = importlib.util.module_from_spec(_spec)
_loader.exec_module(R)

CLK = os.sysconf("SC_CLK_TCK")
OUTPUT_TOKENS = 100
CHAT = ('{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
        '"message":{"role":"assistant","content":"Hello there, this is a short answer."},'
        '"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":9,'
        '"total_tokens":18}}')




def nginx_conf(d, ports, socks, paced_port):
    return R.nginx_head(d) + f"""    keepalive_requests 1000000;
    upstream paced {{ server 127.0.0.1:{paced_port}; keepalive 4096;
                     keepalive_requests 1000000; }}
    server {{
        listen 127.0.0.1:{ports['small']} backlog=65535;
        listen unix:{socks['small']} backlog=65535;
        location / {{ default_type application/json; return 200 '{CHAT}'; }}
    }}
    server {{
        listen 127.0.0.1:{ports['paced']} backlog=65535;
        listen unix:{socks['paced']} backlog=65535;
        location / {{
            proxy_pass http://paced;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


def gateway_config(port, ports, socks):
    lines = ["[server]", f'listen = "127.0.0.1:{port}"', "shards = 1",
             "max_connections_per_address = 0", ""]
    for up in ("small", "paced"):
        for fam, base in (("tcp", f"http://127.0.0.1:{ports[up]}/v1"),
                          ("unix", f"unix:{socks[up]}:/v1")):
            name = f"{up}-{fam}"
            lines += ["[[provider]]", f'name = "{name}"', 'kind = "openai"',
                      f'base_url = "{base}"', "", "[[model]]", f'name = "{name}"',
                      f'provider = "{name}"', ""]
    return "\n".join(lines)


def wrk_script(model):
    path = os.path.join(R.tmpdir(), f"{model}.lua")
    with open(path, "w") as f:
        f.write(f"""wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{{"model":"{model}","max_tokens":16,"messages":[{{"role":"user","content":"hi"}}]}}'
""")
    return path


def run_wrk(url, model, conns, secs):
    argv = R.pin(R.HARNESS_CPU, ["wrk", "-t1", f"-c{conns}", f"-d{secs}s",
                                 "-s", wrk_script(model), url + "/v1/chat/completions"])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=secs + 120)
    import re
    m = re.search(r"(\d+) requests in", r.stdout)
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", r.stdout)
    if not m:
        raise R.HarnessError(f"wrk failed: {shlex.join(argv)}\n{r.stdout[-800:]}{r.stderr[-800:]}")
    return int(m.group(1)), int(errs.group(1)) if errs else 0, shlex.join(argv)


def events_per_stream(mock):
    body = json.dumps({"model": "m", "stream": True, "max_tokens": OUTPUT_TOKENS,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    st, raw = R.http_post(mock.port, "/v1/chat/completions", body, timeout=30.0)
    if st != 200:
        raise R.HarnessError(f"mock stream probe: {st}")
    return raw.count(b"\ndata: ") + raw.startswith(b"data: ")


def cpu_us(pid):
    return R.proc_cpu_ticks(pid) * 1e6 / CLK


def main(argv):
    binary, lgpath, dur, trials, quick, jpath, outp = R.RINGGATE, None, 8.0, 3, False, None, None
    streams = 200
    it = iter(argv)
    for a in it:
        if a == "--bin":
            binary = os.path.abspath(next(it))
        elif a == "--loadgen":
            lgpath = os.path.abspath(next(it))
        elif a == "--duration":
            dur = float(next(it))
        elif a == "--trials":
            trials = int(next(it))
        elif a == "--quick":
            quick, dur, trials = True, 3.0, 1
        elif a == "--json":
            jpath = next(it)
        elif a == "--out":
            outp = next(it)
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            raise SystemExit(f"unknown option {a!r}")
    R.RINGGATE = binary
    lg = R.Loadgen(lgpath or R.newest_loadgen())
    R.raise_nofile()
    env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": R.cpu_model(),
           "kernel": os.uname().release, "binary_sha256": R.file_sha(binary),
           "nginx": subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip(),
           "argv": "benches/unix-upstream/run.py " + shlex.join(argv)}
    paced = R.start_mock("paced", "-unix")
    per_stream = events_per_stream(paced)
    env["events_per_stream"] = per_stream
    d = os.path.join(R.tmpdir(), "nginx")
    os.makedirs(d, exist_ok=True)
    ports = {"small": R.free_port(), "paced": R.free_port()}
    socks = {k: os.path.join(d, f"{k}.sock") for k in ports}
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(nginx_conf(d, ports, socks, paced.port))
    R.Proc("upstream-nginx", R.pin(R.HARNESS_CPU, ["nginx", "-c", conf, "-p", d]),
           port=ports["paced"])
    gport = R.free_port()
    cfg = os.path.join(R.tmpdir(), "gateway.toml")
    with open(cfg, "w") as f:
        f.write(gateway_config(gport, ports, socks))
    gw = R.Proc("ringgate", R.pin(R.GW_CPU, [binary, "--config", cfg]), port=gport,
                env=R.GATEWAY_ENV)
    url = f"http://127.0.0.1:{gport}"
    for model in ("small-tcp", "small-unix", "paced-tcp", "paced-unix"):  # warm pools
        lg.run(url, None, "warm", ["--concurrency", 4, "--requests", 40, "--warmup", 0,
                                   "--model", model])
    rows = []
    for t in range(trials):
        order = ("tcp", "unix") if t % 2 == 0 else ("unix", "tcp")
        for fam in order:
            la, c0 = R.loadavg(), cpu_us(gw.pid)
            n, bad, cmd = run_wrk(url, f"small-{fam}", 50, int(dur))
            cpu = cpu_us(gw.pid) - c0
            rows.append({"cell": "small c=50", "family": fam, "trial": t, "loadavg": la,
                         "units": n, "errors": bad, "cpu_us": cpu, "per_unit_us": cpu / max(1, n),
                         "rps": n / dur, "cmd": cmd})
        for fam in order:
            la, c0 = R.loadavg(), cpu_us(gw.pid)
            res = lg.run(url, None, f"paced-{fam}",
                         ["--stream", "--concurrency", streams, "--duration", dur, "--warmup", 1,
                          "--output-tokens", OUTPUT_TOKENS, "--connections", streams + 16,
                          "--idle-timeout-ms", 30000, "--model", f"paced-{fam}"],
                         timeout_s=dur + 300)
            cpu = cpu_us(gw.pid) - c0
            tg = R.tgt(res)
            w = tg.get("warmup") or {}
            n = (tg["completed_ok"] + tg["errors"]["total"] + (w.get("ok") or 0)
                 + (w.get("errors") or 0))
            ev = n * per_stream
            rows.append({"cell": f"paced streams c={streams}", "family": fam, "trial": t,
                         "loadavg": la, "units": ev, "errors": tg["errors"]["total"],
                         "cpu_us": cpu, "per_unit_us": cpu / max(1, ev),
                         "gap_p99_us": R.pct(tg.get("inter_chunk_us"), "p99"),
                         "cmd": res["_argv"]})
    out = [f"Run {env['date']}, {env['cpu']}, kernel {env['kernel']}, {env['nginx']}; "
           f"load average at start {R.loadavg()}.", "",
           "| cell | trial | TCP µs/unit | Unix µs/unit | Unix / TCP | TCP units/s | Unix units/s | load |",
           "|---|---|---|---|---|---|---|---|"]
    summary = {}
    for cell in dict.fromkeys(r["cell"] for r in rows):
        for t in range(trials):
            by = {r["family"]: r for r in rows if r["cell"] == cell and r["trial"] == t}
            tcp, unx = by["tcp"], by["unix"]
            ratio = unx["per_unit_us"] / tcp["per_unit_us"]
            summary.setdefault(cell, []).append(ratio)
            out.append(f"| {cell} | {t + 1} | {tcp['per_unit_us']:.2f} | {unx['per_unit_us']:.2f} "
                       f"| {ratio:.3f} | {tcp['units'] / dur:.0f} | {unx['units'] / dur:.0f} "
                       f"| {tcp['loadavg']} |")
    out.append("")
    for cell, rs in summary.items():
        out.append(f"- {cell}: Unix / TCP CPU per unit, median of {len(rs)} trial(s): "
                   f"{statistics.median(rs):.3f}")
    errs = sum(r["errors"] for r in rows)
    out.append(f"- errors over all cells: {errs}")
    text = "\n".join(out)
    print(text)
    if outp:
        with open(outp, "w") as f:
            f.write(R.portable(text) if hasattr(R, "portable") else text)
    if jpath:
        with open(jpath, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
