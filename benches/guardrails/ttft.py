#!/usr/bin/env python3
"""Guardrails end to end: time to first token and gateway CPU per streamed event with
`pii` + `secrets` on the model against off, through the real gateway in front of
`ringgate mock`.

  benches/guardrails/ttft.py BIN [--requests N] [--profile paced|instant]

BIN is a release-like ringgate binary. For each setting (off, on) it starts the mock and a
one-shard gateway, warms up, then sends N sequential Chat streams (64 deltas each) and
reports: median / p90 time to the first content byte and to the first letter (a word that
could still start a match is held until it ends), total stream time, and the gateway's CPU
time (utime + stime from /proc) per streamed event.
"""

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

LISTEN_RE = re.compile(r"listening on http://([0-9.:]+)")


def spawn(bin_, args):
    p = subprocess.Popen([bin_, *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         text=True, env={**os.environ, "XDG_DATA_HOME": tempfile.mkdtemp()})
    while True:
        line = p.stderr.readline()
        if not line:
            raise SystemExit("did not start")
        m = LISTEN_RE.search(line)
        if m:
            return p, m.group(1)


def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def one(addr):
    host, port = addr.split(":")
    body = json.dumps({"model": "m", "stream": True, "max_tokens": 64,
                       "messages": [{"role": "user", "content": "hi"}]})
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.perf_counter()
    s.sendall(req)
    buf, first_byte, first_letter, events = b"", None, None, 0
    while b"data: [DONE]" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
        now = time.perf_counter()
        for m in re.finditer(rb'"content":"([^"]*)"', chunk):
            if m.group(1) and first_byte is None:
                first_byte = now - t0
            if re.search(rb"[A-Za-z]", m.group(1)) and first_letter is None:
                first_letter = now - t0
    total = time.perf_counter() - t0
    events = buf.count(b"data: ")
    s.close()
    return first_byte, first_letter, total, events


def run(bin_, profile, on, n):
    mock, maddr = spawn(bin_, ["mock", "--listen", "127.0.0.1:0", "--profile", profile])
    guard = 'guardrails = ["pii", "secrets"]' if on else ""
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = 1

[[provider]]
name = "mock"
kind = "openai"
base_url = "http://{maddr}/v1"

[[guardrail]]
name = "pii"
detect = ["email", "phone", "credit_card", "iban", "us_ssn", "ipv4"]
action = "mask"

[[guardrail]]
name = "secrets"
detect = ["secrets"]
action = "block"

[[model]]
name = "m"
provider = "mock"
{guard}
"""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(cfg)
    gw, gaddr = spawn(bin_, ["--config", f.name])
    try:
        for _ in range(5):
            one(gaddr)
        c0 = cpu(gw.pid)
        res = [one(gaddr) for _ in range(n)]
        c1 = cpu(gw.pid)
    finally:
        gw.terminate()
        mock.terminate()
        gw.wait()
        mock.wait()
        os.unlink(f.name)
    fb = [r[0] for r in res if r[0] is not None]
    fl = [r[1] for r in res if r[1] is not None]
    tot = [r[2] for r in res]
    ev = sum(r[3] for r in res)
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] * 1000
    return {"setting": "on" if on else "off", "requests": n, "events": ev,
            "first_byte_p50_ms": q(fb, 0.5), "first_byte_p90_ms": q(fb, 0.9),
            "first_letter_p50_ms": q(fl, 0.5), "first_letter_p90_ms": q(fl, 0.9),
            "total_p50_ms": q(tot, 0.5), "cpu_us_per_event": (c1 - c0) / ev * 1e6}


def main():
    bin_ = sys.argv[1]
    n = int(sys.argv[sys.argv.index("--requests") + 1]) if "--requests" in sys.argv else 40
    profile = sys.argv[sys.argv.index("--profile") + 1] if "--profile" in sys.argv else "paced"
    for on in (False, True):
        print(json.dumps(run(bin_, profile, on, n)))


if __name__ == "__main__":
    main()
