"""`kind = "vertex"` through the official SDKs: a service-account key made here (RSA,
`cryptography`), a fake token endpoint that verifies the RS256 assertion with its public key,
and a fake Vertex API that refuses any token it did not issue or that expired. Gemini models
(`generateContent`, `streamGenerateContent?alt=sse`) and Anthropic models (`rawPredict`,
`streamRawPredict`, body with `anthropic_version = "vertex-2023-10-16"` and no `model`), stream
and not, with tools; one token for many calls; renewed before it expires."""

import json
import os
import tempfile
import threading
import time
import urllib.parse

import anthropic
import openai
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google import genai
from google.genai import types

from cloud_fakes import Vertex, reply
from conftest import serve_config

EMAIL = "gateway@my-project.iam.gserviceaccount.com"


def setup(lifetime=3600):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    up = Vertex(key.public_key(), EMAIL, "my-project", "us-central1", lifetime)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    sa = {"type": "service_account", "project_id": "my-project", "private_key_id": "k1",
          "private_key": pem, "client_email": EMAIL, "token_uri": f"{up.url}/token"}
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(sa, f)
    f.close()
    return up, f.name


def config(shards, up, sa_path, creds_line=True):
    creds = f'credentials_file = "{sa_path}"' if creds_line else ""
    return f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}

[[provider]]
name = "gcp"
kind = "vertex"
project = "my-project"
location = "us-central1"
{creds}
base_url = "{up.url}"

[[model]]
name = "gemini-vertex"
provider = "gcp"
upstream_model = "gemini-2.5-flash"

