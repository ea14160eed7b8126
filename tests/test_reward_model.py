"""Reward modelling and preference data: pair loading, held-out pairwise accuracy against a hand computation on a
fixed micro model, two real RewardTrainer steps, the trained model as a batched deterministic GRPO reward
(``reward_model(path=...)`` and ``rm:PATH``), GRPO training with it, and ``preferences`` writing best-vs-worst pairs."""

from __future__ import annotations

import json
import math
import re
import sys
import textwrap
from pathlib import Path

import pytest

from agentic_rl.config import config_from_dict
from agentic_rl.errors import ConfigError, DataError


def _conv_pairs(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        prompt = [{"role": "user", "content": f"What is {i} + {i + 2}?"}]
        rows.append({"prompt": prompt,
                     "chosen": [{"role": "assistant",
                                 "content": f"{i} + {i + 2} = {2 * i + 2}\nFinal Answer: {2 * i + 2}"}],
                     "rejected": [{"role": "assistant", "content": f"Final Answer: {i}"}],
                     "chosen_score": 1.0, "rejected_score": 0.0})
    return rows


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------------------------------------------------------
# Pair loading (no model)
# ---------------------------------------------------------------------------------------------------------------

def test_pairs_load_in_text_and_conversational_form_and_bad_rows_name_the_line(tmp_path):
    from agentic_rl.train.reward_model import load_pairs

    rows, conversational = load_pairs(str(_write_jsonl(tmp_path / "c.jsonl", _conv_pairs(3))))
    assert conversational and set(rows[0]) == {"prompt", "chosen", "rejected"}  # score columns dropped
    text = [{"prompt": "Q: 1+1?", "chosen": " 2", "rejected": " 3"}]
    rows, conversational = load_pairs(str(_write_jsonl(tmp_path / "t.jsonl", text)))
    assert not conversational and rows == text
    implicit = [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} for r in _conv_pairs(2)]
    rows, conversational = load_pairs(str(_write_jsonl(tmp_path / "i.jsonl", implicit)))
    assert conversational and "prompt" not in rows[0]
    mixed = _conv_pairs(2)
    mixed[1]["rejected"] = "Final Answer: 3"
    with pytest.raises(DataError, match=r"line 2: 'rejected' must be a message list"):
        load_pairs(str(_write_jsonl(tmp_path / "m.jsonl", mixed)))
    with pytest.raises(DataError, match=r"line 1: a preference pair needs 'chosen' and 'rejected'"):
        load_pairs(str(_write_jsonl(tmp_path / "x.jsonl", [{"prompt": "a", "chosen": "b"}])))
    with pytest.raises(DataError, match="no such file"):
        load_pairs(str(tmp_path / "missing.jsonl"))


def test_config_rejects_bad_values_with_the_fix():
    from agentic_rl.train.reward_model import RewardModelConfig

    with pytest.raises(ConfigError, match=r"^heldout_fraction must be in \[0, 0.5\], got 0.7$"):
        RewardModelConfig(model="m", dataset="d", heldout_fraction=0.7)
    # The shared check_range: each of these was accepted by the hand-written checks.
    for name, value, wanted in [("seed", 2**40, r"in \[0, 4.29497e\+09\]"), ("seed", -1, r"in \[0, "),
                                ("weight_decay", -1.0, ">= 0"), ("max_grad_norm", -3.0, ">= 0"),
                                ("center_rewards_coefficient", -0.01, ">= 0"), ("learning_rate", float("nan"), "> 0"),
                                ("warmup_ratio", float("inf"), r"in \[0, 1\)")]:
        with pytest.raises(ConfigError, match=rf"^{name} must be {wanted}.*, got {re.escape(repr(value))}$"):
            RewardModelConfig(model="m", dataset="d", **{name: value})
    RewardModelConfig(model="m", dataset="d", seed=2**32 - 1, weight_decay=0.0, max_grad_norm=0.0)  # the edges
    with pytest.raises(ConfigError, match="unknown config key 'lora_rank'"):
        config_from_dict(RewardModelConfig, {"model": "m", "lora_rank": 4})


# ---------------------------------------------------------------------------------------------------------------
# Pairwise accuracy: batched scoring against one-sequence-at-a-time forward passes
# ---------------------------------------------------------------------------------------------------------------

