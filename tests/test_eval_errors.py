"""Error analysis: each category from hand-made completions, the precedence order, and the summary."""

from __future__ import annotations

import json

import pytest

from agentic_rl.eval.error_analysis import (CATEGORIES, EPISODE_CATEGORIES, MEMORY_EPISODE_CATEGORIES,
                                            SEARCH_EPISODE_CATEGORIES, categorize, categorize_episode,
                                            categorize_memory_episode, categorize_search_episode,
                                            count_episode_errors, episode_calls, episode_classifier,
                                            question_numbers, reference_intermediates, reference_steps,
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


# ---------------------------------------------------------------------------------------------------------------
# Calculator episodes: each class from hand-made episodes
# ---------------------------------------------------------------------------------------------------------------

# A row of the embedded agentic task: a multiplication, a detail sentence ("23 days"), then one + step.
TOOL_ROW = {"question": "Noah plants 26 rows of tulips with 57 tulips in each row. The job is done in 23 days. "
                        "He plants 32 more tulips. What is the total now?",
            "ground_truth": "1514", "steps": ["26 * 57 = 1482", "1482 + 32 = 1514"]}


def tool_episode(*calls, answer="Final Answer: 1450", tool="calculator", argument="expression"):
    """An episode's messages as the rollout records them: each (argument, result) a call and its tool message."""
    messages = []
    for value, result in calls:
        messages.append({"role": "assistant", "content": "<tool_call>\n" + json.dumps(
            {"name": tool, "arguments": {argument: value}}) + "\n</tool_call>"})
        messages.append({"role": "tool", "content": result, "name": tool})
    return {"messages": messages + [{"role": "assistant", "content": answer}]}


@pytest.mark.parametrize("calls, answer, category", [
    ((), "Final Answer: 1514000", "no_call"),
    ((("26*57", "1482"), ("1482 +", "error: invalid expression")), "Final Answer: 1482", "call_error"),
    ((("26*57", "1482"), ("1482+32" * 40, "error: at most 200 characters")), "Final Answer: 1", "call_error"),
    ((("26*75", "1950"),), "Final Answer: 1950", "miscopied_call"),                  # first call miscopied
    ((("57*26", "1482"), ("1482+23", "1505")), "Final Answer: 1505", "miscopied_call"),  # the detail, not the step
    ((("26*57", "1482"), ("1482-32", "1450")), "Final Answer: 1450", "wrong_operation"),
    ((("26*57", "1482"), ("1482+32", "1514"), ("1514-2", "1512")), "Final Answer: 1512", "step_too_many"),
    ((("26*57", "1482"),), "Final Answer: 1482", "step_left_out"),
    ((("26*57", "1482"), ("1482+32", "1514")), "Final Answer: 1541", "answer_not_copied"),
])
def test_each_episode_category_from_hand_made_episodes(calls, answer, category):
    got, reason = categorize_episode(tool_episode(*calls, answer=answer), TOOL_ROW)
    assert got == category and reason


def test_episode_calls_and_reference_steps_from_steps_or_annotations():
    episode = tool_episode(("26*57", "1482"), ("1482+32", "1514"))
    assert episode_calls(episode) == [("26*57", "1482"), ("1482+32", "1514")]
    assert reference_steps(TOOL_ROW) == [("26 * 57", 1482.0), ("1482 + 32", 1514.0)]
    # GSM8K's rows: the steps in words are read first; a row with only the answer gives its annotations
    gsm8k = {"steps": ["She sells 16 - 3 - 4 = 9 eggs."],
             "answer": "She sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18"}
    assert reference_steps(gsm8k) == [("She sells 16 - 3 - 4", 9.0)]
    assert reference_steps({"answer": gsm8k["answer"]}) == [("16-3-4", 9.0), ("9*2", 18.0)]
    assert categorize_episode(tool_episode(("16-3-4", "9"), ("9*2", "18")), {"answer": gsm8k["answer"]})[0] == (
        "answer_not_copied")
    # a row without a reference solution gets no class
    assert categorize_episode(episode, {"question": "q", "ground_truth": "1"}) is None


def test_count_episode_errors():
    episodes = [{"category": "step_left_out"}, {"category": "step_left_out"}, {"category": "no_call"}, {}]
    counts = count_episode_errors(episodes)
    assert list(counts) == list(EPISODE_CATEGORIES)
    assert counts["step_left_out"] == 2 and counts["no_call"] == 1 and sum(counts.values()) == 3
    assert count_episode_errors([{}, {"correct": True}]) is None
    searches = count_episode_errors([{"category": "hop_left_out"}, {"category": "answer_misread"}])
    assert list(searches) == list(SEARCH_EPISODE_CATEGORIES) and sum(searches.values()) == 2


# "Where was the mentor of the mentor of Orla Venn born?" as a synthetic:world row carries it (chain in task_data).
SEARCH_ROW = {"question": "Where was the mentor of the mentor of Orla Venn born?", "ground_truth": "Dunmor Bay",
              "task_data": json.dumps({"hops": 3, "chain": ["Orla Venn", "Tavo Ruskel", "Salmi Guild"]})}
ORLA = ("Orla Venn", "Orla Venn lives in Isya. The mentor of Orla Venn is Tavo Ruskel.\n"
                     "Kel Orla lives in Vacal. The mentor of Kel Orla is Orla Venn.")
TAVO = ("Tavo Ruskel", "Tavo Ruskel works at the Salmi Guild. The mentor of Tavo Ruskel is Mira Tam.")
SALMI = ("the Salmi Guild", "The Salmi Guild is located in Dunmor Bay.")


def search_episode(*searches, answer="Final Answer: Dunmor Bay"):
    """A search episode as the rollout records it: each (query, result) a search and its tool message."""
    return tool_episode(*searches, answer=answer, tool="search", argument="query")


@pytest.mark.parametrize("searches, answer, category", [
    ((), "Final Answer: Isya", "no_search"),
    ((ORLA, ("Tavo", "error: the tool call is not closed with </tool_call>")), "Final Answer: Isya", "search_error"),
    ((ORLA, ("Kel Orla", "Kel Orla lives in Vacal.")), "Final Answer: Vacal", "lookup_misread"),  # the other passage
    ((ORLA, ("Tavo Ruskol", "Tavo Ruskel works at the Salmi Guild.")), "Final Answer: Isya", "lookup_miscopied"),
    ((ORLA, ORLA, TAVO), "Final Answer: Salmi Guild", "hop_left_out"),  # a repeat counts once: one hop short
    ((ORLA, TAVO, SALMI, ("Dunmor Bay", "no passage matches the query")), "Final Answer: Dunmor Bay",
     "hop_too_many"),
    ((ORLA, TAVO, SALMI), "I cannot tell.", "no_answer"),
    ((ORLA, TAVO, SALMI), "Final Answer: the Salmi Guild", "answer_misread"),  # a name read, not the asked fact
    ((ORLA, TAVO, SALMI), "Final Answer: Dunmor Vale", "answer_miscopied"),
])
def test_each_search_episode_category_from_hand_made_episodes(searches, answer, category):
    got, reason = categorize_search_episode(search_episode(*searches, answer=answer), SEARCH_ROW)
    assert got == category and reason


def test_search_episodes_need_a_chain_and_read_their_queries():
    episode = search_episode(ORLA, TAVO)
    assert episode_calls(episode, "query") == [ORLA, TAVO]
    assert categorize_search_episode(episode, {"question": "q", "ground_truth": "Isya"}) is None
    # the chain as a row read directly carries it, and names compared as answers are (case, a leading "the")
    row = {"chain": ["orla venn", "Tavo Ruskel", "The Salmi Guild"]}
    assert categorize_search_episode(search_episode(ORLA, TAVO, SALMI, answer="Final Answer: Isya"), row)[0] == (
        "answer_misread")


def test_episode_classifier_follows_the_tools_an_environment_offers():
    from types import SimpleNamespace

    from agentic_rl.agent.calculator_env import CalculatorEnv
    from agentic_rl.agent.memory_env import MemoryEnv

    assert episode_classifier(CalculatorEnv()) is categorize_episode
    assert episode_classifier(MemoryEnv()) is categorize_memory_episode
    searching = SimpleNamespace(offered_tools=[SimpleNamespace(name="lookup"), SimpleNamespace(name="search")])
    assert episode_classifier(searching) is categorize_search_episode
    assert episode_classifier(SimpleNamespace()) is None  # an environment without tools


# A synthetic:memory row as the dataset carries it: four events, the question's chain in the second and the fourth.
MEMORY_EVENTS = ["Kel Orla lives in Vacal.", "The mentor of Orla Venn is Tavo Ruskel.", "Mira Tam was born in Isya.",
                 "Tavo Ruskel was born in Dunmor Bay."]
MEMORY_ROW = {"question": f"Log 1. Event 1 of 4: {MEMORY_EVENTS[0]}", "ground_truth": "Dunmor Bay",
              "task_data": json.dumps({
                  "log_question": "Where was the mentor of Orla Venn born?", "events": MEMORY_EVENTS, "hops": 2,
                  "facts": [["Kel Orla", "lives_in", "Vacal"], ["Orla Venn", "mentor", "Tavo Ruskel"],
                            ["Mira Tam", "born_in", "Isya"], ["Tavo Ruskel", "born_in", "Dunmor Bay"]],
                  "needed": [1, 3], "chain": ["Orla Venn", "Tavo Ruskel"]})}
STORES = [("Kel Orla", "lives in Vacal"), ("Orla Venn", "mentor is Tavo Ruskel"), ("Mira Tam", "born in Isya"),
          ("Tavo Ruskel", "born in Dunmor Bay")]
RECALL_ORLA = ("Orla Venn", "mentor is Tavo Ruskel")
RECALL_TAVO = ("Tavo Ruskel", "born in Dunmor Bay")


def memory_episode(stores, recalls, answer):
    """A memory episode as the rollout records it: a remember call per event (each answered "stored", then the next
    event), the question, a recall call per (key, result), then the answer."""
    def call(name, **arguments):
        return {"role": "assistant", "content": "<tool_call>\n" + json.dumps(
            {"name": name, "arguments": arguments}) + "\n</tool_call>"}

    messages = []
    for number, (key, text) in enumerate(stores, 2):
        messages += [call("remember", key=key, text=text), {"role": "tool", "content": "stored", "name": "remember"},
                     {"role": "user", "content": f"Event {number} of 4: {MEMORY_EVENTS[(number - 1) % 4]}"}]
    messages.append({"role": "user", "content": "Question: Where was the mentor of Orla Venn born?"})
    for key, result in recalls:
        messages += [call("recall", key=key), {"role": "tool", "content": result, "name": "recall"}]
    return {"messages": messages + [{"role": "assistant", "content": answer}]}


@pytest.mark.parametrize("stores, recalls, answer, category", [
    (STORES[:3], (RECALL_ORLA,), "Final Answer: Tavo Ruskel", "fact_not_stored"),  # the last needed fact never stored
    ([*STORES[:3], ("Tavo Ruskol", "born in Dunmor Bay")],
     (RECALL_ORLA, ("Tavo Ruskel", "no note under 'Tavo Ruskel'")), "Final Answer: Isya",
     "fact_miscopied"),  # stored under a miscopied key
    ([*STORES[:3], ("Tavo Ruskel", "mentor is Mira Tam")], (RECALL_ORLA, ("Tavo Ruskel", "mentor is Mira Tam")),
     "Final Answer: Mira Tam", "fact_miscopied"),  # under the right key, without the fact's object
    (STORES, (), "Final Answer: Isya", "no_recall"),
    (STORES, (("Kel Orla", "lives in Vacal"),), "Final Answer: Vacal", "recall_misread"),  # a name of another event
    (STORES, (("Orla Ven", "no note under 'Orla Ven'"),), "Final Answer: Isya", "recall_miscopied"),
    (STORES, (RECALL_ORLA, RECALL_ORLA), "Final Answer: Tavo Ruskel", "recall_left_out"),  # a repeat counts once
    (STORES, (RECALL_ORLA, RECALL_TAVO, ("Dunmor Bay", "no note under 'Dunmor Bay'")), "Final Answer: Isya",
     "recall_too_many"),
    (STORES, (RECALL_ORLA, RECALL_TAVO), "I do not know.", "no_answer"),
    (STORES, (RECALL_ORLA, RECALL_TAVO), "Final Answer: Vacal", "answer_misread"),
    (STORES, (RECALL_ORLA, RECALL_TAVO), "Final Answer: Dunmor Vale", "answer_miscopied"),
])
def test_each_memory_episode_category_from_hand_made_episodes(stores, recalls, answer, category):
    got, reason = categorize_memory_episode(memory_episode(stores, recalls, answer), MEMORY_ROW)
    assert got == category and reason


def test_memory_episodes_need_a_chain_and_count_in_their_classes():
    episode = memory_episode(STORES, (RECALL_ORLA, RECALL_TAVO), "Final Answer: Vacal")
    assert categorize_memory_episode(episode, {"question": "q", "ground_truth": "Isya"}) is None
    # a note under the subject's key holding the object counts as stored, whatever its wording
    loose = [*STORES[:3], ("tavo ruskel", "Dunmor Bay is where he was born")]
    assert categorize_memory_episode(memory_episode(loose, (RECALL_ORLA, RECALL_TAVO), "Final Answer: Vacal"),
                                     MEMORY_ROW)[0] == "answer_misread"
    counts = count_episode_errors([{"category": "recall_left_out"}, {"category": "fact_not_stored"}])
    assert list(counts) == list(MEMORY_EPISODE_CATEGORIES) and sum(counts.values()) == 2
