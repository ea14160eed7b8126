"""Answer extraction, the shared is_correct, every reward class, the registry and `agentic-rl reward check`."""

from __future__ import annotations

import json
import sys
import textwrap
import threading

import pytest

from agentic_rl.cli import main
from agentic_rl.errors import ConfigError
from agentic_rl.rewards import (REWARDS, AccuracyReward, CombinedReward, FormatReward, LengthPenaltyReward,
                                ProcessReward, StepReward, accuracy_reward, answers_match, build_rewards,
                                completion_text, extract_answer, get_reward, is_correct, load_user_reward, parse_number,
                                parse_reward_spec)

GOOD = "48 / 2 = 24\n48 + 24 = 72\nFinal Answer: 72"

# ---------------------------------------------------------------------------------------------------------------
# Extraction: the tricky-cases table
# ---------------------------------------------------------------------------------------------------------------

TRICKY = [
    # (completion, strict answer, lenient answer)
    ("Final Answer: $1,234.50", "1234.5", "1234.5"),
    ("Final Answer: -5", "-5", "-5"),
    ("Final Answer: −5", "-5", "-5"),                       # unicode minus
    ("Final Answer: 0.5", "0.5", "0.5"),
    ("Final Answer: .5", "0.5", "0.5"),
    ("Final Answer: 72.0", "72", "72"),
    ("Final Answer: 72.", "72", "72"),                       # sentence period
    ("Final Answer: 3/4", "0.75", "0.75"),
    ("Final Answer: \\frac{3}{4}", "0.75", "0.75"),
    ("Final Answer: \\dfrac{3}{4}", "0.75", "0.75"),
    ("The answer is \\boxed{18}.", "18", "18"),
    ("so \\boxed{\\frac{3}{4}}", "0.75", "0.75"),
    ("Final Answer: \\boxed{18}", "18", "18"),              # a boxed final answer is one answer, not two
    ("Final Answer: 18 dollars", "18", "18"),
    ("Final Answer: 18 \\text{ dollars}", "18", "18"),
    ("Final Answer: 50%", "50", "50"),
    ("Final Answer: 1{,}234", "1234", "1234"),
    ("**Final Answer:** 72", "72", "72"),
    ("The final answer is 72.", "72", "72"),
    ("final answer: 72", "72", "72"),
    ("Final Answer: 48 + 24 = 72", "72", "72"),             # the number after the last "="
    ("Final Answer:\n72", "72", "72"),                      # the value on the next line
    ("#### 72", "72", "72"),
    ("#### Step 1\n4 + 4 = 8\nFinal Answer: 8", "8", "8"),  # a markdown heading is not a GSM8K final
    ("#### 1. Understand it\n4 + 4 = 8\nFinal Answer: 8", "8", "8"),
    ("#### 72 dollars", "72", "72"),
    ("#### $1,234.50", "1234.5", "1234.5"),
    ("The final answer isn't 5 yet\nFinal Answer: 8", "8", "8"),
    ("Final Answer: 5\nFinal Answer: 6", None, None),       # two conflicting final answers: no answer
    ("Final Answer: 5\n\\boxed{6}", None, None),
    ("#### 5\nFinal Answer: 6", None, None),
    ("Final Answer: 72\nFinal Answer: 72.0", "72", "72"),   # the same answer twice is one answer
    ("Final Answer: 72\nCheck: 72 - 24 = 48, and 100 more", "72", "72"),  # numbers after the final answer
    ("Final Answer: 72 apples, 3 boxes", None, None),     # a second number on the answer line: no answer
    ("", None, None),                                       # empty completion
    ("   \n  ", None, None),
    ("I think it is 18 dollars", None, "18"),               # no marker: lenient falls back to the last number
    ("48 / 2 = 24 and 48 + 24 = 72", None, "72"),
    ("it is 10-5", None, None),                             # a range or an unevaluated difference: two candidates
    ("it is 10 - 5 = 5", None, "5"),
    ("we owe -5 dollars", None, "-5"),
    ("Final Answer: seventy-two", None, None),              # a marker without a number has no answer
    ("Final Answer: \\frac{\\sqrt{2}}{2}", None, None),     # symbolic, not the 2 it starts with
    ("Final Answer: 10^6", None, None),
    ("<think>Final Answer: 5</think>\n2 + 2 = 4\nFinal Answer: 4", "4", "4"),  # closed thinking is ignored
    ("Final Answer: " + "9" * 80, None, None),              # absurdly long numbers are not answers
]


@pytest.mark.parametrize("text, strict, lenient", TRICKY)
def test_extract_answer_tricky_cases(text, strict, lenient):
    assert extract_answer(text) == strict
    assert extract_answer(text, mode="strict") == strict
    assert extract_answer(text, mode="lenient") == lenient


