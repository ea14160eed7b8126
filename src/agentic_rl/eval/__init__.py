"""Evaluation: metrics (accuracy, pass@k, numeric error, ...), error analysis and reports.

``agentic-rl eval MODEL [MODEL ...]`` runs :func:`agentic_rl.eval.evaluate.run`; training and the pipeline call
:func:`evaluate_model` in process and :func:`write_comparison_report` to compare base / SFT / GRPO.
"""

from agentic_rl.eval.error_analysis import CATEGORIES, categorize, summarize_errors
from agentic_rl.eval.evaluate import EvalConfig, evaluate_model, flatten_metrics, run, write_outputs
from agentic_rl.eval.metrics import compute_metrics, difficulty_bucket, pass_at_k
from agentic_rl.eval.report import write_comparison_report, write_report

__all__ = [
    "CATEGORIES", "EvalConfig", "categorize", "compute_metrics", "difficulty_bucket", "evaluate_model",
    "flatten_metrics", "pass_at_k", "run", "summarize_errors", "write_comparison_report", "write_outputs",
    "write_report",
]
