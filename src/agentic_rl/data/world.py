"""A seeded fictional world: people, places and organisations whose facts no model can know, for the search and
memory environments and for the embedded base's pretraining lines.

A world is drawn from a seed (an int for task worlds, a string for the corpus's own worlds). People have unique
names of two capitalised two-syllable words ("Orla Venkel"); places are a word with an optional suffix ("Dunmor
Bay"); organisations are a word and a kind ("Salmi Guild", told as "the Salmi Guild"). Every person was born in a
place, lives in a place, works at an organisation and has a mentor (another person); every organisation is located
in a place. :func:`passages` gives one passage per person and organisation holding all its facts (places are only
objects of facts, so they have none); :func:`questions` asks templated questions of 1 to N hops
("Where was the mentor of Orla Venkel born?") with one answer, the titles a perfect agent looks up in order
(``chain``) and the passages it needs (``supporting``).

:func:`world_splits` gives train and test questions about ONE world per seed: the world is the corpus the search
tool retrieves from, so both splits ask about the same passages, and they never share a question. The test split
depends only on the seed, ``n_test`` and the world's size (not on ``n_train``).

:func:`memory_episodes` gives event logs (one fact sentence per turn, distractors mixed in) that end with a question.
:func:`world_corpus` gives pretraining lines from worlds of their own seed namespace (never a task world): passage
texts, search layouts (question, ``{"query": title}`` and the retrieved passage per hop, the answer), memory layouts
(notes stored as ``{"key": ..., "text": ...}``, one recalled) and name copies; :func:`world_tokenizer_lines` gives
lines of the same kinds for the tokenizer corpus, so names' syllables and the JSON keys become few tokens.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from agentic_rl.errors import ConfigError

#: Short syllables that read aloud and that BPE merges: names are two of them per word, capitalised.
SYLLABLES = ("ba", "bren", "cal", "da", "dor", "dun", "el", "fen", "ga", "hal", "is", "ka", "kel", "la", "lin", "lo",
             "ma", "mi", "mor", "na", "nel", "or", "pa", "ren", "ri", "ro", "rus", "sa", "sel", "ta", "tam", "ti",
             "to", "ul", "va", "ven", "vo", "wen", "ya", "zo")
PLACE_SUFFIXES = ("Bay", "Ford", "Hill", "Vale", "Port", "Cross")
ORGANISATION_KINDS = ("Guild", "Institute", "Company", "Library")
RELATIONS = ("born_in", "lives_in", "works_at", "mentor", "located_in")
#: The sentence that states each relation in a passage (organisations take "the" inside a sentence).
SENTENCES = {
    "born_in": "{subject} was born in {object}.",
    "lives_in": "{subject} lives in {object}.",
    "works_at": "{subject} works at the {object}.",
    "mentor": "The mentor of {subject} is {object}.",
    "located_in": "The {subject} is located in {object}.",
}
#: The same facts as a note about the subject (the text a memory note stores under the subject's name).
NOTES = {
    "born_in": "born in {object}",
    "lives_in": "lives in {object}",
    "works_at": "works at the {object}",
    "mentor": "mentor is {object}",
    "located_in": "located in {object}",
}
#: The question asked about the last relation of a path; ``{who}`` is the person ("the mentor of Orla Venkel").
LAST_HOP = {
    "born_in": "Where was {who} born?",
    "lives_in": "Where does {who} live?",
    "works_at": "Where does {who} work?",
    "mentor": "Who is the mentor of {who}?",
    "located_in": "Where is the organisation that {who} works for located?",  # follows works_at, then located_in
}


@dataclass(frozen=True)
class World:
    """People, places, organisations and the facts between them: ``(subject, relation, object)`` triples."""

    seed: int | str
    people: tuple[str, ...]
    places: tuple[str, ...]
    organisations: tuple[str, ...]
    facts: tuple[tuple[str, str, str], ...]
    _lookup: dict[tuple[str, str], str] = field(default_factory=dict, repr=False, compare=False, hash=False)

    def __post_init__(self):
        object.__setattr__(self, "_lookup", {(s, r): o for s, r, o in self.facts})

    def get(self, subject: str, relation: str) -> str:
        """The object of ``subject``'s ``relation`` (each subject has at most one of each relation)."""
        try:
            return self._lookup[(subject, relation)]
        except KeyError:
            raise ConfigError(f"the world has no {relation!r} fact about {subject!r}") from None


def fact_sentence(subject: str, relation: str, obj: str) -> str:
    """The passage sentence that states one fact ("Orla Venkel was born in Dunmor Bay.")."""
    return SENTENCES[relation].format(subject=subject, object=obj)


def note_text(relation: str, obj: str) -> str:
    """The fact as a note under its subject's name ("born in Dunmor Bay")."""
    return NOTES[relation].format(object=obj)


