"""Learning from every GRPO step: group selection and re-padding, zero-variance refill on a real trainer, the SFT
anchor loss, and difficulty selection."""

from __future__ import annotations

import pytest
import torch

from agentic_rl.train.signal import (concat_batches, group_has_signal, pass_rate_histogram, select_by_pass_rate,
                                     select_groups)


def _batch(prompt_widths, completion_widths, advantages, pad=0):
    b = len(prompt_widths)
    pw, cw = max(prompt_widths), max(completion_widths)
    prompt_ids = torch.full((b, pw), pad)
    prompt_mask = torch.zeros((b, pw), dtype=torch.long)
    completion_ids = torch.full((b, cw), pad)
    completion_mask = torch.zeros((b, cw), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_widths, completion_widths)):
        prompt_ids[i, pw - p:] = 100 + i
        prompt_mask[i, pw - p:] = 1
        completion_ids[i, :c] = 200 + i
        completion_mask[i, :c] = 1
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": torch.tensor(advantages, dtype=torch.float),
            "old_per_token_logps": completion_mask.float() * -1.0, "num_items_in_batch": completion_mask.sum()}


def test_groups_with_tied_rewards_have_no_signal_and_whole_groups_are_selected():
    adv = torch.tensor([0.0, 0.0, 1.0, -1.0, 0.0, 0.0])
    assert group_has_signal(adv, 2).tolist() == [False, True, False]
    batch = _batch([2, 2, 3, 3, 1, 1], [1, 2, 3, 4, 1, 1], adv.tolist())
    picked = select_groups(batch, torch.tensor([1]), 2)
    assert picked["completion_ids"][:, 0].tolist() == [202, 203]
    assert picked["advantages"].tolist() == [1.0, -1.0]


def test_concatenated_batches_keep_left_padded_prompts_and_right_padded_completions():
    a = _batch([2, 2], [1, 2], [1.0, -1.0])
    b = _batch([4, 3], [5, 3], [0.5, -0.5], pad=0)
    out = concat_batches([a, b], pad_token_id=0)
    assert out["prompt_ids"].shape == (4, 4) and out["completion_ids"].shape == (4, 5)
    # The short prompts gained pads on the LEFT, the short completions on the RIGHT.
    assert out["prompt_ids"][0].tolist() == [0, 0, 100, 100]
    assert out["prompt_mask"][0].tolist() == [0, 0, 1, 1]
    assert out["completion_ids"][1].tolist() == [201, 201, 0, 0, 0]
    assert out["old_per_token_logps"][1].tolist() == [-1.0, -1.0, 0.0, 0.0, 0.0]
    assert out["num_items_in_batch"].item() == 1 + 2 + 5 + 3
    assert out["advantages"].tolist() == [1.0, -1.0, 0.5, -0.5]


def test_concatenated_batches_join_per_row_lists_and_keep_other_values_of_the_first_part():
    a = {**_batch([2, 2], [1, 2], [1.0, -1.0]), "tags": ["a0", "a1"], "note": "first", "group": [7]}
    b = {**_batch([4, 3], [5, 3], [0.5, -0.5], pad=0), "tags": ["b0", "b1"], "note": "second", "group": [8]}
    out = concat_batches([a, b], pad_token_id=0)
    assert out["tags"] == ["a0", "a1", "b0", "b1"]  # one entry per row: joined in row order
    assert out["note"] == "first" and out["group"] == [7]  # not per row: the first part's


def test_difficulty_band_and_histogram():
    rows = [{"q": i} for i in range(5)]
    kept = select_by_pass_rate(rows, [0.0, 0.25, 0.5, 1.0, 0.75], 0.1, 0.9)
    assert [r["q"] for r in kept] == [1, 2, 4] and all(0.1 <= r["pass_rate"] <= 0.9 for r in kept)
    assert pass_rate_histogram([0.0, 0.25, 0.25, 1.0], 4) == {"0/4": 1, "1/4": 2, "2/4": 0, "3/4": 0, "4/4": 1}


# --- a real trainer on the tiny model ---------------------------------------------------------------------------

TIED = "tied"


def _reward(completions, question, **_):
    """Every completion of a 'tied' question scores 0 (no signal); the others alternate 0/1 within the group."""
    return [0.0 if TIED in q else float(i % 2) for i, q in enumerate(question)]