# Final answers that offer more than one candidate: wrong in both modes whichever candidate is the truth.
HEDGES = [
    "Final Answer: 12 or 13", "Final Answer: 13 or 12", "Final Answer: either 12 or 13", "Final Answer: 12 (or 13)",
    "Final Answer: 12 or maybe 13", "Final Answer: 12 | 13", "Final Answer: 12 / 13",             # alternatives
    "Final Answer: 12, 13", "Final Answer: 12,13", "Final Answer: 12; 13", "Final Answer: [12, 13]",
    "Final Answer: {12, 13}", "Final Answer: 12 and 13", "Final Answer: 12 apples, 13 apples",    # lists
    "Final Answer: 12-13", "Final Answer: 12–13", "Final Answer: 12 to 13", "Final Answer: between 12 and 13",
    "Final Answer: $12 - $13", "Final Answer: 12 to 13 apples",                                    # ranges
    "Final Answer: 12 ± 1", "Final Answer: 12±1", "Final Answer: 12 +/- 1", "Final Answer: 12 \\pm 1",
    "Final Answer: 12 plus or minus 1",                                                            # ±
    "Final Answer: 12 13", "Final Answer: 11 12 13", "Final Answer: 12. 13",                       # sequences
    "Final Answer: 5+7 = 12, 13", "Final Answer: 3*4 = 12 or 13", "Final Answer: 12 + 1",          # expressions
    "Final Answer: \\boxed{12, 13}", "Final Answer: \\boxed{12} or \\boxed{13}", "\\boxed{12 \\text{ or } 13}",
    "#### 12 or 13", "The final answer is 12 or 13.", "**Final Answer:** 12, 13",
    "the answer is 12 or 13", "so it is somewhere between 12 and 13", "so 12-13 apples",         # lenient fallback
]


@pytest.mark.parametrize("text", HEDGES)
def test_hedged_final_answers_are_wrong_in_both_modes(text):
    for mode in ("strict", "lenient"):
        assert extract_answer(text, mode=mode) is None
        for truth in ("12", "13", "11", "1"):
            assert not is_correct(text, truth, mode=mode), (mode, truth)
            assert not is_correct(text, truth, mode=mode, use_math_verify=True), (mode, truth)
    assert AccuracyReward(mode="lenient")([text, text], ground_truth=["12", "13"]) == [0.0, 0.0]


# What models write on a final-answer line, with the answer a person grading it reads (None: no single answer).
LABELLED = [
    ("Final Answer: 1,234", "1234"), ("Final Answer: $12", "12"), ("Final Answer: 12 apples", "12"),
    ("Final Answer: 12.50", "12.5"), ("Final Answer: -12", "-12"), ("Final Answer: 3*4 = 12", "12"),
    ("Final Answer: 48 + 24 = \\boxed{72}", "72"), ("The answer is \\boxed{72}.", "72"),
    ("Final Answer: 72, which is 48 + 24", "72"),             # working after the answer that equals it
    ("Final Answer: 2 1/2", "2.5"), ("Final Answer: 72 m^2", "72"),
    ("Final Answer: 72 (72 clips)", "72"), ("Final Answer: 72 or so", "72"), ("Final Answer: 3/4", "0.75"),
    ("The final answer is 72 clips, which Natalia sold in April and May (48 + 24).", "72"),
    ("Final Answer: 72\nCheck: 72 - 24 = 48, or 48 + 24 = 72", "72"),   # the checks are on a later line
    ("Final Answer: 42 (6 x 7)", "42"), ("Final Answer: 42 [6*7]", "42"), ("Final Answer: 72 (48 + 24)", "72"),
    ("Final Answer: 12 or 13", None), ("Final Answer: 12-13", None), ("Final Answer: 12 (or maybe 13)", None),
    ("Final Answer: 12 (±1)", None), ("Final Answer: (12, 13)", None),
    # another number on the answer line that is not working equal to the answer could be a second answer
    ("Final Answer: 72 clips in 2 months", None), ("Final Answer: 72 apples, 3 boxes", None),
    ("Final Answer: $12.50 per hour for 8 hours", None), ("Final Answer: 12 (rounded from 12.4)", None),
]


@pytest.mark.parametrize("text, label", LABELLED)
def test_final_answer_lines_read_as_a_person_reads_them(text, label):
    for mode in ("strict", "lenient"):
        assert extract_answer(text, mode=mode) == label
    if label is not None:
        assert is_correct(text, label) and is_correct(text, label, mode="lenient")


