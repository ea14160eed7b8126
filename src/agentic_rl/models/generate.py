"""Batched generation, the one decoding path of evaluation, GRPO's held-out checks, GRPO's sampling (tiny preset),
preference sampling and the agent's episode loop. It sits with model loading, below the layers that generate, and
imports torch and transformers when imported: callers import it where they generate, not at their own import.

The reference system generated one prompt at a time. Here prompts are rendered with the one prompt builder
(:func:`agentic_rl.data.formats.render_prompt`, the same one SFT and GRPO use), tokenized, sorted by length (little
padding), left-padded (decoder-only models continue from the last position, so padding must sit on the left) and
generated in batches under ``torch.inference_mode``. Results come back in the original order.

Two engines (:func:`generate_token_ids`):

* ``compact`` (the default wherever the model allows it): the project's own decode loop. A prefix every prompt
  shares (the system prompt) is prefilled once; the prompts are prefilled from there in chunks and joined into one
  decode batch over a KV cache allocated once; a sequence leaves the batch the step it ends, so each step costs
  what the running sequences cost and a large batch does not wait for its longest member. Between the turns of a
  multi-turn rollout each episode's keys and values are kept (:class:`TurnCache`), so a turn prefills only the
  tokens added since the last one (the observation and the next generation prompt), not the whole episode again.
  Evaluation completions are short and of uneven length, which is exactly where padded batches waste their work.
* ``padded``: ``model.generate`` on padded batches (the fallback for models the loop cannot drive: encoder-decoders,
  sliding-window or hybrid caches, forwards without ``logits_to_keep``).

transformers' continuous batching (``generate_batch``, paged attention) and a static cache (with or without
``torch.compile``) were measured against these on CPU; ``benchmarks/bench_eval.py --also ...`` reruns them.

Greedy decoding is the default. ``num_samples > 1`` with ``temperature > 0`` draws that many samples per prompt
(for pass@k); with ``temperature == 0`` every sample would be identical, so the greedy completion is generated once
and repeated. Sampling settings the model's own ``generation_config`` might carry (Qwen3 ships ``do_sample=True,
top_k=20``) are overridden explicitly: what the caller asks for is what runs.
"""

from __future__ import annotations

import inspect
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agentic_rl.data.formats import render_prompt


@dataclass
class GenerationResult:
    """One completion: the decoded text (special tokens removed), its length in generated tokens (up to and including
    the end-of-sequence token, padding excluded) and whether it hit ``max_new_tokens`` without ending."""

    text: str
    num_tokens: int
    truncated: bool


# ---------------------------------------------------------------------------------------------------------------
# Device-dependent batch size
# ---------------------------------------------------------------------------------------------------------------

#: Largest batch of the compact decode loop on a CPU (memory permitting).
CPU_COMPACT_CAP = 1024


