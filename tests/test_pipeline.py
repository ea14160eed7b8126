"""The ladder end to end on the reduced preset (what CI runs): one run directory, summary, report, export, skipping."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from agentic_rl.cli import main
from agentic_rl.config import save_config
from agentic_rl.errors import ConfigError
from agentic_rl.locking import LOCK_FILE
from agentic_rl.pipeline import QuickstartConfig, load_pipeline_config, preset_path, run_pipeline, run_quickstart

PRESET_DIR = preset_path("quickstart").parent


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "smoke"
    config = load_pipeline_config(preset_path("quickstart-smoke"), {"output_dir": str(out)})
    summary = run_pipeline(config)
    return out, summary


def test_smoke_ladder_writes_everything_into_one_run_directory(smoke_run):
    out, summary = smoke_run
    for name in ["config.yaml", "summary.json", "report.md", "training_curves.png",
                 "sft/model/config.json", "grpo/model/config.json", "export/model.safetensors",
                 "eval/base/metrics.json", "eval/sft/predictions.jsonl", "eval/grpo/report.md",
                 "sft/config.yaml", "grpo/config.yaml", "grpo/heldout.jsonl"]:
        assert (out / name).exists(), name
    assert not list(out.rglob("merged"))  # every stage's model is in <stage>/model/, the one name for it
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["stages"].keys() >= {"base", "sft", "grpo", "export"} and not (out / "pretrain").exists()
    for stage in ("base", "sft", "grpo"):
        # the summary's accuracy is the evaluation's strict accuracy: the share of its 16 predictions marked correct
        metrics = json.loads((out / "eval" / stage / "metrics.json").read_text())
        predictions = [json.loads(line) for line in (out / "eval" / stage / "predictions.jsonl").open()]
        accuracy = on_disk["stages"][stage]["accuracy"]
        assert on_disk["stages"][stage]["metrics"]["num_prompts"] == len(predictions) == 16
        assert accuracy == metrics["accuracy_strict"]
        assert accuracy == pytest.approx(sum(bool(p["correct_strict"]) for p in predictions) / 16)
    for stage in ("sft", "grpo"):
        assert on_disk["stages"][stage]["wall_time_s"] > 0
    report = (out / "report.md").read_text()
    assert "| base |" in report and "| sft |" in report and "| grpo |" in report


def test_the_report_says_where_the_time_goes(smoke_run):
    from agentic_rl.report import stage_time_rows

    out, summary = smoke_run
    rows = {row["stage"]: row for row in stage_time_rows(out, summary)}
    grpo = json.loads((out / "grpo" / "stage.json").read_text())
    assert grpo["generation_seconds"] > 0  # the trainer timed its generation batches
    share = (grpo["generation_seconds"] + grpo["heldout_seconds"]) / grpo["wall_time_s"]
    assert rows["grpo"]["generation_share"] == pytest.approx(share) and 0 < share < 1
    assert "pretrain" not in rows and rows["sft"]["generation_share"] == 0.0  # the run starts from the shipped base
    eval_sft = summary["stages"]["sft"]["metrics"]
    assert rows["eval sft"]["tokens"] == pytest.approx(eval_sft["avg_tokens"] * eval_sft["num_prompts"])
    report = (out / "report.md").read_text()
    assert "## Where the time goes" in report and f"| grpo | {grpo['wall_time_s']:.0f} |" in report


def test_the_control_gets_grpo_wall_time_in_sft_steps_and_is_compared_paired(smoke_run):
    out, _ = smoke_run
    on_disk = json.loads((out / "summary.json").read_text())
    stages = on_disk["stages"]
    budget = stages["sft_continued"]["budget"]
    history = [json.loads(line) for line in (out / "sft" / "metrics.jsonl").read_text().splitlines()]
    final = [h for h in history if "perf/train_runtime_s" in h][-1]
    seconds_per_step = final["perf/train_runtime_s"] / final["step"]
    assert budget["grpo_wall_time_s"] == stages["grpo"]["wall_time_s"]
    assert budget["steps"] == max(1, round(stages["grpo"]["wall_time_s"] / seconds_per_step))
    control_run = json.loads((out / "sft_continued" / "metrics.json").read_text())
    assert control_run["global_step"] == budget["steps"]
    # It continued the SFT model (not the base, not GRPO's output).
    import yaml

    assert yaml.safe_load((out / "sft_continued" / "config.yaml").read_text())["model"] == stages["sft"]["model_dir"]
    for mode, suffix in (("greedy", ""), ("sampled", "-sampled")):
        grpo = [json.loads(line) for line in (out / "eval" / f"grpo{suffix}" / "predictions.jsonl").open()]
        control = [json.loads(line) for line in (out / "eval" / f"sft_continued{suffix}" / "predictions.jsonl").open()]
        assert {r["question"] for r in grpo} == {r["question"] for r in control}
        expected = (sum(r["correct_strict"] for r in grpo) - sum(r["correct_strict"] for r in control)) / len(grpo)
        assert on_disk["control"][mode]["difference"] == pytest.approx(expected)
    assert stages["grpo"]["sampled"]["samples"] == 2 and "pass@2" in stages["grpo"]["sampled"]
    report = (out / "report.md").read_text()
    assert "| sft_continued |" in report and "## GRPO vs the compute-matched control" in report
    assert "sampled pass@1" in report


@pytest.mark.stage  # trains without the model fixtures
def test_the_longer_control_is_one_sft_schedule_from_sfts_start_for_sfts_steps_plus_grpos_time(tmp_path):
    """``control: longer``: the control repeats SFT from its starting model for SFT's steps plus the steps that fit
    GRPO's wall time, in one run (one warm-up, one decay); a re-run with the other control does not reuse it."""
    out = tmp_path / "longer"
    overrides = {"output_dir": str(out), "stages": ["sft", "grpo", "sft_continued"], "sampled_eval": 0}
    run_pipeline(load_pipeline_config(preset_path("quickstart-smoke"), {**overrides, "control": "longer"}))
    stages = json.loads((out / "summary.json").read_text())["stages"]
    budget = stages["sft_continued"]["budget"]
    final = [h for h in map(json.loads, (out / "sft" / "metrics.jsonl").read_text().splitlines())
             if "perf/train_runtime_s" in h][-1]
    extra = max(1, round(stages["grpo"]["wall_time_s"] / (final["perf/train_runtime_s"] / final["step"])))
    assert (budget["control"], budget["sft_steps"], budget["extra_steps"]) == ("longer", final["step"], extra)
    assert budget["steps"] == final["step"] + extra
    assert json.loads((out / "sft_continued" / "metrics.json").read_text())["global_step"] == budget["steps"]
    sft_settings = yaml.safe_load((out / "sft" / "config.yaml").read_text())
    control_settings = yaml.safe_load((out / "sft_continued" / "config.yaml").read_text())
    assert control_settings["model"] == sft_settings["model"] != stages["sft"]["model_dir"]
    assert control_settings["max_steps"] == budget["steps"] and sft_settings["max_steps"] == final["step"]
    report = (out / "report.md").read_text()
    assert (f"The control is one SFT run from SFT's starting model for {budget['steps']} steps in one schedule: "
            f"SFT's {final['step']} and {extra} more") in report
    with pytest.raises(ConfigError, match=r"other settings: .*model"):
        run_pipeline(load_pipeline_config(preset_path("quickstart-smoke"), {**overrides, "control": "continue"}))


