"""Stage 2: supervised fine-tuning on worked solutions, with LoRA by default, using TRL's ``SFTTrainer``.

Algorithm:

1. Data: task rows (``data.load_task_dataset``: the synthetic task, GSM8K, or a custom dataset) become
   conversational prompt-completion rows (``data.to_sft_dataset``): the prompt is the shared system + user messages
   (``data.formats.build_prompt``), the completion one assistant message ``step\\nstep\\nFinal Answer: N``.
   Imperfect demonstrations on request: ``answer_only_fraction`` of them keep only the final-answer line,
   ``answer_first_fraction`` state the final answer before the steps.
2. Tokenization (TRL): the prompt with the chat template's generation prompt, then prompt + completion; the loss
   covers the completion tokens only, including the template's end-of-turn token ``<|im_end|>`` (the EOS), so the
   model learns to stop. With ``max_steps`` set, only the rows those steps reach are tokenized (a seeded random
   subset, :func:`rows_reached`). Batches are padded to their longest row. Two ways to compute less padding:
   ``micro_batches`` splits each optimizer step's rows (the same rows as without it) into forward passes over rows
   of similar length (:func:`length_sorted_steps`) — the loss is normalised over the whole step's tokens, so the
   gradient is the same; ``group_by_length`` batches rows of similar length, in random batch order
   (:func:`length_bucketed_order`) — other batches, so other training.
3. Model: any causal LM (``models.load_model_and_tokenizer``). LoRA (rank ``lora_r``, scale ``lora_alpha``/r,
   dropout, on q/k/v/o projections, optionally the MLP's gate/up/down) unless ``full`` is set.
4. Optimisation: AdamW, linear warm-up over the first ``warmup_ratio`` of the steps, then linear decay to 0 (the
   Hello-Agents book's schedule). Loss, gradient norm and learning rate go to ``metrics.jsonl``
   (``train/loss``, ``sft/mean_token_accuracy``, ...) and TensorBoard (``<run>/tensorboard``) or wandb; the health
   rules of ``train.monitoring`` print live warnings.
5. Output in the run directory: ``checkpoints/`` (for ``--resume``), ``adapter/`` (LoRA weights + tokenizer),
   ``model/`` (the adapter merged in with ``merge_and_unload``: a plain model directory later stages and export start
   from), ``config.yaml``,
   ``metrics.json`` (final numbers) and ``metrics.jsonl`` (every logged step), the marker ``.agentic-rl-run`` with
   the settings ``--resume`` checks and, once finished, ``stage.json`` (a finished run is replaced only with
   ``--overwrite``; :class:`agentic_rl.runs.StageRun`); a LoRA adapter records its base in ``base_fingerprint.json``.

In an environment (``--environment``, :class:`agentic_rl.agent.settings.EnvironmentSettings`) the rows become
whole demonstration episodes (:func:`build_environment_dataset`): the environment's ``demonstration(task)`` (the
calculator replays the reference solution's annotated steps as tool calls), tokenized exactly as a rollout splices
them, with labels -100 on the prompt, on tool and feedback messages and on turns the environment marks untrained;
``direct_fraction`` of the rows without the environment, ``skip_tool_fraction`` answered directly under its prompt;
rows the environment does not demonstrate (``env.demonstrates(task)``) are left out.

Device defaults: ``use_cpu`` without a GPU; bf16 mixed precision (fp32 weights, bf16 matmuls) on a GPU that supports
it and on a CPU with bf16 instructions (AVX512-BF16, AMX-BF16: 3-4x the fp32 matmul rate there), fp32 elsewhere;
activation checkpointing on a GPU for models above 100M parameters. The resolved settings are printed.

Run: ``agentic-rl sft --model embedded --output-dir runs/sft`` (add ``--full`` for full fine-tuning,
``--resume`` to continue an interrupted run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_rl.agent.settings import EnvironmentSettings
from agentic_rl.config import SEED_RANGE, changed_from_default, check_range, config_to_dict, report_to_list, setting
from agentic_rl.console import announce
from agentic_rl.data.synthetic import SYNTHETIC_TEST_SIZE
from agentic_rl.errors import ConfigError
from agentic_rl.runs import MODEL_FOLDER, StageRun, stage_path
from agentic_rl.train.logprobs import labelled_positions_only
from agentic_rl.utils import (default_mixed_precision, has_gpu, log, set_seed, supports_bf16, warn, world_size,
                              write_json)

ATTENTION_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP_TARGETS = ["gate_proj", "up_proj", "down_proj"]
#: SFT's synthetic train split: all of it is trained on when max_train_samples is unset, and a smaller
#: max_train_samples is drawn from it with the seed, so that each seed demonstrates other problems (GRPO's split is
#: another: :data:`agentic_rl.eval.validation.SYNTHETIC_TRAIN_ROWS_AFTER_CARVING`).
SFT_SYNTHETIC_TRAIN_ROWS = 5000


@dataclass
class SFTConfig(EnvironmentSettings):
    """Every setting of the SFT stage (the environment settings come from :class:`EnvironmentSettings`)."""

    model: str = setting("embedded", "base model: Hub id, local directory (a model or a PEFT adapter directory), "
                                     "or 'embedded' (the tiny base shipped with the package)")
    dataset: str = setting("synthetic", "task data: synthetic, gsm8k, a Hub id, a local file/folder, or a registered "
                                        "name")
    split: str = setting("train", "dataset split to train on")
    question_field: str | None = setting(None, "custom datasets: column holding the question")
    answer_field: str | None = setting(None, "custom datasets: column holding the reference solution (steps and a "
                                             "final '#### N' or number)")
    ground_truth_field: str | None = setting(None, "custom datasets: column holding the final answer")
    max_train_samples: int | None = setting(None, "use at most N training rows, drawn with the seed; the synthetic "
                                            f"task draws them from its {SFT_SYNTHETIC_TRAIN_ROWS}-row split, or "
                                            "generates N when more")
    eval_samples: int = setting(0, "held-out problems carved out of the training split (seeded) as a validation "
                                   "slice, never trained on; tune scores its trials on them (0 = none)")
    synthetic_test_size: int = setting(SYNTHETIC_TEST_SIZE, "rows in the synthetic test split (kept out of training; "
                                                            "match the evaluation's)")
    synthetic_seed: int = setting(0, "seed of the synthetic task (same for all stages)")
    output_dir: str | None = setting(None, "run directory (default runs/sft)")
    seed: int = setting(0, "random seed (sampling, LoRA init, data order)")
    full: bool = setting(False, "full fine-tuning instead of LoRA (this stage trains a LoRA adapter by default)")
    lora_r: int = setting(8, "LoRA rank")
    lora_alpha: int = setting(16, "LoRA alpha (the update is scaled by alpha / r)")
    lora_dropout: float = setting(0.05, "dropout on the LoRA input")
    lora_target_modules: list[str] = setting(list(ATTENTION_TARGETS), "modules that get LoRA adapters (comma list)")
    lora_mlp: bool = setting(False, "also adapt the MLP (gate_proj, up_proj, down_proj)")
    learning_rate: float = setting(2e-4, "peak learning rate")
    epochs: float = setting(1.0, "passes over the data (when max_steps is -1)")
    max_steps: int = setting(-1, "optimizer steps; -1: use epochs")
    batch_size: int = setting(16, "rows per device per forward pass")
    gradient_accumulation_steps: int = setting(1, "micro-steps per optimizer step")
    warmup_ratio: float = setting(0.1, "share of steps for linear warm-up")
    lr_scheduler_type: str = setting("linear", "decay after warm-up (linear to 0 is the Hello-Agents book's schedule)",
                                               choices=["linear", "cosine", "constant_with_warmup"])
    weight_decay: float = setting(0.0, "AdamW weight decay")
    max_grad_norm: float = setting(1.0, "gradient clipping norm")
    max_length: int = setting(512, "truncate prompt + completion to N tokens")
    micro_batches: int = setting(1, "forward passes per batch: each optimizer step's rows (the same as with 1) are "
                                    "sorted by length and split into this many passes, so less padding is computed; "
                                    "the loss is normalised over the whole step, so the gradient is the same "
                                    "(batch_size must be a multiple)")
    group_by_length: bool = setting(False, "batch rows of similar length together, the batches in random order: "
                                           "less padding, so faster steps when row lengths vary (other batches "
                                           "than random order: see micro_batches for the same batches)")
    answer_only_fraction: float = setting(0.0, "share of demonstrations showing only the final answer, no steps "
                                               "(imperfect demonstrations)")
    answer_first_fraction: float = setting(0.0, "share of demonstrations stating the final answer first, then the "
                                                "steps (imperfect demonstrations)")
    direct_fraction: float = setting(0.25, "environment: share of rows shown without the environment (standard "
                                           "prompt, no tools, the worked solution), so the model can also be "
                                           "evaluated without tools")
    skip_tool_fraction: float = setting(0.0, "environment: share of rows shown under the environment's prompt that "
                                             "answer directly without a tool call (imperfect demonstrations, so RL "
                                             "has a tool-call rate to raise); disjoint from direct_fraction")
    system_prompt: str | None = setting(None, "system message of every prompt: unset = the standard instruction, '' = "
                                              "none, or your own text (same for SFT, GRPO, eval)")
    enable_thinking: bool = setting(False, "Qwen3 thinking blocks in the chat template")
    dtype: str = setting("auto", "weights dtype: auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16")
    gradient_checkpointing: bool | None = setting(None, "recompute activations to save memory (unset: on for GPU "
                                                        "models > 100M parameters)")
    bf16: bool | None = setting(None, "bfloat16 mixed precision: weights stay in dtype, matmuls run in bf16 (unset: "
                                      "on with weights dtype auto or bfloat16 on a GPU that supports it or a CPU "
                                      "with bf16 instructions, e.g. AVX512-BF16)")
    report_to: list[str] = setting(["tensorboard"], "metric backends: tensorboard, wandb (offline works), none (comma "
                                                    "list)")
    logging_steps: int = setting(10, "log loss / grad norm / lr every N steps")
    save_steps: int = setting(100, "checkpoint every N steps (for --resume)")
    save_total_limit: int = setting(2, "keep at most N checkpoints")
    resume: bool = setting(False, "continue from the last complete checkpoint in the run directory (same settings "
                                  "only; max_steps and epochs may grow)")
    overwrite: bool = setting(False, "replace a finished or interrupted run in the run directory (without it, such a "
                                     "directory is an error)")
    merge: bool = setting(True, "also save the model with the LoRA adapter merged in (<run>/model)")
    trust_remote_code: bool = setting(False, "allow custom model code from the Hub")

    def __post_init__(self):
        if self.bf16 is None:
            self.bf16 = default_mixed_precision() and self.dtype in ("auto", "bfloat16", "bf16")
        self.report_to = report_to_list(self.report_to)
        check_range(self, ("answer_only_fraction", "answer_first_fraction", "warmup_ratio", "direct_fraction",
                           "skip_tool_fraction"), 0, 1)
        self.check_environment_settings()
        if self.environment is None:
            changed = changed_from_default(self, ("direct_fraction", "skip_tool_fraction"))
            if changed:
                raise ConfigError(f"{changed[0]} applies to environment demonstrations only: set environment (e.g. "
                                  f"--environment calculator) or drop {changed[0]}")
        else:
            if self.answer_only_fraction or self.answer_first_fraction:
                raise ConfigError("answer_only_fraction / answer_first_fraction shape single-turn demonstrations: "
                                  "with an environment use direct_fraction / skip_tool_fraction")
            if self.direct_fraction + self.skip_tool_fraction > 1.0 + 1e-9:
                raise ConfigError(f"direct_fraction + skip_tool_fraction must be <= 1, got {self.direct_fraction} + "
                                  f"{self.skip_tool_fraction}")
        if self.answer_only_fraction + self.answer_first_fraction > 1.0:
            raise ConfigError("answer_only_fraction + answer_first_fraction must be at most 1")
        check_range(self, "max_steps", 1, also=(-1,), meaning="-1 to train for `epochs`")
        check_range(self, ("learning_rate", "epochs"), 0, low_open=True)
        if not self.full:
            check_range(self, ("lora_r", "lora_alpha"), 1)
        check_range(self, "lora_dropout", 0, 1, high_open=True)
        check_range(self, ("batch_size", "gradient_accumulation_steps", "save_steps", "save_total_limit",
                           "logging_steps", "max_train_samples", "micro_batches"), 1)
        if self.batch_size % self.micro_batches:
            raise ConfigError(f"batch_size ({self.batch_size}) must be a multiple of micro_batches "
                              f"({self.micro_batches}): each forward pass takes batch_size / micro_batches rows")
        if self.micro_batches > 1 and self.group_by_length:
            raise ConfigError("micro_batches and group_by_length both order rows by length: set one of them")
        check_range(self, "eval_samples", 0)
        check_range(self, "synthetic_test_size", 0)
        check_range(self, "max_length", 16)
        check_range(self, ("weight_decay", "max_grad_norm"), 0)  # max_grad_norm 0: no clipping
        check_range(self, ("seed", "synthetic_seed"), *SEED_RANGE)

    @property
    def target_modules(self) -> list[str]:
        targets = list(dict.fromkeys(self.lora_target_modules + (MLP_TARGETS if self.lora_mlp else [])))
        return targets


# ---------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------

def load_task_rows(config: SFTConfig):
    """The configured task data as canonical task rows (a ``datasets.Dataset``), without the validation slice."""
    return _task_rows_and_validation(config)[0]


def _task_rows_and_validation(config: SFTConfig):
    """``(train, validation)``: the training rows (a ``datasets.Dataset``) and the ``eval_samples`` validation rows
    carved out of the split before them (:func:`agentic_rl.eval.validation.training_and_validation_rows`)."""
    from agentic_rl.data import load_task_dataset
    from agentic_rl.data.gsm8k import rows_to_dataset, sample_indices
    from agentic_rl.eval.validation import training_and_validation_rows

    options = dict(question_field=config.question_field, answer_field=config.answer_field,
                   ground_truth_field=config.ground_truth_field, synthetic_seed=config.synthetic_seed,
                   synthetic_test_size=config.synthetic_test_size, text_answers=config.answers_are_text())
    synthetic_rows = max(config.max_train_samples or 0, SFT_SYNTHETIC_TRAIN_ROWS)
    if not config.eval_samples:
        return load_task_dataset(config.dataset, config.split, max_samples=config.max_train_samples, seed=config.seed,
                                 synthetic_train_size=synthetic_rows, **options), []
    train, validation = training_and_validation_rows(config.dataset, config.split, seed=config.seed,
                                                     eval_samples=config.eval_samples,
                                                     synthetic_train_size=synthetic_rows, **options)
    rows = [train[i] for i in sample_indices(len(train), config.max_train_samples, config.seed)]
    return rows_to_dataset(rows), validation


def validation_rows(config: SFTConfig) -> list[dict[str, Any]]:
    """The validation slice (``eval_samples`` rows) as prompts the way this stage writes them: its system prompt,
    or with an environment the environment's."""
    from agentic_rl.agent.settings import build_environment, environment_system_prompt
    from agentic_rl.data import to_rl_dataset

    validation = _task_rows_and_validation(config)[1]
    env = build_environment(config).example if config.environment is not None else None
    return to_rl_dataset(validation, environment_system_prompt(config.system_prompt, env)).to_list()


