"""BM25 retrieval over a local corpus of passages, for the ``search`` environment.

A :class:`Retriever` is built once from passages ``{"id", "text", "title"?}`` and answers ``search(query, k)`` with
the ``k`` best-scoring passages (fewer when fewer share a word with the query; none when none does). Passages and
queries are split into lowercase words (letters and digits, no stemming and no stop words), so a name query such as
"Orla Venn" matches the passages that spell the name, whatever its case. The title is indexed with the text.

The index is ``bm25s`` (Okapi BM25 as sparse matrices): pure Python on numpy, so it installs wherever numpy does,
with no compiled code of its own and no other service, and its scores can be read as arrays. ``pyserini`` runs
Lucene in a Java 21 virtual machine and brings dependencies that conflict with the project's; ``tantivy`` (Rust,
a platform wheel) indexes and answers faster, but at the sizes of a local corpus both take a small fraction of one
model turn, so the dependency that installs everywhere wins. ``benchmarks/bench_search.py`` measures both on a
synthetic corpus of 10,000 passages (``--also tantivy``).

Corpora: :func:`read_corpus` reads a user's JSONL file (one passage a line; a missing or empty ``id`` or ``text``,
a duplicate ``id`` or an empty file is a one-line error naming the file, the line and the field);
:func:`world_corpus_passages` gives the passages of the fictional world of ``synthetic:world``
(:func:`agentic_rl.data.world.passages`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from agentic_rl.errors import ConfigError, DataError

_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """The lowercase words of ``text`` (runs of letters and digits): the tokens of the index and of queries."""
    return _WORD.findall(str(text).lower())


def check_passages(passages: list[Any], origin: str = "corpus", places: list[str] | None = None
                   ) -> list[dict[str, str]]:
    """Passages as ``{"id", "text", "title"}`` strings (title "" when absent), or a one-line :class:`DataError`
    naming ``origin``, the passage (``places[i]``, e.g. "line 3"; default "passage i") and the field."""
    places = places or [f"passage {i}" for i in range(len(passages))]
    checked: list[dict[str, str]] = []
    first: dict[str, str] = {}
    for passage, place in zip(passages, places):
        where = f"{origin} {place}"
        if not isinstance(passage, dict):
            raise DataError(f"{where}: a passage must be a JSON object with 'id' and 'text', got "
                            f"{type(passage).__name__}")
        for field in ("id", "text"):
            value = passage.get(field)
            if value is None or (isinstance(value, str) and not value.strip()):
                raise DataError(f"{where}: missing or empty field '{field}'")
            if not isinstance(value, (str, int)) or isinstance(value, bool):
                raise DataError(f"{where}: field '{field}' must be a string, got {type(value).__name__}")
        title = passage.get("title") or ""
        if not isinstance(title, str):
            raise DataError(f"{where}: field 'title' must be a string, got {type(title).__name__}")
        passage_id = str(passage["id"])
        if passage_id in first:
            raise DataError(f"{where}: field 'id': duplicate id {passage_id!r} (first at {first[passage_id]})")
        first[passage_id] = place
        checked.append({"id": passage_id, "text": str(passage["text"]), "title": title})
    if not checked:
        raise DataError(f"{origin}: the corpus has no passages")
    return checked


def read_corpus(path: str | Path) -> list[dict[str, str]]:
    """The passages of a JSONL corpus file (``id``, ``text``, optional ``title``), checked by
    :func:`check_passages`; blank lines are skipped, and errors name the file's own line numbers."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"corpus file not found: {path}")
    rows: list[Any] = []
    places: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path} line {number}: malformed JSON ({exc.msg})") from None
            places.append(f"line {number}")
    return check_passages(rows, str(path), places)


class Retriever:
    """BM25 over ``passages`` (see the module docstring); ``search(query, k)`` returns passages, best first."""

    def __init__(self, passages: list[dict[str, Any]]):
        import bm25s

        self.passages = check_passages(list(passages))
        tokens = [words(f"{p['title']} {p['text']}") or [""] for p in self.passages]
        self.index = bm25s.BM25()
        self.index.index(tokens, show_progress=False)
        self.by_id = {p["id"]: p for p in self.passages}

    def __len__(self) -> int:
        return len(self.passages)

    def search(self, query: str, k: int = 1) -> list[dict[str, str]]:
        """The (at most) ``k`` passages that score best for ``query``; only passages sharing a word with it, ties
        in corpus order."""
        import numpy as np

        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        known = [w for w in words(query) if w in self.index.vocab_dict and w]
        if not known:
            return []
        scores = np.asarray(self.index.get_scores(known))
        order = np.argsort(-scores, kind="stable")[:k]
        return [self.passages[i] for i in order if scores[i] > 0]
