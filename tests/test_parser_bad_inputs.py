"""Hostile inputs to the parsers — tool calls, data files, YAML configs, `reward check` files: integers longer than
Python converts from text, nesting deeper than its recursion limit, non-UTF-8 bytes, thousands of unclosed tags,
YAML aliases that expand exponentially. Each gives a clear error (an error observation for tool calls, a one-line
DataError/ConfigError naming the file for files), never a traceback."""

from __future__ import annotations

import json

import pytest

from agentic_rl.agent.calculator_env import CalculatorEnv
from agentic_rl.agent.tool_format import MAX_ECHO_CHARS, parse_tool_calls
from agentic_rl.agent.tools import Tool, ToolError
from agentic_rl.cli import main
from agentic_rl.config import read_yaml
from agentic_rl.data.custom import load_task_dataset
from agentic_rl.data.gsm8k import read_file
from agentic_rl.errors import ConfigError, DataError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
HUGE_INT = "9" * 5000  # beyond Python's 4300-digit limit for int("...")
DEEP = "[" * 5000 + "]" * 5000  # beyond Python's recursion limit


def _call(arguments_json: str, name: str = "calculator") -> str:
    return f'{OPEN}\n{{"name": "{name}", "arguments": {arguments_json}}}\n{CLOSE}'


# ---------------------------------------------------------------------------------------------------------------
# Tool calls
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, problem", [
    (_call('{"expression": ' + HUGE_INT + "}"), "more than 4300 digits"),
    (_call(json.dumps(json.dumps({"expression": 1}).replace("1", HUGE_INT))), "more than 4300 digits"),
    (_call(DEEP), "nested deeper than"),
    (_call('{"expression": ' + "[" * 100_000 + "}"), "nested deeper than"),
])
def test_tool_calls_with_huge_integers_or_deep_nesting_are_error_calls(text, problem):
    rest, calls = parse_tool_calls(text)
    assert rest == "" and len(calls) == 1
    assert calls[0].error is not None and problem in calls[0].error


def test_thousands_of_unclosed_tags_are_one_unclosed_call():
    text = "Let me compute. " + OPEN * 5000
    rest, calls = parse_tool_calls(text)
    assert rest == "Let me compute."
    assert len(calls) == 1 and "not closed" in calls[0].error
    # a block runs to the first closing tag after its opening tag, as before
    rest, calls = parse_tool_calls(f"a {OPEN} x {_call('{}')} b")
    assert rest == "a  b" and len(calls) == 1 and "not valid JSON" in calls[0].error


def test_error_observations_quote_at_most_200_characters_of_the_model_output():
    env = CalculatorEnv(max_tool_calls=10)
    env.reset({"question": "What is 2 + 3?", "ground_truth": "5"})
    long_name = "x" * 10_000
    text = "\n".join([
        _call('{"expression": "2+3"}', name=long_name),                 # unknown tool: echoes its name
        _call("{" + ", ".join(f'"{"k" * 50}{i}": 1' for i in range(200)) + "}"),  # echoes unknown argument names
        f"{OPEN}{{\"name\": \"calculator\", \"arguments\": \"{'y' * 10_000}\"}}{CLOSE}",
        _call('{"expression": "' + "1+" * 3000 + '1"}'),                  # the calculator's own error
    ])
    result = env.step(text)
    contents = [m["content"] for m in result.observation]
    assert len(contents) == 4 and all(c.startswith("error: ") for c in contents)
    assert all(len(c) <= MAX_ECHO_CHARS + len("error: ") for c in contents), [len(c) for c in contents]


def test_a_float_argument_beyond_float_range_is_a_tool_error():
    def scale(factor: float) -> str:
        """Scale.

        Args:
            factor: a number.
        """
        return str(factor)

    tool = Tool(scale)
    with pytest.raises(ToolError, match="too large"):
        tool({"factor": 10 ** 400})
    assert tool({"factor": 2}) == "2.0"


# ---------------------------------------------------------------------------------------------------------------
# Data files
# ---------------------------------------------------------------------------------------------------------------

GOOD_ROW = '{"question": "What is 2 + 3?", "answer": "2 + 3 = 5\\n#### 5"}'


@pytest.mark.parametrize("suffix, content, problem", [
    (".jsonl", GOOD_ROW + '\n{"question": "q", "answer": ' + DEEP + "}\n", "line 2: malformed JSON (arrays/objects "
                                                                            "nested deeper than 100 levels"),
    (".jsonl", GOOD_ROW + '\n{"question": "q", "answer": ' + HUGE_INT + "}\n", "line 2: malformed JSON (a number "
                                                                                "with more than 4300 digits"),
    (".jsonl", GOOD_ROW + "\n" + "[" * 100_000 + "\n", "line 2: malformed JSON (arrays/objects nested deeper"),
    (".json", "[" + GOOD_ROW + ", " + DEEP + "]", "malformed JSON (arrays/objects nested deeper than 100 levels"),
    (".json", '{"data": [' + GOOD_ROW + ", " + HUGE_INT + "]}", "malformed JSON (a number with more than 4300"),
])
def test_data_files_with_deep_nesting_or_huge_integers_are_one_line_errors(tmp_path, suffix, content, problem):
    path = tmp_path / f"data{suffix}"
    path.write_text(content)
    with pytest.raises(DataError, match="^" + str(path).replace(".", r"\.")) as info:
        read_file(path)
    assert problem in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(DataError):
        load_task_dataset(str(path))


