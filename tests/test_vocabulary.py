"""One concept, one name: every stage config and every shipped YAML uses TRL's name for a concept TRL names.

The table below is the vocabulary: concept -> (the one name, other names the same concept has gone by). A config
field or a YAML key under another name, or ``report_to`` / ``gradient_checkpointing`` with a different type in some
stage, fails here. A name earlier versions used is an unknown key like any other (CHANGELOG.md lists them).
The table also names the folder each stage writes its model to, and a stage that wrote it under another name (in its
list of outputs, or as a path anywhere in the package's code) fails here too.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import yaml

from agentic_rl.cli import COMMANDS, build_parser, main
from agentic_rl.config import config_from_args, config_from_dict, load_config
from agentic_rl.errors import ConfigError
from agentic_rl.stages import STAGES

REPO = Path(__file__).resolve().parents[1]
SHIPPED_YAML = sorted(p for d in (REPO / "configs", REPO / "src" / "agentic_rl" / "configs") for p in d.glob("*.yaml"))

# concept -> (the name every config uses, names the same concept must not appear under)
VOCABULARY: dict[str, tuple[str, set[str]]] = {
    "gradient accumulation": ("gradient_accumulation_steps",
                              {"grad_accum", "gradient_accumulation", "grad_accum_steps", "accumulation_steps"}),
    "learning-rate schedule": ("lr_scheduler_type", {"lr_scheduler", "scheduler", "lr_schedule", "scheduler_type"}),
    "LoRA target modules": ("lora_target_modules", {"lora_target", "lora_targets", "target_modules"}),
    "metric backends": ("report_to", {"report", "log_with", "loggers", "logging_backend"}),
    "gradient checkpointing": ("gradient_checkpointing",
                               {"activation_checkpointing", "grad_checkpointing", "checkpoint_activations"}),
    "training-set size": ("max_train_samples", {"train_samples", "num_train_samples", "train_size",
                                                "max_train_rows"}),
    "held-out size": ("eval_samples", {"heldout_samples", "max_eval_samples", "num_eval_samples", "eval_size",
                                       "validation_samples", "test_samples"}),
    "synthetic-data seed": ("synthetic_seed", {"data_seed", "synthetic_data_seed", "task_seed", "dataset_seed"}),
    "LoRA or full fine-tuning": ("full", {"use_lora", "lora", "use_peft", "full_finetune", "full_fine_tuning",
                                         "finetune_type"}),
    # not a setting but a folder: <stage>/model/ in every stage's run directory
    "model output folder": ("model", {"merged", "merged_model", "final_model", "output_model", "model_final"}),
}
#: Each stage that trains a model (what it writes into its run directory is in the table of stages).
TRAINING_STAGES = [name for name, stage in STAGES.items() if stage.trains]
# ``max_samples`` was both the training-set size (SFT) and the held-out size (evaluation), and SFT's
# ``synthetic_train_size`` its training-set size too: in the stages that train or evaluate they are no names at all.
# (The data tools and the reward model keep ``max_samples`` for "rows drawn from a source", and the data tools
# ``synthetic_train_size`` for the size of the synthetic source's train split they draw from.)
RETIRED_IN_STAGES = {"max_samples": ("sft", "grpo", "eval", "pipeline", "quickstart", "tune"),
                     "synthetic_train_size": ("sft", "grpo", "eval", "pipeline", "quickstart", "tune")}
#: (old name, the name every stage uses now, a command whose config has the new name): names earlier versions used,
#: listed in CHANGELOG.md; each is now an unknown key.
OLD_NAMES = [("grad_accum", "gradient_accumulation_steps", "sft"), ("lr_scheduler", "lr_scheduler_type", "sft"),
             ("lora_target", "lora_target_modules", "sft"), ("max_samples", "max_train_samples", "sft"),
             ("max_samples", "eval_samples", "eval"), ("synthetic_train_size", "max_train_samples", "sft"),
             ("heldout_samples", "eval_samples", "grpo"), ("heldout_samples", "eval_samples", "sft"),
             ("data_seed", "synthetic_seed", "pretrain")]
# Commands that read the synthetic task: each takes the one synthetic_seed.
READ_SYNTHETIC = ("data", "pretrain", "sft", "grpo", "preferences", "eval", "pipeline")
# Commands that train LoRA or the whole model: each has `full`, and its --help says what the stage does by default.
LORA_OR_FULL = ("sft", "grpo", "reward-model")
# name -> the one type it has in every config that has it
TYPES: dict[str, typing.Any] = {"report_to": list[str], "gradient_checkpointing": bool | None}


def _stage_configs() -> dict[str, type]:
    classes = {}
    for command, stage in COMMANDS.items():
        classes[command] = stage.config_class
    return classes


def _field_types(cls: type) -> dict[str, typing.Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _yaml_keys(data, path=""):
    """Every (dotted path, key, value) of a YAML mapping, nested sections included."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield f"{path}{key}", str(key), value
            yield from _yaml_keys(value, f"{path}{key}.")


