#!/usr/bin/env python3
"""The ceiling prototype's bench (issue 23): the raw io_uring relay against the monoio skeleton
of the same logic (and, for scale, nginx `proxy_pass` and optionally ringgate) on one pinned core.

USAGE
  benches/ceiling/run.py [--conns 50,500,2000] [--duration SECS] [--trials N] [--rate R]
                         [--ringgate PATH] [--defer] [--no-counters] [--json FILE]
                         [--out FILE.md]

  --rate R   pace wrk to about R req/s at every connection count (each connection waits
             c × 1000 / R ms between requests: every system gets the same offered load, so
             CPU per request compares at equal batching); default closed loop (as fast as
             the harness goes: CPU 1 is the limit, not the proxy)

Builds nothing: `cargo build --release --manifest-path benches/ceiling/Cargo.toml` first
(target dir benches/ceiling/target). Placement: the proxy under test alone on CPU 0; the
upstream (nginx, one worker, `return 200` of a 330-byte chat completion, keep-alive without
limits) and the load (wrk -t1, small POST of a chat request) on CPU 1. Every system talks to
the same upstream. Per cell and trial: a 1 s wrk warm-up at the cell's connection count, then
the measured wrk run; CPU = delta of the proxy's run time (sum of /proc/PID/task/*/schedstat,
ns) over the measured run, divided by wrk's completed requests. Trials interleave the systems
(the order rotates per cell and trial). Reported: req/s and CPU µs per request per system
(median of trials), and the ratios of the medians; the load average is printed per cell.
Then (unless --no-counters) one more wrk run per system and cell under `perf stat -p PID`:
syscalls, io_uring SQEs (`io_uring_submit_req`), poll arms (`io_uring_poll_arm`: an
operation that found nothing and waits), task-work runs and context switches per request —
load-independent, unlike the CPU figures.

Systems: `uring` (src/bin/uring.rs: multishot accept into registered files, multishot receive
on a provided-buffer ring, one send per message, POLL_FIRST upstream receive), `uring-defer`
(the same + IORING_SETUP_DEFER_TASKRUN, with --defer), `mono` (src/bin/mono.rs: monoio 0.2.4
as the gateway builds it), `mono-defer` (the same + DEFER_TASKRUN, with --defer: the flag
alone, which monoio's `uring_builder` accepts today), `nginx` (proxy_pass, keepalive upstream, 1 worker), `ringgate`
(with --ringgate: the product, shards = 1, one openai provider on the same upstream).
"""

import json
import os
import re
import resource
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(HERE, "target", "release")
ANSWER = ('{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"instant",'
          '"choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the '
          'upstream, sixteen tokens or so of answer."},"finish_reason":"stop"}],'
          '"usage":{"prompt_tokens":9,"completion_tokens":16,"total_tokens":25}}')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"port {port} not listening")


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def runtime_ns(pid):
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
        except (OSError, ValueError):
            pass
    return total


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Procs:
    def __init__(self):
        self.procs = []
        self.dir = tempfile.mkdtemp(prefix="ceiling-")

    def start(self, name, cpu, argv, port, env=None):
        log = open(os.path.join(self.dir, f"{name}.log"), "w")
        p = subprocess.Popen(["taskset", "-c", str(cpu)] + argv, stdout=log, stderr=log,
                             env=dict(os.environ, **(env or {})), start_new_session=True)
        self.procs.append(p)
        wait_port(port, p)
        return p

    def stop(self):
        for p in self.procs:  # only what this runner started, by PID
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()


def nginx_upstream(d, port):
    return f"""master_process off; daemon off; worker_processes 1; worker_rlimit_nofile 20000;
error_log {d}/up-error.log warn; pid {d}/up.pid;
events {{ worker_connections 16000; multi_accept on; }}
http {{
  access_log off; tcp_nodelay on; keepalive_requests 100000000; keepalive_timeout 3600s;
  # the raw relay connects its whole pool at start: a connection that has not sent its first
  # request yet is under client_header_timeout (60 s), not keepalive_timeout
  client_header_timeout 3600s;
  client_body_temp_path {d}/up-body;
  server {{ listen 127.0.0.1:{port} backlog=65535; default_type application/json;
           location / {{ return 200 '{ANSWER}'; }} }}
}}
"""


def nginx_proxy(d, port, up):
    return f"""master_process off; daemon off; worker_processes 1; worker_rlimit_nofile 20000;
error_log {d}/px-error.log warn; pid {d}/px.pid;
events {{ worker_connections 16000; multi_accept on; }}
http {{
  access_log off; tcp_nodelay on; keepalive_requests 100000000; keepalive_timeout 3600s;
  client_body_temp_path {d}/px-body; proxy_temp_path {d}/px-proxy;
  upstream up {{ server 127.0.0.1:{up}; keepalive 4096; keepalive_requests 100000000;
                keepalive_timeout 3600s; }}
  server {{ listen 127.0.0.1:{port} backlog=65535;
    location / {{ proxy_pass http://up; proxy_http_version 1.1;
                 proxy_set_header Connection ""; proxy_buffering off;
                 proxy_request_buffering off; }} }}
}}
"""


