"""Hyper-parameter search over a training stage (SFT or GRPO) with Optuna: grid, random or Bayesian (TPE).

Each trial resolves the stage's own typed config (base YAML, then ``fixed`` settings, then the sampled values), runs
the stage *as a function* (``agentic_rl.train.sft.run`` / ``agentic_rl.train.grpo.run``) for a short fixed budget,
and scores the trained model on held-out problems: greedy accuracy (``objective: accuracy``) or the mean of the
stage's reward functions on the same greedy completions (``objective: reward``). While a trial trains, a callback
scores the model every ``prune_every`` steps on a few held-out problems and reports it to Optuna's MedianPruner,
which stops trials that fall below the median of earlier trials at the same step.

Search space (YAML ``space:`` or repeated ``--param NAME=SPEC``), parsed from a small syntax (never ``eval``)::

    learning_rate: loguniform(1e-6, 1e-4)    # log-uniform float
    beta: choice(0.01, 0.05, 0.1)            # one of these (numbers, true/false/null, strings)
    lora_r: [8, 16, 32]                      # a YAML list is a choice too
    warmup_ratio: uniform(0.0, 0.2)          # uniform float; uniform(0, 0.2, step=0.05) for a grid
    num_generations: int(2, 8, step=2)       # integers lo..hi inclusive; int(1, 64, log=true)

Strategies: ``grid`` (Optuna GridSampler: exactly the Cartesian product of the values; ranges need a ``step``),
``random`` (RandomSampler: each parameter independently from its range), ``bayes`` (TPESampler: a density model of
good vs bad trials proposes the next point). Trials share a study in an Optuna RDB storage: by default
``<output_dir>/study.db`` (SQLite), so re-running the same command resumes an interrupted search; any RDB URL
(``postgresql://...``) lets several workers or machines share one study — start the same command once per worker.
``trials`` counts finished (complete, pruned or diverged) trials of the whole study, across workers, with no trial run
twice.
A worker that runs out of trials to start waits for those still running in other workers, so when a command returns
the study holds its ``trials``.

A worker killed mid-trial (``kill -9``, the OOM killer): its trial is marked failed — at once by a worker on the same
machine that finds the process gone, else by any worker once the trial's heartbeat is 60 s old — the weights in its
``trials/<study>/<n>/`` are deleted (its config and logs stay), and its parameters run again as a new trial
(``retry_of`` in the table), at most three attempts per parameter set; after that the failure stands and another point
is sampled.
Re-running the command after a lone worker was killed resumes the same way.
A trial whose training diverges (NaN/inf loss or weights: the stage raises ``TrainingError``) is marked failed with
the message in its ``diverged`` attribute, its weights are deleted, and the search goes on; it counts as one of the
``trials`` and its parameters are not run again (same seed, same divergence).
Every trial gets the same ``seed``, so differences between trials come from the hyper-parameters.

Outputs in the run directory: ``trials.csv`` and ``report.md`` (a table of trials, the best values, the plots
``optimization_history.png`` and ``param_importances.png``), ``best_<stage>.yaml`` (the best trial's full stage
config: ``agentic-rl sft|grpo --config best_<stage>.yaml`` reruns it) and ``best_pipeline.yaml`` (the same settings as
a pipeline section: ``agentic-rl pipeline --config best_pipeline.yaml``), ``trials/<study>/<n>/`` (each trial's stage
run: config, metrics, logs, ``tune_score.json``; its weights only with ``keep_models``; one folder per study, since
trial numbers restart at 0 in each: a study created where its name's folder is taken gets ``<study>-2``),
``study.db`` (the study).

Trials are scored on a validation slice of ``eval_samples`` problems carved out of the stage's *training* split
(:mod:`agentic_rl.eval.validation`): every trial's stage gets the same ``eval_samples``, so it sets those
rows aside (seeded, the same for every trial) and never trains on them, and the test split that the final evaluation
reports plays no part in choosing the hyper-parameters. The problems carry the stage's system prompt and column
mapping, and are scored by the same function as GRPO's periodic held-out checks. ``eval_split`` names another split
instead (``test`` only on purpose: it warns).

    agentic-rl tune --stage sft --search bayes --trials 20 --base-config configs/qwen3-0.6b-gsm8k.yaml \\
        --param 'learning_rate=loguniform(1e-6,1e-4)' --param 'lora_r=choice(8,16,32)' --budget-steps 50
"""

from __future__ import annotations

import ast
import contextlib
import csv
import dataclasses
import difflib
import io
import json
import math
import os
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from agentic_rl.config import SEED_RANGE, check_range, config_from_dict, config_to_dict, read_yaml, setting
from agentic_rl.errors import ConfigError, TrainingError
from agentic_rl.runs import MODEL_FOLDER
from agentic_rl.stages import inherited_settings
from agentic_rl.utils import free_memory, log, run_dir, warn, write_json

STAGES = ("sft", "grpo")
SEARCHES = ("grid", "random", "bayes")
# Stage config fields a search may not set: they are per-trial bookkeeping, not hyper-parameters.
_RESERVED = ("output_dir",)
# Stage settings that decide which problems a trial is scored on (and its stage holds out of training).
_DATA_KEYS = ("dataset", "split", "seed", "eval_samples", "question_field", "answer_field", "ground_truth_field",
              "system_prompt", "environment", "environment_args", "max_train_samples")


