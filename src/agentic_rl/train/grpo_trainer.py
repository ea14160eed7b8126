"""The GRPO stage's trainers: TRL's ``GRPOTrainer`` / ``RLOOTrainer`` with the project's overrides, and the table
that picks one from the stage config.

The algorithm is DeepSeekMath's GRPO as TRL 1.16 implements it. For every prompt, sample a *group* of
``num_generations`` completions; score each with the weighted sum of the reward functions; the advantage of
completion *i* is ``r_i - mean(r_group)``, divided by the group's standard deviation when ``scale_rewards=group``. The
policy loss is PPO's clipped surrogate per token, ``-min(ρ·A, clip(ρ, 1-ε, 1+ε_high)·A)`` with ``ρ = π_θ / π_old``,
plus ``β · KL(π_θ || π_ref)`` (the k3 estimator) against the starting model; ``loss_type`` picks how token losses are
averaged (``grpo``: per sequence, then over sequences; ``dapo``: over all tokens of the global batch; ``dr_grpo``: by a
constant ``max_completion_length``; ``bnpo``: over the tokens of the local batch). Each generation batch is used for
``steps_per_generation`` optimizer steps, ``num_iterations`` times over. Sampling is TRL's own (``model.generate``
or vLLM), the project's decode loop (``generation_backend: compact``: each distinct prompt prefilled once, ended
completions dropped from the batch) or, with an environment, multi-turn episodes whose tool and feedback tokens carry
no loss (TRL's tool mask); TRL decodes, scores and trains on them alike.

Every class here subclasses a TRL trainer and replaces or extends a few of its methods, one named override per
concern, each docstring naming the TRL method it replaces and the TRL version it was checked against:

* **sampling / rollout**: ``_generate`` (timed), ``_generate_and_score_completions`` (zero-variance group refill);
  the ``rollout_func`` hooks :func:`compact_rollout` and :func:`episode_rollout` plug the project's decode loop and
  multi-turn episodes into TRL's own hook;
* **advantages**: ``_generate_and_score_completions`` of :class:`SignalGRPOTrainer` (turn-level credit:
  per-token advantages from each turn's return-to-go, :mod:`agentic_rl.train.credit`) and of
  :class:`RLOOEpisodeTrainer` (leave-one-out, KL in the reward);
* **loss**: ``compute_loss`` (the SFT anchor), ``_compute_loss`` of :class:`RLOOEpisodeTrainer` (RLOO's sequence
  loss);
* **scoring**: ``_get_per_token_logps_and_entropies`` in length-sorted chunks
  (:class:`~agentic_rl.train.logprobs.LengthSortedScoring`, a base of every class here) and, for episodes whose
  environment has a ``context_window``, per context view (:class:`~agentic_rl.train.logprobs.FoldedContextScoring`,
  a base of the classes that train on episodes).

:data:`OVERRIDDEN_TRL_METHODS` lists those TRL methods with the signatures they were written for; a unit test fails
when the installed TRL changes one (``pyproject.toml`` pins TRL to the tested range). :data:`VARIANTS` is the one
table from (algorithm, sampling) to trainer class, TRL config class and the TRL settings that variant fixes.

RLOO: without an environment the update is TRL's own ``RLOOTrainer`` (with its ``normalize_advantages`` and its
baseline that tolerates unscorable rewards). TRL 1.16's ``RLOOTrainer`` takes no ``rollout_func``, so multi-turn
episodes, which only ``GRPOTrainer`` can play, get :class:`RLOOEpisodeTrainer`: ``GRPOTrainer``'s rollouts with
``RLOOTrainer``'s advantage and loss.

:class:`GRPOMonitor` is the callback every variant trains with: it renames TRL's metrics to ours, applies the health
rules, writes sample completions and runs the periodic held-out evaluation that keeps ``best/``. Metric names (TRL's
raw name -> ours; anything else TRL logs appears as ``grpo/<raw name>``):

=====================================  ===========================  =============================================
ours                                   TRL                          meaning
=====================================  ===========================  =============================================
grpo/reward                            reward                       mean weighted reward of the sampled group
grpo/reward/<name>                     rewards/<func>/mean          mean of one reward function (unweighted)
grpo/accuracy                          rewards/<accuracy>/mean      training accuracy of the samples
grpo/reward_std                        reward_std                   std of the reward over the batch
grpo/zero_std_fraction                 frac_reward_zero_std         groups with no learning signal (all equal)
grpo/kl                                kl                           KL(π_θ || π_ref), logged when β > 0
grpo/entropy                           entropy                      mean token entropy of the policy
grpo/clip_ratio                        clip_ratio/region_mean       fraction of tokens clipped by ε
grpo/completion_length                 completions/mean_length      mean completion length (tokens)
grpo/truncated_fraction                completions/clipped_ratio    completions cut at max_completion_length
train/loss, train/grad_norm,           loss, grad_norm,             optimizer quantities
train/learning_rate                    learning_rate
perf/step_time_s                       step_time                    wall time of one optimizer step
perf/generation_s                      (ours)                       of it, seconds spent generating the batch
grpo/signal/dropped_group_fraction     (ours, refill_max_draws)     groups of the first draw whose rewards tie
grpo/signal/refill_draws               (ours)                       extra generation rounds to replace them
grpo/signal/final_zero_std_fraction    (ours)                       groups without signal left in the batch
grpo/signal/sft_loss                   (ours, sft_loss_weight)      demonstrations' NLL added to the loss
grpo/signal/tied_failure_fraction      (ours, tied_failure_weight)  episodes of groups that all fail alike,
                                                                    given a negative advantage
grpo/signal/skipped_row_fraction       (ours)                       completions left out of the loss pass: all
                                                                    their advantages zero (the same update)
eval/accuracy, eval/format_rate,       (ours)                       greedy held-out evaluation every N steps
eval/avg_tokens, eval/avg_reward                                    (strict accuracy, as the final evaluation)
agent/accuracy, agent/tool_call_rate,  (ours, environment)          per generation batch of episodes: correct,
agent/tool_error_rate, agent/return,                                with a valid call, errors / calls, return,
agent/turns_per_episode, agent/<own>                                turns, the environment's own numbers
=====================================  ===========================  =============================================
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import trl
from accelerate.utils import gather
from trl.models.utils import disable_gradient_checkpointing

from agentic_rl.errors import ConfigError
from agentic_rl.runs import MODEL_FOLDER
from agentic_rl.train.credit import CREDIT_ASSIGNMENTS
from agentic_rl.train.logprobs import FoldedContextScoring, LengthSortedScoring
from agentic_rl.train.monitoring import (HealthMonitor, NonFiniteGuard, log_trained_advantages, quiet_progress,
                                         trl_generation_log)
from agentic_rl.train.signal import concat_batches, group_has_signal, select_groups, select_rows
from agentic_rl.utils import append_jsonl, has_gpu, log, read_json, write_json

#: The TRL release range these overrides were checked against (pyproject.toml pins the same range).
TRL_CHECKED = "1.16"

#: TRL loss types that divide the summed token losses by the generation batch's token count: leaving a row out of
#: the pass changes neither their value nor their gradient when the row's advantages are zero.
ZERO_ROW_SAFE_LOSSES = ("dapo", "cispo", "vespo")


# ---------------------------------------------------------------------------------------------------------------
# GRPO: refill, SFT anchor, timed generation
# ---------------------------------------------------------------------------------------------------------------

class WeightsPrecisionGeneration:
    """For a TRL trainer: on a CPU its own generation decodes in the weights' fp32, as the project's decode loop does
    (:func:`agentic_rl.models.generate.weights_precision`). Without it a full model's generation runs through
    accelerate's bf16 wrapper and a LoRA model's (PEFT's ``generate``) does not."""

    def _generate(self, prompts):
        """Extends ``GRPOTrainer._generate`` / ``RLOOTrainer._generate`` (checked against TRL 1.16): their
        generation, in :func:`agentic_rl.models.generate.weights_precision`."""
        from agentic_rl.models.generate import weights_precision

        with weights_precision(self.accelerator.unwrap_model(self.model)):
            return super()._generate(prompts)


class SignalGRPOTrainer(WeightsPrecisionGeneration, FoldedContextScoring, LengthSortedScoring, trl.GRPOTrainer):
    """``GRPOTrainer`` with zero-variance group refill and an optional SFT anchor loss (:mod:`agentic_rl.train.signal`).

    ``refill_max_draws``: extra generation rounds per batch (0 = off). ``sft_demonstrations``: tokenized
    demonstrations (:func:`agentic_rl.train.signal.tokenize_demonstrations`); ``sft_loss_weight``: their weight
    (0 = off). ``logprob_chunk_rows``: :class:`~agentic_rl.train.logprobs.LengthSortedScoring`'s (0 = TRL's passes).
    ``credit_assignment``: ``trajectory`` (TRL's advantage) or ``turn`` (:mod:`agentic_rl.train.credit`, episodes
    only) with ``turn_discount`` γ. ``skip_zero_advantage_rows``: the loss pass leaves out completions whose
    advantages are all zero where that changes neither the loss nor its gradient (:meth:`rows_with_signal`).
    """

    def __init__(self, *args, refill_max_draws: int = 0, sft_loss_weight: float = 0.0,
                 sft_demonstrations: list[tuple[list[int], list[int]]] | None = None, seed: int = 0,
                 credit_assignment: str = "trajectory", turn_discount: float = 1.0,
                 skip_zero_advantage_rows: bool = False, tied_failure_weight: float = 0.0, **kwargs):
        if credit_assignment not in CREDIT_ASSIGNMENTS:
            raise ConfigError(f"credit_assignment must be one of {', '.join(CREDIT_ASSIGNMENTS)}; got "
                              f"{credit_assignment!r}")
        super().__init__(*args, **kwargs)
        if credit_assignment == "turn" and self.rollout_func is None:
            raise ConfigError("credit_assignment 'turn' needs multi-turn episodes (an environment's rollout_func)")
        if refill_max_draws and self.accelerator.num_processes > 1:
            raise ConfigError("refill_max_draws works on one process only (each process would draw a different "
                              "number of refills and the collective calls would hang); set it to 0 with "
                              "several processes")
        if sft_loss_weight and not sft_demonstrations:
            raise ConfigError("sft_loss_weight > 0 needs demonstrations (the training rows' reference "
                              "solutions), and none could be built")
        self.refill_max_draws = refill_max_draws
        self.sft_loss_weight = sft_loss_weight
        self.sft_demonstrations = sft_demonstrations or []
        self._refill_rng = random.Random(seed)
        self._refill_order: list[int] = []
        self._demo_rng = random.Random(seed + 1)
        self.credit_assignment = credit_assignment
        self.turn_discount = turn_discount
        self.skips_zero_advantage_rows = skip_zero_advantage_rows and self.zero_rows_add_nothing()
        self.tied_failure_weight = tied_failure_weight

    def zero_rows_add_nothing(self) -> bool:
        """Whether a completion whose advantages are all zero adds nothing to TRL's loss or its gradient. Its
        clipped-surrogate term is the ratio times a zero advantage; nothing else of it reaches the loss without a KL
        term (beta 0), an entropy bonus, an entropy mask (a quantile over the batch) or the MoE auxiliary loss; and
        the token-sum losses divide by the generation batch's token count (``num_items_in_batch``), which stays
        (the per-sequence ones would divide by fewer rows). One process only: TRL gathers per-row metrics across
        processes, which must then hold as many rows each."""
        return (self.beta == 0.0 and self.loss_type in ZERO_ROW_SAFE_LOSSES and not self._entropy_bonus_enabled
                and self.top_entropy_quantile == 1.0 and not self.aux_loss_enabled
                and self.accelerator.num_processes == 1)

    # --- sampling ---------------------------------------------------------------------------------------------------
    def _generate(self, prompts):
        """Extends ``GRPOTrainer._generate`` (checked against TRL 1.16): TRL's generation (its own, vLLM or a
        ``rollout_func``), timed: ``generation_time`` per batch, the report's share of GRPO time spent generating."""
        started = time.perf_counter()
        output = super()._generate(prompts)
        seconds = time.perf_counter() - started
        self.generation_seconds = getattr(self, "generation_seconds", 0.0) + seconds
        self._metrics["train" if self.model.training else "eval"]["generation_time"].append(seconds)
        return output

    def _generate_and_score_completions(self, inputs):
        """Extends ``GRPOTrainer._generate_and_score_completions`` (checked against TRL 1.16) with turn-level credit
        and the refill of zero-variance groups. With ``credit_assignment: turn`` each draw's (batch,) advantages are
        replaced by (batch, tokens) ones (:meth:`_assign_turn_credit`). Refill: groups whose advantages are all zero
        are dropped and replaced by freshly drawn prompts' groups that have signal, at most ``refill_max_draws``
        extra rounds; what is still missing is filled with dropped groups, so the batch shape never changes."""
        batch = self._scored_draw(inputs)
        if not self.model.training or not self.refill_max_draws:
            return batch
        g = self.num_generations
        n_groups = batch["advantages"].shape[0] // g
        signal = group_has_signal(batch["advantages"], g)
        kept = [select_groups(batch, signal.nonzero().flatten(), g)]
        dropped = select_groups(batch, (~signal).nonzero().flatten(), g)
        have, draws = int(signal.sum()), 0
        self._metrics["train"]["signal/dropped_group_fraction"].append(1 - have / n_groups)
        while have < n_groups and draws < self.refill_max_draws:
            draws += 1
            extra = self._scored_draw(self._draw_prompts(n_groups - have))
            extra_signal = group_has_signal(extra["advantages"], g).nonzero().flatten()
            extra_signal = extra_signal[: n_groups - have]
            if len(extra_signal):
                kept.append(select_groups(extra, extra_signal, g))
                have += len(extra_signal)
        if have < n_groups:  # keep the batch shape: fill with groups that carry no signal
            kept.append(select_groups(dropped, torch.arange(n_groups - have), g))
        self._metrics["train"]["signal/refill_draws"].append(float(draws))
        self._metrics["train"]["signal/final_zero_std_fraction"].append(1 - have / n_groups)
        return concat_batches(kept, self._tokenizer.pad_token_id) if len(kept) > 1 else kept[0]

    def _scored_draw(self, inputs):
        """One generation batch as TRL samples and scores it, with turn-level advantages when asked for."""
        batch = super()._generate_and_score_completions(inputs)
        if self.model.training and self.scale_rewards == "batch" and \
                self.multi_objective_aggregation == "sum_then_normalize":
            # TRL tests the std it divides by, here the whole batch's (never zero): count the groups that tie
            # instead, on this process's rows (their advantages, reward minus group mean, are exactly zero)
            tied = 1.0 - group_has_signal(batch["advantages"], self.num_generations).float().mean().item()
            self._metrics["train"]["frac_reward_zero_std"][-1] = tied
        if self.model.training and self.tied_failure_weight:
            self._push_down_tied_failures(batch, inputs)
        if self.credit_assignment == "turn":
            self._assign_turn_credit(batch, inputs)
        return batch

    def _push_down_tied_failures(self, batch, inputs) -> None:
        """Give the groups whose episodes all fail with one reward the advantage of
        :func:`agentic_rl.train.signal.tied_failure_advantages` (their TRL advantage is zero). The rewards are the
        weighted sum TRL logged for this draw, the episodes' ``correct`` the rollout's, over every process's rows."""
        from accelerate.utils import gather_object

        from agentic_rl.train.signal import tied_failure_advantages

        if any("correct" not in row for row in inputs):
            raise RuntimeError(f"tied_failure_weight: the rollout field 'correct' did not reach the trainer's inputs "
                               f"(TRL {trl.__version__}; written for TRL {TRL_CHECKED})")
        correct = torch.tensor(gather_object([bool(row["correct"]) for row in inputs]))
        log = trl_generation_log(self)
        local = batch["advantages"].shape[0]
        total = local * self.accelerator.num_processes
        per_func = [list(log["rewards"][name])[-total:] for name in self.reward_func_names]
        if any(len(values) != total for values in per_func):
            raise RuntimeError(f"tied_failure_weight: TRL's log holds fewer rewards than the {total} completions "
                               f"drawn (TRL {trl.__version__}; written for TRL {TRL_CHECKED})")
        rewards = (torch.tensor(per_func, dtype=torch.float32).T * self.reward_weights).nansum(dim=1)  # as TRL sums
        extra = tied_failure_advantages(rewards, correct, self.num_generations, self.tied_failure_weight,
                                        scale=self.scale_rewards != "none")
        self._metrics["train"]["signal/tied_failure_fraction"].append((extra != 0).float().mean().item())
        start = self.accelerator.process_index * local
        batch["advantages"] = batch["advantages"] + extra[start:start + local].to(batch["advantages"].device)
        log_trained_advantages(self, [a + e for a, e in zip(list(log["advantages"])[-total:], extra.tolist())])

    def _assign_turn_credit(self, batch, inputs) -> None:
        """Replace ``batch["advantages"]`` (B,) by per-token advantages (B, T) from each turn's return-to-go
        (:func:`agentic_rl.train.credit.turn_advantages`); TRL's ``_compute_loss`` takes either shape. The rollout's
        ``step_rewards`` and ``turn_spans`` reach ``inputs`` the way TRL hands ``rollout_func`` fields to the reward
        functions. Groups may span processes, so the per-turn statistics run over every process's episodes. TRL's
        completion log gets each episode's list of turn advantages."""
        from accelerate.utils import gather_object

        from agentic_rl.train.credit import token_advantages, turn_advantages

        missing = [key for key in ("step_rewards", "turn_spans") if any(key not in row for row in inputs)]
        if missing:
            raise RuntimeError(f"credit_assignment 'turn': the rollout fields {missing} did not reach the trainer's "
                               f"inputs (TRL {trl.__version__}; written for TRL {TRL_CHECKED})")
        mode = "train" if self.model.training else "eval"
        g = self.num_generations if mode == "train" else self.num_generations_eval
        local = len(inputs)
        episodes = gather_object([[list(row["step_rewards"]), list(row["turn_spans"])] for row in inputs])
        advantages = turn_advantages([rewards for rewards, _ in episodes], g, discount=self.turn_discount,
                                     scale_rewards=self.scale_rewards)
        start = self.accelerator.process_index * local
        spans = [spans for _, spans in episodes[start:start + local]]
        batch["advantages"] = token_advantages(advantages[start:start + local], spans,
                                               batch["completion_ids"].shape[1]).to(batch["completion_ids"].device)
        log_trained_advantages(self, advantages)

    def _draw_prompts(self, n_prompts: int) -> list[dict[str, Any]]:
        """``n_prompts`` training rows, each repeated ``num_generations`` times, as TRL's sampler lays them out."""
        rows = []
        for _ in range(n_prompts):
            if not self._refill_order:
                self._refill_order = list(range(len(self.train_dataset)))
                self._refill_rng.shuffle(self._refill_order)
            rows.append(self.train_dataset[self._refill_order.pop()])
        return [dict(row) for row in rows for _ in range(self.num_generations)]

    # --- loss -------------------------------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Extends ``GRPOTrainer.compute_loss`` (checked against TRL 1.16): training passes skip the completions
        without signal (:meth:`rows_with_signal`), and the SFT anchor adds ``sft_loss_weight`` x the
        demonstrations' mean token NLL to every training micro-step's loss."""
        trained = self.rows_with_signal(inputs) if model.training else inputs
        loss = super().compute_loss(model, trained, return_outputs, num_items_in_batch)
        if not self.sft_loss_weight or not model.training:
            return loss
        sft = self._demonstration_loss(model, max(1, inputs["advantages"].shape[0] // self.num_generations))
        self._metrics["train"]["signal/sft_loss"].append(sft.item())
        # TRL divides its own loss by the accumulation steps (loss_is_scaled_for_ga): so must the anchor, or the
        # weight would grow with gradient_accumulation_steps.
        return loss + self.sft_loss_weight * sft / self.current_gradient_accumulation_steps

    def rows_with_signal(self, inputs):
        """The micro-batch without its completions whose advantages are all zero (ties within their group), when
        :meth:`zero_rows_add_nothing`: the same loss and gradient for fewer forward and backward passes (to float
        rounding: in bf16 a smaller batch may take kernels that round differently). With a small group most of a batch
        ties once the policy is sure of itself (two episodes of a problem both right), and the loss pass is the larger
        part of a step on a CPU. TRL's entropy and clip-ratio metrics are then those of the completions trained on. A
        micro-batch that is all ties keeps one row: its loss is 0, with a graph to backpropagate through."""
        if not self.skips_zero_advantage_rows:
            return inputs
        advantages = inputs["advantages"]
        signal = group_has_signal(advantages, 1)  # per completion: each its own group of one
        self._metrics["train"]["signal/skipped_row_fraction"].append(1.0 - signal.float().mean().item())
        if bool(signal.all()):
            return inputs
        rows = signal.nonzero().flatten() if bool(signal.any()) else torch.zeros(1, dtype=torch.long)
        return select_rows(inputs, rows)

    def _demonstration_loss(self, model, n: int):
        """Mean token NLL of ``n`` random demonstrations' completions (the prompt tokens, and an episode's tool and
        feedback messages, carry no loss)."""
        chosen = [self.sft_demonstrations[self._demo_rng.randrange(len(self.sft_demonstrations))]
                  for _ in range(n)]
        width = max(len(ids) for ids, _ in chosen)
        pad = self._tokenizer.pad_token_id
        device = self.accelerator.device
        input_ids = torch.full((n, width), pad, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        labels = torch.full((n, width), -100, dtype=torch.long)
        for row, (ids, row_labels) in enumerate(chosen):
            input_ids[row, :len(ids)] = torch.tensor(ids)
            attention[row, :len(ids)] = 1
            labels[row, :len(ids)] = torch.tensor(row_labels)
        out = model(input_ids=input_ids.to(device), attention_mask=attention.to(device), labels=labels.to(device))
        return out.loss


# ---------------------------------------------------------------------------------------------------------------
# RLOO
# ---------------------------------------------------------------------------------------------------------------

class RLOOTrainer(WeightsPrecisionGeneration, LengthSortedScoring, trl.RLOOTrainer):
    """TRL's ``RLOOTrainer`` (its sampling, leave-one-out advantage and loss unchanged) with the length-sorted
    log-prob passes (``logprob_chunk_rows``), decoding in fp32 on a CPU (:class:`WeightsPrecisionGeneration`)."""


class RLOOEpisodeTrainer(FoldedContextScoring, LengthSortedScoring, trl.GRPOTrainer):
    """``GRPOTrainer``'s generation and ``rollout_func`` hook (so multi-turn episodes and their tool mask) with
    ``RLOOTrainer``'s advantage and loss. It must be given ``scale_rewards="none"`` (:data:`VARIANTS` does).

    Per generation batch (``G`` = ``num_generations``, ``mask`` = completion mask × tool mask, i.e. action tokens):

    * GRPOTrainer with ``scale_rewards="none"`` yields ``A_i = r_i − mean_j r_j`` over the group, and (with
      ``beta > 0``) the reference log-probs. The KL is folded into the reward as RLOOTrainer does —
      ``r_i ← r_i − β · KL_i`` with ``KL_i = Σ_t mask · (log π_old − log π_ref)`` (k1, summed over the sequence) —
      which subtracts ``β · (KL_i − mean_j KL_j)`` from ``A_i``.
    * leave-one-out: ``r_i − mean_{j≠i} r_j = (G·r_i − Σ_j r_j)/(G−1) = G/(G−1) · (r_i − mean_j r_j)``, so the
      advantage is the centred one times ``G/(G−1)`` (rewards [1, 0, 0, 0] → [1, −1/3, −1/3, −1/3]).
      No normalisation afterwards (RLOOConfig's ``normalize_advantages`` defaults to false).
    * loss: ``−mean_i min(ρ_i A_i, clip(ρ_i, 1−ε, 1+ε_high) A_i)`` with the *sequence* ratio
      ``ρ_i = exp(Σ_t mask · (log π_θ − log π_old))``; no KL term (it is in the reward).

    Where it departs from ``RLOOTrainer``: every token sum (KL, ratio, entropy) runs over *action* tokens only
    (RLOOTrainer has no tool tokens to exclude); ``normalize_advantages`` is not offered (it stays at RLOO's
    default); unscorable (``None``) rewards cannot occur (the reward is the episode's return), so RLOOTrainer's
    NaN-aware baseline is not needed.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The advantage below is derived from GRPO's centred (unscaled, summed-reward) advantage.
        if self.scale_rewards != "none" or self.multi_objective_aggregation != "sum_then_normalize":
            raise ConfigError("RLOOEpisodeTrainer needs TRL's scale_rewards='none' and "
                              "multi_objective_aggregation='sum_then_normalize'")

    @staticmethod
    def _action_mask(batch):
        mask = batch["completion_mask"]
        return mask if "tool_mask" not in batch else mask * batch["tool_mask"]

    def _policy_logps(self, batch, mode: str):
        """Per-token log-probs of the completions under the current policy (π_old), no gradient: (B, C)."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        batch_size = (self.args.per_device_train_batch_size if mode == "train"
                      else self.args.per_device_eval_batch_size)
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs), \
                self.contexts_of(batch):
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, batch["completion_ids"].size(1), batch_size=batch_size)
        return logps

    # --- advantages -------------------------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        """Extends ``GRPOTrainer._generate_and_score_completions`` (checked against TRL 1.16): GRPO's centred
        advantage becomes RLOO's leave-one-out one with the KL folded into the reward (the class docstring), and the
        batch carries the sequence log-probs of π_old that :meth:`_compute_loss` needs."""
        batch = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        g = self.num_generations if mode == "train" else self.num_generations_eval
        mask = self._action_mask(batch)
        old = batch.pop("old_per_token_logps", None)  # GRPO computes it only when steps are misaligned
        if old is None and self.beta != 0.0:
            old = self._policy_logps(batch, mode)
        local = batch["advantages"].shape[0]
        centred = gather(batch["advantages"])  # r - mean(group) over all processes' rows: (N,)
        if self.beta != 0.0:
            per_token_kl = (old - batch.pop("ref_per_token_logps")) * mask  # k1, as RLOOTrainer: (B, C)
            kl = gather(per_token_kl.sum(-1))  # (N,)
            centred = centred - self.beta * (kl - kl.view(-1, g).mean(1).repeat_interleave(g))
            stats = self.accelerator.reduce(torch.stack([per_token_kl.sum(), mask.sum().float()]), reduction="sum")
            self._metrics[mode]["kl"].append((stats[0] / stats[1].clamp(min=1.0)).item())
        advantages = centred * g / (g - 1) if g > 1 else torch.zeros_like(centred)
        # TRL's completion log holds GRPO's advantages of this batch: replace them with the ones trained on.
        log_trained_advantages(self, advantages.tolist())
        start = self.accelerator.process_index * local
        batch["advantages"] = advantages[start:start + local]
        if old is not None:
            batch["old_logps"] = (old * mask).sum(1)  # (B,)
        return batch

    # --- loss -------------------------------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        """Replaces ``GRPOTrainer._compute_loss`` (checked against TRL 1.16) by ``RLOOTrainer._compute_loss``'s
        clipped surrogate on the sequence ratio, over action tokens only; entropy and clip ratios logged as TRL
        does."""
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = self._action_mask(inputs)
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled)
        logps = (per_token_logps * mask).sum(1)  # (B,)
        # Without a stored π_old (beta 0, one micro-step per generation) π_old is the current policy.
        old_logps = inputs["old_logps"] if "old_logps" in inputs else logps.detach()
        advantages = inputs["advantages"]
        ratio = torch.exp(logps - old_logps)
        clipped = torch.clamp(ratio, 1 - self.epsilon_low, 1 + self.epsilon_high)
        loss = -torch.min(ratio * advantages, clipped * advantages).mean()
        mode = "train" if self.model.training else "eval"
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss
        entropy = self.accelerator.reduce(torch.stack([(entropies * mask).sum(), mask.sum().float()]),
                                          reduction="sum")
        self._metrics[mode]["entropy"].append((entropy[0] / entropy[1].clamp(min=1.0)).item())
        low = self.accelerator.gather(((ratio < 1 - self.epsilon_low) & (advantages < 0)).float())
        high = self.accelerator.gather(((ratio > 1 + self.epsilon_high) & (advantages > 0)).float())
        self._metrics[mode]["clip_ratio/low_mean"].append(low.mean().item())
        self._metrics[mode]["clip_ratio/high_mean"].append(high.mean().item())
        self._metrics[mode]["clip_ratio/region_mean"].append(torch.maximum(low, high).mean().item())
        # GRPOTrainer declares its loss already divided for gradient accumulation (RLOOTrainer lets the
        # Trainer divide): the same gradient either way.
        return loss / self.current_gradient_accumulation_steps if mode == "train" else loss


# ---------------------------------------------------------------------------------------------------------------
# Sampling hooks (TRL's rollout_func)
# ---------------------------------------------------------------------------------------------------------------

def compact_rollout(prompts: list[list[dict[str, str]]], trainer) -> dict[str, Any]:
    """TRL ``rollout_func`` of ``generation_backend: compact``: samples the completions of a generation batch with
    the project's decode loop (:func:`agentic_rl.models.generate.generate_token_ids`), at the trainer's temperature,
    top-p, top-k and completion length, from the prompts rendered as TRL renders them (chat template, generation
    prompt, no thinking). TRL then decodes, scores and trains on them exactly as on its own samples."""
    from agentic_rl.data.formats import render_prompt
    from agentic_rl.models.generate import generate_token_ids

    tokenizer, args = trainer.processing_class, trainer.args
    prompt_ids = [tokenizer(render_prompt(tokenizer, p, enable_thinking=False), add_special_tokens=False)["input_ids"]
                  for p in prompts]
    completion_ids = generate_token_ids(
        trainer.accelerator.unwrap_model(trainer.model), prompt_ids, max_new_tokens=args.max_completion_length,
        stop_ids=list(trainer.eos_token_ids), pad_id=tokenizer.pad_token_id, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k or 0)
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}


def episode_rollout(config: Any, env_factory, rows: list[dict[str, Any]], out: Path):
    """TRL ``rollout_func`` of an environment run: ``num_generations`` multi-turn episodes per prompt
    (:func:`agentic_rl.agent.rollout.make_rollout_func`), tool and feedback tokens masked out of the loss, the
    episode's return as the reward; per-batch tool statistics go to the logged metrics and ``<run>/rollouts.jsonl``."""
    from agentic_rl.agent.rollout import RolloutSettings, make_rollout_func

    settings = RolloutSettings(max_turn_tokens=config.max_turn_tokens,
                               max_completion_length=config.max_completion_length,
                               tools_in_prompt=config.tools_in_prompt)
    return make_rollout_func(env_factory, rows, settings, log_path=out / "rollouts.jsonl",
                             retry_groups=config.retry_groups)


# ---------------------------------------------------------------------------------------------------------------
# The table of variants
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    """One way the GRPO stage trains: the trainer class, TRL's config class for it, the TRL settings the variant
    fixes, and the project's trainer arguments the class takes (``refill_max_draws`` ...)."""

    trainer: type
    arguments: type
    fixed: dict[str, Any] = field(default_factory=dict)
    signal: bool = False  # takes refill_max_draws, sft_loss_weight, sft_demonstrations, seed, the credit settings


#: (algorithm, sampling) -> variant. Sampling: ``trl`` (TRL's own generation or vLLM), ``compact`` (the project's
#: decode loop through ``rollout_func``), ``episodes`` (an environment's multi-turn episodes through
#: ``rollout_func``). Refill, the SFT anchor and compact sampling are GRPO's (the stage config refuses them with RLOO).
VARIANTS: dict[tuple[str, str], Variant] = {
    ("grpo", "trl"): Variant(SignalGRPOTrainer, trl.GRPOConfig, signal=True),
    ("grpo", "compact"): Variant(SignalGRPOTrainer, trl.GRPOConfig, signal=True),
    ("grpo", "episodes"): Variant(SignalGRPOTrainer, trl.GRPOConfig, signal=True),
    ("rloo", "trl"): Variant(RLOOTrainer, trl.RLOOConfig),
    # RLOO's advantage is derived from GRPO's centred one, which scale_rewards 'none' leaves unscaled.
    ("rloo", "episodes"): Variant(RLOOEpisodeTrainer, trl.GRPOConfig, fixed={"scale_rewards": "none"}),
}


def sampling_of(config: Any) -> str:
    """How a config's completions are sampled: ``episodes`` with an environment, else ``compact`` or ``trl``."""
    if config.environment is not None:
        return "episodes"
    return "compact" if config.generation_backend == "compact" and config.algorithm == "grpo" else "trl"


def variant_for(config: Any) -> Variant:
    return VARIANTS[(config.algorithm, sampling_of(config))]


def build_trainer(config: Any, *, env_factory, out: Path, demonstrations, **trainer_kwargs):
    """The trainer :data:`VARIANTS` picks for ``config``, with its rollout hook and its own arguments;
    ``trainer_kwargs`` are TRL's (model, reward_funcs, args, ...) and ``logprob_chunk_rows``."""
    sampling = sampling_of(config)
    variant = VARIANTS[(config.algorithm, sampling)]
    if sampling != "trl":
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL 1.16
    if sampling == "episodes":
        trainer_kwargs["rollout_func"] = episode_rollout(config, env_factory, trainer_kwargs["train_dataset"].to_list(),
                                                         out)
    elif sampling == "compact":
        trainer_kwargs["rollout_func"] = compact_rollout
    if variant.signal:
        trainer_kwargs.update(refill_max_draws=config.refill_max_draws, sft_loss_weight=config.sft_loss_weight,
                              sft_demonstrations=demonstrations, seed=config.seed,
                              credit_assignment=config.credit_assignment, turn_discount=config.turn_discount,
                              skip_zero_advantage_rows=config.skip_zero_advantage_rows,
                              tied_failure_weight=config.tied_failure_weight)
    trainer = variant.trainer(**trainer_kwargs)
    quiet_progress(trainer)
    return trainer


# ---------------------------------------------------------------------------------------------------------------
# TRL's config: the stage's settings under TRL's names
# ---------------------------------------------------------------------------------------------------------------

#: TRL generation settings the compact decode loop does not apply: with any of them TRL must generate itself.
_TRL_ONLY_GENERATION = ("generation_kwargs", "repetition_penalty", "min_p", "cache_implementation",
                        "use_transformers_continuous_batching", "use_transformers_paged")

#: This config's fields that TRL's config calls otherwise, and TRL fields the stage computes itself.
_RENAMED_TRL_FIELDS = {"batch_size": "per_device_train_batch_size", "warmup_ratio": "warmup_steps"}
_COMPUTED_TRL_FIELDS = ("output_dir", "report_to", "reward_weights")


def passed_through(config: Any, trl_config_class) -> list[str]:
    """The fields of the stage config that TRL's ``trl_config_class`` has under the same name: they go to TRL as
    they are (the stage's own settings, its defaults and checks, for TRL's)."""
    trl_fields = {f.name for f in dataclasses.fields(trl_config_class)}
    return [f.name for f in dataclasses.fields(config) if f.name in trl_fields and f.name not in _COMPUTED_TRL_FIELDS]


def check_trl_args(config: Any) -> None:
    """Every ``trl_args`` key names a field of the TRL config the run uses, and none that a typed setting (or the
    stage itself) owns: passing those through would silently fight the typed field."""
    if not config.trl_args:
        return
    config_cls = variant_for(config).arguments
    known = {f.name for f in dataclasses.fields(config_cls)}
    owned = {*passed_through(config, config_cls), *_RENAMED_TRL_FIELDS.values(), *_COMPUTED_TRL_FIELDS}
    for key in config.trl_args:
        if key not in known:
            import difflib

            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"trl_args: '{key}' is not a field of TRL's {config_cls.__name__}{hint}")
        if key in owned:
            raise ConfigError(f"trl_args: '{key}' has its own setting in this stage; set '{key}' directly")
    trl_only = [key for key in _TRL_ONLY_GENERATION if key in config.trl_args]
    if config.generation_backend == "compact" and trl_only:
        raise ConfigError(f"trl_args '{trl_only[0]}' is applied by TRL's own generation only: set "
                          "generation_backend to 'trl'")


def trl_arguments(config: Any, out: Path, reward_weights: list[float]):
    """The stage config -> the TRL config class of the run's variant (``GRPOConfig`` or ``RLOOConfig``): the fields both
    have, the renamed ones, what the stage fixes, then ``trl_args`` (any other TRL field)."""
    variant = variant_for(config)
    kwargs: dict[str, Any] = {name: getattr(config, name) for name in passed_through(config, variant.arguments)}
    kwargs.update({trl_name: getattr(config, name) for name, trl_name in _RENAMED_TRL_FIELDS.items()})
    kwargs.update(
        output_dir=str(out), reward_weights=reward_weights,  # warmup_steps < 1: a fraction of max_steps
        # Without use_cpu, several CPU processes would each train alone (no gloo process group, no gradient sync).
        use_cpu=not has_gpu(),
        # Our logger writes TensorBoard / wandb with the documented names; TRL's own reporters stay off.
        report_to="none", log_completions=False, save_strategy="steps",
        disable_tqdm=False,  # the progress bar with its time estimate, whatever the libraries' log level
        disable_dropout=True, dataloader_num_workers=0, remove_unused_columns=False,
        chat_template_kwargs={"enable_thinking": False},
    )
    kwargs.update(config.trl_args)
    kwargs.update(variant.fixed)
    try:
        return variant.arguments(**kwargs)
    except (TypeError, ValueError) as exc:
        name = "RLOO" if config.algorithm == "rloo" else "GRPO"
        raise ConfigError(f"TRL rejected the {name} settings: {exc}") from None


# ---------------------------------------------------------------------------------------------------------------
# TRL methods overridden here, with the signatures they were written for
# ---------------------------------------------------------------------------------------------------------------

#: ``"Class.method"`` of TRL (``SFTTrainer``'s sampler is transformers' ``Trainer``'s), or a TRL function the project
#: swaps (``trainer.utils._use_triton``: :func:`~agentic_rl.train.logprobs.labelled_positions_only`) -> its parameters
#: as written for TRL 1.16 (annotations left out: a call depends on names, order and defaults). Checked by a unit
#: test against the installed library.
OVERRIDDEN_TRL_METHODS: dict[str, str] = {
    "GRPOTrainer._generate": "(self, prompts)",
    "GRPOTrainer._generate_and_score_completions": "(self, inputs)",
    "GRPOTrainer.compute_loss": "(self, model, inputs, return_outputs=False, num_items_in_batch=None)",
    "GRPOTrainer._compute_loss": "(self, model, inputs)",
    "GRPOTrainer._get_per_token_logps_and_entropies": (
        "(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, "
        "compute_aux_loss=False, pixel_values=None, image_grid_thw=None, num_images=None, pixel_attention_mask=None, "
        "spatial_shapes=None, num_tiles=None, image_sizes=None, token_type_ids=None, mm_token_type_ids=None, "
        "image_position_ids=None)"),
    "RLOOTrainer._generate": "(self, prompts)",
    "RLOOTrainer._get_per_token_logps_and_entropies": (
        "(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, "
        "compute_aux_loss=False, pixel_values=None, image_grid_thw=None, num_images=None, pixel_attention_mask=None, "
        "spatial_shapes=None, num_tiles=None, image_sizes=None, token_type_ids=None, mm_token_type_ids=None, "
        "image_position_ids=None)"),
    "SFTTrainer._get_train_sampler": "(self, train_dataset=None)",
    "trainer.utils._use_triton": "(device)",
}


def plain_signature(func: Callable) -> str:
    """``(self, a, b=1)``: a function's parameters with their defaults, without annotations."""
    params = [p.replace(annotation=inspect.Parameter.empty) for p in inspect.signature(func).parameters.values()]
    return str(inspect.Signature(params))


def _trl_attribute(path: str):
    """``trl.<path>`` (``"GRPOTrainer._generate"``, ``"trainer.utils._use_triton"``), or None when it is gone."""
    found: Any = trl
    parts = path.split(".")
    for i, part in enumerate(parts):
        try:
            found = getattr(found, part)
        except AttributeError:
            try:
                found = importlib.import_module("trl." + ".".join(parts[:i + 1]))
            except ImportError:
                return None
    return found


def changed_trl_methods() -> list[str]:
    """One line per overridden TRL method whose installed signature differs from the one written for (or that is
    gone); empty when all match."""
    problems = []
    for qualified, expected in OVERRIDDEN_TRL_METHODS.items():
        func = _trl_attribute(qualified)
        if func is None:
            problems.append(f"trl.{qualified} is gone (TRL {trl.__version__}; written for TRL {TRL_CHECKED})")
        elif plain_signature(func) != expected:
            problems.append(f"trl.{qualified} is now {plain_signature(func)} in TRL {trl.__version__}; written for "
                            f"{expected} (TRL {TRL_CHECKED})")
    return problems


# ---------------------------------------------------------------------------------------------------------------
# The policy (start, best/, final) and monitoring: metric names, health rules, sample completions, held-out checks
# ---------------------------------------------------------------------------------------------------------------

#: TRL's GRPO keys -> ours (the trainer's shared keys are train.monitoring.TRAINER_METRIC_NAMES).
_RENAME = {
    "reward": "grpo/reward", "reward_std": "grpo/reward_std",
    "frac_reward_zero_std": "grpo/zero_std_fraction", "kl": "grpo/kl", "entropy": "grpo/entropy",
    "clip_ratio/region_mean": "grpo/clip_ratio", "clip_ratio/low_mean": "grpo/clip_ratio_low",
    "clip_ratio/high_mean": "grpo/clip_ratio_high", "completions/mean_length": "grpo/completion_length",
    "completions/clipped_ratio": "grpo/truncated_fraction", "generation_time": "perf/generation_s",
}


def rename_metrics(logs: dict[str, Any]) -> dict[str, float]:
    """TRL's log keys -> the documented ``grpo/…`` names (see the module docstring's table); nothing is dropped."""
    from agentic_rl.train.monitoring import namespace_metrics

    out: dict[str, float] = {}
    rest: dict[str, Any] = {}
    for key, value in logs.items():
        if key.startswith("rewards/") and key.count("/") == 2 and isinstance(value, (int, float)):
            _, name, stat = key.split("/")
            out[f"grpo/reward/{name}" if stat == "mean" else f"grpo/reward_{stat}/{name}"] = float(value)
            if stat == "mean" and name == "accuracy":
                out["grpo/accuracy"] = float(value)
        else:
            rest[key] = value
    return {**out, **namespace_metrics(rest, "grpo", _RENAME)}


def health_monitor(config: Any, *, environment: bool = False) -> HealthMonitor:
    """The Hello-Agents book's live warnings for GRPO, as rules of the shared
    :class:`~agentic_rl.train.monitoring.HealthMonitor` (each warns once when its condition starts to hold, again
    only after it cleared). Rules read our metric names, plus ``step``: KL above ``kl_high`` (drifting) or below
    ``kl_low`` after ``kl_warmup_steps`` (not learning), the mean reward falling below ``collapse_fraction`` of its
    best 10-step moving average, at least ``truncated_high`` of the completions cut at ``max_completion_length``;
    with an environment, the tool error rate rising and the tool-call rate collapsing."""
    from agentic_rl.train.monitoring import grad_explosion, metric_rising

    def kl_high(history, logs):
        kl = logs.get("grpo/kl")
        if kl is not None and kl > config.kl_high:
            return (f"KL {kl:.3f} > {config.kl_high}: the policy is drifting from the reference; raise beta (now "
                    f"{config.beta}) or lower the learning rate (now {config.learning_rate:g})")
        return None

    def kl_low(history, logs):
        kl = logs.get("grpo/kl")
        if kl is not None and logs.get("step", 0) > config.kl_warmup_steps and kl < config.kl_low:
            return (f"KL {kl:.5f} < {config.kl_low} after {config.kl_warmup_steps} steps: the policy is barely "
                    "moving (not learning); raise the learning rate, or check that the rewards vary within groups "
                    "(grpo/zero_std_fraction)")
        return None

    # A 10-step moving average: on a tiny model the per-step reward is a mean of few successes and very noisy.
    collapse = metric_rising("grpo/reward", window=10, tolerance=1 - config.collapse_fraction, higher_is_worse=False,
                             advice="possible collapse; lower the learning rate, raise beta, or use best/")
    collapse.__name__ = "reward_collapse"

    def truncated(history, logs):
        value = logs.get("grpo/truncated_fraction")
        if value is not None and value >= config.truncated_high:
            what = "episodes" if environment else "completions"
            return (f"{value:.0%} of the {what} are cut at max_completion_length ({config.max_completion_length}): "
                    "their answers are lost; raise max_completion_length"
                    + (" or lower max_turns" if environment else " or reward shorter solutions"))
        return None

    rules = [kl_high, kl_low, collapse, truncated, grad_explosion(key="train/grad_norm")]
    if environment:
        def tool_errors_rising(history, logs):
            # The first 5 logs are the baseline: an error rate that doubles from it, and is material, is a warning.
            values = [h["agent/tool_error_rate"] for h in [*history, logs] if "agent/tool_error_rate" in h]
            if "agent/tool_error_rate" not in logs or len(values) < 10:
                return None
            first, now = sum(values[:5]) / 5, sum(values[-5:]) / 5
            if now >= 0.2 and now > 2 * first:
                return (f"agent/tool_error_rate rose to {now:.2f} (moving average of 5 logs) from {first:.2f}: the "
                        "policy is writing broken tool calls; lower the learning rate, raise beta, or set "
                        "tool_error_reward below 0")
            return None

        tool_calls_collapse = metric_rising(
            "agent/tool_call_rate", window=5, tolerance=0.5, higher_is_worse=False,
            advice="the policy is giving up its tools; check tool_call_reward, lower the learning rate, or use best/")
        tool_calls_collapse.__name__ = "tool_call_collapse"
        rules += [tool_errors_rising, tool_calls_collapse]
    return HealthMonitor(rules)


def load_policy(config: Any, out: Path):
    """The starting policy (a plain ``PreTrainedModel``) and its tokenizer; writes nothing.

    An SFT adapter is merged into its base, so the new GRPO adapter (or full fine-tuning) starts from — and is
    KL-regularised towards — the SFT policy. Returns ``(model, tokenizer, base_dir)`` where ``base_dir`` is a
    directory holding exactly the starting weights (needed by TRL to build the reference for full fine-tuning, and
    recorded as the adapter's base): for a merged adapter ``<run>/base``, which :func:`save_start` writes once the
    run directory may be touched.
    """
    from agentic_rl.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(config.model)
    base_dir = config.model  # a directory or hub id: TRL and PEFT can reload it by name
    if hasattr(model, "merge_and_unload"):  # a PeftModel: an adapter directory was given
        model = model.merge_and_unload()
        base_dir = str(out / "base")
    model.config._name_or_path = base_dir  # TRL rebuilds the full-FT reference from here
    tokenizer.padding_side = "left"
    return model, tokenizer, base_dir


def save_start(model, tokenizer, base_dir: str, out: Path) -> None:
    """Write the merged starting weights to ``<run>/base`` when the start was an adapter (see :func:`load_policy`)."""
    if Path(base_dir) == out / "base" and not (Path(base_dir) / "config.json").is_file():
        log(f"writing the starting weights to {base_dir} (reference model / adapter base)")
        model.save_pretrained(base_dir)
        tokenizer.save_pretrained(base_dir)


def peft_config_for(config: Any, *, task_type: str = "CAUSAL_LM", modules_to_save: list[str] | None = None):
    """PEFT's ``LoraConfig`` from a stage config's ``lora_*`` fields (None with ``full``); the reward-model stage
    passes ``SEQ_CLS`` and its score head."""
    if config.full:
        return None
    from peft import LoraConfig

    targets: Any = config.lora_target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"
    return LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=targets, task_type=task_type, modules_to_save=modules_to_save)


