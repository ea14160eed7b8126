"""Small shared utilities: run directories, seeding, device defaults, console output.

Kept deliberately small: stages share these helpers, not a base class.
"""

from __future__ import annotations

import json
import os
import random
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
    """The newest ``checkpoint-N`` folder a transformers ``Trainer`` wrote in ``path`` (None when there is none)."""
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(path)) if Path(path).is_dir() else None


def append_jsonl(path: str | Path, row: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(row, default=str) + "\n")
