"""Agentic GRPO: multi-turn tool use with per-step rewards, on TRL's ``GRPOTrainer``.

Algorithm. For every task, ``num_generations`` episodes are played with the environment (default: the calculator
environment): the model writes a turn, a tool call is executed and its result appended as a ``tool`` message, until
the model answers or ``max_turns`` is reached. Each step returns a reward — ``tool_call_reward`` for each useful valid
tool call, ``answer_reward`` for a correct final answer — and the trajectory's return is their sum. GRPO's advantage
``A_i = R_i - mean(R_group)`` (divided by the group std with ``scale_rewards=group``) is applied to the
log-probability of every *action* token of trajectory *i*; tool-response tokens (and the chat-template tokens around
them) are in the sequence the policy conditions on but carry no loss.

How it maps onto TRL 1.16. TRL's built-in ``tools=`` / ``environment_factory=`` loop masks tool outputs but scores
only the finished conversation with ``reward_funcs`` and parses calls with its own response schema (malformed calls,
per-step rewards and turn limits are not ours to control), so this stage uses its ``rollout_func`` hook instead:
:func:`agentic_rl.agent.rollout.make_rollout_func` runs the multi-turn loop and returns ``prompt_ids``,
``completion_ids``, ``env_mask`` (TRL's tool mask: loss mask = completion mask × env mask) and ``trajectory_return``,
which the single reward function passes on as the reward. Everything else — group advantages, KL to the reference
(β), clipping, loss variants — is TRL's.

RLOO with the environment (``algorithm: rloo``, the GRPO stage's option of the same name). TRL 1.16's
``RLOOTrainer`` takes no ``rollout_func`` / ``environment_factory``, so the episodes still come from
``GRPOTrainer``'s hook and the update is RLOOTrainer's, replicated in
:func:`agentic_rl.train.rloo.make_rloo_rollout_trainer_class` (a ``GRPOTrainer`` subclass). What matches
``RLOOTrainer._generate_and_score_completions`` / ``_compute_loss``:

* KL in the *reward*, not the loss: ``r_i ← r_i − β · Σ_t (log π_old − log π_ref)`` (k1 estimator summed over the
  sequence; ``β = 0`` drops it), logged as ``kl`` (per-token mean, as RLOOTrainer logs it);
* advantage ``r_i − mean_{j≠i} r_j`` over the ``num_generations`` episodes of a task. It is computed from
  GRPOTrainer's advantage with ``scale_rewards="none"``, ``r_i − mean_j r_j``, times ``G/(G−1)``, which is the
  same number: ``r_i − (Σ_j r_j − r_i)/(G−1) = (G·r_i − Σ_j r_j)/(G−1)``. No normalisation afterwards
  (RLOOConfig's ``normalize_advantages`` default, false);
* loss ``−mean_i min(ρ_i A_i, clip(ρ_i, 1−ε, 1+ε) A_i)`` with the *sequence* ratio ``ρ_i = exp(Σ_t log π_θ −
  log π_old)``, averaged over episodes; entropy and clip-ratio metrics as RLOOTrainer logs them.

Where it departs: every token sum (KL, ratio, entropy) runs over *action* tokens only (completion mask × env mask;
RLOOTrainer has no tool tokens to exclude); ``normalize_advantages`` is not offered (it stays at RLOO's default);
unscorable (``None``) rewards cannot occur (the reward is the trajectory return), so RLOOTrainer's NaN-aware
baseline is not needed. ``loss_type`` and ``scale_rewards`` are GRPO settings and changing them with ``algorithm:
rloo`` is an error, as in the GRPO stage.

Monitoring: besides TRL's metrics (reward, KL, entropy, ...), every generation batch logs ``agent/accuracy``,
``agent/tool_call_rate`` (episodes with at least one valid call), ``agent/tool_calls_per_episode``,
``agent/tool_error_rate`` (error observations / calls), ``agent/useful_call_rate`` (calls that earned the tool
reward / calls), ``agent/turns_per_episode``, ``agent/return`` and
``agent/truncated_rate``, to TensorBoard / the console and to ``<run>/rollouts.jsonl`` (with two sample episodes);
``<run>/metrics.jsonl`` has every logged step.

Run it (as a function: ``run(AgentGRPOConfig(model=...))``)::

    agentic-rl agent-grpo --model runs/quickstart-agentic/sft/model --max-steps 40
    agentic-rl agent-grpo --model runs/quickstart-agentic/sft/model --max-steps 40 --algorithm rloo
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_rl.config import SEED_RANGE, check_range, setting
from agentic_rl.errors import ConfigError, DataError
from agentic_rl.runs import check_stage_dir, claim_stage_dir, stage_path
from agentic_rl.utils import append_jsonl, has_gpu, log, read_jsonl, set_seed


@dataclass
class AgentGRPOConfig:
    model: str = setting("", "model directory or hub id to train (an SFT output that already writes tool calls)")
    output_dir: str | None = setting(None, "run directory (default runs/agent-grpo)")
    overwrite: bool = setting(False, "replace a finished run in the run directory (without it, such a directory is an "
                              "error)")
    dataset: str = setting("multiplication", "task rows: 'multiplication' or 'arithmetic' (embedded synthetic task), "
                                        "or a JSONL file of GSM8K-shaped rows (question, answer with '#### N')")
    train_rows: int = setting(512, "number of training tasks")
    heldout_rows: int = setting(200, "size of the held-out split that training rows never overlap (synthetic tasks)")
    data_seed: int = setting(0, "seed of the synthetic task split")
    environment: str = setting("calculator", "environment: a registered name or module:factory")
    max_turns: int = setting(4, "assistant turns per episode (the last one is scored as the answer)")
    max_tool_calls: int = setting(3, "tool calls per episode; more get an error observation")
    tool_call_reward: float = setting(0.1, "step reward for each useful valid tool call")
    tool_error_reward: float = setting(0.0, "step reward for a call that returns an error (<= 0)")
    answer_reward: float = setting(1.0, "reward of a correct final answer")
    tools_in_prompt: bool = setting(True, "render the tool schemas into the prompt with the chat template")
    system_prompt: str | None = setting(None, "system prompt (default: the agent prompt that mentions the calculator)")
    algorithm: str = setting("grpo", "policy update: 'grpo' (TRL's GRPOTrainer) or 'rloo' (RLOOTrainer's leave-one-out "
                             "baseline and KL-in-the-reward on the same rollouts, see train/rloo.py)",
                             choices=["grpo", "rloo"])
    num_generations: int = setting(8, "episodes per task (the GRPO group size)")
    generation_batch_size: int = setting(32, "episodes per generation batch (a multiple of num_generations)")
    max_steps: int = setting(40, "optimizer steps")
    learning_rate: float = setting(1e-5, "learning rate")
    beta: float = setting(0.05, "KL coefficient against the starting policy")
    epsilon: float = setting(0.2, "clipping range of the policy ratio")
    loss_type: str = setting("dapo", "token-loss aggregation", choices=["grpo", "dapo", "dr_grpo", "bnpo"])
    scale_rewards: str = setting("group", "divide advantages by the group std ('group'), batch std, or not ('none')",
                            choices=["group", "batch", "none"])
    temperature: float = setting(1.0, "sampling temperature of the episodes")
    top_p: float = setting(1.0, "nucleus sampling")
    max_turn_tokens: int = setting(48, "new tokens per assistant turn")
    max_completion_length: int = setting(192, "tokens after the prompt: all turns plus tool responses")
    lora: bool = setting(True, "train a LoRA adapter (false: full fine-tuning)")
    gradient_checkpointing: bool = setting(False, "recompute activations in the backward pass (saves memory on big models)")
    lora_r: int = setting(16, "LoRA rank")
    lora_alpha: int = setting(32, "LoRA alpha")
    seed: int = setting(0, "random seed")
    logging_steps: int = setting(1, "log every N steps")
    report_to: str = setting("tensorboard", "tensorboard | wandb | none")

    def __post_init__(self) -> None:
        check_range(self, ("train_rows", "max_turns", "generation_batch_size", "max_steps", "max_turn_tokens",
                           "max_completion_length", "lora_r", "lora_alpha", "logging_steps"), 1)
        check_range(self, ("heldout_rows", "max_tool_calls", "beta"), 0)
        check_range(self, ("learning_rate", "temperature", "answer_reward"), 0, low_open=True)
        check_range(self, "epsilon", 0, 1, low_open=True, high_open=True)
        check_range(self, "top_p", 0, 1, low_open=True)
        check_range(self, "tool_call_reward")  # any finite number
        check_range(self, "tool_error_reward", high=0)  # a positive value would reward broken tool calls
        check_range(self, ("seed", "data_seed"), *SEED_RANGE)
        check_range(self, "num_generations", 2)  # group-relative advantages need a group; checked before the modulo
        if self.generation_batch_size % self.num_generations:
            raise ConfigError(f"num_generations ({self.num_generations}) must divide the generation batch "
                              f"({self.generation_batch_size})")
        if self.max_turn_tokens > self.max_completion_length:
            raise ConfigError(f"max_turn_tokens ({self.max_turn_tokens}) must not exceed max_completion_length "
                              f"({self.max_completion_length})")
        if self.algorithm == "rloo":
            from agentic_rl.train.rloo import check_rloo_settings

            check_rloo_settings(self)


# ---------------------------------------------------------------------------------------------------------------
# Data, model, environment
# ---------------------------------------------------------------------------------------------------------------

def load_task_rows(dataset: str, split: str, n: int, *, heldout_rows: int = 200, data_seed: int = 0
                   ) -> list[dict[str, Any]]:
    """GSM8K-shaped rows for ``split`` ('train' | 'test'): the embedded synthetic task or a JSONL file."""
    if dataset in ("multiplication", "arithmetic"):
        from agentic_rl.data.synthetic import synthetic_splits

        n_test = max(heldout_rows, n if split == "test" else 0)
        train, test = synthetic_splits(n if split == "train" else 0, n_test, seed=data_seed, kind=dataset)
        return (train if split == "train" else test)[:n]
    path = Path(dataset)
    if path.is_file():
        import json

        from agentic_rl.utils import parse_json

        try:
            lines = path.read_text(encoding="utf-8-sig").splitlines()
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text (byte {exc.start}); expected a JSONL file of tasks") from None
        rows = []
        for k, line in enumerate(lines, 1):
            if line.strip():
                try:
                    row = parse_json(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path} line {k}: invalid JSON ({exc.msg} at column {exc.colno})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path} line {k}: expected a JSON object, got {type(row).__name__}")
                rows.append(row)
        return rows[:n]
    raise DataError(f"unknown agent dataset '{dataset}': use 'multiplication', 'arithmetic' or a JSONL file path")


def load_model(path: str):
    """(model, tokenizer) from a directory or hub id, in fp32, through the project's loader (pad token, chat
    template check, one-line errors; an adapter directory is merged into its base); left padding for generation."""
    from agentic_rl.models.loading import load_model_and_tokenizer

    if not path:
        raise ConfigError("model is required: give the directory of an SFT model (or a hub id)")
    model, tokenizer = load_model_and_tokenizer(path, dtype="float32", for_training=False)
    tokenizer.padding_side = "left"
    return model, tokenizer


def environment_factory(config):
    """A zero-argument factory for fresh environments with the config's limits and rewards."""
    from agentic_rl.agent.env import get_environment_factory

    factory = get_environment_factory(config.environment)
    kwargs = dict(max_turns=config.max_turns, max_tool_calls=config.max_tool_calls,
                  tool_call_reward=config.tool_call_reward, tool_error_reward=config.tool_error_reward,
                  answer_reward=config.answer_reward)
    return lambda: factory(**kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------

def run(config: AgentGRPOConfig) -> dict[str, Any]:
    """Train; returns the run directory, the final model directory and the last agent metrics."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig as TRLGRPOConfig
    from trl import GRPOTrainer

    from agentic_rl.agent.rollout import RolloutSettings, make_rollout_func, trajectory_return_reward
    from agentic_rl.agent.tasks import agent_rows
    from agentic_rl.config import format_config, save_config

    out = stage_path(config.output_dir, "agent-grpo")
    log(format_config(config, "agent GRPO"))
    # A finished run in `out` is kept unless --overwrite says to replace it.
    check_stage_dir(out, config, stage="agent-grpo", finished="final/config.json", checkpoints=out)
    set_seed(config.seed)

    rows = agent_rows(load_task_rows(config.dataset, "train", config.train_rows, heldout_rows=config.heldout_rows,
                                     data_seed=config.data_seed), system_prompt=config.system_prompt)
    model, tokenizer = load_model(config.model)
    settings = RolloutSettings(max_turn_tokens=config.max_turn_tokens,
                               max_completion_length=config.max_completion_length,
                               tools_in_prompt=config.tools_in_prompt)
    rollout_func = make_rollout_func(environment_factory(config), rows, settings, log_path=out / "rollouts.jsonl")
    # Only now the run directory: an earlier run's outputs go, this run's settings are recorded.
    claim_stage_dir(out, config, stage="agent-grpo", stale=("final", "rollouts.jsonl", "metrics.jsonl", "checkpoint-*"),
                    resuming=False)
    save_config(config, out / "config.yaml")

    peft_config = None
    if config.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                                 target_modules="all-linear", task_type="CAUSAL_LM")
    args = TRLGRPOConfig(
        output_dir=str(out), num_generations=config.num_generations,
        per_device_train_batch_size=config.generation_batch_size, gradient_accumulation_steps=1,
        generation_batch_size=config.generation_batch_size, max_steps=config.max_steps,
        learning_rate=config.learning_rate, beta=config.beta, epsilon=config.epsilon, loss_type=config.loss_type,
        # RLOO derives its leave-one-out advantage from GRPO's unscaled one (see the module docstring).
        scale_rewards="none" if config.algorithm == "rloo" else config.scale_rewards,
        temperature=config.temperature, top_p=config.top_p,
        max_completion_length=config.max_completion_length, logging_steps=config.logging_steps,
        save_strategy="no", report_to=[] if config.report_to == "none" else [config.report_to],
        seed=config.seed, bf16=False, use_cpu=not has_gpu(),
        dataloader_num_workers=0, remove_unused_columns=False, log_completions=False,
        gradient_checkpointing=config.gradient_checkpointing,
    )

    from agentic_rl.train.monitoring import NonFiniteGuard

    class _MetricsFile(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                append_jsonl(out / "metrics.jsonl", {"step": state.global_step, **logs})

    trainer_class = GRPOTrainer
    if config.algorithm == "rloo":
        from agentic_rl.train.rloo import make_rloo_rollout_trainer_class

        trainer_class = make_rloo_rollout_trainer_class()
    trainer = trainer_class(
        model=model, reward_funcs=[trajectory_return_reward], args=args,
        train_dataset=Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["ground_truth"]} for r in rows]),
        processing_class=tokenizer, peft_config=peft_config, rollout_func=rollout_func,
        callbacks=[_MetricsFile(), NonFiniteGuard()],  # NaN/inf loss or weights: stop, and raise instead of saving
    )
    trainer.train()

    final = out / "final"
    policy = trainer.model
    if config.lora:
        policy = policy.merge_and_unload()
    policy.save_pretrained(final)
    tokenizer.padding_side = "left"
    tokenizer.save_pretrained(final)
    last = _last_agent_metrics(out / "metrics.jsonl")
    log(f"agent GRPO done: {final}  " + "  ".join(f"{k}={v:.3f}" for k, v in last.items()))
    return {"run_dir": str(out), "model_dir": str(final), "last_metrics": last}


def _last_agent_metrics(path: Path) -> dict[str, float]:
    last: dict[str, float] = {}
    for row in read_jsonl(path):
        last.update({k: v for k, v in row.items() if k.startswith("agent/")})
    return last


if __name__ == "__main__":  # pragma: no cover
    import sys

    from agentic_rl.cli import main

    sys.exit(main(["agent-grpo", *sys.argv[1:]]))
