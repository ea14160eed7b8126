"""Evaluation metrics over per-completion records, overall and per difficulty bucket.

Each record (one completion of one prompt, built in :mod:`agentic_rl.eval.evaluate`) carries the fields read here:
``index`` (the prompt), ``difficulty``, ``correct_strict``, ``correct_lenient``, ``abs_error`` / ``rel_error`` (wrong
numeric answers only), ``num_tokens``, ``steps``, ``format_ok``, ``reward``, ``truncated``, ``category``.

Metric table (keys of the dict :func:`compute_metrics` returns; logged as ``eval/<key>`` during training):

=====================  ========================================================================================
``accuracy_strict``    share of completions whose ``Final Answer:`` value equals the ground truth (a hedged answer,
                       ``12 or 13``, ``12-13``, ``12, 13``, is wrong whichever value is true)
``accuracy_lenient``   same, falling back to the last number in the text when the marker is missing
``pass@k``             unbiased pass@k (Chen et al., 2021) over the ``n`` samples per prompt, strict correctness;
                       only for k <= n. With one greedy sample, ``pass@1 == accuracy_strict``
``numeric_abs_error``  mean |prediction - truth| over wrong answers that parse as a number
``numeric_rel_error``  mean |prediction - truth| / |truth| over those with a non-zero truth
``numeric_error_count`` how many wrong numeric answers the two means above average over
``avg_tokens``         mean completion length in generated tokens (EOS included, padding excluded)
``avg_steps``          mean number of reasoning steps in the completion (``rewards.count_steps``)
``format_rate``        share of completions the format reward scores as fully well-formed
``avg_reward``         mean total reward under the configured reward specs
``truncation_rate``    share of completions that hit ``max_new_tokens`` without ending
``num_prompts``        prompts evaluated; ``num_completions`` = prompts x samples
=====================  ========================================================================================

``by_difficulty`` holds the same metrics per bucket of the reference solution's step count: easy <= 2,
medium 3-4, hard >= 5 (``unknown`` when a dataset gives no step count).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from statistics import mean
from typing import Any

DIFFICULTY_BUCKETS = ("easy", "medium", "hard")


def difficulty_bucket(num_steps: int | None) -> str:
    """easy <= 2 reference steps, medium 3-4, hard >= 5; ``unknown`` without a step count."""
    if num_steps is None:
        return "unknown"
    if num_steps <= 2:
        return "easy"
    if num_steps <= 4:
        return "medium"
    return "hard"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k): the chance that k of the n samples, drawn without replacement,
    hold at least one of the c correct ones (Chen et al., 2021, computed as a stable product).

    >>> pass_at_k(n=4, c=1, k=2)
    0.5
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def numeric_errors(prediction: str | None, truth: str) -> tuple[float | None, float | None]:
    """(absolute, relative) error of a numeric prediction; ``None`` where it does not apply (no number, zero truth)."""
    p, t = to_float(prediction), to_float(truth)
    if p is None or t is None:
        return None, None
    abs_err = abs(p - t)
    return abs_err, (abs_err / abs(t) if t != 0 else None)


def to_float(value: Any) -> float | None:
    """``"1,234.5"`` -> 1234.5; ``"$18"`` -> 18.0; non-numbers, NaN and inf -> None."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        f = float(value)
    else:
        text = str(value).strip().replace(",", "").replace("$", "").rstrip(".")
        if text.endswith("%"):
            text = text[:-1]
        try:
            f = float(text)
        except ValueError:
            try:  # simple fractions such as "3/4"
                num, den = text.split("/")
                f = float(num) / float(den)
            except (ValueError, ZeroDivisionError):
                return None
    return f if math.isfinite(f) else None


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(mean(kept)) if kept else None


def _aggregate(records: list[dict[str, Any]], ks: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    by_prompt: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_prompt[r["index"]].append(r)
    out["num_prompts"] = len(by_prompt)
    out["num_completions"] = len(records)
    out["accuracy_strict"] = _mean(float(r["correct_strict"]) for r in records)
    out["accuracy_lenient"] = _mean(float(r["correct_lenient"]) for r in records)
    n_min = min((len(v) for v in by_prompt.values()), default=0)
    for k in ks:
        if 1 <= k <= n_min:
            out[f"pass@{k}"] = _mean(pass_at_k(len(v), sum(bool(r["correct_strict"]) for r in v), k)
                                     for v in by_prompt.values())
    wrong_numeric = [r for r in records if not r["correct_strict"] and r.get("abs_error") is not None]
    out["numeric_abs_error"] = _mean(r["abs_error"] for r in wrong_numeric)
    out["numeric_rel_error"] = _mean(r.get("rel_error") for r in wrong_numeric)
    out["numeric_error_count"] = len(wrong_numeric)
    out["avg_tokens"] = _mean(float(r["num_tokens"]) for r in records)
    out["avg_steps"] = _mean(float(r["steps"]) for r in records)
    out["format_rate"] = _mean(float(r["format_ok"]) for r in records)
    out["avg_reward"] = _mean(r.get("reward") for r in records)
    out["truncation_rate"] = _mean(float(r["truncated"]) for r in records)
    return out


def compute_metrics(records: list[dict[str, Any]], ks: list[int] | tuple[int, ...] = (1,)) -> dict[str, Any]:
    """All metrics of the table above, overall and in ``by_difficulty`` (only buckets that hold samples)."""
    ks = sorted(set(int(k) for k in ks))
    metrics = _aggregate(records, ks)
    buckets: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        buckets[r["difficulty"]].append(r)
    order = [b for b in (*DIFFICULTY_BUCKETS, "unknown") if b in buckets]
    metrics["by_difficulty"] = {b: _aggregate(buckets[b], ks) for b in order}
    return metrics
