#!/usr/bin/env python3
"""Idle-connection memory of a `ringgate serve` process.

usage: benches/idle-rss.py [BINARY] [N]   (default target/release/ringgate, 10000)

Starts the gateway (built-in config, one shard, epoll and io_uring in turn), opens N client
connections that each send one `GET /healthz` and then stay idle, and reads the process's
VmRSS from /proc: before, while the N connections idle, and after they all closed. Prints
KiB per idle connection. Needs `ulimit -n` above N (the script raises its own soft limit).
"""
import os
import re
import resource
import socket
import subprocess
import sys
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/ringgate"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 10000


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def run(driver):
    env = dict(os.environ, RINGGATE_DRIVER=driver)
    env.pop("OPENAI_API_KEY", None)
    p = subprocess.Popen(
        [BIN, "serve", "--listen", "127.0.0.1:0", "--shards", "1"],
        stderr=subprocess.PIPE, text=True, env=env)
    addr = None
    for line in p.stderr:
        m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if m:
            addr = (m.group(1), int(m.group(2)))
            break
    time.sleep(0.3)
    base = rss_kib(p.pid)
    socks = []
    req = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    for i in range(N):
        # from 127.1.x.1, 1000 per address: under the default max_connections_per_address
        s = socket.create_connection(addr, source_address=(f"127.1.{i // 1000}.1", 0))
        s.sendall(req)
        got = b""
        while b'{"status":"ok"}' not in got:
            chunk = s.recv(4096)
            if not chunk:
                raise SystemExit("connection closed early (max_connections?)")
            got += chunk
        socks.append(s)
    time.sleep(2.0)
    idle = rss_kib(p.pid)
    for s in socks:
        s.close()
    time.sleep(3.0)
    after = rss_kib(p.pid)
    p.terminate()
    p.wait(timeout=30)
    per = (idle - base) / N
    print(f"{driver:8} N={N}: base {base/1024:.1f} MiB, idle {idle/1024:.1f} MiB "
          f"({per:.2f} KiB/conn), after close {after/1024:.1f} MiB")


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, N + 100)), hard))
    for driver in ["epoll", "io_uring"]:
        run(driver)


main()
