"""GRPO's log-prob passes in length-sorted chunks, each cut to the columns its rows use; the LM head over labelled
positions only.

TRL's ``GRPOTrainer`` (and ``RLOOTrainer``) score a batch — the policy's log-probs for the loss, the reference's for
the KL term, the old policy's when needed — with forward passes over ``[prompt | completion]`` rows: prompts
left-padded to the longest prompt of the batch, completions right-padded to the longest completion. With prompts and
completions of uneven lengths much of that is padding, and the forward and backward passes pay for every position.
verl removes padding with variable-length attention kernels (``use_remove_padding``); those need a GPU. Here
(:class:`LengthSortedScoring`) the rows are sorted by prompt length, then completion length, and scored
``logprob_chunk_rows`` at a time; each chunk drops the columns none of its rows uses — left padding all its prompts
share and completion columns past its longest completion. The results are put back in the batch's order and width
(zeros where a chunk was cut, which the completion mask hides), so the loss, its normalisation and the gradients are
TRL's own, up to float rounding.

Dropping left columns moves every position of the chunk by the same amount. Rotary position embeddings depend only on
the distance between positions, so that changes nothing but rounding; models with absolute positions, or rotary
variants whose frequencies depend on the sequence length, keep their left columns (:func:`shift_invariant`).

:func:`labelled_positions_only` is the other half, for SFT as well: TRL's fused LM head then projects only the
positions that carry a label (the completion) on a CPU, as it does on GPUs.
"""

from __future__ import annotations

import contextlib
from typing import Any

#: Rotary variants whose frequencies do not depend on the sequence length (transformers' ``rope_type`` names):
#: attention scores depend only on the distance between positions.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def shift_invariant(model) -> bool:
    """Whether moving every position of a row by the same amount leaves the model's outputs unchanged (up to
    rounding): rotary position embeddings of a static kind, nothing else."""
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    rope = getattr(text_config, "rope_parameters", None)
    if not isinstance(rope, dict):
        return False
    # Some models keep one set per attention type ({"full_attention": {...}, "sliding_attention": {...}}).
    kinds = [v.get("rope_type", "default") for v in rope.values() if isinstance(v, dict)]
    return all(kind in STATIC_ROPE_TYPES for kind in kinds or [rope.get("rope_type", "default")])


def plan_chunks(attention_mask, logits_to_keep: int, rows_per_chunk: int, *, trim_left: bool):
    """How to score a ``(B, L)`` batch whose last ``logits_to_keep`` columns are the completions.

    Returns ``(chunks, inverse)``: each chunk is ``(rows, start, stop, keep)`` — the batch rows it holds (a tensor),
    the column slice ``start:stop`` that covers every real token of those rows (``start`` is 0 unless ``trim_left``),
    and how many completion columns that slice keeps (at least one); ``inverse`` puts the concatenated chunk rows
    back in batch order.
    """
    import torch

    batch, width = attention_mask.shape
    first_completion = width - logits_to_keep
    prompt_lengths = attention_mask[:, :first_completion].sum(1).tolist()
    completion_lengths = attention_mask[:, first_completion:].sum(1).tolist()
    order = sorted(range(batch), key=lambda i: (prompt_lengths[i], completion_lengths[i], i))
    device = attention_mask.device
    chunks = []
    for begin in range(0, batch, rows_per_chunk):
        rows = torch.tensor(order[begin:begin + rows_per_chunk], device=device)
        used = attention_mask[rows].any(0).nonzero().flatten().tolist()
        start = min(used[0], first_completion) if (trim_left and used) else 0
        stop = max(used[-1] + 1 if used else 0, first_completion + 1)  # keep at least one completion column
        chunks.append((rows, start, stop, stop - first_completion))
    inverse = torch.empty(batch, dtype=torch.long, device=device)
    inverse[torch.tensor(order, device=device)] = torch.arange(batch, device=device)
    return chunks, inverse


class LengthSortedScoring:
    """Mixin for TRL's ``GRPOTrainer`` / ``RLOOTrainer`` (put it first among the bases): their
    ``_get_per_token_logps_and_entropies`` runs on length-sorted chunks of ``logprob_chunk_rows`` rows cut to the
    columns they use (module docstring). ``logprob_chunk_rows=0`` leaves TRL's own passes; so do multimodal inputs
    and the MoE auxiliary loss (their per-row extras would need the same cutting)."""

    def __init__(self, *args, logprob_chunk_rows: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.logprob_chunk_rows = logprob_chunk_rows

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **extras: Any):
        """Replaces ``GRPOTrainer._get_per_token_logps_and_entropies`` (and ``RLOOTrainer``'s, the same; checked
        against TRL 1.16) by the same passes over length-sorted chunks; TRL's own with chunking off."""
        import torch
        import torch.nn.functional as F

        score = super()._get_per_token_logps_and_entropies
        if not self.logprob_chunk_rows or compute_aux_loss or any(v is not None for v in extras.values()):
            return score(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                         compute_aux_loss, **extras)
        rows_per_chunk = min(self.logprob_chunk_rows, batch_size or self.logprob_chunk_rows)  # TRL's memory cap
        chunks, inverse = plan_chunks(attention_mask, logits_to_keep, rows_per_chunk,
                                      trim_left=shift_invariant(self.accelerator.unwrap_model(model)))
        logps, entropies = [], []
        for rows, start, stop, keep in chunks:
            chunk_logps, chunk_entropies, _ = score(model, input_ids[rows, start:stop],
                                                    attention_mask[rows, start:stop], keep, None, compute_entropy)
            logps.append(F.pad(chunk_logps, (0, logits_to_keep - keep)))
            if compute_entropy:
                entropies.append(F.pad(chunk_entropies, (0, logits_to_keep - keep)))
        return (torch.cat(logps)[inverse], torch.cat(entropies)[inverse] if compute_entropy else None, None)


@contextlib.contextmanager
def labelled_positions_only():
    """While open, TRL's fused LM head (``add_fused_lm_head``: the SFT loss, GRPO's and RLOO's log-probs) scores only
    the positions that have a label on a CPU too, as it does on CUDA and XPU.

    TRL projects through the LM head and folds the vocabulary only for labelled positions where Triton runs, and for
    every position elsewhere, because on a compiling backend (Neuron) a changing count would recompile each batch;
    the unlabelled positions' results are then zeroed. Nothing compiles on a CPU, and in SFT the prompt and the
    padding are most of the positions, so the head's forward and backward would run for several times the tokens
    they need. Same arithmetic per labelled position: this
    is TRL's own GPU path. A TRL without the switch (``trl.trainer.utils._use_triton``, checked against TRL 1.16 with
    the overridden methods: :data:`agentic_rl.train.grpo_trainer.OVERRIDDEN_TRL_METHODS`) keeps its own behaviour."""
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is None:
        yield
        return
    trl_utils._use_triton = lambda device: device.type == "cpu" or original(device)
    try:
        yield
    finally:
        trl_utils._use_triton = original
