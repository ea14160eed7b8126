"""Typed configs: one dataclass per stage, loaded from YAML and overridden by CLI flags.

Every stage module defines a ``@dataclass`` config whose fields carry a ``help`` string in their metadata
(``field(default=..., metadata={"help": "..."})``). This module turns such a dataclass into:

* ``load_config(Config, yaml_path, overrides)`` — YAML values, then overrides; an unknown key or a value of the
  wrong type is a :class:`ConfigError` that names the key (a silently ignored setting is the worst defect a
  training tool can have);
* ``add_config_arguments(parser, Config)`` — one ``--flag`` per field, with the field's help;
* ``config_to_dict`` / ``save_config`` — the resolved config, written into every run directory;
* ``check_range(config, name, low, high, ...)`` — the one range check every stage config's ``__post_init__`` uses
  (a value outside its range, or NaN/inf, is a one-line :class:`ConfigError` naming the field). Non-finite numbers
  are already rejected for every float setting when YAML or flags are read.

Field metadata understood here: ``help`` (required for a good ``--help``), ``flag`` (the CLI name when it differs
from the field name, e.g. ``reward`` for a ``rewards`` list), ``positional`` (a positional CLI argument),
``choices`` (allowed values).

One concept has one name in every stage, TRL's where TRL has one (``gradient_accumulation_steps``,
``lr_scheduler_type``, ``lora_target_modules``); any other name is an unknown key (``CHANGELOG.md`` lists the
names earlier versions used).

A list setting's flag repeats (``--judge accuracy:1.0 --judge format:0.2``), and each value given to it is also a
comma list, split only at commas outside parentheses, brackets and quotes (:func:`split_list_value`), so
``--report-to tensorboard,wandb`` is two items while ``--reward 'length(alpha=0.01, floor=0):0.5'`` and an LLM judge
spec stay one. In YAML a list setting given as one string is a one-item list (``report_to: none`` is ``["none"]``;
``report_to`` itself also splits ``"tensorboard,wandb"``).

Sizes are bounded before anything is parsed: a config file over :data:`MAX_CONFIG_BYTES`, or YAML (in a file or a
mapping-valued flag such as ``--environment-args``) nested deeper than ``MAX_NESTING``, whose aliases expand to more
than :data:`MAX_YAML_CONTAINERS` lists and mappings, or holding an integer too long to convert, is a one-line error.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from agentic_rl.errors import ConfigError

T = TypeVar("T")

REPORT_BACKENDS = ("tensorboard", "wandb", "none")


def report_to_list(value: str | list[str] | None) -> list[str]:
    """``report_to`` as every stage keeps it, a list of backends (a string from Python is a comma list too).

    >>> report_to_list("tensorboard, wandb")
    ['tensorboard', 'wandb']
    """
    items = value if isinstance(value, (list, tuple)) else [str(value or "none")]
    names = [part.strip().lower() for item in items for part in str(item).split(",") if part.strip()]
    bad = [n for n in names if n not in REPORT_BACKENDS]
    if bad:
        raise ConfigError(f"report_to '{bad[0]}' is not supported; use tensorboard, wandb or none "
                          f"(comma-separated for several)")
    return names or ["none"]


# ---------------------------------------------------------------------------------------------------------------
# Type handling
# ---------------------------------------------------------------------------------------------------------------

def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """``Optional[X]`` / ``X | None`` -> (X, True); anything else -> (tp, False)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _type_name(tp: Any) -> str:
    inner, optional = _unwrap_optional(tp)
    name = getattr(inner, "__name__", str(inner))
    if typing.get_origin(inner) in (list, dict):
        name = str(inner).replace("typing.", "")
    return f"{name} or null" if optional else name


