"""Streams that break upstream, seen through the official SDKs: a raw fake upstream cuts an SSE
stream inside an event (chunked: the connection drops before the last chunk; close-delimited:
the connection closes), or closes a close-delimited stream after whole events but before its
terminal event. Whatever the dialect pair, the SDK must raise its API error type — never a JSON
decode error from a half event, never a silent (truncated) success."""

import json
import socket
import threading

import anthropic
import openai
import pytest

from conftest import serve_config

CHAT_EV = ('data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"u",'
           '"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},'
           '"finish_reason":null}]}\n\n')
CHAT_CUT = 'data: {"id":"c1","object":"chat.compl'
MSG_EV = ('event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1",'
          '"type":"message","role":"assistant","model":"u","content":[],"stop_reason":null,'
          '"stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":0}}}\n\n'
          'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
          '"content_block":{"type":"text","text":""}}\n\n'
          'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
          '"delta":{"type":"text_delta","text":"Hel"}}\n\n')
MSG_CUT = 'event: content_block_delta\ndata: {"type":"content_block_del'


def read_request(conn):
    buf = b""
    while b"\r\n\r\n" not in buf:
        b = conn.recv(65536)
        if not b:
            return None, None
        buf += b
    head, _, body = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return head.split(b" ")[1].decode(), json.loads(body)


def serve(conn):
    """Scenario from the model name: `*cut-chunked`, `*cut-close`, `*whole-close`."""
    with conn:
        path, req = read_request(conn)
        if req is None:
            return
        model = req["model"]
        anthropic_up = path.endswith("/v1/messages")
        whole, cut = (MSG_EV, MSG_CUT) if anthropic_up else (CHAT_EV, CHAT_CUT)
        chunked = model.endswith("cut-chunked")
        body = whole + ("" if model.endswith("whole-close") else cut)
        framing = "Transfer-Encoding: chunked" if chunked else "Connection: close"
        out = f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{framing}\r\n\r\n"
        if chunked:
            out += f"{len(body.encode()):x}\r\n{body}\r\n"  # ... and no last chunk: a cut
        else:
            out += body
        conn.sendall(out.encode())


@pytest.fixture(scope="module")
def fake_upstream():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)

    def accept():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield "127.0.0.1:%d" % srv.getsockname()[1]
    srv.close()


@pytest.fixture(scope="module")
def gw(fake_upstream, driver, shards):
    models = "".join(
        f'\n[[model]]\nname = "{p}{s}"\nprovider = "{prov}"\n'
        for p, prov in [("", "fake-oa"), ("claude-", "fake-an")]
        for s in ["cut-chunked", "cut-close", "whole-close"])
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}

[[provider]]
name = "fake-oa"
kind = "openai"
base_url = "http://{fake_upstream}/v1"

[[provider]]
name = "fake-an"
kind = "anthropic"
base_url = "http://{fake_upstream}"
{models}"""
    yield from serve_config(cfg, {"RINGGATE_DRIVER": driver})


SCENARIOS = ["cut-chunked", "cut-close", "whole-close"]


@pytest.mark.parametrize("upstream", ["", "claude-"], ids=["passthrough", "translated"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_openai_sdk_stream_broken_upstream_raises_api_error(gw, upstream, scenario):
    client = openai.OpenAI(base_url=gw + "/v1", api_key="sk-client", max_retries=0, timeout=10)
    got = []
    # A JSONDecodeError (half an event reached the SDK) propagates and fails this test; so
    # does a clean end (pytest: DID NOT RAISE).
    with pytest.raises(openai.APIError) as err:
        for chunk in client.chat.completions.create(
                model=upstream + scenario, stream=True,
                messages=[{"role": "user", "content": "hi"}]):
            got.append(chunk)
    assert not isinstance(err.value, json.JSONDecodeError)
    assert "request id rg-" in str(err.value)
    assert "".join(c.choices[0].delta.content or "" for c in got if c.choices) == "Hel"


@pytest.mark.parametrize("upstream", ["claude-", ""], ids=["passthrough", "translated"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_anthropic_sdk_stream_broken_upstream_raises_api_error(gw, upstream, scenario):
    client = anthropic.Anthropic(base_url=gw, api_key="sk-ant-client", max_retries=0, timeout=10)
    text = []
    with pytest.raises(anthropic.APIStatusError):
        with client.messages.stream(model=upstream + scenario, max_tokens=5,
                                    messages=[{"role": "user", "content": "hi"}]) as s:
            for t in s.text_stream:
                text.append(t)
    assert text == ["Hel"]
