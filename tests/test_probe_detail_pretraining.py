"""The detail-pretraining probe: its corpus holds detail sentences only when asked (else it is the recipe's), keeps the
evaluations' test questions out, and its run writes a base a preset can start from."""

from __future__ import annotations

import sys

import pytest
from conftest import benchmark_script, detail_sentences


@pytest.fixture(scope="module")
def probe():
    return benchmark_script("probe_detail_pretraining")


def with_a_detail(lines: list[str]) -> int:
    patterns = detail_sentences()
    return sum(any(pattern.search(line) for pattern in patterns) for line in lines)


@pytest.mark.unit
def test_the_corpus_holds_detail_sentences_only_when_asked_and_never_a_test_question(probe):
    from agentic_rl.train.pretrain import BROAD_MIX, broad_corpus, evaluation_questions

    with_details = probe.detail_corpus(2000, 11, 1.0, chat_format=None)
    without = probe.detail_corpus(2000, 11, 0.0, chat_format=None)
    assert with_a_detail(without) == 0
    assert without == broad_corpus(2000, 11, exclude=probe.evaluation_exclusions())  # the recipe's corpus
    # every multiplication problem gets one: half the worked problems and half the calculator-call lines
    problems = {kind: round(2000 * BROAD_MIX[kind]) // 2 for kind in ("answer", "call")}
    assert with_a_detail(with_details) == problems["answer"] + problems["call"]
    test_questions = evaluation_questions("synthetic:multiplication-distractor", 1000, 0)
    assert not [q for q in test_questions if any(q in line for line in with_details)]


@pytest.mark.stage
def test_a_short_run_writes_a_base_that_loads_in_float16(probe, tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path / "cpt"
    monkeypatch.setattr(sys, "argv", ["probe", "--out", str(out), "--steps", "1", "--lines", "400"])
    probe.main()
    model = AutoModelForCausalLM.from_pretrained(out / "base")
    assert model.dtype == torch.float16 and (out / "base" / "tokenizer.json").is_file()
    assert not (out / "base" / "README.md").exists()  # the shipped card's sha256 is not this model's
    with pytest.raises(SystemExit):  # a second run never overwrites the first
        probe.main()