def _trainer(tiny_model_dir, tmp_path, args_extra=None, **extra):
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from agentic_rl.data.formats import build_prompt
    from agentic_rl.train.grpo_trainer import SignalGRPOTrainer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    questions = [f"{TIED} {i}" for i in range(4)] + [f"varied {i}" for i in range(4)]
    ds = datasets.Dataset.from_list([{"question": q, "prompt": build_prompt(q, None), "ground_truth": "1"}
                                     for q in questions])
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=2,
                      max_completion_length=4, report_to="none", max_steps=1, logging_steps=1,
                      save_strategy="no", disable_dropout=True, remove_unused_columns=False,
                      # fp32: bf16 matmuls round by batch shape on some CPUs (oneDNN's AMX kernels), and the tests
                      # compare a loss pass over some rows with one over all of them to fp32 precision.
                      **{"beta": 0.0, "bf16": False, "per_device_train_batch_size": 4, **(args_extra or {})})
    trainer = SignalGRPOTrainer(model=model, reward_funcs=[_reward], args=args, train_dataset=ds,
                                processing_class=tok, **extra)
    return trainer, ds


def test_refill_replaces_tied_groups_with_groups_that_have_signal(tiny_model_dir, tmp_path):
    trainer, ds = _trainer(tiny_model_dir, tmp_path, refill_max_draws=8)
    trainer.model.train()
    tied = [dict(ds[i]) for i in (0, 0, 1, 1)]  # two groups of two, both tied
    batch = trainer._generate_and_score_completions(tied)
    assert batch["advantages"].shape == (4,)
    assert group_has_signal(batch["advantages"], 2).all()
    metrics = trainer._metrics["train"]
    assert metrics["signal/dropped_group_fraction"] == [1.0]
    assert metrics["signal/final_zero_std_fraction"] == [0.0]
    assert metrics["signal/refill_draws"][0] >= 1
    assert batch["num_items_in_batch"].item() == batch["completion_mask"].sum().item()


def test_without_refill_tied_groups_stay(tiny_model_dir, tmp_path):
    trainer, ds = _trainer(tiny_model_dir, tmp_path, refill_max_draws=0)
    trainer.model.train()
    batch = trainer._generate_and_score_completions([dict(ds[i]) for i in (0, 0, 1, 1)])
    assert not group_has_signal(batch["advantages"], 2).any()


@pytest.mark.parametrize("scale_rewards", ["batch", "group"])
def test_zero_std_fraction_counts_tied_groups_whatever_the_rewards_are_scaled_by(tiny_model_dir, tmp_path,
                                                                                 scale_rewards):
    trainer, ds = _trainer(tiny_model_dir, tmp_path, refill_max_draws=0, args_extra={"scale_rewards": scale_rewards})
    trainer.model.train()
    batch = trainer._generate_and_score_completions([dict(ds[i]) for i in (0, 0, 4, 4)])
    assert group_has_signal(batch["advantages"], 2).tolist() == [False, True]
    assert trainer._metrics["train"]["frac_reward_zero_std"] == [0.5]


def test_refill_gives_up_after_its_draws_and_keeps_the_batch_shape(tiny_model_dir, tmp_path):
    trainer, ds = _trainer(tiny_model_dir, tmp_path, refill_max_draws=2)
    trainer.train_dataset = ds.select(range(4))  # only tied questions to draw from
    trainer.model.train()
    batch = trainer._generate_and_score_completions([dict(ds[i]) for i in (0, 0, 1, 1)])
    assert batch["advantages"].shape == (4,)
    assert trainer._metrics["train"]["signal/refill_draws"] == [2.0]
    assert trainer._metrics["train"]["signal/final_zero_std_fraction"] == [1.0]


