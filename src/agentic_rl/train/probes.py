"""Probes of a base: has pretraining given it the skills the embedded tasks' fine-tuning builds on?

Each probe gives a base held-out text (the synthetic tasks' test split, or a fictional world no corpus holds), lets it
continue greedily, and scores the share done right. The first six read plain text, as the corpus's compact lines
write it (no chat template):

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

The ``tool_`` probes ask the same in the chat layout a rollout's context has (the environment's system prompt, the
question, the calls and results so far, :func:`agentic_rl.agent.rollout.episode_text`), up to the call's argument:

* ``tool_call``: the first calculator call's two factors;
* ``tool_operation``: the second calculator call's sign, after the first call and its result;
* ``tool_detail``: on questions with a detail sentence (a number the answer does not use), after the first call and
  its result, the next step: the second call's expression where there is a second step, no call where there is not;
* ``tool_lookup``: the first search's name;
* ``tool_hop``: on questions of two hops or more, the second search's name, read from the first passage found.

The tool probes ask the search task's own test questions (``synthetic:world``, seed 0) about its world.

The shipped embedded base's card records its scores (``models/embedded.py``); a test reruns them on the shipped file.
"""

from __future__ import annotations

import json
import random
import re
from contextlib import contextmanager
from typing import Any

#: The probes, in the order a card lists them.
PROBES = ("arithmetic", "copy_lists", "first_step", "call", "operation", "lookup", "tool_call", "tool_operation",
          "tool_detail", "tool_lookup", "tool_hop")


def _continue(model, tokenizer, texts: list[str], max_new_tokens: int, batch_size: int = 100, *,
              start: str = "\n") -> list[str]:
    """Greedy continuations of texts (each after ``start``: a line break, as the corpus's plain lines start)."""
    import torch

    device = next(model.parameters()).device
    out: list[str] = []
    with _eval_left_padded(model, tokenizer):
        for i in range(0, len(texts), batch_size):
            enc = tokenizer([start + t for t in texts[i:i + batch_size]], return_tensors="pt", padding=True,
                            add_special_tokens=False).to(device)
            with torch.no_grad():
                ids = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
            out += tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return out


@contextmanager
def _eval_left_padded(model, tokenizer):
    """The model in eval mode and the tokenizer padding on the left (prompts end where generation starts), both put
    back as they were afterwards."""
    was_training, old_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    try:
        yield
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)


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


def _calculator_steps(row: dict[str, Any]) -> list[tuple[str, str]]:
    """A reference answer's steps as calculator calls make them: (expression without spaces, its value)."""
    from agentic_rl.data.formats import CALC_STEP

    return [(e.strip().replace(" ", ""), v.strip()) for e, v in CALC_STEP.findall(row["answer"])]


def _two_step_problems(n: int) -> list[tuple[dict[str, Any], str, str, str]]:
    """(row, product expression, its value, the second step's sign) of the multiplication test questions whose second
    step adds or takes away a number, among the first ``n``."""
    problems = []
    for row in _test_rows("synthetic:multiplication", n):
        steps = _calculator_steps(row)
        if len(steps) >= 2 and re.fullmatch(r"\d+[+-]\d+", steps[1][0]):
            problems.append((row, *steps[0], steps[1][0][len(steps[0][1])]))
    return problems


def _sign_share(model, tokenizer, texts: list[str], signs: list[str], *, start: str) -> float:
    """Share of ``texts`` whose next token is more likely ``+`` than ``-`` exactly where ``signs`` says ``+``."""
    import torch

    plus, minus = tokenizer.convert_tokens_to_ids("+"), tokenizer.convert_tokens_to_ids("-")
    device = next(model.parameters()).device
    right = 0
    with _eval_left_padded(model, tokenizer):
        for i in range(0, len(texts), 100):
            enc = tokenizer([start + t for t in texts[i:i + 100]], return_tensors="pt", padding=True,
                            add_special_tokens=False).to(device)
            with torch.no_grad():
                logits = model(**enc).logits[:, -1, :]
            for sign, row in zip(signs[i:i + 100], logits):
                right += (row[plus] > row[minus]).item() == (sign == "+")
    return right / max(len(texts), 1)


def probe_operation(model, tokenizer, n: int = 200) -> float:
    """Share of two-step problems whose next token after ``{"expression": "<product>`` is the right sign."""
    problems = _two_step_problems(n)
    texts = [f"{row['question']} {json.dumps({'expression': product})} {value} {{\"expression\": \"{value}"
             for row, product, value, _ in problems]
    return _sign_share(model, tokenizer, texts, [sign for *_, sign in problems], start="\n")


def probe_lookup(model, tokenizer, n: int = 100) -> float:
    from agentic_rl.data.world import make_world, questions

    rows = questions(make_world(0), n, seed=0)
    texts = _continue(model, tokenizer, [r["question"] + ' {"query": "' for r in rows], 12)
    return sum(t.startswith(r["chain"][0] + '"}') for r, t in zip(rows, texts)) / len(rows)


# -- the chat layout ---------------------------------------------------------------------------------------------

def _call_prefix(tool: str, argument: str) -> str:
    """The start of an assistant turn that calls ``tool``, up to the opening quote of ``argument``'s value."""
    from agentic_rl.agent.tool_format import render_tool_call

    call = render_tool_call(tool, {argument: "PROBE_VALUE"})
    return call[:call.index("PROBE_VALUE")]


