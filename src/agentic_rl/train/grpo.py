"""GRPO: Group Relative Policy Optimization with verifiable rewards, on TRL's ``GRPOTrainer``.

Algorithm (DeepSeekMath's GRPO as TRL 1.16 implements it). For every prompt, sample a *group* of
``num_generations`` completions at ``temperature`` / ``top_p``; score each with the weighted sum of the reward
functions (``--reward accuracy:1.0 --reward format:0.2``); the advantage of completion *i* is
``r_i - mean(r_group)``, divided by the group's standard deviation when ``scale_rewards=group``. The policy loss is
PPO's clipped surrogate per token, ``-min(ρ·A, clip(ρ, 1-ε, 1+ε_high)·A)`` with ``ρ = π_θ / π_old``, plus
``β · KL(π_θ || π_ref)`` (the k3 estimator) against the starting model; ``loss_type`` picks how token losses are
averaged (``grpo``: per sequence, then over sequences; ``dapo``: over all tokens of the global batch; ``dr_grpo``: by a
constant ``max_completion_length``; ``bnpo``: over the tokens of the local batch). Each generation batch
(``generation_batch_size`` completions) is used for ``steps_per_generation`` optimizer steps, ``num_iterations``
times over.

Where this departs from the paper and from TRL's defaults (the settings the Hello-Agents book recommends):

* β = 0.05 (TRL: 0.0, no reference at all), learning rate in the 1e-6..1e-5 band for real models (a 5e-5 run
  collapsed GSM8K accuracy from 57 % to 2.4 %), temperature 0.9. ``--preset tiny`` holds the values tuned for the
  embedded 3M-parameter model on 2 CPU cores (see ``PRESETS``).
* LoRA by default (``--full`` for full fine-tuning). With LoRA the reference model is *the same network with the
  adapter disabled*: TRL's ``GRPOTrainer.__init__`` sets ``ref_model = None`` when ``is_peft_model(model)`` and
  computes the reference log-probs inside ``use_adapter(model, adapter_name=None)``, so no second copy is held.
  When the start is an SFT *adapter*, it is merged into its base first, so the reference is the SFT policy (not the
  pre-SFT base) and GRPO trains a fresh adapter on top.
* Full fine-tuning with β > 0: TRL reloads the reference from ``model.config._name_or_path``; if the starting weights
  exist only in memory (a merged SFT adapter) they are written to ``<run>/base`` first so the reference is exactly the
  starting policy.
* Sampling: ``generation_backend: trl`` is TRL's own (``model.generate`` on the padded generation batch, or vLLM);
  ``compact`` (the tiny preset's default) samples through TRL's ``rollout_func`` hook with the project's decode loop
  (:func:`agentic_rl.models.generate.generate_token_ids`: each distinct prompt prefilled once, ended completions
  dropped from the batch). TRL decodes, scores and trains on the completions either way.

In an environment (``--environment calculator``, ``self_correct`` or ``module:Class``; settings in
:class:`agentic_rl.agent.settings.EnvironmentSettings`) a completion is a whole multi-turn *episode*, played through
TRL's ``rollout_func`` hook by :func:`agentic_rl.agent.rollout.make_rollout_func`: the model writes a turn, the
environment answers (tool results, errors, feedback) as messages spliced into the token sequence with ``env_mask`` 0,
until the episode ends or ``max_completion_length`` tokens are used. The loss covers the model's tokens only
(TRL's tool mask); the reward is the episode return, the sum of the environment's step rewards; the group advantage
reaches every action token. Held-out checks play greedy episodes; ``agent/...`` metrics and ``rollouts.jsonl``
record the tool statistics. Not with an environment: ``use_vllm``, ``select_samples``, ``sft_loss_weight`` and
``--reward`` (errors say so).

``--algorithm rloo`` swaps the update for TRL's ``RLOOTrainer`` (leave-one-out baseline, KL folded into the reward;
see :mod:`agentic_rl.train.rloo`) and keeps everything else here: rewards, LoRA, monitoring and metric names, outputs.

Run it::

    agentic-rl grpo --model runs/quickstart/sft/model --reward accuracy:1.0 --reward format:0.2
    agentic-rl grpo --config configs/qwen3-0.6b-gsm8k.yaml --resume

Outputs in the run directory (``--output-dir``, default ``runs/grpo``)::

    config.yaml         the resolved config (loads back with --config)
    .agentic-rl-run     marker with the settings --resume checks (a finished run is replaced only with --overwrite)
    metrics.jsonl       one row per logged step, with the metric names below
    completions.jsonl   sample completions with each reward component and the advantage, every N steps
    heldout.jsonl       periodic greedy held-out evaluation (step, accuracy, ...)
    rollouts.jsonl      with an environment: per generation batch the tool statistics and two sample episodes
    tensorboard/        the same scalars for TensorBoard (wandb too with --report-to wandb)
    checkpoint-N/       trainer checkpoints (optimizer included) for --resume
    best/               the policy with the best held-out accuracy so far (adapter, or full model with --full)
    adapter/ model/     the final LoRA adapter and the model with it merged in (model/ is what evaluation and export
                        load)

Metrics (TRL's raw name -> ours; anything else TRL logs appears as ``grpo/<raw name>``):

    =====================================  ===========================  =============================================
    ours                                   TRL                          meaning
    =====================================  ===========================  =============================================
    grpo/reward                            reward                       mean weighted reward of the sampled group
    grpo/reward/<name>                     rewards/<func>/mean          mean of one reward function (unweighted)
    grpo/accuracy                          rewards/<accuracy>/mean      training accuracy of the samples
    grpo/reward_std                        reward_std                   std of the reward over the batch
    grpo/zero_std_fraction                 frac_reward_zero_std         groups with no learning signal (all equal)
    grpo/kl                                kl                           KL(π_θ || π_ref), logged when β > 0
    grpo/entropy                           entropy                      mean token entropy of the policy
    grpo/clip_ratio                        clip_ratio/region_mean       fraction of tokens clipped by ε
    grpo/completion_length                 completions/mean_length      mean completion length (tokens)
    grpo/truncated_fraction                completions/clipped_ratio    completions cut at max_completion_length
    train/loss, train/grad_norm,           loss, grad_norm,             optimizer quantities
    train/learning_rate                    learning_rate
    perf/step_time_s                       step_time                    wall time of one optimizer step
    perf/generation_s                      (ours)                       of it, seconds spent generating the batch
    grpo/signal/dropped_group_fraction     (ours, refill_max_draws)     groups of the first draw whose rewards tie
    grpo/signal/refill_draws               (ours)                       extra generation rounds to replace them
    grpo/signal/final_zero_std_fraction    (ours)                       groups without signal left in the batch
    grpo/signal/sft_loss                   (ours, sft_loss_weight)      demonstrations' NLL added to the loss
    eval/accuracy, eval/format_rate,       (ours)                       greedy held-out evaluation every N steps
    eval/avg_tokens, eval/avg_reward                                    (strict accuracy, as the final evaluation)
    agent/accuracy, agent/tool_call_rate,  (ours, environment)          per generation batch of episodes: correct,
    agent/tool_error_rate, agent/return,                                with a valid call, errors / calls, return,
    agent/turns_per_episode, agent/<own>                                turns, the environment's own numbers
    =====================================  ===========================  =============================================

Live warnings (the Hello-Agents book's rules): KL > ``kl_high`` (0.5: drifting, raise β or lower the learning rate), KL <
``kl_low`` (0.001) after ``kl_warmup_steps`` (not learning), and the mean reward falling to less than half of its best
10-step moving average (collapse; ``collapse_fraction``): rules of the shared ``train.monitoring.HealthMonitor``.
Also: at least ``truncated_high`` of the completions cut at ``max_completion_length``; with an environment, the tool
error rate doubling to >= 0.2 and the tool-call rate falling below half its best.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_rl.agent.settings import EnvironmentSettings
from agentic_rl.config import (SEED_RANGE, check_range, check_retired_value, config_to_dict, format_config,
                               report_to_list, save_config, setting)
from agentic_rl.errors import ConfigError
from agentic_rl.eval.validation import SYNTHETIC_TRAIN_ROWS_AFTER_CARVING
from agentic_rl.models.fingerprint import weights_fingerprint, write_base_fingerprint
from agentic_rl.runs import MODEL_FOLDER, check_stage_dir, claim_stage_dir, stage_path
from agentic_rl.train.logprobs import labelled_positions_only
from agentic_rl.train.signal import check_signal_settings
from agentic_rl.utils import (append_jsonl, default_mixed_precision, has_gpu, log, read_jsonl, set_seed, warn,
                              world_size, write_json)

SYNTHETIC_TEST_GUARD = 2000
LOSS_TYPES = ["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo"]
SCALE_REWARDS = ["group", "batch", "none"]
#: What a run writes into its directory; an earlier run's copies are removed when a new run (not --resume) starts.
GRPO_OUTPUTS = ("checkpoint-*", "best", "base", "adapter", MODEL_FOLDER, "completions.jsonl", "heldout.jsonl",
                "metrics.jsonl", "result.json", "trainable_parameters.txt", "tensorboard", "difficulty.json",
                "rollouts.jsonl")
GENERATION_BACKENDS = ["trl", "compact"]
# TRL generation settings the compact decode loop does not apply: with any of them TRL must generate itself.
_TRL_ONLY_GENERATION = ("generation_kwargs", "repetition_penalty", "min_p", "cache_implementation",
                        "use_transformers_continuous_batching", "use_transformers_paged")

#: Values a preset fills in for the fields left unset (None). ``default``: the Hello-Agents book's recommended settings for real models
#: (Qwen3-0.6B on GSM8K). ``tiny``: the embedded ~3M-parameter model on 2 CPU cores — 64 completions of <= 64
#: tokens per step (~3.5 s/step on 2 free cores, so 40 steps + 5 held-out checks fit in ~4 min); LoRA needs a high
#: rank and learning rate on so small a model. The quickstart overrides some of these (lr 1e-4, temperature 0.7,
#: 30 steps, the accuracy reward alone) — that recipe and what it measured are in ``configs/quickstart.yaml``.
#: The tiny preset samples with the compact decode loop and scores in length-sorted chunks of 8 rows
#: (`logprob_chunk_rows`, train/logprobs.py). `benchmarks/bench_grpo_step.py --steps 5 --repeats 2 --also
#: sampling-only` on the quickstart's seed-0 SFT model with its GRPO settings, 1 thread, idle 2-core machine: 2.99 s
#: of CPU per step against 4.71 s for TRL's own step (its model.generate and its passes over the padded batch):
#: 0.634x; the compact sampling alone 3.91 s (0.831x). Chunks of 16 / 32 rows: 3.17 / 3.38 s. Greedy completions of
#: the GRPO models of seeds 0/1/2 on 500 held-out problems are identical with and without the chunks. With the LM
#: head over labelled positions only as well (`labelled_positions_only`, every preset), the same benchmark a session
#: later: 3.27 s against 5.31 s (0.615x; the machine ran slower that day). TRL's other transformers options (static
#: cache, continuous batching) were slower than its default on CPU.
PRESETS: dict[str, dict[str, Any]] = {
    "default": dict(learning_rate=1e-5, full_learning_rate=3e-6, max_steps=300, num_generations=8, batch_size=16,
                    gradient_accumulation_steps=4, max_completion_length=256, temperature=0.9,
                    heldout_every=50, eval_samples=100, save_steps=50, lora_r=16, lora_alpha=32,
                    generation_backend="trl", logprob_chunk_rows=0),
    "tiny": dict(learning_rate=3e-4, full_learning_rate=3e-5, max_steps=40, num_generations=8, batch_size=64,
                 gradient_accumulation_steps=1, max_completion_length=64, temperature=1.0,
                 heldout_every=10, eval_samples=64, save_steps=20, lora_r=64, lora_alpha=128,
                 generation_backend="compact", logprob_chunk_rows=8),
}


@dataclass
class GRPOConfig(EnvironmentSettings):
    """Every setting of the GRPO stage. ``None`` means "the preset's value"; the resolved value is printed.

    The environment settings (``environment``, ``max_turns``, ...) come from :class:`EnvironmentSettings`."""

    # --- model and data -------------------------------------------------------------------------------------------
    model: str = setting("", "model to start from: an SFT output (its adapter/ or model/), a local model dir or a "
                             "hub id")
    preset: str = setting("default", "default values for unset fields: 'default' (real models, the recommended settings) or "
                     "'tiny' (the embedded model on CPU)", choices=list(PRESETS))
    dataset: str = setting("synthetic", "prompts with ground truth: 'synthetic', a hub id, or a local file/folder")
    split: str = setting("train", "dataset split used for training prompts")
    max_train_samples: int | None = setting(None, "use at most this many training prompts (default: all; the "
                                            f"synthetic task generates this many, default "
                                            f"{SYNTHETIC_TRAIN_ROWS_AFTER_CARVING})")
    synthetic_seed: int = setting(0, "seed of the synthetic task (same for all stages)")
    question_field: str | None = setting(None, "custom datasets: column holding the question")
    answer_field: str | None = setting(None, "custom datasets: column holding the reference solution")
    ground_truth_field: str | None = setting(None, "custom datasets: column holding the final answer")
    system_prompt: str | None = setting(None, "system message of every prompt: unset = the standard instruction, "
                                        "'' = none, or your own text (use the value the SFT stage used)")
    output_dir: str | None = setting(None, "run directory (default runs/grpo)")
    seed: int = setting(0, "random seed (sampling, LoRA init, data order)")
    resume: bool = setting(False, "continue from the last complete checkpoint-N in the run directory (same settings "
                           "only; max_steps may grow)")
    overwrite: bool = setting(False, "replace a finished or interrupted run in the run directory (without it, such a "
                              "directory is an error)")

    # --- what is trained ------------------------------------------------------------------------------------------
    full: bool = setting(False, "full fine-tuning instead of LoRA (this stage trains a LoRA adapter by default; with "
                         "full, the reference is a second copy of the model)")
    lora_r: int | None = setting(None, "LoRA rank")
    lora_alpha: int | None = setting(None, "LoRA alpha (scale = alpha / r)")
    lora_dropout: float = setting(0.0, "LoRA dropout")
    lora_target_modules: list[str] = setting(["all-linear"], "modules that get LoRA adapters ('all-linear' or names)")

    # --- optimisation ---------------------------------------------------------------------------------------------
    learning_rate: float | None = setting(None, "AdamW learning rate (default: preset, LoRA and full differ)")
    max_steps: int | None = setting(None, "optimizer steps")
    batch_size: int | None = setting(None, "completions per device per micro-step (TRL per_device_train_batch_size)")
    gradient_accumulation_steps: int | None = setting(None, "micro-steps per optimizer step")
    lr_scheduler_type: str = setting("constant_with_warmup", "learning-rate schedule (transformers names)")
    warmup_ratio: float = setting(0.0, "fraction of max_steps spent in linear learning-rate warm-up (0..1)")
    weight_decay: float = setting(0.0, "AdamW weight decay")
    max_grad_norm: float = setting(1.0, "gradient clipping norm")
    gradient_checkpointing: bool | None = setting(None, "recompute activations to save memory (unset: on with a GPU)")
    bf16: bool | None = setting(None, "bfloat16 mixed precision: fp32 weights, matmuls in bf16 (unset: on a GPU that "
                                      "supports it or a CPU with bf16 instructions, e.g. AVX512-BF16)")

    # --- GRPO -----------------------------------------------------------------------------------------------------
    algorithm: str = setting("grpo", "policy update: 'grpo' (TRL's GRPOTrainer) or 'rloo' (TRL's RLOOTrainer: "
                             "leave-one-out baseline, see train/rloo.py)", choices=["grpo", "rloo"])
    num_generations: int | None = setting(None, "group size G: completions sampled per prompt")
    generation_batch_size: int | None = setting(None, "completions generated at once (default: batch_size x "
                                           "gradient_accumulation_steps x devices); must be a multiple of G")
    steps_per_generation: int | None = setting(None, "optimizer micro-steps per generation batch (alternative to "
                                          "generation_batch_size)")
    beta: float = setting(0.05, "KL coefficient against the reference (starting) model; 0 disables the reference")
    epsilon: float = setting(0.2, "clipping ε (lower bound, and upper bound unless epsilon_high is set)")
    epsilon_high: float | None = setting(None, "upper clipping bound (DAPO's clip-higher suggests 0.28)")
    num_iterations: int = setting(1, "μ: optimisation passes over each generation batch")
    loss_type: str = setting("dapo", "token-loss aggregation", choices=LOSS_TYPES)
    scale_rewards: str = setting("group", "divide advantages by the group std ('group'), batch std, or not ('none', "
                            "Dr. GRPO)", choices=SCALE_REWARDS)
    mask_truncated_completions: bool = setting(False, "exclude completions cut at max_completion_length from the loss")
    temperature: float | None = setting(None, "sampling temperature")
    top_p: float = setting(1.0, "nucleus sampling p")
    top_k: int = setting(0, "top-k sampling (0 = off)")
    max_completion_length: int | None = setting(None, "maximum generated tokens per completion")
    rewards: list[str] = setting(["accuracy:1.0", "format:0.2"], "reward 'name:weight' from the registry, or "
                            "'module:function[:weight]'", flag="reward")
    use_vllm: bool = setting(False, "generate with vLLM (GPU)")
    generation_backend: str | None = setting(
        None, "how completions are sampled without vLLM: 'trl' (TRL's model.generate on a padded batch) or "
        "'compact' (the project's decode loop, which drops each completion from the batch as it ends, through "
        "TRL's rollout_func hook)", choices=GENERATION_BACKENDS)
    logprob_chunk_rows: int | None = setting(
        None, "rows per forward pass when scoring completions (the loss, the reference's and the old policy's "
        "log-probs): rows sorted by length, each pass cut to the columns its rows use, so little padding is "
        "computed (train/logprobs.py); 0 = TRL's passes over the whole padded batch")
    vllm_mode: str = setting("colocate", "vLLM integration: 'colocate' (same GPU) or 'server' (trl vllm-serve)",
                        choices=["colocate", "server"])
    vllm_gpu_memory_utilization: float = setting(0.3, "GPU memory fraction vLLM may use in colocate mode")
    trl_args: dict[str, Any] = setting({}, "YAML mapping of any other TRL GRPOConfig field, passed through as is "
                                  "(names are checked)")

    # --- learning signal (train/signal.py) ------------------------------------------------------------------------
    refill_max_draws: int = setting(0, "zero-variance groups (all rewards tie, no signal): extra generation rounds per "
                                  "batch that replace them with groups that have signal (0 = off, as TRL)")
    select_samples: int = setting(0, "difficulty selection: samples per training prompt from the starting model, at "
                                "the training temperature, to estimate its pass rate (0 = off)")
    select_candidates: int | None = setting(None, "difficulty selection: estimate at most this many training prompts "
                                            "(default: all)")
    select_pass_rate_low: float = setting(0.1, "difficulty selection: keep prompts whose pass rate is at least this")
    select_pass_rate_high: float = setting(0.9, "difficulty selection: keep prompts whose pass rate is at most this")
    sft_loss_weight: float = setting(0.0, "weight of the demonstrations' SFT loss added to the GRPO loss (0 = off)")

    # --- monitoring -----------------------------------------------------------------------------------------------
    report_to: list[str] = setting(["tensorboard"], "metric backends: tensorboard, wandb (or none)")
    logging_steps: int = setting(1, "log metrics every N optimizer steps")
    completions_every: int = setting(10, "write sample completions with their rewards every N steps (0 = never)")
    completions_per_log: int = setting(8, "sample completions written each time")
    kl_high: float = setting(0.5, "warn when KL exceeds this (drifting: raise beta or lower the learning rate)")
    kl_low: float = setting(0.001, "warn when KL stays below this after warm-up (not learning)")
    kl_warmup_steps: int = setting(10, "steps before the 'KL too low: not learning' rule applies")
    collapse_fraction: float = setting(0.5, "warn when the mean reward falls below this fraction of its best")
    truncated_high: float = setting(0.9, "warn when at least this fraction of completions is cut at "
                                    "max_completion_length")

    # --- held-out evaluation and checkpoints ---------------------------------------------------------------------
    heldout_every: int | None = setting(None, "greedy held-out evaluation every N steps (0 = off)")
    eval_samples: int | None = setting(None, "held-out problems per evaluation: the validation slice carved out of "
                                          "the training split, never trained on (with heldout_every 0 and this "
                                          "unset, none)")
    heldout_dataset: str | None = setting(None, "held-out source (default: same as dataset)")
    heldout_split: str = setting("train", "held-out split; when equal to split, held-out problems are carved out of it "
                            "(disjoint from training prompts and from the test split)")
    best_metric: str = setting("accuracy", "held-out metric that picks best/: strict 'accuracy' or the weighted "
                          "'avg_reward'", choices=["accuracy", "avg_reward"])
    select_best: bool = setting(False, "build model/ (the stage's output model) from best/ instead of the last step")
    save_steps: int | None = setting(None, "checkpoint every N steps")
    save_total_limit: int = setting(2, "checkpoints kept (the best held-out model is kept apart in best/)")

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ConfigError(f"preset must be one of {', '.join(PRESETS)}; got {self.preset!r}")
        preset = PRESETS[self.preset]
        if self.eval_samples is None and self.heldout_every == 0:
            self.eval_samples = 0  # checks off and no slice asked for: nothing is held out of training
        if self.generation_backend is None and (self.use_vllm or self.algorithm == "rloo"):
            self.generation_backend = "trl"  # vLLM / RLOO's trainer generate; the preset's choice is for GRPO
        for name, value in preset.items():
            if name in ("learning_rate", "full_learning_rate"):  # LoRA and full fine-tuning differ: below
                continue
            if getattr(self, name, None) is None and hasattr(self, name):
                setattr(self, name, value)
        if self.learning_rate is None:
            self.learning_rate = preset["full_learning_rate"] if self.full else preset["learning_rate"]
        check_retired_value("gradient_checkpointing", self.gradient_checkpointing)  # "auto" from Python
        if self.gradient_checkpointing is None:
            self.gradient_checkpointing = has_gpu()
        if self.bf16 is None:
            self.bf16 = default_mixed_precision()
        self._validate()

    def _validate(self) -> None:
        # Ranges first: the relations checked below assume each number is sane on its own.
        if not self.full:
            check_range(self, ("lora_r", "lora_alpha"), 1)
        check_range(self, ("max_steps", "batch_size", "gradient_accumulation_steps", "max_completion_length",
                           "num_iterations", "logging_steps", "save_steps", "save_total_limit", "max_train_samples",
                           "generation_batch_size", "steps_per_generation", "completions_per_log"), 1)
        check_range(self, ("heldout_every", "eval_samples"), 0)  # 0: no held-out evaluation
        check_range(self, ("completions_every", "top_k", "kl_warmup_steps", "logprob_chunk_rows"), 0)
        check_range(self, ("learning_rate", "temperature", "epsilon_high", "kl_high"), 0, low_open=True)
        check_range(self, "epsilon", 0, 1, low_open=True, high_open=True)
        check_range(self, ("beta", "weight_decay", "max_grad_norm", "kl_low"), 0)  # max_grad_norm 0: no clipping
        check_range(self, ("warmup_ratio", "collapse_fraction", "truncated_high"), 0, 1)
        check_range(self, "lora_dropout", 0, 1, high_open=True)
        check_range(self, ("top_p", "vllm_gpu_memory_utilization"), 0, 1, low_open=True)
        check_range(self, ("seed", "synthetic_seed"), *SEED_RANGE)
        if self.use_vllm and importlib.util.find_spec("vllm") is None:
            raise ConfigError("use_vllm needs vLLM, which is not installed: pip install -e '.[vllm]' (GPU), "
                              "or drop --use-vllm to generate with transformers")
        if self.num_generations < 2:
            raise ConfigError(f"num_generations ({self.num_generations}) must be >= 2: advantages compare "
                              "completions of the same prompt")
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise ConfigError("set generation_batch_size or steps_per_generation, not both")
        world = world_size()
        step_batch = self.batch_size * world
        if self.generation_batch_size is not None:
            gen = self.generation_batch_size
            if gen % step_batch:
                raise ConfigError(f"generation_batch_size ({gen}) must be a multiple of batch_size x devices "
                                  f"({step_batch})")
            how = "generation_batch_size"
        else:
            spg = self.steps_per_generation or self.gradient_accumulation_steps
            gen = step_batch * spg
            how = (f"batch_size {self.batch_size} x "
                   + (f"steps_per_generation {spg}" if self.steps_per_generation else
                      f"gradient_accumulation_steps {spg}") + (f" x {world} devices" if world > 1 else ""))
        if gen % self.num_generations:
            g = self.num_generations
            raise ConfigError(
                f"num_generations ({g}) must divide the generation batch ({gen} = {how}): set batch_size to a "
                f"multiple of {g} (e.g. {g * max(1, round(self.batch_size / g))}) or num_generations to a divisor "
                f"of {gen}")
        if not self.rewards:
            raise ConfigError("at least one reward is needed, e.g. --reward accuracy:1.0")
        self.report_to = report_to_list(self.report_to)
        if self.use_vllm and not has_gpu():
            raise ConfigError("use_vllm needs a CUDA GPU; drop --use-vllm on CPU")
        check_signal_settings(self.refill_max_draws, self.select_pass_rate_low, self.select_pass_rate_high)
        check_range(self, ("select_samples", "sft_loss_weight"), 0)  # 0: off
        self.check_environment_settings()
        if self.environment is not None:
            self._validate_environment()
        check_range(self, "select_candidates", 1)
        if self.algorithm == "rloo":
            from agentic_rl.train.rloo import check_rloo_settings

            check_rloo_settings(self)
            if self.generation_backend == "compact":
                raise ConfigError("generation_backend 'compact' is GRPO's rollout hook; TRL's RLOOTrainer generates "
                                  "itself: set generation_backend: trl, or use --algorithm grpo")
        _check_trl_args(self.trl_args, self.algorithm)
        if self.generation_backend == "compact":
            if self.use_vllm:
                raise ConfigError("generation_backend 'compact' and use_vllm exclude each other: drop one")
            trl_only = [key for key in _TRL_ONLY_GENERATION if key in self.trl_args]
            if trl_only:
                raise ConfigError(f"trl_args '{trl_only[0]}' is applied by TRL's own generation only: set "
                                  "generation_backend to 'trl'")


    def _validate_environment(self) -> None:
        """What multi-turn episodes exclude: the reward is the environment's trajectory return, and the episode loop
        samples with the project's decoder (not vLLM, not single-turn pass-rate estimates or demonstrations)."""
        if list(self.rewards) != ["accuracy:1.0", "format:0.2"]:
            raise ConfigError("with an environment the reward is the episode's return (the sum of its step rewards): "
                              "set answer_reward / tool_call_reward / tool_error_reward (or the environment's own "
                              "environment_args) instead of --reward")
        if self.use_vllm:
            raise ConfigError("use_vllm does not run multi-turn episodes yet: drop --use-vllm with --environment")
        for name in ("select_samples", "sft_loss_weight"):
            if getattr(self, name):
                raise ConfigError(f"{name} works on single-turn prompts only: set it to 0 with --environment")
        if self.max_turn_tokens > self.max_completion_length:
            raise ConfigError(f"max_turn_tokens ({self.max_turn_tokens}) must not exceed max_completion_length "
                              f"({self.max_completion_length}), the budget of a whole episode")


