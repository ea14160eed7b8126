"""User rewards fail clearly: every bad return kind is a one-line RewardError naming the reward and the problem.

Policy (TRL's contract for multi-task rewards): ``None`` for a completion means "not applicable" and is kept;
everything else that is not one finite number per completion is an error.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import sys
import textwrap

import pytest

from agentic_rl.cli import main
from agentic_rl.errors import AgenticRLError, RewardError
from agentic_rl.rewards import build_rewards

BAD_RETURNS = {
    # name: (body returning the bad value, what the one-line error must say)
    "scalar": ("return 0.5", r"returned a float \(0\.5\), not a list with one reward per completion \(2\)"),
    "none": ("return None", r"returned None, not a list with one reward per completion \(2\)"),
    "string": ("return 'good'", r"returned a str \('good'\), not a list"),
    "mapping": ("return {'a': 1.0}", r"returned a dict .*not a list"),
    "short": ("return [1.0]", r"returned 1 rewards for 2 completions"),
    "long": ("return [1.0, 1.0, 1.0]", r"returned 3 rewards for 2 completions"),
    "empty": ("return []", r"returned 0 rewards for 2 completions"),
    "strings": ("return ['1.0', '0.0']", r"returned '1\.0' \(str\) for completion 0; each reward must be a number"),
    "nested": ("return [[1.0], [0.0]]", r"returned \[1\.0\] \(list\) for completion 0"),
    "nan": ("return [1.0, float('nan')]", r"returned nan for completion 1; rewards must be finite"),
    "inf": ("return [float('inf'), 0.0]", r"returned inf for completion 0; rewards must be finite"),
    "neg_inf": ("return [0.0, -float('inf')]", r"returned -inf for completion 1; rewards must be finite"),
    "bools": ("return [True, False]", r"returned True \(bool\) for completion 0"),
    "raises": ("return [1 / 0 for _ in completions]",
               r"raised ZeroDivisionError: division by zero at .*bad_rewards\.py:\d+$"),
}


@pytest.fixture()
def bad_rewards(tmp_path, monkeypatch):
    lines = ["import numpy as np", ""]
    for name, (body, _) in BAD_RETURNS.items():
        lines += [f"def {name}(completions, **kwargs):", f"    {body}", ""]
    lines += textwrap.dedent("""
        def not_applicable(completions, **kwargs):
            return [None if 'skip' in c else 1.0 for c in completions]

        def as_array(completions, **kwargs):
            return np.array([0.25] * len(completions))

        def with_ints(completions, **kwargs):
            return [1, 0]

        async def async_nan(completions, **kwargs):
            return [float('nan')] * len(completions)

        async def async_ok(completions, **kwargs):
            return [1.0] * len(completions)
        """).splitlines()
    (tmp_path / "bad_rewards.py").write_text("\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "bad_rewards"
    sys.modules.pop("bad_rewards", None)


@pytest.mark.parametrize("name", list(BAD_RETURNS))
def test_bad_return_is_one_clear_error(bad_rewards, name):
    (func,), _ = build_rewards([f"{bad_rewards}:{name}"])
    with pytest.raises(RewardError, match=rf"^user reward '{bad_rewards}:{name}' " + BAD_RETURNS[name][1]) as err:
        func(["a", "b"], ground_truth=["1", "2"])
    assert "\n" not in str(err.value) and isinstance(err.value, AgenticRLError)


def test_good_returns_pass_through(bad_rewards):
    funcs, _ = build_rewards([f"{bad_rewards}:not_applicable", f"{bad_rewards}:as_array", f"{bad_rewards}:with_ints"])
    assert funcs[0](["ok", "skip me"]) == [1.0, None]  # None: this reward does not apply (TRL leaves it out)
    assert funcs[1](["a", "b"]) == [0.25, 0.25]
    assert funcs[2](["a", "b"]) == [1.0, 0.0]
    assert [f.__name__ for f in funcs] == ["not_applicable", "as_array", "with_ints"]


def test_async_rewards_stay_async_and_are_checked(bad_rewards):
    from trl.trainer.utils import is_async_callable

    (bad, good), _ = build_rewards([f"{bad_rewards}:async_nan", f"{bad_rewards}:async_ok"])
    assert is_async_callable(bad) and is_async_callable(good)  # TRL awaits them
    assert asyncio.run(good(["a"])) == [1.0]
    with pytest.raises(RewardError, match="async_nan' returned nan for completion 0"):
        asyncio.run(bad(["a"]))


def test_checked_rewards_pickle_and_rename(bad_rewards):
    funcs, _ = build_rewards([f"{bad_rewards}:nan", f"{bad_rewards}:nan"])
    assert [f.__name__ for f in funcs] == ["nan", "nan_2"]
    clone = pickle.loads(pickle.dumps(funcs[1]))
    assert clone.__name__ == "nan_2"
    with pytest.raises(RewardError, match="returned nan"):
        clone(["a", "b"])


@pytest.mark.parametrize("name", ["scalar", "none", "strings", "short", "nan", "inf", "raises"])
def test_reward_check_reports_the_same_error_in_one_line(bad_rewards, name, tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"completion": c, "ground_truth": "1"}) + "\n" for c in ("a", "b")))
    assert main(["reward", "check", str(data), "--reward", "accuracy", "--reward", f"{bad_rewards}:{name}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: user reward '{bad_rewards}:{name}' "), err
