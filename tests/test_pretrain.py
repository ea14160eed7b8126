"""Pretraining the embedded base: corpus hygiene, a short run that learns, and plain-transformers loading."""

from __future__ import annotations

import json

import pytest
from conftest import pretrain_config, read_jsonl

from agentic_rl.errors import ConfigError
from agentic_rl.train.pretrain import PretrainConfig, arithmetic_probe, build_corpus, pack_blocks, run


def test_corpus_excludes_held_out_questions_and_has_no_task_format():
    from agentic_rl.data.synthetic import synthetic_splits

    cfg = PretrainConfig(corpus_lines=3000, exclude_test=300)
    lines = build_corpus(cfg)
    assert len(lines) == 3000 and lines == build_corpus(cfg)  # deterministic
    _, test = synthetic_splits(0, 300, seed=cfg.synthetic_seed)
    assert not {r["question"] for r in test} & set(lines)
    assert not any("Final Answer" in line or "<|im_start|>" in line for line in lines)
    assert sum(" = " in line for line in lines) > 1000  # mostly arithmetic


def test_copy_corpus_option_adds_copy_lines_and_keeps_both_test_splits_out(monkeypatch):
    from agentic_rl.data import synthetic
    from agentic_rl.data.custom import load_task_dataset
    from agentic_rl.data.synthetic import CORPUS_MULTIPLICATION, arithmetic_corpus, synthetic_splits

    default = PretrainConfig(corpus_lines=2000, exclude_test=300)
    _, arithmetic_test = synthetic_splits(0, 300, seed=0)
    assert build_corpus(default) == arithmetic_corpus(2000, 0, exclude=[r["question"] for r in arithmetic_test])
    excluded = {}
    original = synthetic.copy_corpus

    def recording(n, seed, exclude=(), layout="plain"):
        excluded["questions"] = set(exclude)
        excluded["layout"] = layout
        return original(n, seed, exclude=exclude, layout=layout)

    monkeypatch.setattr(synthetic, "copy_corpus", recording)
    lines = build_corpus(PretrainConfig(corpus_lines=2000, exclude_test=300, corpus="arithmetic+copy"))
    # copy_fraction 0.75: 1500 copy lines, a third of them number lists
    assert len(lines) == 2000 and sum(" -> " in line for line in lines) == 500
    assert sum(" = " in line for line in lines) == sum(" = " in line for line in arithmetic_corpus(500, 0))
    half = build_corpus(PretrainConfig(corpus_lines=2000, exclude_test=300, corpus="arithmetic+copy",
                                       copy_fraction=0.5))
    assert sum(" -> " in line for line in half) == 333
    called = build_corpus(PretrainConfig(corpus_lines=2000, exclude_test=300, corpus="arithmetic+copy",
                                         copy_layout="call"))
    assert excluded["layout"] == "call" and sum('{"expression": "' in line for line in called) >= 900
    assert not any('{"expression"' in line for line in lines)
    # What is left out is the test split of every kind of problem the corpus writes: the single-turn task's and the
    # corpus's own multiplication problems (same generator, knobs and seed), which are the agentic task's.
    evaluated = {r["question"] for source in ("synthetic", "synthetic:multiplication")
                 for r in load_task_dataset(source, "test", synthetic_test_size=300).to_list()}
    assert {r["question"] for r in synthetic_splits(0, 300, 0, **CORPUS_MULTIPLICATION)[1]} <= evaluated
    assert evaluated <= excluded["questions"]
    questions = {line.rsplit("?", 1)[0] + "?" for line in lines if "?" in line}
    assert sum("*" in line and "?" in line for line in lines) >= 250
    assert not questions & evaluated
    with pytest.raises(ConfigError, match="corpus must be one of"):
        PretrainConfig(corpus="copy")
    with pytest.raises(ConfigError, match="copy_fraction"):
        PretrainConfig(corpus="arithmetic+copy", copy_fraction=1.5)


