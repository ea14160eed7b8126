"""The pipeline report: one stage-comparison table (same held-out problems for every stage) and training curves.

Curves come from what the stages already wrote: each training stage's ``metrics.jsonl`` (``train/loss``; ``grpo/reward``
and ``grpo/kl`` over GRPO steps) and GRPO's periodic held-out evaluation (``grpo/heldout.jsonl``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentic_rl.utils import read_json, read_jsonl

# (column title, metric key, format) for the stage comparison table.
TABLE_COLUMNS = [
    ("accuracy", "accuracy_strict", "{:.1%}"),
    ("accuracy (lenient)", "accuracy_lenient", "{:.1%}"),
    ("format correct", "format_rate", "{:.1%}"),
    ("avg length (tokens)", "avg_tokens", "{:.1f}"),
    ("avg steps", "avg_steps", "{:.2f}"),
]
#: The same table for a run in an environment (greedy episodes, with and without tools).
ENVIRONMENT_COLUMNS = [
    ("accuracy with tools", "accuracy_strict", "{:.1%}"),
    ("without tools", "accuracy_without_tools", "{:.1%}"),
    ("tool-call rate", "tool_call_rate", "{:.1%}"),
    ("useful calls", "useful_call_rate", "{:.1%}"),
    ("tool errors", "tool_error_rate", "{:.1%}"),
    ("turns / episode", "turns_per_episode", "{:.2f}"),
]
#: Columns added when the environment reports these numbers (the search environment's).
ENVIRONMENT_OWN_COLUMNS = [
    ("searches / episode", "searches", "{:.2f}"),
    ("useful searches", "useful_search_rate", "{:.1%}"),
]


def _fmt(value: Any, pattern: str) -> str:
    return pattern.format(value) if isinstance(value, (int, float)) else "–"


def load_log_history(stage_dir: Path) -> list[dict[str, Any]]:
    """A stage's logged metrics, one dict per logging step: its ``metrics.jsonl``, which every training stage writes
    through :class:`agentic_rl.train.monitoring.MetricsLogger` (``train/loss``, ``perf/num_tokens``, ``grpo/kl``, ...);
    empty when the stage logged nothing."""
    return read_jsonl(stage_dir / "metrics.jsonl")


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
        steps, loss = _series(load_log_history(root / stage), "train/loss")
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


def _interval(metrics: dict[str, Any]) -> str:
    """95 % Wilson interval of a stage's greedy accuracy, in percent."""
    from agentic_rl.eval.compare import wilson_interval

    acc, n = metrics.get("accuracy_strict"), metrics.get("num_prompts")
    if not isinstance(acc, (int, float)) or not n:
        return "–"
    low, high = wilson_interval(acc * n, n)
    return f"{100 * low:.1f}–{100 * high:.1f} %"


def control_comparison(root: Path, summary: dict[str, Any]) -> dict[str, Any] | None:
    """GRPO against its compute-matched control, paired over the same problems: per mode (greedy, sampled) both
    scores, the difference with its 95 % bootstrap interval and, greedy, the discordant counts and McNemar's p.
    None unless both stages were evaluated."""
    stages = summary["stages"]
    if "metrics" not in stages.get("grpo", {}) or "metrics" not in stages.get("sft_continued", {}):
        return None
    from agentic_rl.eval.compare import compare_runs

    result = compare_runs([root], "grpo", "sft_continued", samples=4000)
    return {mode: {**block["rows"][0], "ci95": block["ci95"]} for mode, block in result["modes"].items()}


#: Below this share of GRPO's wall time a control sized by the SFT stage's speed is flagged as short of GRPO's compute.
CONTROL_SHORT_SHARE = 0.9


def control_compute_share(budget: dict[str, Any], control_seconds: float) -> float | None:
    """The share of GRPO's wall time that a control sized by the SFT stage's speed (``_run_control`` in the
    pipeline) spent on its extra steps; None when the control's steps were set by the user or a time is missing.
    ``control: longer`` also trains SFT's steps, which take their share of its time and are not counted."""
    grpo_seconds = budget.get("grpo_wall_time_s")
    if "sft_seconds_per_step" not in budget or not grpo_seconds or not control_seconds > 0:
        return None
    return control_seconds * budget["extra_steps"] / budget["steps"] / grpo_seconds


