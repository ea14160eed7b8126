"""Bring-your-own environment in TRL's shape, run with this project's masking, per-step rewards and statistics.

TRL 1.16's ``GRPOTrainer(environment_factory=...)`` takes a class like::

    class Shop:
        def reset(self, **row) -> str | None:        # row = the dataset row; a string is appended to the prompt
            self.stock = {"apple": 3}

        def buy(self, item: str, count: int) -> str:  # public methods with typed arguments and docstrings = tools
            '''Buy items from the shop.

            Args:
                item: what to buy.
                count: how many.
            '''
            ...

        def get_reward(self) -> float:               # optional: the environment scores the episode
            return 1.0 if ... else 0.0

:class:`TRLEnvironment` wraps one such object as a :class:`~agentic_rl.agent.env.ToolEnvironment`: its tools are the
public methods (not ``reset``/``get_reward``, no ``_private`` ones), schemas derived by
:class:`agentic_rl.agent.tools.Tool` (a method without a docstring or argument types is a ConfigError naming it);
``reset(task)`` calls ``obj.reset(**task)`` and returns its string as the first observation; any exception raised
by a tool method becomes an error observation (clipped), never a crash. The answer turn (the first turn without a
call, or the last allowed turn) earns ``get_reward()`` when the class defines it, else ``answer_reward`` if the
answer is correct against ``task["ground_truth"]``; each useful tool call earns ``tool_call_reward`` as in
:class:`ToolEnvironment`. :func:`agentic_rl.agent.env.environment_factory` wraps such classes automatically
(``--environment mypkg.envs:Shop``).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable
from typing import Any

from agentic_rl.agent.env import StepResult, ToolEnvironment
from agentic_rl.agent.tools import DEFAULT_MAX_TOOL_RESULT_CHARS, DEFAULT_TOOL_TIMEOUT_S, Tool
from agentic_rl.errors import ConfigError, RewardError

#: Methods of a TRL environment that are not tools (TRL's own exclusions).
NOT_TOOLS = ("reset", "get_reward")


def trl_tools(obj: Any) -> list[Tool]:
    """The tools of a TRL-shaped environment object: its public methods, each with a schema (see the module)."""
    cls = type(obj)
    tools = []
    # Listed on the class, as TRL does: getmembers on the instance would evaluate properties.
    for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction):
        if name in NOT_TOOLS or name.startswith("_"):
            continue
        method = getattr(obj, name)
        if not inspect.getdoc(method):
            raise ConfigError(f"{cls.__name__}.{name}: a tool method needs a docstring (it is the tool's "
                              "description the model reads); make it private (_name) if it is not a tool")
        try:
            tools.append(Tool(method, name=name))
        except ConfigError as exc:
            raise ConfigError(f"{cls.__name__}.{name}: {exc}") from None
    return tools


class TRLEnvironment(ToolEnvironment):
    """A TRL-shaped environment object (``reset(**row)``, tool methods, optional ``get_reward()``) as an
    :class:`~agentic_rl.agent.env.Environment` (see the module docstring)."""

    def __init__(self, obj: Any, *, max_turns: int = 4, max_tool_calls: int = 3, tool_call_reward: float = 0.1,
                 tool_error_reward: float = 0.0, answer_reward: float = 1.0, tools_enabled: bool = True,
                 answer_check: Callable[[str, str], bool] | None = None,
                 tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
                 max_tool_result_chars: int = DEFAULT_MAX_TOOL_RESULT_CHARS):
        cls_name = type(obj).__name__
        if not callable(getattr(obj, "reset", None)):
            raise ConfigError(f"environment {cls_name} has no reset(**row) method")
        get_reward = getattr(obj, "get_reward", None)
        if get_reward is not None and inspect.iscoroutinefunction(get_reward):
            raise ConfigError(f"{cls_name}.get_reward is async; write it as a plain method returning a float")
        super().__init__(trl_tools(obj), max_turns=max_turns, max_tool_calls=max_tool_calls,
                         tool_call_reward=tool_call_reward, tool_error_reward=tool_error_reward,
                         answer_reward=answer_reward, tools_enabled=tools_enabled, answer_check=answer_check,
                         tool_timeout_s=tool_timeout_s, max_tool_result_chars=max_tool_result_chars)
        self.obj = obj
        self._get_reward = get_reward if callable(get_reward) else None
        prompt = getattr(obj, "system_prompt", None)
        self.system_prompt = prompt if isinstance(prompt, str) else None

    def reset(self, task: dict[str, Any]) -> str | None:
        super().reset(task)
        cls_name = type(self.obj).__name__
        try:
            inspect.signature(self.obj.reset).bind(**task)
        except TypeError:
            raise ConfigError(f"{cls_name}.reset() does not accept the task columns ({', '.join(task)}); "
                              "give it **kwargs, as TRL's contract says (reset(self, **row))") from None
        except ValueError:  # a signature that cannot be inspected: just call it
            pass
        observation = self.obj.reset(**task)
        if observation is not None and not isinstance(observation, str):
            raise ConfigError(f"{cls_name}.reset() must return a string or None, got {type(observation).__name__}")
        return observation

    def _answer(self, text: str, content: str, had_calls: bool) -> StepResult:
        result = super()._answer(text, content, had_calls)
        if self._get_reward is None:
            return result
        cls_name = type(self.obj).__name__
        try:
            reward = self._get_reward()
        except Exception as exc:  # noqa: BLE001 - the user's scoring code failed: one line naming it
            raise RewardError(f"{cls_name}.get_reward() raised {type(exc).__name__}: {exc}") from None
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
            raise RewardError(f"{cls_name}.get_reward() must return a finite number, got {reward!r}")
        result.reward = float(reward)
        if "ground_truth" not in self.task:  # no reference answer: a positive reward counts as a success
            result.info["correct"] = result.reward > 0
        return result
