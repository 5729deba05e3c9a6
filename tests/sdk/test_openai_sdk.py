"""The official `openai` Python SDK drives the gateway in front of `ringgate mock`."""

import json
import urllib.request

import openai
import pytest

# The mock's deterministic output: token i is WORDS[i % 16].
WORDS = [" the", " gate", " ring", " fast", " core", " byte", " path", " tail", " load", " mock",
         " lane", " wire", " time", " zero", " copy", " flow"]


def expected(n):
    return "".join(WORDS[i % len(WORDS)] for i in range(n))


def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=10)


def test_chat_non_stream(gateway):
    r = client(gateway).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}], max_tokens=12)
    assert r.choices[0].message.content == expected(12)
    assert r.choices[0].finish_reason == "stop"
    assert r.model == "gpt-4o-mini"
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_chat_stream(gateway):
    stream = client(gateway).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}], max_tokens=30,
        stream=True, stream_options={"include_usage": True})
    content, finish, usage = "", None, None
    for chunk in stream:
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert content == expected(30)
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == 30


def test_large_request_body(gateway):
    big = "lorem ipsum " * 20000  # ~240 KB prompt, ~20k tokens
    r = client(gateway).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": big}], max_tokens=5)
    assert r.choices[0].message.content == expected(5)
    assert r.usage.prompt_tokens > 50000


def test_unknown_model_is_404_in_openai_shape(gateway):
    with pytest.raises(openai.NotFoundError) as e:
        client(gateway).chat.completions.create(model="nope", messages=[])
    assert e.value.status_code == 404
    assert e.value.body["code"] == "model_not_found"
    assert "nope" in e.value.body["message"]


def test_models_list(gateway):
    ids = [m.id for m in client(gateway).models.list()]
    assert ids == ["gpt-4o-mini"]


def test_bad_json_is_400(gateway):
    req = urllib.request.Request(gateway + "/v1/chat/completions", data=b"{nope",
                                 headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 400
    body = json.loads(e.value.read())
    assert body["error"]["type"] == "invalid_request_error"


def test_embedded_default_serves_mock(embedded):
    c = client(embedded)
    r = c.chat.completions.create(model="mock", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == expected(16)
    text = "".join(ch.choices[0].delta.content or "" for ch in
                   c.chat.completions.create(model="mock", messages=[], stream=True) if ch.choices)
    assert text == expected(16)
