"""Training health checks as live warnings, and the choice of logging backends.

The health rules the Hello-Agents book recommends, applied to every logged step:

====================  ==========================================  ===========================================
rule                  condition                                   advice
====================  ==========================================  ===========================================
``grad_explosion``    gradient norm > 100                         lower the learning rate (or clip gradients)
``grad_vanishing``    gradient norm < 0.01                        raise the learning rate / check frozen weights
``loss_rising``       smoothed loss rises > 10 % above its best   learning rate too high, or over-fitting
                      after having fallen
====================  ==========================================  ===========================================

A rule is a plain function ``rule(history, logs) -> str | None`` (``history``: earlier log dicts; ``logs``: the
current one); :class:`HealthMonitor` runs a list of rules and prints each new warning once per episode (a rule
warns again only after its condition has cleared). :class:`HealthCallback` plugs a monitor into any ``transformers``
/ TRL trainer. The GRPO stage reuses these with its own keys, e.g.
``HealthMonitor([grad_explosion(), grad_vanishing(), metric_rising("kl", ...)])``.

Non-finite numbers are not a warning but the end of the run: :class:`NonFiniteGuard` (part of every
:class:`HealthCallback`, and of GRPO's monitor) stops training as soon as a logged loss or gradient norm, or the
trainable weights, hold NaN or inf; it vetoes the checkpoint of that step, so the last checkpoint on disk is the
last good one, and when training ends it raises a one-line :class:`~agentic_rl.errors.TrainingError`, so no final
model is written from broken weights and the command exits non-zero. The trainable weights are checked after every
optimizer step (one pass over them, small next to the step; GRPO would otherwise sample its next batch from NaN
logits and die in ``torch.multinomial``). Under fp16 mixed precision an infinite gradient norm is normal (the loss
scaler skips that step) and only the weights count.

Metrics: every stage logs through one :class:`MetricsLogger` (a :class:`MetricsCallback` on its trainer) into
``<run>/metrics.jsonl`` with namespaced keys (``train/loss``, ``perf/num_tokens``, ``sft/mean_token_accuracy``,
``grpo/kl``, ``eval/loss``: :func:`namespace_metrics`), which is what the pipeline report reads, and into the
backends ``report_to`` names: ``tensorboard`` (default, events in ``<run>/tensorboard``), ``wandb`` (offline unless
``WANDB_API_KEY`` is set or ``WANDB_MODE`` says otherwise), ``none`` (:class:`NullBackend`); comma-separate several.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import ProgressCallback, TrainerCallback

from agentic_rl.config import report_to_list
from agentic_rl.errors import ConfigError, TrainingError
from agentic_rl.utils import append_jsonl, log, warn

Rule = Callable[[list[dict[str, Any]], dict[str, Any]], "str | None"]



# ---------------------------------------------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------------------------------------------

def _value(logs: dict[str, Any], key: str) -> float | None:
    v = logs.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
        return float(v)
    return None


def grad_explosion(threshold: float = 100.0, key: str = "grad_norm") -> Rule:
    """Gradient norm above ``threshold``: the update is too large for the learning rate."""

    def rule(history, logs):
        g = _value(logs, key)
        if g is not None and g > threshold:
            return (f"gradient norm {g:.3g} > {threshold:g} (explosion): lower the learning rate "
                    f"(now {logs.get('learning_rate', '?')}) or clip gradients (max_grad_norm)")
        return None

    rule.__name__ = "grad_explosion"
    return rule


def grad_vanishing(threshold: float = 0.01, key: str = "grad_norm") -> Rule:
    """Gradient norm below ``threshold``: nothing is being learned."""

    def rule(history, logs):
        g = _value(logs, key)
        if g is not None and g < threshold:
            return (f"gradient norm {g:.3g} < {threshold:g} (vanishing): raise the learning rate or check that the "
                    f"trainable weights (LoRA targets) are the ones you meant")
        return None

    rule.__name__ = "grad_vanishing"
    return rule


def metric_rising(key: str = "loss", *, window: int = 5, tolerance: float = 0.10, higher_is_worse: bool = True,
                  advice: str = "the learning rate may be too high, or the model is over-fitting") -> Rule:
    """``key``'s moving average (``window`` logs) moved ``tolerance`` (relative) past its best, after improving.

    With ``higher_is_worse=False`` it watches a metric that should rise (e.g. a reward) for a fall instead.
    """

    def rule(history, logs):
        values = [v for v in (_value(h, key) for h in [*history, logs]) if v is not None]
        if _value(logs, key) is None or len(values) < 2 * window:
            return None
        sign = 1.0 if higher_is_worse else -1.0
        means = [sign * sum(values[i - window:i]) / window for i in range(window, len(values) + 1)]
        best, first, now = min(means), means[0], means[-1]
        improved = best < first - 1e-12
        if improved and now > best + tolerance * abs(best) and now > best:
            direction = "risen" if higher_is_worse else "fallen"
            return (f"{key} has {direction} to {sign * now:.4g} after reaching {sign * best:.4g} "
                    f"(moving average of {window} logs): {advice}")
        return None

    rule.__name__ = f"{key}_{'rising' if higher_is_worse else 'falling'}"
    return rule


def default_rules() -> list[Rule]:
    """The Hello-Agents book's three rules on the trainer's ``grad_norm`` and ``loss`` logs."""
    return [grad_explosion(), grad_vanishing(), metric_rising("loss")]


# ---------------------------------------------------------------------------------------------------------------
# Monitor + trainer callback
# ---------------------------------------------------------------------------------------------------------------

class HealthMonitor:
    """Apply ``rules`` to each log dict; print a warning when a rule starts firing (once per episode).

    ``warnings`` keeps every warning as ``{"step", "rule", "message"}`` for the run's metrics.
    """

    def __init__(self, rules: list[Rule] | None = None, emit: Callable[[str], None] = warn):
        self.rules = default_rules() if rules is None else list(rules)
        self.emit = emit
        self.history: list[dict[str, Any]] = []
        self.warnings: list[dict[str, Any]] = []
        self._firing: set[str] = set()

    def update(self, logs: dict[str, Any], step: int | None = None) -> list[str]:
        new = []
        for rule in self.rules:
            name = getattr(rule, "__name__", repr(rule))
            message = rule(self.history, logs)
            if message and name not in self._firing:
                self._firing.add(name)
                where = f"step {step}: " if step is not None else ""
                self.emit(f"{where}{message}")
                self.warnings.append({"step": step, "rule": name, "message": message})
                new.append(message)
            elif not message:
                self._firing.discard(name)
        self.history.append(dict(logs))
        return new


def _nonfinite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(float(value))


class NonFiniteGuard(TrainerCallback):
    """Stops a ``Trainer`` whose loss, gradient norm or trainable weights became NaN/inf (see the module docstring).

    ``problem`` says what went wrong (``None`` while all is well); :meth:`on_train_end` raises it as a
    :class:`TrainingError` naming the step and the last good checkpoint.
    """

    LOSS_KEYS = ("loss", "train_loss", "eval_loss")
    GRAD_KEYS = ("grad_norm",)

    def __init__(self) -> None:
        self.problem: str | None = None
        self.step: int | None = None

    def _stop(self, control, state, problem: str) -> None:
        if self.problem is None:
            self.problem, self.step = problem, state.global_step
        control.should_training_stop = True
        control.should_save = False  # the checkpoint of this step would hold broken weights
        control.should_evaluate = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        keys = self.LOSS_KEYS + (() if getattr(args, "fp16", False) else self.GRAD_KEYS)
        bad = [k for k in keys if _nonfinite((logs or {}).get(k))]
        if bad:
            self._stop(control, state, f"the {bad[0].replace('_', ' ')} became {logs[bad[0]]}")
        elif self.problem is not None:
            self._stop(control, state, self.problem)

    def _check_weights(self, state, control, model) -> None:
        if self.problem is None and model is not None:
            from agentic_rl.models.loading import nonfinite_parameters

            bad = nonfinite_parameters(model, trainable_only=True)
            if bad:
                more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
                self._stop(control, state, f"the weights became non-finite (NaN/inf in {bad[0]}{more})")
        if self.problem is not None:
            self._stop(control, state, self.problem)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self._check_weights(state, control, model)

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        self._check_weights(state, control, model)

    def on_train_end(self, args, state, control, **kwargs):
        if self.problem is None:
            return
        from agentic_rl.utils import last_checkpoint

        checkpoint = last_checkpoint(args.output_dir) if getattr(args, "output_dir", None) else None
        kept = (f"the last good checkpoint is {checkpoint}" if checkpoint else
                "no checkpoint was saved before it")
        if not getattr(args, "disable_tqdm", True):  # the progress bar (closed after us) leaves its line open
            print(file=sys.stderr, flush=True)
        raise TrainingError(
            f"training stopped at step {self.step}: {self.problem}; no model was saved from these weights and "
            f"{kept}. Lower the learning rate (now {getattr(args, 'learning_rate', '?')}) or clip gradients "
            f"(max_grad_norm), and check the data and rewards for extreme values")


class HealthCallback(NonFiniteGuard):
    """Runs a :class:`HealthMonitor` on every training log of a ``Trainer`` (SFT, GRPO, pretraining), and stops
    the run when its numbers become non-finite (:class:`NonFiniteGuard`)."""

    def __init__(self, monitor: HealthMonitor | None = None):
        super().__init__()
        self.monitor = monitor or HealthMonitor()

    def on_log(self, args, state, control, logs=None, **kwargs):
        super().on_log(args, state, control, logs=logs, **kwargs)
        if logs and any(k in logs for k in ("loss", "grad_norm", "reward")):
            self.monitor.update(logs, state.global_step)


# ---------------------------------------------------------------------------------------------------------------
# What the run will cost
# ---------------------------------------------------------------------------------------------------------------

def cost_line(steps: int, seconds_per_step: float) -> str:
    """``"cost: about 98 more steps x 65.2 s/step = ~106.5 min"`` (with hours when it is more than two)."""
    total = steps * seconds_per_step / 60
    hours = f" ({total / 60:.1f} h)" if total > 120 else ""
    return f"cost: about {steps} more steps x {seconds_per_step:.2f} s/step = ~{total:.1f} min{hours}"


class StepCostCallback(TrainerCallback):
    """Prints once, early in a run, what the rest of it will take: the steps left times the mean time of the steps
    after the first (which holds the warm-up: compiling, the first batch's allocations, a resumed run's checkpoint).
    The mean is over one cycle of steps: one step, or for GRPO reusing each generation batch (``num_iterations``,
    ``steps_per_generation`` above the gradient accumulation) the optimizer steps between two generations, since only
    one of them generates. Printed on any device: a long run is worth planning for on a GPU as well, and one line is
    all it costs. Nothing is printed when no step is left."""

    def __init__(self) -> None:
        self.first_step: int | None = None
        self.first_step_done: float | None = None
        self.seconds_per_step: float | None = None
        self.cycle = 1

    def on_train_begin(self, args, state, control, **kwargs):
        self.first_step = state.global_step + 1  # a resumed run measures its own steps
        # TRL's GRPO generates every steps_per_generation x num_iterations micro-steps; other trainers have neither
        micro_steps = getattr(args, "steps_per_generation", None) or 1
        micro_steps *= getattr(args, "num_iterations", None) or 1
        accumulation = getattr(args, "gradient_accumulation_steps", None) or 1
        self.cycle = max(1, -(-micro_steps // accumulation))

    def on_step_end(self, args, state, control, **kwargs):
        import time

        if self.first_step is None or self.seconds_per_step is not None:
            return
        if state.global_step == self.first_step:
            self.first_step_done = time.perf_counter()
        elif state.global_step == self.first_step + self.cycle and self.first_step_done is not None:
            self.seconds_per_step = (time.perf_counter() - self.first_step_done) / self.cycle
            left = state.max_steps - state.global_step
            if left > 0 and state.is_world_process_zero:
                log(cost_line(left, self.seconds_per_step))


# ---------------------------------------------------------------------------------------------------------------
# Logging backends
# ---------------------------------------------------------------------------------------------------------------

_WANDB_DIR_SET_HERE: str | None = None


def resolve_report_to(report_to: str | list[str] | None, run_dir: str | Path | None = None) -> list[str]:
    """Validate ``report_to`` ("tensorboard", "wandb", "none" or a comma list) and prepare the backends.

    wandb runs offline unless ``WANDB_API_KEY`` is set or ``WANDB_MODE`` is set explicitly; its files go to
    ``<run>/wandb``. Returns the list for ``TrainingArguments.report_to`` (``["none"]`` for no backend).
    """
    names = [n for n in dict.fromkeys(report_to_list(report_to)) if n != "none"]
    if "tensorboard" in names:
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            raise ConfigError("report_to tensorboard needs the tensorboard package: pip install tensorboard") from None
    if "wandb" in names:
        try:
            import wandb
        except ImportError:
            raise ConfigError("report_to wandb needs the wandb package: pip install 'agentic-rl[wandb]'") from None
        if not os.environ.get("WANDB_MODE") and not os.environ.get("WANDB_API_KEY"):
            os.environ["WANDB_MODE"] = "offline"
        os.environ.setdefault("WANDB_PROJECT", "agentic-rl")
        global _WANDB_DIR_SET_HERE
        if run_dir is not None and (not os.environ.get("WANDB_DIR") or
                                    os.environ.get("WANDB_DIR") == _WANDB_DIR_SET_HERE):
            # Each stage's files in its own run directory: a directory this function chose for an earlier stage of
            # the same process is replaced, one the user chose is kept.
            os.environ["WANDB_DIR"] = _WANDB_DIR_SET_HERE = str(Path(run_dir))
        # wandb keeps the settings of its first run in a process-wide singleton (its directory among them):
        # start each stage's run from a clean one, or a second stage logs into the first one's folder.
        wandb.teardown()
    return names or ["none"]


# ---------------------------------------------------------------------------------------------------------------
# The one metrics logger of every stage
# ---------------------------------------------------------------------------------------------------------------

#: The trainer's own keys, the same in every stage -> their namespaced names (see :func:`namespace_metrics`).
TRAINER_METRIC_NAMES = {
    "loss": "train/loss", "grad_norm": "train/grad_norm", "learning_rate": "train/learning_rate",
    "epoch": "train/epoch", "train_loss": "train/mean_loss", "num_tokens": "perf/num_tokens",
    "step_time": "perf/step_time_s", "train_runtime": "perf/train_runtime_s",
    "train_samples_per_second": "perf/train_samples_per_s", "train_steps_per_second": "perf/train_steps_per_s",
    "total_flos": "perf/total_flos",
}


def namespace_metrics(logs: dict[str, Any], stage: str, names: dict[str, str] | None = None) -> dict[str, float]:
    """A trainer's log dict -> namespaced scalars: the trainer's shared keys as ``train/…`` / ``perf/…``
    (:data:`TRAINER_METRIC_NAMES`, plus the stage's own ``names``), ``eval_x`` as ``eval/x``, the environment's
    ``agent/…`` as they are, anything else as ``<stage>/<key>`` (nothing is dropped); non-numbers are left out.

    >>> namespace_metrics({"loss": 1.5, "mean_token_accuracy": 0.4, "eval_loss": 1.7}, "sft")
    {'train/loss': 1.5, 'sft/mean_token_accuracy': 0.4, 'eval/loss': 1.7}
    """
    names = {**TRAINER_METRIC_NAMES, **(names or {})}
    out: dict[str, float] = {}
    for key, value in logs.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if key in names:
            out[names[key]] = float(value)
        elif key.startswith("eval_"):
            out[f"eval/{key[len('eval_'):]}"] = float(value)
        elif key.startswith("agent/"):
            out[key] = float(value)
        else:
            out[f"{stage}/{key}"] = float(value)
    return out


class NullBackend:
    """Where scalars go when ``report_to`` is ``none``: nowhere (no file, no folder, no process)."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def text(self, step: int, tag: str, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardBackend(NullBackend):
    """Scalars (and sample texts) as TensorBoard events in ``<run>/tensorboard`` (one fixed folder per run; the
    trainer's own callback would write under ``output_dir/runs/<date>``)."""

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if math.isfinite(value):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def text(self, step: int, tag: str, text: str) -> None:
        self.writer.add_text(tag, text, step)

    def close(self) -> None:
        self.writer.close()


class WandbBackend(NullBackend):
    """A wandb run named after the run directory, its files in ``$WANDB_DIR`` (the user's, else the run directory:
    :func:`resolve_report_to`, which also makes it offline unless a key is set)."""

    def __init__(self, run_dir: Path, config: dict[str, Any] | None):
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "agentic-rl"), name=run_dir.name,
                              dir=os.environ.get("WANDB_DIR", str(run_dir)), config=config or {}, resume="allow")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class MetricsLogger:
    """The one place a stage's scalars go, so that no training loop branches on which backends are on.

    ``<run>/metrics.jsonl`` (``{"step": N, <namespaced metric>: value, ...}`` per log) is the run's record, always
    written: the pipeline report, the compute-matched control and the agent tool read it. TensorBoard and wandb are
    backends chosen by ``report_to`` (already checked by :func:`resolve_report_to`); ``none`` is the
    :class:`NullBackend`. A new run starts a fresh ``metrics.jsonl``; a resumed one appends to it.
    """

    def __init__(self, run_dir: str | Path, report_to: list[str], *, config: dict[str, Any] | None = None,
                 resume: bool = False):
        run_dir = Path(run_dir)
        self.path = run_dir / "metrics.jsonl"
        if not resume and self.path.exists():
            self.path.unlink()
        self.backends: list[NullBackend] = []
        if "tensorboard" in report_to:
            self.backends.append(TensorBoardBackend(run_dir))
        if "wandb" in report_to:
            self.backends.append(WandbBackend(run_dir, config))
        if not self.backends:
            self.backends.append(NullBackend())

    def log(self, step: int, metrics: dict[str, float]) -> None:
        append_jsonl(self.path, {"step": step, **metrics})
        for backend in self.backends:
            backend.log(step, metrics)

    def text(self, step: int, tag: str, text: str) -> None:
        for backend in self.backends:
            backend.text(step, tag, text)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()


