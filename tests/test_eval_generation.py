"""Batched generation: the compact decode loop (the default engine) and padded ``model.generate`` both equal
one-by-one greedy decoding, with completions that end at different steps, EOS/truncation flags, one or no prompt;
sampling, modes and adapters; GRPO's sampling through the same loop."""

from __future__ import annotations

import functools
import inspect

import pytest
import torch

from agentic_rl.data.formats import build_prompt, render_prompt
from agentic_rl.models.generate import (GenerationResult, _compact_supported, _decode, _next_tokens, auto_batch_size,
                                        generate_batched, generate_one_by_one, generate_token_ids)

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


# ---------------------------------------------------------------------------------------------------------------
# Engines: the compact decode loop (default) and padded model.generate give the naive loop's greedy completions
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture()
def early_stopping(model_and_tokenizer):
    """The scaled model with two of its greedy tokens made end-of-sequence tokens too: a token the first completion
    writes and one the second writes, from the third token on, that the last two never write. So completions end at
    different steps or run to the limit, and rows leave the batch at different times."""
    model, tok = model_and_tokenizer
    saved = model.generation_config.eos_token_id
    prompts = [build_prompt(q) for q in QUESTIONS]
    free = []
    for messages in prompts:  # model.generate one prompt at a time: the reference tokens
        ids = tok(render_prompt(tok, messages), return_tensors="pt", add_special_tokens=False)
        out = model.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
        free.append(out[0, ids["input_ids"].shape[1]:].tolist())
    never = set(free[-1]) | set(free[-2])
    stops = [next(t for t in free[k][2:] if t not in never) for k in (0, 1)]
    model.generation_config.eos_token_id = [tok.eos_token_id, *stops]
    yield model, tok, prompts
    model.generation_config.eos_token_id = saved


@pytest.mark.parametrize("engine, prefill_chunk, remove_fraction",
                         [("compact", None, None), ("compact", 2, None), ("compact", None, 1), ("padded", None, None)])
def test_engines_match_the_naive_loop_with_uneven_ends(early_stopping, engine, prefill_chunk, remove_fraction,
                                                       monkeypatch):
    """Prefill chunk 2: the prompts are prefilled in three chunks of different widths whose caches are joined.
    Remove fraction 1: ended sequences stay in the batch until all have ended (the default removes them at once
    from a batch this small)."""
    import agentic_rl.models.generate as generation

    if prefill_chunk:
        monkeypatch.setattr(generation, "PREFILL_CHUNK", prefill_chunk)
    if remove_fraction:
        monkeypatch.setattr(generation, "REMOVE_FRACTION", remove_fraction)
    model, tok, prompts = early_stopping
    reference = generate_one_by_one(model, tok, prompts, max_new_tokens=12)
    lengths = sorted(r.num_tokens for r in reference)
    assert lengths[0] < 12 and any(not r.truncated for r in reference) and any(r.truncated for r in reference), \
        f"the fixture should give ended and truncated completions of several lengths: {lengths}"
    for batch_size in (None, 1, 2):
        out = generate_batched(model, tok, prompts, max_new_tokens=12, batch_size=batch_size, engine=engine)
        assert [r[0] for r in out] == reference, f"engine={engine} batch_size={batch_size}"


