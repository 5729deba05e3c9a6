#!/usr/bin/env python3
"""Key directory cost: admin API creates as keys pile up, and memory after listing them all.

usage: benches/key-directory.py [BINARY] [N] [SHARDS]
       (default target/release/ringgate, 30000 keys, 2 shards)

Starts `ringgate` (mock provider, admin listener on loopback with a token, a fresh state_dir in
a temp dir: every create is committed to SQLite with synchronous = FULL, as in production) and
creates N keys one after another on one keep-alive admin connection. Prints:

- ms per create around 1k, 10k, 30k keys (mean, p50, p99 over the 200 creates before each mark);
- at each mark, the median keyed request (fresh connections, `GET /v1/models`) with no
  directory change since the last request, and right after a PATCH (each shard takes the new
  directory generation on its next request: the per-shard refresh cost, plus noise);
- VmRSS before and after walking `GET /admin/keys?limit=1000` to the end (`next_after`; a
  gateway without pagination answers every key in the first body), VmHWM, and bytes read.
"""
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/ringgate"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 30000
SHARDS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
TOKEN = "bench-key-directory-token-0123456789abcdef"
MARKS = [m for m in (1000, 10000, 30000) if m <= N]
WINDOW = 200


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(field + r":\s+(\d+)", f.read()).group(1))


def start(state):
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = {SHARDS}
pin = false
state_dir = "{state}/state"

[admin]
listen = "127.0.0.1:0"

[[provider]]
name = "mock"
kind = "mock"

[[model]]
name = "gpt-4o-mini"
provider = "mock"
"""
    path = os.path.join(state, "ringgate.toml")
    with open(path, "w") as f:
        f.write(cfg)
    env = dict(os.environ, RINGGATE_ADMIN_TOKEN=TOKEN)
    env.pop("OPENAI_API_KEY", None)
    p = subprocess.Popen([BIN, "--config", path], stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True, env=env)
    main = admin = None
    for line in p.stderr:
        m = re.search(r"admin listening on http://([\d.]+):(\d+)", line)
        if m:
            admin = (m.group(1), int(m.group(2)))
            break
        m = re.search(r" listening on http://([\d.]+):(\d+)", line)
        if m:
            main = (m.group(1), int(m.group(2)))
    if admin is None or main is None:
        raise SystemExit("ringgate did not start")
    # keep draining its log so it never blocks on a full pipe
    import threading
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    return p, main, admin


def keyed_request(main, secret):
    """One `GET /v1/models` with `secret` on a fresh connection: (status, ms)."""
    c = http.client.HTTPConnection(*main, timeout=30)
    t0 = time.perf_counter()
    c.request("GET", "/v1/models", headers={"Authorization": f"Bearer {secret}"})
    r = c.getresponse()
    r.read()
    ms = (time.perf_counter() - t0) * 1000
    c.close()
    return r.status, ms


def refresh_cost(conn, auth, main_addr, name, secret, rounds=15):
    """Median keyed-request time on fresh connections with no directory change since the last
    request, and right after one (a PATCH of `name`): what a shard pays to take a new
    directory generation, plus noise."""
    def burst():
        reqs = [keyed_request(main_addr, secret) for _ in range(2 * SHARDS)]
        assert all(s == 200 for s, _ in reqs), reqs
        return [ms for _, ms in reqs]
    burst()  # every shard takes what piled up since the last mark
    base, changed = [], []
    for r in range(rounds):
        base += burst()
        conn.request("PATCH", f"/admin/keys/{name}", body=json.dumps({"tpm": 100000 + r}),
                     headers=auth)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status
        # the first request on each shard after the change refreshes it; SO_REUSEPORT spreads
        # fresh connections, so 2 × shards requests reach each shard about twice
        changed += burst()
    return sorted(base)[len(base) // 2], sorted(changed)[len(changed) // 2]


def main():
    state = tempfile.mkdtemp(prefix="rg-keydir-")
    p, main_addr, admin = start(state)
    conn = http.client.HTTPConnection(*admin, timeout=60)
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    times = []
    t_all = time.perf_counter()
    for i in range(N):
        body = json.dumps({"name": f"bench-{i:06d}", "rpm": 1000 + i})
        t0 = time.perf_counter()
        conn.request("POST", "/admin/keys", body=body, headers=auth)
        r = conn.getresponse()
        made = json.loads(r.read())
        times.append((time.perf_counter() - t0) * 1000)
        if r.status != 201:
            raise SystemExit(f"create {i}: {r.status} {made}")
        if i + 1 in MARKS:
            w = sorted(times[-WINDOW:])
            mean = sum(w) / len(w)
            p50 = w[len(w) // 2]
            p99 = w[int(len(w) * 0.99) - 1]
            base, changed = refresh_cost(conn, auth, main_addr, f"bench-{i:06d}", made["key"])
            print(f"{i + 1:6} keys: create mean {mean:6.2f} ms, p50 {p50:6.2f} ms, p99 {p99:7.2f} ms "
                  f"({1000 / mean:5.0f}/s); keyed request p50 {base:.2f} ms, "
                  f"right after a change {changed:.2f} ms", flush=True)
    print(f"{N} creates in {time.perf_counter() - t_all:.1f} s", flush=True)
    time.sleep(1.0)
    before = status_kib(p.pid, "VmRSS")
    after_name, pages, listed, nbytes = None, 0, 0, 0
    t0 = time.perf_counter()
    while True:
        q = "/admin/keys?limit=1000" + (f"&after={after_name}" if after_name else "")
        conn.request("GET", q, headers=auth)
        r = conn.getresponse()
        raw = r.read()
        nbytes += len(raw)
        page = json.loads(raw)
        if r.status != 200:
            raise SystemExit(f"list: {r.status} {page}")
        pages += 1
        listed += len(page["keys"])
        after_name = page.get("next_after")
        if not after_name:
            break
    list_s = time.perf_counter() - t0
    time.sleep(1.0)
    after = status_kib(p.pid, "VmRSS")
    hwm = status_kib(p.pid, "VmHWM")
    print(f"listing: {listed} keys in {pages} page(s), {nbytes / 1e6:.2f} MB, {list_s:.2f} s; "
          f"VmRSS {before / 1024:.1f} MiB before, {after / 1024:.1f} MiB after; "
          f"VmHWM {hwm / 1024:.1f} MiB", flush=True)
    conn.close()
    p.terminate()
    p.wait(timeout=30)
    shutil.rmtree(state, ignore_errors=True)


main()