class MetricsCallback(TrainerCallback):
    """Feeds a ``transformers`` / TRL trainer's logs, namespaced for ``stage``, to a :class:`MetricsLogger`
    (pretraining, SFT, the reward model; GRPO's monitor calls the logger itself). The trainer's own reporting stays
    off (``report_to="none"``); only the main process writes."""

    def __init__(self, logger: MetricsLogger, stage: str):
        self.logger, self.stage = logger, stage

    def on_log(self, args, state, control, logs=None, **kwargs):
        metrics = namespace_metrics(logs or {}, self.stage)
        if metrics and state.is_world_process_zero:
            self.logger.log(state.global_step, metrics)


def trl_generation_log(trainer) -> dict[str, Any]:
    """The latest generation batch a TRL ``GRPOTrainer`` / ``RLOOTrainer`` scored, as TRL records it:
    ``{"prompt": deque, "completion": deque, "rewards": {name: deque}, "advantages": deque, ...}``.

    TRL 1.16 keeps this only in the private attribute ``trainer._logs`` (filled in
    ``_generate_and_score_completions`` for its ``log_completions`` table) and offers no public accessor. We need it
    for GRPO's ``completions.jsonl`` (sample completions with each reward and the advantage), and the overrides that
    change TRL's advantages write the ones they trained on into it (:func:`log_trained_advantages`). This is the one
    place the project touches that attribute, so a TRL release that renames it fails here, with a message, rather
    than deep in a callback.
    """
    logs = getattr(trainer, "_logs", None)
    if not isinstance(logs, dict) or not {"prompt", "completion", "rewards", "advantages"} <= logs.keys():
        import trl

        raise TrainingError(f"TRL {trl.__version__} no longer keeps its generation batch in trainer._logs (read by "
                            "agentic_rl.train.monitoring.trl_generation_log, written for TRL 1.16): install the "
                            "TRL version in constraints.txt, or set completions_every: 0")
    return logs


def log_trained_advantages(trainer, advantages: list) -> None:
    """Replace the latest ``len(advantages)`` advantages of TRL's completion log (:func:`trl_generation_log`) by
    ``advantages``, the ones trained on, when an override changed TRL's (RLOO's, turn credit's, tied failures')."""
    logged = trl_generation_log(trainer)["advantages"]
    for _ in range(min(len(advantages), len(logged))):
        logged.pop()
    logged.extend(advantages)


class QuietProgressCallback(ProgressCallback):
    """transformers' progress bar without the metrics dict it prints under the bar at every logging step."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        return None


def quiet_progress(trainer) -> None:
    """Keep the trainer's progress bar but not the metrics dict transformers prints under it at every logging step
    (the metrics go to metrics.jsonl and TensorBoard); with ``--verbose`` it is printed as before."""
    from agentic_rl.console import is_verbose

    if not is_verbose() and trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(QuietProgressCallback)
