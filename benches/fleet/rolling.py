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

With `--shared-keys` the three nodes are one fleet (issue 24, docs/fleet.md): a `redis-server`
(Debian package `redis-server`) holds limits, spend, keys and Responses state (`[fleet] share =
["keys", "responses"]`), each node has its own admin listener and SQLite state dir, and the
load is sent with a *runtime* key made through node rg1's admin API before the run (rpm
1,000,000: every request also takes the exact shared-limit path). A restarted node must know
that key from its first request (401 otherwise, counted as a failure). During the run a second
key is made on the node restarted last and a third one revoked on rg1; the run records how long
each change took to be seen on every other node (`GET /admin/keys` polled every 20 ms).
"""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time

NODES = 3
BUCKET_MS = 100
ADMIN_TOKEN = "fleet-bench-admin-token-5e1d0c9b8a7f6e5d"
CFG_SECRET = "rg-fleet-bench-config-key-0f1e2d3c4b5a69788796a5b4"


def read_all(s):
    """Everything the peer sends on socket `s` until it closes."""
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return out
        out += chunk


def http_close(port, raw, timeout):
    """The whole answer to one `Connection: close` request sent to 127.0.0.1:port."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(raw)
        return read_all(s)


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
            return read_all(s).decode()

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


def node_config(port, version, fleet=None):
    """The node's config; `fleet` = {redis_port, admin_port, state_dir} for --shared-keys."""
    models = '\n[[model]]\nname = "mock"\nprovider = "up"\n'
    if version >= 2:  # the upgrade also changes the config: one more model name
        models += '\n[[model]]\nname = "fleet-v2"\nprovider = "up"\nupstream_model = "mock"\n'
    server = f'[server]\nlisten = "127.0.0.1:{port}"\nshards = 1\n'
    extra = ""
    if fleet:
        server += f'state_dir = "{fleet["state_dir"]}"\n'
        digest = hashlib.sha256(CFG_SECRET.encode()).hexdigest()
        extra = (f'\n[limits]\nstore = "redis"\nredis_url = "redis://127.0.0.1:'
                 f'{fleet["redis_port"]}/0"\nmode = "exact"\n'
                 '\n[fleet]\nshare = ["keys", "responses"]\n'
                 f'\n[admin]\nlisten = "127.0.0.1:{fleet["admin_port"]}"\n'
                 'token_env = "RINGGATE_ADMIN_TOKEN"\n'
                 # a config key turns authentication on; the load uses a runtime key
                 f'\n[[key]]\nname = "config-only"\nkey_sha256 = "{digest}"\n')
    return (f'# fleet node config v{version}\n{server}{extra}'
            f'\n[[provider]]\nname = "up"\nkind = "openai"\nbase_url = "{{base}}"\n{models}')


