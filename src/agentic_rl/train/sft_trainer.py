"""The SFT stage's trainer class: TRL's ``SFTTrainer`` drawing rows in a length-aware order (the orders are
:func:`agentic_rl.train.sft.length_sorted_steps` and :func:`~agentic_rl.train.sft.length_bucketed_order`).

Kept apart from :mod:`agentic_rl.train.sft` so that reading the stage's config does not import TRL's trainers.
"""

from __future__ import annotations

from collections.abc import Callable

import trl


class LengthAwareSampler:
    """A length-aware row order (``arrange(lengths, size, generator)``: ``sft.length_bucketed_order`` or
    ``sft.length_sorted_steps``) for the trainer's dataloader, reshuffled every epoch (``set_epoch``, called by the
    trainer) from the run's seed, so that a resumed run sees the same order."""

    def __init__(self, arrange, lengths: list[int], size: int, seed: int):
        self.arrange, self.lengths, self.size, self.seed, self.epoch = arrange, lengths, size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        import torch

        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(self.arrange(self.lengths, self.size, generator))


class LengthAwareTrainer(trl.SFTTrainer):
    """``SFTTrainer`` whose training rows come from a :class:`LengthAwareSampler`:
    ``arrange(lengths, rows_per_batch, generator)`` orders them (sorted within each optimizer step, or bucketed by
    length)."""

    def __init__(self, *args, arrange: Callable, rows_per_batch: int, **kwargs):
        self.arrange, self.rows_per_batch = arrange, rows_per_batch
        super().__init__(*args, **kwargs)

    def _get_train_sampler(self, train_dataset=None):
        """Replaces ``transformers.Trainer._get_train_sampler`` (as ``SFTTrainer`` inherits it; checked against
        TRL 1.16): the length-aware order instead of a random one."""
        dataset = self.train_dataset if train_dataset is None else train_dataset
        return LengthAwareSampler(self.arrange, [len(ids) for ids in dataset["input_ids"]], self.rows_per_batch,
                                  self.args.seed)
