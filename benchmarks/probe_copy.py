"""Has a pretrained base learned to copy numbers, the skill the agentic preset's tool calls need?

    .venv/bin/python benchmarks/probe_copy.py runs/quickstart-agentic/pretrain/model [more model or checkpoint dirs]

Plain-text continuations, greedy, on the base alone (no chat template), for each model directory:

* list copy: a list of 2-5 random numbers followed by " ->", continued; correct when it starts with the same list;
* question -> expression: a held-out multiplication word problem (the evaluation's own test split, which the
  pretraining corpus leaves out), continued; correct when it starts with the question's ``a*b``, as the corpus's
  problem lines do;
* grounded: the continuation's first ``a*b`` uses two numbers of the question (in either order).

A checkpoint folder (``pretrain/checkpoints/checkpoint-N``) has no tokenizer: ``--tokenizer`` points at the run's
``pretrain/tokenizer``. docs/experiments.md has what it measured.
"""

from __future__ import annotations

import argparse
import random
import re

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentic_rl.data.custom import load_task_dataset


def continuations(model, tokenizer, texts: list[str], max_new_tokens: int) -> list[str]:
    batch = tokenizer(["\n" + t for t in texts], return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    return [tokenizer.decode(row, skip_special_tokens=True) for row in out[:, batch["input_ids"].shape[1]:]]


def probe(model_dir: str, tokenizer_dir: str | None, n: int) -> dict[str, float]:
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or model_dir)
    tokenizer.padding_side = "left"
    rng = random.Random(7)
    lists = [" ".join(str(rng.randint(0, 10 ** rng.randint(1, 4) - 1)) for _ in range(rng.randint(2, 5)))
             for _ in range(n)]
    listed = continuations(model, tokenizer, [f"{numbers} ->" for numbers in lists], 25)
    rows = load_task_dataset("synthetic:multiplication", "test", synthetic_test_size=n).to_list()
    wanted = [re.search(r"<<([^=]+)=", row["answer"]).group(1) for row in rows]
    written = continuations(model, tokenizer, [row["question"] for row in rows], 12)

    def grounded(text: str, question: str) -> bool:
        call = re.match(r"\s*(\d+)\*(\d+)", text)
        numbers = re.findall(r"\d+", question)
        return bool(call) and call.group(1) in numbers and call.group(2) in numbers

    return {"list_copy": sum(o.strip().startswith(line) for o, line in zip(listed, lists)) / n,
            "expression_copy": sum(o.strip().startswith(w) for o, w in zip(written, wanted)) / n,
            "grounded": sum(grounded(o, row["question"]) for o, row in zip(written, rows)) / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="model or checkpoint directories")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (for checkpoints)")
    parser.add_argument("--samples", type=int, default=50, help="lists and questions probed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for model_dir in args.models:
        scores = probe(model_dir, args.tokenizer, args.samples)
        print(f"{model_dir}: " + ", ".join(f"{k} {100 * v:.0f} %" for k, v in scores.items()))


if __name__ == "__main__":
    main()
