"""What a command prints: one line per stage with its key settings, and no library noise a user cannot act on.

Every stage announces itself with one line (:func:`announce`: model, data, steps, batch, learning rate, run
directory); the full resolved config is in the run directory's ``config.yaml`` and is printed only with
``--verbose``. The command line runs each command inside :func:`console_session`, which, unless ``--verbose`` is
given, filters the warnings of the libraries underneath (transformers, TRL, PEFT, accelerate, datasets, torch) that
say nothing a user can change: their deprecation notices, generation-config and tokenizer-length notices. This
project's own warnings (``agentic_rl.utils.warn``) are never filtered.

A one-line error must start on its own line even when a progress bar was drawing when the command failed:
:func:`end_open_line` ends the line that the last write to stderr left open.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: The libraries whose warnings a user cannot act on (their module names, as ``warnings`` sees them).
LIBRARY_MODULES = ("transformers", "trl", "peft", "accelerate", "datasets", "torch", "huggingface_hub", "tokenizers")
#: Messages filtered wherever they are raised from (a library warning whose ``stacklevel`` points at its caller).
LIBRARY_MESSAGES = (
    r"Token indices sequence length is longer than the specified maximum",
    r".*generation flags are not valid",
    r".*`generation_config` default values have been modified",
    r".*torch_dtype.* is deprecated",
)
#: The categories of library warnings filtered without ``--verbose``.
LIBRARY_CATEGORIES = (FutureWarning, DeprecationWarning, UserWarning)

#: Per stage, the settings its start line shows (those the config has and sets).
SUMMARY_KEYS: dict[str, tuple[str, ...]] = {
    "pretrain": ("model_preset", "corpus_lines", "seq_length", "max_steps", "epochs", "batch_size", "learning_rate"),
    "sft": ("model", "dataset", "environment", "max_steps", "epochs", "batch_size", "gradient_accumulation_steps",
            "learning_rate"),
    "grpo": ("model", "dataset", "environment", "rewards", "algorithm", "max_steps", "batch_size", "num_generations",
             "max_completion_length", "learning_rate"),
    "reward-model": ("model", "dataset", "max_steps", "epochs", "batch_size", "learning_rate"),
    "preferences": ("model", "dataset", "num_samples", "temperature", "judge"),
    "eval": ("models", "dataset", "split", "eval_samples", "environment", "num_samples", "max_new_tokens"),
    "pipeline": ("name", "model", "dataset", "stages", "eval_samples"),
    "export": ("source", "dtype"),
}
_LABELS = {"model_preset": "preset", "corpus_lines": "corpus lines", "seq_length": "sequence", "max_steps": "steps",
           "batch_size": "batch", "gradient_accumulation_steps": "accumulation", "learning_rate": "lr",
           "num_generations": "group", "max_completion_length": "completion tokens", "eval_samples": "samples",
           "num_samples": "samples per prompt", "max_new_tokens": "new tokens", "dataset": "data"}

#: Values a summary leaves out: they say nothing beyond the usual case.
_UNREMARKABLE = {"gradient_accumulation_steps": 1, "num_samples": 1, "algorithm": "grpo"}

_state = {"verbose": False, "line_open": False}


def is_verbose() -> bool:
    """Whether the command runs with ``--verbose`` (the full config printed, library warnings shown)."""
    return _state["verbose"]


def summary_line(stage: str, config: Any, out: str | Path | None = None, keys: tuple[str, ...] | None = None) -> str:
    """``"sft: model m, data synthetic, steps 100, batch 8, lr 0.0002 -> runs/sft"``: the settings of
    :data:`SUMMARY_KEYS` (or ``keys``) that ``config`` has and sets."""
    values = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    parts = []
    for key in keys if keys is not None else SUMMARY_KEYS.get(stage, ()):
        value = values.get(key)
        if value is None or value == [] or (key == "max_steps" and value == -1):
            continue
        if key == "epochs" and (values.get("max_steps") or -1) > 0:
            continue  # the step count decides
        if key in _UNREMARKABLE and value == _UNREMARKABLE[key]:
            continue
        if key == "rewards" and values.get("environment"):
            value = ["the episode return"]  # an environment's step rewards replace the reward functions
        if isinstance(value, float):
            value = f"{value:g}"
        elif isinstance(value, (list, tuple)):
            value = " ".join(map(str, value)) if key == "models" else ", ".join(map(str, value))
            value = f"[{value}]" if key != "models" else value
        elif isinstance(value, dict):
            value = json.dumps(value)
        parts.append(f"{_LABELS.get(key, key)} {value}")
    where = f" -> {out}" if out is not None else ""
    return f"{stage}: {', '.join(parts)}{where}"


def announce(stage: str, config: Any, out: str | Path | None = None, *, keys: tuple[str, ...] | None = None,
             line: str | None = None) -> None:
    """The one line a stage prints when it starts (``line``, or :func:`summary_line`); with ``--verbose`` the full
    resolved config follows it."""
    from agentic_rl.utils import log

    log(line if line is not None else summary_line(stage, config, out, keys))
    if is_verbose():
        from agentic_rl.config import format_config

        print(format_config(config, stage), file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# The session: library warnings, and whether stderr's last line is open
# ---------------------------------------------------------------------------------------------------------------

class _LineTracker:
    """Stands in for ``sys.stderr`` during a command and remembers whether the last write ended its line (a
    progress bar redraws its line with ``\\r`` and leaves it open)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if text:
            _state["line_open"] = not text.endswith("\n")
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def end_open_line() -> None:
    """Write a line break to stderr when the last write there left its line open (a progress bar was drawing)."""
    if _state["line_open"]:
        sys.stderr.write("\n")
        sys.stderr.flush()
    _state["line_open"] = False


