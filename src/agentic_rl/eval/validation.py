"""The validation slice and its one scorer: held-out problems carved out of the training split, never the test split.

GRPO's periodic held-out checks (``heldout_every``, ``best/``) and ``tune``'s trial scores (pruning included) draw
their problems from here, and so does the pipeline, which runs those stages:

* :func:`training_and_validation_rows` loads a stage's training split, shuffles it with the stage's seed and carves the
  first ``eval_samples`` rows off as the validation slice; the stage trains on the rest. The slice is deterministic
  by seed and disjoint from the rows trained on, and the test split that the final evaluation reports is never looked
  at while training or choosing hyper-parameters. ``tune`` asks the trial's stage to carve the slice it scores on, so a
  trial never trains on a problem it is scored on.
* :func:`score_heldout` scores a model on those rows the same way for every caller: greedy, on each row's own
  ``prompt`` (built with the stage's system prompt from the stage's column mapping), through
  :func:`agentic_rl.eval.evaluate_model` (the accuracy reward's parse-and-compare); in an environment, as greedy
  episodes with its tools (:func:`agentic_rl.eval.episodes.evaluate_episodes`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

#: Rows of the synthetic train split left to train on once the validation slice is carved off, when the stage does
#: not say how many it trains on (GRPO without max_train_samples): the split is generated with ``eval_samples`` rows
#: more than this, so carving the slice does not shrink the training set.
SYNTHETIC_TRAIN_ROWS_AFTER_CARVING = 2000


def carve_validation(rows: list[dict[str, Any]], n: int, seed: int, *, where: str,
                     setting: str = "eval_samples") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(train, validation)``: ``rows`` shuffled with ``seed``, the first ``n`` the validation slice (none for 0)."""
    from agentic_rl.errors import ConfigError

    rows = list(rows)
    random.Random(seed).shuffle(rows)
    if n <= 0:
        return rows, []
    if len(rows) <= n:
        raise ConfigError(f"{setting} ({n}) leaves no training rows from the {len(rows)} rows of {where}; lower "
                          f"{setting}")
    return rows[n:], rows[:n]


def training_and_validation_rows(source: str, split: str, *, seed: int, eval_samples: int,
                                 synthetic_train_size: int | None = None, **load_options: Any,
                                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Task rows of ``source``'s training ``split`` as ``(train, validation)`` (see :func:`carve_validation`).

    The synthetic task is generated with ``eval_samples`` rows more than ``synthetic_train_size``, so carving the
    slice does not shrink the training set. ``load_options`` go to :func:`agentic_rl.data.load_task_dataset`
    (column mapping, ``synthetic_seed``, ...)."""
    from agentic_rl.data import load_task_dataset

    if source.startswith("synthetic"):
        train_rows = synthetic_train_size or SYNTHETIC_TRAIN_ROWS_AFTER_CARVING
        load_options["synthetic_train_size"] = train_rows + eval_samples
    rows = load_task_dataset(source, split=split, seed=seed, **load_options).to_list()
    return carve_validation(rows, eval_samples, seed, where=f"{source}:{split}")


def score_heldout(model: Any, tokenizer: Any, rows: list[dict[str, Any]], *, max_new_tokens: int,
                  rewards: list[str] | None = None, env_factory: Callable[[], Any] | None = None,
                  tools_in_prompt: bool = True, max_turn_tokens: int = 48) -> dict[str, Any]:
    """Greedy held-out metrics of ``model`` (an in-memory model with its ``tokenizer``, or a directory) on ``rows``.

    ``rows`` carry ``question``, ``ground_truth`` and the stage's ``prompt`` messages. Single-turn: ``accuracy``
    (strict, as the final evaluation), ``accuracy_lenient``, ``format_rate``, ``avg_reward`` (of ``rewards``, the
    stage's weighted reward functions), ``avg_tokens``, ``truncation_rate``. With ``env_factory``: one greedy episode
    per row with the environment's tools, its statistics (``accuracy``, ``tool_call_rate``, ``return``, ...) and
    ``avg_reward``, the episode return. Always ``n``, the number of problems."""
    if env_factory is not None:
        from agentic_rl.eval.episodes import evaluate_episodes

        if isinstance(model, str):
            from agentic_rl.models.loading import load_model_and_tokenizer

            model, tokenizer = load_model_and_tokenizer(model, for_training=False)
        stats, _ = evaluate_episodes(model, tokenizer, rows, env_factory, tools=True, tools_in_prompt=tools_in_prompt,
                                     max_turn_tokens=max_turn_tokens, max_completion_length=max_new_tokens)
        # avg_reward is the episode return, the reward GRPO optimises in an environment
        return {**{k: v for k, v in stats.items() if isinstance(v, (int, float))}, "avg_reward": stats["return"],
                "n": len(rows)}
    from agentic_rl.eval import evaluate_model

    settings: dict[str, Any] = {"max_new_tokens": max_new_tokens, "temperature": 0.0}
    if rewards:
        settings["rewards"] = list(rewards)
    m = evaluate_model(model, rows, tokenizer=tokenizer, **settings)
    out = {"accuracy": m.get("accuracy_strict"), "accuracy_lenient": m.get("accuracy_lenient"),
           "format_rate": m.get("format_rate"), "avg_reward": m.get("avg_reward"), "avg_tokens": m.get("avg_tokens"),
           "truncation_rate": m.get("truncation_rate"), "n": m.get("num_prompts", len(rows))}
    return {k: v for k, v in out.items() if v is not None}
