"""The Makefile's install commands (dry runs: ``make -n``, nothing is installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.skipif(shutil.which("make") is None, reason="needs make")]

REPO = Path(__file__).resolve().parents[1]


def pip_commands(tmp_path: Path, **env_changes: str | None) -> list[str]:
    """The pip lines ``make install`` would run for a new virtual environment under ``tmp_path``."""
    env = dict(os.environ)
    for name, value in env_changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    out = subprocess.run(["make", "-n", "-B", "install", f"VENV={tmp_path / 'venv'}"], cwd=REPO, env=env,
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if " -m pip install " in line]


def test_install_leaves_byte_compiling_to_first_import_where_python_writes_bytecode(tmp_path):
    lines = pip_commands(tmp_path, PYTHONDONTWRITEBYTECODE=None)
    assert len(lines) == 2  # the package, then the extras the tests need
    assert all("--no-compile" in line and "-c constraints.txt" in line for line in lines)


@pytest.mark.parametrize("value", ["1", "x"])
def test_install_byte_compiles_where_python_never_writes_bytecode(tmp_path, value):
    lines = pip_commands(tmp_path, PYTHONDONTWRITEBYTECODE=value)
    assert len(lines) == 2
    assert not any("--no-compile" in line for line in lines)