@pytest.mark.parametrize("budget, control_seconds, expected", [
    ({"control": "continue", "grpo_wall_time_s": 60.0, "sft_seconds_per_step": 0.5, "extra_steps": 90, "steps": 90},
     61.0,
     "The control continues SFT from GRPO's starting model for 90 steps, sized to GRPO's wall time (60 s; "),
    ({"control": "continue", "grpo_wall_time_s": 60.0, "steps": 40}, 61.0,
     "The control continues SFT from GRPO's starting model for 40 steps (set by sft_continued.max_steps; GRPO took "
     "60 s, the control 61 s). Differences"),
    ({"control": "longer", "grpo_wall_time_s": 60.0, "sft_seconds_per_step": 0.5, "sft_steps": 200, "extra_steps": 90,
      "steps": 290}, 195.0,  # 290 steps of about 0.67 s: SFT's 200, then 90 in GRPO's 60 s
     "The control is one SFT run from SFT's starting model for 290 steps in one schedule: SFT's 200 and 90 more, "
     "sized to GRPO's wall time (60 s; the control took 195 s). Differences"),
    ({"control": "longer", "grpo_wall_time_s": 60.0, "steps": 250}, 61.0,
     "for 250 steps in one schedule (set by sft_continued.max_steps; GRPO took 60 s, the control 61 s)."),
])
def test_the_report_says_which_control_ran_and_how_its_steps_were_set(budget, control_seconds, expected):
    from agentic_rl.report import _control_section

    row = {"treatment": 0.5, "control": 0.4, "difference": 0.1, "ci95": [0.05, 0.15]}
    summary = {"control": {"greedy": row},
               "stages": {"sft_continued": {"budget": budget, "wall_time_s": control_seconds}}}
    assert expected in "\n".join(_control_section(summary))


