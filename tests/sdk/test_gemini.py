"""The official `google-genai` SDK, unchanged (only `http_options={"base_url": ...}`), through
the gateway's Gemini dialect: translated to an OpenAI-kind and an Anthropic-kind provider, and
passed through to a Gemini-kind one — all three served by `ringgate mock`. Text, system
instruction, multi-turn, streams, a two-step function-calling turn (non-stream and stream),
token counts, the model list, errors and keys; content, finish reasons and usage asserted
exactly."""

import json

import pytest
from google import genai
from google.genai import errors, types

from conftest import serve_config
from test_openai_sdk import expected

# client model → what serves it (see the `multi` fixture in conftest.py)
MODELS = {"gpt-4o-mini": "openai", "claude-native": "anthropic", "gpt-on-gemini": "gemini"}
TOOL_ARGS = {"location": "Paris, France", "unit": "celsius"}
WEATHER = types.FunctionDeclaration(
    name="get_weather", description="Weather for a city",
    # upper-case types, as the SDK sends them; OpenAI and Anthropic reject these untranslated
    parameters=types.Schema(type="OBJECT", properties={
        "location": types.Schema(type="STRING"),
        "unit": types.Schema(type="STRING", enum=["celsius", "fahrenheit"], nullable=True)},
        required=["location"]))
TOOLS = types.GenerateContentConfig(
    tools=[types.Tool(function_declarations=[WEATHER])],
    automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))


_clients = []


def gm(base, key="sk-goog-client"):
    """A client kept alive for the session (the SDK closes its HTTP client when the `Client`
    is collected, which a temporary `gm(...).models…` would be mid-call)."""
    c = genai.Client(api_key=key, http_options={"base_url": base, "timeout": 10_000})
    _clients.append(c)
    return c


@pytest.mark.parametrize("model", MODELS)
def test_text_with_system_instruction(multi, model):
    r = gm(multi).models.generate_content(
        model=model, contents="hi",
        config=types.GenerateContentConfig(max_output_tokens=7, system_instruction="Be brief."))
    assert r.text == expected(7)
    assert r.candidates[0].finish_reason == types.FinishReason.STOP
    assert r.usage_metadata.candidates_token_count == 7
    assert r.usage_metadata.prompt_token_count > 0
    assert r.usage_metadata.total_token_count == (
        r.usage_metadata.prompt_token_count + r.usage_metadata.candidates_token_count)


@pytest.mark.parametrize("model", MODELS)
def test_multi_turn(multi, model):
    contents = [
        types.Content(role="user", parts=[types.Part(text="hi")]),
        types.Content(role="model", parts=[types.Part(text="hello")]),
        types.Content(role="user", parts=[
            types.Part(text="and this?"),
            types.Part(inline_data=types.Blob(mime_type="image/png", data=b"\x89PNG fake"))]),
    ]
    r = gm(multi).models.generate_content(
        model=model, contents=contents, config=types.GenerateContentConfig(max_output_tokens=4))
    assert r.text == expected(4)


@pytest.mark.parametrize("model", MODELS)
def test_stream_text(multi, model):
    chunks = list(gm(multi).models.generate_content_stream(
        model=model, contents="hi", config=types.GenerateContentConfig(max_output_tokens=9)))
    assert "".join(c.text or "" for c in chunks) == expected(9)
    last = chunks[-1]
    assert last.candidates[0].finish_reason == types.FinishReason.STOP
    assert last.usage_metadata.candidates_token_count == 9


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", MODELS)
def test_function_calling_turn(multi, model, stream):
    c = gm(multi)
    ask = types.Content(role="user", parts=[types.Part(text="What is the weather in Paris?")])
    if stream:
        chunks = list(c.models.generate_content_stream(model=model, contents=[ask], config=TOOLS))
        calls = [fc for ch in chunks for fc in (ch.function_calls or [])]
        assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    else:
        r = c.models.generate_content(model=model, contents=[ask], config=TOOLS)
        calls = r.function_calls
        assert r.candidates[0].finish_reason == types.FinishReason.STOP
    assert len(calls) == 1, "a call arrives whole, exactly once"
    assert calls[0].name == "get_weather" and calls[0].args == TOOL_ARGS
    # second step: the function's result goes back; the model answers in text
    turn = [ask,
            types.Content(role="model", parts=[types.Part(function_call=calls[0])]),
            types.Content(role="user", parts=[types.Part.from_function_response(
                name="get_weather", response={"temperature": 21})])]
    r = c.models.generate_content(
        model=model, contents=turn,
        config=types.GenerateContentConfig(
            tools=TOOLS.tools, automatic_function_calling=TOOLS.automatic_function_calling,
            max_output_tokens=5))
    assert r.function_calls is None and r.text == expected(5)


