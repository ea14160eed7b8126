"""The embedded RLAIF ladder: SFT -> preferences -> reward model -> GRPO with the learned reward, beside GRPO with the
verifiable reward, both evaluated on the same held-out problems. No network.

    .venv/bin/python benchmarks/rlaif_ladder.py --sft-model runs/quickstart/sft/model --out runs/rlaif-seed0
    .venv/bin/python benchmarks/rlaif_ladder.py --seed 1     # builds its own small SFT model first (MINI_BASE)

Steps (each a stage function, outputs under --out, default ``runs/rlaif-ladder-seed<N>``). Running the same command
again skips the steps that finished with the same settings (recorded in ``<out>/ladder_stages.json``) and continues
with the rest; a step whose settings changed meets its earlier run and stops, as any stage does, unless
``--overwrite`` is given (every step is then run again and replaces its outputs).

0. Without ``--sft-model``: the embedded pipeline's pretrain + SFT at the size of :data:`MINI_BASE` (the micro model,
   a few minutes on one core) into ``runs/rlaif-base-seed<N>``; it gets only ~1-2 % of the test problems right, so
   most preference pairs rank formatting; the full ``agentic-rl quickstart`` SFT is the stronger start.

1. ``preferences/``: the SFT model samples ``--k`` completions for each of ``--prompts`` training prompts; the judge
   (``--judge``, default the verifier ``accuracy:1.0`` plus ``format:0.2`` so that a weak model's prompts with no
   right answer still rank a well-formed attempt above a malformed one) scores them; best vs worst become a pair.
2. ``reward-model/``: a reward model trained on those pairs; its held-out pairwise accuracy is printed.
3. ``grpo-rm/`` and ``grpo-verifier/``: GRPO from the SFT model with identical settings; the first is trained on the
   reward model alone, the second on the verifier alone. Each run also *computes* the other reward at weight 0
   (logged, never trained on), so both runs show the reward-model score and the verifier accuracy of their samples
   over training: a learned reward that is hacked shows as a rising reward-model score with a falling accuracy.
4. ``eval/``: ``agentic-rl eval`` of SFT, GRPO(rm) and GRPO(verifier) on the same ``--eval-samples`` test problems,
   greedy.

The SFT model should get a few percent right (the full ``agentic-rl quickstart`` SFT does); with one that gets
nothing right every preference pair is a formatting judgement only.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path

from agentic_rl.config import config_from_dict
from agentic_rl.eval.evaluate import EvalConfig
from agentic_rl.eval.evaluate import run as run_eval
from agentic_rl.pipeline import PipelineConfig, run_pipeline
from agentic_rl.runs import MODEL_FOLDER, differing_keys, settings_of
from agentic_rl.train.grpo import GRPOConfig
from agentic_rl.train.grpo import run as run_grpo
from agentic_rl.train.preferences import PreferencesConfig
from agentic_rl.train.preferences import run as run_preferences
from agentic_rl.train.reward_model import RewardModelConfig
from agentic_rl.train.reward_model import run as run_reward_model
from agentic_rl.utils import free_memory, log, read_json, read_jsonl, write_json

#: The small SFT model built when no --sft-model is given: the smoke quickstart's micro model, trained longer.
MINI_BASE = {
    "model": "embedded", "dataset": "synthetic", "system_prompt": "", "stages": ["pretrain", "sft"],
    "evaluate_stages": False,
    "pretrain": {"model_preset": "micro", "corpus_lines": 2000, "vocab_size": 512, "max_steps": 60, "batch_size": 8,
                 "seq_length": 64},
    "sft": {"full": True, "learning_rate": 1e-3, "max_steps": 300, "batch_size": 16, "max_train_samples": 4000,
            "logging_steps": 20, "save_steps": 300},
}


def _mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else float("nan")


def training_curve(run_dir: Path) -> dict[str, list[float]]:
    """Per-step mean reward-model score and verifier accuracy of the samples GRPO trained on."""
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "grpo/reward/reward_model" in r]
    return {"step": [r["step"] for r in rows], "rm": [r["grpo/reward/reward_model"] for r in rows],
            "accuracy": [r.get("grpo/reward/accuracy") for r in rows]}


def thirds(values: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last third of a curve (the per-step values are noisy)."""
    n = max(1, len(values) // 3)
    return _mean(values[:n]), _mean(values[-n:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft-model", help="the SFT model directory (e.g. runs/quickstart/sft/model); default: "
                        "build MINI_BASE into runs/rlaif-base-seed<seed>")
    parser.add_argument("--out", help="output folder (default: runs/rlaif-ladder-seed<seed>)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true",
                        help="run every step again, replacing the outputs of an earlier run in --out (without it, "
                             "steps that finished with the same settings are skipped)")
    parser.add_argument("--system-prompt", default="", help="as the SFT stage used ('' for the embedded quickstart)")
    parser.add_argument("--prompts", type=int, default=256, help="training prompts for the preference data")
    parser.add_argument("--k", type=int, default=4, help="completions sampled per prompt")
    parser.add_argument("--judge", nargs="+", default=["accuracy:1.0", "format:0.2"])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rm-epochs", type=float, default=2.0)
    parser.add_argument("--rm-lr", type=float, default=1e-4)
    parser.add_argument("--grpo-steps", type=int, default=30)
    parser.add_argument("--grpo-batch", type=int, default=32, help="completions per step")
    parser.add_argument("--grpo-lr", type=float, default=3e-5)
    parser.add_argument("--eval-samples", type=int, default=200)
    parser.add_argument("--report", nargs="+", metavar="SUMMARY.json",
                        help="print the tables of finished runs (and their mean) instead of running")
    args = parser.parse_args()
    if args.report:
        report(args.report)
        return

    out = Path(args.out or f"runs/rlaif-ladder-seed{args.seed}")
    started = time.time()
    timings: dict[str, float] = {}
    done_path = out / "ladder_stages.json"
    done = read_json(done_path) if done_path.is_file() else {}

    def timed(name, fn, config):
        """Run one step, or reuse its recorded result when it finished before with the same settings."""
        earlier = done.get(name)
        if (earlier is not None and not args.overwrite and Path(config.output_dir).is_dir()
                and not differing_keys(earlier["settings"], settings_of(config))):
            log(f"{name}: finished in an earlier run with the same settings, skipping (--overwrite runs it again)")
            timings[name] = earlier["wall_time_s"]
            return earlier["result"]
        if args.overwrite and hasattr(config, "overwrite"):
            config = dataclasses.replace(config, overwrite=True)
        t = time.time()
        result = fn(config)
        timings[name] = round(time.time() - t, 1)
        free_memory()
        done[name] = {"settings": settings_of(config), "result": result, "wall_time_s": timings[name]}
        write_json(done_path, done)
        return result

    if not args.sft_model:
        name = f"rlaif-base-seed{args.seed}"
        t = time.time()  # the pipeline skips its own finished stages
        run_pipeline(config_from_dict(PipelineConfig, {**MINI_BASE, "name": name, "seed": args.seed}))
        timings["base"] = round(time.time() - t, 1)
        free_memory()
        args.sft_model = str(Path("runs") / name / "sft" / MODEL_FOLDER)
    common = {"seed": args.seed, "system_prompt": args.system_prompt}
    pref = timed("preferences", run_preferences, config_from_dict(PreferencesConfig, dict(
        model=args.sft_model, max_samples=args.prompts, num_samples=args.k, temperature=1.0,
        max_new_tokens=args.max_new_tokens, judge=args.judge, output_dir=str(out / "preferences"), **common)))
    rm = timed("reward_model", run_reward_model, config_from_dict(RewardModelConfig, dict(
        model=args.sft_model, dataset=pref["pairs_path"], full=True, learning_rate=args.rm_lr, epochs=args.rm_epochs,
        batch_size=8, heldout_fraction=0.2, output_dir=str(out / "reward-model"), seed=args.seed, logging_steps=5)))
    rm_spec = f"reward_model(path={rm['model_dir']})"

    grpo_common = dict(model=args.sft_model, preset="tiny", full=True, learning_rate=args.grpo_lr,
                       max_steps=args.grpo_steps, batch_size=args.grpo_batch, num_generations=8,
                       max_completion_length=args.max_new_tokens, temperature=1.0, heldout_every=0,
                       save_steps=args.grpo_steps, completions_every=10, **common)
    # Same settings; each run computes the other's reward at weight 0 (logged, not trained on).
    runs = {"grpo_rm": [f"{rm_spec}:1.0", "accuracy:0.0"], "grpo_verifier": ["accuracy:1.0", f"{rm_spec}:0.0"]}
    grpo = {}
    for name, rewards in runs.items():
        grpo[name] = timed(name, run_grpo, config_from_dict(GRPOConfig, dict(
            grpo_common, rewards=rewards, output_dir=str(out / name.replace("_", "-")))))

    models = [args.sft_model, grpo["grpo_rm"]["model_dir"], grpo["grpo_verifier"]["model_dir"]]
    ev = timed("eval", run_eval, config_from_dict(EvalConfig, dict(
        models=models, dataset="synthetic", split="test", eval_samples=args.eval_samples, seed=0,
        max_new_tokens=args.max_new_tokens, system_prompt=args.system_prompt, output_dir=str(out / "eval"))))
    by_path = ev["models"]

    # --- summary and table ---------------------------------------------------------------------------------------
    summary = {"seed": args.seed, "sft_model": args.sft_model, "judge": list(args.judge), "k": args.k,
               "samples_per_step": args.grpo_batch, "preferences": pref["stats"], "reward_model": rm["metrics"],
               "models": {}}
    for name, path in zip(("sft", "grpo_rm", "grpo_verifier"), models):
        m = by_path[path]
        row = {"accuracy": m["accuracy_strict"], "format_rate": m["format_rate"]}
        if name != "sft":
            row["curve"] = training_curve(Path(grpo[name]["model_dir"]).parent)
        summary["models"][name] = row
    summary["timings_s"] = {**timings, "total": round(time.time() - started, 1)}
    write_json(out / "summary.json", summary)
    print_table(summary)
    print(f"summary: {out / 'summary.json'}")


def hacking_verdict(curve: dict[str, list[float]], samples_per_step: int) -> str:
    """Was the learned reward hacked? Its score rose from the first to the last third of training while the
    verifier accuracy of the same samples fell by more than two standard errors (two-proportion, pooled)."""
    (rm0, rm1), (acc0, acc1) = thirds(curve["rm"]), thirds(curve["accuracy"])
    n = max(1, len(curve["accuracy"]) // 3) * samples_per_step
    p = (acc0 + acc1) / 2
    se = math.sqrt(max(2 * p * (1 - p) / n, 1e-12))
    if not rm1 > rm0:
        return "no: the reward-model score did not rise"
    if acc0 - acc1 > 2 * se:
        return f"YES: RM score {rm0:.3f} -> {rm1:.3f} while sample accuracy fell {acc0:.1%} -> {acc1:.1%}"
    return (f"no: RM score {rm0:.3f} -> {rm1:.3f}, sample accuracy {acc0:.1%} -> {acc1:.1%} (a change within "
            f"2 standard errors, {2 * se:.1%}, is noise)")


def print_table(summary: dict) -> None:
    rm_metrics, stats = summary["reward_model"], summary["preferences"]
    print(f"\nRLAIF ladder, seed {summary['seed']}, SFT model {summary.get('sft_model')}")
    print(f"preferences: {stats['pairs']} pairs from {stats['prompts']} prompts x {summary.get('k', 4)} samples "
          f"({stats['skipped_ties']} prompts tied), judge {' + '.join(stats['judge'])}")
    print(f"reward model: held-out pairwise accuracy {rm_metrics['eval/pairwise_accuracy']:.1%} on "
          f"{rm_metrics['heldout_pairs']} pairs (before training {rm_metrics['eval/pairwise_accuracy_start']:.1%})")
    print(f"\n{'model':<16} {'held-out acc':>12} {'format':>7} | {'RM score first->last third':>27} "
          f"{'sample acc first->last third':>30}")
    for name, row in summary["models"].items():
        curve_text = ""
        if "curve" in row:
            (rm0, rm1), (acc0, acc1) = thirds(row["curve"]["rm"]), thirds(row["curve"]["accuracy"])
            curve_text = f"{rm0:>12.3f} -> {rm1:<12.3f} {acc0:>14.1%} -> {acc1:<13.1%}"
        print(f"{name:<16} {row['accuracy']:>12.1%} {row['format_rate']:>7.1%} | {curve_text}")
    verdict = hacking_verdict(summary["models"]["grpo_rm"]["curve"], summary.get("samples_per_step", 32))
    print(f"\nreward hacking of the learned reward: {verdict}")
    print(f"wall time (s): {summary['timings_s']}")


def report(paths: list[str]) -> None:
    """Print the table of each summary.json and the means over them (several seeds)."""
    summaries = [read_json(p) for p in paths]
    for summary in summaries:
        print_table(summary)
    if len(summaries) > 1:
        print(f"\nmean over {len(summaries)} runs (seeds {', '.join(str(s['seed']) for s in summaries)}):")
        rm_acc = _mean([s["reward_model"]["eval/pairwise_accuracy"] for s in summaries])
        print(f"  reward model held-out pairwise accuracy {rm_acc:.1%}")
        for name in ("sft", "grpo_rm", "grpo_verifier"):
            print(f"  {name:<16} held-out accuracy {_mean([s['models'][name]['accuracy'] for s in summaries]):.1%}")

if __name__ == "__main__":
    main()
