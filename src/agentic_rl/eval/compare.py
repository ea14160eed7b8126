"""Does RL add what more SFT cannot? Compare a treatment stage with its compute-matched control, with intervals.

The pipeline evaluates every stage on the same held-out problems and writes one ``predictions.jsonl`` per stage
(``eval/<stage>/``, greedy; ``eval/<stage>-sampled/`` when sampled evaluation is on). This command reads those files
from one or more run directories (one per seed), pairs the two stages problem by problem, and reports:

* per run (seed): both accuracies, their difference, and McNemar's exact test on the discordant problems;
* over all runs: the mean difference with a 95 % percentile-bootstrap interval, resampling problems within each run
  (the runs are the strata), and a more conservative hierarchical interval that also resamples the runs;
* the same for sampled pass@1 (per problem: the share of its samples, or sampled episodes in an environment, that
  are correct) when both stages have it.

Run it::

    agentic-rl compare runs/quickstart-seed0 runs/quickstart-seed1 runs/quickstart-seed2

Outputs (``--output-dir``, default ``runs/compare``): ``compare.json``, ``compare.md`` and ``compare.png``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_rl.config import SEED_RANGE, check_range, setting
from agentic_rl.errors import ConfigError, DataError

MAX_BOOTSTRAP_SAMPLES = 100_000


@dataclass
class CompareConfig:
    """Settings of ``agentic-rl compare``."""

    runs: list[str] = setting([], "pipeline/quickstart run directories, one per seed (each holds eval/<stage>/)",
                              positional=True)
    treatment: str = setting("grpo", "the stage under test (its eval/<stage>/predictions.jsonl is read, or "
                                     "episodes_with_tools.jsonl for a stage evaluated in an environment)")
    control: str = setting("sft_continued", "the compute-matched control stage")
    bootstrap_samples: int = setting(10000, f"bootstrap resamples for the 95-percent intervals (at most "
                                            f"{MAX_BOOTSTRAP_SAMPLES}: more moves the interval by less than its "
                                            "rounding)")
    seed: int = setting(0, "seed of the bootstrap resampling")
    output_dir: str | None = setting(None, "where compare.json / compare.md / compare.png go (default runs/compare)")

    def __post_init__(self) -> None:
        check_range(self, "bootstrap_samples", 100, MAX_BOOTSTRAP_SAMPLES)
        check_range(self, "seed", *SEED_RANGE)
        if self.treatment == self.control:
            raise ConfigError(f"treatment and control are the same stage ({self.treatment!r})")


# ---------------------------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------------------------

def wilson_interval(successes: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion (well-behaved at 0 % and 100 %, unlike the normal interval).

    >>> [round(x, 3) for x in wilson_interval(0, 10)]
    [0.0, 0.278]
    """
    if n <= 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def mcnemar_exact(only_treatment: int, only_control: int) -> float:
    """Two-sided exact McNemar p-value: under the null, each discordant problem is a fair coin.

    ``only_treatment``: problems the treatment solves and the control does not; ``only_control``: the reverse.
    """
    n = only_treatment + only_control
    if n == 0:
        return 1.0
    k = min(only_treatment, only_control)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def bootstrap_mean_difference(diffs_by_run: list[list[float]], *, samples: int = 10000, seed: int = 0,
                              hierarchical: bool = False) -> tuple[float, float, float]:
    """(mean, low, high): the mean over runs of each run's mean paired difference, with a 95 % percentile interval.

    Each inner list holds one run's per-problem differences (treatment - control). Resampling draws problems with
    replacement within each run; ``hierarchical`` also draws the runs with replacement (seed-to-seed noise).
    """
    import numpy as np

    runs = [np.asarray(d, dtype=float) for d in diffs_by_run if len(d)]
    if not runs:
        raise ValueError("no paired differences to bootstrap")
    rng = np.random.default_rng(seed)
    point = float(np.mean([r.mean() for r in runs]))
    stats = np.empty(samples)
    for b in range(samples):
        chosen = rng.integers(0, len(runs), len(runs)) if hierarchical else range(len(runs))
        stats[b] = np.mean([runs[i][rng.integers(0, len(runs[i]), len(runs[i]))].mean() for i in chosen])
    low, high = np.percentile(stats, [2.5, 97.5])
    return point, float(low), float(high)


