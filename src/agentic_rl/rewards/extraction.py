"""Answer extraction and the one parse-and-compare function shared by training rewards and evaluation.

A completion ends with ``Final Answer: N`` (see :mod:`agentic_rl.data.formats`). :func:`extract_answer` reads it
with a grammar of the answer line: exactly one number is an answer, and anything that could be a second answer makes
the line none. The grammar accepts what it describes rather than rejecting a list of known hedges.

**Normalisation.** The text is read after :func:`normalise_text`: control and invisible characters (zero-width
spaces and joiners, bidi controls, soft hyphens, variation selectors) removed, every line break a ``\\n``, Unicode
NFKC (full-width ``１８`` and mathematical digits become ``18``, ``…`` becomes ``...``), superscripts a power
(``m²`` -> ``m^2``), vulgar fractions and the fraction slash a ``/`` (``2½`` -> ``2 1/2``), ``−`` a ``-``. Text
inside a closed ``<think>...</think>`` block is ignored.

**Answer lines.** A marker opens one: ``Final Answer:`` (also ``final answer is``, ``final answer =``, any case,
markdown bold allowed), GSM8K's ``#### N`` (a number must follow; ``#### 1. Understand it`` is a heading) and LaTeX
``\\boxed{...}`` (read with the rest of its line; a box on a marker line is that line's answer, not a second one). The
line is the rest of the marker's line, or the next non-blank line when that is empty, and goes on over the lines right
after it that continue it: a line opening with a joining word or symbol (``or 19``, ``/ 19``, ``(or 19)``), a number
or a number word, or a short sentence holding one (``It might also be 19.``); a line with ``=`` is working or a check
and ends it, as does a line of prose or a longer one (``Explanation:``).

**The grammar of an answer line**, after LaTeX is undone (``\\frac{3}{4}`` -> ``3/4``, ``1{,}234``, ``\\text{...}``,
``\\pm``) and boxes unwrapped:

* *working* — everything up to the last ``=`` outside brackets (not ``=>``, ``<=``, ``>=``, ``!=``) is working and
  not read for the answer (``Final Answer: 48 + 24 = 72`` -> ``72``), unless the step just before that ``=`` is a
  bare other number (``18 = 19``);
* *the answer* — exactly one number: a sign, ``$``, thousands commas, decimals (``.5``), a fraction without spaces
  (``3/4``), a mixed number (``2 1/2``), a percent sign, with any words around it (a unit or currency word, ``about``,
  markdown ``**``, a trailing ``.``/``!``); a symbolic answer (``\\frac{\\sqrt{2}}{2}``, ``10^6``) is not the number it
  starts with. Answers are returned normalised (``"1234.5"``, ``"0.75"``, ``"-5"``, ``"72"`` for ``72.0``);
* *nothing that could be a second answer* — after the answer, each group of numbers (words and units aside) must be
  arithmetic worth the answer (``72 (48 + 24)``, ``42 [6*7]``, ``72, which is 48 + 24``, ``0.67 (2/3)``) or the answer
  repeated (``72 (72 clips)``); a unit's power (``72 m^2``) is not a number. Any other number — whatever joins it: a
  word (``or``, ``in``, ``which could also be``), a symbol (``-``, ``...``, ``~``, ``/`` with spaces, ``|``, ``±``,
  ``\\\\``, ``=>``), a bracket (``18 (if rounded down) 19 (otherwise)``) or a line break — makes the line
  hedged, and so does a number written otherwise anywhere on it: a number word in English (``nineteen``, ``a dozen``,
  ``half``, ordinals but ``second``; also in look-alike Cyrillic or Greek letters, or spaced out), a Roman numeral
  in capitals (``XIX``) or a digit of another script (``١٩``, ``十九``).

A hedged answer line, or two answer lines that state different answers, leave the completion without an answer
(``None``) in both modes, and no reading of it can be correct (math-verify included); the same answer stated twice is
one answer. A final answer followed by more text on later lines that do not continue it keeps the marked answer.

**Modes.** *strict* reads answer lines only. *lenient* reads them the same way, and only when a completion has no
answer line at all falls back to its last number (not a unit's power): hedged when the numbers before it on its line
are joined to it as candidates (``it is 12 or 13``, ``12-13``, ``12 (if rounded down) 13``), when its line goes on
with another number or a number word (``18...19``, ``18 or nineteen``), or when a number word is joined to it
(``eighteen or 19``).

**Names.** A ground truth that is text rather than a number (``"Orla Venn"``, ``"the Salmi Guild"``; not symbolic
maths) is compared with the answer line's text, exactly after normalisation: case, markdown emphasis, the surrounding
punctuation, a leading "the" and whitespace do not count (:func:`same_name`). The line must hold exactly that one
name: ``Final Answer: Orla Venn or Tavo Ruskel`` is no answer to either. A ground truth may list several accepted
answers (a list, or a string holding a JSON list such as ``'["Paris", "Paris, France"]'``): any of them counts.

All patterns are linear-time (no nested quantifiers that can backtrack) and scanning is bounded, so a 1 MB
completion is read in milliseconds.

:func:`is_correct` is THE comparison used by :class:`~agentic_rl.rewards.AccuracyReward` and by the evaluator, so the
reward a model is trained on and the accuracy we report cannot drift apart. With ``use_math_verify=True`` a
completion our parser rejects gets a second chance through Hugging Face's ``math_verify`` (symbolic answers such as
``\\frac{\\sqrt{2}}{2}``); math-verify's own timeouts use ``signal.alarm``, which only works on the main thread, so
off the main thread the check runs in a long-lived worker process that is killed when it does not answer in time.
"""

from __future__ import annotations

import math
import re
import threading
import unicodedata
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation, localcontext
from typing import Any

from agentic_rl.data.formats import accepted_answers

__all__ = [
    "completion_text", "extract_answer", "parse_number", "answers_match", "is_correct", "find_final_answers",
    "FinalAnswers", "FINAL_ANSWER_RE", "normalise_text", "accepted_answers", "is_text_answer", "same_name",
]

# Bounds that keep every function fast on adversarial input.
MAX_NUMBER_DIGITS = 64        # longer digit runs are not numbers an answer could be
MAX_MARKERS = 64              # final-answer markers read per completion (more are ignored)
MAX_SPAN_CHARS = 300          # characters read after a marker
MAX_BOXED_CHARS = 500         # characters scanned for the closing brace of \boxed{...}
MAX_WORKING_GROUPS = 16       # groups of numbers after an answer read as its working (more: not one answer)

# ---------------------------------------------------------------------------------------------------------------
# Completion text
# ---------------------------------------------------------------------------------------------------------------


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal content parts: [{"type": "text", "text": ...}, ...]
        return "".join(str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content)
    return str(content)


