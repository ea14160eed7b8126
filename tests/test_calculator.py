"""The safe calculator (AST whitelist, bounds) and the equation checker / step counter built on it."""

from __future__ import annotations

import time

import pytest

from agentic_rl.rewards import CalculatorError, check_equations, count_steps, format_number, safe_eval
from agentic_rl.rewards.calculator import MAX_EQUATIONS, MAX_EXPRESSION_CHARS, MAX_STEPS, find_equations


@pytest.mark.parametrize("expr, expected", [
    ("48 / 2", 24),
    ("48/2", 24),
    ("48 + 24", 72),
    ("3 x 4", 12),
    ("3 X 4", 12),
    ("3 × 4", 12),
    ("6 ÷ 4", 1.5),
    ("2^10", 1024),
    ("2 ** 10", 1024),
    ("(1 + 2) * (3 + 4)", 21),
    ("2(3 + 4)", 14),
    ("(1 + 2)(3 + 4)", 21),
    ("-5 + 3", -2),
    ("-(2 - 5)", 3),
    ("+7", 7),
    ("0.2 * 50", 10),
    (".5 + .25", 0.75),
    ("$5 * 3", 15),
    ("1,200 + 300", 1500),
    ("20% * 50", 10),
    ("168 / 20%", 840),
    ("7 // 2", 3),
    ("10 − 4", 6),
    ("0900 - 0130", 770),
    ("2 ** -1", 0.5),
    ("10 ** 100", 10 ** 100),
])
def test_safe_eval_arithmetic(expr, expected):
    value = safe_eval(expr)
    assert value == pytest.approx(expected, rel=1e-12)
    assert isinstance(value, (int, float)) and not isinstance(value, bool)


def test_safe_eval_returns_int_for_integral_results():
    assert safe_eval("48 / 2") == 24 and isinstance(safe_eval("48 / 2"), int)
    assert isinstance(safe_eval("1 / 3"), float)
    assert format_number(safe_eval("1 / 3")) == "0.333333333333"
    assert format_number(safe_eval("12 / 60")) == "0.2"
    assert format_number(24.0) == "24"


