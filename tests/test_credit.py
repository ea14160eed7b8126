"""Turn-level credit assignment (``credit_assignment: turn``): returns-to-go, advantages normalised within the group
per turn index (written out by hand here, not recomputed by the code under test), per-token advantage tensors, the
settings' one-line errors; on the micro model, the trainer's advantages (``trajectory`` exactly TRL's, ``turn`` per
token), no loss on tool-result tokens under either setting, and two GRPO steps in the calculator environment."""

from __future__ import annotations

import math

import pytest
from conftest import episode_batch, grpo_config, loss_gradient, read_jsonl

from agentic_rl.config import config_from_dict
from agentic_rl.errors import ConfigError
from agentic_rl.train.credit import returns_to_go, token_advantages, turn_advantages

#: A group of 3 episodes: two of 2 turns, one of 3.
STEP_REWARDS = [[0.1, 1.0], [0.1, 0.0], [-0.05, 0.1, 1.0]]
EPS = 1e-4  # added to the standard deviation, as TRL's GRPO does


def test_returns_to_go_by_hand():
    assert returns_to_go([0.1, 1.0]) == pytest.approx([1.1, 1.0])
    assert returns_to_go([-0.05, 0.1, 1.0]) == pytest.approx([1.05, 1.1, 1.0])
    # γ = 0.5: G_2 = 1.0, G_1 = 0.1 + 0.5·1.0 = 0.6, G_0 = -0.05 + 0.5·0.6 = 0.25
    assert returns_to_go([-0.05, 0.1, 1.0], 0.5) == pytest.approx([0.25, 0.6, 1.0])
    assert returns_to_go([0.1, 1.0], 0.0) == pytest.approx([0.1, 1.0])
    assert returns_to_go([]) == []


def test_turn_advantages_by_hand_with_no_discount():
    # Returns-to-go: [1.1, 1.0], [0.1, 0.0], [1.05, 1.1, 1.0].
    # Turn 0: all three episodes; mean (1.1 + 0.1 + 1.05) / 3 = 0.75, deviations 0.35, -0.65, 0.3,
    #         std = sqrt((0.35² + 0.65² + 0.3²) / 2) = sqrt(0.3175).
    # Turn 1: all three; mean (1.0 + 0.0 + 1.1) / 3 = 0.7, deviations 0.3, -0.7, 0.4, std = sqrt(0.74 / 2) = sqrt(0.37).
    # Turn 2: only the third episode reached it: nothing to compare with, advantage 0.
    s0, s1 = math.sqrt(0.3175), math.sqrt(0.37)
    expected = [[0.35 / (s0 + EPS), 0.3 / (s1 + EPS)],
                [-0.65 / (s0 + EPS), -0.7 / (s1 + EPS)],
                [0.3 / (s0 + EPS), 0.4 / (s1 + EPS), 0.0]]
    got = turn_advantages(STEP_REWARDS, 3, discount=1.0, scale_rewards="group")
    assert [len(a) for a in got] == [2, 2, 3]
    for row, want in zip(got, expected):
        assert row == pytest.approx(want, abs=1e-9)
    # Unscaled ('none', Dr. GRPO): the deviations themselves.
    none = turn_advantages(STEP_REWARDS, 3, scale_rewards="none")
    for row, want in zip(none, [[0.35, 0.3], [-0.65, -0.7], [0.3, 0.4, 0.0]]):
        assert row == pytest.approx(want, abs=1e-12)


