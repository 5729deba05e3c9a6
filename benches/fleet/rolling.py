"""S11 rolling upgrade of a small fleet behind HAProxy (docs/bench-protocol.md).

Used by `benches/run fleet`. Three ringgate instances (one shard each, CPU 0) on their own
ports behind HAProxy (Debian package `haproxy`; roundrobin; health checks `GET /readyz` every
200 ms, fall 2 / rise 2; `retries 3`, `option redispatch`, L7 retry on connection failure and
empty response), one `ringgate mock --profile seed` upstream. Two load generators through
HAProxy at once (open loop): chat non-stream and chat stream. After a steady period each node in
turn goes through drain → replace binary and config → start → ready (back in HAProxy's rotation)
→ settle. The restart windows go to a file the load generators read when they finish
(`loadgen --windows-file`), so p99 is merged exactly per window (100 ms buckets).

Drain modes (`--drain`):
  sigterm  the gateway's own drain (src/runtime/shutdown.rs): SIGTERM closes the listener and idle
           connections, in-flight requests and streams finish; HAProxy sees refused connects
           (retried on another node) and the failing health check. [default]
  haproxy  the load balancer drains first (runtime API `set server … state drain`, wait until
           the node has no session), then SIGTERM as above; `state ready` after the restart.
"""

import os
import shutil
import socket
import subprocess
import threading
import time

NODES = 3
BUCKET_MS = 100


def now_ms():
    return int(time.time() * 1000)


def haproxy_version():
    try:
        out = subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout
        return out.splitlines()[0].strip()
    except (OSError, IndexError):
        return "?"