def test_compact_engine_prefills_repeated_prompts_once_with_the_same_result(early_stopping, monkeypatch):
    """GRPO groups and pass@k repeat prompts: each distinct one is prefilled once and its cache copied to its rows."""
    import agentic_rl.models.generate as generation

    model, tok, prompts = early_stopping
    repeated = [prompts[i] for i in (3, 0, 3, 1, 0, 4, 2, 3)]
    reference = generate_one_by_one(model, tok, repeated, max_new_tokens=12)
    prefilled = []
    original = model.forward

    @functools.wraps(original)  # the decode loop reads the cache keyword from forward's signature
    def counting_forward(*args, **kwargs):
        if kwargs["input_ids"].shape[1] > 1:  # a prefill (decode steps feed one token)
            prefilled.append(kwargs["input_ids"].shape[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counting_forward)
    monkeypatch.setattr(generation, "PREFILL_CHUNK", 2)
    out = generate_batched(model, tok, repeated, max_new_tokens=12, engine="compact")
    assert [r[0] for r in out] == reference
    assert prefilled == [1, 2, 2, 1]  # the shared system prompt once, then 5 distinct prompts in chunks of 2, not 8


def test_compact_engine_prefills_a_prefix_all_contexts_share_once(early_stopping, monkeypatch):
    """Contexts that share a long prefix (a system prompt): the prefix is prefilled once, each chunk only from where
    its contexts differ, and the completions are the naive loop's, whatever the chunking (chunks of 2 put padding
    between the prefix and the rest of the shorter contexts). Below the threshold, or with one context, everything
    is prefilled together as before."""
    import agentic_rl.models.generate as generation

    model, tok, prompts = early_stopping
    contexts = [tok(render_prompt(tok, p), add_special_tokens=False)["input_ids"] for p in prompts]
    shared = generation.shared_prefix_length(contexts)
    assert shared >= generation.MIN_SHARED_PREFIX and all(len(c) > shared for c in contexts)
    assert len({c[shared] for c in contexts}) > 1  # the contexts differ right after it
    reference = generate_one_by_one(model, tok, prompts, max_new_tokens=12)
    widths = []
    original = model.forward

    @functools.wraps(original)  # the decode loop reads the cache keyword from forward's signature
    def recording_forward(*args, **kwargs):
        if kwargs["input_ids"].shape[1] > 1:
            widths.append(tuple(kwargs["input_ids"].shape))
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "forward", recording_forward)
    order = sorted(contexts, key=len, reverse=True)
    for chunk, expected in ((2, [(1, shared), (2, len(order[0]) - shared), (2, len(order[2]) - shared),
                                 (1, len(order[4]) - shared)]),
                            (16, [(1, shared), (5, len(order[0]) - shared)])):
        monkeypatch.setattr(generation, "PREFILL_CHUNK", chunk)
        widths.clear()
        out = generate_batched(model, tok, prompts, max_new_tokens=12, engine="compact")
        assert [r[0] for r in out] == reference, f"chunks of {chunk}"
        assert widths == expected, f"chunks of {chunk}"
    shipped = generation.MIN_SHARED_PREFIX
    monkeypatch.setattr(generation, "MIN_SHARED_PREFIX", shared + 1)
    widths.clear()
    assert [r[0] for r in generate_batched(model, tok, prompts, max_new_tokens=12, engine="compact")] == reference
    assert widths == [(5, len(order[0]))]
    monkeypatch.setattr(generation, "MIN_SHARED_PREFIX", shipped)
    widths.clear()
    assert [r[0] for r in generate_batched(model, tok, prompts[:1], max_new_tokens=12, engine="compact")] \
        == reference[:1]
    assert widths == [(1, len(contexts[0]))]  # one context: nothing to share


def test_compact_engine_one_prompt_and_budget_of_one(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompts = [build_prompt(QUESTIONS[1])]
    for n in (1, 5):
        reference = generate_one_by_one(model, tok, prompts, max_new_tokens=n)
        assert [r[0] for r in generate_batched(model, tok, prompts, max_new_tokens=n, engine="compact")] == reference
    assert generate_batched(model, tok, [], max_new_tokens=4, engine="compact") == []


def test_generate_token_ids_cuts_after_the_first_stop_and_keeps_order(model_and_tokenizer):
    model, tok = model_and_tokenizer
    contexts = [tok(q, add_special_tokens=False)["input_ids"] for q in QUESTIONS]
    free = generate_token_ids(model, contexts, max_new_tokens=8, stop_ids=[tok.eos_token_id],
                              pad_id=tok.pad_token_id)
    assert all(len(ids) == 8 for ids in free)  # the random model never writes EOS
    stop = free[2][3]  # make the 4th token of the third context a stop token
    cut = generate_token_ids(model, contexts, max_new_tokens=8, stop_ids=[tok.eos_token_id, stop],
                             pad_id=tok.pad_token_id, batch_size=2)
    for ids, full in zip(cut, free):
        end = next((k + 1 for k, t in enumerate(full) if t == stop), len(full))
        assert ids == full[:end]  # same tokens, cut just after the stop token (kept)
    assert cut[2] == free[2][:4]
    assert generate_token_ids(model, [], max_new_tokens=4, stop_ids=[0], pad_id=0) == []
    with pytest.raises(ValueError, match="engine must be one of"):
        generate_token_ids(model, contexts, max_new_tokens=4, stop_ids=[0], pad_id=0, engine="vllm")


def test_compact_engine_is_chosen_for_plain_and_peft_models(model_and_tokenizer):
    from peft import LoraConfig, get_peft_model

    model, _ = model_and_tokenizer
    assert _compact_supported(model)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], lora_alpha=8))
    try:
        assert _compact_supported(peft_model)
    finally:
        peft_model.unload()


