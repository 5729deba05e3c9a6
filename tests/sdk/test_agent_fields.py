"""Agent-traffic fields through the official SDKs, across dialects (`multi`: every provider
kind pointed at `ringgate mock`): thinking / reasoning both ways (the mock answers Chat
requests carrying `reasoning_effort` with `reasoning_content`, as vLLM and DeepSeek do, and
Anthropic requests with `thinking` enabled with a signed thinking block), structured output
(`response_format` / `text.format` through the forced answer tool), and the clear 400 for
`n > 1` on a translated route."""

import anthropic
import openai
import pydantic
import pytest

from test_openai_sdk import expected

REASONING = "Thinking it over."
SIGNATURE = "mock-signature"


def oa(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=10)


def an(base):
    return anthropic.Anthropic(base_url=base, api_key="sk-ant-client", max_retries=0, timeout=10)


THINK = {"type": "enabled", "budget_tokens": 2048}


# ---------- anthropic SDK with thinking ----------

@pytest.mark.parametrize("model", ["claude-on-compat", "claude-on-openai"])
def test_anthropic_thinking_stream_from_reasoning_content(multi, model):
    """An OpenAI-compatible upstream streams `reasoning_content`: the anthropic SDK sees a
    `thinking` block (thinking_delta events) before the text."""
    with an(multi).messages.stream(model=model, max_tokens=4000, thinking=THINK,
                                   messages=[{"role": "user", "content": "hi"}]) as s:
        kinds, thinking = [], []
        for ev in s:
            if ev.type == "content_block_start":
                kinds.append(ev.content_block.type)
            if ev.type == "thinking":
                thinking.append(ev.thinking)
        final = s.get_final_message()
    assert kinds == ["thinking", "text"]
    assert "".join(thinking) == REASONING
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == REASONING
    assert final.content[1].text == expected(4000)[:len(final.content[1].text)]


def test_anthropic_thinking_non_stream_from_reasoning_content(multi):
    m = an(multi).messages.create(model="claude-on-compat", max_tokens=3000, thinking=THINK,
                                  messages=[{"role": "user", "content": "hi"}])
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == REASONING


def test_anthropic_thinking_passthrough_untouched(multi):
    """Same dialect: thinking blocks and their signature arrive as the provider sent them."""
    with an(multi).messages.stream(model="claude-native", max_tokens=5, thinking=THINK,
                                   messages=[{"role": "user", "content": "hi"}]) as s:
        final = s.get_final_message()
    assert final.content[0].type == "thinking"
    assert final.content[0].thinking == REASONING
    assert final.content[0].signature == SIGNATURE


def test_anthropic_thinking_history_round_trip(multi):
    """A second turn echoing the thinking block goes back through the hub without a 400."""
    client = an(multi)
    first = client.messages.create(model="claude-on-compat", max_tokens=3000, thinking=THINK,
                                   messages=[{"role": "user", "content": "hi"}])
    second = client.messages.create(
        model="claude-on-compat", max_tokens=3000, thinking=THINK,
        messages=[{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                  {"role": "user", "content": "again"}])
    assert second.content[0].type == "thinking"


# ---------- openai SDK against an Anthropic provider with thinking ----------

def test_openai_chat_reasoning_effort_to_anthropic_thinking(multi):
    r = oa(multi).chat.completions.create(model="gpt-on-anthropic", reasoning_effort="low",
                                          messages=[{"role": "user", "content": "hi"}],
                                          max_completion_tokens=3000)
    msg = r.choices[0].message
    extra = msg.model_extra or {}
    assert extra.get("reasoning_content") == REASONING
    assert extra["thinking_blocks"][0]["signature"] == SIGNATURE
    assert msg.content


def test_openai_chat_stream_reasoning_content_from_anthropic(multi):
    s = oa(multi).chat.completions.create(model="gpt-on-anthropic", reasoning_effort="medium",
                                          stream=True, max_completion_tokens=9000,
                                          messages=[{"role": "user", "content": "hi"}])
    reasoning, text = [], []
    for ch in s:
        if ch.choices:
            d = ch.choices[0].delta
            reasoning.append((d.model_extra or {}).get("reasoning_content") or "")
            text.append(d.content or "")
    assert "".join(reasoning) == REASONING
    assert "".join(text)


def test_openai_responses_reasoning_item_from_anthropic(multi):
    client = oa(multi)
    r = client.responses.create(model="gpt-on-anthropic", input="hi", max_output_tokens=3000,
                                reasoning={"effort": "low"})
    assert r.output[0].type == "reasoning"
    assert r.output[0].content[0].text == REASONING
    with client.responses.stream(model="gpt-on-anthropic", input="hi", max_output_tokens=3000,
                                 reasoning={"effort": "low"}) as s:
        deltas = [e.delta for e in s if e.type == "response.reasoning_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == REASONING
    assert [o.type for o in final.output] == ["reasoning", "message"]


# ---------- structured output through the forced answer tool ----------

class Weather(pydantic.BaseModel):
    location: str
    unit: str


def test_openai_chat_parse_structured_output(multi):
    # (Gemini gets responseMimeType/responseSchema: golden tests; the mock answers text.)
    r = oa(multi).chat.completions.parse(model="gpt-on-anthropic", response_format=Weather,
                                         messages=[{"role": "user", "content": "Paris?"}])
    assert r.choices[0].message.parsed == Weather(location="Paris, France", unit="celsius")
    assert r.choices[0].finish_reason == "stop"


def test_openai_chat_stream_structured_output(multi):
    with oa(multi).chat.completions.stream(model="gpt-on-anthropic", response_format=Weather,
                                           messages=[{"role": "user", "content": "Paris?"}]) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.parsed == Weather(location="Paris, France", unit="celsius")


def test_openai_responses_parse_structured_output(multi):
    r = oa(multi).responses.parse(model="gpt-on-anthropic", input="Paris?", text_format=Weather)
    assert r.output_parsed == Weather(location="Paris, France", unit="celsius")


def test_structured_output_that_cannot_be_mapped_is_a_400(multi):
    with pytest.raises(openai.BadRequestError) as err:
        oa(multi).chat.completions.create(
            model="gpt-on-anthropic", messages=[{"role": "user", "content": "list"}],
            response_format={"type": "json_schema", "json_schema": {
                "name": "l", "schema": {"type": "array", "items": {"type": "string"}}}})
    assert "Anthropic" in str(err.value)


@pytest.mark.parametrize("model", ["gpt-on-anthropic", "gpt-on-gemini"])
def test_n_above_one_is_a_400_on_translated_routes(multi, model):
    with pytest.raises(openai.BadRequestError) as err:
        oa(multi).chat.completions.create(model=model, n=2,
                                          messages=[{"role": "user", "content": "hi"}])
    assert "`n`" in str(err.value)


def test_tool_choice_named_and_parallel_off_through_anthropic(multi):
    tools = [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {"location": {"type": "string"}}}}} for n in ("a", "b")]
    r = oa(multi).chat.completions.create(
        model="gpt-on-anthropic", tools=tools, parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "b"}},
        messages=[{"role": "user", "content": "Paris?"}])
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["b"]
    assert r.choices[0].finish_reason == "tool_calls"
