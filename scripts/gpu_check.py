"""GPU check (called by scripts/gpu_check.sh): a Qwen3-0.6B-shaped model, generation, a few SFT and GRPO steps.

Builds a random-init model with Qwen3-0.6B's exact shape (28 layers, hidden 1024, GQA 16:8, head_dim 128, vocabulary
151,936, tied embeddings) and the embedded tokenizer (ids above its vocabulary are never produced by the data and are
skipped when decoding), saves it in bf16, then through the project's own functions:

1. batched greedy generation (``agentic_rl.models.generate.generate_batched``): tokens/s;
2. SFT (``agentic_rl.train.sft.run``) with LoRA and bf16 for ``--sft-steps`` steps;
3. GRPO (``agentic_rl.train.grpo.run``) with LoRA and bf16 for ``--grpo-steps`` steps (random weights never stop
   early, so every completion runs to ``--completion-length``: the worst case for generation time).

For each phase: step times (median after the first, which includes warm-up), peak GPU memory
(``torch.cuda.max_memory_allocated``) and tokens/s; everything also goes to ``gpu_check.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

QWEN3_0_6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False, hidden_act="silu")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu_check", help="where results go")
    p.add_argument("--layers", type=int, default=28, help="decoder layers (28 = Qwen3-0.6B)")
    p.add_argument("--sft-steps", type=int, default=8)
    p.add_argument("--sft-batch-size", type=int, default=16)
    p.add_argument("--grpo-steps", type=int, default=4)
    p.add_argument("--grpo-batch-size", type=int, default=64, help="completions per step (per device)")
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--completion-length", type=int, default=256)
    p.add_argument("--gen-prompts", type=int, default=128, help="prompts for the generation benchmark")
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--skip", action="append", default=[], choices=["generate", "sft", "grpo"])
    p.add_argument("--smoke", action="store_true",
                   help="a miniature model and sizes, CPU allowed: checks this script itself in a minute")
    args = p.parse_args(argv)
    if args.smoke:
        args.layers, args.sft_steps, args.grpo_steps, args.sft_batch_size = 1, 2, 2, 4
        args.grpo_batch_size, args.num_generations, args.completion_length = 8, 4, 8
        args.gen_prompts, args.gen_tokens = 8, 8
    return args


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak_gib() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def say(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Environment and model
# ---------------------------------------------------------------------------------------------------------------

def environment() -> dict:
    import torch

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "bf16": torch.cuda.is_available() and torch.cuda.is_bf16_supported()}
    for name in ("transformers", "trl", "peft", "accelerate", "datasets", "tokenizers", "vllm", "deepspeed",
                 "flash_attn"):
        try:
            env[name] = importlib.import_module(name).__version__
        except Exception as exc:  # absent or broken: say which
            env[name] = f"absent ({type(exc).__name__})"
    return env


def build_model(out: Path, layers: int, smoke: bool = False) -> tuple[Path, int]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agentic_rl.data.synthetic import default_tokenizer_corpus
    from agentic_rl.models.tiny import BOS_TOKEN, QWEN3_STYLE_CHAT_TEMPLATE, save_model_dir, train_tokenizer

    tokenizer = train_tokenizer(default_tokenizer_corpus(2000, seed=0), vocab_size=1024,
                                chat_template=QWEN3_STYLE_CHAT_TEMPLATE)
    shape = dict(QWEN3_0_6B, num_hidden_layers=layers)
    if smoke:
        shape.update(vocab_size=2048, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=32)
    config = Qwen3Config(**shape, max_window_layers=layers,
                         rope_parameters={"rope_theta": 1_000_000.0, "rope_type": "default"},
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.convert_tokens_to_ids(BOS_TOKEN))
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    path = save_model_dir(model, tokenizer, out / "qwen3-0.6b-shape")
    del model
    return path, n_params


# ---------------------------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------------------------

def step_timer():
    """A TrainerCallback recording each optimizer step's wall time (CUDA-synchronised) and the logged metrics."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.logs, self._t = [], [], None

        def on_step_begin(self, args, state, control, **kwargs):
            _sync()
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            _sync()
            self.times.append(time.perf_counter() - self._t)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                self.logs.append({"step": state.global_step, **logs})

    return StepTimer()


