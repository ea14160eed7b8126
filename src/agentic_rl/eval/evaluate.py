"""Evaluate one or more models on a task dataset: accuracy, pass@k, numeric error, error analysis, report.

Algorithm: load the dataset rows (:func:`agentic_rl.data.custom.load_task_dataset`: synthetic, GSM8K from the hub
or a local folder, or a custom file; ``--eval-samples`` draws a seeded random subset), build each prompt with the one
prompt builder SFT and GRPO use, generate in left-padded, length-sorted batches
(:func:`agentic_rl.models.generate.generate_batched`; greedy by default, ``--num-samples n --temperature t`` samples
n completions per prompt for pass@k), then score every completion with the same functions training uses:
:func:`agentic_rl.rewards.is_correct` (strict and lenient), the configured rewards
(:func:`agentic_rl.rewards.build_rewards`), ``count_steps`` and ``check_equations``. Wrong completions are
categorised by :mod:`agentic_rl.eval.error_analysis`; metrics (table in :mod:`agentic_rl.eval.metrics`) are
computed overall and per difficulty bucket.

In an environment (``--environment calculator``) each problem is one greedy episode (``--num-samples n
--temperature t``: n sampled episodes), played with the environment's tools and again without them
(:mod:`agentic_rl.eval.episodes`); ``metrics.json`` then holds ``accuracy`` (with tools; over all episodes),
``accuracy_without_tools``, pass@k when sampling, the tool statistics and the environment's own numbers, with every
episode (its problem ``index`` and ``sample``) in ``episodes_with_tools.jsonl`` / ``episodes_without_tools.jsonl``.

Run it::

    agentic-rl eval runs/quickstart-agentic/grpo/model --environment calculator --no-tools-in-prompt
    agentic-rl eval runs/quickstart-agentic/grpo/model --environment calculator --no-tools-in-prompt \
        --num-samples 4 --temperature 1.0
    agentic-rl eval runs/quickstart/sft/model runs/quickstart/grpo/model --dataset synthetic --eval-samples 200
    agentic-rl eval Qwen/Qwen3-0.6B --dataset openai/gsm8k --num-samples 8 --temperature 0.7 --pass-at-k 1,4,8

Outputs (in ``--output-dir``, default ``runs/eval``; one sub-directory per model when several are given)::

    metrics.json        every metric, per difficulty bucket, error counts/shares/examples, the resolved config
    predictions.jsonl   one line per completion: prompt, completion, extracted answers, ground truth, rewards,
                        correctness, error category and reason
    report.md (+ PNGs)  tables and plots: accuracy by difficulty, error categories, length histogram
    comparison.md       several models: one comparison table and grouped plots

In-process use (the GRPO trainer's periodic held-out evaluation, the pipeline)::

    metrics = evaluate_model(model, rows, tokenizer=tok, max_new_tokens=128, eval_samples=32)

accepts a model object (a ``PeftModel`` too) or a path, and returns the model to train mode if it was training.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_rl.agent.settings import EnvironmentSettings
from agentic_rl.config import SEED_RANGE, check_range, setting
from agentic_rl.errors import ConfigError
from agentic_rl.runs import MODEL_FOLDER

DEFAULT_REWARDS = ["accuracy:1.0", "format:0.2"]


@dataclass
class EvalConfig(EnvironmentSettings):
    """Settings of ``agentic-rl eval`` (the environment settings come from :class:`EnvironmentSettings`)."""

    models: list[str] = setting([], "model directories or hub ids to evaluate (several give a comparison table)",
                                 positional=True)
    dataset: str = setting("synthetic", "'synthetic', 'gsm8k' / a hub id, a local file or folder, or 'module:function'")
    split: str = setting("test", "dataset split")
    eval_samples: int | None = setting(None, "evaluate this many problems drawn at random with --seed (default: all)")
    seed: int = setting(0, "seed for the sample of problems and for sampling")
    synthetic_seed: int = setting(0, "seed of the synthetic task (same for all stages)")
    question_field: str | None = setting(None, "custom datasets: column holding the question")
    answer_field: str | None = setting(None, "custom datasets: column holding the reference solution")
    ground_truth_field: str | None = setting(None, "custom datasets: column holding the final answer")
    batch_size: int | None = setting(None, "prompts per generate call (default: chosen from free device memory)")
    max_new_tokens: int = setting(256, "generation budget per completion (longer ones count as truncated)")
    num_samples: int = setting(1, "completions per prompt (in an environment: episodes per problem; n for pass@k; > 1 "
                                       "needs --temperature > 0)")
    temperature: float = setting(0.0, "0 = greedy decoding; > 0 samples")
    top_p: float = setting(1.0, "nucleus sampling threshold (sampling only)")
    pass_at_k: list[int] = setting([], "k values for pass@k, e.g. 1,4,8 (default: 1 and powers of two up to "
                                       "--num-samples, and --num-samples itself)")
    rewards: list[str] = setting(list(DEFAULT_REWARDS), "reward 'name:weight' for the average-reward metric (as in "
                                                        "grpo)", flag="reward")
    system_prompt: str | None = setting(None, "system message of every prompt: unset = the standard instruction, "
                                        "'' = none, or your own text (use the value the model was trained with)")
    enable_thinking: bool = setting(False, "let Qwen3-style chat templates open a <think> block")
    dtype: str = setting("auto", "weights dtype: auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16")
    num_examples: int = setting(3, "examples per error category in the report")
    output_dir: str | None = setting(None, "run directory (default runs/eval)")

    def __post_init__(self) -> None:
        check_range(self, ("max_new_tokens", "num_samples", "batch_size", "eval_samples"), 1)
        check_range(self, "temperature", 0, meaning="0 = greedy")
        check_range(self, "top_p", 0, 1, low_open=True)
        check_range(self, "num_examples", 0)
        check_range(self, ("seed", "synthetic_seed"), *SEED_RANGE)
        if self.num_samples > 1 and self.temperature == 0:
            raise ConfigError(f"num_samples ({self.num_samples}) > 1 needs --temperature > 0: greedy samples are "
                              "all identical (e.g. --temperature 0.7)")
        for k in self.pass_at_k:
            if not 1 <= k <= self.num_samples:
                raise ConfigError(f"pass_at_k value {k} must be between 1 and num_samples ({self.num_samples}); "
                                  f"raise --num-samples to at least {k}")
        if not self.pass_at_k:
            ks = {1, self.num_samples} | {2**i for i in range(1, 12) if 2**i <= self.num_samples}
            self.pass_at_k = sorted(ks)
        from agentic_rl.rewards.registry import check_reward_specs

        check_reward_specs(self.rewards)  # a misspelt name fails here, not after every completion was generated
        self.check_environment_settings()
        if self.environment is not None:
            if self.max_turn_tokens > self.max_new_tokens:
                raise ConfigError(f"max_turn_tokens ({self.max_turn_tokens}) must not exceed max_new_tokens "
                                  f"({self.max_new_tokens}), the budget of a whole episode")


# ---------------------------------------------------------------------------------------------------------------
# Dataset and rewards
# ---------------------------------------------------------------------------------------------------------------

def load_rows(config: EvalConfig) -> list[dict[str, Any]]:
    """The evaluation rows for ``config`` (seeded sample of ``eval_samples``) as plain dicts."""
    from agentic_rl.data.custom import load_task_dataset

    ds = load_task_dataset(config.dataset, config.split, question_field=config.question_field,
                           answer_field=config.answer_field, ground_truth_field=config.ground_truth_field,
                           max_samples=config.eval_samples, seed=config.seed, synthetic_seed=config.synthetic_seed,
                           text_answers=config.answers_are_text())
    return ds.to_list() if hasattr(ds, "to_list") else list(ds)


def _as_rows(dataset: Any, config: EvalConfig) -> list[dict[str, Any]]:
    """A source string is loaded; an in-memory list / ``datasets.Dataset`` is sub-sampled with the random seed."""
    if isinstance(dataset, (str, Path)):
        return load_rows(config)
    rows = dataset.to_list() if hasattr(dataset, "to_list") else [dict(r) for r in dataset]
    if config.eval_samples is not None and len(rows) > config.eval_samples:
        from agentic_rl.data.gsm8k import sample_indices

        rows = [rows[i] for i in sample_indices(len(rows), config.eval_samples, config.seed)]
    for i, row in enumerate(rows):
        if "ground_truth" not in row or ("question" not in row and "prompt" not in row):
            raise ConfigError(f"evaluation row {i} needs 'question' (or 'prompt') and 'ground_truth'; got keys "
                              f"{sorted(row)}. Load datasets with agentic_rl.data.custom.load_task_dataset")
        if not row.get("question") and isinstance(row.get("prompt"), list):  # RL rows: the last user message
            from agentic_rl.data.formats import last_message_index

            k = last_message_index(row["prompt"])
            row["question"] = row["prompt"][k].get("content", "") if k is not None else ""
    return rows


def _score_rewards(specs: list[str], texts: list[str], rows: list[dict[str, Any]], tokenizer: Any = None,
                   ) -> tuple[list[float], list[dict[str, float]]]:
    """(weighted total, per-reward values) for each completion under the configured reward specs, called the way
    TRL calls them in GRPO: conversational completions plus every dataset column as a keyword list."""
    from agentic_rl.rewards import build_rewards

    funcs, weights = build_rewards(specs, defaults={"tokenizer": tokenizer} if tokenizer is not None else None)
    completions = [[{"role": "assistant", "content": t}] for t in texts]  # conversational, as TRL passes them
    columns: dict[str, list[Any]] = {key: [r.get(key) for r in rows] for key in rows[0]} if rows else {}
    if "answer" in columns and "full_answer" not in columns:  # the name GRPO's RL rows use
        columns["full_answer"] = columns["answer"]
    per: list[dict[str, float]] = [{} for _ in texts]
    totals = [0.0] * len(texts)
    for fn, weight in zip(funcs, weights):
        name = getattr(fn, "__name__", type(fn).__name__)
        values = fn(completions=completions, **columns)
        for i, v in enumerate(values):
            v = float(v) if v is not None else 0.0
            per[i][name] = v
            totals[i] += weight * v
    return totals, per


def reference_step_count(row: dict[str, Any]) -> int | None:
    """The reference solution's step count (difficulty): ``num_steps``, else derived from ``steps`` or from the
    reference text (``answer`` / ``full_answer``); None when the row has no reference solution."""
    if row.get("num_steps") is not None:
        return int(row["num_steps"])
    if row.get("steps"):
        return len(row["steps"])
    text = row.get("answer") or row.get("full_answer")
    if not isinstance(text, str) or not text.strip():
        return None
    from agentic_rl.data.custom import parse_answer_text

    steps, final = parse_answer_text(text)
    return len(steps) if final is not None else None


def _format_ok(texts: list[str]) -> list[bool]:
    """Well-formed = the format reward gives its full score (steps, one final-answer line, nothing after it)."""
    from agentic_rl.rewards import FormatReward

    fn = FormatReward()
    values = fn(completions=[[{"role": "assistant", "content": t}] for t in texts])
    return [v is not None and float(v) >= 1.0 - 1e-9 for v in values]


# ---------------------------------------------------------------------------------------------------------------
# Evaluation of one model
# ---------------------------------------------------------------------------------------------------------------

def _resolve_config(config: EvalConfig | None, overrides: dict[str, Any]) -> EvalConfig:
    if config is None:
        from agentic_rl.config import config_from_dict

        return config_from_dict(EvalConfig, overrides, where="evaluate_model arguments")
    if overrides:
        from agentic_rl.config import config_from_dict, config_to_dict

        return config_from_dict(EvalConfig, {**config_to_dict(config), **overrides}, where="evaluate_model arguments")
    return config


def score_completions(rows: list[dict[str, Any]], prompts: list[list[dict[str, str]]], generations: list[list[Any]],
                      config: EvalConfig, tokenizer: Any = None) -> list[dict[str, Any]]:
    """One record per completion with everything the metrics, the error analysis and predictions.jsonl need."""
    from agentic_rl.eval.error_analysis import categorize
    from agentic_rl.eval.metrics import difficulty_bucket, numeric_errors
    from agentic_rl.rewards import count_steps, extract_answer, is_correct

    flat = [(i, j, g) for i, gens in enumerate(generations) for j, g in enumerate(gens)]
    texts = [g.text for _, _, g in flat]
    flat_rows = [rows[i] for i, _, _ in flat]
    totals, per_reward = _score_rewards(config.rewards, texts, flat_rows, tokenizer) if config.rewards else (
        [None] * len(flat), [{} for _ in flat])
    format_ok = _format_ok(texts)
    ref_steps = [reference_step_count(r) for r in rows]
    records = []
    for n, (i, j, gen) in enumerate(flat):
        row = rows[i]
        truth = str(row["ground_truth"])
        strict, lenient = extract_answer(gen.text, "strict"), extract_answer(gen.text, "lenient")
        correct_strict = is_correct(gen.text, truth, "strict")
        record = {
            "index": i, "sample": j, "question": row.get("question"), "prompt": prompts[i],
            "completion": gen.text, "extracted_strict": strict, "extracted_lenient": lenient, "ground_truth": truth,
            "correct_strict": correct_strict, "correct_lenient": is_correct(gen.text, truth, "lenient"),
            "num_tokens": gen.num_tokens, "truncated": gen.truncated, "steps": count_steps(gen.text),
            "format_ok": format_ok[n], "reward": totals[n], "rewards": per_reward[n],
            "reference_steps": ref_steps[i], "difficulty": difficulty_bucket(ref_steps[i]),
            "abs_error": None, "rel_error": None, "category": None, "category_reason": None,
        }
        if not correct_strict:
            record["abs_error"], record["rel_error"] = numeric_errors(strict, truth)
            record["category"], record["category_reason"] = categorize(gen.text, row, extracted=strict)
        records.append(record)
    return records


def evaluate_model(model_or_path: Any, dataset: Any, *, config: EvalConfig | None = None, tokenizer: Any = None,
                   output_dir: str | Path | None = None, name: str | None = None, progress: bool = False,
                   **overrides: Any) -> dict[str, Any]:
    """Evaluate one model; returns the metrics dict with a ``predictions`` list (one record per completion).

    ``model_or_path``: a model object (``PreTrainedModel`` or ``PeftModel``; then ``tokenizer`` is required) or a
    directory / hub id. ``dataset``: a source string for ``load_task_dataset``, or rows (list of dicts or a
    ``datasets.Dataset``) with ``question`` and ``ground_truth``. Settings come from ``config`` and/or keyword
    overrides named like :class:`EvalConfig` fields (``eval_samples=32, max_new_tokens=128``); an unknown keyword
    is a :class:`ConfigError`. With ``output_dir`` the metrics, predictions and report are written there.
    ``progress``: draw a progress bar over the generations (the ``eval`` command does).
    """
    from agentic_rl.eval.error_analysis import summarize_errors
    from agentic_rl.eval.metrics import compute_metrics
    from agentic_rl.models.generate import generate_batched

    config = _resolve_config(config, overrides)
    if not hasattr(model_or_path, "generate") and hasattr(model_or_path, "module"):
        model_or_path = model_or_path.module  # DistributedDataParallel and similar wrappers
    if isinstance(dataset, (str, Path)):
        config = dataclasses.replace(config, dataset=str(dataset))
    if isinstance(model_or_path, (str, Path)):
        from agentic_rl.models.loading import load_model_and_tokenizer

        model, loaded_tok = load_model_and_tokenizer(str(model_or_path), dtype=config.dtype, for_training=False)
        tokenizer = tokenizer or loaded_tok
        name = name or _display_name(str(model_or_path))
    else:
        model = model_or_path
        if tokenizer is None:
            raise ConfigError("evaluate_model with an in-memory model needs tokenizer=...")
        name = name or getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__
    rows = _as_rows(dataset, config)
    if not rows:
        raise ConfigError(f"no evaluation rows in dataset {config.dataset!r} split {config.split!r}")

    from agentic_rl.data.formats import build_prompt, resolve_system_prompt

    system_prompt = resolve_system_prompt(config.system_prompt)
    prompts = [r["prompt"] if isinstance(r.get("prompt"), list) else build_prompt(r["question"], system_prompt)
               for r in rows]
    start = time.perf_counter()
    generations = generate_batched(model, tokenizer, prompts, max_new_tokens=config.max_new_tokens,
                                   batch_size=config.batch_size, temperature=config.temperature,
                                   top_p=config.top_p, num_samples=config.num_samples, seed=config.seed,
                                   enable_thinking=config.enable_thinking,
                                   progress=f"eval {name}" if progress else None)
    seconds = time.perf_counter() - start
    records = score_completions(rows, prompts, generations, config, tokenizer)

    metrics: dict[str, Any] = {"model": name}
    metrics.update(compute_metrics(records, config.pass_at_k))
    metrics["errors"] = summarize_errors(records, config.num_examples)
    generated = sum(r["num_tokens"] for r in records)
    metrics["timing"] = {"generation_seconds": seconds,
                         "tokens_per_second": generated / seconds if seconds > 0 else None}
    metrics["config"] = {k: v for k, v in dataclasses.asdict(config).items() if k != "models"}
    metrics["predictions"] = records
    if output_dir is not None:
        write_outputs(metrics, output_dir, name=name)
    return metrics


def _display_name(path: str) -> str:
    p = Path(path)
    if p.name in (MODEL_FOLDER, "adapter", "final") and p.parent.name:  # sft/model, not model
        return f"{p.parent.name}/{p.name}"
    return p.name or path


def _clean_json(value: Any) -> Any:
    """NaN/inf -> None so metrics.json is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean_json(v) for v in value]
    return value


