"""Retry groups (``grpo.retry_groups``): a GRPO group whose episodes all answered wrong at first goes on from one
shared wrong answer, so its advantages compare only what each episode did with the feedback."""

from __future__ import annotations

import pytest
from conftest import episode_batch, grpo_config, loss_gradient

from agentic_rl.agent import rollout as rollout_mod
from agentic_rl.agent.calculator_env import CalculatorEnv
from agentic_rl.agent.env import DEFAULT_FEEDBACK
from agentic_rl.agent.rollout import (RolloutSettings, branch_after_wrong_answers, make_rollout_func, replay_turns,
                                      run_episodes)
from agentic_rl.agent.tasks import agent_rows
from agentic_rl.agent.tool_format import ChatFormat
from agentic_rl.config import config_from_dict
from agentic_rl.errors import ConfigError

ROWS = agent_rows([
    {"question": "A farm has 23 boxes with 47 eggs in each box. How many eggs are there?",
     "answer": "23 * 47 = <<23*47=1081>>1081\n#### 1081"},
    {"question": "Sam has 47 bags with 23 beads each. How many beads?",
     "answer": "47 * 23 = <<47*23=1081>>1081\n#### 1081"}])
SETTINGS = RolloutSettings(max_turn_tokens=32, max_completion_length=300, tools_in_prompt=False)


def answering_policy(tokenizer, first_answers: dict[int, str], retries: list[str]):
    """A stand-in for ``generate_batch``: an episode's first answer is ``first_answers[its cache key]`` (its row in
    the batch of the call that started it); each answer after the feedback is the next of ``retries``, in the order
    the calls ask for them."""
    fmt = ChatFormat(tokenizer)
    queue = list(retries)

    def generate(model, contexts, *, cache_keys, **kwargs):
        out = []
        for key, ids in zip(cache_keys, contexts):
            text = queue.pop(0) if "not correct" in tokenizer.decode(ids) else first_answers[key]
            out.append(fmt.encode(text) + [fmt.end_of_turn_id])
        return out

    return generate, queue


def play(tokenizer, monkeypatch, first_answers, retries, env_class=CalculatorEnv):
    """Two groups of two episodes (rows 0, 0, 1, 1) with two answers allowed, then the retry-group branching."""
    generate, queue = answering_policy(tokenizer, first_answers, retries)
    monkeypatch.setattr(rollout_mod, "generate_batch", generate)
    tasks = [ROWS[0], ROWS[0], ROWS[1], ROWS[1]]
    prompts = [t["prompt"] for t in tasks]
    factory = lambda: env_class(answer_attempts=2, max_turns=2)  # noqa: E731
    fmt = ChatFormat(tokenizer)
    played = run_episodes(None, tokenizer, [factory() for _ in tasks], tasks, prompts, SETTINGS, fmt)
    trajectories = list(played)
    stats = branch_after_wrong_answers(None, tokenizer, factory, tasks, prompts, trajectories, SETTINGS, fmt)
    return played, trajectories, stats, queue


def test_a_group_wrong_at_first_goes_on_from_its_first_wrong_answer(tokenizer, monkeypatch):
    # Group 0: both wrong at first (5, 7); group 1: episode 2 right at once, episode 3 wrong (3).
    # Retries of the first play: episodes 0, 1, 3 in that order; then the one replaced episode (1) retries.
    played, trajectories, stats, queue = play(
        tokenizer, monkeypatch, {0: "Final Answer: 5", 1: "Final Answer: 7", 2: "Final Answer: 1081",
                                 3: "Final Answer: 3"},
        ["Final Answer: 1081", "Final Answer: 8", "Final Answer: 1081", "Final Answer: 9"])
    assert queue == []  # exactly one more retry was written: the replaced episode's
    anchor, branch = trajectories[0], trajectories[1]
    assert anchor is played[0] and branch is not played[1]
    assert trajectories[2] is played[2] and trajectories[3] is played[3]  # a group right at first is left alone
    assert [m["content"] for m in branch.messages] == ["Final Answer: 5", DEFAULT_FEEDBACK, "Final Answer: 9"]
    assert [m["content"] for m in played[1].messages] == ["Final Answer: 7", DEFAULT_FEEDBACK, "Final Answer: 8"]
    # The shared part is the anchor's tokens up to its second turn, with the same masks and step rewards.
    shared = anchor.turn_spans[1][0]
    assert branch.completion_ids[:shared] == anchor.completion_ids[:shared]
    assert branch.env_mask[:shared] == anchor.env_mask[:shared] and 0 in branch.env_mask[:shared]
    assert branch.prompt_ids == anchor.prompt_ids and branch.turn_spans[0] == anchor.turn_spans[0]
    assert branch.completion_ids[shared:] != anchor.completion_ids[shared:]
    assert branch.step_rewards == [pytest.approx(-0.2), 0.0] and anchor.step_rewards == [pytest.approx(-0.2), 1.0]
    assert branch.retry_turns == anchor.retry_turns == [0]
    assert not branch.correct and anchor.correct
    assert branch.metrics == {"attempts": 2.0, "success_at_1": 0.0, "success_at_2": 0.0}
    assert stats == {"retry_groups": 0.5, "retry_groups_split": 1.0}


