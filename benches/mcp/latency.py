"""Added latency of an MCP `tools/call` through ringgate's /mcp against the same server direct,
and memory per idle MCP session (issue 25's bench line).

The server is the official Python SDK's FastMCP over Streamable HTTP (tests/mcp/mcp_server.py,
JSON answers). The client is a raw keep-alive HTTP/1.1 loop (http.client), so that the
client's own cost is small and the same on both paths. Direct and gateway runs are
interleaved in rounds (the machine is shared and noisy): added = gateway - direct at the same
percentile. Prints a Markdown summary and writes JSON next to it when --out is given.

    python benches/mcp/latency.py --bin target/release/ringgate [--calls 2000] [--out FILE]
"""

import argparse
import http.client
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = os.path.join(ROOT, "tests", "mcp", "mcp_server.py")
class Conn(http.client.HTTPConnection):
    """Keep-alive HTTP/1.1 with TCP_NODELAY (http.client writes head and body in two sends)."""

    def connect(self):
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


HDR = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def post(conn, body, headers):
    conn.request("POST", "/mcp", json.dumps(body), {**HDR, **headers})
    r = conn.getresponse()
    data = r.read()
    return r.status, r.getheader("mcp-session-id"), data


def session(host, port):
    """(connection, headers) of an initialised MCP session."""
    c = Conn(host, port, timeout=60)
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "bench", "version": "1"}}}
    status, sid, _ = post(c, init, {})
    assert status == 200, status
    h = {"Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"}
    status, _, _ = post(c, {"jsonrpc": "2.0", "method": "notifications/initialized"}, h)
    assert status in (200, 202), status
    return c, h


def call(c, h, tool, i):
    """One timed tools/call. `c` is a keep-alive connection, or a (host, port) target: then the
    call opens a fresh connection and asks the server to close it, as the gateway reaches the
    server (no MCP upstream pool), so that baseline pays the same connect and no keep-alive
    delayed-ACK wait."""
    body = {"jsonrpc": "2.0", "id": i, "method": "tools/call",
            "params": {"name": tool, "arguments": {"a": i, "b": 1}}}
    t0 = time.perf_counter()
    if isinstance(c, tuple):
        fresh = Conn(*c, timeout=60)
        status, _, data = post(fresh, body, {**h, "Connection": "close"})
        fresh.close()
    else:
        status, _, data = post(c, body, h)
    took = time.perf_counter() - t0
    assert status == 200 and b'"isError":false' in data.replace(b" ", b""), data[:200]
    return took


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_secs(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def throughput(target, tool, threads, seconds):
    done = [0] * threads
    stop = time.time() + seconds

    def worker(k):
        c, h = session(*target)
        i = 0
        while time.time() < stop:
            call(c, h, tool, i)
            i += 1
        done[k] = i

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(done) / (time.time() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "ringgate"))
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--sessions", type=int, default=10000)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--out")
    a = ap.parse_args()

    srv = subprocess.Popen([sys.executable, SERVER, "alpha", "0", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = int(srv.stdout.readline().split()[1])
    state = tempfile.mkdtemp(prefix="rg-mcp-bench-")
    cfg = os.path.join(state, "ringgate.toml")
    with open(cfg, "w") as f:
        f.write(f"""[server]
listen = "127.0.0.1:0"
shards = 1

[reload]
allow_empty = true

[mcp]
max_sessions = {a.sessions + 100}

[[mcp_server]]
name = "alpha"
url = "http://127.0.0.1:{port}/mcp"
""")
    gw = subprocess.Popen(["taskset", "-c", "0", a.bin, "--config", cfg], stderr=subprocess.PIPE,
                          stdout=subprocess.DEVNULL, text=True,
                          env=dict(os.environ, XDG_DATA_HOME=state))
    gport = None
    for line in gw.stderr:
        if " listening on http://" in line:
            gport = int(line.split("listening on http://")[1].split()[0].rsplit(":", 1)[1])
            break
    threading.Thread(target=lambda: [None for _ in gw.stderr], daemon=True).start()
    try:
        time.sleep(1)
        direct, via = ("127.0.0.1", port), ("127.0.0.1", gport)
        dc, dh = session(*direct)
        gc, gh = session(*via)
        for i in range(200):  # warm up both paths (and the gateway's upstream session)
            call(dc, dh, "add", i)
            call(gc, gh, "alpha__add", i)
        d, f, g = [], [], []
        cpu0, served0 = cpu_secs(gw.pid), 0
        per = a.calls // a.rounds
        for r in range(a.rounds):
            order = [(d, dc, dh, "add"), (f, direct, dh, "add"), (g, gc, gh, "alpha__add")]
            for out, c, h, tool in (order if r % 2 == 0 else order[::-1]):
                gcpu = cpu_secs(gw.pid)
                for i in range(per):
                    out.append(call(c, h, tool, i))
                if out is not g:  # the gateway's CPU is counted over its own calls only
                    cpu0 += cpu_secs(gw.pid) - gcpu
        served0 = len(g)
        cpu_per_call = (cpu_secs(gw.pid) - cpu0) / served0
        c1 = {
            "direct_p50_ms": pct(d, 50) * 1e3, "direct_p99_ms": pct(d, 99) * 1e3,
            "direct_fresh_p50_ms": pct(f, 50) * 1e3, "direct_fresh_p99_ms": pct(f, 99) * 1e3,
            "gateway_p50_ms": pct(g, 50) * 1e3, "gateway_p99_ms": pct(g, 99) * 1e3,
        }
        # added latency against the baseline that reaches the server the way the gateway does
        c1["added_p50_ms"] = c1["gateway_p50_ms"] - c1["direct_fresh_p50_ms"]
        c1["added_p99_ms"] = c1["gateway_p99_ms"] - c1["direct_fresh_p99_ms"]
        c1["gateway_cpu_us_per_call"] = cpu_per_call * 1e6
        tput = {}
        for name, target, tool in (("direct", direct, "add"), ("gateway", via, "alpha__add"),
                                   ("direct_again", direct, "add")):
            tput[name] = throughput(target, tool, 32, a.seconds)
        # memory per idle session: RSS before and after opening many (initialize only)
        rss0 = rss_kib(gw.pid)
        conn = Conn(*via, timeout=60)
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "bench", "version": "1"}}}
        for _ in range(a.sessions):
            assert post(conn, init, {})[0] == 200
        rss1 = rss_kib(gw.pid)
        mem = {"sessions": a.sessions, "rss_before_kib": rss0, "rss_after_kib": rss1,
               "bytes_per_idle_session": (rss1 - rss0) * 1024 / a.sessions}
        result = {
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                        "kernel": platform.release(), "python": platform.python_version(),
                        "load_avg": os.getloadavg()},
            "calls_c1": len(g), "c1": c1, "c32_calls_per_s": tput, "idle_sessions": mem,
        }
        print(json.dumps(result, indent=2))
        if a.out:
            with open(a.out, "w") as f:
                json.dump(result, f, indent=2)
    finally:
        gw.terminate()
        srv.terminate()
        gw.wait()
        srv.wait()


if __name__ == "__main__":
    main()
