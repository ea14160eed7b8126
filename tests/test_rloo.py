"""RLOO as GRPO's second algorithm (``--algorithm rloo``, TRL's RLOOTrainer): GRPO-only settings are refused, TRL
fields are checked against RLOOConfig, and two real steps on the micro model use the leave-one-out baseline (visible
in the logged advantages) with its metrics reaching TensorBoard."""

from __future__ import annotations

import pytest
from conftest import grpo_config, read_jsonl

from agentic_rl.config import config_from_dict
from agentic_rl.errors import ConfigError
from agentic_rl.train.grpo import GRPOConfig

ALTERNATING = '''
def alternating(completions, **kwargs):
    """1, 0, 1, 0, ...: within each group of two one completion is rewarded."""
    return [float(i % 2 == 0) for i in range(len(completions))]
'''


@pytest.fixture()
def alternating_reward(make_user_module):
    return make_user_module("rloo_alternating", ALTERNATING) + ":alternating"


def test_grpo_only_settings_and_unknown_trl_fields_are_refused_under_rloo():
    with pytest.raises(ConfigError, match="loss_type \\('grpo'\\) is a GRPO setting"):
        GRPOConfig(model="m", algorithm="rloo", loss_type="grpo")
    with pytest.raises(ConfigError, match="scale_rewards \\('none'\\) is a GRPO setting"):
        GRPOConfig(model="m", algorithm="rloo", scale_rewards="none")
    with pytest.raises(ConfigError, match="refill_max_draws \\(2\\) is a GRPO setting"):
        GRPOConfig(model="m", algorithm="rloo", refill_max_draws=2)
    with pytest.raises(ConfigError, match="tied_failure_weight \\(0.5\\) is a GRPO setting"):
        GRPOConfig(model="m", algorithm="rloo", environment="calculator", tied_failure_weight=0.5)
    assert GRPOConfig(model="m", algorithm="rloo", trl_args={"normalize_advantages": True}).algorithm == "rloo"
    with pytest.raises(ConfigError, match="not a field of TRL's GRPOConfig"):
        GRPOConfig(model="m", trl_args={"normalize_advantages": True})
    with pytest.raises(ConfigError, match="not a field of TRL's RLOOConfig"):
        GRPOConfig(model="m", algorithm="rloo", trl_args={"top_entropy_quantile": 0.2})
    with pytest.raises(ConfigError, match="must be one of grpo, rloo"):
        config_from_dict(GRPOConfig, {"model": "m", "algorithm": "ppo"})


def test_rloo_trains_two_steps_with_leave_one_out_advantages_and_tensorboard_metrics(tiny_model_dir, tmp_path,
                                                                                    alternating_reward):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from trl import RLOOConfig

    from agentic_rl.train.grpo import run
    from agentic_rl.train.grpo_trainer import trl_arguments

    out = tmp_path / "rloo"
    cfg = grpo_config(tiny_model_dir, out, algorithm="rloo", gradient_accumulation_steps=4, save_steps=2, beta=0.0,
                      report_to=["tensorboard"], completions_every=1, completions_per_log=4,
                      rewards=[f"{alternating_reward}:1.0"])
    assert isinstance(trl_arguments(cfg, out, [1.0]), RLOOConfig)
    result = run(cfg)
    assert result["steps"] == 2
    # Leave-one-out: with rewards (1, 0) in a group of two the advantages are exactly +1 and -1 (GRPO's group-std
    # scaling would give ±0.707).
    rows = read_jsonl(out / "completions.jsonl")
    assert {r["step"] for r in rows} == {1, 2} and sorted({r["advantage"] for r in rows}) == [-1.0, 1.0]
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"grpo/reward", "grpo/reward/alternating", "train/loss", "grpo/entropy"} <= tags
    assert [e.step for e in events.Scalars("grpo/reward")] == [1, 2]
    assert [e.value for e in events.Scalars("grpo/reward/alternating")] == [0.5, 0.5]
