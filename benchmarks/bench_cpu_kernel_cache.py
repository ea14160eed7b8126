"""The CPU kernel caches' capacity, side by side: the quickstart's bf16 SFT with the libraries' default (1024 entries
in oneDNN's primitive cache and in ideep's computation cache) against the package's bound
(:data:`agentic_rl.CPU_KERNEL_CACHE_CAPACITY`).

Every new sequence length adds cache entries for the bf16 matmuls, so with variable-length batches a cache of 1024
entries grows by hundreds of MB over a stage. Both variants run :func:`agentic_rl.train.sft.run` with the quickstart
preset's ``sft:`` section from the shipped base, ``bf16`` on, for ``--steps`` steps, each in a process of its own (the
variables are read once per process) and in alternating order over ``--repeats``. Prints the median step time, the
peak resident memory of each, their ratios, and whether the trained weights are the same bit for bit.

The runs force ``bf16`` on; a CPU without bf16 instructions emulates it, and its stages train in fp32 by default,
so measure on a CPU that has them (AVX512-BF16 or AMX-BF16).

    python benchmarks/bench_cpu_kernel_cache.py --steps 200 --repeats 2
"""

from __future__ import annotations

import argparse
import hashlib
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

LIBRARY_DEFAULT = "1024"


def run_sft(out: Path, steps: int, seed: int) -> dict:
    """One SFT run in this process: seconds per step, peak RSS (MB), sha256 of the trained weights."""
    from agentic_rl.config import config_from_dict
    from agentic_rl.pipeline import load_pipeline_config, preset_path
    from agentic_rl.train import sft
    from agentic_rl.utils import read_jsonl

    preset = load_pipeline_config(preset_path("quickstart"))
    values = {**preset.sft, "model": "embedded", "system_prompt": preset.system_prompt, "output_dir": str(out),
              "max_steps": steps, "seed": seed, "report_to": ["none"], "logging_steps": 1, "bf16": True,
              "save_steps": steps + 1}
    result = sft.run(config_from_dict(sft.SFTConfig, values, where="bench_cpu_kernel_cache"))
    runtime = [r["perf/train_runtime_s"] for r in read_jsonl(out / "metrics.jsonl") if "perf/train_runtime_s" in r]
    weights = Path(result["model_dir"]) / "model.safetensors"
    return {"seconds_per_step": runtime[-1] / steps, "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def child(capacity: str, out: Path, steps: int, seed: int, threads: int) -> dict:
    from agentic_rl import CPU_KERNEL_CACHE_VARIABLES

    env = {**os.environ, **{name: capacity for name in CPU_KERNEL_CACHE_VARIABLES}}
    command = [sys.executable, __file__, "--child", str(out), "--steps", str(steps), "--seed", str(seed),
               "--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        sys.exit(f"capacity {capacity} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="SFT steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant (alternating order)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        print(json.dumps(run_sft(Path(args.child), args.steps, args.seed)))
        return

    from agentic_rl import CPU_KERNEL_CACHE_CAPACITY
    from agentic_rl.utils import cpu_computes_bf16

    variants = (LIBRARY_DEFAULT, CPU_KERNEL_CACHE_CAPACITY)
    results: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="bench_cpu_kernel_cache_") as tmp:
        for repeat in range(args.repeats):
            for capacity in variants if repeat % 2 == 0 else variants[::-1]:
                result = child(capacity, Path(tmp) / f"{capacity}_{repeat}", args.steps, args.seed, args.threads)
                results[capacity].append(result)
                print(f"  run {repeat + 1}, capacity {capacity:>4s}: {result['seconds_per_step']:.3f} s/step, "
                      f"peak RSS {result['peak_rss_mb']:.0f} MB", flush=True)

    step = {v: statistics.median(r["seconds_per_step"] for r in results[v]) for v in variants}
    rss = {v: max(r["peak_rss_mb"] for r in results[v]) for v in variants}
    same = len({r["sha256"] for v in variants for r in results[v]}) == 1
    print(f"\nCPU bf16 instructions: {cpu_computes_bf16()}; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs; bf16 SFT, {args.steps} steps per run, {args.repeats} runs per variant")
    print("capacity  s/step  peak RSS MB")
    for v in variants:
        print(f"{v:>8s}  {step[v]:6.3f}  {rss[v]:11.0f}")
    bound, default = CPU_KERNEL_CACHE_CAPACITY, LIBRARY_DEFAULT
    print(f"capacity {bound} / {default}: step time {step[bound] / step[default]:.3f}x, peak RSS "
          f"{rss[bound] / rss[default]:.3f}x; trained weights {'identical' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
