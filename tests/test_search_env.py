"""The search environment: BM25 retrieval over a world or a user's corpus, the step rewards of useful, repeated and
empty searches, name answers scored by the verifier, demonstrations that solve every question, the synthetic:world
dataset, and a user's own corpus + QA files through SFT, GRPO and evaluation."""

from __future__ import annotations

import json

import pytest
from conftest import read_jsonl, write_jsonl

from agentic_rl.agent.env import make_environment
from agentic_rl.agent.retrieval import Retriever, read_corpus, words
from agentic_rl.agent.search_env import NO_RESULT, SearchEnv
from agentic_rl.agent.tool_format import render_tool_call
from agentic_rl.data import load_task_dataset
from agentic_rl.data.custom import WORLD_TEST_POOL, task_world
from agentic_rl.data.world import passages
from agentic_rl.errors import ConfigError, DataError
from agentic_rl.rewards import is_correct

CORPUS = [
    {"id": "d1", "title": "Mont Blanc", "text": "Mont Blanc is the highest mountain of the Alps, at 4806 metres."},
    {"id": "d2", "title": "Lake Geneva", "text": "Lake Geneva lies between Switzerland and France."},
    {"id": "d3", "text": "The Rhone flows through Lake Geneva and reaches the sea near Marseille."},
]
QA = [
    {"question": "Which city does the Rhone reach the sea near?", "answer": "Marseille"},
    {"question": "What is the highest mountain of the Alps?", "answers": ["Mont Blanc", "Monte Bianco"]},
    {"question": "Which countries does Lake Geneva lie between?", "answer": "Switzerland and France"},
    {"question": "Where does the Rhone flow through?", "answers": ["Lake Geneva"]},
]


def search(query: str) -> str:
    return render_tool_call("search", {"query": query})


@pytest.fixture(scope="module")
def world_rows():
    return load_task_dataset("synthetic:world", "test", synthetic_test_size=120).to_list()


@pytest.fixture
def user_files(tmp_path):
    return write_jsonl(tmp_path / "corpus.jsonl", CORPUS), write_jsonl(tmp_path / "qa.jsonl", QA)


# ---------------------------------------------------------------------------------------------------------------
# Retrieval
# ---------------------------------------------------------------------------------------------------------------

def test_the_retriever_finds_each_entitys_own_passage_by_its_name():
    world = task_world(0)
    texts = passages(world)
    retriever = Retriever(texts)
    for passage in texts[::7]:
        assert retriever.search(passage["title"], 1) == [passage]
        assert retriever.search(passage["title"].upper(), 1) == [passage]  # names match whatever their case
    person = world.people[3]
    found = retriever.search(person, 3)
    assert found[0]["title"] == person and len(found) == 3  # then passages that share a word of the name
    assert all(set(words(person)) & set(words(p["text"])) for p in found)
    assert retriever.search("Zzyzx Qwop", 3) == [] and retriever.search("", 1) == []


def test_a_user_corpus_with_a_bad_row_is_a_one_line_error_naming_file_line_and_field(tmp_path):
    cases = [
        ([{"id": "a", "text": "x"}, {"text": "no id"}], r"c\.jsonl line 2: missing or empty field 'id'"),
        ([{"id": "a", "text": "x"}, {"id": "b", "text": "  "}], r"c\.jsonl line 2: missing or empty field 'text'"),
        ([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}], r"c\.jsonl line 2: field 'id': duplicate id 'a' "
                                                               r"\(first at line 1\)"),
        ([{"id": "a", "text": "x", "title": 3}], r"c\.jsonl line 1: field 'title' must be a string"),
        ([], r"c\.jsonl: the corpus has no passages"),
    ]
    for rows, message in cases:
        path = write_jsonl(tmp_path / "c.jsonl", rows)
        with pytest.raises(DataError, match=message) as info:
            read_corpus(path)
        assert "\n" not in str(info.value)
    (tmp_path / "c.jsonl").write_text('{"id": "a", "text": "x"}\n\n{oops\n')
    with pytest.raises(DataError, match=r"c\.jsonl line 3: malformed JSON"):
        read_corpus(tmp_path / "c.jsonl")
    with pytest.raises(ConfigError, match="not found"):
        SearchEnv(corpus=str(tmp_path / "missing.jsonl"))


