"""Small shared utilities: run directories, seeding, device defaults, console output.

Kept deliberately small: stages share these helpers, not a base class.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

RUNS_ROOT = Path(os.environ.get("AGENTIC_RL_RUNS", "runs"))


def run_dir(output_dir: str | Path | None, default_name: str) -> Path:
    """The run directory for a stage: ``output_dir`` if given, else ``runs/<default_name>``; created."""
    path = Path(output_dir) if output_dir else RUNS_ROOT / default_name
    path.mkdir(parents=True, exist_ok=True)
    return path


def set_seed(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:  # pragma: no cover
        pass
    import torch

    torch.manual_seed(seed)


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def supports_bf16() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def free_memory() -> None:
    """Collect a finished model before the next one loads (several models in one process must not pile up)."""
    import gc

    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def log(message: str) -> None:
    """Console line for a stage (stderr keeps stdout clean for machine-readable output)."""
    print(f"[agentic-rl {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    print(f"[agentic-rl {time.strftime('%H:%M:%S')}] WARNING: {message}", file=sys.stderr, flush=True)


def write_json(path: str | Path, data: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    return path


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def write_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row, default=str) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file written by :func:`write_jsonl` / :func:`append_jsonl`; ``[]`` when it does not exist."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_checkpoint(path: str | Path) -> str | None:
    """The newest *complete* ``checkpoint-N`` folder a transformers ``Trainer`` wrote in ``path`` (None when none).

    A checkpoint is complete when it holds ``trainer_state.json`` (the Trainer writes it last), readable model or
    adapter weights and the optimizer and scheduler state. A run killed while saving leaves the newest one
    incomplete: it is skipped with a warning and the previous complete one is returned, so ``--resume`` continues
    from there instead of failing with a traceback.
    """
    path = Path(path)
    if not path.is_dir():
        return None
    numbered = []
    for child in path.iterdir():
        match = re.fullmatch(r"checkpoint-(\d+)", child.name)
        if match and child.is_dir():
            numbered.append((int(match.group(1)), child))
    for _, checkpoint in sorted(numbered, reverse=True):
        problem = checkpoint_problem(checkpoint)
        if problem is None:
            return str(checkpoint)
        warn(f"{checkpoint} is incomplete ({problem}; was the run killed while saving?); using the checkpoint "
             "before it")
    return None


CHECKPOINT_WEIGHTS = ("model.safetensors", "adapter_model.safetensors", "model.safetensors.index.json",
                      "pytorch_model.bin", "adapter_model.bin", "pytorch_model.bin.index.json")


def checkpoint_problem(checkpoint: str | Path) -> str | None:
    """What makes a ``checkpoint-N`` folder unusable for resuming (None when it is complete)."""
    checkpoint = Path(checkpoint)
    state = checkpoint / "trainer_state.json"
    if not state.is_file():
        return "no trainer_state.json"
    try:
        json.loads(state.read_text())
    except ValueError:
        return "trainer_state.json is truncated"
    weights = [checkpoint / name for name in CHECKPOINT_WEIGHTS if (checkpoint / name).is_file()]
    if not weights:
        return "no model weights"
    for file in weights:
        if file.suffix == ".safetensors":
            try:
                from safetensors import safe_open

                with safe_open(str(file), framework="pt") as fh:
                    fh.keys()
            except Exception:  # a truncated file: safetensors checks the header against the file size
                return f"{file.name} is unreadable"
    for name in ("optimizer", "scheduler"):
        if not any(p.stat().st_size > 0 for p in checkpoint.glob(f"{name}.*")):
            return f"no {name} state"
    return None


def append_jsonl(path: str | Path, row: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(row, default=str) + "\n")
