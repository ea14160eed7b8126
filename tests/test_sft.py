"""SFT with LoRA / full fine-tuning, resume, the Qwen3-shape stand-in, and the health monitor."""

from __future__ import annotations

import pytest
import torch
from conftest import read_jsonl, sft_config
from safetensors.torch import load_file
from transformers import TrainerCallback

from agentic_rl.config import config_from_args, load_config
from agentic_rl.errors import ConfigError
from agentic_rl.train.monitoring import HealthMonitor, default_rules, grad_explosion, metric_rising, resolve_report_to
from agentic_rl.train.sft import (SFTConfig, build_sft_dataset, length_bucketed_order, length_sorted_steps,
                                  prepare_model, rows_reached, run, sft_trainer, trainer_arguments)

FAST = dict(max_train_samples=48, synthetic_test_size=20, batch_size=8, logging_steps=1,
            report_to="none", max_length=256)


def completion_loss(model_dir, rows) -> float:
    """Mean loss over the completion tokens of ``rows`` (prompt tokens masked), as SFT optimises it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total, count = 0.0, 0
    for row in rows:
        p = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, return_dict=False)
        full = tok.apply_chat_template(row["prompt"] + row["completion"], return_dict=False)
        labels = torch.tensor([[-100] * len(p) + full[len(p):]])
        with torch.no_grad():
            out = model(torch.tensor([full]), labels=labels)
        n = len(full) - len(p)
        total += out.loss.item() * n
        count += n
    return total / count


class StopAt(TrainerCallback):
    """Interrupts training like Ctrl-C after ``step`` optimizer steps."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            raise KeyboardInterrupt