@pytest.mark.parametrize("expr, reason", [
    ("x + 1", "Name"),                                   # names
    ("__import__('os').system('ls')", "Call"),           # calls
    ("print(1)", "Call"),
    ("abs(-1)", "Call"),
    ("(1).real", "Attribute"),                           # attributes
    ("().__class__", "not allowed"),
    ("[1, 2][0]", "not allowed"),                        # subscripts / lists
    ("'ab' * 3", "only numbers"),                        # strings
    ("b'ab'", "only numbers"),
    ("True + 1", "only numbers"),                        # booleans are not numbers here
    ("1j * 2", "only numbers"),                          # complex
    ("lambda: 1", "Lambda"),                             # lambdas
    ("[i for i in range(10)]", "ListComp"),              # comprehensions
    ("{i for i in (1, 2)}", "SetComp"),
    ("sum(i for i in (1, 2))", "Call"),
    ("(y := 3)", "NamedExpr"),                           # walrus
    ("1 if 2 else 3", "IfExp"),
    ("1 < 2", "Compare"),
    ("1 and 2", "BoolOp"),
    ("7 % 3", "not an arithmetic expression"),           # % means percent, so "7 % 3" is not valid
    ("1 << 40", "operator LShift"),
    ("~1", "not allowed"),
    ("9 ** 9 ** 9", "exponent"),                         # huge exponents
    ("2 ** 1000", "exponent"),
    ("10 ** 101", "exponent"),
    ("10 ** 99 * 1000", "magnitude"),
    ("99999999999 ** 99", "magnitude"),
    ("(-8) ** 0.5", "fractional power"),
    ("1e308 * 10", "magnitude"),
    ("1 / 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("1 +", "not an arithmetic expression"),
    ("", "empty"),
    ("   ", "empty"),
    ("1" * (MAX_EXPRESSION_CHARS + 1), "longer than"),   # overly long input
    ("-(" * 60 + "1" + ")" * 60, "deeper"),
    ("-" * 400 + "1", "deeper"),
])
def test_safe_eval_rejects(expr, reason):
    with pytest.raises(CalculatorError, match=reason):
        safe_eval(expr)


def test_calculator_error_is_a_value_error_and_non_strings_are_rejected():
    assert issubclass(CalculatorError, ValueError)
    with pytest.raises(CalculatorError):
        safe_eval(12)  # type: ignore[arg-type]


def test_safe_eval_is_fast_on_hostile_input():
    start = time.perf_counter()
    for expr in ["9**9**9**9", "(" * 100 + ")" * 100, "1" * MAX_EXPRESSION_CHARS, "2**100*" * 60 + "1",
                 "10**99*10**99", "+-" * 200 + "1"]:
        with pytest.raises(CalculatorError):
            safe_eval(expr)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("text, expected", [
    ("48 / 2 = 24", [("48 / 2", 24.0, 24.0, True)]),
    ("48/2=24", [("48/2", 24.0, 24.0, True)]),
    ("3 x 4 = 12", [("3 x 4", 12.0, 12.0, True)]),
    ("$5 * 3 = $15", [("$5 * 3", 15.0, 15.0, True)]),
    ("48 + 24 = 71", [("48 + 24", 71.0, 72.0, False)]),
    ("Natalia sold 48/2 = 24 clips in May.", [("48/2", 24.0, 24.0, True)]),
    ("Weng earns 12/60 = $0.2 per minute.", [("12/60", 0.2, 0.2, True)]),
    ("Step 1: 48 / 2 = 24", [("48 / 2", 24.0, 24.0, True)]),
    ("Step 1 48/2 = 24", [("48/2", 24.0, 24.0, True)]),
    ("He has 3, 50 - 3 = 47 left", [("50 - 3", 47.0, 47.0, True)]),
    ("100 / 3 = 33.33", [("100 / 3", 33.33, pytest.approx(33.3333333), True)]),   # rounded to the decimals shown
    ("100 / 3 = 33", [("100 / 3", 33.0, pytest.approx(33.3333333), False)]),      # but an integer is exact
    ("100 - 80 = 20%", [("100 - 80", 20.0, 20.0, True)]),
    ("20 / 100 = 20%", [("20 / 100", 20.0, 0.2, True)]),
    ("(1 / 3) x (1 / 4) = 1/12", [("(1 / 3) x (1 / 4)", pytest.approx(1 / 12), pytest.approx(1 / 12), True)]),
    ("300 seeds * 1/3 = 100 seeds", [("300 * 1/3", 100.0, 100.0, True)]),
    ("-5 + 3 = -2", [("-5 + 3", -2.0, -2.0, True)]),
    ("1,200 + 300 = 1,500", [("1,200 + 300", 1500.0, 1500.0, True)]),
    ("2^3 = 8", [("2^3", 8.0, 8.0, True)]),
    ("5 / 0 = 1", [("5 / 0", 1.0, None, False)]),
    ("12 * 5 = 60 - 10 = 50", [("12 * 5", 60.0, 60.0, True), ("60 - 10", 50.0, 50.0, True)]),
    ("8 * 2 + 4 = 16 + 4 = 20", [("8 * 2 + 4", 16.0, 20.0, True), ("16 + 4", 20.0, 20.0, True)]),
    ("x = 5", []),                    # no arithmetic on the left
    ("24 = 24", []),
    ("3 + 2x = 9", []),               # algebra with a variable
    ("if a == 1 + 1 then", []),       # a comparison
    ("1 + 1 <= 3", []),
    ("no equations here, 5 + 3", []),
    ("", []),
])
def test_check_equations(text, expected):
    got = [(c.expression, c.stated, c.computed, c.ok) for c in check_equations(text)]
    assert got == expected


def test_check_equations_is_bounded():
    text = "1 + 1 = 2\n" * 10_000
    checks = check_equations(text)
    assert len(checks) == MAX_EQUATIONS and all(c.ok for c in checks)
    assert len(check_equations(text, limit=3)) == 3
    assert len(find_equations("a = b = " * 10_000 + "1 + 1 = 2")) == 0  # only a bounded number of "=" is read


@pytest.mark.parametrize("text, expected", [
    ("48 / 2 = 24\n48 + 24 = 72\nFinal Answer: 72", 2),
    ("Step 1: add them\nStep 2: done\nFinal Answer: 3", 2),
    ("**Step 3** think\n# Step 4: more", 2),
    ("\n\n\n\n\nFinal Answer: 72", 0),                  # bare newlines are not steps
    ("first I thought\nthen I thought\nFinal Answer: 1", 0),  # filler is not a step
    ("1 + 1 = 2\n1 + 1 = 2\n1 + 1 = 2", 1),            # a repeated line counts once
    ("x = 5\ny = 6", 0),
    ("The next step 2 is", 0),                          # "step k" must start the line
    ("", 0),
])
def test_count_steps(text, expected):
    assert count_steps(text) == expected


def test_count_steps_limit_and_speed():
    text = "".join(f"{i} + 1 = {i + 1}\n" for i in range(50_000))
    assert count_steps(text, limit=7) == 7
    assert count_steps(text) == count_steps(text, limit=None) == MAX_STEPS
    start = time.perf_counter()
    count_steps("a=b\n" * 250_000)
    count_steps("1+" * 500_000 + "=3")
    assert time.perf_counter() - start < 1.0
