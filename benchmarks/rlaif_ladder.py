"""The embedded RLAIF ladder: SFT -> preferences -> reward model -> GRPO with the learned reward, beside GRPO with the
verifiable reward and GRPO's compute-matched control, all evaluated on the same held-out problems. No network.

    .venv/bin/python benchmarks/rlaif_ladder.py --seed 0          # SFT from the shipped base, then the ladder
    .venv/bin/python benchmarks/rlaif_ladder.py --sft-model runs/quickstart/sft/model --out runs/rlaif-qs-seed0
    .venv/bin/python benchmarks/rlaif_ladder.py --report runs/rlaif-ladder-seed{0,1,2}/summary.json

Steps (outputs under --out, default ``runs/rlaif-ladder-seed<N>``). Running the same command again skips the steps
that finished with the same settings and continues with the rest; a step whose settings changed meets its earlier run
and stops, as any stage does, unless ``--overwrite`` is given (every step is then run again and replaces its outputs).

0. ``pipeline/sft/``: without ``--sft-model``, the pipeline's SFT stage from the shipped base (``model: embedded``)
   on the single-turn synthetic task with clean demonstrations (``answer_first_fraction: 0``) and the quickstart's
   SFT settings (:data:`BASE`) except ``max_steps``: ``--sft-steps`` (:data:`SFT_STEPS`), so that the SFT model
   solves a fair share of the problems but not most: the preferences then hold many pairs with a right answer
   against a wrong one, and GRPO has room to add.
1. ``preferences/``: the SFT model samples ``--k`` completions for each of ``--prompts`` training prompts at GRPO's
   ``--temperature`` (the distribution the reward model will score); the judge
   (``--judge``, default the verifier ``accuracy:1.0`` plus ``format:0.2``, so that a prompt with no right answer
   still ranks a well-formed attempt above a malformed one) scores them; best vs worst become a pair.
2. ``reward-model/``: a reward model trained on those pairs; its pairwise accuracy on held-out pairs is reported.
3. ``pipeline/grpo/`` and ``pipeline/sft_continued/``: the pipeline's GRPO stage on the verifier from the SFT model
   (GRPO(verifier)), then its compute-matched control: SFT continued from the SFT model on the same clean
   demonstrations for as many steps as fit in GRPO(verifier)'s wall time (the pipeline's ``sft_continued`` stage;
   that wall time includes scoring the samples with the reward model at weight 0, as GRPO(rm) does).
4. ``grpo-rm/``: GRPO with the pipeline's resolved GRPO settings, the reward model as its only trained reward. Each
   GRPO run also *computes* the other reward at weight 0 (logged, never trained on), so both show the reward-model
   score and the verifier accuracy of their samples over training: a learned reward that is hacked shows as a rising
   reward-model score while accuracy does not rise, that of the same samples or the held-out accuracy against the
   SFT start (:func:`hacking_verdict`).
5. ``eval/<model>/``: SFT, GRPO(rm), GRPO(verifier) and the control on the same ``--eval-samples`` test problems,
   greedy, and sampled (``--sampled-eval`` samples per problem at GRPO's temperature; pass@1) into
   ``eval/<model>-sampled/``: the layout ``agentic-rl compare`` reads, so each GRPO run is compared with the control
   paired over the problems, with 95 % bootstrap intervals (per seed, and pooled over seeds by ``--report``).

``summary.json`` holds the numbers of one seed; ``--report`` prints the tables of several and their means.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path

from agentic_rl.config import config_from_dict
from agentic_rl.eval.compare import compare_runs
from agentic_rl.eval.evaluate import run as run_eval
from agentic_rl.pipeline import PipelineConfig, resolve_stage_config, run_pipeline
from agentic_rl.runs import differing_keys, settings_of
from agentic_rl.train.grpo import run as run_grpo
from agentic_rl.train.preferences import PreferencesConfig
from agentic_rl.train.preferences import run as run_preferences
from agentic_rl.train.reward_model import RewardModelConfig
from agentic_rl.train.reward_model import run as run_reward_model
from agentic_rl.utils import free_memory, log, read_json, read_jsonl, write_json

#: SFT steps from the shipped base. Its pretraining has taught it the task's arithmetic, so a few steps of clean
#: demonstrations teach the answer format and the SFT model lands near 65 % held-out after 4 to 10 steps (seed 0),
#: where 40 steps reach 77 % and leave GRPO and the preferences less to find. Measurements: docs/results.md.
SFT_STEPS = 10

#: The pipeline the ladder runs: the single-turn quickstart's model, task and SFT settings (clean demonstrations,
#: :data:`SFT_STEPS` steps); the ladder adds the ``grpo`` section and the stages.
BASE = {
    "model": "embedded", "dataset": "synthetic", "system_prompt": "", "evaluate_stages": False,
    "sft": {"full": True, "learning_rate": 1e-3, "max_steps": SFT_STEPS, "batch_size": 32, "max_train_samples": 20000,
            "answer_first_fraction": 0.0, "save_steps": 50, "micro_batches": 4},
}
#: The models of one seed, as their eval/ folders are named.
MODELS = ("sft", "grpo_rm", "grpo_verifier", "sft_continued")
#: The paired differences reported (treatment, control): each GRPO run against the compute-matched control, the
#: learned reward against the verifier, and against the SFT model it started from (a learned reward that rises
#: while held-out accuracy falls below the start is hacked).
PAIRS = (("grpo_rm", "sft_continued"), ("grpo_verifier", "sft_continued"), ("grpo_rm", "grpo_verifier"),
         ("grpo_rm", "sft"), ("grpo_verifier", "sft"))


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft-model", help="start from this SFT model (e.g. runs/quickstart/sft/model; its control "
                        "continues SFT on the clean demonstrations); default: SFT from the shipped base (BASE)")
    parser.add_argument("--out", help="output folder (default: runs/rlaif-ladder-seed<seed>)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true",
                        help="run every step again, replacing the outputs of an earlier run in --out (without it, "
                             "steps that finished with the same settings are skipped)")
    parser.add_argument("--sft-steps", type=int, default=SFT_STEPS,
                        help="SFT steps from the shipped base (without --sft-model); default %(default)s")
    parser.add_argument("--system-prompt", default="", help="as the SFT stage used ('' for the embedded quickstart)")
    parser.add_argument("--prompts", type=int, default=1024, help="training prompts for the preference data")
    parser.add_argument("--k", type=int, default=4, help="completions sampled per prompt")
    parser.add_argument("--judge", nargs="+", default=["accuracy:1.0", "format:0.2"])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rm-epochs", type=float, default=2.0)
    parser.add_argument("--rm-lr", type=float, default=1e-4)
    parser.add_argument("--grpo-steps", type=int, default=30)
    parser.add_argument("--grpo-batch", type=int, default=32, help="completions per step")
    parser.add_argument("--grpo-lr", type=float, default=3e-5)
    parser.add_argument("--grpo-full", action=argparse.BooleanOptionalAction, default=True,
                        help="full fine-tuning in both GRPO runs (--no-grpo-full: a LoRA adapter, the tiny preset's)")
    parser.add_argument("--temperature", type=float, default=0.7,
                        help="sampling temperature of the preference data, both GRPO runs and the sampled evaluation "
                             "(the quickstart's GRPO temperature)")
    parser.add_argument("--eval-samples", type=int, default=500, help="held-out test problems (the same for every "
                        "model and seed)")
    parser.add_argument("--sampled-eval", type=int, default=4, help="samples per problem of the sampled evaluation "
                        "at GRPO's temperature (0: greedy only)")
    parser.add_argument("--report", nargs="+", metavar="SUMMARY.json",
                        help="print the tables of finished runs and their means with 95 %% intervals instead of "
                             "running")
    return parser


def pipeline_settings(args: argparse.Namespace, root: Path) -> dict:
    """The settings of the pipeline that runs SFT, GRPO(verifier) and its control, in ``root``."""
    pipeline = {**BASE, "name": f"rlaif-ladder-seed{args.seed}", "output_dir": str(root), "seed": args.seed,
                "system_prompt": args.system_prompt, "eval": {"seed": 0, "max_new_tokens": args.max_new_tokens},
                "sft": {**BASE["sft"], "max_steps": args.sft_steps}}
    if args.sft_model:
        pipeline["model"] = args.sft_model
    return pipeline


def main() -> None:
    args = build_parser().parse_args()
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

    # The pipeline runs SFT, GRPO(verifier) and its control; the pipeline skips its own finished stages.
    root = out / "pipeline"
    pipeline = pipeline_settings(args, root)
    fresh = args.overwrite  # only the first pipeline call starts the run directory over

    def pipeline_run(stages: list[str], grpo: dict | None = None) -> dict:
        nonlocal fresh
        config = config_from_dict(PipelineConfig, {**pipeline, "stages": stages, "fresh": fresh,
                                                   **({"grpo": grpo} if grpo else {})})
        fresh = False
        summary = run_pipeline(config)
        free_memory()
        for stage, row in summary["stages"].items():
            timings[stage] = row.get("wall_time_s")
        return summary

    sft_model = args.sft_model or pipeline_run(["sft"])["models"]["sft"]
    common = {"seed": args.seed, "system_prompt": args.system_prompt}
    pref = timed("preferences", run_preferences, config_from_dict(PreferencesConfig, dict(
        model=sft_model, max_samples=args.prompts, num_samples=args.k, temperature=args.temperature,
        max_new_tokens=args.max_new_tokens, judge=args.judge, output_dir=str(out / "preferences"), **common)))
    rm = timed("reward_model", run_reward_model, config_from_dict(RewardModelConfig, dict(
        model=sft_model, dataset=pref["pairs_path"], full=True, learning_rate=args.rm_lr, epochs=args.rm_epochs,
        batch_size=8, heldout_fraction=0.2, output_dir=str(out / "reward-model"), seed=args.seed, logging_steps=5)))
    rm_spec = f"reward_model(path={rm['model_dir']})"

    # GRPO(verifier) and the control through the pipeline; GRPO(rm) with the same resolved settings but the reward.
    # Each GRPO run computes the other's reward at weight 0 (logged, not trained on).
    grpo_section = dict(preset="tiny", full=args.grpo_full, learning_rate=args.grpo_lr, max_steps=args.grpo_steps,
                        batch_size=args.grpo_batch, num_generations=8, max_completion_length=args.max_new_tokens,
                        temperature=args.temperature, heldout_every=0, save_steps=args.grpo_steps,
                        completions_every=10, rewards=["accuracy:1.0", f"{rm_spec}:0.0"])
    stages = ["grpo", "sft_continued"] if args.sft_model else ["sft", "grpo", "sft_continued"]
    ran = pipeline_run(stages, grpo_section)
    verifier_config = resolve_stage_config(config_from_dict(PipelineConfig, {**pipeline, "stages": stages,
                                                                             "grpo": grpo_section}),
                                           "grpo", sft_model, root)
    grpo_rm = timed("grpo_rm", run_grpo, dataclasses.replace(
        verifier_config, rewards=[f"{rm_spec}:1.0", "accuracy:0.0"], output_dir=str(out / "grpo-rm")))
    models = {"sft": sft_model, "grpo_rm": grpo_rm["model_dir"], "grpo_verifier": ran["models"]["grpo"],
              "sft_continued": ran["models"]["sft_continued"]}

    # --- evaluation: every model on the same problems, greedy and sampled ------------------------------------------
    eval_base = resolve_stage_config(config_from_dict(PipelineConfig, {**pipeline, "eval_samples": args.eval_samples}),
                                     "eval", sft_model, root)
    metrics = {}
    for name, path in models.items():
        config = dataclasses.replace(eval_base, models=[path], output_dir=str(out / "eval" / name))
        metrics[name] = timed(f"eval_{name}", run_eval, config)["models"][path]
        if args.sampled_eval:
            config = dataclasses.replace(config, num_samples=args.sampled_eval, temperature=args.temperature,
                                         pass_at_k=[], output_dir=str(out / "eval" / f"{name}-sampled"))
            metrics[f"{name}-sampled"] = timed(f"eval_{name}_sampled", run_eval, config)["models"][path]

    # --- summary and table ---------------------------------------------------------------------------------------
    summary = {"seed": args.seed, "out": str(out), "sft_model": sft_model, "judge": list(args.judge), "k": args.k,
               "samples_per_step": args.grpo_batch, "prompts_per_step": (
                   verifier_config.batch_size * verifier_config.gradient_accumulation_steps
                   // verifier_config.num_generations),
               "preferences": pref["stats"], "reward_model": rm["metrics"], "control_budget": _control_budget(root),
               "models": {}}
    for name, path in models.items():
        m = metrics[name]
        row = {"model_dir": path, "accuracy": m["accuracy_strict"], "format_rate": m["format_rate"]}
        if f"{name}-sampled" in metrics:
            row["pass@1_sampled"] = metrics[f"{name}-sampled"].get("pass@1")
        if name.startswith("grpo"):
            row["curve"] = training_curve(Path(path).parent)
        summary["models"][name] = row
    summary["differences"] = {f"{a} - {b}": compare_runs([out], a, b, samples=4000)["modes"] for a, b in PAIRS}
    summary["hacking"] = hacking_verdict(summary["models"]["grpo_rm"]["curve"], summary["prompts_per_step"],
                                         summary["differences"]["grpo_rm - sft"]["greedy"])
    # Per step (a step skipped as finished keeps its recorded time), their sum, and this invocation's wall time.
    summary["timings_s"] = {**timings, "steps_total": round(sum(timings.values()), 1),
                            "this_run": round(time.time() - started, 1)}
    write_json(out / "summary.json", summary)
    print_table(summary)
    print(f"summary: {out / 'summary.json'}")


def _control_budget(root: Path) -> dict:
    """The control's budget as the pipeline sized it (GRPO's wall time, SFT seconds per step, steps)."""
    path = root / "summary.json"
    return read_json(path)["stages"].get("sft_continued", {}).get("budget", {}) if path.is_file() else {}


def hacking_verdict(curve: dict[str, list[float]], prompts_per_step: int,
                    heldout: dict | None = None) -> str:
    """Signs that the learned reward was hacked: GRPO(rm)'s reward-model score rose from the first to the last third
    of training while accuracy did not rise (a sign) or fell (hacking). Accuracy is that of the same samples (their
    change counts beyond two standard errors, two-proportion, pooled; the unit is the prompt, not the completion: a
    group's completions share their prompt's difficulty, so counting them as independent understates the noise) and,
    with ``heldout`` (``compare_runs``' greedy block of GRPO(rm) - SFT), the held-out accuracy against the SFT model
    GRPO started from (its 95 % interval excludes 0)."""
    (rm0, rm1), (acc0, acc1) = thirds(curve["rm"]), thirds(curve["accuracy"])
    n = max(1, len(curve["accuracy"]) // 3) * prompts_per_step
    p = (acc0 + acc1) / 2
    se = math.sqrt(max(2 * p * (1 - p) / n, 1e-12))
    change = f"RM score {rm0:.3f} -> {rm1:.3f}, sample accuracy {acc0:.1%} -> {acc1:.1%}"
    fell, rose = acc0 - acc1 > 2 * se, acc1 - acc0 > 2 * se
    if heldout is not None:
        low, high = heldout["ci95"]
        change += f", held-out vs SFT {_interval(heldout)} points"
        fell, rose = fell or high < 0, rose or low > 0
    if not rm1 > rm0:
        return f"no: the reward-model score did not rise ({change})"
    if fell:
        return f"YES: {change}: the learned reward rose while accuracy fell"
    if rose:
        return f"no: {change}: accuracy rose with the learned reward"
    return f"a sign: {change}: the learned reward rose, accuracy did not beyond noise"


def _interval(block: dict) -> str:
    low, high = block["ci95"]
    return f"{100 * block['mean_difference']:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


def print_table(summary: dict) -> None:
    rm_metrics, stats = summary["reward_model"], summary["preferences"]
    budget = summary.get("control_budget", {})
    print(f"\nRLAIF ladder, seed {summary['seed']}, SFT model {summary.get('sft_model')}")
    print(f"preferences: {stats['pairs']} pairs from {stats['prompts']} prompts x {summary.get('k', 4)} samples "
          f"({stats['skipped_ties']} prompts tied), judge {' + '.join(stats['judge'])}")
    print(f"reward model: held-out pairwise accuracy {rm_metrics['eval/pairwise_accuracy']:.1%} on "
          f"{rm_metrics['heldout_pairs']} pairs (before training {rm_metrics['eval/pairwise_accuracy_start']:.1%})")
    if budget:
        print(f"control: {budget.get('steps')} SFT steps in GRPO(verifier)'s {budget.get('grpo_wall_time_s', 0):.0f} s")
    print(f"\n{'model':<14} {'held-out acc':>12} {'pass@1 smp':>10} {'format':>7} | {'RM score first->last third':>27} "
          f"{'sample acc first->last third':>30}")
    for name, row in summary["models"].items():
        curve_text = ""
        if row.get("curve", {}).get("rm"):
            (rm0, rm1), (acc0, acc1) = thirds(row["curve"]["rm"]), thirds(row["curve"]["accuracy"])
            curve_text = f"{rm0:>12.3f} -> {rm1:<12.3f} {acc0:>14.1%} -> {acc1:<13.1%}"
        sampled = row.get("pass@1_sampled")
        print(f"{name:<14} {row['accuracy']:>12.1%} {'' if sampled is None else f'{sampled:.1%}':>10} "
              f"{row['format_rate']:>7.1%} | {curve_text}")
    print("\npaired differences, points [95 % bootstrap over the problems]:")
    for name, modes in summary.get("differences", {}).items():
        print(f"  {name:<30} " + ", ".join(f"{mode} {_interval(block)}" for mode, block in modes.items()))
    print(f"\nreward hacking of the learned reward: {summary.get('hacking')}")
    print(f"wall time (s): {summary['timings_s']}")


def report(paths: list[str]) -> None:
    """Print the table of each summary.json, then the means over them (several seeds) with 95 % intervals: paired
    bootstrap over the problems within each seed (``agentic-rl compare``'s statistics) and, in brackets, with the
    seeds resampled too; the reward model's pairwise accuracy with a Wilson interval over all held-out pairs."""
    from agentic_rl.eval.compare import bootstrap_mean_difference, per_problem_accuracy, wilson_interval

    summaries = [read_json(p) for p in paths]
    for summary in summaries:
        print_table(summary)
    if len(summaries) < 2:
        return
    runs = [Path(s.get("out") or Path(p).parent) for s, p in zip(summaries, paths)]
    print(f"\nmean over {len(summaries)} seeds ({', '.join(str(s['seed']) for s in summaries)}), 95 % intervals:")
    pairs = [(s["reward_model"]["eval/pairwise_accuracy"], s["reward_model"]["heldout_pairs"]) for s in summaries]
    right, n = sum(a * k for a, k in pairs), sum(k for _, k in pairs)
    low, high = wilson_interval(right, n)
    print(f"  reward model pairwise accuracy {_mean([a for a, _ in pairs]):.1%} (pooled {right / n:.1%} "
          f"[{low:.1%}, {high:.1%}] over {n} held-out pairs)")
    for name in MODELS:
        scores = [list(per_problem_accuracy(run / "eval" / name).values()) for run in runs]
        mean, low, high = bootstrap_mean_difference(scores)
        _, h_low, h_high = bootstrap_mean_difference(scores, hierarchical=True)
        print(f"  {name:<14} held-out accuracy {mean:.1%} [{low:.1%}, {high:.1%}] ([{h_low:.1%}, {h_high:.1%}])")
    for treatment, control in PAIRS:
        modes = compare_runs(runs, treatment, control)["modes"]
        text = "; ".join(f"{mode} {_interval(b)} ([{100 * b['ci95_hierarchical'][0]:+.1f}, "
                         f"{100 * b['ci95_hierarchical'][1]:+.1f}])" for mode, b in modes.items())
        print(f"  {f'{treatment} - {control}':<30} {text} points")
    print("  hacking: " + "; ".join(f"seed {s['seed']} {s.get('hacking', '').split(':')[0]}" for s in summaries))


if __name__ == "__main__":
    main()
