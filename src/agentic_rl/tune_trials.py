"""The trials of a hyper-parameter search (:mod:`agentic_rl.tune`): one trial's objective (its stage config, held-out
problems, training with a callback that reports held-out scores to Optuna's pruner, the score), the trials' folders
and weights, and the plots of the study."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
from transformers import TrainerCallback

from agentic_rl.config import config_from_dict, config_to_dict
from agentic_rl.errors import ConfigError
from agentic_rl.runs import MODEL_FOLDER
from agentic_rl.utils import free_memory, log, warn, write_json

# ``objective(trial, params) -> value``: train and score one trial (``config`` below is the search's TuneConfig).
Objective = Callable[[Any, dict[str, Any]], float]
# Stage settings that decide which problems a trial is scored on (and its stage holds out of training).
_DATA_KEYS = ("dataset", "split", "seed", "eval_samples", "question_field", "answer_field", "ground_truth_field",
              "system_prompt", "environment", "environment_args", "max_train_samples")


def build_stage_config(cls: type, base: dict[str, Any], params: dict[str, Any], output_dir: str | Path,
                       where: str):
    return config_from_dict(cls, {**base, **params, "output_dir": str(output_dir)}, where=where)


def drop_weights(trial_dir: Path) -> None:
    """A finished trial keeps its config, metrics and logs; its weights (GBs for real models) are removed."""
    for child in trial_dir.glob("*"):
        if child.is_dir() and (child.name in (MODEL_FOLDER, "adapter", "base", "best", "final", "checkpoints")
                               or child.name.startswith("checkpoint-")):
            shutil.rmtree(child, ignore_errors=True)


def drop_trial_weights(trial: optuna.Trial | optuna.trial.FrozenTrial, trials_dir: Path | None) -> Path | None:
    """Delete the weights in the trial's own trials_dir/<n>/, only when the trial recorded that very directory."""
    own = (trials_dir / str(trial.number)).resolve() if trials_dir is not None else None
    if own is not None and trial.user_attrs.get("trial_dir") == str(own) and own.is_dir():
        drop_weights(own)
        return own
    return None


def load_heldout(config: Any, stage_cfg: Any, n: int) -> list[dict[str, Any]]:
    """``n`` held-out problems with the stage's prompts: the first ``n`` of the validation slice the trial's stage
    carves out of its training split (:mod:`agentic_rl.eval.validation`), or a seeded sample of ``eval_split``."""
    if config.eval_split is None:
        if stage_cfg.eval_samples < n:
            raise ConfigError(f"the stage holds out {stage_cfg.eval_samples} validation problems, fewer than the "
                              f"{n} a trial is scored on; tune gives the stage its own eval_samples")
        if config.stage == "sft":
            from agentic_rl.train.sft import validation_rows
        else:
            from agentic_rl.train.grpo import validation_rows
        return validation_rows(stage_cfg)[:n]
    from agentic_rl.agent.settings import build_environment, environment_system_prompt
    from agentic_rl.data.formats import build_prompt
    from agentic_rl.eval.evaluate import EvalConfig, load_rows

    columns = {name: getattr(stage_cfg, name, None) for name in ("question_field", "answer_field",
                                                                  "ground_truth_field")}
    rows = load_rows(EvalConfig(dataset=getattr(stage_cfg, "dataset", None) or "synthetic", split=config.eval_split,
                                eval_samples=n, seed=config.seed or 0, **columns))
    env = build_environment(stage_cfg).example if getattr(stage_cfg, "environment", None) is not None else None
    system_prompt = environment_system_prompt(getattr(stage_cfg, "system_prompt", None), env)
    return [{**r, "prompt": build_prompt(r["question"], system_prompt)} for r in rows]


