"""The embedded synthetic task: deterministic, arithmetically right, GSM8K-shaped, disjoint splits."""

import re
from collections import Counter

import pytest

from agentic_rl.data.synthetic import (DISTRACTORS, arithmetic_corpus, copy_corpus, generate_synthetic,
                                       multiplication_task, synthetic_splits)
from agentic_rl.errors import ConfigError

ANNOTATED_LINE = re.compile(r"^(\d+) ([-+*/]) (\d+) = <<(\d+)([-+*/])(\d+)=(\d+)>>(\d+)$")
EQUATION = re.compile(r"^(\d+) ([-+*/]) (\d+) = (\d+)$")
#: A detail sentence of the multiplication task (a number the answer does not use).
DETAIL_SENTENCE = re.compile("|".join(re.escape(t).replace(r"\{d\}", r"\d+").replace(r"\{name\}", "[A-Z][a-z]+")
                                      .replace(r"\{friend\}", "[A-Z][a-z]+") for t in DISTRACTORS))


def _exact(a: int, op: str, b: int) -> int | None:
    """The exact integer result of ``a op b`` (None when division is not exact), computed without eval."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a // b if b and a % b == 0 else None


def check_row(row, *, max_answer=None, min_steps=1, max_steps=3):
    """Every annotation right, the text equals the annotation, steps chained, #### equals the last result."""
    assert set(row) == {"question", "answer"}
    assert row["question"].endswith("?")
    lines = row["answer"].split("\n")
    assert lines[-1].startswith("#### ")
    final = int(lines[-1][5:])
    steps = lines[:-1]
    assert min_steps <= len(steps) <= max_steps, row
    previous = None
    for line in steps:
        m = ANNOTATED_LINE.match(line)
        assert m, f"not an annotated step: {line!r}"
        a, op, b, a2, op2, b2, c_ann, c_text = m.groups()
        assert (a, op, b, c_ann) == (a2, op2, b2, c_text)
        result = _exact(int(a), op, int(b))
        assert result is not None and result == int(c_ann) and result >= 0, line
        if max_answer is not None:
            assert result <= max_answer
        if previous is not None:  # each step after the first continues from the previous result
            assert int(a) == previous or op == "*" and int(b) == previous, row
        previous = result
    assert final == previous
    return steps, final


def test_rows_are_arithmetically_right_and_gsm8k_shaped():
    rows = generate_synthetic(1500, seed=3)
    assert len(rows) == 1500
    assert len({r["question"] for r in rows}) == 1500
    counts = Counter()
    for row in rows:
        steps, final = check_row(row, max_answer=150)
        counts[len(steps)] += 1
        for line in steps:
            counts[line.split()[1]] += 1
        # every operand that is not the previous result is mentioned in the question
        first = EQUATION.match(ANNOTATED_LINE.sub(lambda m: f"{m[1]} {m[2]} {m[3]} = {m[8]}", steps[0]))
        assert first and first[1] in re.findall(r"\d+", row["question"])
    # all step counts and all four operations occur in useful amounts
    assert all(counts[k] > 300 for k in (1, 2, 3)), counts
    assert all(counts[op] > 150 for op in "+-*/"), counts


def test_determinism_by_seed():
    assert generate_synthetic(200, seed=11) == generate_synthetic(200, seed=11)
    assert generate_synthetic(200, seed=11) != generate_synthetic(200, seed=12)
    assert generate_synthetic(50, seed=11) == generate_synthetic(200, seed=11)[:50]


def test_templates_entities_and_names_vary():
    rows = generate_synthetic(800, seed=0)
    names = Counter(r["question"].split()[0] for r in rows)
    assert len(names) > 30
    endings = Counter(r["question"].rsplit(".", 1)[-1].strip() for r in rows)
    assert len(endings) > 100  # question sentences differ by entity, owner and phrasing
    assert any("$" in r["question"] for r in rows)


@pytest.mark.parametrize("knobs", [
    {"min_steps": 1, "max_steps": 1},
    {"min_steps": 4, "max_steps": 5, "max_answer": 400},
    {"ops": ("+", "-"), "max_operand": 20, "max_answer": 60},
    {"ops": ("*", "/"), "max_factor": 5, "max_answer": 500},
])
def test_knobs_control_steps_ops_and_sizes(knobs):
    rows = generate_synthetic(300, seed=1, **knobs)
    ops = set()
    for row in rows:
        steps, _ = check_row(row, max_answer=knobs.get("max_answer", 150), min_steps=knobs.get("min_steps", 1),
                             max_steps=knobs.get("max_steps", 3))
        for line in steps:
            a, op, b = line.split()[:3]
            ops.add(op)
            if op in "+-" and "max_operand" in knobs:
                assert int(b) <= knobs["max_operand"]
            if op in "*/" and "max_factor" in knobs and line is not steps[0]:
                assert int(b) <= knobs["max_factor"]
    assert ops <= set(knobs.get("ops", "+-*/"))
    if "ops" in knobs:
        assert ops == set(knobs["ops"])