def _coerce(key: str, value: Any, tp: Any, from_string: bool) -> Any:
    """Check (and, for CLI strings, convert) ``value`` against the annotation ``tp``."""
    inner, optional = _unwrap_optional(tp)
    if value is None or (from_string and optional and str(value).lower() in ("none", "null")):
        if optional:
            return None
        raise ConfigError(f"config key '{key}' must be {_type_name(tp)}, got null")
    origin = typing.get_origin(inner)
    if origin is list:
        (item_tp,) = typing.get_args(inner) or (str,)
        if from_string and isinstance(value, (str, list, tuple)):  # a flag, maybe repeated: each value a comma list
            value = [item for given in ([value] if isinstance(value, str) else value)
                     for item in (split_list_value(given) if isinstance(given, str) else [given])]
        elif isinstance(value, str):  # one value in YAML or Python: a one-item list ("none" -> ["none"]); not split,
            value = [value]  # since a reward spec such as "length(alpha=0.01, floor=0):0.5" holds commas itself
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}' must be a list, got {type(value).__name__} {value!r}")
        return [_coerce(f"{key}[{i}]", v, item_tp, from_string) for i, v in enumerate(value)]
    if origin is dict:
        if from_string and isinstance(value, str):  # a flag: a YAML / JSON mapping, e.g. '{final_turn: answer}'
            if len(value.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
                raise ConfigError(f"config key '{key}' holds more than {MAX_CONFIG_BYTES // 1024} KB; put large "
                                  "values in a file")
            try:
                value = parse_yaml_text(value, f"config key '{key}'") if value.strip() else {}
            except ConfigError as exc:
                if "invalid YAML (" in str(exc):  # a limit (depth, aliases, digits): say which
                    raise
                raise ConfigError(f"config key '{key}' must be a mapping such as '{{name: value}}', got "
                                  f"{value[:80]!r}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' must be a mapping, got {type(value).__name__} {value!r}")
        return dict(value)
    if inner is Any:
        return value
    if inner is bool:
        if isinstance(value, bool):
            return value
        if from_string and str(value).lower() in ("true", "1", "yes", "on"):
            return True
        if from_string and str(value).lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"config key '{key}' must be true or false, got {value!r}")
    if inner is int:
        if isinstance(value, bool):
            raise ConfigError(f"config key '{key}' must be an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if from_string:
            try:
                return int(str(value))
            except ValueError:
                pass
        raise ConfigError(f"config key '{key}' must be an integer, got {value!r}")
    if inner is float:
        if isinstance(value, bool):
            raise ConfigError(f"config key '{key}' must be a number, got {value!r}")
        number: float | None = None
        if isinstance(value, (int, float)):
            try:
                number = float(value)
            except OverflowError:  # an integer too large for a float
                number = math.inf
        elif isinstance(value, str):  # YAML reads "1e-5" as a string; accept plain numeric strings everywhere
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise ConfigError(f"config key '{key}' must be a number, got {value!r}")
        if not math.isfinite(number):  # YAML .nan/.inf, "nan", "inf", 1e999: no setting means anything with them
            raise ConfigError(f"config key '{key}' must be a finite number, got {value!r}")
        return number
    if inner is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"config key '{key}' must be a string, got {type(value).__name__} {value!r}")
    return value


def _check_choices(key: str, value: Any, f: dataclasses.Field) -> None:
    choices = f.metadata.get("choices")
    if choices and value is not None and value not in choices:
        raise ConfigError(f"config key '{key}' must be one of {', '.join(map(str, choices))}; got {value!r}")


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        f.type = hints[f.name]
        out[f.name] = f
    return out


def _unknown_key_error(key: str, known: list[str], where: str) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return ConfigError(f"unknown config key '{key}' in {where}{hint}")


# ---------------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------------

def setting(default: Any, help: str, **extra: Any) -> Any:
    """A config field with its help string (and optional ``flag`` / ``choices`` / ``positional``).

    Mutable defaults (lists, dicts) get a fresh copy per instance.
    """
    kwargs: dict[str, Any] = {"metadata": {"help": help, **extra}}
    if isinstance(default, (list, dict)):
        kwargs["default_factory"] = (lambda d=default: type(d)(d))
    else:
        kwargs["default"] = default
    return dataclasses.field(**kwargs)


