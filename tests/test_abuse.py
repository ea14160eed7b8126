"""Faults and abuse: hostile or broken inputs at the edges of the product get a bounded cost and a one-line error.

Environments: a tool that blocks, one that returns megabytes, one that returns a dict.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentic_rl.agent.env import ToolEnvironment, environment_factory
from agentic_rl.agent.settings import EnvironmentSettings
from agentic_rl.agent.tool_format import render_tool_call
from agentic_rl.agent.tools import MAX_ABANDONED_CALLS, Tool, ToolError
from agentic_rl.errors import ConfigError

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------------------------------------------------------
# Environments: tool calls are bounded in time and size; structured results are JSON


def lookup(key: str) -> dict:
    """Look a key up.

    Args:
        key: the key.
    """
    return {"key": key, "values": [1, 2.5, None, True], "note": "ü"}


def huge(n: int) -> str:
    """Return n characters.

    Args:
        n: how many.
    """
    return "x" * n


def _tool_observation(env: ToolEnvironment, name: str, arguments: dict) -> tuple[str, float]:
    env.reset({"question": "q", "ground_truth": "1"})
    result = env.step(render_tool_call(name, arguments))
    assert not result.done
    return result.observation[0]["content"], result.reward


def test_a_dict_result_reaches_the_model_as_json():
    observation, reward = _tool_observation(ToolEnvironment([lookup]), "lookup", {"key": "a"})
    assert json.loads(observation) == {"key": "a", "values": [1, 2.5, None, True], "note": "ü"}
    assert observation == '{"key": "a", "values": [1, 2.5, null, true], "note": "ü"}' and reward == 0.1


def test_a_huge_result_is_clipped_and_says_so():
    env = ToolEnvironment([huge], max_tool_result_chars=1000)
    started = time.monotonic()
    observation, reward = _tool_observation(env, "huge", {"n": 10_000_000})
    assert time.monotonic() - started < 5
    assert observation.startswith("x" * 1000 + "\n[result clipped: 10000000 characters, the first 1000 shown]")
    assert len(observation) < 1100 and reward == 0.1            # a clipped result is still a result
    assert _tool_observation(env, "huge", {"n": 1000})[0] == "x" * 1000
    # the default clips too
    default, _ = _tool_observation(ToolEnvironment([huge]), "huge", {"n": 1_000_000})
    assert len(default) < 5000


def test_a_blocking_tool_times_out_into_an_error_observation():
    def wait(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long.
        """
        time.sleep(seconds)
        return "slept"

    env = ToolEnvironment([wait], tool_timeout_s=0.3)
    started = time.monotonic()
    observation, reward = _tool_observation(env, "wait", {"seconds": 3.0})
    assert time.monotonic() - started < 2
    assert observation == "error: wait did not return within 0.3 s (the tool_timeout_s setting)"
    assert reward == 0.0 and env.tool_errors == 1
    assert _tool_observation(env, "wait", {"seconds": 0.0})[0] == "slept"   # a quick call still runs


