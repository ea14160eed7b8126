"""The one held-out scorer on a validation slice (agentic_rl.eval.validation): GRPO's periodic checks and tune's trial
scores draw their problems from the training split — never the test split that the final evaluation reports, never a
row the stage trains on — carry the stage's system prompt, and are scored by the same function."""

from __future__ import annotations

import pytest

from agentic_rl.data import load_task_dataset
from agentic_rl.errors import ConfigError
from agentic_rl.eval import validation
from agentic_rl.train.grpo import GRPOConfig
from agentic_rl.train.sft import SFTConfig
from agentic_rl.tune import TuneConfig, base_values, make_objective

SYSTEM = "Answer in numbers only."


def _questions(rows) -> set[str]:
    return {r["question"] for r in rows}


class _Trial:
    """What the objective uses of an Optuna trial."""

    number = 0

    def __init__(self):
        self.user_attrs = {}

    def set_user_attr(self, key, value):
        self.user_attrs[key] = value


def _run_one_trial(tmp_path, monkeypatch, stage: str, fixed: dict, **tune_settings):
    """One tune trial with the stage's training replaced by a recorder and the one scorer by a spy: returns
    ``(stage config the trial trained with, rows it was scored on)``."""
    scored = []

    def spy(model, tokenizer, rows, **settings):
        scored.append(rows)
        return {"accuracy": 0.5, "avg_reward": 0.5, "n": len(rows)}

    monkeypatch.setattr(validation, "score_heldout", spy)
    trained = []

    def stage_run(cfg, **_):
        trained.append(cfg)
        return {"model_dir": str(tmp_path / "model")}

    config = TuneConfig(stage=stage, prune=False, output_dir=str(tmp_path), fixed=fixed, **tune_settings)
    cls = SFTConfig if stage == "sft" else GRPOConfig
    objective = make_objective(config, cls, stage_run, base_values(config, cls), tmp_path / "trials")
    assert objective(_Trial(), {"learning_rate": 1e-4}) == 0.5
    assert len(trained) == 1 and len(scored) == 1
    return trained[0], scored[0]


@pytest.mark.parametrize("stage", ["sft", "grpo"])
@pytest.mark.parametrize("dataset", ["synthetic", "gsm8k"])
def test_tune_scores_trials_on_a_validation_slice_the_trial_never_trains_on(tmp_path, monkeypatch, request, stage,
                                                                           dataset):
    if dataset == "gsm8k":  # the real files, skipped cleanly where they are absent
        dataset = str(request.getfixturevalue("gsm8k_dir"))
    fixed = {"model": "m", "dataset": dataset, "system_prompt": SYSTEM,
             "max_train_samples": 64}
    cfg, rows = _run_one_trial(tmp_path, monkeypatch, stage, fixed, eval_samples=12)
    assert len(rows) == 12 and cfg.eval_samples == 12
    scored = _questions(rows)
    test_split = _questions(load_task_dataset(dataset, "test"))
    # the synthetic train split as the stage generates it: its training size plus the slice, its test questions kept out
    size, test_size = (5000 + 12, 1000) if stage == "sft" else (64 + 12, 2000)
    train_split = _questions(load_task_dataset(dataset, "train", synthetic_train_size=size,
                                               synthetic_test_size=test_size))
    assert scored <= train_split and not scored & test_split
    if stage == "sft":
        from agentic_rl.train.sft import load_task_rows

        trained_on = _questions(load_task_rows(cfg))
    else:
        from agentic_rl.train.grpo import load_data

        trained_on = _questions(load_data(cfg)[0])
    assert len(trained_on) == 64 and not scored & trained_on
    # scored on the prompt the trial trains with: the stage's system message, then the question
    assert all(r["prompt"] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["question"]}]
               for r in rows)


def test_the_validation_slice_is_deterministic_by_seed_and_a_prefix_across_sizes():
    rows = [{"question": str(i)} for i in range(50)]
    train, held = validation.carve_validation(rows, 5, seed=3, where="x")
    again = validation.carve_validation(rows, 5, seed=3, where="x")
    assert (train, held) == again and len(train) == 45 and not _questions(train) & _questions(held)
    assert validation.carve_validation(rows, 5, seed=4, where="x")[1] != held
    assert validation.carve_validation(rows, 8, seed=3, where="x")[1][:5] == held
    with pytest.raises(ConfigError, match=r"^eval_samples \(50\) leaves no training rows from the 50 rows of x"):
        validation.carve_validation(rows, 50, seed=3, where="x")


def test_grpo_heldout_checks_and_tune_trials_call_the_same_scorer(tmp_path, monkeypatch):
    from agentic_rl.train.grpo_trainer import evaluate_heldout

    calls = []

    def spy(model, tokenizer, rows, **settings):
        calls.append(settings)
        return {"accuracy": 1.0, "avg_reward": 1.0, "n": len(rows)}

    monkeypatch.setattr(validation, "score_heldout", spy)
    cfg = GRPOConfig(model="m", max_train_samples=8, heldout_every=2, eval_samples=3, max_completion_length=16)
    assert evaluate_heldout(object(), object(), [{"question": "q"}], cfg) == {"accuracy": 1.0, "avg_reward": 1.0,
                                                                            "n": 1}
    assert calls == [{"max_new_tokens": 16, "rewards": ["accuracy:1.0", "format:0.2"], "env_factory": None,
                      "tools_in_prompt": True, "max_turn_tokens": cfg.max_turn_tokens}]
    _run_one_trial(tmp_path, monkeypatch, "grpo", {"model": "m", "max_train_samples": 8}, eval_samples=3)


def test_grpo_heldout_rows_are_carved_out_of_the_training_split(gsm8k_dir):
    from agentic_rl.train.grpo import load_data

    gsm8k = str(gsm8k_dir)
    train, heldout = load_data(GRPOConfig(model="m", dataset=gsm8k, max_train_samples=100, heldout_every=5,
                                          eval_samples=20))
    held = _questions(heldout)
    assert len(held) == 20 and not held & _questions(train)
    assert held <= _questions(load_task_dataset(gsm8k, "train")) and not held & _questions(load_task_dataset(gsm8k,
                                                                                                            "test"))


def test_grpo_without_checks_holds_nothing_out_unless_asked():
    from agentic_rl.train.grpo import load_data

    assert GRPOConfig(model="m", heldout_every=0).eval_samples == 0
    assert load_data(GRPOConfig(model="m", max_train_samples=8, heldout_every=0))[1] is None
    # tune asks for a slice while the periodic checks stay off
    assert len(load_data(GRPOConfig(model="m", max_train_samples=8, heldout_every=0, eval_samples=4))[1]) == 4


def test_tune_on_the_test_split_is_an_explicit_choice_that_warns(tmp_path, monkeypatch, capsys):
    cfg, rows = _run_one_trial(tmp_path, monkeypatch, "sft", {"model": "m", "max_train_samples": 16}, eval_samples=4,
                               eval_split="test")
    assert "WARNING: eval_split 'test'" in capsys.readouterr().err
    assert _questions(rows) <= _questions(load_task_dataset("synthetic", "test")) and cfg.eval_samples == 0


def test_tune_sets_eval_samples_itself(tmp_path):
    with pytest.raises(ConfigError, match=r"the stage's eval_samples \(5\) is set per trial by tune to its own "
                                          r"eval_samples \(8\)"):
        base_values(TuneConfig(stage="sft", eval_samples=8, fixed={"eval_samples": 5}), SFTConfig)