[[model]]
name = "claude-vertex"
provider = "gcp"
upstream_model = "claude-3-5-sonnet-v2@20241022"
"""


def env():
    return {"GOOGLE_APPLICATION_CREDENTIALS": "", "GCE_METADATA_HOST": "127.0.0.1:1"}


@pytest.fixture(scope="module")
def vertex(shards):
    up, sa = setup()
    for base in serve_config(config(shards, up, sa), env()):
        yield base, up
    up.stop()
    os.unlink(sa)


FN = {"name": "get_weather", "description": "weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def test_gemini_models_through_genai_and_openai(vertex):
    base, up = vertex
    c = genai.Client(api_key="unused", http_options={"base_url": base})
    assert c.models.generate_content(model="gemini-vertex", contents="hi").text == "Hello from Vertex Gemini"
    path = up.calls[-1][0]
    assert path == "/v1/projects/my-project/locations/us-central1/publishers/google/models/gemini-2.5-flash:generateContent"
    text = "".join(ch.text or "" for ch in c.models.generate_content_stream(model="gemini-vertex", contents="hi"))
    assert text == "Hello from Vertex Gemini"
    assert up.calls[-1][0].endswith(":streamGenerateContent?alt=sse")
    cfg = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(
            name="get_weather", parameters={"type": "OBJECT", "properties": {"city": {"type": "STRING"}}})])],
        automatic_function_calling={"disable": True})
    r = c.models.generate_content(model="gemini-vertex", contents="weather?", config=cfg)
    assert r.function_calls[0].args == {"city": "Paris"}
    o = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    r = o.chat.completions.create(model="gemini-vertex", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "Hello from Vertex Gemini"
    s = o.chat.completions.create(model="gemini-vertex", stream=True, tools=[{"type": "function", "function": FN}],
                                  messages=[{"role": "user", "content": "weather?"}])
    args = "".join(t.function.arguments or "" for ch in s for d in ch.choices for t in d.delta.tool_calls or [])
    assert json.loads(args) == {"city": "Paris"}
    assert not up.refused, up.refused


def test_anthropic_models_through_anthropic_and_openai(vertex):
    base, up = vertex
    c = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    m = c.messages.create(model="claude-vertex", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    assert m.content[0].text == "Hello from Vertex Claude"
    path, _, body = up.calls[-1]
    assert path == "/v1/projects/my-project/locations/us-central1/publishers/anthropic/models/claude-3-5-sonnet-v2%4020241022:rawPredict"
    assert body["anthropic_version"] == "vertex-2023-10-16" and "model" not in body
    tool = {"name": "get_weather", "input_schema": FN["parameters"]}
    with c.messages.stream(model="claude-vertex", max_tokens=64, tools=[tool],
                           messages=[{"role": "user", "content": "weather?"}]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].input == {"city": "Paris"}
    assert up.calls[-1][0].endswith(":streamRawPredict")
    with c.messages.stream(model="claude-vertex", max_tokens=64,
                           messages=[{"role": "user", "content": "hi"}]) as s:
        assert "".join(s.text_stream) == "Hello from Vertex Claude"
    o = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    r = o.chat.completions.create(model="claude-vertex", tools=[{"type": "function", "function": FN}],
                                  messages=[{"role": "user", "content": "weather?"}])
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}
    s = o.chat.completions.create(model="claude-vertex", stream=True,
                                  messages=[{"role": "user", "content": "hi"}])
    assert "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices) == "Hello from Vertex Claude"
    assert not up.refused, up.refused


def test_one_token_for_many_calls(vertex):
    base, up = vertex
    o = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    for _ in range(20):
        o.chat.completions.create(model="gemini-vertex", messages=[{"role": "user", "content": "hi"}])
    assert up.token_calls == 1, up.token_calls
    assert len({tok for _, tok, _ in up.calls}) == 1


def test_token_renewed_before_expiry_under_load(shards):
    """Tokens living 10 s, renewed halfway while 3 clients call for 22 s; the API refuses an
    expired token, so no failure means every call carried a live one."""
    up, sa = setup(lifetime=10)
    failures = []
    for base in serve_config(config(shards, up, sa, creds_line=False),
                             dict(env(), GOOGLE_APPLICATION_CREDENTIALS=sa)):
        end = time.time() + 22

        def load():
            o = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
            while time.time() < end:
                try:
                    o.chat.completions.create(model="gemini-vertex", messages=[{"role": "user", "content": "hi"}])
                except Exception as e:  # noqa: BLE001
                    failures.append(repr(e))

        ts = [threading.Thread(target=load) for _ in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert not failures, failures[:3]
    assert not up.refused, up.refused[:3]
    assert up.token_calls >= 3, up.token_calls
    up.stop()
    os.unlink(sa)


class OtherSources(Vertex):
    """The same fake, also answering the two other token sources the way Google does: the
    metadata server (`GET /computeMetadata/v1/instance/service-accounts/default/token` with
    `Metadata-Flavor: Google`) and the refresh-token grant of an `authorized_user` file (what
    `gcloud auth application-default login` writes)."""

    CLIENT = {"client_id": "cid.apps.googleusercontent.com", "client_secret": "csecret",
              "refresh_token": "1//refresh-me"}

    def __init__(self):
        super().__init__(None, EMAIL, "my-project", "us-central1")
        self.sources = []

    def issue(self, source):
        with self.lock:
            self.token_calls += 1
            self.sources.append(source)
            tok = f"ya29.{source}-{self.token_calls}"
            self.tokens[tok] = time.time() + self.lifetime
        return tok

    def handle(self, h, body):
        if h.path == "/computeMetadata/v1/instance/service-accounts/default/token":
            if h.headers.get("metadata-flavor") != "Google":
                self.refused.append("metadata without Metadata-Flavor")
                return reply(h, 403, "missing Metadata-Flavor", "text/plain")
            return reply(h, 200, {"access_token": self.issue("metadata"), "expires_in": 3599,
                                  "token_type": "Bearer"})
        if h.path == "/token":
            form = dict(urllib.parse.parse_qsl(body.decode()))
            want = dict(self.CLIENT, grant_type="refresh_token")
            if form != want:
                self.refused.append(f"refresh grant {sorted(form)}")
                return reply(h, 400, {"error": "invalid_grant"})
            return reply(h, 200, {"access_token": self.issue("user"), "expires_in": 3599,
                                  "token_type": "Bearer"})
        return super().handle(h, body)


def test_metadata_server_and_authorized_user_tokens(shards):
    up = OtherSources()
    o = lambda base: openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)  # noqa: E731
    ask = [{"role": "user", "content": "hi"}]
    # no credentials file anywhere: the metadata server named by GCE_METADATA_HOST
    meta_env = {"GOOGLE_APPLICATION_CREDENTIALS": "", "GCE_METADATA_HOST": up.addr}
    for base in serve_config(config(shards, up, "", creds_line=False), meta_env):
        for _ in range(3):
            r = o(base).chat.completions.create(model="gemini-vertex", messages=ask)
            assert r.choices[0].message.content == "Hello from Vertex Gemini"
    assert up.sources == ["metadata"], up.sources
    assert {tok for _, tok, _ in up.calls} == {"ya29.metadata-1"}
    # an authorized_user file (GOOGLE_APPLICATION_CREDENTIALS), its token_uri given as token_url
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(dict(up.CLIENT, type="authorized_user"), f)
    f.close()
    cfg = config(shards, up, "", creds_line=False).replace(
        f'base_url = "{up.url}"', f'base_url = "{up.url}"\ntoken_url = "{up.url}/token"')
    user_env = {"GOOGLE_APPLICATION_CREDENTIALS": f.name, "GCE_METADATA_HOST": "127.0.0.1:1"}
    for base in serve_config(cfg, user_env):
        m = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0).messages.create(
            model="claude-vertex", max_tokens=16, messages=ask)
        assert m.content[0].text == "Hello from Vertex Claude"
    assert up.sources == ["metadata", "user"], up.sources
    assert up.calls[-1][1] == "ya29.user-2"
    assert not up.refused, up.refused
    up.stop()
    os.unlink(f.name)
