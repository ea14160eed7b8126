"""Hyper-parameter search over a training stage (SFT or GRPO) on Optuna: grid, random or Bayesian (TPE).

Each trial resolves the stage's config (``base_config``, then ``fixed``, then the sampled values), runs the stage for
``budget_steps`` steps and scores the model on held-out problems (greedy ``accuracy``, or the mean ``reward``);
every ``prune_every`` steps its held-out score goes to Optuna's MedianPruner. The search space is plain YAML, one
entry per stage setting (``--param NAME=ENTRY``, the entry in YAML flow style, adds or replaces one)::

    space:
      learning_rate: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}
      warmup_ratio: {type: float, low: 0.0, high: 0.2, step: 0.05}
      num_generations: {type: int, low: 2, high: 8, step: 2}
      lora_r: {type: categorical, choices: [8, 16, 32]}    # a plain list [8, 16, 32] means the same

``float`` and ``int`` take ``low``, ``high`` and either ``step`` or ``log``; ``categorical`` takes ``choices``.
Grid search needs discrete entries (categorical, int without ``log``, float with ``step``).

The study lives in an Optuna RDB storage (default ``<output_dir>/study.db``; running the command again resumes it,
and workers started with the same command share it). Optuna's machinery keeps the study whole: MaxTrialsCallback stops
every worker at ``trials`` (complete, pruned, running and queued trials count), heartbeats find a killed worker's
trial after ``grace_period`` seconds and RetryHeartbeatStaleTrialCallback queues its parameters again (three attempts
at most; tune deletes that trial's weights). A trial whose training diverges (the stage raises ``TrainingError``) is
recorded as pruned with its ``diverged`` message and is not rerun. See docs/tuning.md for the outputs
(``report.md``, ``trials.csv``, ``best_<stage>.yaml``, ``best_pipeline.yaml``, ``trials/<study>/<n>/``).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import difflib
import functools
import io
import json
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from agentic_rl import tune_trials
from agentic_rl.config import SEED_RANGE, check_range, config_to_dict, read_yaml, setting
from agentic_rl.console import announce
from agentic_rl.errors import ConfigError, TrainingError
from agentic_rl.stages import inherited_settings
from agentic_rl.tune_trials import Objective, make_objective
from agentic_rl.utils import log, run_dir, warn

STAGES = ("sft", "grpo")
# Trials that use up the budget: finished ones and those that will finish (a stale one is failed and queued again).
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
MAX_RETRIES = 2  # reruns of a parameter set whose worker died or was interrupted: three attempts in all
_ENTRY_KEYS = {"float": ("low", "high", "step", "log"), "int": ("low", "high", "step", "log"),
               "categorical": ("choices",)}
# Heartbeats, the retry callback and fail_stale_trials are marked experimental in Optuna; tune relies on them.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@dataclass
class TuneConfig:
    stage: str = setting("sft", "the stage to tune", choices=list(STAGES))
    search: str = setting("bayes", "grid (Cartesian product), random or bayes (TPE)",
                          choices=["grid", "random", "bayes"])
    trials: int | None = setting(None, "trials in the whole study, all workers together (default: grid size, or 20)")
    space: dict[str, Any] = setting({}, "search space: stage setting -> entry, e.g. {lora_r: [8, 16]} (docs/tuning.md)")
    params: list[str] = setting([], "a search-space entry NAME=ENTRY, e.g. 'lora_r={type: int, low: 8, high: 32, "
                                    "step: 8}'", flag="param")
    base_config: str | None = setting(None, "stage YAML, or pipeline YAML (its stage section and model/dataset/seed)")
    fixed: dict[str, Any] = setting({}, "stage settings of every trial, over base_config (e.g. {max_steps: 50})")
    budget_steps: int | None = setting(None, "training steps per trial (sets the stage's max_steps)")
    objective: str = setting("accuracy", "what a trial maximises on held-out problems: accuracy (greedy, strict) or "
                                         "reward (mean of the stage's reward functions)",
                             choices=["accuracy", "reward"])
    eval_samples: int = setting(64, "held-out problems each trial is scored on")
    eval_split: str | None = setting(None, "split of the held-out problems (default: a validation slice of the "
                                           "stage's training split, never trained on; 'test' warns)")
    max_new_tokens: int = setting(256, "generation length when scoring a trial")
    prune: bool = setting(True, "stop hopeless trials early (MedianPruner)")
    prune_every: int | None = setting(None, "steps between intermediate held-out scores (default: budget / 4)")
    prune_samples: int = setting(16, "held-out problems each intermediate score uses")
    prune_startup_trials: int = setting(3, "trials that always run to the end before pruning starts")
    storage: str | None = setting(None, "Optuna RDB URL shared by workers (default: sqlite:///<output_dir>/study.db)")
    study_name: str | None = setting(None, "study name in the storage (default: tune-<stage>)")
    heartbeat_interval: int = setting(10, "seconds between a worker's heartbeats for its running trial")
    grace_period: int = setting(60, "seconds without heartbeat after which a trial's worker counts as dead (rerun)")
    output_dir: str | None = setting(None, "run directory (default: runs/tune-<stage>)")
    seed: int | None = setting(None, "seed of the sampler and of every trial (default: the base config's, else 0)")
    keep_models: bool = setting(False, "keep every trial's weights in trials/<study>/<n>/")

    def __post_init__(self) -> None:
        check_range(self, ("trials", "budget_steps", "eval_samples", "prune_samples", "prune_every",
                           "max_new_tokens", "heartbeat_interval"), 1)
        check_range(self, "prune_startup_trials", 0)
        check_range(self, "seed", *SEED_RANGE)
        if self.grace_period <= self.heartbeat_interval:
            raise ConfigError(f"grace_period ({self.grace_period}) must be longer than heartbeat_interval "
                              f"({self.heartbeat_interval}): live workers' trials would be taken for dead ones")
        self.study_name = name = self.study_name or f"tune-{self.stage}"
        if name in (".", "..") or any(c in name for c in "/\\\0"):  # it names the trials/<study>/ folder
            raise ConfigError(f"study_name {name!r} must be a plain folder name (no '/', '\\', '.' or '..'): "
                              "trials are stored under trials/<study_name>/")


def _bound(value: Any, key: str, integer: bool, where: str) -> int | float:
    if isinstance(value, str) and not integer:  # YAML reads 1e-5 (no dot) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: {key} must be {'an integer' if integer else 'a finite number'}, got {value!r}")
    return value


def parse_param(name: str, entry: Any) -> BaseDistribution:
    """One search-space entry (a mapping with ``type``, or a list of choices) as an Optuna distribution."""
    where = f"search space '{name}'"
    entry = {"type": "categorical", "choices": entry} if isinstance(entry, list) else entry
    if not isinstance(entry, dict) or entry.get("type") not in _ENTRY_KEYS:
        raise ConfigError(f"{where}: expected a mapping with type float, int or categorical, e.g. {{type: float, "
                          f"low: 1.0e-5, high: 1.0e-3, log: true}}, got {entry!r}")
    kind, unknown = entry["type"], sorted(set(entry) - {"type", *_ENTRY_KEYS[entry["type"]]})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} for type {kind}")
    if kind == "categorical":
        choices = entry.get("choices")
        if (not isinstance(choices, list) or not choices or len(set(map(repr, choices))) != len(choices)
                or any(c is not None and not isinstance(c, (bool, int, float, str)) for c in choices)):
            raise ConfigError(f"{where}: choices must be a non-empty list of distinct numbers, strings or "
                              f"true/false/null, got {choices!r}")
        return CategoricalDistribution(choices)
    if "low" not in entry or "high" not in entry:
        raise ConfigError(f"{where}: type {kind} needs low and high")
    low, high = (_bound(entry[k], k, kind == "int", where) for k in ("low", "high"))
    step = None if entry.get("step") is None else _bound(entry["step"], "step", kind == "int", where)
    if not isinstance(entry.get("log", False), bool):
        raise ConfigError(f"{where}: log must be true or false, got {entry['log']!r}")
    if not low < high or (step is not None and step <= 0):
        raise ConfigError(f"{where}: needs low < high and step > 0, got low {low}, high {high}, step {step}")
    if kind == "float" and step is not None and abs((high - low) / step - round((high - low) / step)) > 1e-9:
        raise ConfigError(f"{where}: the range {high} - {low} is not a multiple of step {step}")
    try:  # Optuna's own checks: log needs low > 0 (int: >= 1) and no step
        if kind == "int":
            return IntDistribution(low, high, log=entry.get("log", False), step=step or 1)
        return FloatDistribution(float(low), float(high), log=entry.get("log", False), step=step)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def parse_space(space: dict[str, Any] | None, params: list[str] | None = None) -> dict[str, BaseDistribution]:
    """The YAML ``space``, then ``NAME=ENTRY`` strings (which replace its entries), as distributions."""
    merged: dict[str, Any] = dict(space or {})
    for item in params or []:
        name, sep, entry = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--param {item!r}: expected NAME=ENTRY, e.g. 'lora_r={{type: categorical, "
                              "choices: [8, 16]}'")
        try:
            merged[name.strip()] = yaml.safe_load(entry)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--param {item!r}: the entry is not YAML ({str(exc).splitlines()[0]})") from None
    return {name.replace("-", "_"): parse_param(name, entry) for name, entry in merged.items()}


def grid_values(name: str, dist: BaseDistribution) -> list[Any]:
    """The values grid search enumerates (a ConfigError for a continuous range)."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if dist.step is None or dist.log:
        raise ConfigError(f"grid search needs discrete values for '{name}': give it choices, or a step (int without "
                          "log, float with step)")
    values = [dist.low + i * dist.step for i in range(int(round((dist.high - dist.low) / dist.step)) + 1)]
    return values if isinstance(dist, IntDistribution) else [round(v, 12) for v in values]


