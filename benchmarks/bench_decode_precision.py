"""Decoding under bf16 mixed precision on a CPU, side by side: autocast against the weights' own precision (fp32).

With ``bf16`` set, TRL trains through accelerate's mixed precision, which wraps the model instance's ``forward`` in
bf16 autocast. GRPO samples its episodes and runs its held-out checks with that model, in training mode. Two variants
of the decode loop (:func:`agentic_rl.models.generate.generate_token_ids`) on the same model, wrapped that way:

* ``autocast``: every decoding step in the wrapper, in bf16 (what the setting alone gives);
* ``weights`` (what ships: :func:`agentic_rl.models.generate.weights_precision`): the wrapper set aside while
  decoding, the steps in fp32, the precision evaluation loads the model in on a CPU.

Both play the same episodes as GRPO's rollouts do (:func:`agentic_rl.agent.rollout.run_episodes`, the model in training
mode, ``--problems`` held-out problems in calls of ``--per-call`` problems × ``--num-samples`` episodes, at
``--temperature``), with the settings of a run's evaluation stage (its ``config.yaml``: environment, arguments, turn and
token limits), in one process, after an untimed pass of each, alternating over ``--repeats`` with the same random stream
for both. Prints the wall and CPU seconds of each (medians), their ratios weights / autocast and the share of correct
episodes (bf16 rounding can change a sample).

    python benchmarks/bench_decode_precision.py --run runs/quickstart-agentic
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a pipeline run directory with eval/<stage>/config.yaml and "
                        "<stage>/model (e.g. runs/quickstart-agentic)")
    parser.add_argument("--stage", default="sft", help="the stage whose model and evaluation settings to use")
    parser.add_argument("--problems", type=int, default=128, help="held-out problems")
    parser.add_argument("--per-call", type=int, default=16, help="problems per decoding call (16: the agentic "
                        "preset's GRPO step)")
    parser.add_argument("--num-samples", type=int, default=2, help="episodes per problem")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    parser.add_argument("--repeats", type=int, default=4, help="runs per variant (alternating)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0 = torch's default)")
    args = parser.parse_args(argv)

    import torch
    from accelerate import Accelerator

    import agentic_rl.models.generate as generation
    from agentic_rl.agent.rollout import RolloutSettings, run_episodes
    from agentic_rl.agent.settings import build_environment, environment_system_prompt
    from agentic_rl.config import config_from_dict, read_yaml
    from agentic_rl.data.formats import build_prompt
    from agentic_rl.eval.evaluate import EvalConfig, load_rows
    from agentic_rl.models.loading import load_model_and_tokenizer

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    run = Path(args.run)
    values = read_yaml(run / "eval" / args.stage / "config.yaml")
    values.update(eval_samples=args.problems, models=[str(run / args.stage / "model")])
    config = config_from_dict(EvalConfig, values, where="bench_decode_precision")
    rows = load_rows(config)
    env_factory = build_environment(config)
    system_prompt = environment_system_prompt(config.system_prompt, env_factory())  # as evaluation's, with tools
    model, tokenizer = load_model_and_tokenizer(config.models[0], dtype="float32", for_training=True)
    model = Accelerator(cpu=True, mixed_precision="bf16").prepare_model(model)
    model.train()  # as GRPO holds the policy while it samples
    if "_original_forward" not in vars(model):
        print("accelerate set no mixed-precision wrapper on this model: nothing to compare", file=sys.stderr)
        return 2
    settings = RolloutSettings(max_turn_tokens=config.max_turn_tokens, max_completion_length=config.max_new_tokens,
                               do_sample=True, temperature=args.temperature, tools_in_prompt=config.tools_in_prompt)

    def play() -> float:
        correct = 0
        for start in range(0, len(rows), args.per_call):
            chunk = [row for row in rows[start:start + args.per_call] for _ in range(args.num_samples)]
            trajectories = run_episodes(model, tokenizer, [env_factory() for _ in chunk], [dict(r) for r in chunk],
                                        [build_prompt(r["question"], system_prompt) for r in chunk], settings)
            correct += sum(t.correct for t in trajectories)
        return correct / (len(rows) * args.num_samples)

    variants = {"autocast": False, "weights": True}
    wall = {v: [] for v in variants}
    cpu = {v: [] for v in variants}
    correct = {v: [] for v in variants}
    print(f"{config.environment} {config.environment_args} | {len(rows)} problems x {args.num_samples} at "
          f"temperature {args.temperature}, {args.per_call} problems per call | model {config.models[0]} | torch "
          f"threads {torch.get_num_threads()}", flush=True)
    shipped = generation.CPU_DECODES_IN_WEIGHTS_PRECISION
    try:
        for flag in variants.values():  # untimed: the first pass of each builds its kernels
            generation.CPU_DECODES_IN_WEIGHTS_PRECISION = flag
            play()
        for i in range(args.repeats):
            for variant in (list(variants) if i % 2 == 0 else list(variants)[::-1]):
                generation.CPU_DECODES_IN_WEIGHTS_PRECISION = variants[variant]
                torch.manual_seed(i)
                start, start_cpu = time.perf_counter(), time.process_time()
                correct[variant].append(play())
                wall[variant].append(time.perf_counter() - start)
                cpu[variant].append(time.process_time() - start_cpu)
                print(f"  run {i + 1} {variant:<8} {wall[variant][-1]:7.1f} s wall {cpu[variant][-1]:7.1f} s CPU, "
                      f"{correct[variant][-1]:.3f} of the episodes correct", flush=True)
    finally:
        generation.CPU_DECODES_IN_WEIGHTS_PRECISION = shipped
    median = {v: statistics.median(t) for v, t in wall.items()}
    median_cpu = {v: statistics.median(t) for v, t in cpu.items()}
    print(f"weights / autocast: {median['weights'] / median['autocast']:.3f} wall, "
          f"{median_cpu['weights'] / median_cpu['autocast']:.3f} CPU; correct episodes "
          + ", ".join(f"{v} {statistics.mean(c):.3f}" for v, c in correct.items()))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
