"""bf16 mixed precision against fp32 on the quickstart's two long stages, side by side: pretraining and SFT steps.

Both variants run our stages (:func:`agentic_rl.train.pretrain.run`, :func:`agentic_rl.train.sft.run`) with the
quickstart preset's ``pretrain:`` and ``sft:`` sections for ``--steps`` steps and differ only in ``bf16`` (fp32 weights
either way; with ``bf16`` the matmuls run in bfloat16 under autocast). SFT starts from the model of the first fp32
pretraining run. Each run is a process of its own, so its peak resident memory is its own; runs alternate (ABBA
order over ``--repeats``) so that load from other processes hits both alike. The step time is the trainer's
``train_runtime / steps`` (checkpoints off). Prints the median step times, their ratio, the peak RSS and the largest
difference of the logged losses (float rounding: the learning itself is measured by whole quickstart runs, see
docs/experiments.md).

On a CPU without bf16 instructions (no AVX512-BF16 / AMX-BF16) the bf16 variant is emulated and slower: that is why
the stages' default is on only where :func:`agentic_rl.utils.cpu_computes_bf16` finds them.

    python benchmarks/bench_mixed_precision.py --steps 200 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VARIANTS = ("fp32", "bf16")
STAGES = ("pretrain", "sft")


def run_stage(stage: str, variant: str, out: Path, steps: int, seed: int, model: str | None) -> dict:
    """One stage run in this process: seconds per step, logged losses, the model directory, peak RSS (MB)."""
    from agentic_rl.config import config_from_dict
    from agentic_rl.pipeline import load_pipeline_config, preset_path
    from agentic_rl.train import pretrain, sft
    from agentic_rl.utils import read_jsonl

    preset = load_pipeline_config(preset_path("quickstart"))
    common = {"output_dir": str(out), "max_steps": steps, "seed": seed, "report_to": ["none"], "logging_steps": 1,
              "bf16": variant == "bf16"}
    if stage == "pretrain":
        result = pretrain.run(config_from_dict(pretrain.PretrainConfig, {**preset.pretrain, **common},
                                               where="bench_mixed_precision"))
    else:
        values = {**preset.sft, **common, "model": model, "system_prompt": preset.system_prompt,
                  "save_steps": steps + 1}
        result = sft.run(config_from_dict(sft.SFTConfig, values, where="bench_mixed_precision"))
    rows = list(read_jsonl(out / "metrics.jsonl"))
    runtime = [r["perf/train_runtime_s"] for r in rows if "perf/train_runtime_s" in r][-1]
    return {"seconds_per_step": runtime / steps, "losses": [r["train/loss"] for r in rows if "train/loss" in r],
            "model_dir": str(result["model_dir"]),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def child(stage: str, variant: str, out: Path, steps: int, seed: int, model: str | None, threads: int) -> dict:
    command = [sys.executable, __file__, "--child", stage, variant, str(out), "--steps", str(steps), "--seed",
               str(seed), "--threads", str(threads)] + (["--model", model] if model else [])
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{stage} {variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="steps per run, each stage")
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant and stage (alternating order)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=3, metavar=("STAGE", "VARIANT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        stage, variant, out = args.child
        print(json.dumps(run_stage(stage, variant, Path(out), args.steps, args.seed, args.model)))
        return

    from agentic_rl.utils import cpu_computes_bf16

    results: dict[tuple[str, str], list[dict]] = {(s, v): [] for s in STAGES for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench_mixed_precision_") as tmp:
        start_model = None
        for stage in STAGES:
            for repeat in range(args.repeats):
                for variant in VARIANTS if repeat % 2 == 0 else VARIANTS[::-1]:
                    result = child(stage, variant, Path(tmp) / f"{stage}_{variant}_{repeat}", args.steps, args.seed,
                                   start_model, args.threads)
                    results[stage, variant].append(result)
                    print(f"  {stage:8s} run {repeat + 1} {variant}: {result['seconds_per_step']:.3f} s/step, "
                          f"peak RSS {result['peak_rss_mb']:.0f} MB", flush=True)
                    if stage == "pretrain" and variant == "fp32" and start_model is None:
                        start_model = result["model_dir"]
                        # SFT's start must outlive the pretraining runs' folder: it is in tmp, kept to the end

    print(f"\nCPU bf16 instructions: {cpu_computes_bf16()}; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs; {args.steps} steps per run, {args.repeats} runs per variant")
    print("stage      fp32 s/step  bf16 s/step  bf16/fp32  peak RSS fp32 / bf16 MB  largest loss difference")
    for stage in STAGES:
        fp32, bf16 = ([r["seconds_per_step"] for r in results[stage, v]] for v in VARIANTS)
        rss = [max(r["peak_rss_mb"] for r in results[stage, v]) for v in VARIANTS]
        gap = max(abs(a - b) for a, b in zip(results[stage, "fp32"][0]["losses"], results[stage, "bf16"][0]["losses"]))
        print(f"{stage:9s}  {statistics.median(fp32):11.3f}  {statistics.median(bf16):11.3f}  "
              f"{statistics.median(bf16) / statistics.median(fp32):8.3f}x  {rss[0]:10.0f} / {rss[1]:.0f}"
              f"{'':14s}{gap:.3f}")


if __name__ == "__main__":
    main()
