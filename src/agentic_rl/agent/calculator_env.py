"""The calculator environment for math word problems.

One tool, :func:`calculator`, backed by the safe AST-whitelist evaluator
(:func:`agentic_rl.rewards.calculator.safe_eval`, never ``eval``). The model calls it in its chat format::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "23*47"}}
    </tool_call>

and reads the result in the next ``tool`` message (``1081``). A forbidden or malformed expression returns
``error: ...`` as the observation. The episode ends at the first turn without a tool call (the answer, scored
against ``ground_truth``) or at ``max_turns``. Rewards: ``tool_call_reward`` per useful valid call, ``answer_reward``
for a correct answer (see :class:`agentic_rl.agent.env.ToolEnvironment`). A call is *useful* here when it is grounded:
every number in the expression appears in the question or in an earlier tool result (``39*83`` for "39 tickets for
$83 each"); an ungrounded call still runs but earns nothing, so the tool bonus cannot be farmed with arbitrary
arithmetic (``grounded_calls_only=False`` rewards any new valid call). A grounded call can still be a wrong step (a
number the answer does not use, read as one), so ``reference_calls_only=True`` rewards only a call whose result is one
of the reference solution's step results not yet rewarded (the task's ``<<a*b=c>>`` annotations in ``answer`` or
``full_answer``); a task without annotations falls back to the grounded rule.

Its tasks use :data:`agentic_rl.agent.tasks.AGENT_SYSTEM_PROMPT`; its demonstration replays the row's ``<<a*b=c>>``
annotations as calls (:func:`agentic_rl.agent.tasks.demonstration`), the last turn written as ``final_turn`` says.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from agentic_rl.agent.env import DEFAULT_FEEDBACK, ToolEnvironment
from agentic_rl.agent.tasks import AGENT_SYSTEM_PROMPT, FINAL_TURNS, demonstration
from agentic_rl.agent.tools import DEFAULT_MAX_TOOL_RESULT_CHARS, DEFAULT_TOOL_TIMEOUT_S, ToolError
from agentic_rl.data.formats import CALC_STEP
from agentic_rl.errors import ConfigError
from agentic_rl.rewards import parse_number

_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _numbers(text: str) -> set[Decimal]:
    out = set()
    for token in _NUMBER.findall(text.replace(",", "")):
        try:
            out.add(Decimal(token).normalize())
        except InvalidOperation:
            continue
    return out


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as "23*47" or "(120 - 15) / 3".

    Args:
        expression: numbers, + - * / parentheses (no names, no function calls).
    """
    from agentic_rl.rewards.calculator import CalculatorError, format_number, safe_eval

    try:
        return format_number(safe_eval(expression))
    except CalculatorError as exc:  # forbidden syntax, division by zero, too large: all become observations
        raise ToolError(str(exc)) from None


class CalculatorEnv(ToolEnvironment):
    """:class:`ToolEnvironment` with the calculator as its one tool (registered as ``calculator``).

    ``final_turn`` shapes the demonstration's answer turn after the calls: ``"steps"`` (the solution steps and the
    final-answer line) or ``"answer"`` (only ``Final Answer: N``, copying the last tool result).
    """

    system_prompt = AGENT_SYSTEM_PROMPT

    def __init__(self, *, max_turns: int = 4, max_tool_calls: int = 3, tool_call_reward: float = 0.1,
                 tool_error_reward: float = 0.0, answer_reward: float = 1.0, tools_enabled: bool = True,
                 answer_check=None, grounded_calls_only: bool = True, reference_calls_only: bool = False,
                 final_turn: str = "steps",
                 tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
                 max_tool_result_chars: int = DEFAULT_MAX_TOOL_RESULT_CHARS, answer_attempts: int = 1,
                 wrong_attempt_reward: float = -0.2, feedback: str = DEFAULT_FEEDBACK,
                 retry_demonstration_fraction: float = 0.0):
        for name, value in (("grounded_calls_only", grounded_calls_only),
                            ("reference_calls_only", reference_calls_only)):
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be true or false, got {value!r}")
        if final_turn not in FINAL_TURNS:
            raise ConfigError(f"final_turn must be one of {', '.join(FINAL_TURNS)}, got {final_turn!r}")
        self.final_turn = final_turn
        super().__init__([calculator], max_turns=max_turns, max_tool_calls=max_tool_calls,
                         tool_call_reward=tool_call_reward, tool_error_reward=tool_error_reward,
                         answer_reward=answer_reward, tools_enabled=tools_enabled, answer_check=answer_check,
                         tool_timeout_s=tool_timeout_s, max_tool_result_chars=max_tool_result_chars,
                         answer_attempts=answer_attempts, wrong_attempt_reward=wrong_attempt_reward, feedback=feedback,
                         retry_demonstration_fraction=retry_demonstration_fraction)
        self.grounded_calls_only, self.reference_calls_only = grounded_calls_only, reference_calls_only
        self._reference: list[float] = []  # the step results of the task's solution not yet rewarded
        self._has_reference = False

    def reset(self, task):
        super().reset(task)
        self._known = _numbers(str(task.get("question", "")))
        solution = str(task.get("answer") or task.get("full_answer") or "")
        self._reference = [v for _, text in CALC_STEP.findall(solution) if (v := parse_number(text)) is not None]
        self._has_reference = bool(self._reference)
        return None

    def demonstration(self, task):
        """The row's annotations as calculator calls, then the answer turn (no calls when tools are disabled); a
        retry demonstration (``retry_demonstration_fraction``) answers one more than the truth first."""
        return self.with_retry(task, demonstration(task, tools=self.tools_enabled, final_turn=self.final_turn))

    def is_useful(self, call, result: str) -> bool:
        grounded = _numbers(str(call.arguments.get("expression", ""))) <= self._known
        self._known |= _numbers(result)
        if self.reference_calls_only and self._has_reference:
            value = parse_number(result)
            if value in self._reference:
                self._reference.remove(value)  # each reference step rewards one call
                return True
            return False
        return grounded or not self.grounded_calls_only