def summarize_steps(times: list[float]) -> dict:
    steady = times[1:] or times
    return {"steps": len(times), "first_step_s": round(times[0], 3) if times else None,
            "median_step_s": round(statistics.median(steady), 3) if steady else None}


def stage_config(cls, values: dict):
    """The stage config from ``values``; keys the stage does not have are reported, not silently dropped."""
    from agentic_rl.config import config_from_dict

    known = {f.name for f in dataclasses.fields(cls)}
    missing = sorted(set(values) - known)
    if missing:
        say(f"NOTE: {cls.__name__} has no {missing}; running without them")
    return config_from_dict(cls, {k: v for k, v in values.items() if k in known}, where=f"gpu_check {cls.__name__}")


def run_stage(run, cfg, timer) -> tuple[dict, float]:
    import inspect

    start = time.perf_counter()
    if "callbacks" in inspect.signature(run).parameters:
        result = run(cfg, callbacks=[timer])
    else:
        say("NOTE: the stage's run() takes no callbacks=; per-step times come from its metrics.jsonl if any")
        result = run(cfg)
    return result, time.perf_counter() - start


def metrics_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_generate(model_dir: Path, args) -> dict:
    from agentic_rl.data.formats import build_prompt
    from agentic_rl.models.generate import generate_batched
    from agentic_rl.models.loading import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(str(model_dir), for_training=False)
    prompts = [build_prompt(f"Tom has {i} apples and buys {i + 3} more. How many apples does he have?")
               for i in range(args.gen_prompts)]
    generate_batched(model, tokenizer, prompts[:4], max_new_tokens=8)  # warm-up
    _sync()
    _reset_peak()
    start = time.perf_counter()
    results = generate_batched(model, tokenizer, prompts, max_new_tokens=args.gen_tokens)
    _sync()
    seconds = time.perf_counter() - start
    tokens = sum(r[0].num_tokens for r in results)
    out = {"prompts": len(prompts), "new_tokens": tokens, "seconds": round(seconds, 2),
           "tokens_per_s": round(tokens / seconds, 1), "peak_mem_gib": _peak_gib(),
           "dtype": str(next(model.parameters()).dtype)}
    del model
    return out


def check_sft(model_dir: Path, out: Path, args) -> dict:
    from agentic_rl.train.sft import SFTConfig, run

    # dtype auto: bf16 weights and bf16 training on a GPU that supports it
    cfg = stage_config(SFTConfig, dict(model=str(model_dir), dataset="synthetic", output_dir=str(out / "sft"),
                                       max_steps=args.sft_steps, batch_size=args.sft_batch_size,
                                       gradient_accumulation_steps=1,
                                       max_train_samples=args.sft_steps * args.sft_batch_size, dtype="auto",
                                       lora_r=16, lora_alpha=32, lora_mlp=True, max_length=512, save_steps=10_000,
                                       report_to=["none"], logging_steps=1, seed=0))
    _reset_peak()
    timer = step_timer()
    result, wall = run_stage(run, cfg, timer)
    res = {"wall_s": round(wall, 1), "peak_mem_gib": _peak_gib(),
           **summarize_steps(timer.times)}
    tokens = [log.get("num_tokens") for log in timer.logs if log.get("num_tokens") is not None]
    if len(tokens) >= 2 and timer.times:
        per_step = (tokens[-1] - tokens[0]) / max(1, len(tokens) - 1)
        res["tokens_per_step"] = round(per_step)
        res["tokens_per_s"] = round(per_step / res["median_step_s"], 1)
    losses = [log["loss"] for log in timer.logs if "loss" in log]
    res["loss_first_last"] = [losses[0], losses[-1]] if losses else None
    res["model_dir"] = result.get("model_dir") if isinstance(result, dict) else str(result)
    return res