class CountSteps(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def test_lora_sft_lowers_loss_and_changes_only_adapter_weights(tiny_model_dir, tmp_path):
    cfg = sft_config(tiny_model_dir, tmp_path / "run", max_steps=12, learning_rate=1e-2, save_steps=100,
                     **{**FAST, "report_to": "tensorboard"})
    rows = build_sft_dataset(cfg).select(range(16)).to_list()
    before = completion_loss(tiny_model_dir, rows)
    result = run(cfg)
    after = completion_loss(result["model_dir"], rows)
    assert after < before - 0.2, (before, after)  # a random micro model saturates near 5.9 (tiny frozen embeddings)

    m = result["metrics"]
    assert m["global_step"] == 12 and 0 < m["trainable_parameters"] < m["total_parameters"] / 5
    adapter = load_file(f"{result['adapter_dir']}/adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]  # LoRA's B starts at zero: non-zero means trained
    assert len(lora_b) == 2 * 4 and all(v.abs().max() > 0 for v in lora_b)  # 2 layers x q,k,v,o
    # base weights outside the adapted projections are untouched by the merge
    base = load_file(f"{tiny_model_dir}/model.safetensors")
    merged = load_file(f"{result['model_dir']}/model.safetensors")
    assert torch.equal(base["model.layers.0.mlp.up_proj.weight"], merged["model.layers.0.mlp.up_proj.weight"])
    assert not torch.equal(base["model.layers.0.self_attn.q_proj.weight"],
                           merged["model.layers.0.self_attn.q_proj.weight"])
    run_dir = tmp_path / "run"
    assert (run_dir / "config.yaml").is_file() and load_config(SFTConfig, run_dir / "config.yaml") == cfg
    assert any((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    history = read_jsonl(run_dir / "metrics.jsonl")
    assert {"step", "train/loss", "train/grad_norm", "train/learning_rate"} <= set(history[0])
    # the seed's schedule: linear warm-up over 10 % of the steps, then linear decay towards 0
    lrs = [h["train/learning_rate"] for h in history if "train/learning_rate" in h]
    peak = lrs.index(max(lrs))
    assert max(lrs) == pytest.approx(1e-2) and peak <= 2 and lrs[:peak + 1] == sorted(lrs[:peak + 1])
    assert lrs[peak:] == sorted(lrs[peak:], reverse=True) and lrs[-1] <= 0.1 * max(lrs) + 1e-12


def test_lora_flag_decides_what_is_trained(tiny_model_dir):
    lora_model, _ = prepare_model(SFTConfig(model=str(tiny_model_dir)))
    trainable = [n for n, p in lora_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-3] for n in trainable} == {"lora_A", "lora_B"}  # ...q_proj.lora_A.default.weight
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "k_proj", "v_proj", "o_proj"}

    mlp_model, _ = prepare_model(SFTConfig(model=str(tiny_model_dir), lora_mlp=True, lora_r=4))
    targets = {n.split(".")[-4] for n, p in mlp_model.named_parameters() if p.requires_grad}
    assert targets == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

    full_model, _ = prepare_model(SFTConfig(model=str(tiny_model_dir), full=True))
    assert all(p.requires_grad for p in full_model.parameters())
    assert not any("lora_" in n for n, _ in full_model.named_parameters())

    with pytest.raises(ConfigError, match="lora_target_modules"):
        prepare_model(SFTConfig(model=str(tiny_model_dir), lora_target_modules=["c_attn"]))


def test_full_run_trains_every_weight(tiny_model_dir, tmp_path):
    result = run(sft_config(tiny_model_dir, tmp_path, full=True, max_steps=2, learning_rate=1e-3, **FAST))
    m = result["metrics"]
    assert m["trainable_parameters"] == m["total_parameters"]
    assert result["adapter_dir"] is None and not (tmp_path / "adapter").exists()
    base = load_file(f"{tiny_model_dir}/model.safetensors")
    merged = load_file(f"{result['model_dir']}/model.safetensors")
    assert not torch.equal(base["model.layers.0.mlp.up_proj.weight"], merged["model.layers.0.mlp.up_proj.weight"])


class KeepTrainingRows(TrainerCallback):
    """Keeps the first rows of the tokenized training set, exactly as the trainer feeds them."""

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.rows = [train_dataloader.dataset[i] for i in range(3)]


def test_same_code_path_on_qwen3_shape_with_thinking_template(qwen3_shape_dir, tmp_path):
    from agentic_rl.data.formats import render_prompt
    from agentic_rl.models.loading import load_model_and_tokenizer

    cfg = sft_config(qwen3_shape_dir, tmp_path, max_steps=2, **FAST)
    kept = KeepTrainingRows()
    result = run(cfg, callbacks=[kept])
    model, tok = load_model_and_tokenizer(result["adapter_dir"], for_training=False)
    # Token alignment under the thinking template: the loss-masked part of each training sequence is exactly the
    # prompt as evaluation renders it (empty think block included), and the trained part is the completion.
    for row, trained in zip(rows_reached(build_sft_dataset(cfg), cfg), kept.rows):
        prompt_ids = tok(render_prompt(tok, row["prompt"]), add_special_tokens=False)["input_ids"]
        labels = list(trained["labels"])  # TRL 1.16 builds them in dataset preparation: -100 where no loss
        start = next(i for i, label in enumerate(labels) if label != -100)
        assert start == len(prompt_ids) and list(trained["input_ids"][:start]) == prompt_ids
        assert labels[start:] == list(trained["input_ids"][start:])
        completion = tok.decode(trained["input_ids"][start:], skip_special_tokens=True)
        assert completion.strip() == row["completion"][0]["content"].strip()
    assert model.config.head_dim == 128 and type(model).__name__ == "Qwen3ForCausalLM"
    enc = tok.apply_chat_template(build_sft_dataset(cfg)[0]["prompt"], add_generation_prompt=True,
                                  enable_thinking=False, return_tensors="pt", return_dict=True)
    assert tok.decode(enc["input_ids"][0]).endswith("<think>\n\n</think>\n\n")
    out = model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert out.shape[1] == enc["input_ids"].shape[1] + 3 or out[0, -1].item() == tok.eos_token_id


def test_only_the_rows_the_steps_reach_are_kept(monkeypatch):
    steps = {**FAST, "max_steps": 3, "batch_size": 4, "gradient_accumulation_steps": 2}  # 24 of the 48 rows
    cfg = SFTConfig(**steps)
    rows = build_sft_dataset(cfg)
    rows = rows.add_column("row", list(range(len(rows))))

    def kept(config):
        return rows_reached(rows, config)["row"]

    picked = kept(cfg)
    assert len(rows) == 48 and len(picked) == 24 and len(set(picked)) == 24
    assert picked == sorted(picked) and picked != list(range(24))  # a random subset, in the data's order
    assert kept(cfg) == picked and kept(SFTConfig(**steps, seed=1)) != picked
    assert kept(SFTConfig(**FAST)) == list(range(48))  # by epochs: every row
    assert kept(SFTConfig(**{**steps, "max_steps": 7})) == list(range(48))  # 56 rows wanted, 48 there
    monkeypatch.setenv("WORLD_SIZE", "2")  # each of 2 processes takes its own rows every step
    assert len(kept(cfg)) == 48


def test_group_by_length_cuts_the_padding_of_the_same_rows(tiny_model_dir, tmp_path):
    def batches(group_by_length):
        # 50 batches of 8: one group sorted by length
        cfg = sft_config(tiny_model_dir, tmp_path, max_steps=50, group_by_length=group_by_length,
                         **{**FAST, "max_train_samples": 400})
        model, tok = prepare_model(cfg)
        trainer = sft_trainer(cfg, model=model, args=trainer_arguments(cfg, tmp_path, ["none"], 1),
                              train_dataset=rows_reached(build_sft_dataset(cfg), cfg), processing_class=tok)
        return [b["attention_mask"] for b in trainer.get_train_dataloader()]

    def padding_share(masks):
        return 1 - sum(m.sum().item() for m in masks) / sum(m.numel() for m in masks)

    def row_lengths(masks):
        return sorted(length for m in masks for length in m.sum(dim=1).tolist())

    shuffled, grouped = batches(False), batches(True)
    assert row_lengths(grouped) == row_lengths(shuffled)  # the same rows, batched differently
    assert padding_share(grouped) < padding_share(shuffled) / 2, (padding_share(grouped), padding_share(shuffled))


def _step_batches(cfg, tmp_path):
    """The per-device batches (their attention masks and row ids) the real trainer's dataloader draws for ``cfg``,
    grouped by optimizer step."""
    model, tok = prepare_model(cfg)
    rows = rows_reached(build_sft_dataset(cfg), cfg)
    trainer = sft_trainer(cfg, model=model, args=trainer_arguments(cfg, tmp_path, ["none"], 1),
                          train_dataset=rows, processing_class=tok)
    passes = list(trainer.get_train_dataloader())
    per_step = trainer.args.gradient_accumulation_steps
    return [passes[i:i + per_step] for i in range(0, len(passes), per_step)]


def test_micro_batches_split_each_step_of_the_same_rows_by_length(tiny_model_dir, tmp_path):
    def steps(micro_batches):
        cfg = sft_config(tiny_model_dir, tmp_path, max_steps=-1, micro_batches=micro_batches,
                         **{**FAST, "max_train_samples": 400, "batch_size": 16})
        return _step_batches(cfg, tmp_path)

    def rows(step):  # each row's token ids: which rows the step trains on, whatever their padding
        return sorted(tuple(ids[m.bool()].tolist())
                      for b in step for ids, m in zip(b["input_ids"], b["attention_mask"]))

    def padding_share(all_steps):
        masks = [b["attention_mask"] for step in all_steps for b in step]
        return 1 - sum(m.sum().item() for m in masks) / sum(m.numel() for m in masks)

    whole, split = steps(1), steps(4)
    assert len(whole) == len(split) == 25 and all(len(step) == 4 and len(step[0]["input_ids"]) == 4 for step in split)
    assert [rows(a) for a in whole] == [rows(b) for b in split]  # every step: the same rows as in random order
    for step in split:  # sorted within the step: each pass's rows are no longer than the next pass's
        lengths = [m.sum(dim=1).tolist() for m in (b["attention_mask"] for b in step)]
        assert all(max(a) <= min(b) for a, b in zip(lengths, lengths[1:]))
    assert padding_share(split) < padding_share(whole) / 2, (padding_share(split), padding_share(whole))


def test_micro_batches_give_the_weights_of_whole_batches(tiny_model_dir, tmp_path):
    """The loss is normalised over the step's tokens (transformers' num_items_in_batch), not per pass: two steps
    split into 4 length-sorted passes end with the weights of two steps of whole batches (in fp32: bf16 matmuls of
    other shapes round differently)."""
    settings = dict(full=True, max_steps=2, learning_rate=1e-3, bf16=False, **{**FAST, "batch_size": 16})
    whole = run(sft_config(tiny_model_dir, tmp_path / "whole", **settings))
    split = run(sft_config(tiny_model_dir, tmp_path / "split", micro_batches=4, **settings))
    start = load_file(f"{tiny_model_dir}/model.safetensors")
    expected = load_file(f"{whole['model_dir']}/model.safetensors")
    got = load_file(f"{split['model_dir']}/model.safetensors")
    assert expected.keys() == got.keys()
    moved = max((expected[k] - start[k]).abs().max().item() for k in expected if k in start)
    assert moved > 1e-4
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], atol=1e-5, rtol=1e-4)


