#!/usr/bin/env python3
"""LLM-shaped load (issue 23): ringgate next to nginx `proxy_pass` in one run, one pinned core.

USAGE
  benches/llm-load/run.py [--bin PATH[=LABEL]]... [--loadgen PATH] [--what LIST]
                          [--duration SECS] [--quick] [--json FILE] [--out FILE.md]

  --bin PATH[=LABEL]  a ringgate binary (repeatable: e.g. the old one, then the new one);
                      default target/release/ringgate. For allocation counts and a profile use
                      a binary with symbols (`cargo build --profile profiling`).
  --loadgen PATH      the load generator (default: newest target/release/deps/loadgen-*)
  --what LIST         comma-separated parts: timing, syscalls, callgrind, profile [all]
  --duration SECS     measured seconds per timing cell                             [8]
  --quick             smaller cells (a check that the runner works, ~1 min)
  --no-nginx          leave nginx out (an A/B of ringgate binaries only; its figures are
                      in the pages of earlier runs)

Placement: the proxy under test (each ringgate binary, shards = 1, and nginx, one worker,
`master_process off`) alone on CPU 0; the mocks (`ringgate mock`, one shard each: `paced` =
one event every 20 ms, `instant` = every event as fast as it is written) and the load
generators (benches/loadgen, wrk) on CPU 1. The same mocks serve every system. Cells:

  timing (wall-clock, depends on the machine's load; the load average is printed per cell):
    paced streams   c = 200, 2000  (loadgen closed loop, --stream, 100 output tokens)
    batched streams c = 50, 500    (instant mock)
    bodies          2 / 20 / 100 KB request bodies, non-stream, c = 50 (wrk)
    connections     small non-stream requests at c = 50 / 500 / 2000 (wrk)
    counters: CPU per request or per SSE event (utime + stime of /proc/PID/stat over the
    cell, warm-up included in both the CPU and the count); RSS per open stream (VmRSS in the
    middle of the paced cell minus VmRSS before it, divided by the open streams).
  syscalls (load-independent): `perf stat -e raw_syscalls:sys_enter,...` on the proxy over a
    wrk run of small requests at c = 50 and over batched streams: syscalls, recvfrom and
    io_uring_enter per request, io_uring SQEs (`io_uring_submit_req`), poll arms
    (`io_uring_poll_arm`: an operation that found nothing and waits), context switches, and
    TCP segments per request (Δ OutSegs of /proc/net/snmp over the run, every loopback
    segment of the machine: client → proxy → upstream and back; other traffic on the box
    counts too, so it is an upper bound on a shared machine).
  profile (needs symbols): `perf record -e cpu-clock -p PID` on the proxy over small requests
    (wrk, c = 50) and batched streams (c = 50); self samples bucketed kernel TCP/IP /
    io_uring / timers / syscall entry / scheduler / kernel memory+copies / other kernel, and
    user space: parse / JSON / vetting / metrics / logging / allocator / memcpy / runtime /
    other; µs per unit = share × the CPU per unit measured over the same window.
  callgrind (load-independent): each proxy under `valgrind --tool=callgrind --dump-instr=no`,
    two runs with N1 and N2 requests (or streams); instructions per request / per SSE event =
    (Ir(N2) - Ir(N1)) / (N2 - N1) (start-up and shutdown cancel out), and allocations per
    request from the call counts of the allocator's entry points (mimalloc `mi_*alloc*` for
    ringgate, libc `malloc`/`calloc`/`realloc`/`posix_memalign` for nginx) called from outside
    the allocator. The N2 profile of each system is kept (`--keep-profiles DIR`) for
    `callgrind_annotate`.

Prints Markdown tables (and writes them to --out); --json keeps every raw figure.
"""

import importlib.machinery
import importlib.util
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

_loader = importlib.machinery.SourceFileLoader("bench_run", os.path.join(ROOT, "benches", "run"))
_spec = importlib.util.spec_from_loader("bench_run", _loader)
R = importlib.util.module_from_spec(_spec)
_loader.exec_module(R)

