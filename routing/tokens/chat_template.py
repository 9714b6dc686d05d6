"""Chat templates rendered as the engine renders them: the prompt text of a chat request.

A chat request reaches the model as the text its chat template (a Jinja program shipped with
the model) makes of the messages; this module makes the same text, so that a tokenizer can
count what the engine counts. It follows vLLM 0.32, which renders through transformers 5's
``apply_chat_template``; SGLang uses the model's Hugging Face template by default too.

Per request: (1) the messages become the engine's conversation (:func:`engine_conversation`);
(2) the tools are dumped as vLLM dumps them (:func:`engine_tools`); (3) the content format,
"string" or "openai", is detected from the template (:func:`detect_content_format`); (4) the
template renders in a sandboxed Jinja environment set up as transformers sets it
(:class:`ChatTemplate`, compiled once); (5) what is not modelled raises :class:`Unsupported`,
and the caller falls back to its estimate. Needs the optional ``jinja2`` package
(``ridge[tokenizers]``), imported only when a template is compiled.

See docs/routing.md#chat-templates.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

CONTENT_FORMATS = ("auto", "string", "openai")
"""``auto``: detect from the template (step 3); ``string`` / ``openai``: as vLLM's
``--chat-template-content-format``."""

TEXT_PARTS: Mapping[str, str] = MappingProxyType({
    "text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
    "thinking": "thinking",
})
"""Content part types read as text, and the field holding the text (vLLM's
``TEXT_PART_TYPES`` and ``MM_PARSER_MAP``)."""

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")
"""The named special tokens a template sees (transformers 5's ``SPECIAL_TOKENS_ATTRIBUTES``)."""

TOOL_FIELDS = ("name", "description", "parameters")
"""A tool function's fields always present in the engine's dump, in order; ``strict`` and
``defer_loading`` follow when set."""

_UNSET = (None, "auto")


class Unsupported(ValueError):
    """A request this module does not render (step 5; what is not modelled:
    docs/routing.md#chat-templates)."""


# -- 1. messages ---------------------------------------------------------------------------

def _part_text(part: Any) -> str | None:
    """The text of a text part; None for a part without text (skipped, as vLLM does)."""
    if isinstance(part, str):
        return part
    if not isinstance(part, Mapping):
        raise Unsupported("a content part that is not an object")
    field = TEXT_PARTS.get(part.get("type"))  # type: ignore[arg-type]
    if field is None:
        raise Unsupported(f"content part of type {part.get('type')!r}")
    text = part.get(field)
    return text if isinstance(text, str) else None


def _texts(content: Any) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise Unsupported("content that is neither a string nor a list of parts")
    return [t for t in map(_part_text, content) if t is not None]


def _content(texts: list[str], content_format: str, role: str) -> Any:
    if content_format == "openai" and role != "tool":
        return [{"type": "text", "text": t} for t in texts]
    return "\n".join(texts)


def _arguments(value: Any) -> dict[str, Any]:
    """A tool call's ``arguments`` as the template sees them: a JSON object (vLLM's
    ``_postprocess_messages``)."""
    if not value:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def _tool_calls(calls: Any) -> list[Any]:
    if not isinstance(calls, list):
        raise Unsupported("tool_calls that is not a list")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or call.get("type", "function") != "function":
            raise Unsupported("a tool call that is not a function call")
        out.append({**call, "function": {**function,
                                         "arguments": _arguments(function.get("arguments"))}})
    return out


def engine_message(message: Any, content_format: str) -> dict[str, Any]:
    """One request message as the engine hands it to the template (step 1)."""
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise Unsupported("a message that is not an object with a role")
    role = message["role"]
    out: dict[str, Any] = {"role": role,
                           "content": _content(_texts(message.get("content")), content_format,
                                               role)}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            calls = _tool_calls(message["tool_calls"])
            if calls:
                out["tool_calls"] = calls
        if message.get("reasoning") is not None:
            out["reasoning"] = out["reasoning_content"] = message["reasoning"]
    elif role == "tool" and "tool_call_id" in message:
        out["tool_call_id"] = message["tool_call_id"]
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    if role == "developer":
        out["tools"] = message.get("tools")
    return out


def _as_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Developer messages as system messages, all system messages merged into one, first
    (vLLM's ``_convert_developer_to_system`` and ``_consolidate_system_messages``)."""
    if not any(m["role"] == "developer" for m in conversation):
        return conversation
    converted = [{k: v for k, v in m.items() if k != "tools"} | {"role": "system"}
                 if m["role"] == "developer" else m for m in conversation]
    systems = [m for m in converted if m["role"] == "system"]
    if len(systems) < 2 and (not systems or converted[0]["role"] == "system"):
        return converted
    texts = [m["content"] if isinstance(m["content"], str)
             else "\n".join(p["text"] for p in m["content"]) for m in systems]
    merged = {"role": "system", "content": "\n\n".join(t for t in texts if t)}
    return [merged, *(m for m in converted if m["role"] != "system")]


def engine_conversation(messages: Any, content_format: str,
                        developer_role: bool = True) -> list[dict[str, Any]]:
    """The request's messages as the engine's conversation (step 1); ``developer_role``:
    whether the template knows the developer role. Raises :class:`Unsupported`."""
    if not isinstance(messages, list) or not messages:
        raise Unsupported("messages must be a non-empty list")
    conversation = [engine_message(m, content_format) for m in messages]
    return conversation if developer_role else _as_system(conversation)


# -- 2. tools ------------------------------------------------------------------------------

def _engine_tool(tool: Any) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise Unsupported("a tool that is not a function with a name")
    dumped: dict[str, Any] = {k: function.get(k) for k in TOOL_FIELDS}
    defer = function.get("defer_loading", tool.get("defer_loading"))
    for key, value in (("strict", function.get("strict")), ("defer_loading", defer)):
        if value is not None:
            dumped[key] = value
    out: dict[str, Any] = {"type": "function", "function": dumped}
    if tool.get("defer_loading") is not None:
        out["defer_loading"] = tool["defer_loading"]
    return out


def engine_tools(tools: Any) -> list[dict[str, Any]] | None:
    """The request's ``tools`` as the engine passes them to the template (step 2)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise Unsupported("tools must be a list")
    return [_engine_tool(t) for t in tools]


# -- 3. content format ---------------------------------------------------------------------

def _is_var(node: Any, nodes: Any, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name


def _is_key(node: Any, nodes: Any, name: str, key: str) -> bool:
    if isinstance(node, nodes.Getitem):
        return (_is_var(node.node, nodes, name) and isinstance(node.arg, nodes.Const)
                and node.arg.value == key)
    return isinstance(node, nodes.Getattr) and _is_var(node.node, nodes, name) \
        and node.attr == key


def _reads(node: Any, nodes: Any, name: str, key: str | None = None) -> bool:
    """Whether ``node`` reads ``name`` (or ``name[key]``), through filters, tests and
    slices (vLLM's ``_is_var_or_elems_access``)."""
    if isinstance(node, nodes.Filter | nodes.Test):
        return node.node is not None and _reads(node.node, nodes, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads(node.node, nodes, name, key)
    return _is_key(node, nodes, name, key) if key else _is_var(node, nodes, name)


def _aliases(ast: Any, nodes: Any, name: str) -> Iterator[str]:
    """``name`` and every variable assigned from it, transitively."""
    seen, todo = {name}, [name]
    while todo:
        current = todo.pop()
        yield current
        for assign in ast.find_all(nodes.Assign):
            target = assign.target
            if (_reads(assign.node, nodes, current) and isinstance(target, nodes.Name)
                    and target.name not in seen):
                seen.add(target.name)
                todo.append(target.name)


def detect_content_format(source: str) -> str:
    """``openai`` when the template loops over a message's content, else ``string`` (step 3;
    a template that does not parse counts as ``string``)."""
    jinja2 = importlib.import_module("jinja2")
    nodes = jinja2.nodes
    try:
        ast = _environment(jinja2).parse(source)
    except jinja2.TemplateSyntaxError:
        return "string"
    lists = set(_aliases(ast, nodes, "messages"))
    loops = list(ast.find_all(nodes.For))
    items = {loop.target.name for loop in loops if isinstance(loop.target, nodes.Name)
             and any(_reads(loop.iter, nodes, v) for v in lists)}
    in_macros = {id(loop) for macro in ast.find_all(nodes.Macro)
                 for loop in macro.find_all(nodes.For)}
    for loop in loops:
        if any(_reads(loop.iter, nodes, v, "content") for v in items) or (
                id(loop) not in in_macros and _is_var(loop.iter, nodes, "content")):
            return "openai"
    return "string"


# -- 4. rendering --------------------------------------------------------------------------

def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _generation_tag(jinja2: Any) -> type:
    """``{% generation %}...{% endgeneration %}`` (transformers marks assistant text with
    it); renders its body."""

    class GenerationTag(jinja2.ext.Extension):  # type: ignore[misc]
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body) \
                .set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    return GenerationTag


def _environment(jinja2: Any) -> Any:
    importlib.import_module("jinja2.sandbox")
    importlib.import_module("jinja2.ext")
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_generation_tag(jinja2), jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise(jinja2)
    env.globals["strftime_now"] = _strftime_now
    return env


def _raise(jinja2: Any) -> Callable[[str], None]:
    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)
    return raise_exception


def template_kwargs(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The request's own template variables: ``chat_template_kwargs``, ``reasoning_effort``
    and ``enable_thinking`` (step 4). Raises :class:`Unsupported` (step 5)."""
    if payload.get("chat_template") is not None or payload.get("continue_final_message"):
        raise Unsupported("a request chat template or continue_final_message")
    own = payload.get("chat_template_kwargs") or {}
    if not isinstance(own, Mapping) or {"chat_template", "tokenize"} & own.keys():
        raise Unsupported("chat_template_kwargs")
    kwargs = {k: v for k, v in own.items() if v not in _UNSET}
    effort = payload.get("reasoning_effort")
    if effort not in _UNSET:
        kwargs["reasoning_effort"] = effort
        kwargs.setdefault("enable_thinking", effort != "none")
    return kwargs


class ChatTemplate:
    """One compiled chat template and the special tokens it renders with.

    ``content_format``: one of :data:`CONTENT_FORMATS` (``auto`` is resolved here, once).
    Raises ImportError without ``jinja2`` and ``jinja2.TemplateSyntaxError`` for a template
    that does not compile.
    """

    __slots__ = ("source", "content_format", "_template", "_specials", "_developer")

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None,
                 content_format: str = "auto") -> None:
        if content_format not in CONTENT_FORMATS:
            raise ValueError(f"content_format must be one of {CONTENT_FORMATS}")
        jinja2 = importlib.import_module("jinja2")
        self.source = source
        self._template = _environment(jinja2).from_string(source)
        self.content_format = (detect_content_format(source) if content_format == "auto"
                               else content_format)
        self._specials = MappingProxyType(dict(special_tokens or {}))
        self._developer = "'developer'" in source or '"developer"' in source

    def render(self, payload: Mapping[str, Any]) -> str | None:
        """The prompt text of the chat request ``payload`` (its ``messages``, ``tools``,
        ``documents``, ``add_generation_prompt`` and template options), or None when this
        module does not model it (step 5)."""
        try:
            variables = {**self._specials, **template_kwargs(payload)}
            variables.update(
                messages=engine_conversation(payload.get("messages"), self.content_format,
                                             self._developer),
                tools=engine_tools(payload.get("tools")),
                documents=payload.get("documents"),
                add_generation_prompt=payload.get("add_generation_prompt", True) is not False)
            text: str = self._template.render(variables)
        except Exception:  # noqa: BLE001 - Unsupported, or the template refused the request
            return None
        return text