def changed_from_default(config: Any, names: typing.Iterable[str]) -> list[str]:
    """Those of ``names`` whose value in ``config`` (a dataclass instance) differs from the field's default: the
    settings a user gave, for "X applies only with Y" checks (a value equal to the default cannot be told apart)."""
    fields = {f.name: f for f in dataclasses.fields(config)}

    def default(f: dataclasses.Field) -> Any:
        return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default

    return [name for name in names if getattr(config, name) != default(fields[name])]


def check_range(config: Any, names: str | tuple[str, ...], low: float | None = None, high: float | None = None, *,
                low_open: bool = False, high_open: bool = False, also: tuple[Any, ...] = (), meaning: str = "",
                integer: bool = False, required: bool = False) -> None:
    """Raise a one-line :class:`ConfigError` unless each ``config.<name>`` is a finite number in the range.

    ``config`` is an object (a stage config) or a mapping (an environment's keyword arguments). The range is
    ``[low, high]``; ``low_open`` / ``high_open`` exclude an end, ``None`` leaves a side open. ``integer`` asks
    for a whole number. ``also`` lists special values that are allowed outside it (``-1`` for "use epochs"), with
    ``meaning`` saying what they mean. Unset (``None``) values are not checked, since they mean "the default"
    wherever a field allows them, unless ``required``. Called from each stage config's ``__post_init__``, so a
    config built in Python is checked as well as YAML and flags::

        check_range(self, "learning_rate", 0, low_open=True)                 # > 0
        check_range(self, "warmup_ratio", 0, 1)                              # in [0, 1]
        check_range(self, ("batch_size", "gradient_accumulation_steps"), 1)  # >= 1
        check_range(self, "max_steps", 1, also=(-1,), meaning="-1: train for `epochs`")
    """
    for name in (names,) if isinstance(names, str) else names:
        value = config[name] if isinstance(config, Mapping) else getattr(config, name)
        if (value is None and not required) or (value in also and not isinstance(value, bool)):
            continue
        ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value)
        if ok and low is not None:
            ok = value > low if low_open else value >= low
        if ok and high is not None:
            ok = value < high if high_open else value <= high
        if not ok:
            if low is not None and high is not None:
                wanted = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            elif low is not None:
                wanted = f"{'>' if low_open else '>='} {low:g}"
            elif high is not None:
                wanted = f"{'<' if high_open else '<='} {high:g}"
            else:
                wanted = "a finite number"
            if integer:
                wanted = "an integer" + ("" if wanted == "a finite number" else f" {wanted}")
            special = f" (or {meaning})" if meaning else (f" (or {', '.join(map(str, also))})" if also else "")
            raise ConfigError(f"{name} must be {wanted}{special}, got {value!r}")


SEED_RANGE = (0, 2**32 - 1)  # numpy's (transformers' set_seed seeds numpy with the value as is)


def import_object(spec: str, what: str) -> Any:
    """The object a ``module:attribute`` setting names (dots allowed on both sides: ``pkg.mod:obj.attr``).

    A failure is a one-line :class:`ConfigError` that starts with ``what`` and the spec (``tool 'm:f': ...``).
    """
    import importlib

    module_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{what} '{spec}': cannot import module '{module_name}' ({exc})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what} '{spec}': module '{module_name}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    return obj


MAX_YAML_CONTAINERS = 10_000  # lists/mappings a config may hold once its aliases are expanded (configs: ~50)
MAX_CONFIG_BYTES = 1024 * 1024  # a config file or mapping flag (configs: a few KB; parsing 50 MB takes minutes)


