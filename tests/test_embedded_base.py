"""The embedded base shipped in the package: its card, its weights, its probes, and `embedded` as a model name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import detail_sentences

from agentic_rl.errors import ModelLoadError
from agentic_rl.models import embedded
from agentic_rl.models.embedded import (CARD_FILE, EMBEDDED_DIR, WEIGHTS_FILE, describe_base, file_sha256,
                                        read_card)
from agentic_rl.train.probes import PROBES

MAX_SHIPPED_BYTES = 25 * 1000 * 1000


def test_the_shipped_weights_are_the_ones_the_card_names():
    card = read_card()
    weights = EMBEDDED_DIR / WEIGHTS_FILE
    assert file_sha256(weights) == card["sha256"]
    assert weights.stat().st_size == card["weights_bytes"]
    assert card["weights_dtype"] == "float16" and card["architecture"] == "Qwen3ForCausalLM"
    assert card["sha256"] in (EMBEDDED_DIR / CARD_FILE).read_text(encoding="utf-8").split("---\n", 2)[2]  # the body


def test_the_shipped_folder_is_small_enough_to_ship():
    total = sum(p.stat().st_size for p in EMBEDDED_DIR.iterdir() if p.is_file())
    assert total <= MAX_SHIPPED_BYTES


def test_the_card_records_the_recipe_it_was_built_with():
    """The card's recipe is the rebuild command's two configuration files, key by key and in order, plus the corpus
    mix."""
    import yaml

    from agentic_rl.train.pretrain import BROAD_MIX
    from tests.conftest import REPO_ROOT

    files = ["configs/embedded-base.yaml", "configs/embedded-base-distractors.yaml"]
    recipe = [{"file": name, **yaml.safe_load((REPO_ROOT / name).read_text(encoding="utf-8"))} for name in files]
    card = read_card()
    assert card["recipe"] == recipe
    assert card["corpus_mix"] == BROAD_MIX
    assert list(card["probes"]) == list(PROBES)


@pytest.mark.stage
def test_the_shipped_base_scores_its_cards_probes():
    """Loaded as every stage loads `embedded`, the shipped base scores the card's probe values (one greedy token may
    flip on another CPU kind: a tolerance of one probe item in a hundred), and has the skills the presets need."""
    from agentic_rl.models.loading import load_model_and_tokenizer
    from agentic_rl.train.probes import run_probes

    model, tokenizer = load_model_and_tokenizer("embedded")
    scores = run_probes(model, tokenizer)
    card = read_card()["probes"]
    assert scores == pytest.approx(card, abs=0.011)
    assert min(scores[name] for name in ("copy_lists", "call", "operation", "lookup", "tool_call", "tool_operation",
                                         "tool_detail",
                                         "tool_lookup", "tool_hop")) >= 0.8


@pytest.mark.stage
def test_probes_score_zero_on_an_untrained_model(tiny_model_dir):
    """The probes can fail: a random-init model copies nothing and computes nothing."""
    from agentic_rl.models.loading import load_model_and_tokenizer
    from agentic_rl.train.probes import (probe_arithmetic, probe_call, probe_copy_lists, probe_lookup,
                                         probe_tool_call, probe_tool_hop, probe_tool_lookup)

    model, tokenizer = load_model_and_tokenizer(str(tiny_model_dir))
    probes = (probe_arithmetic, probe_copy_lists, probe_call, probe_lookup, probe_tool_call, probe_tool_lookup,
              probe_tool_hop)
    assert [probe(model, tokenizer, n=20) for probe in probes] == [0] * len(probes)


def test_the_chat_layout_probes_ask_at_the_point_a_rollout_writes_the_call():
    """Each tool probe's context is the start of the environment's own demonstration as a rollout's context holds
    it, cut where the probed argument begins, and the answer it scores is what the demonstration writes there."""
    from agentic_rl.agent.calculator_env import CalculatorEnv
    from agentic_rl.agent.rollout import episode_text
    from agentic_rl.agent.search_env import SearchEnv
    from agentic_rl.agent.tool_format import ChatFormat, tool_exchange
    from agentic_rl.data.formats import build_prompt
    from agentic_rl.models.loading import load_model_and_tokenizer
    from agentic_rl.train import probes

    _, tokenizer = load_model_and_tokenizer("embedded")
    fmt = ChatFormat(tokenizer)
    row, product, value, sign = probes._two_step_problems(40)[0]
    calculator = CalculatorEnv()
    demo = calculator.demonstration({**row, "ground_truth": row["answer"].rsplit("#### ", 1)[1]})
    full = episode_text(fmt, build_prompt(row["question"], calculator.system_prompt), demo)
    first = probes._chat_context(tokenizer, calculator.system_prompt, row["question"], [])
    first += probes._call_prefix("calculator", "expression")
    second = probes._chat_context(tokenizer, calculator.system_prompt, row["question"],
                                  tool_exchange("calculator", {"expression": product}, value))
    second += probes._call_prefix("calculator", "expression") + value
    assert full.startswith(first + product + '"') and full.startswith(second + sign)

    rows, texts = probes._world_questions(10, hops=(2,))
    search = SearchEnv()
    demo = search.demonstration({"question": rows[0]["question"], "ground_truth": rows[0]["answer"]})
    full = episode_text(fmt, build_prompt(rows[0]["question"], search.system_prompt), demo)
    hop = probes._chat_context(tokenizer, search.system_prompt, rows[0]["question"], demo[:2])
    assert full.startswith(hop + probes._call_prefix("search", "query") + rows[0]["chain"][1] + '"')


def test_embedded_names_the_shipped_folder_and_a_missing_one_is_one_line(monkeypatch, tmp_path):
    from agentic_rl.models.loading import resolve_model_path

    assert resolve_model_path("embedded") == str(EMBEDDED_DIR)
    monkeypatch.setattr(embedded, "EMBEDDED_DIR", tmp_path / "absent")
    with pytest.raises(ModelLoadError, match=r"embedded base is missing .*make embedded-base"):
        resolve_model_path("embedded")


def test_a_run_names_its_base_with_the_weights_sha256(tmp_path):
    assert describe_base("embedded") == {"base": "embedded", "sha256": read_card()["sha256"]}
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / WEIGHTS_FILE).write_bytes(b"not really weights")
    assert describe_base(str(folder)) == {"base": str(folder), "sha256": file_sha256(folder / WEIGHTS_FILE)}
    assert describe_base("Some/hub-model") == {"base": "Some/hub-model"}  # offline in tests: named, no digest


def test_the_broad_corpus_holds_each_kind_in_its_share_and_no_test_question():
    from agentic_rl.agent.tool_format import ChatFormat
    from agentic_rl.config import config_from_dict
    from agentic_rl.models.loading import load_model_and_tokenizer
    from agentic_rl.train.pretrain import (BROAD_MIX, EPISODE_SEARCH_SHARE, PretrainConfig, build_corpus,
                                           evaluation_questions)

    _, tokenizer = load_model_and_tokenizer("embedded")
    config = config_from_dict(PretrainConfig, {"corpus": "broad", "corpus_lines": 4000, "exclude_test": 200})
    lines = build_corpus(config, ChatFormat(tokenizer))
    assert len(lines) == 4000
    episodes = [line for line in lines if line.startswith("<|im_start|>system\n")]
    plain = [line for line in lines if not line.startswith("<|im_start|>")]
    kinds = {"episode": len(episodes),
             "call": sum('{"expression": "' in line for line in plain),
             "lists": sum(bool(re.fullmatch(r"[\d ]+ -> [\d ]+", line)) for line in plain),
             "answer": sum("\n" in line for line in plain)}
    assert kinds == {kind: round(4000 * BROAD_MIX[kind]) for kind in kinds}
    searches = [line for line in episodes if '"name": "search"' in line]
    assert len(searches) == round(kinds["episode"] * EPISODE_SEARCH_SHARE)
    assert all('"name": "calculator"' in line for line in episodes if line not in searches)
    world = [line for line in plain if '{"query": ' in line or '{"key": ' in line]
    assert world and len(world) < 4000 * BROAD_MIX["world"]  # searches and notes are part of the world lines
    questions = {line.split("\n")[0] for line in plain}
    questions |= {line.split("<|im_start|>user\n")[1].split("<|im_end|>")[0] for line in episodes}
    for source in ("synthetic", "synthetic:multiplication"):
        assert not questions & set(evaluation_questions(source, 200, 0))
    # The agentic task's questions each hold a detail sentence, which no line of the corpus does: the base has read
    # none of them.
    assert not [line for line in lines for detail in detail_sentences() if detail.search(line)]
    without_template = build_corpus(config)  # the tokenizer's corpus: no chat template yet, so no episodes
    assert len(without_template) == 4000 - kinds["episode"]
    assert not any(line.startswith("<|im_start|>") for line in without_template)


def test_the_tool_scaffold_makes_every_tools_call_a_few_tokens():
    from agentic_rl.agent.tasks import tool_call_scaffold
    from agentic_rl.agent.tool_format import render_tool_call
    from agentic_rl.data.synthetic import default_tokenizer_corpus
    from agentic_rl.models.tiny import train_tokenizer

    call = render_tool_call("search", {"query": "Orla Venn"})
    lengths = {}
    for every_tool in (False, True):
        scaffold = tool_call_scaffold(2000, 1, every_tool=every_tool)
        tokenizer = train_tokenizer(default_tokenizer_corpus(2000, seed=1, scaffold=scaffold), vocab_size=1024)
        lengths[every_tool] = len(tokenizer(call, add_special_tokens=False)["input_ids"])
    assert lengths[True] <= lengths[False] - 5


def test_the_detail_probe_wants_the_second_step_where_there_is_one_and_no_call_where_there_is_not(monkeypatch):
    """Scored on continuations given in place of a model's: the next step's call, an answer, or a call on the detail's
    number."""
    from agentic_rl.data.custom import load_task_dataset
    from agentic_rl.data.formats import CALC_STEP
    from agentic_rl.train import probes

    rows = load_task_dataset("synthetic:multiplication-distractor", "test", synthetic_test_size=200).to_list()
    steps = [[e.replace(" ", "") for e, _ in CALC_STEP.findall(row["answer"])] for row in rows]
    prefix = probes._call_prefix("calculator", "expression")
    one_step = sum(len(s) == 1 for s in steps) / len(rows)
    assert 0.2 < one_step < 0.8  # both kinds are asked

    def scored(continuations):
        monkeypatch.setattr(probes, "_continue", lambda model, tokenizer, texts, *a, **k: continuations[:len(texts)])
        return probes.probe_tool_detail(None, tokenizer)

    from agentic_rl.models.loading import load_tokenizer

    tokenizer = load_tokenizer("embedded")
    right = [prefix + s[1] + '"}}' if len(s) > 1 else "Final Answer: 12" for s in steps]
    assert scored(right) == 1.0
    assert scored(["Final Answer: 12"] * len(rows)) == pytest.approx(one_step)  # a second step left out
    detail = [prefix + "1482+23\"}}"] * len(rows)  # a call on a number no step uses
    assert scored(detail) == 0.0


@pytest.fixture
def build(monkeypatch, tmp_path):
    """The rebuild script with its pretraining runs and its float16 copies recorded instead of done, and the shipped
    folder moved into the test's folder."""
    from conftest import script_module

    module = script_module("scripts/build_embedded_base.py")
    module.calls = []

    def pretrain(config):
        module.calls.append(("pretrain", config.output_dir, config.init_from, config.max_steps))

    def ship(model_dir, dest, *, recipe, command, first_phase_sha256=None):
        module.calls.append(("ship", str(model_dir), str(dest), [phase["file"] for phase in recipe]))
        Path(dest).mkdir(parents=True, exist_ok=True)
        (Path(dest) / WEIGHTS_FILE).write_bytes(b"weights")
        return {"sha256": "0" * 64, "probes": {}}

    monkeypatch.setattr(module, "run_pretrain", pretrain)
    monkeypatch.setattr(module, "ship", ship)
    monkeypatch.setattr(module, "EMBEDDED_DIR", tmp_path / "shipped-here")
    return module