class Redis:
    """One redis-server for the fleet (no persistence), on the harness CPU."""

    def __init__(self, R, d):
        if not shutil.which("redis-server"):
            raise R.HarnessError("redis-server not installed (apt-get install redis-server)")
        self.port = R.free_port()
        self.proc = R.Proc("fleet-redis", R.pin(R.HARNESS_CPU, [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", d]), port=self.port)


def admin_call(port, method, path, body=None, timeout=2.0):
    """(status, parsed JSON or None) of one admin API request."""
    data = json.dumps(body).encode() if body is not None else b""
    req = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
           f"Authorization: Bearer {ADMIN_TOKEN}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(data)}\r\n\r\n").encode() + data
    head, _, payload = http_close(port, req, timeout).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    try:
        return status, json.loads(payload) if payload else None
    except ValueError:
        return status, None


def key_listed(port, name):
    """True / False: `name` is among the node's live keys (GET /admin/keys, every page; a
    revoked key is not listed); None: no answer."""
    after = ""
    while True:
        try:
            status, doc = admin_call(port, "GET", "/admin/keys?limit=1000" + after)
        except OSError:
            return None
        if status != 200 or not isinstance(doc, dict):
            return None
        if any(isinstance(k, dict) and k.get("name") == name for k in doc.get("keys", [])):
            return True
        if not doc.get("has_more"):
            return False
        after = "&after=" + str(doc.get("next_after"))


def wait_key_everywhere(nodes, name, listed, timeout=10.0):
    """Seconds until every node lists `name` (listed=True) or none does (False), polled every
    20 ms; None when that did not happen within `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if all(key_listed(n.admin_port, name) is listed for n in nodes):
            return round(time.monotonic() - t0, 3)
        time.sleep(0.02)
    return None


def chat_status(port, secret):
    """Status of one small chat request with `secret` sent straight to a node."""
    body = b'{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
           f"Authorization: Bearer {secret}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    out = http_close(port, req, 5)
    return int(out.split(b" ", 2)[1]) if out.startswith(b"HTTP/1.1 ") else 0


def make_key(node, name, rpm=None):
    body = {"name": name}
    if rpm:
        body["rpm"] = rpm
    status, doc = admin_call(node.admin_port, "POST", "/admin/keys", body)
    if status != 201 or not isinstance(doc, dict) or "key" not in doc:
        raise node.R.HarnessError(f"{node.name}: POST /admin/keys {name}: {status} {doc}")
    return doc["key"]


class Node:
    def __init__(self, R, d, i, port, base, binary, gw_env, fleet=None):
        self.R, self.i, self.port, self.base = R, i, port, base
        self.name = f"rg{i + 1}"
        self.dir = os.path.join(d, self.name)
        os.makedirs(self.dir, exist_ok=True)
        self.fleet = None
        self.admin_port = None
        if fleet is not None:
            self.admin_port = R.free_port()
            self.fleet = {"redis_port": fleet, "admin_port": self.admin_port,
                          "state_dir": os.path.join(self.dir, "state")}
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
            f.write(node_config(self.port, version, self.fleet).replace("{base}", self.base))
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

    def get(self, path, timeout=1.0, auth=None):
        hdr = f"Authorization: Bearer {auth}\r\n" if auth else ""
        req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{hdr}\r\n"
        return http_close(self.port, req.encode(), timeout)

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
    shared = bool(opts.get("shared_keys"))
    mock = R.start_mock("seed", "-fleet")
    base = R.mock_url(mock) + "/v1"
    ports = [R.free_port() for _ in range(NODES)]
    redis, gw_env, keys = None, R.GATEWAY_ENV, {}
    if shared:
        redis = Redis(R, d)
        gw_env = dict(R.GATEWAY_ENV, RINGGATE_ADMIN_TOKEN=ADMIN_TOKEN)
    nodes = [Node(R, d, i, p, base, R.RINGGATE, gw_env, redis.port if redis else None)
             for i, p in enumerate(ports)]
    for n in nodes:
        n.start()
    hp = HAProxy(R, d, ports)
    for n in nodes:
        if not hp.wait_status(n.name, "UP", 10):
            raise R.HarnessError(f"haproxy never saw {n.name} UP: {hp.stats().get(n.name)}")
    api_key, secret = [], None
    if shared:
        # The load's key is made on rg1 only; every node must admit it (the fleet's keys).
        secret = make_key(nodes[0], "fleet-load", rpm=1_000_000)
        keys["load_key_seen_everywhere_s"] = wait_key_everywhere(nodes, "fleet-load", True)
        keys["revoke_secret"] = make_key(nodes[0], "fleet-revoke")
        keys["revoke_key_seen_everywhere_s"] = wait_key_everywhere(nodes, "fleet-revoke", True)
        if keys["load_key_seen_everywhere_s"] is None:
            raise R.HarnessError("the key made on rg1 never reached every node")
        api_key = ["--api-key", secret]
    wfile = os.path.join(d, "windows.txt")
    open(wfile, "w").close()
    target = f"http://127.0.0.1:{hp.port}"
    common = ["--duration", duration, "--warmup", 2, "--timeline", BUCKET_MS, "--windows-file",
              wfile, "--count-header", "x-fleet-node", "--timeout-ms", 10000,
              "--connections", 1024] + api_key
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
        models = n.get("/v1/models", auth=secret)
        rec["serves_v2_config"] = b"fleet-v2" in models
        if shared:  # the restarted node knows the fleet's key at once
            rec["lists_fleet_key_when_up"] = key_listed(n.admin_port, "fleet-load") is True
        restarts.append(rec)
        windows.append((f"restart-{n.name}", rec["t_start_ms"], rec["t_end_ms"]))
        with open(wfile, "w") as f:
            f.write("".join(f"{a} {b} {c}\n" for a, b, c in windows))
        R.log(f"fleet: {n.name} restarted ({mode}): stop {rec['stop_s']} s, start→ready "
              f"{rec['start_to_ready_s']} s, window {rec['window_s']} s, exit {rc}, "
              f"v2 config served: {rec['serves_v2_config']}")
        time.sleep(gap)
    if shared:
        # Changes made while the fleet runs: a key made on the node restarted last, one revoked
        # on rg1 (restarted first); each must reach every node (change feed) within 1 s.
        late = nodes[-1]
        t0 = time.monotonic()
        late_secret = make_key(late, "fleet-late")
        keys["late_key_create_s"] = round(time.monotonic() - t0, 3)
        keys["late_key_seen_everywhere_s"] = wait_key_everywhere(nodes, "fleet-late", True)
        keys["late_key_status"] = {n.name: chat_status(n.port, late_secret) for n in nodes}
        t0 = time.monotonic()
        status, _ = admin_call(nodes[0].admin_port, "DELETE", "/admin/keys/fleet-revoke")
        keys["revoke_status"] = status
        keys["revoked_gone_everywhere_s"] = wait_key_everywhere(nodes, "fleet-revoke", False)
        keys["revoked_key_status"] = {n.name: chat_status(n.port, keys["revoke_secret"])
                                      for n in nodes}
        keys.pop("revoke_secret")
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
    if redis:
        redis.proc.stop()
    mock.stop()
    for k, v in results.items():
        if "error" in v:
            raise R.HarnessError(f"fleet load generator {k}: {v['error'][-600:]}")
    return summarize(R, opts, env, results, restarts, hstats, mode, rate, srate, duration,
                     loadavg_before, loadavg_after, new_bin, steady, gap, keys if shared else None)


def _win(t, name):
    for w in t.get("windows") or []:
        if w.get("name") == name:
            return w
    return None


def keys_ok(keys):
    """The shared-keys checks: every change seen everywhere within 1 s, the late key admitted
    (200) and the revoked one refused (401) on every node."""
    return (all((keys.get(k) is not None and keys[k] <= 1.0) for k in (
        "load_key_seen_everywhere_s", "late_key_seen_everywhere_s",
        "revoked_gone_everywhere_s"))
        and all(v == 200 for v in keys.get("late_key_status", {}).values())
        and all(v == 401 for v in keys.get("revoked_key_status", {}).values())
        and keys.get("revoke_status") in (200, 204))


def summarize(R, opts, env, results, restarts, hstats, mode, rate, srate, duration, la0, la1,
              new_bin, steady, gap, keys=None):
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
        "S11 rolling upgrade — 3 nodes behind HAProxy"
        + (", one fleet sharing keys through Redis" if keys is not None else ""), env,
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
    if keys is not None:
        passed = passed and keys_ok(keys) and all(r["lists_fleet_key_when_up"] for r in restarts)
        summary += (f"; shared keys: made on rg1 → every node {keys['load_key_seen_everywhere_s']} s,"
                    f" made on {restarts[-1]['node']} → every node "
                    f"{keys['late_key_seen_everywhere_s']} s, revoked on rg1 → gone everywhere "
                    f"{keys['revoked_gone_everywhere_s']} s")
        md += ("\n## Shared keys (`--shared-keys`)\n\nThe nodes share one `redis-server` (`[limits] "
               "store = \"redis\"`, `mode = \"exact\"`, `[fleet] share = [\"keys\", "
               "\"responses\"]`), each with its own SQLite state dir and admin listener. The "
               "load's key (`fleet-load`, rpm 1,000,000) was made through rg1's admin API before "
               "the run; a restarted node that did not know it would answer 401 (counted above as "
               "failed). Times are from the admin call's answer until every node's `GET "
               "/admin/keys` (polled every 20 ms) shows the change.\n\n" + R.md_table(
                   ["check", "result"],
                   [["`fleet-load` made on rg1 → listed on all 3 nodes",
                     f"{keys['load_key_seen_everywhere_s']} s"],
                    ["each restarted node lists `fleet-load` as soon as it is UP",
                     ", ".join(f"{r['node']} {'yes' if r['lists_fleet_key_when_up'] else '**no**'}"
                               for r in restarts)],
                    [f"`fleet-late` made on {restarts[-1]['node']} (after its restart) → listed on "
                     "all 3", f"{keys['late_key_seen_everywhere_s']} s (create answered in "
                     f"{keys['late_key_create_s']} s)"],
                    ["`fleet-late` used on each node (status)",
                     ", ".join(f"{k} {v}" for k, v in keys["late_key_status"].items())],
                    ["`fleet-revoke` revoked on rg1 → listed on none",
                     f"{keys['revoked_gone_everywhere_s']} s (DELETE answered "
                     f"{keys['revoke_status']})"],
                    ["`fleet-revoke` used on each node after that (status)",
                     ", ".join(f"{k} {v}" for k, v in keys["revoked_key_status"].items())]])
               + "\n")
    if opts.get("smoke"):  # CI: say what happened, write nothing
        R.log(f"fleet smoke: {summary}; HAProxy retries {retr}, redispatches {redis}; "
              + ("ok" if passed else "FAILED: " + str({k: t['errors'] for k, t in totals.items()})))
        return 0 if passed else 1
    chart = chart_timeline(R, env, results, restarts, mode,
                           "-shared-keys" if keys is not None else "")
    md += f"\n![{chart}]({chart})\n"
    name = "fleet-rolling" + ("" if mode == "sigterm" else f"-{mode}") + (
        "-shared-keys" if keys is not None else "")
    R.write_results(name, env, {"totals": totals, "restarts": restarts, "haproxy": hp,
                                "summary": summary, "charts": [chart], "shared_keys": keys,
                                "loadgen": results}, md, opts)
    return 0 if passed else 1


def chart_timeline(R, env, results, restarts, mode, suffix=""):
    ser = []
    for key in ("non-stream", "stream"):
        tl = (R.tgt(results[key]).get("timeline") or {}).get("buckets") or []
        ser.append((f"{key} p99", [(b["t_s"], (b["p99_us"] / 1000) if b["p99_us"] else None)
                                   for b in tl], key == "stream"))
    t0 = results["non-stream"].get("window_start_unix_ms") or 0
    spans = [((r["t_start_ms"] - t0) / 1000, (r["t_end_ms"] - t0) / 1000, r["node"])
             for r in restarts]
    name = "fleet-rolling" + ("" if mode == "sigterm" else f"-{mode}") + suffix + ".svg"
    return R.svg_chart(os.path.join(R.RESULTS, name),
                       f"S11 rolling upgrade ({mode} drain): p99 per 100 ms", ser,
                       "seconds into the measured window", "p99 latency, ms", stamp=R.chart_stamp(env),
                       vspans=spans, gaps=True)
