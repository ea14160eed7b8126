"""The seeded fictional world: deterministic by seed, answers that follow from the passages' text, disjoint splits,
memory episodes whose needed events hold the answer, and pretraining lines from worlds no task uses."""

import json
import re

import pytest

from agentic_rl.data.world import (KINDS, make_world, memory_episodes, passages, questions, world_corpus,
                                   world_splits, world_tokenizer_lines)
from agentic_rl.errors import ConfigError

#: The passage sentences, read back from text alone (test-side, independent of the module's templates).
READ = {
    "born_in": "{s} was born in (.+?)\\.",
    "lives_in": "{s} lives in (.+?)\\.",
    "works_at": "{s} works at the (.+?)\\.",
    "mentor": "The mentor of {s} is (.+?)\\.",
    "located_in": "The {s} is located in (.+?)\\.",
}


def read_fact(texts: dict[str, str], subject: str, relation: str) -> str:
    found = re.findall("(?:^| )" + READ[relation].format(s=re.escape(subject)) + "(?= |$)", texts[subject])
    assert len(found) == 1, (subject, relation, texts[subject])
    return found[0]


def resolve(texts: dict[str, str], who: str, visited: list[str]) -> str:
    """The person a phrase like "the mentor of the mentor of X" names, walking the passages (recording each one)."""
    person = who
    if who.startswith("the mentor of "):
        person = read_fact(texts, resolve(texts, who[len("the mentor of "):], visited), "mentor")
    visited.append(person)
    return person


def answer_from_passages(texts: dict[str, str], question: str) -> tuple[str, list[str]]:
    """The answer of a question recomputed by reading passages only, and the titles read in order."""
    visited: list[str] = []
    patterns = [(r"Where was (.+) born\?", ("born_in",)), (r"Where does (.+) live\?", ("lives_in",)),
                (r"Where does (.+) work\?", ("works_at",)), (r"Who is the mentor of (.+)\?", ("mentor",)),
                (r"Where is the organisation that (.+) works for located\?", ("works_at", "located_in"))]
    for pattern, relations in patterns:
        match = re.fullmatch(pattern, question)
        if match:
            entity = resolve(texts, match.group(1), visited)
            for relation in relations:
                if relation != relations[0]:
                    visited.append(entity)
                entity = read_fact(texts, visited[-1], relation)
            return entity, visited
    raise AssertionError(f"unparsed question {question!r}")


def test_the_same_seed_gives_the_same_world_and_another_seed_another():
    assert make_world(3) == make_world(3) and passages(make_world(3)) == passages(make_world(3))
    assert questions(make_world(3), 40, seed=5) == questions(make_world(3), 40, seed=5)
    assert questions(make_world(3), 40, seed=5) != questions(make_world(3), 40, seed=6)
    names = [set(make_world(seed).people) for seed in range(10)]
    assert all(len(a & b) < 5 for i, a in enumerate(names) for b in names[i + 1:])
    assert make_world(1).facts != make_world(2).facts


def test_a_world_has_unique_titles_and_every_fact_in_its_subjects_passage():
    world = make_world(7, n_people=200, n_places=40, n_orgs=20)
    assert len(set(world.people)) == 200 and len(set(world.places)) == 40 and len(set(world.organisations)) == 20
    found = passages(world)
    titles = [p["title"] for p in found]
    assert len(set(titles)) == len(titles) == 220 and len({p["id"] for p in found}) == 220
    assert all(re.fullmatch(r"[A-Z][a-z]+ [A-Z][a-z]+", person) for person in world.people)
    texts = {p["title"]: p["text"] for p in found}
    for subject, relation, obj in world.facts:
        assert read_fact(texts, subject, relation) == obj
    mentors = [(s, o) for s, r, o in world.facts if r == "mentor"]
    assert len(mentors) == 200 and all(s != o for s, o in mentors)
    assert {r for _, r, _ in world.facts} == {"born_in", "lives_in", "works_at", "mentor", "located_in"}


def test_every_answer_follows_from_the_passages_along_its_chain():
    world = make_world(11, n_people=80)
    found = passages(world)
    texts = {p["title"]: p["text"] for p in found}
    ids = {p["title"]: p["id"] for p in found}
    rows = questions(world, 300, seed=2, hops=(1, 2, 3))
    assert len({r["question"] for r in rows}) == 300
    assert {r["hops"] for r in rows} == {1, 2, 3} and [r["hops"] for r in rows].count(3) == 100
    for row in rows:
        answer, visited = answer_from_passages(texts, row["question"])
        assert row["answer"] == answer and row["chain"] == visited, row
        assert row["hops"] == len(row["chain"]) == len(set(row["chain"]))
        assert row["supporting"] == [ids[title] for title in row["chain"]]


def test_questions_refuse_bad_settings_and_more_questions_than_the_world_holds():
    world = make_world(0, n_people=5)
    with pytest.raises(ConfigError, match="1-hop questions"):
        questions(world, 90, hops=(1,))
    with pytest.raises(ConfigError, match="hops"):
        questions(world, 3, hops=(0, 2))
    with pytest.raises(ConfigError, match="n_people"):
        make_world(0, n_people=1)
    with pytest.raises(ConfigError, match="seed"):
        make_world(1.5)


