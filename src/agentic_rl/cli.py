"""The ``agentic-rl`` command: one sub-command per stage, each a thin shell over a stage function.

Every stage module exposes a typed ``Config`` dataclass and a ``run(config)`` function; flags are generated from the
config's fields (so ``--help`` lists every setting with its help and default), ``--config FILE.yaml`` loads values that
flags then override, and user errors print as one line instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from agentic_rl.errors import AgenticRLError

# name -> (module, config class, run function, one-line help). Modules are imported lazily so that
# `agentic-rl --help` and light commands stay fast.
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "data": ("agentic_rl.data.cli", "DataCommandConfig", "run",
             "Inspect a dataset as the model will see it: `data preview` or `data stats`."),
    "reward": ("agentic_rl.rewards.cli", "RewardCheckConfig", "run",
               "Score completions in a JSONL file and show each reward component: `reward check FILE`."),
    "pretrain": ("agentic_rl.train.pretrain", "PretrainConfig", "run",
                 "Train the embedded tokenizer and tiny Qwen3 base model on a synthetic arithmetic corpus."),
    "sft": ("agentic_rl.train.sft", "SFTConfig", "run", "Supervised fine-tuning (LoRA by default) with TRL's SFTTrainer."),
    "grpo": ("agentic_rl.train.grpo", "GRPOConfig", "run",
             "Group Relative Policy Optimization with TRL's GRPOTrainer and verifiable rewards."),
    "reward-model": ("agentic_rl.train.reward_model", "RewardModelConfig", "run",
                     "Train a reward model on preference pairs (prompt/chosen/rejected) with TRL's RewardTrainer."),
    "preferences": ("agentic_rl.data.preferences", "PreferencesConfig", "run",
                    "Sample k completions per prompt, score them with a judge (any reward), write best-vs-worst pairs."),
    "eval": ("agentic_rl.eval.evaluate", "EvalConfig", "run",
             "Evaluate one or more models: accuracy, pass@k, error analysis, report."),
    "quickstart": ("agentic_rl.pipeline", "QuickstartConfig", "run_quickstart",
                   "The whole embedded ladder on CPU: data, tiny base, SFT, GRPO, evaluation, export, report."),
    "pipeline": ("agentic_rl.pipeline", "PipelineConfig", "run_pipeline",
                 "The same ladder for any model and dataset, each stage switchable (see configs/)."),
    "compare": ("agentic_rl.eval.compare", "CompareConfig", "run",
                "GRPO vs its compute-matched SFT control over seeds: paired differences with 95-percent intervals."),
    "tune": ("agentic_rl.tune", "TuneConfig", "run", "Hyper-parameter search (grid, random, Bayesian) on Optuna."),
    "export": ("agentic_rl.deploy.export", "ExportConfig", "run",
               "Write a merged model directory that transformers and vLLM load as is."),
    "serve": ("agentic_rl.deploy.serve", "ServeConfig", "run",
              "Serve a model over an OpenAI-compatible HTTP API (127.0.0.1 by default)."),
}


def _load_command(name: str):
    module_name, config_name, run_name, _ = COMMANDS[name]
    module = importlib.import_module(module_name)
    return getattr(module, config_name), getattr(module, run_name), module


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    from agentic_rl.config import add_config_arguments

    parser = argparse.ArgumentParser(
        prog="agentic-rl",
        description="Train LLM agents with reinforcement learning: SFT with LoRA, GRPO with verifiable rewards, "
                    "evaluation, hyper-parameter search, export and serving.",
        epilog="Each command takes --config FILE.yaml; flags override the file. `agentic-rl COMMAND --help` lists "
               "every setting.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, _, _, help_text) in COMMANDS.items():
        if name != only:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        config_cls, _, module = _load_command(name)
        p = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--config", dest="_config_file", metavar="FILE.yaml", default=None,
                       help="YAML file with settings for this command (flags given here override it)")
        add_config_arguments(p, config_cls)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Build flags only for the command asked for: importing every stage (torch, TRL) costs seconds.
    command = next((a for a in argv if not a.startswith("-")), None)
    try:
        parser = build_parser(only=command if command in COMMANDS else None)
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return 0
        from agentic_rl.config import config_from_args

        config_cls, run, _ = _load_command(args.command)
        config = config_from_args(config_cls, args, yaml_path=args._config_file, section=args.command)
        run(config)
        return 0
    except AgenticRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: checkpoints saved so far are kept; run the same command with --resume to continue",
              file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
