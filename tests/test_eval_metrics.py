"""Evaluation metrics: pass@k against brute-force enumeration, buckets, numeric error, aggregation, config checks."""

from __future__ import annotations

import itertools
import math

import pytest

from agentic_rl.errors import ConfigError
from agentic_rl.eval.evaluate import EvalConfig
from agentic_rl.eval.metrics import compute_metrics, difficulty_bucket, numeric_errors, pass_at_k, to_float


def brute_force_pass_at_k(outcomes: list[bool], k: int) -> float:
    """Share of all k-subsets of the n samples that contain at least one correct sample."""
    subsets = list(itertools.combinations(range(len(outcomes)), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(outcomes, k), abs=1e-12), (n, c, k)


def test_pass_at_k_closed_form_and_edges():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the fraction correct
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 8, 3) == 1.0  # fewer than k wrong samples: every draw holds a correct one
    assert pass_at_k(20, 4, 5) == pytest.approx(1 - math.comb(16, 5) / math.comb(20, 5))
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_difficulty_buckets_boundaries():
    assert [difficulty_bucket(s) for s in (0, 1, 2, 3, 4, 5, 9)] == ["easy", "easy", "easy", "medium", "medium",
                                                                      "hard", "hard"]
    assert difficulty_bucket(None) == "unknown"


def test_numeric_errors():
    assert numeric_errors("110", "100") == (pytest.approx(10.0), pytest.approx(0.1))
    assert numeric_errors("-5", "0") == (5.0, None)  # no relative error against a zero truth
    assert numeric_errors(None, "3") == (None, None)
    assert to_float("1,234.5") == 1234.5 and to_float("$18") == 18.0 and to_float("3/4") == 0.75
    assert to_float("abc") is None and to_float("nan") is None


def _record(index, correct, *, difficulty="easy", lenient=None, abs_error=None, rel_error=None, tokens=10,
            steps=2, fmt=True, reward=1.0, truncated=False):
    return {"index": index, "difficulty": difficulty, "correct_strict": correct,
            "correct_lenient": correct if lenient is None else lenient, "abs_error": abs_error,
            "rel_error": rel_error, "num_tokens": tokens, "steps": steps, "format_ok": fmt, "reward": reward,
            "truncated": truncated}


def test_compute_metrics_values_and_buckets():
    records = [
        # prompt 0 (easy): 2 samples, 1 correct
        _record(0, True, tokens=10, reward=1.2),
        _record(0, False, lenient=True, abs_error=2.0, rel_error=0.5, tokens=20, fmt=False, reward=0.0),
        # prompt 1 (hard): 2 samples, none correct, one truncated and without a number
        _record(1, False, difficulty="hard", abs_error=6.0, rel_error=None, tokens=30, steps=5, reward=0.2),
        _record(1, False, difficulty="hard", tokens=40, steps=1, fmt=False, reward=0.0, truncated=True),
    ]
    m = compute_metrics(records, ks=[1, 2, 4])
    assert m["num_prompts"] == 2 and m["num_completions"] == 4
    assert m["accuracy_strict"] == pytest.approx(0.25)
    assert m["accuracy_lenient"] == pytest.approx(0.5)
    assert m["pass@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert m["pass@2"] == pytest.approx((1.0 + 0.0) / 2)
    assert "pass@4" not in m  # k larger than the samples per prompt is not reported
    assert m["numeric_abs_error"] == pytest.approx(4.0) and m["numeric_error_count"] == 2
    assert m["numeric_rel_error"] == pytest.approx(0.5)  # the zero-truth case has no relative error
    assert m["avg_tokens"] == pytest.approx(25.0)
    assert m["avg_steps"] == pytest.approx(2.5)
    assert m["format_rate"] == pytest.approx(0.5)
    assert m["avg_reward"] == pytest.approx(0.35)
    assert m["truncation_rate"] == pytest.approx(0.25)
    assert list(m["by_difficulty"]) == ["easy", "hard"]
    assert m["by_difficulty"]["easy"]["accuracy_strict"] == pytest.approx(0.5)
    assert m["by_difficulty"]["hard"]["accuracy_strict"] == 0.0
    assert m["by_difficulty"]["hard"]["truncation_rate"] == pytest.approx(0.5)


def test_eval_config_validation_and_default_ks():
    assert EvalConfig().pass_at_k == [1]
    assert EvalConfig(num_samples=8, temperature=0.7).pass_at_k == [1, 2, 4, 8]
    assert EvalConfig(num_samples=6, temperature=0.7).pass_at_k == [1, 2, 4, 6]
    with pytest.raises(ConfigError, match="temperature"):
        EvalConfig(num_samples=4)
    with pytest.raises(ConfigError, match="pass_at_k value 8"):
        EvalConfig(num_samples=4, temperature=0.5, pass_at_k=[1, 8])
    with pytest.raises(ConfigError, match="max_new_tokens"):
        EvalConfig(max_new_tokens=0)
    with pytest.raises(ConfigError, match="top_p"):
        EvalConfig(top_p=0.0)
