"""GRPO steps with and without the completions whose advantages are all zero in the loss pass, side by side.

When both episodes of a problem score the same, their advantages are zero, and without a KL term their forward and
backward passes change nothing (:meth:`agentic_rl.train.grpo_trainer.SignalGRPOTrainer.rows_with_signal`). Variants,
from a run's GRPO settings (its ``grpo/config.yaml``, which needs ``beta: 0``), starting from the run's SFT model:

* ``all-rows``: ``skip_zero_advantage_rows: false``, every completion in the loss pass (TRL's own pass);
* ``rows-with-signal``: ``skip_zero_advantage_rows: true`` (the default).

Each runs the GRPO stage for ``--steps`` steps in a child process, one torch thread, held-out checks and checkpoints
off, in ABBA order over ``--repeats`` so that load from other processes hits both alike. Prints the median seconds
per step (the trainer's runtime / steps) and of it generating, the first step's loss and gradient norm (equal up to
rounding: the same update), the share of completions left out, and the ratio.

    python benchmarks/bench_zero_advantage_rows.py --run runs/quickstart-agentic --steps 20 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CHILD = """
import json, sys, torch
torch.set_num_threads(1)
from agentic_rl.config import config_from_dict, read_yaml
from agentic_rl.train import grpo
from agentic_rl.utils import read_jsonl
settings = json.loads(sys.argv[1])
values = {**read_yaml(settings.pop("config")), **settings}
result = grpo.run(config_from_dict(grpo.GRPOConfig, values, where="bench_zero_advantage_rows"))
rows = [s for s in read_jsonl(values["output_dir"] + "/metrics.jsonl") if "train/loss" in s]
mean = lambda key: sum(s.get(key, 0.0) for s in rows) / len(rows)
print("RESULT", json.dumps({"step_s": result["train_metrics"]["train_runtime"] / values["max_steps"],
                            "generation_s": mean("perf/generation_s"), "loss": rows[0]["train/loss"],
                            "grad_norm": rows[0]["train/grad_norm"],
                            "skipped": mean("grpo/signal/skipped_row_fraction")}))
"""

VARIANTS = {"all-rows": False, "rows-with-signal": True}


def run_variant(config: Path, model: str, out: Path, steps: int, skip: bool) -> dict:
    settings = {"config": str(config), "model": model, "output_dir": str(out), "max_steps": steps,
                "heldout_every": 0, "save_steps": 10**6, "report_to": ["none"], "completions_every": 0,
                "skip_zero_advantage_rows": skip, "overwrite": True}
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(settings)], capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    line = next((x for x in child.stdout.splitlines() if x.startswith("RESULT ")), None)
    if child.returncode != 0 or line is None:
        tail = (child.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"the run with skip_zero_advantage_rows {skip} failed: {tail}")
    return json.loads(line[len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a pipeline run with grpo/config.yaml (beta 0) and sft/model "
                        "(e.g. runs/quickstart-agentic)")
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps per variant and repeat")
    parser.add_argument("--repeats", type=int, default=1, help="ABBA rounds (each runs both variants twice)")
    args = parser.parse_args(argv)

    from agentic_rl.config import read_yaml

    run = Path(args.run)
    config, model = run / "grpo" / "config.yaml", str(run / "sft" / "model")
    if not config.is_file() or not Path(model).is_dir():
        parser.error(f"{run} holds no grpo/config.yaml and sft/model: give a pipeline run with SFT and GRPO stages")
    values = read_yaml(config)
    if values.get("beta"):
        parser.error(f"{config} has beta {values['beta']}: with a KL term every completion changes the update")
    print(f"{values.get('environment')} | {values['batch_size']} completions per micro-step, groups of "
          f"{values['num_generations']} | {args.steps} steps from {model}", flush=True)
    order = [name for _ in range(args.repeats) for name in (*VARIANTS, *reversed(VARIANTS))]
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench_zero_advantage_rows_") as work:
        for i, name in enumerate(order):
            r = run_variant(config, model, Path(work) / f"{name}-{i}", args.steps, VARIANTS[name])
            results[name].append(r)
            print(f"  {name:<17} {r['step_s']:6.2f} s/step ({r['generation_s']:.2f} generating), first step loss "
                  f"{r['loss']:+.6f}, grad norm {r['grad_norm']:.6f}, left out {r['skipped']:.0%}", flush=True)
    median = {name: statistics.median(r["step_s"] for r in rs) for name, rs in results.items()}
    print(f"rows-with-signal / all-rows: {median['rows-with-signal'] / median['all-rows']:.3f} time per step "
          f"(medians {median['rows-with-signal']:.2f} / {median['all-rows']:.2f} s); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