# ---------------------------------------------------------------------------------------------------------------
# Reading stage predictions
# ---------------------------------------------------------------------------------------------------------------

#: What an evaluated stage folder holds, and each row's per-problem outcome: single-turn predictions, or (a stage
#: evaluated in an environment) the episodes with tools.
STAGE_OUTCOMES = (("predictions.jsonl", "correct_strict"), ("episodes_with_tools.jsonl", "correct"))


def per_problem_accuracy(stage_dir: Path) -> dict[str, float]:
    """question -> share of its completions (or episodes) that are correct, from an evaluated stage folder
    (``eval/<stage>/``: ``predictions.jsonl``, or ``episodes_with_tools.jsonl`` for an environment)."""
    from agentic_rl.utils import iter_jsonl

    found = [(stage_dir / name, key) for name, key in STAGE_OUTCOMES if (stage_dir / name).is_file()]
    if not found:
        raise DataError(f"{stage_dir}: no {' or '.join(name for name, _ in STAGE_OUTCOMES)} found (was this stage "
                        "evaluated? run the pipeline with the stage on)")
    path, key = found[0]
    totals: dict[str, list[int]] = {}
    seen: dict[tuple[str, Any, Any], int] = {}  # (question, index, sample) -> line: one row per problem and sample
    for n, row in iter_jsonl(path):
        if "question" not in row or key not in row:
            raise DataError(f"{path} line {n}: needs 'question' and '{key}' (an evaluation output)")
        if "sample" in row:
            ident = (str(row["question"]), row.get("index"), row["sample"])
            if ident in seen:
                raise DataError(f"{path} line {n}: repeats line {seen[ident]} (the same problem and sample "
                                f"{row['sample']!r}); an evaluation writes each once, so this file was edited or "
                                "appended to: evaluate the stage again")
            seen[ident] = n
        hits = totals.setdefault(str(row["question"]), [0, 0])
        hits[0] += bool(row[key])
        hits[1] += 1
    if not totals:
        raise DataError(f"{path} has no rows (the evaluation was cut short?); evaluate the stage again")
    return {q: c / n for q, (c, n) in totals.items()}


def _evaluated(stage_dir: Path) -> bool:
    """Whether ``stage_dir`` holds an evaluation's per-problem outcomes (predictions or episodes)."""
    return any((stage_dir / name).is_file() for name, _ in STAGE_OUTCOMES)


def paired_scores(run: Path, treatment: str, control: str, suffix: str = "") -> tuple[list[float], list[float]]:
    """Per-problem scores of both stages on the problems both were evaluated on, in one order."""
    a = per_problem_accuracy(run / "eval" / f"{treatment}{suffix}")
    b = per_problem_accuracy(run / "eval" / f"{control}{suffix}")
    shared = sorted(set(a) & set(b))
    if len(shared) < len(a) or len(shared) < len(b):
        raise DataError(f"{run}: {treatment} and {control} were evaluated on different problems "
                        f"({len(a)} and {len(b)} problems, {len(shared)} shared); evaluate both on the same set")
    return [a[q] for q in shared], [b[q] for q in shared]


def compare_runs(runs: list[Path], treatment: str, control: str, *, samples: int = 10000, seed: int = 0
                 ) -> dict[str, Any]:
    """Per-run rows and pooled differences for greedy accuracy, and for sampled pass@1 where every run has it."""
    out: dict[str, Any] = {"treatment": treatment, "control": control, "runs": [], "modes": {}}
    modes = {"greedy": ""}
    if all(_evaluated(r / "eval" / f"{s}-sampled") for r in runs for s in (treatment, control)):
        modes["sampled"] = "-sampled"
    for mode, suffix in modes.items():
        diffs, rows = [], []
        for run in runs:
            t, c = paired_scores(run, treatment, control, suffix)
            d = [x - y for x, y in zip(t, c)]
            diffs.append(d)
            row = {"run": str(run), "problems": len(t), "treatment": sum(t) / len(t), "control": sum(c) / len(c),
                   "difference": sum(d) / len(d)}
            if mode == "greedy":  # McNemar needs one 0/1 outcome per problem
                row["only_treatment"] = sum(1 for x, y in zip(t, c) if x > y)
                row["only_control"] = sum(1 for x, y in zip(t, c) if y > x)
                row["mcnemar_p"] = mcnemar_exact(row["only_treatment"], row["only_control"])
            rows.append(row)
        mean, low, high = bootstrap_mean_difference(diffs, samples=samples, seed=seed)
        _, h_low, h_high = bootstrap_mean_difference(diffs, samples=samples, seed=seed, hierarchical=True)
        out["modes"][mode] = {"rows": rows, "mean_difference": mean, "ci95": [low, high],
                              "ci95_hierarchical": [h_low, h_high],
                              "treatment_wins_every_run": all(r["difference"] > 0 for r in rows)}
    out["runs"] = [str(r) for r in runs]
    return out


