"""Shared fixtures, the stage config factories and JSONL helpers. Tests never touch the network (HF_HUB_OFFLINE=1)
and keep torch to the machine's 2 cores."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

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
    with a tokenizer whose chat template has Qwen3's thinking behaviour (``enable_thinking=False`` -> empty think
    block).
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


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    """The micro model's tokenizer, one per test module (tests may change its padding side)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def make_user_module(tmp_path, monkeypatch):
    """Write a module the way a user puts one on PYTHONPATH (rewards, an environment):
    ``make_user_module(name, source)`` writes ``<tmp_path>/<name>.py``, makes it importable and returns ``name``; the
    import is forgotten afterwards."""
    names = []

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


def write_jsonl(path: Path, rows) -> Path:
    """Write ``rows`` to ``path`` as a user's JSONL file: one JSON object a line."""
    path = Path(path)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL file a run wrote: one JSON object a line, no blank lines."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def script_module(path: str):
    """The module of a script of the repository, ``path`` from its root (``benchmarks/`` and ``scripts/`` hold scripts,
    not packages)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(path).stem, REPO_ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def detail_sentences() -> list[re.Pattern]:
    """One pattern per detail sentence the synthetic generator can add (``distractors``), its number as group 1."""
    from agentic_rl.data.synthetic import DISTRACTORS, NAMES

    names = "(?:" + "|".join(name for name, _ in NAMES) + ")"
    return [re.compile(re.escape(t).replace(r"\{d\}", r"(\d+)").replace(r"\{friend\}", names)
                       .replace(r"\{name\}", names)) for t in DISTRACTORS]


# --- one config factory per stage: the small, fast settings the stage tests share --------------------------------
# Each takes the model (or models) and the output folder, and the settings the test is about as overrides. Built with
# config_from_dict, as a YAML file or the CLI would build them, so a misspelt override fails with the config's error.

def _config(cls: type, values: dict[str, Any], overrides: dict[str, Any]):
    from agentic_rl.config import config_from_dict

    return config_from_dict(cls, {**values, **overrides})


def grpo_config(model, out, **overrides):
    """A GRPO run of 2 steps: groups of 2 over 8 training rows, 6-token completions, a checkpoint each step, no
    held-out checks, no logging backend."""
    from agentic_rl.train.grpo import GRPOConfig

    return _config(GRPOConfig, dict(
        model=str(model), output_dir=str(out), max_steps=2, num_generations=2, batch_size=4, max_completion_length=6,
        max_train_samples=8, gradient_accumulation_steps=1, heldout_every=0, save_steps=1, learning_rate=0.05,
        report_to=["none"]), overrides)


def sft_config(model, out, **overrides):
    """An SFT run of 2 steps of 4 rows from 16 training rows (20 held-out rows), sequences up to 128 tokens, every
    step logged, no logging backend."""
    from agentic_rl.train.sft import SFTConfig

    return _config(SFTConfig, dict(
        model=str(model), output_dir=str(out), max_steps=2, batch_size=4, max_train_samples=16,
        synthetic_test_size=20, max_length=128, logging_steps=1, report_to=["none"]), overrides)


def pretrain_config(out, **overrides):
    """Pretraining a micro model for 2 steps of 4 blocks of 32 tokens, on a 300-line corpus with a 300-token
    vocabulary, no logging backend."""
    from agentic_rl.train.pretrain import PretrainConfig

    return _config(PretrainConfig, dict(
        output_dir=str(out), corpus_lines=300, exclude_test=10, model_preset="micro", vocab_size=300, seq_length=32,
        max_steps=2, batch_size=4, report_to=["none"]), overrides)


def eval_config(models, out, **overrides):
    """Evaluating ``models`` (one path or a list) greedily on 2 synthetic problems with answers up to 4 tokens."""
    from agentic_rl.eval.evaluate import EvalConfig

    models = [str(m) for m in models] if isinstance(models, (list, tuple)) else [str(models)]
    return _config(EvalConfig, dict(models=models, output_dir=str(out), eval_samples=2, max_new_tokens=4), overrides)


def reward_model_config(model, dataset, out, **overrides):
    """A reward-model run of 2 steps of 4 pairs from ``dataset``, every step logged, no logging backend."""
    from agentic_rl.train.reward_model import RewardModelConfig

    return _config(RewardModelConfig, dict(
        model=str(model), dataset=str(dataset), output_dir=str(out), max_steps=2, batch_size=4, logging_steps=1,
        report_to=["none"]), overrides)


def episode_batch(trainer_class, model_dir, tokenizer, tmp_path, rows, rollout, *, max_completion_length,
                  **trainer_kwargs):
    """One generation batch of ``trainer_class`` (a TRL GRPOTrainer or a subclass) on the micro model with the
    episode ``rollout``: rows 0, 0, 1, 1 of ``rows`` (two groups of 2, as TRL's sampler repeats each prompt), the
    episode return as the reward, β = 0. Returns (trainer, batch, the inputs as TRL left them)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    from agentic_rl.agent.rollout import trajectory_return_reward

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer.padding_side = "left"
    args = GRPOConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4,
                      generation_batch_size=4, max_completion_length=max_completion_length, max_steps=1,
                      report_to=[], use_cpu=True, beta=0.0, gradient_checkpointing=False, logging_steps=1)
    trainer = trainer_class(model=AutoModelForCausalLM.from_pretrained(model_dir),
                            reward_funcs=[trajectory_return_reward], args=args,
                            train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in rows]),
                            processing_class=tokenizer, rollout_func=rollout, **trainer_kwargs)
    trainer.model.train()  # as inside trainer.train(): metrics go to the "train" bucket
    inputs = [{"prompt": rows[k]["prompt"]} for k in (0, 0, 1, 1)]
    return trainer, trainer._generate_and_score_completions(inputs), inputs


def loss_gradient(trainer, batch, monkeypatch):
    """d loss / d per-token log-prob of the batch (TRL's _compute_loss, β = 0)."""
    captured = {}
    original = trainer._get_per_token_logps_and_entropies

    def logps_as_leaf(*a, **kw):
        logps, entropies, aux = original(*a, **kw)
        captured["logps"] = logps.detach().requires_grad_(True)
        return captured["logps"], entropies, aux

    monkeypatch.setattr(trainer, "_get_per_token_logps_and_entropies", logps_as_leaf)
    trainer.current_gradient_accumulation_steps = 1  # set by trainer.train()'s loop
    trainer._compute_loss(trainer.model, batch).backward()
    return captured["logps"].grad