def grid_size(space: dict[str, BaseDistribution]) -> int:
    return math.prod(len(grid_values(name, dist)) for name, dist in space.items())


def suggest(trial: optuna.Trial, name: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, list(dist.choices))
    suggest_number = trial.suggest_int if isinstance(dist, IntDistribution) else trial.suggest_float
    return suggest_number(name, dist.low, dist.high, step=dist.step, log=dist.log)


def make_sampler(search: str, space: dict[str, BaseDistribution], seed: int) -> optuna.samplers.BaseSampler:
    if search == "grid":
        return optuna.samplers.GridSampler({name: grid_values(name, d) for name, d in space.items()}, seed=seed)
    if search == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)


def stage_class(stage: str) -> tuple[type, Callable[..., Any]]:
    """The stage's config dataclass and ``run`` function."""
    from agentic_rl.stages import get_stage

    return get_stage(stage).load()


def _check_stage_keys(cls: type, keys: list[str], where: str) -> None:
    """Unknown stage keys -> one ConfigError naming all of them (with a suggestion for the first)."""
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in keys if k not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"{where}: unknown {cls.__name__} key(s) {', '.join(repr(k) for k in unknown)}{hint}")
    if "output_dir" in keys:
        raise ConfigError(f"{where}: output_dir is set per trial by tune; remove it")