# ---------------------------------------------------------------------------------------------------------------
# Report and command
# ---------------------------------------------------------------------------------------------------------------

def _pct(x: float) -> str:
    return f"{100 * x:+.1f}" if x == x else "–"


def render_markdown(result: dict[str, Any]) -> str:
    t, c = result["treatment"], result["control"]
    kind = "compute-matched control" if c == "sft_continued" else "control"  # only sft_continued is budget-matched
    lines = [f"# {t} vs {c} ({kind})", ""]
    for mode, block in result["modes"].items():
        title = "greedy accuracy" if mode == "greedy" else "sampled pass@1"
        lines += [f"## {title}", "", f"| run | problems | {c} | {t} | difference (points) |"
                  + (f" only {t} / only {c} | McNemar p |" if mode == "greedy" else ""),
                  "|---|---|---|---|---|" + ("---|---|" if mode == "greedy" else "")]
        for row in block["rows"]:
            extra = (f" {row['only_treatment']} / {row['only_control']} | {row['mcnemar_p']:.3g} |"
                     if mode == "greedy" else "")
            lines.append(f"| {row['run']} | {row['problems']} | {row['control']:.1%} | {row['treatment']:.1%} | "
                         f"{_pct(row['difference'])} |{extra}")
        low, high = block["ci95"]
        h_low, h_high = block["ci95_hierarchical"]
        lines += ["", f"Mean difference {_pct(block['mean_difference'])} points, 95 % interval "
                  f"[{_pct(low)}, {_pct(high)}] (problems resampled within each run; also resampling the runs: "
                  f"[{_pct(h_low)}, {_pct(h_high)}]). {t} ahead in every run: "
                  f"{'yes' if block['treatment_wins_every_run'] else 'no'}.", ""]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(result["modes"])
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 3.5), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        rows = result["modes"][mode]["rows"]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [100 * r["control"] for r in rows], 0.4, label=result["control"])
        ax.bar([i + 0.2 for i in x], [100 * r["treatment"] for r in rows], 0.4, label=result["treatment"])
        ax.set_xticks(list(x), [Path(r["run"]).name for r in rows], rotation=20, fontsize=8)
        ax.set_ylabel("%")
        ax.set_title("greedy accuracy" if mode == "greedy" else "sampled pass@1")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run(config: CompareConfig) -> dict[str, Any]:
    from agentic_rl.utils import log, run_dir, write_json

    if not config.runs:
        raise ConfigError("give at least one run directory: agentic-rl compare RUN_DIR [RUN_DIR ...]")
    runs = [Path(r) for r in config.runs]
    first_given: dict[Path, Path] = {}
    for r in runs:
        same = first_given.setdefault(r.resolve(), r)
        if same is not r:  # one seed counted twice would narrow the interval without new evidence
            raise ConfigError(f"run directory {r} is given twice (also as {same}); give each seed's run once")
        if not (r / "eval").is_dir():
            raise DataError(f"{r}: no eval/ folder (not a pipeline/quickstart run directory?)")
    result = compare_runs(runs, config.treatment, config.control, samples=config.bootstrap_samples,
                          seed=config.seed)
    out = run_dir(config.output_dir, "compare")
    write_json(out / "compare.json", result)
    (out / "compare.md").write_text(render_markdown(result))
    plot(result, out / "compare.png")
    for mode, block in result["modes"].items():
        low, high = block["ci95"]
        log(f"{mode}: {config.treatment} - {config.control} = {_pct(block['mean_difference'])} points "
            f"[{_pct(low)}, {_pct(high)}] over {len(runs)} run(s) -> {out / 'compare.md'}")
    return result

