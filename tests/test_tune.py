"""Hyper-parameter search: the search-space syntax, the strategies, the shared study, outputs, and real stage trials.

Fast tests drive the real worker loop (``tune.optimize``: Optuna storage, samplers, heartbeats) with a cheap
numeric objective; the slow tests run real SFT trials on the tiny model in two worker processes at once.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from optuna.storages import RetryHeartbeatStaleTrialCallback

from agentic_rl.errors import ConfigError
from agentic_rl.tune import (TuneConfig, grid_size, grid_values, optimize, parse_param, parse_space, validate_space,
                             write_outputs)

# tune relies on Optuna's heartbeats and retry callback, which Optuna marks experimental.
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


def _trials(tmp_path: Path, study_name: str = "tune-sft"):
    import optuna

    return optuna.load_study(study_name=study_name, storage=_url(tmp_path)).get_trials()


# ---------------------------------------------------------------------------------------------------------------
# Search space: plain YAML entries
# ---------------------------------------------------------------------------------------------------------------

LR = {"type": "float", "low": 1.0e-6, "high": 1.0e-4, "log": True}


def test_parse_every_kind():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    assert parse_param("lr", LR) == FloatDistribution(1e-6, 1e-4, log=True)
    assert parse_param("lr", {"type": "float", "low": "1e-6", "high": 1.0e-4}) == FloatDistribution(1e-6, 1e-4)
    beta = {"type": "categorical", "choices": [0.01, 0.05]}
    assert parse_param("beta", beta) == CategoricalDistribution([0.01, 0.05])
    assert parse_param("lora_r", [8, 16, 32]).choices == (8, 16, 32)  # a plain list is a categorical entry
    assert grid_values("w", parse_param("w", {"type": "float", "low": 0, "high": 0.2, "step": 0.05})) == \
        [0.0, 0.05, 0.1, 0.15, 0.2]
    assert grid_values("g", parse_param("g", {"type": "int", "low": 2, "high": 8, "step": 2})) == [2, 4, 6, 8]
    assert parse_param("n", {"type": "int", "low": 1, "high": 64, "log": True}) == IntDistribution(1, 64, log=True)
    assert parse_param("x", ["dapo", True, None, -1.5]).choices == ("dapo", True, None, -1.5)


@pytest.mark.parametrize("entry, fragment", [
    ("loguniform(1e-6, 1e-4)", "expected a mapping with type float, int or categorical"),
    ({"type": "normal", "low": 0, "high": 1}, "expected a mapping with type"),
    ({"low": 0, "high": 1}, "expected a mapping with type"),
    ({"type": "float", "low": 0, "high": 1, "scale": "log"}, "unknown key(s) 'scale' for type float"),
    ({"type": "categorical", "choices": [1], "step": 1}, "unknown key(s) 'step'"),
    ({"type": "float", "low": 1, "high": 0}, "needs low < high"),
    ({"type": "float", "low": 0, "high": 1, "step": 0.3}, "not a multiple of step"),
    ({"type": "float", "low": 0, "high": 1, "step": -0.5}, "step > 0"),
    ({"type": "float", "low": 0, "high": 1, "log": True}, "low"),               # Optuna's own check, named
    ({"type": "float", "low": 1e-3, "high": 1, "log": True, "step": 0.1}, "step"),
    ({"type": "float", "low": 0, "high": 1, "log": "yes"}, "log must be true or false"),
    ({"type": "int", "low": 1.5, "high": 4}, "low must be an integer"),
    ({"type": "int", "low": 0, "high": 8, "log": True}, "low"),
    ({"type": "float", "low": 0, "high": float("inf")}, "high must be a finite number"),
    ({"type": "float", "low": 0, "high": True}, "high must be a finite number"),
    ({"type": "int", "low": 1}, "needs low and high"),
    ({"type": "categorical", "choices": []}, "non-empty list"),
    ({"type": "categorical", "choices": [{"a": 1}]}, "list of distinct numbers, strings or true/false/null"),
    ([8, 8], "non-empty list of distinct"),
])
def test_parse_rejects_with_a_message(entry, fragment):
    with pytest.raises(ConfigError) as err:
        parse_param("p", entry)
    assert fragment in str(err.value)
    assert str(err.value).startswith("search space 'p': ") and "\n" not in str(err.value)


def test_flags_override_yaml_space():
    space = parse_space({"learning_rate": LR, "beta": [0.0, 0.1]},
                        ["beta={type: categorical, choices: [0.01, 0.05]}",
                         "lora-r={type: int, low: 8, high: 32, step: 8}", "warmup_ratio=[0.0, 0.1]"])
    assert space["beta"].choices == (0.01, 0.05)
    assert grid_values("lora_r", space["lora_r"]) == [8, 16, 24, 32]
    assert space["warmup_ratio"].choices == (0.0, 0.1) and space["learning_rate"].log
    with pytest.raises(ConfigError, match="NAME=ENTRY"):
        parse_space({}, ["beta:[1, 2]"])
    with pytest.raises(ConfigError, match="the entry is not YAML"):
        parse_space({}, ["beta={type: "])


def test_grid_needs_discrete_values():
    with pytest.raises(ConfigError, match="grid search needs discrete values for 'lr'"):
        grid_size(parse_space({"lr": LR, "r": [8, 16]}))
    with pytest.raises(ConfigError, match="grid search needs discrete values for 'n'"):
        grid_size(parse_space({"n": {"type": "int", "low": 1, "high": 64, "log": True}}))
    assert grid_size(parse_space({"a": [1, 2, 3], "b": {"type": "int", "low": 0, "high": 3},
                                  "c": {"type": "float", "low": 0, "high": 1, "step": 0.5}})) == 3 * 4 * 3


def test_unknown_or_invalid_stage_keys_are_named():
    from agentic_rl.train.grpo import GRPOConfig

    base = {"model": "some/model"}
    with pytest.raises(ConfigError) as err:
        validate_space(GRPOConfig, parse_space({"learning_rat": LR, "betta": [0.1]}), base,
                       "random")
    assert "'learning_rat'" in str(err.value) and "'betta'" in str(err.value)
    assert "did you mean 'learning_rate'" in str(err.value)
    # the value has the wrong type for the field
    with pytest.raises(ConfigError, match="lora_r"):
        validate_space(GRPOConfig, parse_space({"lora_r": {"type": "float", "low": 8, "high": 32}}), base, "random")
    # the stage config's own validation rejects a choice value, before any trial runs
    with pytest.raises(ConfigError, match=r"num_generations.*value 1"):
        validate_space(GRPOConfig, parse_space({"num_generations": [1, 8]}), base, "grid")
    with pytest.raises(ConfigError, match="output_dir"):
        validate_space(GRPOConfig, parse_space({"output_dir": ["a", "b"]}), base, "grid")
    with pytest.raises(ConfigError, match="empty"):
        validate_space(GRPOConfig, {}, base, "random")


def test_base_values_reject_unknown_fixed_keys(tmp_path):
    from agentic_rl.train.grpo import GRPOConfig
    from agentic_rl.tune import base_values

    with pytest.raises(ConfigError, match="'max_stepz'.*did you mean 'max_steps'"):
        base_values(TuneConfig(stage="grpo", fixed={"max_stepz": 3}), GRPOConfig)
    pipeline_yaml = tmp_path / "pipe.yaml"
    pipeline_yaml.write_text(yaml.safe_dump({"model": "Qwen/Qwen3-0.6B", "dataset": "gsm8k", "seed": 7,
                                             "grpo": {"beta": 0.05, "lora_r": 16}, "sft": {"x": 1}}))
    values = base_values(TuneConfig(stage="grpo", base_config=str(pipeline_yaml), budget_steps=5), GRPOConfig)
    assert values == {"model": "Qwen/Qwen3-0.6B", "dataset": "gsm8k", "seed": 7, "beta": 0.05, "lora_r": 16,
                      "max_steps": 5, "eval_samples": 64}  # the validation slice trials are scored on
    values = base_values(TuneConfig(stage="grpo", base_config=str(pipeline_yaml), seed=3), GRPOConfig)
    assert values["seed"] == 3


# ---------------------------------------------------------------------------------------------------------------
# Strategies and the shared study (real Optuna storage, cheap objective)
# ---------------------------------------------------------------------------------------------------------------

def _recording_objective(seen: list):
    def objective(trial, params):
        seen.append(dict(params))
        trial.set_user_attr("stage_config", {"model": "m", **params})
        return float(sum(v for v in params.values() if isinstance(v, (int, float)) and not isinstance(v, bool)))

    return objective


def test_grid_enumerates_exactly_the_cartesian_product(tmp_path):
    space = parse_space({"a": [1, 2, 3], "b": {"type": "int", "low": 10, "high": 11}, "c": ["x", "y"]})
    seen: list = []
    config = TuneConfig(search="grid", seed=0)
    optimize(config, space, _recording_objective(seen), _url(tmp_path), grid_size(space))
    got = [(p["a"], p["b"], p["c"]) for p in seen]
    assert len(got) == 12 and len(set(got)) == 12
    assert set(got) == set(itertools.product([1, 2, 3], [10, 11], ["x", "y"]))
    # running again does nothing: the study already holds every grid point
    optimize(config, space, _recording_objective(seen), _url(tmp_path), grid_size(space))
    assert len(seen) == 12


def test_random_respects_every_range(tmp_path):
    space = parse_space({"lr": LR, "w": {"type": "float", "low": -0.5, "high": 0.25},
                         "s": {"type": "float", "low": 0, "high": 1, "step": 0.25},
                         "n": {"type": "int", "low": 3, "high": 7},
                         "m": {"type": "int", "low": 1, "high": 64, "log": True},
                         "k": {"type": "int", "low": 2, "high": 10, "step": 4}, "r": [8, 16, 32]})
    seen: list = []
    optimize(TuneConfig(search="random", seed=1), space, _recording_objective(seen), _url(tmp_path), 50)
    assert len(seen) == 50
    for p in seen:
        assert 1e-6 <= p["lr"] <= 1e-4
        assert -0.5 <= p["w"] <= 0.25
        assert p["s"] in (0.0, 0.25, 0.5, 0.75, 1.0)
        assert isinstance(p["n"], int) and 3 <= p["n"] <= 7
        assert isinstance(p["m"], int) and 1 <= p["m"] <= 64
        assert p["k"] in (2, 6, 10)
        assert p["r"] in (8, 16, 32)
    # independent draws cover the ranges (log-uniform spreads over both decades)
    lrs = [p["lr"] for p in seen]
    assert sum(x < 1e-5 for x in lrs) > 12 and sum(x > 1e-5 for x in lrs) > 12
    assert {p["n"] for p in seen} == {3, 4, 5, 6, 7} and {p["r"] for p in seen} == {8, 16, 32}


def test_bayes_search_improves_on_a_simple_objective(tmp_path):
    space = parse_space({"x": {"type": "float", "low": -3, "high": 3}})
    values: list = []

    def objective(trial, params):
        values.append(-(params["x"] - 1.0) ** 2)
        return values[-1]

    optimize(TuneConfig(search="bayes", seed=0), space, objective, _url(tmp_path), 16)
    assert len(values) == 16
    assert max(values[5:]) > -0.05  # after its 5 random start-up trials, TPE closes in on the optimum


def test_interrupted_grid_resumes_and_still_covers_the_grid(tmp_path):
    space = parse_space({"a": [1, 2], "b": [3, 4, 5]})
    seen: list = []
    config = TuneConfig(search="grid", seed=0)

    def interrupted(trial, params):
        if len(seen) == 2:
            seen.append(None)
            raise KeyboardInterrupt
        return _recording_objective(seen)(trial, params)

    with pytest.raises(KeyboardInterrupt):
        optimize(config, space, interrupted, _url(tmp_path), 6)
    optimize(config, space, _recording_objective(seen), _url(tmp_path), 6)
    from optuna.trial import TrialState

    done = [(t.params["a"], t.params["b"]) for t in _trials(tmp_path) if t.state == TrialState.COMPLETE]
    assert sorted(done) == sorted(itertools.product([1, 2], [3, 4, 5]))


_WORKER = textwrap.dedent("""
    import json, os, sys, time
    from agentic_rl.tune import TuneConfig, optimize, parse_space
    url, n, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    space = parse_space({"lr": {"type": "float", "low": 1e-6, "high": 1e-4, "log": True}, "r": [8, 16, 32, 64]})
    def objective(trial, params):
        time.sleep(0.3)  # long enough for the two workers to interleave
        with open(log, "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "number": trial.number, **params}) + "\\n")
        return params["lr"]
    optimize(TuneConfig(search=sys.argv[4], seed=0), space, objective, url, n)
""")


def test_two_workers_share_one_sqlite_study(tmp_path, search="bayes"):
    log = tmp_path / "ran.jsonl"
    n = 8
    cmd = [sys.executable, "-c", _WORKER, _url(tmp_path), str(n), str(log), search]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    from optuna.trial import TrialState

    rows = [json.loads(line) for line in log.read_text().splitlines()]
    numbers = [r["number"] for r in rows]
    trials = _trials(tmp_path)
    complete = sorted(t.number for t in trials if t.state == TrialState.COMPLETE)
    assert sorted(numbers) == complete and len(complete) == n        # N trials in total, none run twice
    assert len({r["pid"] for r in rows}) == 2                        # both workers took part
    assert len({(r["lr"], r["r"]) for r in rows}) == n               # no proposal duplicated across workers
    # A trial two workers started at the instant the budget filled is failed before it samples or trains anything.
    assert all(t.state == TrialState.FAIL and not t.params for t in trials if t.number not in complete)


_DYING_WORKER = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from agentic_rl.tune import TuneConfig, optimize, parse_space
    url, n, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    space = parse_space({"lr": {"type": "float", "low": 1e-6, "high": 1e-4, "log": True}, "r": [8, 16, 32, 64]})
    def objective(trial, params):
        trial_dir = out / "trials" / str(trial.number)
        (trial_dir / "checkpoints" / "checkpoint-1").mkdir(parents=True)
        (trial_dir / "checkpoints" / "checkpoint-1" / "model.safetensors").write_bytes(b"weights")
        (trial_dir / "adapter").mkdir()
        (trial_dir / "config.yaml").write_text("lr: 1\\n")
        if trial.number == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-trial, with weights on disk
        time.sleep(0.3)
        return params["lr"]
    config = TuneConfig(search="random", seed=0, heartbeat_interval=1, grace_period=3)  # a dead worker: found in 3 s
    optimize(config, space, objective, url, n, trials_dir=out / "trials")
""")