def test_splits_are_disjoint_and_the_test_split_ignores_the_train_size():
    world, train, test = world_splits(300, 120, seed=4, n_people=100)
    _, train_big, test_again = world_splits(900, 120, seed=4, n_people=100)
    assert test == test_again and len(test) == 120 and len(train) == 300 and len(train_big) == 900
    test_questions = {r["question"] for r in test}
    assert not test_questions & {r["question"] for r in train_big}
    assert world == make_world(4, 100, 40, 20)
    assert world_splits(10, 120, seed=5, n_people=100)[2] != test


def test_memory_episodes_hold_the_answer_in_their_needed_events():
    world = make_world(2)
    texts = {p["title"]: p["text"] for p in passages(world)}
    rows = memory_episodes(world, 100, seed=1, n_facts=(3, 6))
    assert rows == memory_episodes(world, 100, seed=1, n_facts=(3, 6))
    assert {r["hops"] for r in rows} == {1, 2}
    for row in rows:
        events = row["events"]
        assert 3 <= len(events) <= 6 and len(row["needed"]) == row["hops"]
        needed = [events[i] for i in row["needed"]]
        assert row["answer"] in needed[-1] and needed[-1].endswith(f"{row['answer']}.")
        # the question is answerable from the needed events alone (a world of just those sentences)
        subjects = {}
        for sentence in needed:
            for title in texts:
                if sentence.startswith((f"{title} ", f"The mentor of {title} ", f"The {title} ")):
                    subjects.setdefault(title, []).append(sentence)
        answer, _ = answer_from_passages({t: " ".join(s) for t, s in subjects.items()}, row["question"])
        assert answer == row["answer"]
        assert all(e in " ".join(texts.values()) for e in events)  # every event is a true fact of the world
    with pytest.raises(ConfigError, match="n_facts"):
        memory_episodes(world, 1, n_facts=(4, 2))


def kind_of(line: str) -> str:
    if line.startswith('{"key": '):
        return "memory"
    if " -> " in line:
        return "copy"
    if '{"query": ' in line:
        return "search"
    return "passage"


def test_world_corpus_gives_exactly_n_single_lines_of_every_kind():
    lines = world_corpus(1000, seed=0)
    assert len(lines) == 1000 and all(isinstance(x, str) and "\n" not in x and x for x in lines)
    kinds = [kind_of(x) for x in lines]
    assert {k: kinds.count(k) for k in KINDS} == {"passage": 300, "search": 350, "memory": 200, "copy": 150}
    assert all(set(kinds[start:start + 100]) == set(KINDS) for start in range(0, 1000, 100))  # mixed throughout
    assert world_corpus(1000, seed=0) == lines and world_corpus(1000, seed=1) != lines
    assert len(world_corpus(7, seed=0, copy_share=0.0, memory_share=0.35)) == 7
    with pytest.raises(ConfigError, match="copy_share"):
        world_corpus(10, copy_share=0.5)


def test_world_corpus_layouts_copy_what_a_tool_call_would():
    lines = world_corpus(600, seed=3)
    for line in lines:
        kind = kind_of(line)
        if kind == "search":
            question, *hops = re.split(r' (?=\{"query": )', line)
            answer = hops[-1].rsplit(". ", 1)[1]
            retrieved = {}
            for hop in hops:
                call, rest = hop.split("} ", 1)
                title = json.loads(call + "}")["query"]
                assert hop.startswith(json.dumps({"query": title}) + " ")
                retrieved[title] = rest if hop != hops[-1] else rest.rsplit(". ", 1)[0] + "."
            assert answer_from_passages(retrieved, question) == (answer, list(retrieved))
        elif kind == "memory":
            calls = re.findall(r"\{[^}]*\}", line)
            notes = {json.loads(c)["key"]: json.loads(c)["text"] for c in calls[:-1]}
            assert 2 <= len(notes) <= 4 and line == " ".join(calls) + " " + notes[json.loads(calls[-1])["key"]]
        elif kind == "copy":
            left, right = line.split(" -> ")
            assert left == right and 2 <= len(left.split(", ")) <= 4


def test_world_corpus_never_uses_a_task_worlds_names_or_facts():
    lines = world_corpus(2000, seed=0)
    corpus_people = {m.group(1) for line in lines for m in re.finditer(r"\{\"query\": \"([^\"]+)\"\}", line)}
    text = "\n".join(lines)
    for seed in range(10):
        world = make_world(seed)
        assert set(world.people) != corpus_people and len(set(world.people) & corpus_people) <= 3
        for p in passages(world):
            assert p["text"] not in text


def test_world_tokenizer_lines_hold_the_json_keys_and_names():
    lines = world_tokenizer_lines(400, seed=0)
    assert len(lines) == 400 and all("\n" not in x for x in lines)
    joined = " ".join(lines)
    assert joined.count('{"query": "') >= 100 and joined.count('{"key": "') >= 100 and joined.count('"text": "') >= 80
    assert {kind_of(x) for x in lines} == set(KINDS)
    assert world_tokenizer_lines(400, seed=0) == lines and not set(lines) & set(world_corpus(400, seed=0))
