"""The agent-facing ``rl_training`` tool: real hello-agents registry, real stages on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentic_rl.tools.rl_training import HELLO_AGENTS, RLTrainingTool

QUESTIONS = [("Ann has 3 boxes of 4 pens. How many pens?", "12"), ("What is 9 + 8?", "17"),
             ("A train goes 60 km per hour for 2 hours. How far?", "120"), ("What is 30 - 12?", "18")]


def _call(tool, **params) -> dict:
    out = tool.run(params)
    assert isinstance(out, str)
    return json.loads(out)


@pytest.fixture()
def custom_dataset(tmp_path) -> Path:
    """A user's file with its own column names (question in 'problem_text', bare final answer in 'final')."""
    path = tmp_path / "mine" / "test.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps({"problem_text": q, "final": a}) + "\n" for q, a in QUESTIONS))
    return path.parent


@pytest.mark.skipif(not HELLO_AGENTS, reason="hello-agents not installed")
def test_hello_agents_registry_runs_evaluate(tiny_model_dir, custom_dataset, tmp_path):
    from hello_agents.tools.base import Tool
    from hello_agents.tools.registry import ToolRegistry

    tool = RLTrainingTool(workspace=tmp_path / "ws")
    assert isinstance(tool, Tool) and tool.name == "rl_training"
    registry = ToolRegistry()
    registry.register_tool(tool)
    assert "rl_training" in registry.list_tools() and registry.get_tool("rl_training") is tool

    # The schema an LLM sees lists the tool's keys and every stage hyper-parameter, typed.
    schema = tool.to_openai_schema()["function"]
    props = schema["parameters"]["properties"]
    assert schema["name"] == "rl_training" and schema["parameters"]["required"] == ["action"]
    assert props["beta"]["type"] == "number" and props["num_generations"]["type"] == "integer"
    assert props["max_new_tokens"]["type"] == "integer" and props["rewards"]["type"] == "array"

    # The registry passes {"input": text}: a JSON object of the parameters.
    loaded = json.loads(registry.execute_tool("rl_training", json.dumps({
        "action": "load_dataset", "source": str(custom_dataset), "split": "test", "name": "mine",
        "question_field": "problem_text", "ground_truth_field": "final"})))
    assert loaded["dataset"] == "mine" and loaded["num_rows"] == 4
    assert loaded["example"]["ground_truth"] == "12" and loaded["example"]["question"] == QUESTIONS[0][0]

    result = json.loads(registry.execute_tool("rl_training", json.dumps({
        "action": "evaluate", "model": str(tiny_model_dir), "dataset": "mine", "split": "test", "max_samples": 3,
        "max_new_tokens": 8, "batch_size": 3, "rewards": ["accuracy:1.0", "format:0.2"]})))
    assert "error" not in result, result
    metrics = result["metrics"]
    for key in ("accuracy_strict", "accuracy_lenient", "pass@1", "format_rate", "avg_reward", "avg_tokens",
                "truncation_rate", "avg_steps"):
        assert isinstance(metrics[key], float), (key, metrics[key])
    assert 0.0 <= metrics["accuracy_strict"] <= metrics["accuracy_lenient"] <= 1.0
    assert metrics["num_prompts"] == 3 and isinstance(metrics["errors"]["counts"], dict)

    # The numbers are those of the predictions on *our* rows (the dataset name reached the evaluator).
    predictions = [json.loads(line) for line in
                   (Path(result["output_dir"]) / "predictions.jsonl").read_text().splitlines()]
    assert {p["question"] for p in predictions} <= {q for q, _ in QUESTIONS} and len(predictions) == 3
    assert {p["ground_truth"] for p in predictions} <= {a for _, a in QUESTIONS}
    assert metrics["avg_tokens"] == pytest.approx(sum(p["num_tokens"] for p in predictions) / 3)
    assert metrics["accuracy_strict"] == pytest.approx(sum(p["correct_strict"] for p in predictions) / 3)
    assert metrics["truncation_rate"] == pytest.approx(sum(p["truncated"] for p in predictions) / 3)

    # status reports the run with the same numbers; a new tool on the same workspace still knows it.
    status = json.loads(registry.execute_tool("rl_training", '{"action": "status"}'))
    assert [r["name"] for r in status["runs"]] == [result["run"]]
    run_metrics = next(iter(status["runs"][0]["metrics"].values()))
    assert run_metrics["accuracy_strict"] == metrics["accuracy_strict"]
    again = _call(RLTrainingTool(workspace=tmp_path / "ws"), action="status", name=result["run"])
    assert again["run"]["kind"] == "evaluate"