def write_outputs(metrics: dict[str, Any], out_dir: str | Path, *, name: str = "model") -> Path:
    """metrics.json (without predictions), predictions.jsonl and report.md (+ PNGs) in ``out_dir``."""
    from agentic_rl.eval.report import write_report
    from agentic_rl.utils import write_json, write_jsonl

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    predictions = metrics.get("predictions") or []
    write_json(out_dir / "metrics.json", _clean_json({k: v for k, v in metrics.items() if k != "predictions"}))
    write_jsonl(out_dir / "predictions.jsonl", [_clean_json(p) for p in predictions])
    write_report(metrics, out_dir, name=name, predictions=predictions)
    return out_dir


def flatten_metrics(metrics: dict[str, Any], prefix: str = "eval/") -> dict[str, float]:
    """Scalar metrics with namespaced names for loggers: ``eval/accuracy_strict``, ``eval/hard/accuracy_strict``,
    ``eval/errors/calculation`` (share of wrong completions)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = float(value)
    for bucket, values in (metrics.get("by_difficulty") or {}).items():
        for key, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"{prefix}{bucket}/{key}"] = float(value)
    for cat, share in ((metrics.get("errors") or {}).get("shares") or {}).items():
        if share is not None:
            out[f"{prefix}errors/{cat}"] = float(share)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------------

def run(config: EvalConfig) -> dict[str, Any]:
    """``agentic-rl eval MODEL [MODEL ...]``: evaluate each model on the same rows, write reports; returns
    ``{"output_dir": ..., "results": {display name: metrics}, "models": {model path as given: metrics}}`` (the
    same metrics dicts, without predictions; the headline number is ``accuracy_strict``)."""
    from agentic_rl.config import save_config
    from agentic_rl.console import announce
    from agentic_rl.eval.report import write_comparison_report
    from agentic_rl.runs import stage_path
    from agentic_rl.utils import log, run_dir, set_seed

    if not config.models:
        raise ConfigError("give at least one model to evaluate: agentic-rl eval MODEL_DIR [MODEL_DIR ...]")
    out = stage_path(config.output_dir, "eval")  # not created yet
    announce("eval", config, out)
    env_factory = None
    if config.environment is not None:  # a bad environment fails before anything is written
        from agentic_rl.agent.settings import build_environment

        env_factory = build_environment(config)
    set_seed(config.seed)
    rows = load_rows(config)  # a bad dataset fails here, before the run directory is touched
    created, earlier_config = not out.exists(), _read_bytes(out / "config.yaml")
    out = run_dir(config.output_dir, "eval")
    save_config(config, out / "config.yaml")
    log(f"evaluating {len(config.models)} model(s) on {len(rows)} problems from {config.dataset} ({config.split})")

    names = _unique_names(config.models)
    results: dict[str, dict[str, Any]] = {}
    try:
        _evaluate_each(config, rows, env_factory, out, names, results)
    except BaseException:
        if not results:  # nothing evaluated yet: leave the directory as it was before this run
            _restore(out, created, earlier_config)
        raise
    if len(results) > 1 and env_factory is None:
        path = write_comparison_report(results, out)
        log(f"comparison: {path}")
    summary = {name: {k: v for k, v in m.items() if k != "predictions"} for name, m in results.items()}
    return {"output_dir": str(out), "results": summary,
            "models": {path: summary[name] for path, name in zip(config.models, names)}}


def _evaluate_each(config: EvalConfig, rows: list[dict[str, Any]], env_factory: Any, out: Path, names: list[str],
                   results: dict[str, dict[str, Any]]) -> None:
    """Evaluate each model of ``config`` into ``out`` (its own folder when there are several), adding its metrics to
    ``results`` as it finishes."""
    from agentic_rl.utils import free_memory, log

    for model_path, name in zip(config.models, names):
        model_dir = out if len(config.models) == 1 else out / name.replace("/", "_")
        if env_factory is not None:
            metrics = evaluate_model_in_environment(model_path, rows, config, env_factory, output_dir=model_dir,
                                                    name=name, progress=True)
            results[name] = metrics
            per = f" ({config.num_samples} sampled episodes per problem)" if config.temperature > 0 else ""
            log(f"{name}: accuracy {metrics['accuracy']:.3f} with tools, {metrics['accuracy_without_tools']:.3f} "
                f"without{per}; tool-call rate {metrics['tool_call_rate']:.3f} -> {model_dir}")
            free_memory()
            continue
        metrics = evaluate_model(model_path, rows, config=config, output_dir=model_dir, name=name, progress=True)
        results[name] = metrics
        log(f"{name}: accuracy {metrics['accuracy_strict']:.3f} (lenient {metrics['accuracy_lenient']:.3f}), "
            f"format {metrics['format_rate']:.3f}, truncated {metrics['truncation_rate']:.3f} -> {model_dir}")
        free_memory()


def _read_bytes(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def _restore(out: Path, created: bool, earlier_config: bytes | None) -> None:
    """Undo what a failed ``eval`` wrote before any model was evaluated: the directory it created, or the
    ``config.yaml`` it wrote into an existing one (an earlier run's is put back)."""
    import shutil

    if created:
        shutil.rmtree(out, ignore_errors=True)
    elif earlier_config is not None:
        (out / "config.yaml").write_bytes(earlier_config)
    else:
        (out / "config.yaml").unlink(missing_ok=True)


def evaluate_model_in_environment(model_or_path: Any, rows: list[dict[str, Any]], config: EvalConfig, env_factory,
                                  *, tokenizer: Any = None, output_dir: str | Path | None = None,
                                  name: str | None = None, without_tools: bool = True,
                                  progress: bool = False) -> dict[str, Any]:
    """Episodes in ``config.environment`` with its tools and without them
    (:func:`agentic_rl.eval.episodes.evaluate_episodes`): one greedy episode per problem, or with ``temperature`` > 0
    ``num_samples`` sampled episodes per problem seeded with ``seed``. Returns the metrics: ``accuracy`` (with tools,
    over all episodes; also under ``accuracy_strict``, the single-turn headline name), ``accuracy_without_tools``,
    when sampling ``pass@k`` for each k of ``config.pass_at_k``, the tool and environment statistics of the
    with-tools episodes at the top level and both settings' statistics under ``with_tools`` / ``without_tools``
    (``without_tools=False`` skips that setting: tune scores trials with tools only), and, where the rows have
    reference steps or a lookup chain, ``error_classes``: the wrong with-tools episodes per class of
    :func:`agentic_rl.eval.error_analysis.categorize_episode` or ``categorize_search_episode``. With ``output_dir``:
    ``metrics.json``, ``episodes_with_tools.jsonl``, ``episodes_without_tools.jsonl`` and ``report.md``.
    ``progress``: draw a progress bar over the episodes (the ``eval`` command does)."""
    from agentic_rl.agent.settings import environment_system_prompt
    from agentic_rl.data.formats import resolve_system_prompt
    from agentic_rl.eval.episodes import evaluate_episodes
    from agentic_rl.eval.error_analysis import count_episode_errors
    from agentic_rl.utils import write_json, write_jsonl

    if isinstance(model_or_path, (str, Path)):
        from agentic_rl.models.loading import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(str(model_or_path), dtype=config.dtype, for_training=False)
        name = name or _display_name(str(model_or_path))
    else:
        model = model_or_path
        if tokenizer is None:
            raise ConfigError("evaluate_model_in_environment with an in-memory model needs tokenizer=...")
    example = getattr(env_factory, "example", None) or env_factory()  # a plain callable has no built example
    prompts = {True: environment_system_prompt(config.system_prompt, example),
               False: resolve_system_prompt(config.system_prompt)}
    start = time.perf_counter()
    settings, episodes = {}, {}
    for tools in ((True, False) if without_tools else (True,)):
        key = "with_tools" if tools else "without_tools"
        settings[key], episodes[key] = evaluate_episodes(
            model, tokenizer, rows, env_factory, tools=tools, tools_in_prompt=config.tools_in_prompt,
            max_turn_tokens=config.max_turn_tokens, max_completion_length=config.max_new_tokens,
            batch_size=config.batch_size or 64, system_prompt=prompts[tools], num_samples=config.num_samples,
            temperature=config.temperature, top_p=config.top_p, seed=config.seed,
            pass_at_k=config.pass_at_k if config.temperature > 0 else (),
            progress=f"eval {name} ({key.replace('_', ' ')})" if progress else None)
    with_tools = settings["with_tools"]
    metrics: dict[str, Any] = {
        "model": name, "environment": config.environment, "num_prompts": len(rows),
        "num_samples": config.num_samples, "temperature": config.temperature,
        "accuracy": with_tools["accuracy"], "accuracy_strict": with_tools["accuracy"],
        "accuracy_without_tools": settings["without_tools"]["accuracy"] if without_tools else None,
        **{k: v for k, v in with_tools.items() if k != "accuracy"},
        **settings, "timing": {"generation_seconds": time.perf_counter() - start},
        "config": {k: v for k, v in dataclasses.asdict(config).items() if k != "models"},
    }
    error_classes = count_episode_errors(episodes["with_tools"])
    if error_classes is not None:
        metrics["error_classes"] = error_classes
    if output_dir is not None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "metrics.json", _clean_json(metrics))
        for key, rows_out in episodes.items():
            write_jsonl(out / f"episodes_{key}.jsonl", rows_out)
        (out / "report.md").write_text(environment_report(metrics))
    return metrics


