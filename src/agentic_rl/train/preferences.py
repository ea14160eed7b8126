"""Preference pairs from the model itself (the data half of RLAIF): sample, judge, keep best vs worst.

For each training prompt the model samples ``num_samples`` completions (``models.generate.generate_batched``: the
chat template as the policy sees it, temperature ``temperature``, seeded). A **judge** scores every completion: the
weighted sum of reward specs from the rewards registry (``--judge accuracy`` — the verifier — by default; any
registered reward, a ``module:function``, or an LLM judge registered there, e.g. ``--judge 'judge(base_url=...)'``).
The completion with the highest score becomes ``chosen`` and the one with the lowest ``rejected``; prompts whose
best and worst scores differ by ``min_margin`` or less (ties: every sample right, or every sample wrong) give no pair.

Output in the run directory (default ``runs/preferences``):

    pairs.jsonl     one pair per line: prompt (messages), chosen / rejected (one assistant message each),
                    chosen_score, rejected_score, question, ground_truth — what ``agentic-rl reward-model`` reads
    samples.jsonl   every sampled completion with its score (to inspect the judge)
    stats.json      prompts, samples, pairs, prompts skipped as ties, mean best / worst score
    config.yaml     the resolved settings (an earlier run's pairs are replaced only with ``--overwrite``)
    stage.json      written last: the run finished (:class:`agentic_rl.runs.StageRun`)

Run: ``agentic-rl preferences --model runs/sft/model --num-samples 4 --judge accuracy``
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from agentic_rl.config import SEED_RANGE, check_range, setting
from agentic_rl.console import announce
from agentic_rl.errors import ConfigError
from agentic_rl.runs import StageRun, stage_path
from agentic_rl.utils import log, set_seed, write_json, write_jsonl


@dataclass
class PreferencesConfig:
    model: str = setting("", "model that writes the candidates (an SFT model/ folder, a model dir or a hub id)")
    dataset: str = setting("synthetic", "prompts: synthetic, gsm8k, a hub id, a local file/folder, or a registered "
                                        "name")
    split: str = setting("train", "dataset split the prompts come from")
    max_samples: int | None = setting(256, "prompts to sample from (random, seed); null: all")
    question_field: str | None = setting(None, "custom datasets: column holding the question")
    answer_field: str | None = setting(None, "custom datasets: column holding the reference solution")
    ground_truth_field: str | None = setting(None, "custom datasets: column holding the final answer")
    synthetic_train_size: int = setting(2000, "rows in the synthetic train split the prompts are drawn from")
    synthetic_seed: int = setting(0, "seed of the synthetic task (same for all stages)")
    system_prompt: str | None = setting(None, "system message of every prompt: unset = the standard instruction, "
                                        "'' = none, or your own text (use the value SFT and GRPO use)")
    num_samples: int = setting(4, "completions sampled per prompt (k)")
    temperature: float = setting(1.0, "sampling temperature (> 0: the k samples must differ)")
    top_p: float = setting(1.0, "nucleus sampling p")
    max_new_tokens: int = setting(256, "maximum generated tokens per completion")
    batch_size: int | None = setting(None, "prompts per generation batch (default: sized for the device)")
    judge: list[str] = setting(["accuracy"], "reward specs whose weighted sum scores a completion (the rewards "
                               "registry: 'accuracy', 'format:0.2', 'module:function', an LLM judge ...)")
    min_margin: float = setting(0.0, "keep a pair only when best - worst score exceeds this (0: drop exact ties)")
    output_dir: str | None = setting(None, "run directory (default runs/preferences)")
    seed: int = setting(0, "random seed (prompt draw, sampling)")
    overwrite: bool = setting(False, "replace the pairs of an earlier run in the run directory (without it, such a "
                              "directory is an error)")

    def __post_init__(self) -> None:
        check_range(self, "num_samples", 2)  # a pair needs two completions
        check_range(self, "temperature", 0, low_open=True)  # greedy samples would all be identical
        check_range(self, "top_p", 0, 1, low_open=True)
        check_range(self, ("max_new_tokens", "max_samples", "batch_size", "synthetic_train_size"), 1)
        check_range(self, "min_margin", 0)
        check_range(self, ("seed", "synthetic_seed"), *SEED_RANGE)
        if not self.judge:
            raise ConfigError("judge needs at least one reward spec, e.g. --judge accuracy")


def load_prompts(config: PreferencesConfig) -> list[dict[str, Any]]:
    """RL rows (``question``, ``prompt``, ``ground_truth``, ``full_answer``) of the configured split."""
    from agentic_rl.data import load_task_dataset, to_rl_dataset
    from agentic_rl.data.formats import resolve_system_prompt

    extra: dict[str, Any] = {"question_field": config.question_field, "answer_field": config.answer_field,
                             "ground_truth_field": config.ground_truth_field, "synthetic_seed": config.synthetic_seed}
    if config.dataset.startswith("synthetic"):
        extra["synthetic_train_size"] = config.synthetic_train_size
    rows = load_task_dataset(config.dataset, split=config.split, seed=config.seed, max_samples=config.max_samples,
                             **extra)
    return to_rl_dataset(rows, resolve_system_prompt(config.system_prompt)).to_list()


def judge_scores(funcs, weights, completions: list[str], rows: list[dict[str, Any]]) -> list[float]:
    """The weighted judge score of each completion; ``rows[i]`` holds its prompt and dataset columns. A reward that
    returns ``None`` for a completion (cannot score it) makes its score NaN, and it is never picked."""
    messages = [[{"role": "assistant", "content": c}] for c in completions]  # as TRL passes conversational ones
    columns = {key: [r[key] for r in rows] for key in rows[0] if key != "prompt"} if rows else {}
    total = [0.0] * len(completions)
    for func, weight in zip(funcs, weights):
        values = func(messages, prompts=[r["prompt"] for r in rows], **columns)
        if len(values) != len(completions):
            name = getattr(func, "__name__", type(func).__name__)
            raise ConfigError(f"judge '{name}' returned {len(values)} scores for {len(completions)} completions")
        total = [t + weight * (math.nan if v is None else float(v)) for t, v in zip(total, values)]
    return total


def best_and_worst(scores: list[float], min_margin: float) -> tuple[int, int] | None:
    """Indices of the highest and lowest finite score (first occurrence), or None when they differ by
    ``min_margin`` or less.

    >>> best_and_worst([0.0, 1.0, 0.0, 1.0], 0.0)
    (1, 0)
    >>> best_and_worst([1.0, 1.0], 0.0) is None
    True
    """
    finite = [i for i, s in enumerate(scores) if math.isfinite(s)]
    if len(finite) < 2:
        return None
    best = max(finite, key=lambda i: (scores[i], -i))
    worst = min(finite, key=lambda i: (scores[i], i))
    if scores[best] - scores[worst] <= min_margin:
        return None
    return best, worst


def run(config: PreferencesConfig) -> dict[str, Any]:
    """Sample, judge and pair; returns ``{"run_dir", "pairs_path", "stats"}``."""
    from agentic_rl.models import load_model_and_tokenizer
    from agentic_rl.models.generate import generate_batched
    from agentic_rl.rewards import build_rewards

    if not config.model:
        raise ConfigError("model is required: the model that writes the candidates (--model runs/sft/model)")
    start = time.time()
    out = stage_path(config.output_dir, "preferences")
    announce("preferences", config, out)
    stage_run = StageRun(out, config, stage="preferences")
    stage_run.check()
    set_seed(config.seed)
    # Everything is loaded and checked before anything is written.
    funcs, weights = build_rewards(list(config.judge))
    rows = load_prompts(config)
    model, tokenizer = load_model_and_tokenizer(config.model, for_training=False)

    log(f"preferences: {len(rows)} prompts x {config.num_samples} samples at temperature {config.temperature}, "
        f"judge {' + '.join(config.judge)}")
    results = generate_batched(model, tokenizer, [r["prompt"] for r in rows], max_new_tokens=config.max_new_tokens,
                               batch_size=config.batch_size, temperature=config.temperature, top_p=config.top_p,
                               num_samples=config.num_samples, seed=config.seed, progress="preferences: sampling")
    flat_rows = [r for r in rows for _ in range(config.num_samples)]
    flat_texts = [s.text for samples in results for s in samples]
    flat_scores = judge_scores(funcs, weights, flat_texts, flat_rows)

    pairs, samples, ties = [], [], 0
    best_scores, worst_scores = [], []
    k = config.num_samples
    for p, row in enumerate(rows):
        texts, scores = flat_texts[p * k:(p + 1) * k], flat_scores[p * k:(p + 1) * k]
        samples.extend({"question": row["question"], "ground_truth": row["ground_truth"], "completion": t,
                        "score": s} for t, s in zip(texts, scores))
        picked = best_and_worst(scores, config.min_margin)
        if picked is None:
            ties += 1
            continue
        best, worst = picked
        best_scores.append(scores[best])
        worst_scores.append(scores[worst])
        pairs.append({"prompt": row["prompt"], "chosen": [{"role": "assistant", "content": texts[best]}],
                      "rejected": [{"role": "assistant", "content": texts[worst]}],
                      "chosen_score": scores[best], "rejected_score": scores[worst],
                      "question": row["question"], "ground_truth": row["ground_truth"]})

    finite = [s for s in flat_scores if math.isfinite(s)]
    stats = {"prompts": len(rows), "samples": len(flat_texts), "pairs": len(pairs), "skipped_ties": ties,
             "mean_score": sum(finite) / len(finite) if finite else None,
             "mean_chosen_score": sum(best_scores) / len(pairs) if pairs else None,
             "mean_rejected_score": sum(worst_scores) / len(pairs) if pairs else None,
             "judge": list(config.judge), "wall_time_s": round(time.time() - start, 1)}
    stage_run.claim()
    pairs_path = write_jsonl(out / "pairs.jsonl", pairs)
    write_jsonl(out / "samples.jsonl", samples)
    write_json(out / "stats.json", stats)
    mean = "n/a" if stats["mean_score"] is None else f"{stats['mean_score']:.4g}"
    log(f"preferences done in {stats['wall_time_s']} s: {len(pairs)} pairs from {len(rows)} prompts "
        f"({ties} skipped: best and worst scored alike), mean score {mean}; {pairs_path}")
    if not pairs:
        log("no pairs: every prompt's samples scored alike; sample more (num_samples), raise the temperature, or "
            "use a judge with finer scores")
    return stage_run.finish({"run_dir": str(out), "pairs_path": str(pairs_path), "stats": stats})

