"""The official `openai` and `anthropic` SDKs through the gateway to a real llama.cpp engine
(issue 22): `llama-server` built by `.ci/llama-engine` (LLAMA_SERVER / LLAMA_MODEL; skipped
without them unless RINGGATE_REQUIRE_LLAMA is set, as in .ci/run), SmolLM2-135M, one thread,
`-np 2`. Greedy decoding (temperature 0) on one thread is deterministic, so the same request
sent straight to the engine gives the reference text and token counts: through the gateway,
stream or not, in the OpenAI or Anthropic dialect, usage is exactly the engine's."""

import json
import os
import re
import subprocess
import tempfile
import time
import urllib.request

import anthropic
import openai
import pytest

from conftest import serve_config

SERVER = os.environ.get("LLAMA_SERVER")
MODEL = os.environ.get("LLAMA_MODEL")
ALIAS = "smollm2"
PROMPT = "Name three colours."
MAX_TOKENS = 12

if not (SERVER and MODEL and os.path.isfile(SERVER) and os.path.isfile(MODEL)):
    if os.environ.get("RINGGATE_REQUIRE_LLAMA"):
        raise RuntimeError("LLAMA_SERVER / LLAMA_MODEL missing but RINGGATE_REQUIRE_LLAMA is set")
    pytest.skip("no real llama-server (eval \"$(.ci/llama-engine env)\")", allow_module_level=True)


def get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


@pytest.fixture(scope="module")
def engine():
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    cmd = [SERVER, "-m", MODEL, "--host", "127.0.0.1", "--port", "0", "-t", "1", "-tb", "1",
           "-np", "2", "-c", "4096", "--no-warmup", "--alias", ALIAS]
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        addr = None
        while time.time() < deadline and addr is None:
            assert proc.poll() is None, open(log.name).read()
            m = re.search(r"listening on http://(127\.0\.0\.1:\d+)", open(log.name).read())
            addr = m and m.group(1)
            time.sleep(0.05)
        assert addr, open(log.name).read()
        while time.time() < deadline and get(f"http://{addr}/health")[0] != 200:
            time.sleep(0.05)
        assert get(f"http://{addr}/health")[0] == 200, open(log.name).read()
        yield addr
    finally:
        proc.kill()
        proc.wait()
        os.unlink(log.name)


@pytest.fixture(scope="module")
def gw(engine, shards):
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}

[[provider]]
name = "eng0"
kind = "openai-compatible"
engine = "llamacpp"
base_url = "http://{engine}/v1"

[[model]]
name = "{ALIAS}"
provider = "eng0"
lb = "load"
"""
    yield from serve_config(cfg, {})


@pytest.fixture(scope="module")
def reference(engine):
    """The engine's own answer to the request, sent straight to it."""
    body = json.dumps({"model": ALIAS, "temperature": 0, "max_tokens": MAX_TOKENS,
                       "messages": [{"role": "user", "content": PROMPT}]}).encode()
    req = urllib.request.Request(f"http://{engine}/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        v = json.load(r)
    return v["choices"][0]["message"]["content"], v["usage"]


def oa(gw):
    return openai.OpenAI(base_url=f"{gw}/v1", api_key="unused", max_retries=0, timeout=120)


def an(gw):
    # greedy decoding: `temperature` goes in extra_body (recent anthropic SDKs no longer take
    # it as a keyword of messages.create / messages.stream)
    return anthropic.Anthropic(base_url=gw, api_key="unused", max_retries=0, timeout=120)


def test_openai_sdk_exact_usage(gw, reference):
    text, usage = reference
    r = oa(gw).chat.completions.create(model=ALIAS, temperature=0, max_tokens=MAX_TOKENS,
                                       messages=[{"role": "user", "content": PROMPT}])
    assert r.choices[0].message.content == text
    assert r.usage.prompt_tokens == usage["prompt_tokens"]
    assert r.usage.completion_tokens == usage["completion_tokens"]
    # max_tokens reached: the engine says so
    assert r.choices[0].finish_reason in ("length", "stop")


def test_openai_sdk_stream_exact_usage(gw, reference):
    text, usage = reference
    got, last = [], None
    with oa(gw).chat.completions.create(model=ALIAS, temperature=0, max_tokens=MAX_TOKENS,
                                        stream=True, stream_options={"include_usage": True},
                                        messages=[{"role": "user", "content": PROMPT}]) as s:
        for ev in s:
            for c in ev.choices:
                if c.delta.content:
                    got.append(c.delta.content)
            if ev.usage:
                last = ev.usage
    assert "".join(got) == text
    assert last is not None
    assert (last.prompt_tokens, last.completion_tokens) == (
        usage["prompt_tokens"], usage["completion_tokens"])


def anthropic_input(u):
    """The prompt tokens of an Anthropic usage: `input_tokens` excludes what was read from the
    cache (the engine reuses the repeated prompt: llama-server's `cached_tokens` become
    `cache_read_input_tokens`)."""
    return u.input_tokens + (u.cache_read_input_tokens or 0)


def test_anthropic_sdk_exact_usage(gw, reference):
    text, usage = reference
    m = an(gw).messages.create(model=ALIAS, extra_body={"temperature": 0}, max_tokens=MAX_TOKENS,
                               messages=[{"role": "user", "content": PROMPT}])
    assert "".join(b.text for b in m.content if b.type == "text") == text
    assert anthropic_input(m.usage) == usage["prompt_tokens"]
    assert m.usage.output_tokens == usage["completion_tokens"]


def test_anthropic_sdk_stream_exact_usage(gw, reference):
    text, usage = reference
    with an(gw).messages.stream(model=ALIAS, extra_body={"temperature": 0}, max_tokens=MAX_TOKENS,
                                messages=[{"role": "user", "content": PROMPT}]) as s:
        got = "".join(s.text_stream)
        final = s.get_final_message()
    assert got == text
    assert anthropic_input(final.usage) == usage["prompt_tokens"]
    assert final.usage.output_tokens == usage["completion_tokens"]
