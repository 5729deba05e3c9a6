"""OpenTelemetry traces over OTLP/HTTP (issue 27, docs/telemetry.md), checked against a real
OTLP/HTTP receiver that decodes what arrives with the official `opentelemetry-proto` package,
driven by the official openai, anthropic and google-genai SDKs through the gateway into a
scripted upstream (Chat, Messages and Gemini answers with known usage) that records the
`traceparent` each attempt carried.

Every call sends its own caller `traceparent`, so a test finds its spans by trace id whatever
else the gateway exported."""

import json
import os
import re
import secrets
import signal
import socket
import socketserver
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import openai
import pytest
from google import genai
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from conftest import serve_config, spawn, stop

KEY = "rg-sdk-telemetry-3f2a1b0c9d8e7f6a5b4c3d2e"
USAGE_IN, USAGE_OUT = 11, 7
PROMPT = "say the secret word: periwinkle"


# ---- the upstream: answers in three dialects, remembers each request's traceparent ----------

class Upstream:
    seen = []  # (path, traceparent, tracestate)


def sse(events):
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode()


def chat_answer(stream):
    usage = {"prompt_tokens": USAGE_IN, "completion_tokens": USAGE_OUT,
             "total_tokens": USAGE_IN + USAGE_OUT}
    if not stream:
        return "application/json", json.dumps({
            "id": "c1", "object": "chat.completion", "created": 1, "model": "up-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                         "finish_reason": "stop"}], "usage": usage}).encode()
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "up-model"}
    evs = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hel"},
                                 "finish_reason": None}]},
           {**base, "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
           {**base, "choices": [], "usage": usage}]
    return "text/event-stream", sse(evs) + b"data: [DONE]\n\n"


def messages_answer(stream):
    if not stream:
        return "application/json", json.dumps({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "up-model",
            "content": [{"type": "text", "text": "hello"}], "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": USAGE_IN, "output_tokens": USAGE_OUT}}).encode()

    def ev(name, v):
        return f"event: {name}\ndata: {json.dumps({'type': name, **v})}\n\n"

    out = "".join([
        ev("message_start", {"message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "up-model",
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": USAGE_IN, "output_tokens": 0}}}),
        ev("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        ev("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "hello"}}),
        ev("content_block_stop", {"index": 0}),
        ev("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                             "usage": {"output_tokens": USAGE_OUT}}),
        ev("message_stop", {}),
    ])
    return "text/event-stream", out.encode()


def gemini_answer(stream):
    usage = {"promptTokenCount": USAGE_IN, "candidatesTokenCount": USAGE_OUT,
             "totalTokenCount": USAGE_IN + USAGE_OUT}
    cand = {"content": {"role": "model", "parts": [{"text": "hello"}]}, "finishReason": "STOP",
            "index": 0}
    whole = {"candidates": [cand], "usageMetadata": usage, "modelVersion": "up-model",
             "responseId": "r-gem"}
    if not stream:
        return "application/json", json.dumps(whole).encode()
    return "text/event-stream", sse([whole])


class UpstreamHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        Upstream.seen.append((self.path, self.headers.get("traceparent"),
                              self.headers.get("tracestate")))
        if self.path.startswith("/v1/messages"):
            ct, out = messages_answer(bool(json.loads(body or b"{}").get("stream")))
        elif ":streamGenerateContent" in self.path or ":generateContent" in self.path:
            ct, out = gemini_answer(":streamGenerateContent" in self.path)
        else:
            ct, out = chat_answer(bool(json.loads(body or b"{}").get("stream")))
        self.send_response(200)
        self.send_header("content-type", ct)
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


class McpHandler(BaseHTTPRequestHandler):
    """A minimal MCP server (Streamable HTTP, JSON answers): initialize, notifications, and
    tools/call of `echo` (answers its text) and `fail` (a tool error, `isError`); remembers each
    call's traceparent."""
    protocol_version = "HTTP/1.1"
    calls = []  # (tool, traceparent)

    def do_POST(self):
        msg = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        if "id" not in msg:
            self.send_response(202)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        if msg["method"] == "initialize":
            result = {"protocolVersion": msg["params"]["protocolVersion"],
                      "capabilities": {"tools": {}}, "serverInfo": {"name": "f", "version": "1"}}
        elif msg["method"] == "tools/call":
            name = msg["params"]["name"]
            McpHandler.calls.append((name, self.headers.get("traceparent")))
            result = {"content": [{"type": "text", "text": name}], "isError": name == "fail"}
        else:
            result = {"tools": []}
        out = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("mcp-session-id", "up-session-1")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


# ---- the collector: a real OTLP/HTTP receiver ------------------------------------------------

class Collector:
    def __init__(self):
        self.spans = []  # (resource attrs dict, Span)
        self.mode = "ok"  # ok | 500 | hang
        self.posts = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        coll = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with coll.lock:
                    coll.posts += 1
                if coll.mode == "hang":
                    coll.release.wait(60)
                    return
                if coll.mode == "500":
                    self.send_response(500)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                assert self.path == "/v1/traces", self.path
                assert self.headers.get("content-type") == "application/x-protobuf"
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                with coll.lock:
                    for rs in req.resource_spans:
                        res = {a.key: a.value.string_value for a in rs.resource.attributes}
                        for ss in rs.scope_spans:
                            for s in ss.spans:
                                coll.spans.append((res, s))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def of_trace(self, trace_id):
        with self.lock:
            return [s for _, s in self.spans if s.trace_id.hex() == trace_id]

    def wait(self, trace_id, n, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = self.of_trace(trace_id)
            if len(got) >= n:
                return got
            time.sleep(0.05)
        raise AssertionError(f"{len(self.of_trace(trace_id))} spans of trace {trace_id}, wanted {n}")

    def close(self):
        self.release.set()
        self.srv.shutdown()


@pytest.fixture(scope="module")
def upstream():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), UpstreamHandler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.fixture(scope="module")
def mcp_server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), McpHandler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.fixture(scope="module")
def collector():
    c = Collector()
    yield c
    c.close()