def test_data_rows_nested_moderately_deep_load_or_fail_cleanly(tmp_path):
    """150 levels parse in Python but would overflow the stack later (str() of the value deep in the loader)."""
    path = tmp_path / "d.jsonl"
    path.write_text(GOOD_ROW + '\n{"question": "q", "ground_truth": ' + "[" * 150 + "]" * 150 + "}\n")
    with pytest.raises(DataError, match="line 2: malformed JSON .*nested deeper than 100"):
        read_file(path)


# ---------------------------------------------------------------------------------------------------------------
# YAML configs
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content, problem", [
    ("learning_rate: 1.0e-5\nname: caf\xe9\n".encode("latin-1"), "not UTF-8 text (byte 31)"),
    (bytes(range(256)) * 4, "not UTF-8 text"),
    (("a: " + DEEP).encode(), "invalid YAML"),
    (("a: " + "[" * 10_000).encode(), "invalid YAML"),
    ("".join(" " * i + "a:\n" for i in range(1400)).encode(), "invalid YAML"),  # 1 MB: under the size limit
    (("seed: " + HUGE_INT).encode(), "a number with more than 4300 digits"),
    (("a: " + "[" * 150 + "]" * 150).encode(), "nested deeper than 100 levels"),
    (("a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9))).encode(),
     "aliases expand to more than"),
    (b"a: &a [*a]\n", "nested deeper than"),
])
def test_bad_yaml_configs_are_one_line_config_errors(tmp_path, content, problem):
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        read_yaml(path)
    message = str(info.value)
    assert message.startswith(str(path)) and problem in message and "\n" not in message


def test_yaml_configs_still_read_as_before(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_bytes("\ufefflearning_rate: 1.0e-5\nrewards: [accuracy, format]\nbase: &b {a: 1}\nother: *b\n"
                     .encode("utf-8"))
    assert read_yaml(path) == {"learning_rate": 1.0e-5, "rewards": ["accuracy", "format"], "base": {"a": 1},
                               "other": {"a": 1}}
    path.write_text("a: 2024-13-01\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        read_yaml(path)


# ---------------------------------------------------------------------------------------------------------------
# `agentic-rl reward check` and agent task files
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content, problem", [
    (bytes(range(255, -1, -1)) * 8, "line 1: not UTF-8 text"),
    (b'{"completion": "Final Answer: 5", "ground_truth": "5"}\n\x89PNG\r\n\x1a\n\x00\x00\xff', "line 2: not UTF-8"),
    (('{"completion": "Final Answer: 5", "ground_truth": ' + HUGE_INT + "}\n").encode(), "a number with more than"),
    (('{"completion": ' + DEEP + ', "ground_truth": 1}\n').encode(), "nested deeper than"),
    (b"\x00\x00\x00\x00", "line 1: malformed JSON"),
])
def test_reward_check_on_binary_or_hostile_files_is_one_line_error(tmp_path, capsys, content, problem):
    path = tmp_path / "samples.jsonl"
    path.write_bytes(content)
    assert main(["reward", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and problem in err and str(path) in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("content, problem", [
    ("question: caf\xe9".encode("latin-1"), "not UTF-8 text"),
    (('{"question": "q", "ground_truth": ' + HUGE_INT + "}\n").encode(), "line 1: malformed JSON (a number"),
    (('{"question": ' + DEEP + "}\n").encode(), "line 1: malformed JSON (arrays/objects nested"),
    (b'["not", "an", "object"]\n', "line 1: expected a JSON object"),
])
def test_environment_task_files_that_are_not_jsonl_are_one_line_errors(tiny_model_dir, tmp_path, content, problem,
                                                                        capsys):
    """`sft --environment calculator --dataset FILE` on a hostile task file: one line naming the file and the
    problem, and no run directory."""
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(content)
    out = tmp_path / "sft"
    assert main(["sft", "--model", str(tiny_model_dir), "--output-dir", str(out), "--environment", "calculator",
                 "--dataset", str(path)]) == 2
    err = capsys.readouterr().err  # the model loads first (its progress bars come before the error)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and err.rstrip("\n").endswith(errors[0]) and "Traceback" not in err
    assert problem in errors[0] and str(path) in errors[0]
    assert not out.exists()