# ---------------------------------------------------------------------------------------------------------------
# Answers: names through the project's verifier
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("completion, truth, correct", [
    ("Final Answer: Orla Venn", "Orla Venn", True),
    ("Final Answer: orla  venn.", "Orla Venn", True),
    ("**Final Answer:** **The Salmi Guild**", "Salmi Guild", True),
    ("Final Answer: Salmi Guild", "the Salmi Guild", True),
    ("Final Answer: Orla Venn or Tavo Ruskel", "Orla Venn", False),  # strict: one name only
    ("Final Answer: Orla Venn, Tavo Ruskel", "Orla Venn", False),
    ("Final Answer: Orla Venn\nor Tavo Ruskel", "Orla Venn", False),
    ("Final Answer: Orla Venn\nFinal Answer: Tavo Ruskel", "Orla Venn", False),  # two different answers
    ("Final Answer: Orla", "Orla Venn", False),
    ("Orla Venn", "Orla Venn", False),  # no answer line
    ("Final Answer: Monte Bianco", '["Mont Blanc", "Monte Bianco"]', True),  # any accepted answer
    ("Final Answer: Mont Blanc or Monte Bianco", '["Mont Blanc", "Monte Bianco"]', False),
    ("Final Answer: 72", "72", True),  # numbers as before
    ("Final Answer: 12 or 13", "12", False),
])
def test_name_answers_are_exact_after_normalisation_and_hold_one_name(completion, truth, correct):
    assert is_correct(completion, truth) is correct


# ---------------------------------------------------------------------------------------------------------------
# Step rewards and episode statistics
# ---------------------------------------------------------------------------------------------------------------

def test_useful_repeated_and_empty_searches_and_right_wrong_and_hedged_answers(world_rows):
    env = SearchEnv()
    row = next(r for r in world_rows if r["question"].startswith("Where was the mentor of "))  # two hops
    person = row["question"].removeprefix("Where was the mentor of ").removesuffix(" born?")
    mentor = task_world(0).get(person, "mentor")
    stranger = next(p for p in task_world(0).people if p not in (person, mentor))

    env.reset(row)
    assert env.step(search(person)).reward == pytest.approx(0.1)  # a passage the answer needs
    assert env.step(search(person.lower())).reward == pytest.approx(-0.05)  # the same query again
    assert env.step(search("Zzyzx Qwop")).reward == pytest.approx(-0.05)  # nothing found
    result = env.step(search(stranger))  # found, but not needed: no reward, no cost
    assert result.reward == 0.0 and stranger in result.text
    assert env.episode_metrics() == {"searches": 4.0, "useful_searches": 1.0, "wasted_searches": 2.0,
                                     "useful_search_rate": 0.25}
    answer = env.step(f"Final Answer: {row['ground_truth']}")  # the 5th turn: the last one is the answer
    assert answer.done and answer.reward == 1.0 and answer.info["correct"]

    for text, reward in ((f"Final Answer: {row['ground_truth']}", 1.0), ("Final Answer: Nowhere", 0.0),
                         (f"Final Answer: {row['ground_truth']} or {stranger}", 0.0)):
        env.reset(row)
        assert env.step(text).reward == reward
    assert env.episode_metrics() == {"searches": 0.0, "useful_searches": 0.0, "wasted_searches": 0.0}
    env.reset(row)
    assert env.step(search(mentor)).reward == pytest.approx(0.1)  # the second hop's passage
    assert env.step(search("")).text == NO_RESULT


def test_rewards_and_limits_are_settings_and_bad_values_are_one_line_errors():
    env = make_environment("search", useful_search_reward=0.3, wasted_search_reward=-0.2, max_tool_calls=1)
    env.reset({"question": "Which river is longest?", "ground_truth": "x"})
    assert env.step(search("Zzyzx")).reward == pytest.approx(-0.2)
    assert env.step(search("other")).text.startswith("error: the limit of 1 tool calls")
    for kwargs, message in (({"top_k": 0}, "top_k"), ({"wasted_search_reward": 0.1}, "wasted_search_reward"),
                            ({"corpus": "nowhere.jsonl"}, "corpus"), ({"wrong_search_fraction": 2}, "wrong_search"),
                            ({"world_seed": "a"}, "world_seed"), ({"useful_search_reward": "lots"}, "useful_search")):
        with pytest.raises(ConfigError, match=message):
            SearchEnv(**kwargs)


def test_top_k_returns_that_many_passages():
    env = SearchEnv(top_k=3)
    env.reset({"question": "q", "ground_truth": "x"})
    person = task_world(0).people[0]
    assert len(env.step(search(person)).text.splitlines()) == 3