# TRL fields this stage sets itself: passing them through trl_args would silently fight the typed field.
_OWNED_TRL_FIELDS = {
    "output_dir", "learning_rate", "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
    "num_generations", "generation_batch_size", "steps_per_generation", "beta", "epsilon", "epsilon_high",
    "num_iterations", "loss_type", "scale_rewards", "mask_truncated_completions", "temperature", "top_p", "top_k",
    "max_completion_length", "reward_weights", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "seed",
    "report_to", "logging_steps", "save_steps", "save_total_limit", "lr_scheduler_type", "warmup_steps",
    "weight_decay", "max_grad_norm", "gradient_checkpointing", "bf16",
}


def _check_trl_args(trl_args: dict[str, Any], algorithm: str = "grpo") -> None:
    if not trl_args:
        return
    from trl import GRPOConfig as TRLGRPOConfig

    config_cls = TRLGRPOConfig
    if algorithm == "rloo":
        from agentic_rl.train.rloo import trl_config_class

        config_cls = trl_config_class()
    known = {f.name for f in dataclasses.fields(config_cls)}
    for key in trl_args:
        if key not in known:
            import difflib

            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"trl_args: '{key}' is not a field of TRL's {config_cls.__name__}{hint}")
        if key in _OWNED_TRL_FIELDS:
            raise ConfigError(f"trl_args: '{key}' has its own setting in this stage; set '{key}' directly")