def test_splits_are_disjoint_deterministic_and_test_is_stable():
    train, test = synthetic_splits(2000, 300, seed=5)
    assert len(train) == 2000 and len(test) == 300
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    train2, test2 = synthetic_splits(500, 300, seed=5)
    assert test2 == test  # the evaluation set does not depend on the training size
    assert synthetic_splits(2000, 300, seed=5) == (train, test)
    assert synthetic_splits(2000, 300, seed=6)[1] != test


def test_multiplication_task_needs_a_real_multiplication():
    rows = multiplication_task(300, seed=2)
    assert rows == generate_synthetic(300, seed=2, kind="multiplication", min_steps=1, max_steps=2, max_operand=50)
    for row in rows:
        steps, final = check_row(row, min_steps=1, max_steps=2)
        a, op, b = steps[0].split()[:3]
        assert op == "*" and 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert a in row["question"] and b in row["question"]
    assert sum(len(check_row(r, max_steps=2)[0]) == 2 for r in rows) > 50
    three = multiplication_task(50, seed=2, digits=3, max_steps=1)
    assert all(len(r["answer"].split()[0]) == 3 for r in three)


def test_detail_sentences_hold_a_number_the_answer_does_not_use():
    plain = generate_synthetic(300, seed=4, kind="multiplication", max_steps=3)
    assert not any(DETAIL_SENTENCE.search(r["question"]) for r in plain)
    rows = generate_synthetic(300, seed=4, kind="multiplication", max_steps=3, distractors=1.0)
    for row in rows:
        steps, _ = check_row(row, min_steps=1, max_steps=3)
        details = list(DETAIL_SENTENCE.finditer(row["question"]))
        assert len(details) == 1, row["question"]
        rest = row["question"].replace(details[0].group(0), "")
        operands = [steps[0].split()[0], steps[0].split()[2]] + [step.split()[2] for step in steps[1:]]
        # without the detail, the question's numbers are the steps' operands, in the order told ("reads 16 pages a
        # day for 60 days" tells the second factor first)
        told = re.findall(r"\d+", rest)
        assert sorted(told[:2]) == sorted(operands[:2]) and told[2:] == operands[2:], row
    assert sum(len(check_row(r, max_steps=3)[0]) == 3 for r in rows) > 50
    # the detail goes anywhere after the opening sentence and before the question: right after the opening in some
    # problems, right before the question in others
    places = set()
    for row in rows:
        sentences = re.split(r"(?<=[.?])\s+", row["question"])
        where = next(i for i, sentence in enumerate(sentences) if DETAIL_SENTENCE.fullmatch(sentence))
        assert 1 <= where <= len(sentences) - 2, row["question"]
        places |= {("after opening", where == 1), ("before question", where == len(sentences) - 2)}
    assert places == {("after opening", True), ("after opening", False), ("before question", True),
                      ("before question", False)}
    half = generate_synthetic(400, seed=4, kind="multiplication", distractors=0.5)
    assert 160 < sum(bool(DETAIL_SENTENCE.search(r["question"])) for r in half) < 240  # 200 +- 4 sd
    with pytest.raises(ConfigError, match="distractors apply to kind 'multiplication'"):
        generate_synthetic(5, seed=0, distractors=0.5)
    with pytest.raises(ConfigError, match="share between 0 and 1"):
        generate_synthetic(5, seed=0, kind="multiplication", distractors=1.5)


def test_arithmetic_corpus_teaches_arithmetic_not_the_task_format():
    _, test = synthetic_splits(0, 200, seed=0)
    lines = arithmetic_corpus(3000, seed=0, exclude=[r["question"] for r in test])
    assert len(lines) == 3000
    assert lines == arithmetic_corpus(3000, seed=0, exclude=[r["question"] for r in test])
    equations = [line for line in lines if EQUATION.match(line)]
    sentences = [line for line in lines if not EQUATION.match(line)]
    assert 0.2 < len(sentences) / len(lines) < 0.4
    for line in equations:
        a, op, b, c = EQUATION.match(line).groups()
        assert _exact(int(a), op, int(b)) == int(c), line
    for line in lines:
        assert "\n" not in line and "Final Answer" not in line and "####" not in line and "<<" not in line
    assert not set(sentences) & {r["question"] for r in test}
    assert {line.split()[1] for line in equations} == set("+-*/")
    # chains: consecutive equation lines where the second starts from the first's result
    chained = sum(1 for x, y in zip(lines, lines[1:])
                  if EQUATION.match(x) and EQUATION.match(y) and y.split()[0] == x.split()[-1])
    assert chained > 200
    assert "6 * 7 = 42" in set(arithmetic_corpus(20000, seed=1))


