"""A trained reward model as a reward: ``--reward 'reward_model(path=DIR):1.0'`` or the shorthand ``--reward rm:DIR``.

``DIR`` is the model folder ``agentic-rl reward-model`` writes (a sequence-classification model with one output).
Each completion is scored as the reward model saw its training pairs: a conversational prompt plus the completion as
an assistant message, rendered by the chat template exactly as TRL's ``RewardTrainer`` tokenizes a conversational
pair (:func:`render_conversation`); a plain-text prompt gets the completion and the EOS token appended. The score is
the model's scalar output at the last non-padding token. A sequence longer than ``max_length`` tokens (default: the
model's context length) is cut to its first ``max_length`` tokens, so one huge completion cannot exhaust memory.
Scoring is batched (right padding, ``batch_size`` sequences
per forward pass), in eval mode under ``torch.inference_mode``, on the training device (GPU when there is one), so
the same completion always gets the same score.

>>> reward = RewardModelReward(path="runs/reward-model/model")                          # doctest: +SKIP
>>> reward([[{"role": "assistant", "content": "Final Answer: 5"}]],
...        prompts=[[{"role": "user", "content": "What is 2 + 3?"}]])                  # doctest: +SKIP
[1.73]
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentic_rl.errors import ConfigError

__all__ = ["RewardModelReward", "load_reward_model", "score_texts", "render_conversation", "pair_texts"]


def load_reward_model(path: str | Path, *, device: str | None = None):
    """``(model, tokenizer)`` of a saved reward model, in eval mode on ``device`` (default: this process's GPU,
    ``cuda:$LOCAL_RANK``, when there is one, else the CPU)."""
    from transformers import AutoModelForSequenceClassification

    from agentic_rl.models.loading import (check_weights_finite, from_pretrained, load_tokenizer, resolve_device,
                                           resolve_dtype)

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"reward model {path} is not a model directory (no config.json); pass the model folder "
                          f"`agentic-rl reward-model` wrote (<run>/model)")
    device = resolve_device(device)
    if device == "cuda":  # one training process per GPU: score on this process's GPU, as the policy does
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    # The project's loader: a damaged folder (weights, config, shapes, NaN) is one ModelLoadError line.
    model = from_pretrained(AutoModelForSequenceClassification, str(path), "reward model",
                            dtype=resolve_dtype("auto", device, for_training=False))
    check_weights_finite(model, str(path))
    if getattr(model.config, "num_labels", None) != 1:
        raise ConfigError(f"{path} has {model.config.num_labels} outputs; a reward model has one (num_labels=1)")
    tokenizer = load_tokenizer(str(path), require_chat_template=False)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval(), tokenizer


@functools.lru_cache(maxsize=2)
def _shared_reward_model(path: str, device: str | None):
    """One loaded copy per (folder, device) in a process: GRPO builds its rewards again for every held-out
    evaluation, and a reward model is read-only, so the copies would only cost load time and memory."""
    return load_reward_model(path, device=device)


def render_conversation(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a whole conversation, as ``RewardTrainer`` tokenizes a conversational pair (no generation
    prompt: the last assistant turn is closed by the template's end-of-turn token)."""
    return list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])


def _as_messages(completion: Any) -> list[dict[str, str]]:
    if isinstance(completion, list):
        return list(completion)
    return [{"role": "assistant", "content": str(completion)}]


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "".join(m.get("content", "") for m in value if isinstance(m, dict))
    return str(value)


def pair_texts(tokenizer, prompt: Any, completion: Any) -> list[int]:
    """Token ids the reward model scores for one (prompt, completion): a conversational prompt (a message list) is
    rendered with the completion as its assistant turn; a plain-text prompt (or none) is prompt + completion + EOS,
    as ``RewardTrainer`` prepares text pairs."""
    if isinstance(prompt, list) or (prompt is None and isinstance(completion, list)):
        return render_conversation(tokenizer, list(prompt or []) + _as_messages(completion))
    text = (prompt or "") + _text(completion)
    if tokenizer.eos_token and not text.endswith(tokenizer.eos_token):
        text += tokenizer.eos_token
    return list(tokenizer(text)["input_ids"])


def score_texts(model, tokenizer, sequences: Sequence[list[int]], *, batch_size: int = 32,
                max_length: int | None = None) -> list[float]:
    """The reward model's scalar for each token sequence, batched with right padding (the classification head reads
    the last non-padding token, so padding never changes a score). A sequence longer than ``max_length`` is cut to
    its first ``max_length`` tokens (None: the model's context length, ``max_position_embeddings``)."""
    import torch

    if batch_size < 1:
        raise ConfigError(f"batch_size ({batch_size}) must be >= 1")
    if max_length is None:
        max_length = getattr(model.config, "max_position_embeddings", None)
    if max_length is not None:
        if max_length < 1:
            raise ConfigError(f"max_length ({max_length}) must be >= 1")
        sequences = [s[:max_length] for s in sequences]
    device = next(model.parameters()).device
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else tokenizer.pad_token_id
    scores: list[float] = []
    with torch.inference_mode():
        for start in range(0, len(sequences), batch_size):
            batch = sequences[start:start + batch_size]
            width = max(len(s) for s in batch)
            ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, seq in enumerate(batch):
                ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
                mask[row, :len(seq)] = 1
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits  # (batch, 1)
            scores.extend(float(v) for v in logits[:, 0].float().cpu())
    return scores


class RewardModelReward:
    """Scores completions with a trained reward model (see the module docstring); TRL's reward signature.

    ``path``: the reward model folder; ``batch_size``: sequences per forward pass; ``device``: default the GPU when
    there is one (where GRPO trains), else the CPU.
    """

    def __init__(self, path: str, batch_size: int = 32, device: str | None = None, name: str = "reward_model",
                 max_length: int | None = None):
        if not path:
            raise ConfigError("reward_model needs path=DIR (the folder `agentic-rl reward-model` wrote)")
        self.path = str(path)
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise ConfigError(f"reward_model: batch_size ({batch_size}) must be >= 1")
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < 1):
            raise ConfigError(f"reward_model: max_length must be an integer >= 1 (tokens), got {max_length!r}")
        self.max_length = max_length
        self.model, self.tokenizer = _shared_reward_model(str(Path(self.path).resolve()), device)
        self.__name__ = name

    def __call__(self, completions: Sequence[Any], prompts: Sequence[Any] | None = None, **kwargs: Any
                 ) -> list[float]:
        if prompts is None:
            prompts = kwargs.get("prompt")
        if prompts is not None and len(prompts) != len(completions):
            raise ConfigError(f"reward_model: {len(prompts)} prompts for {len(completions)} completions")
        rows = [pair_texts(self.tokenizer, prompts[i] if prompts is not None else None, c)
                for i, c in enumerate(completions)]
        return score_texts(self.model, self.tokenizer, rows, batch_size=self.batch_size, max_length=self.max_length)

    def __repr__(self) -> str:
        return f"RewardModelReward(path={self.path!r})"
