"""Rewards by name, with parameters and weights, plus user rewards loaded from ``module:function``.

A reward **spec** is one string::

    name                         accuracy                    built-in reward, weight 1.0
    name:WEIGHT                  format:0.2                  built-in reward with a weight
    name(key=value,...)          length(alpha=0.002,target_length=300)
    name(key=value,...):WEIGHT   step(beta=0.05):0.5
    module:function              my_pkg.rewards:brevity      a user reward (any importable callable)
    module:function:WEIGHT       my_pkg.rewards:brevity:0.3
    module:function(k=v):WEIGHT  my_pkg.rewards:Brevity(limit=100):0.3
    rm:PATH[:WEIGHT]             rm:runs/rm/model:1.0        a trained reward model (= reward_model(path=PATH))

The syntax is unambiguous because a weight is always the last ``:``-field and parses as a number, while a
user reward always has a ``:`` between module and attribute, and a built-in name never contains ``:``; the prefix
``rm:`` is reserved for the reward-model shorthand (a user module named ``rm`` is out of reach). (The Python names
``nan``, ``inf`` and ``infinity`` parse as floats: after a module that is not a built-in reward they name the
function.) Parameter values are read as YAML scalars (``0.01``, ``true``, ``lenient``, ``null``; quote a value
holding ``,`` or ``: ``, e.g. ``rubric="Correct, concise"``). A user target that is a class is instantiated with the
parameters; a function given parameters gets them bound as keyword arguments. Any mistake is a :class:`ConfigError`
that names the spec.

A user reward's every call is checked (:class:`CheckedReward`): it must return one number per completion, as a
list, tuple or 1-D array. ``None`` for a completion is allowed and means "not applicable" (TRL's contract for
multi-task rewards: that reward is left out of the completion's sum). Anything else — an exception, a scalar, ``None``
instead of a list, the wrong length, a string, NaN or inf — stops with a one-line :class:`RewardError` that names
the reward and the problem, never a TRL traceback or a silently skipped reward.

>>> funcs, weights = build_rewards(["accuracy", "format:0.2", "length(alpha=0.01)"])
>>> [f.__name__ for f in funcs], weights
(['accuracy', 'format', 'length'], [1.0, 0.2, 1.0])
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import numbers
import re
import traceback
from collections.abc import Callable
from typing import Any

import yaml

from agentic_rl.config import import_object
from agentic_rl.errors import ConfigError, RewardError
from agentic_rl.rewards.functions import AccuracyReward, FormatReward, LengthPenaltyReward, ProcessReward, StepReward
from agentic_rl.rewards.judge import JudgeReward
from agentic_rl.rewards.reward_model import RewardModelReward

__all__ = ["REWARDS", "get_reward", "load_user_reward", "parse_reward_spec", "build_rewards", "CheckedReward",
           "check_reward_output"]

REWARDS: dict[str, type] = {
    "accuracy": AccuracyReward,
    "length": LengthPenaltyReward,
    "step": StepReward,
    "format": FormatReward,
    "process": ProcessReward,
    "judge": JudgeReward,
    "reward_model": RewardModelReward,
}

_PARAM_KEY_RE = re.compile(r"^[A-Za-z_]\w*$")


def _accepted(cls: Any) -> list[str]:
    try:
        return [p for p in inspect.signature(cls).parameters if p not in ("self", "completions", "kwargs")]
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return []


def get_reward(name: str, **params: Any) -> Callable[..., list[float]]:
    """A built-in reward by name, built with ``params`` (e.g. ``get_reward("length", alpha=0.01)``)."""
    cls = _builtin_reward(name, params)
    try:
        return cls(**params)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"reward '{name}': invalid parameters {params}: {exc}") from None


def _builtin_reward(name: str, params: dict[str, Any]) -> Any:
    """The class of built-in reward ``name``, after checking the name and the parameter names."""
    if name not in REWARDS:
        close = difflib.get_close_matches(name, list(REWARDS), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"unknown reward '{name}'{hint}; built-in rewards are {', '.join(REWARDS)} "
                          f"(or give a user reward as module:function)")
    cls = REWARDS[name]
    unknown = [k for k in params if k not in _accepted(cls)]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(_accepted(cls)), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"reward '{name}' has no parameter '{unknown[0]}'{hint}; its parameters are "
                          f"{', '.join(_accepted(cls))}")
    return cls


def load_user_reward(target: str, **params: Any) -> Callable[..., list[float]]:
    """Import ``module:function`` (dots allowed on both sides: ``pkg.mod:obj.attr``) as a reward callable."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"user reward '{target}' must look like module:function")
    obj = import_object(target, "user reward")
    if inspect.isclass(obj):
        try:
            obj = obj(**params)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"user reward '{target}': cannot build it with {params}: {exc}") from None
    elif params:
        name = getattr(obj, "__name__", attr)
        obj = functools.partial(obj, **params)  # TRL names a partial after the function it wraps
        obj.__name__ = name  # type: ignore[attr-defined]
    if not callable(obj):
        raise ConfigError(f"user reward '{target}' is a {type(obj).__name__}, not a callable")
    return checked_reward(obj, target)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_reward_output(values: Any, n: int, what: str) -> list[float | None]:
    """``values`` as a list of ``n`` finite floats (``None`` kept: "not applicable"), else a :class:`RewardError`.

    ``what`` names the reward in the message (``user reward 'my_mod:brevity'``).
    """
    if hasattr(values, "tolist") and not isinstance(values, (str, bytes)):  # numpy array, torch tensor
        values = values.tolist()
    if values is None or not isinstance(values, (list, tuple)):
        kind = "None" if values is None else f"a {type(values).__name__} ({_short(values)})"
        raise RewardError(f"{what} returned {kind}, not a list with one reward per completion ({n})")
    if len(values) != n:
        raise RewardError(f"{what} returned {len(values)} rewards for {n} completions; return exactly one per "
                          f"completion")
    out: list[float | None] = []
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise RewardError(f"{what} returned {_short(v)} ({type(v).__name__}) for completion {i}; each reward "
                              f"must be a number (or None: not applicable)")
        number = float(v)
        if not math.isfinite(number):
            raise RewardError(f"{what} returned {number} for completion {i}; rewards must be finite (return None "
                              f"when a reward does not apply)")
        out.append(number)
    return out


