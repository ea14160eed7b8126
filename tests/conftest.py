"""Shared fixtures. Tests never touch the network (HF_HUB_OFFLINE=1) and keep torch to the machine's 2 cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Fixtures that build a model or run stages: a test that uses one (directly or through another fixture) is ``stage``.
STAGE_FIXTURES = {"tiny_model_dir", "qwen3_shape_dir", "smoke_run"}


def pytest_collection_modifyitems(config, items):
    """Test tiers (registered in pyproject.toml): ``slow`` and ``stage`` as marked by hand; else ``stage`` when the
    test uses a model fixture (:data:`STAGE_FIXTURES`), else ``unit``. Each test is in exactly one tier."""
    for item in items:
        if item.get_closest_marker("slow") or item.get_closest_marker("stage"):
            continue
        if STAGE_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.stage)
        else:
            item.add_marker(pytest.mark.unit)
GSM8K_DIR = REPO_ROOT.parent / "shared" / "data" / "gsm8k"


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    """The real GSM8K files (MIT) beside the checkout; tests that need them skip cleanly when absent."""
    if not (GSM8K_DIR / "train.jsonl").is_file() or not (GSM8K_DIR / "test.jsonl").is_file():
        pytest.skip(f"real GSM8K files not found in {GSM8K_DIR}")
    return GSM8K_DIR


# --- model fixtures (owned by the model/SFT helper; additive) --------------------------------------------------------

@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A saved random-init micro Qwen3 (2 layers, hidden 64) + the embedded BPE tokenizer with chat template.

    Loads with ``AutoModelForCausalLM/AutoTokenizer.from_pretrained``; eos = ``<|im_end|>``, pad = ``<|endoftext|>``.
    Built in a few seconds; untrained, so it writes gibberish — use it for plumbing, not for learning.
    """
    from agentic_rl.data.synthetic import default_tokenizer_corpus
    from agentic_rl.models.tiny import build_tiny_model, save_model_dir, train_tokenizer

    path = tmp_path_factory.mktemp("tiny_model")
    tokenizer = train_tokenizer(default_tokenizer_corpus(2000, seed=0), vocab_size=512)
    model = build_tiny_model(tokenizer, "micro", seed=0)
    return save_model_dir(model, tokenizer, path)


@pytest.fixture(scope="session")
def qwen3_shape_dir(tmp_path_factory) -> Path:
    """Stand-in for ``Qwen/Qwen3-0.6B``: a random-init model with the real Qwen3-0.6B config keys and structure
    (Qwen3ForCausalLM, head_dim 128, GQA 2:1, q/k-norm, tied embeddings, rope 1e6) scaled to 2 layers / hidden 128,
    with a tokenizer whose chat template has Qwen3's thinking behaviour (``enable_thinking=False`` -> empty think block).
    """
    from agentic_rl.data.synthetic import default_tokenizer_corpus
    from agentic_rl.models.tiny import (QWEN3_STYLE_CHAT_TEMPLATE, build_qwen3_shape_model, save_model_dir,
                                        train_tokenizer)

    path = tmp_path_factory.mktemp("qwen3_shape")
    tokenizer = train_tokenizer(default_tokenizer_corpus(2000, seed=1), vocab_size=512,
                                chat_template=QWEN3_STYLE_CHAT_TEMPLATE)
    model = build_qwen3_shape_model(tokenizer, seed=0)
    return save_model_dir(model, tokenizer, path)


@pytest.fixture
def lm_head_calls(monkeypatch) -> list[tuple[int, bool]]:
    """Every call of TRL's fused LM head (``ChunkedLogProbFunction`` as ``trl.trainer.utils`` uses it) while the
    test runs: (positions projected, whether TRL then scores labelled positions only). The calls still compute."""
    import trl.trainer.utils as trl_utils

    function, calls = trl_utils._ChunkedLogProbFunction, []

    class Recording:
        @staticmethod
        def apply(hidden, *args):
            calls.append((hidden.shape[0], trl_utils._use_triton(hidden.device)))
            return function.apply(hidden, *args)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Recording)
    return calls
