"""The one JSONL reader (``utils.iter_jsonl`` / ``read_jsonl``) and the readers built on it: a bad line is one line
that names the file and the line number, counted as in an editor (blank lines included)."""

from __future__ import annotations

import pytest

from agentic_rl.errors import DataError
from agentic_rl.utils import iter_jsonl, read_jsonl

GOOD = '{"question": "1 + 1?", "answer": "#### 2"}'


@pytest.mark.parametrize("lines, message", [
    ([GOOD, "", '{"question": "cut short', GOOD],
     r"data\.jsonl line 3: malformed JSON \(Unterminated string starting at column 14\)"),
    ([GOOD, "[1, 2]"], r"data\.jsonl line 2: expected a JSON object, got list"),
    ([GOOD, "null"], r"data\.jsonl line 2: expected a JSON object, got NoneType"),
])
def test_a_broken_line_is_one_error_naming_the_file_and_line(tmp_path, lines, message):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=message):
        read_jsonl(path)


def test_line_numbers_bom_and_blank_lines(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(("\ufeff" + GOOD + "\n\n  \n" + GOOD + "\n").encode("utf-8"))
    assert [n for n, _ in iter_jsonl(path)] == [1, 4]
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_non_utf8_bytes_name_the_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + '{"question": "caf\xe9"}'.encode("latin-1") + b"\n")
    with pytest.raises(DataError, match=r"data\.jsonl line 2: not UTF-8 text \(byte 17 of the line\)"):
        read_jsonl(path)


def test_skip_bad_lines_keeps_the_good_rows_and_warns_once(tmp_path, capsys):
    path = tmp_path / "cache.jsonl"
    path.write_text(GOOD + "\n[]\n" + GOOD + '\n{"key": "cut')
    assert read_jsonl(path, skip_bad_lines=True) == [{"question": "1 + 1?", "answer": "#### 2"}] * 2
    assert capsys.readouterr().err.count("skipped 2 unreadable line(s) of") == 1


def test_the_data_reader_names_the_line_of_a_bad_row(tmp_path):
    from agentic_rl.data.gsm8k import read_file

    path = tmp_path / "train.jsonl"
    path.write_text(GOOD + "\n\n" + GOOD + "\n" + "{oops}\n")
    with pytest.raises(DataError, match=r"train\.jsonl line 4: malformed JSON"):
        read_file(path)
    path.write_text(GOOD + "\n\n" + GOOD + "\n")
    assert read_file(path).locations == [f"{path} line 1", f"{path} line 3"]


def test_preference_pairs_errors_count_lines_not_rows(tmp_path):
    from agentic_rl.train.reward_model import load_pairs

    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n\n{"prompt": "p", "chosen": "a"}\n')
    with pytest.raises(DataError, match=r"pairs\.jsonl line 3: a preference pair needs 'chosen' and 'rejected'"):
        load_pairs(str(path))


def test_the_judge_cache_survives_a_line_cut_short(tmp_path, capsys):
    from agentic_rl.rewards.judge import JudgeReward

    cache = tmp_path / "judge.jsonl"
    cache.write_text('{"key": "a", "score": 0.7, "reply": "Score: 7"}\n{"key": "b", "score": "x"}\n{"key": "c", "sc')
    judge = JudgeReward(base_url="http://127.0.0.1:9/v1", model="m", cache_path=str(cache))
    assert judge.cache == {"a": 0.7}
    err = capsys.readouterr().err
    assert "skipped 1 unreadable line(s)" in err and "skipped 1 cache row(s)" in err


def test_a_damaged_tool_workspace_state_is_one_line(tmp_path):
    from agentic_rl.integrations.hello_agents import RLTrainingTool

    (tmp_path / "rl_training_state.json").write_text('{"runs": {')
    with pytest.raises(DataError, match=r"rl_training_state\.json: not valid JSON"):
        RLTrainingTool(workspace=tmp_path)
