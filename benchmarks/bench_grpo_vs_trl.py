"""Our GRPO stage vs a bare TRL ``GRPOTrainer`` script, identical settings, in one process: step-time ratio.

Both sides train the same model directory on the same prompts with the same rewards, LoRA config, group size,
completion length, learning rate, β and steps; the runs alternate in ABBA order (bare, ours, ours, bare, ...) so
that load from other processes on a shared machine and warm-up effects hit both alike, and the median per-step time
of each side is compared. The step time is the trainer's own ``train_runtime / steps`` (generation + reward + loss
+ optimizer + our callbacks: metric logging, health rules, completions.jsonl); model loading and the final merged
save are reported apart.
Our periodic held-out evaluation is switched off here (it is extra work by design, not overhead); checkpoints are
off on both sides. CPU time (user + sys of this process) is reported too: on a shared machine it is steadier than
wall time.

    .venv/bin/python benchmarks/bench_grpo_vs_trl.py                      # embedded tiny model, random init
    .venv/bin/python benchmarks/bench_grpo_vs_trl.py --model runs/quickstart/sft/model --steps 10 --repeats 3

Goal: ours <= 1.05x bare TRL.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def embedded_model(path: Path) -> Path:
    """The embedded tiny Qwen3 (random init) with its BPE tokenizer: generation always runs to the length limit,
    so both sides do exactly the same amount of work."""
    from agentic_rl.data.synthetic import default_tokenizer_corpus
    from agentic_rl.models.tiny import build_tiny_model, save_model_dir, train_tokenizer

    tokenizer = train_tokenizer(default_tokenizer_corpus(2000, seed=0), vocab_size=512)
    return save_model_dir(build_tiny_model(tokenizer, "tiny", seed=0), tokenizer, path)


def settings(args) -> dict:
    return dict(num_generations=args.group, batch_size=args.group * args.prompts, max_completion_length=args.length,
                learning_rate=args.lr, beta=args.beta, max_steps=args.steps, lora_r=args.lora_r,
                lora_alpha=2 * args.lora_r, temperature=1.0, seed=0, max_train_samples=args.train_samples)


def run_ours(model_dir: Path, out: Path, s: dict) -> dict:
    from agentic_rl.config import config_from_dict
    from agentic_rl.train.grpo import GRPOConfig, run

    cfg = config_from_dict(GRPOConfig, dict(model=str(model_dir), output_dir=str(out), preset="tiny",
                                            gradient_accumulation_steps=1, heldout_every=0,
                                            save_steps=10**6, report_to=["tensorboard"], **s))
    t0, c0 = time.perf_counter(), cpu_seconds()
    result = run(cfg)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    train = result["train_metrics"]["train_runtime"]
    return {"step_s": train / s["max_steps"], "train_s": train, "stage_wall_s": wall, "stage_cpu_s": cpu}


def run_bare_trl(model_dir: Path, out: Path, s: dict) -> dict:
    """What a user would write with TRL alone: load, LoRA config, GRPOConfig, GRPOTrainer.train()."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig as TRLGRPOConfig
    from trl import GRPOTrainer

    from agentic_rl.data import load_task_dataset, to_rl_dataset
    from agentic_rl.rewards import build_rewards

    t0, c0 = time.perf_counter(), cpu_seconds()
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # The same prompts our stage trains on: the synthetic train split, shuffled with the seed, first N.
    rows = to_rl_dataset(load_task_dataset("synthetic", "train", seed=0,
                                           synthetic_train_size=s["max_train_samples"])).to_list()
    random.Random(s["seed"]).shuffle(rows)
    rows = rows[: s["max_train_samples"]]
    funcs, weights = build_rewards(["accuracy:1.0", "format:0.2"])
    args = TRLGRPOConfig(
        output_dir=str(out), seed=s["seed"], max_steps=s["max_steps"], learning_rate=s["learning_rate"],
        per_device_train_batch_size=s["batch_size"], gradient_accumulation_steps=1,
        num_generations=s["num_generations"], max_completion_length=s["max_completion_length"], beta=s["beta"],
        temperature=s["temperature"], top_k=0, reward_weights=weights, lr_scheduler_type="constant_with_warmup",
        report_to="none", logging_steps=1, save_strategy="no", bf16=False, gradient_checkpointing=False,
        disable_dropout=True, chat_template_kwargs={"enable_thinking": False})
    lora = LoraConfig(r=s["lora_r"], lora_alpha=s["lora_alpha"], lora_dropout=0.0, target_modules="all-linear",
                      task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, peft_config=lora)
    metrics = trainer.train().metrics
    from agentic_rl.runs import MODEL_FOLDER

    trainer.model.merge_and_unload().save_pretrained(out / MODEL_FOLDER)  # as our stage saves its model
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    train = metrics["train_runtime"]
    return {"step_s": train / s["max_steps"], "train_s": train, "stage_wall_s": wall, "stage_cpu_s": cpu}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (default: the embedded tiny model, random init)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2, help="alternating runs per side")
    p.add_argument("--group", type=int, default=8, help="num_generations")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--length", type=int, default=32, help="max_completion_length")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--beta", type=float, default=0.05)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--train-samples", type=int, default=256)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench_grpo_"))
    model_dir = Path(args.model) if args.model else embedded_model(work / "model")
    s = settings(args)
    print(f"settings: {s} | model {model_dir} | torch threads {torch.get_num_threads()}", flush=True)
    results: dict[str, list[dict]] = {"bare TRL": [], "ours": []}
    sides = [("bare TRL", run_bare_trl), ("ours", run_ours)]
    for i in range(args.repeats):
        for name, fn in (sides if i % 2 == 0 else sides[::-1]):  # ABBA order: neither side always goes first
            r = fn(model_dir, work / f"{name.replace(' ', '_')}_{i}", s)
            results[name].append(r)
            print(f"  run {i + 1} {name:8s}: {r['step_s']:.2f} s/step (train {r['train_s']:.1f}s, stage wall "
                  f"{r['stage_wall_s']:.1f}s, cpu {r['stage_cpu_s']:.1f}s)", flush=True)
    med = {k: statistics.median(r["step_s"] for r in v) for k, v in results.items()}
    cpu = {k: statistics.median(r["stage_cpu_s"] for r in v) for k, v in results.items()}
    print(f"\nmedian step time: bare TRL {med['bare TRL']:.2f}s, ours {med['ours']:.2f}s "
          f"-> ratio {med['ours'] / med['bare TRL']:.3f} (goal <= 1.05)")
    print(f"median whole-stage CPU time: bare TRL {cpu['bare TRL']:.1f}s, ours {cpu['ours']:.1f}s "
          f"-> ratio {cpu['ours'] / cpu['bare TRL']:.3f}")
    load = os.getloadavg()
    print(f"load average during the run: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