def test_copy_corpus_lines_are_predictable_only_by_copying_earlier_numbers():
    _, test = synthetic_splits(0, 200, seed=0, kind="multiplication")
    excluded = [r["question"] for r in test]
    lines = copy_corpus(2000, seed=0, exclude=excluded)
    assert len(lines) == 2000 and lines == copy_corpus(2000, seed=0, exclude=excluded)
    lists = [line for line in lines if " -> " in line]
    problems = [line for line in lines if " -> " not in line]
    assert len(problems) == 1333 and all(line.split(" -> ")[0] == line.split(" -> ")[1] for line in lists)
    step = re.compile(r"(\d+)([-+*/])(\d+)=(\d+)")
    multiplications = 0
    for line in problems:
        question, steps = line.rsplit("?", 1)
        matches = [step.fullmatch(s) for s in steps.split()]
        assert matches and all(matches), line
        first, *rest = [m.groups() for m in matches]
        # the first step's operands are numbers of the question; every later step starts from the previous result
        assert first[0] in re.findall(r"\d+", question) and first[2] in re.findall(r"\d+", question), line
        for (_, _, _, before), (a, op, b, c) in zip([first, *rest], rest):
            assert a == before and _exact(int(a), op, int(b)) == int(c), line
        multiplications += first[1] == "*" and len(first[0]) == 2 and len(first[2]) == 2
    assert multiplications >= 500  # the multiplication task's questions are half of them
    assert not {line.rsplit("?", 1)[0] + "?" for line in problems} & set(excluded)
    with pytest.raises(ConfigError, match="problem_fraction"):
        copy_corpus(10, problem_fraction=1.5)


def test_copy_corpus_call_layout_writes_each_step_as_the_calculator_call_arguments():
    from agentic_rl.agent.tool_format import render_tool_call

    plain = copy_corpus(600, seed=3)
    call = copy_corpus(600, seed=3, layout="call")
    step = re.compile(r'(\{"expression": "([^"]+)"\}) (\d+)')
    assert len(call) == 600 and sum(" -> " in line for line in call) == 200
    for before, after in zip(plain, call):  # the same lines in the same order, only the steps written differently
        if " -> " in before:
            assert after == before
            continue
        question, steps = after.rsplit("?", 1)
        assert question == before.rsplit("?", 1)[0]
        found = step.findall(steps)
        assert step.sub("", steps).strip() == "" and found, after
        assert " ".join(f"{expression}={value}" for _, expression, value in found) == before.rsplit("? ", 1)[1]
        # the number is copied after the same text as in the agent's tool call
        for arguments, expression, _ in found:
            assert arguments in render_tool_call("calculator", {"expression": expression})
    with pytest.raises(ConfigError, match="copy layout must be one of plain, call"):
        copy_corpus(10, layout="json")


def test_copy_corpus_answer_layout_writes_the_steps_as_the_task_answer_lines():
    from agentic_rl.data.gsm8k import parse_gsm8k_answer

    plain = copy_corpus(600, seed=3)
    answer = copy_corpus(600, seed=3, layout="answer")
    assert len(answer) == 600 and sum(" -> " in line for line in answer) == 200
    for before, after in zip(plain, answer):  # the same lines in the same order, only the steps written differently
        if " -> " in before:
            assert after == before
            continue
        question, *steps = after.split("\n")
        assert question == before.rsplit("? ", 1)[0] + "?" and steps
        # '39*83=3237' becomes the line '39 * 83 = 3237', one per step
        assert [re.sub(r"(?<=\d)([-+*/=])(?=\d)", r" \1 ", step) for step in before.rsplit("? ", 1)[1].split()] == steps
    # ... which is how the task's own answers (and so SFT's demonstrations) write a step
    row = generate_synthetic(1, seed=5)[0]
    assert all(re.fullmatch(r"\d+ [-+*/] \d+ = \d+", step) for step in parse_gsm8k_answer(row["answer"])["steps"])


@pytest.mark.parametrize("knobs", [{"kind": "division"}, {"min_steps": 3, "max_steps": 2}, {"ops": ("%",)},
                                   {"max_operand": 1}])
def test_bad_knobs_are_config_errors(knobs):
    with pytest.raises(ConfigError):
        generate_synthetic(5, **knobs)
