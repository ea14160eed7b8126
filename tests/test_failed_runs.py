"""A run that fails leaves its directory as it found it, unless it saved checkpoints (kept for --resume): no
half-claimed directory (marker, config.yaml) that makes the next run refuse or compare against settings that never
trained anything. Names are checked before any data is prepared."""

from __future__ import annotations

import pytest
from conftest import eval_config, grpo_config, pretrain_config, write_jsonl
from transformers import TrainerCallback

from agentic_rl.cli import main
from agentic_rl.errors import ConfigError, ModelLoadError, TrainingError
from agentic_rl.runs import RUN_MARKER, StageRun, has_run, read_marker


class FailAtStep(TrainerCallback):
    """Fails the run at the end of optimizer step ``step`` (after the checkpoints of earlier steps were saved)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise TrainingError(f"failed at step {self.step}")


def test_a_grpo_run_that_fails_before_its_first_checkpoint_leaves_no_directory(tiny_model_dir, tmp_path):
    from agentic_rl.train.grpo import run

    out = tmp_path / "grpo"
    with pytest.raises(TrainingError, match="failed at step 1"):
        run(grpo_config(tiny_model_dir, out, save_steps=100, completions_every=0), callbacks=[FailAtStep(1)])
    assert not out.exists()
    # the same directory with other settings and --resume: no "trained with other settings" from a run that never was
    result = run(grpo_config(tiny_model_dir, out, learning_rate=0.01, resume=True, max_steps=1))
    assert result["steps"] == 1 and (out / "stage.json").is_file()


def test_a_pretraining_run_that_fails_before_its_first_checkpoint_leaves_no_directory(monkeypatch, tmp_path):
    from agentic_rl.models import tiny
    from agentic_rl.train.pretrain import run

    def full_disk(*args, **kwargs):
        raise TrainingError("no space left on the device")

    out = tmp_path / "pretrain"
    monkeypatch.setattr(tiny, "save_model_dir", full_disk)
    with pytest.raises(TrainingError, match="no space left"):
        run(pretrain_config(out))
    assert not out.exists()


def test_a_failed_grpo_run_keeps_an_existing_directory_and_its_checkpoints(tiny_model_dir, tmp_path):
    from agentic_rl.train.grpo import run

    empty, out = tmp_path / "empty", tmp_path / "grpo"
    empty.mkdir()
    with pytest.raises(TrainingError):
        run(grpo_config(tiny_model_dir, empty, save_steps=100, completions_every=0), callbacks=[FailAtStep(1)])
    assert empty.is_dir() and not has_run(empty)  # made by the user: kept, and empty again

    config = grpo_config(tiny_model_dir, out, max_steps=3, completions_every=0)
    with pytest.raises(TrainingError, match="failed at step 2"):
        run(config, callbacks=[FailAtStep(2)])
    assert (out / "checkpoint-1").is_dir() and read_marker(out)["kind"] == "grpo" and (out / "config.yaml").is_file()
    resumed = grpo_config(tiny_model_dir, out, max_steps=3, completions_every=0, resume=True)
    assert StageRun(out, resumed, stage="grpo").check(announce=False).endswith("checkpoint-1")


def test_an_eval_that_fails_on_its_model_leaves_no_directory_behind(tmp_path):
    from agentic_rl.eval.evaluate import run

    out = tmp_path / "eval"
    with pytest.raises(ModelLoadError):
        run(eval_config(tmp_path / "no-such-model", out))
    assert not out.exists()

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "config.yaml").write_text("models: [an earlier run]\n")
    (earlier / "metrics.json").write_text("{}\n")
    with pytest.raises(ModelLoadError):
        run(eval_config(tmp_path / "no-such-model", earlier))
    assert (earlier / "config.yaml").read_text() == "models: [an earlier run]\n"  # the earlier run's, put back
    assert (earlier / "metrics.json").read_text() == "{}\n" and not (earlier / RUN_MARKER).exists()


def test_an_eval_on_bad_data_fails_before_the_run_directory_is_made(tmp_path, capsys):
    data = write_jsonl(tmp_path / "bad.jsonl", [{"question": "1 + 1?", "answer": "2"}, {"question": "no answer"}])
    out = tmp_path / "eval"
    assert main(["eval", str(tmp_path / "model"), "--dataset", str(data), "--output-dir", str(out)]) == 2
    assert capsys.readouterr().err.count("error: ") == 1
    assert not out.exists()


@pytest.mark.parametrize("command", [["grpo", "--model", "some/model"], ["eval", "some/model"]])
def test_a_misspelt_reward_fails_before_any_data_is_loaded(monkeypatch, tmp_path, capsys, command):
    import agentic_rl.data.custom as custom

    def untouchable(*args, **kwargs):
        raise AssertionError("the dataset was loaded before the reward names were checked")

    monkeypatch.setattr(custom, "load_task_dataset", untouchable)
    code = main([*command, "--reward", "acuracy", "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "unknown reward 'acuracy' (did you mean 'accuracy'?)" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_reward_specs_are_checked_when_the_config_is_built(tmp_path):
    with pytest.raises(ConfigError, match=r"reward 'length' has no parameter 'alpah' \(did you mean 'alpha'\?\)"):
        grpo_config("m", tmp_path, rewards=["accuracy", "length(alpah=0.1)"])
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module'"):
        eval_config("m", tmp_path, rewards=["no_such_module:score"])