@dataclass
class TuneConfig:
    stage: str = setting("sft", "the stage to tune", choices=list(STAGES))
    search: str = setting("bayes", "grid (Cartesian product), random (independent samples) or bayes (TPE)",
                                   choices=list(SEARCHES))
    trials: int | None = setting(None, "finished trials wanted in the whole study, all workers together (default: the "
                                       "grid size for grid search, else 20)")
    space: dict[str, Any] = setting({}, "search space: stage key -> spec, e.g. {learning_rate: 'loguniform(1e-6, "
                                        "1e-4)', lora_r: [8, 16]}")
    params: list[str] = setting([], "one search-space entry NAME=SPEC, e.g. 'beta=choice(0.01,0.05,0.1)' (overrides "
                                    "`space`)", flag="param")
    base_config: str | None = setting(None, "YAML with the stage's settings: a stage file, or a pipeline file (its "
                                            "stage section and its model/dataset/seed are used)")
    fixed: dict[str, Any] = setting({}, "stage settings applied to every trial, over base_config (e.g. "
                                        "{max_train_samples: 256})")
    budget_steps: int | None = setting(None, "training steps per trial (sets the stage's max_steps); the short, fixed "
                                             "budget every trial gets")
    objective: str = setting("accuracy", "what a trial maximises on held-out problems: accuracy (greedy, strict "
                                         "answer match) or reward (mean of the stage's reward functions on the same "
                                         "completions)", choices=["accuracy", "reward"])
    eval_samples: int = setting(64, "held-out problems each trial is scored on")
    eval_split: str | None = setting(None, "split the held-out problems come from (default: a validation slice carved "
                                           "out of the stage's training split, never trained on; 'test' leaks the "
                                           "test set into the choice and warns)")
    max_new_tokens: int = setting(256, "generation length when scoring a trial")
    prune: bool = setting(True, "stop hopeless trials early (MedianPruner)")
    prune_every: int | None = setting(None, "steps between intermediate held-out scores (default: a quarter of the "
                                            "budget)")
    prune_samples: int = setting(16, "held-out problems each intermediate score uses")
    prune_startup_trials: int = setting(3, "trials that always run to the end before pruning starts")
    storage: str | None = setting(None, "Optuna RDB URL shared by workers (default: sqlite:///<output_dir>/study.db)")
    study_name: str | None = setting(None, "study name in the storage (default: tune-<stage>)")
    output_dir: str | None = setting(None, "run directory (default: runs/tune-<stage>)")
    seed: int | None = setting(None, "seed of the sampler and of every trial's training (default: the base config's "
                                     "seed, else 0)")
    keep_models: bool = setting(False, "keep every trial's weights in trials/<study>/<n>/ (default: only configs, "
                                       "metrics and logs are kept)")

    def __post_init__(self) -> None:
        check_range(self, ("trials", "budget_steps", "eval_samples", "prune_samples", "prune_every",
                           "max_new_tokens"), 1)
        check_range(self, "prune_startup_trials", 0)
        check_range(self, "seed", *SEED_RANGE)
        if self.study_name is None:
            self.study_name = f"tune-{self.stage}"
        name = self.study_name
        if not name or name in (".", "..") or any(c in name for c in "/\\\0"):  # it names the trials/<study>/ folder
            raise ConfigError(f"study_name {name!r} must be a plain folder name (no '/', '\\', '.' or '..'): "
                              "trials are stored under trials/<study_name>/")


# ---------------------------------------------------------------------------------------------------------------
# Search space: a tiny, safe expression language
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    """One searchable setting. ``kind`` is choice | uniform | loguniform | int."""

    name: str
    kind: str
    values: tuple = ()            # choice
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None
    log: bool = False

    def grid_values(self) -> list[Any]:
        """The values grid search enumerates (a ConfigError for a continuous range without a step)."""
        if self.kind == "choice":
            return list(self.values)
        if self.kind == "int":
            if self.log:
                raise ConfigError(f"grid search needs discrete values for '{self.name}': int(..., log=true) has no "
                                  "grid; use choice(...) or int(lo, hi, step=k)")
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        if self.kind == "uniform" and self.step is not None:
            n = int(round((self.high - self.low) / self.step))
            return [round(self.low + i * self.step, 12) for i in range(n + 1)]
        raise ConfigError(f"grid search needs discrete values for '{self.name}': {self.kind} is a continuous range; "
                          "use choice(...) or uniform(lo, hi, step=s)")

    def suggest(self, trial) -> Any:
        if self.kind == "choice":
            return trial.suggest_categorical(self.name, list(self.values))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        if self.kind == "uniform":
            return trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step)
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=True)

    def contains(self, value: Any) -> bool:
        if self.kind == "choice":
            return value in self.values
        if self.kind == "int" and (not isinstance(value, int) or isinstance(value, bool)):
            return False
        return self.low <= value <= self.high


_FUNCS = {"choice", "uniform", "loguniform", "int"}
_WORDS = {"true": True, "false": False, "null": None, "none": None, "True": True, "False": False, "None": None}


def _literal(node: ast.AST, where: str) -> Any:
    """A number, string, true/false/null or a bare word (read as a string); nothing else is accepted."""
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (int, float, str, bool))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _literal(node.operand, where)
        if isinstance(inner, (int, float)) and not isinstance(inner, bool):
            return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.Name):
        return _WORDS.get(node.id, node.id)
    raise ConfigError(f"{where}: only numbers, strings and true/false/null are allowed as values, got "
                      f"'{ast.unparse(node)}'")