def record_trainable_parameters(model, path: Path) -> int:
    """Write the names of the trainable parameters to ``path``, log their count; returns it."""
    from agentic_rl.models.loading import count_parameters

    path.write_text("".join(f"{n}\n" for n, p in model.named_parameters() if p.requires_grad))
    trainable, total = count_parameters(model)
    log(f"trainable parameters: {trainable:,} of {total:,} ({trainable / total:.2%}), names in {path}")
    return trainable


def save_policy(model, tokenizer, path: Path) -> None:
    """The trainable part: the adapter for LoRA, the whole model for full fine-tuning; whole or not at all (a full
    disk is one line, and an earlier copy in ``path`` stays until the new one is complete)."""
    from agentic_rl.models.loading import save_model_atomically

    save_model_atomically(model, tokenizer, path)


def load_weights(policy, path: Path) -> None:
    """Load the weights saved by :func:`save_policy` in ``path`` into ``policy`` (adapter or full model)."""
    from safetensors.torch import load_file

    if (path / "adapter_model.safetensors").is_file():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(policy, load_file(str(path / "adapter_model.safetensors")))
    else:
        missing, unexpected = policy.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
        if unexpected or [m for m in missing if "lm_head" not in m]:
            raise RuntimeError(f"{path}: weights do not match the policy (missing {missing[:3]}, "
                               f"unexpected {unexpected[:3]})")


