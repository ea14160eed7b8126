"""Turn-level credit assignment for multi-turn GRPO (``credit_assignment: turn``).

With ``trajectory`` (the default) an episode's step rewards are summed into one return and every action token of the
episode gets the same group-relative advantage. With ``turn``, each assistant turn *t* of an episode gets an advantage
from its own return-to-go::

    G_t = r_t + γ·r_{t+1} + γ²·r_{t+2} + ...          (γ = turn_discount; the step rewards from turn t on)
    A_t = (G_t − mean of G_t over the group's episodes that reached turn t) [/ std, as scale_rewards says]

and every token of that turn (the tokens the model wrote; tool and feedback tokens carry no loss either way) is
trained with ``A_t``. An episode that never reached turn *t* has no tokens there and takes no part in turn *t*'s
mean; a turn index only one episode of the group reached gets advantage 0 (nothing to compare it with). The scaling
follows GRPO's ``scale_rewards``: ``group`` divides by the standard deviation of the same per-turn set (Bessel's
correction, + 1e-4, as TRL), ``batch`` by the standard deviation of all returns-to-go of the generation batch, ``none``
not at all. With γ = 1 turn 0's return-to-go is the episode return, so the first turn's advantage is the trajectory
advantage.

The scheme is MT-GRPO's (Zeng et al. 2025, "Reinforcing multi-turn reasoning in LLM agents via turn-level credit
assignment"), generalised: MT-GRPO normalises turn-level rewards within the group at each turn of a two-turn episode
and adds the outcome advantage to them; here each turn's reward is its discounted return-to-go, which carries the
outcome into every earlier turn by itself and works for any number of turns. GiGPO (Feng et al. 2025) is not
followed: its step-level groups are the steps that share an identical anchor state, and in these environments
episodes share a state only at the first turn (each later context holds different tool results), so its step groups
would hold one step each beyond turn 0.

The rollout (:func:`agentic_rl.agent.rollout.make_rollout_func`) hands each episode's ``turn_spans`` (start and end
of every assistant turn in the completion tokens) and ``step_rewards`` to the trainer;
:class:`agentic_rl.train.grpo_trainer.SignalGRPOTrainer` turns them into a (batch, tokens) advantage tensor, which
TRL's loss takes in place of the (batch,) one.
"""

from __future__ import annotations

import math
from typing import Any

from agentic_rl.errors import ConfigError

CREDIT_ASSIGNMENTS = ["trajectory", "turn"]
#: Added to the standard deviation before dividing, as TRL's GRPO does.
STD_EPSILON = 1e-4


def returns_to_go(step_rewards: list[float], discount: float = 1.0) -> list[float]:
    """``G_t = Σ_{k≥t} discount^(k−t) · r_k`` for every turn ``t``.

    >>> returns_to_go([0.5, 0.0, 1.0], 0.5)
    [0.75, 0.5, 1.0]
    """
    out, running = [], 0.0
    for reward in reversed(step_rewards):
        running = float(reward) + discount * running
        out.append(running)
    return out[::-1]


def _sample_std(values: list[float]) -> float:
    """Standard deviation with Bessel's correction (TRL's ``nanstd``); NaN for fewer than two values."""
    if len(values) < 2:
        return math.nan
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def turn_advantages(step_rewards: list[list[float]], num_generations: int, *, discount: float = 1.0,
                    scale_rewards: str = "group") -> list[list[float]]:
    """One advantage per turn of every episode (see the module docstring); ``step_rewards`` holds the episodes of
    the generation batch in TRL's order, each group's ``num_generations`` episodes next to each other."""
    if num_generations < 1 or len(step_rewards) % num_generations:
        raise ValueError(f"{len(step_rewards)} episodes do not make groups of {num_generations}")
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    returns = [returns_to_go(rewards, discount) for rewards in step_rewards]
    batch_std = _sample_std([g for episode in returns for g in episode])
    advantages = [[0.0] * len(episode) for episode in returns]
    for start in range(0, len(returns), num_generations):
        group = range(start, start + num_generations)
        for turn in range(max(len(returns[i]) for i in group)):
            reached = [i for i in group if len(returns[i]) > turn]
            if len(reached) < 2:
                continue  # no other episode of the group to compare this turn with: advantage 0
            values = [returns[i][turn] for i in reached]
            mean = sum(values) / len(values)
            std = {"group": _sample_std(values), "batch": batch_std, "none": None}[scale_rewards]
            for i in reached:
                centred = returns[i][turn] - mean
                advantages[i][turn] = centred if std is None else centred / (std + STD_EPSILON)
    return advantages


def token_advantages(advantages: list[list[float]], turn_spans: list[list[tuple[int, int]]], width: int):
    """A (episodes, ``width``) float tensor: the tokens of turn ``t`` (``turn_spans[i][t]`` = start, end in the
    completion) hold ``advantages[i][t]``; every other position (environment tokens, padding) holds 0."""
    import torch

    out = torch.zeros((len(advantages), width), dtype=torch.float32)
    for row, (values, spans) in enumerate(zip(advantages, turn_spans)):
        if len(values) != len(spans):
            raise ValueError(f"episode {row}: {len(spans)} turn spans but {len(values)} turn advantages")
        for value, (start, end) in zip(values, spans):
            out[row, start:min(end, width)] = value
    return out


def check_credit_settings(config: Any) -> None:
    """The GRPO stage's credit settings: ``turn`` needs multi-turn episodes (an environment) and GRPO's token loss;
    ``turn_discount`` is in [0, 1]."""
    from agentic_rl.config import check_range

    check_range(config, "turn_discount", 0, 1)
    if config.credit_assignment == "trajectory":
        if config.turn_discount != 1.0:
            raise ConfigError("turn_discount applies with credit_assignment 'turn' only: drop it, or set "
                              "credit_assignment: turn")
        return
    if config.environment is None:
        raise ConfigError("credit_assignment 'turn' needs multi-turn episodes: set --environment (a single-turn "
                          "completion has one turn, whose credit is the trajectory's)")
    if config.algorithm == "rloo":
        raise ConfigError("credit_assignment 'turn' works with --algorithm grpo only: RLOO's loss weighs one "
                          "sequence-level ratio by one advantage per episode")
