from dataclasses import dataclass, field

import pytest

from agentic_rl.cli import main
from agentic_rl.config import config_from_args, load_config, save_config
from agentic_rl.errors import ConfigError


@dataclass
class ToyConfig:
    learning_rate: float = field(default=1e-5, metadata={"help": "peak learning rate"})
    steps: int = field(default=10, metadata={"help": "optimizer steps"})
    use_lora: bool = field(default=True, metadata={"help": "train a LoRA adapter"})
    rewards: list[str] = field(default_factory=lambda: ["accuracy:1.0"], metadata={"help": "rewards", "flag": "reward"})
    output_dir: str | None = field(default=None, metadata={"help": "run directory"})
    loss_type: str = field(default="grpo", metadata={"help": "loss", "choices": ["grpo", "dapo"]})


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("learning_rate: 3e-4\nsteps: 5\nuse_lora: false\n")
    cfg = load_config(ToyConfig, path, {"steps": 7})
    assert cfg.learning_rate == pytest.approx(3e-4)
    assert cfg.steps == 7 and cfg.use_lora is False


def test_unknown_key_names_the_key_and_suggests(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("lerning_rate: 1e-4\n")
    with pytest.raises(ConfigError, match="lerning_rate.*did you mean 'learning_rate'"):
        load_config(ToyConfig, path)


@pytest.mark.parametrize("key,value", [("steps", "ten"), ("steps", 1.5), ("use_lora", "maybe"), ("rewards", 3),
                                       ("learning_rate", "fast")])
def test_wrong_type_names_the_key(tmp_path, key, value):
    with pytest.raises(ConfigError, match=key):
        load_config(ToyConfig, None, {key: value})


def test_choices_are_enforced():
    with pytest.raises(ConfigError, match="loss_type"):
        load_config(ToyConfig, None, {"loss_type": "ppo"})


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(ToyConfig, None, {"steps": 3, "rewards": ["accuracy:1.0", "format:0.2"]})
    path = save_config(cfg, tmp_path / "config.yaml")
    assert load_config(ToyConfig, path) == cfg


def test_cli_flags_override_yaml(tmp_path):
    import argparse

    from agentic_rl.config import add_config_arguments

    path = tmp_path / "c.yaml"
    path.write_text("steps: 5\nlearning_rate: 0.1\n")
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, ToyConfig)
    args = parser.parse_args(["--steps", "9", "--no-use-lora", "--reward", "a:1", "--reward", "b:2"])
    cfg = config_from_args(ToyConfig, args, yaml_path=path)
    assert (cfg.steps, cfg.learning_rate, cfg.use_lora, cfg.rewards) == (9, 0.1, False, ["a:1", "b:2"])


#: Every command the CLI offers: removing one (or adding one) must be a decision that updates this list.
EXPECTED_COMMANDS = ["data", "reward", "pretrain", "sft", "grpo", "reward-model", "preferences", "eval", "quickstart",
                     "pipeline", "compare", "tune", "export", "serve"]


def test_top_level_help_lists_every_stage(capsys):
    """The help lists exactly the command table's commands, one entry each (with its help text), in order; the
    command table is the expected one."""
    import re

    from agentic_rl.cli import COMMANDS

    assert list(COMMANDS) == EXPECTED_COMMANDS
    assert main([]) == 0
    out = capsys.readouterr().out
    listed = re.findall(r"^    ([a-z][a-z-]*)(?:\s|$)", out, flags=re.MULTILINE)  # "    sft         Supervised ..."
    assert listed == EXPECTED_COMMANDS
    flat = " ".join(out.split())
    for name, stage in COMMANDS.items():
        assert " ".join(stage.help.split()) in flat, name


def test_stage_reads_its_section_of_a_pipeline_file(tmp_path):
    import argparse

    from agentic_rl.config import add_config_arguments

    @dataclass
    class StageConfig:
        model: str = field(default="m", metadata={"help": "model"})
        seed: int = field(default=0, metadata={"help": "seed"})
        steps: int = field(default=1, metadata={"help": "steps"})

    path = tmp_path / "pipeline.yaml"
    path.write_text("model: base-dir\nseed: 3\neval_samples: 10\nsft:\n  steps: 7\ngrpo:\n  steps: 99\n")
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, StageConfig)
    cfg = config_from_args(StageConfig, parser.parse_args([]), yaml_path=path, section="sft")
    assert (cfg.model, cfg.seed, cfg.steps) == ("base-dir", 3, 7)
    path.write_text("model: base-dir\nsft:\n  stepz: 7\n")
    with pytest.raises(ConfigError, match="stepz"):
        config_from_args(StageConfig, parser.parse_args([]), yaml_path=path, section="sft")


@pytest.mark.parametrize("command", sorted(__import__("agentic_rl.cli", fromlist=["COMMANDS"]).COMMANDS))
def test_every_command_has_help_listing_its_settings(command, capsys):
    from agentic_rl.cli import _load_command

    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    config_cls, _, _ = _load_command(command)
    import dataclasses

    for f in dataclasses.fields(config_cls):
        shown = f.name if f.metadata.get("positional") else "--" + f.metadata.get("flag", f.name).replace("_", "-")
        assert shown in out, f"{command} --help does not list {shown}"
        assert f.metadata.get("help"), f"{command}: setting {f.name} has no help text"


def test_bad_input_is_one_line_error_not_traceback(capsys):
    assert main(["data", "stats", "--source", "/nonexistent/file.jsonl"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "/nonexistent/file.jsonl" in err[0]
