"""One metrics logger for every stage: namespaced keys in ``metrics.jsonl``, backends chosen by ``report_to``."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import pretrain_config, read_jsonl, sft_config

from agentic_rl.errors import TrainingError
from agentic_rl.train.monitoring import MetricsLogger, NullBackend, namespace_metrics, trl_generation_log

#: The namespaces a logged metric may live in (STYLE.md, lesson 9): the trainer's own numbers, timings, evaluation,
#: the environment's episode statistics, and one per stage.
NAMESPACES = ("train/", "perf/", "eval/", "agent/", "pretrain/", "sft/", "grpo/", "reward_model/")


def _logged(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "metrics.jsonl")


def _bare_keys(rows: list[dict]) -> set[str]:
    return {key for row in rows for key in row if key != "step" and not key.startswith(NAMESPACES)}


def test_pretraining_and_sft_log_namespaced_metrics_to_metrics_jsonl(tiny_model_dir, tmp_path):
    from agentic_rl.train import pretrain, sft

    pretrain.run(pretrain_config(tmp_path / "pretrain", exclude_test=20, logging_steps=1))
    sft.run(sft_config(tiny_model_dir, tmp_path / "sft", synthetic_test_size=10))
    for stage in ("pretrain", "sft"):
        rows = _logged(tmp_path / stage)
        assert [r["step"] for r in rows if "train/loss" in r] == [1, 2], stage
        assert not _bare_keys(rows), (stage, _bare_keys(rows))
        assert any("perf/train_runtime_s" in r for r in rows), stage  # the trainer's final summary row
    assert any("eval/loss" in r for r in _logged(tmp_path / "pretrain"))  # held-out loss after training
    assert any("sft/mean_token_accuracy" in r for r in _logged(tmp_path / "sft"))  # TRL's SFT-only metric
    assert not (tmp_path / "sft" / "tensorboard").exists()  # report_to none: no backend wrote anything


@pytest.mark.parametrize("stage", ["pretrain", "sft", "reward_model", "grpo"])
def test_a_trainers_keys_are_namespaced_for_its_stage(stage):
    logs = {"loss": 1.5, "grad_norm": 0.3, "learning_rate": 1e-4, "epoch": 0.5, "eval_loss": 1.7,
            "mean_token_accuracy": 0.4, "accuracy": 0.6, "agent/return": 0.5, "train_runtime": 9.0, "note": "x"}
    out = namespace_metrics(logs, stage)
    assert out == {"train/loss": 1.5, "train/grad_norm": 0.3, "train/learning_rate": 1e-4, "train/epoch": 0.5,
                   "eval/loss": 1.7, f"{stage}/mean_token_accuracy": 0.4, f"{stage}/accuracy": 0.6,
                   "agent/return": 0.5, "perf/train_runtime_s": 9.0}


def test_report_to_none_writes_only_the_run_record(tmp_path):
    logger = MetricsLogger(tmp_path, ["none"])
    assert [type(b) for b in logger.backends] == [NullBackend]
    logger.log(1, {"train/loss": 2.0})
    logger.text(1, "grpo/completions", "a sample")
    logger.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    assert _logged(tmp_path) == [{"step": 1, "train/loss": 2.0}]


def test_the_null_backend_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    backend = NullBackend()
    backend.log(1, {"train/loss": 2.0})
    backend.text(1, "tag", "text")
    backend.close()
    assert list(tmp_path.iterdir()) == []


def test_tensorboard_gets_the_same_scalars_and_a_new_run_starts_a_fresh_record(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "metrics.jsonl").write_text('{"step": 9, "train/loss": 9.0}\n')  # an earlier run's record
    logger = MetricsLogger(tmp_path, ["tensorboard"])
    logger.log(1, {"train/loss": 2.0, "grpo/kl": float("nan")})
    logger.close()
    assert _logged(tmp_path) == [{"step": 1, "train/loss": 2.0, "grpo/kl": pytest.approx(float("nan"), nan_ok=True)}]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert events.Tags()["scalars"] == ["train/loss"]  # a NaN is kept in the record, not plotted
    resumed = MetricsLogger(tmp_path, ["none"], resume=True)
    resumed.log(2, {"train/loss": 1.0})
    assert [r["step"] for r in _logged(tmp_path)] == [1, 2]


def test_trl_generation_log_names_the_trl_version_when_the_private_batch_is_gone():
    class Trainer:
        _logs = {"prompt": [], "completion": [], "rewards": {}, "advantages": []}

    assert trl_generation_log(Trainer()) is Trainer._logs
    with pytest.raises(TrainingError, match=r"TRL .* trainer\._logs .* TRL 1\.16"):
        trl_generation_log(object())
