"""Probes of a plain-text base: has pretraining given it the skills the embedded tasks' fine-tuning builds on?

Each probe gives a base held-out text (the synthetic tasks' test split, or a fictional world no corpus holds), lets it
continue greedily with no chat template, and scores the share done right:

* ``arithmetic``: ``a op b =`` completed with the exact result, on fresh facts;
* ``copy_lists``: a list of 2-5 numbers then `` ->``, continued with the same list;
* ``first_step``: a single-turn test question, then a line break: the first worked step (``39 * 83 = 3237``)
  written exactly as the reference writes it (copying the question's numbers, and computing);
* ``call``: a multiplication test question followed by the calculator's argument text (``{"expression": "``):
  continued with the question's two factors (``39*83"}``), the skill the first tool call needs;
* ``operation``: a two-step multiplication test question with its first call and result, up to the second call's
  sign: the right sign (``+`` where the question adds, ``-`` where it takes away) more likely than the other;
* ``lookup``: a fictional-world question followed by the search tool's argument text (``{"query": "``): continued
  with the name the first lookup needs.

The shipped embedded base's card records its scores (``models/embedded.py``); a test reruns them on the shipped file.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

#: The probes, in the order a card lists them.
PROBES = ("arithmetic", "copy_lists", "first_step", "call", "operation", "lookup")


def _continue(model, tokenizer, texts: list[str], max_new_tokens: int, batch_size: int = 100) -> list[str]:
    """Greedy continuations of plain texts (each after a line break, as corpus lines start)."""
    import torch

    device = next(model.parameters()).device
    was_training, old_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    out: list[str] = []
    try:
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(["\n" + t for t in texts[i:i + batch_size]], return_tensors="pt", padding=True,
                            add_special_tokens=False).to(device)
            with torch.no_grad():
                ids = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
            out += tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)
    return out


def _test_rows(source: str, n: int) -> list[dict[str, Any]]:
    from agentic_rl.data.custom import load_task_dataset

    return load_task_dataset(source, "test", synthetic_seed=0, synthetic_test_size=n).to_list()


def probe_arithmetic(model, tokenizer, n: int = 200) -> float:
    rng = random.Random("agentic-rl-probe:arithmetic")
    facts = []
    for _ in range(n):
        op = rng.choice("+-*/")
        a, b = rng.randint(0, 60), rng.randint(1, 60)
        if op == "+":
            facts.append((f"{a} + {b} =", a + b))
        elif op == "-":
            facts.append((f"{a + b} - {b} =", a))
        elif op == "*":
            a, b = rng.randint(0, 12), rng.randint(0, 12)
            facts.append((f"{a} * {b} =", a * b))
        else:
            b, c = rng.randint(1, 12), rng.randint(0, 12)
            facts.append((f"{b * c} / {b} =", c))
    texts = _continue(model, tokenizer, [p for p, _ in facts], 5)
    return sum(t.strip().split("\n")[0].strip() == str(want) for (_, want), t in zip(facts, texts)) / n


def probe_copy_lists(model, tokenizer, n: int = 100) -> float:
    rng = random.Random("agentic-rl-probe:lists")
    lists = [" ".join(str(rng.randint(0, 10 ** rng.randint(1, 4) - 1)) for _ in range(rng.randint(2, 5)))
             for _ in range(n)]
    texts = _continue(model, tokenizer, [f"{numbers} ->" for numbers in lists], 24)
    return sum(t.split("\n")[0].strip() == numbers for numbers, t in zip(lists, texts)) / n


def probe_first_step(model, tokenizer, n: int = 100) -> float:
    from agentic_rl.data.gsm8k import parse_gsm8k_answer

    rows = _test_rows("synthetic", n)
    texts = _continue(model, tokenizer, [r["question"] + "\n" for r in rows], 16)
    want = [parse_gsm8k_answer(r["answer"])["steps"][0].strip() for r in rows]
    return sum(t.split("\n")[0].strip() == w for w, t in zip(want, texts)) / len(rows)


def probe_call(model, tokenizer, n: int = 100) -> float:
    from agentic_rl.data.formats import CALC_STEP

    rows = _test_rows("synthetic:multiplication", n)
    texts = _continue(model, tokenizer, [r["question"] + ' {"expression": "' for r in rows], 10)
    right = 0
    for row, text in zip(rows, texts):
        first = CALC_STEP.findall(row["answer"])[0][0].replace(" ", "")
        right += text.startswith(first + '"}')
    return right / len(rows)


def probe_operation(model, tokenizer, n: int = 200) -> float:
    """Share of two-step problems whose next token after ``{"expression": "<product>`` is the right sign."""
    import torch

    from agentic_rl.data.formats import CALC_STEP

    texts, signs = [], []
    for row in _test_rows("synthetic:multiplication", n):
        steps = [(e.strip().replace(" ", ""), v.strip()) for e, v in CALC_STEP.findall(row["answer"])]
        if len(steps) < 2 or not re.fullmatch(r"\d+[+-]\d+", steps[1][0]):
            continue
        product, value = steps[0]
        texts.append(f"{row['question']} {json.dumps({'expression': product})} {value} "
                     f'{{"expression": "{value}')
        signs.append(steps[1][0][len(value)])
    plus, minus = tokenizer.convert_tokens_to_ids("+"), tokenizer.convert_tokens_to_ids("-")
    device = next(model.parameters()).device
    was_training, old_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    right = 0
    try:
        for i in range(0, len(texts), 100):
            enc = tokenizer(["\n" + t for t in texts[i:i + 100]], return_tensors="pt", padding=True,
                            add_special_tokens=False).to(device)
            with torch.no_grad():
                logits = model(**enc).logits[:, -1, :]
            for sign, row in zip(signs[i:i + 100], logits):
                right += (row[plus] > row[minus]).item() == (sign == "+")
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)
    return right / max(len(texts), 1)


def probe_lookup(model, tokenizer, n: int = 100) -> float:
    from agentic_rl.data.world import make_world, questions

    rows = questions(make_world(0), n, seed=0)
    texts = _continue(model, tokenizer, [r["question"] + ' {"query": "' for r in rows], 12)
    return sum(t.startswith(r["chain"][0] + '"}') for r, t in zip(rows, texts)) / len(rows)


def run_probes(model, tokenizer) -> dict[str, float]:
    """Every probe's score, rounded to 4 places (what a card records)."""
    functions = {"arithmetic": probe_arithmetic, "copy_lists": probe_copy_lists, "first_step": probe_first_step,
                 "call": probe_call, "operation": probe_operation, "lookup": probe_lookup}
    return {name: round(functions[name](model, tokenizer), 4) for name in PROBES}
