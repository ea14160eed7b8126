"""The GRPO stage's trainer classes: every TRL method they override still has the signature it was written for, the
variant table picks the class and TRL config the settings call for, and no trainer class is built inside a function."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import trl

from agentic_rl.train import grpo_trainer
from agentic_rl.train.grpo import GRPOConfig
from agentic_rl.train.grpo_trainer import (OVERRIDDEN_TRL_METHODS, VARIANTS, RLOOEpisodeTrainer, RLOOTrainer,
                                           SignalGRPOTrainer, changed_trl_methods, trl_arguments, variant_for)
from agentic_rl.train.sft_trainer import LengthAwareTrainer

TRAIN_DIR = Path(grpo_trainer.__file__).parent
OUR_TRAINERS = {SignalGRPOTrainer: trl.GRPOTrainer, RLOOTrainer: trl.RLOOTrainer,
                RLOOEpisodeTrainer: trl.GRPOTrainer, LengthAwareTrainer: trl.SFTTrainer}


def test_every_overridden_trl_method_has_the_signature_it_was_written_for():
    problems = changed_trl_methods()
    assert not problems, ("TRL changed methods this project overrides (agentic_rl/train/grpo_trainer.py, "
                          "logprobs.py, sft_trainer.py); check each override against the new TRL, then update "
                          "OVERRIDDEN_TRL_METHODS and pyproject.toml's TRL range:\n" + "\n".join(problems))


def test_a_changed_signature_is_reported_with_the_method_and_both_signatures(monkeypatch):
    def _compute_loss(self, model, inputs, num_items_in_batch):  # a TRL release that added a parameter
        raise AssertionError("never called")

    import trl.trainer.utils as trl_utils

    monkeypatch.setattr(trl.GRPOTrainer, "_compute_loss", _compute_loss)
    monkeypatch.delattr(trl.GRPOTrainer, "_generate")
    monkeypatch.delattr(trl_utils, "_use_triton")
    problems = changed_trl_methods()
    assert len(problems) == 3
    assert any(p.startswith("trl.trainer.utils._use_triton is gone") for p in problems)
    assert any(p.startswith("trl.GRPOTrainer._generate is gone") for p in problems)
    assert any("trl.GRPOTrainer._compute_loss is now (self, model, inputs, num_items_in_batch)" in p
               and "written for (self, model, inputs)" in p for p in problems)


@pytest.mark.parametrize("ours", list(OUR_TRAINERS), ids=lambda c: c.__name__)
def test_every_trl_method_our_trainers_override_is_listed(ours):
    """An override of a TRL method not in OVERRIDDEN_TRL_METHODS would escape the signature check above."""
    base = OUR_TRAINERS[ours]
    overridden = set()
    for klass in ours.__mro__:
        if not klass.__module__.startswith("agentic_rl."):
            continue
        for name, value in vars(klass).items():
            if callable(value) and not name.startswith("__") and hasattr(base, name):
                overridden.add(f"{base.__name__}.{name}")
    assert overridden, f"{ours.__name__} overrides no TRL method"
    assert overridden <= OVERRIDDEN_TRL_METHODS.keys(), sorted(overridden - OVERRIDDEN_TRL_METHODS.keys())


def test_each_override_names_the_trl_method_it_replaces_and_the_version_checked():
    for ours, base in OUR_TRAINERS.items():
        for klass in [k for k in ours.__mro__ if k.__module__.startswith("agentic_rl.")]:
            for name, value in vars(klass).items():
                if callable(value) and not name.startswith("__") and hasattr(base, name):
                    doc = " ".join((inspect.getdoc(value) or "").split())
                    assert f"{name}``" in doc and "checked against TRL 1.16" in doc, f"{klass.__name__}.{name}"


@pytest.mark.parametrize("settings, trainer, trl_config", [
    ({}, SignalGRPOTrainer, trl.GRPOConfig),
    ({"preset": "tiny"}, SignalGRPOTrainer, trl.GRPOConfig),  # compact sampling
    ({"environment": "calculator"}, SignalGRPOTrainer, trl.GRPOConfig),
    ({"algorithm": "rloo"}, RLOOTrainer, trl.RLOOConfig),
    ({"algorithm": "rloo", "environment": "calculator"}, RLOOEpisodeTrainer, trl.GRPOConfig),
])
def test_the_variant_table_picks_the_trainer_and_trl_config(settings, trainer, trl_config, tmp_path):
    config = GRPOConfig(model="m", **settings)
    assert variant_for(config).trainer is trainer
    args = trl_arguments(config, tmp_path, [1.0])
    assert type(args) is trl_config
    # The settings both configs have reach TRL unchanged; the renamed ones under TRL's names.
    assert (args.learning_rate, args.max_steps, args.beta) == (config.learning_rate, config.max_steps, config.beta)
    assert args.per_device_train_batch_size == config.batch_size and args.output_dir == str(tmp_path)
    if trainer is RLOOEpisodeTrainer:  # RLOO's advantage is built from GRPO's unscaled one
        assert args.scale_rewards == "none"


def test_every_variant_is_reachable_from_a_config():
    reached = {(c.algorithm, grpo_trainer.sampling_of(c)) for c in [
        GRPOConfig(model="m"), GRPOConfig(model="m", generation_backend="compact"),
        GRPOConfig(model="m", environment="calculator"), GRPOConfig(model="m", algorithm="rloo"),
        GRPOConfig(model="m", algorithm="rloo", environment="calculator")]}
    assert reached == set(VARIANTS)


def test_no_class_is_defined_inside_a_function_in_train():
    nested = []
    for path in sorted(TRAIN_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                nested += [f"{path.name}:{inner.lineno} {inner.name}" for inner in ast.walk(node)
                           if isinstance(inner, ast.ClassDef)]
    assert not nested


def test_the_grpo_stage_module_stays_readable():
    assert len((TRAIN_DIR / "grpo.py").read_text().splitlines()) <= 500
