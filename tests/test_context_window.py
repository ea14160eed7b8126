"""Environments with a context window: a turn is generated from the prompt and the latest turns only; SFT learns each
turn in that context, and GRPO's log-prob passes score each turn in it (train/logprobs.py FoldedContextScoring)."""

from __future__ import annotations

import pytest
import torch
from test_token_in_token_out import ROWS, SCRIPTS

from agentic_rl.agent import rollout as rollout_mod
from agentic_rl.agent.calculator_env import CalculatorEnv
from agentic_rl.agent.rollout import (RolloutSettings, context_start, context_views, encode_episode_turns,
                                      run_episodes)
from agentic_rl.agent.tasks import agent_rows, environment_examples, view_examples
from agentic_rl.agent.tool_format import ChatFormat
from agentic_rl.errors import ConfigError


class WindowedCalculator(CalculatorEnv):
    def __init__(self, window, **kwargs):
        super().__init__(**kwargs)
        self.context_window = window


@pytest.fixture(scope="module")
def tokenizer():
    from agentic_rl.data.synthetic import default_tokenizer_corpus
    from agentic_rl.models.tiny import train_tokenizer

    return train_tokenizer(default_tokenizer_corpus(300, seed=0), vocab_size=400)


def play(tokenizer, monkeypatch, window):
    """The scripted episodes of test_token_in_token_out, in environments with ``window``: the trajectories and, per
    episode, the contexts the policy was given."""
    fmt = ChatFormat(tokenizer, {"enable_thinking": False})
    seen: list[list[list[int]]] = [[], []]

    def generate_batch(model, contexts, **kwargs):
        active = [e for e in range(len(SCRIPTS)) if len(SCRIPTS[e]) > len(seen[e])]
        out = []
        for episode, context in zip(active, contexts):
            seen[episode].append(list(context))
            out.append(fmt.encode(SCRIPTS[episode][len(seen[episode]) - 1]) + [fmt.end_of_turn_id])
        return out

    monkeypatch.setattr(rollout_mod, "generate_batch", generate_batch)
    tasks = agent_rows(ROWS)
    envs = [WindowedCalculator(window), WindowedCalculator(window)]
    trajectories = run_episodes(None, tokenizer, envs, tasks, [t["prompt"] for t in tasks],
                                RolloutSettings(max_turn_tokens=64, max_completion_length=600), fmt)
    return trajectories, seen


def test_context_start_counts_the_latest_turns():
    spans = [(0, 5), (9, 14), (20, 26), (30, 33)]
    assert [context_start(spans, turn, None) for turn in range(4)] == [0, 0, 0, 0]
    assert [context_start(spans, turn, 1) for turn in range(4)] == [0, 0, 9, 20]
    assert [context_start(spans, turn, 2) for turn in range(4)] == [0, 0, 0, 9]
    assert context_views(spans, [0, 0, 9, 20]) == [(0, 14, [0, 1]), (9, 26, [2]), (20, 33, [3])]


def test_a_turn_is_generated_from_the_prompt_and_the_latest_turns_only(tokenizer, monkeypatch):
    full, full_seen = play(tokenizer, monkeypatch, None)
    folded, seen = play(tokenizer, monkeypatch, 1)
    long = folded[0]  # three turns: the third one's context has lost the first turn and its tool result
    assert long.completion_ids == full[0].completion_ids and long.correct  # the same episode was played
    assert long.context_starts == [0, 0, long.turn_spans[1][0]] and long.turn_spans[1][0] > 0
    for turn, context in enumerate(seen[0]):
        end = long.turn_spans[turn][0]  # the context ends where the turn's tokens begin
        assert context == long.prompt_ids + long.completion_ids[long.context_starts[turn]:end]
    assert seen[0][:2] == full_seen[0][:2] and len(seen[0][2]) < len(full_seen[0][2])
    dropped = tokenizer.decode(long.completion_ids[:long.turn_spans[1][0]])
    assert "23*47" in dropped and "23*47" not in tokenizer.decode(seen[0][2][len(long.prompt_ids):])
    assert seen[1] == full_seen[1]  # two turns: the window of one turn drops nothing
    assert folded[1].context_starts == [0, 0]