# The answer-line grammar, form by form: (completion, the answer in both modes; None: no single answer, scores 0).
# Exactly one number, in any notation, with its unit, currency, box, markup and working, is an answer; anything on
# the line (or continuing it) that could be a second answer makes it none, whatever joins the two.
GRAMMAR = [
    # one number, however written
    ("Final Answer: 18", "18"), ("Final Answer: -18", "-18"), ("Final Answer: \u221218", "-18"),
    ("Final Answer: +18", "18"), ("Final Answer: 18.", "18"), ("Final Answer: 18!", "18"),
    ("Final Answer: $18.00", "18"), ("Final Answer: 18 dollars", "18"), ("Final Answer: 18 apples.", "18"),
    ("Final Answer: 1,800", "1800"), ("Final Answer: 1,234,567.89", "1234567.89"), ("Final Answer: 50%", "50"),
    ("Final Answer: 18/19", "0.9473684210526315789473684211"),  # no spaces around the slash: a fraction
    ("Final Answer: \u00bd", "0.5"), ("Final Answer: 2\u00bd", "2.5"), ("Final Answer: 2 1/2", "2.5"),
    ("Final Answer: \uff11\uff18", "18"), ("Final Answer: \U0001d7cf\U0001d7d6", "18"),  # full-width, math bold
    ("Final Answer: \\boxed{18}", "18"), ("\\boxed{18}", "18"), ("Final Answer: **18**", "18"),
    ("**Final Answer: 18**", "18"), ("Final Answer: \u224818", "18"), ("Final Answer: 18 m\u00b2", "18"),
    ("Final Answer: 18\u200b", "18"), ("Final Answer: \u202a18\u202c", "18"),
    # working that equals the answer, brackets without a second answer, text on later lines
    ("Final Answer: 6 * 3 = 18", "18"), ("Final Answer: 2/3 = 0.67", "0.67"), ("Final Answer: x = 18", "18"),
    ("Final Answer: 18 (6 x 3)", "18"), ("Final Answer: 18 (if rounded down)", "18"),
    ("Final Answer: 18, which is 12 + 6", "18"), ("Final Answer: 18 (18 apples)", "18"),
    ("Final Answer: 18 (= 6 \u00d7 3)", "18"), ("Final Answer: 18 (12 + 6 = 18)", "18"),
    ("Final Answer: (6 x 3) = 18", "18"), ("Final Answer: 18 (= 19)", None), ("Final Answer: 18 (6 x 3 = 19)", None),
    ("Final Answer: 18 = 6 \u00d7 3", "18"), ("Final Answer: 12 = 12 + 1", None), ("Final Answer: $\\boxed{18}$", "18"),
    ("Final Answer: The total cost is $18.", "18"), ("Final Answer: 18\u00b0C", "18"), ("Final Answer: (18)", "18"),
    ("Final Answer: 18\nCheck: 6 * 3 = 18", "18"), ("Final Answer: 18\n\nExplanation: we added them.", "18"),
    ("Final Answer: 18\n- Check: it works", "18"), ("Final Answer: 18\n6 * 3 = 18", "18"),
    # a second answer in words, Roman numerals or another script
    ("Final Answer: 18 or nineteen", None), ("Final Answer: 18 or Nineteen", None),
    ("Final Answer: 18 or NINETEEN", None), ("Final Answer: nineteen or 18", None),
    ("Final Answer: 18 or twenty-one", None), ("Final Answer: 18 or a dozen", None),
    ("Final Answer: 18 and a half", None), ("Final Answer: 18 or eighteenth", None),
    ("Final Answer: 18 or XIX", None), ("Final Answer: 18 (XIX)", None),
    ("Final Answer: 18 or \u0661\u0669", None), ("Final Answer: 18 or \u5341\u4e5d", None),
    # a second answer behind invisible, control or look-alike characters
    ("Final Answer: 18\u200b or 19", None), ("Final Answer: 18\u202e or 19", None),
    ("Final Answer: 18\u00ad or 19", None), ("Final Answer: 18\x00 or 19", None), ("Final Answer: 18\u2028or 19", None),
    ("Final Answer: 18 or \uff11\uff19", None), ("Final Answer: 18 \U0001d7ed\U0001d7f5", None),
    ("Final Answer: 18 or \u00b9\u2079", None), ("Final Answer: 18\u00a0or\u00a019", None),
    # ranges and alternatives joined by any symbol or word
    ("Final Answer: 18...19", None), ("Final Answer: 18\u202619", None), ("Final Answer: 18~19", None),
    ("Final Answer: 18 ~ 19", None), ("Final Answer: 18-19", None), ("Final Answer: 18 \u2014 19", None),
    ("Final Answer: 18 to 19", None), ("Final Answer: 18 => 19", None), ("Final Answer: 18 -> 19", None),
    ("Final Answer: 18 = 19", None), ("Final Answer: 18 \u2248 19", None),
    ("Final Answer: 18 \u2264 x \u2264 19", None), ("Final Answer: 18 \u00b1 1", None),
    ("Final Answer: 18 (\u00b11)", None), ("Final Answer: 18 give or take 1", None),
    ("Final Answer: 18; 19", None), ("Final Answer: 18 | 19", None), ("Final Answer: 18, 19", None),
    ("Final Answer: 18 / 19", None), ("Final Answer: 18 \\\\ 19", None), ("Final Answer: 18 & 19", None),
    ("Final Answer: 18 vs 19", None), ("Final Answer: 18 \u2228 19", None), ("Final Answer: 18 instead of 19", None),
    ("Final Answer: 18 but 19", None), ("Final Answer: 18 if not 19", None), ("Final Answer: 18 in 19", None),
    ("Final Answer: 18 (or 19)", None), ("Final Answer: 18 (19 if rounded up)", None),
    ("Final Answer: 18 (if rounded down) 19 (otherwise)", None), ("Final Answer: 18, which could also be 19", None),
    ("Final Answer: 18 or 19.0", None), ("Final Answer: 18 or -18", None), ("Final Answer: 18 or $19", None),
    # markup: LaTeX, boxes, markdown, line breaks
    ("Final Answer: \\boxed{18}\\text{ or }19", None), ("Final Answer: \\boxed{18 \\text{ or } 19}", None),
    ("\\boxed{18} \\boxed{19}", None), ("\\boxed{18}, \\boxed{19}", None), ("Final Answer: **18** or **19**", None),
    ("Final Answer: 18 \\text{or} 19", None), ("Final Answer: 18 \\quad 19", None),
    ("Final Answer: 18\n19", None), ("Final Answer: 18\nor 19", None), ("Final Answer: 18\n\nor nineteen", None),
    ("Final Answer: 18\n(or 19)", None), ("Final Answer: 18\n\u221219", None), ("Final Answer: 18\n\\boxed{19}", None),
    ("Final Answer: 18\r19", None), ("Final Answer:\n18\nor 19", None),
    ("The answer is \\boxed{18} or 19", None), ("Final Answer: 18\nIt might also be 19.", None),
    ("Final Answer: 18\nNote: could be 19", None), ("Final Answer: 18 or n\u0456neteen", None),  # Cyrillic i
    ("Final Answer: 18 or n i n e t e e n", None), ("Final Answer: 18 or \u2169\u2168", None),  # Roman numerals
    ("we get \\boxed{18} apples, which is 6 x 3", "18"), ("\\boxed{18}, \\boxed{18}", "18"),
    ("Final Answer: 18\n\nExplanation:\n1. In April: 12 clips", "18"), ("Final Answer: 18\n\nI hope this helps!", "18"),
    ("Final Answer: 18\n   \n19", None), ("Final Answer: 18\nWait.\nOr 19", None), ("Final Answer: 18\nor\n19", None),
    ("Final Answer: 18\n\nSo the answer is 19.", None), ("Final Answer: 18ornineteen", None),
    ("Final Answer: 18 orange", "18"), ("Final Answer: 18 tons", "18"),
]


