"""Custom datasets: sources, column mapping, validation errors naming file / row / field, seeded sampling."""

import json
import sys

import pytest

from conftest import detail_sentences

from agentic_rl.data import generate_synthetic, load_gsm8k, load_task_dataset, register_dataset, to_rl_dataset
from agentic_rl.data.custom import parse_answer_text
from agentic_rl.errors import ConfigError, DataError

COLUMNS = ["question", "answer", "ground_truth", "num_steps", "steps", "solution"]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_synthetic_source_is_deterministic_with_disjoint_splits():
    train = load_task_dataset("synthetic", "train", synthetic_train_size=300, synthetic_test_size=100,
                              synthetic_seed=3)
    test = load_task_dataset("synthetic", "test", synthetic_train_size=300, synthetic_test_size=100,
                             synthetic_seed=3)
    assert train.column_names == COLUMNS and (len(train), len(test)) == (300, 100)
    assert not set(train["question"]) & set(test["question"])
    assert train.to_list() == load_task_dataset("synthetic", "train", synthetic_train_size=300,
                                                synthetic_test_size=100, synthetic_seed=3).to_list()
    assert test["question"] == load_task_dataset("synthetic", "test", synthetic_test_size=100,
                                                 synthetic_seed=3)["question"]
    # the training seed only drives sampling: every run sees the same task, whatever its seed
    assert load_task_dataset("synthetic", "test", synthetic_test_size=100, synthetic_seed=3,
                             seed=7)["question"] == test["question"]
    assert load_task_dataset("synthetic", "test", synthetic_test_size=100)["question"] != test["question"]
    sampled = load_task_dataset("synthetic", "test", synthetic_test_size=100, synthetic_seed=3, max_samples=20,
                                seed=7)["question"]
    assert set(sampled) < set(test["question"]) and len(sampled) == 20
    for row in train:
        assert row["solution"].endswith(f"Final Answer: {row['ground_truth']}")
        assert row["steps"][-1].endswith(f"= {row['ground_truth']}") and 1 <= row["num_steps"] <= 3
    one_step = load_task_dataset("synthetic", "test", synthetic_test_size=50, min_steps=1, max_steps=1)
    assert set(one_step["num_steps"]) == {1}
    mult = load_task_dataset("synthetic:multiplication", "test", synthetic_test_size=30)
    assert all(" * " in r["steps"][0] and int(r["ground_truth"]) >= 100 for r in mult)
    with pytest.raises(DataError, match="splits 'train' and 'test'"):
        load_task_dataset("synthetic", "validation")
    with pytest.raises(ConfigError, match="only apply to source 'synthetic'"):
        load_task_dataset("some/hub-id", "train", max_steps=2)


def test_every_problem_of_the_distractor_task_holds_one_detail_sentence():
    for split in ("train", "test"):
        rows = load_task_dataset("synthetic:multiplication-distractor", split, synthetic_train_size=300,
                                 synthetic_test_size=300).to_list()
        assert {r["num_steps"] for r in rows} == {1, 2}
        for row in rows:
            assert sum(len(d.findall(row["question"])) for d in detail_sentences()) == 1, row["question"]
            assert " * " in row["steps"][0]


def test_gsm8k_folder_through_the_generic_loader_matches_load_gsm8k(gsm8k_dir):
    a = load_task_dataset(str(gsm8k_dir), "test", max_samples=40, seed=9)
    b = load_gsm8k(str(gsm8k_dir), "test", max_samples=40, seed=9)
    assert a.to_list() == b.to_list()


