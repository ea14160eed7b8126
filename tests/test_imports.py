"""The package's modules import each other without cycles (read from the source with ``ast``, function-level imports
included: a lazy import hides a cycle from Python, not from the reader)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def import_graph(src: Path = SRC, package: str = "agentic_rl") -> dict[str, set[str]]:
    """module -> the package modules it imports (``from pkg import name`` counts as importing ``pkg.name`` when that
    is a module, else ``pkg``; relative imports count as the absolute ones they stand for)."""
    modules: dict[str, Path] = {}
    packages: set[str] = set()
    for path in (src / package).rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
            packages.add(".".join(parts))
        modules[".".join(parts)] = path

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom):  # from . import x, from ..y import z
                here = module.split(".") if module in packages else module.split(".")[:-1]
                base = ".".join(here[:len(here) - (node.level - 1)] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                if target.split(".")[0] == package:
                    resolved = resolve(target)
                    if resolved and resolved != module:
                        graph[module].add(resolved)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import thing\n")
    (pkg / "b.py").write_text("def thing():\n    from pkg import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from pkg.a import x\n")
    assert cycles(import_graph(tmp_path, "pkg")) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_cycle_finder_reads_relative_imports(tmp_path):
    sub = tmp_path / "pkg" / "sub"
    sub.mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "top.py").write_text("def f():\n    from .sub.env import g\n")
    (sub / "__init__.py").write_text("from . import tools\n")
    (sub / "env.py").write_text("from .tools import t\n")
    (sub / "tools.py").write_text("from ..top import f\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.sub"] == {"pkg.sub.tools"} and graph["pkg.sub.tools"] == {"pkg.top"}
    assert cycles(graph) == [["pkg.sub.env", "pkg.sub.tools", "pkg.top"]]


def test_no_import_cycles_in_the_package():
    graph = import_graph()
    assert "agentic_rl.train.grpo" in graph and graph["agentic_rl.train.grpo"]  # the graph was read
    assert cycles(graph) == []


def test_every_command_runs_with_python_dash_m_agentic_rl(tmp_path):
    """``python -m agentic_rl COMMAND`` runs a command (and ``accelerate launch -m agentic_rl COMMAND``); the modules
    that hold the commands do not import the command line back (no ``__main__`` block calling it)."""
    import json
    import os
    import subprocess
    import sys

    from agentic_rl.stages import STAGES

    calling_cli = []
    for module in sorted({stage.module for stage in STAGES.values()}):
        tree = ast.parse((SRC / (module.replace(".", "/") + ".py")).read_text())
        if any(isinstance(node, ast.ImportFrom) and node.module == "agentic_rl.cli" for node in ast.walk(tree)):
            calling_cli.append(module)
    assert set(calling_cli) <= {"agentic_rl.train.grpo"}, calling_cli
    rows = tmp_path / "completions.jsonl"
    rows.write_text(json.dumps({"completion": "Final Answer: 4", "ground_truth": "4"}) + "\n")
    done = subprocess.run([sys.executable, "-m", "agentic_rl", "reward", "check", str(rows), "--reward", "accuracy"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 0 and "accuracy" in done.stdout, done.stderr[-2000:]


def test_the_readme_layout_gives_every_source_file_its_own_line():
    """Each file under src/agentic_rl has a line of its own in README's layout section: its name (after the folder
    name, on a folder's first line), then its role."""
    layout = (SRC.parent / "README.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    described = set()
    for line in layout.splitlines():
        words = line.split()
        if words and words[0].endswith("/"):  # "data/     gsm8k.py     GSM8K and file readers ..."
            words = words[1:]
        if len(words) > 1:  # a name and its role
            described.add(words[0])
    files = sorted(p.relative_to(SRC / "agentic_rl") for p in (SRC / "agentic_rl").rglob("*")
                   if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts)
    assert len(files) > 50 and [str(f) for f in files if f.name not in described] == []
