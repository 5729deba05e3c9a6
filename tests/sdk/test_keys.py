"""Virtual keys and per-key limits through the official `openai` and `anthropic` SDKs: the SDKs
raise their own AuthenticationError / PermissionDeniedError / RateLimitError; a client's key
never reaches the upstream; a non-loopback listener without keys refuses to start."""

import http.server
import json
import subprocess
import threading

import anthropic
import openai
import pytest

from conftest import BIN, serve_config

TEAM_KEY = "rg-sdk-test-5b0e8f3a1c7d4e2f9a6b8c0d1e3f5a7b"
NARROW_KEY = "rg-sdk-test-narrow-00112233445566778899aabb"
LIMITED_KEY = "rg-sdk-test-limited-ffeeddccbbaa99887766554"


@pytest.fixture(scope="module")
def keyed(mock, driver, shards):
    """A gateway with three keys in front of the mock: unrestricted, one model only, and one
    with rpm = 2 and tpm = 2000."""
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}

[[provider]]
name = "local"
kind = "openai"
base_url = "http://{mock}/v1"

[[model]]
name = "gpt-4o-mini"
provider = "local"

[[model]]
name = "claude-native"
provider = "local"
upstream_model = "gpt-4o-mini"

[[key]]
name = "team"
key_env = "RG_SDK_TEAM_KEY"

[[key]]
name = "narrow"
key_env = "RG_SDK_NARROW_KEY"
models = ["claude-native"]

[[key]]
name = "limited"
key_env = "RG_SDK_LIMITED_KEY"
rpm = 2
tpm = 2000
"""
    env = {"RINGGATE_DRIVER": driver, "RG_SDK_TEAM_KEY": TEAM_KEY,
           "RG_SDK_NARROW_KEY": NARROW_KEY, "RG_SDK_LIMITED_KEY": LIMITED_KEY}
    yield from serve_config(cfg, env)


def oa(base, key):
    return openai.OpenAI(base_url=base + "/v1", api_key=key or "unused", max_retries=0,
                         timeout=10)


def an(base, key):
    return anthropic.Anthropic(base_url=base, api_key=key or "unused", max_retries=0,
                               timeout=10)


def chat(client, model="gpt-4o-mini", **kw):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3, **kw)


def message(client, model="gpt-4o-mini", max_tokens=3, **kw):
    return client.messages.create(model=model, max_tokens=max_tokens,
                                  messages=[{"role": "user", "content": "hi"}], **kw)


@pytest.mark.parametrize("key", ["", "rg-wrong-key"])
def test_no_key_or_wrong_key_is_authentication_error(keyed, key):
    # key "": the SDKs send no key header at all
    no_oa = {"Authorization": openai.Omit()} if key == "" else None
    no_an = {"X-Api-Key": anthropic.Omit()} if key == "" else None
    with pytest.raises(openai.AuthenticationError) as e:
        chat(oa(keyed, key), extra_headers=no_oa)
    assert e.value.status_code == 401
    assert e.value.body["code"] == "invalid_api_key"
    assert ("missing API key" in e.value.message) == (key == "")
    assert "rg-wrong-key" not in str(e.value)
    with pytest.raises(anthropic.AuthenticationError) as e:
        message(an(keyed, key), extra_headers=no_an)
    assert e.value.status_code == 401
    assert e.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        oa(keyed, key).models.list(extra_headers=no_oa)


def test_a_valid_key_works_in_both_sdks(keyed):
    assert chat(oa(keyed, TEAM_KEY)).choices[0].message.content
    assert message(an(keyed, TEAM_KEY)).content[0].text
    assert [m.id for m in oa(keyed, TEAM_KEY).models.list()]


def test_a_model_outside_the_allow_list_is_permission_denied(keyed):
    with pytest.raises(openai.PermissionDeniedError) as e:
        chat(oa(keyed, NARROW_KEY))
    assert e.value.status_code == 403
    with pytest.raises(anthropic.PermissionDeniedError) as e:
        message(an(keyed, NARROW_KEY))
    assert e.value.body["error"]["type"] == "permission_error"
    assert message(an(keyed, NARROW_KEY), model="claude-native").content[0].text


def test_rpm_and_tpm_are_rate_limit_errors_with_retry_after(keyed):
    client = oa(keyed, LIMITED_KEY)
    r = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.headers["x-ratelimit-limit-requests"] == "2"
    assert r.headers["x-ratelimit-remaining-requests"] == "1"
    assert int(r.headers["x-ratelimit-remaining-tokens"]) < 2000
    # over tpm: 429 on the body, before the request goes upstream
    with pytest.raises(anthropic.RateLimitError) as e:
        message(an(keyed, LIMITED_KEY), max_tokens=5000)
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 60
    assert e.value.body["error"]["type"] == "rate_limit_error"
    # that one counted as a request (rpm is decided on the head): the third is over rpm
    with pytest.raises(openai.RateLimitError) as e:
        chat(client)
    assert e.value.status_code == 429
    assert 1 <= int(e.value.response.headers["retry-after"]) <= 60
    assert e.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert "limited" in e.value.message and LIMITED_KEY not in e.value.message


class Recorder(http.server.BaseHTTPRequestHandler):
    """A raw upstream that records every request's headers and answers a small chat body."""
    seen = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        Recorder.seen.append({k.lower(): v for k, v in self.headers.items()})
        body = json.dumps({
            "id": "x", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_clients_key_never_reaches_the_upstream(driver, shards):
    up = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    Recorder.seen = []
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}

[[provider]]
name = "up"
kind = "openai"
base_url = "http://127.0.0.1:{up.server_address[1]}/v1"
api_key_env = "RG_SDK_PROVIDER_KEY"

[[model]]
name = "gpt-4o-mini"
provider = "up"

[[model]]
name = "claude-x"
provider = "up"
upstream_model = "gpt-4o-mini"

[[key]]
name = "team"
key_env = "RG_SDK_TEAM_KEY"
"""
    env = {"RINGGATE_DRIVER": driver, "RG_SDK_TEAM_KEY": TEAM_KEY,
           "RG_SDK_PROVIDER_KEY": "sk-provider-only"}
    gen = serve_config(cfg, env)
    base = next(gen)
    try:
        assert chat(oa(base, TEAM_KEY)).choices[0].message.content == "ok"
        assert message(an(base, TEAM_KEY), model="claude-x").content[0].text == "ok"
    finally:
        gen.close()
        up.shutdown()
    assert len(Recorder.seen) == 2
    for h in Recorder.seen:
        assert TEAM_KEY not in json.dumps(h)
        assert h["authorization"] == "Bearer sk-provider-only"
        assert "x-api-key" not in h


def test_a_non_loopback_listener_without_keys_refuses_to_start():
    r = subprocess.run([BIN, "--listen", "0.0.0.0:0"], capture_output=True, text=True,
                       timeout=20)
    assert r.returncode != 0
    assert "without keys" in r.stderr and 'auth = "none"' in r.stderr
