"""The embedded base shipped in the package: its card, its weights, its probes, and `embedded` as a model name."""

from __future__ import annotations

import re

import pytest

from agentic_rl.errors import ModelLoadError
from agentic_rl.models import embedded
from agentic_rl.models.embedded import (CARD_FILE, EMBEDDED_DIR, WEIGHTS_FILE, describe_base, file_sha256,
                                        read_card)
from agentic_rl.models.probes import PROBES

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
    """The card's recipe is the rebuild command's configuration file, key by key, plus the corpus mix."""
    import yaml

    from agentic_rl.train.pretrain import BROAD_MIX
    from tests.conftest import REPO_ROOT

    recipe = yaml.safe_load((REPO_ROOT / "configs" / "embedded-base.yaml").read_text(encoding="utf-8"))
    assert read_card()["recipe"] == {**recipe, "corpus_mix": BROAD_MIX}
    assert list(read_card()["probes"]) == list(PROBES)


@pytest.mark.stage
def test_the_shipped_base_scores_its_cards_probes():
    """Loaded as every stage loads `embedded`, the shipped base scores the card's probe values (one greedy token may
    flip on another CPU kind: a tolerance of one probe item in a hundred), and has the skills the presets need."""
    from agentic_rl.models.loading import load_model_and_tokenizer
    from agentic_rl.models.probes import run_probes

    model, tokenizer = load_model_and_tokenizer("embedded")
    scores = run_probes(model, tokenizer)
    card = read_card()["probes"]
    assert scores == pytest.approx(card, abs=0.011)
    assert min(scores[name] for name in ("copy_lists", "call", "operation", "lookup")) >= 0.8


@pytest.mark.stage
def test_probes_score_zero_on_an_untrained_model(tiny_model_dir):
    """The probes can fail: a random-init model copies nothing and computes nothing."""
    from agentic_rl.models.loading import load_model_and_tokenizer
    from agentic_rl.models.probes import probe_arithmetic, probe_call, probe_copy_lists, probe_lookup

    model, tokenizer = load_model_and_tokenizer(str(tiny_model_dir))
    probes = (probe_arithmetic, probe_copy_lists, probe_call, probe_lookup)
    assert [probe(model, tokenizer, n=20) for probe in probes] == [0] * 4


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
    from agentic_rl.config import config_from_dict
    from agentic_rl.train.pretrain import BROAD_MIX, PretrainConfig, build_corpus, evaluation_questions

    config = config_from_dict(PretrainConfig, {"corpus": "broad", "corpus_lines": 4000, "exclude_test": 200})
    lines = build_corpus(config)
    assert len(lines) == 4000
    kinds = {"call": sum('{"expression": "' in line for line in lines),
             "lists": sum(bool(re.fullmatch(r"[\d ]+ -> [\d ]+", line)) for line in lines),
             "answer": sum("\n" in line for line in lines)}
    assert kinds == {kind: round(4000 * BROAD_MIX[kind]) for kind in kinds}
    world = [line for line in lines if '{"query": ' in line or '{"key": ' in line]
    assert world and len(world) < 4000 * BROAD_MIX["world"]  # searches and notes are part of the world lines
    questions = {line.split("\n")[0] for line in lines}
    for source in ("synthetic", "synthetic:multiplication"):
        assert not questions & set(evaluation_questions(source, 200, 0))


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
