"""Rewards and answer verification: plain TRL-style reward callables, one shared parse-and-compare, a safe calculator.

* :mod:`~agentic_rl.rewards.extraction` — :func:`extract_answer`, :func:`is_correct` (used by training rewards and
  evaluation alike), :func:`parse_number`, :func:`answers_match`, :func:`completion_text`;
* :mod:`~agentic_rl.rewards.calculator` — :func:`safe_eval` (AST whitelist), :func:`check_equations`,
  :func:`count_steps`;
* :mod:`~agentic_rl.rewards.functions` — ``AccuracyReward``, ``LengthPenaltyReward``, ``StepReward``,
  ``FormatReward``, ``ProcessReward``, ``CombinedReward`` and the default ``accuracy_reward``;
* :mod:`~agentic_rl.rewards.registry` — ``REWARDS``, :func:`get_reward`, :func:`load_user_reward`,
  :func:`build_rewards` (specs such as ``"format:0.2"``, ``"length(alpha=0.01):0.5"``, ``"my.mod:fn:0.3"``);
* ``agentic-rl reward check FILE.jsonl`` — a per-sample breakdown of every reward component.
"""

from agentic_rl.rewards.calculator import (CalculatorError, EquationCheck, check_equations, count_steps, format_number,
                                           safe_eval)
from agentic_rl.rewards.extraction import (answers_match, completion_text, extract_answer, find_final_answers,
                                           is_correct, math_verify_match, parse_number)
from agentic_rl.rewards.functions import (AccuracyReward, CombinedReward, FormatReward, LengthPenaltyReward,
                                          ProcessReward, StepReward, accuracy_reward)
from agentic_rl.rewards.registry import REWARDS, build_rewards, get_reward, load_user_reward, parse_reward_spec

__all__ = [
    "completion_text", "extract_answer", "parse_number", "answers_match", "is_correct", "find_final_answers",
    "math_verify_match",
    "CalculatorError", "safe_eval", "format_number", "EquationCheck", "check_equations", "count_steps",
    "AccuracyReward", "LengthPenaltyReward", "StepReward", "FormatReward", "ProcessReward", "CombinedReward",
    "accuracy_reward",
    "REWARDS", "get_reward", "load_user_reward", "parse_reward_spec", "build_rewards",
]
