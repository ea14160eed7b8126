"""The embedded agentic demonstration: a task where the calculator matters, on CPU.

Task: word problems built around one multiplication of two 2-digit numbers (``39 * 83``), then 0..1 +/- steps
(``agentic_rl.data.synthetic.multiplication_task``) — beyond what the tiny model computes in its head.

Ladder (``agentic-rl quickstart --agentic``; as a function :func:`run_agentic_quickstart`):

1. tiny base — the model helper's pretraining on synthetic arithmetic (``agentic_rl.train.pretrain``), or
   ``base_model`` if given;
2. SFT on tool-use demonstrations (:mod:`agentic_rl.agent.sft`): one calculator call per step, tool responses
   masked out of the loss, the answer turn after the calls only ``Final Answer: N`` (``final_turn="answer"``: the
   last tool result is copied, nothing recomputed); a quarter of the rows as direct answers without tools (plain
   prompt), and ``skip_tool_fraction`` (0.35) of them under the agent prompt answering directly without a call —
   imperfect demonstrations, so the SFT model sometimes skips the tool and GRPO has a tool-call rate to raise;
3. evaluation of the SFT model with and without tools (:mod:`agentic_rl.agent.evaluate`);
4. agentic GRPO (:mod:`agentic_rl.agent.train`): multi-turn episodes, per-step rewards, tool tokens masked;
5. evaluation of the GRPO model with and without tools; ``report.json`` / ``report.md`` in the run directory.

The tiny model gets a short system prompt that names the calculator instead of the JSON tool schemas in the prompt
(``tools_in_prompt=False``): the schemas would triple the prompt length of a 3M-parameter model for no gain, since
SFT teaches the call format. Real models keep ``tools_in_prompt=True``.

Measured (issue #9; seed 0, data_seed 0, base ``runs/quickstart-seed1/pretrain/model`` = 300 pretraining steps,
200 held-out problems, greedy, one CPU thread beside other jobs). What the SFT stage has to learn is *copying*
numbers — from the question into the call and from a tool result into the next call / the answer; the tiny model
does that only after ~1000 optimizer steps (its loss sits on a plateau near 0.55 until then):

* SFT 8000 rows x 1 epoch, batch 16, lr 1e-3 (500 steps, 16 min), or 9600 rows, batch 16, lr 2e-3 (600 steps,
  18 min): the calls have the right format and the right number of steps
  (tool-call rate 1.0, no errors) but invented numbers — accuracy 0.000 with tools, useful (grounded) call rate
  0.000;
* the 600-step model trained 400 more steps (6400 rows, batch 16, lr 1e-3; 1000 steps in all, ~31 min): accuracy
  **0.350 with tools vs 0.000 without**, tool-call rate 1.000, tool errors 0.000, useful call rate 0.629;
* GRPO on it, 30 steps x 32 episodes (4 tasks x 8), lr 5e-5, beta 0.02, full fine-tuning (3.4 min): **0.400 with
  tools vs 0.000 without**, useful call rate 0.651, tool-call rate 1.000; with lr 1e-4 x 40 steps: 0.350 / 0.619.
  On the first 1000 held-out problems (one of them is among the 9600 SFT rows): SFT 0.410 with tools / 0.000
  without, useful call rate 0.655; GRPO lr 5e-5 0.435 / 0.001, useful 0.649 (81 problems gained, 56 lost: McNemar
  p ~ 0.03); GRPO lr 1e-4 0.415 / 0.000 (62 gained, 57 lost). A small GRPO gain at best, one seed.

In those runs the tool-call rate is 1.0 after SFT already (the direct demonstrations use the plain prompt, so the
agent prompt always calls), so GRPO cannot raise it. Hence ``skip_tool_fraction``, measured as a *continuation*, not
end to end: the 1000-step SFT model above trained 200 more steps (3200 rows x 1 epoch, batch 16, lr 5e-4, cosine;
direct_fraction 0.25, skip_tool_fraction 0.35, final_turn "answer", seed 0; 5.6 min), then GRPO exactly as above
(30 steps, lr 5e-5, beta 0.02, 8 generations x 4 tasks, full fine-tuning, seed 0; 3.1 min). On the first 1000
held-out problems (greedy; 1.8 min / 2.2 min to evaluate, with and without tools):

* continued SFT: tool-call rate **0.808**, accuracy **0.454 with tools** vs 0.001 without, useful call rate 0.990
  (the 192 episodes that skip the tool: 1 correct; the 808 that call: 0.561); on the 200-problem split 0.795 /
  0.405 / 0.979;
* GRPO on it: tool-call rate **1.000**, accuracy **0.572 with tools** vs 0.000 without, useful call rate 0.981
  (140 problems gained, 22 lost against the continued SFT model: McNemar z ~ 9.3); on the 200-problem split
  1.000 / 0.540 / 0.971. The training-time tool-call rate (sampled) goes 0.41 -> 1.0 within the first 3 GRPO
  steps. Side effect: under the plain prompt without tools the GRPO model now tries a call in about half of the
  episodes (0.51 calls per episode, every one an error since no tool is offered; accuracy without tools stays 0).

So GRPO raises both the tool-call rate and held-out accuracy with tools once SFT leaves room to; the extra SFT steps
alone moved e4's 0.410 to 0.454 (useful call rate 0.655 -> 0.990), GRPO the rest.

End to end with the defaults (``agentic-rl quickstart --agentic --fresh``, seed 0, 2 free CPU cores, 200 held-out
problems, greedy; 17 min 9 s wall, peak RSS 2.2 GB: pretrain 152 s, SFT 760 s (1000 steps, 16000 rows: 4000 direct,
5600 skip-tool, 6400 tool demonstrations), GRPO 93 s, evaluations 11 s each):

* SFT: accuracy **0.425 with tools** vs 0.000 without, tool-call rate **0.735**, useful call rate 0.990, no errors;
* GRPO: accuracy **0.540 with tools** vs 0.000 without, tool-call rate **1.000**, useful call rate 0.981, no errors;
  without tools it now tries a call in 8 % of the episodes (errors, since none is offered).

One seed end to end; the continuation above is a second, independent path to the same picture.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agentic_rl.errors import ConfigError
from agentic_rl.runs import (check_run_name, create_run_root, delete_run_dir, describe, differing_keys, has_run,
                             read_marker, settings_of, write_marker)
from agentic_rl.utils import RUNS_ROOT, log, read_json, write_json

STAGES = ("base", "sft", "eval_sft", "grpo", "eval_grpo")

#: ``smoke=True``: a reduced ladder that checks the plumbing in a couple of minutes (CI).
SMOKE = dict(pretrain_steps=10, sft_rows=32, sft_epochs=1.0, grpo_steps=2, grpo_rows=16, num_generations=4,
             generation_batch_size=8, eval_rows=16)


def run_agentic_quickstart(output_dir: str | Path | None = None, *, name: str = "quickstart-agentic", seed: int = 0,
                           fresh: bool = False, smoke: bool = False, base_model: str | None = None,
                           pretrain_steps: int = 300, pretrain_corpus: str = "arithmetic", sft_rows: int = 16000,
                           sft_epochs: float = 1.0,
                           sft_learning_rate: float = 2e-3, sft_batch_size: int = 16, final_turn: str = "answer",
                           direct_fraction: float = 0.25, skip_tool_fraction: float = 0.35, grpo_steps: int = 30,
                           grpo_rows: int = 512, num_generations: int = 8, generation_batch_size: int = 32,
                           grpo_learning_rate: float = 5e-5, beta: float = 0.02, eval_rows: int = 200,
                           data_seed: int = 0) -> dict[str, Any]:
    """Run the ladder into ``output_dir`` (default ``runs/<name>``); returns the report (paths, with/without-tool
    stats before and after GRPO, timings). A stage whose ``<stage>/stage.json`` exists is skipped on a re-run;
    ``fresh`` deletes the run directory first; ``smoke`` uses :data:`SMOKE` sizes."""
    if smoke:
        pretrain_steps, sft_rows, sft_epochs, grpo_steps = (SMOKE["pretrain_steps"], SMOKE["sft_rows"],
                                                            SMOKE["sft_epochs"], SMOKE["grpo_steps"])
        grpo_rows, num_generations, generation_batch_size, eval_rows = (
            SMOKE["grpo_rows"], SMOKE["num_generations"], SMOKE["generation_batch_size"], SMOKE["eval_rows"])
    check_run_name(name)
    root = Path(output_dir) if output_dir else RUNS_ROOT / name
    if fresh and root.exists():
        delete_run_dir(root, "agentic-quickstart")  # only a quickstart run we made, never the cwd, home or a parent
    new_run = not has_run(root)
    out = create_run_root(root, "agentic-quickstart")
    # The ladder's settings are recorded with the run: a re-run with other ones must not reuse its stages.
    settings = dict(seed=seed, smoke=smoke, base_model=base_model, pretrain_steps=pretrain_steps,
                    pretrain_corpus=pretrain_corpus, sft_rows=sft_rows,
                    sft_epochs=sft_epochs, sft_learning_rate=sft_learning_rate, sft_batch_size=sft_batch_size,
                    final_turn=final_turn, direct_fraction=direct_fraction, skip_tool_fraction=skip_tool_fraction,
                    grpo_steps=grpo_steps, grpo_rows=grpo_rows, num_generations=num_generations,
                    generation_batch_size=generation_batch_size, grpo_learning_rate=grpo_learning_rate, beta=beta,
                    eval_rows=eval_rows, data_seed=data_seed)
    stored = (read_marker(out) or {}).get("settings")
    if stored is not None:
        differences = differing_keys(stored, settings_of(settings))
        if differences:
            raise ConfigError(f"{out} was made with other settings: {describe(differences)}; use a new --name for "
                              "these settings, or --fresh to start the run over")
    elif new_run:
        write_marker(out, "agentic-quickstart", settings)
    timings: dict[str, float] = {}
    report: dict[str, Any] = {"seed": seed, "data_seed": data_seed, "smoke": smoke,
                              "task": "multiplication (2-digit x 2-digit, then 0..1 +/- steps)"}

    def timed(stage: str, fn):
        marker = out / stage / "stage.json"
        if marker.is_file():
            log(f"agentic quickstart: {stage} already done, skipping (fresh=True redoes it)")
            return read_json(marker)
        start = time.time()
        value = fn()
        timings[stage] = round(time.time() - start, 1)
        write_json(marker, value)
        log(f"agentic quickstart: {stage} done in {timings[stage]:.0f}s")
        return value

    # 1. base
    if base_model is None:
        from agentic_rl.train.pretrain import PretrainConfig
        from agentic_rl.train.pretrain import run as pretrain

        base = timed("base", lambda: pretrain(PretrainConfig(output_dir=str(out / "base"), seed=seed,
                                                             max_steps=pretrain_steps, corpus=pretrain_corpus,
                                                             data_seed=data_seed,
                                                             report_to="none")))
        base_model = str(base["model_dir"])
    report["base_model"] = base_model

    # 2. SFT on tool-use demonstrations
    from agentic_rl.agent.sft import AgentSFTConfig
    from agentic_rl.agent.sft import run as agent_sft

    sft = timed("sft", lambda: agent_sft(AgentSFTConfig(
        model=base_model, output_dir=str(out / "sft"), train_rows=sft_rows, heldout_rows=eval_rows,
        data_seed=data_seed, tools_in_prompt=False, epochs=sft_epochs, learning_rate=sft_learning_rate,
        batch_size=sft_batch_size, final_turn=final_turn, direct_fraction=direct_fraction,
        skip_tool_fraction=skip_tool_fraction, seed=seed)))
    report["sft"] = {"model_dir": sft["model_dir"], "train_loss": sft["train_loss"]}

    # 3. evaluate SFT, 4. GRPO, 5. evaluate GRPO
    from agentic_rl.agent.evaluate import AgentEvalConfig
    from agentic_rl.agent.evaluate import run as agent_eval
    from agentic_rl.agent.train import AgentGRPOConfig
    from agentic_rl.agent.train import run as agent_grpo

    def evaluate(model_dir: str, name: str) -> dict[str, Any]:
        return agent_eval(AgentEvalConfig(model=model_dir, output_dir=str(out / name), num_rows=eval_rows,
                                          heldout_rows=eval_rows, data_seed=data_seed, tools_in_prompt=False))

    report["eval_sft"] = timed("eval_sft", lambda: evaluate(sft["model_dir"], "eval_sft"))
    grpo = timed("grpo", lambda: agent_grpo(AgentGRPOConfig(
        model=sft["model_dir"], output_dir=str(out / "grpo"), train_rows=grpo_rows, heldout_rows=eval_rows,
        data_seed=data_seed, tools_in_prompt=False, num_generations=num_generations,
        generation_batch_size=generation_batch_size, max_steps=grpo_steps, learning_rate=grpo_learning_rate,
        beta=beta, lora=False, seed=seed, report_to="none")))
    report["grpo"] = {"model_dir": grpo["model_dir"], "last_metrics": grpo["last_metrics"]}
    report["eval_grpo"] = timed("eval_grpo", lambda: evaluate(grpo["model_dir"], "eval_grpo"))
    report["timings_s"] = timings
    write_json(out / "report.json", report)
    (out / "report.md").write_text(format_report(report))
    log("\n" + format_report(report))
    return report


def format_report(report: dict[str, Any]) -> str:
    """A small markdown table: accuracy and tool statistics, with and without tools, after SFT and after GRPO."""
    keys = ("accuracy", "tool_call_rate", "tool_calls_per_episode", "tool_error_rate", "useful_call_rate",
            "turns_per_episode")
    lines = [f"# Agentic quickstart (seed {report.get('seed')})", "",
             "| model | tools | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for stage in ("eval_sft", "eval_grpo"):
        for setting in ("with_tools", "without_tools"):
            stats = report.get(stage, {}).get(setting)
            if stats:
                lines.append(f"| {stage[5:]} | {setting.split('_')[0]} | "
                             + " | ".join(f"{stats[k]:.3f}" for k in keys) + " |")
    return "\n".join(lines) + "\n"
