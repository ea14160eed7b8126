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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RUNS_ROOT = Path(os.environ.get("AGENTIC_RL_RUNS", "runs"))


MAX_NAME_BYTES = 255  # one file or folder name (Linux, macOS and Windows file systems alike)


def output_path(output_dir: str | Path) -> Path:
    """A user's ``--output-dir`` as a path: ``~`` expanded, every folder name short enough for the file system, and
    not an existing file; a one-line :class:`ConfigError` otherwise (before anything is created)."""
    from agentic_rl.errors import ConfigError

    path = Path(os.path.expanduser(str(output_dir)))
    long = next((part for part in path.parts if len(os.fsencode(part)) > MAX_NAME_BYTES), None)
    if long is not None:
        raise ConfigError(f"output directory {str(path)[:80]}...: the folder name {long[:40]!r}... is longer than "
                          f"{MAX_NAME_BYTES} bytes, more than the file system allows; choose a shorter --output-dir")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output directory {path} exists and is a file, not a folder; choose another --output-dir")
    return path


def run_dir(output_dir: str | Path | None, default_name: str) -> Path:
    """The run directory for a stage: ``output_dir`` if given (see :func:`output_path`), else
    ``runs/<default_name>``; created."""
    from agentic_rl.errors import ConfigError

    path = output_path(output_dir) if output_dir else RUNS_ROOT / default_name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a parent that is a file, no permission, a full disk, a path too long
        raise ConfigError(f"cannot create the output directory {path}: {exc.strerror or exc}; choose another "
                          "--output-dir") from None
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


def world_size() -> int:
    """Processes training together (``accelerate launch`` / torchrun set ``WORLD_SIZE``; 1 otherwise)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def supports_bf16() -> bool:
    """A GPU that computes in bfloat16 (weights may be loaded in bf16 there)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def cpu_computes_bf16() -> bool:
    """The CPU has bfloat16 dot-product instructions (AVX512-BF16 or AMX-BF16). There torch's bf16 matmuls run 3-4x
    faster than fp32 (oneDNN); elsewhere they are emulated and slower, so mixed precision stays off. A process whose
    torch kernels are restricted below AVX512 (``ATEN_CPU_CAPABILITY=avx2``, as when measuring what an AVX2-only CPU
    does) counts as one without them."""
    import torch

    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return False
    capabilities = torch.cpu.get_capabilities()
    return bool(capabilities.get("avx512_bf16") or capabilities.get("amx_bf16"))


def default_mixed_precision() -> bool:
    """Default of the training stages' ``bf16`` setting (fp32 weights, bf16 autocast): on where the hardware computes
    bf16 natively, a GPU that supports it or a CPU with bf16 instructions."""
    return supports_bf16() if has_gpu() else cpu_computes_bf16()


def free_memory() -> None:
    """Collect a finished model before the next one loads (several models in one process must not pile up)."""
    import gc

    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def log(message: str) -> None:
    """Console line for a stage (stderr keeps stdout clean for machine-readable output), written above a running
    progress bar rather than into its line."""
    from tqdm.auto import tqdm

    tqdm.write(f"[agentic-rl {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr)
    sys.stderr.flush()


def warn(message: str) -> None:
    log(f"WARNING: {message}")


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


MAX_NESTING = 100  # arrays/objects read from user JSON or YAML nest at most this deep (rows and configs need ~5)
_JSON_STRUCTURE_RE = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')
INT_DIGITS_LIMIT = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 4300
_LONG_DIGITS_RE = re.compile(rf"\d{{{INT_DIGITS_LIMIT + 1},}}")


def nesting_depth(value: Any, limit: int = MAX_NESTING, max_containers: int | None = None) -> int | None:
    """How deep lists and dicts nest in ``value`` (a scalar is 0), counted without recursion; stops past ``limit``
    (so a structure that contains itself ends too). None when more than ``max_containers`` lists/dicts are met:
    YAML aliases can expand a small file into an exponential tree."""
    deepest, seen, stack = 0, 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple, dict)):
            seen += 1
            if max_containers is not None and seen > max_containers:
                return None
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_json(text: str, max_depth: int = MAX_NESTING) -> Any:
    """``json.loads`` that fails only with ``json.JSONDecodeError`` (message and position of the problem): also on
    arrays/objects nested deeper than ``max_depth`` (Python's own limit would raise ``RecursionError``) and on
    integers longer than Python converts from text (``ValueError``), so that every caller's one-line error applies."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        value = None
    except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
        long = _LONG_DIGITS_RE.search(text)
        raise json.JSONDecodeError(f"a number with more than {INT_DIGITS_LIMIT} digits", text,
                                   long.start() if long else 0) from None
    else:
        if nesting_depth(value, max_depth) <= max_depth:  # JSON has no aliases: at most one visit per value
            return value
    raise json.JSONDecodeError(f"arrays/objects nested deeper than {max_depth} levels", text,
                               _first_position_deeper_than(text, max_depth)) from None


def _first_position_deeper_than(text: str, max_depth: int) -> int:
    depth = 0
    for m in _JSON_STRUCTURE_RE.finditer(text):
        token = m.group()
        if token == "[" or token == "{":
            depth += 1
            if depth > max_depth:
                return m.start()
        elif token == "]" or token == "}":
            depth -= 1
    return 0


def iter_jsonl(path: str | Path, *, skip_bad_lines: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` for each line of a JSONL file: the project's one JSONL reader (blank lines are skipped,
    a UTF-8 byte-order mark is allowed).

    A line that is not UTF-8, not JSON or not a JSON object is a one-line :class:`~agentic_rl.errors.DataError`
    ``"<path> line N: ..."``; with ``skip_bad_lines`` such lines are skipped and counted in one warning instead (for
    caches and logs whose last line may have been cut short when their writer was killed).
    """
    from agentic_rl.errors import DataError

    path = Path(path)
    bad = 0
    with path.open("rb") as fh:
        for lineno, data in enumerate(fh, start=1):
            try:
                row = _jsonl_row(data, first=lineno == 1)
            except ValueError as exc:
                if not skip_bad_lines:
                    raise DataError(f"{path} line {lineno}: {exc}") from None
                bad += 1
                continue
            if row is not None:
                yield lineno, row
    if bad:
        warn(f"skipped {bad} unreadable line(s) of {path}")


def _jsonl_row(data: bytes, *, first: bool) -> dict[str, Any] | None:
    """One JSONL line as a row (None when blank); a ``ValueError`` saying what is wrong with it otherwise."""
    try:
        line = data.decode("utf-8-sig" if first else "utf-8").rstrip("\r\n")  # a cut string ends at the line
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start} of the line)") from None
    if not line.strip():
        return None
    try:
        row = parse_json(line)
    except json.JSONDecodeError as exc:
        # json's "Unterminated string starting at" already ends in "at"
        raise ValueError(f"malformed JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    return row


def read_jsonl(path: str | Path, *, skip_bad_lines: bool = False) -> list[dict[str, Any]]:
    """The rows of a JSONL file (:func:`iter_jsonl`, the same one-line errors); ``[]`` when it does not exist."""
    path = Path(path)
    if not path.is_file():
        return []
    return [row for _, row in iter_jsonl(path, skip_bad_lines=skip_bad_lines)]


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