@pytest.mark.parametrize("control_seconds, flagged", [(40.0, True), (54.0, False), (61.0, False)])
def test_a_control_that_got_less_of_grpos_time_than_it_was_sized_for_is_flagged(control_seconds, flagged):
    from agentic_rl.report import _control_section, equal_budget_steps

    # sized by the SFT stage's speed (0.5 s a step for GRPO's 60 s: 120 steps), the control ran at another speed
    budget = {"control": "continue", "grpo_wall_time_s": 60.0, "sft_seconds_per_step": 0.5, "extra_steps": 120,
              "steps": 120}
    row = {"treatment": 0.5, "control": 0.4, "difference": 0.1, "ci95": [0.05, 0.15]}
    summary = {"control": {"greedy": row},
               "stages": {"sft_continued": {"budget": budget, "wall_time_s": control_seconds}}}
    section = "\n".join(_control_section(summary))
    assert equal_budget_steps(budget, control_seconds) == (180 if flagged else None)  # 120 steps x 60 s / 40 s
    assert ("**The control got less compute than GRPO** (its extra steps ran 67% of GRPO's time: the machine ran at "
            "another speed during SFT): for an equal budget set `sft_continued.max_steps: 180` (with a new `--name`, "
            "or `--fresh`)." in section) is flagged
    # steps the user set are left as set, however long they took
    set_by_user = {"control": "continue", "grpo_wall_time_s": 60.0, "steps": 120}
    assert equal_budget_steps(set_by_user, control_seconds) is None
    # control: longer also trains SFT's 80 steps: 200 steps in 2 x control_seconds leave 120 of them GRPO's share
    longer = {**budget, "control": "longer", "sft_steps": 80, "steps": 200}
    longer_seconds = control_seconds * 200 / 120
    assert equal_budget_steps(longer, longer_seconds) == (80 + 180 if flagged else None)
    # the flag gives the share the decision used (the extra steps' time), not the whole control's over GRPO's
    longer_section = "\n".join(_control_section({**summary, "stages": {"sft_continued": {
        "budget": longer, "wall_time_s": longer_seconds}}}))
    assert ("(its extra steps ran 67% of GRPO's time" in longer_section) is flagged


def test_the_pipeline_warns_when_the_control_got_less_than_grpos_time(monkeypatch, tmp_path, capsys):
    from agentic_rl import pipeline

    monkeypatch.setattr(pipeline, "_section_over_defaults", lambda *args: {})
    monkeypatch.setattr(pipeline, "_sft_final_row", lambda candidates: {"perf/train_runtime_s": 50.0, "step": 100})

    def control_stage(config, name, root, values, summary):  # 120 steps sized at 0.5 s each, run in 40 s
        summary["stages"][name] = {"wall_time_s": 40.0}
        return None, {"model_dir": str(root / name / "model")}

    monkeypatch.setattr(pipeline, "_run_training_stage", control_stage)
    config = SimpleNamespace(control="continue", sft_continued={})
    summary = {"stages": {}}
    pipeline._run_control(config, tmp_path, "sft/model", 60.0, summary)
    assert summary["stages"]["sft_continued"]["budget"]["steps"] == 120
    assert ("the control's extra steps ran 67% of GRPO's 60 s (the machine ran at another speed during SFT): it got "
            "less compute than GRPO; for an equal budget set sft_continued.max_steps: 180 (with a new --name, or "
            "--fresh)") in capsys.readouterr().err


