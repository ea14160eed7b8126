"""RLOO (REINFORCE Leave-One-Out, Ahmadian et al. 2024), GRPO's second algorithm: ``agentic-rl grpo --algorithm rloo``.

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
:class:`agentic_rl.train.grpo_trainer.RLOOEpisodeTrainer` runs instead: TRL's ``GRPOTrainer`` (for its
``rollout_func`` hook and tool mask) with ``RLOOTrainer``'s update — the same KL-in-the-reward, leave-one-out advantage
and sequence-level loss as above, on action tokens only. How it maps onto ``RLOOTrainer``, and where it departs, is in
that class's docstring; :data:`agentic_rl.train.grpo_trainer.VARIANTS` picks one of the two.
"""

from __future__ import annotations

from typing import Any

from agentic_rl.errors import ConfigError

#: GRPO settings that RLOO does not have, with their GRPO-stage defaults (a changed value is an error under RLOO):
#: TRL's loss aggregation and reward scaling, and our signal trainer's group refill, SFT anchor and push-down of tied
#: failures (train/signal.py, built on GRPOTrainer).
GRPO_ONLY_SETTINGS = {"loss_type": "dapo", "scale_rewards": "group", "refill_max_draws": 0, "sft_loss_weight": 0.0,
                      "tied_failure_weight": 0.0}


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