def test_the_sft_loss_scores_only_completion_positions(tiny_model_dir, tmp_path, lm_head_calls):
    """SFT trains with TRL's fused LM head restricted to the labelled positions on a CPU
    (``train/logprobs.labelled_positions_only``, whose results test_logprobs checks against TRL's default)."""
    import trl.trainer.utils as trl_utils

    run(sft_config(tiny_model_dir, tmp_path, max_steps=2, **FAST))
    assert len(lm_head_calls) == 2 and all(labelled_only for _, labelled_only in lm_head_calls)
    assert not trl_utils._use_triton(torch.device("cpu"))  # TRL's own choice again after the stage


def test_length_sorted_steps_keep_the_random_order_of_rows_per_step():
    lengths = [(7 * i) % 23 for i in range(50)]
    order = length_sorted_steps(lengths, 8, torch.Generator().manual_seed(3))
    shuffled = torch.randperm(50, generator=torch.Generator().manual_seed(3)).tolist()
    for start in range(0, 50, 8):
        step = order[start:start + 8]
        assert sorted(step) == sorted(shuffled[start:start + 8])
        assert [lengths[i] for i in step] == sorted(lengths[i] for i in step)


def test_micro_batches_settings_are_checked():
    with pytest.raises(ConfigError, match="multiple of micro_batches"):
        SFTConfig(batch_size=8, micro_batches=3)
    with pytest.raises(ConfigError, match="set one of them"):
        SFTConfig(batch_size=8, micro_batches=2, group_by_length=True)
    with pytest.raises(ConfigError, match="micro_batches"):
        SFTConfig(micro_batches=0)


