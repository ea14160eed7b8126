"""evaluate_model / run / the CLI on the tiny model: determinism, outputs, scoring, comparison, datasets."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import eval_config

from agentic_rl.data.formats import build_prompt
from agentic_rl.errors import ConfigError
from agentic_rl.eval import EvalConfig, evaluate_model, flatten_metrics, run, write_comparison_report
from agentic_rl.eval.evaluate import load_rows, score_completions
from agentic_rl.models.generate import GenerationResult


def _without_timing(metrics):
    return {k: v for k, v in metrics.items() if k != "timing"}


@pytest.fixture(scope="module")
def varied_model(tiny_model_dir):
    """The tiny model with weights scaled up so greedy outputs vary (an untouched random init repeats one token)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(8.0)
    return model, tok


def test_metrics_deterministic_across_two_runs(tiny_model_dir, varied_model, tmp_path):
    kwargs = dict(eval_samples=6, max_new_tokens=16, seed=3)
    a = evaluate_model(str(tiny_model_dir), "synthetic", **kwargs)
    b = evaluate_model(str(tiny_model_dir), "synthetic", **kwargs)
    assert _without_timing(a) == _without_timing(b)
    model, tok = varied_model
    c = evaluate_model(model, "synthetic", tokenizer=tok, **kwargs)
    d = evaluate_model(model, "synthetic", tokenizer=tok, **kwargs)
    assert _without_timing(c) == _without_timing(d)
    assert c["num_prompts"] == 6 and len(c["predictions"]) == 6
    assert [p["question"] for p in c["predictions"]] == [p["question"] for p in a["predictions"]]  # same sample
    # a random model: wrong everywhere, every wrong completion categorised
    assert c["accuracy_strict"] == 0.0
    assert sum(c["errors"]["counts"].values()) == 6
    assert all(p["category"] in ("format", "calculation", "understanding", "reasoning") for p in c["predictions"])
    assert c["avg_tokens"] == pytest.approx(sum(p["num_tokens"] for p in c["predictions"]) / 6)


def test_sampling_gives_pass_at_k_and_is_seeded(varied_model):
    model, tok = varied_model
    kw = dict(eval_samples=3, max_new_tokens=8, num_samples=4, temperature=1.0, seed=1, tokenizer=tok)
    a = evaluate_model(model, "synthetic", **kw)
    b = evaluate_model(model, "synthetic", **kw)
    assert _without_timing(a) == _without_timing(b)
    assert {"pass@1", "pass@2", "pass@4"} <= set(a) and a["num_completions"] == 12
    assert sorted({(p["index"], p["sample"]) for p in a["predictions"]}) == [(i, j) for i in range(3)
                                                                             for j in range(4)]


def test_score_completions_hand_made(tmp_path):
    config = EvalConfig(dataset="synthetic", eval_samples=3, seed=0)
    rows = load_rows(config)
    prompts = [build_prompt(r["question"]) for r in rows]
    right = rows[0]["solution"]  # the reference in our format: correct, well formed
    no_marker = "\n".join(rows[1]["steps"])  # right steps, no final answer line
    wrong_calc = "2 + 2 = 5\nFinal Answer: 5"
    gens = [[GenerationResult(right, 20, False)], [GenerationResult(no_marker, 30, True)],
            [GenerationResult(wrong_calc, 10, False)]]
    records = score_completions(rows, prompts, gens, config)
    assert [r["correct_strict"] for r in records] == [True, False, False]
    assert [r["correct_lenient"] for r in records] == [True, True, False]  # the last number is the answer
    assert [r["category"] for r in records] == [None, "format", "calculation"]
    assert records[0]["rewards"] == {"accuracy": 1.0, "format": 1.0}
    assert records[0]["reward"] == pytest.approx(1.2)
    assert records[0]["format_ok"] and not records[1]["format_ok"]
    assert records[0]["steps"] == rows[0]["num_steps"]
    assert records[2]["abs_error"] == pytest.approx(abs(5 - float(rows[2]["ground_truth"])))
    assert records[1]["abs_error"] is None  # no strict answer: no numeric error
    assert records[1]["truncated"] and records[1]["num_tokens"] == 30


