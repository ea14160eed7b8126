"""RLOO (REINFORCE Leave-One-Out, Ahmadian et al. 2024) as GRPO's second algorithm: ``agentic-rl grpo --algorithm rloo``.

Everything but the update is the GRPO stage's (:mod:`agentic_rl.train.grpo`): model, LoRA, data, rewards (the same
``--reward`` specs, a reward model included), monitoring (the same ``grpo/…`` metric names in ``metrics.jsonl`` and
TensorBoard), held-out evaluation, checkpoints and outputs. The update is TRL 1.16's ``RLOOTrainer``:

* sample ``num_generations`` (k) completions per prompt; with ``beta > 0`` the KL to the reference is folded into
  the *reward*, ``r_i ← r_i − β · KL_i`` (sequence-level, k1 estimator), instead of being a loss term as in GRPO;
* advantage = the reward minus the mean reward of the *other* k−1 completions of the same prompt (the leave-one-out
  baseline: unbiased, no value network); TRL's ``normalize_advantages`` (pass it through ``trl_args``) then
  standardises the advantages over the batch;
* loss: PPO's clipped surrogate on the *sequence* log-probability ratio, averaged over sequences.

GRPO's ``loss_type`` and ``scale_rewards``, and the GRPO stage's ``refill_max_draws`` and ``sft_loss_weight`` (its
signal trainer subclasses ``GRPOTrainer``), have no meaning here: changing them from their defaults with
``--algorithm rloo`` is an error rather than a setting silently ignored. Difficulty selection (``select_samples``)
happens before training and works with both. TRL no longer ships a PPO trainer; GRPO and RLOO are its on-policy RL
algorithms for LLMs.

With an environment (``agentic-rl grpo --environment calculator --algorithm rloo``). TRL 1.16's ``RLOOTrainer`` takes
no ``rollout_func`` and no ``environment_factory``, so the multi-turn stage cannot use it;
:func:`make_rloo_rollout_trainer_class` builds ``RLOORolloutTrainer`` instead: TRL's ``GRPOTrainer`` (for its
``rollout_func`` hook and tool mask) with ``RLOOTrainer``'s update — the same KL-in-the-reward, leave-one-out advantage
and sequence-level loss as above, on action tokens only. How it maps onto ``RLOOTrainer``, and where it departs, is in
that function's docstring.
"""

from __future__ import annotations

from typing import Any

from agentic_rl.errors import ConfigError

#: GRPO settings that RLOO does not have, with their GRPO-stage defaults (a changed value is an error under RLOO):
#: TRL's loss aggregation and reward scaling, and our signal trainer's group refill and SFT anchor (train/signal.py,
#: built on GRPOTrainer).
GRPO_ONLY_SETTINGS = {"loss_type": "dapo", "scale_rewards": "group", "refill_max_draws": 0, "sft_loss_weight": 0.0}
#: Of these, the ones TRL's RLOOConfig has no field for (ours are not TRL fields at all).
_TRL_GRPO_ONLY = ("loss_type", "scale_rewards")


def check_rloo_settings(config: Any) -> None:
    """A GRPO-only setting changed from its default with ``algorithm: rloo`` is a one-line :class:`ConfigError`.

    Serves the GRPO stage and the agent stage; a setting the config does not have is skipped.
    """
    for name, default in GRPO_ONLY_SETTINGS.items():
        if hasattr(config, name) and getattr(config, name) != default:
            # Only the GRPO stage passes TRL fields through (trl_args); the agent stage has no normalisation switch.
            hint = (" (for batch-normalised advantages pass trl_args: {normalize_advantages: true})"
                    if hasattr(config, "trl_args") else "")
            raise ConfigError(f"{name} ({getattr(config, name)!r}) is a GRPO setting; RLOO uses the leave-one-out "
                              f"baseline{hint}; drop --{name.replace('_', '-')} or use --algorithm grpo")


def trl_config_class():
    from trl import RLOOConfig

    return RLOOConfig


def trainer_class():
    """TRL's ``RLOOTrainer`` with the length-sorted log-prob passes (``logprob_chunk_rows``, train/logprobs.py)."""
    from trl import RLOOTrainer

    from agentic_rl.train.logprobs import LengthSortedScoring

    return type("RLOOTrainer", (LengthSortedScoring, RLOOTrainer), {"__module__": __name__})


def rloo_arguments(grpo_kwargs: dict[str, Any]):
    """TRL's ``RLOOConfig`` from the keyword arguments the GRPO stage built for ``GRPOConfig`` (the shared fields
    have the same names; the GRPO-only ones are dropped after :func:`check_rloo_settings` made sure they are unset)."""
    config_cls = trl_config_class()
    kwargs = {k: v for k, v in grpo_kwargs.items() if k not in _TRL_GRPO_ONLY}
    try:
        return config_cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"TRL rejected the RLOO settings: {exc}") from None


# ---------------------------------------------------------------------------------------------------------------
# RLOO with an environment: RLOOTrainer's update on GRPOTrainer's rollout machinery
# ---------------------------------------------------------------------------------------------------------------

def make_rloo_rollout_trainer_class():
    """``RLOORolloutTrainer``: TRL's ``GRPOTrainer`` (its ``rollout_func`` hook and tool mask) with ``RLOOTrainer``'s
    advantage and loss (built lazily: TRL is heavy). It must be given ``scale_rewards="none"``.

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
    import torch
    from accelerate.utils import gather
    from trl import GRPOTrainer
    from trl.models.utils import disable_gradient_checkpointing

    from agentic_rl.train.logprobs import LengthSortedScoring
    from agentic_rl.train.monitoring import trl_generation_log

    class RLOORolloutTrainer(LengthSortedScoring, GRPOTrainer):
        """GRPOTrainer's generation and rollouts, RLOOTrainer's advantage and loss (see the factory's docstring)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            # The advantage below is derived from GRPO's centred (unscaled, summed-reward) advantage.
            if self.scale_rewards != "none" or self.multi_objective_aggregation != "sum_then_normalize":
                raise ConfigError("RLOORolloutTrainer needs TRL's scale_rewards='none' and "
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
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention_mask, batch["completion_ids"].size(1), batch_size=batch_size)
            return logps

        def _generate_and_score_completions(self, inputs):
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
                stats = self.accelerator.reduce(torch.stack([per_token_kl.sum(), mask.sum().float()]),
                                                reduction="sum")
                self._metrics[mode]["kl"].append((stats[0] / stats[1].clamp(min=1.0)).item())
            advantages = centred * g / (g - 1) if g > 1 else torch.zeros_like(centred)
            # TRL's completion log holds GRPO's advantages of this batch: replace them with the ones trained on.
            logged = trl_generation_log(self)["advantages"]
            for _ in range(min(len(advantages), len(logged))):
                logged.pop()
            logged.extend(advantages.tolist())
            start = self.accelerator.process_index * local
            batch["advantages"] = advantages[start:start + local]
            if old is not None:
                batch["old_logps"] = (old * mask).sum(1)  # (B,)
            return batch

        def _compute_loss(self, model, inputs):
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

    return RLOORolloutTrainer