def _chat_context(tokenizer, system_prompt: str, question: str, messages: list[dict[str, Any]]) -> str:
    from agentic_rl.agent.rollout import episode_text
    from agentic_rl.agent.tool_format import ChatFormat
    from agentic_rl.data.formats import build_prompt

    return episode_text(ChatFormat(tokenizer), build_prompt(question, system_prompt), messages)


def probe_tool_call(model, tokenizer, n: int = 100) -> float:
    from agentic_rl.agent.tasks import AGENT_SYSTEM_PROMPT
    from agentic_rl.data.formats import CALC_STEP

    rows = _test_rows("synthetic:multiplication", n)
    texts = [_chat_context(tokenizer, AGENT_SYSTEM_PROMPT, r["question"], []) + _call_prefix("calculator", "expression")
             for r in rows]
    outputs = _continue(model, tokenizer, texts, 10, start="")
    firsts = [CALC_STEP.findall(r["answer"])[0][0].replace(" ", "") for r in rows]
    return sum(text.startswith(first + '"') for first, text in zip(firsts, outputs)) / len(rows)


def probe_tool_operation(model, tokenizer, n: int = 200) -> float:
    from agentic_rl.agent.tasks import AGENT_SYSTEM_PROMPT
    from agentic_rl.agent.tool_format import tool_exchange

    problems = _two_step_problems(n)
    texts = [_chat_context(tokenizer, AGENT_SYSTEM_PROMPT, row["question"],
                           tool_exchange("calculator", {"expression": product}, value))
             + _call_prefix("calculator", "expression") + value for row, product, value, _ in problems]
    return _sign_share(model, tokenizer, texts, [sign for *_, sign in problems], start="")


def probe_tool_detail(model, tokenizer, n: int = 200) -> float:
    """On questions with a detail sentence (``synthetic:multiplication-distractor``), after the first call and its
    result: the next turn starts the second step's call where the problem has a second step, and no call where it
    has not (the detail's number is not a step)."""
    from agentic_rl.agent.tasks import AGENT_SYSTEM_PROMPT
    from agentic_rl.agent.tool_format import tool_exchange

    rows = _test_rows("synthetic:multiplication-distractor", n)
    prefix = _call_prefix("calculator", "expression")
    contexts, seconds = [], []
    for row in rows:
        steps = _calculator_steps(row)
        contexts.append(_chat_context(tokenizer, AGENT_SYSTEM_PROMPT, row["question"],
                                      tool_exchange("calculator", {"expression": steps[0][0]}, steps[0][1])))
        seconds.append(steps[1][0] if len(steps) > 1 else None)
    outputs = _continue(model, tokenizer, contexts, len(tokenizer(prefix, add_special_tokens=False)["input_ids"]) + 16,
                        start="")
    return sum(text.startswith(prefix + second + '"') if second else not text.startswith(prefix)
               for second, text in zip(seconds, outputs)) / len(rows)


def _world_questions(n: int, hops=(1, 2, 3)) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The first ``n`` test questions of the search task (``synthetic:world``, seed 0) of the given hop counts, and
    its world's passages by title (what a search of the title returns)."""
    from agentic_rl.data.custom import WORLD_SIZE, WORLD_TEST_POOL
    from agentic_rl.data.world import passages, world_splits

    world, _, test = world_splits(0, WORLD_TEST_POOL, 0, **WORLD_SIZE)  # as the dataset draws its test split
    return [r for r in test if r["hops"] in hops][:n], {p["title"]: p["text"] for p in passages(world)}


def probe_tool_lookup(model, tokenizer, n: int = 100) -> float:
    from agentic_rl.agent.search_env import SEARCH_SYSTEM_PROMPT

    rows, _ = _world_questions(n)
    texts = [_chat_context(tokenizer, SEARCH_SYSTEM_PROMPT, r["question"], []) + _call_prefix("search", "query")
             for r in rows]
    outputs = _continue(model, tokenizer, texts, 12, start="")
    return sum(text.startswith(r["chain"][0] + '"') for r, text in zip(rows, outputs)) / len(rows)


def probe_tool_hop(model, tokenizer, n: int = 100) -> float:
    from agentic_rl.agent.search_env import SEARCH_SYSTEM_PROMPT
    from agentic_rl.agent.tool_format import tool_exchange

    rows, texts = _world_questions(n, hops=(2, 3))
    contexts = []
    for r in rows:
        first = tool_exchange("search", {"query": r["chain"][0]}, texts[r["chain"][0]])
        contexts.append(_chat_context(tokenizer, SEARCH_SYSTEM_PROMPT, r["question"], first)
                        + _call_prefix("search", "query"))
    outputs = _continue(model, tokenizer, contexts, 12, start="")
    return sum(text.startswith(r["chain"][1] + '"') for r, text in zip(rows, outputs)) / len(rows)


def run_probes(model, tokenizer) -> dict[str, float]:
    """Every probe's score, rounded to 4 places (what a card records)."""
    functions = {"arithmetic": probe_arithmetic, "copy_lists": probe_copy_lists, "first_step": probe_first_step,
                 "call": probe_call, "operation": probe_operation, "lookup": probe_lookup,
                 "tool_call": probe_tool_call, "tool_operation": probe_tool_operation, "tool_detail": probe_tool_detail,
                 "tool_lookup": probe_tool_lookup, "tool_hop": probe_tool_hop}
    return {name: round(functions[name](model, tokenizer), 4) for name in PROBES}
