"""Nothing the user did not ask to lose is deleted or overwritten (issue 16, class 1).

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

from agentic_rl.cli import main
from agentic_rl.config import config_from_dict
from agentic_rl.errors import ConfigError, ModelLoadError
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


def _finished_stage_run(out: Path, config, stage: str, finished: str) -> dict[str, str]:
    """A finished run of ``stage`` in ``out``, marked as the stage marks it; returns its snapshot."""
    from agentic_rl.runs import claim_stage_dir

    claim_stage_dir(out, config, stage=stage, resuming=False)
    (out / finished).parent.mkdir(parents=True, exist_ok=True)
    (out / finished).write_text("{}")
    return _snapshot(out)


def test_a_pipeline_never_writes_into_or_fresh_deletes_a_stage_run(tiny_model_dir, tmp_path):
    from agentic_rl.train.sft import SFTConfig

    out = tmp_path / "sft"  # `agentic-rl sft` ran here; then `pipeline --output-dir runs/sft` by mistake
    before = _finished_stage_run(out, SFTConfig(model=str(tiny_model_dir)), "sft", "metrics.json")
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
    from agentic_rl.data.preferences import PreferencesConfig

    out = tmp_path / "preferences"
    _finished_stage_run(out, PreferencesConfig(model="m"), "preferences", "stats.json")
    assert main(["preferences", "--model", "m", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"error: {out} already holds a finished preferences run; pass --overwrite to replace it, or "
                       f"choose another --output-dir")


# ---------------------------------------------------------------------------------------------------------------
# A finished GRPO run: re-runs, --resume, a half-written checkpoint
# ---------------------------------------------------------------------------------------------------------------

def _grpo_config(model_dir: Path, out: Path, **overrides):
    from agentic_rl.train.grpo import GRPOConfig

    values = dict(model=str(model_dir), output_dir=str(out), max_steps=2, num_generations=2, batch_size=4,
                  max_completion_length=6, max_train_samples=8, gradient_accumulation_steps=1, heldout_every=1,
                  eval_samples=2, save_steps=1, learning_rate=0.05, report_to=["none"], completions_every=1,
                  completions_per_log=2, rewards=["accuracy:1.0", "format:0.2"])
    values.update(overrides)
    return config_from_dict(GRPOConfig, values)


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

    from agentic_rl.runs import claim_stage_dir
    from agentic_rl.train import grpo, grpo_trainer

    source = inspect.getsource(grpo) + inspect.getsource(grpo_trainer)  # the stage and its trainer's callback
    written = set(re.findall(r'\bout / "([^"]+)"', source)) - {"config.yaml"}
    assert {"difficulty.json", "result.json", "best"} <= written
    out = tmp_path / "grpo"
    for name in written | {"checkpoint-3"}:
        if "." in name:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text("from the earlier run")
        else:
            (out / name).mkdir(parents=True)
            (out / name / "weights").write_text("from the earlier run")
    claim_stage_dir(out, _grpo_config(tiny_model_dir, out), stage="grpo", stale=grpo.GRPO_OUTPUTS, resuming=False)
    assert sorted(p.name for p in out.iterdir()) == [RUN_MARKER]


def test_a_misspelt_reward_leaves_a_finished_grpo_run_byte_identical(finished_grpo, tiny_model_dir):
    from agentic_rl.train.grpo import run

    before = _snapshot(finished_grpo)
    with pytest.raises(ConfigError, match="already holds a finished grpo run.*--resume.*--overwrite"):
        run(_grpo_config(tiny_model_dir, finished_grpo, rewards=["accuracyy"]))
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
    (out / "result.json").unlink()
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


def test_an_interrupted_pipeline_stage_resumes_from_its_checkpoint(tiny_model_dir, tmp_path):
    import json

    out = tmp_path / "run"
    run_pipeline(_pipeline(tiny_model_dir, out))
    # As if killed during step 2: checkpoint-1 saved, nothing after it.
    for name in ("stage.json", "metrics.json"):
        (out / "sft" / name).unlink()
    for name in ("model", "adapter", "checkpoints/checkpoint-2"):
        shutil.rmtree(out / "sft" / name)
    other = _pipeline(tiny_model_dir, out, sft={**_pipeline(tiny_model_dir, out).sft, "learning_rate": 1e-3})
    with pytest.raises(ConfigError, match=r"stage sft .* other settings: learning_rate"):
        run_pipeline(other)
    summary = run_pipeline(_pipeline(tiny_model_dir, out))
    marker = json.loads((out / "sft" / "stage.json").read_text())
    assert marker["metrics"]["resumed_from"] == str(out / "sft" / "checkpoints" / "checkpoint-1")
    assert marker["metrics"]["global_step"] == 2 and summary["stages"]["sft"]["model_dir"] == str(out / "sft" / "model")


# ---------------------------------------------------------------------------------------------------------------
# An adapter is merged only onto its own base
# ---------------------------------------------------------------------------------------------------------------

def test_an_sft_adapter_exports_only_onto_the_base_it_was_trained_on(tiny_model_dir, tmp_path, capsys):
    from transformers import AutoTokenizer

    from agentic_rl.deploy.export import ExportConfig
    from agentic_rl.deploy.export import run as export
    from agentic_rl.models.tiny import build_tiny_model, save_model_dir
    from agentic_rl.train.sft import SFTConfig
    from agentic_rl.train.sft import run as sft

    other_base = save_model_dir(build_tiny_model(AutoTokenizer.from_pretrained(tiny_model_dir), "micro", seed=1),
                                AutoTokenizer.from_pretrained(tiny_model_dir), tmp_path / "other_base")
    result = sft(SFTConfig(model=str(tiny_model_dir), output_dir=str(tmp_path / "sft"), max_steps=1, batch_size=4,
                           max_train_samples=8, synthetic_test_size=20, max_length=128,
                           report_to="none", merge=False))
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


# ---------------------------------------------------------------------------------------------------------------
# A run directory of an earlier version: the stage's model in merged/ (model/ now)
# ---------------------------------------------------------------------------------------------------------------

def _renamed_error(stage_dir: Path) -> str:
    return (f"{stage_dir / 'merged'}: the folder of a stage's model was renamed to model/; rename it "
            f"(mv {stage_dir / 'merged'} {stage_dir / 'model'}) or re-run the stage")


def _as_earlier_version(run: Path, stage: str) -> None:
    """What an earlier version left: the stage's model in merged/, and every path recorded to it (stage results,
    settings in markers and configs, the summary) naming merged/."""
    (run / stage / "model").rename(run / stage / "merged")
    for path in run.rglob("*"):
        if path.is_file() and (path.suffix in (".json", ".yaml") or path.name == RUN_MARKER):
            path.write_text(path.read_text().replace(str(run / stage / "model"), str(run / stage / "merged")))


def test_a_pipeline_run_of_an_earlier_version_is_reused_only_once_its_model_folder_is_renamed(tiny_model_dir,
                                                                                             tmp_path, capsys):
    from agentic_rl.config import save_config

    out = tmp_path / "run"

    def config() -> PipelineConfig:
        return _pipeline(tiny_model_dir, out, stages=["sft", "export"], evaluate_stages=True, eval_samples=4,
                         eval={"max_new_tokens": 8})

    first = run_pipeline(config())
    assert (out / "sft" / "model" / "model.safetensors").is_file() and not list(out.rglob("merged"))
    _as_earlier_version(out, "sft")
    assert "sft/merged" in (out / "sft" / "stage.json").read_text()  # the old layout, paths and all
    before = _snapshot(out)
    with pytest.raises(ConfigError, match="^" + _renamed_error(out / "sft").replace("(", r"\(").replace(")", r"\)")):
        run_pipeline(config())
    save_config(config(), tmp_path / "pipeline.yaml")
    assert main(["pipeline", "--config", str(tmp_path / "pipeline.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"error: {_renamed_error(out / 'sft')}" and "Traceback" not in err
    assert _snapshot(out) == before  # nothing re-run, nothing overwritten
    # Renamed as the message says: every stage is reused (the recorded merged/ paths now match model/).
    (out / "sft" / "merged").rename(out / "sft" / "model")
    again = run_pipeline(config())
    err = capsys.readouterr().err
    assert "starting" not in err and "other settings" not in err
    assert err.count("already done") == 4  # sft, export and the two evaluations
    assert again["stages"]["sft"]["model_dir"] == str(out / "sft" / "model")
    assert again["stages"]["sft"]["accuracy"] == first["stages"]["sft"]["accuracy"]


def test_a_stage_directory_of_an_earlier_version_is_a_one_line_error_wherever_its_model_is_looked_up(tmp_path,
                                                                                                      capsys,
                                                                                                      monkeypatch):
    from agentic_rl.rewards.reward_model import load_reward_model
    from agentic_rl.runs import claim_stage_dir
    from agentic_rl.tools.rl_training import RLTrainingTool
    from agentic_rl.train.sft import SFT_OUTPUTS, SFTConfig

    monkeypatch.chdir(tmp_path)
    old = tmp_path / "sft"  # a finished SFT run as an earlier version wrote it
    (old / "merged").mkdir(parents=True)
    (old / "merged" / "config.json").write_text("{}")
    (old / "metrics.json").write_text("{}")
    (old / RUN_MARKER).write_text('{"created_by": "agentic-rl", "kind": "sft"}')
    before = _snapshot(tmp_path)
    message = _renamed_error(old)
    # --resume would train on and leave the old model beside the new one; eval (and every stage's --model) would
    # find no model in the stage directory
    for argv in (["sft", "--model", "m", "--output-dir", str(old), "--resume"],
                 ["eval", str(old), "--output-dir", str(tmp_path / "eval")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.strip().splitlines()[-1] == f"error: {message}" and "Traceback" not in err, argv
    assert _snapshot(tmp_path) == before and not (tmp_path / "eval").exists() and not (tmp_path / "runs").exists()
    with pytest.raises(ConfigError, match="renamed to model/"):
        load_reward_model(old)  # the reward model's run directory as a reward
    tool = RLTrainingTool(tmp_path / "tool")  # the rl_training tool's registry of earlier runs
    tool.runs["sft_1"] = {"model_dir": str(old / "merged")}
    with pytest.raises(ConfigError, match="renamed to model/"):
        tool._model_path("sft_1")
    # --overwrite replaces the earlier run: its merged/ goes with the rest of its outputs
    claim_stage_dir(old, SFTConfig(overwrite=True), stage="sft", stale=SFT_OUTPUTS, resuming=False)
    assert not (old / "merged").exists() and not (old / "metrics.json").exists()
    # Renamed, the registry's recorded path follows it.
    (old / "model").mkdir()
    tool.runs["sft_2"] = {"model_dir": str(old / "merged")}
    assert tool._model_path("sft_2") == str(old / "model")
