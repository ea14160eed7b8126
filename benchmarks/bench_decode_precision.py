"""Decoding under bf16 mixed precision on a CPU, side by side: autocast against the weights' own precision (fp32).

With ``bf16`` set, TRL trains through accelerate's mixed precision, which wraps the model instance's ``forward`` in
bf16 autocast. GRPO samples its episodes and runs its held-out checks with that model. Two variants of the decode
loop (:func:`agentic_rl.models.generate.generate_token_ids`) on the same model, wrapped that way:

* ``autocast``: every decoding step in the wrapper, as TRL's own generation runs;
* ``weights`` (what ships: :func:`agentic_rl.models.generate.weights_precision`): the wrapper set aside while
  decoding, the steps in fp32, the precision evaluation loads the model in on a CPU.

Both play the same held-out episodes with the settings of a run's evaluation stage (its ``config.yaml``: environment,
arguments, turn and token limits), sampled at ``--temperature`` with ``--num-samples`` episodes per problem as GRPO
does (``--temperature 0`` decodes greedily), in one process, alternating over ``--repeats``. Prints the wall and CPU
seconds of each (medians), their ratios weights / autocast and the accuracies (bf16 rounding changes a few samples).

    python benchmarks/bench_decode_precision.py --run runs/quickstart-agentic --samples 128
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--run", required=True, help="a pipeline run directory with eval/<stage>/config.yaml and "
                        "<stage>/model (e.g. runs/quickstart-agentic)")
    parser.add_argument("--stage", default="sft", help="the stage whose model and evaluation settings to use")
    parser.add_argument("--samples", type=int, default=128, help="held-out problems")
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant (alternating)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0 = torch's default)")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 decodes greedily")
    parser.add_argument("--num-samples", type=int, default=2, help="episodes per problem")
    args = parser.parse_args(argv)

    import torch
    from accelerate import Accelerator

    import agentic_rl.models.generate as generation
    from agentic_rl.agent.settings import build_environment
    from agentic_rl.config import config_from_dict, read_yaml
    from agentic_rl.eval.evaluate import EvalConfig, evaluate_model_in_environment, load_rows
    from agentic_rl.models.loading import load_model_and_tokenizer

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    run = Path(args.run)
    values = read_yaml(run / "eval" / args.stage / "config.yaml")
    values.update(eval_samples=args.samples, models=[str(run / args.stage / "model")],
                  temperature=args.temperature, num_samples=args.num_samples)
    config = config_from_dict(EvalConfig, values, where="bench_decode_precision")
    rows = load_rows(config)
    env_factory = build_environment(config)
    model, tokenizer = load_model_and_tokenizer(config.models[0], dtype="float32", for_training=True)
    # As GRPO holds the policy while it samples: in training mode, weights that take gradients (in evaluation mode,
    # with weights that take none, both variants decode at about one speed).
    model = Accelerator(cpu=True, mixed_precision="bf16").prepare_model(model)
    model.train().requires_grad_(True)
    if "forward" not in vars(model):
        print("accelerate set no mixed-precision wrapper on this model: nothing to compare", file=sys.stderr)
        return 2

    variants = {"autocast": False, "weights": True}
    wall = {v: [] for v in variants}
    cpu = {v: [] for v in variants}
    accuracy = {}
    scratch = Path(tempfile.mkdtemp(prefix="bench_decode_precision_"))
    print(f"{config.environment} {config.environment_args} | {len(rows)} problems x {args.num_samples} at "
          f"temperature {args.temperature} | model {config.models[0]} | torch threads {torch.get_num_threads()}",
          flush=True)
    shipped = generation.CPU_DECODES_IN_WEIGHTS_PRECISION
    try:
        for i in range(args.repeats):
            names = list(variants) if i % 2 == 0 else list(variants)[::-1]
            for variant in names:
                generation.CPU_DECODES_IN_WEIGHTS_PRECISION = variants[variant]
                start, start_cpu = time.perf_counter(), time.process_time()
                metrics = evaluate_model_in_environment(model, rows, config, env_factory, tokenizer=tokenizer,
                                                        output_dir=scratch / variant)
                wall[variant].append(time.perf_counter() - start)
                cpu[variant].append(time.process_time() - start_cpu)
                accuracy.setdefault(variant, []).append(metrics["accuracy"])
                print(f"  run {i + 1} {variant:<8} {wall[variant][-1]:7.1f} s wall {cpu[variant][-1]:7.1f} s CPU, "
                      f"accuracy {metrics['accuracy']:.3f} with tools, {metrics['accuracy_without_tools']:.3f} "
                      "without", flush=True)
    finally:
        generation.CPU_DECODES_IN_WEIGHTS_PRECISION = shipped
        shutil.rmtree(scratch, ignore_errors=True)
    median = {v: statistics.median(t) for v, t in wall.items()}
    median_cpu = {v: statistics.median(t) for v, t in cpu.items()}
    print(f"weights / autocast: {median['weights'] / median['autocast']:.3f} wall, "
          f"{median_cpu['weights'] / median_cpu['autocast']:.3f} CPU; mean accuracy with tools "
          + ", ".join(f"{v} {statistics.mean(a):.3f}" for v, a in accuracy.items()))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
