"""Any task dataset -> canonical task rows: the synthetic task, GSM8K, or your own file / hub dataset.

``load_task_dataset(source, split, ...)`` is the one entry point the stages use. ``source`` is

* a registered name: ``synthetic`` (the embedded task, deterministic train/test), ``synthetic:multiplication``
  (the tool-use variant), ``synthetic:multiplication-distractor`` (the same, each problem with one detail sentence
  whose number the answer does not use: the agentic preset's task), ``synthetic:world`` (questions of 1 to 3 hops
  about a fictional world, answered by a name: the ``search`` environment's task), ``synthetic:memory`` (event logs
  about the same world that end with a question of 1 or 2 hops: the ``memory`` environment's task), ``gsm8k`` (the
  hub's ``openai/gsm8k``), or one added with :func:`register_dataset`;
* ``module:function`` — your own function ``fn(split, seed) -> list[dict] | datasets.Dataset``;
* a local ``.jsonl``/``.json``/``.parquet``/``.csv`` file, or a folder holding ``train``/``test`` files;
* a hub dataset id (``hub_config`` picks its config; ``openai/gsm8k`` uses ``main``).

Columns are mapped by name: ``question_field`` (or ``prompt_field``: a string or a message list, whose last user
message is the question) and ``answer_field`` (or ``completion_field``) holding a GSM8K-style answer (``... #### N``),
our format (``... Final Answer: N``) or a bare number; ``ground_truth_field`` names a column with the final answer
(then the answer column is optional: prompt/ground-truth datasets for RL). Without a mapping the usual names are
tried (question/prompt/problem, answer/completion/solution, ground_truth/final_answer).

Every row comes out as ``question``, ``answer`` (as given), ``ground_truth`` (normalised number), ``num_steps``,
``steps`` and ``solution`` (our answer format) — the same as :func:`agentic_rl.data.load_gsm8k` — so
:func:`~agentic_rl.data.to_sft_dataset` and :func:`~agentic_rl.data.to_rl_dataset` work on any source. A registered
dataset with task columns (:data:`TASK_DATA_COLUMNS`: what its environment reads beside the question) also gives
``task_data``, those columns as a JSON object, which reaches ``env.reset(task)`` spread into the task.

Invalid rows are a one-line :class:`DataError` naming file, row and field: a missing field, an empty question or
answer, or (with ``numeric_ground_truth``, the default, needed by the numeric accuracy reward) a ground truth that
is not a number. ``max_samples`` draws that many rows at random with ``seed`` (not the first N).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any

from agentic_rl.data.formats import (CALC_ANNOTATION, FINAL_ANSWER_PREFIX, TASK_DATA, format_solution,
                                    last_message_index)
from agentic_rl.data.gsm8k import (GSM8K_HUB_ID, Records, _looks_like_path, _one_line, is_number, normalize_number,
                                   parse_gsm8k_answer, read_records, rows_to_dataset, sample_indices)
from agentic_rl.data.synthetic import SYNTHETIC_TEST_SIZE, synthetic_splits
from agentic_rl.errors import ConfigError, DataError

QUESTION_NAMES = ("question", "prompt", "problem", "input", "query")
ANSWER_NAMES = ("answer", "completion", "solution", "output", "response")
GROUND_TRUTH_NAMES = ("ground_truth", "final_answer", "label", "target")
_FINAL_LINE = re.compile(rf"^\s*{re.escape(FINAL_ANSWER_PREFIX)}\s*(.*?)\s*$", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------------------------
# Registry: name -> fn(split, seed, **options) -> raw rows
# ---------------------------------------------------------------------------------------------------------------

def _synthetic_source(split: str, seed: int, *, train_size: int = 2000, test_size: int = SYNTHETIC_TEST_SIZE,
                      **knobs) -> list[dict[str, Any]]:
    if split not in ("train", "test"):
        raise DataError(f"the synthetic dataset has splits 'train' and 'test', not '{split}'")
    try:
        train, test = synthetic_splits(train_size if split == "train" else 0, test_size, seed, **knobs)
    except TypeError as exc:
        raise ConfigError(f"unknown synthetic option ({exc})") from None
    return train if split == "train" else test


def _gsm8k_source(split: str, seed: int) -> Records:
    return read_records(GSM8K_HUB_ID, split, hub_config="main")


#: The size of the fictional world of ``synthetic:world`` (one per ``synthetic_seed``): enough people that 1-, 2- and
#: 3-hop questions fill the stages' default train and test splits.
WORLD_SIZE = {"n_people": 800, "n_places": 40, "n_orgs": 20}
#: The ``synthetic:world`` test questions are drawn as this many and cut to ``test_size``: every test split is a
#: prefix of the same list, and the train split never holds any of them.
WORLD_TEST_POOL = 2000


@lru_cache(maxsize=8)
def _world_split_rows(seed: int, n_train: int) -> tuple[Any, tuple[dict, ...], tuple[dict, ...]]:
    from agentic_rl.data.world import world_splits

    try:
        world, train, test = world_splits(n_train, WORLD_TEST_POOL, seed, **WORLD_SIZE)
    except ConfigError:
        raise ConfigError(f"synthetic:world has too few questions for {n_train} training rows beside its "
                          f"{WORLD_TEST_POOL} test questions; ask for fewer (max_train_samples)") from None
    return world, tuple(train), tuple(test)


def task_world(seed: int = 0):
    """The fictional world of ``synthetic:world`` for ``synthetic_seed`` ``seed``: the search corpus of its
    questions (:func:`agentic_rl.data.world.world_splits` with :data:`WORLD_SIZE`)."""
    return _world_split_rows(seed, 0)[0]


def _check_world_request(name: str, split: str, test_size: int, pool: int, unit: str, knobs: dict) -> None:
    """The checks of a request to a world dataset: no synthetic options, a known split, a test size within the
    pool of ``pool`` ``unit``."""
    if knobs:
        raise ConfigError(f"{name} takes no synthetic option ({', '.join(sorted(knobs))})")
    if split not in ("train", "test"):
        raise DataError(f"the {name} dataset has splits 'train' and 'test', not '{split}'")
    if split == "test" and test_size > pool:
        raise ConfigError(f"{name} has {pool} {unit}; synthetic_test_size {test_size} asks for more")


def _world_source(split: str, seed: int, *, train_size: int = 2000, test_size: int = SYNTHETIC_TEST_SIZE,
                  **knobs) -> list[dict[str, Any]]:
    """Questions of 1 to 3 hops about the world of ``seed``: ``question``, ``answer`` (a name), ``hops``, ``chain``
    (the titles to look up, in order), ``supporting`` (their passage ids)."""
    _check_world_request("synthetic:world", split, test_size, WORLD_TEST_POOL, "test questions", knobs)
    _, train, test = _world_split_rows(seed, train_size if split == "train" else 0)
    rows = train if split == "train" else test[:test_size]
    return [{**row, "chain": list(row["chain"]), "supporting": list(row["supporting"])} for row in rows]


#: The ``synthetic:memory`` test logs are drawn as this many and cut to ``test_size`` (every test split is a prefix
#: of the same list); the train split never asks one of their questions, and its logs are numbered after them.
MEMORY_TEST_POOL = 2000
#: The shape of a ``synthetic:memory`` log: 4 to 6 events, questions of 1 and 2 hops, the first event a distractor.
MEMORY_SHAPE = {"n_facts": (4, 6), "hops": (1, 2), "distractor_first": True}


@lru_cache(maxsize=8)
def _memory_split_rows(seed: int, n_train: int) -> tuple[tuple[dict, ...], tuple[dict, ...]]:
    from agentic_rl.data.world import memory_episodes

    world = task_world(seed)
    test = memory_episodes(world, MEMORY_TEST_POOL, seed, **MEMORY_SHAPE)
    try:
        train = memory_episodes(world, n_train, seed + 1_000_003, exclude={row["question"] for row in test},
                                **MEMORY_SHAPE)
    except ConfigError:
        raise ConfigError(f"synthetic:memory has too few questions for {n_train} training logs; ask for fewer "
                          "(max_train_samples)") from None
    return tuple(train), tuple(test)


def memory_log_row(row: dict[str, Any], number: int) -> dict[str, Any]:
    """A task row of an event log (:func:`agentic_rl.data.world.memory_episodes`): ``question`` is the log's
    header and first event ("Log 17. Event 1 of 5: ..."), the text of the prompt; the question asked at the end is
    ``log_question``; ``events``, ``facts``, ``needed``, ``chain`` and ``hops`` as the log has them."""
    header = f"Log {number}. Event 1 of {len(row['events'])}: {row['events'][0]}"
    return {"question": header, "answer": row["answer"], "log_question": row["question"],
            "events": list(row["events"]), "facts": [list(f) for f in row["facts"]], "needed": list(row["needed"]),
            "chain": list(row["chain"]), "hops": row["hops"]}


def _memory_source(split: str, seed: int, *, train_size: int = 2000, test_size: int = SYNTHETIC_TEST_SIZE,
                   **knobs) -> list[dict[str, Any]]:
    """Event logs about the world of ``seed`` (:func:`task_world`), each ending with a question of 1 or 2 hops
    (:data:`MEMORY_SHAPE`); rows as :func:`memory_log_row` makes them. Test logs are numbered from 1, train logs
    after the :data:`MEMORY_TEST_POOL`, so no two rows share a prompt."""
    _check_world_request("synthetic:memory", split, test_size, MEMORY_TEST_POOL, "test logs", knobs)
    train, test = _memory_split_rows(seed, train_size if split == "train" else 0)
    if split == "test":
        return [memory_log_row(row, i + 1) for i, row in enumerate(test[:test_size])]
    return [memory_log_row(row, MEMORY_TEST_POOL + i + 1) for i, row in enumerate(train)]


DATASETS: dict[str, Callable[..., Any]] = {
    "synthetic": _synthetic_source,
    "synthetic:multiplication": partial(_synthetic_source, kind="multiplication", max_steps=2),
    # Every problem holds a detail sentence, a number the answer does not use; the embedded base's corpus writes such
    # problems too (its second phase) and leaves this task's test questions out.
    "synthetic:multiplication-distractor": partial(_synthetic_source, kind="multiplication", max_steps=2,
                                                   distractors=1.0),
    "synthetic:world": _world_source,
    "synthetic:memory": _memory_source,
    "gsm8k": _gsm8k_source,
}
#: Registered datasets whose answers are names or short text (scored by the verifier's name comparison).
TEXT_ANSWER_DATASETS = {"synthetic:world", "synthetic:memory"}
#: The columns of a registered dataset's rows that its environment reads beside the question: they travel in the
#: task rows' ``task_data`` column (:data:`agentic_rl.data.formats.TASK_DATA`) to ``env.reset(task)``.
TASK_DATA_COLUMNS: dict[str, tuple[str, ...]] = {
    "synthetic:world": ("hops", "chain", "supporting"),
    "synthetic:memory": ("log_question", "events", "facts", "needed", "chain", "hops"),
}


def register_dataset(name: str, fn: Callable[..., Any], task_columns: tuple[str, ...] = ()) -> None:
    """Make ``fn(split, seed) -> list[dict] | datasets.Dataset`` available as ``source=name``; ``task_columns``
    are the columns of its rows that an environment reads (they reach ``env.reset(task)``)."""
    DATASETS[name] = fn
    if task_columns:
        TASK_DATA_COLUMNS[name] = tuple(task_columns)
    else:
        TASK_DATA_COLUMNS.pop(name, None)


def _records_from(value: Any, origin: str, split: str) -> Records:
    if isinstance(value, Records):
        return value
    rows = value.to_list() if hasattr(value, "to_list") else list(value)
    if not all(isinstance(r, dict) for r in rows):
        raise DataError(f"{origin}: the dataset function must return a list of dicts or a datasets.Dataset")
    return Records(rows, origin, [f"{origin}[{split}] row {i + 1}" for i in range(len(rows))])


def _resolve_source(source: str, split: str, seed: int, hub_config: str | None,
                    options: dict[str, Any]) -> Records:
    if source in DATASETS:
        return _records_from(DATASETS[source](split, seed, **options), source, split)
    if options:
        raise ConfigError(f"synthetic options ({', '.join(options)}) only apply to source 'synthetic', not {source!r}")
    if ":" in source and not _looks_like_path(source):
        module_name, _, fn_name = source.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), fn_name)
        except (ImportError, AttributeError) as exc:
            raise DataError(f"cannot import dataset function '{source}' ({exc})") from None
        return _records_from(fn(split, seed), source, split)
    if source == GSM8K_HUB_ID and hub_config is None:
        hub_config = "main"
    return read_records(source, split, hub_config=hub_config)


# ---------------------------------------------------------------------------------------------------------------
# One row
# ---------------------------------------------------------------------------------------------------------------

def _message_text(value: Any, role: str) -> Any:
    """A message list's last ``role`` message content (else its last message's); anything else unchanged."""
    if isinstance(value, list) and value and all(isinstance(m, dict) and "content" in m for m in value):
        last = last_message_index(value, role)
        return value[-1 if last is None else last]["content"]
    return value


def parse_answer_text(text: str, keep_annotations: bool = False) -> tuple[list[str], str | None]:
    """Steps and final answer from a GSM8K answer (``#### N``), our format (``Final Answer: N``) or a bare number.

    The final answer is ``None`` when the text has none of the three (the steps are then all its lines).
    """
    if "####" in text:
        parsed = parse_gsm8k_answer(text, keep_annotations=keep_annotations)
        return parsed["steps"], parsed["final_answer"]
    lines = [" ".join((line if keep_annotations else CALC_ANNOTATION.sub("", line)).split())
             for line in text.splitlines()]
    lines = [line for line in lines if line]
    for i in range(len(lines) - 1, -1, -1):
        m = _FINAL_LINE.match(lines[i])
        if m and m.group(1):
            return lines[:i], normalize_number(m.group(1))
    if len(lines) == 1 and is_number(lines[0]):
        return [], normalize_number(lines[0])
    return lines, None


def _pick(columns: dict[str, Any], explicit: str | None, names: tuple[str, ...]) -> str | None:
    if explicit:
        return explicit
    return next((n for n in names if n in columns), None)


def _mapping_hint() -> str:
    return "map your columns with --question-field/--answer-field (or --prompt-field/--completion-field, " \
           "--ground-truth-field)"


def _text_answer_row(raw: dict[str, Any], where: str, question: str, columns: str, answer_field: str | None,
                     ground_truth_field: str | None) -> dict[str, Any]:
    """A task row whose answer is a name or short text taken as it is: from ``ground_truth_field``/``answer_field``
    when given, else an ``answers`` list (any listed answer counts) or the usual answer/ground-truth columns."""
    name = ground_truth_field or answer_field or next(
        (n for n in ("answers", *GROUND_TRUTH_NAMES, *ANSWER_NAMES) if n in raw), None)
    if name is None or name not in raw:
        raise DataError(f"{where}: missing field '{name or 'answer'}' (columns: {columns}); {_mapping_hint()}")
    value = raw[name]
    items = value if isinstance(value, list) else [value]
    accepted: list[str] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise DataError(f"{where}: field '{name}': an answer must be text, got {type(item).__name__}")
        text = " ".join(str(item).split())
        if not text:
            raise DataError(f"{where}: field '{name}' (the answer) is empty")
        if text not in accepted:
            accepted.append(text)
    if not accepted:
        raise DataError(f"{where}: field '{name}' (the answers) is an empty list")
    # Several accepted answers are stored as a JSON list, which the verifier reads as "any of these".
    truth = accepted[0] if len(accepted) == 1 else json.dumps(accepted, ensure_ascii=False)
    return {"question": question.strip(), "answer": value.strip() if isinstance(value, str) else accepted[0],
            "ground_truth": truth, "num_steps": 0, "steps": [], "solution": format_solution([], accepted[0])}


def task_row(raw: dict[str, Any], where: str, *, question_field: str | None = None, answer_field: str | None = None,
             ground_truth_field: str | None = None, numeric_ground_truth: bool = True,
             keep_annotations: bool = False, text_answers: bool = False) -> dict[str, Any]:
    """Validate one raw row and turn it into a canonical task row (see the module docstring)."""
    columns = _one_line(", ".join(map(str, raw))) or "none"  # column names can hold newlines (a quoted CSV header)
    q_name = _pick(raw, question_field, QUESTION_NAMES)
    if q_name is None or q_name not in raw:
        raise DataError(f"{where}: missing field '{q_name or 'question'}' (columns: {columns}); {_mapping_hint()}")
    question = _message_text(raw[q_name], "user")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: field '{q_name}' (the question) is empty")
    if text_answers:
        return _text_answer_row(raw, where, question, columns, answer_field, ground_truth_field)

    a_name = _pick(raw, answer_field, ANSWER_NAMES)
    g_name = _pick(raw, ground_truth_field, GROUND_TRUTH_NAMES if a_name is None else ())
    if a_name is not None and a_name not in raw:
        raise DataError(f"{where}: missing field '{a_name}' (columns: {columns}); {_mapping_hint()}")
    if g_name is not None and g_name not in raw:
        raise DataError(f"{where}: missing field '{g_name}' (columns: {columns}); {_mapping_hint()}")
    if a_name is None and g_name is None:
        raise DataError(f"{where}: missing field 'answer' (columns: {columns}); {_mapping_hint()}")

    answer, steps, final = "", [], None
    if a_name is not None:
        answer = _message_text(raw[a_name], "assistant")
        answer = "" if answer is None else str(answer)
        if not answer.strip() and g_name is None:
            raise DataError(f"{where}: field '{a_name}' (the answer) is empty")
        if answer.strip():
            try:
                steps, final = parse_answer_text(answer, keep_annotations=keep_annotations)
            except DataError as exc:
                raise DataError(f"{where}: field '{a_name}': {exc}") from None
    if g_name is not None:
        value = raw[g_name]
        if value is None or not str(value).strip():
            raise DataError(f"{where}: field '{g_name}' (the ground truth) is empty")
        final = normalize_number(str(value))
    elif final is None:
        raise DataError(f"{where}: field '{a_name}': no final answer found (expected '#### N', "
                        f"'{FINAL_ANSWER_PREFIX} N' or a number); or name a column with --ground-truth-field")
    if numeric_ground_truth and not is_number(final):
        field = g_name or a_name
        raise DataError(f"{where}: field '{field}': ground truth {final!r} is not a number (the numeric accuracy "
                        "reward needs one; set numeric_ground_truth false for a custom reward)")
    return {"question": question.strip(), "answer": answer, "ground_truth": final, "num_steps": len(steps),
            "steps": steps, "solution": format_solution(steps, final)}


# ---------------------------------------------------------------------------------------------------------------
# Public entry point
# ---------------------------------------------------------------------------------------------------------------

def load_task_dataset(source: str = "synthetic", split: str = "train", *, question_field: str | None = None,
                      answer_field: str | None = None, prompt_field: str | None = None,
                      completion_field: str | None = None, ground_truth_field: str | None = None,
                      max_samples: int | None = None, seed: int = 0, numeric_ground_truth: bool = True,
                      keep_annotations: bool = False, hub_config: str | None = None,
                      synthetic_seed: int = 0, synthetic_train_size: int = 2000,
                      synthetic_test_size: int = SYNTHETIC_TEST_SIZE, text_answers: bool = False,
                      **synthetic_knobs):
    """Canonical task rows (``question answer ground_truth num_steps steps solution``) as a ``datasets.Dataset``.

    ``seed`` only drives the ``max_samples`` draw (and registered / ``module:function`` sources). The synthetic
    task is generated from ``synthetic_seed`` (default 0), kept apart from ``seed`` so that runs with different
    training seeds train and evaluate on the same problems: its test split depends on ``synthetic_seed`` and
    ``synthetic_test_size`` alone and never shares a question with its train split. ``synthetic_knobs``
    (``kind``, ``min_steps``, ``max_steps``, ``max_operand``, ``max_factor``, ``max_answer``, ``ops``, ``digits``;
    see :func:`agentic_rl.data.synthetic.generate_synthetic`) apply to the synthetic sources only.

    ``text_answers`` (always on for ``synthetic:world`` and ``synthetic:memory``) reads answers that are names or
    short text, as HotpotQA/NQ-style QA files hold them: the ``answer`` string (or ``ground_truth``), or an
    ``answers`` list of which any counts (stored in ``ground_truth`` as a JSON list); the verifier compares them as
    names.
    """
    if question_field and prompt_field:
        raise ConfigError("give question_field or prompt_field, not both")
    if answer_field and completion_field:
        raise ConfigError("give answer_field or completion_field, not both")
    options = dict(synthetic_knobs)
    source_seed = seed
    if source.startswith("synthetic"):
        options.update(train_size=synthetic_train_size, test_size=synthetic_test_size)
        source_seed = synthetic_seed
    records = _resolve_source(source, split, source_seed, hub_config, options)
    if not records.rows:
        raise DataError(f"{records.origin}: no rows in split '{split}'")
    task_columns = TASK_DATA_COLUMNS.get(source, ()) if source in DATASETS else ()
    rows = []
    for i in sample_indices(len(records.rows), max_samples, seed):
        raw = records.rows[i]
        row = task_row(raw, records.where(i), question_field=question_field or prompt_field,
                       answer_field=answer_field or completion_field, ground_truth_field=ground_truth_field,
                       numeric_ground_truth=numeric_ground_truth, keep_annotations=keep_annotations,
                       text_answers=text_answers or source in TEXT_ANSWER_DATASETS)
        if task_columns:
            row[TASK_DATA] = json.dumps({k: raw[k] for k in task_columns if k in raw}, ensure_ascii=False)
        rows.append(row)
    return rows_to_dataset(rows)