def test_turn_advantages_by_hand_with_discount_one_half():
    # Returns-to-go with γ = 0.5: [0.1 + 0.5, 1.0] = [0.6, 1.0]; [0.1, 0.0]; [0.25, 0.6, 1.0].
    # Turn 0: mean (0.6 + 0.1 + 0.25) / 3 = 0.95 / 3; deviations 0.6 - 0.95/3, 0.1 - 0.95/3, 0.25 - 0.95/3.
    # Turn 1: mean (1.0 + 0.0 + 0.6) / 3 = 1.6 / 3.
    m0, m1 = 0.95 / 3, 1.6 / 3
    d0 = [0.6 - m0, 0.1 - m0, 0.25 - m0]
    d1 = [1.0 - m1, 0.0 - m1, 0.6 - m1]
    s0 = math.sqrt(sum(d * d for d in d0) / 2)
    s1 = math.sqrt(sum(d * d for d in d1) / 2)
    got = turn_advantages(STEP_REWARDS, 3, discount=0.5, scale_rewards="group")
    assert got[0] == pytest.approx([d0[0] / (s0 + EPS), d1[0] / (s1 + EPS)], abs=1e-9)
    assert got[1] == pytest.approx([d0[1] / (s0 + EPS), d1[1] / (s1 + EPS)], abs=1e-9)
    assert got[2] == pytest.approx([d0[2] / (s0 + EPS), d1[2] / (s1 + EPS), 0.0], abs=1e-9)
    # With γ = 0.5 the third episode's first turn is below the mean although its episode return (1.05) is above it:
    # the turn that earned -0.05 is blamed for it, the turn after it credited.
    assert got[2][0] < 0 < got[2][1]


def test_batch_scaling_uses_the_std_of_every_return_to_go_of_the_batch():
    returns = [1.1, 1.0, 0.1, 0.0, 1.05, 1.1, 1.0]  # all returns-to-go of the batch (γ = 1)
    mean = sum(returns) / 7
    std = math.sqrt(sum((g - mean) ** 2 for g in returns) / 6)
    got = turn_advantages(STEP_REWARDS, 3, scale_rewards="batch")
    assert got[1] == pytest.approx([-0.65 / (std + EPS), -0.7 / (std + EPS)], abs=1e-9)
    assert got[2][2] == 0.0


def test_groups_are_normalised_apart_and_turn_zero_is_the_trajectory_advantage():
    # Two groups of 2. With γ = 1 the first turn's return-to-go is the episode return, so turn 0's advantage is
    # GRPO's trajectory advantage: (R - mean) / (std + eps); a group of 2 has std |R1 - R2| / sqrt(2).
    rewards = [[0.0, 1.0], [0.0], [0.5], [0.1, 0.1, 0.1]]
    got = turn_advantages(rewards, 2)
    s = 1 / math.sqrt(2)
    assert got[0] == pytest.approx([0.5 / (s + EPS), 0.0]) and got[1] == pytest.approx([-0.5 / (s + EPS)])
    s2 = 0.2 / math.sqrt(2)
    assert got[2] == pytest.approx([0.1 / (s2 + EPS)]) and got[3] == pytest.approx([-0.1 / (s2 + EPS), 0.0, 0.0])
    # Tied returns-to-go within a turn: no signal there.
    assert turn_advantages([[1.0, 0.0], [1.0, 0.0]], 2) == [[0.0, 0.0], [0.0, 0.0]]


def test_bad_batches_are_refused():
    with pytest.raises(ValueError, match="do not make groups of 2"):
        turn_advantages([[1.0]] * 3, 2)
    with pytest.raises(ValueError, match="scale_rewards"):
        turn_advantages([[1.0]] * 2, 2, scale_rewards="sum")
    with pytest.raises(ValueError, match="episode 0: 1 turn spans but 2 turn advantages"):
        token_advantages([[1.0, 2.0]], [[(0, 2)]], 4)


def test_token_advantages_fill_each_turns_tokens_and_nothing_else():
    # Episode 0: turn 0 = tokens 0..2, tool tokens 3..5, turn 1 = tokens 6..7; episode 1: one turn of 3 tokens.
    tensor = token_advantages([[0.5, -1.0], [2.0]], [[(0, 3), (6, 8)], [(0, 3)]], width=10)
    assert tensor.shape == (2, 10)
    assert tensor[0].tolist() == [0.5, 0.5, 0.5, 0.0, 0.0, 0.0, -1.0, -1.0, 0.0, 0.0]
    assert tensor[1].tolist() == [2.0, 2.0, 2.0] + [0.0] * 7


def test_refill_sees_the_signal_of_per_token_advantages():
    import torch

    from agentic_rl.train.signal import group_has_signal

    per_token = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.3, 0.0], [0.0, -0.3, 0.0]])
    assert group_has_signal(per_token, 2).tolist() == [False, True]
    assert group_has_signal(torch.tensor([0.0, 0.0, 1.0, -1.0]), 2).tolist() == [False, True]


