"""Hypothesis fuzzing of the tool-call parser and the data readers (JSONL, JSON, CSV, parquet, YAML configs and
`reward check` files) on text and bytes built from hostile pieces: tags, brackets nested hundreds deep, integers
beyond Python's 4300-digit limit, invalid UTF-8, NULs, lone surrogates. Each reader raises nothing but the
project's own errors, and each one reads a 10 kB input in under 50 ms of CPU time (the best of three tries, so
that a busy machine is not mistaken for a quadratic parser: the old regex tool-call parser took 600 ms on 10 kB of
unclosed tags). The default tier tries 1,000 cases per target; the ``slow`` tier the issue's 10,000, derandomized (so CI
sees the same cases on every run) and printing the slowest call it met.
"""

from __future__ import annotations

import atexit
import gc
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentic_rl.agent.calculator_env import CalculatorEnv
from agentic_rl.agent.tool_format import MAX_ECHO_CHARS, ToolCall, parse_tool_calls
from agentic_rl.config import read_yaml
from agentic_rl.data.custom import task_row
from agentic_rl.data.gsm8k import read_file
from agentic_rl.errors import ConfigError, DataError
from agentic_rl.rewards.cli import RewardCheckConfig, read_rows

INPUT_CHARS = 10_000
MAX_SECONDS = 0.050  # per 10 kB input: the linearity bound

OPEN, CLOSE = "<tool_call>", "</tool_call>"
TOOL_PIECES = [
    OPEN, CLOSE, OPEN + "\n", "\n" + CLOSE, "<tool_call", "</tool_", "<tool_response>", "<|im_end|>",
    '{"name": "calculator", "arguments": {"expression": "23*47"}}', '{"name": "calculator", "arguments": ',
    '{"name": ', '"arguments": ', '"parameters": ', '"calculator"', '"expression"', '"2*3"', '"' + "1+" * 300 + '1"',
    "{", "}", "[", "]", '"', "\\", ":", ",", " ", "\n", "\t", "null", "true", "-", "0", "1.5", "1e999", "-1e999",
    "NaN", "Infinity", "9" * 4301, "1" * 5000, "[" * 300, "]" * 300, '{"a": ' * 120, "}" * 120, '"\\u0000"',
    '"\\ud800"', "\\u", "é", "🙂", "\x00", "\ufeff", "Final Answer: 5", "12 or 13",
]
piece_texts = st.lists(st.one_of(st.sampled_from(TOOL_PIECES), st.text(max_size=12)), max_size=24).map("".join)
# Well-formed calls whose arguments nest up to 3,000 deep around an integer of up to 6,000 digits
hostile_calls = st.builds(
    lambda before, depth, digits, closed, after: (
        f'{before}{OPEN}{{"name": "calculator", "arguments": {"[" * depth}{"9" * digits}'
        f'{"]" * depth if closed else ""}}}{CLOSE}{after}'),
    piece_texts, st.integers(0, 3000), st.integers(1, 6000), st.booleans(), piece_texts)
tool_texts = st.one_of(piece_texts, hostile_calls)

ROW = b'{"question": "What is 2 + 3?", "answer": "2 + 3 = 5\\n#### 5"}'
DATA_PIECES = [
    ROW, ROW + b"\n", b'{"question": "q", "ground_truth": ', b'{"question": "q", "answer": ', b'{"data": [', b"}",
    b"{", b"[", b"]", b'"', b",", b":", b"\n", b"\r\n", b" ", b"\t", b"9" * 4301, b"1" * 5000, b"[" * 300,
    b"]" * 300, b'{"a": ' * 120, b"1e999", b"NaN", b"-Infinity", b"-", b"null", b"#### 5", b"Final Answer: 5",
    b"question,answer\n", b'"What is 2 + 3?","#### 5"\n', b'"unclosed', b"\xff", b"\xc3", b"\xed\xa0\x80",
    b"\xef\xbb\xbf", b"\x00", b"a: 1\n", b"- ", b"&a [*a]", b"*a", b"!!python/object:os.system", b"!!binary",
    b"!!int 0x", b"%YAML 1.1\n", b"---\n", b"? ", b"<<: ", b"2024-13-01", b"PAR1",
]
piece_bytes = st.lists(st.one_of(st.sampled_from(DATA_PIECES), st.binary(max_size=12)), max_size=24).map(b"".join)
# A good row, then one whose answer nests up to 3,000 deep around an integer of up to 6,000 digits
hostile_rows = st.builds(
    lambda before, depth, digits, after: (
        before + ROW + b'\n{"question": "q", "answer": ' + b"[" * depth + b"9" * digits + b"]" * depth + b"}\n"
        + after),
    piece_bytes, st.integers(0, 3000), st.integers(1, 6000), piece_bytes)
data_bytes = st.one_of(piece_bytes, hostile_rows)