# ---------------------------------------------------------------------------------------------------------------
# Model, data, rewards
# ---------------------------------------------------------------------------------------------------------------

def load_policy(config: GRPOConfig, out: Path):
    """The starting policy (a plain ``PreTrainedModel``) and its tokenizer; writes nothing.

    An SFT adapter is merged into its base, so the new GRPO adapter (or full fine-tuning) starts from — and is
    KL-regularised towards — the SFT policy. Returns ``(model, tokenizer, base_dir)`` where ``base_dir`` is a
    directory holding exactly the starting weights (needed by TRL to build the reference for full fine-tuning, and
    recorded as the adapter's base): for a merged adapter ``<run>/base``, which :func:`save_start` writes once the
    run directory may be touched.
    """
    from agentic_rl.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(config.model)
    base_dir = config.model  # a directory or hub id: TRL and PEFT can reload it by name
    if hasattr(model, "merge_and_unload"):  # a PeftModel: an adapter directory was given
        model = model.merge_and_unload()
        base_dir = str(out / "base")
    model.config._name_or_path = base_dir  # TRL rebuilds the full-FT reference from here
    tokenizer.padding_side = "left"
    return model, tokenizer, base_dir


def save_start(model, tokenizer, base_dir: str, out: Path) -> None:
    """Write the merged starting weights to ``<run>/base`` when the start was an adapter (see :func:`load_policy`)."""
    if Path(base_dir) == out / "base" and not (Path(base_dir) / "config.json").is_file():
        log(f"writing the starting weights to {base_dir} (reference model / adapter base)")
        model.save_pretrained(base_dir)
        tokenizer.save_pretrained(base_dir)