def config(upstream, shards, telemetry, log="", keys=True, mcp=None):
    mcp = f'[[mcp_server]]\nname = "tools"\nurl = "http://{mcp}/mcp"' if mcp else ""
    key = '[[key]]\nname = "tel"\nkey_env = "RG_SDK_TELEMETRY_KEY"' if keys else ""
    return f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}

[log]
{log}

[telemetry]
{telemetry}

[[provider]]
name = "oa"
kind = "openai"
base_url = "http://{upstream}/v1"

[[provider]]
name = "an"
kind = "anthropic"
base_url = "http://{upstream}"
api_key_env = "RG_TEST_ANTHROPIC_KEY"

[[provider]]
name = "gm"
kind = "gemini"
base_url = "http://{upstream}"
api_key_env = "RG_TEST_GEMINI_KEY"

[[model]]
name = "gpt-x"
provider = "oa"
upstream_model = "up-gpt"
price_input_per_mtok = 1.0
price_output_per_mtok = 2.0

[[model]]
name = "claude-x"
provider = "an"
upstream_model = "up-claude"

[[model]]
name = "gem-x"
provider = "gm"
upstream_model = "up-gem"

{key}

{mcp}
"""


ENV = {"RG_TEST_ANTHROPIC_KEY": "sk-an", "RG_TEST_GEMINI_KEY": "gm-key",
       "RG_SDK_TELEMETRY_KEY": KEY}


def gateway_on(upstream, driver, shards, telemetry, log="", keys=True, mcp=None):
    return serve_config(config(upstream, shards, telemetry, log, keys, mcp),
                        {"RINGGATE_DRIVER": driver, **ENV})


@pytest.fixture(scope="module")
def traced(upstream, collector, mcp_server, driver, shards):
    tel = f'otlp_endpoint = "{collector.url}"\nservice_name = "rg-test"'
    yield from gateway_on(upstream, driver, shards, tel, mcp=mcp_server)


def traceparent(sampled=True):
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, parent, f"00-{trace_id}-{parent}-{'01' if sampled else '00'}"


_clients = []


def call(base, sdk, model, stream, headers):
    """One generation through `sdk`'s client; returns the answer's text."""
    if sdk == "openai":
        c = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=20,
                          default_headers=headers)
        msgs = [{"role": "user", "content": PROMPT}]
        if stream:
            s = c.chat.completions.create(model=model, messages=msgs, stream=True,
                                          max_tokens=50, temperature=0.5, top_p=0.9)
            return "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)
        r = c.chat.completions.create(model=model, messages=msgs, max_tokens=50,
                                      temperature=0.5, top_p=0.9)
        return r.choices[0].message.content
    if sdk == "anthropic":
        c = anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0, timeout=20,
                                default_headers=headers)
        msgs = [{"role": "user", "content": PROMPT}]
        # (newer SDKs dropped the sampling arguments; the API still takes them)
        extra = {"temperature": 0.5, "top_p": 0.9}
        if stream:
            with c.messages.stream(model=model, max_tokens=50, messages=msgs,
                                   extra_body=extra) as s:
                return "".join(s.text_stream)
        r = c.messages.create(model=model, max_tokens=50, messages=msgs, extra_body=extra)
        return r.content[0].text
    c = genai.Client(api_key=KEY, http_options={"base_url": base, "timeout": 20_000,
                                                "headers": headers})
    _clients.append(c)
    cfg = {"max_output_tokens": 50, "temperature": 0.5, "top_p": 0.9}
    if stream:
        return "".join(ch.text or "" for ch in
                       c.models.generate_content_stream(model=model, contents=PROMPT, config=cfg))
    return c.models.generate_content(model=model, contents=PROMPT, config=cfg).text


def attrs(span):
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


# (client SDK, model): same-dialect and translated for each dialect
CASES = [
    ("openai", "gpt-x", "openai", "chat"),
    ("openai", "claude-x", "anthropic", "chat"),
    ("anthropic", "claude-x", "anthropic", "chat"),
    ("anthropic", "gpt-x", "openai", "chat"),
    ("gemini", "gem-x", "gcp.gemini", "generate_content"),
    ("gemini", "gpt-x", "openai", "generate_content"),
]
UPSTREAM_MODEL = {"gpt-x": "up-gpt", "claude-x": "up-claude", "gem-x": "up-gem"}
# what each upstream's answer names itself and why it stopped (read from the upstream's answer,
# whatever dialect the client got it in)
ANSWER = {"openai": ("c1", ["stop"]), "anthropic": ("msg_1", ["end_turn"]),
          "gcp.gemini": ("r-gem", ["STOP"])}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("sdk,model,provider,op", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_server_and_client_spans(traced, collector, upstream, sdk, model, provider, op, stream):
    trace_id, parent, tp = traceparent()
    text = call(traced, sdk, model, stream, {"traceparent": tp, "tracestate": "caller=1"})
    assert text == "hello"
    spans = collector.wait(trace_id, 2)
    server = [s for s in spans if s.kind == Span.SPAN_KIND_SERVER]
    client = [s for s in spans if s.kind == Span.SPAN_KIND_CLIENT]
    assert len(server) == 1 and len(client) == 1, spans
    s, c = server[0], client[0]
    # the caller's span is the parent; the CLIENT span is the SERVER span's child
    assert s.parent_span_id.hex() == parent
    assert c.parent_span_id == s.span_id
    assert s.trace_state == "caller=1"
    assert s.name == f"{op} {model}"
    assert s.start_time_unix_nano <= c.start_time_unix_nano <= c.end_time_unix_nano
    assert c.end_time_unix_nano <= s.end_time_unix_nano
    a = attrs(s)
    assert a["gen_ai.operation.name"] == op
    assert a["gen_ai.request.model"] == model
    assert a["gen_ai.provider.name"] == provider
    assert a["gen_ai.response.model"] == UPSTREAM_MODEL[model]
    assert a["gen_ai.request.max_tokens"] == 50
    assert a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.request.top_p"] == 0.9
    assert a["gen_ai.usage.input_tokens"] == USAGE_IN
    assert a["gen_ai.usage.output_tokens"] == USAGE_OUT
    assert a["gen_ai.response.id"] == ANSWER[provider][0]
    assert [v.string_value for v in a["gen_ai.response.finish_reasons"].values] == \
        ANSWER[provider][1]
    assert "gen_ai.output.messages" not in a, "content is off by default"
    assert a["http.request.method"] == "POST"
    assert a["http.response.status_code"] == 200
    assert "error.type" not in a
    assert a["ringgate.key"] == "tel"
    assert a["ringgate.route"] == model
    assert a["ringgate.attempts"] == 1
    assert 0 <= a["ringgate.overhead_us"] < 30_000_000
    assert ("ringgate.ttft_ms" in a) == stream
    assert "gen_ai.input.messages" not in a, "content is off by default"
    assert a["url.path"].startswith("/v1")
    ca = attrs(c)
    assert ca["server.address"] == "127.0.0.1"
    assert ca["server.port"] == int(upstream.rsplit(":", 1)[1])
    assert ca["http.response.status_code"] == 200
    assert ca["gen_ai.request.model"] == UPSTREAM_MODEL[model]
    # the upstream got a traceparent naming the CLIENT span, and the caller's tracestate
    sent = [(p, t, st) for p, t, st in Upstream.seen if t and trace_id in t]
    assert len(sent) == 1, sent
    assert sent[0][1] == f"00-{trace_id}-{c.span_id.hex()}-01"
    assert sent[0][2] == "caller=1"


def test_unix_socket_upstream_client_span(collector, driver, shards):
    """A Unix-socket upstream's CLIENT span names the socket path as `server.address`, with
    `network.transport = unix` and no port (OTel semantic conventions), not localhost:0."""
    d = tempfile.mkdtemp(prefix="rg-tel-", dir="/tmp")
    path = os.path.join(d, "up.sock")

    class UnixUpstream(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    class H(UpstreamHandler):
        def address_string(self):
            return "unix"

    srv = UnixUpstream(path, H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        tel = f'otlp_endpoint = "{collector.url}"\nservice_name = "rg-test"'
        cfg = config("UNIX", shards, tel).replace('"http://UNIX/v1"', f'"unix:{path}:/v1"')
        cfg = cfg.replace('"http://UNIX"', f'"unix:{path}"')
        assert "http://UNIX" not in cfg
        for base in serve_config(cfg, {"RINGGATE_DRIVER": driver, **ENV}):
            trace_id, _, tp = traceparent()
            assert call(base, "openai", "gpt-x", False, {"traceparent": tp}) == "hello"
            spans = collector.wait(trace_id, 2)
            client = [s for s in spans if s.kind == Span.SPAN_KIND_CLIENT]
            assert len(client) == 1, spans
            ca = attrs(client[0])
            assert ca["server.address"] == path
            assert ca["network.transport"] == "unix"
            assert "server.port" not in ca, ca
            assert ca["http.response.status_code"] == 200
    finally:
        srv.shutdown()
        srv.server_close()
        os.unlink(path)
        os.rmdir(d)


def test_resource_and_fresh_trace(traced, collector):
    """Without a caller context the request starts a trace of its own (ratio 1.0)."""
    before = len(collector.spans)
    assert call(traced, "openai", "gpt-x", False, {}) == "hello"
    sent = Upstream.seen[-1][1]
    m = re.fullmatch(r"00-([0-9a-f]{32})-([0-9a-f]{16})-01", sent or "")
    assert m, sent
    spans = collector.wait(m.group(1), 2)
    server = [s for s in spans if s.kind == Span.SPAN_KIND_SERVER][0]
    assert server.parent_span_id == b""
    res = [r for r, s in collector.spans[before:] if s.trace_id.hex() == m.group(1)][0]
    assert res["service.name"] == "rg-test"
    assert res["service.version"]


def test_error_answer_is_an_error_span(traced, collector):
    trace_id, _, tp = traceparent()
    c = openai.OpenAI(base_url=traced + "/v1", api_key=KEY, max_retries=0, timeout=20,
                      default_headers={"traceparent": tp})
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="no-such-model", messages=[{"role": "user",
                                                                    "content": "x"}])
    s = collector.wait(trace_id, 1)[0]
    a = attrs(s)
    assert a["http.response.status_code"] == 404
    assert a["error.type"] == "model_not_found"


def mcp_post(base, msg, headers):
    req = urllib.request.Request(base + "/mcp", data=json.dumps(msg).encode(), method="POST",
                                 headers={"content-type": "application/json",
                                          "accept": "application/json, text/event-stream",
                                          "authorization": f"Bearer {KEY}", **headers})
    with urllib.request.urlopen(req, timeout=20) as r:
        return r.headers.get("mcp-session-id"), json.loads(r.read() or b"null")


def test_mcp_tool_calls_are_execute_tool_spans(traced, collector):
    session, _ = mcp_post(traced, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}, {})
    h = {"mcp-session-id": session, "mcp-protocol-version": "2025-06-18"}
    mcp_post(traced, {"jsonrpc": "2.0", "method": "notifications/initialized"}, h)
    # a method other than tools/call: no span
    list_id, _, tp = traceparent()
    mcp_post(traced, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, {**h, "traceparent": tp})
    spans = {}
    for tool in ("echo", "fail"):
        trace_id, parent, tp = traceparent()
        _, answer = mcp_post(traced, {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                      "params": {"name": f"tools__{tool}", "arguments": {}}},
                             {**h, "traceparent": tp})
        assert answer["result"]["content"][0]["text"] == tool
        got = collector.wait(trace_id, 2)
        [s] = [x for x in got if x.kind == Span.SPAN_KIND_SERVER]
        [c] = [x for x in got if x.kind == Span.SPAN_KIND_CLIENT]
        assert s.parent_span_id.hex() == parent
        # the forwarded call is the SERVER span's CLIENT child, named in the traceparent the
        # MCP server got
        assert c.parent_span_id == s.span_id and c.name == f"tools/call {tool}"
        sent = [t for name, t in McpHandler.calls if t and trace_id in t]
        assert sent == [f"00-{trace_id}-{c.span_id.hex()}-01"], sent
        assert attrs(c)["server.address"] == "127.0.0.1"
        spans[tool] = s
    s = spans["echo"]
    assert (s.name, s.kind) == ("tools/call echo", Span.SPAN_KIND_SERVER)
    a = attrs(s)
    assert a["gen_ai.operation.name"] == "execute_tool"
    assert a["gen_ai.tool.name"] == "echo"
    assert a["mcp.method.name"] == "tools/call"
    assert a["ringgate.mcp_server"] == "tools"
    assert a["ringgate.key"] == "tel"
    assert a["http.response.status_code"] == 200
    assert "error.type" not in a and s.status.code != s.status.STATUS_CODE_ERROR
    f = spans["fail"]
    assert attrs(f)["error.type"] == "tool_error"
    assert f.status.code == f.status.STATUS_CODE_ERROR
    # exported in order: the tools/list request's span would be here by now
    assert collector.of_trace(list_id) == []


def metric(base, name, labels):
    # /metrics is on the main listener for a loopback gateway
    text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_metric(base, name, labels, at_least, timeout=60):
    deadline = time.time() + timeout
    v = 0.0
    while time.time() < deadline:
        v = metric(base, name, labels)
        if v >= at_least:
            return v
        time.sleep(0.2)
    raise AssertionError(f"{name}{{{labels}}} = {v}, wanted >= {at_least}")


def test_exported_spans_are_counted(traced, collector):
    trace_id, _, tp = traceparent()
    call(traced, "openai", "gpt-x", False, {"traceparent": tp})
    collector.wait(trace_id, 2)
    wait_metric(traced, "ringgate_telemetry_spans_total", 'result="exported"', 2)


@pytest.fixture(scope="module")
def captured(upstream, collector, driver, shards):
    """Content capture on, and no virtual keys: the spans still carry the answer's usage."""
    tel = (f'otlp_endpoint = "{collector.url}"\ncapture_content = true\n'
           'content_max_bytes = 100')
    yield from gateway_on(upstream, driver, shards, tel, keys=False)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("sdk,model,provider", [("openai", "gpt-x", "openai"),
                                                ("openai", "claude-x", "anthropic"),
                                                ("gemini", "gem-x", "gcp.gemini")])
