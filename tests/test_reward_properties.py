"""Property-based tests: every reward returns one finite float per completion and never raises, on thousands of
random and adversarial strings (and 1 MB inputs, each scored in well under a second); extraction is
self-consistent and cannot be gamed by stating a second, different final answer, nor by a final answer that offers
several candidates: any separator (a word, a symbol, a bracket, a line break, an invisible character) joined to any
written form of a second answer (digits, a number word, full-width or another script's digits, a box, a unit) scores
0, while one answer written plainly in any notation scores 1."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentic_rl.rewards import (AccuracyReward, CalculatorError, CombinedReward, FormatReward, LengthPenaltyReward,
                                ProcessReward, StepReward, check_equations, count_steps, extract_answer, is_correct,
                                parse_number, safe_eval)

REWARDS = [
    AccuracyReward(),
    AccuracyReward(mode="lenient"),
    LengthPenaltyReward(only_correct=False, floor=None),
    LengthPenaltyReward(),
    StepReward(only_correct=False),
    StepReward(),
    FormatReward(),
    ProcessReward(),
]
COMBINED = CombinedReward(REWARDS, [1.0, 0.5, 0.1, 0.1, 0.2, 0.2, 0.3, 0.4])

# Pieces that exercise every branch of the parsers: markers, LaTeX, numbers in every notation, operators,
# braces, thinking tags, unicode look-alikes, and things that could make a regex backtrack.
TOKENS = [
    "Final Answer:", "final answer is", "**Final Answer:**", "####", "#### ", "\\boxed{", "\\fbox{", "{", "}", "{,}",
    "\\frac{", "\\dfrac", "\\text{", "\\sqrt", "\\pi", "\\$", "\\%", "\\left(", "\\right)", "$", "%", "^", "=", "==",
    "+", "-", "−", "*", "x", "×", "÷", "/", "//", "(", ")", ",", ".", "..", " ", "\t", "\n", "\n\n", "Step 1",
    "step",
    "0", "1", "7", "72", "72.0", ".5", "0.5", "-5", "1,234", "1,234.50", "1,2345", "3/4", "3/0", "1e308", "inf",
    "nan", "9" * 70, "1" * 300, "0" * 40, "<think>", "</think>", "dollars", "apples", "a", "é", "٣", "１２",
    "\x00", "\ufeff", "🙂",
]
adversarial = st.lists(st.sampled_from(TOKENS), max_size=60).map("".join)
any_text = st.one_of(st.text(max_size=400), adversarial)
messages = any_text.map(lambda t: [{"role": "assistant", "content": t}])
truths = st.one_of(st.sampled_from(["72", "0", "-5", "0.75", "1234.5", "3/4", "abc", ""]),
                   st.integers(-10**6, 10**6).map(str), st.text(max_size=20))


def _check_outputs(name, values, n):
    assert isinstance(values, list) and len(values) == n, name
    for v in values:
        assert isinstance(v, float) and math.isfinite(v), (name, v)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completions=st.lists(st.one_of(any_text, messages), min_size=1, max_size=4), truth=truths)
def test_every_reward_returns_one_float_per_completion(completions, truth):
    truths_ = [truth] * len(completions)
    for reward in REWARDS:
        values = reward(completions, ground_truth=truths_)
        _check_outputs(reward.__name__, values, len(completions))
        if isinstance(reward, AccuracyReward):
            assert set(values) <= {0.0, 1.0}
        if isinstance(reward, FormatReward):
            assert set(values) <= {0.0, 0.5, 1.0}
        if isinstance(reward, ProcessReward):
            assert all(0.0 <= v <= 1.0 for v in values)
    _check_outputs("combined", COMBINED(completions, ground_truth=truths_), len(completions))


@settings(max_examples=1500, deadline=None)
@given(text=any_text)
def test_extraction_is_self_consistent_and_cannot_be_hedged(text):
    for mode in ("strict", "lenient"):
        answer = extract_answer(text, mode=mode)
        if answer is None:
            continue
        assert parse_number(answer) is not None
        # the extracted answer is what is_correct compares: a completion is right about its own answer
        assert is_correct(text, answer, mode=mode)
    strict = extract_answer(text)
    if strict is not None:
        # stating a second, different final answer never pays: the completion then has no answer at all
        value = float(strict)
        other = value + max(1.0, abs(value))
        hedged = f"{text}\nFinal Answer: {other:.17g}"
        assert extract_answer(hedged) is None
        assert not is_correct(hedged, strict) and not is_correct(hedged, f"{other:.17g}")


def _written(value: int, style: str) -> str:
    """One number as a model might write it."""
    if style == "dollars":
        return f"${value}" if value >= 0 else f"-${-value}"
    if style == "thousands":
        return f"{value:,}"
    if style == "decimal":
        return f"{value}.5"
    return str(value)


# Connectors that make several numbers candidates for one answer.
HEDGE_JOINS = [" or ", ", ", "; ", " | ", " / ", "-", " - ", "–", " to ", " through ", " and ", " or maybe ",
               " ± ", "±", " +/- ", " \\pm ", " plus or minus ", " ", " + ", " (or ", " apples or ", " apples, "]
HEDGE_LINES = [
    "Final Answer: {h}", "**Final Answer:** {h}", "The final answer is {h}.", "final answer = {h}",
    "Final Answer: \\boxed{{{h}}}", "Final Answer: {a} + {b} = {h}", "Final Answer: either {h}",
    "Final Answer: between {h}", "#### {h}", "\\boxed{{{h}}}", "Final Answer:\n{h}",
]
LENIENT_LINES = ["the answer is {h}", "so it is {h} apples", "{h}"]


@settings(max_examples=1500, deadline=None)
@given(truth=st.integers(-10**6, 10**6), others=st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=3),
       position=st.integers(0, 3), join=st.sampled_from(HEDGE_JOINS),
       style=st.sampled_from(["plain", "dollars", "thousands", "decimal"]),
       line=st.sampled_from(HEDGE_LINES + LENIENT_LINES),
       reasoning=st.sampled_from(["", "48 / 2 = 24\n48 + 24 = 72\n", "Let me think.\n"]))
def test_hedged_answers_containing_the_truth_score_zero(truth, others, position, join, style, line, reasoning):
    written_truth = _written(truth, style)
    candidates = [_written(o, style) for o in others if _written(o, style) != written_truth]
    if not candidates:
        candidates = [_written(truth + 1, style)]
    candidates.insert(min(position, len(candidates)), written_truth)
    # A dash between a number and its own negative reads as one number written twice ("-1-1" is -1, then -1 again):
    # not a hedge between two answers.
    assume(join.strip() != "-" or len({c.replace("-", "") for c in candidates}) == len(candidates))
    hedge = join.join(candidates)
    if join == " (or ":
        hedge += ")"
    text = reasoning + line.format(h=hedge, a=3, b=4)
    ground_truth = written_truth.replace("$", "").replace(",", "")
    for mode in ("strict", "lenient"):
        assert not is_correct(text, ground_truth, mode=mode), (mode, text)
        assert extract_answer(text, mode=mode) is None, (mode, text)
    assert AccuracyReward(mode="lenient")([text], ground_truth=[ground_truth]) == [0.0]


@settings(max_examples=1500, deadline=None)
@given(expr=st.one_of(st.text(max_size=80), adversarial))
def test_calculator_only_ever_raises_calculator_error(expr):
    try:
        value = safe_eval(expr)
    except CalculatorError:
        return
    assert isinstance(value, (int, float)) and not isinstance(value, bool)
    assert abs(value) <= 1e100


@settings(max_examples=500, deadline=None)
@given(a=st.integers(-10**6, 10**6), b=st.integers(-10**6, 10**6), op=st.sampled_from(["+", "-", "*"]),
       delta=st.integers(1, 1000))
def test_equation_checker_agrees_with_arithmetic(a, b, op, delta):
    true = {"+": a + b, "-": a - b, "*": a * b}[op]
    right, wrong = check_equations(f"{a} {op} {b} = {true}\n{a} {op} {b} = {true + delta}")
    assert right.ok and right.computed == true
    assert not wrong.ok and wrong.stated == true + delta


def _megabyte(pieces: list[str]) -> str:
    unit = "".join(pieces) or "x"
    return (unit * (1_000_000 // len(unit) + 1))[:1_000_000]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(pieces=st.lists(st.sampled_from(TOKENS), min_size=1, max_size=8))
def test_one_megabyte_inputs_score_fast(pieces):
    text = _megabyte(pieces)
    for reward in REWARDS:
        start = time.perf_counter()
        values = reward([text], ground_truth=["72"])
        elapsed = time.perf_counter() - start
        _check_outputs(reward.__name__, values, 1)
        assert elapsed < 1.0, f"{reward.__name__} took {elapsed:.2f}s on 1 MB of {''.join(pieces)[:40]!r}"


@pytest.mark.parametrize("unit", [
    "1", "1,234", "1+1=2\n", "1+1=2=", "a=b\n", "=", " ", "\n", "-", "$", ".", "1.", "1/", "5%", "(", "x ",
    "\\boxed{", "\\boxed{1}", "\\frac{1", "\\text{", "Final Answer: 1\n", "final", "#### 5 ", "Step 1\n",
    "48 / 2 = 24\nFinal Answer: 72\n", "9" * 65 + " ", "<think>", "1 apples * ",
    "m^2 ", "1 or ", "Final Answer: 1 or ", "Final Answer:\\boxed{1", "\\boxed{Final Answer: 1, ",
])
def test_known_worst_cases_of_one_megabyte(unit):
    text = _megabyte([unit])
    start = time.perf_counter()
    for reward in REWARDS:
        _check_outputs(reward.__name__, reward([text], ground_truth=["1"]), 1)
    check_equations(text)
    count_steps(text)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"all rewards together took {elapsed:.2f}s on 1 MB of {unit!r}"


# The answer-line grammar: any separator joined to any written form of a second answer scores 0; the plain forms of
# the one answer score 1.
SEPARATORS = [
    " or ", " / ", "...", "\u2026", "~", " ~ ", "-", " - ", " \u2013 ", " to ", "; ", " | ", ", ", " ", "\n", "\nor ",
    "\n\n", " (if rounded down) ", " (or ", " which could also be ", " => ", " -> ", " vs ", " instead of ",
    "\u200b or ", "\u202e or ", "\u2060 ", " \\text{ or } ", "** or **", " \u2248 ", " \u00b1 ", " (", "\u2028",
    " and ", " & ", " \\\\ ", " = ", " otherwise ", " but maybe ", " else ",
]
WORDS = ["nineteen", "Nineteen", "TWENTY", "twenty-one", "a dozen", "half", "three hundred", "eleventh", "XIX"]


def _second_answer(value: int, form: str, word: str) -> str:
    if form == "word":
        return word
    if form == "full-width":
        return "".join(chr(0xFF10 + int(d)) if d.isdigit() else d for d in str(value))
    if form == "math-bold":
        return "".join(chr(0x1D7CE + int(d)) if d.isdigit() else d for d in str(value))
    if form == "arabic-indic":
        return "".join(chr(0x0660 + int(d)) if d.isdigit() else d for d in str(value))
    if form == "boxed":
        return f"\\boxed{{{value}}}"
    if form == "dollars":
        return f"${value}"
    if form == "unit":
        return f"{value} apples"
    if form == "decimal":
        return f"{value}.5"
    if form == "bold":
        return f"**{value}**"
    return str(value)


@settings(max_examples=1500, deadline=None)
@given(truth=st.integers(-10**6, 10**6), delta=st.integers(1, 10**6), separator=st.sampled_from(SEPARATORS),
       form=st.sampled_from(["digits", "word", "full-width", "math-bold", "arabic-indic", "boxed", "dollars", "unit",
                             "decimal", "bold"]),
       word=st.sampled_from(WORDS), second_first=st.booleans(),
       marker=st.sampled_from(["Final Answer: ", "**Final Answer:** ", "The final answer is ", "#### ", "\\boxed{"]),
       reasoning=st.sampled_from(["", "48 / 2 = 24\n48 + 24 = 72\n"]))
def test_a_second_answer_joined_by_any_separator_scores_zero(truth, delta, separator, form, word, second_first,
                                                            marker, reasoning):
    other = _second_answer(abs(truth) + delta, form, word)
    if marker == "#### " and second_first and not other[0].isdigit() and other[0] not in "$\\*":
        marker = "Final Answer: "  # "#### nineteen" is a markdown heading: GSM8K's marker needs a number after it
    line = f"{other}{separator}{truth}" if second_first else f"{truth}{separator}{other}"
    if separator.endswith("("):
        line += ")"
    text = reasoning + marker + line + ("}" if marker == "\\boxed{" else "")
    for mode in ("strict", "lenient"):
        assert extract_answer(text, mode=mode) is None, (mode, text)
        assert not is_correct(text, str(truth), mode=mode), (mode, text)
    assert AccuracyReward()([text], ground_truth=[str(truth)]) == [0.0]


def _plain(value: int, form: str) -> str:
    if form == "thousands":
        return f"{value:,}"
    if form == "dollars":
        return f"${value}" if value >= 0 else f"-${-value}"
    if form == "unit":
        return f"{value} apples"
    if form == "full-width":
        return "".join(chr(0xFF10 + int(d)) if d.isdigit() else d for d in str(value))
    if form == "minus-sign":
        return str(value).replace("-", "\u2212")
    if form == "boxed":
        return f"\\boxed{{{value}}}"
    if form == "bold":
        return f"**{value}**"
    if form == "working":
        return f"{value - 7} + 7 = {value}"
    if form == "bracket":
        return f"{value} ({value - 7} + 7)"
    if form == "zero-width":
        return f"\u200b{value}\u200b"
    return str(value)


@settings(max_examples=1000, deadline=None)
@given(truth=st.integers(-10**6, 10**6),
       form=st.sampled_from(["digits", "thousands", "dollars", "unit", "full-width", "minus-sign", "boxed", "bold",
                             "working", "bracket", "zero-width"]),
       end=st.sampled_from(["", ".", "!", "\n", "\nCheck: 48 + 24 = 72", "\n\nI hope this helps."]),
       marker=st.sampled_from(["Final Answer: ", "**Final Answer:** ", "The final answer is ", "Final Answer:\n"]),
       reasoning=st.sampled_from(["", "48 / 2 = 24\n48 + 24 = 72\n", "Let me think.\n"]))
def test_one_plainly_written_answer_scores_one(truth, form, end, marker, reasoning):
    text = reasoning + marker + _plain(truth, form) + end
    for mode in ("strict", "lenient"):
        assert extract_answer(text, mode=mode) == str(truth), (mode, text)
        assert is_correct(text, str(truth), mode=mode) and not is_correct(text, str(truth + 1), mode=mode)
    assert AccuracyReward(mode="lenient")([text], ground_truth=[str(truth)]) == [1.0]
