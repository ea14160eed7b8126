"""GSM8K: every real row parses, local formats load the same rows, SFT / RL rows carry exactly their fields."""

import json
import re

import pytest

from agentic_rl.data import SYSTEM_PROMPT, build_prompt, load_gsm8k, parse_gsm8k_answer, to_rl_dataset, to_sft_dataset
from agentic_rl.data.gsm8k import normalize_number
from agentic_rl.errors import DataError

NUMBER = re.compile(r"-?\d+(\.\d+)?")


@pytest.fixture(scope="module")
def gsm8k(gsm8k_dir):
    return {split: load_gsm8k(str(gsm8k_dir), split) for split in ("train", "test")}


def test_all_real_rows_parse_with_numeric_ground_truth(gsm8k, gsm8k_dir):
    assert (len(gsm8k["train"]), len(gsm8k["test"])) == (7473, 1319)
    raw = {s: [json.loads(line) for line in open(gsm8k_dir / f"{s}.jsonl")] for s in ("train", "test")}
    for split, ds in gsm8k.items():
        assert set(ds.column_names) >= {"question", "answer", "ground_truth", "num_steps", "steps", "solution"}
        for row, original in zip(ds, raw[split]):
            assert row["answer"] == original["answer"]  # as given
            expected = original["answer"].rsplit("####", 1)[1].strip().replace(",", "")
            assert row["ground_truth"] == expected
            assert NUMBER.fullmatch(row["ground_truth"])
            assert row["num_steps"] == len(row["steps"]) >= 1
            assert not any("<<" in s or ">>" in s or "####" in s for s in row["steps"])
            assert row["solution"] == "\n".join(row["steps"] + [f"Final Answer: {row['ground_truth']}"])
    # the normalisation was exercised by real rows
    assert any("," in a.rsplit("####", 1)[1] for a in gsm8k["train"]["answer"])


def test_parse_gsm8k_answer():
    answer = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n\n"
              "Natalia sold 48+24 = <<48+24=72>>72 clips.\n#### 1,072")
    parsed = parse_gsm8k_answer(answer)
    assert parsed == {"steps": ["Natalia sold 48/2 = 24 clips in May.", "Natalia sold 48+24 = 72 clips."],
                      "final_answer": "1072", "num_steps": 2,
                      "solution_text": "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips.\n"
                                       "Final Answer: 1072"}
    kept = parse_gsm8k_answer(answer, keep_annotations=True)
    assert kept["steps"][0] == "Natalia sold 48/2 = <<48/2=24>>24 clips in May."
    assert parse_gsm8k_answer("a #### b\n#### 5")["final_answer"] == "5"  # text after the LAST ####
    assert parse_gsm8k_answer("#### 7")["num_steps"] == 0


@pytest.mark.parametrize("text,expected", [("1,000", "1000"), (" $5.50 ", "5.5"), ("+3", "3"), ("7.", "7"),
                                           ("-10", "-10"), ("0.50", "0.5"), ("007", "7"), ("abc", "abc")])
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize("answer,match", [("", "empty"), ("   ", "empty"), ("no final line", "####"),
                                          ("steps\n####   ", "nothing after")])
def test_bad_answers_raise(answer, match):
    with pytest.raises(DataError, match=match):
        parse_gsm8k_answer(answer)


def _sample_rows(gsm8k_dir, n=12):
    with open(gsm8k_dir / "test.jsonl") as fh:
        return [json.loads(next(fh)) for _ in range(n)]


def test_local_formats_and_folders_load_the_same_rows(gsm8k_dir, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _sample_rows(gsm8k_dir)
    reference = load_gsm8k(str(gsm8k_dir / "test.jsonl"), max_samples=None).select(range(12)).to_list()

    (tmp_path / "a.json").write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    import csv

    with open(tmp_path / "a.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["question", "answer"])
        writer.writeheader()
        writer.writerows(rows)
    for name in ("a.json", "a.parquet", "a.csv"):
        assert load_gsm8k(str(tmp_path / name)).to_list() == reference, name

    # a folder with train/test files, and a hub-snapshot layout (config/split-shard.parquet)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "train.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert load_gsm8k(str(folder), "test").to_list() == reference
    assert len(load_gsm8k(str(folder), "train")) == 1
    snap = tmp_path / "snapshot" / "main"
    snap.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows[:6]), snap / "test-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(rows[6:]), snap / "test-00001-of-00002.parquet")
    assert load_gsm8k(str(tmp_path / "snapshot"), "test").to_list() == reference
    with pytest.raises(DataError, match="no 'validation' file"):
        load_gsm8k(str(folder), "validation")


def test_keep_annotations_and_seeded_sampling(gsm8k_dir):
    kept = load_gsm8k(str(gsm8k_dir), "test", keep_annotations=True, max_samples=50, seed=1)
    assert any("<<" in s for row in kept for s in row["steps"])
    a = load_gsm8k(str(gsm8k_dir), "test", max_samples=50, seed=1)
    assert a["question"] == kept["question"] and len(a) == 50
    assert a["question"] == load_gsm8k(str(gsm8k_dir), "test", max_samples=50, seed=1)["question"]
    b = load_gsm8k(str(gsm8k_dir), "test", max_samples=50, seed=2)
    first = load_gsm8k(str(gsm8k_dir), "test").select(range(50))
    assert a["question"] != b["question"] and a["question"] != first["question"]


def test_hub_offline_is_one_line_error_suggesting_a_local_path(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError) as info:
        load_gsm8k("openai/gsm8k", "train")
    message = str(info.value)
    assert "\n" not in message and "openai/gsm8k" in message and "local file or folder" in message


def test_malformed_line_and_missing_field_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q2", "answer": \n')
    with pytest.raises(DataError, match=r"bad.jsonl line 2: malformed JSON"):
        load_gsm8k(str(path))
    path.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q2"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl line 2: missing field 'answer'"):
        load_gsm8k(str(path))
    path.write_text('{"question": "q", "answer": "#### many"}\n')
    with pytest.raises(DataError, match=r"line 1: field 'answer': final answer 'many' is not a number"):
        load_gsm8k(str(path))
    with pytest.raises(DataError, match="data file not found"):
        load_gsm8k(str(tmp_path / "nope.jsonl"))


