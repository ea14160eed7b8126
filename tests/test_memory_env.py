"""The memory environment: events arrive one per turn and the question after the last, the step rewards of needed,
useless and repeated stores and of useful, missing and repeated recalls, answers scored by the verifier, episodes
without tools, demonstrations (perfect and with skipped stores) replayed through the environment, logs past
demonstration_max_hops left out of SFT, the synthetic:memory dataset and its columns' way to env.reset, the registry,
and the embedded tokenizer."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from agentic_rl.agent.env import environment_factory
from agentic_rl.agent.memory_env import MEMORY_SYSTEM_PROMPT, MemoryEnv
from agentic_rl.agent.rollout import reset_episode
from agentic_rl.agent.tool_format import render_tool_call
from agentic_rl.data import load_task_dataset, to_rl_dataset
from agentic_rl.data.custom import MEMORY_TEST_POOL
from agentic_rl.data.formats import build_prompt, task_with_data
from agentic_rl.errors import ConfigError, DataError

# A log of four events; the question needs events 2 and 4 (two hops: Ada Lin's mentor, then where he was born).
TASK = {
    "question": "Log 1. Event 1 of 4: Tam Ora lives in Kel Bay.",
    "ground_truth": "Mira Ford",
    "log_question": "Where was the mentor of Ada Lin born?",
    "events": ["Tam Ora lives in Kel Bay.", "The mentor of Ada Lin is Bo Rus.", "Cal Vo works at the Zo Guild.",
               "Bo Rus was born in Mira Ford."],
    "facts": [["Tam Ora", "lives_in", "Kel Bay"], ["Ada Lin", "mentor", "Bo Rus"], ["Cal Vo", "works_at", "Zo Guild"],
              ["Bo Rus", "born_in", "Mira Ford"]],
    "needed": [1, 3],
    "chain": ["Ada Lin", "Bo Rus"],
    "hops": 2,
}


def remember(key: str, text: str) -> str:
    return render_tool_call("remember", {"key": key, "text": text})


def recall(key: str) -> str:
    return render_tool_call("recall", {"key": key})


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def tool(name: str, text: str) -> dict[str, str]:
    return {"role": "tool", "content": text, "name": name}


def replay(env, task, demo):
    """Step the demonstration's assistant turns; every observation must be what the demonstration shows."""
    env.reset(task)
    rewards, result, shown = [], None, []
    for message in demo:
        if message["role"] == "assistant":
            assert result is None or result.observation == shown
            result, shown = env.step(message["content"]), []
            rewards.append(result.reward)
        else:
            shown.append(message)
    assert result.observation == shown
    return result, rewards


@pytest.fixture(scope="module")
def memory_rows():
    rows = load_task_dataset("synthetic:memory", "test", synthetic_test_size=300).to_list()
    return [task_with_data(row) for row in rows]


# ---------------------------------------------------------------------------------------------------------------
# Protocol and rewards
# ---------------------------------------------------------------------------------------------------------------

def test_events_arrive_in_order_and_the_question_after_the_last():
    env = MemoryEnv()
    assert env.reset(TASK) is None  # the first event is already in the prompt
    seen = []
    for _ in range(4):
        result = env.step("next")
        assert not result.done and result.reward == 0.0 and result.info["kind"] == "log"
        seen += [m["content"] for m in result.observation]
    assert seen == ["Event 2 of 4: The mentor of Ada Lin is Bo Rus.", "Event 3 of 4: Cal Vo works at the Zo Guild.",
                    "Event 4 of 4: Bo Rus was born in Mira Ford.", "Question: Where was the mentor of Ada Lin born?"]
    result = env.step("Final Answer: Mira Ford")  # a turn without a call after the question is the answer
    assert result.done and result.info["correct"] and result.reward == 1.0
    assert env.context_window == 2 and MemoryEnv(context_window=None).context_window is None
    assert env.system_prompt == MEMORY_SYSTEM_PROMPT
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["remember", "recall"]