def split_list_value(text: str) -> list[str]:
    """One value of a list flag as its items: split at commas outside (), [], {} and quotes (a quote opens a value at
    the start of an item or after ``=``); items stripped, empty items dropped.

    >>> split_list_value("accuracy:1.0, format:0.2")
    ['accuracy:1.0', 'format:0.2']
    >>> split_list_value('length(alpha=0.01, floor=0):0.5,judge(base_url=http://h/v1,model=m,rubric="a, b")')
    ['length(alpha=0.01, floor=0):0.5', 'judge(base_url=http://h/v1,model=m,rubric="a, b")']
    """
    items, current, depth, quote = [], [], 0, None
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"" and "".join(current).rstrip()[-1:] in ("", "="):  # an apostrophe in text stays text
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            items.append("".join(current))
            current = []
            continue
        current.append(char)
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def parse_yaml_text(text: str, where: str) -> Any:
    """YAML text as Python values, with the limits of config files (module docstring); a one-line
    :class:`ConfigError` starting with ``where`` otherwise."""
    from agentic_rl.utils import INT_DIGITS_LIMIT, MAX_NESTING, nesting_depth

    try:  # libyaml's loader when present: fast, and it stops deep nesting itself (the Python one recurses)
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError(f"{where}{line}: invalid YAML ({problem})") from None
    except RecursionError:
        raise ConfigError(f"{where}: invalid YAML (nested too deeply)") from None
    except ValueError as exc:  # yaml's int() of a number too long to convert, or a date such as 2024-13-01
        problem = (f"a number with more than {INT_DIGITS_LIMIT} digits" if "integer string conversion" in str(exc)
                   else " ".join(str(exc).split())[:200])
        raise ConfigError(f"{where}: invalid YAML ({problem})") from None
    depth = nesting_depth(data, MAX_NESTING, max_containers=MAX_YAML_CONTAINERS)
    if depth is None:
        raise ConfigError(f"{where}: invalid YAML (its aliases expand to more than {MAX_YAML_CONTAINERS} lists and "
                          "mappings)")
    if depth > MAX_NESTING:
        raise ConfigError(f"{where}: invalid YAML (nested deeper than {MAX_NESTING} levels)")
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {size / 2**20:.1f} MB is not a config file (the limit is "
                          f"{MAX_CONFIG_BYTES // 1024} KB; a config holds settings, not data)")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); save the config as UTF-8") from None
    data = parse_yaml_text(text, str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of config keys, got {type(data).__name__}")
    return data


def config_from_dict(cls: type[T], values: dict[str, Any], *, from_string: bool = False, where: str = "config") -> T:
    """Build ``cls`` from ``values``; unknown keys and wrong types raise :class:`ConfigError` naming the key."""
    fields = _fields(cls)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in fields:
            raise _unknown_key_error(key, list(fields), where)
        f = fields[name]
        if dataclasses.is_dataclass(f.type) and isinstance(value, dict):
            kwargs[name] = config_from_dict(f.type, value, from_string=from_string, where=f"{where}.{name}")
            continue
        coerced = _coerce(name, value, f.type, from_string)
        _check_choices(name, coerced, f)
        kwargs[name] = coerced
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid {where}: {exc}") from None


def check_keys(cls: type, values: dict[str, Any], *, where: str) -> None:
    """Raise :class:`ConfigError` for the first key of ``values`` that ``cls`` does not have (with a suggestion)."""
    fields = _fields(cls)
    for key in values:
        if key.replace("-", "_") not in fields:
            raise _unknown_key_error(key, list(fields), where)


def load_config(cls: type[T], yaml_path: str | Path | None = None, overrides: dict[str, Any] | None = None,
                *, section: str | None = None) -> T:
    """YAML file values (optionally one ``section`` of it), then ``overrides`` (CLI flags, already typed)."""
    values: dict[str, Any] = {}
    where = cls.__name__
    if yaml_path:
        data = read_yaml(yaml_path)
        if section is not None and section in data and isinstance(data[section], dict):
            data = data[section]
        values.update(data)
        where = f"{yaml_path}"
    values.update(overrides or {})
    return config_from_dict(cls, values, where=where)


def config_to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def save_config(config: Any, path: str | Path) -> Path:
    """Write the resolved config as YAML (the file loads back with ``load_config``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    return path


def format_config(config: Any, title: str | None = None) -> str:
    """A readable block of every resolved setting (what a stage prints with ``--verbose``)."""
    data = config_to_dict(config)
    width = max((len(k) for k in data), default=0)
    lines = [f"== {title or type(config).__name__} (resolved) =="]
    for key, value in data.items():
        lines.append(f"  {key:<{width}} : {json.dumps(value) if isinstance(value, (list, dict)) else value}")
    return "\n".join(lines)


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> list[str]:
    """One CLI flag per config field. Defaults are suppressed so that only flags the user gives override YAML.

    Returns the flags added (for "did you mean" on a mistyped one). A list setting's flag may be repeated; each
    value is a comma list as well (module docstring)."""
    fields = _fields(cls)
    flags: list[str] = []
    for name, f in fields.items():
        help_text = f.metadata.get("help", "")
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)  # type: ignore[misc]
        if f.metadata.get("positional"):
            inner, _ = _unwrap_optional(f.type)
            nargs = "*" if typing.get_origin(inner) is list else "?"
            choices = f.metadata.get("choices")
            shown = f"{help_text} (one of: {', '.join(choices)})" if choices else help_text
            parser.add_argument(name, nargs=nargs, default=argparse.SUPPRESS, help=shown, choices=choices,
                                metavar=name)
            continue
        flag = f.metadata.get("flag", name)
        opts = [f"--{flag.replace('_', '-')}"]
        if "_" in flag:
            opts.append(f"--{flag}")
        inner, _ = _unwrap_optional(f.type)
        shown = f"{help_text} (default: {default})" if help_text else f"(default: {default})"
        if inner is bool:
            parser.add_argument(*opts, dest=name, action="store_const", const="true", default=argparse.SUPPRESS,
                                help=shown)
            parser.add_argument(f"--no-{flag.replace('_', '-')}", dest=name, action="store_const", const="false",
                                default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        elif typing.get_origin(inner) is list:
            parser.add_argument(*opts, dest=name, action="append", default=argparse.SUPPRESS, metavar="VALUE",
                                help=f"{shown}; repeat the flag (or give a comma list) for several values")
        else:
            parser.add_argument(*opts, dest=name, default=argparse.SUPPRESS, metavar=_type_name(f.type).upper(),
                                help=shown, choices=f.metadata.get("choices"))
        flags.extend(opts)
    return flags


def unknown_flag_error(unknown: list[str], flags: list[str], command: str) -> ConfigError:
    """The one-line error for arguments a command does not take, with the closest flag when one is near."""
    first = unknown[0]
    name = first.split("=", 1)[0]
    if not name.startswith("-"):
        return ConfigError(f"'agentic-rl {command}' does not take the argument '{first}'")
    close = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else f"; see agentic-rl {command} --help"
    return ConfigError(f"unknown flag '{name}' for 'agentic-rl {command}'{hint}")


def config_from_args(cls: type[T], args: argparse.Namespace, yaml_path: str | Path | None = None,
                     *, section: str | None = None) -> T:
    """Merge a YAML file with the flags that were given on the command line (strings, converted here)."""
    fields = _fields(cls)
    overrides: dict[str, Any] = {}
    for name, f in fields.items():
        if hasattr(args, name):
            overrides[name] = _coerce(name, getattr(args, name), f.type, from_string=True)
            _check_choices(name, overrides[name], f)
    values: dict[str, Any] = {}
    where = cls.__name__
    if yaml_path:
        data = read_yaml(yaml_path)
        if section is not None and isinstance(data.get(section), dict):
            # A pipeline file: the stage's section over the top-level settings the pipeline would give the stage.
            from agentic_rl.stages import STAGES, inherited_settings

            shared = inherited_settings(data, section, cls) if section in STAGES else {}
            data = {**shared, **data[section]}
            where = f"{yaml_path} [{section}]"
        else:
            where = str(yaml_path)
        values.update(data)
    values.update(overrides)
    return config_from_dict(cls, values, where=where)