@pytest.mark.parametrize("text, label", GRAMMAR)
def test_the_answer_line_grammar(text, label):
    for mode in ("strict", "lenient"):
        assert extract_answer(text, mode=mode) == label, mode
    for truth in ("18", "19", "-18", "1", label or "18"):
        expected = label is not None and truth == label
        for mode in ("strict", "lenient"):
            assert is_correct(text, truth, mode=mode) is expected, (mode, truth)
    assert AccuracyReward()([text], ground_truth=[label or "18"]) == [1.0 if label is not None else 0.0]


# Without an answer line, lenient mode reads the last number, and a second answer beside it (in words too) still
# leaves it none.
LENIENT_FALLBACK = [
    ("so it is 18 apples", "18"), ("In one month she sold 72", "72"), ("so 72 m\u00b2", "72"),
    ("Natalia sold 48 clips in April and 24 in May, so 72 altogether", "72"),
    ("so it is 18 or nineteen", None), ("so it is eighteen or 19", None), ("the answer is 18...19", None),
    ("it is 18\u200b or 19", None), ("it is 18 (if rounded down) 19 (otherwise)", None),
    ("it is a dozen or 19", None), ("it is 19 or XIX", None), ("it is 18 or \uff11\uff19", None),
    ("48 + 24 = 72\n72", "72"), ("Natalia sold 48 clips in April\nand 24 in May\nso 72 altogether", "72"),
    ("The answer is 18\nor 19", None), ("The answer is 18\n19", None), ("it is 18\n(or nineteen)", None),
    ("so 18ornineteen", None),
]


@pytest.mark.parametrize("text, label", LENIENT_FALLBACK)
def test_the_lenient_fallback_reads_the_last_number_alone(text, label):
    assert extract_answer(text) is None
    assert extract_answer(text, mode="lenient") == label
    assert is_correct(text, label or "18", mode="lenient") is (label is not None)


def test_invisible_characters_are_every_format_and_control_character():
    """Every Unicode format character (zero-width, bidi, soft hyphen, tags...) and every control character but tab
    and the line breaks is removed before reading, so none can hide a separator."""
    import sys
    import unicodedata

    from agentic_rl.rewards.extraction import normalise_text

    kept = {"\t", "\n"}
    for code in range(sys.maxunicode + 1):
        ch = chr(code)
        if unicodedata.category(ch) in ("Cf", "Cc") and ch not in kept:
            assert normalise_text(f"1{ch}2") in ("12", "1\n2"), hex(code)
    assert normalise_text("a\r\nb\rc\u2028d\u2029e\x85f") == "a\nb\nc\nd\ne\nf"


@pytest.mark.parametrize("pred, truth, expected", [
    ("72", "72", True),
    ("72", "72.0", True),
    ("72.0", "72", True),
    ("0.5", ".5", True),
    ("0.75", "3/4", True),
    ("0.75", "\\frac{3}{4}", True),
    ("1234.5", "$1,234.50", True),
    ("1000", "1,000", True),
    ("-5", "-5", True),
    ("5", "-5", False),
    ("72", "73", False),
    ("72.0000001", "72", True),                  # within tolerance
    ("72.01", "72", False),
    ("0.3333333", "1/3", True),
    (None, "72", False),
    ("72", None, False),
    ("", "", False),
    ("Paris", "paris", True),                    # non-numeric ground truths compare as text
    ("72", "seventy-two", False),
])
def test_answers_match(pred, truth, expected):
    assert answers_match(pred, truth) is expected


