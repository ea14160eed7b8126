"""Every numeric setting of every command is checked: non-finite numbers anywhere, ranges in every stage.

The non-finite test walks the CLI's command table, so a float setting added later is covered without editing it.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing

import pytest

from agentic_rl.cli import COMMANDS, main
from agentic_rl.config import _fields, _unwrap_optional, config_from_dict, load_config
from agentic_rl.errors import ConfigError

# Values a command needs before its __post_init__ gets to the numbers (a model to serve, a file to score, ...).
BASE = {"serve": {"model": "some/model"}, "reward": {"file": "rows.jsonl"}, "export": {"source": "m", "out": "o"}}


def _config_class(command: str) -> type:
    return COMMANDS[command].config_class


def _float_fields() -> list[tuple[str, str, bool]]:
    """(command, field, is_list) for every float (or list-of-float) setting of every command."""
    out = []
    for command in COMMANDS:
        for name, f in _fields(_config_class(command)).items():
            inner, _ = _unwrap_optional(f.type)
            if inner is float:
                out.append((command, name, False))
            elif typing.get_origin(inner) is list and typing.get_args(inner) == (float,):
                out.append((command, name, True))
    return out


FLOAT_FIELDS = _float_fields()


def test_the_walk_finds_the_float_settings():
    found = {(c, n) for c, n, _ in FLOAT_FIELDS}
    assert {("sft", "learning_rate"), ("grpo", "beta"), ("eval", "temperature"), ("serve", "batch_wait_ms"),
            ("grpo", "answer_reward"), ("sft", "direct_fraction"), ("pretrain", "warmup_ratio")} <= found
    assert len(FLOAT_FIELDS) >= 40


@pytest.mark.parametrize("command,name,is_list", FLOAT_FIELDS, ids=[f"{c}.{n}" for c, n, _ in FLOAT_FIELDS])
def test_every_float_setting_rejects_non_finite_numbers(command, name, is_list, tmp_path):
    cls = _config_class(command)
    wrap = (lambda v: [v]) if is_list else (lambda v: v)
    key = f"{name}[0]" if is_list else name
    # Python / JSON values, CLI strings, and YAML's own spellings (.nan, .inf, -.inf, a number too big for a float).
    for value, from_string in [(float("nan"), False), (math.inf, False), (-math.inf, False), (10**400, False),
                               ("nan", True), ("inf", True), ("-inf", True), ("1e999", True), ("NaN", False)]:
        with pytest.raises(ConfigError, match=rf"'{re.escape(key)}' must be a finite number") as err:
            config_from_dict(cls, {**BASE.get(command, {}), name: wrap(value)}, from_string=from_string)
        assert "\n" not in str(err.value)
    for spelling in (".nan", ".inf", "-.inf"):
        path = tmp_path / "c.yaml"
        path.write_text(f"{name}: {'[' + spelling + ']' if is_list else spelling}\n")
        with pytest.raises(ConfigError, match=rf"'{re.escape(key)}' must be a finite number"):
            load_config(cls, path, BASE.get(command, {}))


def test_cli_flag_nan_is_one_line(capsys):
    assert main(["sft", "--learning-rate", "nan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: config key 'learning_rate' must be a finite number, got 'nan'"]


# (command, field, bad value): each is outside the range the field's help text allows.
RANGE_CASES = [
    ("pretrain", "learning_rate", 0.0), ("pretrain", "learning_rate", -1e-3), ("pretrain", "warmup_ratio", 1.5),
    ("pretrain", "warmup_ratio", -0.1), ("pretrain", "epochs", 0.0), ("pretrain", "batch_size", 0),
    ("pretrain", "logging_steps", 0), ("pretrain", "save_steps", -1), ("pretrain", "max_steps", 0),
    ("pretrain", "max_steps", -2), ("pretrain", "weight_decay", -0.1), ("pretrain", "eval_fraction", 0.5),
    ("pretrain", "hidden_size", 0), ("pretrain", "num_layers", 0), ("pretrain", "vocab_size", 100),
    ("pretrain", "seed", -1), ("pretrain", "exclude_test", -5),
    ("sft", "learning_rate", 0.0), ("sft", "learning_rate", -2e-4), ("sft", "warmup_ratio", 1.5),
    ("sft", "lora_dropout", 1.0), ("sft", "lora_alpha", 0), ("sft", "lora_r", 0),
    ("sft", "gradient_accumulation_steps", 0),
    ("sft", "logging_steps", 0), ("sft", "save_total_limit", 0), ("sft", "max_grad_norm", -1.0),
    ("sft", "weight_decay", -1.0), ("sft", "max_train_samples", 0), ("sft", "seed", -1), ("sft", "eval_samples", -1),
    ("sft", "max_steps", 0), ("sft", "max_length", 8), ("sft", "answer_only_fraction", 1.5),
    ("grpo", "learning_rate", -1.0), ("grpo", "warmup_ratio", 2.0), ("grpo", "lora_dropout", 1.0),
    ("grpo", "epsilon", 0.0), ("grpo", "epsilon", 1.5), ("grpo", "epsilon_high", 0.0), ("grpo", "top_k", -1),
    ("grpo", "top_p", 0.0), ("grpo", "vllm_gpu_memory_utilization", 0.0), ("grpo", "vllm_gpu_memory_utilization", 1.5),
    ("grpo", "collapse_fraction", 2.0), ("grpo", "kl_high", 0.0), ("grpo", "kl_low", -1.0), ("grpo", "beta", -0.1),
    ("grpo", "max_grad_norm", -1.0), ("grpo", "weight_decay", -1.0), ("grpo", "completions_every", -1),
    ("grpo", "completions_per_log", 0), ("grpo", "max_train_samples", 0), ("grpo", "steps_per_generation", 0),
    ("grpo", "generation_batch_size", 0), ("grpo", "save_total_limit", 0), ("grpo", "seed", -1),
    ("grpo", "temperature", 0.0), ("grpo", "max_steps", 0), ("grpo", "kl_warmup_steps", -1),
    ("grpo", "select_samples", -1), ("grpo", "sft_loss_weight", -0.5), ("grpo", "select_candidates", 0),
    ("eval", "temperature", -1.0), ("eval", "top_p", 0.0), ("eval", "top_p", 1.5), ("eval", "num_examples", -1),
    ("eval", "max_new_tokens", 0), ("eval", "batch_size", 0), ("eval", "seed", -1), ("eval", "num_samples", 0),
    ("eval", "eval_samples", 0),
    # The environment settings (agent/settings.py), shared by sft, grpo and eval, and SFT's demonstration mix.
    ("sft", "max_turns", 0), ("sft", "max_tool_calls", -1), ("sft", "max_turn_tokens", 0),
    ("sft", "answer_reward", 0.0), ("sft", "tool_error_reward", 0.5), ("sft", "direct_fraction", 1.5),
    ("sft", "direct_fraction", -0.1), ("sft", "skip_tool_fraction", 1.5), ("sft", "skip_tool_fraction", -0.1),
    ("sft", "epochs", 0.0), ("sft", "batch_size", 0),
    ("grpo", "max_turns", 0), ("grpo", "max_tool_calls", -1), ("grpo", "max_turn_tokens", 0),
    ("grpo", "answer_reward", 0.0), ("grpo", "answer_reward", -1.0), ("grpo", "tool_error_reward", 0.5),
    ("grpo", "lora_r", 0), ("grpo", "logging_steps", 0),
    ("eval", "max_turns", 0), ("eval", "max_tool_calls", -1), ("eval", "max_turn_tokens", 0),
    ("eval", "answer_reward", 0.0), ("eval", "tool_error_reward", 0.5),
    ("tune", "trials", 0), ("tune", "eval_samples", 0), ("tune", "max_new_tokens", 0),
    ("tune", "prune_startup_trials", -1), ("tune", "seed", -1),
    ("serve", "max_batch_size", 0), ("serve", "batch_wait_ms", -1.0), ("serve", "temperature", -0.5),
    ("serve", "top_p", 0.0), ("serve", "max_tokens_limit", 0),
    ("data", "n", 0), ("data", "synthetic_train_size", 0), ("data", "min_steps", 0), ("data", "max_steps", 0),
    ("data", "seed", -1), ("data", "max_samples", 0),
    ("reward", "limit", 0),
    ("preferences", "seed", -1), ("preferences", "num_samples", 1), ("preferences", "temperature", 0.0),
    ("preferences", "top_p", 1.5), ("preferences", "max_new_tokens", 0), ("preferences", "max_samples", 0),
    ("preferences", "batch_size", 0), ("preferences", "min_margin", -0.1), ("preferences", "synthetic_train_size", 0),
    ("compare", "seed", -5), ("compare", "bootstrap_samples", 99),
]


@pytest.mark.parametrize("command,name,value", RANGE_CASES, ids=[f"{c}.{n}={v}" for c, n, v in RANGE_CASES])
def test_out_of_range_setting_is_a_one_line_error_naming_it(command, name, value):
    cls = _config_class(command)
    with pytest.raises(ConfigError) as err:
        config_from_dict(cls, {**BASE.get(command, {}), name: value})
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{name} must be "), message


@pytest.mark.parametrize("value", [0, 1])
def test_a_group_of_fewer_than_two_generations_is_refused(value):
    """GRPO's message names the value and why (advantages compare completions of one prompt), so it does not start
    like the range messages above."""
    with pytest.raises(ConfigError, match=rf"^num_generations \({value}\) must be >= 2: advantages compare "):
        config_from_dict(_config_class("grpo"), {"num_generations": value, "environment": "calculator"})


def test_defaults_are_in_range():
    """Every command's defaults pass its own range checks, and the resolved defaults load back to the same config
    (what a run directory's config.yaml holds is a valid config)."""
    checked = []
    for command in COMMANDS:
        if command in ("quickstart", "pipeline"):
            continue
        cls = _config_class(command)
        config = config_from_dict(cls, dict(BASE.get(command, {})))
        assert config_from_dict(cls, dataclasses.asdict(config)) == config, command
        checked.append(command)
    assert len(checked) == len(COMMANDS) - 2


@pytest.mark.parametrize("command", ["pretrain", "sft", "grpo"])
def test_a_config_built_in_python_is_range_checked_too(command):
    """Hyper-parameter search and scripts build configs directly: NaN cannot slip past the checks there."""
    cls = _config_class(command)
    with pytest.raises(ConfigError, match=r"^learning_rate must be > 0, got nan$"):
        cls(**BASE.get(command, {}), learning_rate=float("nan"))
    with pytest.raises(ConfigError, match=r"^learning_rate must be > 0, got inf$"):
        cls(**BASE.get(command, {}), learning_rate=math.inf)


def test_special_values_stay_allowed():
    sft = _config_class("sft")
    assert sft(max_steps=-1).max_steps == -1  # -1: train for epochs
    assert sft(max_grad_norm=0.0).max_grad_norm == 0.0  # 0: no clipping
    assert _config_class("grpo")(heldout_every=0).heldout_every == 0  # 0: no held-out evaluation
    assert _config_class("eval")(temperature=0.0).temperature == 0.0  # greedy
    with pytest.raises(ConfigError, match=r"^max_steps must be >= 1 \(or -1 to train for `epochs`\), got -2$"):
        sft(max_steps=-2)


def test_fields_of_nested_dataclasses_are_not_missed():
    """The walk above looks at each command's own fields; none of them nests another config dataclass with floats."""
    for command in COMMANDS:
        for f in _fields(_config_class(command)).values():
            inner, _ = _unwrap_optional(f.type)
            if dataclasses.is_dataclass(inner):
                assert not any(_unwrap_optional(g.type)[0] is float for g in _fields(inner).values())


def test_a_mapping_is_checked_with_whole_numbers_and_unset_values_refused_where_asked():
    from agentic_rl.config import check_range

    given = {"turns": 3, "share": None, "steps": 2.5, "flag": True}
    check_range(given, "turns", 1, integer=True, required=True)
    check_range(given, "share", 0, 1)  # unset: the default, not checked
    cases = [(("share", 0, 1), {"required": True}, r"^share must be in \[0, 1\], got None$"),
             (("steps", 1), {"integer": True}, r"^steps must be an integer >= 1, got 2.5$"),
             (("flag",), {"integer": True}, r"^flag must be an integer, got True$"),
             (("turns", 5), {"integer": True}, r"^turns must be an integer >= 5, got 3$")]
    for args, keywords, message in cases:
        with pytest.raises(ConfigError, match=message):
            check_range(given, *args, **keywords)


@pytest.mark.parametrize("environment, arguments, message", [
    ("calculator", {"max_tool_calls": -1}, r"^max_tool_calls must be an integer >= 0, got -1$"),
    ("calculator", {"answer_reward": float("nan")}, r"^answer_reward must be a finite number, got nan$"),
    ("memory", {"max_turns": 2.5}, r"^max_turns must be an integer >= 1, got 2.5$"),
    ("memory", {"store_reward": None}, r"^store_reward must be a finite number, got None$"),
    ("memory", {"wasted_call_reward": 0.5}, r"^wasted_call_reward must be <= 0, got 0.5$"),
    ("memory", {"skip_store_fraction": float("nan")}, r"^skip_store_fraction must be in \[0, 1\], got nan$"),
    ("search", {"top_k": True}, r"^top_k must be an integer >= 1, got True$"),
    ("search", {"world_seed": "0"}, r"^world_seed must be an integer, got '0'$"),
    ("search", {"wrong_search_fraction": 1.5}, r"^wrong_search_fraction must be in \[0, 1\], got 1.5$"),
    ("self_correct", {"max_turns": 0}, r"^max_turns must be an integer >= 1, got 0$"),
    ("self_correct", {"wrong_attempt_reward": float("inf")},
     r"^wrong_attempt_reward must be a finite number, got inf$"),
])
def test_an_environment_argument_out_of_range_is_a_one_line_error_naming_it(environment, arguments, message):
    from agentic_rl.agent.env import make_environment

    with pytest.raises(ConfigError, match=message):
        make_environment(environment, **arguments)
