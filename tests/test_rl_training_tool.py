"""The agent-facing ``rl_training`` tool: real hello-agents registry, real stages on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentic_rl.errors import ConfigError
from agentic_rl.integrations.hello_agents import HELLO_AGENTS, RLTrainingTool

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
    assert metrics["num_prompts"] == 3 and isinstance(metrics["errors"]["counts"], dict)

    # The numbers are those of the predictions on *our* rows (the dataset name reached the evaluator).
    predictions = [json.loads(line) for line in
                   (Path(result["output_dir"]) / "predictions.jsonl").read_text().splitlines()]
    assert {p["question"] for p in predictions} <= {q for q, _ in QUESTIONS} and len(predictions) == 3
    assert {p["ground_truth"] for p in predictions} <= {a for _, a in QUESTIONS}
    assert metrics["avg_tokens"] == pytest.approx(sum(p["num_tokens"] for p in predictions) / 3)
    assert metrics["accuracy_strict"] == pytest.approx(sum(p["correct_strict"] for p in predictions) / 3)
    assert metrics["accuracy_lenient"] == pytest.approx(sum(p["correct_lenient"] for p in predictions) / 3)
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
        assert set(result) == {"status", "error", "message", "action"} and message in result["error"], (params, result)
        assert result["status"] == "error" and result["message"] == result["error"]
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


def test_train_rloo_is_the_grpo_stage_with_the_rloo_update(tiny_model_dir, tmp_path):
    """The tool's 'algorithm' key shadows GRPOConfig.algorithm: 'rloo' must reach the GRPO stage as that field."""
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    result = _call(tool, action="train", algorithm="rloo", model=str(tiny_model_dir), dataset="synthetic",
                   rewards=["accuracy:1.0"], max_steps=1, num_generations=2, batch_size=2,
                   gradient_accumulation_steps=1, max_completion_length=6, max_train_samples=4, heldout_every=0,
                   report_to=["none"])
    assert result["status"] == "success", result
    assert result["run"] == "rloo_1" and result["algorithm"] == "rloo" and result["metrics"]["steps"] == 1
    written = yaml.safe_load((Path(result["output_dir"]) / "config.yaml").read_text())
    assert written["algorithm"] == "rloo"
    assert _call(tool, action="status")["runs"][0]["algorithm"] == "rloo"


