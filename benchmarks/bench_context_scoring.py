"""GRPO steps in an environment with a context window, side by side: one micro-step of the whole step's episodes
vs micro-steps of a few episodes (the same episodes per step, the same loss).

With a ``context_window`` each turn is scored in the context it was sampled in (the prompt and the latest turns), so
an episode becomes several rows, one per context view
(:class:`agentic_rl.train.logprobs.FoldedContextScoring`), and the backward pass holds every view of its micro-step:
the memory preset's episodes have about six. Variants, from a run's GRPO settings (its ``config.yaml``):

* ``one-micro-step``: ``batch_size`` = the step's episodes, ``gradient_accumulation_steps`` 1;
* ``micro-steps-of-N`` (``--micro-batch N``, default 8): ``batch_size`` N, ``gradient_accumulation_steps`` = the
  step's episodes / N (TRL normalises the loss over the whole step, so it is the same loss).

Each runs the GRPO stage for ``--steps`` steps in a child process (so its peak resident memory is its own) from the
run's SFT model, held-out checks and checkpoints off, one torch thread. Prints seconds per step (the trainer's
runtime / steps), peak RSS, the first step's loss and gradient norm (equal up to rounding) and the ratios.

    python benchmarks/bench_context_scoring.py --run runs/quickstart-memory --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
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
result = grpo.run(config_from_dict(grpo.GRPOConfig, values, where="bench_context_scoring"))
first = next(s for s in read_jsonl(values["output_dir"] + "/metrics.jsonl") if "train/loss" in s)
print("RESULT", json.dumps({"step_s": result["train_metrics"]["train_runtime"] / values["max_steps"],
                            "loss": first["train/loss"], "grad_norm": first["train/grad_norm"]}))
"""


def run_variant(config: Path, model: str, out: Path, steps: int, micro_batch: int, accumulation: int) -> dict:
    settings = {"config": str(config), "model": model, "output_dir": str(out), "max_steps": steps,
                "heldout_every": 0, "save_steps": 10**6, "report_to": ["none"], "completions_every": 0,
                "batch_size": micro_batch, "gradient_accumulation_steps": accumulation}
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(settings)], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    line = next((x for x in output.splitlines() if x.startswith("RESULT ")), None)
    if status != 0 or line is None:
        raise SystemExit(f"the run with micro-steps of {micro_batch} failed (status {status})")
    return {**json.loads(line[len("RESULT "):]), "peak_gb": usage.ru_maxrss / 1024**2}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a pipeline run with grpo/config.yaml and sft/model (e.g. "
                        "runs/quickstart-memory)")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per variant")
    parser.add_argument("--micro-batch", type=int, default=8, help="episodes per micro-step of the second variant")
    args = parser.parse_args(argv)

    from agentic_rl.config import read_yaml

    run = Path(args.run)
    config, model = run / "grpo" / "config.yaml", str(run / "sft" / "model")
    values = read_yaml(config)
    episodes = values["batch_size"] * values["gradient_accumulation_steps"]
    if episodes % args.micro_batch:
        parser.error(f"--micro-batch {args.micro_batch} does not divide the {episodes} episodes of a step")
    variants = {"one-micro-step": (episodes, 1),
                f"micro-steps-of-{args.micro_batch}": (args.micro_batch, episodes // args.micro_batch)}
    print(f"{values['environment']} {values['environment_args']} | {episodes} episodes per step | {args.steps} "
          f"steps from {model}", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_context_scoring_") as work:
        for name, (micro_batch, accumulation) in variants.items():
            results[name] = r = run_variant(config, model, Path(work) / name, args.steps, micro_batch, accumulation)
            print(f"  {name:<20} {micro_batch:>3} x {accumulation}: {r['step_s']:6.2f} s/step, peak "
                  f"{r['peak_gb']:.2f} GB, first step loss {r['loss']:+.6f}, grad norm {r['grad_norm']:.6f}",
                  flush=True)
    one, micro = results.values()
    print(f"micro-steps / one micro-step: {micro['step_s'] / one['step_s']:.3f} time per step, "
          f"{micro['peak_gb'] / one['peak_gb']:.3f} peak memory; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
