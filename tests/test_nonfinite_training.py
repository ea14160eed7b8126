"""A run whose loss or weights become NaN/inf stops with a one-line error, keeps its last good checkpoint and
writes no final model (SFT, GRPO; pretraining and the agent stages use the same guard)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import grpo_config
from safetensors.torch import load_file
from transformers import TrainerCallback, TrainerControl

from agentic_rl.cli import main
from agentic_rl.errors import AgenticRLError, RewardError, TrainingError
from agentic_rl.models.loading import nonfinite_parameters
from agentic_rl.train import monitoring
from agentic_rl.train.monitoring import HealthCallback, NonFiniteGuard


def _poison(model) -> None:
    """What a diverged optimizer step leaves behind: NaN in a trainable weight."""
    with torch.no_grad():
        next(p for p in model.parameters() if p.requires_grad).view(-1)[0] = float("nan")


class PoisonAtStep(TrainerCallback):
    """Puts a NaN into a trainable weight right after the optimizer update of step ``step``, as a diverged update
    does."""

    def __init__(self, step: int):
        self.step = step

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step - 1:  # global_step counts the step once it has ended
            _poison(model)


# ---------------------------------------------------------------------------------------------------------------
# The guard on its own
# ---------------------------------------------------------------------------------------------------------------

def _args(**kw):
    return SimpleNamespace(**{"output_dir": None, "learning_rate": 1e-3, "fp16": False, **kw})


@pytest.mark.parametrize("logs", [{"loss": math.nan}, {"loss": math.inf}, {"grad_norm": math.nan},
                                  {"grad_norm": -math.inf}, {"eval_loss": math.nan}])
def test_a_non_finite_log_stops_training_and_vetoes_the_save(logs):
    guard, control, state = NonFiniteGuard(), TrainerControl(), SimpleNamespace(global_step=7)
    control.should_save = True
    guard.on_log(_args(), state, control, logs={"learning_rate": 1e-3, **logs})
    assert control.should_training_stop and not control.should_save
    with pytest.raises(TrainingError, match=r"^training stopped at step 7: the .* became .*no checkpoint was saved"):
        guard.on_train_end(_args(), state, control)


def test_finite_logs_and_fp16_overflow_steps_do_not_stop_training():
    guard, control, state = HealthCallback(), TrainerControl(), SimpleNamespace(global_step=3)
    guard.on_log(_args(), state, control, logs={"loss": 1.5, "grad_norm": 0.7})
    # fp16: the loss scaler skips a step whose gradients overflowed; only the weights tell real damage
    guard.on_log(_args(fp16=True), state, control, logs={"loss": 1.4, "grad_norm": math.inf})
    assert not control.should_training_stop and guard.problem is None
    guard.on_train_end(_args(), state, control)  # nothing to raise


def test_the_weights_are_checked_before_a_save_and_the_error_names_the_last_checkpoint(tmp_path, monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    # which checkpoints count as complete is utils.last_checkpoint's business (the SFT run below uses a real one)
    monkeypatch.setattr("agentic_rl.utils.last_checkpoint", lambda path: str(Path(path) / "checkpoint-4"))
    guard, control, state = NonFiniteGuard(), TrainerControl(), SimpleNamespace(global_step=6)
    control.should_save = True
    guard.on_step_end(_args(output_dir=str(tmp_path)), state, control, model=model)
    assert guard.problem is None and control.should_save  # clean weights: the save goes ahead
    _poison(model)
    guard.on_step_end(_args(output_dir=str(tmp_path)), state, control, model=model)
    assert not control.should_save and control.should_training_stop
    with pytest.raises(TrainingError, match=r"NaN/inf in 0\.weight.*last good checkpoint is .*checkpoint-4"):
        guard.on_train_end(_args(output_dir=str(tmp_path)), state, control)


def test_nonfinite_parameters_and_save_model_dir_refuse_broken_weights(tiny_model_dir, tmp_path):
    from agentic_rl.models import load_model_and_tokenizer, save_model_dir

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir, for_training=False)
    assert nonfinite_parameters(model) == []
    with torch.no_grad():
        model.model.norm.weight[1] = 1e30  # finite, though its norm overflows float32: not a broken weight
    assert nonfinite_parameters(model) == []
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
        model.model.norm.weight[0] = float("inf")
    assert nonfinite_parameters(model) == ["model.layers.0.mlp.up_proj.weight", "model.norm.weight"]
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] = 0.0
    assert nonfinite_parameters(model, trainable_only=True) == ["model.norm.weight"]
    with pytest.raises(TrainingError, match=r"not saving .*out: the weights hold NaN/inf \(model\.norm\.weight\)"):
        save_model_dir(model, tokenizer, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------------
# Real runs on the tiny model
# ---------------------------------------------------------------------------------------------------------------

def test_sft_that_diverges_exits_non_zero_keeps_the_good_checkpoint_and_writes_no_model(
        tiny_model_dir, tmp_path, monkeypatch, capsys):
    # The CLI cannot take a callback, so the stage's own health callback carries the poison in.
    poison = PoisonAtStep(3)
    monkeypatch.setattr(monitoring.HealthCallback, "on_optimizer_step", poison.on_optimizer_step, raising=False)
    out = tmp_path / "run"
    code = main(["sft", "--model", str(tiny_model_dir), "--output-dir", str(out), "--max-steps", "6",
                 "--save-steps", "2", "--max-train-samples", "48",
                 "--synthetic-test-size", "20", "--batch-size", "8", "--logging-steps", "1", "--report-to", "none",
                 "--max-length", "256"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and "Traceback" not in err
    assert len(errors) == 1 and errors[0].startswith("error: training stopped at step 3: ")
    assert "checkpoint-2" in errors[0]
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("checkpoint-"))
    assert checkpoints == ["checkpoint-2"]  # the good one is kept; none was written from the broken weights
    saved = load_file(str(out / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors"))
    assert all(torch.isfinite(t).all() for t in saved.values())
    assert not (out / "model").exists() and not (out / "adapter").exists()


REWARDS = '''
def half(completions, **kwargs):
    return [float(i % 2) for i in range(len(completions))]

def nan_in_training(completions, **kwargs):
    if "trainer_state" in kwargs and kwargs["trainer_state"].global_step >= 1:
        return [float("nan")] * len(completions)
    return [float(i % 2) for i in range(len(completions))]
'''


@pytest.fixture()
def reward_module(make_user_module):
    return make_user_module("guard_rewards", REWARDS)


def test_grpo_that_diverges_stops_with_an_error_and_no_merged_model(tiny_model_dir, tmp_path, reward_module):
    from agentic_rl.train.grpo import run

    out = tmp_path / "grpo"
    with pytest.raises(TrainingError, match=r"^training stopped at step 2: the weights became non-finite") as err:
        run(grpo_config(tiny_model_dir, out, max_steps=4, completions_every=0, rewards=[f"{reward_module}:half"]),
            callbacks=[PoisonAtStep(2)])
    assert "checkpoint-1" in str(err.value)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-1"]
    assert not (out / "model").exists() and not (out / "adapter").exists()


def test_grpo_with_a_reward_that_turns_nan_stops_at_once_naming_the_reward(tiny_model_dir, tmp_path, reward_module):
    from agentic_rl.train.grpo import run

    out = tmp_path / "grpo"
    with pytest.raises(RewardError, match=rf"^user reward '{reward_module}:nan_in_training' returned nan") as err:
        run(grpo_config(tiny_model_dir, out, max_steps=4, completions_every=0,
                        rewards=[f"{reward_module}:nan_in_training"]))
    assert isinstance(err.value, AgenticRLError)
    assert not (out / "model").exists()
