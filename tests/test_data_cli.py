"""`agentic-rl data preview|stats` through the real CLI entry point, and its one-line errors."""

import json

import pytest

from agentic_rl.cli import main
from agentic_rl.data import SYSTEM_PROMPT, load_task_dataset
from agentic_rl.data.cli import DataCommandConfig, run


def run_cli(capsys, *argv):
    code = main(["data", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_stats_on_synthetic_defaults(capsys):
    code, out, err = run_cli(capsys, "stats", "--synthetic-train-size", "300")
    assert code == 0, err
    ds = load_task_dataset("synthetic", "train", synthetic_train_size=300)
    assert "rows: 300" in out
    for k in (1, 2, 3):
        count = ds["num_steps"].count(k)
        assert f"{k:>3} | " in out and f" {count} (" in out
    answers = [int(a) for a in ds["ground_truth"]]
    assert f"answers: min {min(answers)}," in out and f"max {max(answers)};" in out


def test_stats_on_real_gsm8k(capsys, gsm8k_dir):
    code, out, err = run_cli(capsys, "stats", "--source", str(gsm8k_dir), "--split", "test")
    assert code == 0, err
    assert "rows: 1319" in out and "answers: min -10," in out and "100.0% integers" in out


def test_run_returns_the_numbers(gsm8k_dir):
    result = run(DataCommandConfig(action="stats", source=str(gsm8k_dir), split="test", max_samples=200, seed=3))
    ds = load_task_dataset(str(gsm8k_dir), "test", max_samples=200, seed=3)
    assert result["rows"] == 200
    assert result["steps_histogram"] == {k: ds["num_steps"].count(k) for k in sorted(set(ds["num_steps"]))}
    assert result["answer_max"] == max(float(a) for a in ds["ground_truth"])


def test_preview_shows_messages_and_completion(capsys):
    code, out, err = run_cli(capsys, "preview", "--n", "2", "--split", "test", "--min-steps", "2", "--max-steps", "2")
    assert code == 0, err
    ds = load_task_dataset("synthetic", "test", min_steps=2, max_steps=2)
    assert out.count("=== row ") == 2 and out.count(f"[system] {SYSTEM_PROMPT}") == 2
    for row in ds.select(range(2)):
        assert f"[user] {row['question']}" in out
        assert f"[assistant] {row['solution']}" in out and "· 2 steps ===" in out


def test_preview_with_a_tokenizer_renders_the_chat_template(capsys, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "<eos>": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>")
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    fast.save_pretrained(tmp_path / "tok")
    code, out, err = run_cli(capsys, "preview", "--n", "1", "--model", str(tmp_path / "tok"))
    assert code == 0, err
    row = load_task_dataset("synthetic", "train")[0]
    assert f"<|system|>{SYSTEM_PROMPT}\n<|user|>{row['question']}\n<|assistant|>{row['solution']}<eos>" in out


def _one_line_error(capsys, *argv):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_bad_inputs_give_one_line_errors(capsys, tmp_path):
    line = _one_line_error(capsys, "stats", "--source", str(tmp_path / "missing.jsonl"))
    assert "data file not found" in line and "missing.jsonl" in line

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a?", "answer": "#### 1"}\n{"question": "b?", "answer": "#### 2"\n')
    line = _one_line_error(capsys, "preview", "--source", str(bad))
    assert "bad.jsonl line 2: malformed JSON" in line

    cols = tmp_path / "cols.jsonl"
    cols.write_text(json.dumps({"problem": "a?", "answer": "#### 1"}) + "\n")
    line = _one_line_error(capsys, "stats", "--source", str(cols), "--question-field", "question")
    assert "cols.jsonl line 1: missing field 'question'" in line

    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"question": "a?", "answer": "#### 1"}) + "\n"
                     + json.dumps({"question": "b?", "answer": ""}) + "\n")
    line = _one_line_error(capsys, "stats", "--source", str(empty))
    assert "empty.jsonl line 2: field 'answer' (the answer) is empty" in line

    line = _one_line_error(capsys, "preview", "--model", str(tmp_path / "no-model"))
    assert "cannot load a tokenizer" in line

    line = _one_line_error(capsys, "stats", "--source", "openai/gsm8k")
    assert "openai/gsm8k" in line and "local file or folder" in line


def test_action_choices_are_enforced(capsys):
    with pytest.raises(SystemExit):
        main(["data", "describe"])