def test_content_when_captured_and_usage_without_keys(captured, collector, sdk, model,
                                                      provider, stream):
    trace_id, _, tp = traceparent()
    assert call(captured, sdk, model, stream, {"traceparent": tp}) == "hello"
    s = [s for s in collector.wait(trace_id, 2) if s.kind == Span.SPAN_KIND_SERVER][0]
    a = attrs(s)
    content = a["gen_ai.input.messages"]
    assert PROMPT[:14] in content
    assert len(content.encode()) == 100, content  # the body was longer: cut
    # the answer's text, in the conventions' shape, read from the upstream's answer
    out = json.loads(a["gen_ai.output.messages"])
    assert out == [{"role": "assistant", "parts": [{"type": "text", "content": "hello"}],
                    "finish_reason": ANSWER[provider][1][0]}], out
    assert a["gen_ai.response.id"] == ANSWER[provider][0]
    # an unkeyed request's span has the usage its upstream reported
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == \
        (USAGE_IN, USAGE_OUT)
    assert "ringgate.key" not in a


@pytest.fixture(scope="module")
def unsampled(upstream, collector, driver, shards):
    yield from gateway_on(upstream, driver, shards,
                          f'otlp_endpoint = "{collector.url}"\nsample_ratio = 0.0')


def test_ratio_zero_exports_only_a_sampled_callers_trace(unsampled, collector):
    # no caller context: nothing exported, nothing sent upstream
    n = len(Upstream.seen)
    for _ in range(5):
        call(unsampled, "openai", "gpt-x", False, {})
    assert all(t is None for _, t, _ in Upstream.seen[n:])
    # a caller that did not sample: passed on unsampled, not exported
    off_id, _, off = traceparent(sampled=False)
    call(unsampled, "anthropic", "claude-x", False, {"traceparent": off})
    sent = [t for _, t, _ in Upstream.seen if t and off_id in t]
    assert len(sent) == 1 and sent[0].endswith("-00"), sent
    # a sampled caller: exported
    on_id, parent, on = traceparent()
    call(unsampled, "openai", "gpt-x", True, {"traceparent": on})
    spans = collector.wait(on_id, 2)
    assert [s.parent_span_id.hex() for s in spans if s.kind == Span.SPAN_KIND_SERVER] == [parent]
    time.sleep(2)  # past a batch interval: anything of the others would have arrived too
    assert collector.of_trace(off_id) == []


