"""Project text speaks of the product, not of how it was developed.

No development-round label ("session 12", "round 3") and no issue reference ("#15", "issue 14") in the README, the
guides, the source (its docstrings, comments and messages), the shipped configs, the benchmarks and scripts, or the
tests' docstrings and comments. Measurements and their history have their own pages (docs/results.md,
docs/experiments.md), which the same rule covers.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
LABELS = re.compile(
    r"\b(?:sessions?|rounds?)\s+\d+"          # development rounds
    r"|\bissues?\s+#?\d+"                      # issue 14, issues #15
    r"|(?<![\w&#/])#\d{1,4}\b(?![\w-])",       # #15 (not "####", not colours or URLs' fragments)
    re.IGNORECASE)


def project_files() -> list[Path]:
    files = [REPO / "README.md", REPO / "mkdocs.yml", REPO / "Makefile", REPO / ".ci" / "run"]
    files += sorted((REPO / "docs").rglob("*.md"))
    for folder in ("src", "configs", "benchmarks", "scripts"):
        files += sorted(p for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".yaml", ".yml", ".sh", ".md")
                        and "__pycache__" not in p.parts)
    return [p for p in files if p.is_file()]


def test_text(path: Path) -> str:
    """A test file's docstrings and comments: what a test says about itself (its data may hold anything)."""
    import ast

    source = path.read_text()
    parts = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            parts.append(ast.get_docstring(node) or "")
    return "\n".join(parts)


test_text.__test__ = False  # a helper, not a test


def labels_in(text: str) -> list[str]:
    return [m.group(0) for m in LABELS.finditer(text)]


def test_no_development_round_labels_or_issue_numbers_in_project_text():
    hits = []
    for path in project_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            hits += [f"{path.relative_to(REPO)}:{number}: {label}" for label in labels_in(line)]
    for path in sorted((REPO / "tests").glob("*.py")):
        if path.name != Path(__file__).name:  # this file names the labels it looks for
            hits += [f"{path.relative_to(REPO)}: {label}" for label in labels_in(test_text(path))]
    assert not hits, "\n".join(hits)


def test_the_search_finds_each_kind_of_label():
    """The search itself: each kind of label is found, and the project's own uses of '#' and 'round' are not."""
    assert labels_in("measured in session 12; Session 3's run") == ["session 12", "Session 3"]
    assert labels_in("see issue 14, issues #15 and #19") == ["issue 14", "issues #15", "#19"]
    assert labels_in("the second round 2 of tuning") == ["round 2"]
    assert labels_in("#### 72 is GSM8K's answer line; colour #1f77b4; page.md#section-2; round(x, 2)") == []
