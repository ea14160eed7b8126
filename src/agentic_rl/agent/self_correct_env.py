"""Self-correction on math word problems: answer, hear whether it was right, try again.

Each assistant turn is an attempt, scored with the project's one parse-and-compare function
(:func:`agentic_rl.rewards.is_correct`) against ``task["ground_truth"]``:

* correct -> the episode ends with ``answer_reward``;
* wrong, attempts left -> a ``user`` message (``feedback``, default "That is not correct. Check your steps and try
  again.") and the step reward ``wrong_attempt_reward`` (default -0.2), so the return favours being right early:
  right at attempt 1 returns 1.0, at attempt 2 0.8, never (3 attempts) -0.6;
* wrong on the last attempt -> the episode ends with ``wrong_attempt_reward``.

``max_turns`` is the number of attempts (default 3); ``tools_enabled=False`` (evaluation "without tools") allows a
single attempt. There are no tools. Statistics per episode (:meth:`SelfCorrectEnv.episode_metrics`): ``attempts``
and ``success_at_k`` for k = 1..max_turns (correct within k attempts). Accuracy is "correct within the episode".

The SFT demonstration of a task is its reference solution; for a fixed fraction of tasks
(``retry_demonstration_fraction``, chosen by a stable hash of the question) it is a wrong first attempt — the
reference steps with a wrong final number, shown but not trained on — then the feedback, then the solution, so the
model sees what to do after feedback without learning to answer wrongly. Used as ``--environment self_correct``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentic_rl.agent.env import (DEFAULT_FEEDBACK, Environment, StepResult, attempt_metrics,
                                  default_answer_check, stable_fraction, wrong_answer)
from agentic_rl.agent.reference import ground_truth_of, solution_steps
from agentic_rl.config import check_range
from agentic_rl.data.formats import format_solution
from agentic_rl.errors import ConfigError


class SelfCorrectEnv(Environment):
    """Attempts scored by the verifier, feedback after a wrong one (registered as ``self_correct``)."""

    tools = []

    def __init__(self, *, max_turns: int = 3, answer_reward: float = 1.0, wrong_attempt_reward: float = -0.2,
                 feedback: str = DEFAULT_FEEDBACK, tools_enabled: bool = True,
                 retry_demonstration_fraction: float = 0.3,
                 answer_check: Callable[[str, str], bool] | None = None):
        given = {"max_turns": max_turns, "answer_reward": answer_reward, "wrong_attempt_reward": wrong_attempt_reward,
                 "retry_demonstration_fraction": retry_demonstration_fraction}
        check_range(given, "max_turns", 1, integer=True, required=True)  # the number of attempts
        check_range(given, ("answer_reward", "wrong_attempt_reward"), required=True)
        check_range(given, "retry_demonstration_fraction", 0, 1, required=True)
        if not str(feedback).strip():
            raise ConfigError("feedback must be a non-empty message")
        self.max_turns = max_turns
        self.answer_reward = answer_reward
        self.wrong_attempt_reward = wrong_attempt_reward
        self.feedback = feedback
        self.tools_enabled = tools_enabled
        self.retry_demonstration_fraction = retry_demonstration_fraction
        self.answer_check = answer_check or default_answer_check
        self.task: dict[str, Any] = {}
        self.attempts = 0
        self.solved_at: int | None = None

    @property
    def allowed_attempts(self) -> int:
        return self.max_turns if self.tools_enabled else 1

    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    def reset(self, task: dict[str, Any]) -> None:
        self.task = task
        self.attempts = 0
        self.solved_at = None
        return None

    def step(self, assistant_text: str) -> StepResult:
        self.attempts += 1
        correct = bool(self.answer_check(assistant_text, str(self.task.get("ground_truth", ""))))
        info = {"turn": self.attempts, "attempt": self.attempts, "correct": correct}
        if correct:
            self.solved_at = self.attempts
            return StepResult(observation=[], reward=self.answer_reward, done=True, info={**info, "kind": "answer"})
        if self.attempts >= self.allowed_attempts:
            return StepResult(observation=[], reward=self.wrong_attempt_reward, done=True,
                              info={**info, "kind": "answer"})
        return StepResult(observation=[{"role": "user", "content": self.feedback}], reward=self.wrong_attempt_reward,
                          done=False, info={**info, "kind": "retry"})

    def episode_metrics(self) -> dict[str, float]:
        """``attempts`` made and ``success_at_k`` (1.0 when correct within k attempts) for k = 1..max_turns."""
        return attempt_metrics(self.attempts, self.solved_at, self.max_turns)

    def demonstration(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        """The reference solution; for ``retry_demonstration_fraction`` of the questions (stable hash) first a wrong
        attempt (``"train": False``) and the feedback (needs two attempts and ``tools_enabled``)."""
        solution = super().demonstration(task)
        retry = (self.tools_enabled and self.max_turns >= 2
                 and stable_fraction(str(task.get("question", task.get("prompt", ""))))
                 < self.retry_demonstration_fraction)
        if not retry:
            return solution
        answer = str(task.get("answer") or "")
        truth = str(task["ground_truth"]) if "ground_truth" in task else ground_truth_of(answer)
        wrong = format_solution(solution_steps(answer), wrong_answer(truth))
        return [{"role": "assistant", "content": wrong, "train": False},
                {"role": "user", "content": self.feedback}, *solution]
