"""Every command and code block in README.md and docs/ works as written.

Every block gets the cheap check, without training:

* an ``agentic-rl`` command (also as ``python -m agentic_rl``, under ``accelerate launch ... -m agentic_rl``, or as
  ``make quickstart ARGS="..."``) is parsed by the real CLI parser and resolved into its stage's config, so every
  flag, YAML key, setting value and ``--config`` file it names exists;
* a ``make`` target exists in the Makefile; a benchmark or script exists and its source knows every flag given;
* a Python block runs (a ``# NAME.py`` block is written as that file first); a YAML or JSON block parses.

Markers on the line before a block (a long one wraps over several lines) say more:

* ``<!-- docs-test: run ARGS -->`` runs the block's commands for real, in order, in a fresh directory, each
  ``agentic-rl`` command with those of ``ARGS`` appended that its stage has (``--max-steps 2`` shrinks a training
  stage, ``--eval-samples 4`` an evaluation), so the end-to-end examples stay short;
* ``<!-- docs-test: file NAME -->`` writes the block to ``NAME`` for the commands after it (a block whose first line
  is ``# NAME.yaml`` or ``# NAME.py`` is written likewise);
* ``<!-- docs-test: skip REASON -->`` says why a block cannot be checked in full here: a Python block is compiled,
  not run; a shell block's commands are parsed, not resolved (e.g. a setting that needs vLLM installed).

Commands of tools outside this project (``pip``, ``vllm``, ``trl``, ``tensorboard``) are left alone; any other
command is an error here, so a new kind of example is checked or consciously left out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.stage

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
EXTERNAL = {"pip", "vllm", "trl", "tensorboard"}
MARKER = re.compile(r"^<!--\s*docs-test:\s*(run|skip|file)\b\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")
NAMED = re.compile(r"^#\s*([\w.-]+\.(?:py|ya?ml|json|jsonl|txt))\s*$")


@dataclasses.dataclass
class Block:
    path: Path
    line: int
    lang: str
    text: str
    marker: str | None = None  # run | skip | file
    argument: str = ""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def file_name(self) -> str | None:
        if self.marker == "file":
            return self.argument
        first = self.text.splitlines()[0] if self.text.strip() else ""
        named = NAMED.match(first.strip())
        return named.group(1) if named and self.lang in ("python", "py", "yaml", "yml", "json") else None


def read_blocks(path: Path, text: str | None = None) -> list[Block]:
    """The fenced code blocks of a markdown file, each with the docs-test marker on the line before it."""
    lines = (path.read_text() if text is None else text).splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        marker = marker_before(lines, start)
        blocks.append(Block(path, start + 1, fence.group(1).lower(), "\n".join(body) + "\n",
                            marker.group(1) if marker else None, marker.group(2) if marker else ""))
        i += 1
    return blocks


def marker_before(lines: list[str], fence: int) -> re.Match | None:
    """The docs-test marker that ends on the line before a fence; a long one wraps over several lines."""
    end = fence - 1
    if end < 0 or not lines[end].rstrip().endswith("-->"):
        return None
    first = end
    while not lines[first].lstrip().startswith("<!--"):
        first -= 1
        if first < 0 or not lines[first].strip() or FENCE.match(lines[first]):
            return None
    return MARKER.match(" ".join(line.strip() for line in lines[first:end + 1]))


def shell_commands(text: str) -> list[list[str]]:
    """A shell block's commands as argument lists: continuation lines joined, comments and blank lines dropped."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(words)
    return commands


def _without_env_prefix(words: list[str]) -> list[str]:
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]
    return words


def agentic_rl_argv(words: list[str]) -> list[str] | None:
    """The arguments of an agentic-rl command however it is started, or None when it is not one."""
    words = _without_env_prefix(words)
    if words and words[0] == "agentic-rl":
        return words[1:]
    if "-m" in words and words[words.index("-m") + 1:words.index("-m") + 2] == ["agentic_rl"]:
        return words[words.index("-m") + 2:]
    return None