def completion_text(completion: Any) -> str:
    """The text of a completion: a string as is, or the assistant messages of a TRL message list joined.

    >>> completion_text([{"role": "assistant", "content": "2 + 2 = 4\\nFinal Answer: 4"}])
    '2 + 2 = 4\\nFinal Answer: 4'
    """
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, (list, tuple)):
        messages = [m for m in completion if isinstance(m, dict)]
        assistant = [m for m in messages if m.get("role") == "assistant"]
        chosen = assistant or [m for m in messages if m.get("role") is None]
        if chosen:
            return "\n".join(_content_text(m.get("content")) for m in chosen)
        if not messages:
            return "\n".join(str(m) for m in completion)
        return ""
    return str(completion)


# ---------------------------------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------------------------------

# Characters that show nothing, or steer the display, and could hide a separator between two answers: control
# characters (tab and line breaks kept), Unicode format characters (category Cf: zero-width spaces and joiners, bidi
# controls, soft hyphen, BOM, tags), variation selectors and the blank fillers of some scripts.
_INVISIBLE_RE = re.compile(
    "[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f"
    "\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u115f\u1160\u17b4\u17b5\u180b-\u180f"
    "\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f\U000e0100-\U000e01ef]"
)
_ASCII_CONTROLS = {**{code: None for code in [*range(0x00, 0x09), *range(0x0e, 0x20), 0x7f]},
                   0x0b: "\n", 0x0c: "\n", 0x0d: "\n"}
_LINE_BREAK_RE = re.compile("\r\n?|[\x0b\x0c\x85\u2028\u2029]")
_SUPERSCRIPT_RE = re.compile("[\u2070\u00b9\u00b2\u00b3\u2074-\u2079]+")
_VULGAR_FRACTION_RE = re.compile("(?<=[0-9])([\u00bc-\u00be\u2150-\u215e])")
_SUPERSCRIPT_DIGITS = str.maketrans("\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079", "0123456789")


def normalise_text(text: str) -> str:
    """Text as the answer grammar reads it: invisible and control characters removed, every line break a ``\\n``,
    Unicode NFKC (full-width and mathematical digits become ``0-9``, ``…`` becomes ``...``), a superscript a power
    (``m²`` -> ``m^2``) and the fraction slash a ``/`` (``½`` -> ``1/2``).

    >>> normalise_text("Final Answer: \\uff11\\uff18\\u200b or 19\\r\\n"), normalise_text("72 m\\u00b2")
    ('Final Answer: 18 or 19\\n', '72 m^2')
    """
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    if text.isascii():  # the common case, by translate: a 1 MB completion in about a millisecond
        return text.translate(_ASCII_CONTROLS)
    text = _INVISIBLE_RE.sub("", text)
    if not text.isascii():
        text = _SUPERSCRIPT_RE.sub(lambda m: "^" + m.group().translate(_SUPERSCRIPT_DIGITS), text)
        text = _VULGAR_FRACTION_RE.sub(r" \1", text)  # "2½" is the mixed number "2 1/2", not "21/2"
        text = unicodedata.normalize("NFKC", text).replace("\u2044", "/").replace("\u2215", "/")
        text = text.replace("\u2212", "-")
        text = _INVISIBLE_RE.sub("", text)
    return _LINE_BREAK_RE.sub("\n", text)


# ---------------------------------------------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------------------------------------------

# One number: optional sign and "$", then 1,234,567.89 | 1234.5 | .5, then an optional "/denominator" (a simple
# fraction, no spaces). Each alternative is a plain run of \d or of ",ddd" groups, so matching is linear.
NUMBER_RE = re.compile(
    r"(?=[-$.\d])(?<![\w.])"  # the lookahead lets the regex engine skip quickly to candidate characters
    r"(?P<sign>-?\$?-?)"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:/(?P<den>\d+(?:\.\d+)?)(?![\d/]))?",
    re.ASCII,
)

_LATEX_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textrm|mbox|operatorname)\s*\{([^{}]*)\}")
_LATEX_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*([\d.,]+)\s*\}", re.ASCII)
_LATEX_FRAC_SHORT_RE = re.compile(r"\\[dt]?frac(\d)(\d)", re.ASCII)
# what remains of LaTeX after _clean, or a power / root / pi: the text is symbolic, not a plain number
_SYMBOLIC_RE = re.compile(r"\\[A-Za-z]|[\^\u221a\u03c0]")
_SYMBOLIC_AFTER_RE = re.compile(r"[ \t]*(?:\\[A-Za-z]|[\^\u221a\u03c0])")
_LATEX_DROP_RE = re.compile(r"\\left|\\right|\\[,;:! ]|\\displaystyle|\\quad|\\qquad")


def _clean(text: str) -> str:
    """Undo LaTeX and typography around numbers: ``\\frac{3}{4}`` -> ``3/4``, ``1{,}234`` -> ``1,234``,
    ``−`` -> ``-``."""
    text = text.replace("\u2212", "-").replace("\u2013", "-").replace("{,}", ",")
    if "\\" in text:
        text = text.replace("\\$", "$").replace("\\%", "%").replace("\\pm", "\u00b1").replace("\\mp", "\u2213")
        text = _LATEX_DROP_RE.sub("", text)
        text = _LATEX_TEXT_RE.sub(r" \1 ", text)
        text = _LATEX_FRAC_RE.sub(r"\1/\2", text)
        text = _LATEX_FRAC_SHORT_RE.sub(r"\1/\2", text)
    return text


def _token_value(match: re.Match) -> Decimal | None:
    """The value of one NUMBER_RE match, or None (too long, or not finite)."""
    num = match.group("num").replace(",", "")
    den = match.group("den")
    if len(num) > MAX_NUMBER_DIGITS or (den and len(den) > MAX_NUMBER_DIGITS):
        return None
    try:
        value = Decimal(num)
        if den is not None:
            denominator = Decimal(den)
            if denominator != 0:
                with localcontext() as ctx:
                    ctx.prec = 28
                    value = value / denominator
    except InvalidOperation:  # pragma: no cover - the regex only admits digits
        return None
    if "-" in match.group("sign"):
        value = -value
    return value


