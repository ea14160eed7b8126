"""Shared fixtures. Tests never touch the network (HF_HUB_OFFLINE=1) and keep torch to the machine's 2 cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

REPO_ROOT = Path(__file__).resolve().parents[1]
GSM8K_DIR = REPO_ROOT.parent / "shared" / "data" / "gsm8k"


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    """The real GSM8K files (MIT) beside the checkout; tests that need them skip cleanly when absent."""
    if not (GSM8K_DIR / "train.jsonl").is_file() or not (GSM8K_DIR / "test.jsonl").is_file():
        pytest.skip(f"real GSM8K files not found in {GSM8K_DIR}")
    return GSM8K_DIR