def test_a_context_window_must_be_a_positive_integer(tokenizer, monkeypatch):
    for window in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="context_window"):
            play(tokenizer, monkeypatch, window)


def test_sft_learns_each_turn_in_the_context_it_will_be_generated_in(tokenizer):
    fmt = ChatFormat(tokenizer, {"enable_thinking": False})
    env = WindowedCalculator(1)
    task = agent_rows(ROWS)[0]
    prompt_ids, completion, mask, spans = encode_episode_turns(fmt, task["prompt"], env.demonstration(task),
                                                               [t.schema for t in env.tools])
    assert len(spans) == 3
    examples = view_examples(prompt_ids, completion, mask, spans, 1)
    assert len(examples) == 2  # turns 0 and 1 share the whole context; turn 2 sees turn 1 onwards
    first, second = examples
    assert first["input_ids"] == prompt_ids + completion[:spans[1][1]]
    assert second["input_ids"] == prompt_ids + completion[spans[1][0]:spans[2][1]]
    labelled_first = [i - len(prompt_ids) for i, label in enumerate(first["labels"]) if label != -100]
    assert labelled_first == [i for turn in (0, 1) for i in range(*spans[turn])]
    labelled_second = [i - len(prompt_ids) + spans[1][0] for i, label in enumerate(second["labels"]) if label != -100]
    assert labelled_second == list(range(*spans[2]))  # turn 1 is context here, learnt in the first view
    assert all(label == tok for example in examples for tok, label in zip(example["input_ids"], example["labels"])
               if label != -100)
    # without a window: the one example of the whole episode, as before
    whole, = view_examples(prompt_ids, completion, mask, spans, None)
    assert whole["input_ids"] == prompt_ids + completion
    assert environment_examples(tokenizer, env, [task]) == examples


# --- GRPO's log-prob passes ----------------------------------------------------------------------------------------

def _scorer(rows_per_chunk):
    from types import SimpleNamespace

    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from agentic_rl.train.grpo_trainer import SignalGRPOTrainer

    scorer = object.__new__(SignalGRPOTrainer)
    AcceleratorState._reset_state(reset_partial_state=True)
    scorer.accelerator = Accelerator(cpu=True, mixed_precision="no")
    scorer.logprob_chunk_rows = rows_per_chunk
    scorer.processing_class = SimpleNamespace(pad_token_id=0)
    return scorer


#: Two episodes: (prompt length, completion length, turn spans, context starts). The first was played with a window
#: of one turn (its third turn saw the second one onwards), the second without one.
EPISODES = [(4, 14, [(0, 3), (5, 8), (11, 14)], [0, 0, 5]),
            (6, 9, [(0, 2), (4, 9)], [0, 0])]