def test_outputs_and_training_mode(varied_model, tmp_path):
    model, tok = varied_model
    model.train()
    metrics = evaluate_model(model, "synthetic", tokenizer=tok, eval_samples=4, max_new_tokens=8,
                             output_dir=tmp_path / "run", name="varied")
    assert model.training
    model.eval()
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert "predictions" not in saved
    assert saved["accuracy_strict"] == metrics["accuracy_strict"] and saved["model"] == "varied"
    lines = (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()
    assert len(lines) == 4
    pred = json.loads(lines[0])
    for key in ("prompt", "completion", "extracted_strict", "ground_truth", "rewards", "category"):
        assert key in pred
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## By difficulty" in report and "## Error analysis" in report and "accuracy_strict" in report
    for png in ("accuracy_by_difficulty.png", "error_categories.png", "length_histogram.png"):
        assert (tmp_path / "run" / png).read_bytes()[:4] == b"\x89PNG"
    flat = flatten_metrics(metrics)
    assert flat["eval/accuracy_strict"] == metrics["accuracy_strict"]
    assert any(k.startswith("eval/errors/") for k in flat)


def test_run_two_models_comparison_and_cli(tiny_model_dir, varied_model, tmp_path):
    from agentic_rl.cli import main

    model, tok = varied_model
    other = tmp_path / "varied"
    model.save_pretrained(other)
    tok.save_pretrained(other)
    out = tmp_path / "cmp"
    rc = main(["eval", str(tiny_model_dir), str(other), "--eval-samples", "3", "--max-new-tokens", "6",
               "--output-dir", str(out)])
    assert rc == 0
    table = (out / "comparison.md").read_text()
    assert "| varied |" in table and f"| {tiny_model_dir.name} |" in table
    assert (out / "varied" / "metrics.json").is_file() and (out / tiny_model_dir.name / "report.md").is_file()
    result = run(eval_config(other, tmp_path / "one"))
    assert result["results"]["varied"]["num_prompts"] == 2
    assert result["models"][str(other)] is result["results"]["varied"]
    assert (tmp_path / "one" / "metrics.json").is_file()


def test_cli_errors_are_one_line(capsys, tmp_path):
    from agentic_rl.cli import main

    assert main(["eval", "--eval-samples", "2"]) == 2
    assert "error: give at least one model" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "missing"), "--num-samples", "4"]) == 2
    assert "needs --temperature" in capsys.readouterr().err


def test_unknown_keyword_and_missing_tokenizer(varied_model):
    model, tok = varied_model
    with pytest.raises(ConfigError, match="max_sample"):
        evaluate_model(model, "synthetic", tokenizer=tok, max_sample=3)
    with pytest.raises(ConfigError, match="tokenizer"):
        evaluate_model(model, "synthetic", eval_samples=2)


def test_local_gsm8k_rows_and_difficulty(gsm8k_dir, varied_model):
    model, tok = varied_model
    metrics = evaluate_model(model, str(gsm8k_dir), tokenizer=tok, eval_samples=5, max_new_tokens=4, seed=0)
    assert metrics["num_prompts"] == 5
    assert sum(b["num_prompts"] for b in metrics["by_difficulty"].values()) == 5
    assert all(p["reference_steps"] >= 1 for p in metrics["predictions"])


def test_write_comparison_report_standalone(tmp_path):
    base = {"accuracy_strict": 0.1, "accuracy_lenient": 0.2, "pass@1": 0.1,
            "by_difficulty": {"easy": {"accuracy_strict": 0.2}, "hard": {"accuracy_strict": 0.0}},
            "errors": {"counts": {"format": 5, "calculation": 1, "understanding": 0, "reasoning": 2}}}
    grpo = {**base, "accuracy_strict": 0.6, "by_difficulty": {"easy": {"accuracy_strict": 0.8}}}
    path = write_comparison_report({"base": base, "grpo": grpo}, tmp_path)
    text = path.read_text()
    assert "| base | 0.100 | 0.200 |" in text and "| grpo | 0.600 |" in text
    assert "| grpo | 0.800 | – |" in text  # a bucket a model lacks is shown as missing, not zero
    assert (tmp_path / "comparison_accuracy_by_difficulty.png").is_file()


def test_reference_step_count_from_rl_rows():
    from agentic_rl.eval.evaluate import reference_step_count

    assert reference_step_count({"num_steps": 4}) == 4
    assert reference_step_count({"steps": ["a = 1", "b = 2"]}) == 2
    rl_row = {"full_answer": "48/2 = <<48/2=24>>24\n48+24 = <<48+24=72>>72\n#### 72"}  # to_rl_dataset rows
    assert reference_step_count(rl_row) == 2
    assert reference_step_count({"answer": "12 + 7 = 19\n19 - 5 = 14\n14 * 2 = 28\nFinal Answer: 28"}) == 3
    assert reference_step_count({"question": "q", "ground_truth": "3"}) is None


def test_rl_rows_in_memory(varied_model):
    """GRPO's held-out rows (to_rl_dataset: question, prompt messages, ground_truth, full_answer) evaluate as is."""
    from agentic_rl.data.custom import load_task_dataset
    from agentic_rl.data.gsm8k import to_rl_dataset

    model, tok = varied_model
    rl = to_rl_dataset(load_task_dataset("synthetic", "test", max_samples=3, seed=0))
    rows = [{k: v for k, v in r.items() if k != "question"} for r in rl.to_list()]  # prompt-only rows too
    metrics = evaluate_model(model, rows, tokenizer=tok, max_new_tokens=4)
    assert metrics["num_prompts"] == 3
    assert [p["question"] for p in metrics["predictions"]] == [r["question"] for r in rl.to_list()]
    assert all(p["reference_steps"] is not None for p in metrics["predictions"])