def test_length_buckets_hold_similar_lengths_in_random_order():
    import random

    from transformers.trainer_pt_utils import get_length_grouped_indices

    rng = random.Random(0)
    lengths = [rng.randint(10, 100) for _ in range(1003)]

    def batches(order):
        return [order[i:i + 8] for i in range(0, len(order), 8)]

    def share_getting_shorter(order):  # of consecutive full batches, how often the next one is shorter
        longest = [max(lengths[i] for i in batch) for batch in batches(order) if len(batch) == 8]
        return sum(b < a for a, b in zip(longest, longest[1:])) / (len(longest) - 1)

    order = length_bucketed_order(lengths, 8, torch.Generator().manual_seed(0))
    assert sorted(order) == list(range(1003)) and len(batches(order)[-1]) == 3  # every row once, the rest last
    spread = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches(order)[:-1]]
    assert max(spread) <= 10 and sum(spread) / len(spread) < 3  # random batches: about 70 apart
    assert order == length_bucketed_order(lengths, 8, torch.Generator().manual_seed(0))
    assert order != length_bucketed_order(lengths, 8, torch.Generator().manual_seed(1))
    # transformers' grouping runs from long to short within each group of 50 batches; this order has no such cycle
    grouped = get_length_grouped_indices(lengths, 8, generator=torch.Generator().manual_seed(0))
    assert share_getting_shorter(grouped) > 0.9 and 0.35 < share_getting_shorter(order) < 0.65


