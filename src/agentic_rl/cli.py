"""The ``agentic-rl`` command: one sub-command per stage, each a thin shell over a stage function.

Every stage module exposes a typed ``Config`` dataclass and a ``run(config)`` function; flags are generated from the
config's fields (so ``--help`` lists every setting with its help and default), ``--config FILE.yaml`` loads values that
flags then override, ``--verbose`` prints every resolved setting and the libraries' warnings
(:mod:`agentic_rl.console`), and user errors print as one line instead of a traceback, on a line of their own.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from agentic_rl.errors import AgenticRLError
from agentic_rl.stages import STAGES

#: Command name -> stage record (the one table of stages, :mod:`agentic_rl.stages`).
COMMANDS = STAGES


def _load_command(name: str):
    stage = STAGES[name]
    config_cls, run = stage.load()
    return config_cls, run, importlib.import_module(stage.module)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    from agentic_rl.config import add_config_arguments

    parser = argparse.ArgumentParser(
        prog="agentic-rl", allow_abbrev=False,  # --learning-rat must not pass for --learning-rate
        description="Train LLM agents with reinforcement learning: SFT with LoRA, GRPO with verifiable rewards, "
                    "evaluation, hyper-parameter search, export and serving.",
        epilog="Each command takes --config FILE.yaml; flags override the file. `agentic-rl COMMAND --help` lists "
               "every setting.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, stage in COMMANDS.items():
        help_text = stage.help
        if name != only:
            sub.add_parser(name, help=help_text, add_help=False, allow_abbrev=False)
            continue
        config_cls, _, module = _load_command(name)
        p = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip(),
                           formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
        p.add_argument("--config", dest="_config_file", metavar="FILE.yaml", default=None,
                       help="YAML file with settings for this command (flags given here override it)")
        p.add_argument("--verbose", dest="_verbose", action="store_true", default=False,
                       help="print every resolved setting (not only the one-line summary; they are in the run "
                            "directory's config.yaml either way) and the libraries' own warnings")
        parser.command_flags = ["--config", "--verbose", "--help", *add_config_arguments(p, config_cls)]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Build flags only for the command asked for: importing every stage (torch, TRL) costs seconds.
    command = next((a for a in argv if not a.startswith("-")), None)
    try:
        parser = build_parser(only=command if command in COMMANDS else None)
        args, unknown = parser.parse_known_args(argv)
        if unknown and args.command:
            from agentic_rl.config import unknown_flag_error

            raise unknown_flag_error(unknown, getattr(parser, "command_flags", []), args.command)
        if unknown:
            parser.parse_args(argv)  # argparse's own message for arguments before any command
        if not args.command:
            parser.print_help()
            return 0
        from agentic_rl.config import config_from_args
        from agentic_rl.console import console_session

        config_cls, run, _ = _load_command(args.command)
        config = config_from_args(config_cls, args, yaml_path=args._config_file, section=args.command)
        with console_session(verbose=args._verbose):
            run(config)
        return 0
    except AgenticRLError as exc:
        message = f"error: {exc}"
    except OSError as exc:
        from agentic_rl.models.loading import DISK_FULL_ERRNOS

        if exc.errno not in DISK_FULL_ERRNOS:
            raise
        # e.g. a checkpoint the trainer writes mid-run (model folders are saved whole or not at all)
        message = (f"error: the disk is full ({exc.filename or 'while writing'}); free some space and run the same "
                   "command with --resume")
    except KeyboardInterrupt:
        print("\ninterrupted: checkpoints saved so far are kept; run the same command with --resume to continue",
              file=sys.stderr)
        return 130
    _end_progress_line()  # outside the handler: the failed run's objects (and their progress bars) are released
    print(message, file=sys.stderr)
    return 2


def _end_progress_line() -> None:
    """Let the error start on its own line: progress bars of the failed run are closed (collected) and a line that
    a bar left open is ended."""
    import gc

    from agentic_rl.console import end_open_line

    gc.collect()
    end_open_line()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