def best_row(out: Path) -> dict[str, Any] | None:
    """What ``<run>/best/best.json`` records (step and held-out metrics of best/), or None."""
    path = out / "best" / "best.json"
    return read_json(path) if path.is_file() else None


def _text(completion: Any) -> str:
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def evaluate_heldout(model, tokenizer, rows, config: Any, env_factory=None) -> dict[str, Any]:
    """Greedy held-out metrics of the current policy by the one held-out scorer that ``tune`` scores trials with
    (:func:`agentic_rl.eval.validation.score_heldout`: the final evaluation's parse-and-compare; with an environment,
    greedy episodes with its tools)."""
    from agentic_rl.eval import validation

    return validation.score_heldout(model, tokenizer, rows, max_new_tokens=config.max_completion_length,
                                    rewards=list(config.rewards), env_factory=env_factory,
                                    tools_in_prompt=config.tools_in_prompt, max_turn_tokens=config.max_turn_tokens)


class GRPOMonitor(NonFiniteGuard):
    """The trainer callback: renamed metrics, health rules, ``completions.jsonl`` and periodic held-out evaluation
    that keeps ``best/``; a :class:`~agentic_rl.train.monitoring.NonFiniteGuard`, so a NaN/inf loss or weights end
    the run with an error. ``heldout``: the rows of the held-out check (None: no check); ``base``: (fingerprint,
    directory) of the starting weights, recorded with ``best/``. ``attach(trainer)`` gives it the
    trainer whose sample completions it writes."""

    def __init__(self, config: Any, out: Path, logger, rules: HealthMonitor, heldout: list | None, tokenizer,
                 env_factory, base: tuple):
        super().__init__()
        self.config, self.out, self.logger, self.rules = config, out, logger, rules
        self.heldout, self.tokenizer, self.env_factory, self.base = heldout, tokenizer, env_factory, base
        self.trainer = None
        self.best_score, self.best_step = -math.inf, None
        self.evaluated_steps: set[int] = set()

    def attach(self, trainer) -> None:
        self.trainer = trainer

    def restore_best(self) -> None:
        """On resume: the best held-out score so far is the one ``best/`` was saved with."""
        best = best_row(self.out)
        if best is not None:
            self.best_score, self.best_step = best.get(self.config.best_metric, best["accuracy"]), best["step"]

    def on_log(self, args, st, control, logs=None, **kwargs):
        super().on_log(args, st, control, logs=logs, **kwargs)
        if not logs or self.trainer is None:
            return
        metrics = rename_metrics(logs)
        if not metrics:
            return
        self.logger.log(st.global_step, metrics)
        self.rules.update({"step": st.global_step, **metrics}, st.global_step)
        if self.config.completions_every and st.global_step % self.config.completions_every == 0:
            self._write_completions(st.global_step)

    def _write_completions(self, step: int) -> None:
        from agentic_rl.data.formats import last_message_index

        batch = trl_generation_log(self.trainer)
        prompts, completions = list(batch["prompt"]), list(batch["completion"])
        rewards = {name: list(values) for name, values in batch["rewards"].items()}
        advantages = list(batch["advantages"])
        n = min(self.config.completions_per_log, len(completions))
        shown = []
        for i in range(n):
            user = last_message_index(prompts[i])  # shown: the question (last user message), else the prompt
            question = prompts[i][user].get("content", "") if user is not None else str(prompts[i])
            row = {"step": step, "prompt": question, "completion": _text(completions[i]),
                   "rewards": {k: v[i] for k, v in rewards.items() if i < len(v)},
                   "advantage": advantages[i] if i < len(advantages) else None}
            append_jsonl(self.out / "completions.jsonl", row)
            shown.append(f"**{row['prompt']}**\n\n```\n{row['completion']}\n```\n\nrewards {row['rewards']}")
        if shown:
            self.logger.text(step, "grpo/completions", "\n\n---\n\n".join(shown))

    def on_train_begin(self, args, st, control, model=None, **kwargs):
        if self.heldout is not None and self.config.heldout_every and st.global_step == 0:
            self._heldout(st.global_step, model)

    def on_step_end(self, args, st, control, model=None, **kwargs):
        super().on_step_end(args, st, control, model=model, **kwargs)
        if self.heldout is None or not self.config.heldout_every or self.problem is not None:
            return
        if st.global_step % self.config.heldout_every == 0 or st.global_step >= st.max_steps:
            self._heldout(st.global_step, model)

    def _heldout(self, step: int, model) -> None:
        from agentic_rl.models.fingerprint import write_base_fingerprint

        if step in self.evaluated_steps:
            return
        self.evaluated_steps.add(step)
        start = time.time()
        metrics = evaluate_heldout(model, self.tokenizer, self.heldout, self.config, self.env_factory)
        row = {"step": step, **metrics, "seconds": round(time.time() - start, 1)}
        append_jsonl(self.out / "heldout.jsonl", row)
        self.logger.log(step, {f"eval/{k}": float(v) for k, v in metrics.items() if k != "n"})
        acc, score = metrics["accuracy"], metrics.get(self.config.best_metric, metrics["accuracy"])
        log(f"step {step}: held-out accuracy {acc:.1%} on {metrics['n']} problems ({row['seconds']}s)")
        if score > self.best_score:
            self.best_score, self.best_step = score, step
            save_policy(model, self.tokenizer, self.out / "best")
            write_base_fingerprint(self.out / "best", *self.base)
            write_json(self.out / "best" / "best.json", {"step": step, **metrics})


