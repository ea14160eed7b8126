"""The environment API for multi-turn agents, a generic tool-using environment, and the environment registry.

An episode::

    first = env.reset(task)              # task = a dataset row (question, ground_truth, ...); may return a string
                                         # that is appended to the prompt's last user message (as TRL does)
    result = env.step(assistant_text)    # the model's turn, as text
    result.observation                   # messages to append: ``tool`` results/errors or ``user`` feedback
    result.reward, result.done, result.info
    env.episode_metrics()                # per-episode numbers once done ({"attempts": 2.0, ...}), averaged in stats

``env.system_prompt`` is the system prompt of the environment's tasks (None: the project's standard one) and
``env.demonstration(task)`` the messages of one correct episode, for SFT (an assistant message with ``"train": False``
is shown but not trained on).

The trajectory return is the sum of the step rewards (:func:`trajectory_return`); GRPO uses it as the reward of
the whole trajectory, so the group-relative advantage reaches every action token (with ``credit_assignment: turn``
each turn gets the advantage of its own return-to-go instead: :mod:`agentic_rl.train.credit`).

:class:`ToolEnvironment` is the environment most users want: each turn either calls tools (``<tool_call>`` blocks,
see :mod:`agentic_rl.agent.tool_format`) — the calls run and their results come back as ``tool`` messages — or
answers, which ends the episode and is scored against ``task["ground_truth"]`` with the one parse-and-compare
function (:func:`agentic_rl.rewards.is_correct`). Per-step rewards follow the Hello-Agents book's example: a small
reward for each useful valid tool call (it returned a result, is not a repeat, and passes
:meth:`ToolEnvironment.is_useful`, which subclasses narrow — the calculator asks for grounded arguments), the large
part for a correct final answer.
Malformed JSON, an unknown tool, bad arguments, a tool error or going over ``max_tool_calls`` all become an error
observation — never an exception. ``max_turns`` bounds the episode: the last allowed turn is scored as the answer.
With ``answer_attempts`` above 1 a wrong answer is not the end: the model hears ``feedback`` (a ``user`` message),
the step costs ``wrong_attempt_reward``, and it may search, calculate or answer again, until it is right, its
attempts are spent or ``max_turns`` is reached (self-correction on any tool task; each episode reports ``attempts``
and ``success_at_k``, and accuracy is "right within the episode"). Evaluation without tools allows one attempt.
A tool call that runs past ``tool_timeout_s`` seconds becomes an error observation, and a result longer than
``max_tool_result_chars`` characters is clipped (see :mod:`agentic_rl.agent.tools`).

Registry: ``register_environment("name", factory)``; :func:`make_environment` takes a registered name or a
``module:factory`` path plus keyword arguments. :func:`environment_factory` is what the stages use: it resolves the
name, passes the common settings (:data:`ENVIRONMENT_SETTINGS`) the factory accepts and the environment's own
arguments, builds one instance to surface errors before any side effect, and wraps a class in TRL's
``environment_factory`` shape (``reset(**row)`` + typed tool methods) in
:class:`agentic_rl.agent.trl_env.TRLEnvironment`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from agentic_rl.agent.reference import ground_truth_of, solution_steps
from agentic_rl.agent.tool_format import clip, parse_tool_calls, tool_message
from agentic_rl.agent.tools import DEFAULT_MAX_TOOL_RESULT_CHARS, DEFAULT_TOOL_TIMEOUT_S, Tool, ToolError, get_tool
from agentic_rl.config import check_range, import_object
from agentic_rl.data.formats import FINAL_ANSWER_PREFIX, format_solution
from agentic_rl.errors import ConfigError, DataError


@dataclass
class StepResult:
    """What the environment answers to one assistant turn."""

    observation: list[dict[str, str]]  # messages to append: {"role": "tool", "name", "content"} or {"role": "user"...}
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
    ``system_prompt`` is the system message of this environment's task prompts (None: the project's standard
    :data:`agentic_rl.data.formats.SYSTEM_PROMPT`). ``context_window``: the number of latest turns (an assistant turn
    with the observation that answers it) the model sees when it writes the next turn; older turns leave its context
    (None: the whole episode stays; see :mod:`agentic_rl.agent.rollout`).
    """

    tools: list[Tool] = []
    tools_enabled: bool = True
    max_turns: int = 1
    system_prompt: str | None = None
    context_window: int | None = None

    def reset(self, task: dict[str, Any]) -> str | None:  # pragma: no cover - interface
        """Start an episode on ``task``; a returned string is appended to the prompt's last user message."""
        raise NotImplementedError

    def step(self, assistant_text: str) -> StepResult:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def offered_tools(self) -> list[Any]:
        """The tools this episode offers: ``tools``, or none when ``tools_enabled`` is off."""
        return self.tools if self.tools_enabled else []

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.offered_tools]

    def episode_metrics(self) -> dict[str, float]:
        """Numbers describing the finished episode (read once it is done), averaged over episodes by
        :func:`agentic_rl.agent.rollout.episode_stats` under these key names. Default: none."""
        return {}

    def demonstrates(self, task: dict[str, Any]) -> bool:
        """Whether the demonstrator shows an episode of ``task``: SFT (and GRPO's SFT anchor) train on the tasks it
        demonstrates and leave the others to RL. Default: every task."""
        return True

    def demonstration(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        """The assistant/tool/user messages of one correct episode on ``task``, for SFT (after ``task["prompt"]``).

        An assistant message with ``"train": False`` is part of the context but not trained on (like tool and user
        messages). Default: one assistant turn with the reference solution (the steps of ``task["answer"]``
        without calculator annotations, then ``Final Answer: <ground_truth>``).
        """
        if not task.get("answer") and "ground_truth" not in task:
            raise DataError(f"{type(self).__name__}.demonstration needs the task's 'answer' (reference solution) "
                            "or 'ground_truth'")
        answer = str(task.get("answer") or "")
        truth = str(task["ground_truth"]) if "ground_truth" in task else ground_truth_of(answer)
        return [{"role": "assistant", "content": format_solution(solution_steps(answer), truth)}]


def demonstrated(env: Any, task: dict[str, Any]) -> bool:
    """``env.demonstrates(task)``, or True for an environment without that method (one that only has ``reset`` and
    ``step``, loaded by path)."""
    method = getattr(env, "demonstrates", None)
    return True if method is None else bool(method(task))


DEFAULT_FEEDBACK = "That is not correct. Check your steps and try again."


def stable_fraction(text: str) -> float:
    """A number in [0, 1) fixed by ``text`` (SHA-256, the same in every process, unlike ``hash()``)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") / 2 ** 64


def wrong_answer(ground_truth: str) -> str:
    """A final answer that is not ``ground_truth``: the number plus one (or the text with a 1 appended)."""
    try:
        value = Decimal(str(ground_truth).replace(",", ""))
    except InvalidOperation:
        return f"{ground_truth}1"
    return format(value + 1, "f")


def attempt_metrics(attempts: int, solved_at: int | None, max_attempts: int) -> dict[str, float]:
    """``attempts`` made and ``success_at_k`` (1.0 when right within k attempts) for k = 1..max_attempts."""
    metrics = {"attempts": float(attempts)}
    for k in range(1, max_attempts + 1):
        metrics[f"success_at_{k}"] = float(solved_at is not None and solved_at <= k)
    return metrics


def default_answer_check(text: str, ground_truth: str) -> bool:
    from agentic_rl.rewards import is_correct

    return bool(is_correct(text, ground_truth))


def call_refusal(call, tools: list[Any], *, calls_made: int, max_calls: int,
                 tools_off: str = "answer directly") -> str | None:
    """Why a parsed tool call is not run, as the observation's text after ``"error: "``, or None to run it.

    Checked in this order: a malformed call (its parse error), no tools in this episode (``tools`` empty; the
    message ends with ``tools_off``, what to do instead), ``max_calls`` reached by ``calls_made``, a tool name that
    is not in ``tools``. Shared by the environments with tools, so the model reads one wording everywhere."""
    if call.error:
        return clip(call.error)
    if not tools:
        return f"no tools are available in this episode; {tools_off}"
    if calls_made >= max_calls:
        return f"the limit of {max_calls} tool calls is reached; write the final answer"
    if not any(t.name == call.name for t in tools):
        return f"unknown tool '{clip(call.name, 60)}'; available: {', '.join(t.name for t in tools)}"
    return None


class ToolEnvironment(Environment):
    """Tools + a final answer checked against ``task["ground_truth"]`` (see the module docstring)."""

    def __init__(self, tools: list[Any] | None = None, *, max_turns: int = 4, max_tool_calls: int = 3,
                 tool_call_reward: float = 0.1, tool_error_reward: float = 0.0, answer_reward: float = 1.0,
                 tools_enabled: bool = True, answer_check: Callable[[str, str], bool] | None = None,
                 tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
                 max_tool_result_chars: int = DEFAULT_MAX_TOOL_RESULT_CHARS, answer_attempts: int = 1,
                 wrong_attempt_reward: float = -0.2, feedback: str = DEFAULT_FEEDBACK,
                 retry_demonstration_fraction: float = 0.0):
        given = {"max_turns": max_turns, "max_tool_calls": max_tool_calls, "tool_timeout_s": tool_timeout_s,
                 "max_tool_result_chars": max_tool_result_chars, "tool_call_reward": tool_call_reward,
                 "tool_error_reward": tool_error_reward, "answer_reward": answer_reward,
                 "answer_attempts": answer_attempts, "wrong_attempt_reward": wrong_attempt_reward,
                 "retry_demonstration_fraction": retry_demonstration_fraction}
        check_range(given, ("max_turns", "max_tool_result_chars", "answer_attempts"), 1, integer=True, required=True)
        check_range(given, "max_tool_calls", 0, integer=True, required=True)
        check_range(given, "tool_timeout_s", 0, low_open=True, required=True)  # seconds
        check_range(given, ("tool_call_reward", "tool_error_reward", "answer_reward", "wrong_attempt_reward"),
                    required=True)
        check_range(given, "retry_demonstration_fraction", 0, 1, required=True)
        if not str(feedback).strip():
            raise ConfigError("feedback must be a non-empty message")
        if retry_demonstration_fraction and answer_attempts < 2:
            raise ConfigError(f"retry_demonstration_fraction {retry_demonstration_fraction} shows retries after a "
                              "wrong answer, which needs answer_attempts of at least 2")
        self.answer_attempts, self.wrong_attempt_reward = answer_attempts, wrong_attempt_reward
        self.feedback, self.retry_demonstration_fraction = str(feedback), retry_demonstration_fraction
        self.tool_timeout_s = float(tool_timeout_s)
        self.max_tool_result_chars = max_tool_result_chars
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

    def reset(self, task: dict[str, Any]) -> str | None:
        self.task = task
        self.turn = 0
        self.tool_calls = 0  # calls that ran and returned a result
        self.tool_errors = 0  # calls that produced an error observation
        self._seen_calls: set[str] = set()
        self.attempts = 0
        self.solved_at: int | None = None
        return None

    @property
    def allowed_attempts(self) -> int:
        """``answer_attempts``, or one when tools are off (evaluation of the model alone)."""
        return self.answer_attempts if self.tools_enabled else 1

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
        correct = bool(self.answer_check(content if had_calls else text, str(self.task.get("ground_truth", ""))))
        self.attempts += 1
        info = {"turn": self.turn, "kind": "answer", "correct": correct, "cut_by_max_turns": had_calls,
                "attempt": self.attempts}
        if correct:
            self.solved_at = self.attempts
        elif self.attempts < self.allowed_attempts and self.turn < self.max_turns:
            return StepResult(observation=[{"role": "user", "content": self.feedback}],
                              reward=self.wrong_attempt_reward, done=False, info={**info, "kind": "retry"})
        return StepResult(observation=[], reward=self.answer_reward if correct else 0.0, done=True, info=info)

    def _run_call(self, call) -> tuple[str, bool, bool]:
        """(observation text, ran without error, useful = first time this exact call is made)."""
        refusal = call_refusal(call, self.offered_tools,
                               calls_made=self.tool_calls + self.tool_errors, max_calls=self.max_tool_calls)
        if refusal is not None:
            return f"error: {refusal}", False, False
        tool = next(t for t in self.tools if t.name == call.name)
        try:
            result = tool(call.arguments, timeout_s=self.tool_timeout_s,
                          max_result_chars=self.max_tool_result_chars)
        except ToolError as exc:  # its message may quote the model's arguments: clipped
            return f"error: {clip(exc)}", False, False
        key = f"{call.name}:{json.dumps(call.arguments, sort_keys=True)}"
        useful = key not in self._seen_calls and self.is_useful(call, result)
        self._seen_calls.add(key)
        return result, True, useful

    def is_useful(self, call, result: str) -> bool:
        """Whether a valid, non-repeated call earns ``tool_call_reward`` (hook for subclasses; default: always)."""
        return True

    def episode_metrics(self) -> dict[str, float]:
        """With ``answer_attempts`` above 1: ``attempts`` (answers given) and ``success_at_k`` (1.0 when right
        within k answers) for k = 1..answer_attempts; otherwise none."""
        if self.answer_attempts < 2:
            return {}
        return attempt_metrics(self.attempts, self.solved_at, self.answer_attempts)

    # -- demonstrations ------------------------------------------------------------------------------------------

    def with_retry(self, task: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` (a demonstration ending in its answer), for ``retry_demonstration_fraction`` of the
        questions (a stable hash of the question, independent of other shares a subclass draws from it) with a
        wrong answer first — shown, not trained on (``"train": False``) — and the feedback before the right one;
        unchanged otherwise or without tools."""
        question = str(task.get("question", task.get("prompt", "")))
        if (not self.tools_enabled or self.allowed_attempts < 2
                or stable_fraction(f"retry:{question}") >= self.retry_demonstration_fraction):
            return messages
        wrong = self.wrong_attempt(task, messages)
        return [*messages[:-1], {"role": "assistant", "content": wrong, "train": False},
                {"role": "user", "content": self.feedback}, messages[-1]]

    def wrong_attempt(self, task: dict[str, Any], messages: list[dict[str, Any]]) -> str:
        """The wrong answer of a retry demonstration (hook for subclasses): the demonstration's answer turn with
        its final answer replaced by :func:`wrong_answer` of the ground truth."""
        answer = messages[-1]["content"]
        head, _, _ = answer.rpartition(FINAL_ANSWER_PREFIX)
        truth = str(task["ground_truth"]) if "ground_truth" in task else ground_truth_of(str(task.get("answer", "")))
        return f"{head}{FINAL_ANSWER_PREFIX} {wrong_answer(truth)}"


# ---------------------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------------------

ENVIRONMENTS: dict[str, Callable[..., Environment]] = {}
#: The environments this package ships, as ``module:attribute``: imported on first use, because their modules build
#: on this one (importing them here would make an import cycle).
BUILTIN_ENVIRONMENTS = {"calculator": "agentic_rl.agent.calculator_env:CalculatorEnv",
                        "self_correct": "agentic_rl.agent.self_correct_env:SelfCorrectEnv",
                        "search": "agentic_rl.agent.search_env:SearchEnv",
                        "memory": "agentic_rl.agent.memory_env:MemoryEnv"}
#: The adapter of environments in TRL's shape (imported on first use for the same reason).
TRL_ADAPTER = "agentic_rl.agent.trl_env:TRLEnvironment"


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
    known = ", ".join(sorted({*ENVIRONMENTS, *BUILTIN_ENVIRONMENTS}))
    raise ConfigError(f"unknown environment '{spec}'; registered: {known} "
                      "(or give module:factory)")


def make_environment(spec: str | Callable[..., Environment], **kwargs: Any) -> Environment:
    """A fresh environment from a registered name or ``module:factory``, built with ``kwargs``."""
    env = get_environment_factory(spec)(**kwargs)
    if not hasattr(env, "reset") or not hasattr(env, "step"):
        raise ConfigError(f"environment '{spec}' must have reset(task) and step(text) methods")
    return env


# ---------------------------------------------------------------------------------------------------------------
# The stages' entry point: one settings vocabulary for every environment
# ---------------------------------------------------------------------------------------------------------------

#: Settings every stage offers for any environment, with the same names everywhere. Each goes to an environment
#: only if its factory takes it (see :func:`environment_settings_used`).
ENVIRONMENT_SETTINGS = ("max_turns", "max_tool_calls", "tool_call_reward", "tool_error_reward", "answer_reward",
                        "tool_timeout_s", "max_tool_result_chars")
#: Also accepted in ``settings`` (passed on the same terms): whether the episode may call tools (evaluation without
#: tools builds the environment with ``tools_enabled=False``).
EXTRA_SETTINGS = ("tools_enabled",)


def _spec_name(spec: Any) -> str:
    return spec if isinstance(spec, str) else getattr(spec, "__qualname__", None) or repr(spec)


def is_trl_environment_class(obj: Any) -> bool:
    """Whether ``obj`` (a class or an instance) has TRL's environment shape: a ``reset`` method and no ``step``."""
    cls = obj if inspect.isclass(obj) else type(obj)
    return callable(getattr(cls, "reset", None)) and not callable(getattr(cls, "step", None))


def _accepted_keywords(factory: Callable[..., Any]) -> set[str] | None:
    """The keyword arguments ``factory`` takes, or None when it takes any (``**kwargs``) or cannot be inspected."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _settings_taken(accepted: set[str] | None) -> set[str]:
    every = set(ENVIRONMENT_SETTINGS) | set(EXTRA_SETTINGS)
    return every if accepted is None else every & accepted


def environment_settings_used(spec: str | Callable[..., Any]) -> set[str]:
    """The common settings (:data:`ENVIRONMENT_SETTINGS`, and ``tools_enabled``) that the environment ``spec``
    takes: the stages warn that the others are ignored. A class in TRL's shape takes them all (its adapter applies
    them)."""
    factory = get_environment_factory(spec)
    if inspect.isclass(factory) and is_trl_environment_class(factory):
        return _settings_taken(None)
    return _settings_taken(_accepted_keywords(factory))


class EnvironmentFactory:
    """A zero-argument factory of fresh environments (one per episode), made by :func:`environment_factory`.

    ``example`` is the instance built eagerly to surface errors (read ``system_prompt``, ``tool_schemas()`` from it);
    ``settings_used`` the common settings the environment takes (as :func:`environment_settings_used`).
    """

    def __init__(self, name: str, build: Callable[[], Environment], example: Environment, settings_used: set[str]):
        self.name = name
        self._build = build
        self.example = example
        self.settings_used = settings_used

    def __call__(self) -> Environment:
        return self._build()

    def __repr__(self) -> str:
        return f"EnvironmentFactory({self.name})"


def environment_factory(spec: str | Callable[..., Any], settings: dict[str, Any],
                        environment_args: dict[str, Any] | None = None) -> EnvironmentFactory:
    """A zero-argument factory of the environment ``spec`` (registered name, builtin, ``module:attr`` or callable).

    ``settings`` holds common settings (:data:`ENVIRONMENT_SETTINGS`, plus ``tools_enabled``); each is passed only
    if the factory accepts it (None values are left to the environment's default). ``environment_args`` are the
    environment's own keyword arguments; one the factory does not take is a :class:`ConfigError` naming it. A class
    in TRL's shape (``reset(**row)`` and typed tool methods, no ``step``) gets ``environment_args``; the common
    settings go to its :class:`~agentic_rl.agent.trl_env.TRLEnvironment` adapter. One instance is built here, so a
    wrong argument or a tool without types fails now, before any side effect.
    """
    name = _spec_name(spec)
    environment_args = dict(environment_args or {})
    known = set(ENVIRONMENT_SETTINGS) | set(EXTRA_SETTINGS)
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError(f"unknown environment setting '{unknown[0]}'; the common settings are "
                          f"{', '.join(ENVIRONMENT_SETTINGS + EXTRA_SETTINGS)}")
    shadowing = sorted(set(environment_args) & known)
    if shadowing:
        raise ConfigError(f"environment_args sets '{shadowing[0]}', a common environment setting; set it as the "
                          f"stage's {shadowing[0]} instead")
    factory = get_environment_factory(spec)
    common = {k: v for k, v in settings.items() if v is not None}
    trl_class = inspect.isclass(factory) and is_trl_environment_class(factory)
    accepted = _accepted_keywords(factory)
    if accepted is not None:
        for key in environment_args:
            if key not in accepted:
                takes = ", ".join(sorted(accepted - known)) or "no arguments of its own"
                raise ConfigError(f"environment '{name}' does not accept the argument '{key}' (environment_args); "
                                  f"it takes {takes}")
    passed = {} if trl_class else {k: v for k, v in common.items() if accepted is None or k in accepted}

    def build_raw() -> Any:
        return factory(**passed, **environment_args)

    try:
        first = build_raw()
    except ConfigError:
        raise
    except Exception as exc:  # a user's constructor: its failure is a one-line error, not a traceback
        raise ConfigError(f"environment '{name}' could not be built: {type(exc).__name__}: {exc}") from None
    if is_trl_environment_class(first):
        adapter = import_object(TRL_ADAPTER, "environment adapter")
        adapter_settings = common  # the adapter applies the turn limits and rewards
        example = adapter(first, **adapter_settings)

        def build() -> Environment:
            return adapter(build_raw(), **adapter_settings)

        used = _settings_taken(None)
    else:
        if not callable(getattr(first, "reset", None)) or not callable(getattr(first, "step", None)):
            raise ConfigError(f"environment '{name}' must build an object with reset(task) and step(text) methods "
                              "(or, in TRL's shape, reset(**row) and tool methods); got "
                              f"{type(first).__name__}")
        example = first
        build = build_raw
        used = _settings_taken(accepted)
    return EnvironmentFactory(name, build, example, used)