def filter_library_warnings() -> None:
    """Hide the libraries' warnings a user cannot act on (call inside ``warnings.catch_warnings()``)."""
    pattern = rf"({'|'.join(LIBRARY_MODULES)})(\.|$)"
    for category in LIBRARY_CATEGORIES:
        warnings.filterwarnings("ignore", category=category, module=pattern)
    for message in LIBRARY_MESSAGES:
        warnings.filterwarnings("ignore", message=message)


@contextmanager
def console_session(verbose: bool = False) -> Iterator[None]:
    """Run a command with this module's console: quiet libraries unless ``verbose``; stderr's open line tracked.

    Everything is restored on exit (warning filters, the libraries' log levels, ``sys.stderr``), so a test or a
    program that runs several commands in one process is left as it was.
    """
    import datasets.utils.logging as datasets_logging
    import transformers.utils.logging as hf_logging

    previous_verbose, previous_stderr = _state["verbose"], sys.stderr
    # the libraries' own bars (datasets' "Map", TRL's "Tokenizing", transformers' "Loading weights"): seconds-long
    # steps a user cannot act on; the training and evaluation bars are ours (tqdm) and stay
    bars = (hf_logging.is_progress_bar_enabled(), datasets_logging.is_progress_bar_enabled())
    _state["verbose"], _state["line_open"] = verbose, False
    hf_level = hf_logging.get_verbosity()
    others = [logging.getLogger(name) for name in LIBRARY_MODULES if name != "transformers"]
    levels = [logger.level for logger in others]
    with warnings.catch_warnings():
        if not verbose:
            filter_library_warnings()
            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
            datasets_logging.disable_progress_bar()
            for logger in others:
                logger.setLevel(logging.ERROR)
        sys.stderr = _LineTracker(previous_stderr)
        try:
            yield
        finally:
            sys.stderr = previous_stderr
            hf_logging.set_verbosity(hf_level)
            (hf_logging.enable_progress_bar if bars[0] else hf_logging.disable_progress_bar)()
            (datasets_logging.enable_progress_bar if bars[1] else datasets_logging.disable_progress_bar)()
            for logger, level in zip(others, levels):
                logger.setLevel(level)
            _state["verbose"] = previous_verbose