def load_data(config: GRPOConfig, env: Any = None):
    """Training prompts (a ``datasets.Dataset`` of RL rows) and the held-out rows (a list, or None).

    With an environment (``env``: one instance) the prompts carry its system prompt unless ``system_prompt`` is set.

    RL rows carry ``question``, ``prompt`` (messages), ``ground_truth`` and ``full_answer``; TRL passes every
    column to the reward functions as keyword arguments. With ``heldout_split`` equal to ``split`` (the default)
    the held-out problems are carved out of the training split, disjoint from the training prompts and from the
    test split the final evaluation uses, so picking ``best/`` by them does not peek at the test set.
    """
    from agentic_rl.agent.settings import environment_system_prompt
    from agentic_rl.data import load_task_dataset, to_rl_dataset
    from agentic_rl.eval.validation import training_and_validation_rows

    system_prompt = environment_system_prompt(config.system_prompt, env)
    n_heldout = config.eval_samples or 0
    carve = n_heldout > 0 and config.heldout_split == config.split and config.heldout_dataset in (None, config.dataset)
    columns: dict[str, Any] = {"question_field": config.question_field, "answer_field": config.answer_field,
                               "ground_truth_field": config.ground_truth_field}
    extra: dict[str, Any] = {**columns, "synthetic_seed": config.synthetic_seed}
    if config.dataset.startswith("synthetic"):
        extra["synthetic_train_size"] = config.max_train_samples
        # Training questions never include any of the first SYNTHETIC_TEST_GUARD test questions (the synthetic test
        # split of any size up to that is a prefix of the same stream), whatever test size evaluation uses.
        extra["synthetic_test_size"] = SYNTHETIC_TEST_GUARD
    train_rows, held_rows = training_and_validation_rows(config.dataset, config.split, seed=config.seed,
                                                         eval_samples=n_heldout if carve else 0, **extra)
    rows = to_rl_dataset(train_rows, system_prompt).to_list()
    heldout = to_rl_dataset(held_rows, system_prompt).to_list() if carve else None
    if n_heldout and not carve:  # an explicit other source: the user's choice (the test split is warned about)
        source = config.heldout_dataset or config.dataset
        if config.heldout_split == "test":
            warn(f"heldout_split 'test': best/ and the held-out curve are chosen on the test split that the final "
                 f"evaluation reports; leave heldout_split at '{config.split}' for a validation slice of it")
        held = load_task_dataset(source, split=config.heldout_split, seed=config.seed, max_samples=n_heldout,
                                 synthetic_seed=config.synthetic_seed, **(columns if source == config.dataset else {}))
        heldout = to_rl_dataset(held, system_prompt).to_list()
    if config.max_train_samples:
        rows = rows[:config.max_train_samples]
    import datasets

    return datasets.Dataset.from_list(rows), heldout