def test_the_longer_control_needs_the_sft_stage():
    from agentic_rl.config import config_from_dict
    from agentic_rl.pipeline import PipelineConfig

    with pytest.raises(ConfigError, match="control 'longer' repeats the SFT stage"):
        config_from_dict(PipelineConfig, {"stages": ["grpo", "sft_continued"], "control": "longer"})
    with pytest.raises(ConfigError, match="control"):
        config_from_dict(PipelineConfig, {"control": "shorter"})


def test_the_pipeline_system_prompt_reaches_sft_grpo_and_every_evaluation(smoke_run):
    import yaml

    out, _ = smoke_run
    pipeline = yaml.safe_load((out / "config.yaml").read_text())
    assert pipeline["system_prompt"] == ""  # the embedded presets train and evaluate without a system message
    for path in ("sft/config.yaml", "grpo/config.yaml", "eval/base/config.yaml", "eval/grpo/config.yaml"):
        assert yaml.safe_load((out / path).read_text())["system_prompt"] == "", path
    for stage in ("base", "sft", "grpo"):
        rows = [json.loads(line) for line in (out / "eval" / stage / "predictions.jsonl").open()]
        assert rows and all([m["role"] for m in r["prompt"]] == ["user"] for r in rows)


def test_exported_model_loads_with_plain_transformers_and_answers(smoke_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentic_rl.data import load_task_dataset
    from agentic_rl.data.formats import build_prompt, render_prompt

    out, _ = smoke_run
    model = AutoModelForCausalLM.from_pretrained(out / "export")
    tokenizer = AutoTokenizer.from_pretrained(out / "export")
    question = load_task_dataset("synthetic", "test", max_samples=1)[0]["question"]
    ids = tokenizer(render_prompt(tokenizer, build_prompt(question)), return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert generated.shape[1] > ids["input_ids"].shape[1]
    # The export is the GRPO model: same weights as the stage's output model.
    grpo = AutoModelForCausalLM.from_pretrained(out / "grpo" / "model")
    for (name, a), (_, b) in zip(model.state_dict().items(), grpo.state_dict().items()):
        assert torch.equal(a, b), name


def test_rerun_skips_finished_stages_and_fresh_starts_over(smoke_run, capsys):
    out, summary = smoke_run
    marker = out / "sft" / "stage.json"
    before = marker.stat().st_mtime_ns
    config = load_pipeline_config(preset_path("quickstart-smoke"), {"output_dir": str(out)})
    again = run_pipeline(config)
    assert marker.stat().st_mtime_ns == before
    assert again["stages"]["sft"]["accuracy"] == summary["stages"]["sft"]["accuracy"]
    assert "already done" in capsys.readouterr().err


def test_a_copied_run_directory_reuses_every_stage_where_it_is_now(smoke_run, tmp_path, capsys):
    import shutil

    out, summary = smoke_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    markers = {p: p.read_bytes() for p in copy.rglob("stage.json")}
    again = run_pipeline(load_pipeline_config(preset_path("quickstart-smoke"), {"output_dir": str(copy)}))
    assert "starting" not in capsys.readouterr().err  # every stage reused, none trained or evaluated again
    assert {p: p.read_bytes() for p in copy.rglob("stage.json")} == markers
    assert again["models"] == {label: str(copy / label / "model") if label != "base" else "embedded"
                               for label in summary["models"]}
    assert again["stages"]["grpo"]["accuracy"] == summary["stages"]["grpo"]["accuracy"]
    # Other settings in the copy are still other settings, named without the paths that moved.
    other = load_pipeline_config(preset_path("quickstart-smoke"), {"output_dir": str(copy), "seed": 1})
    with pytest.raises(ConfigError, match=r"other settings: seed \(0 -> 1\); use"):
        run_pipeline(other)

def test_a_typo_in_a_stage_section_fails_before_any_training(tmp_path):
    path = tmp_path / "p.yaml"
    save_config(load_pipeline_config(preset_path("quickstart-smoke")), path)
    text = path.read_text().replace("learning_rate:", "lerning_rate:", 1)
    path.write_text(text)
    with pytest.raises(ConfigError, match="lerning_rate"):
        run_pipeline(load_pipeline_config(path, {"output_dir": str(tmp_path / "run")}))
    assert not (tmp_path / "run" / "pretrain").exists()


@pytest.mark.parametrize("key, value, message", [
    ("learning_rate", "fast", r"learning_rate"),                 # wrong type
    ("warmup_ratio", 2.0, r"warmup_ratio"),                      # out of range
    ("lr_scheduler_type", "sometimes", r"lr_scheduler_type"),    # not one of the choices
])
def test_a_bad_value_in_the_last_stage_fails_before_the_first_stage_runs(tmp_path, key, value, message):
    """A pipeline YAML is checked in full (types, ranges, cross-field rules of every stage section)
    before the first stage starts, not when the run reaches that section."""
    config = load_pipeline_config(preset_path("quickstart-smoke"))
    path = tmp_path / "p.yaml"
    save_config(config, path)
    data = yaml.safe_load(path.read_text())
    # sft_continued is the last training stage (only export follows); SFT is the first
    assert data["stages"][-2:] == ["sft_continued", "export"] and data["stages"][0] == "sft"
    data["sft_continued"][key] = value
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=message):
        run_pipeline(load_pipeline_config(path, {"output_dir": str(tmp_path / "run")}))
    assert not (tmp_path / "run" / "sft").exists()


def test_quickstart_command_rejects_unknown_flags_and_stage_names(tmp_path, capsys):
    assert main(["quickstart", "--no-such-flag"]) == 2
    assert "unknown flag '--no-such-flag' for 'agentic-rl quickstart'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"unknown stage.*'rlhf'"):
        run_pipeline(load_pipeline_config(preset_path("quickstart-smoke"),
                                          {"stages": ["sft", "rlhf"], "output_dir": str(tmp_path / "run")}))
    assert not (tmp_path / "run").exists()  # refused before anything was written


def _embedded_base_shipped() -> bool:
    from agentic_rl.models.embedded import EMBEDDED_DIR, WEIGHTS_FILE

    return (EMBEDDED_DIR / WEIGHTS_FILE).is_file()


@pytest.mark.stage  # trains without the model fixtures
@pytest.mark.parametrize("preset, environment", [
    ("agentic", "calculator"),
    pytest.param("search", "search", marks=pytest.mark.skipif(
        not _embedded_base_shipped(), reason="the search smoke preset starts from the shipped embedded base, whose "
        "weights (models/embedded_base/model.safetensors) are not in this checkout")),
    pytest.param("memory", "memory", marks=pytest.mark.skipif(
        not _embedded_base_shipped(), reason="the memory smoke preset starts from the shipped embedded base, whose "
        "weights (models/embedded_base/model.safetensors) are not in this checkout")),
])
def test_agentic_quickstart_smoke_runs_every_stage_and_reports_tool_statistics(tmp_path, monkeypatch, preset,
                                                                               environment):
    """`quickstart --preset agentic --smoke` (and `search`, `memory`): the pipeline's layout, with every stage
    evaluated in the environment with and without tools; the summary's numbers are the episodes' own."""
    monkeypatch.chdir(tmp_path)  # the quickstart writes runs/<name>/ under the working directory
    summary = run_quickstart(QuickstartConfig(preset=preset, smoke=True, name=preset))
    out = tmp_path / "runs" / preset
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["stages"].keys() >= {"base", "sft", "grpo", "export"}
    report = (out / "report.md").read_text()
    assert f"in environment `{environment}`" in report
    assert "| stage | accuracy with tools | without tools | tool-call rate |" in report
    questions = {}
    for stage in ("base", "sft", "grpo"):
        numbers = on_disk["stages"][stage]
        assert numbers["accuracy"] == summary["stages"][stage]["accuracy"]
        episodes = {mode: [json.loads(line) for line in (out / "eval" / stage / f"episodes_{mode}.jsonl").open()]
                    for mode in ("with_tools", "without_tools")}
        with_tools, without = episodes["with_tools"], episodes["without_tools"]
        assert len(with_tools) == len(without) == 8  # eval_samples of the smoke preset
        assert numbers["accuracy"] == pytest.approx(sum(e["correct"] for e in with_tools) / 8)
        assert numbers["accuracy_without_tools"] == pytest.approx(sum(e["correct"] for e in without) / 8)
        valid_calls = [e["tool_calls"] - e["tool_errors"] for e in with_tools]
        assert numbers["tool_call_rate"] == pytest.approx(sum(n > 0 for n in valid_calls) / 8)
        assert numbers["turns_per_episode"] == pytest.approx(sum(e["turns"] for e in with_tools) / 8)
        # Without tools the environment never executes a call (an attempt gets an error observation).
        assert all(e["tool_calls"] == e["tool_errors"] for e in without)
        assert all(m["content"].startswith("error:") for e in without for m in e["messages"] if m["role"] == "tool")
        questions[stage] = [e["question"] for e in with_tools]
        row = next(line for line in report.splitlines() if line.startswith(f"| {stage} |"))
        assert row.startswith(f"| {stage} | {numbers['accuracy']:.1%} | {numbers['accuracy_without_tools']:.1%} | "
                              f"{numbers['tool_call_rate']:.1%} |")
    assert questions["base"] == questions["sft"] == questions["grpo"]  # the same held-out problems for every stage
    # (the run-directory lock file says which run holds the directory: each run rewrites it, results stay)
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in out.rglob("*") if p.name != LOCK_FILE}
    # Another seed does not reuse this run's stages (nor deletes them): it is an error naming the setting.
    with pytest.raises(ConfigError, match=r"other settings: seed \(0 -> 1\)"):
        run_quickstart(QuickstartConfig(preset=preset, smoke=True, name=preset, seed=1))
    assert {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in out.rglob("*") if p.name != LOCK_FILE} == before


