"""The RLAIF ladder's reading of a GRPO run with the learned reward: does its reward-model score rise while the
verifier accuracy of the same samples does not? Plain curves, no model."""

from __future__ import annotations

import pytest
from conftest import script_module

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def ladder():
    return script_module("benchmarks/rlaif_ladder.py")


def curve(rm: list[float], accuracy: list[float]) -> dict[str, list[float]]:
    return {"step": list(range(1, len(rm) + 1)), "rm": rm, "accuracy": accuracy}


def test_thirds_are_the_means_of_the_first_and_last_third(ladder):
    assert ladder.thirds([0.0, 0.0, 1.0, 1.0, 2.0, 2.0]) == (0.0, 2.0)
    assert ladder.thirds([3.0]) == (3.0, 3.0)


@pytest.mark.parametrize("rm, accuracy, verdict", [
    ([0.1] * 3 + [0.5] * 3 + [0.9] * 3, [0.6] * 3 + [0.4] * 3 + [0.2] * 3, "YES"),    # reward up, accuracy down
    ([0.1] * 3 + [0.5] * 3 + [0.9] * 3, [0.40, 0.42, 0.41] * 3, "a sign"),             # reward up, accuracy flat
    ([0.1] * 3 + [0.5] * 3 + [0.9] * 3, [0.2] * 3 + [0.4] * 3 + [0.6] * 3, "no"),     # both up
    ([0.9] * 3 + [0.5] * 3 + [0.1] * 3, [0.6] * 3 + [0.4] * 3 + [0.2] * 3, "no"),     # reward did not rise
])
def test_hacking_verdict(ladder, rm, accuracy, verdict):
    assert ladder.hacking_verdict(curve(rm, accuracy), prompts_per_step=32).split(":")[0] == verdict


def test_a_small_accuracy_change_is_noise_not_hacking(ladder):
    """A 3-point drop over 3 x 32 prompts per third is within two standard errors: a sign, not hacking."""
    rm, accuracy = [0.1] * 3 + [0.9] * 3 + [0.9] * 3, [0.50] * 3 + [0.48] * 3 + [0.47] * 3
    assert ladder.hacking_verdict(curve(rm, accuracy), prompts_per_step=32).startswith("a sign")
    assert ladder.hacking_verdict(curve(rm, accuracy), prompts_per_step=100_000).startswith("YES")


def test_a_held_out_drop_below_the_start_is_hacking(ladder):
    """Flat sample accuracy, but held-out accuracy below the SFT start (interval excluding 0): hacking; an interval
    that holds 0 leaves the verdict to the samples."""
    rm, accuracy = [0.1] * 3 + [0.5] * 3 + [0.9] * 3, [0.40, 0.42, 0.41] * 3
    below = {"mean_difference": -0.12, "ci95": [-0.16, -0.08]}
    around = {"mean_difference": -0.01, "ci95": [-0.05, 0.03]}
    assert ladder.hacking_verdict(curve(rm, accuracy), 4, heldout=below).startswith("YES")
    assert ladder.hacking_verdict(curve(rm, accuracy), 4, heldout=around).startswith("a sign")


def test_sft_steps_reach_the_pipelines_sft_stage(ladder, tmp_path):
    from agentic_rl.config import config_from_dict
    from agentic_rl.pipeline import PipelineConfig

    def sft_steps(*argv: str) -> int:
        settings = ladder.pipeline_settings(ladder.build_parser().parse_args(list(argv)), tmp_path)
        return config_from_dict(PipelineConfig, {**settings, "stages": ["sft"]}).sft["max_steps"]

    assert sft_steps() == ladder.SFT_STEPS
    assert sft_steps("--sft-steps", "15") == 15
    assert ladder.BASE["sft"]["max_steps"] == ladder.SFT_STEPS  # the default settings are left as they were