def test_a_tool_stuck_for_good_does_not_keep_the_process_alive_or_pile_up_threads():
    """A tool that never returns: each call is an error after the limit, after MAX_ABANDONED_CALLS stuck calls the
    tool is refused at once, and the process exits normally although those calls are still blocked."""
    result = _python(f"""
        import threading, time
        from agentic_rl.agent.env import ToolEnvironment
        from agentic_rl.agent.tool_format import render_tool_call

        def block(x: int) -> str:
            '''Never returns.

            Args:
                x: anything.
            '''
            threading.Event().wait()

        env = ToolEnvironment([block], tool_timeout_s=0.1, max_tool_calls=100, max_turns=100)
        env.reset({{"question": "q", "ground_truth": "1"}})
        started = time.monotonic()
        for i in range({MAX_ABANDONED_CALLS} + 3):
            print(env.step(render_tool_call("block", {{"x": i}})).observation[0]["content"])
        print("threads", threading.active_count(), "seconds", round(time.monotonic() - started, 1))
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:MAX_ABANDONED_CALLS] == ["error: block did not return within 0.1 s (the tool_timeout_s setting)"] \
        * MAX_ABANDONED_CALLS
    assert all(line.startswith(f"error: block is unavailable: {MAX_ABANDONED_CALLS} earlier calls")
               for line in lines[MAX_ABANDONED_CALLS:-1]), lines
    threads, seconds = lines[-1].split()[1], float(lines[-1].split()[3])
    assert int(threads) == 1 + MAX_ABANDONED_CALLS and seconds < 0.1 * MAX_ABANDONED_CALLS + 3


def test_tool_exceptions_and_tool_errors_still_become_observations_with_a_timeout():
    def broken(x: int) -> str:
        """Fails.

        Args:
            x: anything.
        """
        if x:
            raise ToolError("x must be 0")
        return {}["missing"]

    tool = Tool(broken)
    with pytest.raises(ToolError, match="^x must be 0$"):
        tool({"x": 1}, timeout_s=5)
    with pytest.raises(ToolError, match="broken failed: KeyError: 'missing'"):
        tool({"x": 0}, timeout_s=5)


def test_tool_limits_are_environment_settings_with_one_name_each():
    settings = EnvironmentSettings(environment="calculator", tool_timeout_s=2.5, max_tool_result_chars=50)
    assert settings.environment_settings()["tool_timeout_s"] == 2.5
    env = environment_factory("calculator", settings.environment_settings())()
    assert (env.tool_timeout_s, env.max_tool_result_chars) == (2.5, 50)
    for field, value, message in (("tool_timeout_s", 0, "tool_timeout_s"), ("max_tool_result_chars", 0,
                                                                            "max_tool_result_chars")):
        with pytest.raises(ConfigError, match=message):
            EnvironmentSettings(environment="calculator", **{field: value}).check_environment_settings()
    with pytest.raises(ConfigError, match=r"^tool_timeout_s must be > 0, got inf$"):
        ToolEnvironment([lookup], tool_timeout_s=float("inf"))
    with pytest.raises(ConfigError, match="tool_timeout_s applies to multi-turn episodes only"):
        EnvironmentSettings(tool_timeout_s=5).check_environment_settings()


# ---------------------------------------------------------------------------------------------------------------
# Flags: a list flag repeats, mistyped and abbreviated flags are refused with a suggestion, bounded YAML


def _flags(argv: list[str]):
    """The config the CLI builds from ``argv`` (the command's flags parsed and checked, nothing run)."""
    from agentic_rl.cli import _load_command, build_parser
    from agentic_rl.config import config_from_args, unknown_flag_error

    parser = build_parser(only=argv[0])
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        raise unknown_flag_error(unknown, parser.command_flags, argv[0])
    return config_from_args(_load_command(argv[0])[0], args, yaml_path=args._config_file, section=argv[0])


def test_a_list_flag_repeats_and_splits_only_at_top_level_commas():
    assert _flags(["preferences", "--judge", "accuracy:1.0", "--judge", "format:0.2"]).judge == [
        "accuracy:1.0", "format:0.2"]
    llm = 'judge(base_url=http://127.0.0.1:8000/v1,model=m,rubric="Correct, concise"):0.5'
    assert _flags(["preferences", "--judge", "accuracy", "--judge", llm]).judge == ["accuracy", llm]
    assert _flags(["preferences", "--judge", "accuracy:1.0,length(alpha=0.01, floor=0):0.5"]).judge == [
        "accuracy:1.0", "length(alpha=0.01, floor=0):0.5"]
    assert _flags(["sft", "--report-to", "tensorboard,wandb"]).report_to == ["tensorboard", "wandb"]
    sampled = ["eval", "--num-samples", "8", "--temperature", "0.7"]
    assert _flags([*sampled, "--pass-at-k", "1", "--pass-at-k", "4,8"]).pass_at_k == [1, 4, 8]
    assert _flags(["grpo", "--reward", "accuracy", "--reward", "format:0.2"]).rewards == ["accuracy", "format:0.2"]


@pytest.mark.parametrize("argv, message", [
    (["sft", "--learnig-rate", "1e-4"], "unknown flag '--learnig-rate' for 'agentic-rl sft' (did you mean "
                                        "'--learning-rate'?)"),
    (["sft", "--learning-rat", "1e-4"], "unknown flag '--learning-rat' for 'agentic-rl sft' (did you mean "
                                        "'--learning-rate'?)"),
    (["sft", "--learning-rate=1e-4", "--zzzzzz"], "unknown flag '--zzzzzz' for 'agentic-rl sft'; see agentic-rl sft"),
])
def test_mistyped_or_abbreviated_flags_are_one_line_errors_with_a_suggestion(argv, message, capsys):
    from agentic_rl.cli import main

    assert main(argv) == 2                                       # refused before any stage work
    err = capsys.readouterr().err
    assert err.strip() == f"error: {message}" or err.startswith(f"error: {message}"), err
    assert len(err.strip().splitlines()) == 1


def test_an_unknown_reward_name_or_parameter_suggests_the_close_one():
    from agentic_rl.rewards import build_rewards

    with pytest.raises(ConfigError, match=r"unknown reward 'accuracyy' \(did you mean 'accuracy'\?\)"):
        build_rewards(["accuracyy:1.0"])
    with pytest.raises(ConfigError, match=r"has no parameter 'alpah' \(did you mean 'alpha'\?\)"):
        build_rewards(["length(alpah=0.1)"])


def test_a_config_file_over_the_size_limit_is_refused_before_parsing(tmp_path):
    from agentic_rl.config import MAX_CONFIG_BYTES, read_yaml

    big = tmp_path / "big.yaml"
    with big.open("w") as fh:
        for i in range(MAX_CONFIG_BYTES // 12 + 1000):
            fh.write(f"key{i:07d}: {i}\n")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"big.yaml: 1\.\d MB is not a config file \(the limit is 1024 KB"):
        read_yaml(big)
    assert time.monotonic() - started < 0.5


BOMB = "{" + ", ".join(["a: &a [x, x, x, x, x, x, x, x, x]"] +
                       [f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]"
                        for i in range(8)]) + "}"


@pytest.mark.parametrize("value, message", [
    (BOMB, "its aliases expand to more than 10000 lists and mappings"),
    ("{a: " * 5000 + "1" + "}" * 5000, "invalid YAML ("),
    ("[" * 5000 + "]" * 5000, "invalid YAML ("),
    ("{x: " + "7" * 5000 + "}", "a number with more than"),
    ("{x: '" + "y" * (1024 * 1024) + "'}", "holds more than 1024 KB"),
])
def test_mapping_flags_have_the_limits_of_config_files(value, message):
    started = time.monotonic()
    for flag in ("--environment-args", "--trl-args"):
        argv = ["grpo", "--environment", "calculator", flag, value]
        with pytest.raises(ConfigError, match=rf"config key '{flag[2:].replace('-', '_')}'.*{re.escape(message)}"):
            _flags(argv)
    assert time.monotonic() - started < 5


# ---------------------------------------------------------------------------------------------------------------
# compare: nonsense inputs are refused in one line; output directories


def _predictions(run: Path, stage: str, rows: list[dict]) -> None:
    folder = run / "eval" / stage
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _evaluated_run(run: Path) -> Path:
    for stage, right in (("grpo", 2), ("sft_continued", 1)):
        _predictions(run, stage, [{"index": i, "sample": 0, "question": f"q{i}", "correct_strict": i < right}
                                  for i in range(3)])
    return run


def _compare(argv: list[str], capsys) -> tuple[int, str]:
    from agentic_rl.cli import main

    code = main(["compare", *argv])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) <= 1, err
    return code, err