def validation_rows(config: GRPOConfig) -> list[dict[str, Any]]:
    """The held-out problems of this config's periodic checks (its validation slice), with its prompts."""
    env = None
    if config.environment is not None:
        from agentic_rl.agent.settings import build_environment

        env = build_environment(config).example  # the instance the factory built to check the settings
    return load_data(config, env)[1] or []


def select_training_prompts(model, tokenizer, train, config: GRPOConfig):
    """Difficulty selection: the training prompts whose pass rate, estimated from ``select_samples`` samples of the
    starting policy at the training temperature, lies in the band; returns ``(dataset, record)`` where the record
    (written to ``difficulty.json``) holds the band, the counts and the histogram of estimated pass rates."""
    import datasets

    from agentic_rl.train.signal import estimate_pass_rates, log_selection, pass_rate_histogram, select_by_pass_rate

    started = time.time()
    rows = train.to_list()[: config.select_candidates or None]
    low, high = config.select_pass_rate_low, config.select_pass_rate_high
    rates = estimate_pass_rates(model, tokenizer, rows, samples=config.select_samples, temperature=config.temperature,
                                max_new_tokens=config.max_completion_length, seed=config.seed)
    kept = select_by_pass_rate(rows, rates, low, high)
    log_selection(rates, len(kept), config.select_samples, low, high)
    histogram = pass_rate_histogram(rates, config.select_samples)
    if not kept:
        raise ConfigError(f"difficulty selection kept none of {len(rows)} prompts (correct samples per prompt: "
                          f"{histogram}); widen select_pass_rate_low/high, raise select_candidates or "
                          "select_samples, or set select_samples: 0")
    record = {"candidates": len(rows), "kept": len(kept), "band": [low, high], "samples": config.select_samples,
              "histogram": histogram, "seconds": round(time.time() - started, 1)}
    return datasets.Dataset.from_list(kept), record


def demonstrations_for(train, tokenizer, config: GRPOConfig) -> list[tuple[list[int], int]]:
    """The training prompts' reference solutions as SFT demonstrations (steps first, then ``Final Answer: N``),
    tokenized for the SFT anchor loss."""
    from agentic_rl.data.custom import parse_answer_text
    from agentic_rl.data.formats import completion_message, format_solution
    from agentic_rl.train.signal import tokenize_demonstrations

    rows = []
    for row in train:
        steps, _ = parse_answer_text(str(row.get("full_answer") or ""))
        rows.append({"prompt": row["prompt"],
                     "completion": completion_message(format_solution(steps, str(row["ground_truth"])))})
    return tokenize_demonstrations(tokenizer, rows, max_length=1024)


def build_reward_functions(specs: list[str]):
    """``['accuracy:1.0', 'format:0.2']`` -> (functions, weights, names) through the rewards registry.

    The names are the functions' ``__name__`` (unique: the registry suffixes duplicates), which is what TRL logs
    them under (``rewards/<name>/mean``) and what we log as ``grpo/reward/<name>``.
    """
    from agentic_rl.rewards import build_rewards

    funcs, weights = build_rewards(list(specs))
    names = [getattr(f, "__name__", type(f).__name__) for f in funcs]
    return list(funcs), [float(w) for w in weights], names


def peft_config_for(config: Any, *, task_type: str = "CAUSAL_LM", modules_to_save: list[str] | None = None):
    """PEFT's ``LoraConfig`` from a stage config's ``lora_*`` fields (None with ``full``); the reward-model stage
    passes ``SEQ_CLS`` and its score head."""
    if config.full:
        return None
    from peft import LoraConfig

    targets: Any = config.lora_target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"
    return LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=targets, task_type=task_type, modules_to_save=modules_to_save)