def check_cli(argv: list[str], resolve: bool = True) -> None:
    """Parse ``argv`` with the real CLI parser and resolve the stage's config; a failure raises AssertionError."""
    from agentic_rl.cli import build_parser
    from agentic_rl.config import config_from_args
    from agentic_rl.errors import AgenticRLError
    from agentic_rl.stages import STAGES

    command = next((a for a in argv if not a.startswith("-")), None)
    assert command in STAGES, f"'agentic-rl {' '.join(argv)}': no command '{command}'"
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            args = build_parser(only=command).parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"'agentic-rl {' '.join(argv)}': {stderr.getvalue().strip() or exc}") from None
    if not resolve:
        return
    config_cls, _ = STAGES[command].load()
    try:
        config_from_args(config_cls, args, yaml_path=args._config_file, section=command)
    except AgenticRLError as exc:
        raise AssertionError(f"'agentic-rl {' '.join(argv)}': {exc}") from None


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (REPO / "Makefile").read_text(), flags=re.M))


def check_command(words: list[str], workspace: Path, resolve: bool = True) -> None:
    """The cheap check of one shell command (see the module docstring)."""
    argv = agentic_rl_argv(words)
    if argv is not None:
        check_cli(argv, resolve)
        return
    words = _without_env_prefix(words)
    program = Path(words[0]).name
    if program == "make":
        target = next((w for w in words[1:] if "=" not in w), "")
        assert target in make_targets(), f"'{' '.join(words)}': the Makefile has no target '{target}'"
        extra = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        if target == "quickstart":
            check_cli(["quickstart", *shlex.split(extra.get("ARGS", ""))], resolve)
    elif program in ("python", "python3", "bash") and words[1:] and words[1].endswith((".py", ".sh")):
        script = REPO / words[1]
        assert script.is_file(), f"'{' '.join(words)}': no file {words[1]}"
        source = script.read_text()
        if script.suffix == ".sh":  # the shell wrapper hands its flags to the Python script beside it
            source += "".join(p.read_text() for p in script.parent.glob(script.stem + ".py"))
        unknown = [w.split("=")[0] for w in words[2:] if w.startswith("--") and f'"{w.split("=")[0]}"' not in source]
        assert not unknown, f"'{' '.join(words)}': {words[1]} has no flag {', '.join(unknown)}"
    elif program == "export":
        for assignment in words[1:]:
            name, _, value = assignment.partition("=")
            if name == "PYTHONPATH" and value in ("$PWD", "."):
                sys.path.insert(0, str(workspace))
    elif program == "accelerate":
        raise AssertionError(f"'{' '.join(words)}': an accelerate command must launch `-m agentic_rl COMMAND`")
    else:
        assert program in EXTERNAL, (f"'{' '.join(words)}': the docs test does not know '{program}'; check it here or "
                                     f"add it to the commands of other tools")


def prepare_workspace(workspace: Path) -> None:
    """A directory where the docs' relative paths resolve: the repository's configs next to the files blocks write."""
    for name in ("configs", "src", "benchmarks", "scripts"):
        (workspace / name).symlink_to(REPO / name)


def write_file_block(block: Block, workspace: Path) -> None:
    target = workspace / block.file_name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(block.text)


def run_python(block: Block, workspace: Path) -> None:
    code = compile(block.text, block.where, "exec")
    if block.marker == "skip":
        assert block.argument, f"{block.where}: a skipped block must say why (<!-- docs-test: skip REASON -->)"
        return
    exec(code, {"__name__": "__docs__"})


def check_blocks(blocks: list[Block], workspace: Path) -> list[str]:
    """The cheap check of every block of one page, in order; the failures, each naming its block."""
    failures = []
    for block in blocks:
        try:
            if block.file_name:
                write_file_block(block, workspace)
            if block.lang in ("bash", "sh", "shell", "console"):
                if block.marker == "skip":
                    assert block.argument, "a skipped block must say why (<!-- docs-test: skip REASON -->)"
                for words in shell_commands(block.text):
                    check_command(words, workspace, resolve=block.marker != "skip")
            elif block.lang in ("python", "py"):
                run_python(block, workspace)
            elif block.lang in ("yaml", "yml"):
                yaml.safe_load(block.text)
            elif block.lang == "json" and block.file_name is None:
                json.loads(block.text)
            elif block.lang == "json":
                for line in block.text.splitlines():
                    if line.strip():
                        json.loads(line)
        except Exception as exc:  # every failure of a block is reported with its place, then the next block
            failures.append(f"{block.where}: {exc}".strip())
    return failures


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    prepare_workspace(tmp_path)
    return tmp_path


@pytest.mark.parametrize("path", DOC_FILES, ids=[str(p.relative_to(REPO)) for p in DOC_FILES])
def test_every_documented_command_parses_and_resolves(path, workspace):
    failures = check_blocks(read_blocks(path), workspace)
    assert not failures, "\n".join(failures)


