"""Export: LoRA merge is numerically right, the directory loads with plain transformers, the run-dir search order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentic_rl.deploy.export import ExportConfig, resolve_source, run
from agentic_rl.errors import ConfigError, ModelLoadError

PROMPT = [{"role": "user", "content": "Tom has 12 apples and buys 7 more. How many apples does he have?"}]


def _make_adapter(base_dir: Path, adapter_dir: Path):
    """A LoRA adapter with non-zero B (so merging changes the model), saved with the tokenizer."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                        init_lora_weights=False, task_type="CAUSAL_LM")
    peft_model = get_peft_model(base, config).eval()
    peft_model.save_pretrained(str(adapter_dir))
    AutoTokenizer.from_pretrained(str(base_dir)).save_pretrained(str(adapter_dir))
    return peft_model


def _inputs(tokenizer):
    return tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)


def test_adapter_in_run_dir_is_merged_exactly_and_loads_with_plain_transformers(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_root = tmp_path / "run"
    peft_model = _make_adapter(tiny_model_dir, run_root / "sft" / "adapter")
    out = run(ExportConfig(source=str(run_root), out=str(tmp_path / "exported")))

    # A plain transformers directory: safetensors weights, tokenizer with chat template, generation config.
    assert (out / "model.safetensors").is_file() and (out / "generation_config.json").is_file()
    info = json.loads((out / "export_info.json").read_text())
    assert info["kind"] == "adapter" and Path(info["resolved"]) == run_root / "sft" / "adapter"
    tensors = load_file(str(out / "model.safetensors"))
    assert not [k for k in tensors if "lora" in k or k.startswith("base_model")]

    exported = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.chat_template and "<|im_start|>assistant" in tokenizer.apply_chat_template(
        PROMPT, tokenize=False, add_generation_prompt=True)
    assert exported.generation_config.eos_token_id in (tokenizer.eos_token_id, [tokenizer.eos_token_id])

    inputs = _inputs(tokenizer)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    with torch.no_grad():
        peft_logits = peft_model(**inputs).logits
        exported_logits = exported(**inputs).logits
        base_logits = base(**inputs).logits
    # The adapter matters (merged != base) and the merge reproduces the PeftModel's outputs.
    assert (peft_logits - base_logits).abs().max() > 1e-2
    torch.testing.assert_close(exported_logits, peft_logits, atol=1e-5, rtol=1e-5)

    # Merged weights equal W + scale * B @ A for a LoRA-targeted layer.
    layer = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    expected = layer.base_layer.weight + layer.scaling["default"] * layer.lora_B["default"].weight @ \
        layer.lora_A["default"].weight
    torch.testing.assert_close(tensors["model.layers.0.self_attn.q_proj.weight"], expected.detach(),
                               atol=1e-6, rtol=1e-6)

    # And it generates: a greedy answer of the requested length, stopping or not, from plain generate().
    with torch.no_grad():
        generated = exported.generate(**inputs, max_new_tokens=6, do_sample=False)
    assert generated.shape[1] > inputs["input_ids"].shape[1]
    assert isinstance(tokenizer.decode(generated[0, inputs["input_ids"].shape[1]:]), str)


def test_full_model_export_changes_dtype_and_keeps_weights(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = run(ExportConfig(source=str(tiny_model_dir), out=str(tmp_path / "bf16"), dtype="bfloat16"))
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    tensors = load_file(str(out / "model.safetensors"))
    source = load_file(str(tiny_model_dir / "model.safetensors"))
    assert set(tensors) == set(source)
    for name, value in source.items():
        assert tensors[name].dtype == torch.bfloat16
        torch.testing.assert_close(tensors[name], value.to(torch.bfloat16))
    assert AutoModelForCausalLM.from_pretrained(str(out)).dtype == torch.bfloat16

    # Re-exporting into an earlier export replaces it; a foreign non-empty directory needs --overwrite.
    run(ExportConfig(source=str(tiny_model_dir), out=str(out), dtype="float32"))
    assert load_file(str(out / "model.safetensors"))["model.norm.weight"].dtype == torch.float32
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="--overwrite"):
        run(ExportConfig(source=str(tiny_model_dir), out=str(foreign)))
    assert run(ExportConfig(source=str(tiny_model_dir), out=str(foreign), overwrite=True)) == foreign
    assert (foreign / "notes.txt").read_text() == "mine"


def _fake_model(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path


def _fake_adapter(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    return path


def test_search_order_in_run_directories(tmp_path):
    root = tmp_path / "run"
    _fake_model(root / "pretrain" / "final")
    assert resolve_source(root) == root / "pretrain" / "final"
    sft_adapter = _fake_adapter(root / "sft" / "adapter")
    assert resolve_source(root) == sft_adapter                      # sft beats pretrain
    sft_model = _fake_model(root / "sft" / "model")
    assert resolve_source(root) == sft_model                        # model/ beats adapter/
    _fake_model(root / "grpo" / "checkpoint-3")
    ckpt10 = _fake_adapter(root / "grpo" / "checkpoint-10")
    assert resolve_source(root) == ckpt10                           # grpo beats sft; highest checkpoint
    grpo_best = _fake_model(root / "grpo" / "best")
    assert resolve_source(root) == grpo_best                        # a named model beats checkpoints
    grpo_model = _fake_model(root / "grpo" / "model")
    assert resolve_source(root) == grpo_model                       # model/ beats best/
    _fake_model(root / "export")                                    # an earlier export is never the source
    assert resolve_source(root) == grpo_model
    assert resolve_source(root, stage="sft") == sft_model
    assert resolve_source(root / "sft") == sft_model                # a stage directory works too
    assert resolve_source(sft_adapter) == sft_adapter               # and the model directory itself
    with pytest.raises(ModelLoadError, match="stage 'base'"):
        resolve_source(root, stage="base")
    with pytest.raises(ModelLoadError, match="not found"):
        resolve_source(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no model found"):
        resolve_source(tmp_path / "empty")


def test_user_errors_are_one_line_cli_errors(tiny_model_dir, tmp_path, capsys):
    from agentic_rl.cli import main

    with pytest.raises(ConfigError, match="--out"):
        ExportConfig(source=str(tiny_model_dir))
    with pytest.raises(ConfigError, match="SOURCE"):
        ExportConfig(out=str(tmp_path / "o"))

    assert main(["export", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "error: export source not found" in capsys.readouterr().err

    # No chat template -> an error naming the fix; --chat-template installs one.
    from transformers import AutoTokenizer

    bare = tmp_path / "bare"
    run(ExportConfig(source=str(tiny_model_dir), out=str(bare)))
    tokenizer = AutoTokenizer.from_pretrained(str(bare))
    template = tokenizer.chat_template
    tokenizer.chat_template = None
    (bare / "chat_template.jinja").unlink()
    tokenizer.save_pretrained(str(bare))
    (bare / "export_info.json").unlink()  # make it look like any other model directory
    assert main(["export", str(bare), "--out", str(tmp_path / "o2")]) == 2
    assert "--chat-template" in capsys.readouterr().err
    template_file = tmp_path / "template.jinja"
    template_file.write_text(template)
    assert main(["export", str(bare), "--out", str(tmp_path / "o3"), "--chat-template", str(template_file)]) == 0
    assert AutoTokenizer.from_pretrained(str(tmp_path / "o3")).chat_template == template


def test_config_also_speaks_transformers_4(qwen3_shape_dir, tmp_path):
    """v5 writes rope_parameters / TokenizersBackend; the export adds the v4 spellings (a v4 loader, e.g. a vLLM
    build pinned to transformers 4.x, would otherwise use RoPE base 10000 instead of Qwen3's 1e6) without
    changing how v5 reads the directory."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = run(ExportConfig(source=str(qwen3_shape_dir), out=str(tmp_path / "q3")))
    config = json.loads((out / "config.json").read_text())
    assert config["rope_parameters"]["rope_theta"] == 1_000_000
    assert config["rope_theta"] == 1_000_000 and config["torch_dtype"] == config["dtype"] == "float32"
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tok_config["chat_template"] == (out / "chat_template.jinja").read_text()

    source = AutoConfig.from_pretrained(str(qwen3_shape_dir))
    exported = AutoConfig.from_pretrained(str(out))
    assert exported.rope_parameters == source.rope_parameters
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    original = AutoTokenizer.from_pretrained(str(qwen3_shape_dir))
    rendered = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert rendered == original.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True,
                                                    enable_thinking=False)
    inputs = _inputs(tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(str(out))(**inputs).logits,
                                   AutoModelForCausalLM.from_pretrained(str(qwen3_shape_dir))(**inputs).logits)
