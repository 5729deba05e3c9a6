"""Response cache (issue 14) through the official `openai` and `anthropic` SDKs, against the
real binaries: the same request twice is answered once by the upstream (the mock's
`GET /mock/requests` counter), tenants never share, a stream request is answered from a stored
non-stream answer as SSE the SDK parses into the same text (and the reverse), `no-store`
bypasses, entries expire, eviction keeps the bytes under `max_bytes`, the semantic layer hits a
paraphrase and misses a prompt that differs in a number or a "not" (the mock's embeddings: a bag
of normalised words where numbers and negations weigh three times a word), an embedding
failure is a miss, and the admin API purges by model."""

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request

import anthropic
import openai
import pytest

from conftest import BIN, stop

ADMIN_TOKEN = "rg-cache-admin-token-5f0e1d2c3b4a"
ADMIN_RE = re.compile(r"admin listening on http://([0-9.:]+)")
MAIN_RE = re.compile(r" listening on http://([0-9.:]+)")
ADMIN = {}


def upstream_calls(mock):
    with urllib.request.urlopen(f"http://{mock}/mock/requests", timeout=5) as r:
        return json.loads(r.read())


def metric(base, name):
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


@pytest.fixture(scope="module")
def cached(mock, driver):
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = 2

[admin]
listen = "127.0.0.1:0"
token_env = "RG_CACHE_ADMIN"

[cache]
enabled = true
max_bytes = "64MiB"
ttl_s = 3600
store = "memory"

[[provider]]
name = "local"
kind = "openai"
base_url = "http://{mock}/v1"

[[provider]]
name = "an"
kind = "anthropic"
base_url = "http://{mock}"

[[provider]]
name = "down"
kind = "openai"
base_url = "http://127.0.0.1:9/v1"

[[model]]
name = "gpt-4o-mini"
provider = "local"
cache = "exact"

[[model]]
name = "claude-cached"
provider = "an"
cache = "exact"

[[model]]
name = "short-lived"
provider = "local"
upstream_model = "gpt-4o-mini"
cache = "exact"
cache_ttl_s = 1

[[model]]
name = "sem"
provider = "local"
upstream_model = "gpt-4o-mini"
cache = "semantic"
semantic_threshold = 0.95
embedding_model = "text-embedding-3-small"

[[model]]
name = "text-embedding-3-small"
provider = "local"

[[model]]
name = "sem-no-embeddings"
provider = "local"
upstream_model = "gpt-4o-mini"
cache = "semantic"
embedding_model = "embeddings-down"

[[model]]
name = "embeddings-down"
provider = "down"
"""
    yield from start(cfg, driver)


def start(cfg, driver):
    """Run the gateway on `cfg` (with an admin listener); yield its base URL."""
    state = tempfile.mkdtemp(prefix="rg-sdk-cache-")
    path = os.path.join(state, "ringgate.toml")
    with open(path, "w") as f:
        f.write(cfg)
    env = dict(os.environ, RINGGATE_DRIVER=driver, RG_CACHE_ADMIN=ADMIN_TOKEN,
               XDG_DATA_HOME=state)
    proc = subprocess.Popen([BIN, "--config", path], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, env=env)
    main = admin = None
    deadline = time.time() + 20
    while time.time() < deadline and (admin is None or main is None):
        line = proc.stderr.readline()
        if not line:
            break
        m = ADMIN_RE.search(line)
        if m:
            admin = m.group(1)
            continue
        m = MAIN_RE.search(line)
        if m:
            main = m.group(1)
    if admin is None or main is None:
        proc.kill()
        raise RuntimeError("ringgate did not start")
    ADMIN[f"http://{main}"] = f"http://{admin}"
    # the log is drained in the background (a full pipe would block the gateway)
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    yield f"http://{main}"
    stop(proc)
    shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def small(mock, driver):
    """A cache of 4 KiB: a few entries fit."""
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = 2

[admin]
listen = "127.0.0.1:0"
token_env = "RG_CACHE_ADMIN"

[cache]
enabled = true
max_bytes = "4KiB"

[[provider]]
name = "local"
kind = "openai"
base_url = "http://{mock}/v1"

[[model]]
name = "gpt-4o-mini"
provider = "local"
cache = "exact"
"""
    yield from start(cfg, driver)


def oa(base, key="sk-tenant-a"):
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)


def chat(client, prompt, model="gpt-4o-mini", **kw):
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        **kw,
    )
    return raw.headers.get("x-ringgate-cache"), raw.parse()


def test_same_request_twice_is_one_upstream_call(cached, mock):
    c = oa(cached)
    before = upstream_calls(mock)["generate"]
    h1, a = chat(c, "exact twice: name three colours")
    h2, b = chat(c, "exact twice: name three colours", user="someone-else")
    assert (h1, h2) == ("miss", "hit")
    assert upstream_calls(mock)["generate"] - before == 1
    assert a.choices[0].message.content == b.choices[0].message.content
    assert b.usage.completion_tokens == a.usage.completion_tokens


def test_tenants_never_share(cached, mock):
    before = upstream_calls(mock)["generate"]
    h1, _ = chat(oa(cached, "sk-tenant-a"), "tenants: what is a ring buffer")
    h2, _ = chat(oa(cached, "sk-tenant-b"), "tenants: what is a ring buffer")
    h3, _ = chat(oa(cached, "sk-tenant-b"), "tenants: what is a ring buffer")
    assert (h1, h2, h3) == ("miss", "miss", "hit")
    assert upstream_calls(mock)["generate"] - before == 2