def test_groups_without_a_shared_failure_or_a_replayable_environment_are_left_alone(tokenizer, monkeypatch):
    # Every first answer right: no group branches, and no retry is asked for.
    played, trajectories, stats, _ = play(tokenizer, monkeypatch, dict.fromkeys(range(4), "Final Answer: 1081"), [])
    assert trajectories == played and stats == {"retry_groups": 0.0, "retry_groups_split": 0.0}

    class ChangingFeedback(CalculatorEnv):
        """Each instance words its feedback differently: a replay does not reach the state it replays."""
        made = 0

        def __init__(self, **kwargs):
            ChangingFeedback.made += 1
            super().__init__(feedback=f"That is not correct ({ChangingFeedback.made}).", **kwargs)

    played, trajectories, stats, queue = play(
        tokenizer, monkeypatch, dict.fromkeys(range(4), "Final Answer: 2"), ["Final Answer: 2"] * 4,
        env_class=ChangingFeedback)
    assert all(a is b for a, b in zip(trajectories, played)) and stats["retry_groups"] == 0.0
    assert queue == []  # nothing was continued


def test_replay_needs_a_turn_inside_the_episode(tokenizer, monkeypatch):
    played, _, _, _ = play(tokenizer, monkeypatch, dict.fromkeys(range(4), "Final Answer: 2"),
                           ["Final Answer: 2"] * 4 + ["Final Answer: 2"] * 2)
    fmt = ChatFormat(tokenizer)
    episode = played[0]  # two turns: the wrong answer, then the retry
    for turns in (0, 2):
        assert replay_turns(CalculatorEnv(answer_attempts=2, max_turns=2), ROWS[0], ROWS[0]["prompt"], episode,
                            turns, tokenizer, fmt, SETTINGS) is None
    replay = replay_turns(CalculatorEnv(answer_attempts=2, max_turns=2), ROWS[0], ROWS[0]["prompt"], episode, 1,
                          tokenizer, fmt, SETTINGS)
    assert replay.completion_ids == episode.completion_ids[:episode.turn_spans[1][0]]
    assert replay.step_rewards == episode.step_rewards[:1] and replay.context_starts == [0]


@pytest.mark.parametrize("credit_assignment", ["trajectory", "turn"])
def test_grpo_gives_the_shared_turns_no_net_gradient(tiny_model_dir, tokenizer, monkeypatch, tmp_path,
                                                     credit_assignment):
    """In a branched group the shared tokens' gradients cancel between its episodes; the retries' do not."""
    from agentic_rl.train.grpo_trainer import SignalGRPOTrainer

    generate, _ = answering_policy(tokenizer, {0: "Final Answer: 5", 1: "Final Answer: 7", 2: "Final Answer: 1081",
                                               3: "Final Answer: 3"},
                                   ["Final Answer: 1081", "Final Answer: 8", "Final Answer: 1081", "Final Answer: 9"])
    monkeypatch.setattr(rollout_mod, "generate_batch", generate)
    rollout = make_rollout_func(lambda: CalculatorEnv(answer_attempts=2, max_turns=2), ROWS, SETTINGS,
                                retry_groups=True)
    trainer, batch, _ = episode_batch(SignalGRPOTrainer, tiny_model_dir, tokenizer, tmp_path, ROWS, rollout,
                                      max_completion_length=300, credit_assignment=credit_assignment)
    assert trainer._metrics["train"]["agent/retry_groups"] == [0.5]
    grad = loss_gradient(trainer, batch, monkeypatch)
    ids, action = batch["completion_ids"], (batch["completion_mask"] * batch["tool_mask"]).bool()
    length = [int(batch["completion_mask"][row].sum()) for row in (0, 1)]
    # Completions are right-padded: the shared first turn is at the same positions in rows 0 and 1.
    shared = next(k for k in range(min(length)) if ids[0, k] != ids[1, k])
    first_turn = action[0, :shared]
    assert first_turn.any() and bool((action[1, :shared] == first_turn).all())
    assert grad[0, :shared][first_turn].abs().min() > 0
    assert bool(((grad[0, :shared] + grad[1, :shared])[first_turn]).abs().max() < 1e-9)
    assert grad[0, shared:length[0]][action[0, shared:length[0]]].abs().min() > 0  # the retries are trained


def test_retry_groups_settings_are_checked(tmp_path):
    from agentic_rl.train import grpo

    with pytest.raises(ConfigError, match="retry_groups continues episodes after a wrong answer: it needs an "
                                          "environment"):
        config_from_dict(grpo.GRPOConfig, {"model": "m", "retry_groups": True})
    # An environment that gives one answer per episode has no retry to branch: refused before anything is written.
    config = grpo_config(tmp_path / "no-model", tmp_path / "run", environment="calculator", retry_groups=True,
                         max_completion_length=64)
    with pytest.raises(ConfigError, match="environment calculator allows 1 answer per episode"):
        grpo.run(config)
    assert not (tmp_path / "run").exists()


def test_a_pipeline_with_retry_groups_and_one_answer_fails_before_any_stage(tmp_path):
    from agentic_rl.pipeline import PipelineConfig, run_pipeline

    values = {"name": "one-answer", "output_dir": str(tmp_path / "run"), "dataset": "synthetic:multiplication",
              "environment": "calculator", "grpo": {"retry_groups": True}}
    with pytest.raises(ConfigError, match="environment calculator allows 1 answer per episode"):
        run_pipeline(config_from_dict(PipelineConfig, values))
    assert not (tmp_path / "run").exists()  # nothing trained, nothing written
    # With two answers allowed the same sections pass.
    from agentic_rl.pipeline import _check_sections

    _check_sections(config_from_dict(PipelineConfig, {**values, "environment_args": {"answer_attempts": 2}}),
                    tmp_path / "run")