@pytest.mark.parametrize("model", MODELS)
def test_count_tokens(multi, model):
    n = gm(multi).models.count_tokens(model=model, contents="hello there, how are you?")
    assert n.total_tokens > 0


def test_models_list_and_get(multi):
    c = gm(multi)
    names = [m.name for m in c.models.list()]
    assert "models/gpt-on-gemini" in names and "models/claude-native" in names
    m = c.models.get(model="claude-native")
    assert m.name == "models/claude-native"
    assert "generateContent" in m.supported_actions


def test_unknown_model_is_a_client_error_in_gemini_shape(multi):
    with pytest.raises(errors.ClientError) as e:
        gm(multi).models.generate_content(model="no-such-model", contents="hi")
    assert e.value.code == 404 and e.value.status == "NOT_FOUND"
    assert "no-such-model" in e.value.message
    with pytest.raises(errors.ClientError) as e:
        gm(multi).models.get(model="no-such-model")
    assert e.value.code == 404


def test_untranslatable_tool_is_a_400_in_gemini_shape(multi):
    cfg = types.GenerateContentConfig(tools=[types.Tool(google_search=types.GoogleSearch())])
    with pytest.raises(errors.ClientError) as e:
        gm(multi).models.generate_content(model="gpt-4o-mini", contents="hi", config=cfg)
    assert e.value.code == 400 and e.value.status == "INVALID_ARGUMENT"


KEY = "rg-sdk-gemini-7c1d9e2f4a6b8c0d1e3f5a7b9c1d3e5f"


@pytest.fixture(scope="module")
def keyed(mock, driver, shards):
    cfg = f"""
[server]
listen = "127.0.0.1:0"
shards = {shards}

[[provider]]
name = "an"
kind = "anthropic"
base_url = "http://{mock}"

[[model]]
name = "claude-native"
provider = "an"

[[key]]
name = "team"
key_env = "RG_SDK_GEMINI_KEY"
"""
    yield from serve_config(cfg, {"RINGGATE_DRIVER": driver, "RG_SDK_GEMINI_KEY": KEY})


def test_keys_from_x_goog_api_key_and_query(keyed):
    r = gm(keyed, KEY).models.generate_content(
        model="claude-native", contents="hi",
        config=types.GenerateContentConfig(max_output_tokens=2))
    assert r.text == expected(2)
    with pytest.raises(errors.ClientError) as e:
        gm(keyed, "rg-wrong").models.generate_content(model="claude-native", contents="hi")
    assert e.value.code == 401 and e.value.status == "UNAUTHENTICATED"
    assert "rg-wrong" not in str(e.value)
    # `?key=` (Google's REST examples), percent-encoded or not
    import urllib.parse
    import urllib.request
    body = json.dumps({"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                       "generationConfig": {"maxOutputTokens": 3}}).encode()
    url = (keyed + "/v1beta/models/claude-native:generateContent?key="
           + urllib.parse.quote(KEY, safe=""))
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        out = json.loads(resp.read())
    assert out["candidates"][0]["content"]["parts"][0]["text"] == expected(3)
