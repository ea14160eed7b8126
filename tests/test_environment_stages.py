"""`--environment` in the main stages: SFT on whole-episode demonstrations, GRPO on multi-turn episodes, evaluation
with and without tools; one settings vocabulary checked the same way in each; a user environment written only
against TRL's environment_factory contract (the class below, not one of ours) trains and evaluates; a GRPO run in
an environment killed with SIGKILL resumes to the same total step count."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import eval_config, grpo_config, read_jsonl

from agentic_rl.agent.env import Environment, StepResult
from agentic_rl.config import config_from_dict
from agentic_rl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


class PriceLookup:
    """A user environment in TRL's shape: ``reset(**row)``, typed tool methods with docstrings, ``get_reward``."""

    def reset(self, **row) -> str:
        self.question = row["question"]
        self.lookups = 0
        return "Prices are in dollars."

    def price(self, item: str) -> str:
        """Look up the price of an item.

        Args:
            item: the item to price.
        """
        if item == "broken":
            raise RuntimeError("the price list is unavailable")
        self.lookups += 1
        return "3"

    def get_reward(self) -> float:
        return 1.0 if self.lookups else 0.0


# ---------------------------------------------------------------------------------------------------------------
# One vocabulary: the same settings, the same checks, in every stage
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stage", ["sft", "grpo", "eval"])
def test_environment_settings_have_one_name_and_default_in_every_stage(stage):
    import dataclasses

    from agentic_rl.agent.settings import EnvironmentSettings
    from agentic_rl.cli import _load_command

    config_cls, _, _ = _load_command(stage)
    shared = {f.name: f for f in dataclasses.fields(EnvironmentSettings)}
    mine = {f.name: f for f in dataclasses.fields(config_cls)}
    for name, f in shared.items():
        assert name in mine and mine[name].default == f.default and mine[name].metadata == f.metadata
    base = {"models": ["m"]} if stage == "eval" else {"model": "m"}
    with pytest.raises(ConfigError, match="max_turns applies to multi-turn episodes only"):
        config_from_dict(config_cls, {**base, "max_turns": 2})  # would be ignored without an environment
    with pytest.raises(ConfigError, match="tool_error_reward must be <= 0"):
        config_from_dict(config_cls, {**base, "environment": "calculator", "tool_error_reward": 0.5})


def test_grpo_refuses_what_episodes_exclude():
    from agentic_rl.train.grpo import GRPOConfig

    base = {"model": "m", "environment": "calculator"}
    with pytest.raises(ConfigError, match="the reward is the episode's return"):
        config_from_dict(GRPOConfig, {**base, "rewards": ["accuracy:1.0"]})
    with pytest.raises(ConfigError, match="max_turn_tokens .* must not exceed max_completion_length"):
        config_from_dict(GRPOConfig, {**base, "max_turn_tokens": 300, "max_completion_length": 64})


def test_cli_reads_environment_args_as_a_mapping_and_bad_input_is_one_line(tiny_model_dir, tmp_path):
    from agentic_rl.cli import main

    out = tmp_path / "sft"
    code = main(["sft", "--model", str(tiny_model_dir), "--output-dir", str(out), "--environment", "calculator",
                 "--environment-args", "{final_turn: everything}"])
    assert code == 2 and not out.exists()  # the environment's own check, before the run directory exists
    code = main(["sft", "--model", str(tiny_model_dir), "--output-dir", str(out), "--environment", "calculator",
                 "--environment-args", "{colour: red}"])
    assert code == 2 and not out.exists()
    code = main(["grpo", "--model", str(tiny_model_dir), "--output-dir", str(out), "--environment", "nosuch"])
    assert code == 2 and not out.exists()


# ---------------------------------------------------------------------------------------------------------------
# SFT in an environment
# ---------------------------------------------------------------------------------------------------------------

