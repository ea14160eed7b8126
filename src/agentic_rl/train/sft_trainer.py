"""The SFT stage's trainer class: TRL's ``SFTTrainer`` drawing rows in a length-aware order.

Kept apart from :mod:`agentic_rl.train.sft` so that reading the stage's config does not import TRL's trainers.
"""

from __future__ import annotations

from typing import Callable

import trl

from agentic_rl.train.sft import LengthAwareSampler


class LengthAwareTrainer(trl.SFTTrainer):
    """``SFTTrainer`` whose training rows come from a :class:`~agentic_rl.train.sft.LengthAwareSampler`:
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