def test_pairwise_accuracy_matches_a_hand_computation(tiny_model_dir):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from agentic_rl.rewards.reward_model import render_conversation
    from agentic_rl.train.reward_model import pairwise_accuracy

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_model_dir), num_labels=1).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model.config.pad_token_id = tokenizer.pad_token_id
    pairs = _conv_pairs(5)
    for i in (1, 3):  # two pairs the other way round, so that the untrained head gets some right and some wrong
        pairs[i] = {**pairs[i], "chosen": pairs[i]["rejected"], "rejected": pairs[i]["chosen"]}
    pairs.append({**pairs[0], "rejected": pairs[0]["chosen"]})  # a tie: counts as wrong

    def by_hand(messages):  # one unpadded sequence: the head reads the very last token
        ids = torch.tensor([render_conversation(tokenizer, messages)])
        with torch.no_grad():
            return float(model(input_ids=ids).logits[0, 0])

    chosen = [by_hand(p["prompt"] + p["chosen"]) for p in pairs]
    rejected = [by_hand(p["prompt"] + p["rejected"]) for p in pairs]
    expected = sum(c > r for c, r in zip(chosen, rejected)) / len(pairs)
    got = pairwise_accuracy(model, tokenizer, pairs, batch_size=3)  # batches of mixed lengths: padding is exercised
    assert got["n"] == 6
    assert got["pairwise_accuracy"] == pytest.approx(expected)
    assert 0.0 < expected < 1.0  # a random head: neither all right nor all wrong, so the comparison means something
    assert got["mean_margin"] == pytest.approx(sum(c - r for c, r in zip(chosen, rejected)) / 6, abs=1e-5)
    assert got["mean_chosen"] == pytest.approx(sum(chosen) / 6, abs=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Training, the reward, GRPO with it
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained_rm(tiny_model_dir, tmp_path_factory):
    from agentic_rl.train.reward_model import RewardModelConfig, run

    tmp = tmp_path_factory.mktemp("rm")
    pairs = _write_jsonl(tmp / "pairs.jsonl", _conv_pairs(10))
    cfg = config_from_dict(RewardModelConfig, dict(model=str(tiny_model_dir), dataset=str(pairs),
                                                   output_dir=str(tmp / "run"), max_steps=2, batch_size=4,
                                                   heldout_fraction=0.2, learning_rate=1e-2, report_to="none",
                                                   logging_steps=1))
    return cfg, run(cfg)


def test_reward_model_trains_two_steps_and_reports_held_out_accuracy_of_the_saved_model(trained_rm, tiny_model_dir):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification

    from agentic_rl.train.reward_model import load_pairs, pairwise_accuracy, split_pairs

    cfg, result = trained_rm
    metrics = json.loads((Path(result["run_dir"]) / "metrics.json").read_text())
    assert metrics["global_step"] == 2 and metrics["train_pairs"] == 8 and metrics["heldout_pairs"] == 2
    assert result["model_dir"] == str(Path(result["run_dir"]) / "model") and result["adapter_dir"]
    model = AutoModelForSequenceClassification.from_pretrained(result["model_dir"]).eval()
    assert model.config.num_labels == 1 and model.config.pad_token_id is not None
    from agentic_rl.models.loading import load_tokenizer

    tokenizer = load_tokenizer(result["model_dir"])
    _, heldout = split_pairs(load_pairs(cfg.dataset)[0], cfg)
    again = pairwise_accuracy(model, tokenizer, heldout)
    assert metrics["eval/pairwise_accuracy"] == again["pairwise_accuracy"]
    assert metrics["eval/mean_margin"] == pytest.approx(again["mean_margin"], abs=1e-5)
    # LoRA was merged in: the attention weights moved away from the base model's.
    base = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    merged = load_file(str(Path(result["model_dir"]) / "model.safetensors"))
    key = next(k for k in base if k.endswith("self_attn.q_proj.weight"))
    assert not torch.allclose(base[key], merged[key])


def test_a_finished_reward_model_run_is_kept_unless_overwrite(trained_rm):
    import dataclasses

    from agentic_rl.train.reward_model import run

    cfg, result = trained_rm
    before = (Path(result["model_dir"]) / "model.safetensors").read_bytes()
    with pytest.raises(ConfigError, match="already holds a finished reward-model run"):
        run(dataclasses.replace(cfg, max_steps=1))
    assert (Path(result["model_dir"]) / "model.safetensors").read_bytes() == before


def test_reward_model_reward_is_batched_finite_and_deterministic(trained_rm):
    from agentic_rl.rewards import build_rewards

    _, result = trained_rm
    path = result["model_dir"]
    funcs, weights = build_rewards([f"rm:{path}:0.5", f"reward_model(path={path},batch_size=2)"])
    assert weights == [0.5, 1.0]
    assert [f.__name__ for f in funcs] == ["reward_model", "reward_model_2"]
    prompts = [p["prompt"] for p in _conv_pairs(5)]
    completions = [[{"role": "assistant", "content": f"Final Answer: {i * 7}"}] for i in range(5)]
    scores = funcs[0](completions, prompts=prompts)
    assert len(scores) == 5 and all(isinstance(s, float) and math.isfinite(s) for s in scores)
    assert funcs[0](completions, prompts=prompts) == scores  # deterministic
    assert funcs[1](completions, prompts=prompts) == pytest.approx(scores, abs=1e-5)  # batch size does not matter
    assert len(set(round(s, 6) for s in scores)) > 1  # it tells completions apart


def test_grpo_trains_two_steps_with_the_reward_model(trained_rm, tiny_model_dir, tmp_path):
    from agentic_rl.train.grpo import GRPOConfig, run

    _, rm = trained_rm
    cfg = config_from_dict(GRPOConfig, dict(
        model=str(tiny_model_dir), output_dir=str(tmp_path / "grpo"), max_steps=2, num_generations=2, batch_size=4,
        max_completion_length=6, max_train_samples=8, heldout_every=0, save_steps=2, learning_rate=0.05,
        report_to=["none"], rewards=[f"reward_model(path={rm['model_dir']}):1.0"]))
    result = run(cfg)
    assert result["steps"] == 2
    rows = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    values = [r["grpo/reward/reward_model"] for r in rows if "grpo/reward/reward_model" in r]
    assert len(values) == 2 and all(math.isfinite(v) and v != 0.0 for v in values)


def test_an_adapter_or_a_missing_reward_model_is_a_one_line_error(tmp_path, trained_rm):
    from agentic_rl.rewards import build_rewards

    with pytest.raises(ConfigError, match="not a model directory"):
        build_rewards([f"rm:{tmp_path}"])
    _, result = trained_rm
    with pytest.raises(ConfigError, match="not a model directory"):
        build_rewards([f"rm:{result['adapter_dir']}"])


# ---------------------------------------------------------------------------------------------------------------
# Preference pairs
# ---------------------------------------------------------------------------------------------------------------

JUDGE = '''
def char_judge(completions, **kwargs):
    """A judge with fine-grained scores: the number of distinct characters of the completion."""
    return [float(len(set(c[0]["content"] if isinstance(c, list) else c))) for c in completions]
'''


@pytest.fixture()
def judge_module(tmp_path):
    (tmp_path / "pref_judge.py").write_text(textwrap.dedent(JUDGE))
    sys.path.insert(0, str(tmp_path))
    yield "pref_judge"
    sys.path.remove(str(tmp_path))
    sys.modules.pop("pref_judge", None)


def test_best_and_worst_skip_ties_and_unscorable_samples():
    from agentic_rl.train.preferences import best_and_worst

    assert best_and_worst([0.0, 1.0, 0.0, 1.0], 0.0) == (1, 0)
    assert best_and_worst([1.0, 1.0, 1.0], 0.0) is None
    assert best_and_worst([0.2, 0.5], 0.3) is None  # margin 0.3 is not more than min_margin
    assert best_and_worst([math.nan, 0.5, 0.1], 0.0) == (1, 2)
    assert best_and_worst([math.nan, 0.5], 0.0) is None


def test_preferences_writes_pairs_whose_chosen_outscores_rejected(tiny_model_dir, tmp_path, judge_module):
    from agentic_rl.train.preferences import PreferencesConfig, run
    from agentic_rl.train.reward_model import load_pairs

    cfg = config_from_dict(PreferencesConfig, dict(model=str(tiny_model_dir), output_dir=str(tmp_path / "pref"),
                                                   max_samples=4, num_samples=3, max_new_tokens=8,
                                                   judge=[f"{judge_module}:char_judge"], system_prompt=""))
    result = run(cfg)
    pairs = [json.loads(x) for x in Path(result["pairs_path"]).read_text().splitlines()]
    samples = [json.loads(x) for x in (tmp_path / "pref" / "samples.jsonl").read_text().splitlines()]
    stats = result["stats"]
    assert stats["prompts"] == 4 and stats["samples"] == 12 == len(samples)
    assert len(pairs) == stats["pairs"] >= 1 and stats["pairs"] + stats["skipped_ties"] == 4
    for pair in pairs:
        chosen, rejected = pair["chosen"][0]["content"], pair["rejected"][0]["content"]
        assert pair["chosen_score"] > pair["rejected_score"]
        assert pair["chosen_score"] == len(set(chosen)) and pair["rejected_score"] == len(set(rejected))
        mine = [s["score"] for s in samples if s["question"] == pair["question"]]
        assert pair["chosen_score"] == max(mine) and pair["rejected_score"] == min(mine)
        assert pair["prompt"][-1] == {"role": "user", "content": pair["question"]}
    rows, conversational = load_pairs(result["pairs_path"])  # what the reward-model stage trains on
    assert conversational and len(rows) == len(pairs)


def test_preferences_config_needs_two_samples_and_sampling():
    from agentic_rl.train.preferences import PreferencesConfig

    with pytest.raises(ConfigError, match="^num_samples must be >= 2, got 1$"):
        PreferencesConfig(model="m", num_samples=1)
    with pytest.raises(ConfigError, match="^temperature must be > 0, got 0.0$"):
        PreferencesConfig(model="m", temperature=0.0)