class HAProxy:
    def __init__(self, R, d, ports):
        if not shutil.which("haproxy"):
            raise R.HarnessError("haproxy not installed (apt-get install haproxy)")
        self.sock = os.path.join(d, "haproxy.sock")
        self.port = R.free_port()
        cfg = os.path.join(d, "haproxy.cfg")
        servers = "\n".join(f"    server rg{i + 1} 127.0.0.1:{p} check"
                            for i, p in enumerate(ports))
        with open(cfg, "w") as f:
            f.write(f"""global
    stats socket {self.sock} mode 600 level admin
    log stdout format raw local0 info
    maxconn 4000
    nbthread 1

defaults
    mode http
    log global
    option httplog
    timeout connect 1s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 10s
    # A refused connect or an empty answer (a node closing an idle keep-alive connection as it
    # drains) is retried, on another node (redispatch); nothing is retried once a byte came.
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response

frontend fe
    bind 127.0.0.1:{self.port}
    default_backend fleet

backend fleet
    balance roundrobin
    option httpchk
    http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host 127.0.0.1
    http-check expect status 200
    default-server inter 200ms fall 2 rise 2
    http-response set-header x-fleet-node %s
{servers}
""")
        self.cfg = cfg
        self.proc = R.Proc("haproxy", R.pin(R.HARNESS_CPU, ["haproxy", "-db", "-f", cfg]),
                           port=self.port)

    def cmd(self, line):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(self.sock)
            s.sendall(line.encode() + b"\n")
            out = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        return out.decode()

    def stats(self):
        """{server name: row dict} for the fleet backend (show stat CSV)."""
        text = self.cmd("show stat")
        lines = text.splitlines()
        if not lines or not lines[0].startswith("# "):
            return {}
        hdr = lines[0][2:].split(",")
        out = {}
        for ln in lines[1:]:
            row = dict(zip(hdr, ln.split(",")))
            if row.get("pxname") == "fleet":
                out[row.get("svname")] = row
        return out

    def wait_status(self, name, want, timeout):
        end = time.time() + timeout
        while time.time() < end:
            st = self.stats().get(name, {}).get("status", "")
            if st.startswith(want):
                return True
            time.sleep(0.02)
        return False

    def wait_no_sessions(self, name, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if self.stats().get(name, {}).get("scur") == "0":
                return True
            time.sleep(0.02)
        return False


def node_config(port, version):
    models = '\n[[model]]\nname = "mock"\nprovider = "up"\n'
    if version >= 2:  # the upgrade also changes the config: one more model name
        models += '\n[[model]]\nname = "fleet-v2"\nprovider = "up"\nupstream_model = "mock"\n'
    return (f'# fleet node config v{version}\n[server]\nlisten = "127.0.0.1:{port}"\nshards = 1\n'
            f'\n[[provider]]\nname = "up"\nkind = "openai"\nbase_url = "{{base}}"\n{models}')


class Node:
    def __init__(self, R, d, i, port, base, binary, gw_env):
        self.R, self.i, self.port, self.base = R, i, port, base
        self.name = f"rg{i + 1}"
        self.dir = os.path.join(d, self.name)
        os.makedirs(self.dir, exist_ok=True)
        self.bin = os.path.join(self.dir, "ringgate")
        self.cfg = os.path.join(self.dir, "ringgate.toml")
        self.env = gw_env
        self.install(binary, 1)
        self.proc = None

    def install(self, binary, version):
        """Replace the binary (copy + atomic rename, as a package upgrade does) and the config."""
        tmp = self.bin + ".new"
        shutil.copy2(binary, tmp)
        os.replace(tmp, self.bin)
        with open(self.cfg + ".new", "w") as f:
            f.write(node_config(self.port, version).replace("{base}", self.base))
        os.replace(self.cfg + ".new", self.cfg)
        self.version = version

    def check(self):
        r = subprocess.run([self.bin, "check", "--config", self.cfg], capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise self.R.HarnessError(f"{self.name}: ringgate check failed: {r.stderr[-400:]}")

    def start(self):
        self.check()
        self.proc = self.R.Proc(f"fleet-{self.name}-v{self.version}",
                                self.R.pin(self.R.GW_CPU, [self.bin, "--config", self.cfg]),
                                port=self.port, env=self.env)

    def sigterm_and_wait(self, timeout=40.0):
        p = self.proc.p
        t0 = time.monotonic()
        os.killpg(p.pid, 15)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.stop()
            rc = "killed after timeout"
        self.proc.stop()
        return rc, time.monotonic() - t0

    def get(self, path, timeout=1.0):
        req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(req.encode())
            data = b""
            while True:
                c = s.recv(65536)
                if not c:
                    break
                data += c
        return data

    def wait_ready(self, timeout=10.0):
        end = time.time() + timeout
        while time.time() < end:
            try:
                if self.get("/readyz").startswith(b"HTTP/1.1 200"):
                    return True
            except OSError:
                pass
            time.sleep(0.01)
        return False


def run_fleet(R, lg, opts, env):
    d = R.tmpdir()
    smoke = bool(opts.get("smoke"))
    rate = opts.get("rate") or (100 if smoke else 300)
    srate = opts.get("stream_rate") or (30 if smoke else 100)
    steady, gap = (3.0, 2.0) if smoke else (10.0, 8.0)
    mode = opts.get("drain") or "sigterm"
    new_bin = opts.get("new_bin") or R.RINGGATE
    duration = opts["duration"] if opts.get("duration_set") else (20.0 if smoke else 50.0)
    mock = R.start_mock("seed", "-fleet")
    base = R.mock_url(mock) + "/v1"
    ports = [R.free_port() for _ in range(NODES)]
    nodes = [Node(R, d, i, p, base, R.RINGGATE, R.GATEWAY_ENV) for i, p in enumerate(ports)]
    for n in nodes:
        n.start()
    hp = HAProxy(R, d, ports)
    for n in nodes:
        if not hp.wait_status(n.name, "UP", 10):
            raise R.HarnessError(f"haproxy never saw {n.name} UP: {hp.stats().get(n.name)}")
    wfile = os.path.join(d, "windows.txt")
    open(wfile, "w").close()
    target = f"http://127.0.0.1:{hp.port}"
    common = ["--duration", duration, "--warmup", 2, "--timeline", BUCKET_MS, "--windows-file",
              wfile, "--count-header", "x-fleet-node", "--timeout-ms", 10000,
              "--connections", 1024]
    results = {}

    def load(key, extra):
        try:
            results[key] = lg.run(target, None, f"fleet {key}", common + extra,
                                  timeout_s=duration + 120)
        except R.HarnessError as e:  # reported below
            results[key] = {"error": str(e)}

    threads = [threading.Thread(target=load, args=("non-stream", ["--rate", rate])),
               threading.Thread(target=load, args=("stream", ["--rate", srate, "--stream"]))]
    loadavg_before = open("/proc/loadavg").read().split()[:3]
    t_launch = now_ms()
    for t in threads:
        t.start()
    # Steady state first (the load generators warm up 2 s, then measure).
    time.sleep(2 + steady)
    steady_end = now_ms()
    restarts = []
    windows = [("steady", t_launch + 2000, steady_end)]
    for n in nodes:
        rec = {"node": n.name, "mode": mode, "t_start_ms": now_ms()}
        if mode == "haproxy":
            hp.cmd(f"set server fleet/{n.name} state drain")
            rec["lb_drained"] = hp.wait_no_sessions(n.name, 20)
            rec["lb_drain_s"] = round((now_ms() - rec["t_start_ms"]) / 1000, 3)
        rc, secs = n.sigterm_and_wait()
        rec["exit_code"], rec["stop_s"] = rc, round(secs, 3)
        n.install(new_bin, 2)
        t_start = time.monotonic()
        n.start()
        rec["ready_direct"] = n.wait_ready()
        rec["start_to_ready_s"] = round(time.monotonic() - t_start, 3)
        if mode == "haproxy":
            hp.cmd(f"set server fleet/{n.name} state ready")
        rec["lb_up"] = hp.wait_status(n.name, "UP", 15)
        rec["t_end_ms"] = now_ms()
        rec["window_s"] = round((rec["t_end_ms"] - rec["t_start_ms"]) / 1000, 3)
        models = n.get("/v1/models")
        rec["serves_v2_config"] = b"fleet-v2" in models
        restarts.append(rec)
        windows.append((f"restart-{n.name}", rec["t_start_ms"], rec["t_end_ms"]))
        with open(wfile, "w") as f:
            f.write("".join(f"{a} {b} {c}\n" for a, b, c in windows))
        R.log(f"fleet: {n.name} restarted ({mode}): stop {rec['stop_s']} s, start→ready "
              f"{rec['start_to_ready_s']} s, window {rec['window_s']} s, exit {rc}, "
              f"v2 config served: {rec['serves_v2_config']}")
        time.sleep(gap)
    last_end = restarts[-1]["t_end_ms"]
    windows.append(("after", last_end + 2000, t_launch + int((2 + duration) * 1000)))
    with open(wfile, "w") as f:
        f.write("".join(f"{a} {b} {c}\n" for a, b, c in windows))
    if now_ms() > t_launch + (2 + duration) * 1000:
        R.log("fleet: WARNING restarts outlasted the measured window; raise --duration")
    for t in threads:
        t.join()
    hstats = hp.stats()
    loadavg_after = open("/proc/loadavg").read().split()[:3]
    for n in nodes:
        n.proc.stop()
    hp.proc.stop()
    mock.stop()
    for k, v in results.items():
        if "error" in v:
            raise R.HarnessError(f"fleet load generator {k}: {v['error'][-600:]}")
    return summarize(R, opts, env, results, restarts, hstats, mode, rate, srate, duration,
                     loadavg_before, loadavg_after, new_bin, steady, gap)


def _win(t, name):
    for w in t.get("windows") or []:
        if w.get("name") == name:
            return w
    return None


def summarize(R, opts, env, results, restarts, hstats, mode, rate, srate, duration, la0, la1,
              new_bin, steady, gap):
    env = dict(env)
    env["haproxy"] = haproxy_version()
    env["loadavg_before"], env["loadavg_after"] = la0, la1
    env["new_binary_sha256_16"] = R.file_sha(new_bin)
    env["placement"] = (f"3 gateways on CPU {R.GW_CPU} (shards = 1 each); HAProxy, seed mock "
                        f"and 2 load generators on CPU {R.HARNESS_CPU}")
    totals, rows, wrows = {}, [], []
    ok_all = True
    for key in ("non-stream", "stream"):
        t = R.tgt(results[key])
        e = t["errors"]
        cut = e.get("incomplete_stream", 0) if key == "stream" else 0
        totals[key] = {"sent": t["scheduled"], "ok": t["completed_ok"], "failed": e["total"],
                       "unfinished": t["unfinished"], "streams_cut": cut,
                       "errors": e, "stale_retries": t.get("stale_retries"),
                       "by_node": (t.get("header_counts") or {}).get("x-fleet-node")}
        if e["total"] or t["unfinished"] or cut:
            ok_all = False
        rows.append([key, f"{rate if key == 'non-stream' else srate:,}", f"{t['scheduled']:,}",
                     f"{t['completed_ok']:,}", e["total"], t["unfinished"],
                     cut if key == "stream" else "-", R.errs_str(t), t.get("stale_retries", 0),
                     ", ".join(f"{k} {v:,}" for k, v in sorted(
                         (totals[key]["by_node"] or {}).items()))])
        sw = _win(t, "steady")
        for w in t.get("windows") or []:
            if "name" not in w:
                continue
            p99 = R.pct(w["latency_us"], "p99")
            sp99 = R.pct(sw["latency_us"], "p99") if sw else None
            wrows.append([key, w["name"], f"{w['from_s']:.1f}–{w['to_s']:.1f}", f"{w['ok']:,}",
                          w["errors"], R.fms(R.pct(w["latency_us"], "p50")), R.fms(p99),
                          R.fms(R.pct(w["latency_us"], "p99_9")),
                          f"{p99 / sp99:.2f}×" if p99 and sp99 else "-"])
    retr = sum(int(r.get("wretr") or 0) for r in hstats.values())
    redis = sum(int(r.get("wredis") or 0) for r in hstats.values())
    eresp = sum(int(r.get("eresp") or 0) for r in hstats.values())
    econ = sum(int(r.get("econ") or 0) for r in hstats.values())
    hp = {"retries": retr, "redispatches": redis, "server_response_errors": eresp,
          "server_connect_errors": econ,
          "per_server": {k: {c: v.get(c) for c in ("stot", "wretr", "wredis", "eresp", "econ",
                                                   "chkfail", "status")}
                         for k, v in hstats.items()}}
    verdict = ("**0 failed requests, 0 streams cut**" if ok_all else
               "**FAILED REQUESTS OR CUT STREAMS** (see table)")
    md = R.md_header(
        "S11 rolling upgrade — 3 nodes behind HAProxy", env,
        f"- HAProxy: {env['haproxy']}; health check GET /readyz every 200 ms (fall 2, rise 2); "
        "`retries 3`, `option redispatch 1`, `retry-on conn-failure empty-response`\n"
        f"- Upstream: one `ringgate mock --profile seed` (non-stream answers after 50 ms; streams: "
        "first token at 50 ms, output over 500 ms)\n"
        f"- Load (open loop, through HAProxy, at the same time): chat non-stream {rate:,} RPS and "
        f"chat stream {srate:,} RPS, {duration:g} s measured after 2 s warm-up, client timeout "
        "10 s; p99 per window merged from 100 ms buckets of intended send time\n"
        f"- Drain mode: `{mode}`; each node: "
        + ("HAProxy `set server state drain` → no session left → " if mode == "haproxy" else "")
        + "SIGTERM (gateway drain: listener and idle connections closed, in-flight requests "
        "finish) → exit → binary replaced (copy + rename) and config v2 written → `ringgate "
        f"check` → start → `/readyz` 200 → UP in HAProxy; {gap:g} s between nodes, {steady:g} s "
        "steady first\n"
        f"- Shared machine: load average {' '.join(la0)} before, {' '.join(la1)} after (other "
        "builders were running)\n\n"
        f"Result: {verdict}. HAProxy counters: {redis} request(s) redispatched to another node "
        f"after a failed connection attempt (`wredis`), {retr} retried on the same node "
        f"(`wretr`); left after retries: {econ} connection errors (`econ`), {eresp} response "
        "errors (`eresp`).\n\n")
    md += "## Requests\n\n" + R.md_table(
        ["load", "offered RPS", "sent", "ok", "failed", "unfinished", "streams cut",
         "errors by kind", "client stale-conn retries", "answered by node"], rows) + "\n"
    md += "\n## p99 during each node's restart against steady state\n\n" + R.md_table(
        ["load", "window", "s (of measured window)", "ok", "errors", "p50 ms", "p99 ms",
         "p99.9 ms", "p99 / steady p99"], wrows) + "\n"
    md += ("\nA restart window (drain start → the node UP in HAProxy again) holds a few hundred "
           "requests, so its p99 is close to its maximum. \"client stale-conn retries\": requests "
           "whose pooled connection closed before any answer byte (HAProxy closes client "
           "connections idle for 10 s) and which the load generator sent again once on a fresh "
           "connection, as HTTP client libraries do; they are not failures.\n")
    md += "\n## Restarts\n\n" + R.md_table(
        ["node", "stop (SIGTERM → exit) s", "exit code", "start → ready s", "UP in HAProxy",
         "window s", "serves v2 config"] + (["LB drain s"] if mode == "haproxy" else []),
        [[r["node"], r["stop_s"], r["exit_code"], r["start_to_ready_s"],
          "yes" if r["lb_up"] else "**no**", r["window_s"],
          "yes" if r["serves_v2_config"] else "**no**"]
         + ([r.get("lb_drain_s")] if mode == "haproxy" else []) for r in restarts]) + "\n"
    summary = (f"{mode} drain: sent {sum(t['sent'] for t in totals.values()):,}, failed "
               f"{sum(t['failed'] for t in totals.values())}, streams cut "
               f"{totals['stream']['streams_cut']}")
    passed = ok_all and all(r["lb_up"] and r["serves_v2_config"] for r in restarts)
    if opts.get("smoke"):  # CI: say what happened, write nothing
        R.log(f"fleet smoke: {summary}; HAProxy retries {retr}, redispatches {redis}; "
              + ("ok" if passed else "FAILED: " + str({k: t['errors'] for k, t in totals.items()})))
        return 0 if passed else 1
    chart = chart_timeline(R, env, results, restarts, mode)
    md += f"\n![{chart}]({chart})\n"
    name = "fleet-rolling" + ("" if mode == "sigterm" else f"-{mode}")
    R.write_results(name, env, {"totals": totals, "restarts": restarts, "haproxy": hp,
                                "summary": summary, "charts": [chart],
                                "loadgen": results}, md, opts)
    return 0 if passed else 1


def chart_timeline(R, env, results, restarts, mode):
    ser = []
    for key in ("non-stream", "stream"):
        tl = (R.tgt(results[key]).get("timeline") or {}).get("buckets") or []
        ser.append((f"{key} p99", [(b["t_s"], (b["p99_us"] / 1000) if b["p99_us"] else None)
                                   for b in tl], key == "stream"))
    t0 = results["non-stream"].get("window_start_unix_ms") or 0
    spans = [((r["t_start_ms"] - t0) / 1000, (r["t_end_ms"] - t0) / 1000, r["node"])
             for r in restarts]
    name = "fleet-rolling" + ("" if mode == "sigterm" else f"-{mode}") + ".svg"
    return R.svg_chart(os.path.join(R.RESULTS, name),
                       f"S11 rolling upgrade ({mode} drain): p99 per 100 ms", ser,
                       "seconds into the measured window", "p99 latency, ms", stamp=R.chart_stamp(env),
                       vspans=spans, gaps=True)
