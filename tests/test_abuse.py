"""Faults and abuse: hostile or broken inputs at the edges of the product get a bounded cost and a one-line error.

Environments: a tool that blocks, one that returns megabytes, one that returns a dict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentic_rl.agent.env import ToolEnvironment, environment_factory
from agentic_rl.agent.settings import EnvironmentSettings
from agentic_rl.agent.tool_format import render_tool_call
from agentic_rl.agent.tools import MAX_ABANDONED_CALLS, Tool, ToolError
from agentic_rl.errors import ConfigError

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------------------------------------------------------
# Environments: tool calls are bounded in time and size; structured results are JSON


def lookup(key: str) -> dict:
    """Look a key up.

    Args:
        key: the key.
    """
    return {"key": key, "values": [1, 2.5, None, True], "note": "ü"}


def huge(n: int) -> str:
    """Return n characters.

    Args:
        n: how many.
    """
    return "x" * n


def _tool_observation(env: ToolEnvironment, name: str, arguments: dict) -> tuple[str, float]:
    env.reset({"question": "q", "ground_truth": "1"})
    result = env.step(render_tool_call(name, arguments))
    assert not result.done
    return result.observation[0]["content"], result.reward


def test_a_dict_result_reaches_the_model_as_json():
    observation, reward = _tool_observation(ToolEnvironment([lookup]), "lookup", {"key": "a"})
    assert json.loads(observation) == {"key": "a", "values": [1, 2.5, None, True], "note": "ü"}
    assert observation == '{"key": "a", "values": [1, 2.5, null, true], "note": "ü"}' and reward == 0.1


def test_a_huge_result_is_clipped_and_says_so():
    env = ToolEnvironment([huge], max_tool_result_chars=1000)
    started = time.monotonic()
    observation, reward = _tool_observation(env, "huge", {"n": 10_000_000})
    assert time.monotonic() - started < 5
    assert observation.startswith("x" * 1000 + "\n[result clipped: 10000000 characters, the first 1000 shown]")
    assert len(observation) < 1100 and reward == 0.1            # a clipped result is still a result
    assert _tool_observation(env, "huge", {"n": 1000})[0] == "x" * 1000
    # the default clips too
    default, _ = _tool_observation(ToolEnvironment([huge]), "huge", {"n": 1_000_000})
    assert len(default) < 5000


def test_a_blocking_tool_times_out_into_an_error_observation():
    def wait(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long.
        """
        time.sleep(seconds)
        return "slept"

    env = ToolEnvironment([wait], tool_timeout_s=0.3)
    started = time.monotonic()
    observation, reward = _tool_observation(env, "wait", {"seconds": 3.0})
    assert time.monotonic() - started < 2
    assert observation == "error: wait did not return within 0.3 s (the tool_timeout_s setting)"
    assert reward == 0.0 and env.tool_errors == 1
    assert _tool_observation(env, "wait", {"seconds": 0.0})[0] == "slept"   # a quick call still runs


def test_a_tool_stuck_for_good_does_not_keep_the_process_alive_or_pile_up_threads():
    """A tool that never returns: each call is an error after the limit, after MAX_ABANDONED_CALLS stuck calls the
    tool is refused at once, and the process exits normally although those calls are still blocked."""
    result = _python(f"""
        import threading, time
        from agentic_rl.agent.env import ToolEnvironment
        from agentic_rl.agent.tool_format import render_tool_call

        def block(x: int) -> str:
            '''Never returns.

            Args:
                x: anything.
            '''
            threading.Event().wait()

        env = ToolEnvironment([block], tool_timeout_s=0.1, max_tool_calls=100, max_turns=100)
        env.reset({{"question": "q", "ground_truth": "1"}})
        started = time.monotonic()
        for i in range({MAX_ABANDONED_CALLS} + 3):
            print(env.step(render_tool_call("block", {{"x": i}})).observation[0]["content"])
        print("threads", threading.active_count(), "seconds", round(time.monotonic() - started, 1))
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:MAX_ABANDONED_CALLS] == ["error: block did not return within 0.1 s (the tool_timeout_s setting)"] \
        * MAX_ABANDONED_CALLS
    assert all(line.startswith(f"error: block is unavailable: {MAX_ABANDONED_CALLS} earlier calls")
               for line in lines[MAX_ABANDONED_CALLS:-1]), lines
    threads, seconds = lines[-1].split()[1], float(lines[-1].split()[3])
    assert int(threads) == 1 + MAX_ABANDONED_CALLS and seconds < 0.1 * MAX_ABANDONED_CALLS + 3


def test_tool_exceptions_and_tool_errors_still_become_observations_with_a_timeout():
    def broken(x: int) -> str:
        """Fails.

        Args:
            x: anything.
        """
        if x:
            raise ToolError("x must be 0")
        return {}["missing"]

    tool = Tool(broken)
    with pytest.raises(ToolError, match="^x must be 0$"):
        tool({"x": 1}, timeout_s=5)
    with pytest.raises(ToolError, match="broken failed: KeyError: 'missing'"):
        tool({"x": 0}, timeout_s=5)


def test_tool_limits_are_environment_settings_with_one_name_each():
    settings = EnvironmentSettings(environment="calculator", tool_timeout_s=2.5, max_tool_result_chars=50)
    assert settings.environment_settings()["tool_timeout_s"] == 2.5
    env = environment_factory("calculator", settings.environment_settings())()
    assert (env.tool_timeout_s, env.max_tool_result_chars) == (2.5, 50)
    for field, value, message in (("tool_timeout_s", 0, "tool_timeout_s"), ("max_tool_result_chars", 0,
                                                                            "max_tool_result_chars")):
        with pytest.raises(ConfigError, match=message):
            EnvironmentSettings(environment="calculator", **{field: value}).check_environment_settings()
    with pytest.raises(ConfigError, match="tool_timeout_s must be a number of seconds > 0"):
        ToolEnvironment([lookup], tool_timeout_s=float("inf"))
    with pytest.raises(ConfigError, match="tool_timeout_s applies to multi-turn episodes only"):
        EnvironmentSettings(tool_timeout_s=5).check_environment_settings()