def test_a_resumed_length_bucketed_run_ends_with_the_uninterrupted_weights(tiny_model_dir, tmp_path):
    settings = dict(full=True, max_steps=4, save_steps=2, learning_rate=1e-3, group_by_length=True,
                    **{**FAST, "max_train_samples": 200})
    whole = run(sft_config(tiny_model_dir, tmp_path / "whole", **settings))
    with pytest.raises(KeyboardInterrupt):
        run(sft_config(tiny_model_dir, tmp_path / "cut", **settings), callbacks=[StopAt(3)])
    resumed = run(sft_config(tiny_model_dir, tmp_path / "cut", resume=True, **settings))
    assert resumed["metrics"]["resumed_from"].endswith("checkpoint-2")
    expected = load_file(f"{whole['model_dir']}/model.safetensors")
    got = load_file(f"{resumed['model_dir']}/model.safetensors")
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)


def test_interrupted_run_resumes_from_last_checkpoint(tiny_model_dir, tmp_path):
    cfg = sft_config(tiny_model_dir, tmp_path, max_steps=4, save_steps=2, learning_rate=1e-3, **FAST)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, callbacks=[StopAt(3)])
    assert (tmp_path / "checkpoints" / "checkpoint-2").is_dir()
    assert not (tmp_path / "model").exists()

    counter = CountSteps()
    cfg.resume = True
    result = run(cfg, callbacks=[counter])
    assert result["metrics"]["resumed_from"].endswith("checkpoint-2")
    assert counter.steps == [3, 4]  # continued, not restarted
    assert result["metrics"]["global_step"] == 4 and (tmp_path / "model" / "model.safetensors").is_file()


def test_config_validation_and_flags():
    with pytest.raises(ConfigError, match="answer_only_fraction"):
        SFTConfig(answer_only_fraction=1.5)
    with pytest.raises(ConfigError, match="max_steps"):
        SFTConfig(max_steps=0)
    with pytest.raises(ConfigError, match="lora_rank"):
        load_config(SFTConfig, overrides={"lora_rank": 4})
    from agentic_rl.cli import build_parser

    args = build_parser(only="sft").parse_args(["sft", "--full", "--lora-target-modules", "q_proj,v_proj", "--resume",
                                                  "--learning-rate", "1e-3"])
    cfg = config_from_args(SFTConfig, args)
    assert cfg.full and cfg.resume and cfg.lora_target_modules == ["q_proj", "v_proj"] and cfg.learning_rate == 1e-3
    assert SFTConfig(lora_mlp=True).target_modules[-3:] == ["gate_proj", "up_proj", "down_proj"]


def test_health_rules_warn_once_per_episode():
    seen = []
    mon = HealthMonitor(default_rules(), emit=seen.append)
    for step, g in enumerate([1.0, 150.0, 200.0, 1.0, 120.0]):
        mon.update({"loss": 2.0, "grad_norm": g}, step)
    assert [w["rule"] for w in mon.warnings] == ["grad_explosion", "grad_explosion"]
    assert "lower the learning rate" in seen[0] and "step 1" in seen[0]

    mon = HealthMonitor(default_rules(), emit=seen.append)
    mon.update({"loss": 2.0, "grad_norm": 0.001}, 0)
    assert mon.warnings[-1]["rule"] == "grad_vanishing"

    falling_then_rising = [3.0, 2.8, 2.5, 2.2, 2.0, 1.8, 1.6, 1.5, 1.5, 1.6, 2.2, 2.6, 2.9, 3.0, 3.1]
    mon = HealthMonitor([metric_rising("loss", window=3)], emit=seen.append)
    fired = [i for i, v in enumerate(falling_then_rising) if mon.update({"loss": v}, i)]
    assert fired and fired[0] >= 10 and len(fired) == 1
    mon = HealthMonitor([metric_rising("loss", window=3)], emit=seen.append)
    for i in range(15):  # steadily falling: silent
        mon.update({"loss": 3.0 - 0.1 * i}, i)
    assert not mon.warnings
    # reward that falls after rising (GRPO use), and a custom key
    mon = HealthMonitor([metric_rising("reward", window=2, higher_is_worse=False), grad_explosion(10, key="gn")],
                        emit=seen.append)
    for i, r in enumerate([0.1, 0.2, 0.4, 0.5, 0.5, 0.2, 0.1]):
        mon.update({"reward": r, "gn": 1.0}, i)
    assert [w["rule"] for w in mon.warnings] == ["reward_falling"]