def test_next_tokens_filters_like_generate():
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0], [5.0, 0.0, 0.0, 4.99]])
    assert _next_tokens(logits, 0.0, 1.0, 0).tolist() == [1, 0]  # greedy: argmax, first on ties
    torch.manual_seed(0)
    for _ in range(20):  # top-k 1 and a tiny top-p leave only the most likely token to draw
        assert _next_tokens(logits, 1.0, 1.0, 1).tolist() == [1, 0]
        assert _next_tokens(logits, 1.0, 0.01, 0).tolist() == [1, 0]
    draws = torch.stack([_next_tokens(logits, 1.0, 1.0, 2) for _ in range(200)])  # top-k 2: only the best two
    assert set(draws[:, 0].tolist()) == {1, 2} and set(draws[:, 1].tolist()) == {0, 3}


# ---------------------------------------------------------------------------------------------------------------
# GRPO's sampling through the same loop
# ---------------------------------------------------------------------------------------------------------------

def test_grpo_tiny_preset_samples_with_the_compact_loop():
    from agentic_rl.errors import ConfigError
    from agentic_rl.train.grpo import GRPOConfig

    assert GRPOConfig(model="m", preset="tiny").generation_backend == "compact"
    assert GRPOConfig(model="m").generation_backend == "trl"
    assert GRPOConfig(model="m", preset="tiny", generation_backend="trl").generation_backend == "trl"
    with pytest.raises(ConfigError, match="trl_args 'repetition_penalty' is applied by TRL's own generation only"):
        GRPOConfig(model="m", preset="tiny", trl_args={"repetition_penalty": 1.1})


def test_compact_rollout_renders_like_trl_and_samples_the_naive_greedy_tokens(model_and_tokenizer):
    """At a near-zero temperature a draw is the argmax: the rollout's completions are the naive loop's tokens, its
    prompt ids are TRL's own tokenization of the prompts."""
    from types import SimpleNamespace

    from agentic_rl.train.grpo_trainer import compact_rollout

    model, tok = model_and_tokenizer
    prompts = [build_prompt(q, None) for q in QUESTIONS[:3]]
    trainer = SimpleNamespace(
        processing_class=tok, model=model, eos_token_ids=[tok.eos_token_id],
        accelerator=SimpleNamespace(unwrap_model=lambda m: m),
        args=SimpleNamespace(max_completion_length=8, temperature=1e-4, top_p=1.0, top_k=0))
    out = compact_rollout(prompts, trainer)
    trl_ids = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True,
                                       enable_thinking=False)["input_ids"] for p in prompts]
    assert out["prompt_ids"] == trl_ids and out["logprobs"] is None
    reference = generate_one_by_one(model, tok, prompts, max_new_tokens=8)
    assert [tok.decode(ids, skip_special_tokens=True) for ids in out["completion_ids"]] == [r.text for r in reference]
    assert [len(ids) for ids in out["completion_ids"]] == [r.num_tokens for r in reference]


# ---------------------------------------------------------------------------------------------------------------
# The turn cache: a turn starts from the keys and values of the episode's earlier tokens
# ---------------------------------------------------------------------------------------------------------------