def test_refill_concatenates_per_token_advantages_of_different_widths():
    import torch

    from agentic_rl.train.signal import concat_batches

    def batch(width, value):
        return {"advantages": torch.full((2, width), value), "completion_ids": torch.ones((2, width), dtype=torch.long),
                "completion_mask": torch.ones((2, width), dtype=torch.long), "num_items_in_batch": torch.tensor(0)}

    out = concat_batches([batch(3, 0.5), batch(5, -1.0)], pad_token_id=0)
    assert out["advantages"].tolist() == [[0.5, 0.5, 0.5, 0.0, 0.0]] * 2 + [[-1.0] * 5] * 2  # padding: no advantage


def test_credit_settings_are_checked_in_one_line():
    from agentic_rl.train.grpo import GRPOConfig

    env = {"model": "m", "environment": "calculator"}
    config = config_from_dict(GRPOConfig, {**env, "credit_assignment": "turn", "turn_discount": 0.5})
    assert (config.credit_assignment, config.turn_discount) == ("turn", 0.5)
    assert GRPOConfig(model="m").credit_assignment == "trajectory"
    cases = [
        ({"model": "m", "credit_assignment": "turn"}, r"^credit_assignment 'turn' needs multi-turn episodes"),
        ({**env, "credit_assignment": "turn", "algorithm": "rloo"}, r"^credit_assignment 'turn' works with "
                                                                    r"--algorithm grpo only"),
        ({**env, "credit_assignment": "turn", "turn_discount": 1.5}, r"^turn_discount must be in \[0, 1\]"),
        ({**env, "turn_discount": 0.9}, r"^turn_discount applies with credit_assignment 'turn' only"),
        ({**env, "credit_assignment": "step"}, r"^config key 'credit_assignment' must be one of trajectory, turn"),
    ]
    for values, message in cases:
        with pytest.raises(ConfigError, match=message) as caught:
            config_from_dict(GRPOConfig, values)
        assert "\n" not in str(caught.value)


# ---------------------------------------------------------------------------------------------------------------
# The trainer on the micro model, with a scripted policy
# ---------------------------------------------------------------------------------------------------------------

SCRIPTS = {0: ["call", "Final Answer: 1081"], 1: ["Final Answer: 5"], 2: ["call", "call", "Final Answer: 1081"],
           3: ["call", "Final Answer: 7"]}
#: The step rewards SCRIPTS earn in the calculator environment (a useful call 0.1, a repeated one 0, a right answer 1).
SCRIPTED_STEP_REWARDS = [[0.1, 1.0], [0.0], [0.1, 0.0, 1.0], [0.1, 0.0]]


def _scripted_batch(tiny_model_dir, tokenizer, monkeypatch, tmp_path, trainer_class, scripts=None, **trainer_kwargs):
    """A trainer and one scored generation batch: 2 groups of 2 calculator episodes played by ``scripts`` (default
    :data:`SCRIPTS`: row 0: call, right answer; row 1: wrong answer at once; row 2: call, the same call again, right
    answer; row 3: call, wrong answer)."""
    from agentic_rl.agent import rollout as rollout_mod
    from agentic_rl.agent.calculator_env import CalculatorEnv
    from agentic_rl.agent.rollout import RolloutSettings, make_rollout_func
    from agentic_rl.agent.tasks import agent_rows
    from agentic_rl.agent.tool_format import ChatFormat, render_tool_call

    scripts = SCRIPTS if scripts is None else scripts
    call = render_tool_call("calculator", {"expression": "23*47"})
    fmt = ChatFormat(tokenizer)
    calls = []

    def generate(model, contexts, **kwargs):
        turn = len(calls)
        calls.append(len(contexts))
        active = [row for row, script in scripts.items() if len(script) > turn]  # rows still playing, in batch order
        assert len(active) == len(contexts)
        texts = [scripts[row][turn] for row in active]
        return [fmt.encode(call if text == "call" else text) + [fmt.end_of_turn_id] for text in texts]

    questions = ["A farm has 23 boxes with 47 eggs in each box. How many eggs are there?",
                 "Sam has 47 bags with 23 beads each. How many beads?"]
    rows = agent_rows([{"question": q, "answer": "23 * 47 = <<23*47=1081>>1081\n#### 1081"} for q in questions])
    monkeypatch.setattr(rollout_mod, "generate_batch", generate)
    rollout = make_rollout_func(lambda: CalculatorEnv(), rows, RolloutSettings(max_turn_tokens=64,
                                                                               tools_in_prompt=False))
    trainer, batch, inputs = episode_batch(trainer_class, tiny_model_dir, tokenizer, tmp_path, rows, rollout,
                                           max_completion_length=400, **trainer_kwargs)
    if scripts is SCRIPTS:
        assert calls == [4, 3, 1]
        assert [row["step_rewards"] for row in inputs] == [pytest.approx(r) for r in SCRIPTED_STEP_REWARDS]
    return trainer, batch