def test_plain_class_without_hello_agents(tmp_path):
    code = (
        "import sys, json; sys.modules['hello_agents'] = None\n"
        "from agentic_rl.integrations.hello_agents import RLTrainingTool, HELLO_AGENTS\n"
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


# --- The book's calls (hello-agents' own rl_training tool), written as Hello-Agents writes them ---------------------
# The machine is offline, so where the book would download openai/gsm8k, a call adds our 'source' / 'dataset' key
# pointing at the real GSM8K files, or uses a dataset registered with the book's register_dataset.

def _gsm8k_rows(gsm8k_dir: Path, n: int, split: str = "train") -> list[dict]:
    lines = (gsm8k_dir / f"{split}.jsonl").read_text().splitlines()[:n]
    return [json.loads(line) for line in lines]


def _book_sft_rows(rows: list[dict]) -> list[dict]:
    """Rows as the book's GSM8KDataset.format_for_sft writes them."""
    out = []
    for row in rows:
        reasoning, final = row["answer"].split("####")
        prompt = f"Question: {row['question']}\n\nLet's solve this step by step:\n"
        completion = f"{reasoning.strip()}\n\nFinal Answer: {final.strip()}"
        out.append({"prompt": prompt, "completion": completion, "text": prompt + completion})
    return out


def test_book_load_dataset_sft_and_rl(gsm8k_dir, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    tool = RLTrainingTool(workspace=tmp_path / "ws")
    sft = _call(tool, action="load_dataset", format="sft", split="train", max_samples=5, source=str(gsm8k_dir))
    assert sft["status"] == "success" and sft["format"] == "sft" and sft["split"] == "train"
    assert sft["dataset_size"] == 5 and sft["sample_keys"] == ["prompt", "completion"]
    example = sft["formatted_example"]
    assert example["prompt"][-1] == {"role": "user", "content": sft["example"]["question"]}
    assert example["completion"][0]["content"].endswith(f"Final Answer: {sft['example']['ground_truth']}")

    rl = _call(tool, action="load_dataset", format="rl", split="test", model_name=str(tiny_model_dir),
               source=str(gsm8k_dir))
    assert rl["dataset_size"] == 100                        # the book's default max_samples
    assert rl["sample_keys"] == ["question", "prompt", "ground_truth", "full_answer"]
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert rl["prompt_text"] == tokenizer.apply_chat_template(rl["formatted_example"]["prompt"], tokenize=False,
                                                              add_generation_prompt=True)
    assert rl["example"]["question"] in rl["prompt_text"]
    bad = _call(tool, action="load_dataset", format="chat", source=str(gsm8k_dir))
    assert bad["status"] == "error" and "'format' must be sft or rl" in bad["message"]


def test_book_create_reward_matches_the_book_formulas(tmp_path):
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    accuracy = _call(tool, action="create_reward", reward_type="accuracy")
    assert accuracy["status"] == "success" and accuracy["reward_type"] == "accuracy"
    assert accuracy["specs"] == ["accuracy:1.0"] and accuracy["functions"] == ["accuracy"]

    right_long = "4 * 3 = 12\n" + "I am sure. " * 4 + "\nFinal Answer: 12"      # 72 characters
    texts = [right_long, "Final Answer: 12", "Final Answer: 13"]
    length = _call(tool, action="create_reward", reward_type="length_penalty", penalty_weight=0.1, max_length=20,
                   completions=texts, ground_truth="12")
    assert length["penalty_weight"] == 0.1 and length["max_length"] == 20 and "20 characters" in length["description"]
    # The book: max(0, r - w * (L - L_max) / L_max) when L > L_max characters.
    expected = [max(0.0, 1.0 - 0.1 * (len(right_long) - 20) / 20), 1.0, 0.0]
    assert [s["total"] for s in length["scores"]] == pytest.approx(expected)
    assert 0 < expected[0] < 1
    if HELLO_AGENTS:  # the book's own implementation gives the same numbers
        from hello_agents.rl import create_accuracy_reward, create_length_penalty_reward

        book_fn = create_length_penalty_reward(create_accuracy_reward(), max_length=20, penalty_weight=0.1)
        assert book_fn(texts, ground_truth=["12"] * 3) == pytest.approx(expected)
    default = _call(tool, action="create_reward", reward_type="length_penalty")
    assert default["penalty_weight"] == 0.001 and default["max_length"] == 1024

    steps = "4 * 3 = 12\n12 + 1 = 13\n13 - 1 = 12\nFinal Answer: 12"
    step = _call(tool, action="create_reward", reward_type="step", completions=[steps], ground_truth="12")
    assert step["step_bonus"] == 0.1 and step["specs"] == ["step(beta=0.1,max_steps=5)"]
    assert step["scores"][0]["total"] == pytest.approx(1.3)        # the book: 1.0 + 0.1 x 3 newlines
    if HELLO_AGENTS:
        from hello_agents.rl import create_accuracy_reward, create_step_reward

        assert create_step_reward(create_accuracy_reward(), 0.1)([steps], ground_truth=["12"]) == pytest.approx([1.3])
    capped = _call(tool, action="create_reward", reward_type="step", step_bonus=0.25, completions=[steps],
                   ground_truth="12")
    assert capped["scores"][0]["total"] == pytest.approx(1.5)      # the book caps the bonus at 0.5

    for params, message in [({"reward_type": "fancy"}, "reward_type must be one of accuracy, length_penalty, step"),
                            ({"reward_type": "accuracy", "step_bonus": 0.1}, "'step_bonus' does not apply"),
                            ({"reward_type": "step", "rewards": ["format"]}, "not both"),
                            ({"reward_type": "length_penalty", "max_length": 0}, "positive integer")]:
        result = _call(tool, action="create_reward", **params)
        assert result["status"] == "error" and message in result["message"], (params, result)


def test_book_register_dataset_and_train_sft(tiny_model_dir, gsm8k_dir, tmp_path):
    import datasets

    tool = RLTrainingTool(workspace=tmp_path / "ws")
    raw = _gsm8k_rows(gsm8k_dir, 6)
    tool.register_dataset("my_sft", datasets.Dataset.from_list(_book_sft_rows(raw)))
    saved = [json.loads(line) for line in (tmp_path / "ws/datasets/my_sft/train.jsonl").read_text().splitlines()]
    assert [r["question"] for r in saved] == [r["question"] for r in raw]   # the book's prompt wrapper is removed
    assert [r["ground_truth"] for r in saved] == [r["answer"].split("####")[1].strip() for r in raw]

    out = tmp_path / "output" / "sft"
    result = _call(tool, action="train", algorithm="sft", model_name=str(tiny_model_dir), dataset="my_sft",
                   num_epochs=1, batch_size=4, max_samples=4, use_lora=False, output_dir=str(out),
                   use_tensorboard=True, use_wandb=False)
    assert result["status"] == "success", result
    assert result["model"] == str(tiny_model_dir) and result["num_epochs"] == 1 and result["dataset_size"] == 4
    assert result["output_dir"] == str(out) and result["metrics"]["global_step"] == 1   # 4 rows / batch 4, 1 epoch
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["full"] is True and written["epochs"] == 1.0 and written["max_steps"] == -1
    assert written["batch_size"] == 4 and written["max_train_samples"] == 4 and written["report_to"] == ["tensorboard"]
    assert written["model"] == str(tiny_model_dir) and written["dataset"] == str(tmp_path / "ws/datasets/my_sft")
    assert any((out / "tensorboard").rglob("events.out.tfevents.*"))


def test_book_grpo_with_custom_dataset_and_registered_reward(tiny_model_dir, gsm8k_dir, tmp_path):
    """The book's GRPO call: a dataset handed over as an object, and a reward registered under the dataset's name
    (the book's rule) that expects plain completion strings."""
    import datasets

    seen: list = []

    def brevity(completions, **kwargs):  # written for the book: string completions, ground_truth in kwargs
        seen.append((completions, kwargs["ground_truth"]))
        return [0.5 if isinstance(c, str) else -1.0 for c in completions]

    tool = RLTrainingTool(workspace=tmp_path / "ws")
    rl_rows = [{"question": r["question"], "ground_truth": r["answer"].split("####")[1].strip(),
                "full_answer": r["answer"], "prompt": r["question"]} for r in _gsm8k_rows(gsm8k_dir, 8)]
    tool.register_dataset("mini", datasets.Dataset.from_list(rl_rows))
    tool.register_reward_function("mini", brevity)
    result = _call(tool, action="train", algorithm="grpo", model_name=str(tiny_model_dir), dataset="mini",
                   num_epochs=1, max_samples=4, batch_size=4, use_lora=True, use_tensorboard=False,
                   num_generations=2, gradient_accumulation_steps=1, max_completion_length=8, heldout_every=0)
    assert result["status"] == "success", result
    written = yaml.safe_load((Path(result["output_dir"]) / "config.yaml").read_text())
    # 1 epoch of 4 prompts x 2 completions, 4 completions per optimizer step -> 2 steps
    assert written["max_steps"] == 2 and result["metrics"]["steps"] == 2 and result["dataset_size"] == 4
    assert written["max_train_samples"] == 4 and written["full"] is False and written["report_to"] == ["none"]
    assert len(written["rewards"]) == 1 and "IN_PROCESS_REWARDS.mini_" in written["rewards"][0]
    assert seen and all(isinstance(c, str) for batch, _ in seen for c in batch)
    assert {t for _, truths in seen for t in truths} <= {r["ground_truth"] for r in rl_rows}
    assert result["metrics"]["last_logged"]["grpo/reward/mini"] == pytest.approx(0.5)

    # custom_dataset / custom_reward as objects in the call itself; wandb_project reaches W&B (offline).
    result = _call(tool, action="train", algorithm="grpo", model_name=str(tiny_model_dir),
                   custom_dataset=datasets.Dataset.from_list(rl_rows[4:]), custom_reward=brevity, num_epochs=1,
                   batch_size=4, use_wandb=True, use_tensorboard=False, wandb_project="book-project",
                   num_generations=2, gradient_accumulation_steps=1, max_completion_length=8, heldout_every=0)
    assert result["status"] == "success", result
    assert result["custom_dataset"] == "custom_dataset_2" and result["custom_reward"] == "custom_reward_2"
    assert result["dataset_size"] == 4 and result["metrics"]["steps"] == 2
    assert result["config"]["report_to"] == ["wandb"]
    run_files = list(Path(result["output_dir"]).rglob("*.wandb"))
    assert run_files and b"book-project" in run_files[0].read_bytes()


def test_book_evaluate(tiny_model_dir, gsm8k_dir, tmp_path):
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    result = _call(tool, action="evaluate", model_path=str(tiny_model_dir), max_samples=2, dataset=str(gsm8k_dir))
    assert result["status"] == "success", result
    assert result["model_path"] == str(tiny_model_dir) and result["num_samples"] == 2 and result["split"] == "test"
    assert result["accuracy"] == result["metrics"]["accuracy_strict"]
    assert result["average_reward"] == result["metrics"]["avg_reward"] and result["device"] in ("cpu", "cuda")
    written = yaml.safe_load((Path(result["output_dir"]) / "config.yaml").read_text())
    assert written["max_new_tokens"] == 128 and written["eval_samples"] == 2   # the book's generation length


def test_book_keys_errors(tmp_path):
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    cases = [
        ({"action": "train", "model_name": "m", "num_epoch": 2}, "unknown train key 'num_epoch' for sft (did you "
                                                                  "mean 'num_epochs'?)"),
        ({"action": "train", "algorithm": "grpo", "model": "m", "bogus_key": 1}, "unknown train key 'bogus_key'"),
        ({"action": "train", "model_name": "m", "model": "m"}, "give 'model_name' (the book's name) or 'model'"),
        ({"action": "train", "model_name": "m", "use_lora": False, "full": True}, "'use_lora'"),
        ({"action": "train", "model_name": "m", "use_lora": "no"}, "'use_lora' must be true or false"),
        ({"action": "train", "model_name": "m", "custom_reward": "accuracy"}, "'custom_reward' belongs to "
                                                                               "algorithm grpo"),
        ({"action": "train", "model_name": "m", "num_epochs": 2, "max_steps": 5}, "'num_epochs' or 'max_steps'"),
        ({"action": "train", "model_name": "m", "use_wandb": True, "report_to": "none"}, "not both"),
        ({"action": "evaluate", "model_path": "m", "model": "m"}, "give 'model_path'"),
        ({"action": "load_dataset", "format": "sft", "model_nam": "m"}, "unknown load_dataset key 'model_nam'"),
        ({"action": "TRAIN", "algorithm": "PPO"}, "one of sft, grpo, rloo; got 'ppo'"),   # lower-cased as the book does
    ]
    for params, message in cases:
        result = _call(tool, **params)
        assert result["status"] == "error" and message in result["message"], (params, result)
    # Without 'action', a call in the book's words is a train call (the book's default action).
    result = _call(tool, model_name="m", num_epochs=0)
    assert result["action"] == "train" and "'num_epochs' must be a positive number" in result["message"]
    with pytest.raises(Exception, match="must be callable"):
        tool.register_reward_function("r", 3)
    assert not (tmp_path / "ws" / "runs").exists()   # nothing was trained or written by the failed calls


# --- Registration, names and places as the book and hello-agents use them ------------------------------------------

@pytest.mark.skipif(not HELLO_AGENTS, reason="hello-agents not installed")
def test_register_in_a_real_hello_agents_registry(tmp_path):
    from hello_agents.tools.registry import ToolRegistry

    from agentic_rl.integrations import hello_agents

    registry = ToolRegistry()
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    assert tool.register(registry) is tool and registry.get_tool("rl_training") is tool
    other = ToolRegistry()
    made = hello_agents.register(other, workspace=tmp_path / "ws2", name="trainer")
    assert other.get_tool("trainer") is made and made.workspace == tmp_path / "ws2"
    # the registered tool answers the registry's {"input": text} calls
    assert json.loads(other.execute_tool("trainer", '{"action": "status"}'))["runs"] == []
    # the schema an agent sees types the book's keys too (hello-agents' agents convert key=value text by it)
    props = made.to_openai_schema()["function"]["parameters"]["properties"]
    assert {k: props[k]["type"] for k in ("kl_coef", "lora_rank", "reward_config", "k", "return_details",
                                          "max_samples", "use_lora")} == {
        "kl_coef": "number", "lora_rank": "integer", "reward_config": "object", "k": "integer",
        "return_details": "boolean", "max_samples": "integer", "use_lora": "boolean"}
    with pytest.raises(ConfigError, match=r"^cannot register rl_training in a dict: a registry needs register_tool"):
        tool.register({})


def test_load_dataset_takes_dataset_as_train_and_evaluate_do(tmp_path):
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    train = _call(tool, action="load_dataset", dataset="synthetic", split="train", name="arith", max_samples=12,
                  max_operand=20)
    assert train["status"] == "success" and train["dataset"] == "arith" and train["num_rows"] == 12
    # the dataset's name loads another split of its source with its options, into the same folder
    test = _call(tool, action="load_dataset", dataset="arith", split="test", max_samples=5)
    assert test["status"] == "success", test
    assert test["dataset"] == "arith" and test["num_rows"] == 5 and test["path"] == train["path"]
    state = json.loads((tmp_path / "ws" / "rl_training_state.json").read_text())
    assert state["datasets"]["arith"]["options"]["max_operand"] == 20
    from agentic_rl.data.custom import load_task_dataset

    expected = load_task_dataset("synthetic", "test", max_samples=5, max_operand=20).to_list()
    saved = load_task_dataset(train["path"], "test").to_list()
    assert [r["question"] for r in saved] == [r["question"] for r in expected]
    # one setting, two names: not both; a name of rows handed over in memory is not a source
    both = _call(tool, action="load_dataset", dataset="synthetic", source="synthetic")
    assert both["status"] == "error" and "give 'dataset' or 'source'" in both["message"]
    tool.register_dataset("handed", [{"question": "What is 2 + 2?", "ground_truth": "4"}])
    handed = _call(tool, action="load_dataset", dataset="handed", split="test")
    assert handed["status"] == "error" and "holds only the rows handed to it" in handed["message"]


def test_output_dir_stays_inside_the_workspace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    for output_dir in ("../elsewhere", "./output/../../elsewhere"):
        result = _call(tool, action="train", algorithm="sft", model="m", dataset="synthetic", output_dir=output_dir)
        assert result["status"] == "error", result
        assert f"output_dir '{output_dir}' leaves the workspace" in result["message"]
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "ws" / "runs").exists()


def test_an_agents_key_value_text_is_read_as_numbers_and_flags(tmp_path):
    """hello-agents' agents pass ``key=value`` calls as text: numbers and true/false arrive as strings."""
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    made = _call(tool, action="create_reward", reward_type="length_penalty", penalty_weight="0.1", max_length="20")
    assert made["status"] == "success" and made["penalty_weight"] == 0.1 and made["max_length"] == 20
    loaded = _call(tool, action="load_dataset", dataset="synthetic", split="train", max_samples="6", seed="2")
    assert loaded["status"] == "success" and loaded["num_rows"] == 6
    bad = _call(tool, model_name="m", num_epochs="two")
    assert bad["action"] == "train" and "'num_epochs' must be a positive number, got 'two'" in bad["message"]
    flag = _call(tool, model_name="m", use_lora="maybe")
    assert "'use_lora' must be true or false" in flag["message"]


def test_a_call_without_action_is_a_train_call(tmp_path):
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    result = _call(tool, algorithm="grpo", model="m", num_generations=1)
    assert result["action"] == "train" and "num_generations" in result["message"]


# --- The documented calls, run as written (a tiny model, a few steps) -----------------------------------------------

def _docstring_calls() -> list[dict]:
    """The ``tool.run({...})`` calls of the module docstring's example, in order."""
    import ast
    import textwrap

    from agentic_rl.integrations import hello_agents

    doc = hello_agents.__doc__
    block = "\n".join(line for line in doc.split("\n\n", 2)[1].splitlines())
    tree = ast.parse(textwrap.dedent(block))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and ast.unparse(node.func) == "tool.run"]
    return [ast.literal_eval(call.args[0]) for call in sorted(calls, key=lambda c: c.lineno)]