def test_step_rewards_of_stores_recalls_repeats_and_answers():
    env = MemoryEnv()
    env.reset(TASK)
    steps = [
        (remember("Tam Ora", "lives in Kel Bay"), 0.0, [tool("remember", "stored"), user(
            "Event 2 of 4: The mentor of Ada Lin is Bo Rus.")]),                    # a useless store
        (remember("ada  lin", "Mentor is Bo Rus"), 0.1, [tool("remember", "stored"), user(
            "Event 3 of 4: Cal Vo works at the Zo Guild.")]),                      # needed: case and spacing ignored
        (remember("ada  lin", "Mentor is Bo Rus"), -0.05, [tool("remember", "stored"), user(
            "Event 4 of 4: Bo Rus was born in Mira Ford.")]),                      # an exact repeat
        ("next", 0.0, [user("Question: Where was the mentor of Ada Lin born?")]),  # the second needed fact is lost
        (recall("Bo Rus"), -0.05, [tool("recall", "no note under 'Bo Rus'")]),      # a key without notes
        (recall("ADA LIN"), 0.05, [tool("recall", "Mentor is Bo Rus")]),            # holds a needed note: first time
        (recall("Ada Lin"), 0.0, [tool("recall", "Mentor is Bo Rus")]),             # the same key again, other text
    ]
    for text, reward, observation in steps:
        result = env.step(text)
        assert not result.done and result.observation == observation and result.reward == pytest.approx(reward)
    answer = env.step("Final Answer: Mira Ford")
    assert answer.done and answer.info["correct"] and answer.reward == 1.0 and answer.observation == []
    assert env.episode_metrics() == {"stores": 3.0, "needed_stores": 1.0, "recalls": 3.0, "useful_recalls": 1.0,
                                     "wasted_calls": 2.0, "needed_stored_rate": 0.5,
                                     "reached_question": 1.0}

    env.reset(TASK)  # a new episode starts clean
    for _ in range(4):
        env.step("next")
    wrong = env.step("Final Answer: Kel Bay")
    assert wrong.done and not wrong.info["correct"] and wrong.reward == 0.0
    assert env.episode_metrics()["stores"] == 0.0


def test_malformed_unknown_and_over_the_limit_calls_are_error_observations():
    env = MemoryEnv(max_tool_calls=2, tool_error_reward=-0.1)
    env.reset(TASK)
    bad = env.step("<tool_call>\n{not json\n</tool_call>")
    assert bad.reward == -0.1 and bad.observation[0]["content"].startswith("error: ")
    assert bad.observation[1] == user("Event 2 of 4: The mentor of Ada Lin is Bo Rus.")  # the log goes on
    unknown = env.step(render_tool_call("search", {"query": "Ada Lin"}))
    assert unknown.reward == -0.1 and "unknown tool 'search'" in unknown.observation[0]["content"]
    over = env.step(remember("Ada Lin", "mentor is Bo Rus"))  # a needed store, but the two calls are used
    assert over.reward == -0.1 and "limit of 2 tool calls" in over.observation[0]["content"]
    assert env.tool_errors == 3 and env.episode_metrics()["needed_stores"] == 0.0


def test_the_last_allowed_turn_is_the_answer_and_too_few_turns_for_the_log_is_a_one_line_error():
    env = MemoryEnv(max_turns=5)
    env.reset(TASK)
    for _ in range(4):
        env.step("next")
    last = env.step(recall("Bo Rus") + "\nFinal Answer: Mira Ford")  # turn 5 of 5: scored, its call not run
    assert last.done and last.info["correct"] and last.info["cut_by_max_turns"]
    with pytest.raises(ConfigError, match="needs max_turns >= 5"):
        MemoryEnv(max_turns=4).reset(TASK)
    with pytest.raises(DataError, match="missing: log_question, events"):
        MemoryEnv().reset({"question": "q", "ground_truth": "a"})
    with pytest.raises(ConfigError, match="wasted_call_reward must be <= 0"):
        MemoryEnv(wasted_call_reward=0.1)
    with pytest.raises(ConfigError, match="context_window must be an integer >= 1"):
        MemoryEnv(context_window=0)