def test_copy_fraction_without_the_copy_corpus_is_an_error_not_ignored(tmp_path, capsys):
    from agentic_rl.cli import main
    from agentic_rl.pipeline import load_pipeline_config, run_pipeline

    message = ("copy_fraction applies to corpus 'arithmetic+copy' only: set corpus (--corpus arithmetic+copy) or drop "
               "copy_fraction")
    with pytest.raises(ConfigError) as err:
        PretrainConfig(copy_fraction=0.5)  # the default corpus, 'arithmetic', has no copy lines to size
    assert str(err.value) == message
    # From the command line and from a pipeline's pretrain section: before anything is written.
    assert main(["pretrain", "--copy-fraction", "0.5", "--output-dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == f"error: {message}\n" and not (tmp_path / "run").exists()
    path = tmp_path / "pipeline.yaml"
    path.write_text(f"output_dir: {tmp_path / 'pipeline'}\nstages: [pretrain]\npretrain:\n  corpus: arithmetic\n"
                    "  copy_fraction: 0.5\n")
    with pytest.raises(ConfigError, match="^copy_fraction applies to corpus 'arithmetic\\+copy' only"):
        run_pipeline(load_pipeline_config(path))
    assert not (tmp_path / "pipeline").exists()
    # The default with either corpus, and any share with the copy corpus, are fine.
    assert PretrainConfig().copy_fraction == PretrainConfig(corpus="arithmetic+copy").copy_fraction == 0.75
    assert PretrainConfig(corpus="arithmetic+copy", copy_fraction=0.5).copy_fraction == 0.5
    # The layout of the copy lines likewise: an error without them, a choice with them.
    with pytest.raises(ConfigError, match="^copy_layout applies to corpus 'arithmetic\\+copy' only"):
        PretrainConfig(copy_layout="call")
    with pytest.raises(ConfigError, match="^copy_layout must be one of plain, call, answer; got 'json'"):
        PretrainConfig(corpus="arithmetic+copy", copy_layout="json")


def test_pack_blocks_are_full_length(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    blocks = pack_blocks(["12 + 30 = 42"] * 50, tok, 16)
    assert blocks and all(len(b) == 16 for b in blocks)
    assert tok.decode(blocks[0]).startswith("12 + 30 = 42\n12")


@pytest.mark.stage  # trains without the model fixtures
def test_short_pretrain_learns_and_loads_with_plain_transformers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    result = run(pretrain_config(tmp_path, corpus_lines=1500, exclude_test=50, vocab_size=400, seq_length=64,
                                 max_steps=30, batch_size=8, learning_rate=1e-2, logging_steps=5))
    history = read_jsonl(tmp_path / "metrics.jsonl")
    losses = [h["train/loss"] for h in history if "train/loss" in h]
    assert len(losses) == 6 and losses[-1] < losses[0] - 1.0, losses
    m = result["metrics"]
    assert m["global_step"] == 30 and m["eval/loss"] < losses[0]
    assert json.loads((tmp_path / "metrics.json").read_text())["vocab_size"] == 400

    model_dir = result["model_dir"]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM" and tok.chat_template and len(tok) == 400
    assert model.generation_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    gen = pipeline("text-generation", model=model, tokenizer=tok)
    out = gen("12 + 30 =", max_new_tokens=4, do_sample=False)[0]["generated_text"]
    assert out.startswith("12 + 30 =") and len(out) > len("12 + 30 =")
    # the recorded probe is the saved model's: greedy answers to the same 200 facts, scored again
    assert arithmetic_probe(model, tok) == m["eval/arithmetic_accuracy"]


def test_config_checks():
    with pytest.raises(ConfigError, match="max_steps"):
        PretrainConfig(max_steps=0)
    with pytest.raises(ConfigError, match="corpus_lines"):
        PretrainConfig(corpus_lines=5)


def test_tool_call_tokens_setting_reaches_the_tokenizer_corpus(tmp_path, monkeypatch):
    """`tool_call_tokens` is what decides whether the tokenizer is trained on the tool-call scaffolding (off by
    default: the single-turn quickstart's tokenizer stays as it was measured)."""
    import agentic_rl.data.synthetic as synthetic
    from agentic_rl.agent.tasks import tool_call_scaffold

    class Stop(Exception):
        pass

    seen = []

    def spy(*args, **kwargs):
        seen.append(list(kwargs.get("scaffold", ())))
        raise Stop

    monkeypatch.setattr(synthetic, "default_tokenizer_corpus", spy)
    for flag in (False, True):
        with pytest.raises(Stop):
            run(PretrainConfig(output_dir=str(tmp_path / str(flag)), corpus_lines=200, exclude_test=10,
                               tool_call_tokens=flag, report_to="none"))
    assert seen == [[], tool_call_scaffold(500, 1)]  # 500: the extra corpus's floor; seed: the run's seed + 1
    assert PretrainConfig().tool_call_tokens is False


def test_distractors_give_the_broad_corpus_detail_sentences_and_keep_their_test_questions_out(monkeypatch):
    from conftest import detail_sentences

    from agentic_rl.data.synthetic import CORPUS_MULTIPLICATION
    from agentic_rl.train import pretrain
    from agentic_rl.train.pretrain import BROAD_MIX, evaluation_questions

    def with_a_detail(lines: list[str]) -> int:
        return sum(any(pattern.search(line) for pattern in detail_sentences()) for line in lines)

    def broad(share: float) -> PretrainConfig:
        return PretrainConfig(corpus="broad", corpus_lines=2000, exclude_test=300, distractors=share)

    without, with_details = build_corpus(broad(0.0)), build_corpus(broad(1.0))
    assert with_a_detail(without) == 0
    # every multiplication problem gets one: half the worked problems and half the calculator-call lines
    problems = {kind: round(2000 * BROAD_MIX[kind]) // 2 for kind in ("answer", "call")}
    assert with_a_detail(with_details) == problems["answer"] + problems["call"]
    assert 0.3 < with_a_detail(build_corpus(broad(0.5))) / with_a_detail(with_details) < 0.7
    # what is kept out: the single-turn task's and the multiplication tasks' test questions, with and without details
    seen = {}
    original = pretrain.broad_corpus

    def recording(n_lines, seed, *, exclude, chat_format=None, multiplication_knobs=None):
        seen.update(exclude=set(exclude), knobs=multiplication_knobs)
        return original(n_lines, seed, exclude=exclude, chat_format=chat_format,
                        multiplication_knobs=multiplication_knobs)

    monkeypatch.setattr(pretrain, "broad_corpus", recording)
    build_corpus(broad(0.5))
    assert seen["knobs"] == {**CORPUS_MULTIPLICATION, "distractors": 0.5}
    for source in ("synthetic", "synthetic:multiplication", "synthetic:multiplication-distractor"):
        assert set(evaluation_questions(source, 300, 0)) <= seen["exclude"], source
    test_questions = evaluation_questions("synthetic:multiplication-distractor", 300, 0)
    assert not [q for q in test_questions if any(q in line for line in with_details)]


def test_distractors_and_init_from_are_checked_before_anything_runs(tmp_path):
    from agentic_rl.errors import ModelLoadError

    with pytest.raises(ConfigError, match="^distractors applies to corpus 'broad' only"):
        PretrainConfig(distractors=0.5)
    with pytest.raises(ConfigError, match="distractors"):
        PretrainConfig(corpus="broad", distractors=1.5)
    with pytest.raises(ConfigError, match="^num_layers shapes a new model; with init_from the model and its "
                                          "tokenizer are embedded's: drop num_layers or init_from"):
        PretrainConfig(init_from="embedded", num_layers=2)
    with pytest.raises(ModelLoadError, match=str(tmp_path / "missing")):
        PretrainConfig(init_from=str(tmp_path / "missing"))
    assert PretrainConfig(init_from="embedded").init_from == "embedded"  # as given: the run records the user's name


@pytest.mark.stage
def test_init_from_continues_pretraining_the_saved_model_with_its_tokenizer(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = PretrainConfig(output_dir=str(tmp_path / "run"), init_from=str(tiny_model_dir), corpus_lines=300,
                            exclude_test=10, seq_length=32, max_steps=2, batch_size=4, learning_rate=1e-3,
                            report_to="none", bf16=False)
    result = run(config)
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    after = AutoModelForCausalLM.from_pretrained(result["model_dir"])
    assert after.config.num_hidden_layers == before.config.num_hidden_layers == 2
    assert AutoTokenizer.from_pretrained(result["model_dir"]).get_vocab() == \
        AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()
    # two AdamW steps move each weight by at most about twice the learning rate: trained further, not started anew
    changes = [(a - b).abs().max().item() for a, b in zip(after.state_dict().values(), before.state_dict().values())]
    assert 0 < max(changes) <= 2.2e-3, changes