@pytest.mark.stage  # trains without the model fixtures
def test_the_agentic_ladder_with_sampled_eval_samples_episodes_for_sft_grpo_and_the_control(tmp_path):
    """The agentic smoke ladder with its control and ``sampled_eval: 2``: each trained stage is also evaluated with 2
    sampled episodes per problem at GRPO's temperature, with and without tools, into ``eval/<stage>-sampled/``; the
    summary's ``stages.<stage>.sampled`` numbers are those episodes' own, and the report and the paired comparison
    with the control show them."""
    out = tmp_path / "agentic"
    config = load_pipeline_config(preset_path("quickstart-agentic-smoke"), {
        "output_dir": str(out), "stages": ["sft", "grpo", "sft_continued"], "sampled_eval": 2})
    run_pipeline(config)
    on_disk = json.loads((out / "summary.json").read_text())
    temperature = yaml.safe_load((out / "grpo" / "config.yaml").read_text())["temperature"]
    for stage in ("sft", "grpo", "sft_continued"):
        sampled = on_disk["stages"][stage]["sampled"]
        assert (sampled["samples"], sampled["temperature"]) == (2, temperature)
        episodes = {mode: [json.loads(line) for line in
                           (out / "eval" / f"{stage}-sampled" / f"episodes_{mode}.jsonl").open()]
                    for mode in ("with_tools", "without_tools")}
        for played in episodes.values():
            assert sorted((e["index"], e["sample"]) for e in played) == [(i, j) for i in range(8) for j in range(2)]
        assert sampled["pass@1"] == pytest.approx(sum(e["correct"] for e in episodes["with_tools"]) / 16)
        assert sampled["accuracy_without_tools"] == pytest.approx(
            sum(e["correct"] for e in episodes["without_tools"]) / 16)
        assert sampled["pass@2"] == pytest.approx(
            sum(any(e["correct"] for e in episodes["with_tools"] if e["index"] == i) for i in range(8)) / 8)
        metrics = json.loads((out / "eval" / f"{stage}-sampled" / "metrics.json").read_text())
        assert (metrics["num_samples"], metrics["temperature"]) == (2, temperature)
        greedy = [json.loads(line) for line in (out / "eval" / stage / "episodes_with_tools.jsonl").open()]
        assert len(greedy) == 8 and {e["sample"] for e in greedy} == {0}  # the greedy evaluation stays as it was
    assert "sampled" in on_disk["control"] and on_disk["control"]["sampled"]["problems"] == 8
    report = (out / "report.md").read_text()
    assert "sampled pass@1 |" in report and "2 sampled episodes per problem with tools" in report
    assert "- sampled: GRPO" in report