def test_report_to_resolution(monkeypatch, tmp_path):
    assert resolve_report_to("none") == ["none"]
    assert resolve_report_to("tensorboard") == ["tensorboard"]
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    assert resolve_report_to("tensorboard, wandb", tmp_path) == ["tensorboard", "wandb"]
    import os

    assert os.environ["WANDB_MODE"] == "offline" and os.environ["WANDB_DIR"] == str(tmp_path)
    with pytest.raises(ConfigError, match="report_to 'mlflow'"):
        resolve_report_to("mlflow")


@pytest.mark.slow
def test_wandb_offline_run_writes_local_files(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run(sft_config(tiny_model_dir, tmp_path / "run", max_steps=2, **{**FAST, "report_to": "wandb"}))
    assert list(tmp_path.glob("wandb/offline-run-*"))


@pytest.mark.parametrize("share", [0.3, 0.7])
def test_the_rows_a_short_run_reaches_hold_the_configured_share_of_answer_first_demonstrations(share):
    """The rows max_steps reaches are a seeded subset; the imperfect demonstrations are drawn from another stream, so
    the subset holds their share (from the same stream they would be the first rows reached)."""
    from agentic_rl.config import config_from_dict
    from agentic_rl.train.sft import rows_reached

    config = config_from_dict(SFTConfig, dict(dataset="synthetic", max_train_samples=4000, answer_first_fraction=share,
                                              max_steps=40, batch_size=32, system_prompt=""))
    reached = rows_reached(build_sft_dataset(config), config)
    first = sum(row["completion"][0]["content"].startswith("Final Answer") for row in reached)
    assert len(reached) == 1280 and abs(first / len(reached) - share) < 0.05


def test_a_few_synthetic_rows_are_drawn_with_the_seed_from_the_whole_training_split():
    """max_train_samples below the synthetic split's size draws that many of its rows with the seed, so each seed
    demonstrates other problems; above it, the split is generated to that size and every row is kept."""
    from agentic_rl.data import load_task_dataset
    from agentic_rl.train.sft import SFT_SYNTHETIC_TRAIN_ROWS, load_task_rows

    split = {row["question"] for row in load_task_dataset("synthetic:multiplication", "train",
                                                          synthetic_train_size=SFT_SYNTHETIC_TRAIN_ROWS)}
    drawn = [{row["question"] for row in load_task_rows(SFTConfig(dataset="synthetic:multiplication",
                                                                  max_train_samples=40, seed=seed))}
             for seed in (0, 1)]
    assert [len(questions) for questions in drawn] == [40, 40]
    assert drawn[0] <= split and drawn[1] <= split
    assert drawn[0] != drawn[1]
    again = {row["question"] for row in load_task_rows(SFTConfig(dataset="synthetic:multiplication",
                                                                 max_train_samples=40, seed=0))}
    assert again == drawn[0]
    more = load_task_rows(SFTConfig(dataset="synthetic", max_train_samples=SFT_SYNTHETIC_TRAIN_ROWS + 100))
    assert len(more) == SFT_SYNTHETIC_TRAIN_ROWS + 100
