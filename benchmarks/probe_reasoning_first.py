"""Does a model *know how* to work the steps first, even when it prefers to state the answer first?

    .venv/bin/python benchmarks/probe_reasoning_first.py runs/quickstart/sft/model runs/quickstart/grpo/model

For each model, greedy held-out accuracy twice on the same problems: as the model decodes, and with the token that
starts "Final Answer:" forbidden as the first token of the completion (so it must begin with a reasoning step). The
quickstart's SFT learns from demonstrations that mostly state the answer first; this probe shows whether the skill
to reason first is there for GRPO to find (forced accuracy >> natural accuracy) and whether GRPO found it (natural
accuracy after GRPO close to the forced one). Prompts are the evaluation's own (``--system-prompt`` as trained:
the embedded quickstart uses none, ``''``).

Two more columns say why the forced answers are right or wrong: the share whose first equation uses two numbers of
the question (the model copies the problem into its steps), and the share of all their equations whose stated result
is right (recomputed with ``rewards.check_equations``: the tiny model's mental arithmetic). The measurements made
with it are in docs/experiments.md.
"""

from __future__ import annotations

import argparse

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from agentic_rl.data.custom import load_task_dataset
from agentic_rl.data.formats import FINAL_ANSWER_PREFIX, build_prompt, render_prompt, resolve_system_prompt
from agentic_rl.eval.error_analysis import numbers_in, question_numbers
from agentic_rl.models.loading import load_model_and_tokenizer
from agentic_rl.rewards import check_equations, is_correct


class ForbidFirstToken(LogitsProcessor):
    def __init__(self, prompt_length: int, token_ids: list[int]):
        self.prompt_length, self.token_ids = prompt_length, token_ids

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] == self.prompt_length:
            scores[:, self.token_ids] = -float("inf")
        return scores


def answer_line_starts(tokenizer) -> list[int]:
    """Every token that can begin the answer line: its text (leading space aside) is a start of "Final Answer:" or of
    "Answer:" (forbidding "Final" alone, a model writes " Answer: ..." instead)."""
    starts = []
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id]).strip()
        if text and (FINAL_ANSWER_PREFIX.startswith(text) or "Answer:".startswith(text)):
            starts.append(token_id)
    return starts


def greedy_completions(model, tokenizer, rows, system_prompt, forbid_answer_first: bool,
                       batch_size: int = 50) -> list[str]:
    first_ids = answer_line_starts(tokenizer)
    tokenizer.padding_side = "left"
    completions = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start:start + batch_size]
        texts = [render_prompt(tokenizer, build_prompt(r["question"], system_prompt)) for r in batch]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        processors = LogitsProcessorList(
            [ForbidFirstToken(enc["input_ids"].shape[1], first_ids)] if forbid_answer_first else [])
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=64, do_sample=False, logits_processor=processors,
                                 pad_token_id=tokenizer.pad_token_id)
        completions += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return completions


def accuracy(rows, completions) -> float:
    return sum(bool(is_correct(c, r["ground_truth"])) for r, c in zip(rows, completions)) / len(rows)


def step_checks(rows, completions) -> tuple[float, float]:
    """(share of completions whose first equation's operands are both numbers of the question, share of all their
    equations whose stated result is right)."""
    grounded = with_equation = right = total = 0
    for row, completion in zip(rows, completions):
        checks = check_equations(completion)
        if not checks:
            continue
        with_equation += 1
        operands, given = numbers_in(checks[0].expression), question_numbers(row["question"])
        grounded += len(operands) == 2 and all(n in given for n in operands)
        right += sum(c.ok for c in checks)
        total += len(checks)
    return grounded / max(with_equation, 1), right / max(total, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--samples", type=int, default=300, help="held-out synthetic test problems")
    parser.add_argument("--system-prompt", default="", help="as the models were trained: '' = none (the embedded "
                        "quickstart), 'standard' = the standard instruction, or the text")
    args = parser.parse_args()
    rows = load_task_dataset("synthetic", "test", max_samples=args.samples, seed=0)
    rows = rows.to_list() if hasattr(rows, "to_list") else list(rows)
    system_prompt = resolve_system_prompt(None if args.system_prompt == "standard" else args.system_prompt)
    first = FINAL_ANSWER_PREFIX.split()[0]
    print(f"| model | greedy | greedy, first token not '{first}' | ... its first equation from the question's numbers "
          f"| ... its equations right |\n|---|---|---|---|---|")
    for path in args.models:
        model, tokenizer = load_model_and_tokenizer(path, for_training=False)
        model.eval()
        natural = accuracy(rows, greedy_completions(model, tokenizer, rows, system_prompt, False))
        forced_completions = greedy_completions(model, tokenizer, rows, system_prompt, True)
        grounded, arithmetic = step_checks(rows, forced_completions)
        print(f"| {path} | {natural:.1%} | {accuracy(rows, forced_completions):.1%} | {grounded:.0%} | "
              f"{arithmetic:.0%} |", flush=True)


if __name__ == "__main__":
    main()
