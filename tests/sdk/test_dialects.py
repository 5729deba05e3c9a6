"""Official SDKs, unchanged, through the gateway to `ringgate mock`, across dialects:
the anthropic SDK against an openai-kind upstream, the openai SDK (Chat and Responses)
against an anthropic-kind upstream, Gemini upstreams, and the same-dialect passthroughs.
Content, tool name/arguments, stop reasons and usage are asserted exactly."""

import base64
import json
import struct

import anthropic
import openai
import pytest

from test_openai_sdk import expected

TOOL_ARGS = {"location": "Paris, France", "unit": "celsius"}
WEATHER_OA = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"},
                                                    "unit": {"type": "string"}},
                   "required": ["location"]}}}]
WEATHER_AN = [{"name": "get_weather", "description": "Weather for a city",
               "input_schema": WEATHER_OA[0]["function"]["parameters"]}]
WEATHER_RESP = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
                 "parameters": WEATHER_OA[0]["function"]["parameters"]}]


def oa(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=10)


def an(base):
    return anthropic.Anthropic(base_url=base, api_key="sk-ant-client", max_retries=0, timeout=10)


# ---------- anthropic SDK in ----------

@pytest.mark.parametrize("model", ["claude-on-openai", "claude-native", "claude-on-compat"])
def test_anthropic_text(multi, model):
    m = an(multi).messages.create(model=model, max_tokens=9, system="Be brief.",
                                  messages=[{"role": "user", "content": "hi"}])
    assert m.type == "message" and m.role == "assistant"
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == expected(9)
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.output_tokens == 9 and m.usage.input_tokens > 0
    assert m.model == model


