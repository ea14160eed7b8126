"""Error analysis: every wrong completion gets exactly one category, decided by checks (never by keywords).

Categories, tested in this precedence order (the first that applies wins):

1. **format** — no parseable final answer under strict extraction (:func:`agentic_rl.rewards.extract_answer`):
   no ``Final Answer:`` marker, a marker without a number, or markers stating two different answers. This
   includes a right number written without the marker (lenient extraction would have found it). It comes first
   because without a final answer there is nothing to compare with the reference, and the grader's verdict was
   decided by the format alone.
2. **calculation** — some ``expression = result`` statement in the completion is arithmetically wrong, recomputed
   with the safe calculator (:func:`agentic_rl.rewards.check_equations`). A wrong sum explains a wrong answer
   more directly than the plan does, so it outranks the two checks below.
3. **understanding** — the final answer equals a quantity that is not the question's answer but belongs to the
   problem: an intermediate result of the reference solution (the result of one of its steps) or a number copied
   from the question (digits or number words such as "three"). The model answered a different question than the
   one asked (stopped early, or returned a given).
4. **reasoning** — everything else: the arithmetic written is correct and the answer is not a quantity of the
   problem, so the plan was wrong (wrong operation, missing or extra step).

A wrong episode in the calculator environment is classed by its calls instead (:func:`categorize_episode`), one in
the search environment by its searches against the question's lookup chain (:func:`categorize_search_episode`), one
in the memory environment by its notes and recalls against the log's chain (:func:`categorize_memory_episode`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from agentic_rl.rewards import check_equations, extract_answer, parse_number

CATEGORIES = ("format", "calculation", "understanding", "reasoning")

_NUMBER = re.compile(r"(?<![\w.])-?\$?(?:\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)", re.ASCII)
_PUNCTUATION = re.compile(r"[^\w\s'-]")
_ANNOTATION_RESULT = re.compile(r"<<[^<>=]*=([^<>]*)>>")
_NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16,
    "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
    "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100, "thousand": 1000, "dozen": 12,
    "half": 0.5, "twice": 2, "double": 2, "triple": 3,
}
_WORD = re.compile(r"[a-z]+")


def _num(text: str) -> float | None:
    return parse_number(text.replace("$", ""))


def numbers_in(text: str) -> list[float]:
    """Every number written with digits in ``text`` (``1,234.5``, ``$18``, ``-3``)."""
    out = []
    for m in _NUMBER.finditer(text or ""):
        value = _num(m.group(0))
        if value is not None:
            out.append(value)
    return out


def question_numbers(question: str) -> list[float]:
    """Numbers a question states: digits and number words (``three``, ``a dozen``, ``half``)."""
    words = [_NUMBER_WORDS[w] for w in _WORD.findall((question or "").lower()) if w in _NUMBER_WORDS]
    return numbers_in(question) + [float(w) for w in words]


def reference_intermediates(row: dict[str, Any]) -> list[float]:
    """Results of the reference solution's steps (what each step computes), without the final answer.

    A step's result is the number after its last ``=`` (``Half: 48/2 = 24`` -> 24), else its last number. Steps come
    from ``steps``, else from the lines of ``answer`` / ``full_answer``; GSM8K calculator annotations
    (``<<48/2=24>>``) in that text are read as well.
    """
    truth = _num(str(row.get("ground_truth", "")))
    answer = str(row.get("answer") or row.get("full_answer") or "")  # task rows / GRPO's RL rows
    values: list[float] = []
    steps = row.get("steps")
    if not steps:
        steps = [line for line in answer.split("####")[0].splitlines()
                 if line.strip() and not line.strip().lower().startswith("final answer")]
    for step in steps or []:
        tail = step.rsplit("=", 1)[1] if "=" in step else step
        found = numbers_in(tail)
        if found:
            values.append(found[0] if "=" in step else found[-1])
    for m in _ANNOTATION_RESULT.finditer(answer):
        value = _num(m.group(1))
        if value is not None:
            values.append(value)
    return [v for v in dict.fromkeys(values) if truth is None or not _close(v, truth)]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


def categorize(completion: str, row: dict[str, Any], extracted: str | None = None) -> tuple[str, str]:
    """``(category, reason)`` for a completion already known to be wrong; ``row`` is the dataset row
    (``question``, ``ground_truth``, ``steps`` / ``answer``). ``extracted`` is the strict answer if computed already.

    >>> row = {"question": "Mia has 12 apples and buys 7 more. She gives away 5. How many are left?",
    ...        "ground_truth": "14", "steps": ["12 + 7 = 19", "19 - 5 = 14"]}
    >>> categorize("12 + 7 = 19\\nFinal Answer: 19", row)[0]
    'understanding'
    >>> categorize("12 + 7 = 18\\n18 - 5 = 13\\nFinal Answer: 13", row)[0]
    'calculation'
    >>> categorize("12 + 7 = 19\\n19 - 5 = 14", row)[0]
    'format'
    >>> categorize("12 * 7 = 84\\n84 - 5 = 79\\nFinal Answer: 79", row)[0]
    'reasoning'
    """
    answer = extracted if extracted is not None else extract_answer(completion, "strict")
    if answer is None:
        lenient = extract_answer(completion, "lenient")
        why = "no 'Final Answer:' line with a number"
        if lenient is not None:
            why += f" (the last number is {lenient})"
        return "format", why
    wrong = [c for c in check_equations(completion) if not c.ok and c.computed is not None]
    if wrong:
        c = wrong[0]
        return "calculation", f"{c.expression} = {c.stated:g}, but it is {c.computed:g}"
    value = _num(answer)
    if value is not None:
        for v in reference_intermediates(row):
            if _close(value, v):
                return "understanding", f"answer {answer} is an intermediate result of the reference solution"
        for v in question_numbers(str(row.get("question", ""))):
            if _close(value, v):
                return "understanding", f"answer {answer} is a number copied from the question"
    return "reasoning", f"arithmetic is consistent but the answer {answer} is not {row.get('ground_truth')}"


def summarize_errors(records: list[dict[str, Any]], num_examples: int = 3) -> dict[str, Any]:
    """Counts, shares (of wrong completions) and up to ``num_examples`` examples per category.

    ``records`` are per-completion records; wrong ones carry ``category`` and ``category_reason``.
    """
    wrong = [r for r in records if r.get("category")]
    counts = Counter(r["category"] for r in wrong)
    examples: dict[str, list[dict[str, Any]]] = {c: [] for c in CATEGORIES}
    for r in wrong:
        bucket = examples[r["category"]]
        if len(bucket) < num_examples:
            bucket.append({"index": r["index"], "question": r["question"], "completion": r["completion"],
                           "extracted_strict": r["extracted_strict"], "ground_truth": r["ground_truth"],
                           "reason": r.get("category_reason", "")})
    return {"num_wrong": len(wrong),
            "counts": {c: counts.get(c, 0) for c in CATEGORIES},
            "shares": {c: (counts.get(c, 0) / len(wrong) if wrong else None) for c in CATEGORIES},
            "examples": examples}


# ---------------------------------------------------------------------------------------------------------------
# Episodes with a calculator: each wrong episode's calls against the reference solution's steps
# ---------------------------------------------------------------------------------------------------------------

#: Classes of a wrong calculator episode (:func:`categorize_episode`).
EPISODE_CATEGORIES = ("no_call", "call_error", "miscopied_call", "wrong_operation", "step_too_many",
                      "step_left_out", "answer_not_copied")


def reference_steps(row: dict[str, Any]) -> list[tuple[str, float]]:
    """``(expression, value)`` of each step of the reference solution, from ``steps`` (``"26 * 57 = 1482"``), else
    from the calculator annotations of ``answer`` / ``full_answer`` (``<<26*57=1482>>``); [] when the row has none."""
    texts = [s for s in row.get("steps") or [] if "=" in s]
    if not texts:
        answer = str(row.get("answer") or row.get("full_answer") or "")
        texts = [m.group(0)[2:-2] for m in _ANNOTATION_RESULT.finditer(answer)]
    steps = []
    for text in texts:
        expression, result = text.rsplit("=", 1)
        value = _num(result.strip())
        if value is not None:
            steps.append((expression.strip(), value))
    return steps


def episode_calls(episode: dict[str, Any], argument: str = "expression") -> list[tuple[str, str]]:
    """``(argument, result)`` of each tool call of an episode, in order: the call's ``argument`` (a calculator's
    ``expression``, a search's ``query``) and the tool message that answered it (``messages`` as the rollout records
    them)."""
    calls = []
    for call, result in _calls_with_results(episode):
        arguments = call.arguments if isinstance(call.arguments, dict) else {}
        calls.append((str(arguments.get(argument, call.raw if call.error else "")), result))
    return calls


def _calls_with_results(episode: dict[str, Any]) -> list[tuple[Any, str]]:
    """Each tool call of an episode (parsed, :func:`agentic_rl.agent.tool_format.parse_tool_calls`) with the text of
    the tool message that answered it ("" for a call left unanswered), in order."""
    from agentic_rl.agent.tool_format import parse_tool_calls

    calls: list[tuple[Any, str]] = []
    pending: list[Any] = []
    for message in episode.get("messages") or []:
        if message.get("role") == "assistant":
            pending.extend(parse_tool_calls(str(message.get("content", "")))[1])
        elif message.get("role") == "tool" and pending:
            calls.append((pending.pop(0), str(message.get("content", ""))))
    return calls + [(call, "") for call in pending]


def categorize_episode(episode: dict[str, Any], row: dict[str, Any]) -> tuple[str, str] | None:
    """``(category, reason)`` of a wrong calculator episode (:data:`EPISODE_CATEGORIES`), its calls compared, in
    order, with the reference solution's steps by value (``57*26`` is ``26 * 57``); None when ``row`` has no reference
    steps. A call whose value differs from its step's is a *wrong operation* when it uses the step's numbers, else a
    *miscopied call*; calls beyond the reference's are *a step too many* (e.g. a number the answer does not use read as
    a step), fewer are *a step left out*; all right but the answer not the last result is *answer not copied*.

    >>> row = {"steps": ["26 * 57 = 1482", "1482 + 32 = 1514"]}
    >>> def episode(*calls):
    ...     messages = []
    ...     for expression, result in calls:
    ...         messages += [{"role": "assistant", "content": '<tool_call>{"name": "calculator", "arguments": '
    ...                       f'{{"expression": "{expression}"}}}}</tool_call>'}, {"role": "tool", "content": result}]
    ...     return {"messages": messages + [{"role": "assistant", "content": "Final Answer: 1"}]}
    >>> categorize_episode(episode(("57*26", "1482"), ("1482-32", "1450")), row)[0]
    'wrong_operation'
    >>> categorize_episode(episode(("57*26", "1482")), row)[0]
    'step_left_out'
    >>> categorize_episode(episode(("57*26", "1482"), ("1482+32", "1514"), ("1514-2", "1512")), row)[0]
    'step_too_many'
    >>> categorize_episode(episode(("57*62", "3534")), row)[0]
    'miscopied_call'
    """
    steps = reference_steps(row)
    if not steps:
        return None
    calls = episode_calls(episode)
    if not calls:
        return "no_call", "answered without a calculator call"
    for number, (expression, result) in enumerate(calls, 1):
        value = None if result.strip().lower().startswith("error") else _num(result.strip())
        if value is None:  # the calculator's refusals read "error: ..."
            return "call_error", f"call {number} ({expression}) returned {result.strip()[:60] or 'nothing'}"
        if number > len(steps):
            return "step_too_many", f"call {number} ({expression}) after the reference's {len(steps)} step(s)"
        step_expression, step_value = steps[number - 1]
        if _close(value, step_value):
            continue
        if sorted(numbers_in(expression)) == sorted(numbers_in(step_expression)):
            return "wrong_operation", f"call {number} is {expression}, the reference step {step_expression}"
        return "miscopied_call", f"call {number} is {expression}, the reference step {step_expression}"
    if len(calls) < len(steps):
        return "step_left_out", f"{len(calls)} call(s) for the reference's {len(steps)} step(s)"
    return "answer_not_copied", f"every call right, the answer is not the last result ({calls[-1][1].strip()})"


# ---------------------------------------------------------------------------------------------------------------
# Episodes with a search tool: each wrong episode's searches against the question's lookup chain
# ---------------------------------------------------------------------------------------------------------------

#: Classes of a wrong search episode (:func:`categorize_search_episode`).
SEARCH_EPISODE_CATEGORIES = ("no_search", "search_error", "lookup_misread", "lookup_miscopied", "hop_left_out",
                             "hop_too_many", "no_answer", "answer_misread", "answer_miscopied")


def categorize_search_episode(episode: dict[str, Any], row: dict[str, Any]) -> tuple[str, str] | None:
    """``(category, reason)`` of a wrong search episode (:data:`SEARCH_EPISODE_CATEGORIES`): its searches compared, in
    order, with the row's ``chain`` (the names a perfect agent looks up, as ``synthetic:world`` rows carry it in their
    ``task_data``), names compared as answers are (case, spacing and a leading "the" ignored; a query repeated is
    counted once); None when the row has no chain. A search for another name than the chain's next is a *misread
    lookup* when that name was in a result already read (the wrong passage's or the wrong relation's), else a
    *miscopied lookup*; fewer searches than the chain's names are *a hop left out*, more *a hop too many*; every
    search right but the answer wrong is an *answer misread* when the answer is a name of a result read (another
    fact), else an *answer miscopied*.

    >>> row = {"chain": ["Orla Venn", "Tavo Ruskel"]}
    >>> def episode(*searches, answer="Final Answer: Dunmor"):
    ...     messages = []
    ...     for query, result in searches:
    ...         messages += [{"role": "assistant", "content": '<tool_call>{"name": "search", "arguments": '
    ...                       f'{{"query": "{query}"}}}}</tool_call>'}, {"role": "tool", "content": result}]
    ...     return {"messages": messages + [{"role": "assistant", "content": answer}]}
    >>> orla = ("Orla Venn", "The mentor of Orla Venn is Tavo Ruskel. Orla Venn lives in Isya.")
    >>> categorize_search_episode(episode(orla), row)[0]
    'hop_left_out'
    >>> tavo = ("Tavo Ruskel", "Tavo Ruskel was born in Dunmor.")
    >>> categorize_search_episode(episode(orla, tavo, answer="Final Answer: Isya"), row)[0]
    'answer_misread'
    >>> categorize_search_episode(episode(orla, tavo, answer="Final Answer: Dunmar"), row)[0]
    'answer_miscopied'
    >>> categorize_search_episode(episode(orla, ("Isya", "no passage matches the query")), row)[0]
    'lookup_misread'
    """
    from agentic_rl.data.formats import task_with_data

    chain = task_with_data(row).get("chain")
    if not chain:
        return None
    searches = episode_calls(episode, "query")
    if not searches:
        return "no_search", "answered without a search"
    return _follow_chain(episode, searches, chain, read=[], step="search",
                         error_class="search_error", too_many="hop_too_many", left_out="hop_left_out",
                         wrong="lookup", answer_read="another name of the passages read",
                         answer_unread="a name of no passage read")


def _follow_chain(episode: dict[str, Any], lookups: list[tuple[str, str]], chain: list, *, read: list[str],
                  step: str, too_many: str, left_out: str, wrong: str, answer_read: str, answer_unread: str,
                  error_class: str | None = None) -> tuple[str, str]:
    """The class of a wrong episode whose lookups (``(name looked up, result)`` in order: searches, recalls) should
    have followed ``chain``: the first lookup off the chain (*<wrong>_misread* when its name is in a text already read,
    ``read`` and the results so far; else *<wrong>_miscopied*), one past its end (``too_many``), too few
    (``left_out``); with every lookup right, the final answer (*no_answer*, *answer_misread* when it is a name of a
    text read, else *answer_miscopied*). Names are compared as answers are; a name repeated counts once; with
    ``error_class``, a lookup whose result is an error stops there."""
    from agentic_rl.rewards import find_final_answers
    from agentic_rl.rewards.extraction import name_key

    looked: list[str] = []
    for number, (name, result) in enumerate(lookups, 1):
        if error_class and result.strip().lower().startswith("error"):
            return error_class, f"{step} {number} ({name[:60]}) returned {result.strip()[:60]}"
        key = name_key(name)
        if key not in looked:
            hop = len(looked)
            if hop >= len(chain):
                return too_many, f"{step} {number} ({name[:60]}) after the chain's {len(chain)} name(s)"
            if key != name_key(str(chain[hop])):
                seen = bool(key) and any(f" {key} " in text for text in read)
                return (f"{wrong}_misread" if seen else f"{wrong}_miscopied",
                        f"{step} {number} is {name[:60]!r}, the chain's {chain[hop]!r}")
            looked.append(key)
        read.append(_words_of(result))
    if len(looked) < len(chain):
        return left_out, f"{len(looked)} of the chain's {len(chain)} name(s) looked up"
    messages = [m for m in episode.get("messages") or [] if m.get("role") == "assistant"]
    spans = find_final_answers(str(messages[-1].get("content", ""))).spans if messages else []
    answer = name_key(spans[0]) if spans else ""
    if not answer:
        return "no_answer", "every name looked up, no final answer"
    if any(f" {answer} " in text for text in read):
        return "answer_misread", f"answered {spans[0][:60]!r}, {answer_read}"
    return "answer_miscopied", f"answered {spans[0][:60]!r}, {answer_unread}"


MEMORY_EPISODE_CATEGORIES = ("fact_not_stored", "fact_miscopied", "no_recall", "recall_misread", "recall_miscopied",
                             "recall_left_out", "recall_too_many", "no_answer", "answer_misread",
                             "answer_miscopied")


def categorize_memory_episode(episode: dict[str, Any], row: dict[str, Any]) -> tuple[str, str] | None:
    """``(category, reason)`` of a wrong memory episode (:data:`MEMORY_EPISODE_CATEGORIES`), following the facts the
    answer needs (the row's ``facts``, ``needed`` and ``chain``, as ``synthetic:memory`` rows carry them in their
    ``task_data``) through the episode; None when the row has no chain. Names are compared as answers are.

    A needed fact is *stored* when a ``remember`` call under its subject's key holds its object (in any wording);
    *miscopied* when a note under that key lacks the object or the object went under another key; *not stored*
    when neither is there. Then the recalls, in order (a key repeated is counted once), against the chain: a key
    other than the chain's next is a *misread recall* when it is a name the episode had read (an event or a recalled
    note), else a *miscopied recall*; fewer keys than the chain's are *a recall left out* (answered a hop short),
    more *a recall too many*. With every recall right, the answer is *misread* when it is another name the episode
    read, else *miscopied*.

    >>> row = {"facts": [["Orla Venn", "mentor", "Tavo Ruskel"], ["Tavo Ruskel", "born", "Dunmor"]],
    ...        "needed": [0, 1], "chain": ["Orla Venn", "Tavo Ruskel"], "answer": "Dunmor"}
    >>> def call(name, **arguments):
    ...     import json
    ...     return {"role": "assistant", "content": "<tool_call>" + json.dumps(
    ...         {"name": name, "arguments": arguments}) + "</tool_call>"}
    >>> store = [call("remember", key="Orla Venn", text="mentor is Tavo Ruskel"), {"role": "tool", "content": "stored"},
    ...          call("remember", key="Tavo Ruskel", text="born in Dunmor"), {"role": "tool", "content": "stored"}]
    >>> recall = [call("recall", key="Orla Venn"), {"role": "tool", "content": "mentor is Tavo Ruskel"}]
    >>> def episode(*messages, answer="Final Answer: Isya"):
    ...     return {"messages": [*messages, {"role": "assistant", "content": answer}]}
    >>> categorize_memory_episode(episode(*store[:2], *recall), row)[0]
    'fact_not_stored'
    >>> categorize_memory_episode(episode(*store, *recall, answer="Final Answer: Tavo Ruskel"), row)[0]
    'recall_left_out'
    >>> tavo = [call("recall", key="Tavo Ruskel"), {"role": "tool", "content": "born in Dunmor"}]
    >>> categorize_memory_episode(episode(*store, *recall, *tavo, answer="Final Answer: Dunmar"), row)[0]
    'answer_miscopied'
    """
    from agentic_rl.data.formats import task_with_data
    from agentic_rl.rewards.extraction import name_key

    task = task_with_data(row)
    chain, facts, needed = task.get("chain"), task.get("facts"), task.get("needed")
    if not chain or not facts or needed is None:
        return None
    calls = [("" if call.error else str(call.name), call.arguments if isinstance(call.arguments, dict) else {},
              result) for call, result in _calls_with_results(episode)]
    stores = [(name_key(str(a.get("key", ""))), _words_of(str(a.get("text", "")))) for n, a, _ in calls
              if n == "remember"]
    for index in needed:
        subject, _, obj = (str(part) for part in facts[int(index)])
        holding = [key for key, text in stores if f" {name_key(obj)} " in text]
        if name_key(subject) in holding:
            continue
        # notes of the log's other facts are not this one's copies: another subject with the same object (two
        # people born in one town), or the same subject's other relations
        holding = [key for key in holding if key not in {name_key(str(f[0])) for f in facts
                                                          if name_key(str(f[2])) == name_key(obj)}]
        others = {name_key(str(f[2])) for f in facts if name_key(str(f[0])) == name_key(subject)} - {name_key(obj)}
        if any(key == name_key(subject) and not any(f" {o} " in text for o in others) for key, text in stores):
            return "fact_miscopied", f"the notes under {subject!r} do not hold {obj!r}"
        if holding:
            return "fact_miscopied", f"{obj!r} stored under {holding[0]!r}, not {subject!r}"
        return "fact_not_stored", f"no note under {subject!r} and none holds {obj!r}"
    recalls = [(str(arguments.get("key", "")), result) for name, arguments, result in calls if name == "recall"]
    if not recalls:
        return "no_recall", "answered without a recall"
    return _follow_chain(episode, recalls, chain, read=[_words_of(str(event)) for event in task.get("events") or []],
                         step="recall", too_many="recall_too_many", left_out="recall_left_out", wrong="recall",
                         answer_read="another name the episode read", answer_unread="a name the episode never read")


def _words_of(text: str) -> str:
    """A result's text as name keys are found in it: case folded, punctuation a space, spaces around each word."""
    return f" {' '.join(_PUNCTUATION.sub(' ', text).casefold().split())} "