def _normalise(value: Decimal) -> str:
    """``Decimal('72.0')`` -> ``'72'``, ``Decimal('1234.50')`` -> ``'1234.5'``, ``-0`` -> ``'0'``."""
    if value == 0:
        return "0"
    text = format(value.normalize(), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _numbers(text: str) -> list[Decimal]:
    return [v for v in (_token_value(m) for m in NUMBER_RE.finditer(text)) if v is not None]


_DIGIT_RE = re.compile(r"\d", re.ASCII)


def _last_number_match(text: str) -> re.Match | None:
    """The last readable number of ``text`` (not a unit's power such as the 2 of ``m^2``). Windows of text ending at
    the last digit not yet read are scanned from the end backwards, each character at most once, so a long
    completion is read in milliseconds."""
    reverse = text[::-1]
    end = len(text)
    while True:
        digit = _DIGIT_RE.search(reverse, len(text) - end)
        if digit is None:
            return None
        last_digit = len(text) - 1 - digit.start()
        start = max(0, last_digit - 4096)
        unit_power = None
        for m in reversed(list(NUMBER_RE.finditer(text, start, min(len(text), last_digit + 2)))):
            if (start == 0 or m.start() - start > 256) and _token_value(m) is not None:  # 256: not a cut-off tail
                if not _is_unit_power(text, m):
                    return m
                unit_power = unit_power or m
        if unit_power is not None:  # a window of nothing but powers of units: reading further back is not worth it
            return unit_power
        if start == 0:
            return None
        end = start + 256


def _last_number(text: str) -> tuple[Decimal | None, bool]:
    """(the lenient answer: the last number of ``text``, whether it is hedged). The last number is hedged when the
    numbers before it on its line are joined to it as candidates (``it is 12 or 13``, ``12-13``)."""
    last = _last_number_match(text)
    if last is None:
        return None, False
    line_start = text.rfind("\n", max(0, last.start() - MAX_SPAN_CHARS), last.start()) + 1
    line_start = max(line_start, last.start() - MAX_SPAN_CHARS)
    before = [m for m in NUMBER_RE.finditer(text, line_start, last.start()) if not _is_unit_power(text, m)]
    matches = before + [last]
    first = len(before)  # walk back while the numbers are joined as candidates (or form a mixed number)
    while first > 0 and (_joined(text, matches[first - 1], matches[first])
                         or _mixed_fraction(text, matches[first - 1], matches[first]) is not None):
        first -= 1
    line_end = text.find("\n", last.end(), last.end() + MAX_SPAN_CHARS)
    after = _UNIT_POWER_RE.sub(" ", text[last.end():line_end if line_end != -1 else last.end() + MAX_SPAN_CHARS])
    if _DIGIT_RE.search(after) or _has_number_word(after):
        return None, True  # a second answer after the last number: "18...19", "18 or nineteen"
    if line_end != -1 and _has_number_word(_with_continuation(text, line_end, "")[1]):
        return None, True  # ... or on the lines that go on from it: "18" then "(or nineteen)"
    lead = text[line_start:matches[first].start()]
    if _has_number_word(_TRAILING_JOIN_RE.sub("", lead)[-24:].rsplit(" ", 1)[-1]):
        return None, True  # a number word joined to the answer before it: "eighteen or 19"
    value, hedged = _read_candidates(text, matches[first:])
    if value is not None and first == 0 and _goes_on_from_previous_line(text, line_start, value):
        return None, True
    return value, hedged


def _goes_on_from_previous_line(text: str, line_start: int, value: Decimal) -> bool:
    """Whether the line at ``line_start`` offers a second answer to the line before it: it opens with a joining word
    or symbol, or is a bare number (``The answer is 18`` then ``or 19``, or ``19``), and the line before (after its
    last ``=``) holds another number or a number word."""
    line_end = text.find("\n", line_start, line_start + MAX_SPAN_CHARS)
    line = text[line_start:line_end if line_end != -1 else line_start + MAX_SPAN_CHARS]
    if not (_continues(line, joined_only=True) or _BARE_NUMBER_LINE_RE.fullmatch(line)):
        return False
    previous = text[max(0, line_start - MAX_SPAN_CHARS):max(0, line_start - 1)].rstrip()
    previous = previous[previous.rfind("\n") + 1:]
    equals = _last_equals(previous)
    previous = _UNIT_POWER_RE.sub(" ", previous[equals:] if equals >= 0 else previous)
    if _has_number_word(previous):
        return True
    return any(v is not None and not _same(v, value) for v in map(_token_value, NUMBER_RE.finditer(previous)))


_BARE_NUMBER_LINE_RE = re.compile(r"[ \t*_]*\$?-?\$?[\d.,/]+[ \t*_.!]*")


# Joining words and marks at the end of the text before a number ("eighteen or ", "a dozen - ").
_TRAILING_JOIN_RE = re.compile(r"(?:[\W_]|\b(?:or|and|to|maybe|perhaps|possibly|else|otherwise|vs|versus)\b)*$",
                               re.IGNORECASE)


def _is_unit_power(text: str, m: re.Match) -> bool:
    """Whether the number is the power of a unit: the ``2`` of ``72 m^2`` or ``m^{2}``."""
    i = m.start()
    if text[i - 1:i] == "{":
        i -= 1
    return i >= 2 and text[i - 1] == "^" and text[i - 2].isalpha()


# Words that join candidate answers instead of explaining one answer: "12 or 13", "between 12 and 13", "12 to 13",
# "12 plus or minus 1", "about 12 or maybe 13".
_HEDGE_WORDS = frozenset("""or and to through thru between either maybe perhaps possibly probably about approximately
approx around roughly nearly almost else otherwise alternatively plus minus vs versus""".split())
# Words that may follow a number and then go on to explain it rather than name its unit ("72 in 2 months").
_FUNCTION_WORDS = frozenset("""in of for per on at with from is are was were each every after before the a an which
that because since so than then when if but as by into out left more less fewer times over under""".split())
_WORD_RE = re.compile(r"[^\W\d_]+")
_ASIDE_RE = re.compile(r"\([^()\d]*\)|\[[^\[\]\d]*\]")
MAX_GLUE_CHARS = 60  # longer text between two numbers is prose, not a connector


def _joins_candidates(glue: str) -> bool:
    """Whether the text between two numbers joins them as candidates: only joining words (``or``, ``to``...) and
    symbols (any but ``=``: ``,``, ``-``, ``±``, ``/``, ``≈``...), perhaps after the first number's unit (``12 apples
    or 13``)."""
    if len(glue) > MAX_GLUE_CHARS or "\n" in glue or "=" in glue:
        return False
    glue = _ASIDE_RE.sub(" ", glue)  # "18 (if rounded down) 19": an aside without numbers joins like a space
    words = list(_WORD_RE.finditer(glue))
    if words and not glue[:words[0].start()].strip(" \t%$") and words[0].group().lower() not in _FUNCTION_WORDS:
        words = words[1:]  # the first number's unit
    if any(w.group().lower() not in _HEDGE_WORDS for w in words):
        return False
    return not any(ch.isalnum() for ch in _WORD_RE.sub("", glue))


_UNIT_RE = re.compile(r"[ \t]*%?[ \t]*([^\W\d_]+)")


def _unit(text: str, m: re.Match) -> str | None:
    """The unit word right after a number (``apples`` -> ``apple``), or None."""
    word = _UNIT_RE.match(text, m.end())
    if word is None or word.group(1).lower() in _FUNCTION_WORDS or word.group(1).lower() in _HEDGE_WORDS:
        return None
    return word.group(1).lower().rstrip("s")


# Words that make a bracket after an answer an alternative (``12 (or 13)``) rather than its working (``42 (6 x 7)``).
_BRACKET_HEDGE_WORDS = frozenset("""or either maybe perhaps possibly probably alternatively otherwise else between
about approximately approx around roughly nearly almost""".split())


def _explains(text: str, opened: int) -> bool:
    """Whether the bracket opened at ``opened`` holds working (``(6 x 7)``, ``[48 + 24]``): no hedge word, no ±."""
    closing = ")" if text[opened] == "(" else "]"
    end = text.find(closing, opened, opened + 2 * MAX_GLUE_CHARS)
    content = text[opened + 1:end if end >= 0 else opened + 2 * MAX_GLUE_CHARS]
    words = {w.lower() for w in _WORD_RE.findall(content)}
    return not (words & _BRACKET_HEDGE_WORDS or "\u00b1" in content or "\u2213" in content or "\\pm" in content)


def _joined(text: str, a: re.Match, b: re.Match) -> bool:
    """Whether numbers ``a`` and ``b`` are offered as candidates for one answer: joined by connectors only, and not
    two different quantities (``72 apples, 3 boxes`` names the boxes too; ``12 apples or 13 apples`` hedges). A number
    in a bracket after the answer is its working (``42 (6 x 7)``) unless the bracket hedges (``12 (or 13)``)."""
    glue = text[a.end():b.start()]
    if not _joins_candidates(glue):
        return False
    opened = max(glue.rfind("("), glue.rfind("["))
    if opened >= 0 and max(glue.rfind(")"), glue.rfind("]")) < opened and _explains(text, a.end() + opened):
        return False
    unit_a, unit_b = _unit(text, a), _unit(text, b)
    return unit_a is None or unit_b is None or unit_a == unit_b


def _mixed_fraction(text: str, whole: re.Match, fraction: re.Match) -> Decimal | None:
    """The value of a mixed number such as ``2 1/2`` (a whole number, one space, a proper fraction), else None."""
    if (text[whole.end():fraction.start()] != " " or whole.group("den") is not None or "." in whole.group("num")
            or fraction.group("den") is None or fraction.group("sign")):
        return None
    whole_value, part = _token_value(whole), _token_value(fraction)
    if whole_value is None or part is None or not 0 < part < 1:
        return None
    return whole_value - part if whole_value < 0 or "-" in whole.group("sign") else whole_value + part


def _read_candidates(text: str, matches: list[re.Match]) -> tuple[Decimal | None, bool]:
    """(value, hedged) of an answer that starts with ``matches[0]``: the numbers that follow it joined as candidates
    must all have its value, else the answer is hedged."""
    value = _token_value(matches[0])
    if value is None:
        return None, False
    previous = matches[0]
    for n, m in enumerate(matches[1:]):
        mixed = _mixed_fraction(text, previous, m) if n == 0 else None
        if mixed is not None:
            value, previous = mixed, m
            continue
        if not _joined(text, previous, m):
            break
        other = _token_value(m)
        if other is None or not _same(other, value):
            return None, True
        previous = m
    return value, False


def parse_number(s: Any) -> float | None:
    """The value of a string holding one number (``"$1,234.50"``, ``"3/4"``, ``"\\frac{3}{4}"``, ``"18 dollars"``,
    ``"1e3"``), else None (no number, several numbers, not finite).

    >>> parse_number("$1,234.50"), parse_number("3/4"), parse_number("1 2")
    (1234.5, 0.75, None)
    """
    if s is None or isinstance(s, bool):
        return None
    if isinstance(s, (int, float)):
        return float(s) if math.isfinite(s) else None
    text = str(s).strip()
    if not text or len(text) > 10_000:
        return None
    text = normalise_text(text).strip()
    if not text:
        return None
    try:  # plain Python floats first: "1e3", "72.0"
        value = float(text)
        return value if math.isfinite(value) else None
    except ValueError:
        pass
    cleaned = _clean(text)
    numbers = _numbers(cleaned)
    if len(numbers) != 1 or _SYMBOLIC_RE.search(cleaned):
        return None
    value = float(numbers[0])
    return value if math.isfinite(value) else None


def answers_match(pred: str | None, truth: Any, rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> bool:
    """True when ``pred`` and ``truth`` are the same number: equal when both are whole numbers, else within the
    relative or absolute tolerance.

    Non-numeric ground truths fall back to a case-insensitive comparison of the stripped strings.

    >>> answers_match("72", "72.0"), answers_match("0.75", "3/4"), answers_match("73", "72"), answers_match(None, "1")
    (True, True, False, False)
    """
    if pred is None or truth is None:
        return False
    p, t = parse_number(pred), parse_number(truth)
    if p is not None and t is not None:
        if p.is_integer() and t.is_integer() and max(abs(p), abs(t)) < 2**53:
            return p == t  # whole numbers are exact: 1000155 is not 1000156, whatever the relative tolerance
        return math.isclose(p, t, rel_tol=rel_tol, abs_tol=abs_tol)
    if p is None and t is None:
        a, b = _plain(str(pred)), _plain(str(truth))
        return bool(a) and a == b
    return False


def _plain(text: str) -> str:
    return re.sub(r"\s+", "", text[:10_000]).strip("$.").lower()


# ---------------------------------------------------------------------------------------------------------------
# Final-answer markers
# ---------------------------------------------------------------------------------------------------------------

# "Final Answer: 72", "**Final Answer:** 72", "final answer is 72", "Final answer = 72".
FINAL_ANSWER_RE = re.compile(r"final[ \t]*answer[ \t*_]*(?:is\b(?!['\u2019])|[:=\uff1a])[ \t*_]*", re.IGNORECASE)
# GSM8K's "#### 72", when a number follows, so markdown headings ("#### Step 1", "#### Three cases") are not answers
_HASH_RE = re.compile(r"####[ \t]*(?=\S)")
_NUMBER_START_RE = re.compile(r"[*_ \t]*[-$\\.\d]")
# ... and not a numbered markdown heading: "#### 1. Understand the problem", "#### 2 Compute the total".
_HASH_HEADING_RE = re.compile(r"\d{1,2}(?:[.):][ \t]*|[ \t]+)[A-Z][a-z]", re.ASCII)
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)[ \t]*\{")


@dataclass
class FinalAnswers:
    """What the markers of one completion say. ``spans`` are the raw answer texts; ``values`` their numbers."""

    spans: list[str] = field(default_factory=list)
    values: list[Decimal | None] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    hedged: list[bool] = field(default_factory=list)  # the span offers several candidates ("12 or 13")

    @property
    def distinct(self) -> list[Any]:
        """The different answers stated (numbers compared by value, unparseable spans by their text)."""
        seen: list[Any] = []
        for span, value in zip(self.spans, self.values):
            key: Any = value if value is not None else _plain(span)
            if not any(_same(key, other) for other in seen):
                seen.append(key)
        return seen

    @property
    def conflict(self) -> bool:
        return len(self.distinct) > 1

    @property
    def value(self) -> Decimal | None:
        """The one answer, when the markers agree on a number; None if absent, conflicting or not a number."""
        distinct = self.distinct
        return distinct[0] if len(distinct) == 1 and isinstance(distinct[0], Decimal) else None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9) or a == b
    return a == b


def _line_after(text: str, start: int) -> tuple[int, int, str]:
    """(start, end, text) of the rest of the line from ``start`` (bounded); if blank, of the next non-blank line."""
    end = text.find("\n", start, start + MAX_SPAN_CHARS)
    stop = end if end != -1 else min(len(text), start + MAX_SPAN_CHARS)
    if text[start:stop].strip() or end == -1:
        return start, stop, text[start:stop].strip()
    nxt, stop = _next_line(text, end)
    return nxt, stop, text[nxt:stop].strip()


def _next_line(text: str, newline: int) -> tuple[int, int]:
    """(start, end) of the first non-blank line after the line break at ``newline`` (bounded by MAX_SPAN_CHARS)."""
    nxt = newline + 1
    limit = min(len(text), nxt + MAX_SPAN_CHARS)
    while nxt < limit and text[nxt].isspace():
        nxt += 1
    end = text.find("\n", nxt, limit)
    return nxt, end if end != -1 else limit


MAX_CONTINUATION_LINES = 3  # lines after an answer line read as part of it ("Final Answer: 18\nor 19")
MAX_CONTINUATION_WORDS = 6  # a line after an answer line that holds a number in at most this many words continues it
_CONTINUATION_START_RE = re.compile(r"[ \t*_>#]*(?:[-\u2013\u2014\u2022][ \t]+)?"  # markup, a bullet
                                    r"(?:([^\W\d_]+)|(\$?-?\$?\d)|[,;:|/\\~+&(\[{]|\.\.)")


def _continues(line: str, joined_only: bool = False) -> bool:
    """Whether a line after an answer line goes on with that answer rather than starting working or prose: it opens
    with a joining word or symbol (``or 19``, ``/ 19``, ``(or 19)``), a number or a number word (``19``,
    ``nineteen``), or is a short sentence holding one (``It might also be 19.``). With ``joined_only`` (after a line
    of prose) only the first kind counts: ``Wait.`` then ``Or 19``, but not a numbered list after ``Explanation:``."""
    m = _CONTINUATION_START_RE.match(line)
    if m is not None and m.group(2) is None and (m.group(1) is None or m.group(1).lower() in _HEDGE_WORDS):
        return True
    if joined_only:
        return False
    if m is not None and m.group(1) is not None and _has_number_word(m.group(1)):
        return True
    if m is not None and m.group(2) is not None:
        return True
    return (len(_ANY_WORD_RE.findall(line)) <= MAX_CONTINUATION_WORDS
            and (bool(_DIGIT_RE.search(line)) or _has_number_word(line)))


def _with_continuation(text: str, stop: int, span: str) -> tuple[int, str]:
    """The answer line's end and text, extended over the lines that continue it (see :func:`_continues`): at most
    ``MAX_CONTINUATION_LINES`` lines are looked at; a line with ``=`` (working, a check) or another line with a number
    ends the answer; a line of prose without one is passed over."""
    joined_only, position = False, stop
    for _ in range(MAX_CONTINUATION_LINES):
        if position >= len(text) or text[position] != "\n":
            break
        nxt, end = _next_line(text, position)
        line = text[nxt:end]
        if not line.strip() or "=" in line:
            break
        if _continues(line, joined_only):
            span, stop, joined_only = f"{span} {line.strip()}", end, False
        elif _DIGIT_RE.search(line) or _has_number_word(line):
            break
        else:
            joined_only = True
        position = end
    return stop, span


def _unbox(text: str, depth: int = 0) -> str:
    """``text`` with each ``\\boxed{X}`` replaced by ``X`` (boxes in boxes too), so a box is read together with what
    stands around it."""
    boxes = _boxed_contents(text)
    if not boxes:
        return text
    out, pos = [], 0
    for start, content in boxes:
        if start < pos:  # a box inside a box: unwrapped with its content below
            continue
        out += [text[pos:start], " ", content, " "]
        pos = text.index("{", start) + 1 + len(content) + 1
    text = "".join(out) + text[pos:]
    return _unbox(text, depth + 1) if depth < 3 and _BOXED_RE.search(text) else text


# Words that are numbers (a second answer written in words: "18 or nineteen", "a dozen", "18 and a half"). "second"
# and "quarter" are left out: "18 seconds" and "18 quarters" name units.
_NUMBER_WORDS = frozenset("""zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen
fifteen sixteen seventeen eighteen nineteen twenty thirty forty fourty fifty sixty seventy eighty ninety hundred
hundreds thousand thousands million millions billion billions trillion trillions dozen dozens score half halves twice
thrice first third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth fourteenth fifteenth
sixteenth seventeenth eighteenth nineteenth twentieth thirtieth fortieth fiftieth sixtieth seventieth eightieth
ninetieth hundredth thousandth millionth none""".split())
# Roman numerals of two letters or more, in capitals ("XIX"; a lone "I", "V" or "L" is a word or a unit).
_ROMAN_RE = re.compile(r"M{0,3}(?:CM|CD|D?C{0,3})(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3})")
_ANY_WORD_RE = re.compile(r"[^\W\d_]+")


# Cyrillic and Greek letters that look like Latin ones, read as those in number words ("nіneteen" with a Cyrillic і).
_LOOKALIKES = str.maketrans(
    "\u0430\u0435\u0451\u0456\u0457\u0458\u043a\u043e\u0440\u0441\u0443\u0445\u0455\u0501\u04bb\u0261"
    "\u03bd\u03bf\u03b9\u03b1\u03b5\u03ba\u03c1\u03c5\u03c7\u03b7\u0442\u043d\u043c\u0432",
    "aeeiijkopcyxsdhgvoiaekpuxntnmb")
# A number word glued to a joining word ("18ornineteen").
_GLUED_NUMBER_WORD_RE = re.compile(
    r"(?:or|and|to|vs|else|maybe)(?:{})".format("|".join(sorted(_NUMBER_WORDS, key=len, reverse=True))), re.IGNORECASE)
# Single letters spaced out ("n i n e t e e n", "o-n-e"), read as one word.
_SPACED_LETTERS_RE = re.compile(r"(?<![^\W\d_])(?:[^\W\d_][ \t.\-_*]{1,3}){2,}[^\W\d_](?![^\W\d_])")
_SPACING_RE = re.compile(r"[ \t.\-_*]")


def _is_number_word(word: str) -> bool:
    if _GLUED_NUMBER_WORD_RE.fullmatch(word):
        return True
    if word.lower() in _NUMBER_WORDS or (len(word) > 1 and word.isupper() and _ROMAN_RE.fullmatch(word)):
        return True
    if word.isascii():
        return False
    return any(ch.isnumeric() for ch in word) or word.lower().translate(_LOOKALIKES) in _NUMBER_WORDS


def _has_number_word(text: str) -> bool:
    """Whether ``text`` writes a number other than in ASCII digits: a number word (also spelled with look-alike
    letters or spaced out), a Roman numeral, or a digit or numeral of another script (``١٩``, ``十九``)."""
    if any(_is_number_word(word) for word in _ANY_WORD_RE.findall(text)):
        return True
    if any(_is_number_word(_SPACING_RE.sub("", m.group())) for m in _SPACED_LETTERS_RE.finditer(text)):
        return True
    return not text.isascii() and any(ch.isnumeric() and not ch.isascii() for ch in text)


# The "=" that separates working from the answer; not part of "=>", "<=", ">=", "!=" ("18 => 19" is an arrow).
_EQUALS_RE = re.compile(r"(?<![<>!=])=(?![>=])|==")
_UNIT_POWER_RE = re.compile(r"(?<=[^\W\d_])\^(?:\{\d{1,3}\}|\d{1,3})")
# Text between numbers that may form arithmetic with them ("48 + 24", "(6 x 7)"): everything else separates.
_NOT_ARITHMETIC_RE = re.compile(r"[^\d.,+\-*/()\[\]{}^$%x\u00d7\u00f7 \t]+")
_WORKING_WORD_RE = re.compile(r"(?<![\d)\]}\s])x|x(?![\s\d(\[{.$])|[^\W\d_x]+")


def _last_equals(text: str) -> int:
    """The end of the last ``=`` outside brackets (``18 (= 6 x 3)`` is working after the answer), or -1."""
    position = -1
    for m in _EQUALS_RE.finditer(text):
        before = text[:m.start()]
        if before.count("(") + before.count("[") <= before.count(")") + before.count("]"):
            position = m.end()
    return position


def _rounds_to(value: float, answer: Decimal) -> bool:
    """Whether ``value`` is ``answer`` or rounds to it at the answer's decimals (``2/3`` -> ``0.67``)."""
    target = float(answer)
    if math.isclose(value, target, rel_tol=1e-9, abs_tol=1e-9):
        return True
    decimals = max(0, -answer.as_tuple().exponent) if isinstance(answer.as_tuple().exponent, int) else 0
    return 0 < decimals <= 12 and round(value, decimals) == round(target, decimals)


def _tail_is_working(tail: str, answer: Decimal) -> bool:
    """Whether the text after the answer holds no second answer: each group of numbers in it is arithmetic with the
    answer's value (``(48 + 24)``, ``which is 6 x 7``) or the answer repeated (``(72 clips)``); a unit's power
    (``m^2``) is not a number."""
    from agentic_rl.rewards.calculator import CalculatorError, safe_eval

    tail = _UNIT_POWER_RE.sub(" ", tail)
    if not _DIGIT_RE.search(tail):
        return True
    tail = _WORKING_WORD_RE.sub(" ", tail)  # words (units, prose) separate nothing: "48 clips + 24 clips"
    groups = [g for g in (g.strip(" \t.,") for g in _NOT_ARITHMETIC_RE.split(tail)) if _DIGIT_RE.search(g)]
    if len(groups) > MAX_WORKING_GROUPS:
        return False
    for group in groups:
        single = NUMBER_RE.fullmatch(group)
        if single is not None:  # one number: the answer repeated, or a second answer
            value = _token_value(single)
            if value is None or not _same(value, answer):
                return False
            continue
        expression = group.replace("[", "(").replace("]", ")").replace("{", "(").replace("}", ")")
        if expression.count("(") != expression.count(")"):  # "(= 6 x 3)" splits at its "="
            expression = expression.replace("(", " ").replace(")", " ").strip()
        try:
            if _rounds_to(float(safe_eval(expression)), answer):
                continue
        except (CalculatorError, ArithmeticError, ValueError, TypeError):
            pass
        values = [_token_value(m) for m in NUMBER_RE.finditer(expression)]
        if not values or len(values) != len(_DIGIT_RUN_RE.findall(expression)):
            return False  # digits that are not a number this grammar reads ("...19")
        if not all(v is not None and _same(v, answer) for v in values):
            return False
    return True


_DIGIT_RUN_RE = re.compile(r"\d+(?:[.,]\d+)*|\.\d+", re.ASCII)


def _span_value(span: str) -> tuple[Decimal | None, bool]:
    """(value, hedged) of a final answer's text, read by the answer grammar: the working up to the last ``=``, then
    exactly one number (a mixed number, a fraction, ``\\boxed{}`` around it, its unit, its currency), then nothing
    that could be a second answer (see the module docstring)."""
    cleaned = _unbox(_clean(span))
    equals = _last_equals(cleaned)
    if equals < 0:
        return _answer_value(cleaned, "")
    value, hedged = _answer_value(cleaned[equals:], cleaned[:equals])
    if hedged:  # "18 = 6 x 3": the answer first, then working worth it
        whole, whole_hedged = _answer_value(cleaned, "")
        if whole is not None and not whole_hedged:
            return whole, False
    return value, hedged


def _answer_value(cleaned: str, working: str) -> tuple[Decimal | None, bool]:
    """(value, hedged) of the answer part of a cleaned answer line, after its ``working`` (the text up to its last
    ``=``, or empty)."""
    if _has_number_word(cleaned):
        return None, True
    matches = [m for m in NUMBER_RE.finditer(cleaned) if not _is_unit_power(cleaned, m)]
    if not matches:
        return None, bool(_DIGIT_RE.search(_UNIT_POWER_RE.sub(" ", cleaned)))
    first = matches[0]
    # "\frac{\sqrt{2}}{2}", "10^6", "2\pi": a symbolic answer, not the number it starts with
    if _SYMBOLIC_RE.search(cleaned, 0, first.start()) or _SYMBOLIC_AFTER_RE.match(cleaned, first.end()):
        return None, False
    if _DIGIT_RE.search(cleaned, 0, first.start()):
        return None, True  # digits before the first number ("19...18"): not a number the grammar reads
    value, end = _token_value(first), first.end()
    if value is None:
        return None, False
    if len(matches) > 1:
        mixed = _mixed_fraction(cleaned, first, matches[1])
        if mixed is not None:
            value, end = mixed, matches[1].end()
    if not _tail_is_working(cleaned[end:], value):
        return None, True
    if working and not _equals_step_is_working(working, value):
        return None, True
    return value, False


def _equals_step_is_working(working: str, answer: Decimal) -> bool:
    """Whether the text before the answer's ``=`` is working, not a bare other number (``18 = 19`` offers two)."""
    step = _EQUALS_RE.split(working.rstrip("=<>! \t"))[-1]
    if not _DIGIT_RE.search(step) and _has_number_word(step):
        return False  # "nineteen = 18", "a dozen = 18": a number in words is not working the grammar can check
    step = _WORKING_WORD_RE.sub(" ", _UNIT_POWER_RE.sub(" ", step)).strip(" \t.,:$%*_()[]{}'\"")
    bare = NUMBER_RE.fullmatch(step)
    if bare is None:
        return True
    value = _token_value(bare)
    return value is None or _rounds_to(float(value), answer)


_BRACE_RE = re.compile(r"[{}]")


def _boxed_contents(text: str) -> list[tuple[int, str]]:
    """(position, content) of each ``\\boxed{...}`` (braces matched, bounded; only the braces are visited)."""
    out = []
    for n, m in enumerate(_BOXED_RE.finditer(text)):
        if n >= MAX_MARKERS:
            break
        depth = 1
        for brace in _BRACE_RE.finditer(text, m.end(), min(len(text), m.end() + MAX_BOXED_CHARS)):
            depth += 1 if brace.group() == "{" else -1
            if depth == 0:
                out.append((m.start(), text[m.end():brace.start()]))
                break
    return out


def _strip_thinking(text: str) -> str:
    close = text.rfind("</think>")
    return text[close + len("</think>"):] if close != -1 else text


def find_final_answers(text: str) -> FinalAnswers:
    """Every final-answer marker of ``text`` (``Final Answer:``, ``####``, ``\\boxed{}``) with its span and value."""
    return _find_final_answers(normalise_text(text))


def _find_final_answers(text: str) -> FinalAnswers:
    """:func:`find_final_answers` of a text already normalised."""
    text = _strip_thinking(text)
    found: list[tuple[int, str]] = []
    covered: list[tuple[int, int]] = []  # a \boxed{} inside a "Final Answer:" line is the same answer, not a second
    for regex in (FINAL_ANSWER_RE, _HASH_RE):
        for n, m in enumerate(regex.finditer(text)):
            if n >= MAX_MARKERS:
                break
            start, stop, span = _line_after(text, m.end())
            if regex is _HASH_RE and (_HASH_HEADING_RE.match(span) or not _NUMBER_START_RE.match(span)):
                continue  # "#### 1. Understand the problem" is a markdown heading, not GSM8K's "#### 72"
            stop, span = _with_continuation(text, stop, span)
            found.append((m.start(), span))
            covered.append((start, stop))
    for pos, content in _boxed_contents(text):
        if not any(start <= pos < stop for start, stop in covered):
            # a box is read with the rest of its line: "\boxed{18} or 19" offers two answers
            box_end = text.index("{", pos) + len(content) + 2
            stop = text.find("\n", box_end, box_end + MAX_SPAN_CHARS)
            stop = stop if stop != -1 else min(len(text), box_end + MAX_SPAN_CHARS)
            stop, span = _with_continuation(text, stop, text[pos:stop].strip())
            found.append((pos, span))
            covered.append((pos, stop))  # the boxes later on its line are read with it
    found.sort(key=lambda item: item[0])
    result = FinalAnswers()
    for pos, span in found:
        if not span:
            continue
        value, hedged = _span_value(span)
        result.positions.append(pos)
        result.spans.append(span)
        result.values.append(value)
        result.hedged.append(hedged)
    return result


def _extract(text: str, mode: str) -> tuple[Decimal | None, FinalAnswers, bool]:
    """(answer, the markers found, whether the answer offered several candidates) of a normalised text."""
    finals = _find_final_answers(text)
    if finals.spans or mode == "strict":
        return finals.value, finals, any(finals.hedged)
    value, hedged = _last_number(_clean(_strip_thinking(text)))
    return value, finals, hedged


def extract_answer(text: Any, mode: str = "strict") -> str | None:
    """The final answer of a completion as a normalised number string, or None.

    >>> extract_answer("48 / 2 = 24\\n48 + 24 = 72\\nFinal Answer: 72")
    '72'
    >>> extract_answer("Final Answer: $1,234.50"), extract_answer("The answer is \\\\boxed{\\\\frac{3}{4}}")
    ('1234.5', '0.75')
    >>> extract_answer("so we get 18 dollars"), extract_answer("so we get 18 dollars", mode="lenient")
    (None, '18')
    >>> extract_answer("Final Answer: 5\\nFinal Answer: 6") is None  # two different answers: no answer
    True
    >>> extract_answer("Final Answer: 12 or 13", mode="lenient") is None  # several candidates: no answer
    True
    """
    if mode not in ("strict", "lenient"):
        raise ValueError(f"mode must be 'strict' or 'lenient', got {mode!r}")
    value, _, _ = _extract(normalise_text(completion_text(text)), mode)
    return None if value is None else _normalise(value)


# ---------------------------------------------------------------------------------------------------------------
# The shared parse-and-compare
# ---------------------------------------------------------------------------------------------------------------


def is_correct(completion: Any, ground_truth: Any, mode: str = "strict", use_math_verify: bool = False,
               rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> bool:
    """Whether a completion's final answer equals the ground truth. Never raises on any completion text.

    Used by :class:`~agentic_rl.rewards.AccuracyReward` and by evaluation alike. A ground truth that is a name
    (:func:`is_text_answer`) is compared by :func:`same_name`; one that lists several answers
    (:func:`accepted_answers`) accepts any of them.

    >>> is_correct("48 + 24 = 72\\nFinal Answer: 72", "72"), is_correct("Final Answer: 73", "72")
    (True, False)
    """
    if mode not in ("strict", "lenient"):
        raise ValueError(f"mode must be 'strict' or 'lenient', got {mode!r}")
    accepted = accepted_answers(ground_truth)
    if len(accepted) > 1:  # several accepted answers: any of them
        return any(is_correct(completion, truth, mode, use_math_verify, rel_tol, abs_tol) for truth in accepted)
    ground_truth = accepted[0] if accepted else ground_truth
    text = normalise_text(completion_text(completion))
    value, finals, hedged = _extract(text, mode)
    if finals.conflict or ground_truth is None:
        return False
    if is_text_answer(ground_truth):  # a name: the answer line is exactly it (an exact name cannot be a hedge)
        return bool(finals.spans) and same_name(finals.spans[0], str(ground_truth))
    if hedged:
        return False
    if value is not None and answers_match(_normalise(value), str(ground_truth), rel_tol, abs_tol):
        return True
    if not use_math_verify:
        return False
    if finals.spans:
        candidate = finals.spans[0]
    elif mode == "lenient":
        candidate = _strip_thinking(text)[-MAX_SPAN_CHARS:]
    else:
        return False
    return math_verify_match(candidate, str(ground_truth))


# ---------------------------------------------------------------------------------------------------------------
# Names and other short text answers
# ---------------------------------------------------------------------------------------------------------------

_LETTER_RE = re.compile(r"[^\W\d_]")
_MARKUP_RE = re.compile(r"[*_`]+")
_EDGE_PUNCTUATION = " \t\n\"'.,;:!?()[]{}<>«»“”‘’"


def is_text_answer(ground_truth: Any) -> bool:
    """Whether a ground truth is a name or other text (has a letter, is not a number, not symbolic maths):
    compared by :func:`same_name`."""
    truth = str(ground_truth)
    return bool(_LETTER_RE.search(truth)) and parse_number(truth) is None and not _SYMBOLIC_RE.search(truth)


def name_key(text: str) -> str:
    """A name as compared: normalised text, markdown emphasis removed, case folded, the surrounding punctuation
    and a leading "the" dropped, whitespace collapsed (``"**The Salmi Guild.**"`` -> ``"salmi guild"``)."""
    key = " ".join(_MARKUP_RE.sub("", normalise_text(text[:MAX_SPAN_CHARS])).casefold().split())
    key = key.strip(_EDGE_PUNCTUATION)
    if key.startswith("the "):
        key = key[4:].lstrip(_EDGE_PUNCTUATION)
    return key


def same_name(answer: str, truth: str) -> bool:
    """Whether a final answer's text is exactly the name ``truth`` after :func:`name_key`: the answer line holds
    that one name and nothing else ("Orla Venn or Tavo Ruskel" is not "Orla Venn")."""
    key = name_key(answer)
    return bool(key) and key == name_key(truth)


# ---------------------------------------------------------------------------------------------------------------
# math-verify (optional second opinion for symbolic answers)
# ---------------------------------------------------------------------------------------------------------------

MATH_VERIFY_TIMEOUT = 2           # seconds per math-verify parse / verify call (whole seconds: signal.alarm)
MATH_VERIFY_MAX_CHARS = 1000      # longer candidate texts are cut to their end
MATH_VERIFY_STARTUP_S = 30.0      # extra wait for the worker process (its start-up imports sympy)

_mv_lock = threading.Lock()
_mv_worker: Any = None  # the subprocess.Popen of agentic_rl.rewards._math_verify_worker, started on first use


def _math_verify_compare(candidate: str, truth: str, timeout: int | None) -> bool:
    """math-verify in the current thread; a ``timeout`` in seconds needs the main thread (``signal.alarm``)."""
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)

    def parse_any(text: str) -> list:
        # math-verify reads LaTeX only between delimiters: try the text as is, then wrapped in $...$
        parsed = parse(text, parsing_timeout=timeout)
        if not parsed and "$" not in text:
            parsed = parse(f"${text}$", parsing_timeout=timeout)
        return parsed

    gold = parse_any(truth)
    pred = parse_any(candidate) if gold else []
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


def _worker_process() -> Any:
    global _mv_worker
    if _mv_worker is None or _mv_worker.poll() is not None:
        import atexit
        import os
        import subprocess
        import sys

        import agentic_rl

        env = dict(os.environ)
        src = os.path.dirname(os.path.dirname(os.path.abspath(agentic_rl.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
        _mv_worker = subprocess.Popen([sys.executable, "-m", "agentic_rl.rewards._math_verify_worker"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True, bufsize=1, env=env)
        atexit.unregister(_stop_worker)
        atexit.register(_stop_worker)
    return _mv_worker


def _stop_worker() -> None:
    global _mv_worker
    if _mv_worker is not None:
        _mv_worker.kill()
        _mv_worker.wait()
        _mv_worker = None


def math_verify_match(candidate: str, truth: str, timeout: int = MATH_VERIFY_TIMEOUT) -> bool:
    """math-verify's verdict on ``candidate`` vs ``truth``; False on any error or timeout. Safe on any thread.

    On the main thread math-verify's own ``signal.alarm`` timeouts apply. Elsewhere (signal handlers cannot be set
    off the main thread) the check goes to one long-lived worker process (``python -m
    agentic_rl.rewards._math_verify_worker``, not ``multiprocessing``, so the caller's ``__main__`` is never
    re-run); a check that does not answer in time kills that process, and the next check starts a fresh one.
    """
    candidate = str(candidate)[-MATH_VERIFY_MAX_CHARS:]
    truth = str(truth)[:MATH_VERIFY_MAX_CHARS]
    timeout = max(1, int(timeout))
    if threading.current_thread() is threading.main_thread():
        try:
            return _math_verify_compare(candidate, truth, timeout)
        except Exception:  # noqa: BLE001 - includes math-verify's TimeoutException
            return False
    import json
    import select

    with _mv_lock:  # one check at a time through the worker
        try:
            worker = _worker_process()
            worker.stdin.write(json.dumps([candidate, truth, timeout]) + "\n")
            worker.stdin.flush()
            # five timed steps at most (4 parses, 1 verify) plus the worker's start-up on first use
            ready, _, _ = select.select([worker.stdout], [], [], max(0.0, 5 * timeout + MATH_VERIFY_STARTUP_S))
            if not ready:
                _stop_worker()
                return False
            return worker.stdout.readline().strip() == "1"
        except (OSError, ValueError):  # the worker died: start afresh next time
            _stop_worker()
            return False