OUTPUT_TOKENS = 100
CLK = os.sysconf("SC_CLK_TCK")




def rss(pid):
    return R.proc_status(pid).get("VmRSS")


# ------------------------------------------------------------------ systems

class System:
    def __init__(self, name, proc, url, note=""):
        self.name, self.proc, self.url, self.note = name, proc, url, note

    @property
    def pid(self):
        return self.proc.pid


def ringgate_config(port, mocks):
    return f"""[server]
listen = "127.0.0.1:{port}"
shards = 1
max_connections_per_address = 0

[[provider]]
name = "instant"
kind = "openai"
base_url = "{R.mock_url(mocks['instant'])}/v1"

[[provider]]
name = "paced"
kind = "openai"
base_url = "{R.mock_url(mocks['paced'])}/v1"

[[model]]
name = "instant"
provider = "instant"

[[model]]
name = "paced"
provider = "paced"
"""


def start_ringgate(binary, label, mocks, wrap=()):
    port = R.free_port()
    cfg = os.path.join(R.tmpdir(), f"llm-{label}-{port}.toml")
    with open(cfg, "w") as f:
        f.write(ringgate_config(port, mocks))
    argv = list(wrap) + [binary, "--config", cfg]
    p = R.Proc(f"llm-{label}", R.pin(R.GW_CPU, argv), port=port, env=R.GATEWAY_ENV,
               ready_timeout=60.0 if wrap else 10.0)
    return System(label, p, f"http://127.0.0.1:{port}")


def nginx_conf(d, port, mocks):
    # One listener; the model picks the upstream as ringgate's routes do (a location per path
    # would change nothing: the body is not looked at). The load generators send
    # model "instant" or "paced" to /v1/chat/completions; nginx routes by a header instead.
    return R.nginx_head(d) + f"""    client_max_body_size 64m;
    client_body_buffer_size 1m;
    upstream instant {{ server 127.0.0.1:{mocks['instant'].port}; keepalive 512;
                       keepalive_requests 1000000; }}
    upstream paced {{ server 127.0.0.1:{mocks['paced'].port}; keepalive 4096;
                     keepalive_requests 1000000; }}
    map $http_x_bench_upstream $up {{ default instant; paced paced; }}
    server {{
        listen 127.0.0.1:{port} backlog=65535;
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://$up;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


def start_nginx(mocks, wrap=()):
    if not shutil.which("nginx"):
        raise R.HarnessError("nginx not installed")
    port = R.free_port()
    d = os.path.join(R.tmpdir(), f"nginx-{port}")
    os.makedirs(d, exist_ok=True)
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(nginx_conf(d, port, mocks))
    p = R.Proc("llm-nginx", R.pin(R.GW_CPU, list(wrap) + ["nginx", "-c", conf, "-p", d]),
               port=port, ready_timeout=60.0 if wrap else 10.0)
    return System("nginx", p, f"http://127.0.0.1:{port}",
                  note="proxy_pass, keepalive upstream, 1 worker")


def model_args(upstream):
    # ringgate routes by the model; nginx by the header (it ignores the model)
    return ["--model", upstream, "--header", f"x-bench-upstream: {upstream}"]


def events_per_stream(mock):
    body = json.dumps({"model": "m", "stream": True, "max_tokens": OUTPUT_TOKENS,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    st, raw = R.http_post(mock.port, "/v1/chat/completions", body, timeout=30.0)
    if st != 200:
        raise R.HarnessError(f"mock stream probe: {st}")
    return raw.count(b"\ndata: ") + raw.startswith(b"data: ")


# ------------------------------------------------------------------ load

def attempted(t):
    w = t.get("warmup") or {}
    return (t["completed_ok"] + t["errors"]["total"] + (w.get("ok") or 0)
            + (w.get("errors") or 0))


def wrk_script(kb):
    path = os.path.join(R.tmpdir(), f"body-{kb}.lua")
    pad = max(0, kb * 1024 - 120)
    with open(path, "w") as f:
        f.write(f"""wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench"
