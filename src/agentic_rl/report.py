"""The pipeline report: one stage-comparison table (same held-out problems for every stage) and training curves.

Curves come from what the stages already wrote: TRL/transformers ``trainer_state.json`` log histories (loss; reward,
KL over GRPO steps) and GRPO's periodic held-out evaluation (``grpo/heldout.jsonl``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentic_rl.utils import read_jsonl

# (column title, metric key, format) for the stage comparison table.
TABLE_COLUMNS = [
    ("accuracy", "accuracy_strict", "{:.1%}"),
    ("accuracy (lenient)", "accuracy_lenient", "{:.1%}"),
    ("format correct", "format_rate", "{:.1%}"),
    ("avg length (tokens)", "avg_tokens", "{:.1f}"),
    ("avg steps", "avg_steps", "{:.2f}"),
]


def _fmt(value: Any, pattern: str) -> str:
    return pattern.format(value) if isinstance(value, (int, float)) else "–"


def load_log_history(stage_dir: Path) -> list[dict[str, Any]]:
    """A stage's logged metrics, one dict per logging step.

    SFT and pretraining write the trainer's log history to ``log_history.json``; GRPO writes namespaced metrics to
    ``metrics.jsonl`` (``grpo/reward``, ``grpo/kl``, ...). A bare ``trainer_state.json`` (e.g. from a checkpoint) works too.
    """
    if (stage_dir / "log_history.json").is_file():
        return json.loads((stage_dir / "log_history.json").read_text())
    if (stage_dir / "metrics.jsonl").is_file():
        return read_jsonl(stage_dir / "metrics.jsonl")
    checkpoints = sorted(stage_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1])
                         if p.name.split("-")[-1].isdigit() else -1)
    for path in [stage_dir / "trainer_state.json"] + [c / "trainer_state.json" for c in reversed(checkpoints)]:
        if path.is_file():
            return json.loads(path.read_text()).get("log_history", [])
    return []


def _series(history: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    steps, values = [], []
    for entry in history:
        if key in entry and isinstance(entry[key], (int, float)):
            steps.append(entry.get("step", len(steps)))
            values.append(float(entry[key]))
    return steps, values


def plot_training_curves(root: Path) -> list[Path]:
    """PNG curves: SFT loss; GRPO reward, KL and held-out accuracy over steps. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    panels: list[tuple[str, list[float], list[float]]] = []
    for stage in ("pretrain", "sft"):
        steps, loss = _series(load_log_history(root / stage), "loss")
        if loss:
            panels.append((f"{stage} loss", steps, loss))
    grpo_history = load_log_history(root / "grpo")
    for key, title in (("grpo/reward", "GRPO mean reward"), ("grpo/kl", "GRPO KL to reference")):
        steps, values = _series(grpo_history, key)
        if values:
            panels.append((title, steps, values))
    heldout = read_jsonl(root / "grpo" / "heldout.jsonl")
    if heldout:
        panels.append(("GRPO held-out accuracy", [r.get("step", i) for i, r in enumerate(heldout)],
                       [r.get("accuracy", float("nan")) for r in heldout]))
    if not panels:
        return written
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), squeeze=False)
    for ax, (title, steps, values) in zip(axes[0], panels):
        ax.plot(steps, values, marker="." if len(values) < 40 else None)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = root / "training_curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


def write_pipeline_report(root: Path, summary: dict[str, Any]) -> Path:
    root = Path(root)
    lines = [f"# agentic-rl run: {summary.get('name', root.name)}", "",
             f"Seed {summary.get('seed')}; total wall time {summary.get('total_wall_time_s', 0):.0f} s.", ""]
    evaluated = {name: stage for name, stage in summary["stages"].items() if isinstance(stage.get("metrics"), dict)}
    if evaluated:
        first = next(iter(evaluated.values()))["metrics"]
        n = first.get("num_prompts", "?")
        lines += [f"## Held-out comparison ({n} problems, greedy)", "",
                  "| stage | " + " | ".join(title for title, _, _ in TABLE_COLUMNS) + " | errors (calc / underst. / "
                  "format / reasoning) |",
                  "|---" * (len(TABLE_COLUMNS) + 2) + "|"]
        for name, stage in evaluated.items():
            metrics = stage["metrics"]
            counts = [((metrics.get("errors") or {}).get("counts") or {}).get(c, 0)
                      for c in ("calculation", "understanding", "format", "reasoning")]
            lines.append(f"| {name} | " + " | ".join(_fmt(metrics.get(key), pattern)
                                                      for _, key, pattern in TABLE_COLUMNS)
                         + " | " + " / ".join(str(c) for c in counts) + " |")
        lines.append("")
    timing = [(name, stage.get("wall_time_s")) for name, stage in summary["stages"].items()
              if stage.get("wall_time_s") is not None]
    if timing:
        lines += ["## Wall time per stage", "", "| stage | seconds |", "|---|---|"]
        lines += [f"| {name} | {seconds:.0f} |" for name, seconds in timing]
        lines.append("")
    for png in plot_training_curves(root):
        lines += ["## Training curves", "", f"![training curves]({png.name})", ""]
    if summary.get("export_dir"):
        lines += ["## Export", "", f"Merged model: `{summary['export_dir']}` (load with "
                  "`AutoModelForCausalLM.from_pretrained`, serve with `agentic-rl serve` or `vllm serve`).", ""]
    path = root / "report.md"
    path.write_text("\n".join(lines))
    return path
