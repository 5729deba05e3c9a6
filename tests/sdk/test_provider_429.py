"""Provider 429s with the official SDKs (issue 20 item 3), at 1 and 2 shards under each I/O
driver: a 429 with `Retry-After: 7` from the only deployment reaches an SDK with
`max_retries=0` as its RateLimitError at once (the gateway used to wait 7 s before each of
three attempts: SDK callers saw a timeout), carrying the upstream's Retry-After; with the SDK's
own retries on, the SDK waits the Retry-After the gateway passed on and its retry succeeds.

The limited model's upstream is the mock with a fault chosen by the upstream model name
(`mock-fault-429:retry-after_7`); the retry case uses a scripted upstream that limits only the
first request of each dialect."""

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import openai
import pytest

from conftest import serve_config

CONFIG = """
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
api_key_env = "RG_TEST_429_ANTHROPIC_KEY"

[[provider]]
name = "once-oa"
kind = "openai"
base_url = "http://{once}/v1"

[[provider]]
name = "once-an"
kind = "anthropic"
base_url = "http://{once}"
api_key_env = "RG_TEST_429_ANTHROPIC_KEY"

[[model]]
name = "limited-gpt"
provider = "oa"
upstream_model = "mock-fault-429:retry-after_7"

[[model]]
name = "limited-claude"
provider = "an"
upstream_model = "mock-fault-429:retry-after_7"

[[model]]
name = "once-gpt"
provider = "once-oa"

[[model]]
name = "once-claude"
provider = "once-an"
"""

CHAT = {"id": "c1", "object": "chat.completion", "created": 1, "model": "once-gpt",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "once-claude",
           "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
           "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}


class Once(BaseHTTPRequestHandler):
    """First POST per path: 429 + Retry-After: 2 in the path's dialect; later ones: 200."""

    seen = {}
    lock = threading.Lock()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", "0")))
        with Once.lock:
            n = Once.seen.get(self.path, 0)
            Once.seen[self.path] = n + 1
        anth = self.path.endswith("/messages")
        if n == 0:
            err = ({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
                   if anth else {"error": {"message": "Rate limit reached", "type": "requests",
                                           "param": None, "code": "rate_limit_exceeded"}})
            self.answer(429, err, {"retry-after": "2"})
        else:
            self.answer(200, MESSAGE if anth else CHAT, {})

    def answer(self, status, body, headers):
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


@pytest.fixture(params=[1, 2], scope="module")
def gw(request, mock, driver):
    Once.seen = {}
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Once)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cfg = CONFIG.format(shards=request.param, mock=mock, once=f"127.0.0.1:{srv.server_port}")
    env = {"RINGGATE_DRIVER": driver, "RG_TEST_429_ANTHROPIC_KEY": "sk-ant-test"}
    yield from serve_config(cfg, env)
    srv.shutdown()


def oa(base, retries):
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=retries, timeout=30)


def an(base, retries):
    return anthropic.Anthropic(base_url=base, api_key="unused", max_retries=retries, timeout=30)


def ask(base, sdk, model, retries):
    if sdk == "openai":
        return oa(base, retries).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    return an(base, retries).messages.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3)


@pytest.mark.parametrize("sdk,model", [("openai", "limited-gpt"), ("anthropic", "limited-claude"),
                                       ("openai", "limited-claude"), ("anthropic", "limited-gpt")])
def test_max_retries_0_gets_rate_limit_error_at_once(gw, sdk, model):
    err = openai.RateLimitError if sdk == "openai" else anthropic.RateLimitError
    first = None  # (retry-after, when) of the first answer
    for _ in range(2):  # the upstream's 429 (or a key still cooling from it), then the key's own
        t0 = time.monotonic()
        with pytest.raises(err) as e:
            ask(gw, sdk, model, 0)
        took = time.monotonic() - t0
        assert took < 4, f"took {took:.1f} s"
        ra = int(e.value.response.headers["retry-after"])
        # never more than the upstream's 7 s, never 0 while the key cools
        assert 1 <= ra <= 7, ra
        if first is None:
            first = (ra, time.monotonic())
        else:
            # the cooling key counts down from the first answer's value: by the whole seconds
            # that passed between the two (a loaded box may take seconds), never up
            waited = time.monotonic() - first[1]
            assert first[0] - int(waited) - 1 <= ra <= first[0], (first, ra, waited)


@pytest.mark.parametrize("sdk,model", [("openai", "once-gpt"), ("anthropic", "once-claude")])
def test_sdk_retries_honour_the_passed_on_retry_after(gw, sdk, model):
    t0 = time.monotonic()
    r = ask(gw, sdk, model, 2)
    took = time.monotonic() - t0
    text = r.choices[0].message.content if sdk == "openai" else r.content[0].text
    assert text == "ok"
    # the SDK waited the 2 s Retry-After (its own backoff would be under 1 s), then its retry
    # was served
    assert took >= 1.8, f"retried after {took:.2f} s"
    assert Once.seen[("/v1/chat/completions" if sdk == "openai" else "/v1/messages")] == 2
    # …and the wait was the SDK's: the gateway answered the first call with the 429 (2 s is
    # over max_retry_wait_ms) instead of sleeping on it (shards publish once a second)
    deadline = time.monotonic() + 5
    while True:
        lines = urllib.request.urlopen(gw + "/metrics", timeout=10).read().decode().splitlines()
        limited = [l for l in lines if l.startswith("ringgate_requests_total{")
                   and f'model="{model}"' in l and 'status_class="4xx"' in l]
        if sum(int(l.rsplit(" ", 1)[1]) for l in limited) >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sum(int(l.rsplit(" ", 1)[1]) for l in limited) == 1, limited