def base_values(config: TuneConfig, cls: type) -> dict[str, Any]:
    """The stage settings every trial starts from: base_config (stage file or pipeline section), fixed, budget."""
    values: dict[str, Any] = {}
    known = {f.name for f in dataclasses.fields(cls)}
    if config.base_config:
        data = read_yaml(config.base_config)
        if isinstance(data.get(config.stage), dict):  # a pipeline file: its stage section + shared top-level keys
            values.update(inherited_settings(data, config.stage, cls))
            data = data[config.stage]
        values.update({k.replace("-", "_"): v for k, v in data.items() if k != "output_dir"})
        _check_stage_keys(cls, list(values), config.base_config)
    values.update({k.replace("-", "_"): v for k, v in config.fixed.items()})
    _check_stage_keys(cls, list(values), "tune 'fixed'")
    if config.budget_steps is not None:
        if "max_steps" not in known:
            raise ConfigError(f"{cls.__name__} has no max_steps field, so budget_steps cannot be applied")
        values["max_steps"] = config.budget_steps
    if config.eval_split is None:  # the trial's stage holds out the validation slice it is scored on
        if values.get("eval_samples") not in (None, config.eval_samples):
            raise ConfigError(f"the stage's eval_samples ({values['eval_samples']}) is set per trial by tune to its "
                              f"own eval_samples ({config.eval_samples}), the validation problems trials are scored "
                              "on; remove it from the stage's settings")
        values["eval_samples"] = config.eval_samples
    elif config.eval_split == "test":
        warn("eval_split 'test': trials are scored on the test split, so the final test score is no longer a fair "
             "estimate of the chosen settings; leave eval_split unset for a validation slice of the training split")
    if "seed" in known:
        values["seed"] = config.seed if config.seed is not None else values.get("seed", 0)
    return values