wrk.headers["x-bench-upstream"] = "instant"
wrk.body = '{{"model":"instant","max_tokens":16,"messages":[{{"role":"user","content":"'
  .. string.rep("a", {pad}) .. '"}}]}}'
""")
    return path


def run_wrk(url, conns, secs, kb):
    argv = R.pin(R.HARNESS_CPU, ["wrk", "-t1", f"-c{conns}", f"-d{secs}s", "--latency",
                                 "-s", wrk_script(kb), url + "/v1/chat/completions"])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=secs + 120)
    m = re.search(r"(\d+) requests in", r.stdout)
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", r.stdout)
    sock = re.search(r"Socket errors: (.*)", r.stdout)
    if not m:
        raise R.HarnessError(f"wrk failed: {shlex.join(argv)}\n{r.stdout[-800:]}{r.stderr[-800:]}")
    return {"requests": int(m.group(1)), "non2xx": int(errs.group(1)) if errs else 0,
            "socket_errors": sock.group(1) if sock else "", "argv": shlex.join(argv)}


class Cell:
    """CPU ticks (and optional mid-run RSS) of one system over one load run."""

    def __init__(self, sysm, mid_rss_after=None):
        self.sysm = sysm
        self.rss0 = rss(sysm.pid)
        self.t0 = R.proc_cpu_ticks(sysm.pid)
        self.la = R.loadavg()
        self.mid = None
        if mid_rss_after is not None:
            def sample():
                time.sleep(mid_rss_after)
                self.mid = rss(sysm.pid)
            self.th = threading.Thread(target=sample, daemon=True)
            self.th.start()

    def cpu_us(self):
        return (R.proc_cpu_ticks(self.sysm.pid) - self.t0) * 1e6 / CLK


def timing(systems, lg, ev, dur, quick):
    rows = []
    warm = 1.0 if quick else 2.0
    paced = [200] if quick else [200, 2000]
    batched = [50] if quick else [50, 500]
    for c in paced:
        for s in systems:
            # the middle of the measured window: every stream open (a stream lasts ~2 s)
            cell = Cell(s, mid_rss_after=warm + dur / 2)
            d = lg.run(s.url, None, f"paced-{c}",
                       ["--stream", "--concurrency", c, "--duration", dur, "--warmup", warm,
                        "--output-tokens", OUTPUT_TOKENS, "--connections", c + 16,
                        "--idle-timeout-ms", 30000] + model_args("paced"), timeout_s=dur + 300)
            cpu = cell.cpu_us()
            cell.th.join()
            t = R.tgt(d)
            n = attempted(t)
            rows.append({"cell": f"paced streams c={c}", "system": s.name, "loadavg": cell.la,
                         "units": n * ev, "unit": "event", "cpu_us": cpu,
                         "per_unit_us": cpu / max(1, n * ev), "errors": t["errors"]["total"],
                         "rss_per_stream_kib": ((cell.mid or 0) - (cell.rss0 or 0)) / c / 1024,
                         "gap_p99_us": R.pct(t.get("inter_chunk_us"), "p99")})
    for c in batched:
        for s in systems:
            cell = Cell(s)
            d = lg.run(s.url, None, f"batched-{c}",
                       ["--stream", "--concurrency", c, "--duration", dur, "--warmup", warm,
                        "--output-tokens", OUTPUT_TOKENS, "--connections", c + 16]
                       + model_args("instant"), timeout_s=dur + 300)
            cpu = cell.cpu_us()
            t = R.tgt(d)
            n = attempted(t)
            rows.append({"cell": f"batched streams c={c}", "system": s.name, "loadavg": cell.la,
                         "units": n * ev, "unit": "event", "cpu_us": cpu,
                         "per_unit_us": cpu / max(1, n * ev), "errors": t["errors"]["total"]})
    for kb in ([2] if quick else [2, 20, 100]):
        for s in systems:
            cell = Cell(s)
            w = run_wrk(s.url, 50, int(dur), kb)
            cpu = cell.cpu_us()
            rows.append({"cell": f"body {kb} KB c=50", "system": s.name, "loadavg": cell.la,
                         "units": w["requests"], "unit": "request", "cpu_us": cpu,
                         "per_unit_us": cpu / max(1, w["requests"]), "errors": w["non2xx"],
                         "socket_errors": w["socket_errors"]})
    for c in ([50] if quick else [50, 500, 2000]):
        for s in systems:
            cell = Cell(s)
            w = run_wrk(s.url, c, int(dur), 0)
            cpu = cell.cpu_us()
            rows.append({"cell": f"connections c={c}", "system": s.name, "loadavg": cell.la,
                         "units": w["requests"], "unit": "request", "cpu_us": cpu,
                         "per_unit_us": cpu / max(1, w["requests"]), "errors": w["non2xx"],
                         "socket_errors": w["socket_errors"]})
    return rows


# ------------------------------------------------------------------ syscalls

PERF_EVENTS = ["raw_syscalls:sys_enter", "syscalls:sys_enter_recvfrom",
               "syscalls:sys_enter_io_uring_enter", "syscalls:sys_enter_epoll_wait",
               "syscalls:sys_enter_write", "syscalls:sys_enter_writev",
               "syscalls:sys_enter_read", "syscalls:sys_enter_sendto",
               "io_uring:io_uring_submit_req", "io_uring:io_uring_poll_arm", "context-switches"]


def tcp_out_segs():
    rows = [line.split() for line in open("/proc/net/snmp") if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("OutSegs")])


def perf_stat(pid, secs):
    out = os.path.join(R.tmpdir(), f"perf-{pid}-{time.monotonic_ns()}.txt")
    argv = ["perf", "stat", "-x", ",", "-o", out, "-p", str(pid)]
    for e in PERF_EVENTS:
        argv += ["-e", e]
    argv += ["--", "sleep", str(secs)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out


def read_perf(out):
    counts = {}
    for line in open(out):
        f = line.strip().split(",")
        if len(f) >= 3 and f[0].replace(".", "").isdigit():
            counts[f[2]] = int(float(f[0]))
    return counts


def syscalls(systems, lg, ev, dur):
    rows = []
    if not shutil.which("perf"):
        return rows
    for s in systems:
        # c=50 small requests with wrk; perf counts over the whole wrk run (+1 s margin)
        secs = int(dur)
        p, out = perf_stat(s.pid, secs + 1)
        time.sleep(0.3)
        seg0 = tcp_out_segs()
        w = run_wrk(s.url, 50, secs, 0)
        segs = tcp_out_segs() - seg0
        p.wait()
        c = read_perf(out)
        n = max(1, w["requests"])
        rows.append({"cell": "small requests c=50", "system": s.name, "units": n,
                     "per_unit": dict({k.split(":")[-1]: v / n for k, v in c.items()},
                                      tcp_out_segs=segs / n)})
        # batched streams, c=50: per event
        p, out = perf_stat(s.pid, secs + 3)
        time.sleep(0.3)
        seg0 = tcp_out_segs()
        d = lg.run(s.url, None, "sys-batched", ["--stream", "--concurrency", 50, "--duration",
                                                secs, "--warmup", 0, "--output-tokens",
                                                OUTPUT_TOKENS] + model_args("instant"),
                   timeout_s=secs + 120)
        segs = tcp_out_segs() - seg0
        p.wait()
        c = read_perf(out)
        n = max(1, attempted(R.tgt(d)) * ev)
        rows.append({"cell": "batched streams c=50", "system": s.name, "units": n,
                     "per_unit": dict({k.split(":")[-1]: v / n for k, v in c.items()},
                                      tcp_out_segs=segs / n)})
    return rows


# ------------------------------------------------------------------ profile

KERNEL_BUCKETS = [
    ("io_uring", r"io_uring|^__?io_|^io_"),
    ("timers", r"hrtimer|timer|^tick_|clockevent|ktime|^__?run_timer"),
    ("kernel TCP/IP", r"tcp|^__?ip_|^ip[46]|inet|^__?sk_|^sock_|^__sock|skb|^__?dev_|netif|napi|"
                      r"loopback|^__?sys_(recv|send)|^sk_|csum|^nf_|^__?neigh|^raw_|^sock"),
    ("syscall entry", r"^entry_|syscall|^__x64_sys|^do_syscall|^__do_sys"),
    ("scheduler", r"sched|switch|^pick_|enqueue|dequeue|update_curr|wake|^finish_task|idle"),
    ("kernel memory + copies", r"copy|memcpy|memset|memmove|page|folio|kmem|kmalloc|kfree|"
                               r"slab|^__?alloc|^__?free"),
]
USER_BUCKETS = [
    ("parse (HTTP head, routing fields)", r"httparse|http::head|::head::|extract|::route|request_line"),
    ("JSON", r"json|sonic"),
    ("vetting", r"vet"),
    ("metrics", r"metric|prom|counter|histogram|telemetry"),
    ("logging", r"log"),
    ("allocator", r"^_?mi_|mimalloc|malloc|^free$|^cfree|realloc|calloc|__rust_(de)?alloc|"
                  r"__rdl_|__rg_"),
    ("memcpy", r"memcpy|memmove|memset|memchr"),
    ("runtime (monoio, futures, driver)", r"monoio|io_uring|slab|futures|::task::|waker|"
                                          r"::runtime::|ngx_(event|epoll)"),
]


def bucket_of(sym, kernel):
    for name, pat in (KERNEL_BUCKETS if kernel else USER_BUCKETS):
        if re.search(pat, sym):
            return name
    return "other kernel" if kernel else "user other"


def perf_profile(pid, secs, out):
    return subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", "1999", "-p", str(pid),
                             "-o", out, "--", "sleep", str(secs)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def read_profile(path):
    r = subprocess.run(["perf", "report", "-i", path, "--no-children", "--sort", "dso,sym",
                        "--stdio", "-g", "none", "--percent-limit", "0"],
                       capture_output=True, text=True, timeout=300)
    buckets, top = {}, []
    for line in r.stdout.splitlines():
        m = re.match(r"^\s+([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*?)\s*$", line)
        if not m:
            continue
        pctv, dso, kind, sym = float(m.group(1)), m.group(2), m.group(3), m.group(4)
        kernel = kind == "k"
        b = bucket_of(sym, kernel)
        top_b = ("kernel: " if kernel else "user: ") + b
        buckets[top_b] = buckets.get(top_b, 0.0) + pctv
        top.append((pctv, dso, sym[:90]))
    return buckets, top[:15]


def profile(systems, lg, ev, dur, keep):
    rows = []
    if not shutil.which("perf"):
        return rows
    secs = int(dur)
    for s in systems:
        for cell in ("small requests c=50", "batched streams c=50"):
            path = os.path.join(keep or R.tmpdir(), f"perf.{s.name}.{cell.split()[0]}.data")
            cpu = Cell(s)
            p = perf_profile(s.pid, secs + (3 if "stream" in cell else 1), path)
            time.sleep(0.3)
            if "stream" in cell:
                d = lg.run(s.url, None, "prof-batched",
                           ["--stream", "--concurrency", 50, "--duration", secs, "--warmup", 0,
                            "--output-tokens", OUTPUT_TOKENS] + model_args("instant"),
                           timeout_s=secs + 120)
                units = attempted(R.tgt(d)) * ev
            else:
                units = run_wrk(s.url, 50, secs, 0)["requests"]
            p.wait()
            per_unit = cpu.cpu_us() / max(1, units)
            buckets, top = read_profile(path)
            rows.append({"cell": cell, "system": s.name, "per_unit_us": per_unit,
                         "buckets_pct": buckets, "top": top})
    return rows


def profile_md(rows):
    if not rows:
        return []
    out = ["### CPU-0 profile of the proxy (perf record -e cpu-clock -p PID; self samples)", "",
           "µs per unit = the bucket's share of the proxy's samples × its CPU per unit over the "
           "same window (request, or SSE event).", ""]
    names = sorted({b for r in rows for b in r["buckets_pct"]})
    heads = [f"{r['system']}, {r['cell']}" for r in rows]
    out += ["| bucket | " + " | ".join(heads) + " |", "|---" * (1 + len(rows)) + "|"]
    for b in names:
        vals = [f"{r['buckets_pct'].get(b, 0):.1f} % = {r['buckets_pct'].get(b, 0) / 100 * r['per_unit_us']:.2f}"
                for r in rows]
        out.append(f"| {b} | " + " | ".join(vals) + " |")
    out.append("| **total µs per unit** | " + " | ".join(f"{r['per_unit_us']:.2f}" for r in rows)
               + " |")
    out.append("")
    for r in rows:
        out += [f"Top self symbols, {r['system']}, {r['cell']}: " + "; ".join(
            f"{p:.1f} % {sym}" for p, _, sym in r["top"][:10]), ""]
    return out


# ------------------------------------------------------------------ callgrind

RG_ALLOC = re.compile(r"^(mi_(malloc|zalloc|calloc|realloc|heap_malloc|new)\w*|__rust_alloc\w*|"
                      r"__rust_realloc|__rdl_alloc|__rg_alloc)$")
C_ALLOC = re.compile(r"^(malloc|calloc|realloc|posix_memalign|memalign|aligned_alloc)$")


def parse_callgrind(path, alloc_re):
    """(total Ir, allocator entry calls from outside the allocator)."""
    names = {}
    total = None
    allocs = 0
    cur_fn = ""
    pending = None

    def name(ref):
        m = re.match(r"\((\d+)\)(?: (.*))?", ref)
        if not m:
            return ref
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), "")

    def short(n):
        return n.split("'")[0].split("(")[0].strip()

    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("fn="):
                cur_fn = short(name(line[3:].strip()))
            elif line.startswith("cfn="):
                pending = short(name(line[4:].strip()))
            elif line.startswith("calls=") and pending is not None:
                n = int(line[6:].split()[0])
                if alloc_re.match(pending) and not alloc_re.match(cur_fn) \
                        and not cur_fn.startswith(("mi_", "_mi_", "__libc_", "_int_")):
                    allocs += n
                pending = None
            elif line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
    return total, allocs


def stop_slowly(proc, secs=120):
    """SIGTERM, then time for valgrind to write its profile (Proc.stop kills after 5 s)."""
    if proc.alive():
        try:
            os.killpg(proc.p.pid, 15)
        except OSError:
            pass
        try:
            proc.p.wait(secs)
        except subprocess.TimeoutExpired:
            pass
    proc.stop()


def callgrind_one(make, workload, n, lg, keep=None):
    out = os.path.join(R.tmpdir(), f"cg-{time.monotonic_ns()}.out")
    wrap = ["valgrind", "--tool=callgrind", "--dump-instr=no", f"--callgrind-out-file={out}"]
    s, alloc_re = make(wrap)
    try:
        stream = workload == "stream"
        args = ["--concurrency", 10, "--requests", n, "--warmup", 0, "--output-tokens",
                OUTPUT_TOKENS if stream else 16, "--timeout-ms", 120000,
                "--idle-timeout-ms", 60000] + model_args("instant")
        if stream:
            args.append("--stream")
        lg.run(s.url, None, f"cg-{workload}", args, timeout_s=900)
    finally:
        stop_slowly(s.proc)
    total, allocs = parse_callgrind(out, alloc_re)
    if keep:
        shutil.copy(out, keep)
    return total, allocs


def callgrind(binaries, mocks, lg, ev, quick, keep_dir, nginx=True):
    rows = []
    plans = {"request": (200, 1200) if quick else (500, 3000),
             "stream": (20, 80) if quick else (50, 250)}
    makers = [(label, (lambda b, lbl: lambda wrap: (start_ringgate(b, lbl, mocks, wrap),
                                                     RG_ALLOC))(b, label))
              for b, label in binaries]
    if nginx:
        makers.append(("nginx", lambda wrap: (start_nginx(mocks, wrap), C_ALLOC)))
    for label, make in makers:
        for workload, (n1, n2) in plans.items():
            keep = None
            if keep_dir:
                keep = os.path.join(keep_dir, f"callgrind.{label}.{workload}.out")
            a = callgrind_one(make, workload, n1, lg)
            b = callgrind_one(make, workload, n2, lg, keep)
            units = (n2 - n1) * (ev if workload == "stream" else 1)
            rows.append({"system": label, "workload": workload, "n": [n1, n2],
                         "ir": [a[0], b[0]], "allocs": [a[1], b[1]],
                         "ir_per_unit": (b[0] - a[0]) / units,
                         "allocs_per_request": (b[1] - a[1]) / (n2 - n1),
                         "allocs_per_unit": (b[1] - a[1]) / units})
    return rows


# ------------------------------------------------------------------ report

def md(env, timing_rows, sys_rows, cg_rows, names, prof_rows=()):
    out = [f"Run {env['date']}, {env['cpu']}, kernel {env['kernel']}, {env['nginx']}, "
           f"load average at start {env['loadavg']}.", ""]
    if timing_rows:
        out += ["### Timing (CPU per unit; load-dependent)", "",
                "| cell | " + " | ".join(f"{n} µs/unit" for n in names)
                + " | " + " | ".join(f"{n} / nginx" for n in names if n != "nginx")
                + " | RSS KiB per open stream | inter-event gap p99 ms | load avg |",
                "|---" * (3 + 2 * len(names)) + "|"]
        cells = []
        for r in timing_rows:
            if r["cell"] not in cells:
                cells.append(r["cell"])
        for c in cells:
            by = {r["system"]: r for r in timing_rows if r["cell"] == c}
            ng = by.get("nginx", {}).get("per_unit_us")
            vals = [f"{by[n]['per_unit_us']:.2f}" if n in by else "-" for n in names]
            ratios = [f"{by[n]['per_unit_us'] / ng:.2f}" if n in by and ng else "-"
                      for n in names if n != "nginx"]
            rs = " / ".join(f"{by[n]['rss_per_stream_kib']:.1f}" for n in names
                            if n in by and "rss_per_stream_kib" in by[n]) or "-"
            gaps = " / ".join(f"{by[n]['gap_p99_us'] / 1000:.1f}" for n in names
                              if n in by and by[n].get("gap_p99_us")) or "-"
            la = by[names[0]]["loadavg"] if names[0] in by else ""
            errs = sum(r.get("errors", 0) for r in by.values())
            out.append(f"| {c}{' (errors: %d)' % errs if errs else ''} | " + " | ".join(vals)
                       + " | " + " | ".join(ratios) + f" | {rs} | {gaps} | {la} |")
        out.append("")
    if sys_rows:
        out += ["### Syscalls per unit (perf stat; load-independent)", "",
                "| cell | system | all | recvfrom | io_uring_enter | epoll_wait | "
                "write+writev+sendto | read | io_uring SQEs | poll arms | context switches | "
                "TCP segments (machine) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sys_rows:
            p = r["per_unit"]
            w = p.get("sys_enter_write", 0) + p.get("sys_enter_writev", 0) \
                + p.get("sys_enter_sendto", 0)
            out.append(f"| {r['cell']} | {r['system']} | {p.get('sys_enter', 0):.2f} | "
                       f"{p.get('sys_enter_recvfrom', 0):.2f} | "
                       f"{p.get('sys_enter_io_uring_enter', 0):.2f} | "
                       f"{p.get('sys_enter_epoll_wait', 0):.2f} | {w:.2f} | "
                       f"{p.get('sys_enter_read', 0):.2f} | "
                       f"{p.get('io_uring_submit_req', 0):.2f} | "
                       f"{p.get('io_uring_poll_arm', 0):.2f} | "
                       f"{p.get('context-switches', 0):.3f} | {p.get('tcp_out_segs', 0):.2f} |")
        out.append("")
    if cg_rows:
        out += ["### callgrind (load-independent)", "",
                "| system | workload | instructions per unit | allocations per request "
                "(stream: per stream) | N1 / N2 |", "|---|---|---|---|---|"]
        for r in cg_rows:
            unit = "SSE event" if r["workload"] == "stream" else "request"
            out.append(f"| {r['system']} | {r['workload']} | {r['ir_per_unit']:,.0f} per {unit}"
                       f" | {r['allocs_per_request']:.1f} | {r['n'][0]} / {r['n'][1]} |")
        out.append("")
    out += profile_md(list(prof_rows))
    return "\n".join(out)


def main(argv):
    bins, lgpath, what, dur, quick, jpath, outp, keep = [], None, None, 8.0, False, None, None, None
    nginx = True
    it = iter(argv)
    for a in it:
        if a == "--bin":
            v = next(it)
            path, _, label = v.partition("=")
            bins.append((os.path.abspath(path), label or os.path.basename(path)))
        elif a == "--loadgen":
            lgpath = os.path.abspath(next(it))
        elif a == "--what":
            what = set(next(it).split(","))
        elif a == "--duration":
            dur = float(next(it))
        elif a == "--no-nginx":
            nginx = False
        elif a == "--quick":
            quick, dur = True, 3.0
        elif a == "--json":
            jpath = next(it)
        elif a == "--out":
            outp = next(it)
        elif a == "--keep-profiles":
            keep = os.path.abspath(next(it))
            os.makedirs(keep, exist_ok=True)
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            raise SystemExit(f"unknown option {a!r}")
    what = what or {"timing", "syscalls", "callgrind", "profile"}
    if not bins:
        bins = [(R.RINGGATE, "ringgate")]
    lg = R.Loadgen(lgpath or R.newest_loadgen())
    R.raise_nofile()
    env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": R.cpu_model(),
           "kernel": os.uname().release, "loadavg": R.loadavg(),
           "nginx": subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip(),
           "binaries": [{"label": l, "sha256": R.file_sha(b)} for b, l in bins],
           "argv": "benches/llm-load/run.py " + shlex.join(argv)}
    # the mocks run from the first binary (the same upstream for every system)
    R.RINGGATE = bins[0][0]
    mocks = {"instant": R.start_mock("instant", "-llm"), "paced": R.start_mock("paced", "-llm")}
    ev = events_per_stream(mocks["instant"])
    env["events_per_stream"] = ev
    timing_rows, sys_rows, cg_rows, prof_rows = [], [], [], []
    names = [l for _, l in bins] + (["nginx"] if nginx else [])
    if what & {"timing", "syscalls", "profile"}:
        systems = [start_ringgate(b, l, mocks) for b, l in bins]
        systems += [start_nginx(mocks)] if nginx else []
        for s in systems:  # warm every path once (connections, pools)
            for up in ("instant", "paced"):
                lg.run(s.url, None, "warm", ["--concurrency", 4, "--requests", 40, "--warmup",
                                              0] + model_args(up))
        if "timing" in what:
            timing_rows = timing(systems, lg, ev, dur, quick)
        if "syscalls" in what:
            sys_rows = syscalls(systems, lg, ev, dur)
        if "profile" in what:
            prof_rows = profile(systems, lg, ev, dur, keep)
        for s in systems:
            s.proc.stop()
    if "callgrind" in what and shutil.which("valgrind"):
        cg_rows = callgrind(bins, mocks, lg, ev, quick, keep, nginx)
    text = md(env, timing_rows, sys_rows, cg_rows, names, prof_rows)
    print(text)
    if outp:
        with open(outp, "w") as f:
            f.write(R.portable(text) if hasattr(R, "portable") else text)
    if jpath:
        with open(jpath, "w") as f:
            json.dump({"env": env, "timing": timing_rows, "syscalls": sys_rows,
                       "callgrind": cg_rows, "profile": prof_rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
