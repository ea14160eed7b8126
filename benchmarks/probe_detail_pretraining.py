"""Does a base that has read detail sentences in pretraining tell a detail from a step?

    .venv/bin/python benchmarks/probe_detail_pretraining.py --out runs/cpt-details --detail-share 0.5
    .venv/bin/python benchmarks/probe_detail_pretraining.py --out runs/cpt-plain --detail-share 0

A proxy for a base rebuilt with detail sentences ("It takes 23 minutes to count them all."), cheaper than
`make embedded-base`: the shipped base pretrained further (``--steps``, learning rate decaying to 0, fp32) on a fresh
broad corpus (``--lines`` lines drawn with ``--seed``: the recipe's mix of arithmetic, worked problems, calculator
calls, episodes, lists and worlds) in which a share ``--detail-share`` of the multiplication problems carry one
detail sentence whose number the answer does not use. ``--detail-share 0`` pretrains the same way without them, so
that the extra pretraining alone is measured as well. The test questions of the single-turn task, its
multiplication variant and ``synthetic:multiplication-distractor`` are kept out of the corpus. The result,
``OUT/base``, is a model folder (float16 weights beside the shipped tokenizer) to start a preset from: ``model:
OUT/base`` in a copy of the preset. docs/experiments.md has what it measured.
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path


def evaluation_exclusions() -> list[str]:
    """The test questions the stages evaluate on: the single-turn task's, its multiplication variant's (the recipe
    keeps both out) and ``synthetic:multiplication-distractor``'s."""
    from agentic_rl.data.synthetic import CORPUS_MULTIPLICATION, synthetic_splits
    from agentic_rl.train.pretrain import evaluation_questions

    questions = evaluation_questions("synthetic", 1000, 0)
    questions += [row["question"] for row in synthetic_splits(0, 1000, 0, **CORPUS_MULTIPLICATION)[1]]
    return questions + evaluation_questions("synthetic:multiplication-distractor", 1000, 0)


def detail_corpus(n_lines: int, seed: int, detail_share: float, chat_format) -> list[str]:
    """The broad corpus of ``n_lines`` lines with ``detail_share`` of its multiplication problems given a detail
    sentence, the evaluations' test questions excluded."""
    from agentic_rl.data.synthetic import CORPUS_MULTIPLICATION
    from agentic_rl.train.pretrain import broad_corpus

    knobs = {**CORPUS_MULTIPLICATION, **({"distractors": detail_share} if detail_share else {})}
    return broad_corpus(n_lines, seed, exclude=evaluation_exclusions(), chat_format=chat_format,
                        multiplication_knobs=knobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the run; the model is written to OUT/base")
    parser.add_argument("--detail-share", type=float, default=0.5,
                        help="share of the corpus's multiplication problems with a detail sentence (0: none)")
    parser.add_argument("--steps", type=int, default=1200, help="optimizer steps of 4 blocks of 512 tokens")
    parser.add_argument("--lines", type=int, default=40000, help="corpus lines")
    parser.add_argument("--seed", type=int, default=11, help="seed of the corpus and the data order")
    args = parser.parse_args()
    if not 0 <= args.detail_share <= 1:
        parser.error(f"--detail-share must be between 0 and 1; got {args.detail_share}")
    out = Path(args.out)
    if (out / "base").exists():
        parser.error(f"{out / 'base'} exists: choose another --out")

    import datasets
    import torch
    from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                              TrainingArguments)

    from agentic_rl.agent.tool_format import ChatFormat
    from agentic_rl.models.embedded import EMBEDDED_DIR
    from agentic_rl.train.pretrain import pack_blocks

    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_DIR)
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_DIR, dtype=torch.float32)
    lines = detail_corpus(args.lines, args.seed, args.detail_share, ChatFormat(tokenizer))
    blocks = pack_blocks(lines, tokenizer, 512)
    random.Random(args.seed).shuffle(blocks)
    print(f"corpus: {len(lines)} lines, {len(blocks)} blocks of 512 tokens", flush=True)
    training = TrainingArguments(output_dir=str(out / "checkpoints"), max_steps=args.steps,
                                 per_device_train_batch_size=4, learning_rate=1e-3, warmup_steps=0.03,
                                 lr_scheduler_type="cosine", weight_decay=0.01, max_grad_norm=1.0, logging_steps=100,
                                 save_strategy="no", report_to="none", seed=args.seed, use_cpu=True, bf16=False)
    Trainer(model=model, args=training, train_dataset=datasets.Dataset.from_dict({"input_ids": blocks}),
            data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False)).train()
    base = out / "base"
    shutil.copytree(EMBEDDED_DIR, base, ignore=shutil.ignore_patterns("README.md", "model.safetensors"))
    model.to(torch.float16).save_pretrained(base)  # stored as the shipped base is
    print(f"base: {base}", flush=True)


if __name__ == "__main__":
    main()