def _check_count(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"world {name} must be an integer >= {minimum}; got {value!r}")


def _word(rng: random.Random, syllables: int = 2) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()


def make_world(seed: int | str = 0, n_people: int = 60, n_places: int = 20, n_orgs: int = 12) -> World:
    """A world drawn from ``seed`` alone (the same seed and sizes give the same world; another seed, other names and
    facts). Int seeds are the task worlds; string seeds name worlds of their own (the pretraining corpus's)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, str)):
        raise ConfigError(f"world seed must be an integer or a string; got {seed!r}")
    _check_count("n_people", n_people, 2)  # a mentor is another person
    _check_count("n_places", n_places, 1)
    _check_count("n_orgs", n_orgs, 1)
    words = len(SYLLABLES) ** 2
    if n_places + n_orgs > words // 2:
        raise ConfigError(f"world n_places + n_orgs must be at most {words // 2}; got {n_places + n_orgs}")
    if n_people > words * words // 4:
        raise ConfigError(f"world n_people must be at most {words * words // 4}; got {n_people}")
    rng = random.Random(f"agentic-rl-world:{seed}")
    people: list[str] = []
    titles: set[str] = set()
    while len(people) < n_people:
        name = f"{_word(rng)} {_word(rng)}"
        if name not in titles:
            titles.add(name)
            people.append(name)
    used_words: set[str] = set()  # a place's or organisation's word names nothing else, so a query finds one

    def fresh_word() -> str:
        while True:
            word = _word(rng, rng.choice((2, 2, 3)))
            if word not in used_words:
                used_words.add(word)
                return word

    places = [fresh_word() + (f" {rng.choice(PLACE_SUFFIXES)}" if rng.random() < 0.5 else "")
              for _ in range(n_places)]
    organisations = [f"{fresh_word()} {rng.choice(ORGANISATION_KINDS)}" for _ in range(n_orgs)]
    facts: list[tuple[str, str, str]] = []
    for index, person in enumerate(people):
        mentor = people[(index + rng.randrange(1, n_people)) % n_people]  # any other person
        facts += [(person, "born_in", rng.choice(places)), (person, "lives_in", rng.choice(places)),
                  (person, "works_at", rng.choice(organisations)), (person, "mentor", mentor)]
    facts += [(organisation, "located_in", rng.choice(places)) for organisation in organisations]
    return World(seed, tuple(people), tuple(places), tuple(organisations), tuple(facts))


def passages(world: World) -> list[dict]:
    """One passage ``{"id", "title", "text"}`` per person, then per organisation: every fact of the subject, one
    sentence each, in the order of :data:`RELATIONS`. Ids are ``p0000``, ``p0001``, ... in that order."""
    texts: dict[str, list[str]] = {title: [] for title in (*world.people, *world.organisations)}
    for subject, relation, obj in world.facts:
        texts[subject].append(fact_sentence(subject, relation, obj))
    return [{"id": f"p{index:04d}", "title": title, "text": " ".join(sentences)}
            for index, (title, sentences) in enumerate(texts.items())]


def _paths(hops: int) -> list[tuple[str, ...]]:
    """The relation paths of ``hops`` lookups: mentors, then a person's relation or their organisation's place."""
    mentors = ("mentor",) * (hops - 1)
    paths = [mentors + (last,) for last in ("born_in", "lives_in", "works_at", "mentor")]
    if hops >= 2:
        paths.append(("mentor",) * (hops - 2) + ("works_at", "located_in"))
    return paths


def _ask(path: tuple[str, ...], person: str) -> str:
    mentors = len(path) - (2 if path[-1] == "located_in" else 1)
    return LAST_HOP[path[-1]].format(who="the mentor of " * mentors + person)


def _question_row(world: World, ids: dict[str, str], path: tuple[str, ...], person: str) -> dict | None:
    """The question of ``path`` about ``person``, or None when its chain visits an entity twice."""
    chain = [person]
    for relation in path[:-1]:
        chain.append(world.get(chain[-1], relation))
    if len(set(chain)) < len(chain):
        return None
    return {"question": _ask(path, person), "answer": world.get(chain[-1], path[-1]), "hops": len(path),
            "chain": chain, "supporting": [ids[title] for title in chain]}


def _check_hops(hops: Iterable[int]) -> tuple[int, ...]:
    hops = tuple(hops)
    if not hops or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in hops):
        raise ConfigError(f"world question hops must be integers >= 1; got {list(hops)}")
    return tuple(sorted(set(hops)))


def questions(world: World, n: int, seed: int = 0, hops: Iterable[int] = (1, 2, 3), *,
              exclude: Iterable[str] = ()) -> list[dict]:
    """``n`` distinct questions with one answer each, as even as possible over ``hops``, in a seeded order.

    Each row: ``{"question", "answer", "hops", "chain", "supporting"}``; ``chain`` lists the passage titles to look
    up in order (its length is ``hops``), ``supporting`` their passage ids. Questions in ``exclude`` are never asked.
    """
    _check_count("question count", n, 0)
    hop_counts = _check_hops(hops)
    excluded = set(exclude)
    ids = {p["title"]: p["id"] for p in passages(world)}
    rng = random.Random(f"agentic-rl-world-questions:{seed}")
    rows: list[dict] = []
    for position, h in enumerate(hop_counts):
        want = n // len(hop_counts) + (1 if position < n % len(hop_counts) else 0)
        pool = [row for person in world.people for path in _paths(h)
                if (row := _question_row(world, ids, path, person)) and row["question"] not in excluded]
        if len(pool) < want:
            raise ConfigError(f"world {world.seed!r} has {len(pool)} distinct {h}-hop questions left; {want} asked "
                              f"(raise n_people, currently {len(world.people)}, or ask fewer questions)")
        rows += rng.sample(pool, want)
    rng.shuffle(rows)
    return rows


def world_splits(n_train: int, n_test: int, seed: int = 0, *, hops: Iterable[int] = (1, 2, 3), n_people: int = 200,
                 n_places: int = 40, n_orgs: int = 20) -> tuple[World, list[dict], list[dict]]:
    """ONE world per seed and its questions split in two: ``(world, train, test)``.

    The world is the corpus the search tool retrieves from, so train and test share it; they never share a
    question. The test rows depend only on the seed, ``n_test``, ``hops`` and the world's size (not on ``n_train``);
    train rows come from a separate stream that skips the test questions.
    """
    world = make_world(seed, n_people, n_places, n_orgs)
    test = questions(world, n_test, seed, hops)
    train = questions(world, n_train, seed + 1_000_003, hops, exclude={row["question"] for row in test})
    return world, train, test


def memory_episodes(world: World, n: int, seed: int = 0, n_facts: tuple[int, int] = (3, 6),
                    hops: Iterable[int] = (1, 2), *, exclude: Iterable[str] = (),
                    distractor_first: bool = False) -> list[dict]:
    """``n`` event logs: ``{"events", "question", "answer", "hops", "needed", "facts", "chain"}``.

    ``events`` are fact sentences, one per turn, between ``n_facts[0]`` and ``n_facts[1]`` of them (at least the
    needed ones): the facts the question's chain needs, with distractor facts of the same world mixed in (other
    people's, or the same person's other relations; a world has one fact per subject and relation, so a distractor
    never contradicts the answer). ``needed`` are the indices of the events the answer needs, in order; ``facts``
    the ``[subject, relation, object]`` of each event; ``chain`` the subjects of the needed facts, in order.
    ``distractor_first`` makes the first event a distractor (a log needs one more event than its needed facts).
    """
    _check_count("episode count", n, 0)
    if (not isinstance(n_facts, (tuple, list)) or len(n_facts) != 2
            or any(isinstance(k, bool) or not isinstance(k, int) for k in n_facts)
            or not 1 <= n_facts[0] <= n_facts[1]):
        raise ConfigError(f"world n_facts must be two integers 1 <= low <= high; got {n_facts!r}")
    hop_counts = _check_hops(hops)
    excluded = set(exclude)
    ids = {p["title"]: p["id"] for p in passages(world)}
    rng = random.Random(f"agentic-rl-world-memory:{seed}")
    rows: list[dict] = []
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise ConfigError(f"world {world.seed!r} has too few memory questions outside exclude for {n} episodes")
        path = rng.choice(_paths(rng.choice(hop_counts)))
        row = _question_row(world, ids, path, rng.choice(world.people))
        if row is None or row["question"] in excluded:
            continue
        chain = row["chain"]
        needed_facts = [(chain[i], path[i], chain[i + 1]) for i in range(len(chain) - 1)]
        needed_facts.append((chain[-1], path[-1], row["answer"]))
        first = int(distractor_first)  # the first slot a needed fact may take
        total = max(rng.randint(*n_facts), len(needed_facts) + first)
        needed_set = set(needed_facts)
        distractors = rng.sample([f for f in world.facts if f not in needed_set],
                                 min(total - len(needed_facts), len(world.facts) - len(needed_facts)))
        slots = sorted(rng.sample(range(first, len(distractors) + len(needed_facts)), len(needed_facts)))
        events: list[tuple[str, str, str]] = list(distractors)
        for slot, fact in zip(slots, needed_facts):
            events.insert(slot, fact)
        rows.append({"events": [fact_sentence(*fact) for fact in events], "question": row["question"],
                     "answer": row["answer"], "hops": row["hops"], "needed": slots,
                     "facts": [list(fact) for fact in events], "chain": list(chain)})
    return rows


def corpus_world(seed: int, index: int, namespace: str = "corpus") -> World:
    """The ``index``-th world of the pretraining corpus of ``seed``: a string seed, so never a task world."""
    return make_world(f"{namespace}:{seed}:{index}")


def search_layout(row: dict, texts: dict[str, str]) -> str:
    """A question, then per hop the search arguments and the passage found, then the answer (one line)."""
    parts = [row["question"]]
    for title in row["chain"]:
        parts += [json.dumps({"query": title}), texts[title]]
    return " ".join(parts + [row["answer"]])


def memory_layout(world: World, rng: random.Random) -> str:
    """2-4 notes stored under distinct people's names, then one of them recalled and its text copied back."""
    people = rng.sample(world.people, rng.randint(2, 4))
    notes = []
    for person in people:
        relation = rng.choice(RELATIONS[:4])  # a person's relations (located_in is an organisation's)
        notes.append((person, note_text(relation, world.get(person, relation))))
    key, text = rng.choice(notes)
    stored = [json.dumps({"key": k, "text": t}) for k, t in notes]
    return " ".join(stored + [json.dumps({"key": key}), text])