def _action_runs(batch, row: int) -> list[list[int]]:
    """Column indices of each contiguous run of action tokens (model-written, not tool or padding) of a row."""
    action = (batch["completion_mask"][row] * batch["tool_mask"][row]).tolist()
    runs, current = [], []
    for column, flag in enumerate(action):
        if flag:
            current.append(column)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def test_trajectory_credit_is_trls_advantage_and_tool_tokens_get_no_loss(tiny_model_dir, tokenizer, monkeypatch,
                                                                          tmp_path):
    import torch
    import trl

    from agentic_rl.train.grpo_trainer import SignalGRPOTrainer

    _, plain = _scripted_batch(tiny_model_dir, tokenizer, monkeypatch, tmp_path / "trl", trl.GRPOTrainer)
    trainer, batch = _scripted_batch(tiny_model_dir, tokenizer, monkeypatch, tmp_path / "ours", SignalGRPOTrainer,
                                     credit_assignment="trajectory")
    # Returns 1.1, 0.0 | 1.1, 0.1: each group of 2 is ±(difference / 2) / (|difference| / sqrt(2) + eps).
    assert batch["advantages"].shape == (4,) and torch.equal(batch["advantages"], plain["advantages"])
    s1, s2 = 1.1 / math.sqrt(2), 1.0 / math.sqrt(2)
    assert batch["advantages"].tolist() == pytest.approx([0.55 / (s1 + EPS), -0.55 / (s1 + EPS), 0.5 / (s2 + EPS),
                                                          -0.5 / (s2 + EPS)], rel=1e-5)
    grad = loss_gradient(trainer, batch, monkeypatch)
    action = (batch["completion_mask"] * batch["tool_mask"]).bool()
    tool = (batch["completion_mask"] == 1) & (batch["tool_mask"] == 0)
    assert tool.any() and torch.all(grad[~action] == 0) and torch.all(grad[action] != 0)
    assert "<tool_response>" in tokenizer.decode(batch["completion_ids"][0][tool[0]])


def test_a_group_whose_episodes_all_fail_alike_is_pushed_down_by_the_rollouts_correctness(tiny_model_dir, tokenizer,
                                                                                           monkeypatch, tmp_path):
    from agentic_rl.train.grpo_trainer import SignalGRPOTrainer

    # Group 1: call and the right answer (return 1.1) against a wrong answer at once (0.0); group 2: two wrong answers
    # at once (0.0 each), a tie that TRL's advantage leaves at zero.
    scripts = {0: ["call", "Final Answer: 1081"], 1: ["Final Answer: 5"], 2: ["Final Answer: 5"],
               3: ["Final Answer: 7"]}
    trainer, batch = _scripted_batch(tiny_model_dir, tokenizer, monkeypatch, tmp_path, SignalGRPOTrainer,
                                     scripts=scripts, tied_failure_weight=1.0)
    # Group 1 keeps TRL's ±0.55 / (its std 1.1/sqrt(2) + eps); group 2 gets (0 - 0.275) / (the batch's std 0.55 +
    # eps): returns 1.1, 0, 0, 0 have mean 0.275 and unbiased standard deviation 0.55.
    s1 = 1.1 / math.sqrt(2)
    assert batch["advantages"].tolist() == pytest.approx([0.55 / (s1 + EPS), -0.55 / (s1 + EPS), -0.275 / (0.55 + EPS),
                                                          -0.275 / (0.55 + EPS)], rel=1e-5)
    assert trainer._metrics["train"]["signal/tied_failure_fraction"] == [0.5]