def test_sft_anchor_adds_the_weighted_demonstration_loss(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from agentic_rl.data.formats import build_prompt, completion_message, render_prompt
    from agentic_rl.train.signal import tokenize_demonstrations

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = build_prompt("2 + 3?", None)
    demos = tokenize_demonstrations(tok, [{"prompt": prompt,
                                           "completion": completion_message("2 + 3 = 5\nFinal Answer: 5")}], 64)
    n_prompt = len(tok(render_prompt(tok, prompt), add_special_tokens=False)["input_ids"])
    assert len(demos) == 1 and n_prompt < len(demos[0][0])
    ids, labels = demos[0]
    assert labels == [-100] * n_prompt + ids[n_prompt:]  # the loss on the completion only
    trainer, ds = _trainer(tiny_model_dir, tmp_path, sft_loss_weight=0.5, sft_demonstrations=demos)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2  # set by the training loop; compute_loss reads it
    batch = trainer._generate_and_score_completions([dict(ds[i]) for i in (4, 4, 5, 5)])
    with_anchor = trainer.compute_loss(trainer.model, batch).item()
    trainer.sft_loss_weight = 0.0
    plain = trainer.compute_loss(trainer.model, batch).item()
    nll = trainer._metrics["train"]["signal/sft_loss"][0]
    assert nll > 0
    # Scaled for gradient accumulation like TRL's own loss: the weight means the same at any accumulation.
    assert with_anchor == pytest.approx(plain + 0.5 * nll / 2, rel=1e-5)
    # The logged NLL is the demonstration's loss on its labelled tokens.
    trainer.sft_demonstrations = demos
    assert trainer._demonstration_loss(trainer.model, 1).item() == pytest.approx(nll, rel=1e-5)
    # Only the labelled tokens count: one labelled token gives that token's own NLL.
    trainer.sft_demonstrations = [(ids, [-100] * n_prompt + [ids[n_prompt]] + [-100] * (len(ids) - n_prompt - 1))]
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([ids])).logits[0]
    first = -torch.log_softmax(logits[n_prompt - 1].float(), dim=-1)[ids[n_prompt]].item()
    assert trainer._demonstration_loss(trainer.model, 1).item() == pytest.approx(first, rel=1e-5)


def test_tied_failures_get_the_batch_normalised_advantage_of_their_reward():
    from agentic_rl.train.signal import tied_failure_advantages

    rewards = torch.tensor([1.1, 1.1, 0.2, 0.2, 1.2, 0.2, 0.0, 0.0, 0.0, 0.0])
    correct = torch.tensor([1, 1, 0, 0, 1, 0, 0, 0, 1, 1], dtype=torch.bool)
    # Batch mean 0.4, unbiased std 0.51424 (squared deviations summing to 2.38, over 9).
    out = tied_failure_advantages(rewards, correct, 2, 0.5, scale=True)
    # Only the groups that tie and all fail (the 2nd and 4th) move: 0.5 * (r - 0.4) / (0.51424 + 1e-4).
    expected = [0.0, 0.0, -0.19443, -0.19443, 0.0, 0.0, -0.38885, -0.38885, 0.0, 0.0]
    assert out.tolist() == pytest.approx(expected, abs=1e-4)
    # Correct episodes that tie (the 1st and the last group) never move, whatever their reward; without scaling the
    # advantage is the reward minus the batch mean.
    assert tied_failure_advantages(rewards, correct, 2, 1.0, scale=False).tolist() == pytest.approx(
        [0.0, 0.0, -0.2, -0.2, 0.0, 0.0, -0.4, -0.4, 0.0, 0.0], abs=1e-6)
    # A failing group above the batch's mean (1.7 / 6: its calls earned more than most episodes) is not reinforced.
    low = torch.tensor([0.3, 0.3, 0.0, 0.0, 0.0, 1.1])
    assert tied_failure_advantages(low, torch.tensor([0, 0, 0, 0, 0, 1], dtype=torch.bool), 2, 1.0,
                                   scale=False).tolist() == pytest.approx([0.0, 0.0, -0.28333, -0.28333, 0.0, 0.0],
                                                                          abs=1e-4)


def test_a_failure_every_sample_repeats_is_pushed_down(tiny_model_dir, tmp_path):
    trainer, ds = _trainer(tiny_model_dir, tmp_path, tied_failure_weight=0.5, skip_zero_advantage_rows=True,
                           args_extra={"scale_rewards": "batch", "per_device_train_batch_size": 6})
    trainer.model.train()
    rows = [{**dict(ds[i]), "correct": correct} for i, correct in
            ((0, False), (0, False), (1, True), (1, True), (4, False), (4, True))]
    batch = trainer._generate_and_score_completions(rows)
    # Rewards [0, 0, 0, 0, 0, 1]: batch mean 1/6, unbiased std 0.40825. The tied failing group gets
    # 0.5 * (0 - 1/6) / (0.40825 + 1e-4); the tied correct group stays at zero; the varied group keeps TRL's
    # (r - group mean) / batch std = -+0.5 / (0.40825 + 1e-4).
    expected = [-0.20408, -0.20408, 0.0, 0.0, -1.22444, 1.22444]
    assert batch["advantages"].tolist() == pytest.approx(expected, abs=1e-4)
    assert trainer._metrics["train"]["signal/tied_failure_fraction"] == [pytest.approx(2 / 6)]
    # The completion log holds the advantages trained on.
    from agentic_rl.train.monitoring import trl_generation_log

    assert list(trl_generation_log(trainer)["advantages"])[-6:] == pytest.approx(expected, abs=1e-4)
    # The pushed-down rows are in the loss pass; the tied correct ones are left out.
    kept = trainer.rows_with_signal(batch)
    assert kept["advantages"].tolist() == pytest.approx([-0.20408, -0.20408, -1.22444, 1.22444], abs=1e-4)


