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


#: The batch key of the turn contexts of episodes with a context window: a (B, turns, 3) tensor of
#: ``[context start, turn start, turn end]`` per turn (completion indices), rows padded with -1.
TURN_CONTEXTS = "turn_contexts"


def turn_contexts_tensor(contexts: list[tuple[list[int], list[tuple[int, int]]]]):
    """``[(context_starts, turn_spans), ...]`` per row -> the (B, turns, 3) tensor of :data:`TURN_CONTEXTS`."""
    import torch

    width = max((len(starts) for starts, _ in contexts), default=0)
    out = torch.full((len(contexts), max(width, 1), 3), -1, dtype=torch.long)
    for row, (starts, spans) in enumerate(contexts):
        for turn, (start, (begin, end)) in enumerate(zip(starts, spans)):
            out[row, turn] = torch.tensor([start, begin, end])
    return out


def turn_contexts_rows(tensor) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """The inverse of :func:`turn_contexts_tensor`."""
    rows = []
    for row in tensor.tolist():
        turns = [t for t in row if t[0] >= 0]
        rows.append(([t[0] for t in turns], [(t[1], t[2]) for t in turns]))
    return rows


class FoldedContextScoring:
    """Mixin for TRL's ``GRPOTrainer`` (put it first among the bases): the log-probs of episodes whose environment
    has a ``context_window`` are computed in the contexts their turns were generated in.

    In such an episode turn t was sampled from the prompt and the completion's tokens from ``context_starts[t]`` on
    (the earlier turns had left the context: :mod:`agentic_rl.agent.rollout`). Scoring the whole sequence at once
    would let every turn attend to what it never saw, so the ratio, the KL and the gradient would belong to another
    policy. Instead each row is scored once per context view (:func:`agentic_rl.agent.rollout.context_views`): the
    prompt followed by ``completion[start:end]``, positions counted from the prompt as at sampling; each turn's
    log-probs (and entropies) come from its own view and are put back at their places in the completion. Tool and
    feedback tokens keep a log-prob of 0 (the tool mask excludes them from the loss anyway).

    The rollout hands the views of a generation batch over with :meth:`set_rollout_contexts` (TRL computes the
    reference and old log-probs before it returns); the batch then carries them under :data:`TURN_CONTEXTS`, through
    TRL's shuffling and splitting, to the loss. Episodes without a context window are scored as before.
    """

    _rollout_contexts = None  # views of the generation batch being scored, in its row order
    _scoring_contexts = None  # views of the batch the loss is computed on

    def set_rollout_contexts(self, contexts) -> None:
        """``[(context_starts, turn_spans), ...]`` per row of the generation batch, or None (no context window)."""
        self._rollout_contexts = contexts

    @contextlib.contextmanager
    def contexts_of(self, batch):
        """While open, log-prob passes use the turn contexts ``batch`` carries (if any)."""
        tensor = batch.get(TURN_CONTEXTS) if isinstance(batch, dict) else None
        previous = self._scoring_contexts
        self._scoring_contexts = turn_contexts_rows(tensor) if tensor is not None else None
        try:
            yield
        finally:
            self._scoring_contexts = previous

    def _generate_and_score_completions(self, inputs):
        """Extends ``GRPOTrainer._generate_and_score_completions`` (checked against TRL 1.16): the batch keeps the
        rollout's turn contexts for the loss."""
        self._rollout_contexts = None
        try:
            batch = super()._generate_and_score_completions(inputs)
            if self._rollout_contexts is not None:
                batch[TURN_CONTEXTS] = turn_contexts_tensor(self._rollout_contexts).to(
                    batch["completion_ids"].device)
        finally:
            self._rollout_contexts = None
        return batch

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Extends ``GRPOTrainer.compute_loss`` (checked against TRL 1.16): scored in the batch's turn contexts."""
        with self.contexts_of(inputs):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **extras: Any):
        """Replaces ``GRPOTrainer._get_per_token_logps_and_entropies`` (checked against TRL 1.16) for rows with turn
        contexts (class docstring); the inherited passes otherwise."""
        import torch

        from agentic_rl.agent.rollout import context_views

        score = super()._get_per_token_logps_and_entropies
        contexts = self._scoring_contexts if self._scoring_contexts is not None else self._rollout_contexts
        if contexts is None:
            return score(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                         compute_aux_loss, **extras)
        if len(contexts) != input_ids.shape[0]:
            raise RuntimeError(f"{len(contexts)} episodes' turn contexts for a batch of {input_ids.shape[0]} rows")
        if any(v is not None for v in extras.values()):
            raise NotImplementedError("context windows with multimodal inputs")
        n_prompt = input_ids.shape[1] - logits_to_keep
        views = [(row, start, end, [spans[t] for t in turns]) for row, (starts, spans) in enumerate(contexts)
                 for start, end, turns in context_views(spans, starts)]
        width = max(end - start for _, start, end, _ in views)
        view_ids = input_ids.new_full((len(views), n_prompt + width), self.processing_class.pad_token_id)
        view_mask = attention_mask.new_zeros((len(views), n_prompt + width))
        back_rows, back_cols, view_rows, view_cols = [], [], [], []
        for v, (row, start, end, spans) in enumerate(views):
            view_ids[v, :n_prompt + end - start] = torch.cat([input_ids[row, :n_prompt],
                                                              input_ids[row, n_prompt + start:n_prompt + end]])
            view_mask[v, :n_prompt + end - start] = torch.cat([attention_mask[row, :n_prompt],
                                                               attention_mask[row, n_prompt + start:n_prompt + end]])
            for begin, stop in spans:
                back_rows += [row] * (stop - begin)
                back_cols += range(begin, stop)
                view_rows += [v] * (stop - begin)
                view_cols += range(begin - start, stop - start)
        logps, entropies, aux = score(model, view_ids, view_mask, width, batch_size, compute_entropy,
                                      compute_aux_loss)
        index = (torch.tensor(back_rows, device=logps.device), torch.tensor(back_cols, device=logps.device))
        source = (torch.tensor(view_rows, device=logps.device), torch.tensor(view_cols, device=logps.device))
        out_logps = logps.new_zeros((input_ids.shape[0], logits_to_keep))
        out_logps[index] = logps[source]
        out_entropies = None
        if compute_entropy:
            out_entropies = entropies.new_zeros((input_ids.shape[0], logits_to_keep))
            out_entropies[index] = entropies[source]
        return out_logps, out_entropies, aux