def test_without_tools_the_log_plays_and_every_call_is_an_error():
    env = MemoryEnv(tools_enabled=False)
    assert env.tool_schemas() == []
    env.reset(TASK)
    result = env.step(remember("Ada Lin", "mentor is Bo Rus"))
    assert result.observation[0]["content"].startswith("error: no tools are available")
    assert result.observation[1] == user("Event 2 of 4: The mentor of Ada Lin is Bo Rus.") and not result.done
    demo = env.demonstration(TASK)
    assert [m["content"] for m in demo if m["role"] == "assistant"] == ["next"] * 4 + ["Final Answer: Mira Ford"]
    result, rewards = replay(env, TASK, demo)
    assert result.info["correct"] and rewards == [0.0] * 4 + [1.0]


# ---------------------------------------------------------------------------------------------------------------
# Demonstrations
# ---------------------------------------------------------------------------------------------------------------

def test_the_demonstration_stores_every_event_recalls_the_chain_and_answers():
    env = MemoryEnv()
    demo = env.demonstration(TASK)
    assert [m["content"] for m in demo if m["role"] == "assistant"] == [
        remember("Tam Ora", "lives in Kel Bay"), remember("Ada Lin", "mentor is Bo Rus"),
        remember("Cal Vo", "works at the Zo Guild"), remember("Bo Rus", "born in Mira Ford"),
        recall("Ada Lin"), recall("Bo Rus"), "Final Answer: Mira Ford"]
    result, rewards = replay(env, TASK, demo)
    assert result.done and result.info["correct"]
    assert rewards == pytest.approx([0.0, 0.1, 0.0, 0.1, 0.05, 0.05, 1.0])  # return 1.3
    with pytest.raises(ConfigError, match="set max_turns >= 7 and max_tool_calls >= 6"):
        MemoryEnv(max_tool_calls=5).demonstration(TASK)


def test_demonstrations_solve_every_test_log_with_the_expected_return(memory_rows):
    env = MemoryEnv()
    for row in memory_rows:
        result, rewards = replay(env, row, env.demonstration(row))
        assert result.info["correct"], row["question"]
        assert sum(rewards) == pytest.approx(1.0 + 0.15 * row["hops"])
        assert env.episode_metrics()["needed_stored_rate"] == 1.0


def test_skipped_stores_are_the_expected_share_and_a_skipped_needed_fact_gives_a_wrong_answer(memory_rows):
    env = MemoryEnv(skip_store_fraction=0.3)
    events = skipped = broken = 0
    for row in memory_rows:
        skips = env.skipped_events(row)
        assert skips == env.skipped_events(row)  # stable
        events, skipped = events + len(row["events"]), skipped + len(skips)
        demo = env.demonstration(row)
        log_turns = [m["content"] for m in demo if m["role"] == "assistant"][:len(row["events"])]
        assert [i for i, text in enumerate(log_turns) if text == "next"] == skips
        result, _ = replay(env, row, demo)
        needed_lost = bool(set(skips) & set(row["needed"]))
        broken += needed_lost
        assert result.info["correct"] is not needed_lost, row["question"]
    assert 0.25 < skipped / events < 0.35 and broken > 50
    assert MemoryEnv().skipped_events(memory_rows[0]) == []
    with pytest.raises(ConfigError, match="skip_store_fraction"):
        MemoryEnv(skip_store_fraction=1.5)


def test_error_analysis_classes_a_skipped_needed_store_as_a_fact_not_stored(memory_rows):
    from collections import Counter

    from agentic_rl.eval.error_analysis import categorize_memory_episode

    env = MemoryEnv(skip_store_fraction=0.3)
    classes = Counter(categorize_memory_episode({"messages": env.demonstration(row)}, row)[0]
                      for row in memory_rows if set(env.skipped_events(row)) & set(row["needed"]))
    assert sum(classes.values()) > 50 and set(classes) == {"fact_not_stored"}


