"""The embedded tokenizer/model and the loader: chat template shape, saving, adapters, offline errors."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch

from agentic_rl.data.formats import render_prompt, sft_row
from agentic_rl.data.synthetic import default_tokenizer_corpus
from agentic_rl.errors import ConfigError, ModelLoadError
from agentic_rl.models.loading import count_parameters, load_model_and_tokenizer, resolve_dtype
from agentic_rl.models.tiny import QWEN3_STYLE_CHAT_TEMPLATE, build_tiny_model, train_tokenizer

ROW = sft_row("Tom has 12 apples and buys 30 more. How many apples does he have?", ["12 + 30 = 42"], "42")
TOOL_CHAT = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "What is 6 * 7?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "6 * 7"}}}]},
    {"role": "tool", "content": "42"},
    {"role": "assistant", "content": "Final Answer: 42"},
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(default_tokenizer_corpus(800, seed=3), vocab_size=400)


def test_digits_are_single_tokens_and_specials_exist(tokenizer):
    assert tokenizer.tokenize("2024") == ["2", "0", "2", "4"]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    vocab = tokenizer.get_vocab()
    for t in ["<|im_start|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
              "</think>"]:
        assert t in vocab
        assert len(tokenizer.encode(t, add_special_tokens=False)) == 1
    # markup tokens survive skip_special_tokens (tool-call parsing needs them); turn markers do not
    ids = tokenizer.encode("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"
    with pytest.raises(ConfigError, match="vocab_size"):
        train_tokenizer(["1 + 1 = 2"], vocab_size=100)


def test_tool_use_corpus_makes_a_calculator_episode_few_tokens():
    """With ``tool_use`` (pretraining's ``tool_call_tokens``) the call wrapper, role names and agent system prompt are
    frequent enough to be merged: an episode is far shorter, numbers stay one token per digit."""
    from agentic_rl.agent.tasks import AGENT_SYSTEM_PROMPT, tool_call_scaffold
    from agentic_rl.agent.tool_format import render_tool_call

    call = render_tool_call("calculator", {"expression": "1482+32"})
    episode = [{"role": "system", "content": AGENT_SYSTEM_PROMPT}, {"role": "user", "content": "What is 26*57+32?"},
               {"role": "assistant", "content": call}, {"role": "tool", "content": "1514", "name": "calculator"}]
    lengths = {}
    for tool_use in (False, True):
        scaffold = tool_call_scaffold(2000, seed=3) if tool_use else []
        tok = train_tokenizer(default_tokenizer_corpus(2000, seed=3, scaffold=scaffold), vocab_size=1024)
        text = tok.apply_chat_template(episode, tokenize=False, add_generation_prompt=True)
        lengths[tool_use] = (len(tok.tokenize(call)), len(tok.tokenize(text)))
        assert [t for t in tok.tokenize(call) if t.isdigit()] == list("148232")
    assert lengths[True][0] == 25  # <tool_call> \n {" name ": Ġ" calculator ", ... 6 digits, +, "}} \n </tool_call>
    assert lengths[True][0] < 0.8 * lengths[False][0] and lengths[True][1] < 0.8 * lengths[False][1]


def test_chat_template_has_qwen3_shape(tokenizer):
    text = tokenizer.apply_chat_template(TOOL_CHAT, tokenize=False, enable_thinking=False)
    assert text.startswith("<|im_start|>system\nUse tools.<|im_end|>\n<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n")
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n'
            '</tool_call><|im_end|>\n') in text
    assert "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\nFinal Answer: 42<|im_end|>\n")
    prompt = render_prompt(tokenizer, ROW["prompt"])
    assert prompt.endswith("<|im_start|>assistant\n") and "<think>" not in prompt
    with_tools = tokenizer.apply_chat_template(TOOL_CHAT[:2], tools=[{"type": "function", "function": {
        "name": "calculator", "parameters": {}}}], tokenize=False)
    assert "<tools>\n{" in with_tools and '"name": "calculator"' in with_tools
    # round trip: digits decode back exactly
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


@pytest.mark.parametrize("template", ["embedded", "qwen3"])
def test_prompt_tokens_are_a_prefix_of_prompt_plus_completion(tokenizer, template):
    """What TRL's completion-only loss relies on: the prompt tokenizes identically alone and with its answer."""
    chat_template = None if template == "embedded" else QWEN3_STYLE_CHAT_TEMPLATE
    kw = dict(chat_template=chat_template, enable_thinking=False, return_dict=False)
    prompt_ids = tokenizer.apply_chat_template(ROW["prompt"], add_generation_prompt=True, **kw)
    full_ids = tokenizer.apply_chat_template(ROW["prompt"] + ROW["completion"], **kw)
    assert full_ids[:len(prompt_ids)] == prompt_ids
    completion = tokenizer.decode(full_ids[len(prompt_ids):])
    assert completion.endswith("Final Answer: 42<|im_end|>\n")


def test_tiny_model_dir_loads_with_plain_transformers(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.generation_config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert tok.chat_template and model.config.tie_word_embeddings
    out = pipeline("text-generation", model=model, tokenizer=tok)(ROW["prompt"], max_new_tokens=4, do_sample=False)
    assert out[0]["generated_text"][-1]["role"] == "assistant"


def test_qwen3_shape_dir_keeps_the_real_config_keys(qwen3_shape_dir):
    cfg = json.loads((qwen3_shape_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert cfg["head_dim"] == 128 and cfg["tie_word_embeddings"] is True
    assert cfg["num_attention_heads"] // cfg["num_key_value_heads"] == 2
    assert cfg["rope_parameters"]["rope_theta"] == 1_000_000
    model, tok = load_model_and_tokenizer(qwen3_shape_dir, for_training=False)
    assert any("q_norm" in n for n, _ in model.named_parameters())  # Qwen3's q/k-norm
    prompt = render_prompt(tok, ROW["prompt"], enable_thinking=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_loader_defaults_on_cpu(tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir, for_training=False)
    assert next(model.parameters()).dtype == torch.float32 and next(model.parameters()).device.type == "cpu"
    assert not model.training and tok.pad_token is not None
    model, _ = load_model_and_tokenizer(tiny_model_dir, dtype="bf16")
    assert next(model.parameters()).dtype == torch.bfloat16 and model.training
    assert resolve_dtype("auto", "cpu") == torch.float32
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        resolve_dtype("int3")


def test_loader_adapter_dir_trainable_or_merged(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model

    base, tok = load_model_and_tokenizer(tiny_model_dir)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
                                                  task_type="CAUSAL_LM"))
    peft_model.save_pretrained(tmp_path / "adapter")
    tok.save_pretrained(tmp_path / "adapter")
    ids = tok("12 + 30 = 42", return_tensors="pt").input_ids
    with torch.no_grad():
        want = peft_model(ids).logits

    trainable, _ = load_model_and_tokenizer(tmp_path / "adapter", for_training=True)
    assert type(trainable).__name__ == "PeftModelForCausalLM"
    n_train, n_total = count_parameters(trainable)
    assert 0 < n_train < n_total
    assert all("lora_" in n for n, p in trainable.named_parameters() if p.requires_grad)

    merged, _ = load_model_and_tokenizer(tmp_path / "adapter", for_training=False)
    assert type(merged).__name__ == "Qwen3ForCausalLM"
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, want, atol=1e-4)
    with pytest.raises(ModelLoadError, match="adapter"):
        load_model_and_tokenizer(tmp_path / "adapter", adapter_ok=False)


def test_unreachable_weights_fail_fast_in_one_line(monkeypatch, tmp_path, tiny_model_dir):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(ModelLoadError) as err:
        load_model_and_tokenizer("Qwen/Qwen3-0.6B-does-not-exist")
    assert time.monotonic() - start < 5
    msg = str(err.value)
    assert "\n" not in msg and "HF_HUB_OFFLINE" in msg and "local" in msg and "embedded" in msg
    # without HF_HUB_OFFLINE, an unreachable Hub is detected by one short connect, not transformers' retry loop
    from agentic_rl.models import loading

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=3.0: False)
    start = time.monotonic()
    with pytest.raises(ModelLoadError, match="Hub is unreachable"):
        load_model_and_tokenizer("agentic-rl-test/not-cached")
    assert time.monotonic() - start < 5
    with pytest.raises(ModelLoadError, match="neither config.json"):
        load_model_and_tokenizer(tmp_path)
    with pytest.raises(ModelLoadError, match="not a directory"):
        load_model_and_tokenizer(tmp_path / "missing")
    # a model directory without a chat template is refused with the reason
    no_template = tmp_path / "no_template"
    shutil.copytree(tiny_model_dir, no_template)
    (no_template / "chat_template.jinja").unlink()
    cfg = json.loads((no_template / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (no_template / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="no chat template"):
        load_model_and_tokenizer(no_template)


def test_presets_and_sizes(tokenizer):
    model = build_tiny_model(tokenizer, "tiny")
    n = sum(p.numel() for p in model.parameters())
    assert 2_500_000 < n < 4_000_000 and model.config.num_hidden_layers == 4 and model.config.hidden_size == 256
    with pytest.raises(ConfigError, match="preset"):
        build_tiny_model(tokenizer, "huge")
