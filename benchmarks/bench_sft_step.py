"""An SFT step of the quickstart preset, before vs after: TRL's fused LM head over every position vs the labelled ones.

Both sides run our SFT stage (:func:`agentic_rl.train.sft.run`) with the quickstart preset's ``sft:`` section (full
fine-tuning, batch 32 in 4 length-sorted passes, 70 % answer-first demonstrations, no system prompt) from the same
model, for ``--steps`` steps, and differ only in how the loss goes through the LM head:

* ``before``: TRL 1.16's choice on a CPU: every position of the batch (prompt, padding, completion) is projected
  through the LM head and folded over the vocabulary, forward and backward; the unlabelled ones are then zeroed.
* ``after``: the stage as shipped (:func:`agentic_rl.train.logprobs.labelled_positions_only`): only the completion's
  positions, as TRL does on GPUs.

The runs alternate (ABBA order over ``--repeats``) so that load from other processes hits both alike; the step time is
the trainer's ``train_runtime / steps`` (checkpoints off). The logged losses of the two must agree (same training, up
to float rounding); the script prints the largest difference. Prints the median step times and the ratio.

    python benchmarks/bench_sft_step.py --model embedded --steps 60 --repeats 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VARIANTS = ("before", "after")


def run_variant(variant: str, model: str, steps: int, out: Path, seed: int) -> tuple[float, list[float]]:
    """One SFT run; returns (seconds per step, logged losses)."""
    from agentic_rl.config import config_from_dict
    from agentic_rl.pipeline import load_pipeline_config, preset_path
    from agentic_rl.train import sft
    from agentic_rl.utils import read_jsonl

    preset = load_pipeline_config(preset_path("quickstart"))
    values = {**preset.sft, "model": model, "output_dir": str(out), "max_steps": steps, "seed": seed,
              "system_prompt": preset.system_prompt, "save_steps": steps + 1, "report_to": ["none"],
              "logging_steps": 1}
    config = config_from_dict(sft.SFTConfig, values, where="bench_sft_step")
    original = sft.labelled_positions_only
    if variant == "before":
        sft.labelled_positions_only = contextlib.nullcontext  # TRL's own CPU choice: every position
    try:
        sft.run(config)
    finally:
        sft.labelled_positions_only = original
    rows = list(read_jsonl(out / "metrics.jsonl"))
    runtime = [r["perf/train_runtime_s"] for r in rows if "perf/train_runtime_s" in r][-1]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    return runtime / steps, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True,
                        help="the SFT start model (the quickstart's: runs/quickstart/pretrain/model)")
    parser.add_argument("--steps", type=int, default=60, help="SFT steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant (alternating order)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    losses: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_sft_step_") as tmp:
        for repeat in range(args.repeats):
            order = VARIANTS if repeat % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                seconds, logged = run_variant(variant, args.model, args.steps, Path(tmp) / f"{variant}_{repeat}",
                                              args.seed)
                times[variant].append(seconds)
                losses.setdefault(variant, logged)
                print(f"  run {repeat + 1} {variant:7s}: {seconds:.3f} s/step", flush=True)
    before, after = (statistics.median(times[v]) for v in VARIANTS)
    gap = max(abs(a - b) for a, b in zip(losses["before"], losses["after"]))
    print(f"\nvariant   s/step   vs before\nbefore    {before:6.3f}   1.000x\nafter     {after:6.3f}   "
          f"{after / before:.3f}x")
    print(f"logged losses ({len(losses['after'])} steps): largest difference {gap:.2e}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