#: How the example shrinks to a tiny model and a few steps: these keys replace (or join) the documented ones.
SHRINK = {"sft": {"max_steps": 2, "batch_size": 2, "lora_r": 4},
          "grpo": {"max_steps": 1, "num_generations": 2, "batch_size": 2, "gradient_accumulation_steps": 1,
                   "max_completion_length": 8, "lora_r": 4, "report_to": "none"},
          "evaluate": {"max_samples": 3, "max_new_tokens": 8, "batch_size": 3},
          "load_dataset": {"max_samples": 40}}


def test_the_module_docstring_example_runs_as_written(tiny_model_dir, tmp_path):
    calls = _docstring_calls()
    assert [c["action"] for c in calls] == ["load_dataset", "create_reward", "train", "train", "evaluate", "status"]
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    results = []
    for call in calls:
        call = dict(call)
        if call.get("model") == "Qwen/Qwen3-0.6B":
            call["model"] = str(tiny_model_dir)
        call.update(SHRINK.get(call.get("algorithm", call["action"]), {}))
        result = _call(tool, **call)
        assert result["status"] == "success", (call, result)
        results.append(result)
    load, reward, sft, grpo, evaluation, status = results
    assert sft["run"] == "sft_1" and grpo["run"] == "grpo_2" and evaluation["run"] == "eval_3"
    assert grpo["config"]["model"] == sft["model_dir"] and grpo["config"]["rewards"] == reward["specs"]
    # evaluate on the dataset loaded for training: its test split, from the same source, never the train rows
    assert evaluation["split"] == "test" and evaluation["metrics"]["num_prompts"] == 3
    assert sorted(p.name for p in Path(load["path"]).iterdir()) == ["test.jsonl", "train.jsonl"]
    train_questions = {json.loads(line)["question"] for line in (Path(load["path"]) / "train.jsonl").open()}
    predictions = (Path(evaluation["output_dir"]) / "predictions.jsonl").read_text().splitlines()
    assert not {json.loads(p)["question"] for p in predictions} & train_questions
    assert [r["name"] for r in status["runs"]] == ["sft_1", "grpo_2", "eval_3"]
    assert all(Path(r["output_dir"]).is_relative_to(tmp_path / "ws") for r in status["runs"])


