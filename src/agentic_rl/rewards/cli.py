"""Score completions in a JSONL file and show each reward component per sample.

    agentic-rl reward check samples.jsonl
    agentic-rl reward check samples.jsonl --reward accuracy --reward "length(alpha=0.002):0.5" --mode lenient

Each line of the file is a JSON object with a completion (a string, or a list of chat messages) and its ground
truth; other fields are passed to the rewards as dataset columns, as TRL does. The table shows, per sample, the
extracted answer, the reasoning steps counted, the equations the calculator confirmed, the length, every reward
and their weighted total, so you can see why a completion scored what it did. ``--show-equations`` lists each
wrong equation under its row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_rl.config import setting
from agentic_rl.errors import ConfigError, DataError
from agentic_rl.rewards.calculator import check_equations, count_steps
from agentic_rl.rewards.extraction import completion_text, extract_answer
from agentic_rl.rewards.registry import build_rewards
from agentic_rl.utils import iter_jsonl

DEFAULT_REWARDS = ["accuracy", "format", "step", "length", "process"]


@dataclass
class RewardCheckConfig:
    action: str = setting("check", "what to do: check = score every row of FILE", positional=True, choices=["check"])
    file: str = setting("", "JSONL file, one object per line with a completion and its ground truth", positional=True)
    rewards: list[str] = setting(list(DEFAULT_REWARDS), "reward spec: name[:weight], name(key=value,...)[:weight] or "
                                                        "module:function[:weight]", flag="reward")
    mode: str = setting("strict", "answer extraction: strict (Final Answer / #### / \\boxed only) or lenient (else "
                                  "the last number)", choices=["strict", "lenient"])
    use_math_verify: bool = setting(False, "let math-verify confirm answers our parser rejects (symbolic answers)")
    completion_field: str = setting("completion", "field holding the completion")
    ground_truth_field: str = setting("ground_truth", "field holding the ground truth")
    limit: int | None = setting(None, "score only the first N rows")
    show_equations: bool = setting(False, "list each wrong equation under its row")
    output: str | None = setting(None, "also write per-sample scores to this JSONL file")

    def __post_init__(self) -> None:
        if not self.file:
            raise ConfigError("reward check needs a file: agentic-rl reward check FILE.jsonl")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be >= 1, got {self.limit}")


def read_rows(config: RewardCheckConfig) -> list[dict[str, Any]]:
    """The rows of the JSONL file; a bad line is a DataError naming the file, line and field."""
    path = Path(config.file)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    rows = []
    for lineno, row in iter_jsonl(path):  # a line that is not a JSON object: "<path> line N: ..."
        for key in (config.completion_field, config.ground_truth_field):
            if key not in row:
                raise DataError(f"{path} line {lineno}: missing field '{key}' (fields: {', '.join(row)[:200]})")
        completion = row[config.completion_field]
        if not (isinstance(completion, str) or (isinstance(completion, list)
                                                and all(isinstance(m, dict) for m in completion))):
            raise DataError(f"{path} line {lineno}: field '{config.completion_field}' must be a string or a "
                            f"list of messages, got {type(completion).__name__}")
        truth = row[config.ground_truth_field]
        if isinstance(truth, (dict, list)) or truth is None:
            raise DataError(f"{path} line {lineno}: field '{config.ground_truth_field}' must be a number or "
                            f"a string, got {json.dumps(truth)[:40]}")
        row["_line"] = lineno
        rows.append(row)
        if config.limit is not None and len(rows) >= config.limit:
            break
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def _cell(value: Any, width: int) -> str:
    text = "-" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value))
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[:width - 1] + "~"


def run(config: RewardCheckConfig) -> dict[str, Any]:
    """Score every row with every reward; print the table; return ``{"rows": [...], "mean": {...}}``."""
    rows = read_rows(config)
    funcs, weights = build_rewards(config.rewards, defaults={"mode": config.mode,
                                                             "use_math_verify": config.use_math_verify})
    names = [getattr(f, "__name__", type(f).__name__) for f in funcs]
    completions = [row[config.completion_field] for row in rows]
    columns = {key: [row[key] for row in rows] for key in rows[0]
               if key not in (config.completion_field, "_line") and all(key in row for row in rows)}
    columns["ground_truth"] = [str(row[config.ground_truth_field]) for row in rows]
    scores = {}
    for name, func in zip(names, funcs):
        values = func(completions, **columns)
        if len(values) != len(rows):
            raise ConfigError(f"reward '{name}' returned {len(values)} values for {len(rows)} completions")
        scores[name] = [float("nan") if v is None else float(v) for v in values]

    results = []
    for i, row in enumerate(rows):
        text = completion_text(completions[i])
        checks = check_equations(text)
        result = {
            "line": row["_line"],
            "ground_truth": columns["ground_truth"][i],
            "answer": extract_answer(text, config.mode),
            "steps": count_steps(text),
            "equations_ok": sum(c.ok for c in checks),
            "equations": len(checks),
            "chars": len(text),
            **{name: scores[name][i] for name in names},
        }
        result["total"] = sum(w * scores[name][i] for name, w in zip(names, weights))
        result["_wrong"] = [c for c in checks if not c.ok]
        results.append(result)

    # ---- table ------------------------------------------------------------------------------------------------
    header = ["line", "truth", "answer", "steps", "eq ok", "chars"] + [
        f"{w:g}*{n}" if w != 1 else n for n, w in zip(names, weights)] + ["total"]
    widths = [max(6, min(14, len(h))) for h in header]
    widths[1] = widths[2] = 10
    print("  ".join(h[:w].rjust(w) for h, w in zip(header, widths)))
    for r in results:
        cells = [r["line"], r["ground_truth"], r["answer"], r["steps"], f"{r['equations_ok']}/{r['equations']}",
                 r["chars"]] + [r[n] for n in names] + [r["total"]]
        print("  ".join(_cell(c, w).rjust(w) for c, w in zip(cells, widths)))
        if config.show_equations:
            for c in r["_wrong"]:
                computed = "not computable" if c.computed is None else f"is {c.computed:g}"
                print(f"{'':>8}wrong: {c.expression} = {c.stated:g} ({computed})")
    mean = {name: sum(scores[name]) / len(rows) for name in names}
    mean["total"] = sum(r["total"] for r in results) / len(rows)
    print("  ".join(_cell(c, w).rjust(w) for c, w in zip(
        ["mean", "", "", "", "", ""] + [mean[n] for n in names] + [mean["total"]], widths)))
    print(f"{len(rows)} rows from {config.file}; total = " +
          " + ".join(f"{w:g}*{n}" for n, w in zip(names, weights)))

    for r in results:
        r.pop("_wrong")
    if config.output:
        from agentic_rl.utils import write_jsonl

        write_jsonl(config.output, results)
    return {"rows": results, "mean": mean, "weights": dict(zip(names, weights))}

