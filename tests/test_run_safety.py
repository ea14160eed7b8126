"""Nothing the user did not ask to lose is deleted or overwritten.

``--fresh`` deletes only a run directory this project created, after the whole configuration validated; a stage run
into a finished run refuses unless ``--resume`` / ``--overwrite``, and touches nothing before its model, data and
rewards have loaded; ``--resume`` continues only a run with the same settings and steps over a checkpoint that a
kill left half-written; a pipeline re-run with other settings does not reuse stages made with the old ones, and an
interrupted pipeline stage resumes; an adapter is exported only onto the base it was trained on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

import pytest
from conftest import grpo_config, sft_config

from agentic_rl.cli import main
from agentic_rl.config import config_from_dict
from agentic_rl.errors import ConfigError, ModelLoadError
from agentic_rl.locking import LOCK_FILE
from agentic_rl.pipeline import PipelineConfig, QuickstartConfig, run_pipeline

RUN_MARKER = ".agentic-rl-run"  # the file that makes a folder a run directory of this project


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the sha256 of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _pipeline(tiny_model_dir: Path, out: Path, **overrides) -> PipelineConfig:
    """A one-stage pipeline (LoRA SFT for 2 steps on the micro model), fast enough for a unit test."""
    values = dict(name="safety", output_dir=str(out), model=str(tiny_model_dir), stages=["sft"],
                  evaluate_stages=False, system_prompt="",
                  sft=dict(max_steps=2, save_steps=1, batch_size=4, max_train_samples=16,
                           synthetic_test_size=20, max_length=128, report_to="none", logging_steps=1))
    values.update(overrides)
    return config_from_dict(PipelineConfig, values)


# ---------------------------------------------------------------------------------------------------------------
# --fresh
# ---------------------------------------------------------------------------------------------------------------

def test_fresh_with_a_bad_config_deletes_nothing(tiny_model_dir, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my thesis")
    # Key names are right; a value is not (it only fails when the SFT section is built into its typed config).
    config = _pipeline(tiny_model_dir, out, fresh=True, sft={"max_steps": 0})
    with pytest.raises(ConfigError, match="max_steps"):
        run_pipeline(config)
    assert (out / "notes.txt").read_text() == "my thesis"


def test_fresh_refuses_a_directory_it_did_not_create(tiny_model_dir, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my thesis")
    with pytest.raises(ConfigError, match=f"not created by agentic-rl.*{RUN_MARKER}"):
        run_pipeline(_pipeline(tiny_model_dir, out, fresh=True))
    assert (out / "notes.txt").read_text() == "my thesis"
    # Without --fresh the pipeline does not write into a foreign non-empty folder either.
    with pytest.raises(ConfigError, match="not created by agentic-rl"):
        run_pipeline(_pipeline(tiny_model_dir, out))
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_fresh_never_deletes_the_working_directory_its_parents_or_home(tiny_model_dir, tmp_path, monkeypatch):
    home = tmp_path / "home"  # a stand-in home: whatever happens, the real one is never a target here
    work = home / "project"
    work.mkdir(parents=True)
    for folder in (home, work):  # even a marker does not make these deletable
        (folder / RUN_MARKER).write_text("{}")
        (folder / "keep.txt").write_text("x")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    for target in (".", "..", str(home), str(tmp_path)):
        with pytest.raises(ConfigError, match="refuses to delete"):
            run_pipeline(_pipeline(tiny_model_dir, Path(target), fresh=True))
    assert (work / "keep.txt").is_file() and (home / "keep.txt").is_file()
    from agentic_rl.runs import check_deletable

    with pytest.raises(ConfigError, match="refuses to delete"):
        check_deletable("/")


def test_quickstart_name_dotdot_fresh_deletes_nothing(tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    (work / "runs").mkdir(parents=True)
    (work / "code.py").write_text("print(1)")
    (work / "runs" / "other.txt").write_text("x")
    monkeypatch.chdir(work)
    assert main(["quickstart", "--name", "..", "--fresh", "--smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: name '..' must be a plain folder name") and "\n" not in err
    assert (work / "code.py").is_file() and (work / "runs" / "other.txt").is_file()
    for bad in ("a/b", "..", ".", ""):
        with pytest.raises(ConfigError, match="plain folder name"):
            PipelineConfig(name=bad)
    with pytest.raises(ConfigError, match="plain folder name"):
        QuickstartConfig(name="../x")


def test_fresh_replaces_a_run_directory_it_created(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    config = _pipeline(tiny_model_dir, out, stages=["export"])
    run_pipeline(config)
    assert (out / RUN_MARKER).is_file() and (out / "export" / "model.safetensors").is_file()
    (out / "stale.txt").write_text("from the first run")
    run_pipeline(dataclasses.replace(config, fresh=True))
    assert not (out / "stale.txt").exists() and (out / "export" / "model.safetensors").is_file()


def _finished_stage_run(out: Path, config, stage: str) -> dict[str, str]:
    """A finished run of ``stage`` in ``out``, marked as every stage marks it; returns its snapshot."""
    from agentic_rl.runs import StageRun

    run = StageRun(out, config, stage=stage)
    run.claim()
    run.finish({})
    return _snapshot(out)


def test_a_pipeline_never_writes_into_or_fresh_deletes_a_stage_run(tiny_model_dir, tmp_path):
    from agentic_rl.train.sft import SFTConfig

    out = tmp_path / "sft"  # `agentic-rl sft` ran here; then `pipeline --output-dir runs/sft` by mistake
    before = _finished_stage_run(out, SFTConfig(model=str(tiny_model_dir)), "sft")
    with pytest.raises(ConfigError, match=r"holds a sft run, not a pipeline run"):
        run_pipeline(_pipeline(tiny_model_dir, out))
    assert _snapshot(out) == before
    with pytest.raises(ConfigError, match=r"--fresh refuses to delete .* holds a sft run"):
        run_pipeline(_pipeline(tiny_model_dir, out, fresh=True))
    assert _snapshot(out) == before
    from agentic_rl.runs import check_deletable

    with pytest.raises(ConfigError, match="holds a sft run, not a pipeline run"):
        check_deletable(out)  # any kind of run root: the pipeline's (every quickstart preset is one)


def test_the_refusal_names_only_flags_the_command_has(tmp_path, capsys):
    """preferences has --overwrite but no --resume: the message must not suggest it."""
    from agentic_rl.train.preferences import PreferencesConfig

    out = tmp_path / "preferences"
    _finished_stage_run(out, PreferencesConfig(model="m"), "preferences")
    assert main(["preferences", "--model", "m", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"error: {out} already holds a finished preferences run; pass --overwrite to replace it, or "
                       f"choose another --output-dir")


# ---------------------------------------------------------------------------------------------------------------
# A finished GRPO run: re-runs, --resume, a half-written checkpoint
# ---------------------------------------------------------------------------------------------------------------

def _grpo_config(model_dir: Path, out: Path, **overrides):
    """The finished run these tests start from: held-out checks and logged completions every step, two rewards."""
    return grpo_config(model_dir, out, **{**dict(heldout_every=1, eval_samples=2, completions_every=1,
                                                 completions_per_log=2, rewards=["accuracy:1.0", "format:0.2"]),
                                          **overrides})


@pytest.fixture(scope="module")
def finished_grpo(tiny_model_dir, tmp_path_factory):
    from agentic_rl.train.grpo import run

    out = tmp_path_factory.mktemp("grpo_finished")
    run(_grpo_config(tiny_model_dir, out))
    assert (out / "best" / "adapter_model.safetensors").is_file() and (out / "checkpoint-2").is_dir()
    return out


def test_overwrite_removes_every_output_an_earlier_grpo_run_wrote(tiny_model_dir, tmp_path):
    """Each top-level file or folder grpo.py writes into the run (``out / "name"``) is an earlier run's output that a
    new run (not --resume) removes, e.g. difficulty.json from a run with difficulty selection."""
    import inspect
    import re

    from agentic_rl.runs import FINISHED_MARKER, StageRun, write_marker
    from agentic_rl.train import grpo, grpo_trainer

    source = inspect.getsource(grpo) + inspect.getsource(grpo_trainer)  # the stage and its trainer's callback
    written = set(re.findall(r'\bout / "([^"]+)"', source)) - {"config.yaml"}
    assert {"difficulty.json", "best"} <= written
    out = tmp_path / "grpo"
    for name in written | {"checkpoint-3", FINISHED_MARKER}:
        if "." in name:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text("from the earlier run")
        else:
            (out / name).mkdir(parents=True)
            (out / name / "weights").write_text("from the earlier run")
    write_marker(out, "grpo")  # the earlier run's marker
    StageRun(out, _grpo_config(tiny_model_dir, out, overwrite=True), stage="grpo").claim()
    assert sorted(p.name for p in out.iterdir()) == sorted([RUN_MARKER, LOCK_FILE, "config.yaml"])


def test_a_misspelt_reward_leaves_a_finished_grpo_run_byte_identical(finished_grpo, tiny_model_dir):
    from agentic_rl.train.grpo import run

    before = _snapshot(finished_grpo)
    # The reward names are checked as the config is built, before the run directory is even looked at.
    with pytest.raises(ConfigError, match=r"unknown reward 'accuracyy' \(did you mean 'accuracy'\?\)"):
        run(_grpo_config(tiny_model_dir, finished_grpo, rewards=["accuracyy"]))
    assert _snapshot(finished_grpo) == before
    with pytest.raises(ConfigError, match="already holds a finished grpo run.*--resume.*--overwrite"):
        run(_grpo_config(tiny_model_dir, finished_grpo))
    assert _snapshot(finished_grpo) == before
    # Even with --overwrite nothing goes before the rewards (and model and data) have loaded.
    with pytest.raises(ConfigError, match="unknown reward 'accuracyy'"):
        run(_grpo_config(tiny_model_dir, finished_grpo, rewards=["accuracyy"], overwrite=True))
    assert _snapshot(finished_grpo) == before


def test_a_missing_logging_package_leaves_a_finished_grpo_run_byte_identical(finished_grpo, tiny_model_dir,
                                                                            monkeypatch):
    """report_to is checked (is the package installed?) before --overwrite removes the earlier run's outputs."""
    from agentic_rl.train import monitoring
    from agentic_rl.train.grpo import run

    def missing(report_to, run_dir):
        raise ConfigError("report_to wandb needs the wandb package: pip install 'agentic-rl[wandb]'")

    monkeypatch.setattr(monitoring, "resolve_report_to", missing)
    before = _snapshot(finished_grpo)
    with pytest.raises(ConfigError, match="needs the wandb package"):
        run(_grpo_config(tiny_model_dir, finished_grpo, report_to=["wandb"], overwrite=True))
    assert _snapshot(finished_grpo) == before