#: The classes of each kind of episode classifier, in the order reports list them.
EPISODE_CLASS_SETS = (EPISODE_CATEGORIES, SEARCH_EPISODE_CATEGORIES, MEMORY_EPISODE_CATEGORIES)
#: The episode classifier of an environment that offers the tool of this name.
EPISODE_CLASSIFIERS = {"calculator": categorize_episode, "search": categorize_search_episode,
                       "remember": categorize_memory_episode}


def episode_classifier(env) -> Callable[[dict[str, Any], dict[str, Any]], tuple[str, str] | None] | None:
    """The classifier of ``env``'s wrong episodes: by their calculator calls, their searches or their notes, in an
    environment that offers that tool (:data:`EPISODE_CLASSIFIERS`); None for one that offers none of them."""
    tool_names = {getattr(tool, "name", None) for tool in getattr(env, "offered_tools", None) or []}
    return next((EPISODE_CLASSIFIERS[name] for name in EPISODE_CLASSIFIERS if name in tool_names), None)


def count_episode_errors(episodes: list[dict[str, Any]]) -> dict[str, int] | None:
    """How many wrong episodes fall in each class of their classifier (:data:`EPISODE_CLASS_SETS`; those with a
    ``category``), or None when none has one (no reference, or no wrong episode)."""
    counts = Counter(e["category"] for e in episodes if e.get("category"))
    if not counts:
        return None
    classes = next((c for c in EPISODE_CLASS_SETS if set(counts) <= set(c)), tuple(counts))
    return {c: counts.get(c, 0) for c in classes}
