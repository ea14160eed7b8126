"""Tools an agent can call: plain typed Python functions, plus a registry for user tools.

A tool is an ordinary function with annotated arguments and a docstring::

    def calculator(expression: str) -> str:
        '''Evaluate an arithmetic expression such as "23*47" or "(12+7)/2".

        Args:
            expression: the expression to evaluate (numbers, + - * / // % **, parentheses).
        '''

:class:`Tool` derives the JSON schema the chat template shows the model (``{"type": "function", "function": {...}}``)
from the signature and the docstring, checks the arguments of a call against it, and turns every failure of the
call into a :class:`ToolError` whose message becomes the observation the model reads — a tool never crashes an
episode. A call has a time limit (``timeout_s``; the environment setting ``tool_timeout_s``) and its result a length
limit (``max_result_chars``; the setting ``max_tool_result_chars``): a tool that blocks or returns megabytes costs
one error observation or a clipped result, not a hung or exhausted training run. A result that is not a string is
shown as JSON when it is a dict or a list (what a model reads in tool messages), else as ``str(result)``.

A Python function cannot be interrupted from outside, so a call with a time limit runs in a daemon thread: when the
limit passes the episode goes on without it, and the abandoned thread, still running, does not keep the process alive
at exit. While :data:`MAX_ABANDONED_CALLS` calls of one tool are still running that way, further calls of that tool
are refused at once rather than piling up threads.

Registry: ``register_tool(fn)`` / ``get_tool("calculator")``; a name that is not registered may be
``module:function`` (``get_tool("my_pkg.tools:search")``).
"""

from __future__ import annotations

import inspect
import json
import re
import threading
import typing
from collections.abc import Callable
from typing import Any

from agentic_rl.config import import_object
from agentic_rl.errors import ConfigError

#: Defaults of the environment settings ``tool_timeout_s`` and ``max_tool_result_chars``.
DEFAULT_TOOL_TIMEOUT_S = 30.0
DEFAULT_MAX_TOOL_RESULT_CHARS = 4000
#: Calls of one tool that may still be running after their time limit before further calls of it are refused.
MAX_ABANDONED_CALLS = 8

_abandoned: dict[Any, int] = {}  # tool function -> its timed-out calls still running
_abandoned_guard = threading.Lock()

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
                               dict: "object"}


class ToolError(Exception):
    """A call the tool cannot serve (bad arguments, forbidden input): its message is shown to the model."""


def _doc_parts(fn: Callable) -> tuple[str, dict[str, str]]:
    """(description, {arg: description}) from a Google-style docstring; missing parts are empty."""
    doc = inspect.getdoc(fn) or ""
    description_lines, args, current = [], {}, None
    in_args = False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.lower() in ("args:", "arguments:", "parameters:"):
            in_args = True
            continue
        if stripped.lower() in ("returns:", "raises:", "examples:", "example:"):
            in_args = False
            current = None
            continue
        if in_args:
            match = re.match(r"^(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$", stripped)
            if match:
                current = match.group(1)
                args[current] = match.group(3).strip()
            elif current and stripped:
                args[current] += " " + stripped
        elif stripped or description_lines:
            description_lines.append(stripped)
    description = " ".join(" ".join(description_lines).split())
    return description, args


def _json_type(annotation: Any, where: str) -> str:
    origin = typing.get_origin(annotation) or annotation
    if origin in _JSON_TYPES:
        return _JSON_TYPES[origin]
    raise ConfigError(f"tool {where}: unsupported argument type {annotation!r}; "
                      "use str, int, float, bool, list or dict")


