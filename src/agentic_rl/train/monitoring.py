"""Training health checks as live warnings, and the choice of logging backends.

The seed's health rules, applied to every logged step:

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

Logging backends (``report_to``): ``tensorboard`` (default, events in ``<run>/tensorboard``), ``wandb`` (offline
unless ``WANDB_API_KEY`` is set or ``WANDB_MODE`` says otherwise), ``none``; comma-separate several.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable

from transformers import TrainerCallback

from agentic_rl.errors import ConfigError
from agentic_rl.utils import warn

Rule = Callable[[list[dict[str, Any]], dict[str, Any]], "str | None"]

REPORT_BACKENDS = ("tensorboard", "wandb", "none")


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
    """The seed's three rules on the trainer's ``grad_norm`` and ``loss`` logs."""
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


class HealthCallback(TrainerCallback):
    """Runs a :class:`HealthMonitor` on every training log of a ``Trainer`` (SFT, GRPO, pretraining)."""

    def __init__(self, monitor: HealthMonitor | None = None):
        self.monitor = monitor or HealthMonitor()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and any(k in logs for k in ("loss", "grad_norm", "reward")):
            self.monitor.update(logs, state.global_step)


# ---------------------------------------------------------------------------------------------------------------
# Logging backends
# ---------------------------------------------------------------------------------------------------------------

def resolve_report_to(report_to: str | list[str] | None, run_dir: str | Path | None = None) -> list[str]:
    """Validate ``report_to`` ("tensorboard", "wandb", "none" or a comma list) and prepare the backends.

    wandb runs offline unless ``WANDB_API_KEY`` is set or ``WANDB_MODE`` is set explicitly; its files go to
    ``<run>/wandb``. Returns the list for ``TrainingArguments.report_to`` (``["none"]`` for no backend).
    """
    items = report_to if isinstance(report_to, list) else str(report_to or "none").split(",")
    names = [s.strip().lower() for s in items if s.strip()]
    bad = [n for n in names if n not in REPORT_BACKENDS]
    if bad:
        raise ConfigError(f"report_to '{bad[0]}' is not supported; use tensorboard, wandb or none "
                          f"(comma-separated for several)")
    names = [n for n in dict.fromkeys(names) if n != "none"]
    if "tensorboard" in names:
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            raise ConfigError("report_to tensorboard needs the tensorboard package: pip install tensorboard") from None
    if "wandb" in names:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError("report_to wandb needs the wandb package: pip install 'agentic-rl[wandb]'") from None
        if not os.environ.get("WANDB_MODE") and not os.environ.get("WANDB_API_KEY"):
            os.environ["WANDB_MODE"] = "offline"
        os.environ.setdefault("WANDB_PROJECT", "agentic-rl")
        if run_dir is not None:
            os.environ.setdefault("WANDB_DIR", str(Path(run_dir)))
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