@pytest.mark.parametrize("preset", sorted(p.stem for p in PRESET_DIR.glob("quickstart*.yaml")))
def test_every_embedded_preset_starts_from_the_shipped_base(preset):
    """Seeds vary SFT and RL only: no preset pretrains a base of its own (pretraining is opt-in)."""
    config = load_pipeline_config(preset_path(preset))
    assert config.model == "embedded" and "pretrain" not in config.stages and not config.pretrain


@pytest.mark.parametrize("preset", ["quickstart", "quickstart-smoke"])
def test_shipped_presets_resolve_every_stage_section(preset):
    from agentic_rl.pipeline import _check_sections

    config = load_pipeline_config(preset_path(preset))
    _check_sections(config)  # raises ConfigError on a key a stage does not have
    assert config.system_prompt == "" and 0.5 < config.sft["answer_first_fraction"] < 1.0


def test_the_control_budget_of_a_resumed_grpo_counts_every_step_not_only_the_last_invocation(tmp_path):
    from agentic_rl.pipeline import _grpo_seconds

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "perf/step_time_s": 2.0}\n{"step": 2, "grpo/kl": 0.1}\n'
                                            '{"step": 3, "perf/step_time_s": 4.0}\n')
    (tmp_path / "heldout.jsonl").write_text('{"step": 0, "seconds": 2.5}\n{"step": 10, "seconds": 2.5}\n')
    fresh = {"wall_time_s": 99.0, "resumed_from": None, "steps": 10}
    assert _grpo_seconds(tmp_path, fresh) == 99.0
    resumed = {"wall_time_s": 12.0, "resumed_from": "checkpoint-5", "steps": 10,
               "difficulty_selection": {"seconds": 7.0}}
    assert _grpo_seconds(tmp_path, resumed) == 3.0 * 10 + 5.0 + 7.0