def _kv_bytes_per_token(model) -> int:
    """Bytes of key/value cache one token costs: 2 (K and V) x layers x kv heads x head dim x dtype size."""
    cfg = getattr(model, "config", None)
    text_cfg = getattr(cfg, "text_config", None) or cfg
    layers = getattr(text_cfg, "num_hidden_layers", 24) or 24
    heads = getattr(text_cfg, "num_attention_heads", 16) or 16
    kv_heads = getattr(text_cfg, "num_key_value_heads", None) or heads
    hidden = getattr(text_cfg, "hidden_size", 1024) or 1024
    head_dim = getattr(text_cfg, "head_dim", None) or hidden // heads
    try:
        dtype_bytes = next(model.parameters()).element_size()
    except (StopIteration, AttributeError):
        dtype_bytes = 4
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def auto_batch_size(model, max_seq_len: int, num_prompts: int | None = None, *, compact: bool = False) -> int:
    """A batch size that fits the device: the KV cache of one batch may use half the free GPU memory, or 2 GiB on CPU.

    Capped at 256 sequences on GPU and, on CPU, at 128 for padded batches (per-sequence cost keeps falling up to
    ~64-128 rows, measured on the embedded model) or :data:`CPU_COMPACT_CAP` for the compact loop (which drops ended
    rows, so a larger batch only saves steps), and at the number of sequences to generate.
    """
    per_seq = max(1, _kv_bytes_per_token(model) * max_seq_len)
    device = _model_device(model)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget, cap = free // 2, 256
    else:
        budget, cap = 2 * 1024**3, (CPU_COMPACT_CAP if compact else 128)
    size = max(1, min(cap, budget // per_seq))
    if num_prompts is not None:
        size = max(1, min(size, num_prompts))
    return int(size)


def _model_device(model):
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def _eos_ids(model, tokenizer) -> list[int]:
    """Every token that ends a completion: the generation config's EOS ids (Qwen3: ``<|im_end|>`` and
    ``<|endoftext|>``) plus the tokenizer's EOS."""
    ids: list[int] = []
    gen_cfg = getattr(model, "generation_config", None)
    value = getattr(gen_cfg, "eos_token_id", None)
    if value is not None:
        ids.extend(value if isinstance(value, (list, tuple)) else [value])
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return list(dict.fromkeys(int(i) for i in ids))


# ---------------------------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------------------------

ENGINES = ("auto", "compact", "padded")


class TurnCache:
    """The keys and values of each episode's tokens so far, kept from one turn of a multi-turn rollout to the next:
    a turn then prefills only what came after them (the rest of the last turn, the observation, the next generation
    prompt) instead of the whole episode again.

    Entries are keyed by the caller (an episode's index) and hold the tokens they cover; an entry is used as far as
    its tokens begin the next context (a context window that dropped early turns ends the match there, and the rest is
    prefilled). The keys and values belong to the weights that computed them: one cache per rollout, never kept
    across an optimizer step. An entry that would take the cache past ``max_bytes`` is not kept (that episode is
    prefilled in full next turn).
    """

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = max_bytes, 0
        self.entries: dict = {}

    @classmethod
    def for_model(cls, model) -> TurnCache:
        """A cache that may hold a quarter of the free GPU memory, or 2 GiB on a CPU."""
        device = _model_device(model)
        if device.type == "cuda":
            return cls(torch.cuda.mem_get_info(device)[0] // 4)
        return cls(2 * 1024**3)

    def reusable(self, key, context: list[int]) -> tuple[int, list]:
        """(n, per-layer keys and values): the first n tokens of ``context`` are cached, n < len(context) (the last
        token's logits start the next turn, so at least one token is prefilled)."""
        entry = self.entries.get(key)
        if entry is None:
            return 0, []
        ids, layers = entry
        limit = min(len(ids), len(context) - 1)
        n = next((k for k in range(limit) if ids[k] != context[k]), limit)
        return n, layers

    def forget(self, keys) -> None:
        """Drop the entries of ``keys`` (episodes that ended), freeing their share of the budget."""
        for key in keys:
            old = self.entries.pop(key, None)
            if old is not None:
                self.bytes -= _cache_bytes(old[1])

    def store(self, key, ids: list[int], layers: list) -> None:
        """Keep ``layers`` (per layer (keys, values), each (kv heads, len(ids), head dim)) as the cache of ``ids``."""
        self.forget([key])
        size = _cache_bytes(layers)
        if self.bytes + size <= self.max_bytes:
            self.entries[key] = (list(ids), layers)
            self.bytes += size


def _cache_bytes(layers) -> int:
    return sum(t.numel() * t.element_size() for pair in layers for t in pair)


def generate_token_ids(model, contexts: list[list[int]], *, max_new_tokens: int, stop_ids: list[int], pad_id: int,
                       temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, batch_size: int | None = None,
                       engine: str = "auto", progress: str | None = None, turn_cache: TurnCache | None = None,
                       cache_keys: list | None = None) -> list[list[int]]:
    """New tokens for each token context, in order, each cut just after its first stop token (kept).

    The one decoding function of the project (evaluation, GRPO's held-out checks, GRPO's sampling with
    ``generation_backend: compact`` and the agent's episode loop call it). ``temperature == 0`` decodes greedily;
    otherwise tokens are sampled (``top_k`` 0 = no top-k filter) from torch's global random stream, which the caller
    seeds. The model's mode is left as it is.

    ``engine``: ``compact`` runs the project's decode loop (:func:`_decode_compact`), which drops ended sequences
    from the batch, so a step costs about what the sequences still running cost; ``padded`` is ``model.generate`` on
    padded batches, which carries finished rows to the end of the batch; ``auto`` is ``compact`` wherever the model
    allows it (a decoder-only model with plain full-attention cache layers), else ``padded``.

    On a CPU it decodes in the weights' precision, setting aside a mixed-precision wrapper (:func:`weights_precision`).

    ``progress``: the label of a progress bar (with a time estimate) over the contexts; None draws none.

    ``turn_cache`` with ``cache_keys`` (one per context): the compact engine starts each context from the keys and
    values the cache holds for its key (as far as they cover the context's beginning) and stores each context's
    cache, generated tokens included, under its key afterwards; the padded engine neither reads nor writes it.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if not contexts:
        return []
    if any(len(c) == 0 for c in contexts):
        raise ValueError("every context needs at least one token")
    if engine == "auto":
        engine = "compact" if _compact_supported(model) else "padded"
    # Longest first: batches hold prompts of similar length (little padding), and running out of memory shows up at
    # the first batch.
    order = sorted(range(len(contexts)), key=lambda i: (-len(contexts[i]), i))
    if batch_size is None:
        longest = len(contexts[order[0]]) + max_new_tokens
        batch_size = auto_batch_size(model, longest, len(contexts), compact=engine == "compact")
    reuse = turn_cache is not None and engine == "compact"
    if reuse and (cache_keys is None or len(cache_keys) != len(contexts)):
        raise ValueError("a turn_cache needs one cache key per context")
    sampling = dict(temperature=temperature, top_p=top_p, top_k=top_k)
    results: list[list[int]] = [[] for _ in contexts]
    stops = set(stop_ids)
    from tqdm.auto import tqdm

    bar = tqdm(total=len(contexts), desc=progress, unit="seq", disable=progress is None, file=sys.stderr)
    with torch.inference_mode(), weights_precision(model), bar:
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            batch = [contexts[i] for i in idx]
            if engine == "compact":
                past = [turn_cache.reusable(cache_keys[i], contexts[i]) for i in idx] if reuse else None
                new, kept = _decode_compact(model, batch, max_new_tokens=max_new_tokens, stop_ids=stop_ids,
                                            pad_id=pad_id, past=past, keep_cache=reuse, **sampling)
            else:
                new, kept = _decode_padded(model, batch, max_new_tokens=max_new_tokens, stop_ids=stop_ids,
                                           pad_id=pad_id, **sampling), None
            for j, (i, ids) in enumerate(zip(idx, new.tolist())):  # (len(idx), max_new_tokens), stop then padding
                cut = next((k + 1 for k, t in enumerate(ids) if t in stops), len(ids))
                results[i] = ids[:cut]
                if kept is not None:
                    n_new, layers = kept[j]
                    turn_cache.store(cache_keys[i], contexts[i] + ids[:n_new], layers)
            bar.update(len(idx))
    return results


#: Whether decoding on a CPU sets a mixed-precision wrapper aside (:func:`weights_precision`);
#: ``benchmarks/bench_decode_precision.py`` turns it off to time the autocast decoding it replaces.
CPU_DECODES_IN_WEIGHTS_PRECISION = True


@contextmanager
def weights_precision(model):
    """While decoding on a CPU, the model runs the forward it had before accelerate's mixed-precision wrapper, in its
    weights' precision (fp32 in training); the wrapper is put back on exit.

    TRL's ``bf16`` setting has accelerate wrap the instance's ``forward`` in bf16 autocast. On a CPU, with the weights
    in training (as GRPO's are while it samples), a decode step of a few tokens per sequence then costs more than the
    fp32 step (``benchmarks/bench_decode_precision.py`` measures both), so GRPO's sampling (this loop, and TRL's own
    generation, which the GRPO trainer runs in this context too) and its held-out checks run in fp32 while its loss
    keeps the bf16 matmuls. The samples then come from the policy as evaluation scores it: evaluation loads the weights
    in fp32 on a CPU. A GPU keeps the wrapper (its bf16 matmuls are fast); so does a model no accelerate wrapper is
    on."""
    # accelerate keeps the unwrapped forward under ``_original_forward``; its public way back to it,
    # ``unwrap_model(keep_fp32_wrapper=False)``, drops the wrapper for good, and training needs it after the rollout.
    original, wrapped = model.__dict__.get("_original_forward"), model.__dict__.get("forward")
    if (not CPU_DECODES_IN_WEIGHTS_PRECISION or original is None or wrapped is None
            or _model_device(model).type != "cpu"):
        yield
        return
    model.forward = original
    try:
        yield
    finally:
        model.forward = wrapped


def _compact_supported(model) -> bool:
    """Whether :func:`_decode_compact` can drive the model: a decoder-only model whose forward takes
    ``position_ids``, a cache and ``logits_to_keep``, and whose cache is all full-attention layers."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT wrappers
    config = getattr(base, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False) or _cache_keyword(model) is None:
        return False
    try:
        cache = DynamicCache(config=config)
    except (TypeError, ValueError, AttributeError):
        return False
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def _cache_keyword(model) -> str | None:
    """The forward's name for the KV cache (``cache`` since transformers 5.24, ``past_key_values`` before), or None
    when the forward lacks it, ``position_ids`` or ``logits_to_keep``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        params = set(inspect.signature(base.forward).parameters)
    except (TypeError, ValueError):
        return None
    if not {"position_ids", "logits_to_keep"} <= params:
        return None
    return next((name for name in ("cache", "past_key_values") if name in params), None)


def _left_pad(contexts: list[list[int]], pad_id: int):
    """(input_ids, attention_mask), both (B, longest): [pad ... pad, tokens]; decoder-only models continue from the
    last position, so padding must sit on the left."""
    width = max(len(c) for c in contexts)
    input_ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(contexts), width), dtype=torch.long)
    for row, ids in enumerate(contexts):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention[row, width - len(ids):] = 1
    return input_ids, attention


def _decode_padded(model, contexts, *, max_new_tokens, stop_ids, pad_id, temperature, top_p, top_k):
    """``model.generate`` on one left-padded batch; returns the new tokens (B, generated) on the CPU."""
    input_ids, attention = _left_pad(contexts, pad_id)
    device = _model_device(model)
    sampling = temperature > 0
    out = model.generate(
        input_ids=input_ids.to(device), attention_mask=attention.to(device), max_new_tokens=max_new_tokens,
        do_sample=sampling, eos_token_id=stop_ids or None, pad_token_id=pad_id,
        # Trainers switch the KV cache off for gradient checkpointing (config.use_cache=False); generation needs it.
        use_cache=True,
        # Neutral values unless sampling was asked for: the model's own generation_config must not leak in.
        # top_k=0 turns top-k off when sampling (the global default is 50); greedy ignores it, 50 avoids a warning.
        temperature=temperature if sampling else 1.0, top_p=top_p if sampling else 1.0,
        top_k=top_k if sampling else 50, repetition_penalty=1.0)
    return out[:, input_ids.shape[1]:].cpu()


class PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer with room for ``capacity`` positions, allocated when the first keys arrive:
    ``update`` writes the new keys and values in place and returns views of the filled part."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = capacity, 0
        self.key_buffer = self.value_buffer = None

    def write_rows(self, rows, keys, values, batch: int, width: int) -> None:
        """Prefill: put (len(rows), heads, w, dim) keys and values right-aligned at ``width`` in ``rows``."""
        if self.key_buffer is None:
            shape = (batch, keys.shape[1], self.capacity, keys.shape[3])
            # Zeros, not empty: padding positions are masked, but 0 x NaN garbage would still be NaN.
            self.key_buffer = torch.zeros(shape, dtype=keys.dtype, device=keys.device)
            self.value_buffer = torch.zeros(shape, dtype=values.dtype, device=values.device)
            self.device, self.is_initialized = keys.device, True
        self.key_buffer[rows, :, width - keys.shape[2]:width] = keys
        self.value_buffer[rows, :, width - values.shape[2]:width] = values
        self._refresh()

    def filled(self, length: int) -> None:
        """Mark the first ``length`` positions as holding keys and values (after the prefill wrote them)."""
        self.length = length
        self._refresh()

    def _refresh(self) -> None:
        self.keys = self.key_buffer[:, :, :self.length]
        self.values = self.value_buffer[:, :, :self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        n = key_states.shape[-2]
        self.key_buffer[:, :, self.length:self.length + n] = key_states
        self.value_buffer[:, :, self.length:self.length + n] = value_states
        self.length += n
        self._refresh()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices) -> None:
        self.key_buffer = self.key_buffer.index_select(0, indices)
        self.value_buffer = self.value_buffer.index_select(0, indices)
        self._refresh()


#: Prompts prefilled per forward pass by the compact loop on a CPU: a prefill of the whole batch at once moves
#: activations too large for the CPU's caches (and pads every prompt to the longest); chunks of length-sorted prompts
#: do not. On an accelerator the whole batch is prefilled at once.
PREFILL_CHUNK = 16
#: A prefix that every context of a call shares (the system prompt, a log's header) and that is at least this many
#: tokens long is prefilled once, and each context from where it differs; shorter ones are not worth the extra pass.
MIN_SHARED_PREFIX = 8
#: Ended sequences leave the batch once they are at least 1/REMOVE_FRACTION of it (until then they ride along):
#: each removal copies the whole cache, which costs more than a few rows of computation.
REMOVE_FRACTION = 8


def shared_prefix_length(contexts: list[list[int]]) -> int:
    """How many leading tokens every context has in common, leaving at least one token of each (the last position's
    logits start the decoding).

    >>> shared_prefix_length([[5, 6, 7, 8], [5, 6, 9], [5, 6, 7]])
    2
    """
    limit = min(len(c) for c in contexts) - 1
    if limit <= 0:
        return 0
    heads = torch.tensor([c[:limit] for c in contexts], dtype=torch.long)  # (B, limit)
    differs = (heads != heads[:1]).any(0).nonzero()
    return int(differs[0]) if len(differs) else limit


def _decode_compact(model, contexts, *, max_new_tokens, stop_ids, pad_id, temperature, top_p, top_k, past=None,
                    keep_cache=False):
    """A decode loop that removes ended sequences from the batch; returns ((B, max_new_tokens) new tokens on the CPU,
    ``pad_id`` after a sequence's stop token; the kept caches or None). ``contexts`` come longest first.

    Same arithmetic per sequence as ``model.generate``: left padding hidden by the attention mask, positions counted
    from each sequence's first real token, logits of the last position only, argmax (or temperature, top-k, top-p,
    multinomial). Differences, all for speed: a prefix all contexts share (:data:`MIN_SHARED_PREFIX` tokens or more)
    is prefilled once and its keys and values are given to every chunk; distinct prompts are prefilled once each
    (from where they differ), in chunks of :data:`PREFILL_CHUNK`, and their caches joined (left-padded to the
    longest prompt, a chunk's padding between the shared prefix and the rest) into one decode batch; the KV
    cache is allocated once for the whole generation instead of growing by concatenation every step; and ended
    sequences leave the batch (once they are 1/:data:`REMOVE_FRACTION` of it: a removal copies the cache), where
    ``generate`` keeps computing finished rows until the longest one ends.

    ``past``: for each context, (n, per-layer (keys, values) of shape (kv heads, >= n, head dim)) from a
    :class:`TurnCache`: the keys and values of its first n tokens, which are then not prefilled again. With
    ``keep_cache`` the second result holds, for each context, (new tokens in the cache, per-layer keys and values of
    the context and those tokens), ready for :meth:`TurnCache.store`.
    """
    device = _model_device(model)
    cache_keyword = _cache_keyword(model) or "past_key_values"
    if past is not None and any(n for n, _ in past):
        cache, attention, last_position, logits = _prefill_after_past(
            model, contexts, past, max_new_tokens=max_new_tokens, pad_id=pad_id, device=device,
            cache_keyword=cache_keyword)
    else:
        cache, attention, last_position, logits = _prefill(
            model, contexts, max_new_tokens=max_new_tokens, pad_id=pad_id, device=device, cache_keyword=cache_keyword)
    # --- decode ------------------------------------------------------------------------------------------------------
    rows = torch.arange(len(contexts), device=device)  # original row of each sequence in the batch
    running = torch.ones(len(contexts), dtype=torch.bool, device=device)  # (batch,): not ended yet
    new = torch.full((len(contexts), max_new_tokens + 1), pad_id, dtype=torch.long, device=device)
    stops = torch.tensor(stop_ids, dtype=torch.long, device=device)
    # Per original row: new tokens fed through the model (so in the cache), and new tokens up to its stop token.
    fed = torch.zeros(len(contexts), dtype=torch.long, device=device)
    produced = torch.full((len(contexts),), max_new_tokens, dtype=torch.long, device=device)
    kept = [None] * len(contexts) if keep_cache else None

    def keep(batch_rows) -> None:  # the caches of these batch rows, before they leave the batch or the loop ends
        original = rows[batch_rows]
        new_counts = torch.minimum(fed[original], produced[original])
        lengths = (torch.tensor([len(contexts[row]) for row in original.tolist()], device=device)
                   + new_counts).tolist()
        # A row's tokens sit at its attended positions, in order (a stable sort puts them first); those past its stop
        # token were fed while it rode along after ending and are not its own. One gather per layer for all rows.
        order = torch.sort((attention[batch_rows] == 0).to(torch.int8), dim=1, stable=True).indices[:, :max(lengths)]
        gathered = []
        for layer in cache.layers:
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            gathered.append((layer.keys[batch_rows].gather(2, index), layer.values[batch_rows].gather(2, index)))
        for j, (row, length) in enumerate(zip(original.tolist(), lengths)):
            kept[row] = (int(new_counts[j]), [(keys[j, :, :length], values[j, :, :length])
                                              for keys, values in gathered])

    for step in range(max_new_tokens):
        tokens = _next_tokens(logits, temperature, top_p, top_k)
        # Rows that ended earlier write to the spare last column, which is dropped.
        new[rows, torch.where(running, step, max_new_tokens)] = tokens
        if step == max_new_tokens - 1:
            break
        stopped = running & torch.isin(tokens, stops)
        produced[rows[stopped]] = step + 1
        running &= ~stopped
        ended = len(running) - int(running.sum())
        if ended == len(running):
            break
        if ended * REMOVE_FRACTION >= len(running):  # removal copies the cache: not for every single row
            if kept is not None:
                keep((~running).nonzero().squeeze(1))
            keep_rows = running.nonzero().squeeze(1)
            cache.batch_select_indices(keep_rows)
            rows, tokens, attention = rows[keep_rows], tokens[keep_rows], attention[keep_rows]
            last_position, running = last_position[keep_rows], running[keep_rows]
        attention = torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=1)
        last_position = last_position + 1
        logits = model(input_ids=tokens[:, None], attention_mask=attention, position_ids=last_position[:, None],
                       use_cache=True, logits_to_keep=1, **{cache_keyword: cache}).logits[:, -1, :]  # (running, V)
        fed[rows] += 1
    if kept is not None:
        keep(torch.arange(len(rows)))
    return new[:, :max_new_tokens].cpu(), kept


def _joint_buffers(model, batch: int, width: int, max_new_tokens: int, device):
    """The decode batch's KV cache (room for ``width`` + ``max_new_tokens`` positions), its attention mask (batch,
    width) and each row's last position (batch,), for a prefill to fill."""
    cache = DynamicCache(config=model.config)
    cache.layers = [PreallocatedLayer(width + max_new_tokens) for _ in cache.layers]
    attention = torch.zeros((batch, width), dtype=torch.long, device=device)
    return cache, attention, torch.empty(batch, dtype=torch.long, device=device)


def _prefill(model, contexts, *, max_new_tokens, pad_id, device, cache_keyword):
    """The prefill of :func:`_decode_compact` from nothing: (joint cache, attention (B, width), last position (B,),
    logits of the last position (B, vocab))."""
    width = max(len(c) for c in contexts)
    cache, attention, last_position = _joint_buffers(model, len(contexts), width, max_new_tokens, device)
    # Each distinct context once (GRPO and pass@k repeat every prompt), chunk by chunk; each chunk's cache lands
    # right-aligned in the rows of the joint one that hold its contexts.
    distinct: dict[tuple[int, ...], int] = {}
    owner = torch.tensor([distinct.setdefault(tuple(c), len(distinct)) for c in contexts], device=device)  # (B,)
    unique = [list(c) for c in distinct]  # longest first, like contexts
    logits = None
    shared = shared_prefix_length(unique) if len(unique) > 1 else 0
    shared = shared if shared >= MIN_SHARED_PREFIX else 0
    if shared:
        prefix_cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([unique[0][:shared]], device=device),
              attention_mask=torch.ones((1, shared), dtype=torch.long, device=device),
              position_ids=torch.arange(shared, device=device)[None], use_cache=True, logits_to_keep=1,
              **{cache_keyword: prefix_cache})
        prefix = [(layer.keys, layer.values) for layer in prefix_cache.layers]  # each (1, heads, shared, dim)
    chunk_size = PREFILL_CHUNK if device.type == "cpu" else len(unique)  # an accelerator wants large batches
    for start in range(0, len(unique), chunk_size):
        chunk = unique[start:start + chunk_size]
        input_ids, chunk_attention = (t.to(device) for t in _left_pad([c[shared:] for c in chunk], pad_id))
        positions = shared + (chunk_attention.cumsum(-1) - 1).clamp(min=0)  # (b, w): counted from the first token
        chunk_cache = DynamicCache(config=model.config)
        if shared:  # every row's cache starts with the shared prefix: [prefix | padding | the rest of its context]
            for index, (keys, values) in enumerate(prefix):
                chunk_cache.update(keys.expand(len(chunk), -1, -1, -1), values.expand(len(chunk), -1, -1, -1), index)
            chunk_attention = torch.cat([chunk_attention.new_ones((len(chunk), shared)), chunk_attention], dim=1)
        out = model(input_ids=input_ids, attention_mask=chunk_attention, position_ids=positions, use_cache=True,
                    logits_to_keep=1, **{cache_keyword: chunk_cache})
        rows = ((owner >= start) & (owner < start + len(chunk))).nonzero().squeeze(1)  # joint rows of this chunk
        source = owner[rows] - start  # their row in the chunk
        for layer, chunk_layer in zip(cache.layers, chunk_cache.layers):
            layer.write_rows(rows, chunk_layer.keys[source], chunk_layer.values[source], len(contexts), width)
        attention[rows, width - chunk_attention.shape[1]:] = chunk_attention[source]
        last_position[rows] = positions[source, -1]
        if logits is None:
            logits = out.logits.new_empty((len(contexts), out.logits.shape[-1]))  # (B, vocab)
        logits[rows] = out.logits[source, -1, :]
    for layer in cache.layers:
        layer.filled(width)
    return cache, attention, last_position, logits


def _prefill_after_past(model, contexts, past, *, max_new_tokens, pad_id, device, cache_keyword):
    """The prefill of :func:`_decode_compact` when the keys and values of each context's first n tokens are given
    (``past``, from a :class:`TurnCache`): only the rest is run through the model, in chunks of
    :data:`PREFILL_CHUNK` on a CPU. A chunk's row is [padding | its past | padding | the rest of its context] (the
    padding masked, positions counted from the first real token), right-aligned in the joint cache."""
    chunk_size = PREFILL_CHUNK if device.type == "cpu" else len(contexts)
    chunks = [range(start, min(len(contexts), start + chunk_size)) for start in range(0, len(contexts), chunk_size)]
    done = [n for n, _ in past]
    width = max(max(done[i] for i in chunk) + max(len(contexts[i]) - done[i] for i in chunk) for chunk in chunks)
    cache, attention, last_position = _joint_buffers(model, len(contexts), width, max_new_tokens, device)
    logits = None
    for chunk in chunks:
        longest_past = max(done[i] for i in chunk)
        input_ids, new_attention = (t.to(device) for t in _left_pad([contexts[i][done[i]:] for i in chunk], pad_id))
        past_attention = torch.zeros((len(chunk), longest_past), dtype=torch.long, device=device)
        chunk_cache = DynamicCache(config=model.config)
        if longest_past:
            with_past = next(i for i in chunk if done[i])
            for index in range(len(cache.layers)):
                nothing = past[with_past][1][index][0][:, :0].transpose(0, 1)  # (0, heads, dim): a row without past
                # Each row's past, (n, heads, dim) per token, left-padded with zeros to the chunk's longest past.
                keys, values = (pad_sequence([past[i][1][index][part][:, :done[i]].transpose(0, 1) if done[i]
                                              else nothing for i in chunk],
                                             batch_first=True, padding_side="left").transpose(1, 2)
                                for part in (0, 1))
                chunk_cache.update(keys, values, index)
            for row, i in enumerate(chunk):
                past_attention[row, longest_past - done[i]:] = 1
        chunk_attention = torch.cat([past_attention, new_attention], dim=1)
        positions = (torch.tensor([done[i] for i in chunk], device=device)[:, None]
                     + (new_attention.cumsum(-1) - 1).clamp(min=0))  # (b, w)
        out = model(input_ids=input_ids, attention_mask=chunk_attention, position_ids=positions, use_cache=True,
                    logits_to_keep=1, **{cache_keyword: chunk_cache})
        rows = torch.arange(chunk.start, chunk.stop, device=device)
        for layer, chunk_layer in zip(cache.layers, chunk_cache.layers):
            layer.write_rows(rows, chunk_layer.keys, chunk_layer.values, len(contexts), width)
        attention[rows, width - chunk_attention.shape[1]:] = chunk_attention
        last_position[rows] = positions[:, -1]
        if logits is None:
            logits = out.logits.new_empty((len(contexts), out.logits.shape[-1]))  # (B, vocab)
        logits[rows] = out.logits[:, -1, :]
    for layer in cache.layers:
        layer.filled(width)
    return cache, attention, last_position, logits


def _next_tokens(logits, temperature: float, top_p: float, top_k: int):
    """Greedy argmax, or a draw after temperature, top-k and top-p filtering (``generate``'s order and rules)."""
    if temperature <= 0:
        return logits.argmax(-1)
    scores = logits.float() / temperature
    if top_k and 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, sorted_idx = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        drop = cumulative <= (1 - top_p)
        drop[:, -1:] = False  # always keep the most likely token
        scores = scores.masked_fill(drop.scatter(1, sorted_idx, drop), float("-inf"))
    return torch.multinomial(scores.softmax(-1), num_samples=1).squeeze(1)


@contextmanager
def seeded_sampling(model, seed: int, *, enabled: bool = True):
    """Within the block torch's random streams (CPU, and the model's GPU) start from ``seed``; afterwards the caller's
    streams are restored, so a training loop that evaluates in between draws the same numbers as one that does not.
    ``enabled=False`` (greedy decoding) leaves the streams alone."""
    device = _model_device(model)
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda, enabled=enabled):
        if enabled:
            torch.manual_seed(seed)
        yield


def generate_batched(model, tokenizer, prompts: list[list[dict[str, str]]], *, max_new_tokens: int,
                     batch_size: int | None = None, temperature: float = 0.0, top_p: float = 1.0,
                     num_samples: int = 1, seed: int = 0, enable_thinking: bool = False, engine: str = "auto",
                     progress: str | None = None) -> list[list[GenerationResult]]:
    """Generate ``num_samples`` completions for each conversational prompt; returns one list per prompt, in order.

    Example (a trained model)::

        results = generate_batched(model, tok, [build_prompt("What is 2 + 3?")], max_new_tokens=32)
        results[0][0]  # GenerationResult(text='2 + 3 = 5\\nFinal Answer: 5', num_tokens=12, truncated=False)

    ``engine`` and ``progress`` (a progress bar's label) are :func:`generate_token_ids`'s. The model is put in eval
    mode for the call and returned to the mode it was in (training loops call this).
    """
    if not prompts:
        return []
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    sampling = temperature > 0
    draws = num_samples if sampling else 1  # greedy samples are identical: generate once, repeat

    texts = [render_prompt(tokenizer, messages, enable_thinking=enable_thinking) for messages in prompts]
    # Chat templates already hold any BOS token; adding special tokens again would double it.
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    contexts = [ids for ids in encoded for _ in range(draws)]  # one prompt's samples are adjacent
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = eos_ids[0] if eos_ids else 0

    was_training = getattr(model, "training", False)
    model.eval()
    try:
        with seeded_sampling(model, seed, enabled=sampling):
            new = generate_token_ids(model, contexts, max_new_tokens=max_new_tokens, stop_ids=eos_ids,
                                     pad_id=pad_id, temperature=temperature, top_p=top_p, top_k=0,
                                     batch_size=batch_size * draws if batch_size else None, engine=engine,
                                     progress=progress)
    finally:
        if was_training:
            model.train()
    results = []
    for p in range(len(prompts)):
        samples = [_decode(tokenizer, new[p * draws + d], eos_ids, max_new_tokens) for d in range(draws)]
        results.append(samples if sampling else samples * num_samples)
    return results


def _decode(tokenizer, ids: list[int], eos_ids: list[int], max_new_tokens: int) -> GenerationResult:
    """Cut at the first end-of-sequence token (kept in the count); the rest of the row is padding."""
    end = next((pos for pos, t in enumerate(ids) if t in eos_ids), None)
    if end is None:
        kept = ids
        truncated = len(ids) >= max_new_tokens
        num_tokens = len(ids)
    else:
        kept = ids[:end]
        truncated = False
        num_tokens = end + 1
    return GenerationResult(text=tokenizer.decode(kept, skip_special_tokens=True), num_tokens=num_tokens,
                            truncated=truncated)


def generate_one_by_one(model, tokenizer, prompts: list[list[dict[str, str]]], *, max_new_tokens: int,
                        enable_thinking: bool = False) -> list[GenerationResult]:
    """The naive baseline: one prompt per ``generate`` call, greedy. The reference for the equivalence test."""
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
    device = _model_device(model)
    was_training = getattr(model, "training", False)
    model.eval()
    out_results = []
    try:
        for messages in prompts:
            text = render_prompt(tokenizer, messages, enable_thinking=enable_thinking)
            ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]], dtype=torch.long)
            with torch.inference_mode():
                out = model.generate(input_ids=ids.to(device), attention_mask=torch.ones_like(ids).to(device),
                                     max_new_tokens=max_new_tokens, do_sample=False, temperature=1.0, top_p=1.0,
                                     top_k=50, repetition_penalty=1.0, eos_token_id=eos_ids or None,
                                     pad_token_id=pad_id, use_cache=True)
            out_results.append(_decode(tokenizer, out[0, ids.shape[1]:].cpu().tolist(), eos_ids, max_new_tokens))
    finally:
        if was_training:
            model.train()
    return out_results
