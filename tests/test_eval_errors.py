"""Error analysis: each category from hand-made completions, the precedence order, and the summary."""

from __future__ import annotations

import pytest

from agentic_rl.eval.error_analysis import (CATEGORIES, categorize, question_numbers, reference_intermediates,
                                            summarize_errors)

# A GSM8K-shaped row as load_task_dataset returns it (steps without annotations, raw answer with them).
ROW = {
    "question": "Janet's ducks lay 16 eggs per day. She eats three for breakfast and bakes muffins with 4. "
                "She sells the rest for $2 per egg. How much does she make every day?",
    "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day.\n"
              "#### 18",
    "ground_truth": "18",
    "num_steps": 2,
    "steps": ["Janet sells 16 - 3 - 4 = 9 duck eggs a day.", "She makes 9 * 2 = $18 every day."],
}


def test_reference_intermediates_and_question_numbers():
    assert reference_intermediates(ROW) == [9.0]  # step results without the final answer
    assert sorted(question_numbers(ROW["question"])) == [2.0, 3.0, 4.0, 16.0]  # "three" is read as 3
    # no steps: the raw GSM8K answer's lines and annotations are read instead
    row = {"ground_truth": "72", "answer": "Half: 48/2 = <<48/2=24>>24\nTotal: 48+24 = <<48+24=72>>72\n#### 72"}
    assert reference_intermediates(row) == [24.0]
    assert reference_intermediates({"ground_truth": "72", "full_answer": row["answer"]}) == [24.0]  # GRPO rows
    ours = {"ground_truth": "14", "answer": "12 + 7 = 19\n19 - 5 = 14\nFinal Answer: 14"}
    assert reference_intermediates(ours) == [19.0]


@pytest.mark.parametrize("completion, category", [
    # format: no final-answer marker, even though the right number is there
    ("16 - 3 - 4 = 9\n9 * 2 = 18\nSo she makes 18 dollars.", "format"),
    # format: a marker without a number
    ("16 - 3 - 4 = 9\nFinal Answer: eighteen", "format"),
    # format: two different final answers (hedging) count as no answer
    ("9 * 2 = 18\nFinal Answer: 18\nFinal Answer: 20", "format"),
    # calculation: 16 - 3 - 4 written as 10, the rest consistent
    ("16 - 3 - 4 = 10\n10 * 2 = 20\nFinal Answer: 20", "calculation"),
    # calculation: a wrong multiplication at the end
    ("16 - 3 - 4 = 9\n9 * 2 = 19\nFinal Answer: 19", "calculation"),
    # understanding: stops at the intermediate quantity (eggs sold, not dollars)
    ("16 - 3 - 4 = 9\nFinal Answer: 9", "understanding"),
    # understanding: returns a number copied from the question
    ("She has 16 eggs.\nFinal Answer: 16", "understanding"),
    # understanding: a number the question writes as a word ("three")
    ("Final Answer: 3", "understanding"),
    # reasoning: correct arithmetic, wrong plan (forgot the muffins), answer not a quantity of the problem
    ("16 - 3 = 13\n13 * 2 = 26\nFinal Answer: 26", "reasoning"),
    # reasoning: no equations at all and an unrelated number
    ("I think it is a lot.\nFinal Answer: 57", "reasoning"),
])
def test_each_category_from_hand_made_completions(completion, category):
    got, reason = categorize(completion, ROW)
    assert got == category, reason
    assert reason


def test_precedence_order():
    assert CATEGORIES == ("format", "calculation", "understanding", "reasoning")
    # format beats calculation: a wrong equation and no final answer
    assert categorize("16 - 3 - 4 = 10\n10 * 2 = 20", ROW)[0] == "format"
    # calculation beats understanding: the answer is an intermediate (9) but an equation is wrong
    assert categorize("16 - 3 = 12\n12 - 4 = 9\nFinal Answer: 9", ROW)[0] == "calculation"
    # the calculation reason names the equation and the right value
    assert "16 - 3 = 12" in categorize("16 - 3 = 12\nFinal Answer: 9", ROW)[1]


def test_summarize_errors_counts_shares_examples():
    records = []
    for i, cat in enumerate(["format", "format", "format", "calculation", None, "reasoning"]):
        records.append({"index": i, "question": f"q{i}", "completion": f"c{i}", "extracted_strict": None,
                        "ground_truth": "1", "category": cat, "category_reason": "why"})
    s = summarize_errors(records, num_examples=2)
    assert s["num_wrong"] == 5
    assert s["counts"] == {"format": 3, "calculation": 1, "understanding": 0, "reasoning": 1}
    assert s["shares"]["format"] == pytest.approx(0.6) and s["shares"]["understanding"] == 0.0
    assert [e["index"] for e in s["examples"]["format"]] == [0, 1]  # capped at num_examples
    assert s["examples"]["understanding"] == []
    assert summarize_errors([])["shares"]["format"] is None