def test_answers_match_tolerances():
    assert answers_match("100.5", "100", rel_tol=0.01)
    assert not answers_match("100.5", "100")
    assert answers_match("0.01", "0", abs_tol=0.1)


@pytest.mark.parametrize("text, expected", [
    ("72", 72.0), ("-5", -5.0), ("$1,234.50", 1234.5), ("3/4", 0.75), ("\\frac{3}{4}", 0.75), ("1e3", 1000.0),
    ("18 dollars", 18.0), (".5", 0.5), ("50%", 50.0), ("1 2", None), ("", None), ("abc", None), ("inf", None),
    ("nan", None), (None, None), (7, 7.0), (True, None), ("\\sqrt{2}", None),
])
def test_parse_number(text, expected):
    assert parse_number(text) == expected


def test_completion_text_accepts_strings_and_message_lists():
    assert completion_text("abc") == "abc"
    assert completion_text([{"role": "assistant", "content": "abc"}]) == "abc"
    assert completion_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                            {"role": "assistant", "content": "b"}]) == "a\nb"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "x"},
                                                              {"type": "text", "text": "y"}]}]) == "xy"
    assert completion_text({"role": "assistant", "content": "d"}) == "d"
    assert completion_text(None) == ""
    assert completion_text([]) == ""
    assert completion_text([{"role": "assistant", "content": None}]) == ""


def test_is_correct_is_the_one_comparison():
    assert is_correct(GOOD, "72")
    assert is_correct([{"role": "assistant", "content": GOOD}], 72)
    assert not is_correct(GOOD, "73")
    assert not is_correct("Final Answer: 72\nFinal Answer: 73", "72")   # hedging is never correct
    assert not is_correct("Final Answer: 72\nFinal Answer: 73", "72", mode="lenient")
    assert not is_correct("the total is 72", "72")                       # strict needs the marker
    assert is_correct("the total is 72", "72", mode="lenient")
    assert not is_correct(GOOD, None)
    with pytest.raises(ValueError, match="mode"):
        is_correct(GOOD, "72", mode="fuzzy")


# ---------------------------------------------------------------------------------------------------------------
# math-verify option
# ---------------------------------------------------------------------------------------------------------------

SYMBOLIC = "so the side is\nFinal Answer: \\frac{\\sqrt{2}}{2}"


def test_math_verify_confirms_symbolic_answers_on_the_main_thread():
    assert not is_correct(SYMBOLIC, "\\sqrt{2}/2")                       # our parser: not a number
    assert is_correct(SYMBOLIC, "\\sqrt{2}/2", use_math_verify=True)
    assert not is_correct(SYMBOLIC, "\\sqrt{3}/2", use_math_verify=True)
    assert not is_correct("Final Answer: 1\nFinal Answer: 2", "1", use_math_verify=True)  # conflicts stay wrong
    reward = AccuracyReward(use_math_verify=True)
    assert reward([SYMBOLIC, GOOD, "no answer"], ground_truth=["\\sqrt{2}/2", "72", "72"]) == [1.0, 1.0, 0.0]


def test_math_verify_works_off_the_main_thread():
    """math-verify's signal-based timeouts fail off the main thread; the check then runs in a worker process."""
    results: dict[str, object] = {}

    def work():
        try:
            results["ok"] = is_correct(SYMBOLIC, "\\sqrt{2}/2", use_math_verify=True)
            results["wrong"] = is_correct(SYMBOLIC, "\\sqrt{3}/2", use_math_verify=True)
        except Exception as exc:  # noqa: BLE001 - recorded and asserted below
            results["error"] = exc

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert results == {"ok": True, "wrong": False}


def test_math_verify_worker_that_does_not_answer_is_replaced(monkeypatch):
    from agentic_rl.rewards import extraction

    extraction._stop_worker()
    monkeypatch.setattr(extraction, "MATH_VERIFY_STARTUP_S", -9.9)  # a 0.1 s wait: the fresh worker is too slow
    results: list[bool] = []

    def work():
        results.append(extraction.math_verify_match("$\\sqrt{4}$", "2", timeout=2))
        first = extraction._mv_worker
        monkeypatch.setattr(extraction, "MATH_VERIFY_STARTUP_S", 30.0)
        results.append(extraction.math_verify_match("$\\sqrt{4}$", "2", timeout=2))
        results.append(first is None and extraction._mv_worker is not None and extraction._mv_worker.poll() is None)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=120)
    assert results == [False, True, True]  # timed out -> killed -> a fresh worker answers the next check


# ---------------------------------------------------------------------------------------------------------------
# Reward classes
# ---------------------------------------------------------------------------------------------------------------