# ---- a collector that is down, failing or hanging never touches the requests ---------------

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("mode", ["down", "500", "hang"])
def test_bad_collector_costs_requests_nothing(upstream, driver, shards, mode):
    bad = None
    if mode == "down":
        url = f"http://127.0.0.1:{free_port()}"
    else:
        bad = Collector()
        bad.mode = mode
        url = bad.url
    tel = f'otlp_endpoint = "{url}"\nqueue_spans = 8'
    try:
        for base in gateway_on(upstream, driver, shards, tel):
            c = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=20)
            t0 = time.time()

            def one(_):
                r = c.chat.completions.create(model="gpt-x",
                                              messages=[{"role": "user", "content": "hi"}])
                return r.choices[0].message.content

            # eight clients at a time: the requests in a fraction of the wall time. A hung
            # collector's exporter holds at most one batch (512) and the queue (8): 400
            # requests (800 spans) leave at least 280 that can only have been dropped
            n = 400 if mode == "hang" else 200
            with ThreadPoolExecutor(8) as pool:
                assert list(pool.map(one, range(n))) == ["hello"] * n
            took = time.time() - t0
            spans = lambda r: metric(base, "ringgate_telemetry_spans_total", f'result="{r}"')
            if mode == "hang":
                # the exporter waits out its timeouts on one batch: the queue of 8 overflows
                wait_metric(base, "ringgate_telemetry_spans_total", 'result="dropped"',
                            2 * n - 512 - 8)
            else:
                # every one of the 400 spans (a SERVER and a CLIENT a request) is accounted for
                deadline = time.time() + 60
                while spans("dropped") + spans("failed") < 400 and time.time() < deadline:
                    time.sleep(0.2)
                assert spans("dropped") + spans("failed") == 400
                assert spans("failed") > 0
            assert spans("exported") == 0
            # generous: 200 loopback requests in a debug build on a loaded box
            assert took < 120, took
            if bad:
                # a collector that hangs lets go: the stop's flush need not wait out its timeout
                bad.release.set()
    finally:
        if bad:
            bad.close()


