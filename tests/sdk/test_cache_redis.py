"""The response cache's exact layer in a real redis-server (`[cache] store = "redis"`), seen
through the official `openai` SDK: two gateway processes share one Redis, so an answer stored
by one is a hit on the other (the upstream saw one request), replayed as a stream there too;
entries carry the model's TTL; a Redis that goes away makes requests misses, never errors."""

import socket
import time
import uuid

import openai
import pytest

from conftest import serve_config
from test_cache import upstream_calls
from test_redis_limits import redis_port  # noqa: F401 (fixture)


def redis(port, *args):
    """One command over RESP; the raw reply."""
    cmd = f"*{len(args)}\r\n" + "".join(f"${len(str(a))}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(cmd.encode())
        return s.recv(65536)


def config(mock, port):
    return f"""
[server]
listen = "127.0.0.1:0"
shards = 2

[limits]
redis_url = "redis://127.0.0.1:{port}/0"
redis_prefix = "rgtest:"
redis_timeout_ms = 2000

[cache]
enabled = true
store = "redis"
ttl_s = 600

[[provider]]
name = "local"
kind = "openai"
base_url = "http://{mock}/v1"

[[model]]
name = "gpt-4o-mini"
provider = "local"
cache = "exact"
"""


@pytest.fixture(scope="module")
def fleet(mock, redis_port):  # noqa: F811
    a = serve_config(config(mock, redis_port), {"RINGGATE_DRIVER": "io_uring"})
    b = serve_config(config(mock, redis_port), {"RINGGATE_DRIVER": "epoll"})
    yield next(a), next(b)
    for g in (a, b):
        for _ in g:
            pass


def ask(base, prompt, **kw):
    c = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-fleet", max_retries=0)
    return c.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": prompt}], temperature=0, **kw
    )


def wait_for_store(port, base, prompt):
    """Until the gateways' Redis connections are up and an answer is stored: one miss that
    lands in Redis (polled, not slept on)."""
    deadline = time.time() + 10
    while time.time() < deadline:
        ask(base, prompt)
        if ask(base, prompt).headers.get("x-ringgate-cache") == "hit":
            return
        time.sleep(0.1)
    raise AssertionError("nothing was stored in Redis")


def test_one_gateway_stores_the_other_hits(fleet, mock, redis_port):  # noqa: F811
    a, b = fleet
    run = uuid.uuid4().hex[:8]  # the Redis outlives one parametrised run
    warm = f"fleet warm-up {run}"
    wait_for_store(redis_port, a, warm)
    # b's connection may still be coming up: poll until it answers from Redis
    deadline = time.time() + 10
    while ask(b, warm).headers.get("x-ringgate-cache") != "hit":
        assert time.time() < deadline, "gateway b never hit"
        time.sleep(0.1)
    before = upstream_calls(mock)["generate"]
    prompt = f"fleet {run}: what is a cache line"
    stored = redis(redis_port, "KEYS", "rgtest:cache:*").count(b"rgtest:cache:")
    first = ask(a, prompt)
    assert first.headers.get("x-ringgate-cache") == "miss"
    key_seen = time.time() + 5
    while redis(redis_port, "KEYS", "rgtest:cache:*").count(b"rgtest:cache:") <= stored:
        assert time.time() < key_seen
        time.sleep(0.05)
    second = ask(b, prompt)
    assert second.headers.get("x-ringgate-cache") == "hit"
    assert second.parse().choices[0].message.content == first.parse().choices[0].message.content
    stream = ask(b, prompt, stream=True)
    assert stream.headers.get("x-ringgate-cache") == "hit"
    text = "".join(ch.delta.content or "" for chunk in stream.parse() for ch in chunk.choices)
    assert text == first.parse().choices[0].message.content
    assert upstream_calls(mock)["generate"] - before == 1
    # the model's TTL is on the key
    keys = [k for k in redis(redis_port, "KEYS", "rgtest:cache:*").split(b"\r\n")
            if k.startswith(b"rgtest:cache:")]
    ttl = int(redis(redis_port, "PTTL", keys[0].decode())[1:].split(b"\r\n")[0])
    assert 0 < ttl <= 600_000


def test_an_answer_over_the_store_clients_bulk_bound_is_shared(fleet, mock, redis_port):  # noqa: F811
    """A ~100 KB answer (over the store client's 64 KiB bulk bound, read back in pieces) stored
    by one gateway is a whole, identical hit on the other, and the cache connection survives."""
    a, b = fleet
    run = uuid.uuid4().hex[:8]
    wait_for_store(redis_port, a, f"big warm-up {run}")
    prompt = f"big {run}: write at length"
    before = upstream_calls(mock)["generate"]
    first = ask(a, prompt, max_tokens=20000)
    assert first.headers.get("x-ringgate-cache") == "miss"
    text = first.parse().choices[0].message.content
    assert len(text) > 64 * 1024
    deadline = time.time() + 10
    while True:
        second = ask(b, prompt, max_tokens=20000)
        if second.headers.get("x-ringgate-cache") == "hit":
            break
        assert time.time() < deadline, "gateway b never hit the large answer"
        time.sleep(0.2)
    assert second.parse().choices[0].message.content == text
    # a small answer right after: b's cache connection still works
    small = f"small {run}"
    ask(a, small)
    deadline = time.time() + 10
    while ask(b, small).headers.get("x-ringgate-cache") != "hit":
        assert time.time() < deadline
        time.sleep(0.2)