def ringgate_conf(port, up):
    return f"""[server]
listen = "127.0.0.1:{port}"
shards = 1
max_connections_per_address = 0

[[provider]]
name = "instant"
kind = "openai"
base_url = "http://127.0.0.1:{up}/v1"

[[model]]
name = "instant"
provider = "instant"
"""


def wrk_script(d, delay_ms=0):
    path = os.path.join(d, f"chat-{delay_ms}.lua")
    with open(path, "w") as f:
        if delay_ms:
            # paced: each connection waits delay_ms between requests (rate ≈ c × 1000 / delay)
            f.write(f"function delay() return {delay_ms} end\n")
        f.write("""wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
wrk.body = '{"model":"instant","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}'
""")
    return path


def wrk(url, conns, secs, script):
    argv = ["taskset", "-c", "1", "wrk", "-t1", f"-c{conns}", f"-d{secs}s", "-s", script,
            url + "/v1/chat/completions"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=secs + 60)
    m = re.search(r"(\d+) requests in", r.stdout)
    if not m:
        raise SystemExit(f"wrk failed: {shlex.join(argv)}\n{r.stdout}{r.stderr}")
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", r.stdout)
    sock = re.search(r"Socket errors: (.*)", r.stdout)
    return {"requests": int(m.group(1)), "non2xx": int(bad.group(1)) if bad else 0,
            "socket_errors": sock.group(1) if sock else "", "argv": shlex.join(argv[3:])}


COUNTERS = ["raw_syscalls:sys_enter", "syscalls:sys_enter_io_uring_enter",
            "io_uring:io_uring_submit_req", "io_uring:io_uring_poll_arm",
            "io_uring:io_uring_task_work_run", "io_uring:io_uring_local_work_run",
            "context-switches"]