def test_logs_past_demonstration_max_hops_are_left_to_rl_by_sft_and_by_grpos_sft_anchor(tokenizer):
    from agentic_rl.agent.env import demonstrated
    from agentic_rl.agent.settings import build_environment
    from agentic_rl.train.signal import demonstrations_for
    from agentic_rl.train.sft import SFTConfig, build_environment_dataset, load_task_rows

    def config(**args):
        return SFTConfig(model="m", environment="memory", environment_args={"context_window": None, **args},
                         dataset="synthetic:memory", max_train_samples=40, direct_fraction=0.0,
                         tools_in_prompt=False, max_turns=10, max_tool_calls=8)

    rows = [task_with_data(r) for r in load_task_dataset("synthetic:memory", "train",
                                                         synthetic_train_size=1000).to_list()]
    env = MemoryEnv(demonstration_max_hops=1)
    assert [env.demonstrates(r) for r in rows] == [r["hops"] == 1 for r in rows]
    assert all(MemoryEnv().demonstrates(r) for r in rows)
    drawn = load_task_rows(config()).to_list()
    one_hop = [r["question"] for r in drawn if task_with_data(r)["hops"] == 1]
    assert 0 < len(one_hop) < len(drawn) == 40
    _, counts = build_environment_dataset(config(), build_environment(config()), tokenizer)
    assert counts == {"environment": 40, "skip_tool": 0, "direct": 0, "not_demonstrated": 0}
    limited = config(demonstration_max_hops=1)
    examples, counts = build_environment_dataset(limited, build_environment(limited), tokenizer)
    assert counts == {"environment": len(one_hop), "skip_tool": 0, "direct": 0,
                      "not_demonstrated": 40 - len(one_hop)}
    texts = [tokenizer.decode(e["input_ids"]) for e in examples]  # one example per log without a context window
    assert sorted(r["question"] for r in drawn if any(r["question"] in t for t in texts)) == sorted(one_hop)
    train = [{**r, "prompt": build_prompt(r["question"], MEMORY_SYSTEM_PROMPT)} for r in drawn]
    anchor = SimpleNamespace(sft_anchor_run=None, tools_in_prompt=False)  # the GRPO settings it reads
    assert len(demonstrations_for(train, tokenizer, anchor, env_factory=build_environment(limited))) == len(one_hop)
    assert len(demonstrations_for(train, tokenizer, anchor, env_factory=build_environment(config()))) == 40
    with pytest.raises(ConfigError, match="demonstration_max_hops"):
        MemoryEnv(demonstration_max_hops=0)
    assert demonstrated(SimpleNamespace(reset=None, step=None), drawn[0])  # an environment without the method

    class DemonstratesNothing(MemoryEnv):
        def demonstrates(self, task):
            return False

    with pytest.raises(ConfigError, match="demonstrates none of the 40 training rows"):
        build_environment_dataset(config(), DemonstratesNothing, tokenizer)
    with pytest.raises(ConfigError, match="demonstrates none of the 40 training rows"):
        demonstrations_for(train, tokenizer, anchor, env_factory=DemonstratesNothing)


# ---------------------------------------------------------------------------------------------------------------
# Data, registry, tokenizer
# ---------------------------------------------------------------------------------------------------------------