def _number(value: Any, what: str, where: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: {what} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{where}: {what} must be finite, got {value!r}")
    return value


def parse_param(name: str, spec: Any) -> Param:
    """Parse one search-space entry. ``spec`` is a spec string or a YAML list (a choice).

    >>> parse_param("lr", "loguniform(1e-6, 1e-4)")
    Param(name='lr', kind='loguniform', values=(), low=1e-06, high=0.0001, step=None, log=True)
    >>> parse_param("lora_r", [8, 16]).values
    (8, 16)
    """
    where = f"search space '{name}'"
    if isinstance(spec, (list, tuple)):
        spec_values = tuple(spec)
        for v in spec_values:
            if v is not None and not isinstance(v, (bool, int, float, str)):
                raise ConfigError(f"{where}: choice values must be numbers, strings or true/false/null, got {v!r}")
        return _choice(name, spec_values, where)
    if not isinstance(spec, str):
        raise ConfigError(f"{where}: expected a spec such as 'choice(8, 16)' or 'loguniform(1e-6, 1e-4)' or a list, "
                          f"got {spec!r}")
    try:
        tree = ast.parse(spec.strip(), mode="eval").body
    except SyntaxError:
        raise ConfigError(f"{where}: cannot parse {spec!r}; expected e.g. 'loguniform(1e-6, 1e-4)'") from None
    if isinstance(tree, (ast.List, ast.Tuple)):  # "[8, 16, 32]" as a flag value: a choice, as in YAML
        return _choice(name, tuple(_literal(e, where) for e in tree.elts), where)
    if not (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id in _FUNCS):
        raise ConfigError(f"{where}: {spec!r} must be one of {', '.join(sorted(_FUNCS))} applied to values, "
                          "e.g. 'choice(0.01, 0.05)'")
    kind = tree.func.id
    args = [_literal(a, where) for a in tree.args]
    kwargs = {}
    for kw in tree.keywords:
        if kw.arg is None:
            raise ConfigError(f"{where}: '**' is not allowed")
        kwargs[kw.arg] = _literal(kw.value, where)
    if kind == "choice":
        if kwargs:
            raise ConfigError(f"{where}: choice(...) takes no keyword arguments, got {sorted(kwargs)}")
        return _choice(name, tuple(args), where)

    allowed = {"uniform": {"step"}, "loguniform": set(), "int": {"step", "log"}}[kind]
    unknown = set(kwargs) - allowed
    if unknown:
        raise ConfigError(f"{where}: {kind}(...) does not take {sorted(unknown)}"
                          + (f"; it takes {sorted(allowed)}" if allowed else ""))
    if len(args) != 2:
        raise ConfigError(f"{where}: {kind}(low, high) takes two bounds, got {len(args)}")
    low, high = (_number(a, b, where) for a, b in zip(args, ("the lower bound", "the upper bound")))
    if not low < high:
        raise ConfigError(f"{where}: the lower bound ({low}) must be below the upper bound ({high})")
    step = kwargs.get("step")
    if step is not None:
        step = _number(step, "step", where)
        if step <= 0:
            raise ConfigError(f"{where}: step must be > 0, got {step}")
    log_scale = kwargs.get("log", False)
    if not isinstance(log_scale, bool):
        raise ConfigError(f"{where}: log must be true or false, got {log_scale!r}")
    if kind == "loguniform" and low <= 0:
        raise ConfigError(f"{where}: loguniform needs a lower bound > 0, got {low}")
    if kind == "int":
        if not all(isinstance(v, int) for v in (low, high)) or (step is not None and not isinstance(step, int)):
            raise ConfigError(f"{where}: int(low, high) needs integer bounds and step, got {spec!r}")
        if log_scale and (low < 1 or step not in (None, 1)):
            raise ConfigError(f"{where}: int(..., log=true) needs low >= 1 and no step")
        return Param(name, "int", low=low, high=high, step=step, log=log_scale)
    if kind == "uniform":
        if step is not None and abs((high - low) / step - round((high - low) / step)) > 1e-9:
            raise ConfigError(f"{where}: the range {high} - {low} is not a multiple of step {step}")
        return Param(name, "uniform", low=float(low), high=float(high), step=step)
    return Param(name, "loguniform", low=float(low), high=float(high), log=True)


def _choice(name: str, values: tuple, where: str) -> Param:
    if not values:
        raise ConfigError(f"{where}: choice needs at least one value")
    if len(set(map(repr, values))) != len(values):
        raise ConfigError(f"{where}: choice has repeated values {list(values)}")
    return Param(name, "choice", values=values)


def parse_space(space: dict[str, Any] | None, params: list[str] | None = None) -> dict[str, Param]:
    """YAML ``space`` entries, then ``NAME=SPEC`` strings (which override them), parsed into :class:`Param` s."""
    merged: dict[str, Any] = dict(space or {})
    for item in params or []:
        name, sep, spec = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--param {item!r}: expected NAME=SPEC, e.g. 'lora_r=choice(8,16,32)'")
        merged[name.strip()] = spec.strip()
    return {name.replace("-", "_"): parse_param(name, spec) for name, spec in merged.items()}


def grid_size(space: dict[str, Param]) -> int:
    return math.prod(len(p.grid_values()) for p in space.values())


def make_sampler(search: str, space: dict[str, Param], seed: int):
    """Optuna's sampler for a strategy. ``seed`` fixes its random choices (grid: the order is by trial number)."""
    import optuna

    if search == "grid":
        class _Grid(optuna.samplers.GridSampler):
            def after_trial(self, study, trial, state, values) -> None:
                """No ``study.stop()`` here: the worker loop (ask/tell) stops at the grid size itself."""

        return _Grid({name: p.grid_values() for name, p in space.items()}, seed=seed)
    if search == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)


# ---------------------------------------------------------------------------------------------------------------
# Stage configs: base YAML + fixed + sampled values, validated before any trial runs
# ---------------------------------------------------------------------------------------------------------------

