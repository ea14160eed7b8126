"""Supervised fine-tuning on tool-use demonstrations (the warm start before agentic GRPO).

Each training example is a whole episode — prompt, assistant tool-call turns, tool responses, final answer — spliced
into tokens exactly as a rollout splices them (:func:`agentic_rl.agent.tasks.demonstration_examples`). The loss is
plain next-token cross-entropy on the assistant turns only: prompt and tool-response tokens have label -100, so the
model learns to call the tool and to use its result, never to predict the tool's output. A fraction of the rows
(``direct_fraction``) is shown without tools (plain system prompt, direct answer), so the same model can also be
evaluated without tools. Another, disjoint fraction (``skip_tool_fraction``) is shown under the agent (tool) prompt
but answers directly without calling the tool: imperfect demonstrations, so the SFT model sometimes skips the tool
and RL has a tool-call rate to raise.

Runs on TRL's ``SFTTrainer`` with a pre-tokenized dataset (``input_ids`` + ``labels``): TRL keeps given labels as is.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_rl.config import SEED_RANGE, check_range, setting
from agentic_rl.errors import ConfigError
from agentic_rl.runs import check_stage_dir, claim_stage_dir, stage_path
from agentic_rl.utils import log, set_seed


@dataclass
class AgentSFTConfig:
    model: str = setting("", "base model directory or hub id")
    output_dir: str | None = setting(None, "run directory (default runs/agent-sft); the model goes to <run>/model")
    overwrite: bool = setting(False, "replace a finished run in the run directory (without it, such a directory is an "
                              "error)")
    dataset: str = setting("multiplication", "'multiplication' / 'arithmetic' (embedded synthetic task) or a JSONL file")
    train_rows: int = setting(1000, "demonstration episodes")
    heldout_rows: int = setting(200, "size of the synthetic held-out split never trained on")
    data_seed: int = setting(0, "seed of the synthetic task split")
    direct_fraction: float = setting(0.25, "share of rows shown as direct answers without tools")
    skip_tool_fraction: float = setting(0.0, "share of rows shown under the agent (tool) prompt that answer directly "
                                             "without calling the tool (imperfect demonstrations, so RL can raise "
                                             "the tool-call rate); disjoint from the direct_fraction rows")
    tools_in_prompt: bool = setting(True, "render the tool schemas into the prompt with the chat template")
    final_turn: str = setting("steps", "answer turn after tool calls: 'steps' (solution steps, then 'Final Answer: N') "
                                       "or 'answer' (only 'Final Answer: N', copying the last tool result)",
                              choices=["steps", "answer"])
    epochs: float = setting(3.0, "passes over the demonstrations")
    learning_rate: float = setting(5e-4, "learning rate")
    batch_size: int = setting(16, "examples per optimizer step")
    lora: bool = setting(False, "train a LoRA adapter and merge it (false: full fine-tuning)")
    seed: int = setting(0, "random seed")

    def __post_init__(self) -> None:
        check_range(self, ("direct_fraction", "skip_tool_fraction"), 0, 1)
        check_range(self, ("train_rows", "batch_size"), 1)
        check_range(self, "heldout_rows", 0)
        check_range(self, ("epochs", "learning_rate"), 0, low_open=True)
        check_range(self, ("seed", "data_seed"), *SEED_RANGE)
        if self.direct_fraction + self.skip_tool_fraction > 1.0 + 1e-9:
            raise ConfigError(f"direct_fraction + skip_tool_fraction must be <= 1, got {self.direct_fraction} + "
                              f"{self.skip_tool_fraction}")


def sft_examples(tokenizer, rows: list[dict[str, Any]], config: AgentSFTConfig,
                 tool_schemas: list[dict] | None = None) -> tuple[list[dict[str, list[int]]], dict[str, int]]:
    """Tokenized, shuffled demonstrations of ``rows`` and the count of each kind: ``direct`` (plain prompt, direct
    answer), ``skip_tool`` (agent prompt, direct answer without a call) and ``tool`` (agent prompt, tool calls)."""
    from agentic_rl.agent.tasks import agent_rows, demonstration_examples

    rng = random.Random(config.seed)
    direct_ids = set(rng.sample(range(len(rows)), int(round(config.direct_fraction * len(rows)))))
    rest = [i for i in range(len(rows)) if i not in direct_ids]
    n_skip = min(int(round(config.skip_tool_fraction * len(rows))), len(rest))
    skip_ids = set(rng.sample(rest, n_skip)) if n_skip else set()  # no draw at 0: the old split stays as it was
    direct = [r for i, r in enumerate(rows) if i in direct_ids]
    skip = [r for i, r in enumerate(rows) if i in skip_ids]
    with_tools = [r for i, r in enumerate(rows) if i not in direct_ids and i not in skip_ids]
    examples = demonstration_examples(tokenizer, agent_rows(with_tools, tools=True), tools=True,
                                      tool_schemas=tool_schemas, final_turn=config.final_turn)
    examples += demonstration_examples(tokenizer, agent_rows(skip, tools=True), tools=True, call_tools=False,
                                       tool_schemas=tool_schemas)
    examples += demonstration_examples(tokenizer, agent_rows(direct, tools=False), tools=False)
    rng.shuffle(examples)
    return examples, {"tool": len(with_tools), "skip_tool": len(skip), "direct": len(direct)}


def run(config: AgentSFTConfig) -> dict[str, Any]:
    """Fine-tune on demonstrations; returns ``{"run_dir", "model_dir", "train_loss", "examples"}``."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from agentic_rl.agent.calculator_env import calculator
    from agentic_rl.agent.tools import Tool
    from agentic_rl.agent.train import load_model, load_task_rows
    from agentic_rl.config import save_config

    out = stage_path(config.output_dir, "agent-sft")
    # A finished run in `out` is kept unless --overwrite says to replace it.
    check_stage_dir(out, config, stage="agent-sft", finished="model/config.json", checkpoints=out)
    set_seed(config.seed)
    rows = load_task_rows(config.dataset, "train", config.train_rows, heldout_rows=config.heldout_rows,
                          data_seed=config.data_seed)
    model, tokenizer = load_model(config.model)
    schemas = [Tool(calculator).schema] if config.tools_in_prompt else None
    examples, counts = sft_examples(tokenizer, rows, config, schemas)
    # Only now the run directory: an earlier run's model goes, this run's settings are recorded.
    claim_stage_dir(out, config, stage="agent-sft", stale=("model", "checkpoint-*"), resuming=False)
    save_config(config, out / "config.yaml")
    longest = max(len(e["input_ids"]) for e in examples)
    log(f"agent SFT: {len(examples)} episodes ({counts['direct']} without tools, {counts['skip_tool']} under the "
        f"tool prompt without a call), longest {longest} tokens")

    peft_config = None
    if config.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
    tokenizer.padding_side = "right"
    args = SFTConfig(
        output_dir=str(out), num_train_epochs=config.epochs, learning_rate=config.learning_rate,
        per_device_train_batch_size=config.batch_size, gradient_accumulation_steps=1, lr_scheduler_type="cosine",
        warmup_steps=10, logging_steps=10, save_strategy="no", report_to=[], seed=config.seed, bf16=False,
        max_length=max(longest, 16), packing=False, dataloader_num_workers=0,
    )
    from agentic_rl.train.monitoring import NonFiniteGuard

    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(examples),
                         processing_class=tokenizer, peft_config=peft_config, callbacks=[NonFiniteGuard()])
    result = trainer.train()
    model_dir = Path(out) / "model"
    policy = trainer.model.merge_and_unload() if config.lora else trainer.model
    policy.save_pretrained(model_dir)
    tokenizer.padding_side = "left"
    tokenizer.save_pretrained(model_dir)
    log(f"agent SFT done: loss {result.training_loss:.4f} -> {model_dir}")
    return {"run_dir": str(out), "model_dir": str(model_dir), "train_loss": result.training_loss,
            "examples": len(examples)}