def test_compare_refuses_one_run_given_twice(tmp_path, capsys):
    run = _evaluated_run(tmp_path / "seed0")
    code, err = _compare([str(run), str(tmp_path / "seed0" / "."), "--output-dir", str(tmp_path / "out"),
                          "--bootstrap-samples", "200"], capsys)
    assert code == 2 and f"run directory {tmp_path / 'seed0'} is given twice (also as {run})" in err
    assert not (tmp_path / "out").exists()


def test_compare_refuses_duplicated_and_empty_predictions(tmp_path, capsys):
    run = _evaluated_run(tmp_path / "seed0")
    path = run / "eval" / "grpo" / "predictions.jsonl"
    rows = path.read_text().splitlines()
    path.write_text("\n".join(rows + [rows[0]]) + "\n")
    code, err = _compare([str(run), "--output-dir", str(tmp_path / "out"), "--bootstrap-samples", "200"], capsys)
    assert code == 2 and f"{path} line 4: repeats line 1 (the same problem and sample 0)" in err
    path.write_text("")
    code, err = _compare([str(run), "--output-dir", str(tmp_path / "out"), "--bootstrap-samples", "200"], capsys)
    assert code == 2 and f"{path} has no rows" in err


def test_compare_bounds_the_bootstrap(tmp_path, capsys):
    run = _evaluated_run(tmp_path / "seed0")
    started = time.monotonic()
    code, err = _compare([str(run), "--bootstrap-samples", "1000000000"], capsys)
    assert code == 2 and "bootstrap_samples must be in [100, 100000], got 1000000000" in err
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("make_output, message", [
    (lambda tmp: tmp / "a-file", "exists and is a file, not a folder"),
    (lambda tmp: tmp / ("x" * 300), "is longer than 255 bytes"),
    (lambda tmp: tmp / "a-file" / "below", "cannot create the output directory"),
])
def test_bad_output_directories_are_one_line_errors(tmp_path, capsys, make_output, message):
    run = _evaluated_run(tmp_path / "seed0")
    (tmp_path / "a-file").write_text("keep me")
    code, err = _compare([str(run), "--output-dir", str(make_output(tmp_path)), "--bootstrap-samples", "200"], capsys)
    assert code == 2 and message in err
    assert (tmp_path / "a-file").read_text() == "keep me"


