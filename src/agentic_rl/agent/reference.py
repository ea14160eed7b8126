"""Reference solutions of GSM8K-shaped rows (``answer`` = steps with ``<<a*b=c>>`` annotations, then ``#### N``):
the final answer and the step lines, shared by the environments' demonstrations and the agent task rows."""

from __future__ import annotations

from agentic_rl.data.formats import CALC_ANNOTATION
from agentic_rl.errors import DataError


def ground_truth_of(answer: str) -> str:
    if "####" not in answer:
        raise DataError(f"answer has no '#### N' line: {answer[:60]!r}")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def solution_steps(answer: str) -> list[str]:
    """The answer's step lines without calculator annotations and without the ``####`` line."""
    lines = [ln for ln in answer.splitlines() if ln.strip() and not ln.strip().startswith("####")]
    return [CALC_ANNOTATION.sub("", ln).strip() for ln in lines]
