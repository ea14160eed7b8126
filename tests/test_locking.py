"""The run-directory lock across real processes: a second run into a held directory refuses in one line, the first
finishes intact, and the lock dies with its holder (even under ``kill -9``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentic_rl.locking import LOCK_FILE, RunDirectoryBusy, hold_run_lock

SRC = str(Path(__file__).resolve().parents[1] / "src")

# A stand-in for a stage: takes the lock, says it is ready, writes its result once told to finish.
HOLDER = """
import sys, time
from pathlib import Path
from agentic_rl.locking import hold_run_lock
run, what = Path(sys.argv[1]), sys.argv[2]
with hold_run_lock(run, what):
    (run / f"{what}.ready").write_text("ready")
    deadline = time.monotonic() + 60
    while not (run / "finish").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    (run / "result.txt").write_text(f"written by {what}")
"""

# A second run: takes the lock the way the CLI does, printing the one-line error and exiting 2 when refused.
CONTENDER = """
import sys
from pathlib import Path
from agentic_rl.errors import AgenticRLError
from agentic_rl.locking import hold_run_lock
run = Path(sys.argv[1])
try:
    with hold_run_lock(run, "second"):
        (run / "result.txt").write_text("written by second")
except AgenticRLError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
"""


def _python(code: str, *args: str, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def _wait_for(path: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_second_run_into_a_held_directory_refuses_and_the_first_finishes(tmp_path):
    run = tmp_path / "run"
    first = _python(HOLDER, str(run), "sft")
    try:
        _wait_for(run / "sft.ready", first)
        second = _python(CONTENDER, str(run))
        out, err = second.communicate(timeout=60)
        assert second.returncode == 2, (out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and str(run) in lines[0] and "in use by another run (sft, pid" in lines[0], err
        assert "--output-dir" in lines[0]
        assert not (run / "result.txt").exists()                 # the refused run wrote nothing
        (run / "finish").write_text("")
        assert first.wait(timeout=60) == 0, first.communicate()
    finally:
        if first.poll() is None:
            first.kill()
    assert (run / "result.txt").read_text() == "written by sft"  # the first run finished intact

    # the lock was released: the next run goes ahead
    again = _python(CONTENDER, str(run))
    assert again.wait(timeout=60) == 0, again.communicate()
    assert (run / "result.txt").read_text() == "written by second"


def test_the_lock_dies_with_a_killed_holder(tmp_path):
    run = tmp_path / "run"
    holder = _python(HOLDER, str(run), "grpo")
    _wait_for(run / "grpo.ready", holder)
    with pytest.raises(RunDirectoryBusy, match=r"in use by another run \(grpo, pid \d+\)"):
        with hold_run_lock(run, "eval"):
            pass
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=60)
    with hold_run_lock(run, "eval") as held:                       # no stale lock after kill -9
        assert held == run and (run / LOCK_FILE).is_file()
    assert not (run / "result.txt").exists()


def test_reentry_in_one_process_and_other_directories(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    with hold_run_lock(a, "pipeline"):
        with hold_run_lock(a, "sft"):                              # a stage inside a pipeline holding the directory
            with hold_run_lock(b, "eval"):                         # another directory is independent
                pass
        assert (a / LOCK_FILE).read_text().startswith("pipeline, pid ")
    # released on leaving, also after an exception inside the block
    with pytest.raises(ValueError):
        with hold_run_lock(a, "sft"):
            raise ValueError("boom")
    with hold_run_lock(a, "sft"):
        pass


# A stage as it runs: the lock held, its marker written (what claim() leaves), ready and finish files beside the run.
STAGE_HOLDER = """
import sys, time
from pathlib import Path
from agentic_rl.locking import hold_run_lock
from agentic_rl.runs import write_marker
run, what, signals = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
with hold_run_lock(run, what):
    write_marker(run, what)
    (signals / f"{what}.ready").write_text("ready")
    deadline = time.monotonic() + 120
    while not (signals / f"{what}.finish").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
"""


def test_a_stage_and_a_pipeline_refuse_a_directory_another_run_holds(tmp_path, tiny_model_dir, capsys):
    """The stages take the lock when they claim their directory, the pipeline for its whole run: a second run into a
    held directory stops with one line, before writing anything, and the holder's files stay as they were."""
    from agentic_rl.cli import main

    sft_dir, pipeline_dir = tmp_path / "sft", tmp_path / "ladder"
    holders = [_python(STAGE_HOLDER, str(sft_dir), "sft", str(tmp_path)),
               _python(STAGE_HOLDER, str(pipeline_dir), "pipeline", str(tmp_path))]
    try:
        _wait_for(tmp_path / "sft.ready", holders[0])
        _wait_for(tmp_path / "pipeline.ready", holders[1])
        before = {p.name: p.read_bytes() for p in sft_dir.iterdir()}
        code = main(["sft", "--model", str(tiny_model_dir), "--dataset", "synthetic", "--max-steps", "1",
                     "--max-train-samples", "8", "--eval-samples", "4", "--report-to", "none",
                     "--output-dir", str(sft_dir)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and "in use by another run (sft, pid" in err[-1], err
        assert {p.name: p.read_bytes() for p in sft_dir.iterdir()} == before
        code = main(["pipeline", "--config", str(Path(SRC) / "agentic_rl" / "configs" / "quickstart-smoke.yaml"),
                     "--output-dir", str(pipeline_dir)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and "in use by another run (pipeline, pid" in err[-1], err
        assert sorted(p.name for p in pipeline_dir.iterdir()) == sorted([".agentic-rl-run", LOCK_FILE])
        for holder, what in zip(holders, ("sft", "pipeline")):
            (tmp_path / f"{what}.finish").write_text("")
            assert holder.wait(timeout=60) == 0, holder.communicate()
    finally:
        for holder in holders:
            if holder.poll() is None:
                holder.kill()