COMPLETIONS = [
    GOOD,                                                   # correct, 2 steps, format ok
    "48 / 2 = 24\n48 + 24 = 70\nFinal Answer: 70",          # wrong answer, one wrong equation
    "Final Answer: 72",                                     # correct, no steps
    "I think 72",                                           # no marker
    "",                                                     # empty
    [{"role": "assistant", "content": GOOD}],               # a TRL message list
]
TRUTHS = ["72"] * len(COMPLETIONS)


def test_accuracy_reward():
    assert accuracy_reward(COMPLETIONS, ground_truth=TRUTHS) == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    assert AccuracyReward(mode="lenient")(COMPLETIONS, ground_truth=TRUTHS) == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert accuracy_reward.__name__ == "accuracy"
    assert accuracy_reward(["Final Answer: 72"], ground_truth="72") == [1.0]   # a single value is broadcast
    # TRL passes extra columns and trainer objects; they are ignored
    assert accuracy_reward([GOOD], ground_truth=["72"], prompts=[[]], completion_ids=[[1, 2]],
                           trainer_state=None, log_extra=None, log_metric=None) == [1.0]


def test_rewards_need_their_column():
    with pytest.raises(ConfigError, match="needs a 'ground_truth' column.*answer, question"):
        accuracy_reward([GOOD], answer=["72"], question=["q"])
    with pytest.raises(ConfigError, match="2 'ground_truth' values for 1 completions"):
        accuracy_reward([GOOD], ground_truth=["72", "1"])
    assert AccuracyReward(ground_truth_key="answer")([GOOD], answer=["72"]) == [1.0]


def test_length_penalty_reward():
    long_good = GOOD.replace("Final", "Let me also say a lot more words here.\nFinal")
    r = LengthPenaltyReward(alpha=0.01, target_length=len(GOOD))
    assert r([GOOD, long_good, "Final Answer: 70"], ground_truth=["72"] * 3) == pytest.approx(
        [1.0, 1.0 - 0.01 * (len(long_good) - len(GOOD)), 0.0])
    # never below 0 by default; floor=None lets it go negative; only_correct=False penalises wrong answers too
    assert LengthPenaltyReward(alpha=1.0, target_length=0)([GOOD], ground_truth=["72"]) == [0.0]
    assert LengthPenaltyReward(alpha=0.1, target_length=0, floor=None)([GOOD], ground_truth=["72"]) == \
        pytest.approx([1.0 - 0.1 * len(GOOD)])
    wrong = "x" * 50 + "\nFinal Answer: 1"
    assert LengthPenaltyReward(alpha=0.01, target_length=10, only_correct=False, floor=None)(
        [wrong], ground_truth=["72"]) == pytest.approx([-0.01 * (len(wrong) - 10)])
    assert LengthPenaltyReward().__name__ == "length" and LengthPenaltyReward().unit == "characters"


def test_length_penalty_counts_tokens_with_a_tokenizer():
    class WordTokenizer:  # one token per whitespace-separated word
        def encode(self, text, add_special_tokens=False):
            return text.split()

    r = LengthPenaltyReward(alpha=0.1, target_length=5, tokenizer=WordTokenizer())
    n_words = len(GOOD.split())
    assert r.unit == "tokens"
    assert r([GOOD], ground_truth=["72"]) == pytest.approx([1.0 - 0.1 * (n_words - 5)])
    by_ids = LengthPenaltyReward(alpha=0.1, target_length=5, use_completion_ids=True)
    assert by_ids([GOOD], ground_truth=["72"], completion_ids=[list(range(8))]) == pytest.approx([0.7])


def test_step_reward():
    r = StepReward(beta=0.1, max_steps=3)
    assert r(COMPLETIONS, ground_truth=TRUTHS) == pytest.approx([1.2, 0.0, 1.0, 0.0, 0.0, 1.2])
    many = "\n".join(f"{i} + 1 = {i + 1}" for i in range(10)) + "\nFinal Answer: 72"
    assert r([many], ground_truth=["72"]) == pytest.approx([1.3])                 # capped at max_steps
    padded = "\n\n\n\n\nFinal Answer: 72"
    assert r([padded], ground_truth=["72"]) == [1.0]                              # newlines are not steps
    repeated = "1 + 1 = 2\n" * 10 + "Final Answer: 72"
    assert r([repeated], ground_truth=["72"]) == pytest.approx([1.1])             # a repeated line counts once
    assert StepReward(beta=0.1, only_correct=False)([COMPLETIONS[1]], ground_truth=["72"]) == pytest.approx([0.2])


def test_format_reward():
    r = FormatReward()
    assert r(COMPLETIONS) == [1.0, 1.0, 0.5, 0.0, 0.0, 1.0]
    assert r([GOOD + "\nmore text after"]) == [0.5]
    assert r(["2 + 2 = 4\nFinal Answer: 4\nFinal Answer: 4"]) == [0.0]          # exactly one final answer
    assert r(["2 + 2 = 4\nFinal Answer: four"]) == [0.0]
    assert r(["<think>Final Answer: 3</think>2 + 2 = 4\nFinal Answer: 4"]) == [1.0]


