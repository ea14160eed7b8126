"""Evaluation's generation side by side: a one-prompt-at-a-time loop, padded batches, and the default path.

Same model, same problems, same greedy settings, one process: each method renders the prompts with the model's own
system prompt (read from the config.yaml of the run that produced the model, e.g. ``runs/quickstart/sft/config.yaml``
for ``runs/quickstart/sft/model``), generates ``max_new_tokens`` at most, and is scored with the same ``is_correct``.

* ``naive``: :func:`agentic_rl.eval.generate_one_by_one`, one ``model.generate`` call per prompt (what the reference
  system did).
* ``padded``: :func:`agentic_rl.eval.generate_batched` with ``engine="padded"``: ``model.generate`` on length-sorted,
  left-padded batches (finished rows ride along until the longest one ends).
* ``default``: ``generate_batched`` as evaluation calls it (``engine="auto"``: the compact decode loop that drops each
  sequence from the batch the step it ends).
* ``--also``: more candidates for the record: ``continuous`` (transformers' continuous batching,
  ``model.generate_batch`` with paged attention), ``static`` (padded batches with ``cache_implementation="static"``),
  ``static-compile`` (the same under ``torch.compile``).

Prints CPU and wall seconds (medians over ``--repeats``, methods interleaved), generated tokens per CPU second and the
speed-ups (from CPU time, steadier than wall time on a shared machine; wall ratios in the last line), and counts the
completions identical to the naive loop's (text, token count and truncation flag). Exit status 1 when the default
path's completions differ from the naive loop's.

Run it::

    python benchmarks/bench_eval.py --model runs/quickstart/sft/model --samples 200
    python benchmarks/bench_eval.py --model runs/quickstart/sft/model --samples 500 --repeats 3 --also continuous,static

Goal: the default path >= 10x the naive loop and >= 2x the padded batches, identical greedy completions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EXTRA = ("continuous", "static", "static-compile")


def pick_model(arg: str | None, preset: str, scratch: str) -> tuple[str, str]:
    """(model dir, how it was chosen): --model, else the newest trained model under runs/, else a fresh tiny one."""
    if arg:
        return arg, "given"
    from agentic_rl.runs import MODEL_FOLDER

    candidates = sorted(Path("runs").glob(f"**/{MODEL_FOLDER}/config.json"), key=lambda p: p.stat().st_mtime)
    if candidates:
        return str(candidates[-1].parent), "newest trained model under runs/"
    from agentic_rl.data.synthetic import default_tokenizer_corpus
    from agentic_rl.models.tiny import build_tiny_model, save_model_dir, train_tokenizer

    path = Path(scratch) / f"{preset}-random"
    tokenizer = train_tokenizer(default_tokenizer_corpus(2000, seed=0), vocab_size=512)
    save_model_dir(build_tiny_model(tokenizer, preset, seed=0), tokenizer, path)
    return str(path), f"fresh random-init '{preset}' embedded model (no trained model under runs/)"


def run_system_prompt(model_dir: str) -> tuple[str | None, str]:
    """The ``system_prompt`` setting of the run that produced ``model_dir`` and where it was found: the first
    config.yaml with that key in the model folder or the two above it (``<run>/model`` -> ``<run>/config.yaml``,
    then the pipeline's). Unset everywhere = the stages' default (the standard instruction)."""
    from agentic_rl.config import read_yaml

    folder = Path(model_dir)
    for candidate in (folder, folder.parent, folder.parent.parent):
        path = candidate / "config.yaml"
        if path.is_file():
            data = read_yaml(path)
            if "system_prompt" in data:
                return data["system_prompt"], str(path)
    return None, "no run config with system_prompt found: the stages' default"


def run_method(name: str, model, tokenizer, prompts, max_new_tokens: int, batch_size: int | None):
    """GenerationResults of one method, in prompt order."""
    from agentic_rl.models.generate import GenerationResult, _decode, _eos_ids, generate_batched, generate_one_by_one

    if name == "naive":
        return generate_one_by_one(model, tokenizer, prompts, max_new_tokens=max_new_tokens)
    if name in ("padded", "default"):
        engine = "padded" if name == "padded" else "auto"
        return [r[0] for r in generate_batched(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                               batch_size=batch_size, engine=engine)]
    if name in ("static", "static-compile"):
        from transformers import CompileConfig

        saved = (model.generation_config.cache_implementation, model.generation_config.compile_config)
        model.generation_config.cache_implementation = "static"
        # transformers compiles a static-cache forward on its own only on accelerators; this asks for it on CPU too.
        model.generation_config.compile_config = (CompileConfig(_compile_all_devices=True)
                                                  if name == "static-compile" else None)
        try:
            return [r[0] for r in generate_batched(model, tokenizer, prompts, max_new_tokens=max_new_tokens,
                                                   batch_size=batch_size, engine="padded")]
        finally:
            model.generation_config.cache_implementation, model.generation_config.compile_config = saved
    if name == "continuous":
        from transformers import GenerationConfig

        from agentic_rl.data.formats import render_prompt

        eos_ids = _eos_ids(model, tokenizer)
        encoded = [tokenizer(render_prompt(tokenizer, p), add_special_tokens=False)["input_ids"] for p in prompts]
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_ids,
                                  pad_token_id=tokenizer.pad_token_id)
        outputs = model.generate_batch(encoded, generation_config=config, warmup=False)
        by_order = list(outputs.values())  # returned in input order
        if len(by_order) != len(prompts):
            return [GenerationResult("<failed>", 0, False)] * len(prompts)
        return [_decode(tokenizer, list(o.generated_tokens), eos_ids, max_new_tokens) for o in by_order]
    raise ValueError(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory (default: newest runs/**/model, else a fresh tiny model)")
    parser.add_argument("--preset", default="tiny", help="embedded model preset when no model is found")
    parser.add_argument("--system-prompt", default=argparse.SUPPRESS,
                        help="override the run config's system prompt ('' = none)")
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--split", default="test")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=None, help="default: chosen for the device and engine")
    parser.add_argument("--repeats", type=int, default=1, help="time every method N times (interleaved), report "
                                                               "the median")
    parser.add_argument("--also", default="", help=f"extra candidates, comma list of {', '.join(EXTRA)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads for every method (default 1: on a shared machine, more threads than "
                             "free cores make every step wait on the others; 0 = torch's default)")
    args = parser.parse_args(argv)
    extra = [name for name in args.also.split(",") if name]
    unknown = [name for name in extra if name not in EXTRA]
    if unknown:
        parser.error(f"--also: unknown {', '.join(unknown)}; choose from {', '.join(EXTRA)}")

    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)

    from agentic_rl.data.custom import load_task_dataset
    from agentic_rl.data.formats import build_prompt, resolve_system_prompt
    from agentic_rl.models.loading import load_model_and_tokenizer
    from agentic_rl.rewards import is_correct

    with tempfile.TemporaryDirectory(prefix="bench_eval_") as scratch:
        model_dir, how = pick_model(args.model, args.preset, scratch)
        model, tokenizer = load_model_and_tokenizer(model_dir, for_training=False)
    if hasattr(args, "system_prompt"):
        setting, source = args.system_prompt, "--system-prompt"
    else:
        setting, source = run_system_prompt(model_dir)
    system_prompt = resolve_system_prompt(setting)
    rows = load_task_dataset(args.dataset, args.split, max_samples=args.samples, seed=args.seed).to_list()
    prompts = [build_prompt(row["question"], system_prompt) for row in rows]
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model:  {model_dir} ({how}; {n_params / 1e6:.1f}M parameters, {model.device})")
    print(f"prompt: system message {'none' if system_prompt is None else repr(system_prompt)} (system_prompt "
          f"{setting!r} from {source})")
    print(f"data:   {len(rows)} problems from {args.dataset}/{args.split}, greedy, max_new_tokens={args.max_new_tokens}"
          f"; torch threads={torch.get_num_threads()}, load average={os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")

    methods = ["naive", "padded", "default", *extra]
    for name in methods:  # warm-up (first-call allocations, lazy imports) so that no method pays for it
        if name != "static-compile":
            run_method(name, model, tokenizer, prompts[:2], 4, args.batch_size)
    wall: dict[str, list[float]] = {name: [] for name in methods}
    cpu: dict[str, list[float]] = {name: [] for name in methods}
    results: dict[str, list] = {}
    for _ in range(args.repeats):
        for name in methods:
            start, start_cpu = time.perf_counter(), time.process_time()
            results[name] = run_method(name, model, tokenizer, prompts, args.max_new_tokens, args.batch_size)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)

    # Speed-ups from CPU time (this process, all its threads): on a shared machine other processes stretch wall time
    # by whatever they happen to run meanwhile; on an idle one the two agree (one thread).
    reference = results["naive"]
    print(f"\n{'method':<16} {'cpu s':>7} {'wall s':>7} {'tokens/s':>9} {'vs naive':>9} {'vs padded':>10} "
          f"{'identical':>10} {'accuracy':>9}  per-repeat cpu s")
    median = {name: statistics.median(values) for name, values in cpu.items()}
    median_wall = {name: statistics.median(values) for name, values in wall.items()}
    identical = {}
    for name in methods:
        generated = sum(r.num_tokens for r in results[name])
        identical[name] = sum(a == b for a, b in zip(results[name], reference))
        accuracy = sum(is_correct(r.text, row["ground_truth"]) for r, row in zip(results[name], rows)) / len(rows)
        print(f"{name:<16} {median[name]:>7.2f} {median_wall[name]:>7.2f} {generated / median[name]:>9.0f} "
              f"{median['naive'] / median[name]:>8.1f}x {median['padded'] / median[name]:>9.2f}x "
              f"{identical[name]:>5}/{len(rows):<4} {accuracy:>9.3f}  " + " ".join(f"{s:.2f}" for s in cpu[name]))
    lengths = [r.num_tokens for r in reference]
    print(f"\ncompletion tokens (naive): mean {statistics.mean(lengths):.1f}, min {min(lengths)}, max {max(lengths)}, "
          f"truncated {sum(r.truncated for r in reference)}; load average now {os.getloadavg()[0]:.1f}")
    print(f"default vs naive {median['naive'] / median['default']:.1f}x (goal >= 10x; wall "
          f"{median_wall['naive'] / median_wall['default']:.1f}x), "
          f"vs padded {median['padded'] / median['default']:.2f}x "
          f"(goal >= 2x; wall {median_wall['padded'] / median_wall['default']:.2f}x), identical to naive "
          f"{identical['default']}/{len(rows)}")
    return 0 if identical["default"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
