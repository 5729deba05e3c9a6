"""A key's limits are the key's, not a shard's, seen through the official `openai` and
`anthropic` SDKs: a gateway with 2 or 4 shards, every call on a new client (a new connection,
so the calls land on every shard), `max_retries=0`. With `rpm = 5` the first five calls succeed
and the sixth raises the SDK's RateLimitError, whose headers give the key's own limit."""

import anthropic
import openai
import pytest

from conftest import serve_config

OA_KEY = "rg-sdk-test-shards-oa-0a1b2c3d4e5f60718293a4b5"
AN_KEY = "rg-sdk-test-shards-an-f0e1d2c3b4a5968778695a4b"


@pytest.fixture(params=[2, 4], scope="module")
def sharded(request, mock, driver):
    """A gateway with `shards` = 2 or 4 in front of the mock; two keys with rpm = 5."""
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = {request.param}

[[provider]]
name = "local"
kind = "openai"
base_url = "http://{mock}/v1"

[[model]]
name = "gpt-4o-mini"
provider = "local"

[[key]]
name = "oa"
key_env = "RG_SDK_SHARDS_OA"
rpm = 5

[[key]]
name = "an"
key_env = "RG_SDK_SHARDS_AN"
rpm = 5
"""
    env = {"RINGGATE_DRIVER": driver, "RG_SDK_SHARDS_OA": OA_KEY, "RG_SDK_SHARDS_AN": AN_KEY}
    yield from serve_config(cfg, env)


def chat(base):
    # a new client: a new connection pool, so a new connection (and maybe another shard)
    with openai.OpenAI(base_url=base + "/v1", api_key=OA_KEY, max_retries=0, timeout=10) as c:
        return c.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=3)


def message(base):
    with anthropic.Anthropic(base_url=base, api_key=AN_KEY, max_retries=0, timeout=10) as c:
        return c.messages.create(
            model="gpt-4o-mini", max_tokens=3, messages=[{"role": "user", "content": "hi"}])


def test_openai_sdk_gets_five_then_rate_limit_error(sharded):
    for _ in range(5):
        assert chat(sharded).choices[0].message.content
    for _ in range(3):
        with pytest.raises(openai.RateLimitError) as e:
            chat(sharded)
        assert e.value.response.headers["x-ratelimit-limit-requests"] == "5"
        assert e.value.response.headers["x-ratelimit-remaining-requests"] == "0"
        assert "5 requests per minute" in str(e.value)


def test_anthropic_sdk_gets_five_then_rate_limit_error(sharded):
    for _ in range(5):
        assert message(sharded).content[0].text
    for _ in range(3):
        with pytest.raises(anthropic.RateLimitError) as e:
            message(sharded)
        assert e.value.response.headers["x-ratelimit-limit-requests"] == "5"
        assert "5 requests per minute" in str(e.value)
