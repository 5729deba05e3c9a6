"""The model endpoints as each official SDK reads them: openai `models.list` / `models.retrieve`
(404 → NotFoundError), anthropic `models.list` / `models.retrieve` (Anthropic's shape, chosen by
its `anthropic-version` header), google-genai `models.list` / `models.get`."""

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors

CONFIGURED = ["gpt-4o-mini", "gpt-on-azure", "claude-on-azure", "claude-on-openai",
              "gpt-on-anthropic", "claude-native", "gpt-on-gemini", "claude-on-compat"]


def oa(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="sk-client", max_retries=0, timeout=10)


def an(base):
    return anthropic.Anthropic(base_url=base, api_key="sk-ant-client", max_retries=0, timeout=10)


def test_openai_list_and_retrieve(multi):
    c = oa(multi)
    assert [m.id for m in c.models.list()] == CONFIGURED
    m = c.models.retrieve("claude-native")
    assert (m.id, m.object, m.owned_by) == ("claude-native", "model", "an")
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("no-such-model")
    assert e.value.status_code == 404
    assert e.value.body["code"] == "model_not_found"


def test_anthropic_list_and_retrieve(multi):
    c = an(multi)
    page = c.models.list()
    assert [m.id for m in page.data] == CONFIGURED
    assert all(m.type == "model" and m.display_name == m.id for m in page.data)
    assert page.has_more is False
    assert (page.first_id, page.last_id) == (CONFIGURED[0], CONFIGURED[-1])
    assert [m.id for m in c.models.list()] == CONFIGURED  # auto-pagination stops
    m = c.models.retrieve("gpt-on-gemini")
    assert (m.id, m.type) == ("gpt-on-gemini", "model")
    assert m.created_at.year == 1970
    with pytest.raises(anthropic.NotFoundError) as e:
        c.models.retrieve("no-such-model")
    assert e.value.body["error"]["type"] == "not_found_error"


def test_gemini_list_and_get(multi):
    c = genai.Client(api_key="k", http_options={"base_url": multi, "timeout": 10_000})
    assert [m.name for m in c.models.list()] == ["models/" + m for m in CONFIGURED]
    assert c.models.get(model="models/claude-native").display_name == "claude-native"
    with pytest.raises(errors.ClientError) as e:
        c.models.get(model="no-such-model")
    assert (e.value.code, e.value.status) == (404, "NOT_FOUND")