def stage_class(stage: str) -> tuple[type, Callable[..., Any]]:
    """The stage's config dataclass and ``run`` function."""
    from agentic_rl.stages import get_stage

    return get_stage(stage).load()


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _check_stage_keys(cls: type, keys: list[str], where: str) -> None:
    """Unknown stage keys -> one ConfigError naming all of them (with a suggestion for the first)."""
    known = _field_names(cls)
    unknown = [k for k in keys if k not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"{where}: unknown {cls.__name__} key(s) {', '.join(repr(k) for k in unknown)}{hint}")
    reserved = [k for k in keys if k in _RESERVED]
    if reserved:
        raise ConfigError(f"{where}: {', '.join(reserved)} is set per trial by tune; remove it")


def base_values(config: TuneConfig, cls: type) -> dict[str, Any]:
    """The stage settings every trial starts from: base_config (stage file or pipeline section), fixed, budget."""
    values: dict[str, Any] = {}
    if config.base_config:
        data = read_yaml(config.base_config)
        if isinstance(data.get(config.stage), dict):  # a pipeline file: its stage section + shared top-level keys
            values.update(inherited_settings(data, config.stage, cls))
            if values.get("model") == "embedded":
                raise ConfigError(f"{config.base_config}: model 'embedded' is built by the pipeline's pretrain stage; "
                                  f"give tune a model directory in fixed: {{model: runs/<name>/pretrain/model}}")
            values.update(data[config.stage])
        else:
            values.update(data)
        values.pop("output_dir", None)
        _check_stage_keys(cls, [k.replace("-", "_") for k in values], config.base_config)
    values.update({k.replace("-", "_"): v for k, v in config.fixed.items()})
    _check_stage_keys(cls, list(values), "tune 'fixed'")
    if config.budget_steps is not None:
        if "max_steps" not in _field_names(cls):
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
    if "seed" in _field_names(cls):
        if config.seed is not None:
            values["seed"] = config.seed
        values.setdefault("seed", 0)
    return values


def build_stage_config(cls: type, base: dict[str, Any], params: dict[str, Any], output_dir: str | Path,
                       where: str):
    values = {**base, **params, "output_dir": str(output_dir)}
    return config_from_dict(cls, values, where=where)


def validate_space(cls: type, space: dict[str, Param], base: dict[str, Any], search: str) -> None:
    """Fail before the first trial: unknown keys, values of the wrong type, values the stage config rejects."""
    if not space:
        raise ConfigError("the search space is empty: give `space:` in the YAML or --param NAME=SPEC")
    _check_stage_keys(cls, list(space), "search space")
    for name, p in space.items():
        probes = p.grid_values() if (search == "grid" or p.kind == "choice") else [p.low, p.high]
        if p.kind == "int":
            probes = [int(v) for v in probes]
        for value in probes:
            try:
                build_stage_config(cls, base, {name: value}, "probe", where=f"search space '{name}'")
            except ConfigError as exc:
                raise ConfigError(f"search space '{name}' value {value!r}: {exc}") from None
    if search == "grid":
        grid_size(space)  # raises for continuous ranges


# ---------------------------------------------------------------------------------------------------------------
# Storage, budget and the worker loop
# ---------------------------------------------------------------------------------------------------------------

def storage_url(config: TuneConfig, out: Path) -> str:
    return config.storage or f"sqlite:///{(out / 'study.db').resolve()}"


def open_study(config: TuneConfig, url: str, trials_dir: Path | None = None):
    """Create or load the study. SQLite waits for locks (several workers); heartbeats mark dead workers' trials
    failed, and :func:`_abandon` cleans their ``trials_dir/<n>`` and queues them again."""
    import functools

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    engine_kwargs = {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {}
    try:
        storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=10,
                                             grace_period=60, heartbeat_stale_trial_callback=functools.partial(
                                                 _abandon, trials_dir=trials_dir))
    except Exception as exc:  # an unreachable database, a bad URL, a missing driver
        raise ConfigError(f"cannot open the study storage {url!r}: {exc}") from None
    if url.startswith("sqlite"):
        _sqlite_wal(storage.engine)
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=config.prune_startup_trials, n_warmup_steps=0)
              if config.prune else optuna.pruners.NopPruner())
    return optuna.create_study(study_name=config.study_name, storage=storage, direction="maximize",
                               load_if_exists=True, pruner=pruner)