def _raised(what: str, exc: Exception) -> RewardError:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    message = str(exc).strip().splitlines()
    detail = f": {message[0]}" if message else ""
    return RewardError(f"{what} raised {type(exc).__name__}{detail}{where}")


class CheckedReward:
    """A user reward whose every call is checked with :func:`check_reward_output` (cheap: one pass over the list).

    Keeps the wrapped reward's ``__name__`` (TRL logs rewards by it) and forwards other attributes to it.
    """

    def __init__(self, func: Callable[..., Any], spec: str):
        self.func = func
        self.spec = spec
        self.__name__ = getattr(func, "__name__", type(func).__name__)

    def __call__(self, completions: Any, **kwargs: Any) -> list[float | None]:
        what = f"user reward '{self.spec}'"
        try:
            values = self.func(completions, **kwargs)
        except RewardError:
            raise
        except Exception as exc:  # user code: one line naming the reward, the error and where it was raised
            raise _raised(what, exc) from exc
        return check_reward_output(values, len(completions), what)

    def __getattr__(self, name: str) -> Any:  # only called for attributes the wrapper itself lacks
        func = self.__dict__.get("func")
        if func is None:
            raise AttributeError(name)
        return getattr(func, name)


class AsyncCheckedReward(CheckedReward):
    """:class:`CheckedReward` for an ``async`` reward (TRL awaits those concurrently)."""

    async def __call__(self, completions: Any, **kwargs: Any) -> list[float | None]:  # type: ignore[override]
        what = f"user reward '{self.spec}'"
        try:
            values = await self.func(completions, **kwargs)
        except RewardError:
            raise
        except Exception as exc:
            raise _raised(what, exc) from exc
        return check_reward_output(values, len(completions), what)


def checked_reward(func: Callable[..., Any], spec: str) -> CheckedReward:
    inner = func
    while isinstance(inner, functools.partial):
        inner = inner.func
    call = getattr(inner, "__call__", None)  # noqa: B004 (a callable object's own __call__ may be async)
    is_async = inspect.iscoroutinefunction(inner) or inspect.iscoroutinefunction(call)
    return (AsyncCheckedReward if is_async else CheckedReward)(func, spec)


class _Renamed:
    """A reward under another name (TRL logs rewards by ``__name__``; two with the same name would collide)."""

    def __init__(self, func: Callable[..., list[float]], name: str):
        self.func = func
        self.__name__ = name

    def __call__(self, completions: Any, **kwargs: Any) -> list[float]:
        return self.func(completions, **kwargs)


def _split_params(text: str) -> list[str]:
    """``a=1,b="x, y"`` -> ``['a=1', 'b="x, y"']``: commas inside a quoted value do not split (a quote opens
    only right after ``=``, so an apostrophe inside plain text stays text)."""
    items, current, quote = [], [], None
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"" and "".join(current).rstrip().endswith("="):
            quote = char
        elif char == ",":
            items.append("".join(current))
            current = []
            continue
        current.append(char)
    items.append("".join(current))
    return items