def test_errors_are_json_not_exceptions(tmp_path):
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    cases = [
        ({"action": "fly"}, "unknown action 'fly'"),
        ({}, "'action' is required"),
        ({"action": "train", "algorithm": "ppo"}, "one of sft, grpo"),
        ({"action": "train", "algorithm": "grpo", "model": "m", "learning_rat": 1e-5}, "did you mean 'learning_rate'"),
        ({"action": "train", "algorithm": "grpo", "model": "m", "beta": "high"}, "'beta' must be a number"),
        ({"action": "train", "algorithm": "grpo", "model": "m", "num_generations": 1}, "num_generations"),
        ({"action": "create_reward", "rewards": ["accuracy:1.0", "bogus:2"]}, "unknown reward 'bogus'"),
        ({"action": "create_reward", "rewards": ["format"], "colour": "red"}, "unknown create_reward key 'colour'"),
        ({"action": "load_dataset", "source": "synthetic", "shuffle": True}, "unknown load_dataset key 'shuffle'"),
        ({"action": "load_dataset", "source": str(tmp_path / "nope.jsonl")}, "not found"),
        ({"action": "evaluate"}, "needs 'model'"),
        ({"action": "status", "name": "missing"}, "no run named 'missing'"),
    ]
    for params, message in cases:
        result = _call(tool, **params)
        assert set(result) == {"error", "action"} and message in result["error"], (params, result)
    assert "JSON object" in json.loads(tool.run({"input": "train sft please"}))["error"]
    assert json.loads(tool.run('{"action": "status"}'))["runs"] == []


def test_load_dataset_and_create_reward_give_numbers(tmp_path):
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    train = _call(tool, action="load_dataset", source="synthetic", split="train", name="arith", max_samples=20,
                  seed=3)
    assert train["num_rows"] == 20 and isinstance(train["avg_steps"], float) and train["avg_steps"] >= 1
    test = _call(tool, action="load_dataset", source="synthetic", split="test", name="arith", max_samples=5)
    assert test["num_rows"] == 5 and test["path"] == train["path"]          # both splits in one folder
    assert sorted(p.name for p in Path(train["path"]).iterdir()) == ["test.jsonl", "train.jsonl"]
    # The saved rows read back into exactly the loaded canonical rows.
    from agentic_rl.data.custom import load_task_dataset

    again = load_task_dataset(train["path"], "train").to_list()
    assert [r["question"] for r in again][:1] == [train["example"]["question"]]
    assert again[0]["solution"] == train["example"]["solution"]

    made = _call(tool, action="create_reward", rewards=["accuracy:1.0", "format:0.5"], name="mix",
                 completions=["3 + 4 = 7\nFinal Answer: 7", "Final Answer: 8", "no answer"], ground_truth="7")
    assert made["reward"] == "mix" and made["weights"] == [1.0, 0.5] and made["functions"] == ["accuracy", "format"]
    right, wrong, none = made["scores"]
    assert right["components"]["accuracy"] == 1.0 and wrong["components"]["accuracy"] == 0.0
    assert none["components"]["accuracy"] == 0.0
    for score in made["scores"]:
        expected = score["components"]["accuracy"] + 0.5 * score["components"]["format"]
        assert isinstance(score["total"], float) and score["total"] == pytest.approx(expected)
    assert right["total"] > wrong["total"]
    # A reward name expands into its specs wherever rewards are taken (and names can be combined with specs).
    combined = _call(tool, action="create_reward", rewards=["mix", "length(alpha=0.01):0.1"])
    assert combined["specs"] == ["accuracy:1.0", "format:0.5", "length(alpha=0.01):0.1"]
    status = _call(tool, action="status")
    assert [d["name"] for d in status["datasets"]] == ["arith"] and len(status["rewards"]) == 2


