"""A safe arithmetic calculator, and the equation checker built on it.

:func:`safe_eval` evaluates arithmetic through an AST whitelist — never ``eval``. Allowed: numbers (ints and
decimals, thousands commas, ``$``), ``+ - * / //``, ``**``/``^`` with a bounded exponent, unary signs,
parentheses, ``x``/``×`` for multiplication, ``÷`` for division and ``N%`` meaning ``N/100``. Everything else —
names, attributes, calls, subscripts, strings, lambdas, comprehensions, comparisons — raises
:class:`CalculatorError`, as do inputs over ``MAX_EXPRESSION_CHARS``, exponents over ``MAX_EXPONENT``, nesting
deeper than ``MAX_DEPTH`` and any intermediate result larger than ``MAX_MAGNITUDE``. The tool-calling agent
environment exposes the same function as its calculator tool.

:func:`check_equations` finds statements like ``48 / 2 = 24`` (also ``48/2=24``, ``3 x 4 = 12``, ``$5 * 3 = $15``,
sloppy chains such as ``12 * 5 = 60 - 10 = 50``) and recomputes each left-hand side. A stated result written with
decimals may be rounded to the decimals shown (``100 / 3 = 33.33`` is correct). :func:`count_steps` counts the lines
that carry an equation or a ``Step k`` marker. Both are bounded (``MAX_EQUATIONS`` per text, ``MAX_SIDE_CHARS`` per
side) so that a 1 MB completion is checked in well under a second.
"""

from __future__ import annotations

import ast
import math
import operator
import re
import warnings
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["CalculatorError", "safe_eval", "format_number", "EquationCheck", "Equation", "check_equations",
           "count_steps",
           "find_equations"]

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 100
MAX_MAGNITUDE = 1e100
MAX_DEPTH = 50
MAX_EQUATIONS = 256     # equations checked per text
MAX_SIDE_CHARS = 120    # characters read on each side of "="
MAX_STEPS = 1000        # count_steps stops here by default


class CalculatorError(ValueError):
    """The expression is not plain, bounded arithmetic (the message says why)."""


# ---------------------------------------------------------------------------------------------------------------
# safe_eval
# ---------------------------------------------------------------------------------------------------------------

_BIN_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_UNARY_OPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}

_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))", re.ASCII)
_TIMES_RE = re.compile(r"(?<=[\d)\s])[xX\u00d7\u22c5\u00b7](?=[\s\d(.$])", re.ASCII)
# "2(3 + 4)", "(1 + 2)(3 + 4)", "(9)4": juxtaposition means multiplication in written arithmetic
_IMPLICIT_TIMES_RE = re.compile(r"(?<=[\d.)])\s*(?=\()|(?<=\))\s*(?=\.?\d)", re.ASCII)
_PERCENT_RE = re.compile(r"(\d+(?:\.\d+)?)\s*%", re.ASCII)
_LEADING_ZEROS_RE = re.compile(r"(?<![\d.])0+(?=\d)", re.ASCII)


def _normalise_expression(expr: str) -> str:
    """Typography to Python: ``3 x 4`` -> ``3 * 4``, ``6 ÷ 2`` -> ``6 / 2``, ``2^3`` -> ``2**3``,
    ``$1,200`` -> ``1200``, ``2(3)`` -> ``2*(3)``, ``20%`` -> ``(20/100)``."""
    expr = expr.replace("\u2212", "-").replace("\u2013", "-").replace("\u00f7", "/").replace("\u2217", "*")
    expr = expr.replace("$", "").replace("^", "**")
    expr = _TIMES_RE.sub("*", expr)
    expr = _THOUSANDS_RE.sub("", expr)
    expr = _IMPLICIT_TIMES_RE.sub("*", expr)
    expr = _PERCENT_RE.sub(r"(\1/100)", expr)
    expr = _LEADING_ZEROS_RE.sub("", expr)
    return expr.strip()


