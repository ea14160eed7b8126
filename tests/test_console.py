"""The console of a command: one line per stage (the full config only with --verbose), library warnings filtered
unless --verbose, the cost line after the second step, and a one-line error on its own line after a progress bar."""

from __future__ import annotations

import re
import sys
import warnings

import pytest
from conftest import eval_config, grpo_config, sft_config

from agentic_rl.cli import main
from agentic_rl.config import save_config
from agentic_rl.console import summary_line
from agentic_rl.errors import TrainingError
from agentic_rl.train.monitoring import cost_line

COST = re.compile(r"cost: about (\d+) more steps x ([\d.]+) s/step = ~([\d.]+) min")


def _plant(monkeypatch, module: str, run) -> None:
    """Make ``agentic-rl <stage>`` call ``run`` instead of the stage (the command line looks it up by name)."""
    import importlib

    monkeypatch.setattr(importlib.import_module(module), "run", run)


@pytest.mark.parametrize("command", ["pretrain", "sft", "grpo", "reward-model", "preferences", "eval", "tune",
                                     "export", "quickstart", "pipeline"])
def test_every_stage_command_takes_verbose(command):
    from agentic_rl.cli import build_parser

    parser = build_parser(only=command)
    assert "--verbose" in parser.command_flags
    args = parser.parse_args([command, "--verbose"])
    assert args._verbose is True and parser.parse_args([command])._verbose is False


def test_the_summary_line_holds_the_key_settings_on_one_line(tmp_path):
    config = sft_config("models/base", tmp_path / "sft", learning_rate=2e-4)
    line = summary_line("sft", config, tmp_path / "sft")
    assert "\n" not in line
    assert line.startswith("sft: model models/base, data synthetic, steps 2, batch 4, lr 0.0002 -> ")
    assert "epochs" not in line  # the step count decides, epochs would mislead
    assert "lora_dropout" not in line and "report_to" not in line


def test_in_an_environment_the_summary_line_names_the_episode_return_as_the_reward(tmp_path):
    """GRPO in an environment is rewarded with the episode return, not the reward functions of ``rewards``."""
    plain = summary_line("grpo", grpo_config("models/base", tmp_path / "grpo"))
    assert "rewards [accuracy:1.0, format:0.2]" in plain
    line = summary_line("grpo", grpo_config("models/base", tmp_path / "grpo", environment="calculator",
                                                   max_completion_length=64))
    assert "environment calculator, rewards [the episode return]," in line and "accuracy:1.0" not in line


@pytest.mark.parametrize("steps, seconds", [(98, 65.2), (3, 0.01), (1000, 4.5)])
def test_the_cost_line_multiplies_steps_by_seconds_per_step(steps, seconds):
    line = cost_line(steps, seconds)
    n, s, minutes = COST.search(line).groups()
    assert int(n) == steps and float(s) == pytest.approx(seconds, abs=0.005)
    assert float(minutes) == pytest.approx(steps * seconds / 60, abs=0.05)
    assert ("h)" in line) == (steps * seconds / 60 > 120)


def test_a_training_stage_prints_one_line_and_a_cost_line_not_its_config(tiny_model_dir, tmp_path, capfd):
    config_file = save_config(sft_config(tiny_model_dir, tmp_path / "sft", max_steps=4), tmp_path / "sft.yaml")
    assert main(["sft", "--config", str(config_file)]) == 0
    err = capfd.readouterr().err
    summary = [line for line in err.splitlines() if "] sft: model " in line]
    assert len(summary) == 1 and "steps 4, batch 4" in summary[0] and str(tmp_path / "sft") in summary[0]
    assert "(resolved) ==" not in err and "lora_dropout" not in err  # the full config is in config.yaml only
    assert "lora_dropout" in (tmp_path / "sft" / "config.yaml").read_text()
    assert "None -> None" not in err
    costs = COST.findall(err)
    assert len(costs) == 1, err  # printed once, after the second step
    n, s, minutes = costs[0]
    assert int(n) == 2  # 4 steps, measured on the second: two left
    assert 0 < float(s) < 60 and float(minutes) == pytest.approx(int(n) * float(s) / 60, abs=0.05)


def test_verbose_prints_every_resolved_setting(tiny_model_dir, tmp_path, capfd):
    config_file = save_config(eval_config(tiny_model_dir, tmp_path / "eval"), tmp_path / "eval.yaml")
    assert main(["eval", "--config", str(config_file), "--verbose"]) == 0
    err = capfd.readouterr().err
    assert len([line for line in err.splitlines() if "] eval: models " in line]) == 1
    assert "== eval (resolved) ==" in err and "num_examples" in err
    assert main(["eval", "--config", str(config_file), "--output-dir", str(tmp_path / "eval2")]) == 0
    err = capfd.readouterr().err
    assert "] eval: models " in err and "(resolved) ==" not in err and "num_examples" not in err


def _library_noise(config):
    """A stage stand-in that warns the way transformers does, and the way this project does."""
    import transformers.utils.logging as hf_logging

    from agentic_rl.utils import warn

    hf_logging.get_logger("transformers.tokenization_utils_base").warning(
        "Token indices sequence length is longer than the specified maximum sequence length for this model (600 > "
        "512). Running this sequence through the model will result in indexing errors")
    warnings.warn_explicit("`foo` is deprecated and will be removed in v6", FutureWarning, "modeling_utils.py", 1,
                           module="transformers.modeling_utils", registry={})
    warn("our own warning stays")
    return {}