def equal_budget_steps(budget: dict[str, Any], control_seconds: float) -> int | None:
    """The control's steps that would have given its extra steps GRPO's wall time, when they got under
    :data:`CONTROL_SHORT_SHARE` of it (:func:`control_compute_share`; the machine ran at another speed during SFT
    than during the control), else None. A control whose steps the user set is left as set."""
    share = control_compute_share(budget, control_seconds)
    if share is None or share >= CONTROL_SHORT_SHARE:
        return None
    steps, extra = budget["steps"], budget["extra_steps"]
    return steps - extra + round(extra / share)


def _control_section(summary: dict[str, Any]) -> list[str]:
    control = summary.get("control")
    if not control:
        return []
    stage = summary["stages"]["sft_continued"]
    budget = stage.get("budget", {})
    grpo_s, control_s = budget.get("grpo_wall_time_s", float("nan")), stage.get("wall_time_s", float("nan"))
    steps = budget.get("steps", "?")
    if budget.get("control") == "longer":
        what = f"The control is one SFT run from SFT's starting model for {steps} steps in one schedule"
        if "sft_steps" in budget:
            what += f": SFT's {budget['sft_steps']} and {budget['extra_steps']} more"
    else:
        what = f"The control continues SFT from GRPO's starting model for {steps} steps"
    if "sft_seconds_per_step" in budget:  # sized by the SFT stage's speed (else sft_continued.max_steps set it)
        what += f", sized to GRPO's wall time ({grpo_s:.0f} s; the control took {control_s:.0f} s)."
        steps_needed = equal_budget_steps(budget, control_s)
        if steps_needed is not None:
            share = control_compute_share(budget, control_s)
            what += (f" **The control got less compute than GRPO** (its extra steps ran {share:.0%} of GRPO's time: "
                     "the machine ran at another speed during SFT): for an equal budget set "
                     f"`sft_continued.max_steps: {steps_needed}` (with a new `--name`, or `--fresh`).")
    else:
        what += f" (set by sft_continued.max_steps; GRPO took {grpo_s:.0f} s, the control {control_s:.0f} s)."
    lines = ["## GRPO vs the compute-matched control", "",
             f"{what} Differences are paired over the same problems, with a 95 % bootstrap interval.", ""]
    for mode, row in control.items():
        low, high = row["ci95"]
        extra = (f"; solved only by GRPO {row['only_treatment']}, only by the control {row['only_control']} "
                 f"(McNemar p = {row['mcnemar_p']:.3g})" if "mcnemar_p" in row else "")
        lines.append(f"- {mode}: GRPO {row['treatment']:.1%} vs control {row['control']:.1%}: "
                     f"{100 * row['difference']:+.1f} points [{100 * low:+.1f}, {100 * high:+.1f}]{extra}")
    return lines + [""]


