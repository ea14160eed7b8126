"""Tool calls in the model's chat format: parse them out of an assistant turn, render them, and render results.

The format is Qwen3's (the embedded tiny model's template has the same shape)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "23*47"}}
    </tool_call>

and a result goes back as a ``tool`` role message, which the chat template renders (Qwen3: inside
``<tool_response>...</tool_response>`` in a user block). Parsing never raises: a block that is not valid JSON, lacks
a name or is not closed becomes a :class:`ToolCall` with ``error`` set, which the environment turns into an error
observation.

:class:`ChatFormat` holds the token-level pieces a multi-turn rollout needs from a tokenizer's chat template: the
end-of-turn token the model stops on, and the tokens that follow an assistant turn when tool messages are appended
(``<|im_end|>`` → ``\\n<|im_start|>user\\n<tool_response>...`` → next generation prompt). Rollouts concatenate these
token ids instead of re-rendering the conversation, so the sequence trained on is exactly the one that was sampled.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from agentic_rl.errors import ConfigError

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


@dataclass
class ToolCall:
    """One parsed call: ``name`` and ``arguments``, or ``error`` saying why the block could not be read."""

    name: str | None = None
    arguments: Any = field(default_factory=dict)
    error: str | None = None
    raw: str = ""


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(the text outside tool-call blocks, the calls in order). Never raises.

    >>> text = '<tool_call>\\n{"name": "calculator", "arguments": {"expression": "2*3"}}\\n</tool_call>'
    >>> parse_tool_calls(text)[1][0].name
    'calculator'
    """
    calls: list[ToolCall] = []
    for match in _BLOCK.finditer(text):
        calls.append(_parse_block(match.group(1)))
    rest = _BLOCK.sub("", text)
    if TOOL_CALL_OPEN in rest:  # an opening tag with no closing tag (e.g. the turn was cut off)
        raw = rest[rest.index(TOOL_CALL_OPEN):]
        calls.append(ToolCall(error=f"the tool call is not closed with {TOOL_CALL_CLOSE}", raw=raw))
        rest = rest[: rest.index(TOOL_CALL_OPEN)]
    return rest.strip(), calls


def _parse_block(body: str) -> ToolCall:
    raw = body.strip()
    try:
        data = json.loads(raw)
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
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCall(name=name, error=f'the "arguments" of {name} are not a JSON object', raw=raw)
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


# ---------------------------------------------------------------------------------------------------------------
# Token-level pieces of the chat template
# ---------------------------------------------------------------------------------------------------------------

_SENTINEL = "ASSISTANT_TURN_SENTINEL_91"


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
        text = self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=True, **self.kwargs)
        return self.encode(text)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def turn_ids(self, assistant_text: str) -> list[int]:
        """An assistant turn as the model writes it: its text, then the end-of-turn token."""
        return self.encode(assistant_text) + [self.end_of_turn_id]

    def tool_suffix_ids(self, tool_messages: list[dict[str, str]]) -> list[int]:
        """Tokens after an assistant turn's end token: the tool messages, then the next generation prompt."""
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
        try:
            full = self.tokenizer.apply_chat_template(base + list(tool_messages), tokenize=False,
                                                      add_generation_prompt=True, **self.kwargs)
        except Exception as exc:  # noqa: BLE001 - a template without tool messages is a configuration problem
            raise ConfigError(f"the chat template cannot render tool messages ({exc}); use a model whose template "
                              "supports the 'tool' role") from None
        marker = _SENTINEL + self.end_of_turn
        if marker not in full:
            raise ConfigError(f"the chat template does not end an assistant turn with {self.end_of_turn!r}; "
                              "multi-turn rollouts need a template where it does (Qwen-style)")
        return self.encode(full[full.index(marker) + len(marker):])