def _assert_killed_trial_was_rerun(tmp_path: Path, n: int) -> None:
    from optuna.trial import TrialState

    trials = {t.number: t for t in _trials(tmp_path)}
    assert trials[1].state == TrialState.FAIL
    assert sum(t.state == TrialState.COMPLETE for t in trials.values()) == n and len(trials) == n + 1
    retry = [t for t in trials.values() if RetryHeartbeatStaleTrialCallback.retried_trial_number(t) == 1]
    assert len(retry) == 1 and retry[0].params == trials[1].params and retry[0].state == TrialState.COMPLETE
    killed = tmp_path / "trials" / "1"
    assert sorted(p.name for p in killed.iterdir()) == ["config.yaml"]  # weights gone, config kept
    for number in trials:  # every other trial's folder is untouched
        if number != 1:
            assert (tmp_path / "trials" / str(number) / "checkpoints" / "checkpoint-1" / "model.safetensors").exists()


def test_a_killed_worker_s_trial_is_rerun_by_the_other_worker(tmp_path):
    n = 4
    cmd = [sys.executable, "-c", _DYING_WORKER, _url(tmp_path), str(n), str(tmp_path)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert sorted(p.returncode for p in procs) == [-9, 0], outputs  # one worker was killed, the other finished
    _assert_killed_trial_was_rerun(tmp_path, n)


def test_a_worker_killed_before_optunas_heartbeat_thread_ran_is_found_stale(tmp_path):
    """Optuna's heartbeat thread starts beside the objective; a worker can die before it records anything. Here it
    never runs (start and join do nothing): only the heartbeat the trial records when it starts makes it stale."""
    script = _DYING_WORKER.replace("from agentic_rl.tune import", "from optuna.storages import _heartbeat\n"
                                   "_heartbeat.HeartbeatThread.start = _heartbeat.HeartbeatThread.join = "
                                   "lambda self: None\nfrom agentic_rl.tune import")
    n = 4
    cmd = [sys.executable, "-c", script, _url(tmp_path), str(n), str(tmp_path)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    try:
        outputs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert sorted(p.returncode for p in procs) == [-9, 0], outputs
    _assert_killed_trial_was_rerun(tmp_path, n)


def test_rerunning_after_a_lone_worker_was_killed_completes_the_study(tmp_path):
    n = 3
    cmd = [sys.executable, "-c", _DYING_WORKER, _url(tmp_path), str(n), str(tmp_path)]
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # waits for the stale heartbeat
    assert again.returncode == 0, again.stdout + again.stderr
    assert "worker" in again.stderr + again.stdout and "is gone" in again.stderr + again.stdout
    _assert_killed_trial_was_rerun(tmp_path, n)


# ---------------------------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------------------------

def test_outputs_best_yaml_loads_into_the_stage_and_the_pipeline(tmp_path):
    from agentic_rl.config import check_keys, config_to_dict, load_config
    from agentic_rl.pipeline import load_pipeline_config
    from agentic_rl.train.grpo import GRPOConfig
    from agentic_rl.tune_trials import build_stage_config

    space = parse_space({"learning_rate": {"type": "float", "low": 1e-6, "high": 1e-5, "log": True},
                         "beta": [0.01, 0.05, 0.1]})
    config = TuneConfig(stage="grpo", search="random", seed=0, trials=6)
    base = {"model": "Qwen/Qwen3-0.6B", "dataset": "gsm8k", "max_steps": 5, "seed": 0}

    def objective(trial, params):
        cfg = build_stage_config(GRPOConfig, base, params, tmp_path / "trials" / str(trial.number), where="t")
        trial.set_user_attr("stage_config", config_to_dict(cfg))
        return -abs(math.log10(params["learning_rate"]) + 5.5) + params["beta"]

    study = optimize(config, space, objective, _url(tmp_path), 6)["study"]
    result = write_outputs(config, study, tmp_path)
    best = study.best_trial
    assert result["best_trial"] == best.number and result["best_value"] == pytest.approx(best.value)

    stage_cfg = load_config(GRPOConfig, result["best_config"])
    assert stage_cfg.learning_rate == pytest.approx(best.params["learning_rate"])
    assert stage_cfg.beta == best.params["beta"] and stage_cfg.max_steps == 5 and stage_cfg.model == base["model"]
    assert stage_cfg.output_dir is None  # the rerun gets its own directory

    pipeline = load_pipeline_config(result["best_pipeline_config"])
    assert pipeline.stages == ["grpo"] and pipeline.model == base["model"] and pipeline.dataset == "gsm8k"
    check_keys(GRPOConfig, pipeline.grpo, where="best_pipeline.yaml")
    assert pipeline.grpo["learning_rate"] == pytest.approx(best.params["learning_rate"])

    rows = (tmp_path / "trials.csv").read_text().splitlines()
    assert len(rows) == 7 and rows[0].startswith("number,state,value")
    report = (tmp_path / "report.md").read_text()
    assert f"trial {best.number}" in report and "![optimization_history.png]" in report
    assert (tmp_path / "optimization_history.png").stat().st_size > 1000
    assert (tmp_path / "param_importances.png").stat().st_size > 1000


def test_cli_builds_the_tune_command():
    from agentic_rl.cli import build_parser
    from agentic_rl.config import config_from_args

    parser = build_parser(only="tune")
    args = parser.parse_args(["tune", "--stage", "grpo", "--search", "grid", "--param",
                              "beta={type: categorical, choices: [0.01, 0.05]}", "--param", "lora_r=[8, 16]",
                              "--trials", "4", "--no-prune", "--heartbeat-interval", "5", "--grace-period", "30"])
    config = config_from_args(TuneConfig, args)
    assert config.stage == "grpo" and config.search == "grid" and config.trials == 4 and config.prune is False
    assert config.params == ["beta={type: categorical, choices: [0.01, 0.05]}", "lora_r=[8, 16]"]
    assert (config.heartbeat_interval, config.grace_period) == (5, 30)
    space = parse_space({}, config.params)
    assert space["beta"].choices == (0.01, 0.05) and space["lora_r"].choices == (8, 16)
    with pytest.raises(ConfigError, match="grace_period \\(5\\) must be longer than heartbeat_interval \\(10\\)"):
        TuneConfig(grace_period=5)


def test_median_pruner_stops_trials_below_the_median(tmp_path):
    import optuna
    from optuna.trial import TrialState

    space = parse_space({"x": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]})

    def objective(trial, params):  # the learning curve of a trial: its x at every step
        for step in range(1, 4):
            trial.report(params["x"], step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return params["x"]

    study = optimize(TuneConfig(search="grid", prune_startup_trials=2), space, objective, _url(tmp_path), 8)["study"]
    trials = study.get_trials()
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert len(trials) == 8 and pruned                  # pruned trials count towards the budget
    for t in pruned:                                     # each was below the median of the trials before it
        earlier = [u.params["x"] for u in trials if u.number < t.number and u.state == TrialState.COMPLETE]
        assert len(earlier) >= 2 and t.params["x"] < sorted(earlier)[len(earlier) // 2] + 1e-9
    assert study.best_trial.params["x"] == 0.8
    assert write_outputs(TuneConfig(), study, tmp_path)["pruned"] == len(pruned)


# ---------------------------------------------------------------------------------------------------------------
# Real SFT trials in this process: a diverging trial, two studies in one run directory
# ---------------------------------------------------------------------------------------------------------------

def _tiny_sft_tune(tiny_model_dir, out: Path, **overrides) -> TuneConfig:
    spec = {"stage": "sft", "search": "grid", "seed": 0, "output_dir": str(out),
            "space": {"learning_rate": [1e-3, 2e-3]}, "prune": False, "budget_steps": 3, "eval_samples": 1,
            "max_new_tokens": 2, "fixed": {"model": str(tiny_model_dir), "max_train_samples": 8, "batch_size": 2,
                                           "report_to": "none", "save_steps": 1, "max_length": 128}}
    return TuneConfig(**{**spec, **overrides})


def test_a_diverging_trial_is_pruned_and_the_search_goes_on(tiny_model_dir, tmp_path, monkeypatch):
    """Trial 1's weights turn NaN after its second update (as a diverged step leaves them): the stage's guard raises
    TrainingError at the end of training. The search records the trial as pruned with the message, drops its
    checkpoint, runs the rest, and a re-run does not retry it."""
    import torch
    from optuna.trial import TrialState
    from transformers import TrainerCallback

    from agentic_rl import tune

    class PoisonAfterStep2(TrainerCallback):
        def on_optimizer_step(self, args, state, control, model=None, **kwargs):
            if state.global_step == 1:  # the second update (global_step counts a step once it has ended)
                with torch.no_grad():
                    next(p for p in model.parameters() if p.requires_grad).view(-1)[0] = float("nan")

    real_stage_class = tune.stage_class

    def stage_class(stage):
        cls, run = real_stage_class(stage)

        def run_poisoning_trial_1(cfg, callbacks=None):
            if Path(cfg.output_dir).name == "1":
                callbacks = [*(callbacks or []), PoisonAfterStep2()]
            return run(cfg, callbacks=callbacks)

        return cls, run_poisoning_trial_1

    monkeypatch.setattr(tune, "stage_class", stage_class)
    out = tmp_path / "search"
    config = _tiny_sft_tune(tiny_model_dir, out, space={"learning_rate": [1e-3, 2e-3, 3e-3]}, keep_models=True)
    result = tune.run(config)  # one diverging trial does not stop the search

    trials = {t.number: t for t in _trials(out)}
    assert len(trials) == 3 and trials[1].state == TrialState.PRUNED
    assert trials[1].user_attrs["diverged"].startswith("training stopped at step 2: ")
    assert trials[0].state == trials[2].state == TrialState.COMPLETE
    assert not any(RetryHeartbeatStaleTrialCallback.retried_trial_number(t) is not None for t in trials.values())
    assert {t.params["learning_rate"] for t in trials.values()} == {1e-3, 2e-3, 3e-3}  # every grid point ran once
    diverged = out / "trials" / "tune-sft" / "1"
    assert (diverged / "config.yaml").is_file() and not (diverged / "checkpoints").exists()  # weights dropped
    for kept in ("0", "2"):  # keep_models: the finished trials keep theirs
        assert (out / "trials" / "tune-sft" / kept / "adapter" / "adapter_model.safetensors").is_file()
    assert result["diverged"] == 1 and result["complete"] == 2
    assert "- trial 1: training stopped at step 2" in (out / "report.md").read_text()

    again = tune.run(config)  # the study is complete: nothing is retried
    assert again["ran_here"] == [] and len(_trials(out)) == 3


def test_two_studies_share_one_output_directory(tiny_model_dir, tmp_path):
    """Trial numbers restart at 0 in each study; each study's trials get their own folder, so a second study (another
    name, or the same name after study.db was deleted) does not meet the first one's finished trials/0 (which run
    safety refuses to overwrite)."""
    from optuna.trial import TrialState

    from agentic_rl.tune import run

    out = tmp_path / "search"
    for name in ("lr-small", "lr-large"):
        run(_tiny_sft_tune(tiny_model_dir, out, study_name=name, trials=1, budget_steps=1))
        assert [t.state for t in _trials(out, name)] == [TrialState.COMPLETE]
    (out / "study.db").unlink()
    run(_tiny_sft_tune(tiny_model_dir, out, study_name="lr-small", trials=1, budget_steps=1))
    assert [t.state for t in _trials(out, "lr-small")] == [TrialState.COMPLETE]
    for folder in ("lr-small", "lr-large", "lr-small-2"):  # each study's run kept, none overwritten
        assert json.loads((out / "trials" / folder / "0" / "tune_score.json").read_text())["trial"] == 0
    assert sorted(p.name for p in (out / "trials").iterdir()) == ["lr-large", "lr-small", "lr-small-2"]
    with pytest.raises(ConfigError, match="study_name 'a/b' must be a plain folder name"):
        TuneConfig(study_name="a/b")


# ---------------------------------------------------------------------------------------------------------------
# Real trials: SFT on the tiny model, two workers at once, then the best YAML rerun
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_two_sft_workers_then_the_best_yaml_reproduces_its_trial(tmp_path, tiny_model_dir):
    import os

    import torch
    from safetensors.torch import load_file

    from agentic_rl.config import load_config
    from agentic_rl.train.sft import SFTConfig
    from agentic_rl.tune_trials import load_heldout, score_model

    out = tmp_path / "search"
    spec = {"stage": "sft", "search": "random", "trials": 4, "seed": 0, "output_dir": str(out),
            "space": {"learning_rate": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
                             "lora_r": [4, 8]},
            "fixed": {"model": str(tiny_model_dir), "max_train_samples": 32, "batch_size": 4, "report_to": "none",
                      "logging_steps": 1},
            "budget_steps": 2, "eval_samples": 3, "max_new_tokens": 8, "prune_every": 1, "prune_samples": 2,
            "keep_models": True}
    config_path = tmp_path / "tune.yaml"
    config_path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "agentic_rl", "tune", "--config", str(config_path)]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]

    # four trials in total, each run by exactly one worker, each with its held-out score and intermediate reports
    import re

    started = [set(int(n) for n in re.findall(r"\] trial (\d+): \{", log)) for log in logs]
    assert started[0].isdisjoint(started[1]) and started[0] | started[1] == {0, 1, 2, 3}, started
    from optuna.trial import TrialState

    trials = _trials(out)
    assert len(trials) == 4 and all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert all(t.intermediate_values and min(t.intermediate_values) == 1 for t in trials)

    # the best YAML loads into the stage as is and, rerun with the same seed, reproduces the trial exactly
    import optuna

    best = optuna.load_study(study_name="tune-sft", storage=_url(out)).best_trial
    assert f"Best: trial {best.number}" in (out / "report.md").read_text()
    best_cfg = load_config(SFTConfig, out / "best_sft.yaml", {"output_dir": str(tmp_path / "rerun")})
    assert best_cfg.learning_rate == pytest.approx(best.params["learning_rate"]) and best_cfg.max_steps == 2
    # rerun as a user would (same environment as the workers: bitwise CPU results depend on the thread count)
    rerun_cmd = [sys.executable, "-m", "agentic_rl", "sft", "--config", str(out / "best_sft.yaml"),
                 "--output-dir", str(tmp_path / "rerun")]
    proc = subprocess.run(rerun_cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trial_dir = out / "trials" / "tune-sft" / str(best.number)
    original = load_file(str(trial_dir / "adapter" / "adapter_model.safetensors"))
    again = load_file(str(tmp_path / "rerun" / "adapter" / "adapter_model.safetensors"))
    assert original.keys() == again.keys()
    assert all(torch.equal(original[k], again[k]) for k in original)
    tune_config = TuneConfig(**{k: v for k, v in spec.items() if k in ("eval_samples", "max_new_tokens", "seed")})
    value, _ = score_model(tune_config, best_cfg, str(tmp_path / "rerun" / "model"),
                           load_heldout(tune_config, best_cfg, 3))
    assert value == pytest.approx(best.value)
    assert json.loads((trial_dir / "tune_score.json").read_text())["accuracy"] == pytest.approx(best.value)


_SFT_WORKER_KILLED_IN_TRIAL_0 = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from transformers import TrainerCallback
    from agentic_rl import tune
    from agentic_rl.cli import main

    class DieAfterCheckpoint(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)  # kill -9 right after a checkpoint reached the disk

    real_stage_class = tune.stage_class
    def stage_class(stage):
        cls, run = real_stage_class(stage)
        def run_and_die_in_trial_0(cfg, callbacks=None):
            if Path(cfg.output_dir).parts[-3:] == ("trials", "tune-sft", "0"):
                callbacks = [*(callbacks or []), DieAfterCheckpoint()]
            return run(cfg, callbacks=callbacks)
        return cls, run_and_die_in_trial_0
    tune.stage_class = stage_class
    sys.exit(main(["tune", "--config", sys.argv[1]]))
""")


@pytest.mark.slow
def test_real_sft_trial_killed_mid_training_is_cleaned_and_rerun(tmp_path, tiny_model_dir):
    """The lone worker is killed during trial 0's training; re-running the command removes that trial's
    checkpoints, reruns its parameters as trial 1 and finishes the study, which keeps trial 1's weights
    (keep_models)."""
    import os

    from optuna.trial import TrialState

    out = tmp_path / "search"
    spec = {"stage": "sft", "search": "random", "trials": 1, "seed": 0, "output_dir": str(out),
            "space": {"learning_rate": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
            "heartbeat_interval": 1, "grace_period": 2,
            "fixed": {"model": str(tiny_model_dir), "max_train_samples": 16, "batch_size": 4, "report_to": "none",
                      "save_steps": 1},
            "budget_steps": 2, "eval_samples": 2, "max_new_tokens": 4, "prune": False, "keep_models": True}
    config_path = tmp_path / "tune.yaml"
    config_path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, "-c", _SFT_WORKER_KILLED_IN_TRIAL_0, str(config_path)], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stdout[-2000:] + killed.stderr[-2000:]
    # weights were on disk when it died
    assert (out / "trials" / "tune-sft" / "0" / "checkpoints" / "checkpoint-1").is_dir()

    again = subprocess.run([sys.executable, "-m", "agentic_rl", "tune", "--config", str(config_path)], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    trials = {t.number: t for t in _trials(out)}
    assert trials[0].state == TrialState.FAIL and trials[1].state == TrialState.COMPLETE and len(trials) == 2
    assert RetryHeartbeatStaleTrialCallback.retried_trial_number(trials[1]) == 0
    assert trials[1].params == trials[0].params
    trials_dir = out / "trials" / "tune-sft"
    assert not any((trials_dir / "0" / name).exists() for name in ("checkpoints", "adapter", "model"))
    assert (trials_dir / "0" / "config.yaml").is_file()       # what the trial was stays readable
    assert (trials_dir / "1" / "adapter" / "adapter_model.safetensors").is_file()  # the finished one keeps its
    assert "1 complete, 0 pruned, 0 diverged of 2 trials" in (out / "report.md").read_text()


def test_trials_are_scored_on_the_prompt_and_columns_they_were_trained_with(tiny_model_dir, tmp_path, monkeypatch):
    """A pipeline's system_prompt '' (no system message) and a custom dataset's column names reach the scoring: a
    trial trained on one prompt is never scored on another."""
    from agentic_rl.eval import validation
    from agentic_rl.tune import run

    scorer, scored = validation.score_heldout, []
    monkeypatch.setattr(validation, "score_heldout", lambda model, tok, rows, **kw: (scored.append(rows),
                                                                                     scorer(model, tok, rows, **kw))[1])

    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "test"):
        rows = [{"problem": f"What is {i} plus {i}?", "solution": f"{i} + {i} = {2 * i}\n#### {2 * i}"}
                for i in range(1, 9)]
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "search"
    run(_tiny_sft_tune(tiny_model_dir, out, space={"learning_rate": [1e-3]}, budget_steps=1, eval_samples=2,
                       fixed={"model": str(tiny_model_dir), "max_train_samples": 4, "batch_size": 2,
                              "report_to": "none", "save_steps": 1, "max_length": 128, "system_prompt": "",
                              "dataset": str(data), "question_field": "problem", "answer_field": "solution"}))
    score = json.loads(next((out / "trials").glob("*/0/tune_score.json")).read_text())
    assert score["metrics"]["n"] == 2 and len(scored) == 1
    # the question from the 'problem' column, no system message: the prompt the trial was trained with
    assert all(r["prompt"] == [{"role": "user", "content": r["question"]}] and r["question"].startswith("What is")
               for r in scored[0])
