"""GSM8K: load it (hub id or local files), parse its reference answers, and turn rows into SFT / RL rows.

A GSM8K reference answer is reasoning lines with calculator annotations, then the final answer after ``####``::

    Natalia sold 48/2 = <<48/2=24>>24 clips in May.
    Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.
    #### 72

:func:`parse_gsm8k_answer` splits it into steps (annotations removed unless kept), the final answer (text after the
last ``####``, normalised: ``1,000`` -> ``1000``) and the step count. :func:`load_gsm8k` reads ``openai/gsm8k``
(config ``main``) from the hub, or a local ``.jsonl``/``.json``/``.parquet``/``.csv`` file, or a folder holding
``train``/``test`` files, and adds the parsed fields to every row. :func:`to_sft_dataset` and :func:`to_rl_dataset`
produce exactly the fields of :func:`agentic_rl.data.formats.sft_row` / :func:`~agentic_rl.data.formats.rl_row`.

Local reading (:func:`read_records`) is shared with custom datasets (``data/custom.py``): a malformed JSON line
(also one nested too deeply or holding an integer too long to convert), a file that is not UTF-8, a missing file or
an unreachable hub id is a one-line :class:`~agentic_rl.errors.DataError` naming file and line.
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_rl.data.formats import (CALC_ANNOTATION, SYSTEM_PROMPT, TASK_DATA, accepted_answers, format_solution,
                                    rl_row, sft_row)
from agentic_rl.errors import DataError
from agentic_rl.utils import iter_jsonl, parse_json

GSM8K_HUB_ID = "openai/gsm8k"
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")

# ---------------------------------------------------------------------------------------------------------------
# Answers
# ---------------------------------------------------------------------------------------------------------------


def normalize_number(text: str) -> str:
    """``" 1,000 "`` -> ``"1000"``, ``"$5.50"`` -> ``"5.5"``, ``"+3"`` -> ``"3"``, ``"7."`` -> ``"7"``.

    Text that is not a number after removing thousands separators, currency and a trailing period comes back
    stripped but otherwise unchanged (see :func:`is_number`).
    """
    s = text.strip().replace(",", "").replace("$", "").replace(" ", "")
    if s.endswith(".") and s.count(".") == 1:
        s = s[:-1]
    if not _NUMBER.fullmatch(s):
        return text.strip()
    sign = "-" if s.startswith("-") else ""
    whole, _, frac = s.lstrip("+-").partition(".")
    whole, frac = whole.lstrip("0") or "0", frac.rstrip("0")
    s = f"{whole}.{frac}" if frac else whole
    return "0" if s == "0" else sign + s


def is_number(text: str) -> bool:
    return bool(_NUMBER.fullmatch(normalize_number(text)))


def parse_gsm8k_answer(answer: str, keep_annotations: bool = False) -> dict[str, Any]:
    """Split a GSM8K reference answer into its parts.

    Returns ``steps`` (reasoning lines, stripped, blank lines dropped, ``<<a*b=c>>`` annotations removed unless
    ``keep_annotations``), ``final_answer`` (text after the last ``####``, normalised), ``num_steps`` and
    ``solution_text`` (the steps and final answer in our answer format, as the model learns to write it).

    >>> p = parse_gsm8k_answer("Half: 48/2 = <<48/2=24>>24\\nTotal: 48+24 = <<48+24=72>>72\\n#### 1,072")
    >>> p["steps"], p["final_answer"], p["num_steps"]
    (['Half: 48/2 = 24', 'Total: 48+24 = 72'], '1072', 2)
    >>> print(p["solution_text"])
    Half: 48/2 = 24
    Total: 48+24 = 72
    Final Answer: 1072

    Raises :class:`DataError` when the answer is empty or has no ``####`` line.
    """
    if not isinstance(answer, str) or not answer.strip():
        raise DataError("the answer is empty")
    if "####" not in answer:
        raise DataError("the answer has no '#### N' final-answer line")
    reasoning, final = answer.rsplit("####", 1)
    final_answer = normalize_number(final.strip().splitlines()[0] if final.strip() else "")
    if not final_answer:
        raise DataError("the answer has nothing after its last '####'")
    steps = []
    for line in reasoning.splitlines():
        if not keep_annotations:
            line = CALC_ANNOTATION.sub("", line)
        line = " ".join(line.split())
        if line:
            steps.append(line)
    return {"steps": steps, "final_answer": final_answer, "num_steps": len(steps),
            "solution_text": format_solution(steps, final_answer)}


# ---------------------------------------------------------------------------------------------------------------
# Reading records (shared with custom datasets)
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Records:
    """Raw rows from one source, with where each came from (for error messages)."""

    rows: list[dict[str, Any]]
    origin: str  # file path or hub id
    locations: list[str]  # e.g. "train.jsonl line 12", one per row

    def where(self, i: int) -> str:
        return self.locations[i] if i < len(self.locations) else f"{self.origin} row {i + 1}"


def _one_line(text: object, limit: int = 200) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _read_jsonl(path: Path) -> Records:
    numbered = list(iter_jsonl(path))  # "<path> line N: ..." errors
    return Records([row for _, row in numbered], str(path), [f"{path} line {n}" for n, _ in numbered])


def _read_json(path: Path) -> Records:
    try:
        data = parse_json(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        if "\n" in path.read_text(encoding="utf-8").strip():
            try:  # a JSON-lines file with a .json suffix
                return _read_jsonl(path)
            except DataError:
                pass
        raise DataError(f"{path} line {exc.lineno}: malformed JSON ({exc.msg} at column {exc.colno})") from None
    if isinstance(data, dict):  # {"data": [...]} or {"train": [...], ...} or {column: [values]}
        lists = {k: v for k, v in data.items() if isinstance(v, list)}
        if "data" in lists:
            data = lists["data"]
        elif lists and len({len(v) for v in lists.values()}) == 1 and len(lists) == len(data):
            n = len(next(iter(lists.values())))
            data = [{k: v[i] for k, v in lists.items()} for i in range(n)]
        else:
            raise DataError(f"{path}: expected a list of row objects (or {{\"data\": [...]}}), "
                            f"got an object with keys {', '.join(list(data)[:8])}")
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DataError(f"{path}: expected a JSON list of row objects")
    return Records(data, str(path), [f"{path} row {i + 1}" for i in range(len(data))])


def _read_csv(path: Path) -> Records:
    """Rows named by their number under the header (what a spreadsheet shows) and the line they start on: a quoted
    value may span lines (GSM8K's answers do), so the line alone does not say which row is meant."""
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh)
        rows, locs = [], []
        where = f"{path} line 1"
        try:
            _ = reader.fieldnames  # reading the property reads the header
            while True:
                where = f"{path} row {len(rows) + 1} (from line {reader.line_num + 1})"
                row = next(reader, None)
                if row is None:
                    break
                if None in row:
                    raise DataError(f"{where}: more values than the header has columns")
                rows.append(dict(row))
                locs.append(where)
        except csv.Error as exc:
            raise DataError(f"{where}: malformed CSV ({exc})") from None
    return Records(rows, str(path), locs)


def _read_parquet(path: Path) -> Records:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise DataError(f"{path}: cannot read parquet ({_one_line(exc)})") from None
    return Records(rows, str(path), [f"{path} row {i + 1}" for i in range(len(rows))])


def read_file(path: str | Path) -> Records:
    """Rows of one local ``.jsonl``/``.json``/``.parquet``/``.csv`` file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    suffix = path.suffix.lower()
    readers = {".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv, ".parquet": _read_parquet}
    if suffix not in readers:
        raise DataError(f"{path}: unsupported file type '{suffix}' (use {', '.join(FILE_SUFFIXES)})")
    try:
        return readers[suffix](path)
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text (byte {exc.start}); re-save the file as UTF-8") from None


def split_files(folder: Path, split: str) -> list[Path]:
    """Files in ``folder`` (or one level below, as in hub snapshots) that hold ``split``: ``train.jsonl``,
    ``train-00000-of-00001.parquet``, ``main/test.csv``..."""
    found = []
    for path in sorted(folder.glob("*")) + sorted(folder.glob("*/*")):
        if path.is_file() and path.suffix.lower() in FILE_SUFFIXES:
            stem = path.name[: -len(path.suffix)].lower()
            if stem == split.lower() or re.match(rf"{re.escape(split.lower())}[-_.]", stem):
                found.append(path)
    # Prefer the shallowest level that has matches (a folder may hold both train.jsonl and main/train-*.parquet).
    if found:
        depth = min(len(p.relative_to(folder).parts) for p in found)
        found = [p for p in found if len(p.relative_to(folder).parts) == depth]
        suffix = found[0].suffix.lower()
        found = [p for p in found if p.suffix.lower() == suffix]
    return found


def _looks_like_path(source: str) -> bool:
    return (source.startswith((".", "/", "~")) or "\\" in source or source.lower().endswith(FILE_SUFFIXES)
            or source.count("/") > 1)


def read_records(source: str, split: str = "train", *, hub_config: str | None = None) -> Records:
    """Raw rows of ``split`` from a local file, a local folder (``{split}.jsonl`` ...) or a hub dataset id."""
    path = Path(source).expanduser()
    if path.is_file():
        return read_file(path)
    if path.is_dir():
        files = split_files(path, split)
        if not files:
            present = sorted(p.name for p in path.iterdir())[:10]
            raise DataError(f"no '{split}' file in {path} (expected e.g. {split}.jsonl; found: "
                            f"{', '.join(present) or 'nothing'})")
        parts = [read_file(f) for f in files]
        return Records([r for p in parts for r in p.rows], str(path), [w for p in parts for w in p.locations])
    if _looks_like_path(source):
        raise DataError(f"data file not found: {source}")
    return _read_hub(source, split, hub_config)


def _read_hub(source: str, split: str, hub_config: str | None) -> Records:
    import datasets

    try:
        ds = datasets.load_dataset(source, hub_config, split=split)
    except ValueError as exc:
        if "split" in str(exc).lower():
            raise DataError(f"{source}: no split '{split}' ({_one_line(exc)})") from None
        raise DataError(f"cannot load '{source}' from the Hugging Face hub ({_one_line(exc)})") from None
    except Exception as exc:  # offline, not found, gated: all end the same way for the user
        raise DataError(f"cannot load '{source}' from the Hugging Face hub ({_one_line(exc)}); without network "
                        "pass a local file or folder instead, e.g. --source path/to/gsm8k/ holding "
                        "train.jsonl and test.jsonl") from None
    rows = ds.to_list()
    return Records(rows, source, [f"{source}[{split}] row {i + 1}" for i in range(len(rows))])


def sample_indices(n_rows: int, max_samples: int | None, seed: int) -> list[int]:
    """``max_samples`` row indices drawn at random with ``seed`` (kept in their original order), or all rows."""
    if max_samples is None or max_samples >= n_rows:
        return list(range(n_rows))
    if max_samples < 0:
        raise DataError(f"max_samples must be >= 0, got {max_samples}")
    return sorted(random.Random(seed).sample(range(n_rows), max_samples))


# ---------------------------------------------------------------------------------------------------------------
# GSM8K
# ---------------------------------------------------------------------------------------------------------------

def gsm8k_row(question: str, answer: str, *, keep_annotations: bool = False) -> dict[str, Any]:
    """One dataset row from a question and its GSM8K-style answer (our canonical task row)."""
    parsed = parse_gsm8k_answer(answer, keep_annotations=keep_annotations)
    return {"question": question.strip(), "answer": answer, "ground_truth": parsed["final_answer"],
            "num_steps": parsed["num_steps"], "steps": parsed["steps"], "solution": parsed["solution_text"]}


def rows_to_dataset(rows: list[dict[str, Any]]):
    """A ``datasets.Dataset`` with a fixed schema (works for zero rows too); rows with ``task_data`` (environment
    columns as JSON, :data:`~agentic_rl.data.formats.TASK_DATA`) keep it as one more string column."""
    import datasets

    features = datasets.Features({
        "question": datasets.Value("string"), "answer": datasets.Value("string"),
        "ground_truth": datasets.Value("string"), "num_steps": datasets.Value("int64"),
        "steps": datasets.List(datasets.Value("string")), "solution": datasets.Value("string")})
    if rows and all(TASK_DATA in r for r in rows):
        features[TASK_DATA] = datasets.Value("string")
    columns = {k: [r[k] for r in rows] for k in features}
    return datasets.Dataset.from_dict(columns, features=features)


def load_gsm8k(source: str = GSM8K_HUB_ID, split: str = "train", *, keep_annotations: bool = False,
               max_samples: int | None = None, seed: int = 0, hub_config: str = "main"):
    """GSM8K as a ``datasets.Dataset`` with ``question``, ``answer`` (as given), ``ground_truth``, ``num_steps``,
    ``steps`` and ``solution`` (our answer format).

    ``source``: the hub id (default ``openai/gsm8k``, config ``main``), a local file, or a folder with
    ``train``/``test`` files. ``max_samples`` draws that many rows at random with ``seed``.
    """
    records = read_records(source, split, hub_config=hub_config)
    rows = []
    for i in sample_indices(len(records.rows), max_samples, seed):
        raw = records.rows[i]
        for field in ("question", "answer"):
            if field not in raw:
                raise DataError(f"{records.where(i)}: missing field '{field}' (columns: {', '.join(map(str, raw))})")
            if not isinstance(raw[field], str) or not raw[field].strip():
                raise DataError(f"{records.where(i)}: field '{field}' is empty")
        try:
            row = gsm8k_row(raw["question"], raw["answer"], keep_annotations=keep_annotations)
        except DataError as exc:
            raise DataError(f"{records.where(i)}: field 'answer': {exc}") from None
        if not is_number(row["ground_truth"]):
            raise DataError(f"{records.where(i)}: field 'answer': final answer {row['ground_truth']!r} "
                            "is not a number")
        rows.append(row)
    return rows_to_dataset(rows)


# ---------------------------------------------------------------------------------------------------------------
# Training formats
# ---------------------------------------------------------------------------------------------------------------

def _iter_rows(ds) -> Iterable[dict[str, Any]]:
    return ds if isinstance(ds, list) else ds.to_list()


def to_sft_dataset(ds, system_prompt: str | None = SYSTEM_PROMPT, *, with_text: bool = False,
                   answer_only_fraction: float = 0.0, answer_first_fraction: float = 0.0, seed: int = 0):
    """Conversational prompt-completion rows for TRL's SFTTrainer: exactly ``prompt``, ``completion`` (and ``text``).

    ``ds`` holds task rows (``question``, ``steps``, ``ground_truth``; from :func:`load_gsm8k`,
    :func:`agentic_rl.data.load_task_dataset` or a list of such dicts). Two kinds of imperfect demonstrations, each
    a share of the rows chosen at random with ``seed`` (disjoint): ``answer_only_fraction`` keep only
    ``Final Answer: N`` without their worked steps; ``answer_first_fraction`` state ``Final Answer: N`` first and
    the steps after it (answer, then justify). Imitation cannot exceed such data; RL with a verifiable reward can.
    """
    import datasets

    for name, share in (("answer_only_fraction", answer_only_fraction),
                        ("answer_first_fraction", answer_first_fraction)):
        if not 0.0 <= share <= 1.0:
            raise DataError(f"{name} must be between 0 and 1, got {share}")
    if answer_only_fraction + answer_first_fraction > 1.0:
        raise DataError(f"answer_only_fraction + answer_first_fraction must be at most 1, got "
                        f"{answer_only_fraction} + {answer_first_fraction}")
    rows = list(_iter_rows(ds))
    n_short = int(round(answer_only_fraction * len(rows)))
    n_first = int(round(answer_first_fraction * len(rows)))
    # A stream of its own: the rows a run reaches are drawn with random.Random(seed) (sample_indices), and two samples
    # of one stream share their prefix: the imperfect rows would be exactly the first ones reached.
    rng = random.Random(f"agentic-rl-imperfect-demonstrations:{seed}")
    chosen = rng.sample(range(len(rows)), n_short + n_first) if n_short + n_first else []
    short, first = set(chosen[:n_short]), set(chosen[n_short:])
    out = [sft_row(r["question"], [] if i in short else list(r["steps"]), accepted_answers(r["ground_truth"])[0],
                   system_prompt=system_prompt, with_text=with_text, answer_first=i in first)
           for i, r in enumerate(rows)]
    if not out:
        return datasets.Dataset.from_dict({"prompt": [], "completion": [], **({"text": []} if with_text else {})})
    return datasets.Dataset.from_list(out)


def to_rl_dataset(ds, system_prompt: str | None = SYSTEM_PROMPT, *, full_answer_field: str = "answer"):
    """Rows for GRPO and evaluation: exactly ``question``, ``prompt``, ``ground_truth``, ``full_answer`` (and
    ``task_data`` when the task rows have it: the environment's columns).

    ``full_answer`` is the reference answer as given (``full_answer_field="solution"`` puts our formatted
    solution there instead); the reward functions receive all the columns as keyword arguments.
    """
    import datasets

    rows = list(_iter_rows(ds))
    out = [rl_row(r["question"], r["ground_truth"], r.get(full_answer_field) or r.get("solution", ""),
                  system_prompt=system_prompt) | ({TASK_DATA: r[TASK_DATA]} if TASK_DATA in r else {})
           for r in rows]
    if not out:
        return datasets.Dataset.from_dict({"question": [], "prompt": [], "ground_truth": [], "full_answer": []})
    return datasets.Dataset.from_list(out)
