"""Every YAML the project ships loads into the schema it is meant for, with no unknown or mistyped key.

* ``configs/accelerate/*.yaml``: accelerate's own loader (which rejects unknown keys), plus the DeepSpeed keys
  checked against what accelerate's DeepSpeed plugin and launcher understand;
* pipeline presets (``configs/*.yaml``, the package's ``agentic_rl/configs/*.yaml``): ``PipelineConfig``, and each
  stage section resolved into that stage's config class exactly as the pipeline will (types and ``__post_init__``
  checks included);
* hyper-parameter search files (a ``space:`` key): ``TuneConfig`` and the search space parsed and validated.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIRS = [REPO / "configs", REPO / "src" / "agentic_rl" / "configs"]
ALL_YAML = sorted(p for d in CONFIG_DIRS if d.is_dir() for p in d.rglob("*.yaml"))
ACCELERATE = [p for p in ALL_YAML if p.parent.name == "accelerate"]
OTHER = [p for p in ALL_YAML if p.parent.name != "accelerate"]


def _ids(paths):
    return [str(p.relative_to(REPO)) for p in paths]


def test_the_expected_files_are_shipped():
    names = {str(p.relative_to(REPO)) for p in ALL_YAML}
    for expected in ("configs/accelerate/ddp.yaml", "configs/accelerate/zero2.yaml",
                     "configs/accelerate/zero3_offload.yaml", "configs/qwen3-0.6b-gsm8k.yaml"):
        assert expected in names


@pytest.mark.parametrize("path", ACCELERATE, ids=_ids(ACCELERATE))
def test_accelerate_config_loads(path):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import DeepSpeedPlugin, DistributedType

    config = load_config_from_file(str(path))  # raises on unknown top-level keys
    assert isinstance(config, ClusterConfig)
    assert config.num_machines >= 1 and config.num_processes >= 1 and config.mixed_precision == "bf16"
    if config.distributed_type == DistributedType.DEEPSPEED:
        plugin_fields = {f.name for f in dataclasses.fields(DeepSpeedPlugin)}
        launcher_keys = {"deepspeed_multinode_launcher", "deepspeed_hostfile", "deepspeed_exclusion_filter",
                         "deepspeed_inclusion_filter", "deepspeed_config_file"}
        unknown = set(config.deepspeed_config) - plugin_fields - launcher_keys
        assert not unknown, f"{path.name}: DeepSpeed keys accelerate does not know: {sorted(unknown)}"
        plugin = DeepSpeedPlugin(**{k: v for k, v in config.deepspeed_config.items() if k in plugin_fields})
        assert plugin.zero_stage in (2, 3)
    else:
        assert config.distributed_type == DistributedType.MULTI_GPU


def test_accelerate_files_say_what_they_promise():
    from accelerate.commands.config.config_args import load_config_from_file

    zero2 = load_config_from_file(str(REPO / "configs/accelerate/zero2.yaml")).deepspeed_config
    zero3 = load_config_from_file(str(REPO / "configs/accelerate/zero3_offload.yaml")).deepspeed_config
    assert zero2["zero_stage"] == 2 and zero2["offload_optimizer_device"] == "none"
    assert zero3["zero_stage"] == 3 and zero3["offload_optimizer_device"] == "cpu"
    assert zero3["offload_param_device"] == "cpu" and zero3["zero3_save_16bit_model"] is True


@pytest.mark.parametrize("path", OTHER, ids=_ids(OTHER))
def test_project_yaml_loads_into_its_schema(path):
    from agentic_rl.config import config_from_dict

    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path}: top level must be a mapping"
    if "space" in data:  # a hyper-parameter search file
        from agentic_rl.tune import TuneConfig, base_values, parse_space, stage_class, validate_space

        tune = config_from_dict(TuneConfig, data, where=str(path))
        cls, _ = stage_class(tune.stage)
        validate_space(cls, parse_space(tune.space, tune.params), base_values(tune, cls), tune.search)
        return
    if "stages" not in data:  # one stage's settings file (`agentic-rl STAGE --config FILE`): exactly one stage takes it
        from agentic_rl.errors import ConfigError
        from agentic_rl.stages import STAGES

        accepted = []
        for stage in STAGES.values():
            try:
                config_from_dict(stage.config_class, data, where=str(path))
                accepted.append(stage.name)
            except ConfigError:
                pass
        assert len(accepted) == 1, f"{path.name}: stages that accept it: {accepted}"
        return
    from agentic_rl.pipeline import _check_sections, load_pipeline_config

    pipeline = load_pipeline_config(path)
    # The pipeline's own resolver: every stage section with the values the pipeline gives it (model, dataset, seed,
    # system prompt, environment settings), types and cross-field rules, as before a real run.
    _check_sections(pipeline, Path("runs") / pipeline.name)
    unused = [name for name in ("pretrain", "sft", "grpo", "sft_continued") if getattr(pipeline, name)
              and name not in pipeline.stages and not (name == "sft" and "sft_continued" in pipeline.stages)]
    assert not unused, f"{path.name}: sections {unused} are set but their stages do not run"


def test_gpu_preset_is_the_seed_band():
    from agentic_rl.pipeline import load_pipeline_config

    preset = load_pipeline_config(REPO / "configs" / "qwen3-0.6b-gsm8k.yaml")
    assert preset.model == "Qwen/Qwen3-0.6B" and preset.stages[:2] == ["sft", "grpo"]
    assert 1e-6 <= float(preset.grpo["learning_rate"]) <= 1e-5
    assert preset.grpo["beta"] == 0.05 and preset.grpo["bf16"] is True
    assert preset.grpo["vllm_mode"] == "colocate"
    assert preset.sft["lora_r"] >= 8 and "full" not in preset.sft and "full" not in preset.grpo  # LoRA


@pytest.mark.parametrize("preset", sorted(p.stem for p in (REPO / "src" / "agentic_rl" / "configs").glob("*.yaml")))
@pytest.mark.parametrize("native_bf16", [True, False])
def test_no_preset_pins_a_precision(monkeypatch, preset, native_bf16):
    """Every embedded preset learns in fp32 and in bf16: each training stage (the control included) takes the
    stages' default, bf16 mixed precision where the CPU computes bf16 natively and fp32 elsewhere."""
    from agentic_rl import utils
    from agentic_rl.pipeline import (_section, _stage_class, _stage_config, _train_defaults, load_pipeline_config,
                                     preset_path)

    monkeypatch.setattr(utils, "has_gpu", lambda: False)
    monkeypatch.setattr(utils, "cpu_computes_bf16", lambda: native_bf16)
    pipeline = load_pipeline_config(preset_path(preset))
    for name in ("sft", "grpo", "sft_continued"):
        defaults = _train_defaults(pipeline, name, "runs/x/model", Path("runs/x") / name)
        config = _stage_config(_stage_class(name), _section(pipeline, name), defaults, where=name)
        assert config.bf16 is native_bf16, name