def _check_magnitude(value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError(f"result magnitude exceeds {MAX_MAGNITUDE:g}")
    return value


def _power(base: int | float, exponent: int | float) -> int | float:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {exponent} exceeds the limit of {MAX_EXPONENT}")
    if base != 0 and abs(base) != 1 and abs(exponent) * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
        raise CalculatorError(f"result magnitude exceeds {MAX_MAGNITUDE:g}")
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero")
    if base < 0 and not float(exponent).is_integer():
        raise CalculatorError("fractional power of a negative number")
    return base ** exponent


def _eval_node(node: ast.AST, depth: int) -> int | float:
    if depth > MAX_DEPTH:
        raise CalculatorError(f"expression nested deeper than {MAX_DEPTH}")
    if isinstance(node, ast.Expression):
        return _eval_node(node.body, depth + 1)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError(f"only numbers are allowed, got {type(node.value).__name__} {node.value!r:.40}")
        return _check_magnitude(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN_OPS:
        left = _eval_node(node.left, depth + 1)
        right = _eval_node(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            return _check_magnitude(_power(left, right))
        if isinstance(node.op, (ast.Div, ast.FloorDiv)) and right == 0:
            raise CalculatorError("division by zero")
        return _check_magnitude(_BIN_OPS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
        return _UNARY_OPS[type(node.op)](_eval_node(node.operand, depth + 1))
    kind = type(node).__name__
    if isinstance(node, ast.BinOp):
        kind = f"operator {type(node.op).__name__}"
    raise CalculatorError(f"{kind} is not allowed: only numbers, + - * / // ** and parentheses")


def safe_eval(expr: str) -> int | float:
    """Evaluate plain arithmetic safely; raise :class:`CalculatorError` for anything else.

    >>> safe_eval("48 / 2"), safe_eval("3 x 4"), safe_eval("2^10"), safe_eval("$1,200 * 10%")
    (24, 12, 1024, 120)
    >>> safe_eval("__import__('os')")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    CalculatorError: Call is not allowed: only numbers, + - * / // ** and parentheses
    """
    if not isinstance(expr, str):
        raise CalculatorError(f"expression must be a string, got {type(expr).__name__}")
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = _normalise_expression(expr)
    if not text:
        raise CalculatorError("empty expression")
    try:
        with warnings.catch_warnings():  # "1abc" makes the parser warn before it fails
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise CalculatorError(f"not an arithmetic expression: {expr[:60]!r}") from exc
    try:
        value = _eval_node(tree, 0)
    except (OverflowError, ZeroDivisionError, RecursionError) as exc:
        raise CalculatorError(f"cannot evaluate {expr[:60]!r}: {exc}") from exc
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def format_number(value: int | float) -> str:
    """A result as a person would write it: ``24``, ``0.2``, ``33.333333333333`` (12 significant digits)."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return f"{value:.12g}"


# ---------------------------------------------------------------------------------------------------------------
# Equations in text
# ---------------------------------------------------------------------------------------------------------------

_EXPR_CHARS = frozenset("0123456789.,+-*/()$%^ \txX\u00d7\u00f7\u2212\u00b7\u22c5")
_OPERATOR_RE = re.compile(r"[\d.)%]\s*(?:[-+*/^\u00d7\u00f7\u2212\u00b7\u22c5]|[xX](?=\s*[\d(.$]))\s*[-$(]*\s*[\d.]",
                          re.ASCII)
_STATED_RE = re.compile(r"[ \t]*(?P<neg>-|\u2212)?[ \t]*\$?[ \t]*(?P<num>\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?"
                        r"|\d+(?:\.\d+)?|\.\d+)"
                        r"(?:/(?P<den>\d+)(?![\d.]))?(?P<pct>[ \t]*%)?", re.ASCII)
_ADJACENT_RE = re.compile(r"[\d.)%]\s+(?=[\d.($])", re.ASCII)
_LIST_COMMA_RE = re.compile(r",(?!\d{3}(?!\d))|(?<!\d),", re.ASCII)
# "300 seeds * 1/3", "60 minutes x 2/3": one unit word between a number and an operator is dropped
_UNIT_WORD_RE = re.compile(r"(?<=\d)[ \t]+[A-Za-z]{2,}(?=[ \t]*[-+*/\u00d7\u00f7]|[ \t]+[xX][ \t])", re.ASCII)
_STEP_SEARCH_RE = re.compile(r"step[ \t]*\d", re.IGNORECASE | re.ASCII)
_STEP_RE = re.compile(r"^[\s*#>_-]*step[ \t]*\d+", re.IGNORECASE | re.ASCII)


@dataclass
class EquationCheck:
    """One ``expression = stated`` statement; ``computed`` is None when the expression cannot be evaluated.

    ``stated`` is the number written after "="; in a chain such as ``8 * 2 + 4 = 16 + 4 = 20`` the whole right-hand
    expression (``16 + 4``) is also accepted.
    """

    expression: str
    stated: float
    computed: float | None
    ok: bool


class Equation(NamedTuple):
    """An equation found in text, before it is checked."""

    expression: str
    stated: float
    decimals: int            # decimals shown in the stated number (a rounded result is accepted)
    percent: bool            # the stated number carries "%"
    right_expression: str    # the arithmetic that follows "=" up to the next "=" (the chain's next link)


def _trailing_run(window: str) -> str:
    i = len(window)
    while i > 0 and window[i - 1] in _EXPR_CHARS:
        i -= 1
    return window[i:]


def _last_match_end(regex: re.Pattern, text: str) -> int:
    end = 0
    for m in regex.finditer(text):
        end = m.end()
    return end


def _left_expression(segment: str) -> str | None:
    """The arithmetic expression at the end of ``segment`` (the text before an "="), or None if there is none."""
    window = _UNIT_WORD_RE.sub("", segment[-MAX_SIDE_CHARS:])
    expr = _trailing_run(window).strip()
    # Drop what cannot start an expression: operators, letters-as-times, a dangling "-" separated by a space.
    while expr and (expr[0] in "+*/^,.)%xX\u00d7\u00f7\u00b7\u22c5" and not (expr[0] == "." and expr[1:2].isdigit())):
        expr = expr[1:].lstrip()
    if expr.startswith("-") and expr[1:2].isspace():
        expr = expr[1:].lstrip()
    # "Step 1 48/2": two operands with no operator between them; the expression starts at the second.
    expr = expr[_last_match_end(_ADJACENT_RE, expr):]
    # "3, 50 - 3": a comma that is not a thousands separator ends a list; the expression starts after it.
    expr = expr[_last_match_end(_LIST_COMMA_RE, expr):].lstrip()
    while expr.count("(") > expr.count(")"):  # "sold (48/2 = 24)": drop the unmatched "("
        expr = expr.replace("(", "", 1).lstrip()
    if not expr or not _OPERATOR_RE.search(expr):
        return None
    if "x" in _normalise_expression(expr).lower():  # "3 + 2x" is algebra with a variable, not arithmetic
        return None
    return expr


def _stated(segment: str) -> tuple[float, int, bool] | None:
    """(value, decimals shown, written as a percent) of the number that starts ``segment``, or None."""
    m = _STATED_RE.match(segment)
    if not m:
        return None
    num = m.group("num")
    value = float(num.replace(",", ""))
    den = m.group("den")
    if den and len(den) <= 9 and int(den) != 0:  # "= 1/12": a fraction stated as the result
        value, num = value / int(den), ""
    if m.group("neg"):
        value = -value
    decimals = len(num.split(".", 1)[1]) if "." in num else 0
    return value, decimals, bool(m.group("pct"))


def find_equations(text: str, limit: int = MAX_EQUATIONS) -> list[Equation]:
    """Each ``expression = number`` in ``text``: at most ``limit`` equations, read from at most ``4 * limit + 64``
    "=" signs, ``MAX_SIDE_CHARS`` characters on each side.

    An equation needs an operator on its left-hand side (``x = 5`` and ``24 = 24`` are not steps of arithmetic),
    and no variable (``3 + 2x = 9`` is algebra).
    """
    found: list[Equation] = []
    budget = 4 * limit + 64
    pos = text.find("=")
    while pos != -1 and len(found) < limit and budget > 0:
        budget -= 1
        right = text[pos + 1:pos + 1 + MAX_SIDE_CHARS].split("\n", 1)[0]
        if right.startswith("=") or (pos > 0 and text[pos - 1] in "<>!="):  # comparisons are not equations
            pos = text.find("=", pos + 1)
            continue
        # the left side is the text since the previous "=" or line break (bounded)
        window_start = max(0, pos - MAX_SIDE_CHARS)
        left_start = max(text.rfind("\n", window_start, pos), text.rfind("=", window_start, pos)) + 1
        expression = _left_expression(text[max(left_start, window_start):pos])
        if expression is not None:
            stated = _stated(right)
            if stated is not None:
                right_expression = _trailing_run(right.split("=", 1)[0][::-1])[::-1].strip()
                found.append(Equation(expression, *stated, right_expression))
        pos = text.find("=", pos + 1)
    return found


def _matches(computed: float, stated: float, decimals: int) -> bool:
    if computed.is_integer() and stated.is_integer():
        return computed == stated
    if math.isclose(computed, stated, rel_tol=1e-12, abs_tol=1e-9):  # float noise: 0.1 + 0.2 = 0.3
        return True
    # a stated result written with decimals may be rounded to the decimals it shows: 100/3 = 33.33
    return decimals > 0 and abs(computed - stated) <= 0.5 * 10 ** (-decimals) + 1e-9


def _check(equation: Equation) -> EquationCheck:
    try:
        computed: float | None = float(safe_eval(equation.expression))
    except CalculatorError:
        computed = None
    ok = False
    if computed is not None:
        ok = (_matches(computed, equation.stated, equation.decimals)
              # "100 - 80 = 20%" and "20 / 100 = 20%" are both correct
              or (equation.percent and _matches(computed, equation.stated / 100, equation.decimals + 2)))
        if not ok and _OPERATOR_RE.search(equation.right_expression):
            try:  # a chain "8 * 2 + 4 = 16 + 4 = 20": the right-hand expression has the same value
                ok = _matches(computed, float(safe_eval(equation.right_expression)), 0)
            except CalculatorError:
                pass
    return EquationCheck(expression=equation.expression, stated=equation.stated, computed=computed, ok=ok)


def check_equations(text: str, limit: int = MAX_EQUATIONS) -> list[EquationCheck]:
    """Every ``expression = result`` statement in ``text``, recomputed with :func:`safe_eval`.

    >>> [(c.expression, c.stated, c.computed, c.ok) for c in check_equations("48 / 2 = 24\\n48 + 24 = 71")]
    [('48 / 2', 24.0, 24.0, True), ('48 + 24', 71.0, 72.0, False)]
    """
    return [_check(equation) for equation in find_equations(str(text), limit)]


def count_steps(text: str, limit: int | None = MAX_STEPS) -> int:
    """The number of distinct reasoning lines: lines with an equation or a ``Step k`` marker (blank lines, filler
    and repeated identical lines do not count). Counts at most ``limit`` lines (None: ``MAX_STEPS``).

    >>> count_steps("Step 1: add them\\n48 + 24 = 72\\n\\n\\nFinal Answer: 72")
    2
    """
    text = str(text)
    cap = limit if limit is not None else MAX_STEPS
    # Candidate lines come from two C-speed scans (a "Step k" or an operator between numbers), so lines of filler
    # cost nothing; each scan reads at most 4 * cap + 64 lines.
    budget = 4 * cap + 64
    lines = {**_candidate_lines(text, _STEP_SEARCH_RE, budget), **_candidate_lines(text, _OPERATOR_RE, budget)}
    seen: set[str] = set()
    for start in sorted(lines):
        if len(seen) >= cap:
            break
        stripped = text[start:lines[start]].strip()
        if stripped in seen:
            continue
        if _STEP_RE.match(stripped) or ("=" in stripped and find_equations(stripped, limit=1)):
            seen.add(stripped)
    return len(seen)


def _candidate_lines(text: str, regex: re.Pattern, budget: int) -> dict[int, int]:
    """{line start: line end} of the lines where ``regex`` matches, at most ``budget`` lines, in one pass."""
    lines: dict[int, int] = {}
    pos = 0
    while len(lines) < budget:
        m = regex.search(text, pos)
        if m is None:
            break
        start = text.rfind("\n", pos, m.start()) + 1 or pos
        end = text.find("\n", m.end())
        end = len(text) if end == -1 else end
        lines[start] = end
        pos = end + 1
    return lines
