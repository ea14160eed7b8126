"""Episode evaluation side by side: how much of each turn's context the compact decode loop prefills.

In an environment each turn is a generation call over every running episode. Three variants of the decode loop
(:func:`agentic_rl.models.generate.generate_token_ids`) on the same episodes:

* ``whole``: every context prefilled from its first token, every turn;
* ``shared``: a prefix that all contexts of a call share (the system prompt) prefilled once, each context from where
  it differs (``MIN_SHARED_PREFIX``), every turn;
* ``cached`` (what ships): as ``shared`` on the first turn; afterwards each episode's keys and values are kept from one
  turn to the next (:class:`agentic_rl.models.generate.TurnCache`), so a turn prefills only what was added since.

All evaluate the same model on the same held-out problems with the settings of a run's evaluation stage (its
``config.yaml``: environment, its arguments, turn and token limits), with tools and without, greedy by default
(``--temperature 1 --num-samples 2`` plays sampled episodes, two per problem, as GRPO does), in one process, the
order rotating over ``--repeats``. Prints the CPU and wall seconds of each (medians), their ratios to ``whole``, the
tokens each prefilled, and how many episodes are identical to ``whole``'s (every message); exit status 1 when
accuracy differs.

    python benchmarks/bench_prefill.py --run runs/quickstart-agentic --samples 200
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
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant (the order rotating)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0 = torch's default)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 decodes greedily")
    parser.add_argument("--num-samples", type=int, default=1, help="episodes per problem (sampled when > 1)")
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
    values.update(eval_samples=args.samples, models=[str(run / args.stage / "model")],
                  temperature=args.temperature, num_samples=args.num_samples)
    config = config_from_dict(EvalConfig, values, where="bench_prefill")
    rows = load_rows(config)
    env_factory = build_environment(config)
    model, tokenizer = load_model_and_tokenizer(config.models[0], dtype=config.dtype, for_training=False)

    prefilled = {"tokens": 0}
    forward = model.forward

    def counting_forward(*a, **k):
        if k["input_ids"].shape[1] > 1:
            prefilled["tokens"] += k["input_ids"].numel()  # padding included
        return forward(*a, **k)

    counting_forward.__signature__ = inspect.signature(forward)  # the decode loop reads the forward's signature
    model.forward = counting_forward
    shipped_prefix, shipped_cache = generation.MIN_SHARED_PREFIX, generation.TurnCache.for_model

    def keep_nothing(model):
        return generation.TurnCache(0)

    variants = {"whole": (10**9, keep_nothing), "shared": (shipped_prefix, keep_nothing),
                "cached": (shipped_prefix, shipped_cache)}
    wall = {v: [] for v in variants}
    cpu = {v: [] for v in variants}
    tokens, results, episodes = {}, {}, {}
    scratch = Path(tempfile.mkdtemp(prefix="bench_prefill_"))
    print(f"{config.environment} {config.environment_args} | {len(rows)} problems | model {config.models[0]} | "
          f"torch threads {torch.get_num_threads()}", flush=True)
    try:
        for i in range(args.repeats):
            names = list(variants)
            for variant in names[i % len(names):] + names[:i % len(names)]:
                generation.MIN_SHARED_PREFIX, generation.TurnCache.for_model = variants[variant]
                prefilled["tokens"] = 0
                start, start_cpu = time.perf_counter(), time.process_time()
                try:
                    metrics = evaluate_model_in_environment(model, rows, config, env_factory, tokenizer=tokenizer,
                                                            output_dir=scratch / variant)
                finally:
                    generation.MIN_SHARED_PREFIX, generation.TurnCache.for_model = shipped_prefix, shipped_cache
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
    for variant in ("shared", "cached"):
        same = {key: sum(a["messages"] == b["messages"] for a, b in zip(episodes["whole"][key],
                                                                       episodes[variant][key]))
                for key in episodes["whole"]}
        print(f"{variant} / whole: {median[variant] / median['whole']:.3f} wall, "
              f"{median_cpu[variant] / median_cpu['whole']:.3f} CPU, {tokens[variant] / tokens['whole']:.3f} tokens "
              f"prefilled; identical episodes: "
              + ", ".join(f"{k.replace('_', ' ')} {n}/{len(episodes['whole'][k])}" for k, n in same.items()))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    differs = any(results["whole"][k] != results[v][k] for v in ("shared", "cached")
                  for k in ("accuracy", "accuracy_without_tools"))
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
