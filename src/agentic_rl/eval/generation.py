"""Batched generation for evaluation: left padding, prompts sorted by length, batch size chosen for the device.

The reference system generated one prompt at a time. Here prompts are rendered with the one prompt builder
(:func:`agentic_rl.data.formats.render_prompt`, the same one SFT and GRPO use), tokenized, sorted by length so that
each batch holds prompts of similar length (little padding, and batches whose sequences tend to finish together),
left-padded (decoder-only models continue from the last position, so padding must sit on the left) and generated in
batches under ``torch.inference_mode``. Results come back in the original order.

Greedy decoding is the default. ``num_samples > 1`` with ``temperature > 0`` draws that many samples per prompt
(for pass@k); with ``temperature == 0`` every sample would be identical, so the greedy completion is generated once
and repeated. Sampling settings the model's own ``generation_config`` might carry (Qwen3 ships ``do_sample=True,
top_k=20``) are overridden explicitly: what the caller asks for is what runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


def auto_batch_size(model, max_seq_len: int, num_prompts: int | None = None) -> int:
    """A batch size that fits the device: the KV cache of one batch may use half the free GPU memory, or 2 GiB on CPU.

    Capped at 256 sequences on GPU and 128 on CPU (per-sequence cost keeps falling up to ~64-128 rows on a CPU,
    measured on the embedded model), and at the number of sequences to generate.
    """
    import torch

    per_seq = max(1, _kv_bytes_per_token(model) * max_seq_len)
    device = _model_device(model)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget, cap = free // 2, 256
    else:
        budget, cap = 2 * 1024**3, 128
    size = max(1, min(cap, budget // per_seq))
    if num_prompts is not None:
        size = max(1, min(size, num_prompts))
    return int(size)


def _model_device(model):
    import torch

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

def generate_batched(model, tokenizer, prompts: list[list[dict[str, str]]], *, max_new_tokens: int,
                     batch_size: int | None = None, temperature: float = 0.0, top_p: float = 1.0,
                     num_samples: int = 1, seed: int = 0, enable_thinking: bool = False,
                     ) -> list[list[GenerationResult]]:
    """Generate ``num_samples`` completions for each conversational prompt; returns one list per prompt, in order.

    Example (a trained model)::

        results = generate_batched(model, tok, [build_prompt("What is 2 + 3?")], max_new_tokens=32)
        results[0][0]  # GenerationResult(text='2 + 3 = 5\\nFinal Answer: 5', num_tokens=12, truncated=False)

    The model is put in eval mode for the call and returned to the mode it was in (training loops call this).
    """
    import torch

    if not prompts:
        return []
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    sampling = temperature > 0
    draws = num_samples if sampling else 1  # greedy samples are identical: generate once, repeat

    texts = [render_prompt(tokenizer, messages, enable_thinking=enable_thinking) for messages in prompts]
    # Chat templates already hold any BOS token; adding special tokens again would double it.
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    order = sorted(range(len(encoded)), key=lambda i: (-len(encoded[i]), i))  # longest first: OOM shows up at once

    device = _model_device(model)
    if batch_size is None:
        longest = max(len(e) for e in encoded) + max_new_tokens
        batch_size = max(1, auto_batch_size(model, longest, len(encoded) * draws) // draws)
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = eos_ids[0] if eos_ids else 0
    gen_kwargs: dict[str, Any] = dict(
        max_new_tokens=max_new_tokens, do_sample=sampling, num_return_sequences=draws,
        eos_token_id=eos_ids or None, pad_token_id=pad_id,
        # Trainers switch the KV cache off for gradient checkpointing (config.use_cache=False); generation needs it.
        use_cache=True,
        # Neutral values unless sampling was asked for: the model's own generation_config must not leak in.
        # top_k=0 turns top-k off when sampling (the global default is 50); greedy ignores it, 50 avoids a warning.
        temperature=temperature if sampling else 1.0, top_p=top_p if sampling else 1.0, top_k=0 if sampling else 50,
        repetition_penalty=1.0,
    )

    results: list[list[GenerationResult] | None] = [None] * len(prompts)
    was_training = getattr(model, "training", False)
    model.eval()
    # Sampling is seeded, and the caller's random streams are restored afterwards (a training loop that evaluates
    # in between must draw the same numbers as one that does not).
    cuda = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=cuda, enabled=sampling):
            if sampling:
                torch.manual_seed(seed)
            for start in range(0, len(order), batch_size):
                idx = order[start:start + batch_size]
                width = max(len(encoded[i]) for i in idx)
                # Left padding: [pad ... pad, prompt tokens]; the attention mask hides the pads.
                input_ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
                attention = torch.zeros((len(idx), width), dtype=torch.long)
                for row, i in enumerate(idx):
                    ids = encoded[i]
                    input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
                    attention[row, width - len(ids):] = 1
                with torch.inference_mode():
                    out = model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                                         **gen_kwargs)
                new = out[:, width:].cpu()  # (len(idx) * draws, generated): one prompt's samples are adjacent
                for row, i in enumerate(idx):
                    samples = [_decode(tokenizer, new[row * draws + d].tolist(), eos_ids, max_new_tokens)
                               for d in range(draws)]
                    results[i] = samples if sampling else samples * num_samples
    finally:
        if was_training:
            model.train()
    return results  # type: ignore[return-value]


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
    import torch

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