FUZZ = dict(deadline=None, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _ten_kb(data):
    unit = data or data.__class__(b"x" if isinstance(data, bytes) else "x")
    return (unit * (INPUT_CHARS // len(unit) + 1))[:INPUT_CHARS]


def _timed(fn, *args) -> float:
    """CPU seconds of this thread for one call, the best of up to three tries (more tries only when the first looks
    slow): CPU time, not wall time, and no garbage collection, so that neither other processes on a busy machine nor
    the collector count."""
    best = float("inf")
    for _ in range(3):
        gc.disable()  # a collection of the test harness's heap is not the parser's work
        try:
            start = time.thread_time()
            fn(*args)
            best = min(best, time.thread_time() - start)
        finally:
            gc.enable()
        if best < MAX_SECONDS / 5:
            break
    return best


# ---------------------------------------------------------------------------------------------------------------
# Tool calls
# ---------------------------------------------------------------------------------------------------------------

def _check_tool_calls(text: str) -> float:
    rest, calls = parse_tool_calls(text)
    assert isinstance(rest, str) and OPEN not in rest  # every opening tag starts a call (closed or not)
    for call in calls:
        assert isinstance(call, ToolCall)
        if call.error is None:
            assert isinstance(call.name, str) and call.name
        else:
            assert isinstance(call.error, str) and "\n" not in call.error
    env = CalculatorEnv(max_tool_calls=4)
    env.reset({"question": "What is 23 * 47?", "ground_truth": "1081"})
    result = env.step(text)
    for message in result.observation:
        if message["content"].startswith("error: "):
            assert len(message["content"]) <= len("error: ") + MAX_ECHO_CHARS
    elapsed = _timed(parse_tool_calls, _ten_kb(text))
    assert elapsed < MAX_SECONDS, f"{elapsed * 1000:.0f} ms on 10 kB of {text[:80]!r}"
    return elapsed


def _fuzz_tool_calls(examples: int) -> list[float]:
    times: list[float] = []

    @settings(max_examples=examples, **FUZZ)
    @given(text=tool_texts)
    def run(text):
        times.append(_check_tool_calls(text))

    run()
    return times


def test_tool_call_parser_fuzz():
    times = _fuzz_tool_calls(1_000)
    assert len(times) >= 1_000


@pytest.mark.slow
def test_tool_call_parser_fuzz_ten_thousand_cases():
    times = _fuzz_tool_calls(10_000)
    print(f"\ntool-call parser: {len(times)} cases, slowest 10 kB call {max(times) * 1000:.1f} ms")
    assert len(times) >= 10_000


@pytest.mark.parametrize("text", [
    OPEN * 1000, (OPEN + "x") * 1000, CLOSE * 1000, (OPEN + "[" * 50) * 200, OPEN + "[" * 10_000,
    (OPEN + '{"name": "calculator", "arguments": {"expression": "2*3"}}' + CLOSE) * 150,
    OPEN + '{"name": "c", "arguments": ' + "9" * 9000 + "}" + CLOSE, (OPEN + '{"a": ' * 40) * 50, "<" * 10_000,
    ("<tool_call" + "\\" * 20) * 300,
])
def test_tool_call_parser_known_worst_cases(text):
    _check_tool_calls(text)


# ---------------------------------------------------------------------------------------------------------------
# Data readers
# ---------------------------------------------------------------------------------------------------------------

_DIR = Path(tempfile.mkdtemp(prefix="fuzz_parsers_"))  # hypothesis reruns cases: one folder for all, removed at exit
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)
READERS = {
    ".jsonl": lambda path: [task_row(row, "row") for row in read_file(path).rows],
    ".json": lambda path: [task_row(row, "row") for row in read_file(path).rows],
    ".csv": lambda path: [task_row(row, "row") for row in read_file(path).rows],
    ".parquet": read_file,
    ".yaml": read_yaml,
    ".check.jsonl": lambda path: read_rows(RewardCheckConfig(file=str(path))),
}


def _read(path: Path) -> None:
    try:
        READERS["".join(path.suffixes)](path)
    except (DataError, ConfigError) as exc:
        assert "\n" not in str(exc), str(exc)


def _check_data(data: bytes) -> float:
    slowest = 0.0
    for suffix in READERS:
        path = _DIR / f"rows{suffix}"
        path.write_bytes(data)
        _read(path)
        path.write_bytes(_ten_kb(data))
        elapsed = _timed(_read, path)
        assert elapsed < MAX_SECONDS, f"{suffix}: {elapsed * 1000:.0f} ms on 10 kB of {data[:80]!r}"
        slowest = max(slowest, elapsed)
    return slowest


def _fuzz_data(examples: int) -> list[float]:
    times: list[float] = []

    @settings(max_examples=examples, **FUZZ)
    @given(data=data_bytes)
    def run(data):
        times.append(_check_data(data))

    run()
    return times


def test_data_readers_fuzz():
    times = _fuzz_data(1_000)
    assert len(times) >= 1_000


@pytest.mark.slow
def test_data_readers_fuzz_ten_thousand_cases():
    times = _fuzz_data(10_000)
    print(f"\ndata readers: {len(times)} cases, slowest 10 kB read {max(times) * 1000:.1f} ms")
    assert len(times) >= 10_000


@pytest.mark.parametrize("data", [
    b"[" * 10_000, b"{" * 10_000, b'{"a": ' * 2000, b"9" * 10_000, ROW[:-1] + b', "x": ' + b"9" * 9000 + b"}",
    b"\xff" * 10_000, b"\x00" * 10_000, b"a: &a [*a]\n", b"- " * 5000, b'"' * 10_000, b"\n" * 10_000,
    (ROW + b"\n") * 150, b"question,answer\n" + b'"What is 2 + 3?","#### 5"\n' * 400, b'"unclosed\n' * 1000,
    b"}\n" * 5000,
])
def test_data_readers_known_worst_cases(data):
    _check_data(data)