def copy_layout(world: World, rng: random.Random) -> str:
    """2-4 names (people, places, organisations), `` -> ``, the same names."""
    pools = (world.people, world.people, world.places, world.organisations)
    names = ", ".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(2, 4)))
    return f"{names} -> {names}"


KINDS = ("passage", "search", "memory", "copy")


def _corpus(n_lines: int, seed: int, namespace: str, shares: dict[str, float], lines_per_world: int) -> list[str]:
    _check_count("n_lines", n_lines, 0)
    _check_count("lines_per_world", lines_per_world, 1)
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 for v in shares.values()) or \
            abs(sum(shares.values()) - 1) > 1e-6:
        raise ConfigError("world corpus shares must be non-negative and sum to 1; got "
                          + ", ".join(f"{k}_share={v}" for k, v in shares.items()))
    counts = {kind: int(n_lines * shares[kind]) for kind in KINDS}
    for kind in sorted(KINDS, key=lambda k: n_lines * shares[k] - counts[k], reverse=True)[:n_lines - sum(
            counts.values())]:
        counts[kind] += 1  # the largest remainders round up, so the counts sum to n_lines
    rng = random.Random(f"agentic-rl-world-{namespace}:{seed}")
    kinds = [kind for kind in KINDS for _ in range(counts[kind])]
    rng.shuffle(kinds)
    lines: list[str] = []
    for index, start in enumerate(range(0, n_lines, lines_per_world)):
        chunk = kinds[start:start + lines_per_world]
        world = corpus_world(seed, index, namespace)
        texts = {p["title"]: p["text"] for p in passages(world)}
        n_search = chunk.count("search")
        asked = questions(world, min(n_search, 3 * len(world.people)), rng.randrange(1 << 30)) if n_search else []
        searched = 0
        for kind in chunk:
            if kind == "passage":
                lines.append(texts[rng.choice(list(texts))])
            elif kind == "search":
                lines.append(search_layout(asked[searched % len(asked)], texts))
                searched += 1
            elif kind == "memory":
                lines.append(memory_layout(world, rng))
            else:
                lines.append(copy_layout(world, rng))
    return lines