def test_process_reward():
    r = ProcessReward()
    assert r(COMPLETIONS) == [1.0, 0.5, 0.0, 0.0, 0.0, 1.0]
    assert r(["1 + 1 = 2\n" * 20 + "2 * 3 = 7"]) == [0.5]      # repeating a correct equation does not dilute
    assert ProcessReward(no_equation_value=0.25)(["no arithmetic"]) == [0.25]
    assert r(["5 / 0 = 1\n2 + 2 = 4"]) == [0.5]                # an expression that cannot be computed is wrong


def test_combined_reward():
    combined = CombinedReward([AccuracyReward(), FormatReward(), ProcessReward()], [1.0, 0.5, 0.25])
    assert combined(COMPLETIONS[:3], ground_truth=TRUTHS[:3]) == pytest.approx(
        [1.0 + 0.5 + 0.25, 0.0 + 0.5 + 0.125, 1.0 + 0.25 + 0.0])
    parts = combined.components(COMPLETIONS[:2], ground_truth=TRUTHS[:2])
    assert parts == {"accuracy": [1.0, 0.0], "format": [1.0, 1.0], "process": [1.0, 0.5]}
    with pytest.raises(ConfigError, match="2 weights for 1 rewards"):
        CombinedReward([AccuracyReward()], [1.0, 2.0])


def test_reward_parameters_are_validated():
    with pytest.raises(ConfigError, match="mode"):
        AccuracyReward(mode="fuzzy")
    with pytest.raises(ConfigError, match="alpha"):
        LengthPenaltyReward(alpha=-1)


# ---------------------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent("""
        def brevity(completions, limit=10, **kwargs):
            return [1.0 if len(c) <= limit else 0.0 for c in completions]

        class Constant:
            def __init__(self, value=0.5):
                self.value = value
                self.__name__ = "constant"

            def __call__(self, completions, **kwargs):
                return [self.value] * len(completions)

        not_callable = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


@pytest.mark.parametrize("spec, expected", [
    ("accuracy", ("accuracy", {}, 1.0)),
    ("format:0.2", ("format", {}, 0.2)),
    ("length(alpha=0.01,target_length=300)", ("length", {"alpha": 0.01, "target_length": 300}, 1.0)),
    ("step(beta=0.05, only_correct=false):0.5", ("step", {"beta": 0.05, "only_correct": False}, 0.5)),
    ("accuracy(mode=lenient):-1", ("accuracy", {"mode": "lenient"}, -1.0)),
    ("pkg.mod:func", ("pkg.mod:func", {}, 1.0)),
    ("pkg.mod:func:0.3", ("pkg.mod:func", {}, 0.3)),
    ("pkg.mod:Cls(value=2):1e-1", ("pkg.mod:Cls", {"value": 2}, 0.1)),
])
def test_parse_reward_spec(spec, expected):
    assert parse_reward_spec(spec) == expected


def test_build_rewards_builtins_and_weights():
    funcs, weights = build_rewards(["accuracy", "format:0.2", "length(alpha=0.01,target_length=10):0.5",
                                    "accuracy(mode=lenient)"])
    assert [f.__name__ for f in funcs] == ["accuracy", "format", "length", "accuracy_2"]
    assert weights == [1.0, 0.2, 0.5, 1.0]
    assert isinstance(funcs[2], LengthPenaltyReward) and funcs[2].alpha == 0.01 and funcs[2].target_length == 10
    assert funcs[3].mode == "lenient"
    assert set(REWARDS) == {"accuracy", "length", "step", "format", "process", "judge", "reward_model"}
    assert get_reward("step", beta=0.5).beta == 0.5
    funcs, _ = build_rewards(["accuracy", "step(mode=strict)"], defaults={"mode": "lenient", "alpha": 3})
    assert funcs[0].mode == "lenient" and funcs[1].accuracy.mode == "strict"


def test_build_rewards_user_functions(user_module):
    funcs, weights = build_rewards([f"{user_module}:brevity:0.3", f"{user_module}:brevity(limit=100)",
                                    f"{user_module}:Constant(value=2)"])
    assert weights == [0.3, 1.0, 1.0]
    text = "x" * 50
    assert funcs[0]([text]) == [0.0] and funcs[1]([text]) == [1.0] and funcs[2]([text]) == [2]
    assert [getattr(f, "__name__", None) for f in funcs[:1]] == ["brevity"]
    assert funcs[1].__name__ == "brevity_2"        # renamed apart, the user's function itself is untouched
    assert load_user_reward(f"{user_module}:brevity").__name__ == "brevity"


@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown reward 'nope'.*accuracy, length, step, format, process"),
    ("length(beta=1)", "reward spec 'length\\(beta=1\\)'.*no parameter 'beta'"),
    ("length(alpha)", "parameter 'alpha' must look like key=value"),
    ("accuracy(mode=fuzzy)", "accuracy\\(mode=fuzzy\\).*mode must be one of"),
    ("format:inf", "weight must be a finite number"),
    ("format)(", "is not name"),
    ("", "is empty"),
    ("no_such_module_xyz:func", "cannot import module 'no_such_module_xyz'"),
])
def test_bad_specs_name_the_spec(spec, message):
    with pytest.raises(ConfigError, match=message):
        build_rewards([spec])


