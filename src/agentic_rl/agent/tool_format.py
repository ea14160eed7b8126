"""Tool calls in the model's chat format: parse them out of an assistant turn, render them, and render results.

The format is Qwen3's (the embedded tiny model's template has the same shape)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "23*47"}}
    </tool_call>

and a result goes back as a ``tool`` role message, which the chat template renders (Qwen3: inside
``<tool_response>...</tool_response>`` in a user block). Parsing never raises and takes time linear in the text: a
block that is not valid JSON (also one nested deeper than ``MAX_ARGUMENT_DEPTH`` or holding an integer too long to
convert), lacks a name or is not closed becomes a :class:`ToolCall` with ``error`` set, which the environment turns
into an error observation quoting at most ``MAX_ECHO_CHARS`` of what the model wrote.

:class:`ChatFormat` holds the token-level pieces a multi-turn rollout needs from a tokenizer's chat template: the
end-of-turn token the model stops on, and the tokens that follow an assistant turn when tool messages are appended
(``<|im_end|>`` → ``\\n<|im_start|>user\\n<tool_response>...`` → next generation prompt). Rollouts concatenate these
token ids instead of re-rendering the conversation, so the sequence trained on is exactly the one that was sampled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agentic_rl.errors import ConfigError
from agentic_rl.utils import parse_json

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
MAX_ARGUMENT_DEPTH = 32   # a call's JSON nests at most this deep (real calls: 2-4 levels)
MAX_ECHO_CHARS = 200      # error observations quote at most this much of what the model wrote


def clip(text: object, limit: int = MAX_ECHO_CHARS) -> str:
    """``text`` on one line and at most ``limit`` characters, for echoing model output in an error observation."""
    line = " ".join(str(text)[: 4 * limit].split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass
class ToolCall:
    """One parsed call: ``name`` and ``arguments``, or ``error`` saying why the block could not be read."""

    name: str | None = None
    arguments: Any = field(default_factory=dict)
    error: str | None = None
    raw: str = ""


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(the text outside tool-call blocks, the calls in order). Never raises, and reads ``text`` once: each block
    runs from an opening tag to the first closing tag after it; an opening tag with no closing tag after it ends
    the calls (an unclosed call, e.g. a turn cut off).

    >>> text = '<tool_call>\\n{"name": "calculator", "arguments": {"expression": "2*3"}}\\n</tool_call>'
    >>> parse_tool_calls(text)[1][0].name
    'calculator'
    """
    calls: list[ToolCall] = []
    outside: list[str] = []
    pos = 0
    while True:
        start = text.find(TOOL_CALL_OPEN, pos)
        if start == -1:
            outside.append(text[pos:])
            break
        end = text.find(TOOL_CALL_CLOSE, start + len(TOOL_CALL_OPEN))
        outside.append(text[pos:start])
        if end == -1:  # an opening tag with no closing tag (e.g. the turn was cut off)
            calls.append(ToolCall(error=f"the tool call is not closed with {TOOL_CALL_CLOSE}", raw=text[start:]))
            break
        calls.append(_parse_block(text[start + len(TOOL_CALL_OPEN):end]))
        pos = end + len(TOOL_CALL_CLOSE)
    return "".join(outside).strip(), calls


def _parse_block(body: str) -> ToolCall:
    raw = body.strip()
    try:
        data = parse_json(raw, max_depth=MAX_ARGUMENT_DEPTH)
    except json.JSONDecodeError as exc:
        return ToolCall(error=f"the tool call is not valid JSON ({exc.msg} at position {exc.pos})", raw=raw)
    if not isinstance(data, dict):
        return ToolCall(error='the tool call must be a JSON object {"name": ..., "arguments": {...}}', raw=raw)
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(error='the tool call has no "name"', raw=raw)
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = parse_json(arguments, max_depth=MAX_ARGUMENT_DEPTH)
        except json.JSONDecodeError as exc:
            return ToolCall(name=name, error=f'the "arguments" of {clip(name, 60)} are not a JSON object '
                                             f"({exc.msg} at position {exc.pos})", raw=raw)
    return ToolCall(name=name, arguments=arguments, raw=raw)


