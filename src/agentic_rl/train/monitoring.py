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

Logging backends (``report_to``): ``tensorboard`` (default, events in ``<run>/tensorboard``), ``wandb`` (offline
unless ``WANDB_API_KEY`` is set or ``WANDB_MODE`` says otherwise), ``none``; comma-separate several.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

from transformers import TrainerCallback

from agentic_rl.config import report_to_list
from agentic_rl.errors import ConfigError, TrainingError
from agentic_rl.utils import warn

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


def logging_callbacks(report_to: list[str], run_dir: str | Path) -> tuple[list[str], list[TrainerCallback]]:
    """Split ``report_to`` into what the trainer handles itself and our TensorBoard writer at ``<run>/tensorboard``.

    (The trainer's own TensorBoard callback writes under ``output_dir/runs/<date>``; one fixed folder per run is
    easier to find and to plot.)
    """
    callbacks: list[TrainerCallback] = []
    rest = [r for r in report_to if r not in ("tensorboard", "none")] or ["none"]
    if "tensorboard" in report_to:
        from torch.utils.tensorboard import SummaryWriter
        from transformers.integrations import TensorBoardCallback

        callbacks.append(TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))))
    return rest, callbacks