def count_prefilled_tokens(model, monkeypatch) -> list[int]:
    """A list that the model's prefills append to from now on: the tokens each runs through the model (its new
    positions' attended tokens, padding not counted; decode steps feed one token and are not counted)."""
    prefilled: list[int] = []
    original = model.forward

    @functools.wraps(original)  # the decode loop reads the cache keyword from forward's signature
    def counting_forward(*args, **kwargs):
        if kwargs["input_ids"].shape[1] > 1:
            prefilled.append(int(kwargs["attention_mask"][:, -kwargs["input_ids"].shape[1]:].sum()))
        return original(*args, **kwargs)

    counting_forward.__signature__ = inspect.signature(original)  # the decode loop reads the forward's keywords
    monkeypatch.setattr(model, "forward", counting_forward)
    return prefilled


def test_turn_cache_reuses_the_stored_tokens_that_begin_a_context_and_keeps_within_its_budget():
    from agentic_rl.models.generate import TurnCache

    layers = [(torch.zeros(2, 4, 8), torch.zeros(2, 4, 8))]  # one layer: 2 kv heads, 4 tokens, head dim 8
    cache = TurnCache(max_bytes=2 * 2 * 4 * 8 * 4)  # room for exactly one such entry (float32)
    cache.store("a", [5, 6, 7, 8], layers)
    assert cache.reusable("a", [5, 6, 7, 8, 9, 10])[0] == 4  # the whole entry begins the context
    assert cache.reusable("a", [5, 6, 1, 8, 9])[0] == 2  # a dropped or changed token ends the match there
    assert cache.reusable("a", [5, 6, 7, 8])[0] == 3  # the last token is prefilled: its logits start the turn
    assert cache.reusable("a", [9])[0] == 0 and cache.reusable("b", [5, 6, 7, 8, 9]) == (0, [])
    cache.store("b", [5, 6, 7, 8], layers)  # over the budget: not kept
    assert "b" not in cache.entries and cache.bytes == 2 * 2 * 4 * 8 * 4
    cache.store("a", [5, 6, 7, 8], layers)  # replacing an entry frees its bytes first
    assert cache.bytes == 2 * 2 * 4 * 8 * 4 and list(cache.entries) == ["a"]
    cache.forget(["a", "never stored"])  # an episode that ended: its entry and its bytes go
    assert not cache.entries and cache.bytes == 0
    assert TurnCache(0).store("a", [5], layers) is None and not TurnCache(0).entries


@pytest.mark.parametrize("prefill_chunk, remove_fraction", [(None, None), (2, None), (None, 1)])
def test_a_turn_from_the_cache_generates_what_prefilling_its_whole_context_does(early_stopping, prefill_chunk,
                                                                                remove_fraction, monkeypatch):
    """Two turns: the second turn's contexts are the first turn's plus its completion (ended or cut) and an
    observation of a different length per context; one context lost a token of its beginning (as when a context window
    drops a turn) and one has no entry. From the cache the second turn prefills only what is new and generates the
    same tokens as from nothing. Prefill chunk 2 joins chunks of different past and new widths; remove fraction 1
    keeps ended rows riding along until all have ended, so their caches hold tokens after their stop token."""
    import agentic_rl.models.generate as generation
    from agentic_rl.models.generate import TurnCache

    if prefill_chunk:
        monkeypatch.setattr(generation, "PREFILL_CHUNK", prefill_chunk)
    if remove_fraction:
        monkeypatch.setattr(generation, "REMOVE_FRACTION", remove_fraction)
    model, tok, prompts = early_stopping
    stops = model.generation_config.eos_token_id
    first = [tok(render_prompt(tok, p), add_special_tokens=False)["input_ids"] for p in prompts]
    keys = [f"episode {i}" for i in range(len(first))]
    cache = TurnCache.for_model(model)
    settings = dict(max_new_tokens=12, stop_ids=stops, pad_id=tok.pad_token_id, engine="compact")
    new = generate_token_ids(model, first, turn_cache=cache, cache_keys=keys, **settings)
    assert new == generate_token_ids(model, first, **settings)  # storing changes nothing
    assert len({len(ids) for ids in new}) > 1 and sorted(cache.entries) == sorted(keys)
    observation = tok("The calculator says 1081.", add_special_tokens=False)["input_ids"]
    second = [c + n + observation[:3 + i] for i, (c, n) in enumerate(zip(first, new))]
    second[1] = second[1][:4] + second[1][5:]  # a token of its beginning gone: reused up to there only
    keys[2] = "an episode without an entry"
    assert [cache.reusable(k, c)[0] for k, c in zip(keys, second)][3:] >= [len(c) for c in first][3:]
    assert cache.reusable(keys[1], second[1])[0] == 4 and cache.reusable(keys[2], second[2])[0] == 0
    widths = count_prefilled_tokens(model, monkeypatch)
    whole = generate_token_ids(model, second, **settings)
    prefilled_whole, widths[:] = sum(widths), []
    reused = [cache.reusable(k, c)[0] for k, c in zip(keys, second)]
    assert generate_token_ids(model, second, turn_cache=cache, cache_keys=keys, **settings) == whole
    assert sum(widths) == sum(len(c) - n for c, n in zip(second, reused)) < prefilled_whole / 2
    assert len({tuple(ids) for ids in whole}) > 1


