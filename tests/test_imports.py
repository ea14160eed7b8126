"""The package's modules import only downward, through a table of floors, and without cycles (read from the source
with ``ast``, function-level imports included: a lazy import hides a dependency from Python, not from the reader);
no class is defined inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: The package's floors, bottom first: a module may import modules of its own floor and of the floors below it.
#: An entry is a module or a subpackage (with everything in it); the package's own ``__init__`` is ``agentic_rl``.
FLOORS: list[tuple[str, ...]] = [
    # foundation: errors, helpers, the typed settings, run directories (and their lock), the stage table (module
    # names as strings, imported only when a stage runs) and what a stage prints, which every floor reads
    ("agentic_rl", "agentic_rl.errors", "agentic_rl.utils", "agentic_rl.config", "agentic_rl.runs",
     "agentic_rl.locking", "agentic_rl.stages", "agentic_rl.console"),
    # data: datasets and the prompt/answer formats that models, rewards and agents all speak (the tokenizer corpus too)
    ("agentic_rl.data", "agentic_rl.data.world"),
    # models: loading, the embedded tokenizer and base, generation; everything that runs a model builds on them
    ("agentic_rl.models",),
    # rewards: scoring completions; a learned reward model or judge loads its model through models/
    ("agentic_rl.rewards",),
    # agent: environments, tools and multi-turn rollouts, which generate with models/ and are scored by rewards/
    ("agentic_rl.agent",),
    # eval: evaluation of models and agents (episodes come from agent/)
    ("agentic_rl.eval",),
    # train: the training stages, preference sampling included; they check held-out accuracy through eval/
    ("agentic_rl.train",),
    # orchestration: what runs stages or their results (pipeline, tune, reports, export and serving, the tool API)
    ("agentic_rl.report", "agentic_rl.pipeline", "agentic_rl.tune", "agentic_rl.tune_trials", "agentic_rl.deploy",
     "agentic_rl.integrations"),
    # the command line, which dispatches to every stage
    ("agentic_rl.cli", "agentic_rl.__main__"),
]


def import_graph(src: Path = SRC, package: str = "agentic_rl") -> dict[str, set[str]]:
    """module -> the package modules it imports (``from pkg import name`` counts as importing ``pkg.name`` when that
    is a module, else ``pkg``; relative imports count as the absolute ones they stand for, and so does
    ``importlib.import_module`` of a constant name)."""
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
            elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)
                  and ast.unparse(node.func).rpartition(".")[2] in ("import_module", "__import__")):
                targets = [node.args[0].value]  # importlib.import_module("pkg.mod"): an import all the same
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


def floor_of(module: str, floors: list[tuple[str, ...]], package: str = "agentic_rl") -> int | None:
    """The index of the floor ``module`` is on: the floor of the longest entry that is the module or a subpackage
    holding it (the package itself holds nothing by this rule: each of its modules needs an entry); None if none."""
    best: tuple[int, int] | None = None
    for index, floor in enumerate(floors):
        for entry in floor:
            if module == entry or (entry != package and module.startswith(entry + ".")):
                if best is None or len(entry) > best[0]:
                    best = (len(entry), index)
    return None if best is None else best[1]


def layer_violations(graph: dict[str, set[str]], floors: list[tuple[str, ...]], package: str = "agentic_rl"
                     ) -> list[str]:
    """One line per module without a floor and per import that climbs to a higher floor."""
    problems = [f"{module} has no floor" for module in sorted(graph) if floor_of(module, floors, package) is None]
    for module in sorted(graph):
        here = floor_of(module, floors, package)
        for target in sorted(graph[module]):
            there = floor_of(target, floors, package)
            if here is not None and there is not None and there > here:
                problems.append(f"{module} (floor {here}) imports {target} (floor {there})")
    return problems


def classes_inside_functions(root: Path) -> list[str]:
    """``file:line class Name in function`` for every class statement inside a function body under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(function):
                    if isinstance(node, ast.ClassDef):
                        found.append(f"{path.relative_to(root)}:{node.lineno} class {node.name} in {function.name}")
    return sorted(set(found))


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