def _sqlite_wal(engine) -> None:
    """Write-ahead logging: workers read while one writes, and a commit skips the full disk sync."""
    from sqlalchemy import event, text

    def on_connect(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(engine, "connect", on_connect)
    engine.dispose()  # connections opened before the listener get reopened with it
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


_MAX_ATTEMPTS = 3  # runs of one parameter set whose worker died or was interrupted before its failure stands
_WAIT_POLL_S = 2.0  # how often a worker with nothing to start checks the trials running elsewhere


def _requeue(study, trial) -> None:
    """A trial that did not finish (its worker died or was interrupted): queue its parameters again, so that a
    resumed search still runs every grid point and reaches its number of trials."""
    attempt = int(trial.user_attrs.get("attempt", 1))
    if trial.params and attempt >= _MAX_ATTEMPTS:
        warn(f"trial {trial.number} did not finish, the {attempt}th attempt with these parameters: counted as "
             "failed, not run again")
    elif trial.params:
        log(f"trial {trial.number} did not finish; its parameters are queued to run again")
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number, "attempt": attempt + 1})


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, from /proc), or None when there is no such live
    process (a zombie, which a parent has not yet reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # fields[0] is field 3 (state); the start time is field 22
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _worker_identity() -> dict[str, Any]:
    """What identifies this worker process to the other workers: machine (host name and boot), pid namespace, pid
    and the process's start time (so that a reused pid is not taken for the worker)."""
    identity: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    with contextlib.suppress(OSError, ValueError):  # no /proc (not Linux): only heartbeats find dead workers
        identity["boot"] = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        identity["pid_ns"] = os.stat("/proc/self/ns/pid").st_ino
        identity["started"] = _process_start(os.getpid())
    return identity


def _worker_is_gone(worker: dict[str, Any] | None) -> bool:
    """True only when certain: the worker ran on this machine, in this pid namespace, and its process has ended."""
    if not worker or worker.get("started") is None:
        return False
    here = _worker_identity()
    if any(here.get(key) is None or worker.get(key) != here[key] for key in ("host", "boot", "pid_ns")):
        return False
    return _process_start(int(worker["pid"])) != worker["started"]


def _drop_trial_weights(number: int, user_attrs: dict[str, Any], trials_dir: Path | None) -> Path | None:
    """Delete the weights in trial ``number``'s own trials_dir/<n>/ (never anything else: only when the trial recorded
    that very directory); returns the directory when it did."""
    own = (trials_dir / str(number)).resolve() if trials_dir is not None else None
    if own is not None and user_attrs.get("trial_dir") == str(own) and own.is_dir():
        _drop_weights(own)
        return own
    return None


def _abandon(study, trial, trials_dir: Path | None) -> None:
    """A failed trial whose worker died: delete the weights in its own trials/<study>/<n>/, then queue its
    parameters again."""
    own = _drop_trial_weights(trial.number, trial.user_attrs, trials_dir)
    if own is not None:
        log(f"trial {trial.number}: its worker died; the weights in {own} are removed")
    _requeue(study, trial)


def _fail_dead_workers(study, trials_dir: Path | None) -> None:
    """Fail the running trials whose worker process is known to be gone (same machine), without waiting for their
    heartbeat to go stale; other workers' trials are left to the heartbeat check."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not _worker_is_gone(trial.user_attrs.get("worker")):
            continue
        try:
            if not study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
                continue
        except UpdateFinishedTrialError:  # another worker got there first
            continue
        warn(f"trial {trial.number}: worker {trial.user_attrs['worker']['pid']} is gone; the trial is marked failed")
        _abandon(study, study.get_trials(deepcopy=False)[trial.number], trials_dir)


@contextlib.contextmanager
def _budget_lock(url: str) -> Iterator[None]:
    """Serialise "count trials, then start one" across workers sharing a SQLite file (exact trial totals).

    Other databases get no lock: two workers asking at the same instant may then start one trial too many.
    """
    if not url.startswith("sqlite:///"):
        yield
        return
    import fcntl

    lock_path = Path(url[len("sqlite:///"):] + ".lock")
    with open(lock_path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _live_states():
    from optuna.trial import TrialState

    return (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)


def _counts_towards_budget(trial) -> bool:
    """Finished, running or queued trials count; so does a diverged one (a failure that is its parameters' result:
    the same seed diverges again), unlike a trial whose worker died, which is redone."""
    from optuna.trial import TrialState

    return trial.state in _live_states() or (trial.state == TrialState.FAIL and "diverged" in trial.user_attrs)


Objective = Callable[[Any, dict[str, Any]], float]


def optimize(config: TuneConfig, space: dict[str, Param], objective: Objective, url: str,
             n_trials: int, trials_dir: Path | None = None) -> dict[str, Any]:
    """One worker: start trials until the study holds ``n_trials`` live trials, wait for those running in other
    workers, then return what this worker ran.

    ``objective(trial, params) -> float`` trains and scores one trial; it may raise ``optuna.TrialPruned``.
    Several processes may run this at once against the same storage. A trial whose worker died is failed, its
    weights in ``trials_dir/<n>/`` (the trial's run directory) are deleted, and its parameters run again.
    """
    import optuna
    from optuna.storages import fail_stale_trials
    from optuna.storages._heartbeat import get_heartbeat_thread
    from optuna.trial import TrialState

    # Heartbeats (used here to requeue the trials of dead workers) are marked experimental in Optuna and warn when
    # used with ask/tell; this loop is the documented ask/tell pattern plus those heartbeats.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    with _budget_lock(url):  # two workers creating the SQLite tables at the same instant would collide
        study = open_study(config, url, trials_dir)
    # Trials that count towards the budget: finished (complete/pruned/diverged), running or queued; other failed
    # ones are redone.
    ran: list[int] = []
    waiting_for: list[int] = []
    while True:
        with _budget_lock(url):
            fail_stale_trials(study)
            _fail_dead_workers(study, trials_dir)
            trials = study.get_trials(deepcopy=False)
            queued = any(t.state == TrialState.WAITING for t in trials)  # retries are counted already: run them
            if not queued and sum(map(_counts_towards_budget, trials)) >= n_trials:
                running = [t.number for t in trials if t.state == TrialState.RUNNING]
                if not running:
                    break
            else:
                running = []
                # A fresh sampler per trial, seeded by the trial number it is about to create: one worker is
                # reproducible, and two workers never share a random stream (which would duplicate their proposals).
                # (Grid: one fixed seed, since the grid order it shuffles must be the same for every trial.)
                offset = 0 if config.search == "grid" else len(trials)
                study.sampler = make_sampler(config.search, space, seed=(config.seed or 0) + offset)
                trial = study.ask()
                # Whose trial it is, recorded at once: other workers can then tell when its process dies.
                study._storage.record_heartbeat(trial._trial_id)
                trial.set_user_attr("worker", _worker_identity())
                if trials_dir is not None:
                    trial.set_user_attr("trial_dir", str((trials_dir / str(trial.number)).resolve()))
                params = {name: p.suggest(trial) for name, p in space.items()}
        if running:  # nothing left to start: wait for the other workers' trials (a dead worker's trial is retried)
            if running != waiting_for:
                log(f"waiting for trial(s) {', '.join(map(str, running))} running in other workers")
                waiting_for = running
            time.sleep(_WAIT_POLL_S)
            continue
        ran.append(trial.number)
        log(f"trial {trial.number}: {json.dumps(params)}")
        started = time.time()
        with get_heartbeat_thread(trial._trial_id, study._storage):
            try:
                value = float(objective(trial, params))
            except optuna.TrialPruned:
                trial.set_user_attr("duration_s", round(time.time() - started, 1))
                study.tell(trial, state=TrialState.PRUNED)
                log(f"trial {trial.number}: pruned after {time.time() - started:.0f}s")
                continue
            except TrainingError as exc:  # the run diverged (NaN/inf): a result of these parameters, not a crash
                trial.set_user_attr("duration_s", round(time.time() - started, 1))
                trial.set_user_attr("diverged", str(exc))
                study.tell(trial, state=TrialState.FAIL)
                warn(f"trial {trial.number} diverged, recorded as failed: {exc}")
                own = _drop_trial_weights(trial.number, trial.user_attrs, trials_dir)
                if own is not None:
                    log(f"trial {trial.number}: the weights in {own} are removed")
                continue
            except BaseException:  # an error or Ctrl-C: record it, queue the parameters for the resumed search
                study.tell(trial, state=TrialState.FAIL)
                _requeue(study, study.get_trials(deepcopy=False)[trial.number])
                raise
        trial.set_user_attr("duration_s", round(time.time() - started, 1))
        if not math.isfinite(value):
            warn(f"trial {trial.number}: objective is {value}; recorded as failed")
            study.tell(trial, state=TrialState.FAIL)
            continue
        study.tell(trial, value)
        log(f"trial {trial.number}: {config.objective} {value:.4f} ({time.time() - started:.0f}s)")
    return {"study": study, "ran": ran}


# ---------------------------------------------------------------------------------------------------------------
# The objective: train one trial with the stage function, score it on held-out problems
# ---------------------------------------------------------------------------------------------------------------

def _stage_system_prompt(stage_cfg: Any) -> str | None:
    """The system message the stage's prompts carry (the environment's with an environment)."""
    from agentic_rl.agent.settings import build_environment, environment_system_prompt

    env = build_environment(stage_cfg).example if getattr(stage_cfg, "environment", None) is not None else None
    return environment_system_prompt(getattr(stage_cfg, "system_prompt", None), env)


def load_heldout(config: TuneConfig, stage_cfg: Any, n: int) -> list[dict[str, Any]]:
    """``n`` held-out problems with the stage's prompts: the first ``n`` of the validation slice the trial's stage
    carves out of its training split (see :mod:`agentic_rl.eval.validation`), or with ``eval_split`` a seeded sample
    of that split."""
    if config.eval_split is None:
        if stage_cfg.eval_samples < n:
            raise ConfigError(f"the stage holds out {stage_cfg.eval_samples} validation problems, fewer than the "
                              f"{n} a trial is scored on; tune gives the stage its own eval_samples")
        if config.stage == "sft":
            from agentic_rl.train.sft import validation_rows
        else:
            from agentic_rl.train.grpo import validation_rows
        return validation_rows(stage_cfg)[:n]
    from agentic_rl.data.formats import build_prompt
    from agentic_rl.eval.evaluate import EvalConfig, load_rows

    dataset = getattr(stage_cfg, "dataset", None) or "synthetic"
    columns = {name: getattr(stage_cfg, name, None) for name in ("question_field", "answer_field",
                                                                  "ground_truth_field")}
    rows = load_rows(EvalConfig(dataset=dataset, split=config.eval_split, eval_samples=n, seed=config.seed or 0,
                                **columns))
    system_prompt = _stage_system_prompt(stage_cfg)
    return [{**r, "prompt": build_prompt(r["question"], system_prompt)} for r in rows]


def score_model(config: TuneConfig, stage_cfg: Any, model: Any, rows: list[dict[str, Any]], *,
                tokenizer: Any = None) -> tuple[float, dict[str, Any]]:
    """The trial's objective value and metrics, by the one held-out scorer GRPO's periodic checks use
    (:func:`agentic_rl.eval.validation.score_heldout`): greedy ``accuracy`` (strict), or for ``objective: reward`` the
    mean of the stage's reward functions (in an environment: the mean episode return, played with its tools)."""
    from agentic_rl.eval import validation

    env_factory = None
    budget = config.max_new_tokens
    if getattr(stage_cfg, "environment", None) is not None:
        from agentic_rl.agent.settings import build_environment

        env_factory = build_environment(stage_cfg)
        budget = max(getattr(stage_cfg, "max_completion_length", None) or budget, stage_cfg.max_turn_tokens)
    rewards = getattr(stage_cfg, "rewards", None) if config.objective == "reward" else None
    metrics = validation.score_heldout(model, tokenizer, rows, max_new_tokens=budget, rewards=rewards,
                                       env_factory=env_factory,
                                       tools_in_prompt=getattr(stage_cfg, "tools_in_prompt", True),
                                       max_turn_tokens=getattr(stage_cfg, "max_turn_tokens", 48))
    value = metrics.get("accuracy" if config.objective == "accuracy" else "avg_reward")
    return (float(value) if value is not None else float("nan")), metrics


@contextlib.contextmanager
def _preserved_rng() -> Iterator[None]:
    """Run a side computation (a held-out evaluation inside training) without moving any random stream, so a trial
    trains exactly as the same config does without tune's callback: the best YAML reproduces the trial."""
    import random

    import numpy as np
    import torch

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
              torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])