def test_sft_demonstrations_mix_environment_direct_and_skip_toolread_jsonl(tiny_model_dir):
    from agentic_rl.agent.settings import build_environment
    from agentic_rl.models import load_model_and_tokenizer
    from agentic_rl.train.sft import SFTConfig, build_environment_dataset

    config = config_from_dict(SFTConfig, dict(model=str(tiny_model_dir), environment="calculator",
                                              dataset="synthetic:multiplication", max_train_samples=40,
                                              direct_fraction=0.25, skip_tool_fraction=0.25))
    _, tokenizer = load_model_and_tokenizer(str(tiny_model_dir))
    dataset, counts = build_environment_dataset(config, build_environment(config), tokenizer)
    assert counts == {"environment": 20, "skip_tool": 10, "direct": 10, "not_demonstrated": 0} and len(dataset) == 40
    texts = [tokenizer.decode(r["input_ids"]) for r in dataset]
    trained = [tokenizer.decode([t for t in r["labels"] if t != -100]) for r in dataset]
    assert sum("<tool_call>" in t for t in trained) == 20  # only the environment's demonstrations call the tool
    assert all("<tool_response>" not in t for t in trained)  # tool outputs never carry a loss
    assert sum("calculator tool" in t for t in texts) == 30  # the environment's prompt: environment + skip_tool rows


# ---------------------------------------------------------------------------------------------------------------
# A user environment in TRL's shape, end to end
# ---------------------------------------------------------------------------------------------------------------

def test_a_user_environment_in_trls_shape_trains_two_grpo_steps_and_evaluates(tiny_model_dir, tmp_path):
    from agentic_rl.eval.evaluate import run as evaluate
    from agentic_rl.train.grpo import run as grpo

    spec = f"{__name__}:PriceLookup"
    result = grpo(grpo_config(tiny_model_dir, tmp_path / "grpo", environment=spec, max_completion_length=24,
                              max_turn_tokens=12, gradient_accumulation_steps=4, heldout_every=2, eval_samples=2,
                              save_steps=10))
    assert result["steps"] == 2 and (tmp_path / "grpo" / "model" / "model.safetensors").is_file()
    rollouts = read_jsonl(tmp_path / "grpo" / "rollouts.jsonl")
    assert len(rollouts) == 2 and {"tool_call_rate", "return"} <= set(rollouts[0])
    summary = evaluate(eval_config(result["model_dir"], tmp_path / "eval", environment=spec, dataset="synthetic",
                                   eval_samples=4, max_new_tokens=24, max_turn_tokens=12))
    metrics = next(iter(summary["results"].values()))
    assert metrics["num_prompts"] == 4 and {"accuracy", "accuracy_without_tools", "tool_call_rate"} <= set(metrics)
    episodes = read_jsonl(tmp_path / "eval" / "episodes_with_tools.jsonl")
    assert len(episodes) == 4 and all("step_rewards" in e for e in episodes)
    assert (tmp_path / "eval" / "report.md").read_text().count("|") > 10


# ---------------------------------------------------------------------------------------------------------------
# Evaluation in an environment
# ---------------------------------------------------------------------------------------------------------------

def test_eval_with_and_without_tools_reports_both_and_the_environment_statistics(tiny_model_dir, tmp_path):
    from agentic_rl.eval.evaluate import run as evaluate

    summary = evaluate(eval_config(tiny_model_dir, tmp_path, environment="self_correct", max_turns=2,
                                   dataset="synthetic", eval_samples=3, max_new_tokens=128, max_turn_tokens=8))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics == json.loads(json.dumps(next(iter(summary["results"].values()))))
    with_tools, without = metrics["with_tools"], metrics["without_tools"]
    assert with_tools["attempts"] == 2.0 and without["attempts"] == 1.0  # without tools: one attempt, no feedback
    assert {"success_at_1", "success_at_2"} <= set(with_tools)
    episodes = read_jsonl(tmp_path / "episodes_with_tools.jsonl")
    assert [m["role"] for m in episodes[0]["messages"]] == ["assistant", "user", "assistant"]
    # no calculator in this environment: its episodes are not classed by calculator calls
    assert "error_classes" not in metrics and not any("category" in e for e in episodes)


def test_eval_in_the_calculator_environment_classes_each_wrong_episode_by_its_calls(tiny_model_dir, tmp_path):
    from agentic_rl.eval.error_analysis import EPISODE_CATEGORIES
    from agentic_rl.eval.evaluate import run as evaluate

    evaluate(eval_config(tiny_model_dir, tmp_path, environment="calculator", dataset="synthetic", eval_samples=4,
                         max_new_tokens=32, max_turn_tokens=16))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    episodes = read_jsonl(tmp_path / "episodes_with_tools.jsonl")
    wrong = [e for e in episodes if not e["correct"]]
    assert wrong and all(e["category"] in EPISODE_CATEGORIES and e["category_reason"] for e in wrong)
    assert not any("category" in e for e in episodes if e["correct"])
    assert sum(metrics["error_classes"].values()) == len(wrong)
    assert not any("category" in e for e in read_jsonl(tmp_path / "episodes_without_tools.jsonl"))
    assert "Wrong episodes with tools" in (tmp_path / "report.md").read_text()