def _small_rows(n: int) -> list[dict]:
    return [{"question": f"What is {i} + {i + 3}?", "ground_truth": str(2 * i + 3)} for i in range(n)]


def test_book_calls_on_a_small_registered_dataset(tiny_model_dir, tmp_path, monkeypatch):
    """The book's calls, as it writes them, on a dataset of 8 registered rows: nothing is refused for its size, the
    book's relative output_dir lands in the workspace, and the book's helper functions run the same calls."""
    from agentic_rl.integrations import hello_agents

    monkeypatch.chdir(tmp_path)
    ws = tmp_path / "ws"
    tool = RLTrainingTool(workspace=ws)
    tool.register_dataset("mini", _small_rows(8))
    tiny = {"num_generations": 2, "gradient_accumulation_steps": 1, "max_completion_length": 8}
    grpo = _call(tool, action="train", algorithm="grpo", model_name=str(tiny_model_dir), dataset="mini",
                 num_epochs=1, batch_size=4, output_dir="./output/grpo", use_tensorboard=False, **tiny)
    assert grpo["status"] == "success", grpo
    assert grpo["output_dir"] == str(ws / "output" / "grpo") and not (tmp_path / "output").exists()
    assert grpo["dataset_size"] == 8 and grpo["metrics"]["steps"] == 4   # every row trained on: 8 x 2 / 4
    assert grpo["config"]["eval_samples"] == 0 and grpo["config"]["heldout_every"] == 0

    sft = json.loads(hello_agents.train_with_sft(str(tiny_model_dir), max_samples=4, num_epochs=1,
                                                 workspace=ws, dataset="mini", use_tensorboard=False))
    assert sft["status"] == "success", sft
    assert sft["output_dir"] == str(ws / "output" / "sft") and sft["dataset_size"] == 4
    evaluation = json.loads(hello_agents.evaluate_model(sft["output_dir"] + "/model", max_samples=2, workspace=ws,
                                                        dataset="mini", split="train", max_new_tokens=8))
    assert evaluation["status"] == "success", evaluation
    assert evaluation["num_samples"] == 2 and isinstance(evaluation["accuracy"], float)
    # rows handed over have one split: evaluate reads them unless another split is asked for
    handed = json.loads(hello_agents.evaluate_model(sft["output_dir"], max_samples=2, workspace=ws, dataset="mini",
                                                    max_new_tokens=8))
    assert handed["status"] == "success" and handed["split"] == "train" and handed["num_samples"] == 2, handed
    refused = json.loads(hello_agents.evaluate_model(sft["output_dir"], workspace=ws, dataset="mini", split="test"))
    assert refused["status"] == "error" and "holds only the rows handed to it (split 'train')" in refused["message"]
    rl = json.loads(hello_agents.load_dataset("rl", "train", 5, workspace=ws, dataset="synthetic"))
    assert rl["status"] == "success" and rl["dataset_size"] == 5 and rl["format"] == "rl"
    step = json.loads(hello_agents.create_reward_function("step", workspace=ws, step_bonus=0.2))
    assert step["status"] == "success" and step["specs"] == ["step(beta=0.2,max_steps=2)"]


