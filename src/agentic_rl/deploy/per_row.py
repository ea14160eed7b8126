"""Per-request settings inside one batched ``model.generate`` call of the server: each row's temperature and top-p
(a logits processor) and each row's end (a stopping criterion that also streams the row's text).

Imports torch and transformers when imported; the server imports it when it first generates, so that
``agentic-rl serve --help`` stays fast.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor, StoppingCriteria


def stop_cut(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` cut at the first stop string, and whether one was found."""
    cuts = [text.find(s) for s in stops if s in text]
    return (text[:min(cuts)], True) if cuts else (text, False)


def held_back(text: str, stops: list[str]) -> int:
    """How many trailing characters might be the start of a stop string (not streamed yet)."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return hold


class PerRowSampling(LogitsProcessor):
    """Row-wise temperature and top-p on (batch, vocab) scores; temperature 0 keeps only the argmax.

    ``temperatures`` and ``top_ps`` are (batch, 1) tensors on the model's device."""

    def __init__(self, temperatures: torch.Tensor, top_ps: torch.Tensor):
        self.temperatures, self.top_ps = temperatures, top_ps
        self.greedy = (temperatures == 0).squeeze(1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        temps, top_ps = self.temperatures, self.top_ps
        scores = scores / torch.where(temps > 0, temps, torch.ones_like(temps))
        if bool((top_ps < 1).any()):
            sorted_scores, order = scores.sort(dim=-1, descending=True)
            cumulative = sorted_scores.softmax(-1).cumsum(-1)
            drop_sorted = (cumulative - sorted_scores.softmax(-1)) >= top_ps  # keep the token crossing p
            drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
            scores = scores.masked_fill(drop, float("-inf"))
        if bool(self.greedy.any()):
            best = scores.argmax(-1, keepdim=True)
            only_best = torch.full_like(scores, float("-inf")).scatter(1, best, 0.0)
            scores = torch.where(self.greedy.unsqueeze(1), only_best, scores)
        return scores


class PerRowStop(StoppingCriteria):
    """Takes each new token, streams text, and ends rows at EOS, their max_tokens or a stop string.

    ``rows`` are the server's rows in batch order (their ``job`` carries the request and receives the events)."""

    def __init__(self, rows: list[Any], tokenizer, eos_ids: list[int]):
        self.rows, self.tokenizer, self.eos_ids = rows, tokenizer, eos_ids

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        newest = input_ids[:, -1].tolist()
        for row, token in zip(self.rows, newest):
            if row.done:
                continue
            if row.job.cancelled:
                row.done, row.finish_reason = True, "cancelled"
                continue
            request = row.job.request
            if token in self.eos_ids:
                row.done, row.finish_reason = True, "stop"
            else:
                row.tokens.append(token)
                if len(row.tokens) >= request.max_tokens:
                    row.done, row.finish_reason = True, "length"
            text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
            hit = False
            if request.stop:
                text, hit = stop_cut(text, request.stop)
                if hit:
                    row.done, row.finish_reason = True, "stop"
            if request.stream:
                ready = len(text) if row.done else len(text) - held_back(text, request.stop)
                if not row.done:  # an unfinished multi-byte character decodes as trailing U+FFFD
                    ready = min(ready, len(text.rstrip("\ufffd")))
                if ready > len(row.sent):
                    row.job.emit(("delta", row.index, text[len(row.sent):ready]))
                    row.sent = text[:ready]
            if row.done:
                row.job.emit(("done", row.index, text, len(row.tokens), row.finish_reason))
        return torch.tensor([row.done for row in self.rows], device=input_ids.device)
