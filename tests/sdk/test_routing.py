"""Fallback across dialects with the official `openai` SDK (issue 9): the model gpt-4o-mini has
two deployments whose upstreams answer 500 on every request (`ringgate mock --fault 500`, one
mock process per deployment); it falls back to `claude-haiku` on an anthropic-kind provider, so
the OpenAI client is served through the translator — stream and non-stream. The SDK runs with
`max_retries=0`: every retry is the gateway's."""

import openai
import pytest

from conftest import serve_config, spawn, stop
from test_openai_sdk import expected

CONFIG = """
[server]
listen = "127.0.0.1:0"
shards = {shards}

[[provider]]
name = "a"
kind = "openai"
base_url = "http://{a}/v1"

[[provider]]
name = "a2"
kind = "openai-compatible"
base_url = "http://{a2}/v1"

[[provider]]
name = "b"
kind = "anthropic"
base_url = "http://{b}"
api_key_env = "RG_TEST_B_KEY"

[[model]]
name = "gpt-4o-mini"
deployments = [
  {{ provider = "a", upstream_model = "gpt-4o-mini", weight = 3 }},
  {{ provider = "a2", upstream_model = "gpt-4o-mini", weight = 1 }},
]
lb = "p2c"
fallbacks = ["claude-haiku"]
max_attempts = 3
breaker = {{ failures = 5, cooldown_ms = 10000 }}

[[model]]
name = "claude-haiku"
provider = "b"
upstream_model = "claude-3-5-haiku-latest"
"""


@pytest.fixture(scope="module")
def routed(driver, shards):
    env = {"RINGGATE_DRIVER": driver}
    procs = []
    try:
        addrs = {}
        for name, fault in [("a", ["--fault", "500"]), ("a2", ["--fault", "500"]), ("b", [])]:
            proc, addr = spawn(["mock", "--listen", "127.0.0.1:0", "--profile", "instant", *fault],
                               env)
            procs.append(proc)
            addrs[name] = addr
        cfg = CONFIG.format(shards=shards, **addrs)
        yield from serve_config(cfg, {**env, "RG_TEST_B_KEY": "sk-ant-test"})
    finally:
        for p in procs:
            stop(p)


def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=10)


def test_fallback_non_stream(routed):
    raw = client(routed).chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}], max_tokens=12)
    assert raw.headers["x-ringgate-provider"] == "b"
    assert raw.headers["x-ringgate-attempts"] == "3"
    r = raw.parse()
    assert r.choices[0].message.content == expected(12)
    assert r.choices[0].finish_reason == "stop"
    assert r.model == "gpt-4o-mini"
    assert r.usage.completion_tokens == 12


def test_fallback_stream(routed):
    raw = client(routed).chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}], max_tokens=12,
        stream=True, stream_options={"include_usage": True})
    assert raw.headers["x-ringgate-provider"] == "b"
    assert raw.headers["x-ringgate-attempts"] == "3"
    text, finish, usage = "", None, None
    for chunk in raw.parse():
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert text == expected(12)
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == 12
