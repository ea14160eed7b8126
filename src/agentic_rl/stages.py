"""The one table of stages: every command, the pipeline, ``tune`` and the ``rl_training`` tool read it.

A stage is a record: its command name, the module that holds it, its typed config class, its run function, a
one-line help, what it writes into its run directory and which top-level keys of a pipeline YAML it inherits. Modules
are imported only when a stage is used, so ``agentic-rl --help`` stays fast. Adding a stage touches this table and
nothing else that dispatches on stage names.

Each stage runs as ``agentic-rl STAGE ...`` or ``python -m agentic_rl STAGE ...`` (what ``accelerate launch -m
agentic_rl STAGE`` runs); its module does not import the command line back.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentic_rl.errors import ConfigError

#: Top-level keys of a pipeline YAML that a stage inherits when it has a field of that name (its own section
#: overrides them); with an ``environment`` set, every environment setting too (:func:`inherited_settings`).
PIPELINE_KEYS = ("model", "dataset", "seed", "synthetic_seed", "system_prompt")
#: The pipeline's defaults of the top-level keys its stages inherit (``PipelineConfig`` declares its fields with
#: them), so a stage run alone with a pipeline file that leaves one out resolves what the pipeline would.
PIPELINE_DEFAULTS: dict[str, Any] = {"model": "embedded", "dataset": "synthetic", "seed": 0, "synthetic_seed": 0,
                                     "system_prompt": None, "eval_samples": 500}


@dataclass(frozen=True)
class Stage:
    """One command: ``module.config`` is its typed config dataclass, ``module.run`` its entry point."""

    name: str
    module: str
    config: str
    help: str
    run: str = "run"
    trains: bool = False  # a training stage: produces a model in its run directory's model/ folder
    #: What a run writes into its run directory (names or glob patterns): an earlier run's outputs that a new run
    #: (not ``--resume``) removes once it has loaded everything (:class:`agentic_rl.runs.StageRun`).
    writes: tuple[str, ...] = ()
    #: The folder of ``checkpoint-N`` inside the run directory ("" = the run directory itself; None = none).
    checkpoints: str | None = None
    #: The top-level pipeline keys the stage takes (those it has a field for), besides the environment settings.
    inherits: tuple[str, ...] = PIPELINE_KEYS

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
          "Train the embedded tokenizer and tiny Qwen3 base model on a synthetic arithmetic corpus.", trains=True,
          writes=("checkpoints", "tokenizer", "model", "metrics.json", "metrics.jsonl", "tensorboard"),
          checkpoints="checkpoints"),
    Stage("sft", "agentic_rl.train.sft", "SFTConfig",
          "Supervised fine-tuning (LoRA by default) with TRL's SFTTrainer.", trains=True,
          writes=("checkpoints", "adapter", "model", "metrics.json", "metrics.jsonl", "tensorboard"),
          checkpoints="checkpoints"),
    Stage("grpo", "agentic_rl.train.grpo", "GRPOConfig",
          "Group Relative Policy Optimization with TRL's GRPOTrainer and verifiable rewards.", trains=True,
          writes=("checkpoint-*", "best", "base", "adapter", "model", "completions.jsonl", "heldout.jsonl",
                  "metrics.jsonl", "result.json", "trainable_parameters.txt", "tensorboard", "difficulty.json",
                  "rollouts.jsonl"),
          checkpoints=""),
    Stage("reward-model", "agentic_rl.train.reward_model", "RewardModelConfig",
          "Train a reward model on preference pairs (prompt/chosen/rejected) with TRL's RewardTrainer.", trains=True,
          writes=("checkpoints", "adapter", "model", "metrics.json", "metrics.jsonl", "tensorboard"),
          checkpoints="checkpoints"),
    Stage("preferences", "agentic_rl.train.preferences", "PreferencesConfig",
          "Sample k completions per prompt, score them with a judge (any reward), write best-vs-worst pairs.",
          writes=("pairs.jsonl", "samples.jsonl", "stats.json")),
    Stage("eval", "agentic_rl.eval.evaluate", "EvalConfig",
          "Evaluate one or more models: accuracy, pass@k, error analysis, report.",
          inherits=(*PIPELINE_KEYS, "eval_samples")),
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


def inherited_settings(pipeline: Any, stage: str, config_class: type) -> dict[str, Any]:
    """The top-level settings of a pipeline (its YAML mapping, or a resolved ``PipelineConfig``) that ``stage``
    takes, for ``config_class``'s fields: the stage's :attr:`Stage.inherits` keys, and every environment setting
    (``config_class.environment_defaults()``) when an ``environment`` is set. ``agentic-rl STAGE --config
    PIPELINE.yaml``, the pipeline and ``tune`` all resolve a stage with this, so each gets the settings the others
    would. A key the mapping leaves out has the pipeline's default (:data:`PIPELINE_DEFAULTS`, and the environment
    settings' own) where the stage's own default differs from it.
    """
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(config_class)}
    environment = getattr(config_class, "environment_defaults", dict)()
    if dataclasses.is_dataclass(pipeline):
        values = {f.name: getattr(pipeline, f.name) for f in dataclasses.fields(pipeline)}
    else:
        values = {str(k).replace("-", "_"): v for k, v in dict(pipeline).items()}
        for key, default in {**environment, **PIPELINE_DEFAULTS}.items():
            if key not in values and key in fields and _default(fields[key]) != default:
                values[key] = default
    keys = list(get_stage(stage).inherits)
    if values.get("environment") is not None:
        keys += list(environment)
    return {key: values[key] for key in keys if key in fields and key in values}


def _default(field: Any) -> Any:
    import dataclasses

    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
