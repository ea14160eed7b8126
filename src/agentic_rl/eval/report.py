"""Markdown reports with PNG plots: one per evaluated model, and one comparison across models.

Plots are drawn with matplotlib's object API (``matplotlib.figure.Figure``, Agg canvas) so nothing depends on a
display or on pyplot's global state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentic_rl.eval.error_analysis import CATEGORIES

SUMMARY_KEYS = ("accuracy_strict", "accuracy_lenient", "format_rate", "avg_reward", "avg_tokens", "avg_steps",
                "truncation_rate", "numeric_abs_error", "numeric_rel_error")
BUCKET_KEYS = ("num_completions", "accuracy_strict", "accuracy_lenient", "format_rate", "avg_tokens", "avg_steps",
               "truncation_rate")


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.4g}"
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(v).replace("|", "\\|") for v in row) + " |")
    return "\n".join(lines)


def _pass_keys(metrics: dict[str, Any]) -> list[str]:
    return sorted((k for k in metrics if k.startswith("pass@")), key=lambda k: int(k.split("@")[1]))


def _short(text: str, limit: int = 400) -> str:
    text = text.strip()
    if not text:
        return "(empty or whitespace only)"
    return text if len(text) <= limit else text[:limit] + " …"


# ---------------------------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------------------------

def _figure():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.6), dpi=100)
    return fig, fig.subplots()


def plot_accuracy_by_difficulty(results: dict[str, dict[str, Any]], path: Path) -> Path:
    """Grouped bars: strict accuracy per difficulty bucket, one bar per model."""
    fig, ax = _figure()
    buckets: list[str] = []
    for m in results.values():
        buckets += [b for b in m.get("by_difficulty", {}) if b not in buckets]
    width = 0.8 / max(1, len(results))
    for j, (name, m) in enumerate(results.items()):
        values = [(m["by_difficulty"].get(b) or {}).get("accuracy_strict") or 0.0 for b in buckets]
        bars = ax.bar([i + j * width for i in range(len(buckets))], values, width=width, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks([i + width * (len(results) - 1) / 2 for i in range(len(buckets))], buckets)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy (strict)")
    ax.set_title("Accuracy by difficulty (reference steps)")
    if len(results) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


def plot_error_categories(results: dict[str, dict[str, Any]], path: Path) -> Path:
    """Grouped bars: count of wrong completions per error category, one bar per model."""
    fig, ax = _figure()
    width = 0.8 / max(1, len(results))
    for j, (name, m) in enumerate(results.items()):
        counts = m.get("errors", {}).get("counts", {})
        bars = ax.bar([i + j * width for i in range(len(CATEGORIES))], [counts.get(c, 0) for c in CATEGORIES],
                      width=width, label=name)
        ax.bar_label(bars, fontsize=7)
    ax.set_xticks([i + width * (len(results) - 1) / 2 for i in range(len(CATEGORIES))], list(CATEGORIES))
    ax.set_ylabel("wrong completions")
    ax.set_title("Error categories")
    if len(results) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


def plot_length_histogram(lengths: dict[str, list[int]], path: Path, max_new_tokens: int | None = None) -> Path:
    """Histogram of completion lengths in tokens, one translucent series per model."""
    fig, ax = _figure()
    for name, values in lengths.items():
        if values:
            ax.hist(values, bins=30, alpha=0.6 if len(lengths) > 1 else 0.9, label=name)
    if max_new_tokens:
        ax.axvline(max_new_tokens, color="black", linestyle="--", linewidth=1, label="max_new_tokens")
    ax.set_xlabel("completion length (tokens)")
    ax.set_ylabel("completions")
    ax.set_title("Completion length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


# ---------------------------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------------------------

def _by_difficulty_table(metrics: dict[str, Any]) -> str:
    rows = []
    for bucket, m in metrics.get("by_difficulty", {}).items():
        rows.append([bucket, m.get("num_prompts")] + [m.get(k) for k in BUCKET_KEYS] + [m.get(k) for k in
                                                                                         _pass_keys(metrics)])
    return _table(["bucket", "prompts", *BUCKET_KEYS, *_pass_keys(metrics)], rows)


def _errors_section(metrics: dict[str, Any]) -> list[str]:
    errors = metrics.get("errors") or {}
    counts, shares = errors.get("counts", {}), errors.get("shares", {})
    lines = ["## Error analysis", "",
             "Each wrong completion gets one category, checked in this order: "
             + " > ".join(f"*{c}*" for c in CATEGORIES) + " (see `agentic_rl.eval.error_analysis`).", "",
             _table(["category", "count", "share of wrong"], [[c, counts.get(c, 0), shares.get(c)]
                                                             for c in CATEGORIES]), ""]
    for cat in CATEGORIES:
        examples = (errors.get("examples") or {}).get(cat) or []
        if not examples:
            continue
        lines += [f"### {cat}: examples", ""]
        for ex in examples:
            lines += [f"- **Q:** {_short(ex.get('question', ''), 200)}",
                      f"  **truth:** {ex.get('ground_truth')} · **extracted:** {ex.get('extracted_strict')}"
                      f" · **why:** {ex.get('reason', '')}", "",
                      "  ```", *("  " + line for line in _short(ex.get("completion", "")).splitlines()), "  ```", ""]
    return lines


def write_report(metrics: dict[str, Any], out_dir: str | Path, *, name: str = "model",
                 predictions: list[dict[str, Any]] | None = None) -> Path:
    """``report.md`` with summary, per-difficulty and error tables, and three PNG plots, in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    predictions = predictions if predictions is not None else metrics.get("predictions") or []
    plot_accuracy_by_difficulty({name: metrics}, out_dir / "accuracy_by_difficulty.png")
    plot_error_categories({name: metrics}, out_dir / "error_categories.png")
    plot_length_histogram({name: [p["num_tokens"] for p in predictions]}, out_dir / "length_histogram.png",
                          (metrics.get("config") or {}).get("max_new_tokens"))
    cfg = metrics.get("config") or {}
    lines = [f"# Evaluation report: {name}", "",
             f"Model `{metrics.get('model', name)}` on `{cfg.get('dataset', '?')}` ({cfg.get('split', '?')}): "
             f"{metrics.get('num_prompts')} prompts x {cfg.get('num_samples', 1)} sample(s), "
             f"temperature {cfg.get('temperature', 0.0)}, max_new_tokens {cfg.get('max_new_tokens')}.", "",
             "## Summary", "",
             _table(["metric", "value"], [[k, metrics.get(k)] for k in (*SUMMARY_KEYS, *_pass_keys(metrics))]), "",
             "## By difficulty", "", _by_difficulty_table(metrics), "",
             "![accuracy by difficulty](accuracy_by_difficulty.png)", "",
             *_errors_section(metrics),
             "![error categories](error_categories.png)", "",
             "## Completion length", "", "![length histogram](length_histogram.png)", ""]
    timing = metrics.get("timing")
    if timing:
        lines += [f"Generation took {timing.get('generation_seconds', 0):.1f} s "
                  f"({timing.get('tokens_per_second', 0):.0f} generated tokens/s).", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def write_comparison_report(results: dict[str, dict[str, Any]], out_dir: str | Path,
                            title: str = "Model comparison") -> Path:
    """One table comparing several models (e.g. base vs SFT vs GRPO) plus grouped plots; writes ``comparison.md``.

    ``results`` maps a display name to the metrics dict :func:`agentic_rl.eval.evaluate_model` returned (its
    ``predictions``, when present, feed the length histogram).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pass_keys: list[str] = []
    for m in results.values():
        pass_keys += [k for k in _pass_keys(m) if k not in pass_keys]
    keys = [*SUMMARY_KEYS, *pass_keys]
    rows = [[name] + [m.get(k) for k in keys] for name, m in results.items()]
    buckets: list[str] = []
    for m in results.values():
        buckets += [b for b in m.get("by_difficulty", {}) if b not in buckets]
    bucket_rows = [[name] + [(m.get("by_difficulty", {}).get(b) or {}).get("accuracy_strict") for b in buckets]
                   for name, m in results.items()]
    error_rows = [[name] + [(m.get("errors") or {}).get("counts", {}).get(c, 0) for c in CATEGORIES]
                  for name, m in results.items()]
    plot_accuracy_by_difficulty(results, out_dir / "comparison_accuracy_by_difficulty.png")
    plot_error_categories(results, out_dir / "comparison_error_categories.png")
    lines = [f"# {title}", "", "## Summary", "", _table(["model", *keys], rows), "",
             "## Strict accuracy by difficulty", "", _table(["model", *buckets], bucket_rows), "",
             "![accuracy by difficulty](comparison_accuracy_by_difficulty.png)", "",
             "## Error categories (wrong completions)", "", _table(["model", *CATEGORIES], error_rows), "",
             "![error categories](comparison_error_categories.png)", ""]
    lengths = {name: [p["num_tokens"] for p in m.get("predictions") or []] for name, m in results.items()}
    if any(lengths.values()):
        plot_length_histogram(lengths, out_dir / "comparison_length_histogram.png")
        lines += ["## Completion length", "", "![length histogram](comparison_length_histogram.png)", ""]
    path = out_dir / "comparison.md"
    path.write_text("\n".join(lines))
    return path