def _parse_params(spec: str, text: str) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in (p.strip() for p in _split_params(text)):
        if not item:
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not _PARAM_KEY_RE.match(key):
            raise ConfigError(f"reward spec '{spec}': parameter '{item}' must look like key=value")
        try:
            params[key] = yaml.safe_load(value.strip()) if value.strip() else None
        except yaml.YAMLError:
            params[key] = value.strip()
    return params


def parse_reward_spec(spec: str) -> tuple[str, dict[str, Any], float]:
    """``"length(alpha=0.01):0.5"`` -> ``("length", {"alpha": 0.01}, 0.5)``; the target keeps ``module:function``."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"reward spec {spec!r} is empty; use name[:weight], name(key=value):weight or "
                          f"module:function[:weight]")
    text = spec.strip()
    weight = 1.0
    head, sep, tail = text.rpartition(":")
    if sep and ")" not in tail:
        try:
            number: float | None = float(tail)
        except ValueError:
            number = None
        # `my_mod:nan`, `my_mod:inf`: a user function named like a float, not a weight on a built-in reward
        named_like_a_float = (number is not None and tail.strip().isidentifier() and ":" not in head
                              and head.split("(")[0].strip() not in REWARDS)
        if number is not None and not named_like_a_float:
            if not math.isfinite(number):
                raise ConfigError(f"reward spec '{spec}': weight must be a finite number, got {tail}")
            weight = number
            text = head.strip()
    params: dict[str, Any] = {}
    if text.endswith(")"):
        open_at = text.find("(")
        if open_at <= 0:
            raise ConfigError(f"reward spec '{spec}': unbalanced parentheses")
        params = _parse_params(spec, text[open_at + 1:-1])
        text = text[:open_at].strip()
    if not text or "(" in text or ")" in text or " " in text:
        raise ConfigError(f"reward spec '{spec}' is not name[:weight], name(key=value,...)[:weight] or "
                          f"module:function[:weight]")
    return text, params, weight


def check_reward_specs(specs: list[str]) -> None:
    """Check reward specs without building them: the syntax, built-in names and their parameter names (with "did you
    mean"), and that a user reward's module imports and has the attribute. Stage configs call this when they are
    built, so a misspelt name fails in one line before any model or data is loaded."""
    for spec in specs:
        target, params, _ = parse_reward_spec(spec)
        if target.startswith("rm:"):
            continue  # a reward model's path: checked when it loads
        try:
            if ":" in target:
                module_name, _, attr = target.partition(":")
                if not module_name or not attr:
                    raise ConfigError(f"user reward '{target}' must look like module:function")
                import_object(target, "user reward")
            else:
                _builtin_reward(target, params)
        except ConfigError as exc:
            message = str(exc)
            raise ConfigError(message if spec in message else f"reward spec '{spec}': {message}") from None


def build_rewards(specs: list[str] | str, defaults: dict[str, Any] | None = None,
                  ) -> tuple[list[Callable[..., list[float]]], list[float]]:
    """Reward callables and their weights from specs (see the module docstring for the syntax).

    ``defaults`` (e.g. ``{"mode": "lenient", "tokenizer": tok}``) go to each built-in reward that accepts them
    and whose spec does not set them. Two rewards with the same ``__name__`` get ``_2``, ``_3`` suffixes so their
    logged metrics stay apart.
    """
    if isinstance(specs, str):
        specs = [specs]
    if not specs:
        raise ConfigError("no rewards given; e.g. --reward accuracy --reward format:0.2")
    funcs: list[Callable[..., list[float]]] = []
    weights: list[float] = []
    names: set[str] = set()
    for spec in specs:
        target, params, weight = parse_reward_spec(spec)
        if defaults and target in REWARDS:
            accepted = _accepted(REWARDS[target])
            params = {**{k: v for k, v in defaults.items() if k in accepted}, **params}
        if target.startswith("rm:"):  # the reward-model shorthand: rm:PATH is reward_model(path=PATH)
            target, params = "reward_model", {"path": target[3:], **params}
        try:
            func = load_user_reward(target, **params) if ":" in target else get_reward(target, **params)
        except ConfigError as exc:
            message = str(exc)
            raise ConfigError(message if spec in message else f"reward spec '{spec}': {message}") from None
        name = getattr(func, "__name__", type(func).__name__)
        unique, k = name, 2
        while unique in names:
            unique, k = f"{name}_{k}", k + 1
        if unique != name:
            if isinstance(func, (*REWARDS.values(), CheckedReward)):  # our own fresh objects: rename them
                func.__name__ = unique  # type: ignore[attr-defined]
            else:  # a user function may be shared: wrap it rather than rename it
                func = _Renamed(func, unique)
        names.add(unique)
        funcs.append(func)
        weights.append(weight)
    return funcs, weights
