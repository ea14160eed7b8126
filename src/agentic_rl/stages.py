"""The one table of stages: every command, the pipeline, ``tune`` and the ``rl_training`` tool read it.

A stage is a record: its command name, the module that holds it, its typed config class, its run function and a
one-line help. Modules are imported only when a stage is used, so ``agentic-rl --help`` stays fast. Adding a stage
touches this table and nothing else that dispatches on stage names.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from agentic_rl.errors import ConfigError


@dataclass(frozen=True)
class Stage:
    """One command: ``module.config`` is its typed config dataclass, ``module.run`` its entry point."""

    name: str
    module: str
    config: str
    help: str
    run: str = "run"
    trains: bool = False  # a training stage: produces a model in its run directory's model/ folder

    def load(self) -> tuple[type, Callable[..., Any]]:
        """The stage's config class and run function (imports its module)."""
        module = importlib.import_module(self.module)
        return getattr(module, self.config), getattr(module, self.run)

    @property
    def config_class(self) -> type:
        return self.load()[0]

    @property
    def doc(self) -> str:
        """The module docstring (the command's ``--help`` description)."""
        return (importlib.import_module(self.module).__doc__ or self.help).strip()


STAGES: dict[str, Stage] = {stage.name: stage for stage in (
    Stage("data", "agentic_rl.data.cli", "DataCommandConfig",
          "Inspect a dataset as the model will see it: `data preview` or `data stats`."),
    Stage("reward", "agentic_rl.rewards.cli", "RewardCheckConfig",
          "Score completions in a JSONL file and show each reward component: `reward check FILE`."),
    Stage("pretrain", "agentic_rl.train.pretrain", "PretrainConfig",
          "Train the embedded tokenizer and tiny Qwen3 base model on a synthetic arithmetic corpus.", trains=True),
    Stage("sft", "agentic_rl.train.sft", "SFTConfig",
          "Supervised fine-tuning (LoRA by default) with TRL's SFTTrainer.", trains=True),
    Stage("grpo", "agentic_rl.train.grpo", "GRPOConfig",
          "Group Relative Policy Optimization with TRL's GRPOTrainer and verifiable rewards.", trains=True),
    Stage("reward-model", "agentic_rl.train.reward_model", "RewardModelConfig",
          "Train a reward model on preference pairs (prompt/chosen/rejected) with TRL's RewardTrainer.", trains=True),
    Stage("preferences", "agentic_rl.train.preferences", "PreferencesConfig",
          "Sample k completions per prompt, score them with a judge (any reward), write best-vs-worst pairs."),
    Stage("eval", "agentic_rl.eval.evaluate", "EvalConfig",
          "Evaluate one or more models: accuracy, pass@k, error analysis, report."),
    Stage("quickstart", "agentic_rl.pipeline", "QuickstartConfig",
          "The whole embedded ladder on CPU: data, tiny base, SFT, GRPO, evaluation, export, report.",
          run="run_quickstart"),
    Stage("pipeline", "agentic_rl.pipeline", "PipelineConfig",
          "The same ladder for any model and dataset, each stage switchable (see configs/).", run="run_pipeline"),
    Stage("compare", "agentic_rl.eval.compare", "CompareConfig",
          "GRPO vs its compute-matched SFT control over seeds: paired differences with 95-percent intervals."),
    Stage("tune", "agentic_rl.tune", "TuneConfig", "Hyper-parameter search (grid, random, Bayesian) on Optuna."),
    Stage("export", "agentic_rl.deploy.export", "ExportConfig",
          "Write a merged model directory that transformers and vLLM load as is."),
    Stage("serve", "agentic_rl.deploy.serve", "ServeConfig",
          "Serve a model over an OpenAI-compatible HTTP API (127.0.0.1 by default)."),
)}


def get_stage(name: str) -> Stage:
    """The stage called ``name``; an unknown name is a one-line error with a suggestion."""
    if name in STAGES:
        return STAGES[name]
    import difflib

    close = difflib.get_close_matches(name, list(STAGES), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise ConfigError(f"unknown stage '{name}'{hint}; one of {', '.join(STAGES)}")
