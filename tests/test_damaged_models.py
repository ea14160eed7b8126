"""A damaged model folder is a one-line error in every command that loads models (eval, export, serve, training).

Damage kinds: truncated or overwritten weights, a config.json that is not JSON / not an object / has values of the
wrong type, weights whose shapes disagree with config.json, missing tokenizer files (transformers 5 would quietly
build a one-token tokenizer), NaN weights, and a damaged LoRA adapter.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import write_jsonl

from agentic_rl.cli import main
from agentic_rl.errors import ModelLoadError


def _truncate(d: Path) -> None:
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])


def _garbage(d: Path) -> None:
    (d / "model.safetensors").write_bytes(os.urandom(4096))


def _config_not_json(d: Path) -> None:
    (d / "config.json").write_text('{"model_type": "qwen3", ')


def _config_not_object(d: Path) -> None:
    (d / "config.json").write_text("[1, 2, 3]")


def _edit_config(**changes):
    def edit(d: Path) -> None:
        config = json.loads((d / "config.json").read_text())
        config.update(changes)
        (d / "config.json").write_text(json.dumps(config))
    return edit


def _no_tokenizer(d: Path) -> None:
    for f in d.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja") or f.name == "special_tokens_map.json":
            f.unlink()


def _nan_weights(d: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(d / "model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name][..., 0] = float("nan")
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})


DAMAGE = {
    "truncated_weights": (_truncate, "damaged or incomplete"),
    "garbage_weights": (_garbage, "damaged or incomplete"),
    "config_not_json": (_config_not_json, "config.json is damaged: not valid JSON"),
    "config_not_object": (_config_not_object, "config.json is damaged: expected a JSON object"),
    "config_wrong_type": (_edit_config(num_hidden_layers="two"), "num_hidden_layers"),
    "config_zero_heads": (_edit_config(num_attention_heads=0), "cannot load the model"),
    "shape_mismatch": (_edit_config(hidden_size=128), "shapes do not match its config.json"),
    "no_tokenizer": (_no_tokenizer, "has no tokenizer files"),
    "nan_weights": (_nan_weights, "hold NaN/inf"),
}


@pytest.fixture(scope="module")
def damaged(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    out = {}
    for name, (damage, _) in DAMAGE.items():
        shutil.copytree(tiny_model_dir, root / name)
        damage(root / name)
        out[name] = root / name
    return out


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err[-2000:]
    return lines[0]


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_eval_gives_one_line(damaged, kind, tmp_path, capsys):
    code = main(["eval", str(damaged[kind]), "--eval-samples", "2", "--max-new-tokens", "4",
                 "--output-dir", str(tmp_path / "eval")])
    line = _one_error_line(capsys)
    assert code == 2 and DAMAGE[kind][1] in line, line


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_export_gives_one_line_and_writes_nothing(damaged, kind, tmp_path, capsys):
    out = tmp_path / "export"
    code = main(["export", str(damaged[kind]), "--out", str(out)])
    line = _one_error_line(capsys)
    assert code == 2 and DAMAGE[kind][1] in line, line
    assert not (out / "model.safetensors").exists()


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_serve_and_training_loaders_refuse(damaged, kind):
    from agentic_rl.deploy.serve import ServeConfig, _load
    from agentic_rl.models import load_model_and_tokenizer

    with pytest.raises(ModelLoadError, match=DAMAGE[kind][1]) as err:
        _load(ServeConfig(model=str(damaged[kind])))
    assert "\n" not in str(err.value)
    with pytest.raises(ModelLoadError, match=DAMAGE[kind][1]):
        load_model_and_tokenizer(damaged[kind], for_training=True)


@pytest.fixture(scope="module")
def damaged_adapter(tiny_model_dir, tmp_path_factory):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path_factory.mktemp("adapter")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(path)
    data = (path / "adapter_model.safetensors").read_bytes()
    (path / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize("command", ["eval", "export"])
def test_a_truncated_adapter_gives_one_line(damaged_adapter, command, tmp_path, capsys):
    args = (["eval", str(damaged_adapter), "--eval-samples", "2", "--output-dir", str(tmp_path / "e")]
            if command == "eval" else ["export", str(damaged_adapter), "--out", str(tmp_path / "x")])
    assert main(args) == 2
    assert "adapter_model.safetensors is damaged or incomplete" in _one_error_line(capsys)


def test_the_undamaged_model_still_loads_and_exports(tiny_model_dir, tmp_path, capsys):
    assert main(["export", str(tiny_model_dir), "--out", str(tmp_path / "x")]) == 0
    assert (tmp_path / "x" / "model.safetensors").is_file() and (tmp_path / "x" / "tokenizer.json").is_file()


# ---------------------------------------------------------------------------------------------------------------
# Reward models load through the same checks: training one from a damaged causal LM, scoring with a damaged one
# ---------------------------------------------------------------------------------------------------------------

REWARD_MODEL_DAMAGE = ["truncated_weights", "config_zero_heads", "shape_mismatch", "nan_weights"]


def _reward_model_message(kind: str) -> str:
    return "is its config.json damaged" if kind == "config_zero_heads" else DAMAGE[kind][1]


@pytest.mark.parametrize("kind", REWARD_MODEL_DAMAGE)
def test_reward_model_training_from_a_damaged_model_gives_one_line(damaged, kind, tmp_path, capsys):
    pairs = write_jsonl(tmp_path / "pairs.jsonl",
                        [{"prompt": f"{i} + 1 =", "chosen": f" {i + 1}", "rejected": " 0"} for i in range(6)])
    code = main(["reward-model", "--model", str(damaged[kind]), "--dataset", str(pairs),
                 "--output-dir", str(tmp_path / "rm"), "--max-steps", "1", "--report-to", "none"])
    line = _one_error_line(capsys)
    assert code == 2 and _reward_model_message(kind) in line, line
    assert not (tmp_path / "rm").exists()


@pytest.fixture(scope="module")
def damaged_reward_models(tiny_model_dir, tmp_path_factory):
    """A one-output sequence classifier (what `agentic-rl reward-model` saves) with each kind of damage."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    root = tmp_path_factory.mktemp("damaged_rm")
    clean = root / "clean"
    AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1).save_pretrained(clean)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(clean)
    out = {"clean": clean}
    for name in REWARD_MODEL_DAMAGE:
        shutil.copytree(clean, root / name)
        DAMAGE[name][0](root / name)
        out[name] = root / name
    return out


@pytest.mark.parametrize("kind", REWARD_MODEL_DAMAGE)
def test_the_reward_model_reward_refuses_a_damaged_model_in_one_line(damaged_reward_models, kind):
    from agentic_rl.rewards import build_rewards

    with pytest.raises(ModelLoadError, match=_reward_model_message(kind)) as err:
        build_rewards([f"rm:{damaged_reward_models[kind]}"])
    assert "\n" not in str(err.value)
    funcs, _ = build_rewards([f"rm:{damaged_reward_models['clean']}"])  # the undamaged one scores
    assert len(funcs[0](["Final Answer: 4"], prompts=["2 + 2 ="])) == 1
