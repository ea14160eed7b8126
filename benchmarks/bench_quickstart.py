"""The full embedded ladder over several seeds: held-out accuracy per stage (greedy and sampled) and wall time.

    .venv/bin/python benchmarks/bench_quickstart.py --seeds 0 1 2

Each seed is a complete `agentic-rl quickstart` run (runs/quickstart-seed<N>/, re-runs skip finished stages). The
table prints greedy held-out accuracy for base / SFT / GRPO, the GRPO - SFT difference, the sampled accuracy (mean
over --samples completions per problem at --temperature, i.e. pass@1 of sampling) and the wall time, then the mean
over seeds, and the peak resident memory of the process so far (ru_maxrss). Learning claims are on the held-out
split only.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

from agentic_rl.config import read_yaml
from agentic_rl.pipeline import QuickstartConfig, run_quickstart

STAGES = ("base", "sft", "grpo")


def sampled_accuracy(model_dir: str, eval_samples: int, seed: int, samples: int, temperature: float,
                     system_prompt: str | None) -> float:
    from agentic_rl.eval import evaluate_model

    metrics = evaluate_model(model_dir, "synthetic", split="test", eval_samples=eval_samples, seed=seed,
                             num_samples=samples, temperature=temperature, max_new_tokens=64,
                             system_prompt=system_prompt)
    return metrics["pass@1"] if "pass@1" in metrics else metrics["accuracy_strict"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-samples", type=int, default=500)
    parser.add_argument("--samples", type=int, default=4, help="sampled completions per problem (0: skip)")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()

    rows = []
    for seed in args.seeds:
        start = time.time()
        summary = run_quickstart(QuickstartConfig(name=f"quickstart-seed{seed}", seed=seed, fresh=args.fresh,
                                                  eval_samples=args.eval_samples))
        row = {"seed": seed, "wall_s": summary.get("total_wall_time_s", time.time() - start),
               "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
        system_prompt = read_yaml(f"runs/quickstart-seed{seed}/config.yaml").get("system_prompt")
        for stage in STAGES:
            row[stage] = summary["stages"][stage]["accuracy"]
            if args.samples:
                row[f"{stage}_sampled"] = sampled_accuracy(summary["models"][stage], args.eval_samples, seed,
                                                           args.samples, args.temperature, system_prompt)
        rows.append(row)
        print(json.dumps(row), flush=True)

    header = (["seed", *STAGES, "grpo-sft"] + ([f"{s} sampled" for s in STAGES] if args.samples else [])
              + ["wall s", "peak GB"])
    print("\n| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")

    def line(label, r):
        cells = [label] + [f"{r[s]:.1%}" for s in STAGES] + [f"{100 * (r['grpo'] - r['sft']):+.1f} pt"]
        if args.samples:
            cells += [f"{r[f'{s}_sampled']:.1%}" for s in STAGES]
        return "| " + " | ".join(cells + [f"{r['wall_s']:.0f}", f"{r['peak_rss_gb']:.2f}"]) + " |"

    for r in rows:
        print(line(str(r["seed"]), r))
    mean = {k: statistics.mean(r[k] for r in rows) for k in rows[0] if k != "seed"}
    print(line("mean", mean))


if __name__ == "__main__":
    main()
