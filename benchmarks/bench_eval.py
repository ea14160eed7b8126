"""Batched evaluation vs a one-prompt-at-a-time ``generate`` loop: same model, same samples, side by side.

The naive loop is what a first evaluator does (and what the reference system did): render one prompt, call
``model.generate`` on it, decode, compare, next. Ours is :func:`agentic_rl.eval.evaluate_model`: length-sorted,
left-padded batches, then the full scoring (strict/lenient accuracy, rewards, steps, error analysis). Both decode
greedily with the same ``max_new_tokens`` and score with the same ``is_correct``, so accuracy must be identical;
the script prints both timings, the speed-up and whether the completions match text for text.

Run it::

    python benchmarks/bench_eval.py                       # newest runs/**/merged model, else a fresh tiny model
    python benchmarks/bench_eval.py --model runs/quickstart/sft/merged --samples 128 --max-new-tokens 128

Goal: ours >= 5x faster on CPU, same accuracy. Exit status 1 when the accuracies differ.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pick_model(arg: str | None, preset: str, scratch: str) -> tuple[str, str]:
    """(model dir, how it was chosen): --model, else the newest trained model under runs/, else a fresh tiny one."""
    if arg:
        return arg, "given"
    candidates = sorted(Path("runs").glob("**/merged/config.json"), key=lambda p: p.stat().st_mtime)
    if candidates:
        return str(candidates[-1].parent), "newest trained model under runs/"
    from agentic_rl.models.tiny import build_tiny_model, default_tokenizer_corpus, save_model_dir, train_tokenizer

    path = Path(scratch) / f"{preset}-random"
    tokenizer = train_tokenizer(default_tokenizer_corpus(2000, seed=0), vocab_size=512)
    save_model_dir(build_tiny_model(tokenizer, preset, seed=0), tokenizer, path)
    return str(path), f"fresh random-init '{preset}' embedded model (no trained model under runs/)"


def naive_loop(model, tokenizer, rows, max_new_tokens: int) -> tuple[list[str], float]:
    """One prompt per generate call, greedy; returns the completions and the accuracy."""
    import torch

    from agentic_rl.data.formats import build_prompt, render_prompt
    from agentic_rl.rewards import is_correct

    model.eval()
    texts, correct = [], 0
    for row in rows:
        prompt = render_prompt(tokenizer, build_prompt(row["question"]))
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(model.device)
        with torch.inference_mode():
            out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        text = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        texts.append(text)
        correct += is_correct(text, row["ground_truth"])
    return texts, correct / len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory (default: newest runs/**/merged, else a fresh tiny model)")
    parser.add_argument("--preset", default="tiny", help="embedded model preset when no model is found")
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--split", default="test")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=None, help="default: chosen for the device")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads for both sides (default 1: on a shared machine, more threads than "
                             "free cores make every step wait on the others; 0 = torch's default)")
    args = parser.parse_args(argv)

    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)

    from agentic_rl.data.custom import load_task_dataset
    from agentic_rl.eval import evaluate_model
    from agentic_rl.models.loading import load_model_and_tokenizer

    with tempfile.TemporaryDirectory(prefix="bench_eval_") as scratch:
        model_dir, how = pick_model(args.model, args.preset, scratch)
        model, tokenizer = load_model_and_tokenizer(model_dir, for_training=False)
    rows = load_task_dataset(args.dataset, args.split, max_samples=args.samples, seed=args.seed).to_list()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {model_dir} ({how}; {n_params / 1e6:.1f}M parameters, {model.device})")
    print(f"data:  {len(rows)} problems from {args.dataset}/{args.split}, greedy, max_new_tokens={args.max_new_tokens}"
          f"; torch threads={torch.get_num_threads()}, load average={os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")

    # Warm-up (first-call allocations, lazy imports) so neither side pays for it.
    naive_loop(model, tokenizer, rows[:1], 4)
    evaluate_model(model, rows[:2], tokenizer=tokenizer, max_new_tokens=4)

    start = time.perf_counter()
    naive_texts, naive_acc = naive_loop(model, tokenizer, rows, args.max_new_tokens)
    naive_s = time.perf_counter() - start

    start = time.perf_counter()
    metrics = evaluate_model(model, rows, tokenizer=tokenizer, max_new_tokens=args.max_new_tokens,
                             batch_size=args.batch_size, seed=args.seed)
    ours_s = time.perf_counter() - start
    ours_texts = [p["completion"] for p in sorted(metrics["predictions"], key=lambda p: p["index"])]
    same = sum(a == b for a, b in zip(naive_texts, ours_texts))

    print()
    print(f"{'method':<34} {'seconds':>8} {'problems/s':>11} {'accuracy':>9}")
    print(f"{'one prompt at a time (generate)':<34} {naive_s:>8.2f} {len(rows) / naive_s:>11.2f} {naive_acc:>9.3f}")
    print(f"{'batched evaluate_model (+scoring)':<34} {ours_s:>8.2f} {len(rows) / ours_s:>11.2f} "
          f"{metrics['accuracy_strict']:>9.3f}")
    print(f"  of which generation: {metrics['timing']['generation_seconds']:.2f} s")
    speedup = naive_s / ours_s
    print(f"\nspeed-up: {speedup:.1f}x (goal >= 5x)   identical completions: {same}/{len(rows)}   "
          f"same accuracy: {naive_acc == metrics['accuracy_strict']}")
    return 0 if naive_acc == metrics["accuracy_strict"] else 1


if __name__ == "__main__":
    sys.exit(main())