def test_the_rebuild_runs_two_phases_the_second_from_the_first_as_shipped_in_float16(build, tmp_path):
    import yaml

    from tests.conftest import REPO_ROOT

    steps = [yaml.safe_load((REPO_ROOT / "configs" / name).read_text(encoding="utf-8"))["max_steps"]
             for name in ("embedded-base.yaml", "embedded-base-distractors.yaml")]
    root = tmp_path / "build"
    assert build.main(["--output-dir", str(root)]) == 0
    files = ["configs/embedded-base.yaml", "configs/embedded-base-distractors.yaml"]
    assert build.calls == [
        ("pretrain", str(root / "phase1"), None, steps[0]),
        ("ship", str(root / "phase1" / "model"), str(root / "phase1-float16"), files[:1]),
        ("pretrain", str(root / "phase2"), str(root / "phase1-float16"), steps[1]),
        ("ship", str(root / "phase2" / "model"), str(tmp_path / "shipped-here"), files),
    ]


def test_the_second_phase_alone_starts_from_a_given_first_phase_and_a_missing_one_stops_it(build, tmp_path):
    first = tmp_path / "first"
    assert build.main(["--output-dir", str(tmp_path / "b"), "--first-phase", str(first)]) == 1
    assert build.calls == []  # nothing ran
    first.mkdir()
    (first / WEIGHTS_FILE).write_bytes(b"weights")
    assert build.main(["--output-dir", str(tmp_path / "b"), "--first-phase", str(first)]) == 0
    assert [call[:3] for call in build.calls] == [("pretrain", str(tmp_path / "b" / "phase2"), str(first)),
                                                  ("ship", str(tmp_path / "b" / "phase2" / "model"),
                                                   str(tmp_path / "shipped-here"))]