@pytest.mark.parametrize("verbose", [False, True])
def test_library_warnings_are_filtered_unless_verbose(monkeypatch, capfd, caplog, verbose):
    _plant(monkeypatch, "agentic_rl.eval.evaluate", _library_noise)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["eval", "some-model", *(["--verbose"] if verbose else [])]) == 0
    err = capfd.readouterr().err
    assert "WARNING: our own warning stays" in err
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("transformers")]
    assert any("Token indices sequence length is longer" in m for m in logged) == verbose
    assert any("`foo` is deprecated" in str(w.message) for w in caught) == verbose
    import transformers.utils.logging as hf_logging

    assert hf_logging.get_verbosity() == hf_logging.WARNING  # the libraries' levels are restored afterwards


class _Trainer:
    """Holds its progress bar in a reference cycle, as a real trainer and its callbacks do."""

    def __init__(self):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=10, desc="training")
        self.me = self


@pytest.mark.parametrize("interrupted", [False, True])
def test_an_error_during_training_starts_on_its_own_line(monkeypatch, capsys, interrupted):
    def failing_run(config):
        trainer = _Trainer()
        trainer.bar.update(3)
        trainer.bar.refresh()
        raise KeyboardInterrupt() if interrupted else TrainingError("the reward failed at step 3")

    _plant(monkeypatch, "agentic_rl.eval.evaluate", failing_run)
    assert main(["eval", "some-model"]) == (130 if interrupted else 2)
    err = capsys.readouterr().err
    assert "3/10" in err  # the bar was drawn
    message = "interrupted: " if interrupted else "error: the reward failed at step 3"
    before, _, after = err.partition(message)
    assert before.endswith("\n") and after.count("\n") == 1 and after.endswith("\n"), repr(err)  # nothing after it
    assert type(sys.stderr).__name__ != "_LineTracker"  # the command hands stderr back


def test_the_cost_is_measured_on_the_second_step_of_this_run_and_printed_once(monkeypatch, capsys):
    import time
    from types import SimpleNamespace

    from agentic_rl.train.monitoring import StepCostCallback

    callback = StepCostCallback()
    state = SimpleNamespace(global_step=10, max_steps=20, is_world_process_zero=True)  # resumed at step 10
    callback.on_train_begin(None, state, None)
    clock = iter([100.0, 103.0])  # the ends of steps 11 and 12
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    for step in (11, 12, 13, 14):
        state.global_step = step
        callback.on_step_end(None, state, None)
    costs = COST.findall(capsys.readouterr().err)
    assert costs == [("8", "3.00", "0.4")]  # 8 steps left x 3 s = 24 s


@pytest.mark.parametrize("steps_per_generation, num_iterations, accumulation, cycle",
                         [(1, 2, 1, 2), (4, 1, 4, 1), (2, 3, 1, 6), (4, 2, 4, 2)])
def test_grpo_s_cost_is_measured_over_the_steps_between_two_generations(monkeypatch, capsys, steps_per_generation,
                                                                         num_iterations, accumulation, cycle):
    import time
    from types import SimpleNamespace

    from agentic_rl.train.monitoring import StepCostCallback

    # TRL's GRPO generates once every steps_per_generation x num_iterations micro-steps: the optimizer steps in
    # between only reuse the batch, so one of them alone would promise a run far shorter than it is
    args = SimpleNamespace(steps_per_generation=steps_per_generation, num_iterations=num_iterations,
                           gradient_accumulation_steps=accumulation)
    callback = StepCostCallback()
    state = SimpleNamespace(global_step=0, max_steps=100, is_world_process_zero=True)
    callback.on_train_begin(args, state, None)
    ends = {1: 10.0}  # step 1 ends at 10 s; each later cycle: one 4 s generating step, then 0.5 s reusing ones
    for step in range(2, 2 + cycle):
        ends[step] = ends[step - 1] + (4.0 if step % cycle == 0 else 0.5)
    monkeypatch.setattr(time, "perf_counter", lambda: ends[state.global_step])
    for step in sorted(ends):
        state.global_step = step
        callback.on_step_end(args, state, None)
    per_step = (4.0 + 0.5 * (cycle - 1)) / cycle
    costs = COST.findall(capsys.readouterr().err)
    assert costs == [(str(100 - 1 - cycle), f"{per_step:.2f}", f"{(100 - 1 - cycle) * per_step / 60:.1f}")]


FAILING_REWARD = '''
calls = []


def fails_on_the_second_batch(completions, **kwargs):
    calls.append(len(completions))
    if len(calls) == 2:
        raise ValueError("the scoring service went away")
    return [0.0] * len(completions)
'''


def test_grpo_failing_mid_training_prints_its_error_on_its_own_line(tiny_model_dir, tmp_path, capsys,
                                                                    make_user_module):
    module = make_user_module("console_failing_reward", FAILING_REWARD)
    config = grpo_config(tiny_model_dir, tmp_path / "grpo", max_steps=3,
                         rewards=[f"{module}:fails_on_the_second_batch"])
    assert main(["grpo", "--config", str(save_config(config, tmp_path / "grpo.yaml"))]) == 2
    err = capsys.readouterr().err
    before, found, after = err.partition("error: ")
    assert found and "the scoring service went away" in after and len(after.strip().splitlines()) == 1, err
    assert "1/3" in before and before.endswith("\n"), repr(before[-300:])  # the bar was drawn; the error is below it