def test_every_module_has_a_floor_and_no_import_climbs():
    graph = import_graph()
    assert "agentic_rl.models.generate" in graph and graph["agentic_rl.train.grpo"]  # the graph was read
    assert layer_violations(graph, FLOORS) == []


def test_the_layer_check_reports_a_planted_climbing_import(tmp_path):
    """Climbs are found however they are written (module level, inside a function, relative, importlib); imports of
    the module's own floor and of lower floors pass; a module missing from the table is reported."""
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    for folder in (pkg, pkg / "low", pkg / "high"):
        (folder / "__init__.py").write_text("")
    (pkg / "base.py").write_text("import os\n")
    (pkg / "low" / "a.py").write_text("from pkg import base\nfrom pkg.low import b\n")
    (pkg / "low" / "b.py").write_text("def f():\n    from ..high import top\n")
    (pkg / "low" / "c.py").write_text("import importlib\ntop = importlib.import_module('pkg.high.top')\n")
    (pkg / "high" / "top.py").write_text("import pkg.low.a\nfrom pkg.base import x\n")
    (pkg / "stray.py").write_text("")
    floors = [("pkg", "pkg.base"), ("pkg.low",), ("pkg.high",)]
    assert layer_violations(import_graph(tmp_path, "pkg"), floors, "pkg") == [
        "pkg.stray has no floor",
        "pkg.low.b (floor 1) imports pkg.high.top (floor 2)",
        "pkg.low.c (floor 1) imports pkg.high.top (floor 2)",
    ]


def test_the_layer_table_refuses_the_imports_that_used_to_climb():
    """The package's own table, with imports that once climbed planted back into the real graph."""
    graph = import_graph()
    for module, target in [("agentic_rl.models.tiny", "agentic_rl.agent.tasks"),
                           ("agentic_rl.agent.rollout", "agentic_rl.eval.episodes"),
                           ("agentic_rl.data.formats", "agentic_rl.models.generate"),
                           ("agentic_rl.rewards.judge", "agentic_rl.agent.env"),
                           ("agentic_rl.train.sft", "agentic_rl.cli")]:
        planted = {m: set(targets) for m, targets in graph.items()}
        planted[module].add(target)
        assert [p for p in layer_violations(planted, FLOORS) if p.startswith(module)] == [
            f"{module} (floor {floor_of(module, FLOORS)}) imports {target} (floor {floor_of(target, FLOORS)})"]


def test_no_class_is_defined_inside_a_function(tmp_path):
    """Classes live at module level, where they can be read, imported, tested and pickled."""
    (tmp_path / "m.py").write_text("class Fine:\n    def method(self):\n        return 1\n\n\n"
                                   "def factory():\n    if True:\n        class Hidden:\n            pass\n")
    assert classes_inside_functions(tmp_path) == ["m.py:8 class Hidden in factory"]
    assert classes_inside_functions(SRC / "agentic_rl") == []


def test_help_imports_no_torch():
    """``agentic-rl --help`` and a command's ``--help`` answer without loading torch (seconds on a small machine):
    modules that need torch at import (generation, the server's per-row controls) are imported where they are used."""
    import os
    import subprocess
    import sys

    probe = ("import sys\nfrom agentic_rl.cli import main\nfor argv in (['--help'], ['serve', '--help'], "
             "['eval', '--help']):\n    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
             "print('loaded:', sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "loaded: []"


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
    assert calling_cli == []
    rows = tmp_path / "completions.jsonl"
    rows.write_text(json.dumps({"completion": "Final Answer: 4", "ground_truth": "4"}) + "\n")
    done = subprocess.run([sys.executable, "-m", "agentic_rl", "reward", "check", str(rows), "--reward", "accuracy"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 0 and "accuracy" in done.stdout, done.stderr[-2000:]


def test_the_architecture_guide_gives_every_source_file_its_own_line():
    """Each file under src/agentic_rl has a line of its own in docs/architecture.md's layout section: its name (after
    the folder name, on a folder's first line), then its role."""
    layout = (SRC.parent / "docs" / "architecture.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
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
