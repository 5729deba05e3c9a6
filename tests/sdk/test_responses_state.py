"""Responses API state on translated routes with the official openai SDK: `responses.create`
with `previous_response_id` against an Anthropic and an OpenAI-compatible (Chat) provider, a
streamed first turn, a tool loop whose second turn goes by `previous_response_id`, and the 400
(`openai.BadRequestError`, `param` named) for an unknown id."""

import openai
import pytest

TRANSLATED = ["gpt-on-anthropic", "claude-on-compat"]
TOOLS = [{"type": "function", "name": "weather", "description": "The weather in a city",
          "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                         "required": ["location"]}}]


def client(base, key="sk-state-client"):
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=10)


@pytest.mark.parametrize("model", TRANSLATED)
def test_previous_response_id(multi, model):
    c = client(multi)
    first = c.responses.create(model=model, input="Say something.")
    assert first.status == "completed" and first.output_text
    second = c.responses.create(model=model, input="And more.", previous_response_id=first.id)
    assert second.status == "completed" and second.output_text
    # the earlier turn reached the upstream: the mock counts more input tokens than for the
    # new input alone
    alone = c.responses.create(model=model, input="And more.", store=False)
    assert second.usage.input_tokens > alone.usage.input_tokens


@pytest.mark.parametrize("model", TRANSLATED)
def test_streamed_turn_then_previous_response_id(multi, model):
    c = client(multi)
    with c.responses.stream(model=model, input="Say something.") as s:
        first = s.get_final_response()
    assert first.status == "completed"
    second = c.responses.create(model=model, input="Go on.", previous_response_id=first.id)
    assert second.status == "completed" and second.output_text


@pytest.mark.parametrize("model", TRANSLATED)
def test_tool_loop_by_previous_response_id(multi, model):
    c = client(multi)
    first = c.responses.create(model=model, input="Weather in Paris?", tools=TOOLS)
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "weather"
    second = c.responses.create(
        model=model, tools=TOOLS, previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "20C"}])
    assert second.status == "completed"
    assert not [o for o in second.output if o.type == "function_call"]
    assert second.output_text


def test_unknown_previous_response_id_is_a_400(multi):
    c = client(multi)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="gpt-on-anthropic", input="x", previous_response_id="resp_unknown")
    assert e.value.status_code == 400
    err = e.value.body
    assert err["type"] == "invalid_request_error"
    assert err["param"] == "previous_response_id"
    assert "resp_unknown" in err["message"]


def test_another_clients_response_is_unknown(multi):
    first = client(multi, "sk-tenant-a").responses.create(model="claude-on-compat", input="hi")
    with pytest.raises(openai.BadRequestError):
        client(multi, "sk-tenant-b").responses.create(
            model="claude-on-compat", input="x", previous_response_id=first.id)
