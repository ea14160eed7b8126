"""Episode evaluation side by side: every context prefilled whole vs the shared prefix prefilled once.

In an environment each turn is a generation call over every running episode, and every context begins with the
same system prompt (the memory environment's: 145 tokens, most of a turn's context). The compact decode loop
(:func:`agentic_rl.models.generate.generate_token_ids`) prefills a prefix that all contexts of a call share once and
each context from where it differs (``shared``); ``whole`` sets ``MIN_SHARED_PREFIX`` out of reach, so every context
is prefilled from its first token, as before.

Both evaluate the same model on the same held-out problems with the settings of a run's evaluation stage (its
``config.yaml``: environment, its arguments, turn and token limits), with tools and without, greedy, in one process,
alternating (ABBA over ``--repeats``). Prints the CPU and wall seconds of each (medians), the ratios shared / whole,
the tokens each prefilled, and how many episodes are identical (every message); exit status 1 when accuracy differs.

    python benchmarks/bench_shared_prefix.py --run runs/quickstart-memory --samples 200
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a pipeline run directory with eval/sft/config.yaml and its "
                        "sft/model (e.g. runs/quickstart-memory)")
    parser.add_argument("--stage", default="sft", help="the stage whose model and evaluation settings to use")
    parser.add_argument("--samples", type=int, default=200, help="held-out problems")
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant (alternating order)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0 = torch's default)")
    args = parser.parse_args(argv)

    import torch

    import agentic_rl.models.generate as generation
    from agentic_rl.agent.settings import build_environment
    from agentic_rl.config import config_from_dict, read_yaml
    from agentic_rl.eval.evaluate import EvalConfig, evaluate_model_in_environment, load_rows
    from agentic_rl.models.loading import load_model_and_tokenizer
    from agentic_rl.utils import read_jsonl

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    run = Path(args.run)
    values = read_yaml(run / "eval" / args.stage / "config.yaml")
    values.update(eval_samples=args.samples, models=[str(run / args.stage / "model")])
    config = config_from_dict(EvalConfig, values, where="bench_shared_prefix")
    rows = load_rows(config)
    env_factory = build_environment(config)
    model, tokenizer = load_model_and_tokenizer(config.models[0], dtype=config.dtype, for_training=False)

    prefilled = {"tokens": 0}
    forward = model.forward

    def counting_forward(*a, **k):
        if k["input_ids"].shape[1] > 1:
            prefilled["tokens"] += k["input_ids"].numel()
        return forward(*a, **k)

    counting_forward.__signature__ = inspect.signature(forward)  # the decode loop reads the forward's signature
    model.forward = counting_forward
    shipped = generation.MIN_SHARED_PREFIX
    variants = {"whole": 10**9, "shared": shipped}
    wall = {v: [] for v in variants}
    cpu = {v: [] for v in variants}
    tokens, results, episodes = {}, {}, {}
    scratch = Path(tempfile.mkdtemp(prefix="bench_shared_prefix_"))
    print(f"{config.environment} {config.environment_args} | {len(rows)} problems | model {config.models[0]} | "
          f"torch threads {torch.get_num_threads()}", flush=True)
    try:
        for i in range(args.repeats):
            for variant in (list(variants) if i % 2 == 0 else list(variants)[::-1]):
                generation.MIN_SHARED_PREFIX = variants[variant]
                prefilled["tokens"] = 0
                start, start_cpu = time.perf_counter(), time.process_time()
                try:
                    metrics = evaluate_model_in_environment(model, rows, config, env_factory, tokenizer=tokenizer,
                                                            output_dir=scratch / variant)
                finally:
                    generation.MIN_SHARED_PREFIX = shipped
                wall[variant].append(time.perf_counter() - start)
                cpu[variant].append(time.process_time() - start_cpu)
                tokens[variant], results[variant] = prefilled["tokens"], metrics
                episodes[variant] = {key: read_jsonl(scratch / variant / f"episodes_{key}.jsonl")
                                     for key in ("with_tools", "without_tools")}
                print(f"  run {i + 1} {variant:<7} {wall[variant][-1]:7.1f} s wall {cpu[variant][-1]:7.1f} s CPU, "
                      f"prefilled {tokens[variant]:,} tokens, accuracy {metrics['accuracy']:.3f} with tools, "
                      f"{metrics['accuracy_without_tools']:.3f} without", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    median = {v: statistics.median(t) for v, t in wall.items()}
    median_cpu = {v: statistics.median(t) for v, t in cpu.items()}
    same = {key: sum(a["messages"] == b["messages"]
                     for a, b in zip(episodes["whole"][key], episodes["shared"][key])) for key in episodes["whole"]}
    print(f"\nshared / whole: {median['shared'] / median['whole']:.3f} wall, "
          f"{median_cpu['shared'] / median_cpu['whole']:.3f} CPU, {tokens['shared'] / tokens['whole']:.3f} tokens "
          f"prefilled; identical episodes: "
          + ", ".join(f"{k.replace('_', ' ')} {n}/{len(rows)}" for k, n in same.items())
          + f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    differs = any(results["whole"][k] != results["shared"][k] for k in ("accuracy", "accuracy_without_tools"))
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
