"""Chat templates rendered as vLLM renders them (routing.tokens.chat_template), with small templates
written here and exact expected texts."""

from __future__ import annotations

from typing import Any

import pytest

from routing.tokens.chat_template import (
    ChatTemplate,
    Unsupported,
    detect_content_format,
    engine_conversation,
    engine_message,
    engine_tools,
    template_kwargs,
)

pytest.importorskip("jinja2")

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2's template without its default system turn."""

LINES = """\
{{ bos_token }}
{% for message in messages %}
    {% if message.role == 'system' %}
[S]{{ message.content }}
    {% else %}
[{{ message.role }}]{{ message.content }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
[assistant]
{% endif %}
"""
"""Block tags on their own, indented lines: trim_blocks and lstrip_blocks drop the whitespace
they leave."""

OPENAI = ("{% for m in messages %}{% for part in m['content'] %}"
          "{{ part['type'] }}:{{ part['text'] }};{% endfor %}|{% endfor %}")


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"messages": list(messages), **fields}


def user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_chatml_renders_the_prompt_the_engine_renders() -> None:
    got = ChatTemplate(CHATML).render(chat({"role": "system", "content": "Be terse."},
                                           user("Hi")))
    assert got == ("<|im_start|>system\nBe terse.<|im_end|>\n"
                   "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_add_generation_prompt_false_leaves_out_the_assistant_header() -> None:
    got = ChatTemplate(CHATML).render(chat(user("Hi"), add_generation_prompt=False))
    assert got == "<|im_start|>user\nHi<|im_end|>\n"


def test_block_tags_leave_no_whitespace_and_special_tokens_are_variables() -> None:
    template = ChatTemplate(LINES, {"bos_token": "<s>", "eos_token": "</s>"})
    got = template.render(chat({"role": "system", "content": "S"}, user("U")))
    assert got == "<s>\n[S]S\n[user]U\n[assistant]\n"


def test_tools_are_dumped_as_the_engine_dumps_them_and_tojson_keeps_unicode() -> None:
    template = ChatTemplate("{{ tools | tojson }}")
    tool = {"type": "function", "function": {"name": "météo", "parameters": {"b": 1, "a": 2}}}
    assert template.render(chat(user("x"), tools=[tool])) == (
        '[{"type": "function", "function": {"name": "météo", "description": null, '
        '"parameters": {"b": 1, "a": 2}}}]')


def test_tojson_takes_indent_and_sort_keys_as_transformers_does() -> None:
    template = ChatTemplate("{{ messages[0] | tojson(indent=1, sort_keys=True) }}")
    assert template.render(chat(user("é"))) == '{\n "content": "é",\n "role": "user"\n}'


def test_no_tools_is_none_for_the_template() -> None:
    assert ChatTemplate("{{ tools is none }}").render(chat(user("x"))) == "True"


def test_a_template_that_raises_gives_none() -> None:
    template = ChatTemplate("{{ raise_exception('no system role') }}")
    assert template.render(chat(user("x"))) is None


def test_strftime_now_and_the_generation_tag_are_defined() -> None:
    template = ChatTemplate("{{ strftime_now('day') }}|{% generation %}kept{% endgeneration %}")
    assert template.render(chat(user("x"))) == "day|kept"


def test_the_sandbox_refuses_what_vllm_refuses() -> None:
    template = ChatTemplate("{{ messages.append(1) }}")  # an immutable sandbox
    assert template.render(chat(user("x"))) is None


@pytest.mark.parametrize(("source", "expected"), [
    (CHATML, "string"),
    (OPENAI, "openai"),
    ("{% set msgs = messages %}{% for m in msgs %}{% for c in m.content %}{% endfor %}"
     "{% endfor %}", "openai"),
    ("{% for m in messages[1:] %}{% for c in m['content'] | list %}{% endfor %}{% endfor %}",
     "openai"),
    ("{% for m in messages %}{% set content = m.content %}{% for c in content %}{% endfor %}"
     "{% endfor %}", "openai"),
    ("{% macro show(c) %}{% for p in c %}{% endfor %}{% endmacro %}"
     "{% for m in messages %}{{ show(m.content) }}{% endfor %}", "string"),  # not followed
    ("{% for", "string"),
])
def test_the_content_format_is_detected_like_vllm(source: str, expected: str) -> None:
    assert detect_content_format(source) == expected


def test_string_format_joins_text_parts_with_newlines() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"},
             {"type": "refusal", "refusal": "c"}, {"type": "text", "text": None}]
    assert engine_message(user(parts), "string") == {"role": "user", "content": "a\nb\nc"}
    assert engine_message(user(None), "string") == {"role": "user", "content": ""}


