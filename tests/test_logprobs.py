"""GRPO's log-prob passes in length-sorted chunks (train/logprobs.py): the plan covers every real token and puts rows
back in order, and the trainers' scores, entropies and gradients equal TRL's own passes over the padded batch."""

from __future__ import annotations

import pytest
import torch

from agentic_rl.train.logprobs import plan_chunks


def _mask(prompt_lengths, completion_lengths):
    """A TRL-style attention mask: prompts left-padded to the longest, completions right-padded."""
    width_p, width_c = max(prompt_lengths), max(completion_lengths)
    mask = torch.zeros((len(prompt_lengths), width_p + width_c), dtype=torch.long)
    for row, (p, c) in enumerate(zip(prompt_lengths, completion_lengths)):
        mask[row, width_p - p:width_p + c] = 1
    return mask, width_c


PROMPTS = [5, 9, 3, 9, 7, 3, 5, 8]
COMPLETIONS = [2, 6, 1, 3, 6, 4, 1, 5]


def test_plan_covers_every_real_token_and_cuts_only_padding():
    mask, keep_all = _mask(PROMPTS, COMPLETIONS)
    chunks, inverse = plan_chunks(mask, keep_all, 3, trim_left=True)
    rows = torch.cat([r for r, *_ in chunks])
    assert sorted(rows.tolist()) == list(range(8))
    assert rows[inverse].tolist() == list(range(8))
    # sorted by prompt length, then completion length
    order = rows.tolist()
    assert [(PROMPTS[i], COMPLETIONS[i]) for i in order] == sorted(zip(PROMPTS, COMPLETIONS))
    cut = 0
    for r, start, stop, keep in chunks:
        sub = mask[r]
        assert sub[:, start:stop].sum() == sub.sum()  # every real token is inside the slice
        assert keep == stop - (mask.shape[1] - keep_all) and keep >= 1
        cut += len(r) * (mask.shape[1] - (stop - start))
    assert cut > 0
    # the first chunk holds the prompts of 3 and 5 tokens: 6 of the 9 prompt columns are padding for all of them
    first_rows, start, stop, keep = chunks[0]
    assert start == 9 - 5 and keep == max(COMPLETIONS[i] for i in first_rows.tolist())


def test_plan_without_left_trimming_keeps_every_position():
    mask, keep_all = _mask(PROMPTS, COMPLETIONS)
    chunks, _ = plan_chunks(mask, keep_all, 4, trim_left=False)
    assert all(start == 0 for _, start, _, _ in chunks)


def test_a_chunk_of_empty_completions_keeps_one_column():
    mask, keep_all = _mask([3, 4], [0, 0])
    mask = torch.cat([mask, torch.zeros((2, 2), dtype=torch.long)], dim=1)  # two completion columns, all padding
    (rows, start, stop, keep), = plan_chunks(mask, 2, 8, trim_left=True)[0]
    assert keep == 1 and stop == 4 + 1


# --- the trainers' passes against TRL's ------------------------------------------------------------------------


def _scorer(cls, model, rows_per_chunk):
    """An instance of a trainer class with just what ``_get_per_token_logps_and_entropies`` reads (building a whole
    trainer would generate and load datasets; the method under test is the real one, TRL's beneath ours)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    scorer = object.__new__(cls)
    # fp32, whatever an earlier trainer in this process left in accelerate's shared state (a bf16 stage would make
    # TRL's autocast round both sides' matmuls to bf16, each chunk shape differently)
    AcceleratorState._reset_state(reset_partial_state=True)
    scorer.accelerator = Accelerator(cpu=True, mixed_precision="no")
    scorer.logprob_chunk_rows = rows_per_chunk
    return scorer


def _batch(vocab, seed=0):
    generator = torch.Generator().manual_seed(seed)
    mask, keep = _mask(PROMPTS, COMPLETIONS)
    ids = torch.randint(3, vocab, mask.shape, generator=generator).masked_fill(mask == 0, 0)
    return ids, mask, keep


def _scores(cls, model, rows_per_chunk, ids, mask, keep):
    scorer = _scorer(cls, model, rows_per_chunk)
    model.zero_grad()
    logps, entropies, _ = scorer._get_per_token_logps_and_entropies(model, ids, mask, keep, compute_entropy=True)
    completion = mask[:, -keep:].float()
    (logps * completion).sum().backward()  # a loss of every scored token: gradients must match too
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps * completion, entropies * completion, grads


def _trainer_classes():
    from agentic_rl.train.grpo_trainer import RLOOEpisodeTrainer, RLOOTrainer, SignalGRPOTrainer

    return {"grpo": SignalGRPOTrainer, "rloo": RLOOTrainer, "rloo-episodes": RLOOEpisodeTrainer}


@pytest.mark.parametrize("kind", ["grpo", "rloo", "rloo-episodes"])
def test_chunked_scores_and_gradients_equal_trls_on_a_lora_policy(tiny_model_dir, kind):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from agentic_rl.train.logprobs import shift_invariant

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    add_fused_lm_head(base, outputs=("log_probs", "entropy"))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    assert shift_invariant(model)  # Qwen3: rotary, so chunks also drop the left padding they share
    ids, mask, keep = _batch(base.config.vocab_size)
    cls = _trainer_classes()[kind]
    reference = _scores(cls, model, 0, ids, mask, keep)
    for rows_per_chunk in (1, 3, 8):
        logps, entropies, grads = _scores(cls, model, rows_per_chunk, ids, mask, keep)
        torch.testing.assert_close(logps, reference[0], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(entropies, reference[1], atol=2e-5, rtol=1e-5)
        assert grads.keys() == reference[2].keys() and grads
        for name in grads:
            torch.testing.assert_close(grads[name], reference[2][name], atol=2e-5, rtol=1e-4)


@pytest.mark.stage
def test_absolute_positions_keep_their_left_padding():
    """GPT-2 adds a learned embedding per absolute position: dropping left columns would change its scores, so the
    chunks keep them (and do change the scores when forced to drop them: the check is needed)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from trl.trainer.utils import add_fused_lm_head

    import agentic_rl.train.logprobs as logprobs

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=1, n_head=2,
                                       bos_token_id=1, eos_token_id=2)).eval()  # eval: no dropout
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    assert not logprobs.shift_invariant(model)
    ids, mask, keep = _batch(64)
    cls = _trainer_classes()["grpo"]
    reference = _scores(cls, model, 0, ids, mask, keep)
    chunked = _scores(cls, model, 3, ids, mask, keep)
    torch.testing.assert_close(chunked[0], reference[0], atol=2e-5, rtol=1e-5)
    original = logprobs.shift_invariant
    logprobs.shift_invariant = lambda model: True
    try:
        shifted = _scores(cls, model, 3, ids, mask, keep)
    finally:
        logprobs.shift_invariant = original
    assert (shifted[0] - reference[0]).abs().max() > 1e-3


