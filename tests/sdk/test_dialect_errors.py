"""Errors per dialect, seen through the official SDKs: every documented upstream status from
every provider kind (openai, anthropic, gemini; the mock answers `mock-fault-<STATUS>` models
with that status in its dialect's error shape, HTML for 502) reaches the openai SDK (Chat and
Responses) and the anthropic SDK as the exception class each SDK documents for the status the
gateway gives it: the same status, except Anthropic's overloaded 529 ⇄ OpenAI's and Gemini's
503 (src/dialect/error.rs `client_status`). 429 keeps `Retry-After`; an HTML error page
becomes a dialect-shaped error with a request id. Streams end with `response.failed` (Responses)
or the `error` event (Messages) when the upstream fails mid-stream (`error-after=2`,
`cut-after=2`)."""

import anthropic
import openai
import pytest

from conftest import serve_config

STATUSES = [400, 401, 403, 404, 413, 429, 500, 503, 529]
KINDS = {"oa": ("openai", "/v1"), "an": ("anthropic", ""), "gm": ("gemini", "")}


@pytest.fixture(scope="module")
def errgw(mock, driver, shards):
    """One provider per (kind, status), so a 429's key cool-down or a breaker stays with its
    own cell; one attempt, no retries, no breakers: each request sees the upstream's answer."""
    parts = [f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}

[routing]
max_attempts = 1
retry_on = []
breaker = {{ failures = 0 }}
"""]
    faults = [str(s) for s in STATUSES] + ["502", "error-after_2", "cut-after_2"]
    for k, (kind, suffix) in KINDS.items():
        for f in faults:
            name = f"{k}-{f.replace('_', '')}"
            parts.append(f"""
[[provider]]
name = "{name}"
kind = "{kind}"
base_url = "http://{mock}{suffix}"

[[model]]
name = "e-{name}"
provider = "{name}"
upstream_model = "mock-fault-{f}"
""")
    yield from serve_config("".join(parts), {"RINGGATE_DRIVER": driver})


def client_status(kind, sdk, status):
    """The status the gateway answers (see the module docs)."""
    if sdk == "messages" and kind != "an" and status == 503:
        return 529
    if sdk != "messages" and kind == "an" and status == 529:
        return 503
    return status


OPENAI_CLASS = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
                404: "NotFoundError", 413: "APIStatusError", 429: "RateLimitError",
                500: "InternalServerError", 502: "InternalServerError",
                503: "InternalServerError", 529: "InternalServerError"}
ANTHROPIC_CLASS = {400: "BadRequestError", 401: "AuthenticationError",
                   403: "PermissionDeniedError", 404: "NotFoundError",
                   413: "ContentTooLargeError", 429: "RateLimitError",
                   500: "InternalServerError", 502: "InternalServerError",
                   503: "ServiceUnavailableError", 529: "OverloadedError"}


def oa(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=10)


def an(base):
    return anthropic.Anthropic(base_url=base, api_key="sk-ant-client", max_retries=0, timeout=10)


def call(base, sdk, model, stream):
    msgs = [{"role": "user", "content": "hi"}]
    if sdk == "chat":
        r = oa(base).chat.completions.create(model=model, messages=msgs, max_tokens=5,
                                             stream=stream)
        if stream:
            list(r)
    elif sdk == "responses":
        r = oa(base).responses.create(model=model, input="hi", max_output_tokens=5,
                                      stream=stream)
        if stream:
            list(r)
    elif stream:
        with an(base).messages.stream(model=model, max_tokens=5, messages=msgs) as s:
            list(s.text_stream)
    else:
        an(base).messages.create(model=model, max_tokens=5, messages=msgs)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("status", STATUSES + [502])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("sdk", ["chat", "responses", "messages"])
def test_status_raises_the_documented_class(errgw, sdk, kind, status, stream):
    if stream and status not in (429, 502, 529):
        pytest.skip("streams: a few statuses suffice (the error answer comes before the stream)")
    want = client_status(kind, sdk, status)
    mod, classes = (anthropic, ANTHROPIC_CLASS) if sdk == "messages" else (openai, OPENAI_CLASS)
    cls = getattr(mod, classes[want])
    with pytest.raises(mod.APIStatusError) as err:
        call(errgw, sdk, f"e-{kind}-{status}", stream)
    e = err.value
    assert type(e) is cls, f"{sdk} <- {kind} {status}: got {type(e).__name__} {e}"
    assert e.status_code == want
    body = e.body if isinstance(e.body, dict) else {}
    if sdk == "messages":
        assert e.response.json()["type"] == "error"
        assert isinstance(body.get("error", {}).get("type") or body.get("type"), str)
    else:
        assert isinstance(e.response.json()["error"]["message"], str)
        assert isinstance(e.response.json()["error"]["type"], str)
    if status == 429:
        assert e.response.headers.get("retry-after") == "1"
    if status == 502:
        assert "request id rg-" in e.response.json()["error"]["message"]
        assert "<html" not in e.response.text
    if want == 529 and sdk == "messages":
        assert e.response.json()["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize("fault", ["error-after2", "cut-after2"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_responses_stream_after_upstream_error_ends_failed(errgw, kind, fault):
    """`get_final_response()` raises: the stream ends with `response.failed`, never
    `response.completed`."""
    client = oa(errgw)
    model = f"e-{kind}-{fault}"
    with client.responses.stream(model=model, input="hi", max_output_tokens=5) as s:
        types = [e.type for e in s]
        with pytest.raises(RuntimeError, match="response.completed"):
            s.get_final_response()
    assert "response.completed" not in types
    if kind != "oa":  # translated: the stream's last event is `response.failed`
        assert types[-1] == "response.failed", types


@pytest.mark.parametrize("fault", ["error-after2", "cut-after2"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_messages_stream_after_upstream_error_raises(errgw, kind, fault):
    """The anthropic stream raises at the `error` event; nothing claims a normal end after it."""
    client = an(errgw)
    with pytest.raises(anthropic.APIStatusError):
        with client.messages.stream(model=f"e-{kind}-{fault}", max_tokens=5,
                                    messages=[{"role": "user", "content": "hi"}]) as s:
            list(s.text_stream)
    raw = client.messages.with_raw_response.create(
        model=f"e-{kind}-{fault}", max_tokens=5, stream=True,
        messages=[{"role": "user", "content": "hi"}])
    text = raw.http_response.read().decode()
    events = [ln[len("event: "):] for ln in text.splitlines() if ln.startswith("event: ")]
    assert events[-1] == "error", events
    assert "message_stop" not in events