def stage_time_rows(root: Path, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Where the time went, per stage: wall seconds, tokens processed (pretraining and SFT: trained tokens; GRPO:
    prompt + completion tokens of its batches; evaluation: generated tokens), tokens/s and the share of the time spent
    generating (GRPO: its timed generation plus held-out checks; evaluation: all of it; training stages: none)."""
    rows = []
    for name, stage in summary["stages"].items():
        seconds, tokens, generating = stage.get("wall_time_s"), None, None
        folder = root / name
        if seconds is not None and name == "pretrain":
            import yaml

            config = yaml.safe_load((folder / "config.yaml").read_text()) if (folder / "config.yaml").is_file() else {}
            if all(isinstance(config.get(k), int) for k in ("max_steps", "batch_size", "seq_length")):
                tokens = config["max_steps"] * config["batch_size"] * config["seq_length"]
            generating = 0.0
        elif seconds is not None and name in ("sft", "sft_continued", "grpo"):
            counted = [r["perf/num_tokens"] for r in load_log_history(folder) if "perf/num_tokens" in r]
            tokens = counted[-1] if counted else None
            generating = 0.0 if name != "grpo" else None
            result = read_json(folder / "stage.json") if name == "grpo" and (folder / "stage.json").is_file() else {}
            if result.get("generation_seconds") is not None and not result.get("resumed_from"):
                generating = (result["generation_seconds"] + result.get("heldout_seconds", 0.0)) / max(seconds, 1e-9)
        if seconds is not None:
            rows.append({"stage": name, "seconds": seconds, "tokens": tokens, "generation_share": generating})
        eval_seconds = stage.get("eval_wall_time_s")
        if eval_seconds:
            metrics = stage.get("metrics") or {}
            generated = (metrics["avg_tokens"] * metrics["num_prompts"] * metrics.get("num_samples", 1)
                         if isinstance(metrics.get("avg_tokens"), (int, float)) and metrics.get("num_prompts")
                         else None)
            rows.append({"stage": f"eval {name}", "seconds": eval_seconds, "tokens": generated,
                         "generation_share": 1.0})
    return rows


def _time_section(root: Path, summary: dict[str, Any]) -> list[str]:
    rows = stage_time_rows(root, summary)
    if not rows:
        return []
    lines = ["## Where the time goes", "", "| stage | seconds | tokens processed | tokens/s | generating |",
             "|---|---|---|---|---|"]
    for row in rows:
        rate = row["tokens"] / row["seconds"] if row["tokens"] and row["seconds"] else None
        lines.append(f"| {row['stage']} | {row['seconds']:.0f} | {_fmt(row['tokens'], '{:,.0f}')} | "
                     f"{_fmt(rate, '{:,.0f}')} | {_fmt(row['generation_share'], '{:.0%}')} |")
    total = sum(row["seconds"] for row in rows)
    lines += ["", f"{total:.0f} s in the stages above (the run's total wall time also counts loading and "
              "writing between them).", ""]
    return lines


def write_pipeline_report(root: Path, summary: dict[str, Any]) -> Path:
    root = Path(root)
    lines = [f"# agentic-rl run: {summary.get('name', root.name)}", "",
             f"Seed {summary.get('seed')}; total wall time {summary.get('total_wall_time_s', 0):.0f} s.", ""]
    base = summary.get("base")
    if base:
        digest = f" (weights sha256 `{base['sha256']}`)" if base.get("sha256") else ""
        lines[-1:-1] = [f"Base model: `{base['base']}`{digest}."]
    evaluated = {name: stage for name, stage in summary["stages"].items() if isinstance(stage.get("metrics"), dict)}
    if evaluated:
        first = next(iter(evaluated.values()))["metrics"]
        n = first.get("num_prompts", "?")
        sampled = any("sampled" in stage for stage in evaluated.values())
        environment = first.get("environment")
        columns = list(ENVIRONMENT_COLUMNS if environment else TABLE_COLUMNS)
        columns += [(key.replace("_", " "), key, "{:.1%}") for key in first if key.startswith("success_at_")]
        columns += [column for column in ENVIRONMENT_OWN_COLUMNS if environment and column[1] in first]
        title = f"in environment `{environment}`, greedy episodes" if environment else "greedy"
        lines += [f"## Held-out comparison ({n} problems, {title})", "",
                  "| stage | " + " | ".join(title for title, _, _ in columns) + " | 95 % interval |"
                  + (" sampled pass@1 |" if sampled else "")
                  + ("" if environment else " errors (calc / underst. / format / reasoning) |"),
                  "|---" * (len(columns) + 2 + sampled + (not environment)) + "|"]
        for name, stage in evaluated.items():
            metrics = stage["metrics"]
            counts = [((metrics.get("errors") or {}).get("counts") or {}).get(c, 0)
                      for c in ("calculation", "understanding", "format", "reasoning")]
            extra = f" {_fmt((stage.get('sampled') or {}).get('pass@1'), '{:.1%}')} |" if sampled else ""
            lines.append(f"| {name} | " + " | ".join(_fmt(metrics.get(key), pattern) for _, key, pattern in columns)
                         + f" | {_interval(metrics)} |{extra}"
                         + ("" if environment else " " + " / ".join(str(c) for c in counts) + " |"))
        lines.append("")
        if sampled:
            first_sampled = next(s["sampled"] for s in evaluated.values() if "sampled" in s)
            if environment:
                without = ", ".join(f"{name} {_fmt(stage['sampled'].get('accuracy_without_tools'), '{:.1%}')}"
                                    for name, stage in evaluated.items() if "sampled" in stage)
                lines += [f"Sampled pass@1: {first_sampled['samples']} sampled episodes per problem with tools at "
                          f"temperature {first_sampled['temperature']} (GRPO's training temperature); without "
                          f"tools: {without}.", ""]
            else:
                lines += [f"Sampled pass@1: {first_sampled['samples']} samples per problem at temperature "
                          f"{first_sampled['temperature']} (GRPO's training temperature).", ""]
        lines += _control_section(summary)
    lines += _time_section(root, summary)
    for png in plot_training_curves(root):
        lines += ["## Training curves", "", f"![training curves]({png.name})", ""]
    if summary.get("export_dir"):
        lines += ["## Export", "", f"Merged model: `{summary['export_dir']}` (load with "
                  "`AutoModelForCausalLM.from_pretrained`, serve with `agentic-rl serve` or `vllm serve`).", ""]
    path = root / "report.md"
    path.write_text("\n".join(lines))
    return path