def test_resume_with_other_settings_is_refused_and_names_them(finished_grpo, tiny_model_dir, capsys):
    from agentic_rl.train.grpo import run

    before = _snapshot(finished_grpo)
    with pytest.raises(ConfigError, match=r"other settings: learning_rate \(0.05 -> 0.01\), seed \(0 -> 1\)"):
        run(_grpo_config(tiny_model_dir, finished_grpo, resume=True, seed=1, learning_rate=0.01))
    assert _snapshot(finished_grpo) == before
    # The same from the command line, with the run's own config.yaml: one line.
    assert main(["grpo", "--config", str(finished_grpo / "config.yaml"), "--resume", "--seed", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --resume:") and "seed (0 -> 3)" in err[-1]


def test_resume_steps_over_a_checkpoint_left_half_written(finished_grpo, tiny_model_dir, tmp_path, capsys):
    from agentic_rl.train.grpo import run

    out = tmp_path / "killed"
    shutil.copytree(finished_grpo, out)
    # A kill while checkpoint-2 was being saved: weights cut short, optimizer and trainer state never written.
    weights = out / "checkpoint-2" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    for name in ("optimizer.pt", "trainer_state.json"):
        (out / "checkpoint-2" / name).unlink()
    (out / "stage.json").unlink()
    result = run(_grpo_config(tiny_model_dir, out, resume=True, max_steps=3, output_dir=str(out)))
    assert result["resumed_from"] == str(out / "checkpoint-1") and result["steps"] == 3
    assert "checkpoint-2 is incomplete (no trainer_state.json" in capsys.readouterr().err


def test_last_checkpoint_skips_every_kind_of_incomplete_checkpoint(finished_grpo, tmp_path):
    from agentic_rl.utils import last_checkpoint

    for damage in ("trainer_state.json", "optimizer.pt", "scheduler.pt", "adapter_model.safetensors", "truncate"):
        out = tmp_path / damage
        shutil.copytree(finished_grpo, out, ignore=shutil.ignore_patterns("best", "model", "base"))
        target = out / "checkpoint-2" / ("adapter_model.safetensors" if damage == "truncate" else damage)
        if damage == "truncate":
            target.write_bytes(target.read_bytes()[:-100])
        else:
            target.unlink()
        assert last_checkpoint(out) == str(out / "checkpoint-1"), damage
    assert last_checkpoint(finished_grpo) == str(finished_grpo / "checkpoint-2")
    assert last_checkpoint(tmp_path / "absent") is None


# ---------------------------------------------------------------------------------------------------------------
# The pipeline: stages made with other settings, interrupted stages
# ---------------------------------------------------------------------------------------------------------------

def test_a_second_seed_does_not_reuse_the_first_seeds_stages(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    first = run_pipeline(_pipeline(tiny_model_dir, out))
    before = _snapshot(out)
    with pytest.raises(ConfigError, match=r"stage sft .* other settings: seed \(0 -> 1\).*--name.*--fresh"):
        run_pipeline(_pipeline(tiny_model_dir, out, seed=1))
    assert _snapshot(out) == before
    # A GRPO run pointed at the SFT stage's folder does not clear it either (it is another stage's run).
    from agentic_rl.train.grpo import run as grpo

    with pytest.raises(ConfigError, match="holds a sft run, not a grpo run"):
        grpo(_grpo_config(tiny_model_dir, out / "sft", overwrite=True))
    assert _snapshot(out) == before
    # The same settings reuse the stage; --fresh with the new seed trains it again.
    assert run_pipeline(_pipeline(tiny_model_dir, out))["stages"]["sft"] == first["stages"]["sft"]
    run_pipeline(_pipeline(tiny_model_dir, out, seed=1, fresh=True))
    import yaml

    assert yaml.safe_load((out / "sft" / "config.yaml").read_text())["seed"] == 1


def _interrupt_after_the_first_checkpoint(out: Path) -> None:
    """Leave the run's SFT stage as if killed during step 2: checkpoint-1 saved, nothing after it."""
    for name in ("stage.json", "metrics.json"):
        (out / "sft" / name).unlink()
    for name in ("model", "adapter", "checkpoints/checkpoint-2"):
        shutil.rmtree(out / "sft" / name)


def test_an_interrupted_pipeline_stage_resumes_from_its_checkpoint(tiny_model_dir, tmp_path):
    import json

    out = tmp_path / "run"
    run_pipeline(_pipeline(tiny_model_dir, out))
    _interrupt_after_the_first_checkpoint(out)
    other = _pipeline(tiny_model_dir, out, sft={**_pipeline(tiny_model_dir, out).sft, "learning_rate": 1e-3})
    with pytest.raises(ConfigError, match=r"stage sft .* other settings: learning_rate"):
        run_pipeline(other)
    summary = run_pipeline(_pipeline(tiny_model_dir, out))
    marker = json.loads((out / "sft" / "stage.json").read_text())
    assert marker["metrics"]["resumed_from"] == str(out / "sft" / "checkpoints" / "checkpoint-1")
    assert marker["metrics"]["global_step"] == 2 and summary["stages"]["sft"]["model_dir"] == str(out / "sft" / "model")


def test_an_interrupted_stage_of_a_moved_run_directory_resumes_from_the_checkpoint_where_it_is_now(tiny_model_dir,
                                                                                                  tmp_path):
    import json

    first = tmp_path / "first"
    run_pipeline(_pipeline(tiny_model_dir, first))
    _interrupt_after_the_first_checkpoint(first)
    moved = tmp_path / "elsewhere" / "second"
    shutil.move(first, moved)
    summary = run_pipeline(_pipeline(tiny_model_dir, moved))
    marker = json.loads((moved / "sft" / "stage.json").read_text())
    assert marker["metrics"]["resumed_from"] == str(moved / "sft" / "checkpoints" / "checkpoint-1")
    assert summary["stages"]["sft"]["model_dir"] == str(moved / "sft" / "model")


@pytest.mark.parametrize("recorded, current, expected", [
    ("runs/a/grpo", "runs/b/grpo", ("runs/a", "runs/b")),             # a run directory renamed
    ("runs/a/eval/base", "/x/y/a/eval/base", ("runs", "/x/y")),       # moved: its name and layout shared
    ("out1", "out2", ("out1", "out2")),                               # a stage's own run directory
    ("runs/a/sft", "runs/a/sft", None),                               # not moved
    (None, "runs/a/sft", None),                                       # nothing recorded
])
def test_a_moved_folder_gives_where_its_run_directory_was_and_is(recorded, current, expected):
    from agentic_rl.runs import moved_from

    assert moved_from(recorded, current) == expected


def test_recorded_paths_under_a_moved_run_directory_read_as_the_same_paths_where_it_is_now():
    from agentic_rl.runs import differing_keys, relocated

    moved = ("runs/a", "runs/b")
    recorded = {"model": "runs/a/sft/model", "models": ["runs/a/grpo/model", "embedded"], "seed": 0,
                "dataset": "runs/ab/data.jsonl", "lr_scheduler_type": "cosine"}
    assert relocated(recorded, moved) == {**recorded, "model": "runs/b/sft/model",
                                          "models": ["runs/b/grpo/model", "embedded"]}
    now = {**recorded, "model": "runs/b/sft/model", "models": ["runs/b/grpo/model", "embedded"], "seed": 1}
    assert differing_keys(recorded, now, moved=moved) == ["seed (0 -> 1)"]
    assert differing_keys(recorded, now) == ["model (\"runs/a/sft/model\" -> \"runs/b/sft/model\")",
                                             "models ([\"runs/a/grpo/model\", \"embedded\"] -> "
                                             "[\"runs/b/grpo/model\", \"embedded\"])", "seed (0 -> 1)"]
    # The same path as recorded still matches after a move (a start model outside the run directory).
    assert differing_keys({"model": "runs/a/base"}, {"model": "runs/a/base"}, moved=moved) == []

# ---------------------------------------------------------------------------------------------------------------
# An adapter is merged only onto its own base
# ---------------------------------------------------------------------------------------------------------------

def test_an_sft_adapter_exports_only_onto_the_base_it_was_trained_on(tiny_model_dir, tmp_path, capsys):
    from transformers import AutoTokenizer

    from agentic_rl.deploy.export import ExportConfig
    from agentic_rl.deploy.export import run as export
    from agentic_rl.models.tiny import build_tiny_model, save_model_dir
    from agentic_rl.train.sft import run as sft

    other_base = save_model_dir(build_tiny_model(AutoTokenizer.from_pretrained(tiny_model_dir), "micro", seed=1),
                                AutoTokenizer.from_pretrained(tiny_model_dir), tmp_path / "other_base")
    result = sft(sft_config(tiny_model_dir, tmp_path / "sft", max_steps=1, max_train_samples=8, logging_steps=10,
                            merge=False))
    adapter = Path(result["adapter_dir"])
    assert (adapter / "base_fingerprint.json").is_file()
    with pytest.raises(ModelLoadError, match="trained on another base model"):
        export(ExportConfig(source=str(adapter), out=str(tmp_path / "wrong"), base_model=str(other_base)))
    assert not list((tmp_path / "wrong").glob("*.safetensors"))
    assert main(["export", str(adapter), "--out", str(tmp_path / "wrong2"), "--base-model", str(other_base)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: the adapter in") and "another base model" in err[-1]
    # Its own base (found through adapter_config.json) exports.
    assert (export(ExportConfig(source=str(adapter), out=str(tmp_path / "right"))) / "model.safetensors").is_file()