def trl_arguments(config: GRPOConfig, out: Path, reward_weights: list[float]):
    """Our config -> TRL's ``GRPOConfig``: every field mapped explicitly; ``trl_args`` adds any other TRL field."""
    from trl import GRPOConfig as TRLGRPOConfig

    kwargs: dict[str, Any] = dict(
        output_dir=str(out), seed=config.seed, max_steps=config.max_steps, learning_rate=config.learning_rate,
        # Without use_cpu, several CPU processes would each train alone (no gloo process group, no gradient sync).
        use_cpu=not has_gpu(),
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        lr_scheduler_type=config.lr_scheduler_type, warmup_steps=config.warmup_ratio,  # < 1: a fraction
        weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm,
        gradient_checkpointing=config.gradient_checkpointing, bf16=config.bf16,
        num_generations=config.num_generations, generation_batch_size=config.generation_batch_size,
        steps_per_generation=config.steps_per_generation, beta=config.beta, epsilon=config.epsilon,
        epsilon_high=config.epsilon_high, num_iterations=config.num_iterations, loss_type=config.loss_type,
        scale_rewards=config.scale_rewards, mask_truncated_completions=config.mask_truncated_completions,
        temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
        max_completion_length=config.max_completion_length, reward_weights=reward_weights,
        use_vllm=config.use_vllm, vllm_mode=config.vllm_mode,
        vllm_gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        # Our logger writes TensorBoard / wandb with the documented names; TRL's own reporters stay off.
        report_to="none", logging_steps=config.logging_steps, log_completions=False,
        save_strategy="steps", save_steps=config.save_steps, save_total_limit=config.save_total_limit,
        disable_dropout=True, dataloader_num_workers=0, remove_unused_columns=False,
        chat_template_kwargs={"enable_thinking": False},
    )
    kwargs.update(config.trl_args)
    if config.algorithm == "rloo" and config.environment is None:
        from agentic_rl.train.rloo import rloo_arguments

        return rloo_arguments(kwargs)
    if config.algorithm == "rloo":  # episodes: GRPOTrainer's rollout hook; RLOO's advantage from the unscaled one
        kwargs["scale_rewards"] = "none"
    try:
        return TRLGRPOConfig(**kwargs)
    except ValueError as exc:
        raise ConfigError(f"TRL rejected the GRPO settings: {exc}") from None


# ---------------------------------------------------------------------------------------------------------------
# Monitoring: metric names, health rules, sample completions, held-out eval (the logger: train.monitoring)
# ---------------------------------------------------------------------------------------------------------------

#: TRL's GRPO keys -> ours (the trainer's shared keys are train.monitoring.TRAINER_METRIC_NAMES).
_RENAME = {
    "reward": "grpo/reward", "reward_std": "grpo/reward_std",
    "frac_reward_zero_std": "grpo/zero_std_fraction", "kl": "grpo/kl", "entropy": "grpo/entropy",
    "clip_ratio/region_mean": "grpo/clip_ratio", "clip_ratio/low_mean": "grpo/clip_ratio_low",
    "clip_ratio/high_mean": "grpo/clip_ratio_high", "completions/mean_length": "grpo/completion_length",
    "completions/clipped_ratio": "grpo/truncated_fraction", "generation_time": "perf/generation_s",
}


def rename_metrics(logs: dict[str, Any]) -> dict[str, float]:
    """TRL's log keys -> the documented ``grpo/…`` names (see the module docstring's table); nothing is dropped."""
    from agentic_rl.train.monitoring import namespace_metrics

    out: dict[str, float] = {}
    rest: dict[str, Any] = {}
    for key, value in logs.items():
        if key.startswith("rewards/") and key.count("/") == 2 and isinstance(value, (int, float)):
            _, name, stat = key.split("/")
            out[f"grpo/reward/{name}" if stat == "mean" else f"grpo/reward_{stat}/{name}"] = float(value)
            if stat == "mean" and name == "accuracy":
                out["grpo/accuracy"] = float(value)
        else:
            rest[key] = value
    return {**out, **namespace_metrics(rest, "grpo", _RENAME)}


def health_monitor(config: GRPOConfig, *, environment: bool = False):
    """The Hello-Agents book's live warnings for GRPO, as rules of the shared :class:`~agentic_rl.train.monitoring.HealthMonitor`
    (each warns once when its condition starts to hold, again only after it cleared). Rules read our metric names,
    plus ``step``. Also: most completions cut at ``max_completion_length``; with an environment, the tool error rate
    rising and the tool-call rate collapsing."""
    from agentic_rl.train.monitoring import HealthMonitor, grad_explosion, metric_rising

    def kl_high(history, logs):
        kl = logs.get("grpo/kl")
        if kl is not None and kl > config.kl_high:
            return (f"KL {kl:.3f} > {config.kl_high}: the policy is drifting from the reference; raise beta (now "
                    f"{config.beta}) or lower the learning rate (now {config.learning_rate:g})")
        return None

    def kl_low(history, logs):
        kl = logs.get("grpo/kl")
        if kl is not None and logs.get("step", 0) > config.kl_warmup_steps and kl < config.kl_low:
            return (f"KL {kl:.5f} < {config.kl_low} after {config.kl_warmup_steps} steps: the policy is barely "
                    "moving (not learning); raise the learning rate, or check that the rewards vary within groups "
                    "(grpo/zero_std_fraction)")
        return None

    # A 10-step moving average: on a tiny model the per-step reward is a mean of few successes and very noisy.
    collapse = metric_rising("grpo/reward", window=10, tolerance=1 - config.collapse_fraction, higher_is_worse=False,
                             advice="possible collapse; lower the learning rate, raise beta, or use best/")
    collapse.__name__ = "reward_collapse"

    def truncated(history, logs):
        value = logs.get("grpo/truncated_fraction")
        if value is not None and value >= config.truncated_high:
            what = "episodes" if environment else "completions"
            return (f"{value:.0%} of the {what} are cut at max_completion_length ({config.max_completion_length}): "
                    "their answers are lost; raise max_completion_length"
                    + (" or lower max_turns" if environment else " or reward shorter solutions"))
        return None

    rules = [kl_high, kl_low, collapse, truncated, grad_explosion(key="train/grad_norm")]
    if environment:
        def tool_errors_rising(history, logs):
            # The first 5 logs are the baseline: an error rate that doubles from it, and is material, is a warning.
            values = [h["agent/tool_error_rate"] for h in [*history, logs] if "agent/tool_error_rate" in h]
            if "agent/tool_error_rate" not in logs or len(values) < 10:
                return None
            first, now = sum(values[:5]) / 5, sum(values[-5:]) / 5
            if now >= 0.2 and now > 2 * first:
                return (f"agent/tool_error_rate rose to {now:.2f} (moving average of 5 logs) from {first:.2f}: the "
                        "policy is writing broken tool calls; lower the learning rate, raise beta, or set "
                        "tool_error_reward below 0")
            return None

        tool_calls_collapse = metric_rising(
            "agent/tool_call_rate", window=5, tolerance=0.5, higher_is_worse=False,
            advice="the policy is giving up its tools; check tool_call_reward, lower the learning rate, or use best/")
        tool_calls_collapse.__name__ = "tool_call_collapse"
        rules += [tool_errors_rising, tool_calls_collapse]
    return HealthMonitor(rules)


