"""`kind = "bedrock"` through the official SDKs: a fake Converse upstream on loopback
(`cloud_fakes.Bedrock`) recomputes every request's SigV4 signature with botocore and refuses
mismatches; ConverseStream answers are event-stream frames with valid CRCs cut at random byte
offsets. Credentials from each source of the chain (env, shared files with role_arn +
source_profile, web identity, container, IMDSv2, a Bedrock API key, the provider's role_arn),
and short-lived ones renewed under load."""

import os
import tempfile
import threading
import time

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

from cloud_fakes import Bedrock, Creds, Issuer, Sts
from conftest import serve_config

MODEL = "anthropic.claude-3-5-sonnet-20241022-v2:0"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}}]


def clean_env(**kw):
    """An environment without the host's AWS settings (HOME in a fresh dir, IMDS off)."""
    env = {k: "" for k in os.environ if k.startswith("AWS_")}
    env.update(HOME=tempfile.mkdtemp(prefix="rg-aws-home-"), AWS_EC2_METADATA_DISABLED="true")
    env.update(kw)
    return env


def config(shards, up, extra=""):
    return f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}

[[provider]]
name = "aws"
kind = "bedrock"
region = "us-east-1"
base_url = "{up.url}"
{extra}

[[model]]
name = "claude-bedrock"
provider = "aws"
upstream_model = "{MODEL}"