def world_corpus(n_lines: int, seed: int = 0, *, passage_share: float = 0.3, search_share: float = 0.35,
                 memory_share: float = 0.2, copy_share: float = 0.15, lines_per_world: int = 200) -> list[str]:
    """Exactly ``n_lines`` single-line pretraining strings from the corpus's own worlds (a new world every
    ``lines_per_world`` lines, never a task world), shuffled, in the given shares:

    * passage texts;
    * search layouts: ``Where was the mentor of A born? {"query": "A"} <A's passage> {"query": "B"} <B's passage>
      <answer>``, the query written by ``json.dumps`` as in a tool call;
    * memory layouts: ``{"key": "A", "text": "born in X"} ... {"key": "A"} born in X``;
    * name copies: ``A, B, C -> A, B, C``.
    """
    shares = {"passage": passage_share, "search": search_share, "memory": memory_share, "copy": copy_share}
    return _corpus(n_lines, seed, "corpus", shares, lines_per_world)


def world_tokenizer_lines(n: int, seed: int = 0) -> list[str]:
    """Lines for the tokenizer corpus: the four kinds of :func:`world_corpus` from worlds of their own, so names'
    syllables, the passage sentences and the JSON keys (``{"query": ``, ``{"key": ``, ``"text": ``) merge."""
    shares = {"passage": 0.4, "search": 0.25, "memory": 0.2, "copy": 0.15}
    return _corpus(n, seed, "tokenizer", shares, 200)