def pruning_callback(config: TuneConfig, stage_cfg: Any, trial, rows: list[dict[str, Any]], every: int):
    """A TrainerCallback: every ``every`` steps, score the model on ``rows``, report it to the trial, and stop
    training when the pruner says the trial is hopeless (the objective then raises ``TrialPruned``)."""
    from transformers import TrainerCallback

    class HeldOutPruning(TrainerCallback):
        pruned_at: int | None = None

        def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            step = state.global_step
            if step % every or step >= state.max_steps or model is None:
                return
            with _preserved_rng():
                value, _ = score_model(config, stage_cfg, model, rows, tokenizer=processing_class)
            trial.report(value, step)
            log(f"trial {trial.number} step {step}: held-out {config.objective} {value:.4f} ({len(rows)} problems)")
            if trial.should_prune():
                self.pruned_at = step
                control.should_training_stop = True

    return HeldOutPruning()


def _accepts_callbacks(fn: Callable[..., Any]) -> bool:
    import inspect

    return "callbacks" in inspect.signature(fn).parameters


def _drop_weights(trial_dir: Path) -> None:
    """A finished trial keeps its config, metrics and logs; its weights (GBs for real models) are removed."""
    import shutil

    for child in trial_dir.glob("*"):
        if child.is_dir() and (child.name in (MODEL_FOLDER, "adapter", "base", "best", "final", "checkpoints")
                               or child.name.startswith("checkpoint-")):
            shutil.rmtree(child, ignore_errors=True)