def test_eval_in_the_search_environment_classes_each_wrong_episode_by_its_searches(tiny_model_dir, tmp_path):
    from agentic_rl.eval.error_analysis import SEARCH_EPISODE_CATEGORIES
    from agentic_rl.eval.evaluate import run as evaluate

    evaluate(eval_config(tiny_model_dir, tmp_path, environment="search", dataset="synthetic:world", eval_samples=4,
                         max_new_tokens=32, max_turn_tokens=16))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    wrong = [e for e in read_jsonl(tmp_path / "episodes_with_tools.jsonl") if not e["correct"]]
    assert wrong and all(e["category"] in SEARCH_EPISODE_CATEGORIES and e["category_reason"] for e in wrong)
    assert list(metrics["error_classes"]) == list(SEARCH_EPISODE_CATEGORIES)
    assert sum(metrics["error_classes"].values()) == len(wrong)


class ParityJudge(Environment):
    """An environment whose verdict moves with every sampled token: an answer is correct when its length in
    characters is a multiple of 4; another one gets one more try. Sampled episodes of one problem then disagree, even
    from a random model."""

    max_turns = 2

    def reset(self, task):
        self.turns = 0
        return None

    def step(self, assistant_text):
        self.turns += 1
        correct = len(assistant_text) % 4 == 0
        if correct or self.turns == self.max_turns:
            return StepResult([], float(correct), True, {"correct": correct})
        return StepResult([{"role": "user", "content": "again"}], 0.0, False)


class EvenAnswers(Environment):
    """A verdict fixed by the task alone: an episode is correct when the task's answer is even, whatever the model
    writes, so every problem's pass rate is known (1 or 0)."""

    max_turns = 1

    def reset(self, task):
        self.correct = int(float(task["ground_truth"])) % 2 == 0
        return None

    def step(self, assistant_text):
        return StepResult([], float(self.correct), True, {"correct": self.correct})


def test_difficulty_selection_in_an_environment_estimates_pass_rates_from_sampled_episodes(tiny_model_dir, tmp_path):
    """`select_samples` with an environment: each candidate's pass rate is the share of its sampled episodes the
    environment scores correct, so a band of [0.5, 1] keeps exactly the problems whose episodes succeed."""
    from agentic_rl.train.grpo import run as grpo

    out = tmp_path / "grpo"
    result = grpo(grpo_config(tiny_model_dir, out, environment=f"{__name__}:EvenAnswers", max_completion_length=8,
                              max_turn_tokens=8, select_samples=3, select_candidates=8, select_pass_rate_low=0.5,
                              select_pass_rate_high=1.0, max_train_samples=16))
    selection = json.loads((out / "difficulty.json").read_text())
    even = selection["histogram"]["3/3"]  # the model's own single-turn answers would pass none of them
    assert selection["candidates"] == 8 and selection["histogram"]["0/3"] == 8 - even  # no problem in between
    assert selection["kept"] == even > 0 and result["difficulty_selection"] == selection


def _sampled_eval(model_dir, out, **overrides):
    from agentic_rl.eval.evaluate import run as evaluate

    settings = dict(environment=f"{__name__}:ParityJudge", dataset="synthetic", eval_samples=8, max_new_tokens=24,
                    max_turn_tokens=8, num_samples=4, temperature=1.0, seed=1)
    evaluate(eval_config(model_dir, out, **{**settings, **overrides}))
    return (json.loads((out / "metrics.json").read_text()),
            {key: read_jsonl(out / f"episodes_{key}.jsonl") for key in ("with_tools", "without_tools")})


