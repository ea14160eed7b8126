"""A GRPO step of the quickstart preset, before vs after: TRL's own step vs compact sampling and chunked scoring.

Both sides run our GRPO stage (:func:`agentic_rl.train.grpo.run`) with the quickstart preset's GRPO settings (its
``grpo:`` section of ``configs/quickstart.yaml``: the tiny preset, group size, completion length, learning rate,
temperature, rewards, system prompt) on the same model and prompts, and differ only in how they sample and score:

* ``before``: TRL 1.16's own step: its sampling (``generation_backend: trl``, ``model.generate`` on the padded
  generation batch) and its log-prob passes over the whole padded batch (``logprob_chunk_rows: 0``), with its LM
  head over every position on a CPU.
* ``after``: the tiny preset's defaults: ``compact`` sampling (the project's decode loop through TRL's
  ``rollout_func``), log-probs in length-sorted chunks of 8 rows cut to the columns they use, and the LM head over
  the completion's positions only (``train/logprobs.py``).
* ``sampling-only``: ``compact`` sampling with TRL's log-prob passes and LM head (what the sampling alone gives).
* ``--also``: TRL's other transformers options for the record: ``trl-static`` (``cache_implementation: static``)
  and ``trl-continuous`` (``use_transformers_continuous_batching``, paged attention).

The runs alternate (ABBA order over ``--repeats``) so that load from other processes hits both alike; the step time
is the trainer's ``train_runtime / steps`` (generation + rewards + loss + optimizer + our callbacks), held-out checks
and checkpoints off; this process's CPU time over training is reported too (steadier than wall time on a shared
machine). Prints the median step times of each and the ratios after / before (the goal: <= 0.75).

    python benchmarks/bench_grpo_step.py --model runs/quickstart/sft/model --steps 5 --repeats 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VARIANTS = {
    "before": {"generation_backend": "trl", "logprob_chunk_rows": 0},
    "after": {},  # the preset's default
    "sampling-only": {"logprob_chunk_rows": 0},
    "trl-static": {"generation_backend": "trl", "logprob_chunk_rows": 0,
                   "trl_args": {"cache_implementation": "static"}},
    "trl-continuous": {"generation_backend": "trl", "logprob_chunk_rows": 0,
                       "trl_args": {"use_transformers_continuous_batching": True}},
}


def quickstart_grpo_settings() -> dict:
    """The GRPO stage's settings in the quickstart preset, as the pipeline passes them (its section + the shared
    dataset, seed and system prompt)."""
    from agentic_rl.config import read_yaml
    from agentic_rl.pipeline import preset_path

    preset = read_yaml(preset_path("quickstart"))
    return {**preset["grpo"], "dataset": preset["dataset"], "seed": preset["seed"],
            "system_prompt": preset["system_prompt"]}


def run_variant(model_dir: str, out: Path, base: dict, variant: str, steps: int) -> dict:
    from agentic_rl.config import config_from_dict
    from agentic_rl.train import grpo

    values = {**base, **VARIANTS[variant], "model": model_dir, "output_dir": str(out), "max_steps": steps,
              "heldout_every": 0, "save_steps": 10**6, "report_to": ["none"], "completions_every": 0}
    cfg = config_from_dict(grpo.GRPOConfig, values, where=f"bench {variant}")
    clock = cpu_clock()
    shipped_head = grpo.labelled_positions_only
    if variant != "after":
        grpo.labelled_positions_only = contextlib.nullcontext  # TRL's own CPU choice: the LM head over every position
    try:
        result = grpo.run(cfg, callbacks=[clock])
    finally:
        grpo.labelled_positions_only = shipped_head
    metrics = result["train_metrics"]
    return {"step_s": metrics["train_runtime"] / steps, "cpu_step_s": clock.seconds / steps,
            "backend": cfg.generation_backend}


def cpu_clock():
    """A callback that measures this process's CPU time from the start to the end of training."""
    from transformers import TrainerCallback

    class CpuClock(TrainerCallback):
        seconds = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.process_time()

        def on_train_end(self, args, state, control, **kwargs):
            self.seconds = time.process_time() - self.start

    return CpuClock()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True,
                        help="the GRPO start model (the quickstart's: runs/quickstart/sft/model)")
    parser.add_argument("--steps", type=int, default=5, help="GRPO steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant (alternating order)")
    parser.add_argument("--also", default="", help="extra variants, comma list of sampling-only, trl-static, "
                        "trl-continuous")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0 = torch's default)")
    args = parser.parse_args(argv)
    variants = ["before", "after", *[v for v in args.also.split(",") if v]]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--also: unknown {', '.join(unknown)}")

    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    base = quickstart_grpo_settings()
    print(f"quickstart GRPO settings: {base} | steps {args.steps} | model {args.model} | torch threads "
          f"{torch.get_num_threads()}", flush=True)
    wall: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="bench_grpo_step_") as work:
        for i in range(args.repeats):
            for variant in (variants if i % 2 == 0 else variants[::-1]):
                r = run_variant(args.model, Path(work) / f"{variant}_{i}", base, variant, args.steps)
                wall[variant].append(r["step_s"])
                cpu[variant].append(r["cpu_step_s"])
                print(f"  run {i + 1} {variant:<15} ({r['backend']}): {r['step_s']:.2f} s/step wall, "
                      f"{r['cpu_step_s']:.2f} s/step CPU", flush=True)
    median = {v: statistics.median(t) for v, t in wall.items()}
    median_cpu = {v: statistics.median(t) for v, t in cpu.items()}
    print(f"\n{'variant':<15} {'wall s/step':>11} {'vs before':>10} {'cpu s/step':>11} {'vs before':>10}")
    for v in variants:
        print(f"{v:<15} {median[v]:>11.2f} {median[v] / median['before']:>9.3f}x {median_cpu[v]:>11.2f} "
              f"{median_cpu[v] / median_cpu['before']:>9.3f}x")
    print(f"\nafter / before: {median['after'] / median['before']:.3f} wall, "
          f"{median_cpu['after'] / median_cpu['before']:.3f} CPU (goal <= 0.75); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