def validate_space(cls: type, space: dict[str, BaseDistribution], base: dict[str, Any], search: str) -> None:
    """Fail before the first trial: unknown keys, values of the wrong type, values the stage config rejects."""
    if not space:
        raise ConfigError("the search space is empty: give `space:` in the YAML or --param NAME=ENTRY")
    _check_stage_keys(cls, list(space), "search space")
    for name, dist in space.items():
        discrete = search == "grid" or isinstance(dist, CategoricalDistribution)
        for value in grid_values(name, dist) if discrete else [dist.low, dist.high]:
            try:
                tune_trials.build_stage_config(cls, base, {name: value}, "probe", where=f"search space '{name}'")
            except ConfigError as exc:
                raise ConfigError(f"search space '{name}' value {value!r}: {exc}") from None


def _retry_stale_trial(study: optuna.Study, trial: FrozenTrial, *, trials_dir: Path | None) -> None:
    """Optuna failed a trial whose heartbeat stopped (its worker is gone): delete its weights, queue it again."""
    own = tune_trials.drop_trial_weights(trial, trials_dir)
    warn(f"trial {trial.number}: its worker is gone (no heartbeat); the trial is marked failed"
         + (f" and the weights in {own} are removed" if own else ""))
    RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)(study, trial)


def open_study(config: TuneConfig, url: str, trials_dir: Path | None = None,
               sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    """Create or load the study on an RDB storage with heartbeats; a stale trial is queued again."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for attempt in range(3):  # two workers creating a new SQLite file's tables at one instant: the second retries
        try:
            storage = optuna.storages.RDBStorage(
                url, engine_kwargs={"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {},
                heartbeat_interval=config.heartbeat_interval, grace_period=config.grace_period,
                heartbeat_stale_trial_callback=functools.partial(_retry_stale_trial, trials_dir=trials_dir))
            break
        except Exception as exc:  # an unreachable database, a bad URL, a missing driver
            if attempt == 2:
                raise ConfigError(f"cannot open the study storage {url!r}: {exc}") from None
            time.sleep(1.0)
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=config.prune_startup_trials, n_warmup_steps=0)
              if config.prune else optuna.pruners.NopPruner())
    return optuna.create_study(study_name=config.study_name, storage=storage, direction="maximize",
                               load_if_exists=True, pruner=pruner, sampler=sampler)


class BudgetReached(Exception):
    """A trial started after other workers' trials, started at the same instant, had used up the budget."""


def optimize(config: TuneConfig, space: dict[str, BaseDistribution], objective: Objective, url: str,
             n_trials: int, trials_dir: Path | None = None) -> dict[str, Any]:
    """One worker: run trials until the study holds ``n_trials`` counted trials, wait for those running in other
    workers, and return the study and the trial numbers this worker ran. ``objective(trial, params)`` trains and
    scores one trial; it may raise ``optuna.TrialPruned``, or ``TrainingError`` for a diverged run."""
    seed = config.seed or 0
    study = open_study(config, url, trials_dir, sampler=make_sampler(config.search, space, seed))
    ran: list[int] = []

    def run_trial(trial: optuna.Trial) -> float:
        if sum(t.number < trial.number for t in study.get_trials(deepcopy=False, states=COUNTED)) >= n_trials:
            study.stop()
            raise BudgetReached(f"trial {trial.number}: the study's {n_trials} trials were started by other workers")
        if config.search != "grid":  # seeded by the trial number: reproducible, and no two workers share a stream
            study.sampler = make_sampler(config.search, space, seed + trial.number)
        ran.append(trial.number)
        # Optuna records a trial's first heartbeat from a thread it starts beside this function: a worker that dies
        # before that record leaves a RUNNING trial no worker ever finds stale, so the others would wait for it
        # forever. Record it now, before any work (Optuna has no public trial id; its heartbeat code reads this one).
        study._storage.record_heartbeat(trial._trial_id)
        if trials_dir is not None:
            trial.set_user_attr("trial_dir", str((trials_dir / str(trial.number)).resolve()))
        params = {name: suggest(trial, name, dist) for name, dist in space.items()}
        log(f"trial {trial.number}: {json.dumps(params)}")
        started = time.time()
        try:
            value = float(objective(trial, params))
        except TrainingError as exc:  # the run diverged (NaN/inf): a result of these parameters, not a crash
            trial.set_user_attr("diverged", str(exc))
            own = tune_trials.drop_trial_weights(trial, trials_dir)
            warn(f"trial {trial.number} diverged (recorded as pruned{', weights removed' if own else ''}): {exc}")
            raise optuna.TrialPruned(f"diverged: {exc}") from None
        finally:
            trial.set_user_attr("duration_s", round(time.time() - started, 1))
        if not math.isfinite(value):
            warn(f"trial {trial.number}: its score is {value}; recorded as pruned")
            raise optuna.TrialPruned(f"objective is {value}")
        log(f"trial {trial.number}: {config.objective} {value:.4f} ({time.time() - started:.0f}s)")
        return value

    budget = optuna.study.MaxTrialsCallback(n_trials, states=COUNTED)
    waiting_for: list[int] = []
    while True:
        optuna.storages.fail_stale_trials(study)  # a dead worker's trial: failed, queued again
        states = [t.state for t in study.get_trials(deepcopy=False)]
        if TrialState.WAITING in states or sum(s in COUNTED for s in states) < n_trials:
            try:
                study.optimize(run_trial, callbacks=[budget], catch=(BudgetReached,))
            except BaseException:  # an error or Ctrl-C failed the trial: queue its parameters for the resumed search
                last = study.get_trials(deepcopy=False)[ran[-1]] if ran else None
                if last is not None and last.state == TrialState.FAIL:
                    RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)(study, last)
                raise
            continue
        running = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
        if not running:
            return {"study": study, "ran": ran}
        if running != waiting_for:  # nothing left to start: wait for the other workers' trials
            log(f"waiting for trial(s) {', '.join(map(str, running))} running in other workers")
            waiting_for = running
        time.sleep(2.0)