def test_sampled_evaluation_needs_the_stage_evaluations():
    from agentic_rl.config import config_from_dict
    from agentic_rl.pipeline import PipelineConfig

    with pytest.raises(ConfigError, match="sampled_eval evaluates the stages"):
        config_from_dict(PipelineConfig, {"sampled_eval": 4, "evaluate_stages": False})
    with pytest.raises(ConfigError, match="needs 'grpo' in stages"):
        config_from_dict(PipelineConfig, {"stages": ["pretrain", "sft", "sft_continued"]})


@pytest.mark.unit
@pytest.mark.parametrize("preset", ["default", "agentic", "search", "memory"])
def test_a_smoke_run_without_a_name_never_shares_the_full_runs_directory(preset, monkeypatch):
    """Without --name each preset names its run, so `--smoke` then the full ladder use two directories."""
    import agentic_rl.pipeline as pipeline

    roots = {}
    for smoke in (False, True):
        monkeypatch.setattr(pipeline, "run_pipeline", lambda config: {"name": config.name})
        roots[smoke] = run_quickstart(QuickstartConfig(preset=preset, smoke=smoke))["name"]
    assert roots[True] == roots[False] + "-smoke"
    monkeypatch.setattr(pipeline, "run_pipeline", lambda config: {"name": config.name})
    assert run_quickstart(QuickstartConfig(preset=preset, smoke=True, name="mine"))["name"] == "mine"


def test_the_run_names_its_base_and_the_weights_sha256(smoke_run):
    from agentic_rl.models.embedded import read_card

    out, summary = smoke_run
    digest = read_card()["sha256"]
    assert json.loads((out / "summary.json").read_text())["base"] == {"base": "embedded", "sha256": digest}
    assert f"Base model: `embedded` (weights sha256 `{digest}`)." in (out / "report.md").read_text()