def make_monitor(config: GRPOConfig, out: Path, logger, rules, heldout, tokenizer, env_factory, base: tuple):
    """The trainer callback: renamed metrics, health rules, completions.jsonl and periodic held-out evaluation that
    keeps ``best/``; a :class:`~agentic_rl.train.monitoring.NonFiniteGuard`, so a NaN/inf loss or weights end the run
    with an error. Its state (best score and step, steps evaluated) lives on the instance; ``attach(trainer)`` gives
    it the trainer whose sample completions it writes. (The class is built here because transformers, which its
    base class needs, is imported only when training starts.)"""
    from agentic_rl.data.formats import last_message_index
    from agentic_rl.train.monitoring import NonFiniteGuard, trl_generation_log

    class GRPOMonitor(NonFiniteGuard):
        def __init__(self):
            super().__init__()
            self.trainer = None
            self.best_score, self.best_step = -math.inf, None
            self.evaluated_steps: set[int] = set()

        def attach(self, trainer) -> None:
            self.trainer = trainer

        def restore_best(self) -> None:
            """On resume: the best held-out score so far is the one ``best/`` was saved with."""
            best = _best_row(out)
            if best is not None:
                self.best_score, self.best_step = best.get(config.best_metric, best["accuracy"]), best["step"]

        def on_log(self, args, st, control, logs=None, **kwargs):
            super().on_log(args, st, control, logs=logs, **kwargs)
            if not logs or self.trainer is None:
                return
            metrics = rename_metrics(logs)
            if not metrics:
                return
            logger.log(st.global_step, metrics)
            rules.update({"step": st.global_step, **metrics}, st.global_step)
            if config.completions_every and st.global_step % config.completions_every == 0:
                self._write_completions(st.global_step)

        def _write_completions(self, step: int) -> None:
            batch = trl_generation_log(self.trainer)
            prompts, completions = list(batch["prompt"]), list(batch["completion"])
            rewards = {name: list(values) for name, values in batch["rewards"].items()}
            advantages = list(batch["advantages"])
            n = min(config.completions_per_log, len(completions))
            shown = []
            for i in range(n):
                user = last_message_index(prompts[i])  # shown: the question (last user message), else the prompt
                question = prompts[i][user].get("content", "") if user is not None else str(prompts[i])
                row = {"step": step, "prompt": question, "completion": _text(completions[i]),
                       "rewards": {k: v[i] for k, v in rewards.items() if i < len(v)},
                       "advantage": advantages[i] if i < len(advantages) else None}
                append_jsonl(out / "completions.jsonl", row)
                shown.append(f"**{row['prompt']}**\n\n```\n{row['completion']}\n```\n\nrewards {row['rewards']}")
            if shown:
                logger.text(step, "grpo/completions", "\n\n---\n\n".join(shown))

        def on_train_begin(self, args, st, control, model=None, **kwargs):
            if heldout is not None and config.heldout_every and st.global_step == 0:
                self._heldout(st.global_step, model)

        def on_step_end(self, args, st, control, model=None, **kwargs):
            super().on_step_end(args, st, control, model=model, **kwargs)
            if heldout is None or not config.heldout_every or self.problem is not None:
                return
            if st.global_step % config.heldout_every == 0 or st.global_step >= st.max_steps:
                self._heldout(st.global_step, model)

        def _heldout(self, step: int, model) -> None:
            if step in self.evaluated_steps:
                return
            self.evaluated_steps.add(step)
            start = time.time()
            metrics = evaluate_heldout(model, tokenizer, heldout, config, env_factory)
            row = {"step": step, **metrics, "seconds": round(time.time() - start, 1)}
            append_jsonl(out / "heldout.jsonl", row)
            logger.log(step, {f"eval/{k}": float(v) for k, v in metrics.items() if k != "n"})
            acc, score = metrics["accuracy"], metrics.get(config.best_metric, metrics["accuracy"])
            log(f"step {step}: held-out accuracy {acc:.1%} on {metrics['n']} problems ({row['seconds']}s)")
            if score > self.best_score:
                self.best_score, self.best_step = score, step
                save_policy(model, tokenizer, out / "best")
                write_base_fingerprint(out / "best", *base)
                write_json(out / "best" / "best.json", {"step": step, **metrics})

    return GRPOMonitor()


def _text(completion: Any) -> str:
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def evaluate_heldout(model, tokenizer, rows, config: GRPOConfig, env_factory=None) -> dict[str, Any]:
    """Greedy held-out metrics of the current policy by the one held-out scorer that ``tune`` scores trials with
    (:func:`agentic_rl.eval.validation.score_heldout`: the final evaluation's parse-and-compare; with an environment,
    greedy episodes with its tools)."""
    from agentic_rl.eval import validation

    return validation.score_heldout(model, tokenizer, rows, max_new_tokens=config.max_completion_length,
                                    rewards=list(config.rewards), env_factory=env_factory,
                                    tools_in_prompt=config.tools_in_prompt, max_turn_tokens=config.max_turn_tokens)


def compact_rollout(prompts: list[list[dict[str, str]]], trainer) -> dict[str, Any]:
    """TRL ``rollout_func`` of ``generation_backend: compact``: samples the completions of a generation batch with
    the project's decode loop (:func:`agentic_rl.models.generate.generate_token_ids`), at the trainer's temperature,
    top-p, top-k and completion length, from the prompts rendered as TRL renders them (chat template, generation
    prompt, no thinking). TRL then decodes, scores and trains on them exactly as on its own samples."""
    from agentic_rl.data.formats import render_prompt
    from agentic_rl.models.generate import generate_token_ids

    tokenizer, args = trainer.processing_class, trainer.args
    prompt_ids = [tokenizer(render_prompt(tokenizer, p, enable_thinking=False), add_special_tokens=False)["input_ids"]
                  for p in prompts]
    completion_ids = generate_token_ids(
        trainer.accelerator.unwrap_model(trainer.model), prompt_ids, max_new_tokens=args.max_completion_length,
        stop_ids=list(trainer.eos_token_ids), pad_id=tokenizer.pad_token_id, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k or 0)
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}


def episode_rollout(config: GRPOConfig, env_factory, rows: list[dict[str, Any]], out: Path):
    """TRL ``rollout_func`` of an environment run: ``num_generations`` multi-turn episodes per prompt
    (:func:`agentic_rl.agent.rollout.make_rollout_func`), tool and feedback tokens masked out of the loss, the
    episode's return as the reward; per-batch tool statistics go to the logged metrics and ``<run>/rollouts.jsonl``."""
    from agentic_rl.agent.rollout import RolloutSettings, make_rollout_func

    settings = RolloutSettings(max_turn_tokens=config.max_turn_tokens,
                               max_completion_length=config.max_completion_length,
                               tools_in_prompt=config.tools_in_prompt)
    return make_rollout_func(env_factory, rows, settings, log_path=out / "rollouts.jsonl")