def counted(pid, url, c, secs, script, d):
    out = os.path.join(d, f"perf-{pid}-{c}.txt")
    argv = ["perf", "stat", "-x", ",", "-o", out, "-p", str(pid)]
    for e in COUNTERS:
        argv += ["-e", e]
    p = subprocess.Popen(argv + ["--", "sleep", str(secs + 1)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    w = wrk(url, c, secs, script)
    p.wait()
    n = max(1, w["requests"])
    per = {}
    for line in open(out):
        f = line.strip().split(",")
        if len(f) >= 3 and f[0].replace(".", "").isdigit():
            per[f[2].split(":")[-1]] = int(float(f[0])) / n
    return per


def main(argv):
    conns, dur, trials, rg, defer, jpath, outp = [50, 500, 2000], 8, 3, None, False, None, None
    counters, rate = True, 0
    it = iter(argv)
    for a in it:
        if a == "--conns":
            conns = [int(x) for x in next(it).split(",")]
        elif a == "--duration":
            dur = int(next(it))
        elif a == "--trials":
            trials = int(next(it))
        elif a == "--ringgate":
            rg = os.path.abspath(next(it))
        elif a == "--defer":
            defer = True
        elif a == "--rate":
            rate = int(next(it))
        elif a == "--no-counters":
            counters = False
        elif a == "--json":
            jpath = next(it)
        elif a == "--out":
            outp = next(it)
        else:
            print(__doc__)
            return 0 if a in ("-h", "--help") else 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run `finally`: stop the children
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    P = Procs()
    d = P.dir
    scripts = {c: wrk_script(d, round(c * 1000 / rate) if rate else 0) for c in conns}
    try:
        up = free_port()
        with open(f"{d}/up.conf", "w") as f:
            f.write(nginx_upstream(d, up))
        P.start("upstream", 1, ["nginx", "-c", f"{d}/up.conf", "-p", d], up)
        systems = {}
        pool = str(max(conns) + 100)
        variants = [("uring", [])] + ([("uring-defer", ["--defer"])] if defer else [])
        for name, extra in variants:
            port = free_port()
            p = P.start(name, 0, [os.path.join(BIN, "uring"), "--listen", f"127.0.0.1:{port}",
                                  "--upstream", f"127.0.0.1:{up}", "--pool", pool] + extra, port)
            systems[name] = (p, port)
        for name, extra in [("mono", [])] + ([("mono-defer", ["--defer"])] if defer else []):
            port = free_port()
            systems[name] = (P.start(name, 0, [os.path.join(BIN, "mono"), "--listen",
                                               f"127.0.0.1:{port}", "--upstream",
                                               f"127.0.0.1:{up}", "--pool", pool] + extra, port),
                             port)
        port = free_port()
        with open(f"{d}/px.conf", "w") as f:
            f.write(nginx_proxy(d, port, up))
        systems["nginx"] = (P.start("nginx", 0, ["nginx", "-c", f"{d}/px.conf", "-p", d], port),
                            port)
        if rg:
            port = free_port()
            with open(f"{d}/rg.toml", "w") as f:
                f.write(ringgate_conf(port, up))
            systems["ringgate"] = (P.start("ringgate", 0, [rg, "--config", f"{d}/rg.toml"], port,
                                           env={"MIMALLOC_ALLOW_THP": "0",
                                                "MIMALLOC_PURGE_DELAY": "10"}), port)
        names = list(systems)
        rows = []
        for t in range(trials):
            for ci, c in enumerate(conns):
                k = (t + ci) % len(names)
                for name in names[k:] + names[:k]:
                    p, port = systems[name]
                    url = f"http://127.0.0.1:{port}"
                    wrk(url, c, 1, scripts[c])  # warm-up: connections and pools at this count
                    la = loadavg()
                    ns0 = runtime_ns(p.pid)
                    w = wrk(url, c, dur, scripts[c])
                    cpu_ns = runtime_ns(p.pid) - ns0
                    n = max(1, w["requests"])
                    row = {"trial": t, "conns": c, "system": name, "loadavg": la,
                           "requests": w["requests"], "rps": w["requests"] / dur,
                           "cpu_us_per_req": cpu_ns / 1000 / n, "cpu_share": cpu_ns / 1e9 / dur,
                           "non2xx": w["non2xx"], "socket_errors": w["socket_errors"],
                           "rss_kib": rss_kib(p.pid)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        crows = []
        if counters:
            for c in conns:
                for name in names:
                    p, port = systems[name]
                    url = f"http://127.0.0.1:{port}"
                    wrk(url, c, 1, scripts[c])
                    crows.append({"conns": c, "system": name,
                                  "per_request": counted(p.pid, url, c, 4, scripts[c], d)})
                    print(json.dumps(crows[-1]), flush=True)
        text = (f"Load: wrk -t1, {'paced to %d req/s' % rate if rate else 'closed loop'}.\n\n"
                + report(rows, names, conns, dur, trials) + counter_table(crows))
        print(text)
        if outp:
            open(outp, "w").write(text)
        if jpath:
            json.dump({"rows": rows, "counters": crows, "argv": "benches/ceiling/run.py " + shlex.join(argv)},
                      open(jpath, "w"), indent=1)
    finally:
        P.stop()
    return 0


def report(rows, names, conns, dur, trials):
    out = ["| c | " + " | ".join(f"{n} req/s" for n in names) + " | "
           + " | ".join(f"{n} µs/req" for n in names) + " | uring / mono (CPU) | "
           + "uring / nginx (CPU) | mono / nginx (CPU) | errors | load avg (first trial) |",
           "|---" * (6 + 2 * len(names)) + "|"]
    for c in conns:
        by = {n: [r for r in rows if r["conns"] == c and r["system"] == n] for n in names}
        med = {n: statistics.median(r["cpu_us_per_req"] for r in by[n]) for n in names}
        rps = {n: statistics.median(r["rps"] for r in by[n]) for n in names}
        errs = sum(r["non2xx"] for n in names for r in by[n])
        se = "; ".join(sorted({r["socket_errors"] for n in names for r in by[n]
                               if r["socket_errors"]}))
        la = by[names[0]][0]["loadavg"]
        out.append(f"| {c} | " + " | ".join(f"{rps[n]:,.0f}" for n in names) + " | "
                   + " | ".join(f"{med[n]:.2f}" for n in names) + " | "
                   + f"{med['uring'] / med['mono']:.2f} | {med['uring'] / med['nginx']:.2f} | "
                   + f"{med['mono'] / med['nginx']:.2f} | {errs}{' ' + se if se else ''} | {la} |")
    out.append("")
    out.append(f"Median of {trials} interleaved trials, {dur} s measured each; CPU = proxy run "
               "time (schedstat) over the measured run / requests.")
    per = ["", "Per trial, uring / mono CPU per request: "]
    for c in conns:
        rs = []
        for t in range(trials):
            g = {r["system"]: r["cpu_us_per_req"] for r in rows if r["conns"] == c
                 and r["trial"] == t}
            rs.append(f"{g['uring'] / g['mono']:.2f}")
        per.append(f"c={c}: {', '.join(rs)}; ")
    out.append("".join(per))
    return "\n".join(out)


def counter_table(crows):
    if not crows:
        return ""
    out = ["", "", "Per request (perf stat on the proxy over a 4 s wrk run; load-independent):", "",
           "| c | system | syscalls | io_uring_enter | SQEs | poll arms | task-work runs "
           "(+ local) | context switches |", "|---|---|---|---|---|---|---|---|"]
    for r in crows:
        p = r["per_request"]
        out.append(f"| {r['conns']} | {r['system']} | {p.get('sys_enter', 0):.2f} | "
                   f"{p.get('sys_enter_io_uring_enter', 0):.2f} | "
                   f"{p.get('io_uring_submit_req', 0):.2f} | {p.get('io_uring_poll_arm', 0):.2f} | "
                   f"{p.get('io_uring_task_work_run', 0):.2f} + "
                   f"{p.get('io_uring_local_work_run', 0):.2f} | "
                   f"{p.get('context-switches', 0):.3f} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
