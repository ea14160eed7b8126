"""GRPO stage: config validation, metric names and health rules (fast), and short real runs of TRL's GRPOTrainer on
random-init micro models (a few seconds of training each): rewards receive the dataset columns, beta > 0 gives a
non-zero KL, LoRA and full fine-tuning train different parameters, a Qwen3-0.6B-shaped model completes two steps,
and a run resumes from its last checkpoint."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import grpo_config, read_jsonl, sft_config, write_jsonl

from agentic_rl.config import config_from_args, config_from_dict, format_config, load_config, save_config
from agentic_rl.errors import ConfigError
from agentic_rl.train.grpo import GRPOConfig
from agentic_rl.train.grpo_trainer import health_monitor, rename_metrics

# ---------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------


def test_defaults_come_from_the_seed_not_trl():
    cfg = GRPOConfig(model="m")
    assert cfg.beta == 0.05 and cfg.learning_rate == 1e-5 and cfg.temperature == 0.9
    assert not cfg.full and cfg.lora_r == 16
    full = GRPOConfig(model="m", full=True)
    assert full.learning_rate == 3e-6  # full fine-tuning moves every weight: a smaller step than LoRA's
    tiny = GRPOConfig(model="m", preset="tiny")
    assert tiny.max_completion_length == 64 and tiny.batch_size % tiny.num_generations == 0 and tiny.lora_r == 64
    # An explicit value beats the preset.
    assert GRPOConfig(model="m", preset="tiny", learning_rate=3e-5).learning_rate == 3e-5


def test_num_generations_must_divide_the_generation_batch_and_the_message_gives_the_fix():
    with pytest.raises(ConfigError) as err:
        GRPOConfig(model="m", num_generations=6, batch_size=16, gradient_accumulation_steps=1)
    msg = str(err.value)
    assert "num_generations (6) must divide the generation batch (16" in msg
    assert "set batch_size to a multiple of 6 (e.g. 18)" in msg
    with pytest.raises(ConfigError, match=r"generation batch \(32 = batch_size 8 x gradient_accumulation_steps 4\)"):
        GRPOConfig(model="m", num_generations=6, batch_size=8, gradient_accumulation_steps=4)
    GRPOConfig(model="m", num_generations=6, batch_size=6, gradient_accumulation_steps=4)  # 24: fine
    with pytest.raises(ConfigError, match="generation_batch_size or steps_per_generation"):
        GRPOConfig(model="m", generation_batch_size=64, steps_per_generation=2)
    with pytest.raises(ConfigError, match="num_generations \\(1\\) must be >= 2"):
        GRPOConfig(model="m", num_generations=1)


def test_trl_passthrough_is_checked_by_name():
    with pytest.raises(ConfigError, match="did you mean 'top_entropy_quantile'"):
        GRPOConfig(model="m", trl_args={"top_entropy_quantil": 0.2})
    with pytest.raises(ConfigError, match="has its own setting"):
        GRPOConfig(model="m", trl_args={"beta": 0.1})
    assert GRPOConfig(model="m", trl_args={"top_entropy_quantile": 0.2}).trl_args == {"top_entropy_quantile": 0.2}


def test_cli_flags_yaml_roundtrip_and_every_field_printed(tmp_path):
    import argparse

    from agentic_rl.config import add_config_arguments

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, GRPOConfig)
    args = parser.parse_args(["--model", "m", "--reward", "accuracy:1.0", "--reward", "format:0.5", "--full",
                              "--beta", "0.1", "--loss-type", "dr_grpo", "--scale-rewards", "none"])
    cfg = config_from_args(GRPOConfig, args)
    assert cfg.rewards == ["accuracy:1.0", "format:0.5"] and cfg.full and cfg.beta == 0.1
    assert cfg.loss_type == "dr_grpo" and cfg.scale_rewards == "none"
    with pytest.raises(SystemExit):  # argparse rejects a loss type TRL does not have
        parser.parse_args(["--loss-type", "ppo"])
    text = format_config(cfg, "grpo")
    for name in ("beta", "epsilon", "num_iterations", "temperature", "top_p", "max_completion_length", "loss_type",
                 "scale_rewards", "learning_rate", "num_generations", "use_vllm", "vllm_mode", "rewards"):
        assert f"  {name} " in text
    path = save_config(cfg, tmp_path / "config.yaml")
    assert load_config(GRPOConfig, path) == cfg
    with pytest.raises(ConfigError, match="unknown config key 'betaa'"):
        config_from_dict(GRPOConfig, {"model": "m", "betaa": 0.1})


# ---------------------------------------------------------------------------------------------------------------
# Metric names and live warnings
# ---------------------------------------------------------------------------------------------------------------


def test_trl_metric_names_are_mapped_to_the_documented_table():
    logs = {"loss": 0.1, "reward": 0.7, "rewards/accuracy/mean": 0.6, "rewards/format/mean": 0.5, "kl": 0.01,
            "entropy": 1.2, "clip_ratio/region_mean": 0.03, "completions/mean_length": 30.0, "step_time": 1.5,
            "completions/clipped_ratio": 0.1, "frac_reward_zero_std": 0.25, "something_new": 3.0}
    out = rename_metrics(logs)
    assert out["grpo/reward"] == 0.7 and out["grpo/reward/accuracy"] == 0.6 and out["grpo/accuracy"] == 0.6
    assert out["grpo/reward/format"] == 0.5 and out["grpo/kl"] == 0.01 and out["grpo/entropy"] == 1.2
    assert out["grpo/clip_ratio"] == 0.03 and out["grpo/completion_length"] == 30.0
    assert out["grpo/truncated_fraction"] == 0.1 and out["grpo/zero_std_fraction"] == 0.25
    assert out["train/loss"] == 0.1 and out["perf/step_time_s"] == 1.5
    assert out["grpo/something_new"] == 3.0  # nothing TRL logs is dropped


def test_health_rules_warn_on_kl_drift_stalling_and_reward_collapse(capsys):
    monitor = health_monitor(GRPOConfig(model="m", kl_warmup_steps=3))
    monitor.update({"step": 1, "grpo/kl": 0.0, "grpo/reward": 0.5}, 1)  # warm-up: a tiny KL is expected
    assert monitor.warnings == []
    monitor.update({"step": 2, "grpo/kl": 0.9}, 2)
    assert [w["rule"] for w in monitor.warnings] == ["kl_high"] and "raise beta" in monitor.warnings[0]["message"]
    monitor.update({"step": 5, "grpo/kl": 0.0001}, 5)
    assert monitor.warnings[-1]["rule"] == "kl_low"
    for step, reward in enumerate([0.2] * 10 + [0.8] * 10 + [0.6] * 10, start=10):  # rises, dips 25 %: fine
        monitor.update({"step": step, "grpo/reward": reward}, step)
    assert monitor.warnings[-1]["rule"] == "kl_low"
    for step, reward in enumerate([0.1] * 10, start=40):  # falls below half of its best: collapse
        monitor.update({"step": step, "grpo/reward": reward}, step)
    assert monitor.warnings[-1]["rule"] == "reward_collapse"
    assert "WARNING" in capsys.readouterr().err


def test_health_rules_for_truncation_and_for_tools_in_an_environment():
    config = GRPOConfig(model="m", environment="calculator")
    single_turn = health_monitor(GRPOConfig(model="m"))
    single_turn.update({"step": 1, "grpo/truncated_fraction": 0.5}, 1)
    assert single_turn.warnings == []
    single_turn.update({"step": 2, "grpo/truncated_fraction": 0.95}, 2)  # answers lost to the length limit
    assert [w["rule"] for w in single_turn.warnings] == ["truncated"]
    assert "raise max_completion_length" in single_turn.warnings[0]["message"]
    assert [r.__name__ for r in health_monitor(GRPOConfig(model="m")).rules].count("tool_errors_rising") == 0

    monitor = health_monitor(config, environment=True)
    for step in range(1, 11):  # a steady 5 % error rate, tool calls steady: quiet
        monitor.update({"step": step, "agent/tool_error_rate": 0.05, "agent/tool_call_rate": 0.8}, step)
    assert monitor.warnings == []
    for step in range(11, 16):  # errors climb to 40 %
        monitor.update({"step": step, "agent/tool_error_rate": 0.4, "agent/tool_call_rate": 0.8}, step)
    assert [w["rule"] for w in monitor.warnings] == ["tool_errors_rising"]
    assert "broken tool calls" in monitor.warnings[0]["message"]
    for step, rate in enumerate([0.9] * 5 + [0.2] * 5, start=16):  # the tool-call rate falls below half its best
        monitor.update({"step": step, "agent/tool_call_rate": rate}, step)
    assert monitor.warnings[-1]["rule"] == "tool_call_collapse"


# ---------------------------------------------------------------------------------------------------------------
# Real runs on random-init micro models
# ---------------------------------------------------------------------------------------------------------------

RECORDER = '''
CALLS = []

def recording_reward(completions, **kwargs):
    """1.0 for every other completion: within each group of two the advantages differ, so the policy moves."""
    if "trainer_state" in kwargs:  # called by TRL's GRPOTrainer (not by the held-out evaluation)
        CALLS.append({k: list(v) for k, v in kwargs.items() if k in ("question", "ground_truth", "full_answer")})
    return [float(i % 2 == 0) for i in range(len(completions))]
'''


@pytest.fixture(scope="module")
def recorder_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rewards")
    (folder / "grpo_recording_reward.py").write_text(textwrap.dedent(RECORDER))
    sys.path.insert(0, str(folder))
    yield "grpo_recording_reward"
    sys.path.remove(str(folder))
    sys.modules.pop("grpo_recording_reward", None)


def _config(model_dir: Path, out: Path, **overrides) -> GRPOConfig:
    """The shared small GRPO run, logging two sample completions every step."""
    return grpo_config(model_dir, out, **{"completions_every": 1, "completions_per_log": 2, **overrides})


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory, recorder_module):
    from agentic_rl.train.grpo import run

    out = tmp_path_factory.mktemp("grpo_lora")
    cfg = _config(tiny_model_dir, out, beta=0.2, rewards=[f"{recorder_module}:recording_reward:1.0"],
                  heldout_every=1, eval_samples=3, report_to=["tensorboard"])
    return cfg, run(cfg)


def test_reward_functions_receive_the_dataset_columns(lora_run, recorder_module):
    from agentic_rl.data import load_task_dataset

    cfg, result = lora_run
    calls = sys.modules[recorder_module].CALLS
    assert len(calls) == 2  # one generation batch per step
    truth = {r["question"]: r["ground_truth"] for r in load_task_dataset("synthetic", "train").to_list()}
    for call in calls:
        assert set(call) == {"question", "ground_truth", "full_answer"}
        assert len(call["question"]) == 4  # batch_size completions, each with its row's columns
        assert call["question"][0] == call["question"][1]  # a group shares its prompt
        for question, gt in zip(call["question"], call["ground_truth"]):
            assert truth[question] == gt
    metrics = [r for r in read_jsonl(Path(result["model_dir"]).parent / "metrics.jsonl") if "grpo/reward" in r]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["grpo/reward/recording_reward"] == 0.5 for m in metrics)  # the function's values reached TRL
    samples = read_jsonl(Path(result["model_dir"]).parent / "completions.jsonl")
    assert samples and {"step", "prompt", "completion", "rewards", "advantage"} <= set(samples[0])
    assert samples[0]["rewards"]["recording_reward"] in (0.0, 1.0)


# The stage's real-run tests, over no environment and the two shipped ones. In an environment the reward is the
# episode's return; the start is a micro model given 60 SFT steps in that environment, so sampled episodes differ
# (tool-call errors cost tool_error_reward; self_correct's attempts before the token budget ends differ) and the
# groups carry a signal.
ENVIRONMENT_CASES = {
    "calculator": dict(environment="calculator", environment_args={"final_turn": "answer"}, tools_in_prompt=False,
                       tool_error_reward=-0.1, max_completion_length=96, max_turn_tokens=16,
                       dataset="synthetic:multiplication"),
    "self_correct": dict(environment="self_correct", tools_in_prompt=False, max_completion_length=160,
                         max_turn_tokens=40, dataset="synthetic:multiplication"),
}


def _environment_start(model_dir: Path, out: Path, environment: str) -> Path:
    from agentic_rl.train.sft import run as sft

    case = ENVIRONMENT_CASES[environment]
    result = sft(sft_config(model_dir, out, environment=environment, environment_args=case.get("environment_args", {}),
                            dataset=case["dataset"], tools_in_prompt=False, max_train_samples=256, max_steps=60,
                            batch_size=8, full=True, learning_rate=3e-3, save_steps=1000, synthetic_test_size=1000,
                            max_length=512, logging_steps=10))
    return Path(result["model_dir"])


@pytest.fixture(scope="module", params=[None, "calculator", "self_correct"], ids=["single-turn", "calculator",
                                                                                  "self_correct"])
def grpo_case(request, lora_run, tiny_model_dir, tmp_path_factory, recorder_module):
    """(start model, config, result, extra settings of the case) of a 2-step LoRA run with beta 0.2 and held-out
    checks every step."""
    from agentic_rl.train.grpo import run

    environment = request.param
    if environment is None:
        cfg, result = lora_run
        return tiny_model_dir, cfg, result, {"rewards": [f"{recorder_module}:recording_reward"]}
    start = _environment_start(tiny_model_dir, tmp_path_factory.mktemp(f"sft_{environment}"), environment)
    cfg = _config(start, tmp_path_factory.mktemp(f"grpo_{environment}"), beta=0.2, heldout_every=1, eval_samples=3,
                  report_to=["tensorboard"], **ENVIRONMENT_CASES[environment])
    return start, cfg, run(cfg), ENVIRONMENT_CASES[environment]


@pytest.mark.parametrize("skip", [True, False])
def test_without_a_kl_term_the_stage_leaves_tied_completions_out_of_the_loss_pass(tiny_model_dir, tmp_path, skip):
    # An untrained model answers nothing right: every group ties at reward 0, so every completion is left out (the
    # trainer keeps one row per pass) when the setting is on, and none when it is off.
    from agentic_rl.train.grpo import run

    out = tmp_path / "grpo"
    run(_config(tiny_model_dir, out, beta=0.0, rewards=["accuracy:1.0"], skip_zero_advantage_rows=skip))
    steps = [r for r in read_jsonl(out / "metrics.jsonl") if "grpo/reward" in r]
    assert [r["grpo/reward"] for r in steps] == [0.0, 0.0]
    assert [r.get("grpo/signal/skipped_row_fraction") for r in steps] == ([1.0, 1.0] if skip else [None, None])


def test_beta_gives_a_nonzero_kl_and_the_run_writes_its_outputs(grpo_case):
    from transformers import AutoModelForCausalLM

    _, cfg, result, _ = grpo_case
    out = Path(result["model_dir"]).parent
    metrics = [r for r in read_jsonl(out / "metrics.jsonl") if "grpo/kl" in r]
    assert metrics[0]["grpo/kl"] == 0.0  # step 1: the fresh adapter is the reference
    assert metrics[-1]["grpo/kl"] > 0.0  # after an update the policy has moved away from it
    heldout = read_jsonl(out / "heldout.jsonl")
    assert [h["step"] for h in heldout] == [0, 1, 2] and all(h["n"] == 3 for h in heldout)
    assert (out / "best" / "adapter_config.json").is_file() and (out / "best" / "best.json").is_file()
    assert (out / "config.yaml").is_file() and list((out / "tensorboard").glob("events.*"))
    assert (out / "adapter" / "adapter_config.json").is_file()
    saved = AutoModelForCausalLM.from_pretrained(out / "model")
    assert not (out / "merged").exists()  # the model folder has one name in every stage
    assert saved.config.model_type == "qwen3" and result["steps"] == 2
    if cfg.environment is not None:  # episodes: tool statistics in the logs, the held-out checks and rollouts.jsonl
        trained = [r for r in read_jsonl(out / "metrics.jsonl") if "agent/tool_call_rate" in r]
        assert [r["step"] for r in trained] == [1, 2] and all("agent/return" in r for r in trained)
        assert all("tool_call_rate" in h and "turns_per_episode" in h for h in heldout)
        rollouts = read_jsonl(out / "rollouts.jsonl")
        assert len(rollouts) == 2 and rollouts[0]["samples"][0]["messages"][0]["role"] == "assistant"
        if cfg.environment == "self_correct":  # the environment's own statistics reach the logs
            assert all("agent/success_at_1" in r and "agent/attempts" in r for r in trained)


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_lora_and_full_fine_tuning_train_different_parameters(grpo_case, tmp_path):
    from agentic_rl.train.grpo import run

    start_dir, _, lora, extra = grpo_case
    lora_out = Path(lora["model_dir"]).parent
    lora_names = (lora_out / "trainable_parameters.txt").read_text().split()
    assert lora_names and all("lora_A" in n or "lora_B" in n for n in lora_names)

    full = run(_config(start_dir, tmp_path / "full", full=True, beta=0.0, max_steps=1, learning_rate=1e-3, **extra))
    full_names = (tmp_path / "full" / "trainable_parameters.txt").read_text().split()
    assert "model.embed_tokens.weight" in full_names and not any("lora" in n for n in full_names)
    assert full["adapter_dir"] is None and full["trainable_parameters"] > lora["trainable_parameters"]

    start, after_lora, after_full = (_weights(start_dir), _weights(lora_out / "model"),
                                     _weights(Path(full["model_dir"])))
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not after_lora[q].equal(start[q]) and after_lora["model.embed_tokens.weight"].equal(
        start["model.embed_tokens.weight"])  # LoRA: linear layers move, embeddings stay
    assert not after_full["model.embed_tokens.weight"].equal(start["model.embed_tokens.weight"])


def test_resume_continues_from_the_last_checkpoint(grpo_case):
    import dataclasses

    from agentic_rl.train.grpo import run

    _, cfg, first, _ = grpo_case
    out = Path(first["model_dir"]).parent
    assert (out / "checkpoint-2").is_dir()
    # Same settings (only max_steps grows): a resume with other settings, e.g. heldout_every, is refused.
    again = run(dataclasses.replace(cfg, max_steps=3, resume=True))
    assert again["resumed_from"].endswith("checkpoint-2") and again["steps"] == 3
    steps = [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "grpo/reward" in r]
    assert steps == [1, 2, 3]  # the first run's rows are kept, step 3 is new, nothing repeated


def test_a_qwen3_shaped_model_completes_two_steps(qwen3_shape_dir, tmp_path):
    from agentic_rl.train.grpo import run

    result = run(_config(qwen3_shape_dir, tmp_path / "q", rewards=["accuracy:1.0", "format:0.2"],
                         learning_rate=1e-4))
    assert result["steps"] == 2
    rows = [r for r in read_jsonl(tmp_path / "q" / "metrics.jsonl") if "grpo/reward" in r]
    assert [r["step"] for r in rows] == [1, 2] and all("grpo/kl" in r for r in rows)
    assert (tmp_path / "q" / "model" / "model.safetensors").is_file()


def test_use_vllm_without_vllm_is_a_clear_config_error():
    import importlib.util

    import pytest

    from agentic_rl.errors import ConfigError
    from agentic_rl.train.grpo import GRPOConfig

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    with pytest.raises(ConfigError, match=r"use_vllm needs vLLM.*pip install"):
        GRPOConfig(model="m", use_vllm=True)


def test_custom_dataset_columns_reach_sft_and_grpo_data(tmp_path):
    from agentic_rl.train.grpo import GRPOConfig, load_data
    from agentic_rl.train.sft import SFTConfig, build_sft_dataset

    path = tmp_path / "mine.jsonl"
    rows = [{"problem": f"Tom has {i} apples and buys 2 more. How many?", "worked": f"{i} + 2 = {i + 2}\n#### {i + 2}"}
            for i in range(1, 13)]
    write_jsonl(path, rows)
    grpo = GRPOConfig(model="m", dataset=str(path), question_field="problem", answer_field="worked",
                      heldout_every=0)
    train, _ = load_data(grpo)
    got = {row["question"]: row["ground_truth"] for row in train}
    assert got["Tom has 5 apples and buys 2 more. How many?"] == "7" and len(got) == 12
    sft = build_sft_dataset(SFTConfig(dataset=str(path), question_field="problem", answer_field="worked"))
    first = {r["prompt"][-1]["content"]: r["completion"][0]["content"] for r in sft}
    assert first["Tom has 3 apples and buys 2 more. How many?"] == "3 + 2 = 5\nFinal Answer: 5"


def test_system_prompt_setting_shapes_sft_grpo_and_held_out_prompts_alike():
    from agentic_rl.data import SYSTEM_PROMPT
    from agentic_rl.train.grpo import load_data
    from agentic_rl.train.sft import SFTConfig, build_sft_dataset

    for setting, roles, system in ((None, ["system", "user"], SYSTEM_PROMPT), ("", ["user"], None),
                                   ("Answer briefly.", ["system", "user"], "Answer briefly.")):
        train, heldout = load_data(GRPOConfig(model="m", system_prompt=setting, max_train_samples=8,
                                              heldout_every=5, eval_samples=4))
        sft = build_sft_dataset(SFTConfig(system_prompt=setting, max_train_samples=8))
        for prompt in [r["prompt"] for r in train] + [r["prompt"] for r in heldout] + [r["prompt"] for r in sft]:
            assert [m["role"] for m in prompt] == roles
            assert (prompt[0]["content"] if system else None) == system


def test_learning_signal_options_reach_the_stage(tiny_model_dir, tmp_path):
    """Refill, difficulty selection and the SFT anchor run inside the stage and are logged; with the accuracy
    reward an untrained model's groups all tie, so every first draw is dropped and refills are drawn."""
    from agentic_rl.train.grpo import run

    out = tmp_path / "signal"
    result = run(_config(tiny_model_dir, out, rewards=["accuracy:1.0"], refill_max_draws=2, select_samples=2,
                         select_candidates=6, select_pass_rate_low=0.0, sft_loss_weight=0.5))
    selection = json.loads((out / "difficulty.json").read_text())
    assert selection["candidates"] == 6 and selection["kept"] == 6 and selection["histogram"]["0/2"] == 6
    assert result["difficulty_selection"] == selection
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "grpo/reward" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["grpo/signal/dropped_group_fraction"] == 1.0
        assert row["grpo/signal/refill_draws"] == 2.0  # nothing to find: gives up after its draws
        assert row["grpo/signal/sft_loss"] > 0