def test_the_memory_dataset_splits_are_disjoint_deterministic_and_every_prompt_unique(memory_rows):
    test = load_task_dataset("synthetic:memory", "test", synthetic_test_size=300).to_list()
    assert test == load_task_dataset("synthetic:memory", "test", synthetic_test_size=300,
                                     synthetic_train_size=50).to_list()  # the test split ignores the train size
    assert load_task_dataset("synthetic:memory", "test", synthetic_test_size=40).to_list() == test[:40]
    assert load_task_dataset("synthetic:memory", "test", synthetic_test_size=5, synthetic_seed=1)["question"] \
        != [r["question"] for r in test[:5]]
    train = [task_with_data(r) for r in load_task_dataset("synthetic:memory", "train",
                                                           synthetic_train_size=1000).to_list()]
    pool = [task_with_data(r) for r in load_task_dataset("synthetic:memory", "test",
                                                          synthetic_test_size=MEMORY_TEST_POOL).to_list()]
    assert not {r["log_question"] for r in train} & {r["log_question"] for r in pool}
    prompts = [r["question"] for r in train + pool]
    assert len(set(prompts)) == len(prompts)
    assert train[0]["question"].startswith(f"Log {MEMORY_TEST_POOL + 1}. Event 1 of ")
    assert {r["hops"] for r in memory_rows} == {1, 2}
    for row in memory_rows + train:
        assert 4 <= len(row["events"]) <= 6 and len(row["needed"]) == row["hops"]
        assert 0 not in row["needed"]  # the first event stays in the prompt: never a needed fact
        assert row["question"].endswith(f"Event 1 of {len(row['events'])}: {row['events'][0]}")
        assert [row["facts"][i][0] for i in row["needed"]] == row["chain"]
        assert row["facts"][row["needed"][-1]][2] == row["ground_truth"]
    with pytest.raises(ConfigError, match="synthetic:memory has 2000 test logs"):
        load_task_dataset("synthetic:memory", "test", synthetic_test_size=MEMORY_TEST_POOL + 1)


def test_the_task_columns_reach_reset_through_the_rl_rows_and_the_registry_builds_the_environment():
    rl = to_rl_dataset(load_task_dataset("synthetic:memory", "test", synthetic_test_size=3),
                       MEMORY_SYSTEM_PROMPT).to_list()
    assert list(rl[0]) == ["question", "prompt", "ground_truth", "full_answer", "task_data"]
    assert json.loads(rl[0]["task_data"])["events"][0] in rl[0]["prompt"][-1]["content"]
    factory = environment_factory("memory", {"max_turns": 10, "max_tool_calls": 8, "tool_call_reward": 0.3,
                                             "tools_enabled": True},
                                  {"context_window": 3, "store_reward": 0.2})
    assert "tool_call_reward" not in factory.settings_used and "max_turns" in factory.settings_used
    env = factory()
    assert isinstance(env, MemoryEnv) and env.context_window == 3 and env.store_reward == 0.2
    assert reset_episode(env, rl[0]) is None and env.events == json.loads(rl[0]["task_data"])["events"]
    with pytest.raises(ConfigError, match="does not accept the argument 'top_k'"):
        environment_factory("memory", {}, {"top_k": 2})
    # the row's own columns win over task_data's; the world questions carry their lookup chain the same way
    assert task_with_data({"question": "q", "task_data": '{"question": "x", "chain": ["A"]}'}) == {
        "question": "q", "chain": ["A"]}
    world = load_task_dataset("synthetic:world", "test", synthetic_test_size=1).to_list()[0]
    assert set(json.loads(world["task_data"])) == {"hops", "chain", "supporting"}
    with pytest.raises(DataError, match="must be a JSON object"):
        task_with_data({"task_data": "[1]"})