def test_a_small_dataset_holds_out_a_fifth_for_the_checks(tiny_model_dir, tmp_path, capsys):
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    tool.register_dataset("sixty", _small_rows(60))
    result = _call(tool, action="train", algorithm="grpo", model=str(tiny_model_dir), dataset="sixty", max_steps=1,
                   num_generations=2, batch_size=2, gradient_accumulation_steps=1, max_completion_length=8,
                   report_to="none")
    assert result["status"] == "success", result
    assert result["config"]["eval_samples"] == 12 and result["config"]["heldout_every"] > 0   # the preset's 100: 12
    assert "60 rows: 12 held out for the periodic checks (eval_samples), 48 to train on" in capsys.readouterr().err
    given = _call(tool, action="train", algorithm="grpo", model=str(tiny_model_dir), dataset="sixty", eval_samples=50,
                  max_steps=1, num_generations=2, batch_size=2, gradient_accumulation_steps=1, max_completion_length=8,
                  report_to="none")
    assert given["status"] == "success" and given["config"]["eval_samples"] == 50   # a given setting is kept


def test_the_books_train_keys_map_onto_settings_or_say_why_not(tmp_path):
    tool = RLTrainingTool(workspace=tmp_path / "ws")
    cases = [
        ({"algorithm": "sft", "model_name": "m", "kl_coef": 0.05}, "'kl_coef' belongs to algorithm grpo (beta)"),
        ({"algorithm": "sft", "model_name": "m", "reward_type": "accuracy"}, "'reward_type' belongs to algorithm grpo"),
        ({"algorithm": "grpo", "model_name": "m", "reward_type": "accuracy", "rewards": ["format"]}, "not both"),
        ({"algorithm": "grpo", "model_name": "m", "reward_type": "combined"}, "needs reward_config {'components'"),
        ({"algorithm": "grpo", "model_name": "m", "reward_type": "combined",
          "reward_config": {"components": [{"type": "fancy"}]}}, "reward_config component 1: reward_type must be one"),
        ({"algorithm": "grpo", "model_name": "m", "reward_type": "combined",
          "reward_config": {"components": [{"type": "step", "weight": "heavy"}]}}, "'weight' must be a number"),
        ({"algorithm": "grpo", "model_name": "m", "lora_rank": 8, "lora_r": 8}, "give 'lora_rank'"),
        ({"action": "evaluate", "model_path": "m", "use_lora": "perhaps"}, "'use_lora' must be true or false"),
        ({"action": "evaluate", "model_path": "m", "metrics": ["accuracy", "bleu"]}, "unknown metric 'bleu'"),
        ({"action": "evaluate", "model_path": "m", "k": 0}, "'k' must be a positive integer"),
        ({"action": "evaluate", "model_path": "m", "k": 2, "num_samples": 2}, "give 'k'"),
    ]
    for params, message in cases:
        result = _call(tool, **params)
        assert result["status"] == "error" and message in result["message"], (params, result)
    assert not (tmp_path / "ws" / "runs").exists()


