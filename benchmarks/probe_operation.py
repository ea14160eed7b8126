"""Does a model read the question's verb when it chooses the second step's operation (+ or -)?

    .venv/bin/python benchmarks/probe_operation.py runs/quickstart-agentic/sft/model [more model dirs]

The embedded multiplication problems add or subtract a third number after the product ("32 more tulips" -> +,
"32 tulips do not survive" -> -). For each two-step problem of the evaluation's test split, the model is given
everything up to the sign, written correctly, and the probe reads the next-token probability of "+" against "-":

* chat (an SFT or GRPO model): the environment's prompt, the first call and its result, then the second call up to
  its first operand (``..."expression": "1482``), exactly as an episode reaches that point;
* plain (``--plain``, a pretrained base): the corpus's problem line up to the sign (``question 26*57=1482 1482``).

It prints the mean P(+) on problems whose right sign is + and on those whose right sign is -, and the share decided
right (P(right sign) > 0.5). A model that ignores the verb shows the same P(+) on both. docs/experiments.md has
what it measured.
"""

from __future__ import annotations

import argparse
import re

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentic_rl.agent.env import make_environment
from agentic_rl.agent.settings import environment_system_prompt
from agentic_rl.agent.tool_format import render_tool_call, tool_message
from agentic_rl.data.custom import load_task_dataset
from agentic_rl.data.formats import CALC_STEP, build_prompt


def contexts(tokenizer, rows: list[dict], plain: bool) -> tuple[list[str], list[str]]:
    """(text up to the sign, right sign) for every two-step row."""
    system_prompt = environment_system_prompt(None, make_environment("calculator"))
    texts, signs = [], []
    for row in rows:
        steps = CALC_STEP.findall(row["answer"])
        if len(steps) < 2 or not re.fullmatch(r"\d+[+-]\d+", steps[1][0].strip()):
            continue
        (first, product), (second, _) = [(e.strip(), v.strip()) for e, v in steps[:2]]
        if plain:
            text = f"\n{row['question']} {first}={product} {product}"
        else:
            messages = build_prompt(row["question"], system_prompt) + [
                {"role": "assistant", "content": render_tool_call("calculator", {"expression": first})},
                tool_message("calculator", product)]
            call = render_tool_call("calculator", {"expression": second})
            text = (tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                    + call[:call.index(second) + len(product)])
        texts.append(text)
        signs.append("+" if "+" in second else "-")
    return texts, signs


def probe(model_dir: str, tokenizer_dir: str | None, n: int, plain: bool) -> dict[str, float]:
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or model_dir)
    rows = load_task_dataset("synthetic:multiplication", "test", synthetic_test_size=n).to_list()
    plus, minus = tokenizer.convert_tokens_to_ids("+"), tokenizer.convert_tokens_to_ids("-")
    p_plus = {"+": [], "-": []}
    for text, sign in zip(*contexts(tokenizer, rows, plain)):
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            probs = model(ids).logits[0, -1].softmax(-1)
        p_plus[sign].append((probs[plus] / (probs[plus] + probs[minus])).item())
    right = sum(p > 0.5 for p in p_plus["+"]) + sum(p < 0.5 for p in p_plus["-"])
    return {"P(+) when +": sum(p_plus["+"]) / len(p_plus["+"]), "P(+) when -": sum(p_plus["-"]) / len(p_plus["-"]),
            "decided right": right / (len(p_plus["+"]) + len(p_plus["-"])),
            "problems": len(p_plus["+"]) + len(p_plus["-"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="model directories")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (for pretraining checkpoints)")
    parser.add_argument("--samples", type=int, default=500, help="test problems read (the two-step ones are probed)")
    parser.add_argument("--plain", action="store_true", help="plain corpus text instead of the chat episode (a base)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for model_dir in args.models:
        scores = probe(model_dir, args.tokenizer, args.samples, args.plain)
        print(f"{model_dir}: " + ", ".join(f"{k} {v:.2f}" if k != "problems" else f"{k} {v}"
                                           for k, v in scores.items()))


if __name__ == "__main__":
    main()
