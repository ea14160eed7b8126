"""The environment settings every stage shares: one name and one default wherever they appear.

``SFTConfig``, ``GRPOConfig`` and ``EvalConfig`` inherit :class:`EnvironmentSettings`, so ``--environment calculator
--max-turns 4`` means the same thing to ``agentic-rl sft``, ``grpo`` and ``eval`` (and to the pipeline's sections,
``tune`` and the ``rl_training`` tool, which build those configs). Without ``environment`` the stages are single-turn
and the other settings here must keep their defaults: a setting that would be silently ignored is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any

from agentic_rl.agent.tools import DEFAULT_MAX_TOOL_RESULT_CHARS, DEFAULT_TOOL_TIMEOUT_S
from agentic_rl.config import changed_from_default, check_range, setting
from agentic_rl.errors import ConfigError


@dataclass
class EnvironmentSettings:
    environment: str | None = setting(
        None, "multi-turn environment: 'calculator' (tool use), 'self_correct' (retry after feedback), 'search' "
        "(multi-hop questions answered with a search tool over a corpus), 'memory' (an event log kept in notes, a "
        "question at its end), or "
        "'module:Class' (yours: our Environment API, or TRL's environment_factory shape with reset(**row) and typed "
        "tool methods); unset: single-turn prompts and completions")
    environment_args: dict[str, Any] = setting({}, "extra keyword arguments of the environment's constructor (a YAML "
                                               "mapping, e.g. {final_turn: answer} or {wrong_attempt_reward: -0.2})")
    max_turns: int = setting(4, "environment: assistant turns per episode (self_correct: attempts); the last turn is "
                             "scored as the answer")
    max_tool_calls: int = setting(3, "environment: tool calls per episode; more get an error observation")
    tool_call_reward: float = setting(0.1, "environment: step reward for each useful valid tool call")
    tool_error_reward: float = setting(0.0, "environment: step reward for a tool call that returns an error (<= 0)")
    answer_reward: float = setting(1.0, "environment: reward of a correct final answer")
    tool_timeout_s: float = setting(DEFAULT_TOOL_TIMEOUT_S, "environment: seconds a tool call may run; a call that "
                                    "takes longer becomes an error observation")
    max_tool_result_chars: int = setting(DEFAULT_MAX_TOOL_RESULT_CHARS, "environment: a tool result longer than this "
                                         "is clipped (and says so) before the model reads it")
    tools_in_prompt: bool = setting(True, "environment: render the tools' JSON schemas into the prompt with the chat "
                                    "template (off for the embedded tiny model: its SFT teaches the call format)")
    max_turn_tokens: int = setting(48, "environment: new tokens per assistant turn")

    def check_environment_settings(self) -> None:
        """Ranges, and no environment setting changed without an environment (it would be ignored)."""
        check_range(self, ("max_turns", "max_turn_tokens"), 1)
        check_range(self, "max_tool_calls", 0)
        check_range(self, "tool_timeout_s", 0, low_open=True)
        check_range(self, "max_tool_result_chars", 1)
        check_range(self, "answer_reward", 0, low_open=True)
        check_range(self, "tool_call_reward")  # any finite number
        check_range(self, "tool_error_reward", high=0)  # a positive value would reward broken tool calls
        if self.environment is not None and not str(self.environment).strip():
            raise ConfigError("environment must be a name or module:Class; leave it unset for single-turn training")
        if self.environment is None:
            changed = changed_from_default(self, [f.name for f in fields(EnvironmentSettings)
                                                  if f.name != "environment"])
            if changed:
                raise ConfigError(f"{changed[0]} applies to multi-turn episodes only: set environment (e.g. "
                                  f"--environment calculator) or drop {changed[0]}")

    @classmethod
    def environment_defaults(cls) -> dict[str, Any]:
        """Each environment setting with its default: what a stage inherits from a pipeline that sets an
        environment (the pipeline's own value where it gives one)."""
        return {f.name: f.default_factory() if f.default_factory is not MISSING else f.default
                for f in fields(EnvironmentSettings)}

    def shared_environment_settings(self) -> dict[str, Any]:
        """Every setting of :class:`EnvironmentSettings` with its value here, as another stage's config takes them."""
        return {f.name: getattr(self, f.name) for f in fields(EnvironmentSettings)}

    def answers_are_text(self) -> bool:
        """Whether the environment's answers are names or short text (its class sets ``text_answers = True``, as
        the search environment does): the stages then load the dataset's answers as text
        (``load_task_dataset(text_answers=True)``) instead of requiring numbers."""
        if self.environment is None:
            return False
        from agentic_rl.agent.env import get_environment_factory

        return bool(getattr(get_environment_factory(self.environment), "text_answers", False))

    def environment_settings(self) -> dict[str, Any]:
        """The environment's constructor settings (``environment_factory`` passes those its class accepts)."""
        return {"max_turns": self.max_turns, "max_tool_calls": self.max_tool_calls,
                "tool_call_reward": self.tool_call_reward, "tool_error_reward": self.tool_error_reward,
                "answer_reward": self.answer_reward, "tool_timeout_s": self.tool_timeout_s,
                "max_tool_result_chars": self.max_tool_result_chars}


def build_environment(config: EnvironmentSettings) -> Callable[[], Any]:
    """A zero-argument factory of fresh environments for ``config`` (one instance is built now, so a bad
    environment or argument fails before anything is written, and so does a stage setting the environment cannot
    serve: GRPO's ``retry_groups`` with one answer allowed, where the environment says how many it allows)."""
    from agentic_rl.agent.env import environment_factory

    factory = environment_factory(config.environment, config.environment_settings(), dict(config.environment_args))
    ignored = changed_from_default(config, [name for name in config.environment_settings()
                                            if name not in factory.settings_used])
    if ignored:
        takes = ", ".join(sorted(set(config.environment_settings()) & factory.settings_used)) or "none of them"
        raise ConfigError(f"{ignored[0]} does not apply to environment '{config.environment}' (of the common "
                          f"settings it takes {takes}): drop {ignored[0]}")
    attempts = getattr(factory.example, "allowed_attempts", None)
    if getattr(config, "retry_groups", False) and attempts is not None and attempts < 2:
        raise ConfigError(f"retry_groups continues episodes after a wrong answer, but environment "
                          f"{config.environment} allows {attempts} answer per episode: allow 2 or more "
                          "(answer_attempts in environment_args; max_turns for self_correct)")
    return factory


def environment_system_prompt(system_prompt: str | None, env: Any = None) -> str | None:
    """The system prompt of a stage's tasks: the config's when set, else the environment's own
    (``env.system_prompt``; no environment: None), else the project's standard instruction."""
    from agentic_rl.data.formats import resolve_system_prompt

    if system_prompt is not None:
        return resolve_system_prompt(system_prompt)
    own = getattr(env, "system_prompt", None)
    return own if own is not None else resolve_system_prompt(None)