def test_the_books_chapter_calls_run_as_written(tiny_model_dir, tmp_path, monkeypatch):
    """The Hello-Agents book's SFT, evaluation and GRPO calls (basic and complete) in sequence, each naming the
    previous model by its output_dir, on 12 registered rows (the machine is offline: the book's GSM8K is replaced by
    ``dataset``, and its sizes shrink to the tiny model's)."""
    monkeypatch.chdir(tmp_path)
    ws = tmp_path / "ws"
    tool = RLTrainingTool(workspace=ws)
    tool.register_dataset("mini", _small_rows(12))
    sft = _call(tool, action="train", algorithm="sft", model_name=str(tiny_model_dir), output_dir="./models/sft_full",
                dataset="mini", max_samples=None, num_epochs=1, batch_size=4, learning_rate=5e-5, warmup_ratio=0.1,
                weight_decay=0.01, use_lora=True, lora_rank=4, lora_alpha=8,
                lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], save_steps=500, logging_steps=1,
                eval_steps=500)
    assert sft["status"] == "success", sft
    assert sft["model_path"] == sft["model_dir"] and Path(sft["model_path"]).is_dir()
    assert sft["num_samples"] == 12 and isinstance(sft["final_loss"], float) and sft["final_loss"] > 0
    written = yaml.safe_load((ws / "models" / "sft_full" / "config.yaml").read_text())
    assert written["lora_r"] == 4 and written["lora_alpha"] == 8 and written["weight_decay"] == 0.01
    assert written["lora_target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"] and written["epochs"] == 1.0

    evaluation = _call(tool, action="evaluate", model_path="./models/sft_full", max_samples=2, use_lora=True,
                       dataset="mini", split="train", max_new_tokens=8)
    assert evaluation["status"] == "success", evaluation
    assert evaluation["model_path"] == sft["model_dir"] and evaluation["num_samples"] == 2

    tiny = {"dataset": "mini", "gradient_accumulation_steps": 1, "max_new_tokens": 8}
    basic = _call(tool, action="train", algorithm="grpo", model_name="./models/sft_full",
                  output_dir="./models/grpo_model", max_samples=4, num_epochs=1, batch_size=4, learning_rate=1e-5,
                  num_generations=2, kl_coef=0.05, use_lora=True, lora_rank=4, lora_alpha=8, reward_type="accuracy",
                  **tiny)
    assert basic["status"] == "success", basic
    assert basic["config"]["model"] == sft["model_dir"] and basic["config"]["beta"] == 0.05
    assert basic["config"]["rewards"] == ["accuracy:1.0"] and basic["config"]["max_completion_length"] == 8
    assert basic["num_samples"] == 4 and isinstance(basic["average_reward"], float)

    complete = _call(tool, action="train", algorithm="grpo", model_name="./models/sft_full",
                     output_dir="./models/grpo_full", max_samples=None, num_epochs=1, batch_size=4,
                     learning_rate=1e-5, warmup_ratio=0.1, num_generations=2, temperature=0.8, kl_coef=0.05,
                     clip_range=0.2, use_lora=True, lora_rank=4, lora_alpha=8, reward_type="combined",
                     reward_config={"components": [{"type": "accuracy", "weight": 1.0},
                                                   {"type": "length_penalty", "weight": 0.5, "target_length": 200},
                                                   {"type": "step", "weight": 0.3, "step_bonus": 0.1}]},
                     save_steps=500, logging_steps=1, eval_steps=3, **tiny)
    assert complete["status"] == "success", complete
    config = complete["config"]
    assert config["heldout_every"] == 3 and config["eval_samples"] == 2   # checks asked for: a fifth of 12 rows
    assert config["epsilon"] == 0.2 and config["temperature"] == 0.8 and config["warmup_ratio"] == 0.1
    assert config["rewards"] == ["accuracy:1.0", "length(alpha=5.0e-06,target_length=200):0.5",
                                 "step(beta=0.1,max_steps=5):0.3"]
    assert complete["dataset_size"] == 10 and complete["metrics"]["steps"] == 5   # 10 prompts x 2 / 4 per step
    assert complete["metrics"]["heldout_last"]["n"] == 2

    # The book's analysis: chosen metrics, accuracy@k and the details of every answer, by the returned output_dir.
    analysed = _call(tool, action="evaluate", model_path=complete["output_dir"], max_samples=3, use_lora=True,
                     metrics=["accuracy", "accuracy_at_k", "average_length", "average_steps", "format_correctness"],
                     k=2, return_details=True, dataset="mini", split="train", max_new_tokens=8)
    assert analysed["status"] == "success", analysed
    metrics = analysed["metrics"]
    assert analysed["model_path"] == complete["model_dir"] and analysed["num_samples"] == 3
    assert len(analysed["details"]) == 6 and analysed["accuracy_at_k"] == metrics["pass@2"]   # 3 problems x 2
    assert analysed["errors"] == [d for d in analysed["details"] if not d["correct"]]
    assert analysed["average_length"] == metrics["avg_tokens"] and analysed["average_steps"] == metrics["avg_steps"]
    assert analysed["format_correctness"] == metrics["format_rate"]
    assert {d["ground_truth"] for d in analysed["details"]} <= {r["ground_truth"] for r in _small_rows(12)}
    written = yaml.safe_load((Path(analysed["output_dir"]) / "config.yaml").read_text())
    assert written["num_samples"] == 2 and written["temperature"] == 0.7 and written["pass_at_k"] == [1, 2]

    # A train call on a registered dataset follows the book's rules: the reward registered under its name.
    seen = []
    tool.register_reward_function("mini", lambda completions, **kw: seen.append(len(completions)) or
                                  [0.25] * len(completions))
    ruled = _call(tool, action="train", algorithm="grpo", model=sft["model_dir"], dataset="mini",
                  output_dir="./models/custom_grpo", max_steps=1, num_generations=2, batch_size=2,
                  gradient_accumulation_steps=1, max_completion_length=8)
    assert ruled["status"] == "success", ruled
    assert "IN_PROCESS_REWARDS.mini_" in ruled["config"]["rewards"][0] and seen
    assert not (tmp_path / "models").exists() and sorted(p.name for p in (ws / "models").iterdir()) == [
        "custom_grpo", "grpo_full", "grpo_model", "sft_full"]