def run(config: TuneConfig) -> dict[str, Any]:
    """Run (or resume, or join as another worker) the search; write the report; return the best trial's summary."""
    space = parse_space(config.space, config.params)
    cls, stage_run = stage_class(config.stage)
    base = base_values(config, cls)
    if config.seed is None:  # the sampler follows the trials' seed
        config = dataclasses.replace(config, seed=int(base.get("seed", 0)))
    if config.eval_split is None and "eval_samples" in space:
        raise ConfigError("the stage's eval_samples is set per trial by tune to its own (the validation problems every "
                          "trial is scored on); remove it from the search space")
    validate_space(cls, space, base, config.search)
    n_trials = config.trials or 20
    if config.search == "grid":
        if config.trials is not None and config.trials > grid_size(space):
            warn(f"trials ({config.trials}) is more than the grid's {grid_size(space)} points; running those")
        n_trials = min(config.trials or grid_size(space), grid_size(space))
    out = run_dir(config.output_dir, f"tune-{config.stage}")
    url = config.storage or f"sqlite:///{(out / 'study.db').resolve()}"
    (out / "tune_config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    announce("tune", config, line=f"tune {config.stage}: {config.search} search over {', '.join(space)}; {n_trials} "
             f"trials in study {config.study_name!r} at {url}")
    trials_dir = tune_trials.study_trials_dir(open_study(config, url), str(config.study_name), out)
    objective = make_objective(config, cls, stage_run, base, trials_dir, keep_models=config.keep_models)
    worker = optimize(config, space, objective, url, n_trials, trials_dir=trials_dir)
    result = {**write_outputs(config, worker["study"], out), "ran_here": worker["ran"]}
    if "best_value" in result:
        log(f"best: trial {result['best_trial']} {config.objective} {result['best_value']:.4f} "
            f"{json.dumps(result['best_params'])} -> {result['best_config']}")
    log(f"report: {result['report']}")
    return result