def test_column_mapping_question_answer(tmp_path):
    rows = [{"problem": "What is 2 + 3?", "sol": "2 + 3 = 5\nFinal Answer: 5", "id": 1},
            {"problem": "What is 10 / 4?", "sol": "10 / 4 = 2.5\nFinal answer: 2.50", "id": 2},
            {"problem": "How many?", "sol": "Step one <<1+1=2>>2\n#### 1,000", "id": 3}]
    ds = load_task_dataset(write_jsonl(tmp_path / "d.jsonl", rows), question_field="problem", answer_field="sol")
    assert ds.column_names == COLUMNS
    assert ds["ground_truth"] == ["5", "2.5", "1000"]
    assert ds["steps"] == [["2 + 3 = 5"], ["10 / 4 = 2.5"], ["Step one 2"]]
    assert ds["answer"] == [r["sol"] for r in rows]  # as given
    assert ds[1]["solution"] == "10 / 4 = 2.5\nFinal Answer: 2.5"


def test_prompt_completion_messages_and_prompt_ground_truth(tmp_path):
    rows = [{"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 6 * 7?"}],
             "completion": [{"role": "assistant", "content": "6 * 7 = 42\nFinal Answer: 42"}]}]
    ds = load_task_dataset(write_jsonl(tmp_path / "pc.jsonl", rows), prompt_field="prompt",
                           completion_field="completion")
    assert ds[0]["question"] == "What is 6 * 7?" and ds[0]["ground_truth"] == "42" and ds[0]["steps"] == ["6 * 7 = 42"]
    # auto-detected columns without any mapping
    assert load_task_dataset(str(tmp_path / "pc.jsonl"))[0]["ground_truth"] == "42"

    rows = [{"q": "How far?", "target": 12}, {"q": "How long?", "target": "3.0"}]
    ds = load_task_dataset(write_jsonl(tmp_path / "pg.jsonl", rows), question_field="q", ground_truth_field="target")
    assert ds["ground_truth"] == ["12", "3"] and ds["steps"] == [[], []] and ds["answer"] == ["", ""]
    rl = to_rl_dataset(ds, full_answer_field="solution")
    assert rl.column_names == ["question", "prompt", "ground_truth", "full_answer"]
    assert rl[0]["full_answer"] == "Final Answer: 12"
    # a bare-number answer column
    ds = load_task_dataset(write_jsonl(tmp_path / "num.jsonl", [{"question": "x?", "answer": "1,234"}]))
    assert ds[0]["ground_truth"] == "1234"


def test_csv_and_json_custom_columns(tmp_path):
    (tmp_path / "d.csv").write_text('text,label\n"What is 1 + 1?",2\n"What is 3 + 4?",7\n')
    ds = load_task_dataset(str(tmp_path / "d.csv"), question_field="text", ground_truth_field="label")
    assert ds["ground_truth"] == ["2", "7"]
    (tmp_path / "d.json").write_text(json.dumps({"data": [{"question": "a?", "answer": "#### 4"}]}))
    assert load_task_dataset(str(tmp_path / "d.json"))["ground_truth"] == ["4"]


@pytest.mark.parametrize("rows,kwargs,match", [
    ([{"question": "a?", "answer": "#### 1"}, {"question": "b?"}], {}, r"d.jsonl line 2: missing field 'answer'"),
    ([{"question": "a?", "answer": "#### 1"}], {"question_field": "problem"}, r"line 1: missing field 'problem'"),
    ([{"question": "  ", "answer": "#### 1"}], {}, r"line 1: field 'question' \(the question\) is empty"),
    ([{"question": "a?", "answer": ""}], {}, r"line 1: field 'answer' \(the answer\) is empty"),
    ([{"question": "a?", "answer": "#### seven"}], {}, r"line 1: field 'answer': ground truth 'seven' is not a number"),
    ([{"question": "a?", "gt": "n/a"}], {"ground_truth_field": "gt"}, r"line 1: field 'gt': ground truth 'n/a'"),
    ([{"question": "a?", "answer": "just some text"}], {}, r"line 1: field 'answer': no final answer found"),
    ([{"question": "a?", "gt": ""}], {"ground_truth_field": "gt"}, r"line 1: field 'gt' \(the ground truth\) is empty"),
    ([{"text": "a?", "answer": "#### 1"}], {}, r"line 1: missing field 'question' \(columns: text, answer\)"),
])
def test_invalid_rows_name_file_row_and_field(tmp_path, rows, kwargs, match):
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DataError, match=match) as info:
        load_task_dataset(path, **kwargs)
    assert "\n" not in str(info.value) and "d.jsonl" in str(info.value)