def test_output_dir_tilde_is_the_home_directory(tmp_path, monkeypatch, capsys):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    run = _evaluated_run(tmp_path / "seed0")
    code, _ = _compare([str(run), "--output-dir", "~/cmp", "--bootstrap-samples", "200"], capsys)
    assert code == 0 and (home / "cmp" / "compare.json").is_file() and not (work / "~").exists()


# ---------------------------------------------------------------------------------------------------------------
# Pipeline configs: a repeated stage, a name with control characters


def test_a_pipeline_listing_a_stage_twice_is_refused():
    from agentic_rl.pipeline import PipelineConfig

    with pytest.raises(ConfigError, match="stage 'sft' is listed more than once in 'stages'"):
        PipelineConfig(stages=["sft"] * 1000)
    with pytest.raises(ConfigError, match="stage 'grpo' is listed more than once"):
        PipelineConfig(stages=["sft", "grpo", "sft_continued", "grpo"])


@pytest.mark.parametrize("name", ["run\nname", "run\tname", "tab\x00", "bell\x07"])
def test_run_names_with_control_characters_are_refused(name):
    from agentic_rl.pipeline import PipelineConfig

    with pytest.raises(ConfigError, match="must be a plain folder name"):
        PipelineConfig(name=name)


# ---------------------------------------------------------------------------------------------------------------
# Reward modelling: pairs that rank nothing, held-out pairs too long to score