def test_sampled_episodes_are_seeded_all_recorded_and_scored_per_episode(tiny_model_dir, tmp_path):
    """`eval --environment X --num-samples 4 --temperature 1`: four sampled episodes per problem, with tools and
    without; accuracy is the mean over every episode, pass@k the unbiased estimate per problem; the same seed plays
    the same episodes, another seed others."""
    from math import comb

    metrics, episodes = _sampled_eval(tiny_model_dir, tmp_path / "a")
    again, episodes_again = _sampled_eval(tiny_model_dir, tmp_path / "b")
    other, episodes_other = _sampled_eval(tiny_model_dir, tmp_path / "c", seed=2)
    assert episodes_again == episodes
    assert {k: v for k, v in again.items() if k not in ("timing", "config")} == \
        {k: v for k, v in metrics.items() if k not in ("timing", "config")}
    assert [e["messages"] for e in episodes_other["with_tools"]] != [e["messages"] for e in episodes["with_tools"]]
    assert metrics["num_prompts"] == 8 and metrics["num_samples"] == 4
    for key, setting in (("with_tools", metrics["with_tools"]), ("without_tools", metrics["without_tools"])):
        played = episodes[key]
        assert [(e["index"], e["sample"]) for e in played] == [(i, j) for i in range(8) for j in range(4)]
        assert all(len({e["question"] for e in played if e["index"] == i}) == 1 for i in range(8))
        assert setting["accuracy"] == pytest.approx(sum(e["correct"] for e in played) / 32)
        assert setting["turns_per_episode"] == pytest.approx(sum(e["turns"] for e in played) / 32)
        assert setting["return"] == pytest.approx(sum(e["return"] for e in played) / 32)
        correct = [sum(e["correct"] for e in played if e["index"] == i) for i in range(8)]
        for k in (1, 2, 4):
            expected = sum(1 - comb(4 - c, k) / comb(4, k) for c in correct) / 8
            assert setting[f"pass@{k}"] == pytest.approx(expected), (key, k)
        assert setting["pass@1"] == pytest.approx(setting["accuracy"])
        assert setting["pass@1"] <= setting["pass@2"] <= setting["pass@4"]
    assert 0 < metrics["accuracy"] < metrics["pass@4"] < 1  # the samples of a problem disagree: pass@k is not trivial
    assert metrics["accuracy"] == metrics["accuracy_strict"] == metrics["with_tools"]["accuracy"]
    assert metrics["accuracy_without_tools"] == metrics["without_tools"]["accuracy"]
    assert "4 sampled episodes per problem at temperature 1.0" in (tmp_path / "a" / "report.md").read_text()


def test_greedy_episodes_are_one_per_problem_without_pass_at_k(tiny_model_dir, tmp_path):
    metrics, episodes = _sampled_eval(tiny_model_dir, tmp_path, num_samples=1, temperature=0.0)
    assert [(e["index"], e["sample"]) for e in episodes["with_tools"]] == [(i, 0) for i in range(8)]
    assert not [k for k in metrics if k.startswith("pass@")]
    assert "greedy" in (tmp_path / "report.md").read_text()
    with pytest.raises(ConfigError, match="needs --temperature > 0"):
        eval_config(tiny_model_dir, tmp_path, environment="calculator", num_samples=2)


# ---------------------------------------------------------------------------------------------------------------
# SIGKILL mid-run, then --resume
# ---------------------------------------------------------------------------------------------------------------

