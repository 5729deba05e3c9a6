#!/usr/bin/env python3
"""Streamed upload throughput: one raw-socket multipart upload of SIZE MiB (default 300) through
the gateway (io_uring, epoll; one shard) and straight to the same fake upstream
(tests/sdk/test_files.py's `Upstream`, which hashes what arrives), MiB/s of each.

    RINGGATE_BIN=target/release/ringgate python benches/surface-upload.py [SIZE_MIB]
"""
import os
import pathlib
import socket
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "sdk"))
SIZE = int(sys.argv[1]) if len(sys.argv) > 1 else 300
os.environ["RG_UPLOAD_MIB"] = str(SIZE)

import conftest  # noqa: E402
import test_files as t  # noqa: E402


def upload(base, size):
    host, port = base.removeprefix("http://").split(":")
    head = (b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="x"\r\n\r\n')
    tail = b"\r\n--b--\r\n"
    n = len(head) + size + len(tail)
    with socket.create_connection((host, int(port))) as s:
        t0 = time.time()
        s.sendall(f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {t.KEY}\r\n"
                  f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {n}\r\n\r\n".encode() + head)
        block = b"a" * (1 << 20)
        for _ in range(size >> 20):
            s.sendall(block)
        s.sendall(tail)
        status = s.recv(4096)[:12]
        return status, time.time() - t0


for via in ["io_uring", "epoll", "direct"]:
    up = t.Upstream()
    proc = None
    if via == "direct":
        base = up.url
    else:
        proc, base, path = t.start(t.config(1, up), via)
    status, dt = upload(base, SIZE << 20)
    print(f"{via:8} {status.decode()} {SIZE} MiB in {dt:.2f} s: {SIZE / dt:.0f} MiB/s")
    if proc:
        conftest.stop(proc)
        os.unlink(path)
    up.stop()