def study_trials_dir(config: TuneConfig, url: str, out: Path) -> Path:
    """The study's own folder of trial runs, ``<out>/trials/<study_name>``, recorded in the study so that every worker
    and every resumed run uses it. Trial numbers restart at 0 in each study, so a study created anew (another name, or
    the same name after study.db was deleted) never reuses another study's folder: it gets ``<study_name>-2``, ...
    """
    with _budget_lock(url):  # two workers creating the study at once must agree on the folder
        study = open_study(config, url)
        name = study.user_attrs.get("trials_folder")
        if name is None:
            name, n = str(config.study_name), 1
            while (out / "trials" / name).exists() and any((out / "trials" / name).iterdir()):
                n += 1
                name = f"{config.study_name}-{n}"
            study.set_user_attr("trials_folder", name)
    return out / "trials" / name


def make_objective(config: TuneConfig, cls: type, stage_run: Callable[..., Any], base: dict[str, Any],
                   trials_dir: Path, keep_models: bool = False) -> Objective:
    """The stage objective: resolve the trial's stage config, train (with the pruning callback), score."""
    import optuna

    cache: dict[str, Any] = {}
    prune = config.prune and _accepts_callbacks(stage_run)
    if config.prune and not prune:
        warn(f"the {config.stage} stage's run() takes no callbacks=, so trials cannot report intermediate scores: "
             "pruning is off")

    def objective(trial, params: dict[str, Any]) -> float:
        trial_dir = trials_dir / str(trial.number)
        stage_cfg = build_stage_config(cls, base, params, trial_dir, where=f"trial {trial.number}")
        trial.set_user_attr("stage_config", config_to_dict(stage_cfg))
        # The held-out problems depend on the stage's data settings only, which a search rarely varies (seed may).
        rows_key = json.dumps({k: v for k, v in config_to_dict(stage_cfg).items()
                               if k in _DATA_KEYS or k.startswith("synthetic")}, sort_keys=True, default=str)
        if rows_key not in cache:
            cache[rows_key] = load_heldout(config, stage_cfg, config.eval_samples)
        rows = cache[rows_key]
        kwargs: dict[str, Any] = {}
        callback = None
        if prune:
            budget = getattr(stage_cfg, "max_steps", None) or 0
            every = config.prune_every or max(1, budget // 4)
            if budget and every < budget:
                callback = pruning_callback(config, stage_cfg, trial, rows[:config.prune_samples], every)
                kwargs["callbacks"] = [callback]
        try:
            result = stage_run(stage_cfg, **kwargs)
        except BaseException:  # nothing of ours to clean: a refused directory may hold another run's weights
            free_memory()
            raise
        model_dir = result["model_dir"] if isinstance(result, dict) else str(result)
        try:
            if callback is not None and callback.pruned_at is not None:
                raise optuna.TrialPruned(f"pruned at step {callback.pruned_at}")
            value, metrics = score_model(config, stage_cfg, model_dir, rows)
            trial.set_user_attr("metrics", {k: v for k, v in metrics.items()
                                            if isinstance(v, (int, float)) and not isinstance(v, bool)})
            write_json(trial_dir / "tune_score.json", {"trial": trial.number, "params": params,
                                                      config.objective: value, "metrics": metrics})
            return value
        finally:
            if not keep_models:
                _drop_weights(trial_dir)
            free_memory()

    return objective


# ---------------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------------

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
    n_trials = config.trials
    if config.search == "grid":
        size = grid_size(space)
        if n_trials is None or n_trials > size:
            if n_trials is not None:
                warn(f"trials ({n_trials}) is more than the grid's {size} points; running {size}")
            n_trials = size
    n_trials = n_trials or 20
    out = run_dir(config.output_dir, f"tune-{config.stage}")
    url = storage_url(config, out)
    (out / "tune_config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    log(f"tune {config.stage}: {config.search} search over {', '.join(space)}; {n_trials} trials in study "
        f"{config.study_name!r} at {url}")
    trials_dir = study_trials_dir(config, url, out)
    objective = make_objective(config, cls, stage_run, base, trials_dir, keep_models=config.keep_models)
    worker = optimize(config, space, objective, url, n_trials, trials_dir=trials_dir)
    result = write_outputs(config, worker["study"], out)
    result["ran_here"] = worker["ran"]
    if "best_value" in result:
        log(f"best: trial {result['best_trial']} {config.objective} {result['best_value']:.4f} "
            f"{json.dumps(result['best_params'])} -> {result['best_config']}")
    log(f"report: {result['report']}")
    return result


# ---------------------------------------------------------------------------------------------------------------
# Report: table, best configs, plots
# ---------------------------------------------------------------------------------------------------------------

def trials_table(study) -> list[dict[str, Any]]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        rows.append({"number": t.number, "state": t.state.name, "value": t.value, **t.params,
                     "duration_s": t.user_attrs.get("duration_s"),
                     "last_step": max(t.intermediate_values) if t.intermediate_values else None,
                     "retry_of": t.user_attrs.get("retry_of")})
    return rows


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _markdown_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no trials)\n"
    columns = list(dict.fromkeys(k for row in rows for k in row))
    fmt = lambda v: "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _plots(study, out: Path, objective: str) -> list[str]:
    """Optimisation history and parameter importance as PNGs (matplotlib); skipped with a note when not defined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    made = []
    target_name = f"held-out {objective}"
    plots = {"optimization_history.png": lambda: ovm.plot_optimization_history(study, target_name=target_name),
             "param_importances.png": lambda: ovm.plot_param_importances(study, target_name=target_name)}
    for name, plot in plots.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ax = plot()
            fig = ax.figure if hasattr(ax, "figure") else ax.flatten()[0].figure
            fig.set_size_inches(7, 4)
            fig.tight_layout()
            tmp = out / f".{name}.{os.getpid()}.png"
            fig.savefig(tmp, dpi=100)
            os.replace(tmp, out / name)
            plt.close(fig)
            made.append(name)
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:  # e.g. importance needs >= 2 complete trials
            log(f"plot {name} skipped: {exc}")
    return made


def write_outputs(config: TuneConfig, study, out: Path) -> dict[str, Any]:
    """trials.csv, best_<stage>.yaml, best_pipeline.yaml, plots and report.md from the study's current trials."""
    from optuna.trial import TrialState

    rows = trials_table(study)
    buf = io.StringIO()
    columns = list(dict.fromkeys(k for row in rows for k in row)) or ["number"]
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    _atomic_write(out / "trials.csv", buf.getvalue())

    result: dict[str, Any] = {"output_dir": str(out), "trials": len(rows),
                              "complete": sum(r["state"] == "COMPLETE" for r in rows),
                              "pruned": sum(r["state"] == "PRUNED" for r in rows)}
    diverged = {t.number: t.user_attrs["diverged"] for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
                if "diverged" in t.user_attrs}
    result["diverged"] = len(diverged)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    best_lines = ["No trial has completed yet."]
    if complete:
        best = study.best_trial
        stage_values = dict(best.user_attrs.get("stage_config", {}))
        stage_values.pop("output_dir", None)
        best_stage = out / f"best_{config.stage}.yaml"
        summary = (f"# best of {len(complete)} complete trials (study {config.study_name!r}): trial {best.number}, "
                   f"held-out {config.objective} {best.value:.4f}\n")
        _atomic_write(best_stage, summary + f"# rerun: agentic-rl {config.stage} --config {best_stage.name}\n"
                      + yaml.safe_dump(stage_values, sort_keys=False))
        shared = list(inherited_settings(stage_values, config.stage, stage_class(config.stage)[0]))
        pipeline = {"stages": [config.stage], **{k: stage_values[k] for k in shared if stage_values.get(k) is not None},
                    config.stage: {k: v for k, v in stage_values.items() if k not in shared}}
        _atomic_write(out / "best_pipeline.yaml", summary + "# rerun: agentic-rl pipeline --config best_pipeline.yaml\n"
                      + yaml.safe_dump(pipeline, sort_keys=False))
        result.update({"best_trial": best.number, "best_value": best.value, "best_params": best.params,
                       "best_config": str(best_stage), "best_pipeline_config": str(out / "best_pipeline.yaml")})
        best_lines = [f"Best: trial {best.number}, {config.objective} **{best.value:.4f}** with "
                      + ", ".join(f"`{k}={v}`" for k, v in best.params.items()),
                      "", f"Rerun it: `agentic-rl {config.stage} --config {best_stage.name}` "
                      "(or `agentic-rl pipeline --config best_pipeline.yaml`)."]
    plots = _plots(study, out, config.objective)
    report = [f"# Hyper-parameter search: {config.stage}, {config.search}", "",
              f"Objective: held-out {config.objective} on {config.eval_samples} problems "
              f"({'a validation slice of the training split' if config.eval_split is None else f'{config.eval_split} split'}) after {config.budget_steps or 'the configured'} training steps; "
              f"{result['complete']} complete, {result['pruned']} pruned of {len(rows)} trials.", "",
              *best_lines, "", "## Trials", "", _markdown_table(rows)]
    if diverged:
        report += ["Diverged (failed, not rerun):", "", *(f"- trial {n}: {msg}" for n, msg in diverged.items()), ""]
    report += [f"![{p}]({p})\n" for p in plots]
    _atomic_write(out / "report.md", "\n".join(report))
    result["report"] = str(out / "report.md")
    return result

