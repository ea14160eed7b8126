"""Batched generation: equals one-by-one greedy decoding, handles EOS/truncation, sampling, modes and adapters."""

from __future__ import annotations

import pytest
import torch

from agentic_rl.data.formats import build_prompt
from agentic_rl.eval.generation import (
    GenerationResult,
    _decode,
    auto_batch_size,
    generate_batched,
    generate_one_by_one,
)

QUESTIONS = [
    "What is 2 + 3?",
    "Mia has 12 apples. She buys 7 more. She gives 5 to her friend. How many apples does Mia have now?",
    "Tom had 5 pens.",
    "Leo reads 14 pages a day for 3 days and then 9 more pages on the fourth day. How many pages did he read?",
    "A box holds 6 eggs. How many eggs are in 4 boxes?",
]


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    """The tiny random model with its weights scaled up, so that greedy outputs vary from token to token (an
    untouched random init repeats one token, which would make the equivalence check weak)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(8.0)
    return model, tok


def test_batched_equals_one_by_one_greedy(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompts = [build_prompt(q) for q in QUESTIONS]
    reference = generate_one_by_one(model, tok, prompts, max_new_tokens=12)
    assert len({r.text for r in reference}) > 1, "outputs should differ between prompts"
    assert all(len(set(r.text)) > 2 for r in reference), "outputs should not be one repeated character"
    for batch_size in (None, 2, 5):
        batched = generate_batched(model, tok, prompts, max_new_tokens=12, batch_size=batch_size)
        assert [b[0] for b in batched] == reference, f"batch_size={batch_size}"


def test_eos_ends_completion_and_counts_tokens(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompts = [build_prompt(q) for q in QUESTIONS[:3]]
    free = generate_batched(model, tok, prompts, max_new_tokens=6)
    assert all(r[0].truncated and r[0].num_tokens == 6 for r in free)  # random model: never stops by itself
    # make the model's first greedy token an end-of-sequence token: the completion is then empty, 1 token, not cut
    first = tok(free[0][0].text, add_special_tokens=False)["input_ids"][0]
    model.generation_config.eos_token_id = [tok.eos_token_id, first]
    stopped = generate_batched(model, tok, prompts[:1], max_new_tokens=6)
    assert stopped[0][0] == GenerationResult(text="", num_tokens=1, truncated=False)


def test_decode_cuts_at_first_eos(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok("12 + 7 = 19", add_special_tokens=False)["input_ids"]
    eos, pad = tok.eos_token_id, tok.pad_token_id
    r = _decode(tok, ids + [eos, pad, pad], [eos], max_new_tokens=20)
    assert r == GenerationResult("12 + 7 = 19", len(ids) + 1, False)
    r = _decode(tok, ids, [eos], max_new_tokens=len(ids))
    assert r.truncated and r.num_tokens == len(ids)


def test_sampling_is_seeded_and_returns_n_samples(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompts = [build_prompt(q) for q in QUESTIONS[:2]]
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = generate_batched(model, tok, prompts, max_new_tokens=8, temperature=1.0, num_samples=3, seed=7)
    assert torch.equal(torch.rand(3), expected_next)  # the caller's random stream is left where it was
    b = generate_batched(model, tok, prompts, max_new_tokens=8, temperature=1.0, num_samples=3, seed=7)
    c = generate_batched(model, tok, prompts, max_new_tokens=8, temperature=1.0, num_samples=3, seed=8)
    assert [len(x) for x in a] == [3, 3]
    assert a == b
    assert a != c
    assert len({s.text for s in a[0]}) > 1  # samples of one prompt differ
    greedy = generate_batched(model, tok, prompts, max_new_tokens=8, num_samples=3)
    assert all(len(set(map(repr, g))) == 1 and len(g) == 3 for g in greedy)  # greedy samples are one repeated


def test_restores_training_mode_and_accepts_peft(model_and_tokenizer):
    from peft import LoraConfig, get_peft_model

    model, tok = model_and_tokenizer
    prompts = [build_prompt(QUESTIONS[0])]
    reference = generate_one_by_one(model, tok, prompts, max_new_tokens=6)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_alpha=8))
    try:
        peft_model.train()
        out = generate_batched(peft_model, tok, prompts, max_new_tokens=6)
        assert peft_model.training, "the caller's training mode must be restored"
        assert out[0][0] == reference[0]  # LoRA B starts at zero: same outputs as the base model
        peft_model.eval()
        generate_batched(peft_model, tok, prompts, max_new_tokens=2)
        assert not peft_model.training
    finally:
        peft_model.unload()


def test_auto_batch_size_scales_with_sequence_length(model_and_tokenizer):
    model, _ = model_and_tokenizer
    assert auto_batch_size(model, 128) == 128  # tiny model on CPU: the cap
    assert auto_batch_size(model, 128, num_prompts=10) == 10
    # a KV cache of 2 GiB per sequence leaves room for one
    assert auto_batch_size(model, 2 * 1024**3) == 1


def test_empty_prompt_list(model_and_tokenizer):
    model, tok = model_and_tokenizer
    assert generate_batched(model, tok, [], max_new_tokens=4) == []