def test_non_numeric_ground_truth_allowed_when_not_numeric(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "Capital of France?", "answer": "#### Paris"}])
    assert load_task_dataset(path, numeric_ground_truth=False)["ground_truth"] == ["Paris"]


def test_file_level_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a?", "answer": "#### 1"}\n\n{"question": "b?", "answer": "#### 2"}\n{oops}\n')
    with pytest.raises(DataError, match=r"bad.jsonl line 4: malformed JSON"):
        load_task_dataset(str(bad))
    with pytest.raises(DataError, match=r"^data file not found: .*missing.jsonl$"):
        load_task_dataset(str(tmp_path / "missing.jsonl"))
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(DataError, match="unsupported file type '.txt'"):
        load_task_dataset(str(tmp_path / "d.txt"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="no rows"):
        load_task_dataset(str(tmp_path / "empty.jsonl"))
    with pytest.raises(ConfigError):
        load_task_dataset("synthetic", question_field="a", prompt_field="b")


def test_max_samples_is_a_seeded_sample_not_the_first_n(tmp_path):
    rows = [{"question": f"What is {i} + 0?", "answer": f"#### {i}"} for i in range(100)]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    a = load_task_dataset(path, max_samples=10, seed=1)["ground_truth"]
    assert a == load_task_dataset(path, max_samples=10, seed=1)["ground_truth"]
    assert len(a) == 10 == len(set(a))
    assert a != [str(i) for i in range(10)]
    assert a != load_task_dataset(path, max_samples=10, seed=2)["ground_truth"]
    assert len(load_task_dataset(path, max_samples=500)) == 100


def test_registered_and_module_function_sources(tmp_path, monkeypatch):
    def tiny(split, seed):
        return generate_synthetic(5, seed=seed, max_steps=1)

    register_dataset("tiny-test-set", tiny)
    ds = load_task_dataset("tiny-test-set", "test", seed=4)
    assert ds["answer"] == [r["answer"] for r in generate_synthetic(5, seed=4, max_steps=1)]

    (tmp_path / "my_task_module.py").write_text(
        "def rows(split, seed):\n    return [{'question': split + '?', 'answer': '#### ' + str(seed)}]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ds = load_task_dataset("my_task_module:rows", "dev", seed=8)
    assert ds[0]["question"] == "dev?" and ds[0]["ground_truth"] == "8"
    with pytest.raises(DataError, match="cannot import dataset function"):
        load_task_dataset("no_such_module_xyz:rows")
    sys.modules.pop("my_task_module", None)


def test_parse_answer_text_formats():
    assert parse_answer_text("a\n#### 3") == (["a"], "3")
    assert parse_answer_text("x = 1\nFinal Answer: $1,200") == (["x = 1"], "1200")
    assert parse_answer_text(" 42 ") == ([], "42")
    assert parse_answer_text("no answer here\nreally") == (["no answer here", "really"], None)


def test_non_utf8_and_bom_files(tmp_path):
    import pytest

    from agentic_rl.data.gsm8k import read_file
    from agentic_rl.errors import DataError

    latin = tmp_path / "latin.csv"
    latin.write_bytes("question,answer\nCaf\xe9 sells 3 cups,#### 3\n".encode("latin-1"))
    with pytest.raises(DataError, match="latin.csv: not UTF-8"):
        read_file(latin)
    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufeffquestion,answer\nHow many?,#### 3\n".encode("utf-8"))
    assert read_file(bom).rows[0]["question"] == "How many?"