def test_openai_format_gives_text_parts_even_for_a_string() -> None:
    template = ChatTemplate(OPENAI)
    assert template.content_format == "openai"
    assert template.render(chat(user("hi"), user([{"type": "text", "text": "a"}]))) == \
        "text:hi;|text:a;|"


def test_the_content_format_can_be_set() -> None:
    assert ChatTemplate(CHATML, content_format="openai").content_format == "openai"
    with pytest.raises(ValueError):
        ChatTemplate(CHATML, content_format="html")


def test_a_non_text_part_is_not_modelled() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    assert ChatTemplate(CHATML).render(chat(user([image]))) is None
    with pytest.raises(Unsupported):
        engine_message(user([image]), "string")


def test_assistant_tool_calls_get_parsed_arguments_and_tool_messages_string_content() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
             {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "[1]"}},
             {"id": "c3", "type": "function", "function": {"name": "h", "arguments": "{bad"}}]
    assistant = {"role": "assistant", "content": None, "tool_calls": calls, "reasoning": "r"}
    tool = {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "ok"}]}
    got = engine_conversation([assistant, tool], "openai")
    assert [c["function"]["arguments"] for c in got[0]["tool_calls"]] == [{"x": 1}, {}, {}]
    assert got[0]["content"] == [] and got[0]["reasoning_content"] == "r"
    assert got[1] == {"role": "tool", "content": "ok", "tool_call_id": "c1"}
    assert calls[0]["function"]["arguments"] == '{"x": 1}'  # the request is left as it was


def test_an_empty_tool_call_list_is_dropped_and_names_are_kept() -> None:
    got = engine_message({"role": "assistant", "content": "a", "tool_calls": [], "name": "bot"},
                         "string")
    assert got == {"role": "assistant", "content": "a", "name": "bot"}


def test_developer_messages_become_one_leading_system_message_when_unknown() -> None:
    messages = [user("u"), {"role": "developer", "content": "d"},
                {"role": "system", "content": "s"}]
    merged = engine_conversation(messages, "string", developer_role=False)
    assert merged == [{"role": "system", "content": "d\n\ns"}, {"role": "user", "content": "u"}]
    kept = engine_conversation(messages, "string", developer_role=True)
    assert kept[1] == {"role": "developer", "content": "d", "tools": None}
    template = ChatTemplate("{% for m in messages %}{{ m.role }};{% endfor %}")
    assert template.render(chat(*messages)) == "system;user;"


def test_a_template_naming_the_developer_role_sees_it() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m.role }}{% if m.role == 'developer' %}!"
                            "{% endif %};{% endfor %}")
    assert template.render(chat({"role": "developer", "content": "d"})) == "developer!;"


def test_tools_dump_fills_absent_fields_and_keeps_strict() -> None:
    got = engine_tools([{"type": "function", "function": {"name": "f", "strict": True}}])
    assert got == [{"type": "function", "function": {
        "name": "f", "description": None, "parameters": None, "strict": True}}]
    assert engine_tools(None) is None
    with pytest.raises(Unsupported):
        engine_tools([{"type": "function", "function": {}}])


def test_request_options_reach_the_template() -> None:
    kwargs = template_kwargs({"chat_template_kwargs": {"x": 1, "y": None},
                              "reasoning_effort": "none"})
    assert kwargs == {"x": 1, "reasoning_effort": "none", "enable_thinking": False}
    template = ChatTemplate("{{ x }}{{ enable_thinking }}{{ documents | length }}")
    assert template.render(chat(user("u"), chat_template_kwargs={"x": 7},
                                reasoning_effort="low", documents=[{"t": 1}])) == "7True1"


@pytest.mark.parametrize("fields", [{"chat_template": "{{ 1 }}"}, {"continue_final_message": True},
                                    {"chat_template_kwargs": {"tokenize": True}},
                                    {"messages": []}, {"messages": ["text"]}])
def test_requests_not_modelled_give_none(fields: dict[str, Any]) -> None:
    assert ChatTemplate(CHATML).render({**chat(user("u")), **fields}) is None