def test_only_static_rotary_positions_count_as_shift_invariant():
    from types import SimpleNamespace

    from agentic_rl.train.logprobs import shift_invariant

    def model(rope):
        return SimpleNamespace(config=SimpleNamespace(rope_parameters=rope))

    assert shift_invariant(model({"rope_type": "default", "rope_theta": 1e4}))
    assert shift_invariant(model({"rope_type": "yarn", "factor": 4.0}))
    assert not shift_invariant(model({"rope_type": "dynamic", "factor": 2.0}))  # frequencies follow the length
    assert not shift_invariant(model(None))  # absolute or no positions
    assert shift_invariant(model({"full_attention": {"rope_type": "default"},
                                  "sliding_attention": {"rope_type": "linear", "factor": 8.0}}))
    assert not shift_invariant(model({"full_attention": {"rope_type": "longrope"},
                                      "sliding_attention": {"rope_type": "default"}}))


def test_tiny_preset_scores_in_chunks_and_the_default_preset_as_trl():
    from agentic_rl.errors import ConfigError
    from agentic_rl.train.grpo import GRPOConfig

    assert GRPOConfig(model="m", preset="tiny").logprob_chunk_rows == 8
    assert GRPOConfig(model="m").logprob_chunk_rows == 0
    assert GRPOConfig(model="m", preset="tiny", logprob_chunk_rows=0).logprob_chunk_rows == 0
    with pytest.raises(ConfigError, match="logprob_chunk_rows"):
        GRPOConfig(model="m", logprob_chunk_rows=-1)


# --- TRL's fused LM head: labelled positions only on a CPU ------------------------------------------------------------

def _completion_labels(ids, mask, keep):
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100  # the prompt: no loss, as in SFT's completion-only loss and GRPO's log-probs
    return labels


def test_labelled_positions_only_scores_the_labelled_positions_with_the_same_results(tiny_model_dir, lm_head_calls):
    import trl.trainer.utils as trl_utils
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from agentic_rl.train.logprobs import labelled_positions_only

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))  # what TRL's SFTTrainer asks for
    ids, mask, keep = _batch(model.config.vocab_size)
    labels = _completion_labels(ids, mask, keep)

    def score():
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        out.loss.backward()
        return out, {n: p.grad.clone() for n, p in model.named_parameters()}

    original = trl_utils._use_triton
    everywhere, everywhere_grads = score()
    with labelled_positions_only():
        only, only_grads = score()
    assert trl_utils._use_triton is original  # restored on leaving
    labelled = int((labels[:, 1:] != -100).sum())
    assert lm_head_calls == [(ids.shape[0] * (ids.shape[1] - 1), False), (labelled, True)]
    assert labelled < lm_head_calls[0][0] / 2
    for field in ("loss", "log_probs", "entropy"):
        torch.testing.assert_close(getattr(only, field), getattr(everywhere, field), atol=1e-6, rtol=1e-5)
    assert torch.equal(only.is_top1, everywhere.is_top1) and torch.equal(only.label_mask, everywhere.label_mask)
    assert everywhere_grads.keys() == only_grads.keys()
    for name in everywhere_grads:
        torch.testing.assert_close(only_grads[name], everywhere_grads[name], atol=1e-6, rtol=1e-5)