@pytest.mark.parametrize("model", ["claude-on-openai", "claude-native"])
def test_anthropic_stream_text(multi, model):
    with an(multi).messages.stream(model=model, max_tokens=25,
                                   messages=[{"role": "user", "content": "hi"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == expected(25)
    assert final.usage.output_tokens == 25
    assert final.stop_reason in ("end_turn", "max_tokens")


@pytest.mark.parametrize("model", ["claude-on-openai", "claude-native", "claude-on-compat"])
def test_anthropic_stream_tool_call_reassembles_exactly(multi, model):
    events = []
    with an(multi).messages.stream(model=model, max_tokens=50, tools=WEATHER_AN,
                                   messages=[{"role": "user", "content": "Weather in Paris?"}]) as s:
        for ev in s:
            events.append(ev)
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    kinds = [b.type for b in final.content]
    assert kinds == ["text", "tool_use"], kinds
    assert final.content[0].text == "Let me check."
    tool = final.content[1]
    assert tool.name == "get_weather"
    assert tool.input == TOOL_ARGS
    # the streamed partial_json fragments concatenate to exactly the arguments, sent once
    partial = "".join(e.delta.partial_json for e in events
                      if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    assert json.loads(partial) == TOOL_ARGS
    starts = [e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use"]
    assert len(starts) == 1
    assert final.usage.output_tokens > 0


def test_anthropic_non_stream_tool_call(multi):
    m = an(multi).messages.create(model="claude-on-openai", max_tokens=50, tools=WEATHER_AN,
                                  messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert m.stop_reason == "tool_use"
    assert m.content[-1].type == "tool_use" and m.content[-1].input == TOOL_ARGS
    # send the tool result back: a normal text answer follows
    m2 = an(multi).messages.create(
        model="claude-on-openai", max_tokens=4, tools=WEATHER_AN,
        messages=[{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": [b.model_dump() for b in m.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": m.content[-1].id,
                                                "content": "18C"}]}])
    assert m2.stop_reason in ("end_turn", "max_tokens")
    assert m2.content[0].text == expected(4)


def test_anthropic_errors_are_anthropic_shaped(multi):
    with pytest.raises(anthropic.NotFoundError) as e:
        an(multi).messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "not_found_error"


def test_anthropic_count_tokens(multi):
    for model in ["claude-on-openai", "claude-native"]:
        r = an(multi).messages.count_tokens(model=model, messages=[{"role": "user", "content": "hello " * 100}])
        assert r.input_tokens > 50


# ---------- openai SDK Chat in ----------

@pytest.mark.parametrize("model", ["gpt-on-anthropic", "gpt-on-gemini"])
def test_openai_chat_translated(multi, model):
    r = oa(multi).chat.completions.create(model=model, max_tokens=11,
                                          messages=[{"role": "system", "content": "Be brief."},
                                                    {"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == expected(11)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens == 11
    assert r.model == model


@pytest.mark.parametrize("model", ["gpt-on-anthropic", "gpt-on-gemini"])
def test_openai_chat_stream_translated(multi, model):
    chunks = list(oa(multi).chat.completions.create(
        model=model, max_tokens=21, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "hi"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected(21)
    usage = [c.usage for c in chunks if c.usage]
    assert usage and usage[-1].completion_tokens == 21
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


@pytest.mark.parametrize("model", ["gpt-on-anthropic", "gpt-on-gemini", "gpt-4o-mini"])
def test_openai_chat_stream_tool_call(multi, model):
    chunks = list(oa(multi).chat.completions.create(
        model=model, max_tokens=50, stream=True, tools=WEATHER_OA,
        messages=[{"role": "user", "content": "Weather in Paris?"}]))
    calls = {}
    finish = None
    for c in chunks:
        if not c.choices:
            continue
        d = c.choices[0].delta
        for tc in d.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": None, "name": None, "args": ""})
            slot["id"] = tc.id or slot["id"]
            if tc.function and tc.function.name:
                assert slot["name"] is None, "the tool name is sent once"
                slot["name"] = tc.function.name
            slot["args"] += (tc.function.arguments or "") if tc.function else ""
        finish = c.choices[0].finish_reason or finish
    assert list(calls) == [0]
    assert calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads(calls[0]["args"]) == TOOL_ARGS
    assert finish == "tool_calls"


def test_openai_chat_non_stream_tool_call_translated(multi):
    r = oa(multi).chat.completions.create(model="gpt-on-anthropic", max_tokens=50, tools=WEATHER_OA,
                                          messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert r.choices[0].finish_reason == "tool_calls"
    tc = r.choices[0].message.tool_calls[0]
    assert tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments) == TOOL_ARGS


# ---------- openai SDK Responses in ----------

@pytest.mark.parametrize("model", ["gpt-on-anthropic", "gpt-4o-mini"])
def test_openai_responses(multi, model):
    r = oa(multi).responses.create(model=model, input="hi", instructions="Be brief.", max_output_tokens=13)
    assert r.output_text == expected(13)
    assert r.usage.output_tokens == 13
    assert r.status in ("completed", "incomplete")


@pytest.mark.parametrize("model", ["gpt-on-anthropic", "gpt-4o-mini"])
def test_openai_responses_stream(multi, model):
    events = list(oa(multi).responses.create(model=model, input="hi", max_output_tokens=17, stream=True))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == expected(17)
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.usage.output_tokens == 17


@pytest.mark.parametrize("model", ["gpt-on-anthropic", "gpt-4o-mini"])
def test_openai_responses_stream_tool_call(multi, model):
    events = list(oa(multi).responses.create(model=model, input="Weather in Paris?", tools=WEATHER_RESP,
                                             max_output_tokens=50, stream=True))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == TOOL_ARGS
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert len(done) == 1 and done[0].name == "get_weather"
    assert json.loads(done[0].arguments) == TOOL_ARGS
    assert events[-1].type == "response.completed"


def test_embeddings_passthrough(multi):
    r = oa(multi).embeddings.create(model="gpt-4o-mini", input=["a", "b"])
    assert len(r.data) == 2 and len(r.data[0].embedding) > 0


def test_embeddings_base64_decodes_to_the_float_vectors(multi):
    """The SDK asks for base64 when no format is given (openai-node and LangChain JS too) and
    decodes little-endian f32s: the result must equal the float answer (to f32 precision)."""
    c = oa(multi)
    floats = c.embeddings.create(model="gpt-4o-mini", input=["a", "b"], encoding_format="float")
    b64 = c.embeddings.create(model="gpt-4o-mini", input=["a", "b"], encoding_format="base64")
    default = c.embeddings.create(model="gpt-4o-mini", input=["a", "b"])
    # asked for explicitly, the SDK hands the string over as is
    decoded = [list(struct.unpack("<64f", base64.b64decode(d.embedding))) for d in b64.data]
    # asked for by the SDK itself, it decodes
    assert len(default.data) == 2
    for f, g, d in zip(floats.data, decoded, default.data):
        assert len(f.embedding) == 64
        assert g == pytest.approx(f.embedding, rel=1e-6, abs=1e-7)
        assert d.embedding == pytest.approx(f.embedding, rel=1e-6, abs=1e-7)


# ---------- Azure deployments ----------

def test_azure_passthrough_uses_the_deployment_url(multi):
    r = oa(multi).chat.completions.create(model="gpt-on-azure", max_tokens=6,
                                          messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == expected(6)
    # the mock answers with the deployment name it found in the URL path
    assert r.model == "my-deployment"


def test_anthropic_sdk_on_azure_stream(multi):
    with an(multi).messages.stream(model="claude-on-azure", max_tokens=8,
                                   messages=[{"role": "user", "content": "hi"}]) as s:
        text = "".join(s.text_stream)
    assert text == expected(8)