def build_sft_dataset(config: SFTConfig):
    """Prompt-completion rows (plus ``chat_template_kwargs``) for TRL, from the configured task data."""
    from agentic_rl.data import to_sft_dataset
    from agentic_rl.data.formats import resolve_system_prompt

    ds = to_sft_dataset(load_task_rows(config), resolve_system_prompt(config.system_prompt),
                        answer_only_fraction=config.answer_only_fraction,
                        answer_first_fraction=config.answer_first_fraction, seed=config.seed)
    kwargs = {"enable_thinking": config.enable_thinking}
    return ds.map(lambda _: {"chat_template_kwargs": kwargs})


def rows_per_step(config: SFTConfig) -> int:
    """Rows one optimizer step trains on over every process: batch x accumulation x processes."""
    return config.batch_size * config.gradient_accumulation_steps * world_size()


def rows_reached(dataset, config: SFTConfig):
    """The rows ``max_steps`` will reach: a seeded random subset when the data holds more (the trainer would draw
    that many at random anyway), so that TRL does not tokenize rows no step uses; all rows when training by epochs.
    The same settings give the same subset, so ``--resume`` continues the same batches; a resume that raises
    ``max_steps`` draws a new, larger subset (its remaining steps see other batches than the first run would have)."""
    from agentic_rl.data.gsm8k import sample_indices

    if config.max_steps < 0:
        return dataset
    needed = config.max_steps * rows_per_step(config)
    if len(dataset) <= needed:
        return dataset
    return dataset.select(sample_indices(len(dataset), needed, config.seed))