def test_grpo_in_an_environment_killed_with_sigkill_resumes_to_the_same_step_count(tiny_model_dir, tmp_path):
    out = tmp_path / "grpo"
    command = [sys.executable, "-m", "agentic_rl", "grpo", "--model", str(tiny_model_dir), "--output-dir", str(out),
               "--environment", "calculator", "--dataset", "synthetic:multiplication", "--max-steps", "6",
               "--num-generations", "2", "--batch-size", "4", "--max-completion-length", "32",
               "--max-turn-tokens", "16", "--max-train-samples", "8", "--heldout-every", "0", "--save-steps", "1",
               "--save-total-limit", "10", "--learning-rate", "0.01", "--report-to", "none"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and not (out / "checkpoint-2" / "trainer_state.json").is_file():
        if process.poll() is not None:
            pytest.fail("the run ended before it could be killed")
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL and not (out / "stage.json").exists()
    resumed = subprocess.run(command + ["--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    result = json.loads((out / "stage.json").read_text())
    assert result["steps"] == 6 and "checkpoint-" in result["resumed_from"]
    steps = [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "agent/return" in r]
    assert steps[-1] == 6 and sorted(set(steps)) == list(range(1, 7))


# ---------------------------------------------------------------------------------------------------------------
# tune and the rl_training tool reach the environment through the same settings
# ---------------------------------------------------------------------------------------------------------------

def test_tune_scores_environment_trials_by_their_episodes(tiny_model_dir, tmp_path):
    from agentic_rl.tune import TuneConfig
    from agentic_rl.tune import run as tune

    out = tmp_path / "search"
    result = tune(TuneConfig(
        stage="grpo", search="grid", seed=0, output_dir=str(out), space={"learning_rate": [1e-3, 2e-3]},
        prune=False, budget_steps=1, eval_samples=2, max_new_tokens=32,
        fixed={"model": str(tiny_model_dir), "environment": "calculator", "dataset": "synthetic:multiplication",
               "max_train_samples": 4, "num_generations": 2, "batch_size": 2, "max_completion_length": 32,
               "max_turn_tokens": 16, "heldout_every": 0, "report_to": ["none"], "save_steps": 10}))
    scores = [json.loads(p.read_text()) for p in sorted((out / "trials").glob("*/*/tune_score.json"))]
    assert len(scores) == 2 and result["best_value"] == max(s["accuracy"] for s in scores)
    for score in scores:  # scored in the environment: episode statistics, with tools only
        assert {"tool_call_rate", "turns_per_episode"} <= set(score["metrics"])
        assert "accuracy_without_tools" not in score["metrics"] and score["metrics"]["n"] == 2


def test_rl_training_tool_trains_and_evaluates_in_an_environment(tiny_model_dir, tmp_path):
    from agentic_rl.integrations.hello_agents import RLTrainingTool

    tool = RLTrainingTool(workspace=tmp_path / "ws")
    trained = json.loads(tool.run({
        "action": "train", "algorithm": "grpo", "model": str(tiny_model_dir), "environment": "self_correct",
        "max_turns": 2, "dataset": "synthetic", "max_steps": 1, "num_generations": 2, "batch_size": 2,
        "max_completion_length": 64, "max_turn_tokens": 16, "max_train_samples": 4, "heldout_every": 0,
        "report_to": ["none"]}))
    assert trained["status"] == "success", trained
    written = (Path(trained["output_dir"]) / "config.yaml").read_text()
    assert "environment: self_correct" in written and "max_turns: 2" in written
    evaluated = json.loads(tool.run({"action": "evaluate", "model": trained["model_dir"],
                                     "environment": "self_correct", "max_turns": 2, "dataset": "synthetic",
                                     "max_samples": 2, "max_new_tokens": 64, "max_turn_tokens": 16}))
    assert evaluated["status"] == "success", evaluated
    text = json.dumps(evaluated)
    assert "accuracy_without_tools" in text and "success_at_2" in text


def test_the_guide_example_environment_trains_end_to_end(tiny_model_dir, tmp_path, monkeypatch):
    """The class in the environments guide, taken from it, through the guide's three commands (fewer steps)."""
    import re

    from agentic_rl.cli import main

    readme = (ROOT / "docs" / "environments.md").read_text()
    code = re.search(r"```python\n# my_envs.py\n(.*?)```", readme, re.S).group(1)
    commands = re.search(r"```bash\nexport PYTHONPATH=\$PWD.*?\n(agentic-rl sft .*?)```", readme, re.S).group(1)
    (tmp_path / "my_envs.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    fewer = {"--max-steps": "2", "--eval-samples": "3"}
    steps = []
    for line in commands.replace("\\\n", " ").splitlines():
        argv = line.split()[1:]
        argv = [fewer.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]
        argv = [str(tiny_model_dir) if a == "runs/quickstart/sft/model" else a for a in argv]
        extra = {"sft": ["--max-train-samples", "16", "--batch-size", "4", "--report-to", "none"],
                 "grpo": ["--max-train-samples", "8", "--batch-size", "4", "--num-generations", "2",
                          "--max-completion-length", "48", "--heldout-every", "0", "--report-to", "none"],
                 "eval": ["--max-new-tokens", "48", "--output-dir", "runs/my-eval"]}[argv[0]]
        steps.append(argv[0])
        assert main(argv + extra) == 0, argv
    assert steps == ["sft", "grpo", "eval"]
    metrics = json.loads((tmp_path / "runs" / "my-eval" / "metrics.json").read_text())
    assert metrics["environment"] == "my_envs:ArithmeticTools" and metrics["num_prompts"] == 3
    assert (tmp_path / "runs" / "my-grpo" / "rollouts.jsonl").is_file()


def test_a_pipeline_with_a_bad_environment_argument_fails_before_any_stage(tmp_path):
    from agentic_rl.pipeline import PipelineConfig, run_pipeline

    config = config_from_dict(PipelineConfig, {"name": "bad-env", "output_dir": str(tmp_path / "run"),
                                               "dataset": "synthetic:multiplication", "environment": "calculator",
                                               "environment_args": {"final_turn": "everything"}})
    with pytest.raises(ConfigError, match="final_turn must be one of steps, answer"):
        run_pipeline(config)
    assert not (tmp_path / "run").exists()  # nothing pretrained, nothing written


class Exploding:
    """A user environment whose constructor fails."""

    def __init__(self):
        raise RuntimeError("no database")

    def reset(self, **row) -> None:
        return None


def test_settings_an_environment_does_not_take_and_a_failing_constructor_are_one_line_errors():
    from agentic_rl.agent.settings import build_environment
    from agentic_rl.train.grpo import GRPOConfig

    config = config_from_dict(GRPOConfig, {"model": "m", "environment": "self_correct", "max_tool_calls": 5})
    with pytest.raises(ConfigError, match="max_tool_calls does not apply to environment 'self_correct'"):
        build_environment(config)  # it has no tools: the setting would be silently ignored
    build_environment(config_from_dict(GRPOConfig, {"model": "m", "environment": "self_correct", "max_turns": 2}))
    with pytest.raises(ConfigError, match="could not be built: RuntimeError: no database"):
        build_environment(config_from_dict(GRPOConfig, {"model": "m", "environment": f"{__name__}:Exploding"}))


def test_the_sft_anchor_in_an_environment_trains_on_the_assistant_turns_of_demonstration_episodes(tokenizer):
    from agentic_rl.agent.settings import build_environment
    from agentic_rl.data.gsm8k import to_rl_dataset
    from agentic_rl.train.grpo import GRPOConfig
    from agentic_rl.train.signal import demonstrations_for

    config = config_from_dict(GRPOConfig, {"model": "m", "environment": "calculator", "sft_loss_weight": 0.1,
                                           "tools_in_prompt": False})
    rows = to_rl_dataset([{"question": "A farm has 23 boxes with 47 eggs in each box. How many eggs are there?",
                           "answer": "23 * 47 = <<23*47=1081>>1081\n#### 1081", "ground_truth": "1081"}], None)
    (ids, labels), = demonstrations_for(rows, tokenizer, config, build_environment(config))  # GRPO's own rows
    trained = tokenizer.decode([t for t, label in zip(ids, labels) if label != -100])
    untrained = tokenizer.decode([t for t, label in zip(ids, labels) if label == -100])
    assert '"expression": "23*47"' in trained and "Final Answer: 1081" in trained  # the call and the answer
    assert "1081" in untrained and "How many eggs" in untrained  # the tool's result and the question: no loss


def test_the_pipeline_anchors_grpo_on_its_own_sft_stage_and_a_missing_sft_run_is_one_line(tiny_model_dir, tmp_path):
    from agentic_rl.pipeline import PipelineConfig, resolve_stage_config
    from agentic_rl.train.signal import sft_run_demonstrations

    config = config_from_dict(PipelineConfig, {"name": "anchor", "model": str(tiny_model_dir),
                                               "stages": ["sft", "grpo"], "grpo": {"sft_loss_weight": 0.1}})
    assert resolve_stage_config(config, "grpo", "m", tmp_path).sft_anchor_run == str(tmp_path / "sft")
    without = config_from_dict(PipelineConfig, {"name": "anchor", "model": str(tiny_model_dir), "stages": ["grpo"]})
    assert resolve_stage_config(without, "grpo", "m", tmp_path).sft_anchor_run is None
    with pytest.raises(ConfigError, match=r"sft_anchor_run: .*config.yaml not found"):
        sft_run_demonstrations(str(tmp_path / "nowhere"), None)