RUN_BLOCKS = [b for p in DOC_FILES for b in read_blocks(p) if b.marker == "run"]


def shrink_arguments(argv: list[str], shrink: list[str]) -> list[str]:
    """``argv`` plus the ``--flag value`` pairs (or bare ``--flag``) of ``shrink`` that its stage has."""
    from agentic_rl.stages import STAGES

    command = next((a for a in argv if not a.startswith("-")), None)
    fields = {f.name for f in dataclasses.fields(STAGES[command].load()[0])}
    added, i = [], 0
    while i < len(shrink):
        flag = shrink[i]
        value = [shrink[i + 1]] if i + 1 < len(shrink) and not shrink[i + 1].startswith("--") else []
        if flag.lstrip("-").replace("-", "_") in fields:
            added += [flag, *value]
        i += 1 + len(value)
    return argv + added


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[b.where for b in RUN_BLOCKS])
def test_the_documented_examples_run(block, workspace, capsys):
    from agentic_rl.cli import main

    for earlier in read_blocks(block.path):  # the page's files, as a reader who follows it has them
        if earlier.file_name and earlier.line < block.line:
            write_file_block(earlier, workspace)
    if block.lang in ("python", "py"):
        run_python(block, workspace)
        return
    for words in shell_commands(block.text):
        argv = agentic_rl_argv(words)
        if argv is None:
            check_command(words, workspace)  # `export PYTHONPATH=$PWD` and the like
            continue
        argv = shrink_arguments(argv, shlex.split(block.argument))
        code = main(argv)
        err = capsys.readouterr().err[-2000:]
        assert code == 0, f"{block.where}: 'agentic-rl {' '.join(argv)}' exited {code}: {err}"


def test_a_renamed_flag_or_a_missing_file_fails_the_check(tmp_path, workspace):
    """The check itself: a documented flag the CLI does not have (a renamed one), a setting's bad value, a make target
    or a script flag that does not exist, and an unknown program each fail, naming the block."""
    page = tmp_path / "page.md"
    blocks = read_blocks(page, text="\n".join([
        "```bash", "agentic-rl sft --model runs/base/model --learnig-rate 1e-4", "```",
        "```bash", "agentic-rl grpo --model m --num-generations many", "```",
        "```bash", 'make quickstart ARGS="--smoky"', "```",
        "```bash", "make deploy", "```",
        "```bash", "python benchmarks/bench_eval.py --no-such-flag", "```",
        "```bash", "frobnicate --all", "```",
        "```bash", "agentic-rl sft --model runs/base/model --output-dir runs/sft   # fine", "```",
    ]))
    failures = check_blocks([Block(REPO / b.path.name, b.line, b.lang, b.text) for b in blocks], workspace)
    assert len(failures) == 6, failures
    for failure, expected in zip(failures, ["--learnig-rate", "num_generations", "--smoky", "no target 'deploy'",
                                            "--no-such-flag", "frobnicate"]):
        assert expected in failure, failure
    assert [f.split(":")[1] for f in failures] == ["1", "4", "7", "10", "13", "16"]


def test_markers_and_named_blocks_are_read():
    blocks = read_blocks(REPO / "x.md", text="\n".join([
        "<!-- docs-test: run --max-steps 2 -->", "```bash", "agentic-rl data preview \\", "    --source synthetic",
        "```", "", "```yaml", "# tune.yaml", "stage: grpo", "```",
        "<!-- docs-test: skip needs a server -->", "```python", "print(1)", "```",
        "<!-- docs-test: run --max-steps 2", "     --eval-samples 4 -->", "```bash", "agentic-rl data preview", "```",
        "an unrelated comment -->", "```bash", "agentic-rl data stats", "```",
    ]))
    assert [(b.marker, b.argument, b.file_name) for b in blocks] == [
        ("run", "--max-steps 2", None), (None, "", "tune.yaml"), ("skip", "needs a server", None),
        ("run", "--max-steps 2 --eval-samples 4", None), (None, "", None)]
    assert shell_commands(blocks[0].text) == [["agentic-rl", "data", "preview", "--source", "synthetic"]]
    assert shrink_arguments(["grpo", "--model", "m"], ["--max-steps", "2", "--corpus-lines", "9"]) == [
        "grpo", "--model", "m", "--max-steps", "2"]
    assert os.path.basename(str(blocks[1].path)) == "x.md"