def length_bucketed_order(lengths: list[int], batch_size: int, generator, group_batches: int = 50) -> list[int]:
    """Row indices such that each run of ``batch_size`` holds rows of similar length, the batches in random order.

    The rows are shuffled and cut into groups of ``group_batches`` batches; each group is sorted by length and cut into
    batches; then every full batch of every group is shuffled together (a last, partial batch stays last).
    transformers' ``LengthGroupedSampler`` keeps each group's batches sorted, longest first, so that the steps go
    from long to short problems in cycles of 50; here no step's length follows from the one before."""
    import torch

    order = torch.randperm(len(lengths), generator=generator).tolist()
    group = group_batches * batch_size
    batches: list[list[int]] = []
    for start in range(0, len(order), group):
        rows = sorted(order[start:start + group], key=lengths.__getitem__)
        batches += [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
    partial = [b for b in batches if len(b) < batch_size]
    full = [b for b in batches if len(b) == batch_size]
    shuffled = [full[i] for i in torch.randperm(len(full), generator=generator).tolist()]
    return [i for batch in shuffled + partial for i in batch]


def length_sorted_steps(lengths: list[int], step_rows: int, generator) -> list[int]:
    """A random order of the rows in which each run of ``step_rows`` (one optimizer step's rows) is sorted by
    length, so that the step's forward passes hold rows of similar length.

    The random order is ``torch.randperm`` of the generator, as in the trainer's own sampler (accelerate's
    ``SeedableRandomSampler`` seeds it with the run's seed + epoch), so each step trains on the rows it would have
    trained on in random order; only their split into forward passes changes."""
    import torch

    order = torch.randperm(len(lengths), generator=generator).tolist()
    return [i for start in range(0, len(order), step_rows)
            for i in sorted(order[start:start + step_rows], key=lengths.__getitem__)]


def build_environment_dataset(config: SFTConfig, env_factory, tokenizer):
    """Tokenized whole-episode demonstrations (``input_ids`` + ``labels``) for SFT in an environment, and the count
    of each kind.

    Each row is one of three kinds (a seeded split): ``environment`` — the environment's demonstration
    (``env.demonstration(task)``: for the calculator its annotated steps replayed as tool calls) under the
    environment's prompt; ``skip_tool`` (``skip_tool_fraction``) — the same prompt answered directly with the worked
    solution; ``direct`` (``direct_fraction``) — the standard prompt without tools and the worked solution. Labels
    are -100 on the prompt, on tool and feedback messages and on turns the environment marks ``"train": False``: the
    model learns the calls and the answers, never the tool's output. TRL keeps given labels as they are.
    """
    import random

    import datasets

    from agentic_rl.agent.env import demonstrated
    from agentic_rl.agent.settings import environment_system_prompt
    from agentic_rl.agent.tasks import demonstration_examples, environment_examples
    from agentic_rl.data.formats import build_prompt, resolve_system_prompt, task_with_data

    rows = load_task_rows(config).to_list()
    env = env_factory()
    # Rows the demonstrator does not show (env.demonstrates) are left to RL; the seeded split is over the rest.
    demonstrated_rows = [r for r in rows if demonstrated(env, task_with_data(r))]
    if not demonstrated_rows:
        raise ConfigError(f"the {config.environment} environment demonstrates none of the {len(rows)} training rows "
                          "(its demonstration settings leave every one to RL); SFT has nothing to train on")
    not_demonstrated, rows = len(rows) - len(demonstrated_rows), demonstrated_rows
    rng = random.Random(f"agentic-rl-imperfect-demonstrations:{config.seed}")  # not the stream rows_reached draws
    direct_ids = set(rng.sample(range(len(rows)), int(round(config.direct_fraction * len(rows)))))
    rest = [i for i in range(len(rows)) if i not in direct_ids]
    n_skip = min(int(round(config.skip_tool_fraction * len(rows))), len(rest))
    skip_ids = set(rng.sample(rest, n_skip)) if n_skip else set()
    env_prompt = environment_system_prompt(config.system_prompt, env)
    plain_prompt = resolve_system_prompt(config.system_prompt)

    def tasks(ids: set[int] | None, system_prompt: str | None) -> list[dict[str, Any]]:
        chosen = [r for i, r in enumerate(rows) if (i in ids if ids is not None else
                                                     i not in direct_ids and i not in skip_ids)]
        return [{**r, "prompt": build_prompt(r["question"], system_prompt)} for r in chosen]

    template = {"enable_thinking": config.enable_thinking}
    schemas = env.tool_schemas() if config.tools_in_prompt else None
    with_env = tasks(None, env_prompt)
    skip, direct = tasks(skip_ids, env_prompt), tasks(direct_ids, plain_prompt)
    examples = environment_examples(tokenizer, env, with_env, tools_in_prompt=config.tools_in_prompt,
                                    chat_template_kwargs=template)
    examples += demonstration_examples(tokenizer, skip, tools=bool(schemas), call_tools=False, tool_schemas=schemas,
                                       chat_template_kwargs=template)
    examples += demonstration_examples(tokenizer, direct, tools=False, chat_template_kwargs=template)
    rng.shuffle(examples)
    counts = {"environment": len(with_env), "skip_tool": len(skip), "direct": len(direct),
              "not_demonstrated": not_demonstrated}
    return datasets.Dataset.from_list(examples), counts


# ---------------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------------

def prepare_model(config: SFTConfig):
    """``(model, tokenizer)``: the base with LoRA adapters attached (or all weights trainable with ``full``).

    ``model.agentic_rl_base`` is ``(fingerprint, path)`` of the base the adapter is trained on (see
    ``models.fingerprint``), recorded in the saved adapter; None when it cannot be known (a continued adapter that
    recorded none).
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    from agentic_rl.models.fingerprint import read_base_fingerprint, weights_fingerprint
    from agentic_rl.models.loading import is_adapter_dir, load_model_and_tokenizer

    source = config.model
    if Path(source).is_dir():  # absolute, so that the saved adapter's base_model_name_or_path works from anywhere
        source = str(Path(source).resolve())
    adapter_input = Path(source).is_dir() and is_adapter_dir(source)
    # Full fine-tuning of an adapter directory starts from the merged model; LoRA continues the given adapter.
    dtype = config.dtype
    if adapter_input and config.full and dtype == "auto" and not supports_bf16():
        dtype = "float32"  # the merged model is trained in full: never fp16 master weights
    model, tokenizer = load_model_and_tokenizer(source, dtype=dtype, trust_remote_code=config.trust_remote_code,
                                                for_training=not (adapter_input and config.full))
    model.train()
    if config.full:
        for p in model.parameters():
            p.requires_grad_(True)
        return model, tokenizer
    if isinstance(model, PeftModel):
        log(f"continuing the LoRA adapter in {config.model}")
        warn("lora_r / lora_alpha / lora_dropout / lora_target_modules / lora_mlp come from that adapter's "
             "adapter_config.json; the values in this config do not apply (use --full, or start from its base)")
        recorded = read_base_fingerprint(source)
        model.agentic_rl_base = (recorded, recorded.get("base_model")) if recorded else None
        return model, tokenizer
    model.agentic_rl_base = (weights_fingerprint(model), source)
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in config.target_modules if t not in names]
    if missing:
        raise ConfigError(f"lora_target_modules {missing} not found in the model; its linear layers include "
                          f"{', '.join(sorted(n for n in names if n.endswith('proj')))}")
    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=config.target_modules, task_type="CAUSAL_LM", bias="none")
    return get_peft_model(model, lora), tokenizer


# ---------------------------------------------------------------------------------------------------------------
# Run
# ---------------------------------------------------------------------------------------------------------------

def trainer_arguments(config: SFTConfig, out: Path, report_to: list[str], n_params: int):
    """TRL's ``SFTConfig`` with the device defaults resolved (activation checkpointing; ``bf16`` is resolved by the
    config)."""
    import trl

    gpu = has_gpu()
    checkpointing = config.gradient_checkpointing
    if checkpointing is None:
        checkpointing = gpu and n_params > 100_000_000
    return trl.SFTConfig(
        output_dir=str(out / "checkpoints"),
        max_steps=config.max_steps,
        num_train_epochs=config.epochs,
        per_device_train_batch_size=config.batch_size // config.micro_batches,
        gradient_accumulation_steps=config.gradient_accumulation_steps * config.micro_batches,
        learning_rate=config.learning_rate,
        lr_scheduler_type=config.lr_scheduler_type,
        warmup_steps=config.warmup_ratio,  # a float < 1 is a share of the total steps
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        max_length=config.max_length,
        completion_only_loss=True,
        packing=False,
        logging_steps=config.logging_steps,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=config.save_total_limit,
        report_to=report_to,
        seed=config.seed,
        use_cpu=not gpu,
        bf16=config.bf16,
        activation_checkpointing=checkpointing,
        dataloader_num_workers=0,
        dataset_num_proc=None,
        disable_tqdm=False,
    )


def sft_trainer(config: SFTConfig, **kwargs):
    """TRL's ``SFTTrainer`` (``kwargs`` as its own), drawing rows in a length-aware order
    (:class:`~agentic_rl.train.sft_trainer.LengthAwareTrainer`) when ``micro_batches`` > 1 (each optimizer step's
    rows sorted by length) or ``group_by_length`` is set."""
    import trl

    if config.micro_batches > 1:
        # One optimizer step's rows over every process: accelerate deals process p the per-device batches p, p + W,
        # ..., so a step's passes on all processes are one run of this many rows in the sampler's order.
        arrange, size = length_sorted_steps, rows_per_step(config)
    elif config.group_by_length:
        arrange, size = length_bucketed_order, config.batch_size
    else:
        return trl.SFTTrainer(**kwargs)

    from agentic_rl.train.sft_trainer import LengthAwareTrainer

    return LengthAwareTrainer(**kwargs, arrange=arrange, rows_per_batch=size)


def save_outputs(trainer, tokenizer, out: Path, *, full: bool, merge: bool) -> dict[str, str | None]:
    """``<run>/adapter`` (LoRA runs) and ``<run>/model`` (always for full runs; LoRA runs unless merge=False)."""
    from peft import PeftModel

    from agentic_rl.models.tiny import save_model_dir

    model = trainer.model
    paths: dict[str, str | None] = {"adapter_dir": None, "model_dir": None}
    if isinstance(model, PeftModel) and not full:
        adapter_dir = out / "adapter"
        from agentic_rl.models.loading import save_model_atomically

        save_model_atomically(model, tokenizer, adapter_dir)  # whole or not at all (a full disk: one line)
        if getattr(model, "agentic_rl_base", None):
            from agentic_rl.models.fingerprint import write_base_fingerprint

            write_base_fingerprint(adapter_dir, *model.agentic_rl_base)
        paths["adapter_dir"] = str(adapter_dir)
        if merge:
            merged = model.merge_and_unload()
            trainer.model = merged
            paths["model_dir"] = str(save_model_dir(merged, tokenizer, out / MODEL_FOLDER))
    else:
        if isinstance(model, PeftModel):
            model = model.merge_and_unload()
        paths["model_dir"] = str(save_model_dir(model, tokenizer, out / MODEL_FOLDER))
    return paths


def run(config: SFTConfig, *, callbacks: list | None = None) -> dict[str, Any]:
    """Fine-tune; returns ``{"run_dir", "adapter_dir", "model_dir", "metrics"}`` (``model_dir``: ``<run>/model``, or
    the adapter when ``merge`` is off).

    ``callbacks`` are extra ``TrainerCallback``s (tests, hyper-parameter search pruning).
    """
    from agentic_rl.models.loading import count_parameters
    from agentic_rl.train.monitoring import (HealthCallback, MetricsCallback, MetricsLogger, StepCostCallback,
                                             resolve_report_to, quiet_progress)

    start = time.time()
    out = stage_path(config.output_dir, "sft")
    announce("sft", config, out)
    # A finished or interrupted run in `out` is kept unless --resume / --overwrite says what to do with it.
    stage_run = StageRun(out, config, stage="sft")
    resume_from = stage_run.check()
    report = resolve_report_to(config.report_to, out)
    set_seed(config.seed)

    env_factory = None
    if config.environment is not None:
        from agentic_rl.agent.settings import build_environment

        env_factory = build_environment(config)  # a bad environment or argument fails here, before any output
    dataset = rows_available = None
    if env_factory is None:
        dataset = build_sft_dataset(config)
        rows_available = len(dataset)
        dataset = rows_reached(dataset, config)
    model, tokenizer = prepare_model(config)
    if env_factory is not None:
        dataset, counts = build_environment_dataset(config, env_factory, tokenizer)
        log(f"sft in environment {config.environment}: {counts['environment']} demonstrations in the environment, "
            f"{counts['skip_tool']} answered directly under its prompt, {counts['direct']} without it"
            + (f"; {counts['not_demonstrated']} rows it does not demonstrate left out" if counts['not_demonstrated']
               else ""))
    # Only now the run directory: an earlier run's outputs go (unless resuming), this run's settings are recorded.
    stage_run.claim()
    try:  # a failure before the first checkpoint leaves the directory as it was (StageRun.abandon)
        metrics_logger = MetricsLogger(out, report, config=config_to_dict(config), resume=resume_from is not None)
        n_train, n_total = count_parameters(model)
        args = trainer_arguments(config, out, ["none"], n_total)  # metrics go through metrics_logger
        health = HealthCallback()
        trainer = sft_trainer(config, model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                              callbacks=[health, MetricsCallback(metrics_logger, "sft"), StepCostCallback(),
                                         *(callbacks or [])])
        quiet_progress(trainer)
        steps = trainer.args.max_steps if trainer.args.max_steps > 0 else None
        device = next(model.parameters()).device
        rows_note = f"{len(dataset)} rows"
        if rows_available not in (None, len(dataset)):
            rows_note += f" (of {rows_available}: those {config.max_steps} steps reach)"
        trained = ("full fine-tuning" if config.full else
                   f"LoRA r={config.lora_r} alpha={config.lora_alpha} on " + ",".join(config.target_modules))
        log(f"sft resolved: {trained}; "
            f"trainable {n_train:,} of {n_total:,} parameters ({n_train / max(n_total, 1):.2%}); device {device.type}, "
            f"dtype {next(model.parameters()).dtype}, bf16 {args.bf16}, activation checkpointing "
            f"{args.activation_checkpointing}; {rows_note}, {'grouped by length, ' if config.group_by_length else ''}"
            f"batch {config.batch_size} x accum "
            f"{config.gradient_accumulation_steps}"
            f"{f' ({config.micro_batches} length-sorted passes per batch)' if config.micro_batches > 1 else ''}, "
            f"{'steps ' + str(steps) if steps else f'epochs {config.epochs:g}'}, lr {config.learning_rate:g} "
            f"({config.lr_scheduler_type}, warm-up {config.warmup_ratio:.0%})")

        try:
            with labelled_positions_only():  # the loss's LM head over completion tokens only, not the prompt's too
                train_out = trainer.train(resume_from_checkpoint=resume_from)
        finally:
            metrics_logger.close()

        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        metrics: dict[str, Any] = {
            "train/loss": train_out.training_loss,
            "train/first_loss": losses[0] if losses else None,
            "train/last_loss": losses[-1] if losses else None,
            "global_step": trainer.state.global_step,
            "resumed_from": resume_from,
            "trainable_parameters": n_train,
            "total_parameters": n_total,
            "train_rows": len(dataset),
            "health_warnings": health.monitor.warnings,
        }
        paths = save_outputs(trainer, tokenizer, out, full=config.full, merge=config.merge)
    except BaseException:
        stage_run.abandon()
        raise
    metrics["wall_time_s"] = round(time.time() - start, 1)
    write_json(out / "metrics.json", metrics)
    first, last = metrics["train/first_loss"], metrics["train/last_loss"]
    # no loss was logged when the run was shorter than logging_steps: the mean training loss says enough then
    loss = (f"loss {first:.4g} -> {last:.4g}" if first is not None and last is not None else
            f"mean loss {train_out.training_loss:.4g}")
    saved = ", ".join(f"{kind} {paths[key]}" for kind, key in (("adapter", "adapter_dir"), ("model", "model_dir"))
                      if paths.get(key))
    log(f"sft done in {metrics['wall_time_s']} s, step {metrics['global_step']}: {loss}; {saved}")
    return stage_run.finish({"run_dir": str(out), **paths, "model_dir": paths["model_dir"] or paths["adapter_dir"],
                           "metrics": metrics})

