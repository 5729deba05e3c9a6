"""Usage, spend and budgets through the official `openai` and `anthropic` SDKs: streamed usage is
counted exactly (read back from /metrics) whether or not the client asked for it, a client never
sees a usage chunk it did not ask for, and a budget runs out at the right request as the SDK's
RateLimitError (OpenAI `insufficient_quota`, Anthropic `billing_error`), which the SDKs do not
retry."""

import math
import re
import time
import urllib.request

import anthropic
import openai
import pytest

from conftest import serve_config

KEYS = {
    "usage": "rg-sdk-usage-7c1d2e3f4a5b6c7d8e9f0a1b2c3d",
    "budget-oa": "rg-sdk-budget-oa-0f1e2d3c4b5a69788796a5b4",
    "budget-an": "rg-sdk-budget-an-a1b2c3d4e5f60718293a4b5c",
}
TEXT = "The quick brown fox jumps"  # 25 bytes: the mock counts 7 input tokens


@pytest.fixture(scope="module")
def metered(mock, driver, shards):
    """A gateway in front of the mock as an OpenAI and an Anthropic provider, both priced, and
    three keys: one without a budget, two with a budget of exactly three requests."""
    # gpt-4o-mini: 1 input token ("hi") × 1 µUSD + 4 output × 2 µUSD = 9 µUSD a request
    # claude:      1 × 3 µUSD + 4 × 15 µUSD = 63 µUSD a request
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}

[[provider]]
name = "oa"
kind = "openai"
base_url = "http://{mock}/v1"

[[provider]]
name = "an"
kind = "anthropic"
base_url = "http://{mock}"

[[model]]
name = "gpt-4o-mini"
provider = "oa"
price_input_per_mtok = 1.0
price_output_per_mtok = 2.0

[[model]]
name = "claude"
provider = "an"
price_input_per_mtok = 3.0
price_output_per_mtok = 15.0

[[key]]
name = "usage"
key_env = "RG_SDK_USAGE_KEY"

[[key]]
name = "budget-oa"
key_env = "RG_SDK_BUDGET_OA_KEY"
budget_usd = 0.000027
budget_period = "day"

[[key]]
name = "budget-an"
key_env = "RG_SDK_BUDGET_AN_KEY"
budget_usd = 0.000189
budget_period = "month"
"""
    env = {"RINGGATE_DRIVER": driver, "RG_SDK_USAGE_KEY": KEYS["usage"],
           "RG_SDK_BUDGET_OA_KEY": KEYS["budget-oa"], "RG_SDK_BUDGET_AN_KEY": KEYS["budget-an"]}
    yield from serve_config(cfg, env)


def oa(base, key, retries=0):
    return openai.OpenAI(base_url=base + "/v1", api_key=KEYS[key], max_retries=retries,
                         timeout=10)


def an(base, key, retries=0):
    return anthropic.Anthropic(base_url=base, api_key=KEYS[key], max_retries=retries,
                               timeout=10)


def metric(base, name, **labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{(.*)\} (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def until(read, ok, what):
    """`read()` once `ok` holds for it, polling up to 10 s: at two shards a scrape has the other
    shard's numbers as it last published them (once a second)."""
    deadline = time.time() + 10
    while True:
        v = read()
        if ok(v):
            return v
        assert time.time() < deadline, f"{what}: {v}"
        time.sleep(0.05)


def usage_of(base, model):
    k = {"key": "usage", "model": model}
    return (metric(base, "ringgate_key_input_tokens_total", **k),
            metric(base, "ringgate_key_output_tokens_total", **k))


def settled_usage(base, model, shards):
    """`usage_of` once every shard's numbers are in: at more than one shard, two readings more
    than a publishing interval (1 s) apart that agree."""
    v = usage_of(base, model)
    while shards > 1:
        time.sleep(1.2)
        v, last = usage_of(base, model), v
        if v == last:
            break
    return v


def usage_grew(base, model, since, by):
    want = (since[0] + by[0], since[1] + by[1])
    return until(lambda: usage_of(base, model), lambda v: v == want, f"want {want}")


def test_openai_stream_usage_is_counted_exactly_asked_or_not(metered, shards):
    client = oa(metered, "usage")
    want_in = math.ceil(len(TEXT) / 4)
    before = settled_usage(metered, "gpt-4o-mini", shards)
    # not asked: no usage chunk reaches the client, the gateway counts it all the same
    chunks = list(client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": TEXT}], max_tokens=7,
        stream=True))
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks), "no choices-less chunk"
    assert "".join(c.choices[0].delta.content or "" for c in chunks)
    after = usage_grew(metered, "gpt-4o-mini", before, (want_in, 7))
    # asked: the usage chunk arrives as the client asked, with the same counts
    chunks = list(client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": TEXT}], max_tokens=5,
        stream=True, stream_options={"include_usage": True}))
    usage = [c.usage for c in chunks if c.usage]
    assert len(usage) == 1 and chunks[-1].choices == []
    assert (usage[0].prompt_tokens, usage[0].completion_tokens) == (want_in, 5)
    usage_grew(metered, "gpt-4o-mini", after, (want_in, 5))


def test_anthropic_stream_usage_is_counted_exactly(metered, shards):
    before = settled_usage(metered, "claude", shards)
    with an(metered, "usage").messages.stream(
            model="claude", max_tokens=6, messages=[{"role": "user", "content": TEXT}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text
    assert (final.usage.input_tokens, final.usage.output_tokens) == (math.ceil(len(TEXT) / 4), 6)
    usage_grew(metered, "claude", before, (final.usage.input_tokens, final.usage.output_tokens))
    until(lambda: metric(metered, "ringgate_key_spend_usd_total", key="usage", model="claude"),
          lambda spend: spend > 0, "spend counted")


def test_openai_budget_runs_out_at_the_right_request(metered):
    client = oa(metered, "budget-oa", retries=2)
    for _ in range(3):
        r = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert r.usage.completion_tokens == 4
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert e.value.status_code == 429
    assert e.value.code == "insufficient_quota"
    assert e.value.type == "insufficient_quota"
    assert "budget-oa" in e.value.message and KEYS["budget-oa"] not in e.value.message
    # x-should-retry: false — the SDK (max_retries=2) asked once
    until(lambda: metric(metered, "ringgate_key_rejections_total", key="budget-oa",
                         reason="budget"), lambda n: n == 1, "one rejection")
    until(lambda: metric(metered, "ringgate_key_spend_usd_total", key="budget-oa"),
          lambda spend: abs(spend - 0.000027) < 1e-12, "the spend of three answers")


def test_anthropic_budget_runs_out_at_the_right_request(metered):
    client = an(metered, "budget-an", retries=2)
    for _ in range(3):
        m = client.messages.create(model="claude", max_tokens=4,
                                   messages=[{"role": "user", "content": "hi"}])
        assert m.usage.output_tokens == 4
    with pytest.raises(anthropic.RateLimitError) as e:
        client.messages.create(model="claude", max_tokens=4,
                               messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 429
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "billing_error"
    assert int(e.value.response.headers["retry-after"]) >= 1
    until(lambda: metric(metered, "ringgate_key_rejections_total", key="budget-an",
                         reason="budget"), lambda n: n == 1, "one rejection")
