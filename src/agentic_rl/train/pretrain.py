"""Stage 1 of the embedded ladder: train a tokenizer and pretrain a tiny Qwen3 base on synthetic arithmetic.

Algorithm:

1. Corpus: ``data.synthetic.arithmetic_corpus`` — arithmetic facts (``37 + 48 = 85``), short chains of equations
   where each line starts from the previous result, and word-problem *question* sentences, with no chat format and
   no ``Final Answer`` line. The held-out test questions of the synthetic task are excluded. So the base learns
   arithmetic and the task's vocabulary, but not its question -> worked-answer format (that is SFT's job).
   ``corpus: arithmetic+copy`` replaces a share ``copy_fraction`` of the lines by ``data.synthetic.copy_corpus``
   lines, which only copying earlier numbers predicts (for the agentic preset, whose tool calls copy numbers); with
   ``copy_layout: call`` their steps are written as calculator arguments, as in a tool call, with ``answer`` as the
   lines of a worked answer after the question (``39 * 83 = 3237``), as the single-turn task's answers write them:
   the base then sees training questions with their steps, still without chat format or ``Final Answer`` line (the
   single-turn quickstart's choice: a base that copies the question's numbers into its steps on every seed).
2. Tokenizer: byte-level BPE trained on that corpus (plus the system prompt and chat scaffolding, and with
   ``tool_call_tokens`` the agent's tool-call text), one token per digit, Qwen3-shaped chat template
   (``models/tiny.py``).
3. Model: a random-init ``Qwen3ForCausalLM`` from a small ``Qwen3Config`` preset (``tiny``: hidden 256, 4 layers,
   ~3.4M parameters with a 1024-token vocabulary), fp32. ``init_from`` continues a saved model instead (its
   tokenizer and weights, in fp32; no tokenizer is trained), as a pretraining run's later phase on a changed mix:
   the shipped base's second phase reads the ``broad`` corpus with ``distractors``, a share of its multiplication
   problems given a sentence whose number the answer does not use.
4. Causal-LM training with ``transformers.Trainer`` on the corpus joined by newlines and cut into ``seq_length``
   blocks (every token is a target), AdamW, linear warm-up then cosine decay; matmuls in bf16 (``bf16``) where the
   hardware computes it natively, weights in fp32.
5. Saved with ``save_pretrained`` into ``<run>/model``: plain ``AutoModelForCausalLM.from_pretrained`` /
   ``AutoTokenizer.from_pretrained`` / ``pipeline("text-generation")`` load it. ``<run>/metrics.json`` holds the
   final and held-out loss and an arithmetic probe (greedy ``a op b =`` completions on fresh facts),
   ``<run>/metrics.jsonl`` every logged step (``train/loss``, ``train/learning_rate``, ``eval/loss``, ...), and
   ``<run>/stage.json`` marks the run finished (:class:`agentic_rl.runs.StageRun`).

Run: ``agentic-rl pretrain --output-dir runs/base`` (about 3 minutes on 2 CPU cores with the defaults).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any

from agentic_rl.config import SEED_RANGE, changed_from_default, check_range, config_to_dict, report_to_list, setting
from agentic_rl.console import announce
from agentic_rl.data.synthetic import COPY_LAYOUTS
from agentic_rl.errors import ConfigError
from agentic_rl.runs import MODEL_FOLDER, StageRun, stage_path
from agentic_rl.utils import default_mixed_precision, has_gpu, log, set_seed, write_json

#: Pretraining corpora (``PretrainConfig.corpus``).
CORPORA = ("arithmetic", "arithmetic+copy", "broad")

#: The ``broad`` corpus (the shipped embedded base's): share of the lines of each kind. Every embedded task's skill is
#: in it: the arithmetic lines (facts, chains, question sentences), word problems followed by their worked steps
#: (single-turn answers) and by their calculator calls (tool calls), whole calculator and search episodes in the chat
#: layout the stages read (system prompt, question, calls, tool results, answer), number lists to copy, and lines of
#: fictional worlds (their passages, searches, notes and name lists) for the search and memory environments.
BROAD_MIX = {"arithmetic": 0.25, "answer": 0.225, "call": 0.125, "episode": 0.1, "lists": 0.1, "world": 0.2}

#: Share of the ``episode`` lines that are search episodes (the rest are calculator episodes).
EPISODE_SEARCH_SHARE = 0.4


@dataclass
class PretrainConfig:
    output_dir: str | None = setting(None, "run directory (default runs/pretrain); the model is saved in "
                                           "<output_dir>/model")
    seed: int = setting(0, "random seed (corpus, initialisation, data order)")
    corpus_lines: int = setting(40000, "lines of synthetic pretraining text")
    corpus: str = setting("arithmetic", "pretraining text: 'arithmetic' (facts, chains, question sentences), "
                                        "'arithmetic+copy' (a share copy_fraction of the lines replaced by copy "
                                        "lines: questions followed by their calculator expressions, repeated number "
                                        "lists) or 'broad' (the shipped embedded base's: arithmetic, worked "
                                        "problems, calculator calls, whole calculator and search episodes in the "
                                        "chat layout, number lists and fictional-world lines; implies "
                                        "tool_call_tokens)", choices=list(CORPORA))
    copy_fraction: float = setting(0.75, "with corpus 'arithmetic+copy': share of the lines that are copy lines (two "
                                         "thirds of them questions with their expressions, one third repeated number "
                                         "lists)")
    copy_layout: str = setting("plain", "with corpus 'arithmetic+copy': how a question's steps are written: 'plain' "
                                        "(39*83=3237), 'call' ({\"expression\": \"39*83\"} 3237, numbers copied "
                                        "after the same tokens as in a tool call) or 'answer' (lines '39 * 83 = 3237' "
                                        "after the question, as the single-turn task's answers)",
                                        choices=list(COPY_LAYOUTS))
    distractors: float = setting(0.0, "with corpus 'broad': share of its multiplication problems given one sentence "
                                      "with a number the answer does not use (\"Leo is 34 years old.\"), as in "
                                      "synthetic:multiplication-distractor, whose test questions are then kept out "
                                      "too")
    init_from: str | None = setting(None, "continue pretraining this model (a folder, a hub id, or 'embedded' for the "
                                          "shipped base) on a fresh corpus instead of a new one: its tokenizer and "
                                          "architecture are kept, so model_preset, hidden_size, num_layers, "
                                          "vocab_size and tool_call_tokens stay unset")
    exclude_test: int = setting(1000, "keep the first N held-out synthetic test questions (synthetic_seed) out of the "
                                      "corpus")
    synthetic_seed: int = setting(0, "seed of the synthetic task whose test questions are excluded (same for all "
                                     "stages)")
    model_preset: str = setting("tiny", "model size preset", choices=["micro", "tiny", "small"])
    hidden_size: int | None = setting(None, "override the preset's hidden size")
    num_layers: int | None = setting(None, "override the preset's number of layers")
    vocab_size: int = setting(1024, "BPE vocabulary size (incl. 256 bytes and 9 chat/tool tokens)")
    tool_call_tokens: bool = setting(False, "also train the tokenizer on the agent system prompt, role names and "
                                            "calculator calls, so that a call is ~25 tokens instead of ~55 (shorter "
                                            "episodes in every agentic stage)")
    seq_length: int = setting(128, "tokens per training block")
    max_steps: int = setting(300, "optimizer steps (-1: use epochs)")
    epochs: float = setting(1.0, "passes over the corpus when max_steps is -1")
    batch_size: int = setting(32, "blocks per optimizer step")
    learning_rate: float = setting(3e-3, "peak AdamW learning rate")
    warmup_ratio: float = setting(0.05, "share of steps for linear warm-up")
    lr_scheduler_type: str = setting("cosine", "decay after warm-up",
                                               choices=["cosine", "linear", "constant_with_warmup"])
    weight_decay: float = setting(0.01, "AdamW weight decay")
    eval_fraction: float = setting(0.02, "share of blocks held out for the eval loss")
    logging_steps: int = setting(10, "log loss / grad norm / lr every N steps")
    report_to: list[str] = setting(["tensorboard"], "metric backends: tensorboard, wandb (offline works), none (comma "
                                                    "list)")
    resume: bool = setting(False, "continue from the last complete checkpoint in the run directory (same settings "
                                  "only; max_steps may grow)")
    overwrite: bool = setting(False, "replace a finished or interrupted run in the run directory (without it, such a "
                                     "directory is an error)")
    save_steps: int = setting(0, "save a checkpoint every N steps (0: only at the end)")
    bf16: bool | None = setting(None, "bfloat16 mixed precision: fp32 weights, matmuls in bf16 (unset: on a GPU that "
                                      "supports it or a CPU with bf16 instructions, e.g. AVX512-BF16)")

    def __post_init__(self):
        if self.corpus not in CORPORA:
            raise ConfigError(f"corpus must be one of {', '.join(CORPORA)}; got {self.corpus!r}")
        self.report_to = report_to_list(self.report_to)
        if self.bf16 is None:
            self.bf16 = default_mixed_precision()
        check_range(self, "corpus_lines", 100)
        check_range(self, "seq_length", 16)
        check_range(self, "max_steps", 1, also=(-1,), meaning="-1 to train for `epochs`")
        check_range(self, "eval_fraction", 0, 0.5, high_open=True)
        check_range(self, ("batch_size", "logging_steps", "hidden_size", "num_layers"), 1)
        check_range(self, ("exclude_test", "save_steps"), 0)
        from agentic_rl.models.tiny import MARKUP_TOKENS, SPECIAL_TOKENS

        check_range(self, "vocab_size", 256 + len(SPECIAL_TOKENS) + len(MARKUP_TOKENS) + 1)  # bytes + chat/tool tokens
        check_range(self, ("learning_rate", "epochs"), 0, low_open=True)
        check_range(self, ("warmup_ratio", "copy_fraction"), 0, 1)
        if self.copy_layout not in COPY_LAYOUTS:
            raise ConfigError(f"copy_layout must be one of {', '.join(COPY_LAYOUTS)}; got {self.copy_layout!r}")
        copy_settings = ("copy_fraction", "copy_layout")  # ignored without the copy corpus
        ignored = [] if self.corpus == "arithmetic+copy" else changed_from_default(self, copy_settings)
        if ignored:
            raise ConfigError(f"{ignored[0]} applies to corpus 'arithmetic+copy' only: set corpus (--corpus "
                              f"arithmetic+copy) or drop {ignored[0]}")
        check_range(self, "weight_decay", 0)
        check_range(self, "distractors", 0, 1)
        if self.distractors and self.corpus != "broad":
            raise ConfigError("distractors applies to corpus 'broad' only: set corpus (--corpus broad) or drop "
                              "distractors")
        if self.init_from is not None:
            new_model_settings = ("model_preset", "hidden_size", "num_layers", "vocab_size", "tool_call_tokens")
            changed = changed_from_default(self, new_model_settings)
            if changed:
                raise ConfigError(f"{changed[0]} shapes a new model; with init_from the model and its tokenizer are "
                                  f"{self.init_from}'s: drop {changed[0]} or init_from")
            from agentic_rl.models.loading import resolve_model_path

            resolve_model_path(self.init_from)  # a one-line error now, not after the corpus is built
        check_range(self, ("seed", "synthetic_seed"), *SEED_RANGE)


# ---------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------

def build_corpus(config: PretrainConfig, chat_format=None) -> list[str]:
    """The pretraining lines (deterministic by seed), with the held-out test questions excluded. The ``broad``
    corpus's episodes are written with the chat template of ``chat_format`` (an
    :class:`~agentic_rl.agent.tool_format.ChatFormat`); without one they are left out (the lines the tokenizer is
    trained on, before it has a chat template)."""
    from agentic_rl.data.synthetic import CORPUS_MULTIPLICATION, arithmetic_corpus, copy_corpus, synthetic_splits

    test_questions = []
    copy_lines = int(round(config.corpus_lines * config.copy_fraction)) if config.corpus == "arithmetic+copy" else 0
    if config.exclude_test:
        test_questions = evaluation_questions("synthetic", config.exclude_test, config.synthetic_seed)
        if copy_lines or config.corpus == "broad":  # these also hold multiplication problems: keep their test out too
            test_questions += [row["question"] for row in synthetic_splits(0, config.exclude_test,
                                                                           config.synthetic_seed,
                                                                           **CORPUS_MULTIPLICATION)[1]]
    if config.corpus == "broad":
        knobs = None
        if config.distractors:
            knobs = {**CORPUS_MULTIPLICATION, "distractors": config.distractors}
            if config.exclude_test:
                test_questions += evaluation_questions("synthetic:multiplication-distractor", config.exclude_test,
                                                       config.synthetic_seed)
        return broad_corpus(config.corpus_lines, config.seed, exclude=test_questions, chat_format=chat_format,
                            multiplication_knobs=knobs)
    lines = arithmetic_corpus(config.corpus_lines - copy_lines, config.seed, exclude=test_questions)
    if copy_lines:
        lines += copy_corpus(copy_lines, config.seed, exclude=test_questions, layout=config.copy_layout)
        random.Random(config.seed).shuffle(lines)
    return lines


def broad_corpus(n_lines: int, seed: int, *, exclude: list[str], chat_format=None,
                 multiplication_knobs: dict[str, Any] | None = None) -> list[str]:
    """The ``broad`` corpus: :data:`BROAD_MIX` of ``n_lines`` lines, shuffled (deterministic by seed); the episodes
    only with a ``chat_format``. ``multiplication_knobs`` draws its multiplication problems (default
    ``CORPUS_MULTIPLICATION``; with ``distractors``, some carry a detail sentence)."""
    from agentic_rl.data.synthetic import arithmetic_corpus, copy_corpus
    from agentic_rl.data.world import world_corpus

    counts = {kind: int(round(n_lines * share)) for kind, share in BROAD_MIX.items()}
    counts["arithmetic"] += n_lines - sum(counts.values())
    lines = arithmetic_corpus(counts["arithmetic"], seed, exclude=exclude)
    # different seeds, so that the answer and the call layout write different problems
    lines += copy_corpus(counts["answer"], seed, problem_fraction=1, exclude=exclude, layout="answer",
                         multiplication_knobs=multiplication_knobs)
    lines += copy_corpus(counts["call"], seed + 1, problem_fraction=1, exclude=exclude, layout="call",
                         multiplication_knobs=multiplication_knobs)
    lines += copy_corpus(counts["lists"], seed + 2, problem_fraction=0)
    lines += world_corpus(counts["world"], seed)
    if chat_format is not None:
        lines += episode_corpus(counts["episode"], seed + 3, exclude=exclude, chat_format=chat_format,
                                multiplication_knobs=multiplication_knobs)
    random.Random(seed).shuffle(lines)
    return lines


def episode_corpus(n_lines: int, seed: int, *, exclude: list[str], chat_format,
                   multiplication_knobs: dict[str, Any] | None = None) -> list[str]:
    """Whole episodes as a rollout's context holds them (:func:`agentic_rl.agent.rollout.episode_text`): the
    environment's system prompt, the question, each tool call and its result, the answer. Calculator episodes on word
    problems (the multiplication task, drawn with ``multiplication_knobs``, and the arithmetic task, half each; the
    answer turn is the steps then the answer, or the answer alone, half each) and search episodes on the corpus's
    own fictional worlds (:data:`EPISODE_SEARCH_SHARE`; one search per entity of the question's chain, the passage
    found, the answer).

    A base that has read the question, the calls and the results only in the compact ``call`` layout does not carry
    what it reads there (the operation a verb asks for, the entity a question names) into the chat layout, where
    template tokens and the tool's result stand between the question and the next call."""
    from agentic_rl.agent.reference import ground_truth_of
    from agentic_rl.agent.rollout import episode_text
    from agentic_rl.agent.search_env import SEARCH_SYSTEM_PROMPT
    from agentic_rl.agent.tasks import AGENT_SYSTEM_PROMPT, demonstration
    from agentic_rl.agent.tool_format import tool_exchange
    from agentic_rl.data.formats import build_prompt
    from agentic_rl.data.synthetic import CORPUS_MULTIPLICATION, generate_synthetic
    from agentic_rl.data.world import corpus_world, passages, questions

    rng = random.Random(f"agentic-rl-episodes:{seed}")
    n_search = int(round(n_lines * EPISODE_SEARCH_SHARE))
    n_calculator = n_lines - n_search
    rows = generate_synthetic(n_calculator // 2, seed=seed + 7_777_777,
                              **(multiplication_knobs or CORPUS_MULTIPLICATION), exclude=exclude)
    rows += generate_synthetic(n_calculator - n_calculator // 2, seed=seed + 8_888_888, exclude=exclude)
    lines = []
    for row in rows:
        messages = demonstration({**row, "ground_truth": ground_truth_of(row["answer"])},
                                 final_turn=rng.choice(("steps", "answer")))
        lines.append(episode_text(chat_format, build_prompt(row["question"], AGENT_SYSTEM_PROMPT), messages))
    index = 0
    while len(lines) < n_lines:
        world = corpus_world(seed, index, namespace="episodes")
        texts = {p["title"]: p["text"] for p in passages(world)}
        for row in questions(world, min(n_lines - len(lines), 150), seed=index):
            messages = []
            for title in row["chain"]:
                messages += tool_exchange("search", {"query": title}, texts[title])
            messages.append({"role": "assistant", "content": f"Final Answer: {row['answer']}"})
            lines.append(episode_text(chat_format, build_prompt(row["question"], SEARCH_SYSTEM_PROMPT), messages))
        index += 1
    return lines


def evaluation_questions(source: str, n: int, synthetic_seed: int) -> list[str]:
    """The first ``n`` test questions of a synthetic source exactly as the stages load them (same task knobs, same
    seed), so that what pretraining leaves out is what evaluation asks."""
    from agentic_rl.data.custom import load_task_dataset

    rows = load_task_dataset(source, "test", synthetic_seed=synthetic_seed, synthetic_test_size=n).to_list()
    return [r["question"] for r in rows]


def pack_blocks(lines: list[str], tokenizer, seq_length: int) -> list[list[int]]:
    """Join lines with newlines, tokenize once, cut into full ``seq_length`` blocks (the ragged tail is dropped)."""
    ids = tokenizer("\n".join(lines), add_special_tokens=False)["input_ids"]
    n = len(ids) // seq_length
    return [ids[i * seq_length:(i + 1) * seq_length] for i in range(n)]


# ---------------------------------------------------------------------------------------------------------------
# Probe: does the base do arithmetic?
# ---------------------------------------------------------------------------------------------------------------

def arithmetic_probe(model, tokenizer, n: int = 200) -> float:
    """Greedy completion of ``"a op b ="`` for ``n`` fresh facts; the share answered exactly right (the shipped base's
    card records the same probe, :func:`agentic_rl.train.probes.probe_arithmetic`)."""
    from agentic_rl.train.probes import probe_arithmetic

    return probe_arithmetic(model, tokenizer, n=n)


# ---------------------------------------------------------------------------------------------------------------
# Run
# ---------------------------------------------------------------------------------------------------------------

def run(config: PretrainConfig) -> dict[str, Any]:
    """Train tokenizer + tiny base; returns ``{"model_dir", "run_dir", "metrics"}``."""
    import datasets
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from agentic_rl.agent.tasks import tool_call_scaffold
    from agentic_rl.data.synthetic import default_tokenizer_corpus
    from agentic_rl.models.loading import count_parameters
    from agentic_rl.models.tiny import build_tiny_model, save_model_dir, train_tokenizer
    from agentic_rl.train.monitoring import (HealthCallback, MetricsCallback, MetricsLogger, StepCostCallback,
                                             resolve_report_to, quiet_progress)

    start = time.time()
    out = stage_path(config.output_dir, "pretrain")
    announce("pretrain", config, out)
    # A finished or interrupted run in `out` is kept unless --resume / --overwrite says what to do with it.
    stage_run = StageRun(out, config, stage="pretrain")
    resume_from = stage_run.check()
    report_to = resolve_report_to(config.report_to, out)
    set_seed(config.seed)

    # --- tokenizer and corpus -----------------------------------------------------------------------------------
    tok_dir = out / "tokenizer"
    resumed_tokenizer = resume_from is not None and (tok_dir / "tokenizer.json").is_file()
    broad = config.corpus == "broad"
    trains_tokenizer = config.init_from is None and not resumed_tokenizer
    # the tokenizer's text; the broad corpus's training text is built again below, with the tokenizer's chat template
    lines = build_corpus(config) if trains_tokenizer or not broad else []
    initial_model = None
    if config.init_from is not None:
        from agentic_rl.models.loading import load_model_and_tokenizer, resolve_model_path

        # fp32 weights, as a new model's; the Trainer's bf16 setting decides the matmuls
        initial_model, tokenizer = load_model_and_tokenizer(resolve_model_path(config.init_from), dtype="float32",
                                                            device="cpu")
    elif resumed_tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    else:
        # the tokenizer also sees the system prompt and formatted solutions, so that those become few tokens
        n_extra, extra_seed = max(config.corpus_lines // 4, 500), config.seed + 1
        scaffold = tool_call_scaffold(n_extra, extra_seed, every_tool=broad) if config.tool_call_tokens or broad else []
        if broad:
            from agentic_rl.data.world import world_tokenizer_lines

            scaffold += world_tokenizer_lines(n_extra // 4, extra_seed)
        extra = default_tokenizer_corpus(n_extra, seed=extra_seed, scaffold=scaffold)
        tokenizer = train_tokenizer(lines + extra, vocab_size=config.vocab_size)
    if broad:  # the episodes are written with the tokenizer's chat template
        from agentic_rl.agent.tool_format import ChatFormat

        lines = build_corpus(config, ChatFormat(tokenizer))
    blocks = pack_blocks(lines, tokenizer, config.seq_length)
    rng = random.Random(config.seed)
    rng.shuffle(blocks)
    n_eval = max(1, int(len(blocks) * config.eval_fraction)) if config.eval_fraction > 0 else 0
    eval_ds = datasets.Dataset.from_dict({"input_ids": blocks[:n_eval]}) if n_eval else None
    train_ds = datasets.Dataset.from_dict({"input_ids": blocks[n_eval:]})
    log(f"pretrain corpus: {len(lines)} lines -> {len(blocks)} blocks of {config.seq_length} tokens "
        f"({n_eval} held out); vocabulary {len(tokenizer)}")

    # --- model ----------------------------------------------------------------------------------------------------
    if initial_model is not None:
        model = initial_model
    else:
        overrides = {}
        if config.hidden_size:
            overrides["hidden_size"] = config.hidden_size
            overrides["intermediate_size"] = 3 * config.hidden_size
        if config.num_layers:
            overrides["num_hidden_layers"] = config.num_layers
        model = build_tiny_model(tokenizer, config.model_preset, max_position_embeddings=max(1024, config.seq_length),
                                 seed=config.seed, **overrides)
    _, n_params = count_parameters(model)

    # --- only now the run directory: an earlier run's outputs go (unless resuming), this run's settings are recorded
    stage_run.claim()
    try:  # a failure before the first checkpoint leaves the directory as it was (StageRun.abandon)
        if not resumed_tokenizer:
            tokenizer.save_pretrained(tok_dir)

        # --- trainer --------------------------------------------------------------------------------------------------
        gpu = has_gpu()
        ckpt_dir = out / "checkpoints"
        metrics_logger = MetricsLogger(out, report_to, config=config_to_dict(config), resume=resume_from is not None)
        health = HealthCallback()
        args = TrainingArguments(
            output_dir=str(ckpt_dir),
            max_steps=config.max_steps,
            num_train_epochs=config.epochs,
            per_device_train_batch_size=config.batch_size,
            per_device_eval_batch_size=config.batch_size,
            learning_rate=config.learning_rate,
            warmup_steps=config.warmup_ratio,
            lr_scheduler_type=config.lr_scheduler_type,
            weight_decay=config.weight_decay,
            max_grad_norm=1.0,
            logging_steps=config.logging_steps,
            save_strategy="steps" if config.save_steps else "no",
            save_steps=config.save_steps or 500,
            save_total_limit=2,
            eval_strategy="no",
            report_to="none",  # metrics go through metrics_logger
            seed=config.seed,
            use_cpu=not gpu,
            bf16=config.bf16,
            dataloader_num_workers=0,
            disable_tqdm=False,
        )
        log(f"pretrain: {n_params / 1e6:.2f}M parameters, device {'cuda' if gpu else 'cpu'}, "
            f"bf16 {args.bf16}, steps {config.max_steps}, batch {config.batch_size}")
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=train_ds,
            data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
            callbacks=[health, MetricsCallback(metrics_logger, "pretrain"), StepCostCallback()],
        )
        quiet_progress(trainer)
        try:
            train_out = trainer.train(resume_from_checkpoint=resume_from)
            # --- evaluate and save ------------------------------------------------------------------------------------
            metrics: dict[str, Any] = {"train/loss": train_out.training_loss, "global_step": trainer.state.global_step,
                                       "parameters": n_params, "vocab_size": len(tokenizer)}
            if eval_ds is not None:
                ev = trainer.evaluate(eval_dataset=eval_ds)  # logged as eval/loss, eval/runtime, ...
                metrics["eval/loss"] = ev["eval_loss"]
                metrics["eval/perplexity"] = math.exp(min(ev["eval_loss"], 50))
        finally:
            metrics_logger.close()
        metrics["eval/arithmetic_accuracy"] = arithmetic_probe(trainer.model, tokenizer)
        metrics["health_warnings"] = health.monitor.warnings
        model_dir = save_model_dir(trainer.model, tokenizer, out / MODEL_FOLDER)
    except BaseException:
        stage_run.abandon()
        raise
    metrics["wall_time_s"] = round(time.time() - start, 1)
    write_json(out / "metrics.json", metrics)
    log(f"pretrain done in {metrics['wall_time_s']} s: loss {metrics['train/loss']:.3f}, "
        f"eval loss {metrics.get('eval/loss', float('nan')):.3f}, "
        f"arithmetic probe {metrics['eval/arithmetic_accuracy']:.1%}; model in {model_dir}")
    return stage_run.finish({"model_dir": str(model_dir), "run_dir": str(out), "metrics": metrics})

