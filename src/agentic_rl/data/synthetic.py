"""The embedded task: templated GSM8K-style word problems, deterministic by seed.

Each problem is a chain of 1..N exact integer operations (+, -, *, /) on one running quantity, told as a short
story ("Mia has 12 apples. She buys 7 more. She splits the apples equally into 3 bags and keeps one bag. How many
apples does Mia have now?"). Rows are GSM8K-shaped so everything downstream treats them exactly like GSM8K::

    {"question": "...", "answer": "12 + 7 = <<12+7=19>>19\\n...\\n#### 19"}

one line per step with the calculator annotation ``<<a op b=c>>`` and a final ``#### N`` equal to the last step's
result. Every intermediate result is a non-negative integer no larger than ``max_answer``.

Defaults are sized for the embedded tiny model (a few million parameters, one token per digit): 1..3 steps,
start values and +/- operands up to 50, factors/divisors 2..9, every number at most 150 — GSM8K in shape, but
learnable on a CPU in minutes. Knobs widen it (``max_operand``, ``max_factor``, ``max_answer``, ``max_steps``).

``kind="multiplication"`` (also :func:`multiplication_task`) makes problems whose first step multiplies two
multi-digit numbers (``23 * 47``), optionally followed by +/- steps: a task where a calculator tool matters.
``distractors`` adds to a share of them one sentence with a number the answer does not use ("Leo is 34 years
old."), so a model has to tell which quantities change the total.

:func:`synthetic_splits` gives train and test rows that never share a question; the test split depends only on
``seed`` and ``n_test`` (not on ``n_train``), so evaluation sets stay fixed while training sets grow.
:func:`arithmetic_corpus` gives plain-text pretraining lines (equations, short chains, question sentences) with
no chat format and no ``Final Answer`` line, so a base model learns arithmetic and vocabulary, not the task format.

Try it: ``agentic-rl data preview --source synthetic`` / ``agentic-rl data stats --source synthetic``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agentic_rl.data.formats import CALC_STEP, SYSTEM_PROMPT
from agentic_rl.data.gsm8k import parse_gsm8k_answer
from agentic_rl.errors import ConfigError, DataError

OPS = ("+", "-", "*", "/")
KINDS = ("arithmetic", "multiplication")

# ---------------------------------------------------------------------------------------------------------------
# Vocabulary: names (with pronouns), story families, phrasings
# ---------------------------------------------------------------------------------------------------------------

_SHE = {"he": "she", "him": "her", "his": "her", "himself": "herself"}
_HE = {"he": "he", "him": "him", "his": "his", "himself": "himself"}
NAMES = [(n, _SHE) for n in ("Mia", "Ava", "Lena", "Sofia", "Emma", "Nora", "Zoe", "Lily", "Grace", "Chloe",
                              "Ruby", "Hana", "Priya", "Maya", "Julia", "Rosa", "Amara", "Ella", "Iris", "Nina")]
NAMES += [(n, _HE) for n in ("Leo", "Sam", "Omar", "Ben", "Jack", "Noah", "Luca", "Ravi", "Tom", "Max",
                              "Ethan", "Kofi", "Hugo", "Felix", "Owen", "Liam", "Arjun", "Theo", "Adam", "Marco")]
RELATIVES = ["mother", "father", "sister", "brother", "aunt", "uncle", "grandmother", "grandfather", "cousin", "friend"]


@dataclass(frozen=True)
class Family:
    """One kind of story: what the quantity is, how it starts, and one or more phrasings per operation.

    Placeholders: {name} {he} {him} {his} {himself} (and capitalised {He} {His}), {friend}, {relative}, {items},
    {a} (start value), {b} (the step's operand), {groups} (a container word for grouped starts).
    """

    items: tuple[str, ...]
    start: tuple[str, ...]
    grouped_start: tuple[str, ...]  # "{a} boxes with {b} {items} each" -> first step a * b
    ops: dict[str, tuple[str, ...]]
    questions: tuple[str, ...]
    groups: tuple[str, ...] = ("boxes", "bags", "packs")


FAMILIES: tuple[Family, ...] = (
    Family(  # a person's collection
        items=("apples", "marbles", "stickers", "pencils", "stamps", "shells", "cards", "cookies", "books",
               "toy cars", "balloons", "beads", "crayons", "buttons", "seashells", "comics"),
        start=("{name} has {a} {items}.", "{name} collected {a} {items}.", "There are {a} {items} in {name}'s room.",
               "{name} starts the week with {a} {items}."),
        grouped_start=("{name} has {a} {groups} of {items} with {b} {items} in each.",
                       "{name} buys {a} {groups} of {items}. Each one holds {b} {items}."),
        ops={
            "+": ("{He} buys {b} more {items}.", "{His} {relative} gives {him} {b} {items}.",
                  "{He} finds {b} more {items}.", "{friend} gives {him} {b} more {items}."),
            "-": ("{He} gives {b} {items} to {friend}.", "{He} loses {b} {items}.", "{He} sells {b} {items}.",
                  "{He} gives away {b} of the {items}."),
            "*": ("By the end of the month {he} has {b} times as many {items} as before.",
                  "{He} keeps collecting until {he} has {b} times as many {items}."),
            "/": ("{He} splits the {items} equally into {b} bags and keeps one bag.",
                  "{He} shares the {items} equally among {b} children, {himself} included, and keeps {his} share."),
        },
        questions=("How many {items} does {name} have now?", "How many {items} does {name} have in the end?",
                   "How many {items} does {he} have left?"),
    ),
    Family(  # a shop's stock
        items=("shirts", "lamps", "mugs", "notebooks", "umbrellas", "plants", "bottles of juice", "loaves of bread",
               "pairs of socks", "scarves", "candles", "backpacks"),
        start=("{name}'s shop has {a} {items} in stock.", "A shop run by {name} has {a} {items}.",
               "{name} opens a stall with {a} {items}."),
        grouped_start=("{name}'s shop receives {a} crates of {items} with {b} {items} in each crate.",
                       "{name} orders {a} cartons of {items}; every carton holds {b} {items}."),
        ops={
            "+": ("A delivery brings {b} more {items}.", "{He} orders {b} more {items}.",
                  "{friend} brings {b} {items} to the shop."),
            "-": ("Customers buy {b} {items}.", "{He} sells {b} {items} in the morning.",
                  "{b} {items} are damaged and thrown away."),
            "*": ("After a big order the stock is {b} times as large.",
                  "{He} restocks until the shop has {b} times as many {items}."),
            "/": ("{He} splits the {items} equally among {b} branches and keeps one share in this shop.",
                  "{He} divides the {items} equally into {b} shelves and keeps only one shelf on display."),
        },
        questions=("How many {items} does the shop have now?", "How many {items} are in stock now?",
                   "How many {items} does {name} have in the shop at the end?"),
        groups=("crates", "cartons"),
    ),
    Family(  # money
        items=("dollars",),
        start=("{name} has ${a}.", "{name} saved ${a}.", "{name} has ${a} in {his} wallet."),
        grouped_start=("{name} works {a} days and earns ${b} each day.",
                       "{name} sells {a} drawings for ${b} each."),
        ops={
            "+": ("{He} earns ${b} more.", "{His} {relative} gives {him} ${b}.", "{He} finds ${b} on the street."),
            "-": ("{He} spends ${b} on a book.", "{He} pays ${b} for lunch.", "{He} lends ${b} to {friend}."),
            "*": ("{He} does extra work and ends up with {b} times as much money.",),
            "/": ("{He} shares the money equally among {b} people, {himself} included, and keeps {his} share.",),
        },
        questions=("How many dollars does {name} have now?", "How much money, in dollars, does {name} have left?"),
    ),
    Family(  # a farm
        items=("sheep", "goats", "chickens", "cows", "ducks", "rabbits", "pigs", "horses"),
        start=("A farmer named {name} has {a} {items}.", "{name}'s farm has {a} {items}.",
               "There are {a} {items} on {name}'s farm."),
        grouped_start=("{name}'s farm has {a} pens with {b} {items} in each pen.",
                       "{name} keeps {a} barns with {b} {items} in each barn."),
        ops={
            "+": ("{He} buys {b} more {items}.", "{b} baby {items} are born in spring.",
                  "{friend} gives {him} {b} {items}."),
            "-": ("{He} sells {b} {items} at the market.", "{b} {items} run away.",
                  "{He} gives {b} {items} to {friend}."),
            "*": ("After a few years the herd is {b} times as large.",),
            "/": ("{He} divides the {items} equally among {b} fields and keeps only one field's share.",),
        },
        questions=("How many {items} does {name} have now?", "How many {items} are on the farm now?"),
    ),
    Family(  # a class / school supplies
        items=("chairs", "desks", "markers", "rulers", "tablets", "posters", "paint brushes", "footballs"),
        start=("A school has {a} {items}.", "{name}'s class has {a} {items}.",
               "The library where {name} works has {a} {items}."),
        grouped_start=("{name} sets up {a} rows of {items} with {b} {items} in each row.",
                       "The school buys {a} sets of {items} with {b} {items} in each set."),
        ops={
            "+": ("The school buys {b} more {items}.", "{name} brings {b} more {items}.",
                  "{friend} donates {b} {items}."),
            "-": ("{b} {items} are broken and removed.", "{name} lends {b} {items} to another class.",
                  "{b} {items} are sent for repair."),
            "*": ("Next year the number of {items} is {b} times as large.",),
            "/": ("The {items} are shared equally among {b} classrooms, and {name}'s class keeps one share.",),
        },
        questions=("How many {items} are there now?", "How many {items} does {name}'s class have now?"),
        groups=("rows", "sets"),
    ),
)

# Multiplication (tool-use) stories: "{a} {groups} with {b} {items} each", then optional +/- steps.
MULT_STORIES: tuple[tuple[str, str, str], ...] = (
    # (opening, plus phrasing, minus phrasing)
    ("A warehouse has {a} crates with {b} bottles in each crate.", "{c} more bottles arrive.", "{c} bottles break."),
    ("A theatre has {a} rows with {b} seats in each row.", "{c} extra seats are added.", "{c} seats are removed."),
    ("{name} reads {b} pages a day for {a} days.", "{He} then reads {c} more pages.", "{He} skips {c} of those pages."),
    ("A school orders {a} packs of pencils with {b} pencils in each pack.", "{name} adds {c} pencils.",
     "{c} pencils are lost."),
    ("{name} plants {a} rows of tulips with {b} tulips in each row.", "{He} plants {c} more tulips.",
     "{c} tulips do not survive."),
    ("A bakery makes {a} trays of cookies with {b} cookies on each tray.", "{name} bakes {c} more cookies.",
     "{c} cookies are eaten by the staff."),
    ("{name} sells {a} tickets for ${b} each.", "{He} also receives a ${c} tip.", "{He} pays a ${c} fee."),
    ("A library has {a} shelves holding {b} books each.", "{c} new books arrive.", "{c} books are borrowed."),
    ("A farm has {a} boxes with {b} eggs in each box.", "The hens lay {c} more eggs.", "{c} eggs crack."),
    ("{name} saves ${b} every week for {a} weeks.", "{His} {relative} adds ${c}.", "{He} spends ${c} on a gift."),
)
MULT_QUESTIONS = ("How many are there in total?", "What is the total now?", "What is the final total?")
# Sentences whose number the answer does not use (``distractors``): the model has to tell a quantity that changes the
# total from one that does not, as GSM8K's irrelevant details ask.
DISTRACTORS = ("{friend} helps for {d} hours.", "It takes {d} minutes to count them all.", "{name} is {d} years old.",
               "{friend} has been doing this for {d} years.", "The job is done in {d} days.",
               "{name} tells {d} friends about it.")


def _fill(template: str, ctx: dict[str, str]) -> str:
    text = template.format(**ctx)
    return text[0].upper() + text[1:]


def _person(rng: random.Random, exclude: str | None = None) -> tuple[str, dict[str, str]]:
    while True:
        name, pron = rng.choice(NAMES)
        if name != exclude:
            return name, pron


def _context(rng: random.Random) -> dict[str, str]:
    name, pron = _person(rng)
    friend, _ = _person(rng, exclude=name)
    ctx = {"name": name, "friend": friend, "relative": rng.choice(RELATIVES), **pron}
    ctx.update({k.capitalize(): v.capitalize() for k, v in pron.items()})
    return ctx


def _step_line(a: int, op: str, b: int, c: int) -> str:
    """One GSM8K-style answer line: ``12 + 7 = <<12+7=19>>19``."""
    return f"{a} {op} {b} = <<{a}{op}{b}={c}>>{c}"


def _apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    q, r = divmod(a, b)
    assert r == 0, "division must be exact"
    return q


# ---------------------------------------------------------------------------------------------------------------
# One problem
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Knobs:
    min_steps: int
    max_steps: int
    max_operand: int
    max_factor: int
    max_answer: int
    ops: tuple[str, ...]
    kind: str
    digits: int
    distractors: float = 0.0


def _pick_operand(rng: random.Random, cur: int, op: str, k: _Knobs) -> int | None:
    """A random operand for ``cur op b`` that keeps the result an integer in [1, max_answer], or None."""
    if op == "+":  # operands >= 2 keep the stories grammatical ("buys 2 more apples")
        hi = min(k.max_operand, k.max_answer - cur)
        return rng.randint(2, hi) if hi >= 2 else None
    if op == "-":
        hi = min(k.max_operand, cur - 1)
        return rng.randint(2, hi) if hi >= 2 else None
    if op == "*":
        hi = min(k.max_factor, k.max_answer // max(cur, 1))
        return rng.randint(2, hi) if hi >= 2 else None
    divisors = [d for d in range(2, k.max_factor + 1) if cur % d == 0]
    return rng.choice(divisors) if divisors else None


def _arithmetic_problem(rng: random.Random, k: _Knobs) -> dict[str, str]:
    fam = rng.choice(FAMILIES)
    ctx = _context(rng)
    ctx["items"] = rng.choice(fam.items)
    ctx["groups"] = rng.choice(fam.groups)
    n_steps = rng.randint(k.min_steps, k.max_steps)
    while True:  # retry until a chain of n_steps feasible operations is found (almost always the first try)
        sentences: list[str] = []
        lines: list[str] = []
        used: set[str] = set()
        # Start: either "has {a}" (no step) or "{a} groups of {b}" (the first step is a * b).
        grouped = "*" in k.ops and rng.random() < 0.3
        if grouped:
            a = rng.randint(2, k.max_factor)
            hi = min(k.max_operand, k.max_answer // a)
            if hi < 2:
                grouped = False
        if grouped:
            b = rng.randint(2, hi)
            cur = a * b
            sentences.append(_fill(rng.choice(fam.grouped_start), {**ctx, "a": a, "b": b}))
            lines.append(_step_line(a, "*", b, cur))
        else:
            cur = rng.randint(2, min(k.max_operand, k.max_answer))
            sentences.append(_fill(rng.choice(fam.start), {**ctx, "a": cur}))
        ok = True
        while len(lines) < n_steps:
            choices = [(op, b) for op in k.ops if (b := _pick_operand(rng, cur, op, k)) is not None]
            if not choices:
                ok = False
                break
            op, b = rng.choice(choices)
            new = _apply(cur, op, b)
            phrasings = [t for t in fam.ops[op] if t not in used] or list(fam.ops[op])  # avoid repeating a sentence
            template = rng.choice(phrasings)
            used.add(template)
            sentences.append(_fill(template, {**ctx, "b": b}))
            lines.append(_step_line(cur, op, b, new))
            cur = new
        if ok:
            break
    sentences.append(_fill(rng.choice(fam.questions), ctx))
    return {"question": " ".join(sentences), "answer": "\n".join(lines + [f"#### {cur}"])}


def _multiplication_problem(rng: random.Random, k: _Knobs) -> dict[str, str]:
    ctx = _context(rng)
    opening, plus, minus = rng.choice(MULT_STORIES)
    lo, hi = 10 ** (k.digits - 1), 10 ** k.digits - 1
    a, b = rng.randint(max(lo, 2), hi), rng.randint(max(lo, 2), hi)
    cur = a * b
    sentences = [_fill(opening, {**ctx, "a": a, "b": b})]
    # "{name} reads {b} pages a day for {a} days" reads naturally as b * a; the value is the same.
    lines = [_step_line(a, "*", b, cur)]
    n_steps = rng.randint(k.min_steps, k.max_steps)
    while len(lines) < n_steps:
        op = rng.choice([o for o in ("+", "-") if o in k.ops] or ["+"])
        hi = min(k.max_operand, cur - 1) if op == "-" else k.max_operand
        c = rng.randint(2, max(2, hi))
        new = _apply(cur, op, c)
        sentences.append(_fill(plus if op == "+" else minus, {**ctx, "c": c}))
        lines.append(_step_line(cur, op, c, new))
        cur = new
    if k.distractors and rng.random() < k.distractors:  # drawn only when asked: the default rows stay as they were
        d = rng.randint(2, k.max_operand)
        sentences.insert(rng.randint(1, len(sentences)), _fill(rng.choice(DISTRACTORS), {**ctx, "d": d}))
    sentences.append(rng.choice(MULT_QUESTIONS))
    return {"question": " ".join(sentences), "answer": "\n".join(lines + [f"#### {cur}"])}


# ---------------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------------

def _knobs(min_steps: int, max_steps: int, max_operand: int | None, max_factor: int | None, max_answer: int | None,
           ops: Iterable[str], kind: str, digits: int, distractors: float = 0.0) -> _Knobs:
    if kind not in KINDS:
        raise ConfigError(f"synthetic kind must be one of {', '.join(KINDS)}; got {kind!r}")
    ops = tuple(ops)
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise ConfigError(f"synthetic ops must be a non-empty subset of {' '.join(OPS)}; got {list(ops)}")
    if not 1 <= min_steps <= max_steps:
        raise ConfigError(f"synthetic steps need 1 <= min_steps <= max_steps; got min_steps={min_steps}, "
                          f"max_steps={max_steps}")
    if isinstance(distractors, bool) or not isinstance(distractors, (int, float)) or not 0 <= distractors <= 1:
        raise ConfigError(f"synthetic distractors must be a share between 0 and 1; got {distractors!r}")
    if kind == "multiplication":
        if digits < 1:
            raise ConfigError(f"synthetic digits must be >= 1; got {digits}")
        # the product's size is set by ``digits``; max_answer does not apply
        return _Knobs(min_steps, max_steps, max_operand or 50, max_factor or 9, 0, ops, kind, digits, distractors)
    if distractors:
        raise ConfigError("synthetic distractors apply to kind 'multiplication' only")
    k = _Knobs(min_steps, max_steps, 50 if max_operand is None else max_operand,
               9 if max_factor is None else max_factor, 150 if max_answer is None else max_answer, ops, kind, digits)
    if k.max_operand < 2 or k.max_factor < 2 or k.max_answer < 4:
        raise ConfigError(f"synthetic numbers too small: need max_operand >= 2, max_factor >= 2, max_answer >= 4; "
                          f"got {k.max_operand}, {k.max_factor}, {k.max_answer}")
    return k


def _generate(n: int, rng: random.Random, k: _Knobs, exclude: set[str]) -> list[dict[str, str]]:
    make = _multiplication_problem if k.kind == "multiplication" else _arithmetic_problem
    rows: list[dict[str, str]] = []
    seen = set(exclude)
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise DataError(f"could only generate {len(rows)} distinct synthetic problems of {n} asked for; "
                            "widen the number ranges (max_operand, max_answer) or the step range")
        row = make(rng, k)
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    return rows


def generate_synthetic(n: int, seed: int = 0, *, min_steps: int = 1, max_steps: int = 3,
                       max_operand: int | None = None, max_factor: int | None = None, max_answer: int | None = None,
                       ops: Iterable[str] = OPS, kind: str = "arithmetic", digits: int = 2,
                       distractors: float = 0.0, exclude: Iterable[str] = ()) -> list[dict[str, str]]:
    """``n`` distinct GSM8K-shaped rows ``{"question", "answer"}``, the same for the same seed and knobs.

    Args:
        n: number of problems (distinct question texts).
        seed: random seed; the rows depend only on it and the knobs.
        min_steps, max_steps: number of arithmetic steps per problem (uniform in the range).
        max_operand: largest start value and +/- operand (default 50).
        max_factor: largest multiplier / divisor for ``*`` and ``/`` (default 9).
        max_answer: largest intermediate or final result (default 150; arithmetic kind only).
        ops: operations allowed, a subset of ``+ - * /``.
        kind: ``"arithmetic"`` (default) or ``"multiplication"`` (first step multiplies two ``digits``-digit numbers).
        digits: operand size for ``kind="multiplication"`` (2 -> e.g. ``23 * 47``).
        distractors: ``kind="multiplication"`` only: the share of problems with one extra sentence holding a number
            the answer does not use ("Leo is 34 years old.").
        exclude: question texts never to emit (used to keep splits disjoint).

    >>> generate_synthetic(1, seed=0)[0]["answer"].splitlines()[-1].startswith("#### ")
    True
    """
    k = _knobs(min_steps, max_steps, max_operand, max_factor, max_answer, ops, kind, digits, distractors)
    return _generate(n, random.Random(f"agentic-rl-synthetic:{seed}"), k, set(exclude))


def multiplication_task(n: int, seed: int = 0, *, digits: int = 2, min_steps: int = 1, max_steps: int = 2,
                        max_operand: int = 50, exclude: Iterable[str] = ()) -> list[dict[str, str]]:
    """Word problems built around one multi-digit multiplication (``23 * 47 = 1081``), then 0..1 +/- steps.

    The task where a calculator tool pays off: a small model rarely multiplies two 2-digit numbers right in its
    head. Same as ``generate_synthetic(n, seed, kind="multiplication", ...)``.
    """
    return generate_synthetic(n, seed, kind="multiplication", digits=digits, min_steps=min_steps,
                              max_steps=max_steps, max_operand=max_operand, exclude=exclude)


# The embedded task's held-out split: every stage (pretraining corpus exclusion, SFT, GRPO, evaluation) uses the same
# 1000 test problems by default, so train data never contains an evaluation problem whatever the stage. A smaller test
# size gives a prefix of this split (generation is sequential), so evaluation on N <= 1000 problems stays held out.
SYNTHETIC_TEST_SIZE = 1000


def synthetic_splits(n_train: int, n_test: int, seed: int = 0, **knobs) -> tuple[list[dict], list[dict]]:
    """Train and test rows that never share a question.

    The test rows depend only on ``seed``, ``n_test`` and the knobs (not on ``n_train``), so a fixed evaluation
    set survives a change of training size; train rows are drawn from a separate stream, skipping test questions.
    ``knobs`` are :func:`generate_synthetic`'s keyword arguments.
    """
    test = generate_synthetic(n_test, seed=seed, **{**knobs, "exclude": ()}) if n_test else []
    test_questions = {r["question"] for r in test}
    train = generate_synthetic(n_train, seed=seed + 1_000_003, **{**knobs, "exclude": test_questions})
    return train, test


def arithmetic_corpus(n_lines: int, seed: int = 0, *, max_operand: int = 99, max_factor: int = 12,
                      max_answer: int = 200, chain_fraction: float = 0.25, sentence_fraction: float = 0.3,
                      exclude: Iterable[str] = (), **problem_knobs) -> list[str]:
    """Plain-text pretraining lines: arithmetic facts, short chains and word-problem sentences.

    * facts: ``37 + 48 = 85``, ``6 * 7 = 42``, ``42 / 6 = 7``, ``85 - 37 = 48`` (exact, non-negative; + and -
      operands up to ``max_operand``, * and / the tables up to ``max_factor``);
    * chains: 2-3 consecutive lines where each line starts from the previous result (``12 + 5 = 17`` then
      ``17 * 3 = 51``, results at most ``max_answer``), the shape of the embedded task's reasoning steps;
    * sentences: synthetic question texts (``problem_knobs`` as in :func:`generate_synthetic`), never any in
      ``exclude`` (pass the test questions), with no answer, no chat format and no ``Final Answer`` line.

    Deterministic by seed; exactly ``n_lines`` strings, each a single line, chains kept contiguous.
    """
    if not (0 <= chain_fraction <= 1 and 0 <= sentence_fraction <= 1):
        raise ConfigError("chain_fraction and sentence_fraction must be between 0 and 1")
    rng = random.Random(f"agentic-rl-corpus:{seed}")
    n_sent = int(round(n_lines * sentence_fraction))
    questions = [r["question"] for r in generate_synthetic(n_sent, seed=seed + 7_777_777, exclude=exclude,
                                                           **problem_knobs)] if n_sent else []

    def fact() -> tuple[int, str, int, int]:
        op = rng.choice(OPS)
        if op == "+":
            a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
            return a, op, b, a + b
        if op == "-":
            c, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
            return c + b, op, b, c
        if op == "*":
            a, b = rng.randint(0, max_factor), rng.randint(0, max_factor)
            return a, op, b, a * b
        b, c = rng.randint(1, max_factor), rng.randint(0, max_factor)
        return b * c, op, b, c

    def follow(a: int) -> tuple[int, str, int, int]:
        choices: list[tuple[str, int]] = []
        if max_answer - a >= 1:
            choices.append(("+", rng.randint(1, min(max_operand, max_answer - a))))
        if a >= 1:
            choices.append(("-", rng.randint(1, min(max_operand, a))))
        if a >= 1 and max_answer // a >= 2 and max_factor >= 2:
            choices.append(("*", rng.randint(2, min(max_factor, max_answer // a))))
        divisors = [d for d in range(2, max_factor + 1) if a % d == 0]
        if divisors:
            choices.append(("/", rng.choice(divisors)))
        op, b = rng.choice(choices)
        return a, op, b, _apply(a, op, b)

    blocks: list[list[str]] = [[q] for q in questions]
    n_math = n_lines - n_sent
    while n_math > 0:
        length = rng.randint(2, min(3, n_math)) if n_math >= 2 and rng.random() < chain_fraction else 1
        block = []
        a, op, b, c = fact()
        while length > 1 and c > max_answer:
            a, op, b, c = fact()
        block.append(f"{a} {op} {b} = {c}")
        for _ in range(length - 1):
            a, op, b, c = follow(c)
            block.append(f"{a} {op} {b} = {c}")
        blocks.append(block)
        n_math -= length
    rng.shuffle(blocks)
    return [line for block in blocks for line in block]


#: The multiplication problems the pretraining corpus writes (:func:`copy_corpus`); pretraining keeps their test split
#: out, so the shipped base's corpus does not change when a task's knobs do.
CORPUS_MULTIPLICATION = {"kind": "multiplication", "max_steps": 2}

#: How copy_corpus writes a problem's steps: "39*83=3237", as a calculator call's arguments and its result, or as
#: the lines of the task's worked answer ("39 * 83 = 3237", one per line, as SFT demonstrations write them).
COPY_LAYOUTS = ("plain", "call", "answer")


def copy_corpus(n_lines: int, seed: int = 0, *, problem_fraction: float = 2 / 3,
                exclude: Iterable[str] = (), layout: str = "plain",
                multiplication_knobs: dict[str, Any] | None = None) -> list[str]:
    """Plain-text pretraining lines that can only be predicted by copying numbers seen earlier in the line.

    * problems (``problem_fraction``): a word-problem question (the multiplication and the arithmetic task, half each;
      never one in ``exclude``) followed by its steps as calculator expressions, each one built from numbers of the
      question or from the previous result: ``A theatre has 39 rows with 83 seats in each row. 5 seats are removed.
      How many are there in total? 39*83=3237 3237-5=3232``;
    * lists: a list of 2-5 random numbers (1-4 digits), then the same list again after ``->``:
      ``417 58 3092 -> 417 58 3092``.

    The model has to look back and copy a number token by token (an induction head) — the skill that tool calls
    need (question -> call arguments, tool result -> next call), learned here on cheap plain text instead of in SFT.
    ``layout="call"`` writes a problem's steps as the calculator's arguments followed by the result
    (``... in total? {"expression": "39*83"} 3237 {"expression": "3237-5"} 3232``), so that the number is copied
    after the same tokens as in a tool call: a base that copies after a space can still miss the first digit after
    the quote. ``layout="answer"`` writes them as the worked answer's lines (``... in total?\n39 * 83 = 3237\n3237 - 5 =
    3232``), the text the single-turn task's demonstrations and answers use. The multiplication problems are drawn
    with ``multiplication_knobs`` (:func:`generate_synthetic`'s settings; default :data:`CORPUS_MULTIPLICATION`).
    Deterministic by seed; exactly ``n_lines`` strings, single-line except in the ``answer`` layout.
    """
    if not 0 <= problem_fraction <= 1:
        raise ConfigError("problem_fraction must be between 0 and 1")
    if layout not in COPY_LAYOUTS:
        raise ConfigError(f"copy layout must be one of {', '.join(COPY_LAYOUTS)}; got {layout!r}")
    rng = random.Random(f"agentic-rl-copy:{seed}")
    n_problems = int(round(n_lines * problem_fraction))
    n_mult = n_problems // 2
    rows = generate_synthetic(n_mult, seed=seed + 5_555_555, **(multiplication_knobs or CORPUS_MULTIPLICATION),
                              exclude=exclude)
    rows += generate_synthetic(n_problems - n_mult, seed=seed + 6_666_666, exclude=exclude)
    lines = []
    for row in rows:
        if layout == "answer":
            lines.append("\n".join([row["question"], *parse_gsm8k_answer(row["answer"])["steps"]]))
            continue
        pairs = [(expression.strip(), value.strip()) for expression, value in CALC_STEP.findall(row["answer"])]
        if layout == "call":
            steps = [f'{json.dumps({"expression": expression})} {value}' for expression, value in pairs]
        else:
            steps = [f"{expression}={value}" for expression, value in pairs]
        lines.append(f"{row['question']} {' '.join(steps)}")
    for _ in range(n_lines - n_problems):
        numbers = " ".join(str(rng.randint(0, 10 ** rng.randint(1, 4) - 1)) for _ in range(rng.randint(2, 5)))
        lines.append(f"{numbers} -> {numbers}")
    rng.shuffle(lines)
    return lines


def default_tokenizer_corpus(n_lines: int = 3000, seed: int = 0, *, exclude=(), scaffold: Iterable[str] = ()
                             ) -> list[str]:
    """Text for training the embedded tokenizer: arithmetic lines, synthetic questions and their solutions in the
    answer format, and the system prompt (so the chat scaffolding and ``Final Answer:`` become few tokens).

    ``scaffold`` lines come right after the system prompt: the pretrain stage passes the agent's tool-call text there
    (:func:`agentic_rl.agent.tasks.tool_call_scaffold`) when the tokenizer should also merge tool calls.
    """
    copies = max(20, n_lines // 50)
    lines: list[str] = [SYSTEM_PROMPT] * copies
    lines += list(scaffold)
    lines += list(arithmetic_corpus(n_lines, seed, exclude=exclude))
    for row in generate_synthetic(max(n_lines // 4, 50), seed=seed + 99, exclude=exclude):
        lines.append(row["question"] + "\n" + parse_gsm8k_answer(row["answer"])["solution_text"])
    return lines
