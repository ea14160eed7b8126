"""One run per run directory: an exclusive OS lock held for as long as a stage writes into its directory.

    with hold_run_lock(run_dir, "sft"):
        ...  # write config.yaml, checkpoints, the final model, the run marker

A second run started into the same directory while the first holds the lock stops at once with one line naming the
directory and the run that holds it; the first is not disturbed. The lock is ``fcntl.flock`` on
``<run dir>/.agentic-rl-lock``: the operating system releases it when the holding process exits, however it exits
(Ctrl-C, a crash, ``kill -9``), so a stale lock never blocks the next run. Re-entering the lock for a directory this
process already holds (a pipeline whose stage calls another stage's code) is allowed. Where ``fcntl`` does not exist
(Windows) runs are not locked.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentic_rl.errors import AgenticRLError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_FILE", "RunDirectoryBusy", "hold_run_lock"]

LOCK_FILE = ".agentic-rl-lock"

_held: dict[str, int] = {}  # resolved run directory -> nesting depth, for this process
_held_guard = threading.Lock()


class RunDirectoryBusy(AgenticRLError):
    """Another run is writing into the same run directory."""


def _holder(fd: int) -> str:
    """What the lock file says about the run holding it ("sft, pid 123"), or "" when it says nothing readable."""
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return " ".join(text.split())[:120]


@contextmanager
def hold_run_lock(path: str | Path, what: str = "run") -> Iterator[Path]:
    """Hold the exclusive lock of run directory ``path`` (created if missing) for the ``with`` block.

    ``what`` names the run in the lock file (e.g. the stage name), so that a refused second run can say who holds the
    directory. Raises :class:`RunDirectoryBusy` (one line) when another process holds it.
    """
    directory = Path(path).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    key = str(directory.resolve())
    with _held_guard:
        if key in _held:
            _held[key] += 1
            reentered = True
        else:
            reentered = False
    if reentered or fcntl is None:
        try:
            yield directory
        finally:
            if reentered:
                with _held_guard:
                    _held[key] -= 1
        return

    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            raise RunDirectoryBusy(
                f"run directory {directory} is in use by another run{f' ({holder})' if holder else ''}; wait for "
                "it to finish or give this run another --output-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{' '.join(str(what).split())}, pid {os.getpid()}\n".encode(), 0)
        with _held_guard:
            _held[key] = 1
        try:
            yield directory
        finally:
            with _held_guard:
                _held.pop(key, None)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
