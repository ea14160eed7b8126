"""Reward modelling: train a scalar reward model on preference pairs with TRL's ``RewardTrainer``.

Algorithm (the Bradley-Terry reward model of InstructGPT, as TRL 1.16 implements it):

1. Data: a local JSONL of preference pairs, ``prompt`` + ``chosen`` + ``rejected`` (what ``agentic-rl preferences``
   writes), as text (strings) or conversational (message lists; ``prompt`` may then be left out when ``chosen`` and
   ``rejected`` hold the whole conversation). Extra columns (scores) are ignored. A seeded ``heldout_fraction`` of
   the pairs is carved out before training and never trained on. A pair whose chosen equals its rejected teaches
   nothing (and would count as a wrong ranking): such pairs are dropped with a count; a file of nothing else is an
   error.
2. Model: ``AutoModelForSequenceClassification(num_labels=1)`` from a causal-LM directory (an SFT ``model/``
   folder: Qwen3 gives ``Qwen3ForSequenceClassification``, a fresh linear ``score`` head on the last hidden state);
   ``pad_token_id`` is set in its config, since the head reads the last non-padding token. LoRA (``task_type
   SEQ_CLS``, the ``score`` head fully trained through ``modules_to_save``) unless ``full`` is set.
3. Loss (TRL): ``-log σ(r(x, y_chosen) - r(x, y_rejected))`` per pair, plus ``center_rewards_coefficient ·
   (r_c + r_r)²`` when set. Text pairs get the EOS token appended; conversational pairs are rendered by the chat
   template. TRL logs loss, accuracy, margin and reward range to TensorBoard (``<run>/tensorboard``).
4. Held-out pairwise accuracy: the share of held-out pairs with ``r(chosen) > r(rejected)`` (a tie counts as wrong),
   before and after training, scored by the same code the ``reward_model`` reward uses
   (:mod:`agentic_rl.rewards.reward_model`); a held-out sequence longer than ``max_length`` tokens is scored on its
   first ``max_length`` tokens.
5. Output in the run directory: ``model/`` (the reward model: LoRA merged into it, loadable with
   ``AutoModelForSequenceClassification``; the stage's model folder), ``adapter/`` for LoRA runs, ``config.yaml``,
   ``metrics.json``, ``metrics.jsonl`` (every logged step), ``checkpoints/`` (for ``--resume``), ``stage.json`` once
   finished; a finished run is replaced only with ``--overwrite`` (:class:`agentic_rl.runs.StageRun`).

Use it as a GRPO reward:
``agentic-rl grpo --model runs/sft/model --reward 'reward_model(path=runs/reward-model/model)'`` (or
``--reward rm:runs/reward-model/model``).

Run: ``agentic-rl reward-model --model runs/sft/model --dataset runs/preferences/pairs.jsonl``
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_rl.config import SEED_RANGE, check_range, config_to_dict, report_to_list, setting
from agentic_rl.console import announce
from agentic_rl.errors import ConfigError, DataError
from agentic_rl.runs import MODEL_FOLDER, StageRun, stage_path
from agentic_rl.utils import has_gpu, iter_jsonl, log, set_seed, supports_bf16, warn, write_json

#: What a run writes into its directory; an earlier run's copies are removed when a new run (not --resume) starts.


@dataclass
class RewardModelConfig:
    model: str = setting("", "causal LM to start from (a model directory, e.g. an SFT model/ folder, or a hub id)")
    dataset: str = setting("", "preference pairs: a local JSONL with prompt/chosen/rejected (text or conversational)")
    output_dir: str | None = setting(None, "run directory (default runs/reward-model)")
    seed: int = setting(0, "random seed (held-out split, score head and LoRA init, data order)")
    max_samples: int | None = setting(None, "use at most N pairs (random, seed), before the held-out split")
    heldout_fraction: float = setting(0.1, "share of the pairs held out to measure pairwise accuracy (0..0.5)")
    full: bool = setting(False, "full fine-tuning instead of LoRA (this stage trains a LoRA adapter by default)")
    lora_r: int = setting(16, "LoRA rank")
    lora_alpha: int = setting(32, "LoRA alpha (the update is scaled by alpha / r)")
    lora_dropout: float = setting(0.0, "dropout on the LoRA input")
    lora_target_modules: list[str] = setting(["all-linear"], "modules that get LoRA adapters ('all-linear' or names)")
    learning_rate: float = setting(1e-4, "peak learning rate")
    epochs: float = setting(1.0, "passes over the pairs (when max_steps is -1)")
    max_steps: int = setting(-1, "optimizer steps; -1: use epochs")
    batch_size: int = setting(8, "pairs per device per forward pass (each pair is two sequences)")
    gradient_accumulation_steps: int = setting(1, "micro-steps per optimizer step")
    warmup_ratio: float = setting(0.1, "share of steps for linear warm-up")
    weight_decay: float = setting(0.0, "AdamW weight decay")
    max_grad_norm: float = setting(1.0, "gradient clipping norm")
    max_length: int = setting(512, "pairs whose chosen or rejected sequence is longer (tokens) are dropped")
    center_rewards_coefficient: float | None = setting(None, "pull rewards towards mean 0 (TRL's centering term; "
                                                        "0.01 is the paper's value; unset = off)")
    score_batch_size: int = setting(32, "sequences per forward pass when scoring held-out pairs")
    report_to: list[str] = setting(["tensorboard"], "metric backends: tensorboard, wandb (offline works), none "
                                   "(comma list)")
    logging_steps: int = setting(10, "log loss / accuracy / margin every N steps")
    save_steps: int = setting(500, "checkpoint every N steps")
    save_total_limit: int = setting(1, "keep at most N checkpoints")
    resume: bool = setting(False, "continue from the last complete checkpoint in the run directory (same settings)")
    overwrite: bool = setting(False, "replace a finished or interrupted run in the run directory (without it, such a "
                              "directory is an error)")

    def __post_init__(self) -> None:
        self.report_to = report_to_list(self.report_to)
        check_range(self, "heldout_fraction", 0, 0.5)
        check_range(self, "max_steps", 1, also=(-1,), meaning="-1 to train for `epochs`")
        check_range(self, ("learning_rate", "epochs"), 0, low_open=True)
        if not self.full:
            check_range(self, ("lora_r", "lora_alpha"), 1)
        check_range(self, ("warmup_ratio", "lora_dropout"), 0, 1, high_open=True)
        check_range(self, ("batch_size", "gradient_accumulation_steps", "score_batch_size", "logging_steps",
                           "save_steps", "save_total_limit"), 1)
        check_range(self, "max_length", 16)
        check_range(self, "max_samples", 2)
        # max_grad_norm 0: no clipping; center_rewards_coefficient 0: no centering (None: TRL's default, off)
        check_range(self, ("weight_decay", "max_grad_norm", "center_rewards_coefficient"), 0)
        check_range(self, "seed", *SEED_RANGE)


# ---------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------

def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)


def load_pairs(path: str) -> tuple[list[dict[str, Any]], bool]:
    """``(rows, conversational)``: the pairs of a JSONL file reduced to ``prompt`` (when present), ``chosen`` and
    ``rejected``, all in one form (text or messages); any other shape is a one-line :class:`DataError`."""
    if not path:
        raise ConfigError("dataset is required: a JSONL of preference pairs (--dataset pairs.jsonl)")
    if not Path(path).is_file():
        raise DataError(f"preference pairs {path}: no such file (write one with `agentic-rl preferences`)")
    raw = list(iter_jsonl(path))  # a line that is not a JSON object: "<path> line N: ..."
    if not raw:
        raise DataError(f"{path} holds no preference pairs")
    with_prompt = "prompt" in raw[0][1]
    conversational = _is_messages(raw[0][1].get("chosen"))
    rows, lines = [], []
    for i, row in raw:
        if "chosen" not in row or "rejected" not in row:
            raise DataError(f"{path} line {i}: a preference pair needs 'chosen' and 'rejected' "
                            f"(and usually 'prompt'); got {sorted(row)}")
        if ("prompt" in row) != with_prompt:
            raise DataError(f"{path} line {i}: 'prompt' must be in every row or in none")
        keys = ("prompt", "chosen", "rejected") if with_prompt else ("chosen", "rejected")
        for key in keys:
            value = row[key]
            ok = _is_messages(value) if conversational else isinstance(value, str)
            if not ok:
                form = "a message list [{role, content}, ...]" if conversational else "a string"
                raise DataError(f"{path} line {i}: '{key}' must be {form} like the first row's 'chosen'")
        rows.append({k: row[k] for k in keys})
        lines.append(i)
    same = [line for line, row in zip(lines, rows) if row["chosen"] == row["rejected"]]
    if len(same) == len(rows):
        raise DataError(f"{path}: in every pair 'chosen' equals 'rejected' (line {same[0]} first); a pair needs two "
                        "different responses to rank")
    if same:
        warn(f"{path}: dropped {len(same)} of {len(rows)} pairs whose 'chosen' equals 'rejected' (line {same[0]} "
             "first): they rank nothing")
        rows = [row for row in rows if row["chosen"] != row["rejected"]]
    return rows, conversational


def split_pairs(rows: list[dict[str, Any]], config: RewardModelConfig) -> tuple[list[dict], list[dict]]:
    """``(train, heldout)``: a seeded shuffle, ``max_samples`` kept, then ``heldout_fraction`` carved out."""
    rows = list(rows)
    random.Random(config.seed).shuffle(rows)
    if config.max_samples:
        rows = rows[:config.max_samples]
    n_heldout = round(len(rows) * config.heldout_fraction)
    if config.heldout_fraction > 0:
        n_heldout = max(1, n_heldout)
    if len(rows) - n_heldout < 1:
        raise DataError(f"{len(rows)} pairs leave none to train on after holding out {n_heldout}; "
                        f"add pairs or lower heldout_fraction")
    return rows[n_heldout:], rows[:n_heldout]


def pairwise_accuracy(model, tokenizer, pairs: list[dict[str, Any]], *, batch_size: int = 32,
                      max_length: int | None = None) -> dict[str, float]:
    """Share of pairs scored ``r(chosen) > r(rejected)`` (ties count as wrong), the mean margin, and the mean
    scores, with the scoring the ``reward_model`` reward uses (sequences cut to ``max_length`` tokens)."""
    from agentic_rl.rewards.reward_model import pair_texts, score_texts

    if not pairs:
        return {}
    sequences = [pair_texts(tokenizer, p.get("prompt"), p[key]) for p in pairs for key in ("chosen", "rejected")]
    # Each distinct sequence is scored once: the same text in two padded batches can differ in the last float bits,
    # which would turn an exact tie (chosen == rejected) into a coin flip.
    unique = list(dict.fromkeys(tuple(s) for s in sequences))
    by_sequence = dict(zip(unique, score_texts(model, tokenizer, [list(s) for s in unique], batch_size=batch_size,
                                               max_length=max_length)))
    scores = [by_sequence[tuple(s)] for s in sequences]
    chosen, rejected = scores[0::2], scores[1::2]
    n = len(pairs)
    return {"pairwise_accuracy": sum(c > r for c, r in zip(chosen, rejected)) / n,
            "mean_margin": sum(c - r for c, r in zip(chosen, rejected)) / n,
            "mean_chosen": sum(chosen) / n, "mean_rejected": sum(rejected) / n, "n": n}


# ---------------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------------

def load_reward_base(config: RewardModelConfig, *, conversational: bool):
    """``(model, tokenizer)``: a one-output sequence classifier on top of the causal LM in ``config.model``."""
    from transformers import AutoModelForSequenceClassification

    from agentic_rl.errors import ModelLoadError
    from agentic_rl.models.loading import (check_weights_finite, from_pretrained, is_adapter_dir, load_tokenizer,
                                           resolve_device, resolve_dtype, resolve_model_path)

    if not config.model:
        raise ConfigError("model is required: a causal LM directory such as runs/sft/model (--model)")
    if Path(config.model).is_dir() and is_adapter_dir(config.model):
        raise ModelLoadError(f"{config.model} holds a PEFT adapter; pass the model directory with the adapter merged "
                             f"in (SFT's model/)")
    path = resolve_model_path(config.model)
    tokenizer = load_tokenizer(path, require_chat_template=conversational)
    device = resolve_device()
    # The project's loader: a damaged folder (weights, config, shapes) is one ModelLoadError line, as for causal LMs.
    model = from_pretrained(AutoModelForSequenceClassification, path, "sequence classifier", num_labels=1,
                            dtype=resolve_dtype("auto", device, for_training=True))
    check_weights_finite(model, config.model)
    model.config.pad_token_id = tokenizer.pad_token_id  # the score is read at the last non-padding token
    return model.to(device), tokenizer


def peft_config_for(config: RewardModelConfig):
    from agentic_rl.train.grpo_trainer import peft_config_for as lora_config

    return lora_config(config, task_type="SEQ_CLS", modules_to_save=["score"])  # the score head trains in full


def trainer_arguments(config: RewardModelConfig, out: Path, report_to: list[str]):
    import trl

    gpu = has_gpu()
    return trl.RewardConfig(
        output_dir=str(out / "checkpoints"), seed=config.seed, max_steps=config.max_steps,
        num_train_epochs=config.epochs, per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps, learning_rate=config.learning_rate,
        lr_scheduler_type="linear", warmup_steps=config.warmup_ratio,  # a float < 1 is a share of the steps
        weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm, max_length=config.max_length,
        center_rewards_coefficient=config.center_rewards_coefficient, logging_steps=config.logging_steps,
        save_strategy="steps", save_steps=config.save_steps, save_total_limit=config.save_total_limit,
        report_to=report_to, use_cpu=not gpu, bf16=gpu and supports_bf16(), dataloader_num_workers=0,
        # TRL turns activation checkpointing on by default: on a CPU it only costs time.
        activation_checkpointing=gpu, disable_tqdm=False,
    )


def save_reward_model(model, tokenizer, path: Path) -> Path:
    """A plain sequence-classification directory (``AutoModelForSequenceClassification.from_pretrained`` loads it)."""
    from agentic_rl.models.loading import save_model_atomically

    model.config.pad_token_id = tokenizer.pad_token_id
    return save_model_atomically(model, tokenizer, path)


# ---------------------------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------------------------

def run(config: RewardModelConfig, *, callbacks: list | None = None) -> dict[str, Any]:
    """Train the reward model; returns ``{"run_dir", "model_dir", "adapter_dir", "metrics"}``."""
    import datasets
    import trl
    from peft import PeftModel

    from agentic_rl.models.loading import count_parameters
    from agentic_rl.train.monitoring import (HealthCallback, MetricsCallback, MetricsLogger, StepCostCallback,
                                             resolve_report_to, quiet_progress)

    start = time.time()
    out = stage_path(config.output_dir, "reward-model")
    announce("reward-model", config, out)
    # A finished or interrupted run in `out` is kept unless --resume / --overwrite says what to do with it.
    stage_run = StageRun(out, config, stage="reward-model")
    checkpoint = stage_run.check()
    # Everything is validated and loaded before the run directory is touched.
    rows, conversational = load_pairs(config.dataset)
    train_rows, heldout_rows = split_pairs(rows, config)
    set_seed(config.seed)
    model, tokenizer = load_reward_base(config, conversational=conversational)
    report = resolve_report_to(config.report_to, out)  # checks the packages before anything is removed

    stage_run.claim()
    try:  # a failure before the first checkpoint leaves the directory as it was (StageRun.abandon)
        metrics_logger = MetricsLogger(out, report, config=config_to_dict(config), resume=checkpoint is not None)

        before = pairwise_accuracy(model.eval(), tokenizer, heldout_rows, batch_size=config.score_batch_size,
                                   max_length=config.max_length)
        model.train()
        health = HealthCallback()
        trainer = trl.RewardTrainer(model=model, args=trainer_arguments(config, out, ["none"]),  # via metrics_logger
                                    train_dataset=datasets.Dataset.from_list(train_rows), processing_class=tokenizer,
                                    peft_config=peft_config_for(config),
                                    callbacks=[health, MetricsCallback(metrics_logger, "reward_model"),
                                               StepCostCallback(), *(callbacks or [])])
        quiet_progress(trainer)
        n_train, n_total = count_parameters(trainer.model)
        log(f"reward model: {len(train_rows)} training pairs ({'conversational' if conversational else 'text'}), "
            f"{len(heldout_rows)} held out; {'full fine-tuning' if config.full else f'LoRA r={config.lora_r}'}, "
            f"trainable {n_train:,} of {n_total:,}; held-out pairwise accuracy before training "
            f"{before.get('pairwise_accuracy', float('nan')):.1%}")
        try:
            train_out = trainer.train(resume_from_checkpoint=checkpoint)
        finally:
            metrics_logger.close()

        # --- save: adapter (LoRA), the reward model with it merged in -----------------------------------------------
        policy = trainer.model
        adapter_dir = None
        if isinstance(policy, PeftModel):
            adapter_dir = out / "adapter"
            from agentic_rl.models.loading import save_model_atomically

            save_model_atomically(policy, tokenizer, adapter_dir)  # whole or not at all (a full disk: one line)
            policy = policy.merge_and_unload()
        model_dir = save_reward_model(policy, tokenizer, out / MODEL_FOLDER)
    except BaseException:
        stage_run.abandon()
        raise
    after = pairwise_accuracy(policy.eval(), tokenizer, heldout_rows, batch_size=config.score_batch_size,
                              max_length=config.max_length)

    history = trainer.state.log_history
    losses = [h["loss"] for h in history if "loss" in h]
    train_acc = [h["accuracy"] for h in history if "accuracy" in h]
    metrics: dict[str, Any] = {
        "eval/pairwise_accuracy": after.get("pairwise_accuracy"),
        "eval/pairwise_accuracy_start": before.get("pairwise_accuracy"),
        "eval/mean_margin": after.get("mean_margin"),
        "eval/mean_chosen": after.get("mean_chosen"),
        "eval/mean_rejected": after.get("mean_rejected"),
        "train/loss": train_out.training_loss,
        "train/first_loss": losses[0] if losses else None,
        "train/last_loss": losses[-1] if losses else None,
        "train/last_accuracy": train_acc[-1] if train_acc else None,
        "global_step": trainer.state.global_step,
        "resumed_from": checkpoint,
        "train_pairs": len(train_rows),
        "heldout_pairs": len(heldout_rows),
        "trainable_parameters": n_train,
        "total_parameters": n_total,
        "health_warnings": health.monitor.warnings,
        "wall_time_s": round(time.time() - start, 1),
    }
    write_json(out / "metrics.json", metrics)
    acc = metrics["eval/pairwise_accuracy"]
    log(f"reward model done in {metrics['wall_time_s']} s, step {metrics['global_step']}: held-out pairwise "
        f"accuracy {'n/a' if acc is None else f'{acc:.1%}'} on {len(heldout_rows)} pairs; model in {model_dir}")
    return stage_run.finish({"run_dir": str(out), "model_dir": str(model_dir),
                           "adapter_dir": str(adapter_dir) if adapter_dir else None, "metrics": metrics})

