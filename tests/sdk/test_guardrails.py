"""Guardrails (issue 26) with the official SDKs (openai, anthropic, google-genai), unchanged,
against a scripted upstream that emits a chosen text split into chosen SSE events (OpenAI Chat
or Anthropic Messages): an email, a phone number, a Luhn-valid card and a secret split across
1, 2, 3 and 8 events arrive masked; Luhn-invalid and bad-checksum IBAN numbers pass; `block`
refuses requests (the upstream saw nothing) and ends streams with the dialect's error; masked
tool-call arguments parse as JSON; translated routes (Anthropic client → OpenAI upstream, and
OpenAI client → Anthropic upstream) mask the same; usage is unchanged. Shards 1 and 2, both
drivers."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

from conftest import serve_config

CASES = [
    ("Contact alice.smith@example.com today.", "alice.smith@example.com", "[REDACTED:EMAIL]"),
    ("Call +1 415 555 2671 now.", "+1 415 555 2671", "[REDACTED:PHONE]"),
    ("Card 4111 1111 1111 1111 ok.", "4111 1111 1111 1111", "[REDACTED:CREDIT_CARD]"),
    ("Key sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123 end.",
     "sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123", "[REDACTED:SECRET]"),
]
UNTOUCHED = "Numbers 4111 1111 1111 1112 and DE88 3704 0044 0532 0130 00 stay."


def splits(text, value):
    """Cut sets giving 1, 2, 3 and 8 events, the cuts inside the value."""
    at, n = text.index(value), len(value)
    sets = [[], [at + n // 2], [at + 1, at + n - 2]]
    sets.append(sorted({min(at + k * max(n // 7, 1), len(text) - 1) for k in range(7)}))
    return sets


def cut(text, cuts):
    out, at = [], 0
    for c in cuts:
        out.append(text[at:c])
        at = c
    out.append(text[at:])
    return out


class Script:
    pieces = ["ok"]
    args = []
    seen = []


def sse(events):
    return "".join(events).encode()


def chat_answer(stream):
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    text = "".join(Script.pieces)
    if not stream:
        msg = {"role": "assistant", "content": text}
        if Script.args:
            msg["tool_calls"] = [{"id": "call_1", "type": "function",
                                  "function": {"name": "send", "arguments": "".join(Script.args)}}]
        return "application/json", json.dumps({
            "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
            "usage": usage}).encode()

    def chunk(delta, finish=None, **extra):
        v = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(v)}\n\n"

    evs = [chunk({"role": "assistant", "content": ""})]
    evs += [chunk({"content": p}) for p in Script.pieces]
    if Script.args:
        evs.append(chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                          "function": {"name": "send", "arguments": ""}}]}))
        evs += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": a}}]})
                for a in Script.args]
    evs.append(chunk({}, "tool_calls" if Script.args else "stop"))
    u = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [], "usage": usage}
    evs.append(f"data: {json.dumps(u)}\n\n")
    evs.append("data: [DONE]\n\n")
    return "text/event-stream", sse(evs)


def messages_answer(stream):
    text = "".join(Script.pieces)
    if not stream:
        return "application/json", json.dumps({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 7}}).encode()

    def ev(name, v):
        return f"event: {name}\ndata: {json.dumps(v)}\n\n"

    evs = [ev("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 0}}}),
        ev("content_block_start", {"type": "content_block_start", "index": 0,
                                   "content_block": {"type": "text", "text": ""}})]
    evs += [ev("content_block_delta", {"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "text_delta", "text": p}})
            for p in Script.pieces]
    evs.append(ev("content_block_stop", {"type": "content_block_stop", "index": 0}))
    evs.append(ev("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                    "usage": {"output_tokens": 7}}))
    evs.append(ev("message_stop", {"type": "message_stop"}))
    return "text/event-stream", sse(evs)


def responses_answer(stream):
    text = "".join(Script.pieces)
    usage = {"input_tokens": 5, "output_tokens": 7, "total_tokens": 12,
             "input_tokens_details": {"cached_tokens": 0},
             "output_tokens_details": {"reasoning_tokens": 0}}
    part = {"type": "output_text", "text": text, "annotations": []}
    item = {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
            "content": [part]}
    resp = {"id": "resp_1", "object": "response", "created_at": 1, "status": "completed",
            "model": "m", "output": [item], "usage": usage, "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": []}
    if not stream:
        return "application/json", json.dumps(resp).encode()
    seq = iter(range(1000))

    def ev(name, **v):
        v = {"type": name, "sequence_number": next(seq), **v}
        return f"event: {name}\ndata: {json.dumps(v)}\n\n"

    ids = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    evs = [ev("response.created", response={**resp, "status": "in_progress", "output": []}),
           ev("response.output_item.added", output_index=0,
              item={**item, "status": "in_progress", "content": []}),
           ev("response.content_part.added", part={**part, "text": ""}, **ids)]
    evs += [ev("response.output_text.delta", delta=p, **ids) for p in Script.pieces]
    evs += [ev("response.output_text.done", text=text, **ids),
            ev("response.content_part.done", part=part, **ids),
            ev("response.output_item.done", output_index=0, item=item),
            ev("response.completed", response=resp)]
    return "text/event-stream", sse(evs)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        Script.seen.append(body.decode("utf-8", "replace"))
        stream = bool(json.loads(body or b"{}").get("stream"))
        if self.path.startswith("/v1/messages"):
            answer = messages_answer
        elif self.path.endswith("/responses"):
            answer = responses_answer
        else:
            answer = chat_answer
        ct, out = answer(stream)
        self.send_response(200)
        self.send_header("content-type", ct)
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def upstream():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.fixture(params=[1, 2], scope="module")
def gw(request, upstream, driver):
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = {request.param}

[[provider]]
name = "local"
kind = "openai"
base_url = "http://{upstream}/v1"

[[provider]]
name = "claude"
kind = "anthropic"
base_url = "http://{upstream}"
api_key_env = "RG_TEST_ANTHROPIC_KEY"

[[guardrail]]
name = "pii"
detect = ["email", "phone", "credit_card", "iban", "us_ssn", "ipv4"]
action = "mask"
on = ["request", "response"]

[[guardrail]]
name = "keys"
detect = ["secrets"]
action = "mask"
on = ["response"]

[[guardrail]]
name = "secrets"
detect = ["secrets"]
action = "block"
on = ["request", "response"]

[[model]]
name = "gpt-4o-mini"
provider = "local"
guardrails = ["pii", "keys"]

[[model]]
name = "strict"
provider = "local"
guardrails = ["secrets"]

[[model]]
name = "back"
provider = "claude"
guardrails = ["pii", "keys"]
"""
    yield from serve_config(cfg, {"RINGGATE_DRIVER": driver, "RG_TEST_ANTHROPIC_KEY": "sk-x"})