def save_final_policy(trainer, monitor: GRPOMonitor, tokenizer, out: Path, base: tuple) -> tuple[Path, Path | None]:
    """The run's outputs: ``<run>/adapter`` (LoRA) and ``<run>/model`` (the adapter merged in; built from ``best/``
    with ``select_best`` when the best held-out step is not the last). Returns ``(model_dir, adapter_dir)``."""
    from agentic_rl.models import save_model_dir  # model + tokenizer + generation config, plain from_pretrained
    from agentic_rl.models.fingerprint import write_base_fingerprint

    config = monitor.config
    policy = trainer.model
    if config.select_best and monitor.best_step not in (None, trainer.state.global_step):
        log(f"select_best: building model/ from best/ (step {monitor.best_step}, held-out {config.best_metric} "
            f"{monitor.best_score:.3f})")
        load_weights(policy, out / "best")
    adapter_dir = None
    if not config.full:
        adapter_dir = out / "adapter"
        save_policy(policy, tokenizer, adapter_dir)
        write_base_fingerprint(adapter_dir, *base)
        policy = policy.merge_and_unload()
    model_dir = out / MODEL_FOLDER
    policy.config._name_or_path = str(model_dir)
    save_model_dir(policy, tokenizer, model_dir)
    return model_dir, adapter_dir