def score_model(config: Any, stage_cfg: Any, model: Any, rows: list[dict[str, Any]], *,
                tokenizer: Any = None) -> tuple[float, dict[str, Any]]:
    """The trial's objective value and metrics, by the one held-out scorer GRPO's periodic checks use
    (:func:`agentic_rl.eval.validation.score_heldout`): greedy ``accuracy`` (strict), or for ``objective: reward`` the
    mean of the stage's reward functions (in an environment: the mean episode return, played with its tools)."""
    from agentic_rl.eval import validation

    env_factory, budget = None, config.max_new_tokens
    if getattr(stage_cfg, "environment", None) is not None:
        from agentic_rl.agent.settings import build_environment

        env_factory = build_environment(stage_cfg)
        budget = max(getattr(stage_cfg, "max_completion_length", None) or budget, stage_cfg.max_turn_tokens)
    metrics = validation.score_heldout(
        model, tokenizer, rows, max_new_tokens=budget, env_factory=env_factory,
        rewards=getattr(stage_cfg, "rewards", None) if config.objective == "reward" else None,
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


class HeldOutPruning(TrainerCallback):
    """Every ``every`` steps: score the model on ``rows``, report it to the trial, and stop training when the pruner
    says the trial is hopeless (the objective then raises ``TrialPruned``)."""

    def __init__(self, config: Any, stage_cfg: Any, trial: optuna.Trial, rows: list, every: int) -> None:
        self.config, self.stage_cfg, self.trial, self.rows, self.every = config, stage_cfg, trial, rows, every
        self.pruned_at: int | None = None

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        step = state.global_step
        if step % self.every or step >= state.max_steps or model is None:
            return
        with _preserved_rng():
            value, _ = score_model(self.config, self.stage_cfg, model, self.rows, tokenizer=processing_class)
        self.trial.report(value, step)
        log(f"trial {self.trial.number} step {step}: held-out {self.config.objective} {value:.4f} "
            f"({len(self.rows)} problems)")
        if self.trial.should_prune():
            self.pruned_at = step
            control.should_training_stop = True


def make_objective(config: Any, cls: type, stage_run: Callable[..., Any], base: dict[str, Any],
                   trials_dir: Path, keep_models: bool = False) -> Objective:
    """The stage objective: resolve the trial's stage config, train (with the pruning callback), score."""
    cache: dict[str, Any] = {}
    prune = config.prune and "callbacks" in inspect.signature(stage_run).parameters
    if config.prune and not prune:
        warn(f"the {config.stage} stage's run() takes no callbacks=, so trials cannot report intermediate scores: "
             "pruning is off")

    def objective(trial: optuna.Trial, params: dict[str, Any]) -> float:
        trial_dir = trials_dir / str(trial.number)
        stage_cfg = build_stage_config(cls, base, params, trial_dir, where=f"trial {trial.number}")
        trial.set_user_attr("stage_config", config_to_dict(stage_cfg))
        # The held-out problems depend on the stage's data settings only, which a search rarely varies (seed may).
        rows_key = json.dumps({k: v for k, v in config_to_dict(stage_cfg).items()
                               if k in _DATA_KEYS or k.startswith("synthetic")}, sort_keys=True, default=str)
        if rows_key not in cache:
            cache[rows_key] = load_heldout(config, stage_cfg, config.eval_samples)
        rows = cache[rows_key]
        budget = getattr(stage_cfg, "max_steps", None) or 0
        every = config.prune_every or max(1, budget // 4)
        callback = (HeldOutPruning(config, stage_cfg, trial, rows[:config.prune_samples], every)
                    if prune and budget and every < budget else None)
        try:
            result = stage_run(stage_cfg, **({"callbacks": [callback]} if callback else {}))
        except BaseException:  # nothing of ours to clean: a refused directory may hold another run's weights
            free_memory()
            raise
        try:
            if callback is not None and callback.pruned_at is not None:
                raise optuna.TrialPruned(f"pruned at step {callback.pruned_at}")
            model_dir = result["model_dir"] if isinstance(result, dict) else str(result)
            value, metrics = score_model(config, stage_cfg, model_dir, rows)
            trial.set_user_attr("metrics", {k: v for k, v in metrics.items()
                                            if isinstance(v, (int, float)) and not isinstance(v, bool)})
            write_json(trial_dir / "tune_score.json", {"trial": trial.number, "params": params,
                                                      config.objective: value, "metrics": metrics})
            return value
        finally:
            if not keep_models:
                drop_weights(trial_dir)
            free_memory()

    return objective


def study_trials_dir(study: optuna.Study, study_name: str, out: Path) -> Path:
    """The study's own folder of trial runs, ``<out>/trials/<study_name>``, recorded in the study for every worker and
    resumed run. Trial numbers restart at 0 in each study, so a study created anew (another name, or the same name
    after study.db was deleted) never reuses another study's folder: it gets ``<study_name>-2``, ..."""
    name = study.user_attrs.get("trials_folder")
    if name is None:
        name, n = study_name, 1
        while (out / "trials" / name).exists() and any((out / "trials" / name).iterdir()):
            n += 1
            name = f"{study_name}-{n}"
        study.set_user_attr("trials_folder", name)
    return out / "trials" / name


def atomic_write(path: Path, text: str) -> None:  # workers may write the outputs at the same time
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_plots(study: optuna.Study, out: Path, objective: str) -> list[str]:
    """Optimisation history and parameter importance as PNGs (matplotlib); skipped with a note when not defined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    made = []
    for name, plot in {"optimization_history.png": ovm.plot_optimization_history,
                       "param_importances.png": ovm.plot_param_importances}.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ax = plot(study, target_name=f"held-out {objective}")
            fig = ax.figure if hasattr(ax, "figure") else ax.flatten()[0].figure
            fig.set_size_inches(7, 4)
            fig.tight_layout()
            fig.savefig(out / f".{name}.{os.getpid()}.png", dpi=100)
            os.replace(out / f".{name}.{os.getpid()}.png", out / name)
            plt.close(fig)
            made.append(name)
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:  # e.g. importance needs >= 2 complete trials
            log(f"plot {name} skipped: {exc}")
    return made