def test_the_table_covers_every_old_name():
    names = {name for name, _ in VOCABULARY.values()}
    others = set().union(*(old for _, old in VOCABULARY.values())) | set(RETIRED_IN_STAGES)
    assert {new for _, new, _ in OLD_NAMES} <= names and {old for old, _, _ in OLD_NAMES} <= others


@pytest.mark.parametrize("command", list(COMMANDS))
def test_stage_config_uses_one_name_per_concept(command):
    types = _field_types(_stage_configs()[command])
    for concept, (name, other_names) in VOCABULARY.items():
        under_other = sorted(set(types) & other_names)
        assert not under_other, f"{command}: {concept} is called {under_other}, not {name!r}"
    for name, tp in TYPES.items():
        if name in types:
            assert types[name] == tp, f"{command}: {name} is {types[name]}, every stage has {tp}"
    for old, commands in RETIRED_IN_STAGES.items():
        if command in commands:
            assert old not in types, f"{command}: {old} is max_train_samples or eval_samples now"
    if command in READ_SYNTHETIC:
        assert "synthetic_seed" in types, f"{command} reads the synthetic task: it needs synthetic_seed"


@pytest.mark.parametrize("command", LORA_OR_FULL)
def test_the_lora_or_full_switch_states_the_stage_default_in_its_help(command, capsys):
    cls = _stage_configs()[command]
    assert dataclasses.fields(cls) and _field_types(cls)["full"] is bool
    assert next(f for f in dataclasses.fields(cls) if f.name == "full").default is False
    with pytest.raises(SystemExit):
        build_parser(only=command).parse_args([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--full full fine-tuning instead of LoRA (this stage trains a LoRA adapter by default" in text


def test_the_training_stages_share_the_vocabulary():
    configs = _stage_configs()
    for command in ("sft", "grpo", "reward-model"):
        names = set(_field_types(configs[command]))
        assert {"gradient_accumulation_steps", "lora_target_modules", "report_to"} <= names
    for command in ("pretrain", "sft", "grpo"):
        assert "lr_scheduler_type" in _field_types(configs[command])
    for command in ("sft", "grpo"):
        assert "gradient_checkpointing" in _field_types(configs[command])


@pytest.mark.parametrize("path", SHIPPED_YAML, ids=[str(p.relative_to(REPO)) for p in SHIPPED_YAML])
def test_shipped_yaml_uses_one_name_per_concept(path):
    data = yaml.safe_load(path.read_text())
    for where, key, value in _yaml_keys(data):
        for concept, (name, other_names) in VOCABULARY.items():
            assert key not in other_names, f"{path.name}: {where} names {concept}; call it {name!r}"
        assert key not in RETIRED_IN_STAGES, f"{path.name}: {where} is max_train_samples or eval_samples"
        if key == "gradient_checkpointing":
            assert value is None or isinstance(value, bool), f"{path.name}: {where} must be true, false or null"
        if key == "report_to":
            assert isinstance(value, list), f"{path.name}: {where} should be a list, as in every stage"


def test_the_training_stages_are_known():
    assert set(TRAINING_STAGES) == {"pretrain", "sft", "grpo", "reward-model"}


@pytest.mark.parametrize("stage", TRAINING_STAGES)
def test_every_stage_writes_its_model_to_the_one_model_folder(stage):
    from agentic_rl.runs import MODEL_FOLDER

    name, other_names = VOCABULARY["model output folder"]
    outputs = STAGES[stage].writes
    assert MODEL_FOLDER == name and name in outputs, f"{stage} does not write {name}/"
    assert not set(outputs) & other_names, f"{stage} writes its model to {sorted(set(outputs) & other_names)}"


def test_no_code_names_the_model_folder_otherwise():
    """A path component such as ``out / "merged"`` or ``"runs/sft/merged"`` anywhere in the package fails."""
    import ast

    _, other_names = VOCABULARY["model output folder"]
    package = REPO / "src" / "agentic_rl"
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        assigned = {id(node.value): node.targets[0].id for node in ast.walk(tree)
                    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip()
                    and not any(c.isspace() for c in node.value)
                    and set(node.value.strip("/").split("/")) & other_names):
                found.append((str(path.relative_to(package)), assigned.get(id(node), node.lineno)))
    assert found == []


# ---------------------------------------------------------------------------------------------------------------
# Names and values of earlier versions: unknown keys and wrong types, like any other
# ---------------------------------------------------------------------------------------------------------------

#: What difflib suggests for an old name, where it finds the current one.
SUGGESTED = {("lr_scheduler", "sft"): "lr_scheduler_type", ("lora_target", "sft"): "lora_target_modules",
             ("max_samples", "sft"): "max_train_samples", ("heldout_samples", "sft"): "eval_samples"}


@pytest.mark.parametrize("old,new,command", OLD_NAMES)
def test_an_old_name_in_a_dict_is_an_unknown_key(old, new, command):
    cls = _stage_configs()[command]
    assert new in _field_types(cls) and old not in _field_types(cls)
    hint = rf" \(did you mean '{SUGGESTED[old, command]}'\?\)" if (old, command) in SUGGESTED else r"( \(.*\))?"
    with pytest.raises(ConfigError, match=rf"^unknown config key '{old}' in {command}{hint}$"):
        config_from_dict(cls, {old: ["q_proj"] if old == "lora_target" else 2}, where=command)


def test_the_changelog_gives_every_old_name_its_current_name():
    changelog = (REPO / "CHANGELOG.md").read_text()
    unreleased = changelog.split("## [0.2.0]", 1)[1].split("\n## [", 1)[0]
    for old, new, _ in OLD_NAMES:
        assert f"`{old}`" in unreleased and f"`{new}`" in unreleased, (old, new)
        line = next(line for line in unreleased.splitlines() if f"`{old}`" in line)
        assert f"`{new}`" in line, (old, new, line)


def test_an_old_name_in_yaml_and_in_a_pipeline_section_is_an_unknown_key(tmp_path):
    from agentic_rl.pipeline import _check_sections, load_pipeline_config
    from agentic_rl.train.pretrain import PretrainConfig

    stage_file = tmp_path / "pretrain.yaml"
    stage_file.write_text("lr_scheduler: linear\n")
    with pytest.raises(ConfigError, match=r"^unknown config key 'lr_scheduler' in .*pretrain\.yaml \(did you mean "
                                          r"'lr_scheduler_type'\?\)$"):
        load_config(PretrainConfig, stage_file)
    pipeline_file = tmp_path / "pipeline.yaml"
    pipeline_file.write_text("model: m\nstages: [sft]\nsft:\n  grad_accum: 2\n")
    with pytest.raises(ConfigError, match="unknown config key 'grad_accum'"):
        _check_sections(load_pipeline_config(pipeline_file), tmp_path / "runs")


@pytest.mark.parametrize("command,flag", [("sft", "--grad-accum"), ("sft", "--max-samples"), ("eval", "--max-samples"),
                                          ("grpo", "--heldout-samples"), ("sft", "--synthetic-train-size"),
                                          ("pretrain", "--data-seed")])
def test_an_old_flag_is_refused(command, flag, capsys):
    """No hidden flag stands for an old name any more: the command line refuses it as any unknown flag."""
    try:
        code = main([command, flag, "2"])
    except SystemExit as exc:  # argparse's own refusal
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert flag in err and "renamed" not in err


@pytest.mark.parametrize("value", ["auto", "maybe"])
def test_gradient_checkpointing_takes_only_true_false_or_null(value, tmp_path):
    from agentic_rl.train.sft import SFTConfig

    with pytest.raises(ConfigError, match=r"^config key 'gradient_checkpointing' must be true or false, got "):
        config_from_dict(SFTConfig, {"gradient_checkpointing": value}, from_string=True)
    path = tmp_path / "sft.yaml"
    path.write_text(f"gradient_checkpointing: {value}\n")
    with pytest.raises(ConfigError, match=r"^config key 'gradient_checkpointing' must be true or false, got "):
        load_config(SFTConfig, path)
    for text, meant in (("on", True), ("off", False), ("null", None)):  # as for every true/false setting
        assert config_from_dict(SFTConfig, {"gradient_checkpointing": text},
                                from_string=True).gradient_checkpointing is meant


def test_gradient_checkpointing_is_a_bool_or_unset(tmp_path):
    from agentic_rl.train.sft import SFTConfig, trainer_arguments

    path = tmp_path / "sft.yaml"
    path.write_text("gradient_checkpointing: true\n")
    assert load_config(SFTConfig, path).gradient_checkpointing is True
    args = build_parser(only="sft").parse_args(["sft", "--no-gradient-checkpointing"])
    assert config_from_args(SFTConfig, args).gradient_checkpointing is False
    assert SFTConfig().gradient_checkpointing is None
    on = trainer_arguments(SFTConfig(gradient_checkpointing=True, report_to=["none"]), tmp_path, ["none"], 1000)
    auto = trainer_arguments(SFTConfig(report_to=["none"]), tmp_path, ["none"], 1000)  # CPU, small: off
    assert on.activation_checkpointing is True and auto.activation_checkpointing is False


@pytest.mark.parametrize("command", ["pretrain", "sft", "grpo", "reward-model"])
def test_report_to_is_a_list_from_yaml_flags_and_python(command, tmp_path):
    cls = _stage_configs()[command]
    path = tmp_path / "stage.yaml"
    path.write_text("report_to: none\n")
    assert load_config(cls, path).report_to == ["none"]
    args = build_parser(only=command).parse_args([command, "--report-to", "tensorboard,wandb"])
    assert config_from_args(cls, args).report_to == ["tensorboard", "wandb"]
    assert config_from_dict(cls, {"report_to": ["wandb"]}).report_to == ["wandb"]
    assert cls(report_to="none").report_to == ["none"]
    assert cls().report_to == ["tensorboard"]
    with pytest.raises(ConfigError, match="report_to 'mlflow' is not supported"):
        config_from_dict(cls, {"report_to": "tensorboard,mlflow"})


def test_a_reward_spec_with_commas_given_as_one_yaml_string_stays_one_reward():
    from agentic_rl.config import config_from_dict
    from agentic_rl.train.grpo import GRPOConfig

    spec = "length(alpha=0.01, target_length=0):0.5"
    assert config_from_dict(GRPOConfig, {"model": "m", "rewards": spec}).rewards == [spec]
    assert config_from_dict(GRPOConfig, {"model": "m", "report_to": "tensorboard,wandb"}).report_to == [
        "tensorboard", "wandb"]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_config_declares_its_fields_one_way(command):
    """``name: T = setting(default, help, ...)`` in every config class (and the classes it inherits settings from)."""
    import ast
    import inspect

    for klass in _stage_configs()[command].__mro__:
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(inspect.getsource(klass)).body[0].body
        declared = {stmt.target.id: stmt.value.func.id for stmt in body
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.value, ast.Call)
                    and isinstance(stmt.value.func, ast.Name)}
        other = {name: how for name, how in declared.items() if how != "setting"}
        assert declared and not other, f"{klass.__name__}: {other} are not declared with setting(...)"