def test_difficulty_selection_that_keeps_nothing_fails_before_the_run_directory_is_touched(tiny_model_dir, tmp_path):
    from agentic_rl.train.grpo import run

    out = tmp_path / "nothing"
    with pytest.raises(ConfigError, match=r"kept none of 4 prompts \(correct samples per prompt: \{'0/2': 4"):
        run(_config(tiny_model_dir, out, rewards=["accuracy:1.0"], select_samples=2, select_candidates=4))
    assert not out.exists() or not any(out.iterdir())


def test_learning_signal_settings_are_range_checked():
    with pytest.raises(ConfigError, match="select_pass_rate_low"):
        GRPOConfig(model="m", select_pass_rate_low=0.8, select_pass_rate_high=0.2)
    with pytest.raises(ConfigError, match="refill_max_draws must be >= 0"):
        GRPOConfig(model="m", refill_max_draws=-1)
    with pytest.raises(ConfigError, match=r"sft_loss_weight must be >= 0, got -0.1"):
        GRPOConfig(model="m", sft_loss_weight=-0.1)
    with pytest.raises(ConfigError, match=r"tied_failure_weight must be >= 0"):
        GRPOConfig(model="m", tied_failure_weight=-1.0)
    with pytest.raises(ConfigError, match="tied_failure_weight needs episodes in an environment"):
        GRPOConfig(model="m", tied_failure_weight=0.5)
    with pytest.raises(ConfigError, match="tied_failure_weight needs episodes .* credit_assignment: trajectory"):
        GRPOConfig(model="m", environment="calculator", tied_failure_weight=0.5, credit_assignment="turn")
    assert GRPOConfig(model="m", environment="calculator", tied_failure_weight=0.5).tied_failure_weight == 0.5


def test_log_probs_go_through_the_lm_head_for_completion_positions_only(tiny_model_dir, tmp_path, lm_head_calls):
    """GRPO scores with TRL's fused LM head restricted to the labelled positions on a CPU
    (``train/logprobs.labelled_positions_only``; test_logprobs checks its results against TRL's default)."""
    import torch
    import trl.trainer.utils as trl_utils

    from agentic_rl.train.grpo import run

    run(_config(tiny_model_dir, tmp_path / "grpo", max_steps=1, save_steps=10))
    assert lm_head_calls and all(labelled_only for _, labelled_only in lm_head_calls)
    assert not trl_utils._use_triton(torch.device("cpu"))
