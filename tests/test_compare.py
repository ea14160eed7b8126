"""The RL-vs-control comparison: its statistics against hand computations, and the command on run directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentic_rl.cli import main
from agentic_rl.errors import DataError
from agentic_rl.eval.compare import (bootstrap_mean_difference, compare_runs, mcnemar_exact, per_problem_accuracy,
                                     render_markdown, wilson_interval)


def test_wilson_interval_matches_the_closed_form():
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(3.8415 / 13.8415, abs=1e-4)  # z^2 / (n + z^2) at p = 0
    low, high = wilson_interval(50, 100)
    assert (low, high) == pytest.approx((0.4038, 0.5962), abs=1e-4)


def test_mcnemar_exact_is_the_two_sided_binomial_tail():
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_exact(9, 1) == pytest.approx(2 * (1 + 10) / 1024)
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(0, 0) == 1.0


def test_bootstrap_interval_matches_the_normal_approximation_and_collapses_without_noise():
    assert bootstrap_mean_difference([[1.0] * 50, [1.0] * 20]) == (1.0, 1.0, 1.0)
    diffs = [[1.0, 0.0] * 250]  # mean 0.5, sd 0.5, n 500: standard error 0.02236
    mean, low, high = bootstrap_mean_difference(diffs, samples=4000, seed=1)
    assert mean == 0.5
    assert low == pytest.approx(0.5 - 1.96 * 0.02236, abs=0.006)
    assert high == pytest.approx(0.5 + 1.96 * 0.02236, abs=0.006)
    # Resampling the runs too widens the interval when the runs disagree.
    spread = [[1.0] * 100, [0.0] * 100, [0.5] * 100]
    _, s_low, s_high = bootstrap_mean_difference(spread, samples=2000)
    _, h_low, h_high = bootstrap_mean_difference(spread, samples=2000, hierarchical=True)
    assert (s_low, s_high) == (0.5, 0.5)
    assert h_low < 0.3 and h_high > 0.7


def _write_eval(run: Path, stage: str, outcomes: dict[str, list[bool]]) -> None:
    folder = run / "eval" / stage
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "predictions.jsonl").open("w") as fh:
        for question, correct in outcomes.items():
            for j, c in enumerate(correct):
                fh.write(json.dumps({"index": 0, "sample": j, "question": question, "correct_strict": c}) + "\n")


def test_compare_runs_pairs_problems_and_counts_discordant_pairs(tmp_path):
    questions = [f"q{i}" for i in range(10)]
    for seed, (grpo_right, control_right) in enumerate([(6, 3), (5, 4)]):
        run = tmp_path / f"seed{seed}"
        _write_eval(run, "grpo", {q: [i < grpo_right] for i, q in enumerate(questions)})
        _write_eval(run, "sft_continued", {q: [i < control_right] for i, q in enumerate(reversed(questions))})
        # Sampled: 4 samples per problem.
        _write_eval(run, "grpo-sampled", {q: [True, False, False, False] for q in questions})
        _write_eval(run, "sft_continued-sampled", {q: [False] * 4 for q in questions})
    result = compare_runs([tmp_path / "seed0", tmp_path / "seed1"], "grpo", "sft_continued", samples=500)
    greedy = result["modes"]["greedy"]
    first = greedy["rows"][0]
    # Control solved the LAST three questions (it saw them reversed), GRPO the first six: no overlap.
    assert (first["treatment"], first["control"]) == (0.6, 0.3)
    assert (first["only_treatment"], first["only_control"]) == (6, 3)
    assert greedy["mean_difference"] == pytest.approx(((0.6 - 0.3) + (0.5 - 0.4)) / 2)
    assert greedy["ci95"][0] <= greedy["mean_difference"] <= greedy["ci95"][1]
    sampled = result["modes"]["sampled"]
    assert sampled["mean_difference"] == pytest.approx(0.25)
    assert sampled["treatment_wins_every_run"] is True


def test_compare_refuses_stages_scored_on_different_problems(tmp_path):
    _write_eval(tmp_path, "grpo", {"a": [True], "b": [False]})
    _write_eval(tmp_path, "sft_continued", {"a": [True], "c": [False]})
    with pytest.raises(DataError, match="different problems"):
        compare_runs([tmp_path], "grpo", "sft_continued", samples=200)
    with pytest.raises(DataError, match="no predictions.jsonl or episodes_with_tools.jsonl found"):
        per_problem_accuracy(tmp_path / "eval" / "nothing")


def test_compare_reads_environment_episodes(tmp_path):
    """A stage evaluated in an environment writes episodes (``correct`` per episode), not predictions; sampled, each
    problem's episodes carry their ``index`` and ``sample``, and a problem's score is the share of them correct."""
    for stage, outcomes in (("grpo", [True, True, False, True]), ("sft", [True, False, False, False])):
        folder = tmp_path / "eval" / stage
        folder.mkdir(parents=True)
        (folder / "episodes_with_tools.jsonl").write_text("".join(
            json.dumps({"question": f"q{i}", "correct": ok, "tool_calls": 1}) + "\n" for i, ok in enumerate(outcomes)))
    assert list(compare_runs([tmp_path], "grpo", "sft", samples=200)["modes"]) == ["greedy"]
    for stage, outcomes in (("grpo", [[True, False], [True, True]]), ("sft", [[False, False], [True, False]])):
        folder = tmp_path / "eval" / f"{stage}-sampled"
        folder.mkdir(parents=True)
        (folder / "episodes_with_tools.jsonl").write_text("".join(
            json.dumps({"index": i, "sample": j, "question": f"q{i}", "correct": ok}) + "\n"
            for i, samples in enumerate(outcomes) for j, ok in enumerate(samples)))
    result = compare_runs([tmp_path], "grpo", "sft", samples=200)["modes"]
    row = result["greedy"]["rows"][0]
    assert (row["treatment"], row["control"], row["only_treatment"], row["only_control"]) == (0.75, 0.25, 2, 0)
    sampled = result["sampled"]["rows"][0]
    assert (sampled["problems"], sampled["treatment"], sampled["control"]) == (2, 0.75, 0.25)
    # the SFT start is a control, not a compute-matched one: the table must not claim it is
    assert render_markdown(compare_runs([tmp_path], "grpo", "sft", samples=200)).startswith("# grpo vs sft (control)")


def test_compare_command_writes_table_plot_and_json(tmp_path, capsys):
    run = tmp_path / "run"
    _write_eval(run, "grpo", {"a": [True], "b": [True], "c": [False]})
    _write_eval(run, "sft_continued", {"a": [True], "b": [False], "c": [False]})
    out = tmp_path / "out"
    assert main(["compare", str(run), "--output-dir", str(out), "--bootstrap-samples", "200"]) == 0
    table = (out / "compare.md").read_text()
    assert "| 3 | 33.3% | 66.7% | +33.3 |" in table
    assert json.loads((out / "compare.json").read_text())["modes"]["greedy"]["rows"][0]["only_treatment"] == 1
    assert (out / "compare.png").stat().st_size > 1000
    assert main(["compare", str(tmp_path / "missing"), "--output-dir", str(out)]) == 2
    assert "no eval/ folder" in capsys.readouterr().err
