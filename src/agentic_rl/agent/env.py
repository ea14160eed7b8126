"""The environment API for multi-turn agents, a generic tool-using environment, and the environment registry.

An episode::

    env.reset(task)                      # task = a dataset row (question, ground_truth, ...)
    result = env.step(assistant_text)    # the model's turn, as text
    result.observation                   # tool messages to append (tool result or error); empty when done
    result.reward, result.done, result.info

The trajectory return is the sum of the step rewards (:func:`trajectory_return`); GRPO uses it as the reward of
the whole trajectory, so the group-relative advantage reaches every action token.

:class:`ToolEnvironment` is the environment most users want: each turn either calls tools (``<tool_call>`` blocks,
see :mod:`agentic_rl.agent.tool_format`) — the calls run and their results come back as ``tool`` messages — or
answers, which ends the episode and is scored against ``task["ground_truth"]`` with the one parse-and-compare
function (:func:`agentic_rl.rewards.is_correct`). Per-step rewards follow the seed's example: a small reward for
each useful valid tool call (it returned a result, is not a repeat, and passes :meth:`ToolEnvironment.is_useful`,
which subclasses narrow — the calculator asks for grounded arguments), the large part for a correct final answer.
Malformed JSON, an unknown tool, bad arguments, a tool error or going over ``max_tool_calls`` all become an error
observation — never an exception. ``max_turns`` bounds the episode: the last allowed turn is scored as the answer.

Registry: ``register_environment("name", factory)``; :func:`make_environment` takes a registered name or a
``module:factory`` path plus keyword arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from agentic_rl.agent.tool_format import parse_tool_calls, tool_message
from agentic_rl.agent.tools import Tool, ToolError, get_tool
from agentic_rl.config import import_object
from agentic_rl.errors import ConfigError


@dataclass
class StepResult:
    """What the environment answers to one assistant turn."""

    observation: list[dict[str, str]]  # tool messages ({"role": "tool", "name", "content"}) to append
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The observation as one string (tool results joined by newlines)."""
        return "\n".join(m["content"] for m in self.observation)


def trajectory_return(step_rewards: list[float]) -> float:
    """The return of a trajectory: the (undiscounted) sum of its step rewards."""
    return float(sum(step_rewards))


class Environment:
    """Base class: subclass and implement :meth:`reset` and :meth:`step`.

    ``tools`` are shown to the model (their schemas go into the chat template) when ``tools_enabled``.
    """

    tools: list[Tool] = []
    tools_enabled: bool = True
    max_turns: int = 1

    def reset(self, task: dict[str, Any]) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def step(self, assistant_text: str) -> StepResult:  # pragma: no cover - interface
        raise NotImplementedError

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools] if self.tools_enabled else []


def default_answer_check(text: str, ground_truth: str) -> bool:
    from agentic_rl.rewards import is_correct

    return bool(is_correct(text, ground_truth))


