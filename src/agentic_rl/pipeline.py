"""The post-training ladder in one command: (pretrain) -> eval -> SFT -> eval -> GRPO -> eval -> export -> report.

``agentic-rl quickstart`` runs the embedded default on CPU with no network: a synthetic GSM8K-style task, the tiny
Qwen3 base shipped with the package (``model: embedded``), SFT, GRPO with a verifiable reward, its
compute-matched control (more SFT), evaluation of every stage on the same held-out problems, export, and a report.
``agentic-rl pipeline --config FILE`` runs the same ladder for any model and dataset (e.g.
``configs/qwen3-0.6b-gsm8k.yaml``), each stage switchable.

Everything lands in one run directory::

    runs/<name>/
      .agentic-rl-run      marker: a run directory agentic-rl created (the only kind --fresh deletes)
      config.yaml          resolved pipeline config (every stage's resolved config is in its own folder too)
      pretrain/ sft/ grpo/ stage outputs: checkpoints, TensorBoard events, the adapter/ and the stage's model/
      eval/<stage>/        metrics.json, predictions.jsonl, report.md per evaluated model
      export/              the final model, any adapter merged in (transformers / vLLM load it as is)
      report.md            stage comparison table + training curves (PNG)
      summary.json         per stage: metrics (stages.<stage>.accuracy) and wall time

Re-running skips stages whose ``<stage>/stage.json`` marker exists and records the same settings; a stage made with
other settings (another seed, other steps) is an error, never silently reused or deleted: use a new ``--name`` or
``--fresh``. A stage that was
interrupted (checkpoints, no ``stage.json``) resumes from its last complete checkpoint when its settings match.
``--fresh`` deletes the run directory and starts over, only once the whole configuration has been validated, and only
a directory this project created as a run directory (see ``agentic_rl.runs``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from agentic_rl.agent.settings import EnvironmentSettings
from agentic_rl.config import check_keys, config_from_dict, read_yaml, save_config, setting
from agentic_rl.console import announce
from agentic_rl.errors import ConfigError
from agentic_rl.locking import hold_run_lock
from agentic_rl.models.embedded import EMBEDDED, describe_base
from agentic_rl.runs import (FINISHED_MARKER, check_deletable, check_run_name, create_run_root, delete_run_dir,
                             describe, differing_keys, finished_result, has_run, mark_finished, moved_from,
                             recorded_dir, relocated, settings_of, stage_settings_mismatch)
from agentic_rl.stages import PIPELINE_DEFAULTS, inherited_settings
from agentic_rl.utils import log, warn, write_json

STAGES = ["pretrain", "sft", "grpo", "sft_continued", "export"]
#: The ladder without the compute-matched control (which costs as much as GRPO): what a pipeline runs by default.
DEFAULT_STAGES = ["sft", "grpo", "export"]


@dataclass
class PipelineConfig(EnvironmentSettings):
    """The ladder's settings. The environment settings (``environment``, ``max_turns``, ...) are given once at the top
    level and reach SFT, GRPO, the control and every evaluation alike (a stage's section may still override one)."""

    name: str = setting("pipeline", "run name; outputs go to runs/<name>/ unless output_dir")
    output_dir: str | None = setting(None, "run directory (default runs/<name>)")
    model: str = setting(PIPELINE_DEFAULTS["model"],
                         "base model: a hub id (Qwen/Qwen3-0.6B), a local directory, or 'embedded' (the tiny base "
                         "shipped with the package; with 'pretrain' in stages, a tiny base pretrained by this run "
                         "instead)")
    dataset: str = setting(PIPELINE_DEFAULTS["dataset"],
                           "task data: 'synthetic', a hub id (openai/gsm8k) or a local file/folder")
    seed: int = setting(PIPELINE_DEFAULTS["seed"], "random seed for data sampling, initialisation and training")
    synthetic_seed: int = setting(PIPELINE_DEFAULTS["synthetic_seed"], "seed of the synthetic task, given to every "
                                  "stage (pretraining keeps its test questions out)")
    eval_samples: int = setting(PIPELINE_DEFAULTS["eval_samples"], "held-out problems every stage is evaluated on")
    system_prompt: str | None = setting(PIPELINE_DEFAULTS["system_prompt"], "system message of every prompt in SFT, "
                                        "GRPO and evaluation: unset = the standard instruction, '' = none (the "
                                        "embedded preset: shorter prompts for the tiny model), or your own text")
    stages: list[str] = setting(list(DEFAULT_STAGES),
                                f"stages to run, in ladder order (any of {', '.join(STAGES)}; sft_continued is the "
                                "compute-matched control: SFT continued from GRPO's starting model for GRPO's wall "
                                "time)")
    evaluate_stages: bool = setting(True, "evaluate base, SFT and GRPO models on held-out data")
    fresh: bool = setting(False, "delete the run directory and start over")
    pretrain: dict[str, Any] = setting({}, "settings for the pretrain stage")
    sft: dict[str, Any] = setting({}, "settings for the SFT stage")
    grpo: dict[str, Any] = setting({}, "settings for the GRPO stage")
    sft_continued: dict[str, Any] = setting({}, "settings for the control stage: the sft section's settings, then "
                                                "these (a max_steps here fixes the step count; otherwise it is GRPO's "
                                                "wall time / the SFT stage's seconds per step)")
    control: str = setting("continue", "how the control spends GRPO's time on more SFT: 'continue' (the SFT model "
                                       "trained further, its learning-rate schedule started again) or 'longer' (one "
                                       "SFT run from SFT's starting model for SFT's steps plus GRPO's time, in one "
                                       "schedule: no second warm-up; needs 'sft' in stages)",
                           choices=["continue", "longer"])
    eval: dict[str, Any] = setting({}, "settings for evaluation")
    sampled_eval: int = setting(0, "also evaluate SFT, GRPO and the control with this many samples per problem at "
                                   "GRPO's temperature (pass@1, pass@k; in an environment, sampled episodes with "
                                   "and without tools); 0 = greedy evaluation only")

    def __post_init__(self) -> None:
        check_run_name(self.name)
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown:
            raise ConfigError(f"unknown stage(s) {unknown} in 'stages'; choose from {STAGES}")
        if len(set(self.stages)) < len(self.stages):  # each stage writes one folder: a repeat would redo or clash
            raise ConfigError(f"stage '{next(s for s in self.stages if self.stages.count(s) > 1)}' is listed more "
                              "than once in 'stages'; list each stage once")
        if "pretrain" in self.stages and self.model != EMBEDDED:
            raise ConfigError("stage 'pretrain' builds a tiny base of its own: set model: embedded, "
                              "or drop 'pretrain' from stages to start from an existing model")
        if self.eval_samples < 1:
            raise ConfigError("eval_samples must be >= 1")
        if "sft_continued" in self.stages and "grpo" not in self.stages:
            raise ConfigError("stage 'sft_continued' is GRPO's compute-matched control: it needs 'grpo' in stages "
                              "(its budget is GRPO's wall time)")
        if self.control == "longer" and "sft_continued" in self.stages and "sft" not in self.stages:
            raise ConfigError("control 'longer' repeats the SFT stage with GRPO's time added: it needs 'sft' in "
                              "stages (or use control: continue)")
        if self.sampled_eval < 0:
            raise ConfigError(f"sampled_eval must be >= 0 (0 = off), got {self.sampled_eval}")
        if self.sampled_eval and not self.evaluate_stages:
            raise ConfigError("sampled_eval evaluates the stages: it needs evaluate_stages: true")
        self.check_environment_settings()


#: The embedded presets (``src/agentic_rl/configs/<file>.yaml``; ``--smoke`` takes ``<file>-smoke.yaml``).
QUICKSTART_PRESETS = {"default": "quickstart", "agentic": "quickstart-agentic", "search": "quickstart-search",
                      "memory": "quickstart-memory"}


@dataclass
class QuickstartConfig:
    name: str | None = setting(None, "run name; outputs go to runs/<name>/ (default: the preset's own name: "
                                     "quickstart, quickstart-smoke, quickstart-agentic, ...)")
    preset: str = setting("default", "the embedded ladder: 'default' (single-turn GSM8K-style problems) or 'agentic' "
                                     "(multi-turn calculator tool use: SFT on tool-use episodes, then GRPO in the "
                                     "environment) or 'search' (multi-hop questions about a fictional world answered "
                                     "with a search tool) or 'memory' (a log of events, only the latest turns in "
                                     "view, notes stored and recalled to answer a question at the end)",
                                     choices=list(QUICKSTART_PRESETS))
    seed: int = setting(0, "random seed (data, initialisation, training)")
    fresh: bool = setting(False, "delete the run directory and start over")
    eval_samples: int | None = setting(None, "held-out problems each stage is evaluated on (default: the preset's, "
                                             "500)")
    smoke: bool = setting(False, "a reduced ladder (few steps, few samples) that checks the plumbing in about a "
                                 "minute; used by CI")
    preset_file: str | None = setting(None, "a pipeline YAML to use instead of the embedded preset (same schema as "
                                            "`agentic-rl pipeline`)")

    def __post_init__(self) -> None:
        if self.preset_file and self.preset != "default":
            raise ConfigError("give --preset or --preset-file, not both")
        if self.name is not None:
            check_run_name(self.name)


# ---------------------------------------------------------------------------------------------------------------
# Stage runners: each resolves its stage config (unknown keys are errors) and calls the stage as a function.
# ---------------------------------------------------------------------------------------------------------------

def _stage_config(cls: type, section: dict[str, Any], defaults: dict[str, Any], where: str):
    values = {**defaults, **section}
    return config_from_dict(cls, values, where=where)


def _other_settings_error(name: str, out: Path, differences: list[str]) -> ConfigError:
    return ConfigError(f"stage {name} in {out} was made with other settings: {describe(differences)}; use a new --name "
                       "(or --output-dir) for these settings, or --fresh to start the run over")


def _run_stage(name: str, kind: str, out: Path, fn: Callable[[], dict[str, Any]],
               summary: dict[str, Any] | None = None, settings: Any = None) -> dict[str, Any]:
    """Run one stage (``kind``: its name in the table of stages) unless its finished marker says it finished with
    the same ``settings`` (the stage's resolved config); record its wall time and model in the summary. A finished
    stage with other settings is an error."""
    result = finished_result(out)
    if result is not None:
        stored = result.pop("settings", None)
        if settings is not None and not isinstance(stored, dict):
            warn(f"stage {name}: {out / FINISHED_MARKER} records no settings; reusing it unchecked")
        elif settings is not None:
            made_in = recorded_dir(stored)
            moved = moved_from(made_in, out)
            differences = differing_keys(stored, settings_of(settings), moved=moved)
            if differences:
                raise _other_settings_error(name, out, differences)
            if moved:  # a copied or moved run directory: what the stage wrote is where the stage is now
                log(f"stage {name}: made in {made_in}, now in {out}")
                result = relocated(result, (made_in, str(out)))
        log(f"stage {name}: already done ({result.get('wall_time_s', 0):.0f}s), skipping — use --fresh to redo")
    else:
        log(f"stage {name}: starting")
        start = time.time()
        result = fn()
        result = {**result, "wall_time_s": round(time.time() - start, 1)}
        mark_finished(out, kind, result, settings)  # the stage's own marker, with the time the whole stage took
        log(f"stage {name}: done in {result['wall_time_s']:.0f}s")
    if summary is not None:
        summary["stages"].setdefault(name, {}).update(
            {k: v for k, v in result.items() if k in ("wall_time_s", "model_dir")})
    return result


def _evaluate(label: str, model_dir: str, config: PipelineConfig, root: Path, summary: dict[str, Any],
              sample_temperature: float | None = None) -> dict:
    """Greedy held-out evaluation into ``eval/<label>/``; with ``sample_temperature``, the sampled evaluation
    (``sampled_eval`` samples per problem) into ``eval/<label>-sampled/`` and ``stages.<label>.sampled``."""
    from agentic_rl.eval.evaluate import EvalConfig
    from agentic_rl.eval.evaluate import run as run_eval

    sampled = sample_temperature is not None
    out = root / "eval" / (f"{label}-sampled" if sampled else label)
    defaults = _eval_defaults(config, model_dir, out)
    section = dict(config.eval)
    if sampled:
        section.update(num_samples=config.sampled_eval, temperature=sample_temperature, pass_at_k=[])
    eval_config = _stage_config(EvalConfig, section, defaults, where=f"{config.name}: eval")

    def go() -> dict[str, Any]:
        metrics = run_eval(eval_config)["models"][model_dir]
        return {"metrics": {k: v for k, v in metrics.items() if k != "predictions"}}

    result = _run_stage(f"eval {out.name}", "eval", out, go, settings=eval_config)
    metrics = result["metrics"]
    if sampled:
        summary["stages"].setdefault(label, {})["sampled"] = {
            "temperature": sample_temperature, "samples": config.sampled_eval,
            **{k: v for k, v in metrics.items() if k.startswith("pass@")},
            **({k: metrics.get(k) for k in SAMPLED_ENVIRONMENT_KEYS} if config.environment is not None else {}),
            "eval_wall_time_s": result.get("wall_time_s")}
        return result
    summary["stages"].setdefault(label, {}).update({
        "metrics": metrics, "accuracy": metrics.get("accuracy_strict"),
        "accuracy_lenient": metrics.get("accuracy_lenient"), "format_rate": metrics.get("format_rate"),
        "avg_tokens": metrics.get("avg_tokens"), "eval_wall_time_s": result.get("wall_time_s")})
    if config.environment is not None:  # episodes: accuracy with tools, without them, and the tool statistics
        summary["stages"][label].update({k: v for k, v in metrics.items()
                                         if k in ENVIRONMENT_SUMMARY_KEYS or k.startswith("success_at_")})
    return result


#: What ``stages.<label>.sampled`` holds next to pass@k (with tools) for a run in an environment.
SAMPLED_ENVIRONMENT_KEYS = ("accuracy_without_tools", "tool_call_rate", "tool_calls_per_episode")

#: What ``summary.json`` holds per stage next to ``accuracy`` (with tools) for a run in an environment.
ENVIRONMENT_SUMMARY_KEYS = ("accuracy_without_tools", "tool_call_rate", "tool_error_rate", "useful_call_rate",
                            "tool_calls_per_episode", "turns_per_episode", "attempts", "searches",
                            "useful_search_rate", "wasted_searches", "needed_stored_rate",
                            "wasted_calls")  # and success_at_<k>


#: What the pipeline sets per run in a stage's settings, on top of what the stage inherits from the top level
#: (:func:`agentic_rl.stages.inherited_settings`): where it writes, and the model it starts from (the previous
#: stage's; pretraining builds its own).
PER_RUN_KEYS = ("output_dir", "model", "models")


def _train_defaults(config: PipelineConfig, name: str, model_dir: str, out: Path) -> dict[str, Any]:
    """The values the pipeline gives a training stage (its section overrides them)."""
    stage = _table_name(name)
    values = inherited_settings(config, stage, _stage_class(name))
    if "model" in values:
        values["model"] = model_dir
    return {**values, "output_dir": str(out)}


def _eval_defaults(config: PipelineConfig, model_dir: str, out: Path) -> dict[str, Any]:
    """The values the pipeline gives an evaluation (the eval section overrides them)."""
    from agentic_rl.eval.evaluate import EvalConfig

    return {**inherited_settings(config, "eval", EvalConfig), "models": [model_dir], "split": "test",
            "output_dir": str(out)}


def _check_sections(config: PipelineConfig, root: Path | None = None) -> None:
    """Resolve every stage section into its typed config (key names, types and values) before anything runs or is
    deleted, so a typo or a bad value fails in the first second, not after SFT — or after ``--fresh``."""
    root = root if root is not None else Path("runs") / config.name
    if config.environment is not None:  # the environment itself and its arguments, not only the setting names
        from agentic_rl.agent.settings import build_environment

        build_environment(config)
    for name in _train_stages(config):
        check_keys(_stage_class(name), _section(config, name), where=f"{config.name}: {name}")
        stage_config = resolve_stage_config(config, name, config.model, root)
        if name == "grpo" and stage_config.retry_groups:  # needs an environment that allows a second answer
            from agentic_rl.agent.settings import build_environment

            build_environment(stage_config)
    resolve_stage_config(config, "eval", config.model, root)


def resolve_stage_config(config: PipelineConfig, name: str, model_dir: str, root: Path) -> Any:
    """A stage's typed config as this pipeline runs it (``name``: a training stage, or ``eval``), starting from
    ``model_dir``, in the run directory ``root``: the stage's section over what the stage inherits from the top
    level (:func:`agentic_rl.stages.inherited_settings`) and what the pipeline sets per run (:data:`PER_RUN_KEYS`)."""
    if name == "eval":
        from agentic_rl.eval.evaluate import EvalConfig

        return _stage_config(EvalConfig, config.eval, _eval_defaults(config, model_dir, root / "eval"),
                             where=f"{config.name}: eval")
    return _stage_config(_stage_class(name), _section_over_defaults(config, name, model_dir, root), {},
                         where=f"{config.name}: {name}")


def _train_stages(config: PipelineConfig) -> list[str]:
    return [name for name in ("pretrain", "sft", "grpo", "sft_continued") if name in config.stages]


def _section(config: PipelineConfig, name: str) -> dict[str, Any]:
    """A training stage's settings from the YAML; the control continues SFT, so it starts from the sft section."""
    if name == "sft_continued":
        return {**config.sft, **config.sft_continued}
    return getattr(config, name)


def _table_name(name: str) -> str:
    """A pipeline stage's name in the table of stages (the control is an SFT run)."""
    return "sft" if name == "sft_continued" else name


def _stage_class(name: str) -> type:
    from agentic_rl.stages import get_stage

    return get_stage(_table_name(name)).config_class


def _resume_interrupted(name: str, out: Path, values: dict[str, Any], cls: type, where: str) -> dict[str, Any]:
    """A stage folder without its finished marker but with a run in it was interrupted: resume it when its recorded
    settings are these; refuse when they are not (never silently reuse or delete it)."""
    if (out / FINISHED_MARKER).is_file() or not has_run(out):
        return values
    differences = stage_settings_mismatch(out, _stage_config(cls, values, {}, where=where))
    if differences:
        raise _other_settings_error(name, out, differences)
    log(f"stage {name}: {out} holds an interrupted run with the same settings; resuming it")
    return {**values, "resume": True}


def _section_over_defaults(config: PipelineConfig, name: str, model_dir: str, root: Path) -> dict[str, Any]:
    """A training stage's settings before they are typed: its section over what the pipeline gives it. GRPO's SFT
    anchor trains on this run's SFT demonstrations, the data its compute-matched control continues on."""
    values = {**_train_defaults(config, name, model_dir, root / name), **_section(config, name)}
    if name == "grpo" and values.get("sft_loss_weight") and "sft" in config.stages and not values.get("sft_anchor_run"):
        values["sft_anchor_run"] = str(root / "sft")
    return values


def _run_training_stage(config: PipelineConfig, name: str, root: Path, values: dict[str, Any],
                        summary: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Resolve and run (or reuse) one training stage of the ladder through the table of stages; returns its typed
    config and its result."""
    from agentic_rl.stages import get_stage

    cls, run = get_stage(_table_name(name)).load()
    out, where = root / name, f"{config.name}: {name}"
    cfg = _stage_config(cls, _resume_interrupted(name, out, values, cls, where), {}, where=where)
    return cfg, _run_stage(name, _table_name(name), out, lambda: _jsonable(run(cfg)), summary, settings=cfg)


def run_pipeline(config: PipelineConfig) -> dict[str, Any]:
    root = Path(config.output_dir) if config.output_dir else Path("runs") / config.name
    announce("pipeline", config, root)
    _check_sections(config, root)  # the whole configuration first: nothing is deleted or written before it passes
    if config.fresh and root.exists():
        check_deletable(root, "pipeline")  # only a run directory we created, never the cwd, home or a parent
        with hold_run_lock(root, "pipeline"):  # never delete a run another process is writing into
            pass
        delete_run_dir(root, "pipeline")
    new_run = not has_run(root)
    root = create_run_root(root, "pipeline")
    with hold_run_lock(root, "pipeline"):  # one pipeline per run directory: a second one refuses in one line
        if new_run:
            save_config(config, root / "config.yaml")
        return _run_ladder(config, root)


def _run_ladder(config: PipelineConfig, root: Path) -> dict[str, Any]:
    """The stages of :func:`run_pipeline`, in its claimed run directory ``root``."""
    summary: dict[str, Any] = {"name": config.name, "seed": config.seed, "stages": {}}
    started = time.time()
    model_dir = config.model
    stage_models: dict[str, str] = {}

    # --- 1. pretrain (opt-in: a tiny base of this run's own instead of the shipped one) ----------------------------
    if "pretrain" in config.stages:
        values = _section_over_defaults(config, "pretrain", model_dir, root)
        _, result = _run_training_stage(config, "pretrain", root, values, summary)
        model_dir = result["model_dir"]
    stage_models["base"] = model_dir
    summary["base"] = describe_base(model_dir if "pretrain" in config.stages else config.model)
    if config.evaluate_stages and ("sft" in config.stages or "grpo" in config.stages):
        _evaluate("base", model_dir, config, root, summary)

    # --- 2. SFT, then 3. GRPO: each trains on the previous stage's model and is evaluated on the same problems ------
    grpo_start, grpo_result, sample_temperature = model_dir, None, None
    sft_start = model_dir
    for name in ("sft", "grpo"):
        if name not in config.stages:
            continue
        if name == "grpo":
            grpo_start = model_dir
        cfg, result = _run_training_stage(config, name, root, _section_over_defaults(config, name, model_dir, root),
                                          summary)
        if name == "grpo":
            grpo_result, sample_temperature = result, cfg.temperature
        model_dir = result["model_dir"]
        stage_models[name] = model_dir
        if config.evaluate_stages:
            _evaluate(name, model_dir, config, root, summary)

    # --- 3b. the compute-matched control: GRPO's wall time spent on more SFT --------------------------------------
    if "sft_continued" in config.stages:
        start = sft_start if config.control == "longer" else grpo_start
        control_dir = _run_control(config, root, start, _grpo_seconds(root / "grpo", grpo_result), summary)
        stage_models["sft_continued"] = control_dir
        if config.evaluate_stages:
            _evaluate("sft_continued", control_dir, config, root, summary)
    if config.evaluate_stages and config.sampled_eval:
        if sample_temperature is None:  # no GRPO stage here: sample at the temperature it would have trained at
            sample_temperature = resolve_stage_config(config, "grpo", model_dir, root).temperature
        for label in ("sft", "grpo", "sft_continued"):
            if label in stage_models:
                _evaluate(label, stage_models[label], config, root, summary, sample_temperature=sample_temperature)

    # --- 4. export -----------------------------------------------------------------------------------------------
    if "export" in config.stages:
        from agentic_rl.deploy.export import ExportConfig
        from agentic_rl.deploy.export import run as run_export

        out = root / "export"
        cfg = config_from_dict(ExportConfig, {"source": model_dir, "out": str(out)}, where=f"{config.name}: export")
        _run_stage("export", "export", out, lambda: {"model_dir": str(run_export(cfg))}, summary, settings=cfg)
        summary["export_dir"] = str(out)

    # --- 5. report -----------------------------------------------------------------------------------------------
    summary["total_wall_time_s"] = round(time.time() - started, 1)
    summary["models"] = stage_models
    from agentic_rl.report import control_comparison, write_pipeline_report

    control = control_comparison(root, summary)
    if control:
        summary["control"] = control
    save_config(config, root / "config.yaml")  # every stage agreed with these settings
    write_json(root / "summary.json", summary)
    report = write_pipeline_report(root, summary)
    log(f"report: {report}")
    log("held-out accuracy by stage: " + ", ".join(
        f"{name} {stage['accuracy']:.1%}" for name, stage in summary["stages"].items()
        if isinstance(stage.get("accuracy"), (int, float))))
    return summary


def _sft_final_row(candidates: list[Path]) -> dict[str, Any]:
    """The trainer's final row of an SFT run (``perf/train_runtime_s`` at its last ``step``), from the first
    candidate folder whose ``metrics.jsonl`` holds one."""
    from agentic_rl.utils import read_jsonl

    for folder in candidates:
        final = [r for r in read_jsonl(folder / "metrics.jsonl") if "perf/train_runtime_s" in r and r.get("step")]
        if final:
            return final[-1]
    raise ConfigError("sft_continued: no SFT timing to size the control by (looked for metrics.jsonl in "
                      f"{', '.join(str(c) for c in candidates)}); run the sft stage in this pipeline, or set "
                      "sft_continued.max_steps")


def _grpo_seconds(grpo_dir: Path, result: dict[str, Any]) -> float:
    """GRPO's compute time for sizing the control: the stage's wall time, or — when the stage was resumed, so that
    its wall time covers only the last part — the mean logged step time x steps, plus its held-out checks and
    difficulty selection."""
    if not result.get("resumed_from"):
        return float(result["wall_time_s"])
    from agentic_rl.utils import read_jsonl

    step_times = [r["perf/step_time_s"] for r in read_jsonl(grpo_dir / "metrics.jsonl") if "perf/step_time_s" in r]
    heldout = sum(r.get("seconds", 0.0) for r in read_jsonl(grpo_dir / "heldout.jsonl"))
    selection = (result.get("difficulty_selection") or {}).get("seconds", 0.0)
    mean_step = sum(step_times) / len(step_times) if step_times else 0.0
    return mean_step * result.get("steps", len(step_times)) + heldout + selection


def _run_control(config: PipelineConfig, root: Path, start_model: str, grpo_seconds: float,
                 summary: dict[str, Any]) -> str:
    """The control, on the sft section's data and settings, with as many steps more than SFT as fit in GRPO's time
    (:func:`_grpo_seconds`) at the SFT stage's speed (the control's own loading and saving come on top: the control
    never gets less compute than GRPO). ``control: continue`` trains GRPO's starting model (the SFT model) for those
    steps; ``longer`` trains SFT's starting model for SFT's steps plus those, in one schedule. Returns the
    control's model directory."""
    values = _section_over_defaults(config, "sft_continued", start_model, root)
    budget: dict[str, Any] = {"control": config.control, "grpo_wall_time_s": grpo_seconds}
    if "max_steps" not in config.sft_continued:
        # the SFT stage's timing; a control that continues a model trained elsewhere may find it beside that model
        final = _sft_final_row([root / "sft"] + ([Path(start_model).parent] if config.control == "continue" else []))
        seconds = final["perf/train_runtime_s"] / final["step"]
        extra = max(1, round(grpo_seconds / seconds))
        budget.update(sft_seconds_per_step=round(seconds, 4), extra_steps=extra)
        if config.control == "longer":
            budget["sft_steps"] = final["step"]
        values["max_steps"] = extra + budget.get("sft_steps", 0)
    budget["steps"] = values["max_steps"]
    log(f"stage sft_continued: {values['max_steps']} SFT steps from {start_model} (GRPO took {grpo_seconds:.0f}s)")
    _, result = _run_training_stage(config, "sft_continued", root, values, summary)
    summary["stages"]["sft_continued"]["budget"] = budget
    from agentic_rl.report import control_compute_share, equal_budget_steps

    control_seconds = summary["stages"]["sft_continued"].get("wall_time_s", 0.0)
    steps_needed = equal_budget_steps(budget, control_seconds)
    if steps_needed is not None:
        share = control_compute_share(budget, control_seconds)
        warn(f"the control's extra steps ran {share:.0%} of GRPO's {grpo_seconds:.0f} s (the machine ran at another "
             f"speed during SFT): it got less compute than GRPO; for an equal budget set sft_continued.max_steps: "
             f"{steps_needed} (with a new --name, or --fresh)")
    return result["model_dir"]


def _jsonable(result: Any) -> dict[str, Any]:
    """Stage results as a JSON-friendly dict with at least ``model_dir``."""
    if isinstance(result, (str, Path)):
        return {"model_dir": str(result)}
    if dataclasses.is_dataclass(result):
        result = dataclasses.asdict(result)
    out = {}
    for key, value in dict(result).items():
        out[key] = str(value) if isinstance(value, Path) else value
    if "model_dir" not in out:
        raise RuntimeError(f"stage result has no model_dir: {sorted(out)}")
    return out


# ---------------------------------------------------------------------------------------------------------------
# Quickstart: the embedded preset
# ---------------------------------------------------------------------------------------------------------------

def preset_path(name: str) -> Path:
    return Path(str(resources.files("agentic_rl") / "configs" / f"{name}.yaml"))


def load_pipeline_config(path: str | Path, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    values = read_yaml(path)
    values.update(overrides or {})
    return config_from_dict(PipelineConfig, values, where=str(path))


def run_quickstart(config: QuickstartConfig) -> dict[str, Any]:
    file = QUICKSTART_PRESETS[config.preset] + ("-smoke" if config.smoke else "")
    preset = Path(config.preset_file) if config.preset_file else preset_path(file)
    # Without --name the preset names the run, so a smoke run never lands in the full run's directory.
    overrides: dict[str, Any] = {"seed": config.seed, "fresh": config.fresh}
    if config.name is not None:
        overrides["name"] = config.name
    if config.eval_samples is not None:
        overrides["eval_samples"] = config.eval_samples
    return run_pipeline(load_pipeline_config(preset, overrides))