def test_without_the_episodes_correctness_the_push_down_stops_with_a_message(tiny_model_dir, tmp_path):
    trainer, ds = _trainer(tiny_model_dir, tmp_path, tied_failure_weight=0.5)
    trainer.model.train()
    with pytest.raises(RuntimeError, match="rollout field 'correct' did not reach"):
        trainer._generate_and_score_completions([dict(ds[i]) for i in (0, 0, 4, 4)])


def test_estimated_pass_rates_of_an_untrained_model_are_zero(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentic_rl.data.formats import build_prompt
    from agentic_rl.train.signal import estimate_pass_rates

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    rows = [{"prompt": build_prompt(f"{i} + 1?", None), "ground_truth": str(i + 1)} for i in range(3)]
    rates = estimate_pass_rates(model, tok, rows, samples=2, temperature=1.0, max_new_tokens=4)
    assert rates == [0.0, 0.0, 0.0]


# --- the loss pass without the completions that carry no signal --------------------------------------------------

def _loss_and_grads(trainer, batch):
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}


def _rows_scored(trainer, monkeypatch):
    """The rows each training forward pass scores, recorded."""
    seen = []
    score = type(trainer)._get_per_token_logps_and_entropies

    def counting(self, model, input_ids, *args, **kwargs):
        seen.append(input_ids.shape[0])
        return score(self, model, input_ids, *args, **kwargs)

    monkeypatch.setattr(type(trainer), "_get_per_token_logps_and_entropies", counting)
    return seen


def test_the_loss_pass_skips_tied_completions_with_the_same_loss_and_gradient(tiny_model_dir, tmp_path, monkeypatch):
    trainer, ds = _trainer(tiny_model_dir, tmp_path, skip_zero_advantage_rows=True)
    assert trainer.skips_zero_advantage_rows
    # Eager attention: torch's SDPA takes another kernel for a batch without padding (the kept rows here), which
    # moves the gradient by more than the exact comparison allows; eager attention computes both alike.
    trainer.model.set_attn_implementation("eager")
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer._generate_and_score_completions([dict(ds[i]) for i in (0, 0, 4, 4)])
    assert batch["advantages"][:2].abs().sum() == 0 and batch["advantages"][2:].abs().sum() > 0
    seen = _rows_scored(trainer, monkeypatch)
    skipped_loss, skipped_grads = _loss_and_grads(trainer, batch)
    trainer.skips_zero_advantage_rows = False
    whole_loss, whole_grads = _loss_and_grads(trainer, batch)
    assert seen == [2, 4]  # the tied group left out of the first pass only
    assert trainer._metrics["train"]["signal/skipped_row_fraction"] == [0.5]
    assert skipped_loss == pytest.approx(whole_loss, rel=1e-6, abs=1e-9) and whole_loss != 0
    assert skipped_grads.keys() == whole_grads.keys() and skipped_grads
    for name, grad in whole_grads.items():
        torch.testing.assert_close(skipped_grads[name], grad, rtol=1e-5, atol=1e-8, msg=name)


def test_an_all_tied_micro_batch_keeps_one_row_and_a_zero_loss(tiny_model_dir, tmp_path, monkeypatch):
    trainer, ds = _trainer(tiny_model_dir, tmp_path, skip_zero_advantage_rows=True)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer._generate_and_score_completions([dict(ds[i]) for i in (0, 0, 1, 1)])
    seen = _rows_scored(trainer, monkeypatch)
    loss, grads = _loss_and_grads(trainer, batch)
    assert seen == [1] and loss == 0.0
    assert all(float(g.abs().max()) == 0.0 for g in grads.values())


@pytest.mark.parametrize("setting", [{"beta": 0.1}, {"loss_type": "grpo"}, {"loss_type": "bnpo"},
                                     {"top_entropy_quantile": 0.5}])
def test_tied_completions_stay_in_the_pass_where_they_change_the_loss(tiny_model_dir, tmp_path, setting):
    # The KL term of a tied completion, or a loss that averages over rows or over the micro-batch's tokens, or an
    # entropy mask taken over the batch: leaving the row out would change the update.
    trainer, _ = _trainer(tiny_model_dir, tmp_path, skip_zero_advantage_rows=True, args_extra=setting)
    assert not trainer.skips_zero_advantage_rows

