"""The GRPO stage: Group Relative Policy Optimization with verifiable rewards, on TRL's ``GRPOTrainer``.

This module reads top to bottom: the stage's settings (:class:`GRPOConfig`), its data (:func:`load_data`, the
rewards), then :func:`run`, which builds the trainer and trains. The trainer classes, the table that picks one, what
they compute and the metrics they log are in :mod:`agentic_rl.train.grpo_trainer`; RLOO's settings in
:mod:`agentic_rl.train.rloo`; difficulty selection, refill and the SFT anchor in :mod:`agentic_rl.train.signal`.

The settings the Hello-Agents book recommends, where they depart from TRL's defaults: β = 0.05 against the starting
model (TRL: 0, no reference), a learning rate in the 1e-6..1e-5 band for real models, temperature 0.9; ``--preset
tiny`` holds the values for the embedded model on CPU (``PRESETS``). LoRA by default (``--full`` for full
fine-tuning): the reference is the same network with the adapter disabled. A start that is an SFT *adapter* is merged
into its base first, so the reference is the SFT policy and GRPO trains a fresh adapter on top; for full fine-tuning
those merged weights are written to ``<run>/base``, from which TRL reloads the reference. With ``--environment`` a
completion is a whole multi-turn episode (settings in :class:`agentic_rl.agent.settings.EnvironmentSettings`), its
return the one reward (``credit_assignment: turn``: each turn trained on its own return-to-go,
:mod:`agentic_rl.train.credit`); ``use_vllm`` and ``--reward`` do not apply, ``select_samples`` estimates pass rates
from sampled episodes, and the SFT anchor (``sft_loss_weight``) trains on whole demonstration episodes.

Run it::

    agentic-rl grpo --model runs/quickstart/sft/model --reward accuracy:1.0 --reward format:0.2
    agentic-rl grpo --config configs/qwen3-0.6b-gsm8k.yaml --resume

Outputs in the run directory (``--output-dir``, default ``runs/grpo``)::

    config.yaml         the resolved config (loads back with --config)
    .agentic-rl-run     marker with the settings --resume checks (a finished run is replaced only with --overwrite)
    metrics.jsonl       one row per logged step (metric names: agentic_rl.train.grpo_trainer)
    completions.jsonl   sample completions with each reward component and the advantage, every N steps
    heldout.jsonl       periodic greedy held-out evaluation (step, accuracy, ...)
    rollouts.jsonl      with an environment: per generation batch the tool statistics and two sample episodes
    tensorboard/        the same scalars for TensorBoard (wandb too with --report-to wandb)
    checkpoint-N/       trainer checkpoints (optimizer included) for --resume
    best/               the policy with the best held-out accuracy so far (adapter, or full model with --full)
    adapter/ model/     the final LoRA adapter and the model with it merged in (model/: what evaluation and export load)
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from typing import Any

from agentic_rl.agent.settings import EnvironmentSettings
from agentic_rl.config import SEED_RANGE, check_range, config_to_dict, report_to_list, setting
from agentic_rl.console import announce
from agentic_rl.errors import ConfigError
from agentic_rl.eval.validation import SYNTHETIC_TRAIN_ROWS_AFTER_CARVING
from agentic_rl.models.fingerprint import weights_fingerprint
from agentic_rl.runs import StageRun, stage_path
from agentic_rl.train.credit import CREDIT_ASSIGNMENTS, check_credit_settings
from agentic_rl.train.logprobs import labelled_positions_only
from agentic_rl.train.signal import check_signal_settings, demonstrations_for, select_training_prompts
from agentic_rl.utils import default_mixed_precision, has_gpu, log, read_jsonl, set_seed, warn, world_size, write_json

SYNTHETIC_TEST_GUARD = 2000
LOSS_TYPES = ["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo"]
SCALE_REWARDS = ["group", "batch", "none"]
GENERATION_BACKENDS = ["trl", "compact"]
#: Values a preset fills in for the fields left unset (None). ``default``: the Hello-Agents book's recommended
#: settings for real models (Qwen3-0.6B on GSM8K). ``tiny``: the embedded ~3M-parameter model on 2 CPU cores (64
#: completions of <= 64 tokens per step; LoRA needs a high rank and learning rate on so small a model), sampled with
#: the compact decode loop and scored in length-sorted chunks of 8 rows (``logprob_chunk_rows``, train/logprobs.py).
#: The quickstart overrides some of these in ``configs/quickstart.yaml``.
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
    """Every setting of the GRPO stage. ``None`` means "the preset's value"; the resolved value is in ``config.yaml``.

    The environment settings (``environment``, ``max_turns``, ...) come from :class:`EnvironmentSettings`."""

    # --- model and data -------------------------------------------------------------------------------------------
    model: str = setting("", "model to start from: an SFT output (its adapter/ or model/), a local model dir or a "
                             "hub id")
    preset: str = setting("default", "default values for unset fields: 'default' (real models, the recommended "
                          "settings) or 'tiny' (the embedded model on CPU)", choices=list(PRESETS))
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
    steps_per_generation: int | None = setting(None, "optimizer micro-steps per generation batch (or set that size)")
    beta: float = setting(0.05, "KL coefficient against the reference (starting) model; 0 disables the reference")
    epsilon: float = setting(0.2, "clipping ε (lower bound, and upper bound unless epsilon_high is set)")
    epsilon_high: float | None = setting(None, "upper clipping bound (DAPO's clip-higher suggests 0.28)")
    num_iterations: int = setting(1, "μ: optimisation passes over each generation batch")
    loss_type: str = setting("dapo", "token-loss aggregation", choices=LOSS_TYPES)
    scale_rewards: str = setting("group", "divide advantages by the group std ('group'), batch std, or not ('none', "
                            "Dr. GRPO)", choices=SCALE_REWARDS)
    credit_assignment: str = setting("trajectory", "with an environment: 'trajectory' (every turn gets the episode's "
                                     "advantage) or 'turn' (each turn's tokens get the group-normalised advantage of "
                                     "its return-to-go, train/credit.py)", choices=CREDIT_ASSIGNMENTS)
    turn_discount: float = setting(1.0, "γ of the return-to-go with credit_assignment 'turn' (0..1)")
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
    select_samples: int = setting(0, "difficulty selection: samples (episodes in an environment) per training prompt "
                                "from the starting model at the training temperature: its pass rate (0 = off)")
    select_candidates: int | None = setting(None, "difficulty selection: estimate at most this many training prompts "
                                            "(default: all)")
    select_pass_rate_low: float = setting(0.1, "difficulty selection: keep prompts whose pass rate is at least this")
    select_pass_rate_high: float = setting(0.9, "difficulty selection: keep prompts whose pass rate is at most this")
    sft_loss_weight: float = setting(0.0, "weight of the demonstrations' SFT loss added to the GRPO loss (0 = off)")
    sft_anchor_run: str | None = setting(None, "with sft_loss_weight: the SFT run folder whose demonstrations the "
                                         "anchor trains on (a pipeline: its sft stage); unset: reference solutions")
    tied_failure_weight: float = setting(0.0, "with an environment: groups whose episodes all fail alike get this x "
                                         "their batch-normalised reward as advantage, not 0 (0 = off, as TRL)")
    retry_groups: bool = setting(False, "answer_attempts >= 2: groups all wrong at first go on from one wrong answer")
    skip_zero_advantage_rows: bool = setting(True, "leave completions with all-zero advantages out of the loss pass "
                                             "where no gradient changes (beta 0, loss dapo/cispo/vespo, 1 process)")

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
        from agentic_rl.rewards.registry import check_reward_specs

        check_reward_specs(self.rewards)  # a misspelt name fails here, before any model or data loads
        self.report_to = report_to_list(self.report_to)
        if self.use_vllm and not has_gpu():
            raise ConfigError("use_vllm needs a CUDA GPU; drop --use-vllm on CPU")
        check_signal_settings(self)
        self.check_environment_settings()
        if self.environment is not None:
            self._validate_environment()
        check_range(self, "select_candidates", 1)
        check_credit_settings(self)
        if self.algorithm == "rloo":
            from agentic_rl.train.rloo import check_rloo_settings

            check_rloo_settings(self)
            if self.generation_backend == "compact":
                raise ConfigError("generation_backend 'compact' is GRPO's rollout hook; TRL's RLOOTrainer generates "
                                  "itself: set generation_backend: trl, or use --algorithm grpo")
        if self.trl_args:  # the TRL config class the run uses (RLOO's, GRPO's) has these fields, and they are free
            from agentic_rl.train.grpo_trainer import check_trl_args

            check_trl_args(self)
        if self.generation_backend == "compact" and self.use_vllm:
            raise ConfigError("generation_backend 'compact' and use_vllm exclude each other: drop one")

    def _validate_environment(self) -> None:
        """What multi-turn episodes exclude: the reward is the environment's trajectory return, and the episode loop
        samples with the project's decoder (not vLLM, not single-turn pass-rate estimates or demonstrations)."""
        if list(self.rewards) != ["accuracy:1.0", "format:0.2"]:
            raise ConfigError("with an environment the reward is the episode's return (the sum of its step rewards): "
                              "set answer_reward / tool_call_reward / tool_error_reward (or the environment's own "
                              "environment_args) instead of --reward")
        if self.use_vllm:
            raise ConfigError("use_vllm does not run multi-turn episodes yet: drop --use-vllm with --environment")
        if self.max_turn_tokens > self.max_completion_length:
            raise ConfigError(f"max_turn_tokens ({self.max_turn_tokens}) must not exceed max_completion_length "
                              f"({self.max_completion_length}), the budget of a whole episode")