def test_pairs_whose_chosen_equals_rejected_are_dropped_with_a_count(tmp_path, capsys):
    from agentic_rl.errors import DataError
    from agentic_rl.train.reward_model import load_pairs

    rows = [{"prompt": f"Q{i}", "chosen": " same" if i % 2 else " good", "rejected": " same" if i % 2 else " bad"}
            for i in range(6)]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept, _ = load_pairs(str(path))
    assert [r["prompt"] for r in kept] == ["Q0", "Q2", "Q4"]
    assert "dropped 3 of 6 pairs whose 'chosen' equals 'rejected' (line 2 first)" in capsys.readouterr().err
    path.write_text("".join(json.dumps({**r, "rejected": r["chosen"]}) + "\n" for r in rows))
    with pytest.raises(DataError, match="in every pair 'chosen' equals 'rejected' \\(line 1 first\\)"):
        load_pairs(str(path))


def test_a_huge_held_out_response_is_scored_on_its_first_max_length_tokens(tiny_model_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from agentic_rl.rewards.reward_model import pair_texts, score_texts
    from agentic_rl.train.reward_model import pairwise_accuracy

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_model_dir), num_labels=1).eval()
    model.config.pad_token_id = tokenizer.pad_token_id
    huge = "7 " * 500_000                                      # 1 MB: about a million tokens untruncated
    pairs = [{"prompt": "Q: 3 + 4?", "chosen": huge, "rejected": " 5"}]
    started = time.monotonic()
    result = pairwise_accuracy(model, tokenizer, pairs, max_length=64)
    assert time.monotonic() - started < 60 and result["n"] == 1 and math.isfinite(result["mean_chosen"])
    full = pair_texts(tokenizer, "Q: 3 + 4?", huge)
    assert result["mean_chosen"] == pytest.approx(score_texts(model, tokenizer, [full[:64]])[0], abs=1e-5)
    # without a limit the model's context length bounds the scored sequence
    limit = model.config.max_position_embeddings
    assert score_texts(model, tokenizer, [full])[0] == pytest.approx(
        score_texts(model, tokenizer, [full[:limit]])[0], abs=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# A full disk while saving: no half-written model folder, one line


class _Saves:
    """Stands in for a model or tokenizer: ``save_pretrained`` writes one file, then fails like a full disk when
    told to (the failure is the operating system's error, raised where the real write would raise it)."""

    def __init__(self, name: str, fail: bool = False):
        self.name, self.fail = name, fail

    def save_pretrained(self, folder: str) -> None:
        Path(folder, f"{self.name}.safetensors").write_bytes(b"x" * 1000)
        if self.fail:
            raise OSError(errno.ENOSPC, "No space left on device", str(Path(folder, f"{self.name}-2.safetensors")))


def test_a_full_disk_during_the_final_save_leaves_no_half_written_model(tmp_path):
    from agentic_rl.errors import AgenticRLError
    from agentic_rl.models.loading import save_model_atomically

    model_dir = tmp_path / "run" / "model"
    with pytest.raises(AgenticRLError) as error:
        save_model_atomically(_Saves("model", fail=True), _Saves("tokenizer"), model_dir)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"the disk is full: could not save the model to {model_dir}")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == []          # nothing half-written, no temp folder

    save_model_atomically(_Saves("model"), _Saves("tokenizer"), model_dir)      # a whole save
    assert sorted(p.name for p in model_dir.iterdir()) == ["model.safetensors", "tokenizer.safetensors"]
    with pytest.raises(AgenticRLError, match="the disk is full"):               # failing over an existing model
        save_model_atomically(_Saves("new-model"), _Saves("tokenizer", fail=True), model_dir)
    assert sorted(p.name for p in model_dir.iterdir()) == ["model.safetensors", "tokenizer.safetensors"]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["model"]
    save_model_atomically(_Saves("new-model"), _Saves("tokenizer"), model_dir)  # a whole save replaces it
    assert sorted(p.name for p in model_dir.iterdir()) == ["new-model.safetensors", "tokenizer.safetensors"]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["model"]