def test_sft_and_rl_rows_carry_exactly_their_fields(gsm8k):
    ds = gsm8k["train"]
    sft = to_sft_dataset(ds)
    assert sft.column_names == ["prompt", "completion"] and len(sft) == len(ds)
    assert to_sft_dataset(ds.select(range(3)), with_text=True).column_names == ["prompt", "completion", "text"]
    rl = to_rl_dataset(ds)
    assert rl.column_names == ["question", "prompt", "ground_truth", "full_answer"] and len(rl) == len(ds)
    for i in (0, 1234, len(ds) - 1):
        row = ds[i]
        assert sft[i]["prompt"] == build_prompt(row["question"]) == rl[i]["prompt"]
        assert sft[i]["prompt"][0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert sft[i]["completion"] == [{"role": "assistant", "content": row["solution"]}]
        assert rl[i]["ground_truth"] == row["ground_truth"] and rl[i]["full_answer"] == row["answer"]
    custom = to_sft_dataset(ds.select(range(2)), system_prompt=None)
    assert [m["role"] for m in custom[0]["prompt"]] == ["user"]


def test_answer_only_fraction_drops_steps_from_a_seeded_share():
    rows = [{"question": f"What is {i} + 1?", "steps": [f"{i} + 1 = {i + 1}"], "ground_truth": str(i + 1)}
            for i in range(200)]
    sft = to_sft_dataset(rows, answer_only_fraction=0.3, seed=4)
    completions = [r["completion"][0]["content"] for r in sft]
    short = [i for i, c in enumerate(completions) if "\n" not in c]
    assert len(short) == 60
    for i, c in enumerate(completions):
        assert c == (f"Final Answer: {i + 1}" if i in short else f"{i} + 1 = {i + 1}\nFinal Answer: {i + 1}")
    again = to_sft_dataset(rows, answer_only_fraction=0.3, seed=4)
    assert [r["completion"] for r in again] == [r["completion"] for r in sft]
    other = to_sft_dataset(rows, answer_only_fraction=0.3, seed=5)
    assert [r["completion"] for r in other] != [r["completion"] for r in sft]
    assert all("\n" in r["completion"][0]["content"] for r in to_sft_dataset(rows))
    with pytest.raises(DataError):
        to_sft_dataset(rows, answer_only_fraction=1.5)


def test_answer_first_fraction_moves_the_final_line_before_the_steps_in_a_disjoint_share():
    rows = [{"question": f"What is {i} + 1 - 1?", "steps": [f"{i} + 1 = {i + 1}", f"{i + 1} - 1 = {i}"],
             "ground_truth": str(i)} for i in range(200)]
    sft = to_sft_dataset(rows, answer_only_fraction=0.2, answer_first_fraction=0.5, seed=3)
    completions = [r["completion"][0]["content"] for r in sft]
    kinds = {"first": 0, "only": 0, "last": 0}
    for i, c in enumerate(completions):
        steps = f"{i} + 1 = {i + 1}\n{i + 1} - 1 = {i}"
        if c == f"Final Answer: {i}\n{steps}":
            kinds["first"] += 1
        elif c == f"Final Answer: {i}":
            kinds["only"] += 1
        else:
            assert c == f"{steps}\nFinal Answer: {i}"
            kinds["last"] += 1
    assert kinds == {"first": 100, "only": 40, "last": 60}
    with pytest.raises(DataError, match="at most 1"):
        to_sft_dataset(rows, answer_only_fraction=0.6, answer_first_fraction=0.5)


def test_system_prompt_setting_resolves_to_standard_none_or_custom():
    from agentic_rl.data.formats import resolve_system_prompt

    assert resolve_system_prompt(None) == SYSTEM_PROMPT
    assert resolve_system_prompt("") is None
    assert resolve_system_prompt("Be brief.") == "Be brief."
    assert [m["role"] for m in build_prompt("Q?", resolve_system_prompt(""))] == ["user"]