def environment_report(metrics: dict[str, Any]) -> str:
    """A markdown table of one model's episode statistics, with and without tools."""
    keys = [k for k, v in metrics["with_tools"].items() if isinstance(v, (int, float))]
    decoding = (f"{metrics['num_samples']} sampled episodes per problem at temperature {metrics['temperature']}"
                if metrics.get("temperature") else "greedy")
    lines = [f"# {metrics.get('model')} in environment {metrics.get('environment')} "
             f"({metrics.get('num_prompts')} problems, {decoding})", "",
             "| setting | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for tools_setting in ("with_tools", "without_tools"):
        stats = metrics.get(tools_setting) or {}
        lines.append(f"| {tools_setting.replace('_', ' ')} | "
                     + " | ".join(f"{stats[k]:.3f}" if k in stats else "" for k in keys) + " |")
    classes = metrics.get("error_classes")
    if classes:
        lines += ["", "Wrong episodes with tools, by their calls against the reference (the solution's steps, "
                  "or the question's lookup chain; `agentic_rl.eval.error_analysis`): "
                  + ", ".join(f"{name.replace('_', ' ')} {n}" for name, n in classes.items()) + "."]
    return "\n".join(lines) + "\n"


def _unique_names(paths: list[str]) -> list[str]:
    names = [_display_name(p) for p in paths]
    if len(set(names)) == len(names):
        return names
    return [f"{i}-{n}" for i, n in enumerate(names)]

