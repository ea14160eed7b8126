"""An adapter is applied only to the base it was trained on, whatever float type that base is loaded in.

``base_fingerprint.json`` records sampled weights of the base; the check must pass the same base loaded in float32,
bfloat16 or float16 (export ``--dtype float16``, a GPU without bf16) and refuse another base or a trained one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentic_rl.cli import main
from agentic_rl.errors import ModelLoadError
from agentic_rl.models.fingerprint import BASE_FINGERPRINT_FILE, weights_fingerprint, write_base_fingerprint
from agentic_rl.models.loading import load_model_and_tokenizer


def _adapter_over(base_dir: Path, out: Path, *, fingerprint=None) -> Path:
    """A LoRA adapter over ``base_dir`` (float32), with the base's fingerprint recorded as training records it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir)
    recorded = fingerprint if fingerprint is not None else weights_fingerprint(base)
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(out)
    write_base_fingerprint(out, recorded, base_dir)
    return out


def _copy_base(base_dir: Path, out: Path, edit) -> Path:
    """``base_dir`` with its weights changed by ``edit(name, tensor)``."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(base_dir, out)
    tensors = load_file(str(out / "model.safetensors"))
    for name in tensors:
        tensors[name] = edit(name, tensors[name])
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory) -> Path:
    return _adapter_over(tiny_model_dir, tmp_path_factory.mktemp("fp") / "adapter")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_same_base_in_any_float_type_is_accepted(adapter, dtype):
    import torch

    model, _ = load_model_and_tokenizer(adapter, dtype=dtype, device="cpu", for_training=False)
    assert next(model.parameters()).dtype == getattr(torch, dtype)


def test_export_in_float16_accepts_the_adapters_own_base(adapter, tmp_path):
    assert main(["export", str(adapter), "--out", str(tmp_path / "fp16"), "--dtype", "float16"]) == 0
    assert (tmp_path / "fp16" / "model.safetensors").is_file()


def test_the_recorded_samples_differ_under_float16_rounding(adapter, tiny_model_dir):
    """Guards the test above: the fixture's float32 weights do round differently in float16 (so a hash of the
    values would refuse the base), and the recorded values are the float32 ones."""
    import torch
    from transformers import AutoModelForCausalLM

    recorded = json.loads((adapter / BASE_FINGERPRINT_FILE).read_text())
    half = weights_fingerprint(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float16))
    assert half["fingerprint"] != recorded["fingerprint"]
    assert any(half["tensors"][n]["values"] != t["values"] for n, t in recorded["tensors"].items())


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_another_base_is_refused(adapter, tiny_model_dir, tmp_path, dtype):
    from transformers import AutoTokenizer

    from agentic_rl.models.tiny import build_tiny_model, save_model_dir

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    other = save_model_dir(build_tiny_model(tokenizer, "micro", seed=1), tokenizer, tmp_path / "other")
    config = json.loads((adapter / "adapter_config.json").read_text())
    moved = _adapter_over(tiny_model_dir, tmp_path / "moved",
                          fingerprint=json.loads((adapter / BASE_FINGERPRINT_FILE).read_text()))
    (moved / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(other)}))
    with pytest.raises(ModelLoadError, match="trained on another base model"):
        load_model_and_tokenizer(moved, dtype=dtype, device="cpu", for_training=False)


def test_a_slightly_trained_base_is_refused(adapter, tiny_model_dir, tmp_path):
    """A base that training moved a little (one projection, by 1e-4: far less than the weights' 0.02 scale) is not
    the base the adapter was trained on: the tolerance is float rounding, not closeness."""
    import torch

    generator = torch.Generator().manual_seed(0)

    def nudge(name, tensor):
        if name.endswith("layers.1.self_attn.v_proj.weight"):
            return tensor + 1e-4 * torch.randn(tensor.shape, generator=generator)
        return tensor

    trained = _copy_base(tiny_model_dir, tmp_path / "trained", nudge)
    config = json.loads((adapter / "adapter_config.json").read_text())
    moved = tmp_path / "moved"
    _adapter_over(tiny_model_dir, moved, fingerprint=json.loads((adapter / BASE_FINGERPRINT_FILE).read_text()))
    (moved / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(trained)}))
    with pytest.raises(ModelLoadError, match=r"another base model .*other values in .*layers\.1\.self_attn\.v_proj"):
        load_model_and_tokenizer(moved, dtype="float16", device="cpu", for_training=False)


def test_an_old_hash_only_record_still_checks_exact_loads_and_warns_for_float16(tiny_model_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    old_hash = weights_fingerprint(AutoModelForCausalLM.from_pretrained(tiny_model_dir))["fingerprint"]
    adapter = _adapter_over(tiny_model_dir, tmp_path / "old", fingerprint=old_hash)
    assert set(json.loads((adapter / BASE_FINGERPRINT_FILE).read_text())) == {"fingerprint", "base_model"}
    load_model_and_tokenizer(adapter, dtype="bfloat16", device="cpu", for_training=False)
    capsys.readouterr()
    load_model_and_tokenizer(adapter, dtype="float16", device="cpu", for_training=False)
    assert "cannot check that" in capsys.readouterr().err
    other_hash = "0" * 16
    wrong = _adapter_over(tiny_model_dir, tmp_path / "wrong", fingerprint=other_hash)
    with pytest.raises(ModelLoadError, match="trained on another base model"):
        load_model_and_tokenizer(wrong, dtype="float32", device="cpu", for_training=False)