def test_a_prompt_and_demonstration_encode_with_the_embedded_tokenizer(memory_rows):
    from transformers import AutoTokenizer

    from agentic_rl.agent.tasks import environment_examples
    from agentic_rl.models.embedded import EMBEDDED_DIR

    tokenizer = AutoTokenizer.from_pretrained(str(EMBEDDED_DIR))
    env = MemoryEnv()
    row = load_task_dataset("synthetic:memory", "test", synthetic_test_size=1).to_list()[0]  # task_data as loaded
    task = {**row, "prompt": build_prompt(row["question"], env.system_prompt)}
    [whole] = environment_examples(tokenizer, MemoryEnv(context_window=None), [task], tools_in_prompt=False)
    trained = tokenizer.decode([t for t, label in zip(whole["input_ids"], whole["labels"]) if label != -100])
    demo = env.demonstration(memory_rows[0])
    assert '"name": "remember"' in trained and '"name": "recall"' in trained
    assert f"Final Answer: {row['ground_truth']}" in trained
    assert "Question:" not in trained and "stored" not in trained  # observations are not trained on
    full = tokenizer.decode(whole["input_ids"])
    assert row["question"] in full and f"Question: {memory_rows[0]['log_question']}" in full
    turns = sum(m["role"] == "assistant" for m in demo)
    assert turns == len(memory_rows[0]["events"]) + memory_rows[0]["hops"] + 1
    # with the context window of two turns: one example per context, each turn learnt once, in order
    views = environment_examples(tokenizer, env, [task], tools_in_prompt=False)
    assert len(views) == turns - env.context_window
    labelled = [t for view in views for t, label in zip(view["input_ids"], view["labels"]) if label != -100]
    assert labelled == [t for t, label in zip(whole["input_ids"], whole["labels"]) if label != -100]
    assert all(len(view["input_ids"]) < len(whole["input_ids"]) for view in views[1:])
    assert f"Question: {memory_rows[0]['log_question']}" in tokenizer.decode(views[-1]["input_ids"])
    assert all(row["question"] in tokenizer.decode(view["input_ids"]) for view in views)  # the prompt stays


def test_sft_grpo_and_evaluation_play_memory_logs_through_the_stages(tiny_model_dir, tmp_path):
    from conftest import read_jsonl

    from agentic_rl.cli import main
    from agentic_rl.eval.error_analysis import MEMORY_EPISODE_CATEGORIES

    common = ["--environment", "memory", "--dataset", "synthetic:memory", "--max-turns", "10", "--max-tool-calls", "8",
              "--no-tools-in-prompt", "--max-turn-tokens", "12"]
    assert main(["sft", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path / "sft"), "--max-steps", "2",
                 "--batch-size", "2", "--max-length", "1024", "--max-train-samples", "8", "--report-to", "none",
                 "--full", *common]) == 0
    assert main(["grpo", "--model", str(tmp_path / "sft" / "model"), "--output-dir", str(tmp_path / "grpo"),
                 "--max-steps", "2", "--num-generations", "2", "--batch-size", "4", "--max-completion-length", "64",
                 "--max-train-samples", "8", "--heldout-every", "0", "--gradient-accumulation-steps", "1",
                 "--report-to", "none", "--full", *common]) == 0
    rollouts = read_jsonl(tmp_path / "grpo" / "rollouts.jsonl")
    assert len(rollouts) == 2 and "stores" in rollouts[0] and "reached_question" in rollouts[0]
    observed = [m["content"] for m in rollouts[0]["samples"][0]["messages"] if m["role"] == "user"]
    assert observed[0].startswith("Event 2 of ")  # the log's events reached the environment from the dataset
    assert main(["eval", str(tmp_path / "grpo" / "model"), "--output-dir", str(tmp_path / "eval"),
                 "--eval-samples", "4", "--max-new-tokens", "64", *common]) == 0
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["num_prompts"] == 4 and {"stores", "wasted_calls", "needed_stored_rate"} <= set(
        metrics["with_tools"])
    episodes = read_jsonl(tmp_path / "eval" / "episodes_with_tools.jsonl")
    assert all(e["question"].startswith("Log ") for e in episodes)
    wrong = [e for e in episodes if not e["correct"]]  # each wrong log classed by its notes and recalls
    assert wrong and all(e["category"] in MEMORY_EPISODE_CATEGORIES and e["category_reason"] for e in wrong)
    assert list(metrics["error_classes"]) == list(MEMORY_EPISODE_CATEGORIES)