def test_bad_user_targets(user_module):
    with pytest.raises(ConfigError, match="has no attribute 'missing'"):
        build_rewards([f"{user_module}:missing"])
    with pytest.raises(ConfigError, match="not a callable"):
        build_rewards([f"{user_module}:not_callable"])
    with pytest.raises(ConfigError, match="no rewards given"):
        build_rewards([])


# ---------------------------------------------------------------------------------------------------------------
# `agentic-rl reward check`
# ---------------------------------------------------------------------------------------------------------------


def _write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_reward_check_cli(tmp_path, capsys):
    data = _write_jsonl(tmp_path / "samples.jsonl", [
        {"completion": GOOD, "ground_truth": "72"},
        {"completion": [{"role": "assistant", "content": "48 / 2 = 24\n48 + 24 = 70\nFinal Answer: 70"}],
         "ground_truth": 72},
        {"completion": "I think 72", "ground_truth": "72"},
    ])
    out = tmp_path / "scores.jsonl"
    code = main(["reward", "check", str(data), "--reward", "accuracy", "--reward", "format:0.5",
                 "--reward", "process", "--output", str(out), "--show-equations"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "accuracy" in printed and "0.5*format" in printed and "wrong: 48 + 24 = 70 (is 72)" in printed
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["accuracy"] for r in rows] == [1.0, 0.0, 0.0]
    assert [r["format"] for r in rows] == [1.0, 1.0, 0.0]
    assert [r["process"] for r in rows] == [1.0, 0.5, 0.0]
    assert [r["total"] for r in rows] == [2.5, 1.0, 0.0]
    assert [r["answer"] for r in rows] == ["72", "70", None]
    assert [r["line"] for r in rows] == [1, 2, 3]
    assert [(r["equations_ok"], r["equations"]) for r in rows] == [(2, 2), (1, 2), (0, 0)]

    # lenient mode reaches the rewards through the --mode flag
    assert main(["reward", "check", str(data), "--reward", "accuracy", "--mode", "lenient",
                 "--output", str(out)]) == 0
    assert [json.loads(line)["accuracy"] for line in out.read_text().splitlines()] == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("rows, message", [
    (['{"completion": "x", "ground_truth": "1"}', "{not json"], "line 2: malformed JSON"),
    (['{"completion": "x"}'], "line 1: missing field 'ground_truth'"),
    (['[1, 2]'], "line 1: expected a JSON object"),
    (['{"completion": 5, "ground_truth": "1"}'], "line 1: field 'completion' must be a string or a list"),
    (['{"completion": "x", "ground_truth": null}'], "line 1: field 'ground_truth' must be a number or a string"),
    ([], "no rows"),
])
def test_reward_check_bad_rows(tmp_path, capsys, rows, message):
    data = _write_jsonl(tmp_path / "bad.jsonl", rows)
    assert main(["reward", "check", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "bad.jsonl" in err and "Traceback" not in err


def test_reward_check_usage_errors(tmp_path, capsys):
    assert main(["reward", "check", str(tmp_path / "missing.jsonl")]) == 2
    assert "file not found" in capsys.readouterr().err
    data = _write_jsonl(tmp_path / "ok.jsonl", [{"completion": GOOD, "ground_truth": "72"}])
    assert main(["reward", "check", str(data), "--reward", "nope"]) == 2
    assert "unknown reward 'nope'" in capsys.readouterr().err
    assert main(["reward", "check"]) == 2
    assert "needs a file" in capsys.readouterr().err


def test_whole_numbers_compare_exactly_whatever_the_tolerance():
    assert not answers_match("1000155", "1000156")           # within rel_tol=1e-6, but a different integer
    assert not is_correct("Final Answer: 1000155", "1000156")
    assert answers_match("1000155.0", "1,000,155")


def test_format_reward_reads_inline_mentions_of_the_final_answer():
    r = FormatReward()
    assert r(["8 * 15 = 120, so the final answer is 120 pints\nFinal Answer: 120"]) == [1.0]   # agrees: fine
    assert r(["so the final answer is 5\nFinal Answer: 4"]) == [0.0]                         # disagrees: hedging
    assert r(["2 + 2 = 4\n**Final Answer:** 4"]) == [1.0]


def test_rewards_pickle_and_keep_their_names():
    """TRL logs a reward under its __name__ and may pickle reward functions (e.g. for worker processes)."""
    import pickle

    funcs, _ = build_rewards(["accuracy", "length:0.5", "step", "format:0.2", "process", "accuracy(mode=lenient)"])
    for func in funcs:
        clone = pickle.loads(pickle.dumps(func))
        assert clone.__name__ == func.__name__
        assert clone([GOOD], ground_truth=["72"]) == func([GOOD], ground_truth=["72"])


@pytest.mark.parametrize("module", ["extraction", "calculator", "functions", "registry"])
def test_docstring_examples_hold(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"agentic_rl.rewards.{module}"))
    assert result.attempted > 0 and result.failed == 0