[[model]]
name = "throttled"
provider = "aws"
upstream_model = "throttled"
"""


@pytest.fixture(scope="module")
def static(shards):
    up = Bedrock(keys={"AKIDSTATIC": ("static-secret", None, None)})
    env = clean_env(AWS_ACCESS_KEY_ID="AKIDSTATIC", AWS_SECRET_ACCESS_KEY="static-secret")
    for base in serve_config(config(shards, up), env):
        yield base, up
    up.stop()


def test_openai_sdk_chat_stream_and_tools(static):
    base, up = static
    c = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    r = c.chat.completions.create(model="claude-bedrock",
                                  messages=[{"role": "system", "content": "be brief"},
                                            {"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "Hello from Bedrock"
    assert r.usage.prompt_tokens == 11 and r.usage.completion_tokens == 5
    path, who, req = up.requests[-1]
    assert path == "/model/anthropic.claude-3-5-sonnet-20241022-v2%3A0/converse"
    assert who == "AKIDSTATIC" and req["system"] == [{"text": "be brief"}]
    s = c.chat.completions.create(model="claude-bedrock", stream=True,
                                  stream_options={"include_usage": True},
                                  messages=[{"role": "user", "content": "hi"}])
    chunks = list(s)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "Hello from Bedrock"
    assert chunks[-1].usage.completion_tokens == 5
    assert up.requests[-1][0].endswith("/converse-stream")
    r = c.chat.completions.create(model="claude-bedrock", tools=TOOLS,
                                  messages=[{"role": "user", "content": "weather in Paris?"}])
    tc = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert (tc.function.name, tc.function.arguments) == ("get_weather", '{"city":"Paris"}')
    s = c.chat.completions.create(model="claude-bedrock", tools=TOOLS, stream=True,
                                  messages=[{"role": "user", "content": "weather in Paris?"}])
    args, finish = "", None
    for ch in s:
        for d in ch.choices:
            for t in d.delta.tool_calls or []:
                args += t.function.arguments or ""
            finish = d.finish_reason or finish
    assert (args, finish) == ('{"city": "Paris"}', "tool_calls")
    # the tool result goes back as a toolResult block in a user turn
    c.chat.completions.create(model="claude-bedrock", tools=TOOLS, messages=[
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "tooluse_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "tooluse_1", "content": "sunny"}])
    last = up.requests[-1][2]["messages"][-1]
    assert last["content"][0]["toolResult"] == {"toolUseId": "tooluse_1", "content": [{"text": "sunny"}]}
    assert not up.refused, up.refused
    with pytest.raises(openai.RateLimitError):
        c.chat.completions.create(model="throttled", messages=[{"role": "user", "content": "x"}])
    print(c.responses.create(model="claude-bedrock", input="hi").output_text)


def test_anthropic_sdk_stream_and_tools(static):
    base, up = static
    c = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    m = c.messages.create(model="claude-bedrock", max_tokens=64,
                          messages=[{"role": "user", "content": "hi"}])
    assert m.content[0].text == "Hello from Bedrock" and m.stop_reason == "end_turn"
    tool = {"name": "get_weather", "description": "weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
    m = c.messages.create(model="claude-bedrock", max_tokens=64, tools=[tool],
                          messages=[{"role": "user", "content": "weather?"}])
    assert m.stop_reason == "tool_use"
    assert [b for b in m.content if b.type == "tool_use"][0].input == {"city": "Paris"}
    with c.messages.stream(model="claude-bedrock", max_tokens=64, tools=[tool],
                           messages=[{"role": "user", "content": "weather?"}]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b for b in final.content if b.type == "tool_use"][0].input == {"city": "Paris"}
    with c.messages.stream(model="claude-bedrock", max_tokens=64,
                           messages=[{"role": "user", "content": "hi"}]) as s:
        assert "".join(s.text_stream) == "Hello from Bedrock"
    with pytest.raises(anthropic.RateLimitError):
        c.messages.create(model="throttled", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert not up.refused, up.refused


def test_genai_sdk_stream_and_tools(static):
    base, up = static
    c = genai.Client(api_key="unused", http_options={"base_url": base})
    assert c.models.generate_content(model="claude-bedrock", contents="hi").text == "Hello from Bedrock"
    text = "".join(ch.text or "" for ch in c.models.generate_content_stream(model="claude-bedrock", contents="hi"))
    assert text == "Hello from Bedrock"
    fn = types.FunctionDeclaration(name="get_weather", description="weather",
                                   parameters={"type": "OBJECT", "properties": {"city": {"type": "STRING"}}})
    cfg = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[fn])],
                                      automatic_function_calling={"disable": True})
    r = c.models.generate_content(model="claude-bedrock", contents="weather?", config=cfg)
    assert r.function_calls[0].name == "get_weather" and r.function_calls[0].args == {"city": "Paris"}
    calls = [fc for ch in c.models.generate_content_stream(model="claude-bedrock", contents="weather?", config=cfg)
             for fc in (ch.function_calls or [])]
    assert calls[0].args == {"city": "Paris"}
    assert not up.refused, up.refused


def one_call(base):
    c = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    r = c.chat.completions.create(model="claude-bedrock", messages=[{"role": "user", "content": "hi"}])
    return r.choices[0].message.content


def test_a_wrong_secret_is_refused_by_botocore_check(shards):
    up = Bedrock(keys={"AKIDSTATIC": ("the-right-secret", None, None)})
    env = clean_env(AWS_ACCESS_KEY_ID="AKIDSTATIC", AWS_SECRET_ACCESS_KEY="a-wrong-secret")
    for base in serve_config(config(shards, up), env):
        with pytest.raises(openai.PermissionDeniedError):
            one_call(base)
    assert up.refused == ["signature mismatch"]
    up.stop()


def test_bedrock_api_key_as_bearer(shards):
    up = Bedrock(bearer="bedrock-api-key-1")
    for base in serve_config(config(shards, up), clean_env(AWS_BEARER_TOKEN_BEDROCK="bedrock-api-key-1")):
        assert one_call(base) == "Hello from Bedrock"
    assert up.requests[-1][1] == "bearer" and not up.refused
    up.stop()


def test_profile_role_arn_with_source_profile(shards):
    keys = {}
    up = Bedrock(keys=keys)
    sts = Sts(Issuer(keys), callers={"AKIDSOURCE": ("source-secret", None, None)})
    home = tempfile.mkdtemp()
    with open(f"{home}/credentials", "w") as f:
        f.write("[base]\naws_access_key_id = AKIDSOURCE\naws_secret_access_key = source-secret\n")
    with open(f"{home}/config", "w") as f:
        f.write("[profile dev]\nrole_arn = arn:aws:iam::123456789012:role/dev\nsource_profile = base\n")
    env = clean_env(AWS_PROFILE="dev", AWS_SHARED_CREDENTIALS_FILE=f"{home}/credentials",
                    AWS_CONFIG_FILE=f"{home}/config")
    cfg = config(shards, up, f'sts_url = "{sts.url}"')
    for base in serve_config(cfg, env):
        assert one_call(base) == "Hello from Bedrock"
    assert sts.calls == [("AssumeRole", "arn:aws:iam::123456789012:role/dev", None)]
    assert up.requests[-1][1].startswith("ASIATEST") and not up.refused
    up.stop(), sts.stop()


def test_web_identity_then_provider_role_arn(shards):
    keys = {}
    issuer = Issuer(keys)
    up = Bedrock(keys=keys)
    # the web identity's keys may call AssumeRole for the provider's role_arn
    sts = Sts(issuer, callers=keys, web_token="oidc-token-1")
    tok = tempfile.NamedTemporaryFile("w", delete=False)
    tok.write("oidc-token-1\n")
    tok.close()
    env = clean_env(AWS_WEB_IDENTITY_TOKEN_FILE=tok.name, AWS_ROLE_ARN="arn:aws:iam::1:role/web")
    cfg = config(shards, up, f'sts_url = "{sts.url}"\nrole_arn = "arn:aws:iam::1:role/gateway"')
    for base in serve_config(cfg, env):
        assert one_call(base) == "Hello from Bedrock"
    assert [(a, r, w) for a, r, w in sts.calls] == [
        ("AssumeRoleWithWebIdentity", "arn:aws:iam::1:role/web", None),
        ("AssumeRole", "arn:aws:iam::1:role/gateway", None)]
    assert up.requests[-1][1] == "ASIATEST00000002" and not up.refused
    up.stop(), sts.stop()


def test_imds_v2(shards):
    keys = {}
    up = Bedrock(keys=keys)
    imds = Creds(Issuer(keys))
    env = clean_env(AWS_EC2_METADATA_DISABLED="", AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.url)
    for base in serve_config(config(shards, up), env):
        assert one_call(base) == "Hello from Bedrock"
    assert imds.served == 1 and not up.refused
    up.stop(), imds.stop()


def test_container_credentials_expire_and_renew_under_load(shards):
    """Keys living 12 s: the gateway renews them halfway, while 4 clients keep calling for
    25 s; the upstream refuses any expired key, so every call succeeding means no request
    was signed with an expired key."""
    keys = {}
    up = Bedrock(keys=keys)
    ctr = Creds(Issuer(keys, lifetime=12))
    env = clean_env(AWS_CONTAINER_CREDENTIALS_FULL_URI=f"{ctr.url}/creds",
                    AWS_CONTAINER_AUTHORIZATION_TOKEN="container-secret")
    failures, done = [], []
    for base in serve_config(config(shards, up), env):
        assert one_call(base) == "Hello from Bedrock"
        end = time.time() + 25

        def load():
            n = 0
            while time.time() < end:
                try:
                    assert one_call(base) == "Hello from Bedrock"
                    n += 1
                except Exception as e:  # noqa: BLE001
                    failures.append(repr(e))
            done.append(n)

        ts = [threading.Thread(target=load) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert not failures, failures[:3]
    assert not up.refused, up.refused[:3]
    assert ctr.served >= 3, ctr.served
    assert len({who for _, who, _ in up.requests}) >= 3
    assert sum(done) > 20, done
    up.stop(), ctr.stop()