def render_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text of one call exactly as Qwen3's template writes it (so demonstrations match the model's format)."""
    return f'{TOOL_CALL_OPEN}\n{{"name": "{name}", "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n' \
           f"{TOOL_CALL_CLOSE}"


def tool_message(name: str | None, content: str) -> dict[str, str]:
    message = {"role": "tool", "content": content}
    if name:
        message["name"] = name
    return message


def tool_exchange(name: str, arguments: dict[str, Any], result: str) -> list[dict[str, str]]:
    """One call and its result as an episode's messages: the assistant turn that calls ``name``, then the tool's."""
    return [{"role": "assistant", "content": render_tool_call(name, arguments)}, tool_message(name, result)]


# ---------------------------------------------------------------------------------------------------------------
# Token-level pieces of the chat template
# ---------------------------------------------------------------------------------------------------------------

_SENTINEL = "ASSISTANT_TURN_SENTINEL_91"
#: Roles of the messages an environment may answer with: tool results and (e.g. feedback) user messages.
OBSERVATION_ROLES = ("tool", "user")


class ChatFormat:
    """Token ids a multi-turn rollout splices together, derived once from a tokenizer's chat template."""

    def __init__(self, tokenizer, chat_template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        vocab = tokenizer.get_vocab()
        if "<|im_end|>" in vocab:
            self.end_of_turn_id = vocab["<|im_end|>"]
        elif tokenizer.eos_token_id is not None:
            self.end_of_turn_id = tokenizer.eos_token_id
        else:
            raise ConfigError("the tokenizer has neither <|im_end|> nor an eos token to end an assistant turn")
        self.end_of_turn = tokenizer.convert_ids_to_tokens(self.end_of_turn_id)
        self.stop_ids = sorted({self.end_of_turn_id} | ({tokenizer.eos_token_id} - {None}))

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        """Token ids of the conversation so far plus the generation prompt."""
        return self.encode(self.prompt_text(messages, tools))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def turn_ids(self, assistant_text: str) -> list[int]:
        """An assistant turn as the model writes it: its text, then the end-of-turn token."""
        return self.encode(assistant_text) + [self.end_of_turn_id]

    def prompt_text(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> str:
        """The conversation so far plus the generation prompt, as text (what :meth:`prompt_ids` encodes)."""
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=True, **self.kwargs)

    def observation_suffix_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Tokens after an assistant turn's end token: a run of observation messages (role ``tool`` for tool
        results, ``user`` for feedback), then the next generation prompt."""
        return self.encode(self.observation_suffix_text(messages))

    def observation_suffix_text(self, messages: list[dict[str, str]]) -> str:
        """:meth:`observation_suffix_ids` as text."""
        roles = sorted({m.get("role") for m in messages} - set(OBSERVATION_ROLES), key=str)
        if roles:
            raise ConfigError(f"an observation message has role {roles[0]!r}; environments answer with "
                              f"{' or '.join(OBSERVATION_ROLES)} messages")
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
        # Only role, content and name go to the template (a demonstration's "train" flag is not the template's).
        rendered = [{k: v for k, v in m.items() if k in ("role", "content", "name")} for m in messages]
        try:
            full = self.tokenizer.apply_chat_template(base + rendered, tokenize=False,
                                                      add_generation_prompt=True, **self.kwargs)
        except Exception as exc:  # noqa: BLE001 - a template without tool messages is a configuration problem
            raise ConfigError(f"the chat template cannot render tool messages ({exc}); use a model whose template "
                              "supports the 'tool' role") from None
        marker = _SENTINEL + self.end_of_turn
        if marker not in full:
            raise ConfigError(f"the chat template does not end an assistant turn with {self.end_of_turn!r}; "
                              "multi-turn rollouts need a template where it does (Qwen-style)")
        return full[full.index(marker) + len(marker):]

    #: The earlier name (observations were tool messages only).
    tool_suffix_ids = observation_suffix_ids