def save_policy(model, tokenizer, path: Path) -> None:
    """The trainable part: the adapter for LoRA, the whole model for full fine-tuning."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))


def load_weights(policy, path: Path) -> None:
    """Load the weights saved by :func:`save_policy` in ``path`` into ``policy`` (adapter or full model)."""
    from safetensors.torch import load_file

    if (path / "adapter_model.safetensors").is_file():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(policy, load_file(str(path / "adapter_model.safetensors")))
    else:
        missing, unexpected = policy.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
        if unexpected or [m for m in missing if "lm_head" not in m]:
            raise RuntimeError(f"{path}: weights do not match the policy (missing {missing[:3]}, "
                               f"unexpected {unexpected[:3]})")


def _best_row(out: Path) -> dict[str, Any] | None:
    path = out / "best" / "best.json"
    if not path.is_file():
        return None
    from agentic_rl.utils import read_json

    return read_json(path)


# ---------------------------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------------------------

def run(config: GRPOConfig, *, callbacks: list | None = None) -> dict[str, Any]:
    """Train with GRPO; returns ``{"model_dir": <run>/model, "adapter_dir", "best_dir", "heldout", ...}``.

    ``callbacks``: extra ``TrainerCallback`` objects (hyper-parameter search uses one for pruning).
    """
    if not config.model:
        raise ConfigError("model is required: an SFT output directory, a model directory or a hub id (--model)")
    started = time.time()
    out = stage_path(config.output_dir, "grpo")
    print(format_config(config, "grpo"), flush=True)
    # A finished or interrupted run in `out` is kept unless --resume / --overwrite says what to do with it.
    checkpoint = check_stage_dir(out, config, stage="grpo", finished="result.json", checkpoints=out)
    set_seed(config.seed)

    # --- environment, model, data, rewards -------------------------------------------------------------------------
    env_factory = None
    if config.environment is not None:
        from agentic_rl.agent.settings import build_environment

        env_factory = build_environment(config)  # a bad environment or argument fails here, before any output
    model, tokenizer, base_dir = load_policy(config, out)
    train, heldout = load_data(config, env_factory.example if env_factory else None)
    if env_factory is None:
        funcs, weights, reward_names = build_reward_functions(config.rewards)
    else:  # the episode's return (sum of the environment's step rewards) is the one reward
        from agentic_rl.agent.rollout import trajectory_return_reward

        funcs, weights, reward_names = [trajectory_return_reward], [1.0], ["trajectory_return_reward"]
    demonstrations = demonstrations_for(train, tokenizer, config) if config.sft_loss_weight else None
    selection = None
    if config.select_samples:
        train, selection = select_training_prompts(model, tokenizer, train, config)

    from agentic_rl.train.monitoring import MetricsLogger, resolve_report_to

    backends = resolve_report_to(list(config.report_to), out)  # checks the packages; wandb offline without a key

    # --- only now the run directory: an earlier run's outputs go (unless resuming), this run's settings are recorded
    # (an earlier run's base/ may come from another adapter, its best/ from other settings)
    claim_stage_dir(out, config, stage="grpo", stale=GRPO_OUTPUTS, resuming=checkpoint is not None)
    save_config(config, out / "config.yaml")
    save_start(model, tokenizer, base_dir, out)
    if selection is not None:
        write_json(out / "difficulty.json", selection)
    start_fingerprint = weights_fingerprint(model)
    log(f"GRPO: {len(train)} training prompts, "
        + (f"environment {config.environment} (reward: the episode return), " if env_factory else
           f"rewards {dict(zip(reward_names, weights))}, ") +
        f"{'full fine-tuning' if config.full else f'LoRA r={config.lora_r}'}, beta={config.beta}")

    # --- trainer ---------------------------------------------------------------------------------------------------
    from agentic_rl.models.loading import count_parameters
    from agentic_rl.train.signal import make_signal_trainer_class

    logger = MetricsLogger(out, backends, config=config_to_dict(config), resume=checkpoint is not None)
    rules = health_monitor(config, environment=env_factory is not None)
    monitor = make_monitor(config, out, logger, rules, heldout, tokenizer, env_factory,
                           base=(start_fingerprint, base_dir))
    if checkpoint is not None:
        monitor.restore_best()
    trainer_kwargs = dict(model=model, reward_funcs=funcs, args=trl_arguments(config, out, weights),
                          train_dataset=train, processing_class=tokenizer, peft_config=peft_config_for(config),
                          callbacks=[monitor, *(callbacks or [])], logprob_chunk_rows=config.logprob_chunk_rows)
    rollout_func = None
    if env_factory is not None:
        rollout_func = episode_rollout(config, env_factory, train.to_list(), out)
    elif config.generation_backend == "compact" and config.algorithm == "grpo":
        rollout_func = compact_rollout
    if rollout_func is not None:
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL 1.16
    if config.algorithm == "rloo":  # refill, the SFT anchor and compact sampling are GRPO-only (the config refuses)
        from agentic_rl.train.rloo import make_rloo_rollout_trainer_class, trainer_class

        if rollout_func is None:
            trainer = trainer_class()(**trainer_kwargs)
        else:  # TRL's RLOOTrainer has no rollout hook: GRPOTrainer's episodes with RLOOTrainer's update
            trainer = make_rloo_rollout_trainer_class()(**trainer_kwargs, rollout_func=rollout_func)
    else:
        trainer = make_signal_trainer_class()(
            **trainer_kwargs, refill_max_draws=config.refill_max_draws, sft_loss_weight=config.sft_loss_weight,
            sft_demonstrations=demonstrations, seed=config.seed, rollout_func=rollout_func)
    monitor.attach(trainer)
    trainable_names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    (out / "trainable_parameters.txt").write_text("\n".join(trainable_names) + "\n")
    trainable, total = count_parameters(trainer.model)
    log(f"trainable parameters: {trainable:,} of {total:,} ({trainable / total:.2%}), names in "
        f"{out / 'trainable_parameters.txt'}")

    try:
        with labelled_positions_only():  # log-probs through the LM head for completion tokens only
            train_result = trainer.train(resume_from_checkpoint=checkpoint)
    finally:
        logger.close()

    # --- save: adapter, model (adapter merged in) --------------------------------------------------------------------
    policy = trainer.model
    if config.select_best and monitor.best_step not in (None, trainer.state.global_step):
        log(f"select_best: building model/ from best/ (step {monitor.best_step}, held-out {config.best_metric} "
            f"{monitor.best_score:.3f})")
        load_weights(policy, out / "best")
    adapter_dir = None
    if not config.full:
        adapter_dir = out / "adapter"
        save_policy(policy, tokenizer, adapter_dir)
        write_base_fingerprint(adapter_dir, start_fingerprint, base_dir)
        policy = policy.merge_and_unload()
    model_dir = out / MODEL_FOLDER
    policy.config._name_or_path = str(model_dir)
    from agentic_rl.models import save_model_dir  # model + tokenizer + generation config, plain from_pretrained

    save_model_dir(policy, tokenizer, model_dir)

    heldout_rows = read_jsonl(out / "heldout.jsonl")
    result = {
        "model_dir": str(model_dir),
        "adapter_dir": str(adapter_dir) if adapter_dir else None,
        "base_dir": base_dir,
        "best_dir": str(out / "best") if (out / "best").is_dir() else None,
        "best_heldout": _best_row(out),
        "best_step": monitor.best_step,
        "heldout": heldout_rows,
        "train_metrics": {k: v for k, v in train_result.metrics.items() if isinstance(v, (int, float))},
        "warnings": rules.warnings,
        "trainable_parameters": trainable,
        "resumed_from": checkpoint,
        "difficulty_selection": selection,
        "steps": trainer.state.global_step,
        "wall_time_s": round(time.time() - started, 1),
        # seconds spent generating training batches (this run's part when resumed; None: not timed, e.g. RLOO)
        "generation_seconds": (round(trainer.generation_seconds, 1) if hasattr(trainer, "generation_seconds")
                               else None),
        "heldout_seconds": round(sum(r.get("seconds", 0.0) for r in heldout_rows), 1),
    }
    write_json(out / "result.json", result)
    log(f"GRPO done in {result['wall_time_s']:.0f}s: model in {model_dir}")
    return result


if __name__ == "__main__":  # pragma: no cover
    import sys

    from agentic_rl.cli import main

    sys.exit(main(["grpo", *sys.argv[1:]]))