def oa(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0, timeout=20)


def an(base):
    return anthropic.Anthropic(base_url=base, api_key="sk-test", max_retries=0, timeout=20)


_clients = []


def gm(base):
    """Kept alive for the session (the SDK closes its HTTP client when collected mid-call)."""
    c = genai.Client(api_key="k", http_options={"base_url": base, "timeout": 20_000})
    _clients.append(c)
    return c


def set_script(pieces, args=()):
    Script.pieces, Script.args = list(pieces), list(args)


def chat_stream_text(base, model="gpt-4o-mini"):
    s = oa(base).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True})
    parts, usage = [], None
    for ch in s:
        if ch.choices and ch.choices[0].delta.content is not None:
            parts.append(ch.choices[0].delta.content)
        if ch.usage:
            usage = ch.usage
    return parts, usage


@pytest.mark.parametrize("text,value,mask", CASES)
def test_every_sdk_gets_masked_text_at_every_split(gw, text, value, mask):
    want = text.replace(value, mask)
    for cuts in splits(text, value):
        set_script(cut(text, cuts))
        parts, usage = chat_stream_text(gw)
        assert "".join(parts) == want, cuts
        assert not any(value[:6] in p or value[-4:] in p for p in parts)
        assert usage.completion_tokens == 7
        # Responses (passthrough), stream
        got = "".join(e.delta for e in oa(gw).responses.create(
            model="gpt-4o-mini", input="hi", stream=True) if e.type == "response.output_text.delta")
        assert got == want, cuts
        # Anthropic client → OpenAI upstream, stream
        with an(gw).messages.stream(model="gpt-4o-mini", max_tokens=32,
                                    messages=[{"role": "user", "content": "hi"}]) as s:
            assert "".join(s.text_stream) == want, cuts
            assert s.get_final_message().usage.output_tokens == 7
        # Gemini client → OpenAI upstream, stream
        got = "".join(c.text or "" for c in gm(gw).models.generate_content_stream(
            model="gpt-4o-mini", contents="hi"))
        assert got == want, cuts
        # OpenAI client → Anthropic upstream, stream
        parts, _ = chat_stream_text(gw, "back")
        assert "".join(parts) == want, cuts
    # non-stream, every dialect
    set_script(cut(text, [text.index(value) + 2]))
    r = oa(gw).chat.completions.create(model="gpt-4o-mini",
                                       messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == want and r.usage.completion_tokens == 7
    assert oa(gw).responses.create(model="gpt-4o-mini", input="hi").output_text == want
    m = an(gw).messages.create(model="gpt-4o-mini", max_tokens=32,
                               messages=[{"role": "user", "content": "hi"}])
    assert m.content[0].text == want
    assert gm(gw).models.generate_content(model="gpt-4o-mini", contents="hi").text == want


def test_checksum_invalid_numbers_pass(gw):
    set_script(cut(UNTOUCHED, [12, 30, 44]))
    assert "".join(chat_stream_text(gw)[0]) == UNTOUCHED
    with an(gw).messages.stream(model="gpt-4o-mini", max_tokens=32,
                                messages=[{"role": "user", "content": "hi"}]) as s:
        assert "".join(s.text_stream) == UNTOUCHED


def test_block_on_request_sends_nothing(gw):
    before = len(Script.seen)
    with pytest.raises(openai.BadRequestError) as e:
        oa(gw).chat.completions.create(
            model="strict", messages=[{"role": "user", "content": "key AKIAIOSFODNN7EXAMPLE"}])
    assert e.value.status_code == 400 and e.value.code == "guardrail_blocked"
    assert "AKIA" not in str(e.value) and "secrets" in str(e.value)
    with pytest.raises(anthropic.BadRequestError) as e:
        an(gw).messages.create(model="strict", max_tokens=9, messages=[
            {"role": "user", "content": "key AKIAIOSFODNN7EXAMPLE"}])
    assert "guardrail_blocked" in str(e.value) and "AKIA" not in str(e.value)
    assert len(Script.seen) == before


def test_mask_on_request_reaches_upstream_masked(gw):
    set_script(["ok"])
    oa(gw).chat.completions.create(model="gpt-4o-mini", messages=[
        {"role": "system", "content": "ops is ops@example.org"},
        {"role": "user", "content": [{"type": "text", "text": "call 415-555-2671"}]}])
    seen = Script.seen[-1]
    assert "ops@example.org" not in seen and "2671" not in seen and "[REDACTED:EMAIL]" in seen
    an(gw).messages.create(model="gpt-4o-mini", max_tokens=9, system="admin x@example.org",
                           messages=[{"role": "user", "content": "hi"}])
    assert "x@example.org" not in Script.seen[-1]
    gm(gw).models.generate_content(model="gpt-4o-mini", contents="mail y@example.org")
    assert "y@example.org" not in Script.seen[-1]


def test_block_on_response_stream_ends_with_the_dialect_error(gw):
    set_script(cut("here: AKIAIOSFODNN7EXAMPLE and more", [8, 12, 20]))
    got = []
    with pytest.raises(openai.APIError) as e:
        for ch in oa(gw).chat.completions.create(
                model="strict", messages=[{"role": "user", "content": "hi"}], stream=True):
            if ch.choices and ch.choices[0].delta.content:
                got.append(ch.choices[0].delta.content)
    assert "guardrail_blocked" in str(e.value)
    assert "AKIA" not in "".join(got)
    got = []
    with pytest.raises(anthropic.APIError):
        with an(gw).messages.stream(model="strict", max_tokens=32,
                                    messages=[{"role": "user", "content": "hi"}]) as s:
            for t in s.text_stream:
                got.append(t)
    assert "AKIA" not in "".join(got)
    with pytest.raises(openai.BadRequestError):
        oa(gw).chat.completions.create(model="strict",
                                       messages=[{"role": "user", "content": "hi"}])


def test_tool_call_arguments_are_masked_json(gw):
    args = '{"to": "eve@example.com", "card": "4111111111111111", "n": 3}'
    set_script(["sending"], cut(args, [10, 14, 30, 45]))
    s = oa(gw).chat.completions.create(model="gpt-4o-mini", stream=True,
                                       messages=[{"role": "user", "content": "hi"}])
    got = "".join(tc.function.arguments or "" for ch in s if ch.choices
                  for tc in (ch.choices[0].delta.tool_calls or []))
    v = json.loads(got)
    assert v == {"to": "[REDACTED:EMAIL]", "card": "[REDACTED:CREDIT_CARD]", "n": 3}
    r = oa(gw).chat.completions.create(model="gpt-4o-mini",
                                       messages=[{"role": "user", "content": "hi"}])
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments)["to"] == \
        "[REDACTED:EMAIL]"