def test_stream_hit_is_valid_sse_with_the_same_text(cached, mock):
    c = oa(cached)
    _, whole = chat(c, "stream replay: describe the sea")
    before = upstream_calls(mock)["generate"]
    raw = c.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "stream replay: describe the sea"}],
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert raw.headers.get("x-ringgate-cache") == "hit"
    assert raw.headers.get("content-type").startswith("text/event-stream")
    text, usage, finish = "", None, None
    for chunk in raw.parse():
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert text == whole.choices[0].message.content
    assert finish == "stop"
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert upstream_calls(mock)["generate"] == before


def test_stream_miss_answers_a_later_non_stream_request(cached, mock):
    c = oa(cached)
    prompt = "stream first: list the planets"
    streamed = "".join(
        ch.delta.content or ""
        for chunk in c.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            stream=True,
        )
        for ch in chunk.choices
    )
    before = upstream_calls(mock)["generate"]
    h, whole = chat(c, prompt)
    assert h == "hit"
    assert whole.choices[0].message.content == streamed
    assert upstream_calls(mock)["generate"] == before


def test_anthropic_sdk_hits_and_replays_streams(cached, mock):
    c = anthropic.Anthropic(base_url=cached, api_key="sk-ant-tenant", max_retries=0)
    ask = dict(
        model="claude-cached",
        max_tokens=40,
        messages=[{"role": "user", "content": "anthropic cache: say hello"}],
    )
    before = upstream_calls(mock)["generate"]
    first = c.messages.with_raw_response.create(**ask)
    second = c.messages.with_raw_response.create(**ask)
    assert first.headers.get("x-ringgate-cache") == "miss"
    assert second.headers.get("x-ringgate-cache") == "hit"
    text = first.parse().content[0].text
    assert second.parse().content[0].text == text
    with c.messages.stream(**ask) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text
    assert final.stop_reason == "end_turn"
    assert upstream_calls(mock)["generate"] - before == 1


def test_no_store_and_refresh(cached, mock):
    c = oa(cached)
    prompt = "no-store: explain queues"
    before = upstream_calls(mock)["generate"]
    h1, _ = chat(c, prompt, extra_headers={"cache-control": "no-store"})
    h2, _ = chat(c, prompt)
    h3, _ = chat(c, prompt, extra_headers={"x-ringgate-cache": "refresh"})
    h4, _ = chat(c, prompt, extra_headers={"cache-control": "no-cache"})
    h5, _ = chat(c, prompt)
    # no-store: neither read nor stored; refresh and no-cache: upstream, then stored
    assert (h1, h2, h3, h4, h5) == ("skip", "miss", "miss", "miss", "hit")
    assert upstream_calls(mock)["generate"] - before == 4


def test_entries_expire(cached, mock):
    c = oa(cached)
    prompt = "ttl: a short-lived answer"
    assert chat(c, prompt, model="short-lived")[0] == "miss"
    assert chat(c, prompt, model="short-lived")[0] == "hit"
    deadline = time.time() + 10
    seen = "hit"
    while seen == "hit" and time.time() < deadline:
        time.sleep(0.2)
        seen = chat(c, prompt, model="short-lived")[0]
    assert seen == "miss"


def test_semantic_paraphrase_hits_number_and_not_miss(cached, mock):
    c = oa(cached, "sk-semantic")
    before = upstream_calls(mock)
    assert chat(c, "What is the capital of France?", model="sem")[0] == "miss"
    h, _ = chat(c, "Please tell me the capital of France.", model="sem")
    assert h.startswith("semantic-hit (") and float(h[14:-1]) >= 0.95, h
    assert chat(c, "Is Paris not the capital of France?", model="sem")[0] == "miss"
    assert chat(c, "List 3 facts about the Moon", model="sem")[0] == "miss"
    assert chat(c, "List 5 facts about the Moon", model="sem")[0] == "miss"
    # another tenant never gets the paraphrase hit
    assert chat(oa(cached, "sk-other"), "Capital of France?", model="sem")[0] == "miss"
    after = upstream_calls(mock)
    assert after["generate"] - before["generate"] == 5
    assert after["embeddings"] - before["embeddings"] == 6


def test_embedding_failure_is_a_miss_not_an_error(cached):
    c = oa(cached)
    h, a = chat(c, "embedding down: hello", model="sem-no-embeddings")
    assert h == "miss"
    assert a.choices[0].message.content
    # the exact layer still works for that model
    assert chat(c, "embedding down: hello", model="sem-no-embeddings")[0] == "hit"


def test_admin_purge_by_model(cached):
    c = oa(cached)
    prompt = "purge: a cached answer"
    chat(c, prompt)
    assert chat(c, prompt)[0] == "hit"
    with urllib.request.urlopen(f"{cached}/metrics", timeout=5) as r:
        assert "ringgate_cache_hits_total" in r.read().decode()
    admin = admin_base(cached)
    req = urllib.request.Request(
        f"{admin}/admin/cache/purge",
        data=json.dumps({"model": "gpt-4o-mini"}).encode(),
        headers={"authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        assert json.loads(r.read())["purged"] >= 1
    assert chat(c, prompt)[0] == "miss"


def admin_base(base):
    """The admin listener of the gateway at `base` (read from its start-up log)."""
    return ADMIN[base]


def test_eviction_keeps_bytes_under_max_bytes(small, mock):
    c = oa(small)
    prompts = [f"eviction {i}: tell a short story" for i in range(20)]
    for p in prompts:
        assert chat(c, p, max_tokens=8)[0] == "miss"
        assert metric(small, "ringgate_cache_bytes") <= 4096
    assert metric(small, "ringgate_cache_evictions_total") >= 10
    assert 1 <= metric(small, "ringgate_cache_entries") < 20
    # the most recent answer is still there, the oldest was evicted
    assert chat(c, prompts[-1], max_tokens=8)[0] == "hit"
    assert chat(c, prompts[0], max_tokens=8)[0] == "miss"