def test_train_sft_then_grpo_honours_every_given_hyper_parameter(tiny_model_dir, tmp_path):
    """2 SFT steps, then 1 GRPO step from the SFT run (by name) with a reward made by create_reward."""
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    _call(tool, action="load_dataset", source="synthetic", split="train", name="arith", max_samples=16)
    sft = _call(tool, action="train", algorithm="sft", name="first", model=str(tiny_model_dir), dataset="arith",
                max_steps=2, learning_rate=3.5e-4, lora_r=4, lora_alpha=8, batch_size=2, seed=7, report_to="none")
    assert "error" not in sft, sft
    written = yaml.safe_load((Path(sft["output_dir"]) / "config.yaml").read_text())
    assert written["learning_rate"] == pytest.approx(3.5e-4) and written["lora_r"] == 4
    assert written["lora_alpha"] == 8 and written["max_steps"] == 2 and written["seed"] == 7
    assert written["batch_size"] == 2 and written["dataset"] == str(tmp_path / "ws" / "datasets" / "arith")
    assert Path(sft["model_dir"]).is_dir() and sft["metrics"]["global_step"] == 2
    assert isinstance(sft["metrics"]["train/loss"], float) and sft["metrics"]["train/loss"] > 0

    _call(tool, action="create_reward", rewards=["accuracy:1.0", "format:0.3"], name="mix")
    grpo = _call(tool, action="train", algorithm="grpo", model="first", dataset="arith", rewards="mix",
                 preset="tiny", max_steps=1, num_generations=2, batch_size=2, gradient_accumulation_steps=1,
                 max_completion_length=8, beta=0.02, learning_rate="1e-4", lora_r=4, lora_alpha=8,
                 heldout_every=0, report_to=["none"])
    assert "error" not in grpo, grpo
    written = yaml.safe_load((Path(grpo["output_dir"]) / "config.yaml").read_text())
    assert written["model"] == sft["model_dir"] and written["rewards"] == ["accuracy:1.0", "format:0.3"]
    assert written["beta"] == pytest.approx(0.02) and written["num_generations"] == 2
    assert written["learning_rate"] == pytest.approx(1e-4) and written["max_completion_length"] == 8
    assert grpo["metrics"]["steps"] == 1 and isinstance(grpo["metrics"]["last_logged"]["grpo/reward"], float)

    status = _call(tool, action="status")
    assert [(r["name"], r["status"]) for r in status["runs"]] == [("first", "finished"), ("grpo_2", "finished")]
    assert status["runs"][0]["model_dir"] == sft["model_dir"]


def test_plain_class_without_hello_agents(tmp_path):
    code = (
        "import sys, json; sys.modules['hello_agents'] = None\n"
        "from agentic_rl.tools.rl_training import RLTrainingTool, HELLO_AGENTS\n"
        "tool = RLTrainingTool(workspace=sys.argv[1])\n"
        "assert not HELLO_AGENTS and type(tool).__mro__[1] is object\n"
        "print(tool.run({'action': 'status'}))\n"
        "print(json.dumps([p['name'] for p in tool.get_parameters()][:3]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ws")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    status, names = out.stdout.strip().splitlines()[-2:]
    assert json.loads(status)["runs"] == [] and json.loads(names) == ["action", "algorithm", "name"]