# ---------------------------------------------------------------------------------------------------------------
# Model, data, rewards
# ---------------------------------------------------------------------------------------------------------------

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
    text_answers = config.answers_are_text()
    extra: dict[str, Any] = {**columns, "synthetic_seed": config.synthetic_seed, "text_answers": text_answers}
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
                                 synthetic_seed=config.synthetic_seed, text_answers=text_answers,
                                 **(columns if source == config.dataset else {}))
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


def build_reward_functions(specs: list[str]):
    """``['accuracy:1.0', 'format:0.2']`` -> (functions, weights, names) through the rewards registry.

    The names are the functions' ``__name__`` (unique: the registry suffixes duplicates), which is what TRL logs
    them under (``rewards/<name>/mean``) and what we log as ``grpo/reward/<name>``.
    """
    from agentic_rl.rewards import build_rewards

    funcs, weights = build_rewards(list(specs))
    names = [getattr(f, "__name__", type(f).__name__) for f in funcs]
    return list(funcs), [float(w) for w in weights], names


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
    from agentic_rl.train.grpo_trainer import (GRPOMonitor, best_row, build_trainer, health_monitor, load_policy,
                                               peft_config_for, record_trainable_parameters, save_final_policy,
                                               save_start, trl_arguments)

    out = stage_path(config.output_dir, "grpo")
    announce("grpo", config, out)
    # A finished or interrupted run in `out` is kept unless --resume / --overwrite says what to do with it.
    stage_run = StageRun(out, config, stage="grpo")
    checkpoint = stage_run.check()
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
    demonstrations = demonstrations_for(train, tokenizer, config, env_factory) if config.sft_loss_weight else None
    selection = None
    if config.select_samples:
        train, selection = select_training_prompts(model, tokenizer, train, config, env_factory)

    from agentic_rl.train.monitoring import MetricsLogger, StepCostCallback, resolve_report_to

    backends = resolve_report_to(list(config.report_to), out)  # checks the packages; wandb offline without a key

    # --- only now the run directory: an earlier run's outputs go (unless resuming), this run's settings are recorded
    # (an earlier run's base/ may come from another adapter, its best/ from other settings)
    stage_run.claim()
    try:  # a failure before the first checkpoint leaves the directory as it was (StageRun.abandon)
        save_start(model, tokenizer, base_dir, out)
        if selection is not None:
            write_json(out / "difficulty.json", selection)
        start_fingerprint = weights_fingerprint(model)
        log(f"GRPO: {len(train)} training prompts, "
            + (f"environment {config.environment} (reward: the episode return), " if env_factory else
               f"rewards {dict(zip(reward_names, weights))}, ") +
            f"{'full fine-tuning' if config.full else f'LoRA r={config.lora_r}'}, beta={config.beta}")

        # --- trainer: the variant (refill, SFT anchor, compact sampling, RLOO, episodes) from grpo_trainer.VARIANTS ---
        logger = MetricsLogger(out, backends, config=config_to_dict(config), resume=checkpoint is not None)
        rules = health_monitor(config, environment=env_factory is not None)
        base = (start_fingerprint, base_dir)  # recorded with best/ and adapter/
        monitor = GRPOMonitor(config, out, logger, rules, heldout, tokenizer, env_factory, base)
        if checkpoint is not None:
            monitor.restore_best()
        trainer = build_trainer(config, env_factory=env_factory, out=out, demonstrations=demonstrations, model=model,
                                reward_funcs=funcs, args=trl_arguments(config, out, weights), train_dataset=train,
                                processing_class=tokenizer, peft_config=peft_config_for(config),
                                callbacks=[monitor, StepCostCallback(), *(callbacks or [])],
                                logprob_chunk_rows=config.logprob_chunk_rows)
        monitor.attach(trainer)
        trainable = record_trainable_parameters(trainer.model, out / "trainable_parameters.txt")

        try:
            with labelled_positions_only():  # log-probs through the LM head for completion tokens only
                train_result = trainer.train(resume_from_checkpoint=checkpoint)
        finally:
            logger.close()

        # --- save: adapter, model (adapter merged in) ----------------------------------------------------------------
        model_dir, adapter_dir = save_final_policy(trainer, monitor, tokenizer, out, base)
    except BaseException:
        stage_run.abandon()
        raise
    heldout_rows = read_jsonl(out / "heldout.jsonl")
    result = {
        "model_dir": str(model_dir),
        "adapter_dir": str(adapter_dir) if adapter_dir else None,
        "base_dir": base_dir,
        "best_dir": str(out / "best") if (out / "best").is_dir() else None,
        "best_heldout": best_row(out),
        "best_step": monitor.best_step, "heldout": heldout_rows,
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
    return stage_run.finish(result)