@pytest.mark.parametrize("rows_per_chunk", [0, 1])
def test_each_turn_is_scored_in_the_context_it_was_sampled_in(tiny_model_dir, rows_per_chunk):
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from agentic_rl.train.logprobs import turn_contexts_rows, turn_contexts_tensor

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    width_p, width_c = max(p for p, *_ in EPISODES), max(c for _, c, *_ in EPISODES)
    generator = torch.Generator().manual_seed(1)
    ids = torch.zeros((2, width_p + width_c), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (p, c, _, _) in enumerate(EPISODES):
        ids[row, width_p - p:width_p + c] = torch.randint(3, model.config.vocab_size, (p + c,), generator=generator)
        mask[row, width_p - p:width_p + c] = 1
    contexts = [(starts, spans) for _, _, spans, starts in EPISODES]
    assert turn_contexts_rows(turn_contexts_tensor(contexts)) == contexts
    scorer = _scorer(rows_per_chunk)
    with scorer.contexts_of({"turn_contexts": turn_contexts_tensor(contexts)}):
        logps, entropies, _ = scorer._get_per_token_logps_and_entropies(model, ids, mask, width_c,
                                                                          compute_entropy=True)
    assert scorer._scoring_contexts is None  # only while open

    plain = _scorer(0)
    for row, (p, c, spans, starts) in enumerate(EPISODES):
        prompt = ids[row, width_p - p:width_p]
        completion = ids[row, width_p:width_p + c]
        scored = torch.zeros(c, dtype=torch.bool)
        for (begin, end), start in zip(spans, starts):
            # the reference: TRL's pass over exactly the context the turn was sampled in, no padding
            context = torch.cat([prompt, completion[start:end]]).unsqueeze(0)
            expected, expected_entropy, _ = plain._get_per_token_logps_and_entropies(
                model, context, torch.ones_like(context), end - start, compute_entropy=True)
            torch.testing.assert_close(logps[row, begin:end], expected[0, begin - start:], atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(entropies[row, begin:end], expected_entropy[0, begin - start:], atol=2e-5,
                                       rtol=1e-5)
            scored[begin:end] = True
        assert (logps[row, :c][~scored] == 0).all()  # tool tokens: no log-prob
    # the folded turn differs from what the whole sequence would give it: the window mattered
    whole, _, _ = plain._get_per_token_logps_and_entropies(model, ids, mask, width_c)
    assert not torch.allclose(logps[0, 11:14], whole[0, 11:14], atol=1e-4)
    torch.testing.assert_close(logps[1, :9] * (torch.arange(9) < 2).logical_or(torch.arange(9) >= 4),
                               whole[1, :9] * (torch.arange(9) < 2).logical_or(torch.arange(9) >= 4),
                               atol=2e-5, rtol=1e-5)
    # gradients reach the policy through every turn's view
    model.zero_grad()
    with scorer.contexts_of({"turn_contexts": turn_contexts_tensor(contexts)}):
        logps, _, _ = scorer._get_per_token_logps_and_entropies(model, ids, mask, width_c)
    logps[0, 11:14].sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_refilled_batches_pad_missing_turns_as_absent():
    from agentic_rl.train.logprobs import turn_contexts_rows, turn_contexts_tensor
    from agentic_rl.train.signal import concat_batches

    one = {"advantages": torch.zeros(1), "completion_mask": torch.ones((1, 3)),
           "turn_contexts": turn_contexts_tensor([([0], [(0, 3)])])}
    two = {"advantages": torch.zeros(1), "completion_mask": torch.ones((1, 9)),
           "turn_contexts": turn_contexts_tensor([([0, 0, 4], [(0, 2), (4, 6), (8, 9)])])}
    joined = concat_batches([one, two], pad_token_id=0)
    assert turn_contexts_rows(joined["turn_contexts"]) == [([0], [(0, 3)]), ([0, 0, 4], [(0, 2), (4, 6), (8, 9)])]


class ThreeEventLog:
    """Every episode lasts three turns (two events, then an answer), whatever the policy writes; the context window
    is one turn, so the third turn is generated without the first. The reward varies with what was written."""

    context_window = 1
    max_turns = 3
    tools: list = []
    tools_enabled = True
    system_prompt = None

    def reset(self, task):
        self.turn = 0

    def step(self, text):
        from agentic_rl.agent.env import StepResult

        self.turn += 1
        if self.turn < 3:
            return StepResult([{"role": "user", "content": f"event {self.turn}"}], 0.0, False, {})
        return StepResult([], float(len(text) % 2), True, {"correct": len(text) % 2 == 1})

    def tool_schemas(self):
        return []

    def episode_metrics(self):
        return {}


def test_grpo_scores_episodes_with_a_context_window_in_their_views(tiny_model_dir, tmp_path, monkeypatch):
    from conftest import grpo_config

    from agentic_rl.train.grpo import run as grpo

    views = []
    original = rollout_mod.context_views

    def recording(spans, starts):
        views.append(list(starts))
        return original(spans, starts)

    monkeypatch.setattr(rollout_mod, "context_views", recording)
    result = grpo(grpo_config(tiny_model_dir, tmp_path / "grpo", environment=f"{__name__}:ThreeEventLog",
                              max_completion_length=160, max_turn_tokens=6, beta=0.1))
    assert result["steps"] == 2 and (tmp_path / "grpo" / "model" / "model.safetensors").is_file()
    folded = [starts for starts in views if len(starts) == 3]
    assert folded and all(starts[:2] == [0, 0] and starts[2] > 0 for starts in folded)
    # per step: the reference model's pass (beta > 0) and the loss's, each over the batch's 4 episodes
    assert len(folded) >= 2 * 2 * 4