def test_the_stage_model_savers_are_atomic(tmp_path, monkeypatch):
    """SFT, pretraining and GRPO save their final model with ``save_model_dir``, the reward model with
    ``save_reward_model``: a full disk in either leaves no model folder and is one line."""
    import torch
    from transformers import PreTrainedModel

    from agentic_rl.errors import AgenticRLError
    from agentic_rl.models import build_tiny_model, save_model_dir, train_tokenizer
    from agentic_rl.train.reward_model import save_reward_model

    tokenizer = train_tokenizer(["1 + 2 = 3", "Final Answer: 3"] * 20, vocab_size=300)
    model = build_tiny_model(tokenizer, "micro", seed=0)
    real_save = PreTrainedModel.save_pretrained

    def full_disk(self, folder, *args, **kwargs):
        real_save(self, folder, *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    for save in (save_model_dir, save_reward_model):
        folder = tmp_path / save.__name__ / "model"
        with pytest.raises(AgenticRLError, match=f"the disk is full: could not save the model to {folder}"):
            save(model, tokenizer, folder)
        assert not folder.exists() and list(folder.parent.iterdir()) == []
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", real_save)
    assert (save_model_dir(model, tokenizer, tmp_path / "ok" / "model") / "config.json").is_file()
    assert torch.isfinite(next(model.parameters())).all()


def test_a_full_disk_mid_run_is_one_line_from_the_cli(monkeypatch, capsys):
    """A checkpoint the trainer writes fails with ENOSPC: the command ends with one line, not a traceback."""
    import agentic_rl.cli as cli

    real = cli._load_command

    def failing(name):
        config_cls, _, module = real(name)

        def run(config):
            raise OSError(errno.ENOSPC, "No space left on device", "runs/sft/checkpoints/checkpoint-20/model.bin")

        return config_cls, run, module

    monkeypatch.setattr(cli, "_load_command", failing)
    assert cli.main(["sft", "--max-steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: the disk is full (runs/sft/checkpoints/checkpoint-20/model.bin); free some space and run "
                   "the same command with --resume")


# ---------------------------------------------------------------------------------------------------------------
# Data readers: a CSV error names the row


def test_a_csv_error_names_the_row_not_the_physical_line(tmp_path):
    from agentic_rl.data.custom import load_task_dataset
    from agentic_rl.data.gsm8k import read_file
    from agentic_rl.errors import DataError

    path = tmp_path / "d.csv"
    path.write_text('question,answer\n"What is 1 + 1?","1 + 1 = 2\nso\n#### 2"\n"",7\n"What is 2 + 2?",4\n')
    records = read_file(path)
    assert [records.where(i) for i in range(3)] == [f"{path} row 1 (from line 2)", f"{path} row 2 (from line 5)",
                                                    f"{path} row 3 (from line 6)"]
    with pytest.raises(DataError, match=rf"{re.escape(str(path))} row 2 \(from line 5\)"):
        load_task_dataset(str(path))
    path.write_text('question,answer\n"What is 1 + 1?","1 + 1 = 2\nso\n#### 2"\nWhat is 3 + 4?,7,extra\n')
    with pytest.raises(DataError, match=r"row 2 \(from line 5\): more values than the header has columns"):
        read_file(path)
    path.write_text('question,answer\n"What is 1 + 1?","2"\n"What is 3 + 4?","' + "7" * 200_000 + '"\n')
    with pytest.raises(DataError, match=r"row 2 \(from line 3\): malformed CSV \(field larger than field limit"):
        read_file(path)


def test_stage_output_dirs_expand_the_home_directory_and_refuse_files(tmp_path, monkeypatch):
    """Every stage resolves --output-dir through the same function: '~' is the home directory, a file or an
    over-long name is a one-line error before anything is created."""
    from agentic_rl.runs import stage_path

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert stage_path("~/runs/sft", "sft") == tmp_path / "home" / "runs" / "sft"
    assert stage_path(None, "sft").name == "sft"
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="exists and is a file, not a folder"):
        stage_path(str(tmp_path / "notes.txt"), "sft")
    with pytest.raises(ConfigError, match="longer than 255 bytes"):
        stage_path("runs/" + "n" * 300, "sft")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