class ToolEnvironment(Environment):
    """Tools + a final answer checked against ``task["ground_truth"]`` (see the module docstring)."""

    def __init__(self, tools: list[Any] | None = None, *, max_turns: int = 4, max_tool_calls: int = 3,
                 tool_call_reward: float = 0.1, tool_error_reward: float = 0.0, answer_reward: float = 1.0,
                 tools_enabled: bool = True, answer_check: Callable[[str, str], bool] | None = None):
        if max_turns < 1:
            raise ConfigError(f"max_turns must be >= 1, got {max_turns}")
        if max_tool_calls < 0:
            raise ConfigError(f"max_tool_calls must be >= 0, got {max_tool_calls}")
        self.tools = [get_tool(t) for t in (tools or [])]
        self.max_turns = max_turns
        self.max_tool_calls = max_tool_calls
        self.tool_call_reward = tool_call_reward
        self.tool_error_reward = tool_error_reward
        self.answer_reward = answer_reward
        self.tools_enabled = tools_enabled
        self.answer_check = answer_check or default_answer_check
        self.task: dict[str, Any] = {}

    # -- episode -----------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> None:
        self.task = task
        self.turn = 0
        self.tool_calls = 0  # calls that ran and returned a result
        self.tool_errors = 0  # calls that produced an error observation
        self._seen_calls: set[str] = set()

    def step(self, assistant_text: str) -> StepResult:
        self.turn += 1
        content, calls = parse_tool_calls(assistant_text)
        last_turn = self.turn >= self.max_turns
        if not calls or last_turn:
            return self._answer(assistant_text, content, had_calls=bool(calls))

        reward, messages, errors, useful_calls = 0.0, [], 0, 0
        for call in calls:
            text, ok, useful = self._run_call(call)
            messages.append(tool_message(call.name, text))
            if ok:
                self.tool_calls += 1
                useful_calls += int(useful)
                reward += self.tool_call_reward if useful else 0.0
            else:
                self.tool_errors += 1
                errors += 1
                reward += self.tool_error_reward
        info = {"turn": self.turn, "kind": "tool", "calls": len(calls), "errors": errors, "useful": useful_calls}
        return StepResult(observation=messages, reward=reward, done=False, info=info)

    def _answer(self, text: str, content: str, had_calls: bool) -> StepResult:
        correct = self.answer_check(content if had_calls else text, str(self.task.get("ground_truth", "")))
        reward = self.answer_reward if correct else 0.0
        return StepResult(observation=[], reward=reward, done=True,
                          info={"turn": self.turn, "kind": "answer", "correct": bool(correct),
                                "cut_by_max_turns": had_calls})

    def _run_call(self, call) -> tuple[str, bool, bool]:
        """(observation text, ran without error, useful = first time this exact call is made)."""
        if call.error:
            return f"error: {call.error}", False, False
        if not self.tools_enabled or not self.tools:
            return "error: no tools are available in this episode; answer directly", False, False
        if self.tool_calls + self.tool_errors >= self.max_tool_calls:
            return (f"error: the limit of {self.max_tool_calls} tool calls is reached; write the final answer",
                    False, False)
        tool = next((t for t in self.tools if t.name == call.name), None)
        if tool is None:
            names = ", ".join(t.name for t in self.tools)
            return f"error: unknown tool '{call.name}'; available: {names}", False, False
        try:
            result = tool(call.arguments)
        except ToolError as exc:
            return f"error: {exc}", False, False
        key = f"{call.name}:{json.dumps(call.arguments, sort_keys=True)}"
        useful = key not in self._seen_calls and self.is_useful(call, result)
        self._seen_calls.add(key)
        return result, True, useful

    def is_useful(self, call, result: str) -> bool:
        """Whether a valid, non-repeated call earns ``tool_call_reward`` (hook for subclasses; default: always)."""
        return True


# ---------------------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------------------

ENVIRONMENTS: dict[str, Callable[..., Environment]] = {}
#: The environments this package ships, as ``module:attribute``: imported on first use, because their modules build
#: on this one (importing them here would make an import cycle).
BUILTIN_ENVIRONMENTS = {"calculator": "agentic_rl.agent.calculator_env:CalculatorEnv"}


def register_environment(name: str, factory: Callable[..., Environment] | None = None):
    """Register an environment factory (a class or function returning an :class:`Environment`); also a decorator."""

    def _register(f: Callable[..., Environment]) -> Callable[..., Environment]:
        ENVIRONMENTS[name] = f
        return f

    return _register(factory) if factory is not None else _register


def get_environment_factory(spec: str | Callable[..., Environment]) -> Callable[..., Environment]:
    if callable(spec):
        return spec
    if spec in ENVIRONMENTS:
        return ENVIRONMENTS[spec]
    if spec in BUILTIN_ENVIRONMENTS:
        return import_object(BUILTIN_ENVIRONMENTS[spec], "environment")
    if ":" in spec:
        factory = import_object(spec, "environment")
        if not callable(factory):
            raise ConfigError(f"environment '{spec}' is not callable")
        return factory
    raise ConfigError(f"unknown environment '{spec}'; registered: {', '.join(sorted({*ENVIRONMENTS, *BUILTIN_ENVIRONMENTS}))} "
                      "(or give module:factory)")


def make_environment(spec: str | Callable[..., Environment], **kwargs: Any) -> Environment:
    """A fresh environment from a registered name or ``module:factory``, built with ``kwargs``."""
    env = get_environment_factory(spec)(**kwargs)
    if not hasattr(env, "reset") or not hasattr(env, "step"):
        raise ConfigError(f"environment '{spec}' must have reset(task) and step(text) methods")
    return env
