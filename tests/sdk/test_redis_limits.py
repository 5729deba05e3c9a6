"""Limits shared through a real redis-server, seen through the official SDKs: two gateway
processes (one per I/O driver) share one key's rpm, so the SDKs raise RateLimitError once the
key's requests across both reach the limit — not the limit per process."""

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

import anthropic
import openai
import pytest

from conftest import serve_config

KEY = "rg-sdk-redis-0a1b2c3d4e5f60718293a4b5c6d7e8f9"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_port():
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (apt-get install -y redis-server)")
    port = free_port()
    d = tempfile.mkdtemp(prefix="rg-sdk-redis-")
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", d],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            pass
        assert time.time() < deadline, "redis-server did not start"
        time.sleep(0.02)
    yield port
    proc.kill()
    proc.wait()
    shutil.rmtree(d, ignore_errors=True)


def gateway_config(port, shards):
    # (one database per shard count: each run starts its window at 0 on the shared server)
    return f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}

[limits]
store = "redis"
redis_url = "redis://127.0.0.1:{port}/{shards}"
# generous: on a loaded CI box a 50 ms reply deadline (the default) falls back to local counters
redis_timeout_ms = 2000
on_store_error = "local"

[[provider]]
name = "mock"
kind = "mock"

[[model]]
name = "gpt-4o-mini"
provider = "mock"

[[key]]
name = "fleet"
key_env = "RG_SDK_REDIS_KEY"
rpm = 4
"""


@pytest.fixture(scope="module")
def two_gateways(redis_port, shards):
    cfg = gateway_config(redis_port, shards)
    a = serve_config(cfg, {"RINGGATE_DRIVER": "io_uring", "RG_SDK_REDIS_KEY": KEY})
    b = serve_config(cfg, {"RINGGATE_DRIVER": "epoll", "RG_SDK_REDIS_KEY": KEY})
    urls = (next(a), next(b))
    for url in urls:
        wait_store_up(url, shards)
    yield urls
    for g in (a, b):
        next(g, None)


def wait_store_up(url, shards):
    import urllib.request
    deadline = time.time() + 10
    while True:
        text = urllib.request.urlopen(url + "/metrics").read().decode()
        if len(re.findall(r'^ringgate_limit_store_up\{shard="\d+"\} 1$', text, re.M)) == shards:
            return
        assert time.time() < deadline, text
        time.sleep(0.05)


def fresh_window(need=10):
    """Wait until at least `need` seconds are left in the wall-clock minute (the window)."""
    left = 60 - time.time() % 60
    if left < need:
        time.sleep(left + 0.05)


def test_the_openai_and_anthropic_sdks_hit_one_limit_shared_by_two_gateways(two_gateways):
    a, b = two_gateways
    oa = openai.OpenAI(base_url=a + "/v1", api_key=KEY, max_retries=0)
    ob = openai.OpenAI(base_url=b + "/v1", api_key=KEY, max_retries=0)
    fresh_window()
    for client in (oa, ob, oa, ob):
        r = client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert r.headers["x-ratelimit-limit-requests"] == "4"
        assert r.parse().choices[0].message.content
    # 4 requests between the two processes: the key's limit, on either of them
    for client in (oa, ob):
        with pytest.raises(openai.RateLimitError) as e:
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        retry = int(e.value.response.headers["retry-after"])
        assert 1 <= retry <= 60
        assert e.value.response.headers["x-ratelimit-remaining-requests"] == "0"
        assert "requests per minute" in str(e.value)
    anth = anthropic.Anthropic(base_url=b, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.RateLimitError):
        anth.messages.create(model="gpt-4o-mini", max_tokens=3,
                             messages=[{"role": "user", "content": "hi"}])