# ---- the request log export ----------------------------------------------------------------

def test_request_log_lines_and_rotation(upstream, collector, driver, shards, tmp_path):
    path = tmp_path / "requests.jsonl"
    log = f'requests_file = "{path}"\nrequests_file_max_bytes = "4KiB"'
    tel = f'otlp_endpoint = "{collector.url}"'
    for base in gateway_on(upstream, driver, shards, tel, log):
        trace_id, _, tp = traceparent()
        call(base, "openai", "gpt-x", False, {"traceparent": tp})
        deadline = time.time() + 30
        line = None
        while time.time() < deadline and line is None:
            if path.exists():
                for l in path.read_text().splitlines():
                    if trace_id in l:
                        line = json.loads(l)
            time.sleep(0.1)
        assert line, "the request's line never arrived"
        assert line["trace_id"] == trace_id
        assert line["key"] == "tel"
        assert line["model"] == "gpt-x"
        assert (line["tokens_in"], line["tokens_out"]) == (USAGE_IN, USAGE_OUT)
        assert line["cost_usd"] == pytest.approx(USAGE_IN * 1e-6 + USAGE_OUT * 2e-6)
        assert line["status"] == 200
        # ~400 bytes a line: 40 requests pass 4 KiB a few times
        c = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=20)
        for _ in range(40):
            c.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "x"}])
            time.sleep(0.02)
        old = tmp_path / "requests.jsonl.1"
        deadline = time.time() + 30
        while time.time() < deadline and not old.exists():
            time.sleep(0.1)
        assert old.exists()
        assert old.stat().st_size <= 4096
        assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.jsonl", "requests.jsonl.1"]
        for f in (path, old):
            for l in f.read_text().splitlines():
                json.loads(l)
        assert metric(base, "ringgate_request_log_dropped_total", "") == 0


