"""The test suite's own rules: every test checks something."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
#: pytest's own checks: a test that expects an exception or a warning states its expectation through these.
PYTEST_CHECKS = {"raises", "warns", "deprecated_call"}
#: A helper whose name says it checks (``assert_in_sync``, ``_check_row``) holds the test's assertions.
HELPER_PREFIXES = ("assert_", "check_")


def _checks_something(function: ast.AST) -> bool:
    for node in ast.walk(function):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in PYTEST_CHECKS or name.lstrip("_").startswith(HELPER_PREFIXES):
                return True
    return False


def _not_collected(tree: ast.Module) -> set[str]:
    """Names a module marks ``name.__test__ = False``: helpers that pytest's naming rule would otherwise collect."""
    return {target.value.id for node in tree.body if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Attribute) and target.attr == "__test__" and isinstance(target.value, ast.Name)
            and isinstance(node.value, ast.Constant) and node.value.value is False}


def unchecked_tests(source: str) -> list[str]:
    """The test functions in ``source`` (module level or in ``Test*`` classes) with no ``assert``, no
    ``pytest.raises``/``pytest.warns`` and no call of an ``assert_*``/``check_*`` helper."""
    tree = ast.parse(source)
    skipped = _not_collected(tree)
    functions = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef) and node.name.startswith("Test")):
        functions += [node for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return [f.name for f in functions
            if f.name.startswith("test") and f.name not in skipped and not _checks_something(f)]


def test_the_scan_finds_a_test_that_checks_nothing():
    source = '''
def check_row(row):
    assert row

def test_asserts():
    assert 1 + 1 == 2

def test_raises():
    with pytest.raises(ValueError):
        int("x")

def test_uses_a_checking_helper():
    check_row({"a": 1})

def test_only_runs(tmp_path):
    run(tmp_path)

class TestGroup:
    def test_method_without_a_check(self):
        print("ran")

def test_helper(path):
    return path

test_helper.__test__ = False
'''
    assert unchecked_tests(source) == ["test_only_runs", "test_method_without_a_check"]


def test_every_test_checks_something():
    missing = [f"{path.name}::{name}" for path in sorted(TESTS.glob("test_*.py"))
               for name in unchecked_tests(path.read_text())]
    assert not missing, f"tests with no assertion: {missing}"