def write_outputs(config: TuneConfig, study: optuna.Study, out: Path) -> dict[str, Any]:
    """trials.csv, best_<stage>.yaml, best_pipeline.yaml, plots and report.md from the study's current trials."""
    trials = study.get_trials(deepcopy=False)
    rows = [{"number": t.number, "state": t.state.name, "value": t.value, **t.params,
             "duration_s": t.user_attrs.get("duration_s"),
             "last_step": max(t.intermediate_values) if t.intermediate_values else None,
             "retry_of": RetryHeartbeatStaleTrialCallback.retried_trial_number(t)} for t in trials]
    columns = list(dict.fromkeys(k for row in rows for k in row)) or ["number"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    files = {"trials.csv": buf.getvalue()}
    diverged = {t.number: t.user_attrs["diverged"] for t in trials if "diverged" in t.user_attrs}
    result: dict[str, Any] = {"output_dir": str(out), "trials": len(rows), "diverged": len(diverged),
                              "complete": sum(t.state == TrialState.COMPLETE for t in trials),
                              "pruned": sum(t.state == TrialState.PRUNED and t.number not in diverged for t in trials)}
    best_lines = ["No trial has completed yet."]
    if result["complete"]:
        best = study.best_trial
        stage_values = {k: v for k, v in best.user_attrs.get("stage_config", {}).items() if k != "output_dir"}
        best_stage = f"best_{config.stage}.yaml"
        summary = (f"# best of {result['complete']} complete trials (study {config.study_name!r}): trial "
                   f"{best.number}, held-out {config.objective} {best.value:.4f}\n")
        files[best_stage] = (summary + f"# rerun: agentic-rl {config.stage} --config {best_stage}\n"
                             + yaml.safe_dump(stage_values, sort_keys=False))
        shared = list(inherited_settings(stage_values, config.stage, stage_class(config.stage)[0]))
        pipeline = {"stages": [config.stage], **{k: stage_values[k] for k in shared if stage_values.get(k) is not None},
                    config.stage: {k: v for k, v in stage_values.items() if k not in shared}}
        files["best_pipeline.yaml"] = (summary + "# rerun: agentic-rl pipeline --config best_pipeline.yaml\n"
                                       + yaml.safe_dump(pipeline, sort_keys=False))
        result.update({"best_trial": best.number, "best_value": best.value, "best_params": best.params,
                       "best_config": str(out / best_stage), "best_pipeline_config": str(out / "best_pipeline.yaml")})
        best_lines = [f"Best: trial {best.number}, {config.objective} **{best.value:.4f}** with "
                      + ", ".join(f"`{k}={v}`" for k, v in best.params.items()), "",
                      f"Rerun it: `agentic-rl {config.stage} --config {best_stage}` "
                      "(or `agentic-rl pipeline --config best_pipeline.yaml`)."]
    fmt = lambda v: "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))  # noqa: E731
    scored_on = f"{config.eval_split} split" if config.eval_split else "a validation slice of the training split"
    report = [f"# Hyper-parameter search: {config.stage}, {config.search}", "",
              f"Objective: held-out {config.objective} on {config.eval_samples} problems ({scored_on}) after "
              f"{config.budget_steps or 'the configured'} training steps; {result['complete']} complete, "
              f"{result['pruned']} pruned, {result['diverged']} diverged of {len(rows)} trials.", "",
              *best_lines, "", "## Trials", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
              *("| " + " | ".join(fmt(row.get(c)) for c in columns) + " |" for row in rows), ""]
    if diverged:
        report += ["Diverged (not rerun):", "", *(f"- trial {n}: {msg}" for n, msg in diverged.items()), ""]
    plots = tune_trials.write_plots(study, out, config.objective)
    files["report.md"] = "\n".join(report + [f"![{p}]({p})\n" for p in plots])
    for name, text in files.items():  # workers may write them at the same time
        tune_trials.atomic_write(out / name, text)
    return {**result, "report": str(out / "report.md")}