def test_turn_credit_gives_each_turn_its_own_advantage_and_tool_tokens_get_no_loss(tiny_model_dir, tokenizer,
                                                                                   monkeypatch, tmp_path):
    import torch

    from agentic_rl.train.grpo_trainer import SignalGRPOTrainer

    trainer, batch = _scripted_batch(tiny_model_dir, tokenizer, monkeypatch, tmp_path, SignalGRPOTrainer,
                                     credit_assignment="turn")
    advantages = batch["advantages"]
    assert advantages.shape == batch["completion_ids"].shape
    # Returns-to-go: row 0 [1.1, 1.0], row 1 [0.0] | row 2 [1.1, 1.0, 1.0], row 3 [0.1, 0.0].
    # Group 1: turn 0 compares 1.1 with 0.0; turn 1 only row 0 reached (0).
    # Group 2: turn 0 compares 1.1 with 0.1, turn 1 compares 1.0 with 0.0, turn 2 only row 2 reached (0).
    a1, a2 = 0.55 / (1.1 / math.sqrt(2) + EPS), 0.5 / (1.0 / math.sqrt(2) + EPS)
    expected = [[a1, 0.0], [-a1], [a2, a2, 0.0], [-a2, -a2]]
    for row, want in enumerate(expected):
        runs = _action_runs(batch, row)
        assert len(runs) == len(want), f"row {row}: {len(runs)} turns"
        for run, value in zip(runs, want):
            assert advantages[row, run].tolist() == pytest.approx([value] * len(run), rel=1e-5, abs=1e-6)
    action = (batch["completion_mask"] * batch["tool_mask"]).bool()
    assert torch.all(advantages[~action] == 0)  # tool-result tokens and padding carry no advantage
    # The loss takes the (B, T) advantages token by token: with β = 0 and π_old = π, d loss / d log π = -A / N.
    grad = loss_gradient(trainer, batch, monkeypatch)
    assert torch.all(grad[~action] == 0)
    n_items = batch["num_items_in_batch"].item()
    assert torch.allclose(grad[action], -advantages[action] / n_items, atol=1e-7)
    assert (grad[action] == 0).any() and (grad[action] != 0).any()  # row 0's answer turn: no other episode got there
    # The completion log holds each episode's turn advantages.
    from agentic_rl.train.monitoring import trl_generation_log

    logged = list(trl_generation_log(trainer)["advantages"])[-4:]
    assert [len(a) for a in logged] == [2, 1, 3, 2] and logged[1] == [pytest.approx(-a1)]


def test_two_grpo_steps_with_turn_credit_in_the_calculator_environment(tiny_model_dir, tmp_path, monkeypatch):
    """The stage end to end: a scripted policy that calls the calculator, calls a tool that does not exist (a step
    reward of tool_error_reward) or answers, so episodes have 1 to 3 turns and different step rewards."""
    import random

    from agentic_rl.agent import rollout as rollout_mod
    from agentic_rl.agent.tool_format import ChatFormat, render_tool_call
    from agentic_rl.train.grpo import run as grpo

    pick = random.Random(0)
    state = {}

    def generate(model, contexts, **kwargs):
        from transformers import AutoTokenizer

        if "fmt" not in state:
            state["fmt"] = ChatFormat(AutoTokenizer.from_pretrained(tiny_model_dir))
        fmt = state["fmt"]
        texts = [pick.choice([render_tool_call("calculator", {"expression": "2*3"}), render_tool_call("abacus", {}),
                              "Final Answer: 6"]) for _ in contexts]
        return [fmt.encode(text) + [fmt.end_of_turn_id] for text in texts]

    monkeypatch.setattr(rollout_mod, "generate_batch", generate)
    out = tmp_path / "grpo"
    result = grpo(grpo_config(tiny_model_dir, out, environment="calculator", credit_assignment="turn",
                              turn_discount=0.9, tool_error_reward=-0.1, max_completion_length=160,
                              max_turn_tokens=40, max_turns=3, completions_every=1, completions_per_log=4))
    assert result["steps"] == 2 and (out / "model" / "model.safetensors").is_file()
    stage = read_jsonl(out / "completions.jsonl")
    assert stage and all(isinstance(row["advantage"], list) for row in stage)
    assert {len(row["advantage"]) for row in stage} - {1}, "every logged episode had a single turn"
    assert len(read_jsonl(out / "rollouts.jsonl")) == 2