def test_the_padded_engine_ignores_the_turn_cache_and_keys_are_required(model_and_tokenizer):
    from agentic_rl.models.generate import TurnCache

    model, tok = model_and_tokenizer
    contexts = [tok("What is 2 + 3?", add_special_tokens=False)["input_ids"]]
    cache = TurnCache.for_model(model)
    settings = dict(max_new_tokens=4, stop_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)
    assert generate_token_ids(model, contexts, engine="padded", turn_cache=cache, cache_keys=[0], **settings) \
        == generate_token_ids(model, contexts, engine="padded", **settings)
    assert not cache.entries
    with pytest.raises(ValueError, match="one cache key per context"):
        generate_token_ids(model, contexts, turn_cache=cache, **settings)


@pytest.mark.parametrize("window", [None, 1])
def test_episodes_played_with_the_turn_cache_are_the_ones_played_without(model_and_tokenizer, window, monkeypatch):
    """Three-turn episodes (feedback after each of the first two turns, of a different length per episode): the same
    trajectories with and without the cache, and fewer tokens prefilled with it; with a context window of one turn
    the third turn's context has dropped the first, and the cache is used up to there."""
    from agentic_rl.agent.env import Environment, StepResult
    from agentic_rl.agent.rollout import RolloutSettings, run_episodes
    from agentic_rl.agent.tasks import agent_rows
    from agentic_rl.agent.tool_format import ChatFormat

    class Feedback(Environment):
        max_turns = 3
        context_window = window

        def reset(self, task):
            self.turn, self.words = 0, len(task["question"].split())
            return None

        def step(self, assistant_text):
            self.turn += 1
            done = self.turn == self.max_turns
            note = [] if done else [{"role": "user", "content": f"Not yet: {self.words * self.turn} is wrong."}]
            return StepResult(observation=note, reward=0.0, done=done)

    model, tok = model_and_tokenizer
    fmt = ChatFormat(tok, {"enable_thinking": False})
    tasks = agent_rows([{"question": q, "answer": "#### 5"} for q in QUESTIONS])
    settings = RolloutSettings(max_turn_tokens=10, max_completion_length=200, do_sample=False)
    prefilled = count_prefilled_tokens(model, monkeypatch)
    played, tokens = {}, {}
    for reuse in (False, True):
        prefilled.clear()
        played[reuse] = run_episodes(model, tok, [Feedback() for _ in tasks], tasks, [t["prompt"] for t in tasks],
                                     settings, fmt, reuse_cache=reuse)
        tokens[reuse] = sum(prefilled)
    assert all(t.turns == 3 for t in played[True])
    assert [t.summary() for t in played[True]] == [t.summary() for t in played[False]]
    assert [(t.prompt_ids, t.completion_ids, t.context_starts) for t in played[True]] \
        == [(t.prompt_ids, t.completion_ids, t.context_starts) for t in played[False]]
    assert all((t.context_starts[-1] > 0) == bool(window) for t in played[True])
    assert tokens[True] < tokens[False] * 0.8