# ---- reload and shutdown -----------------------------------------------------------------

def test_reload_applies_telemetry_and_shutdown_flushes(upstream, driver, shards, tmp_path):
    """A reload moves `[telemetry]`: to another endpoint and sample ratio, off, on again; the
    spans of the last request before a stop are exported as the gateway ends (within the
    export's 1 s batch window, which would otherwise still be open)."""
    a, b = Collector(), Collector()
    path = tmp_path / "ringgate.toml"
    env = {"RINGGATE_DRIVER": driver, **ENV}

    def write(tel):
        path.write_text(config(upstream, shards, tel))

    write(f'otlp_endpoint = "{a.url}"')
    proc, addr = spawn(["--config", str(path)], env)
    base = f"http://{addr}"
    c = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=20)

    def sent_traceparent(headers):
        c.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "x"}],
                                  extra_headers=headers)
        return Upstream.seen[-1][1]

    def until(what, check):
        deadline = time.time() + 30
        while time.time() < deadline:
            if check():
                return
            time.sleep(0.1)
        raise AssertionError(what)

    def exported_to(coll):
        trace_id, _, tp = traceparent()
        sent_traceparent({"traceparent": tp})
        time.sleep(0.2)
        return any(s.kind == Span.SPAN_KIND_SERVER for s in coll.of_trace(trace_id))

    try:
        until("exported to a", lambda: exported_to(a))
        # another endpoint and ratio 0: a sampled caller's trace goes to b, none is started
        write(f'otlp_endpoint = "{b.url}"\nsample_ratio = 0.0')
        proc.send_signal(signal.SIGHUP)
        until("exported to b", lambda: exported_to(b))
        assert sent_traceparent({}) is None
        n = len(a.spans)
        # off: nothing traced, nothing passed on
        write("")
        proc.send_signal(signal.SIGHUP)
        until("off", lambda: sent_traceparent({"traceparent": traceparent()[2]}) is None)
        # on again, ratio 1: a fresh trace for a request without context
        write(f'otlp_endpoint = "{b.url}"')
        proc.send_signal(signal.SIGHUP)
        until("on again", lambda: sent_traceparent({}) is not None)
        assert len(a.spans) == n, "nothing went to the old endpoint after the reload"
        # the last request's spans leave at shutdown
        trace_id, _, tp = traceparent()
        sent_traceparent({"traceparent": tp})
        proc.terminate()
        proc.wait(timeout=20)
        assert len(b.of_trace(trace_id)) == 2
    finally:
        if proc.poll() is None:
            stop(proc)
        a.close()
        b.close()