class Tool:
    """A typed function the model may call; ``tool(arguments)`` validates and runs it, returning a string."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None):
        self.fn = fn
        self.name = name or fn.__name__
        self._key = getattr(fn, "__func__", fn)  # a method's calls count together across environment instances
        description, arg_docs = _doc_parts(fn)
        self.description = description or f"The {self.name} tool."
        hints = typing.get_type_hints(fn)
        self.parameters: dict[str, tuple[Any, bool]] = {}  # name -> (python type, required)
        properties: dict[str, dict[str, str]] = {}
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            if param.name not in hints:
                raise ConfigError(f"tool '{self.name}': argument '{param.name}' needs a type annotation")
            annotation = hints[param.name]
            properties[param.name] = {"type": _json_type(annotation, f"'{self.name}' argument '{param.name}'")}
            if param.name in arg_docs:
                properties[param.name]["description"] = arg_docs[param.name]
            self.parameters[param.name] = (typing.get_origin(annotation) or annotation,
                                           param.default is inspect.Parameter.empty)
        self.schema = {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {"type": "object", "properties": properties,
                               "required": [n for n, (_, req) in self.parameters.items() if req]},
            },
        }

    def check_arguments(self, arguments: Any) -> dict[str, Any]:
        """The arguments as the function takes them, or a :class:`ToolError` saying what is wrong."""
        if not isinstance(arguments, dict):
            raise ToolError(f"arguments of {self.name} must be a JSON object, got {type(arguments).__name__}")
        unknown = sorted(set(arguments) - set(self.parameters))
        if unknown:
            raise ToolError(f"{self.name} got unknown argument(s) {', '.join(unknown)}; "
                            f"it takes {', '.join(self.parameters) or 'no arguments'}")
        checked: dict[str, Any] = {}
        for name, (tp, required) in self.parameters.items():
            if name not in arguments:
                if required:
                    raise ToolError(f"{self.name} is missing the required argument '{name}'")
                continue
            value = arguments[name]
            if tp is float and isinstance(value, int) and not isinstance(value, bool):
                if abs(value) > 1e308:  # float() of a larger int raises OverflowError
                    raise ToolError(f"argument '{name}' of {self.name} is too large a number")
                value = float(value)
            elif tp is str and isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)  # {"expression": 23*47} written without quotes still means the expression
            if not isinstance(value, tp) or (tp in (int, float) and isinstance(value, bool)):
                raise ToolError(f"argument '{name}' of {self.name} must be {_JSON_TYPES.get(tp, tp)}, "
                                f"got {type(value).__name__}")
            checked[name] = value
        return checked

    def __call__(self, arguments: Any, *, timeout_s: float | None = None,
                 max_result_chars: int | None = None) -> str:
        """The result of a call as text; ``timeout_s`` bounds the call (None: no limit, run in this thread) and
        ``max_result_chars`` clips the result (None: not clipped). See the module docstring."""
        kwargs = self.check_arguments(arguments)
        if timeout_s is None:
            text = result_text(self._run(kwargs))
        else:  # the conversion to text counts against the limit too (a result's __str__ is the tool's code)
            text = self._run_with_timeout(kwargs, timeout_s)
        if max_result_chars is not None and len(text) > max_result_chars:
            text = (f"{text[:max_result_chars]}\n[result clipped: {len(text)} characters, the first "
                    f"{max_result_chars} shown]")
        return text

    def _run(self, kwargs: dict[str, Any]) -> Any:
        try:
            return self.fn(**kwargs)
        except ToolError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of a tool is an observation, not a crash
            raise ToolError(f"{self.name} failed: {type(exc).__name__}: {exc}") from None

    def _run_with_timeout(self, kwargs: dict[str, Any], timeout_s: float) -> str:
        with _abandoned_guard:
            if _abandoned.get(self._key, 0) >= MAX_ABANDONED_CALLS:
                raise ToolError(f"{self.name} is unavailable: {MAX_ABANDONED_CALLS} earlier calls went past the "
                                f"{timeout_s:g} s limit and are still running")
        outcome: dict[str, Any] = {}
        state = {"abandoned": False}
        done = threading.Event()

        def call() -> None:
            try:
                outcome["result"] = result_text(self._run(kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
                outcome["error"] = exc
            finally:
                with _abandoned_guard:
                    done.set()
                    if state["abandoned"]:
                        _abandoned[self._key] -= 1

        threading.Thread(target=call, name=f"tool-{self.name}", daemon=True).start()
        if not done.wait(timeout_s):
            with _abandoned_guard:
                if not done.is_set():
                    state["abandoned"] = True
                    _abandoned[self._key] = _abandoned.get(self._key, 0) + 1
            if state["abandoned"]:
                raise ToolError(f"{self.name} did not return within {timeout_s:g} s (the tool_timeout_s setting)")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    def __repr__(self) -> str:
        return f"Tool({self.name})"


def result_text(result: Any) -> str:
    """A tool's result as the text the model reads: a string as is, a dict or list as JSON, anything else ``str``."""
    if isinstance(result, str):
        return result
    if isinstance(result, (dict, list, tuple)):
        try:
            return json.dumps(result, ensure_ascii=False, default=str)
        except (TypeError, ValueError, RecursionError):  # e.g. non-string keys of mixed types, a circular reference
            pass
    return str(result)


# ---------------------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------------------

TOOLS: dict[str, Callable[..., Any]] = {}
#: The tools this package ships, as ``module:attribute``: imported on first use, because their modules build on this
#: one (importing them here would make an import cycle).
BUILTIN_TOOLS = {"calculator": "agentic_rl.agent.calculator_env:calculator"}


def register_tool(fn: Callable[..., Any] | None = None, *, name: str | None = None):
    """Register a tool function under its name (usable as a decorator, with or without ``name=``)."""

    def _register(f: Callable[..., Any]) -> Callable[..., Any]:
        TOOLS[name or f.__name__] = f
        return f

    return _register(fn) if fn is not None else _register


def get_tool(spec: str | Callable[..., Any] | Tool) -> Tool:
    """A :class:`Tool` from a registered name, a ``module:function`` path, a function or a Tool."""
    if isinstance(spec, Tool):
        return spec
    if callable(spec):
        return Tool(spec)
    if spec in TOOLS:
        return Tool(TOOLS[spec], name=spec)
    if spec in BUILTIN_TOOLS:
        return Tool(import_object(BUILTIN_TOOLS[spec], "tool"), name=spec)
    if ":" in spec:
        fn = import_object(spec, "tool")
        if not callable(fn):
            raise ConfigError(f"tool '{spec}' is not callable")
        return Tool(fn)
    raise ConfigError(f"unknown tool '{spec}'; registered tools: {', '.join(sorted({*TOOLS, *BUILTIN_TOOLS}))} "
                      "(or give module:function)")
