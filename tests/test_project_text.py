"""Project text speaks of the product, not of how it was developed.

No development-round label ("session 12", "round 3") and no issue reference ("#15", "issue 14") in the README, the
guides, the source (its docstrings, comments and messages), the shipped configs, the benchmarks and scripts, or the
tests' docstrings and comments. Measurements and their history have their own pages (docs/results.md,
docs/experiments.md), which the same rule covers. No path that exists only on the developers' machines (a sibling
checkout's ``../shared/``, ``/work/...``). The guides' lines fit the project's 120 characters, tables excepted.
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


MACHINE_PATHS = re.compile(r"(?<![\w.])(?:\.\./)+shared/|(?<![\w.:/])/work/\w")
LINE_LIMIT = 120


def machine_paths_in(text: str) -> list[str]:
    return [m.group(0) for m in MACHINE_PATHS.finditer(text)]


def test_no_path_that_exists_only_on_the_developers_machines():
    """A user has the hub id or their own copy of a dataset, never the developers' sibling folders."""
    hits = []
    for path in project_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            hits += [f"{path.relative_to(REPO)}:{number}: {hit}" for hit in machine_paths_in(line)]
    assert not hits, "\n".join(hits)


def test_the_path_search_finds_machine_paths_only():
    assert machine_paths_in("--source ../shared/data/gsm8k; cd /work/main; ../../shared/x") == [
        "../shared/", "/work/m", "../../shared/"]
    assert machine_paths_in("openai/gsm8k, gsm8k-local/train.jsonl, runs/work/x, https://x.org/work/y, "
                            "my.shared/x") == []


def long_lines(text: str) -> list[int]:
    """Numbers of the lines over the limit, except table rows (a row cannot wrap) and docs-test markers."""
    return [number for number, line in enumerate(text.splitlines(), 1)
            if len(line) > LINE_LIMIT and not line.lstrip().startswith(("|", "<!-- docs-test:"))]


def test_guide_lines_fit_the_line_limit():
    hits = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        hits += [f"{path.relative_to(REPO)}:{number}" for number in long_lines(path.read_text())]
    assert not hits, f"lines over {LINE_LIMIT} characters: " + ", ".join(hits)


def test_the_line_check_skips_only_tables_and_markers():
    long = "x" * (LINE_LIMIT + 1)
    text = "\n".join([long, "| " + long + " |", "<!-- docs-test: run " + long + " -->", "x" * LINE_LIMIT,
                      "    " + long])
    assert long_lines(text) == [1, 5]