def check_grpo(model_dir: Path, out: Path, args) -> dict:
    import torch

    from agentic_rl.train.grpo import GRPOConfig, run

    gpu = torch.cuda.is_available()

    cfg = stage_config(GRPOConfig, dict(
        model=str(model_dir), dataset="synthetic", output_dir=str(out / "grpo"), max_steps=args.grpo_steps,
        max_train_samples=args.grpo_steps * args.grpo_batch_size, batch_size=args.grpo_batch_size,
        gradient_accumulation_steps=1, num_generations=args.num_generations,
        max_completion_length=args.completion_length, bf16=gpu, gradient_checkpointing=gpu, learning_rate=5e-6,
        beta=0.05, lora_r=16, lora_alpha=32, heldout_every=0, save_steps=10_000, completions_every=0,
        report_to=["none"], logging_steps=1, seed=0))
    _reset_peak()
    timer = step_timer()
    result, wall = run_stage(run, cfg, timer)
    res = {"wall_s": round(wall, 1), "peak_mem_gib": _peak_gib(),
           **summarize_steps(timer.times)}
    rows = timer.logs or metrics_jsonl(out / "grpo" / "metrics.jsonl")
    if not timer.times:  # the stage's own step timer (TRL's step_time)
        times = [r.get("step_time", r.get("perf/step_time_s")) for r in rows]
        times = [t for t in times if t is not None]
        if times:
            res.update(summarize_steps(times))
    lengths = [r.get("completions/mean_length", r.get("grpo/completion_length")) for r in rows]
    lengths = [x for x in lengths if x is not None]
    if lengths and res.get("median_step_s"):
        completions = args.grpo_batch_size  # one generation batch per optimizer step (gradient_accumulation 1)
        res["mean_completion_tokens"] = round(statistics.mean(lengths), 1)
        res["generated_tokens_per_s"] = round(completions * statistics.mean(lengths) / res["median_step_s"], 1)
    res["model_dir"] = result.get("model_dir") if isinstance(result, dict) else str(result)
    return res


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args)}
    report["environment"] = env = environment()
    say("environment: " + json.dumps(env))
    import torch

    if not torch.cuda.is_available() and not args.smoke:
        say("no CUDA GPU visible: this check is for a GPU machine (--smoke runs a miniature on CPU)")
        return 2
    failed = False
    t = time.perf_counter()
    model_dir, n_params = build_model(out / "work", args.layers, smoke=args.smoke)
    report["model"] = {"params": n_params, "layers": args.layers, "build_s": round(time.perf_counter() - t, 1)}
    say(f"model: {n_params / 1e6:.0f}M parameters (Qwen3-0.6B shape, {args.layers} layers), saved to {model_dir}")
    phases = [("generate", lambda: check_generate(model_dir, args)),
              ("sft", lambda: check_sft(model_dir, out / "work", args)),
              ("grpo", lambda: check_grpo(model_dir, out / "work", args))]
    for name, fn in phases:
        if name in args.skip:
            continue
        say(f"--- {name} ---")
        try:
            report[name] = fn()
            say(f"{name}: " + json.dumps(report[name]))
        except Exception as exc:  # keep going: one failing phase should not hide the others' numbers
            failed = True
            report[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
            say(f"{name} FAILED: {type(exc).__name__}: {exc}")
            traceback.print_exc()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    say("=== summary ===")
    for name in ("generate", "sft", "grpo"):
        r = report.get(name, {})
        if "error" in r:
            say(f"{name:9s} FAILED {r['error']}")
        elif r:
            keys = ("median_step_s", "first_step_s", "peak_mem_gib", "tokens_per_s", "generated_tokens_per_s",
                    "wall_s")
            say(f"{name:9s} " + "  ".join(f"{k}={r[k]}" for k in keys if r.get(k) is not None))
    say(f"wrote {out / 'gpu_check.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
