"""The stage contract: one table of stages, one rule for the pipeline keys a stage inherits, one run directory.

A stage run on its own with a pipeline preset (``agentic-rl grpo --config quickstart-agentic.yaml``) resolves the
settings the pipeline gives that stage, and every stage marks a finished run with the same file.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

from agentic_rl.config import config_from_args, read_yaml
from agentic_rl.errors import ConfigError
from agentic_rl.locking import LOCK_FILE
from agentic_rl.runs import FINISHED_MARKER, RUN_MARKER, StageRun, settings_of, write_marker
from agentic_rl.stages import STAGES, get_stage, inherited_settings

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
#: The pipeline files shipped (a stage's own settings file, such as configs/embedded-base.yaml, has no `stages`).
PRESETS = [path for path in sorted((REPO / "src" / "agentic_rl" / "configs").glob("*.yaml"))
           + sorted((REPO / "configs").glob("*.yaml")) if "stages" in yaml.safe_load(path.read_text(encoding="utf-8"))]

#: Settings the pipeline sets per run, which a stage run on its own with the preset cannot know:
PER_RUN = {
    "output_dir": "the pipeline writes each stage into runs/<name>/<stage>/",
    "model": "the pipeline trains each stage on the previous stage's model (the preset's `model` is the first one)",
    "models": "the pipeline evaluates the model each stage produced",
}


def _cli_config(stage: str, preset: Path):
    """The config ``agentic-rl STAGE --config PRESET`` resolves, on the command line's own parsing path."""
    from agentic_rl.cli import build_parser

    args = build_parser(only=stage).parse_args([stage, "--config", str(preset)])
    return config_from_args(get_stage(stage).config_class, args, yaml_path=args._config_file, section=stage)


def _stages_of(preset: Path) -> list[str]:
    """The preset's stages that are commands of their own, and ``eval`` when the pipeline evaluates them."""
    from agentic_rl.pipeline import load_pipeline_config

    pipeline = load_pipeline_config(preset)
    stages = [name for name in pipeline.stages if name in STAGES and name != "export"]
    return stages + (["eval"] if pipeline.evaluate_stages else [])


CASES = [(preset, stage) for preset in PRESETS for stage in _stages_of(preset)]


def test_every_shipped_preset_is_covered():
    from agentic_rl.pipeline import PER_RUN_KEYS

    assert len(PRESETS) >= 5 and {stage for _, stage in CASES} == {"sft", "grpo", "eval"}
    assert set(PER_RUN) == set(PER_RUN_KEYS)  # the pipeline's own list of what it sets per run


@pytest.mark.parametrize("preset,stage", CASES, ids=[f"{p.stem}-{s}" for p, s in CASES])
def test_a_stage_run_with_a_preset_resolves_the_pipelines_settings_for_it(preset, stage):
    from agentic_rl.pipeline import load_pipeline_config, resolve_stage_config

    pipeline = resolve_stage_config(load_pipeline_config(preset), stage, "runs/x/previous/model", Path("runs/x"))
    alone = _cli_config(stage, preset)
    assert type(alone) is type(pipeline)
    ours, theirs = settings_of(alone), settings_of(pipeline)
    differing = {key: (ours[key], theirs[key]) for key in ours if key not in PER_RUN and ours[key] != theirs[key]}
    assert differing == {}, f"{stage} --config {preset.name} resolves other settings than the pipeline's {stage}"
    if "environment" in read_yaml(preset):  # the preset's environment reaches every stage that has the setting
        assert not hasattr(alone, "environment") or alone.environment == read_yaml(preset)["environment"]


def test_inherited_settings_follow_the_table_and_the_environment():
    from agentic_rl.eval.evaluate import EvalConfig
    from agentic_rl.train.pretrain import PretrainConfig
    from agentic_rl.train.sft import SFTConfig

    pipeline = {"model": "m", "dataset": "d", "seed": 3, "synthetic_seed": 1, "eval_samples": 7, "max_turns": 2,
                "stages": ["sft"]}
    assert inherited_settings(pipeline, "pretrain", PretrainConfig) == {"seed": 3, "synthetic_seed": 1}
    sft = inherited_settings(pipeline, "sft", SFTConfig)
    assert sft == {"model": "m", "dataset": "d", "seed": 3, "synthetic_seed": 1}  # no eval_samples, no max_turns
    assert inherited_settings(pipeline, "eval", EvalConfig)["eval_samples"] == 7  # only evaluation takes it
    with_env = inherited_settings({**pipeline, "environment": "calculator"}, "sft", SFTConfig)
    assert with_env["environment"] == "calculator" and with_env["max_turns"] == 2
    # A key left out: the pipeline's default where the stage's own differs from it (and never the embedded model).
    assert inherited_settings({}, "eval", EvalConfig) == {"eval_samples": 500}
    assert inherited_settings({}, "sft", SFTConfig) == {}


# ---------------------------------------------------------------------------------------------------------------
# One table of stages
# ---------------------------------------------------------------------------------------------------------------

def test_no_second_table_maps_stage_names_to_their_modules():
    """Outside stages.py no source file names a stage's module as a string (a second table would)."""
    modules = {stage.module for stage in STAGES.values()}
    found = []
    for path in sorted((REPO / "src" / "agentic_rl").rglob("*.py")):
        if path.name == "stages.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in modules:
                found.append((path.name, node.value))
    assert found == []


# ---------------------------------------------------------------------------------------------------------------
# One run directory
# ---------------------------------------------------------------------------------------------------------------

def test_every_stage_marks_a_finished_run_with_the_same_file(tmp_path):
    from agentic_rl.train.preferences import PreferencesConfig

    config = PreferencesConfig(model="m", output_dir=str(tmp_path / "p"))
    run = StageRun(tmp_path / "p", config, stage="preferences")
    assert run.check() is None and not (tmp_path / "p").exists()  # the check writes nothing
    (tmp_path / "p").mkdir()
    write_marker(tmp_path / "p", "preferences")  # an earlier, unfinished run of the stage
    (tmp_path / "p" / "pairs.jsonl").write_text("old")
    run.claim()
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == sorted([RUN_MARKER, LOCK_FILE, "config.yaml"])
    run.finish({"pairs_path": str(tmp_path / "p" / "pairs.jsonl")})
    marker = json.loads((tmp_path / "p" / FINISHED_MARKER).read_text())
    assert marker["stage"] == "preferences" and marker["settings"]["model"] == "m" and "wall_time_s" in marker
    with pytest.raises(ConfigError, match="already holds a finished preferences run; pass --overwrite"):
        StageRun(tmp_path / "p", config, stage="preferences").check()
    for name, stage in STAGES.items():  # what each stage writes is removed on --overwrite, its marker with it
        assert FINISHED_MARKER not in stage.writes and (not stage.trains or "model" in stage.writes), name