# ---------------------------------------------------------------------------------------------------------------
# Demonstrations
# ---------------------------------------------------------------------------------------------------------------

def _replay(env, row, demo):
    env.reset(row)
    rewards, result = [], None
    for message in demo:
        if message["role"] == "assistant":
            result = env.step(message["content"])
            rewards.append(result.reward)
        else:
            assert result is not None and result.observation == [message]  # the tool returns what was shown
    return result, rewards


def test_demonstrations_solve_every_world_question_of_one_to_three_hops_when_replayed(world_rows):
    env = SearchEnv()
    assert {r_hops for r_hops in (len(env.demonstration(r)) // 2 for r in world_rows)} == {1, 2, 3}
    for row in world_rows:
        demo = env.demonstration(row)
        result, rewards = _replay(env, row, demo)
        hops = len(demo) // 2
        assert result.done and result.info["correct"], row["question"]
        assert rewards == pytest.approx([0.1] * hops + [1.0])
        assert env.episode_metrics()["useful_search_rate"] == 1.0
    assert SearchEnv(tools_enabled=False).demonstration(world_rows[0]) == [
        {"role": "assistant", "content": f"Final Answer: {world_rows[0]['ground_truth']}"}]


def test_imperfect_demonstrations_search_a_wrong_person_first_or_skip_a_hop(world_rows):
    detour = SearchEnv(wrong_search_fraction=1.0)
    for row in world_rows[:30]:
        result, rewards = _replay(detour, row, detour.demonstration(row))
        assert result.info["correct"] and rewards[0] == 0.0 and rewards[-1] == 1.0  # a lookup the answer does not need
    skipper = SearchEnv(skipped_hop_fraction=1.0)
    multi = [r for r in world_rows if len(SearchEnv().demonstration(r)) > 3][:30]
    for row in multi:
        demo = skipper.demonstration(row)
        result, _ = _replay(skipper, row, demo)
        assert len(demo) == len(SearchEnv().demonstration(row)) - 2  # one search fewer
        assert not result.info["correct"] or demo[-1]["content"] == f"Final Answer: {row['ground_truth']}"
    half = SearchEnv(wrong_search_fraction=0.3)
    changed = sum(half.demonstration(r) != SearchEnv().demonstration(r) for r in world_rows)
    assert 0.15 * len(world_rows) < changed < 0.45 * len(world_rows)  # a share, chosen by the question


def test_a_rows_own_chain_and_supporting_passages_decide_what_is_useful(tmp_path):
    env = SearchEnv(corpus=str(write_jsonl(tmp_path / "c.jsonl", CORPUS)))
    row = {"question": "Where does the river through Lake Geneva reach the sea?", "ground_truth": "Marseille",
           "chain": ["Lake Geneva", "Rhone"], "supporting": ["d2", "d3"]}
    assert [m["content"] for m in env.demonstration(row) if m["role"] == "assistant"] == [
        search("Lake Geneva"), search("Rhone"), "Final Answer: Marseille"]
    env.reset(row)
    assert env.step(search("Lake Geneva")).reward == pytest.approx(0.1)  # d2 does not hold the answer, but is needed
    assert env.step(search("Mont Blanc")).reward == 0.0


def test_a_world_corpus_of_another_seed_is_a_one_line_error(world_rows):
    with pytest.raises(ConfigError, match="world_seed"):
        SearchEnv(world_seed=1).demonstration(world_rows[0])


# ---------------------------------------------------------------------------------------------------------------
# Data: synthetic:world and a user's QA file
# ---------------------------------------------------------------------------------------------------------------

def test_the_world_dataset_has_name_answers_disjoint_splits_and_prefix_test_splits():
    from agentic_rl.data.custom import DATASETS

    raw = DATASETS["synthetic:world"]("test", 0, test_size=30)
    assert set(raw[0]) == {"question", "answer", "hops", "chain", "supporting"}
    assert {r["hops"] for r in raw} == {1, 2, 3}
    test = load_task_dataset("synthetic:world", "test", synthetic_test_size=300)["question"]
    assert load_task_dataset("synthetic:world", "test", synthetic_test_size=50)["question"] == test[:50]
    train = load_task_dataset("synthetic:world", "train", synthetic_train_size=3000)
    assert not set(train["question"]) & set(load_task_dataset(
        "synthetic:world", "test", synthetic_test_size=WORLD_TEST_POOL)["question"])
    assert load_task_dataset("synthetic:world", "test", synthetic_test_size=5, synthetic_seed=1)["question"] != test[:5]
    with pytest.raises(ConfigError, match="synthetic_test_size"):
        load_task_dataset("synthetic:world", "test", synthetic_test_size=WORLD_TEST_POOL + 1)
    with pytest.raises(ConfigError, match=r"too few questions for 9000 training rows .* \(max_train_samples\)$"):
        load_task_dataset("synthetic:world", "train", synthetic_train_size=9000)


def test_the_data_command_shows_the_world_questions_and_refuses_step_settings(capsys):
    from agentic_rl.cli import main

    assert main(["data", "stats", "--source", "synthetic:world", "--split", "test", "--synthetic-test-size", "60"]) == 0
    assert "answers: 60 not numbers" in capsys.readouterr().out
    assert main(["data", "preview", "--source", "synthetic:world", "--n", "1", "--max-steps", "5"]) == 2
    assert "synthetic:world takes no synthetic option (max_steps)" in capsys.readouterr().err


def test_a_user_qa_file_reads_answer_strings_and_answer_lists(user_files, tmp_path):
    corpus, qa = user_files
    rows = load_task_dataset(str(qa), "train", text_answers=True).to_list()
    assert [r["ground_truth"] for r in rows] == ["Marseille", json.dumps(["Mont Blanc", "Monte Bianco"]),
                                                 "Switzerland and France", "Lake Geneva"]
    with pytest.raises(DataError, match=r"not a number|no final answer"):
        load_task_dataset(str(qa), "train")  # without text answers the numeric checks stay
    for bad, message in (({"question": "q?", "answers": []}, r"line 1: field 'answers' \(the answers\) is an empty"),
                         ({"question": "q?", "answers": ["a", ""]}, r"line 1: field 'answers' \(the answer\) is empty"),
                         ({"question": "q?", "answers": [{"a": 1}]}, r"line 1: field 'answers': an answer must be"),
                         ({"question": "q?"}, r"line 1: missing field 'answer'")):
        with pytest.raises(DataError, match=message):
            load_task_dataset(str(write_jsonl(tmp_path / "bad.jsonl", [bad])), "train", text_answers=True)

    from agentic_rl.agent.tasks import demonstration
    from agentic_rl.data import to_sft_dataset

    # Shown without the environment (SFT's direct rows, single-turn SFT): the first accepted answer, no steps.
    assert [demonstration(r, tools=False)[0]["content"] for r in rows[:2]] == ["Final Answer: Marseille",
                                                                               "Final Answer: Mont Blanc"]
    assert [c[-1]["content"] for c in to_sft_dataset(rows[:2])["completion"]] == ["Final Answer: Marseille",
                                                                                  "Final Answer: Mont Blanc"]
    env = SearchEnv(corpus=str(corpus))
    for row in rows:
        demo = env.demonstration(row)
        assert demo[0]["content"] == search(row["question"])  # no chain: one search with the question
        result, rewards = _replay(env, row, demo)
        assert result.info["correct"] and rewards == pytest.approx([0.1, 1.0])  # the passage holds the answer
    env.reset(rows[0])
    assert env.step(search("Mont Blanc")).reward == 0.0  # found, but it does not hold the answer
    long_corpus = write_jsonl(tmp_path / "long.jsonl", [{"id": "x", "text": "Filler words. " * 60 + "The Rhone "
                                                         "reaches the sea near MARSEILLE."}])
    env = SearchEnv(corpus=str(long_corpus))
    env.reset(rows[0])
    assert env.step(search("Rhone sea")).reward == pytest.approx(0.1)  # the answer's words, anywhere in the passage


# ---------------------------------------------------------------------------------------------------------------
# A user's own corpus + QA files through the stages
# ---------------------------------------------------------------------------------------------------------------

def test_a_users_corpus_and_qa_files_train_sft_and_two_grpo_steps_and_evaluate(tiny_model_dir, user_files, tmp_path):
    from agentic_rl.cli import main

    corpus, qa = user_files
    common = ["--environment", "search", "--environment-args", json.dumps({"corpus": str(corpus)}),
              "--dataset", str(qa), "--no-tools-in-prompt", "--max-turn-tokens", "12"]
    assert main(["sft", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path / "sft"), "--max-steps", "2",
                 "--batch-size", "2", "--max-length", "256", "--report-to", "none", "--full", *common]) == 0
    sft_model = tmp_path / "sft" / "model"
    assert (sft_model / "model.safetensors").is_file()
    assert main(["grpo", "--model", str(sft_model), "--output-dir", str(tmp_path / "grpo"), "--max-steps", "2",
                 "--num-generations", "2", "--batch-size", "4", "--max-completion-length", "48",
                 "--heldout-every", "0", "--gradient-accumulation-steps", "1", "--learning-rate", "0.01",
                 "--report-to", "none", "--full", *common]) == 0
    rollouts = read_jsonl(tmp_path / "grpo" / "rollouts.jsonl")
    assert len(rollouts) == 2 and "return" in rollouts[0]
    assert main(["eval", str(tmp_path / "grpo" / "model"), "--output-dir", str(tmp_path / "eval"),
                 "--eval-samples", "4", "--split", "train", "--max-new-tokens", "48", *common]) == 0
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["num_prompts"] == 4 and {"accuracy", "accuracy_without_tools"} <= set(metrics)
    assert {"searches", "useful_searches", "wasted_searches"} <= set(metrics["with_tools"])
    episodes = read_jsonl(tmp_path / "eval" / "episodes_with_tools.jsonl")
    assert {e["question"] for e in episodes} == {r["question"] for r in QA}


def test_the_run_report_and_summary_show_the_search_statistics(tmp_path):
    from agentic_rl.pipeline import ENVIRONMENT_SUMMARY_KEYS
    from agentic_rl.report import write_pipeline_report

    metrics = {"environment": "search", "num_prompts": 8, "accuracy_strict": 0.5, "accuracy_without_tools": 0.125,
               "tool_call_rate": 0.75, "useful_call_rate": 0.5, "tool_error_rate": 0.0, "turns_per_episode": 2.5,
               "searches": 1.625, "useful_search_rate": 0.8}
    report = write_pipeline_report(tmp_path, {"name": "s", "seed": 0, "stages": {"sft": {"metrics": metrics}}})
    lines = report.read_text().splitlines()
    header = next(line for line in lines if line.startswith("| stage |"))
    assert header.endswith("| searches / episode | useful searches | 95 % interval |")
    assert "| 2.50 | 1.62 | 80.0% |" in next(line for line in lines if line.startswith("| sft |"))
    assert {"searches", "useful_search_rate"} <= set(ENVIRONMENT_SUMMARY_KEYS)


# ---------------------------------------------------------------------------------------------------------------
# Answer attempts: feedback after a wrong answer, and retry demonstrations
# ---------------------------------------------------------------------------------------------------------------

def test_a_wrong_answer_with_attempts_left_is_answered_by_feedback_and_the_episode_goes_on(world_rows):
    from agentic_rl.agent.env import DEFAULT_FEEDBACK

    row = next(r for r in world_rows if len(SearchEnv().demonstration(r)) == 3)  # one search, then the answer
    person = SearchEnv().lookups(row)["chain"][0]
    right, wrong = f"Final Answer: {row['ground_truth']}", "Final Answer: Nowhere"
    env = SearchEnv(answer_attempts=2, wrong_attempt_reward=-0.3)
    env.reset(row)
    first = env.step(wrong)
    assert (first.done, first.reward, first.info["kind"]) == (False, -0.3, "retry")
    assert first.observation == [{"role": "user", "content": DEFAULT_FEEDBACK}]
    assert env.step(search(person)).reward == pytest.approx(0.1)  # it may search again before its next answer
    last = env.step(right)
    assert (last.done, last.reward, last.info["correct"]) == (True, 1.0, True)
    assert env.episode_metrics() | {"searches": 1.0} == {
        "attempts": 2.0, "success_at_1": 0.0, "success_at_2": 1.0, "searches": 1.0, "useful_searches": 1.0,
        "wasted_searches": 0.0, "useful_search_rate": 1.0}
    # the last attempt's wrong answer ends the episode at 0; so does max_turns, and one attempt without tools
    env.reset(row)
    assert [(r.done, r.reward) for r in (env.step(wrong), env.step(wrong))] == [(False, -0.3), (True, 0.0)]
    assert env.episode_metrics()["success_at_2"] == 0.0
    short = SearchEnv(answer_attempts=3, max_turns=2)
    short.reset(row)
    assert [short.step(wrong).done, short.step(wrong).done] == [False, True]
    alone = SearchEnv(answer_attempts=2, tools_enabled=False)
    alone.reset(row)
    assert alone.step(wrong).done
    # one attempt (the default) reports no attempt statistics, as before
    plain = SearchEnv()
    plain.reset(row)
    assert plain.step(wrong).done and "attempts" not in plain.episode_metrics()


def test_attempt_settings_are_checked():
    with pytest.raises(ConfigError, match="answer_attempts"):
        SearchEnv(answer_attempts=0)
    with pytest.raises(ConfigError, match="needs answer_attempts of at least 2"):
        SearchEnv(retry_demonstration_fraction=0.5)
    with pytest.raises(ConfigError, match="retry_demonstration_fraction"):
        SearchEnv(answer_attempts=2, retry_demonstration_fraction=1.5)
    with pytest.raises(ConfigError, match="feedback"):
        SearchEnv(answer_attempts=2, feedback="  ")


def test_retry_demonstrations_misread_a_fact_of_the_answers_kind_then_answer_right(world_rows):
    from agentic_rl.agent.env import DEFAULT_FEEDBACK
    from agentic_rl.data.world import RELATIONS

    env = SearchEnv(top_k=2, answer_attempts=2, retry_demonstration_fraction=1.0, max_turns=6)
    world = env.world
    kinds = {"born_in": "place", "lives_in": "place", "located_in": "place", "works_at": "organisation",
             "mentor": "person"}
    objects = {kind: {o for _, r, o in world.facts if kinds[r] == kind} for kind in set(kinds.values())}
    seen_kinds = set()
    for row in world_rows[:60]:
        plain = SearchEnv(top_k=2).demonstration(row)
        demo = env.demonstration(row)
        wrong = demo[-3]
        assert demo[:-3] == plain[:-1] and demo[-1] == plain[-1]  # the same searches and the same right answer
        assert wrong["train"] is False and demo[-2] == {"role": "user", "content": DEFAULT_FEEDBACK}
        name = wrong["content"].removeprefix("Final Answer: ")
        kind = kinds[env.lookups(row)["path"][-1]]
        assert name != row["ground_truth"] and name in objects[kind], (row["question"], name)
        last = env.lookups(row)["chain"][-1]
        sibling = {o for subject, r, o in world.facts if subject == last and kinds[r] == kind} - {row["ground_truth"]}
        assert not sibling or name in sibling  # "lives in" for "born in": the same entity's other fact of the kind
        read = [m["content"] for m in demo if m["role"] == "tool"]
        assert any(name in text for text in read) or not any(  # read in the episode's passages, when they hold one
            o in text for o in objects[kind] - {row["ground_truth"]} for text in read)
        seen_kinds.add(kind)
        result, rewards = _replay(env, row, demo)
        assert result.info["correct"] and rewards[-2:] == [-0.2, 1.0]
    assert seen_kinds == {"place", "organisation", "person"} and len(RELATIONS) == 5
    # a share of the questions, drawn apart from the wrong-search share; skipped hops keep their wrong answer
    share = SearchEnv(answer_attempts=2, retry_demonstration_fraction=0.3, wrong_search_fraction=0.3)
    retried = [r for r in world_rows if share.demonstration(r)[-2]["role"] == "user"]
    detoured = [r for r in world_rows if share.demonstration(r)[0] != SearchEnv().demonstration(r)[0]]
    assert 0.15 * len(world_rows) < len(retried) < 0.45 * len(world_rows)
    assert 0 < len({r["question"] for r in retried} & {r["question"] for r in detoured}) < len(retried)
    skipper = SearchEnv(answer_attempts=2, retry_demonstration_fraction=1.0, skipped_hop_fraction=1.0)
    multi = [r for r in world_rows if len(SearchEnv().demonstration(r)) > 3][:10]
    assert all(m["role"] != "user" for r in multi for m in skipper.demonstration(r))


def test_a_calculator_retry_demonstration_answers_one_more_first():
    from agentic_rl.agent.calculator_env import CalculatorEnv
    from agentic_rl.agent.env import DEFAULT_FEEDBACK

    task = {"question": "A farm has 23 boxes with 47 eggs in each box. How many eggs are there?",
            "answer": "23 * 47 = <<23*47=1081>>1081\n#### 1081", "ground_truth": "1081"}
    plain = CalculatorEnv().demonstration(task)
    demo = CalculatorEnv(answer_attempts=2, retry_demonstration_fraction=1.0).demonstration(task)
    assert demo[:-1][:len(plain) - 1] == plain[:-1] and demo[-1] == plain[-1]
    assert demo[-3] == {"role": "assistant", "content": plain[-1]["content"].replace("Final Answer: 1081",
                                                                                      "Final Answer: 1082"),
                        "train": False}
    assert demo[-2] == {"role": "user", "content": DEFAULT_FEEDBACK}
