"""The environment library behind ``--environment``: the self-correction environment (rewards, feedback as a masked
user message, success-at-k statistics, demonstrations with an untrained wrong attempt), environments in TRL's
``environment_factory`` shape (a class defined here, not one of ours), and :func:`environment_factory`'s one
settings vocabulary."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_rl.agent import rollout as rollout_mod
from agentic_rl.agent.calculator_env import CalculatorEnv
from agentic_rl.agent.env import (ENVIRONMENT_SETTINGS, Environment, environment_factory, environment_settings_used,
                                  register_environment)
from agentic_rl.agent.rollout import (RolloutSettings, encode_episode, episode_stats, prompt_with_observation,
                                      run_episodes)
from agentic_rl.agent.self_correct_env import DEFAULT_FEEDBACK, SelfCorrectEnv
from agentic_rl.agent.tasks import AGENT_SYSTEM_PROMPT, agent_rows, demonstration, environment_examples
from agentic_rl.agent.tool_format import ChatFormat, render_tool_call
from agentic_rl.agent.trl_env import TRLEnvironment
from agentic_rl.data.formats import SYSTEM_PROMPT
from agentic_rl.errors import ConfigError, DataError, RewardError

REPO = Path(__file__).resolve().parents[1]
ROW = {"question": "A farm has 23 boxes with 47 eggs in each box. How many eggs are there?",
       "answer": "23 * 47 = <<23*47=1081>>1081\n#### 1081"}
RIGHT = "23 * 47 = 1081\nFinal Answer: 1081"
WRONG = "23 * 47 = 1071\nFinal Answer: 1071"


def self_correct_task(row=ROW):
    return agent_rows([row], system_prompt=SYSTEM_PROMPT)[0]


# ---------------------------------------------------------------------------------------------------------------
# Self-correction: rewards, returns, statistics (no model)
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("turns, rewards, metrics", [
    ([RIGHT], [1.0], {"attempts": 1.0, "success_at_1": 1.0, "success_at_2": 1.0, "success_at_3": 1.0}),
    ([WRONG, RIGHT], [-0.2, 1.0], {"attempts": 2.0, "success_at_1": 0.0, "success_at_2": 1.0, "success_at_3": 1.0}),
    ([WRONG, WRONG, WRONG], [-0.2, -0.2, -0.2],
     {"attempts": 3.0, "success_at_1": 0.0, "success_at_2": 0.0, "success_at_3": 0.0}),
])
def test_self_correct_rewards_favour_being_right_early(turns, rewards, metrics):
    env = SelfCorrectEnv()
    assert env.reset(self_correct_task()) is None and env.tool_schemas() == []
    results = [env.step(turn) for turn in turns]
    assert [r.reward for r in results] == pytest.approx(rewards)
    assert [r.done for r in results] == [False] * (len(turns) - 1) + [True]
    for r in results[:-1]:  # every wrong attempt with attempts left is answered by the feedback, as a user message
        assert r.observation == [{"role": "user", "content": DEFAULT_FEEDBACK}] and r.info["kind"] == "retry"
    assert results[-1].observation == [] and results[-1].info["kind"] == "answer"
    assert results[-1].info["correct"] == (turns[-1] == RIGHT)
    assert env.episode_metrics() == metrics


def test_self_correct_without_tools_is_a_single_attempt_and_settings_are_validated():
    env = SelfCorrectEnv(tools_enabled=False, wrong_attempt_reward=-0.5, feedback="Wrong, again.")
    env.reset(self_correct_task())
    result = env.step(WRONG)
    assert result.done and result.reward == -0.5 and not result.info["correct"]
    assert env.episode_metrics() == {"attempts": 1.0, "success_at_1": 0.0, "success_at_2": 0.0, "success_at_3": 0.0}
    env = SelfCorrectEnv(feedback="Wrong, again.", max_turns=2)
    env.reset(self_correct_task())
    assert env.step(WRONG).observation == [{"role": "user", "content": "Wrong, again."}]
    with pytest.raises(ConfigError, match="max_turns"):
        SelfCorrectEnv(max_turns=0)
    with pytest.raises(ConfigError, match="retry_demonstration_fraction"):
        SelfCorrectEnv(retry_demonstration_fraction=1.5)


# ---------------------------------------------------------------------------------------------------------------
# Rollouts with a scripted policy on the micro model's tokenizer
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def scripted_turns(tokenizer, scripts):
    """A stand-in for ``generate_batch``: an episode whose context contains the key ``name`` of ``scripts`` writes
    ``scripts[name][k]`` at its k-th assistant turn (k counted from the generation prompts in its context)."""
    fmt = ChatFormat(tokenizer)

    def generate(model, contexts, **kwargs):
        out = []
        for ids in contexts:
            text = tokenizer.decode(ids)
            script = next(turns for name, turns in scripts.items() if name in text)
            k = text.count("<|im_start|>assistant") - 1
            out.append(fmt.encode(script[min(k, len(script) - 1)]) + [fmt.end_of_turn_id])
        return out

    return generate


def farm_tasks(names):
    return [self_correct_task({**ROW, "question": f"{name}: " + ROW["question"]}) for name in names]


def test_feedback_is_a_masked_user_message_and_success_at_k_is_averaged(tokenizer, monkeypatch):
    scripts = {"Farm A": [RIGHT], "Farm B": [WRONG, RIGHT], "Farm C": [WRONG, WRONG, WRONG]}
    monkeypatch.setattr(rollout_mod, "generate_batch", scripted_turns(tokenizer, scripts))
    tasks = farm_tasks(scripts)
    trajectories = run_episodes(None, tokenizer, [SelfCorrectEnv() for _ in tasks], tasks,
                                [t["prompt"] for t in tasks],
                                RolloutSettings(max_turn_tokens=64, max_completion_length=400))
    assert [t.step_rewards for t in trajectories] == [[1.0], [-0.2, 1.0], [-0.2, -0.2, -0.2]]
    assert [t.total_return for t in trajectories] == pytest.approx([1.0, 0.8, -0.6])
    second, task = trajectories[1], tasks[1]
    assert [m["role"] for m in second.messages] == ["assistant", "user", "assistant"]
    ids, mask = second.completion_ids, second.env_mask
    env_text = tokenizer.decode([t for t, m in zip(ids, mask) if m == 0])
    action_text = tokenizer.decode([t for t, m in zip(ids, mask) if m == 1])
    assert env_text == f"\n<|im_start|>user\n{DEFAULT_FEEDBACK}<|im_end|>\n<|im_start|>assistant\n"
    assert DEFAULT_FEEDBACK not in action_text and "Final Answer: 1071" in action_text and action_text.endswith(
        "Final Answer: 1081<|im_end|>")
    # the whole sequence is the chat template's rendering of the conversation, and SFT encodes it identically
    rendered = tokenizer.apply_chat_template(task["prompt"] + second.messages, tokenize=False,
                                             enable_thinking=False)
    assert tokenizer.decode(second.prompt_ids + ids) == rendered.rstrip("\n")
    assert encode_episode(ChatFormat(tokenizer), task["prompt"], second.messages) == (second.prompt_ids, ids, mask)

    stats = episode_stats(trajectories)
    assert stats["accuracy"] == pytest.approx(2 / 3) and stats["return"] == pytest.approx(0.4)
    assert stats["attempts"] == pytest.approx(2.0)
    assert (stats["success_at_1"], stats["success_at_2"], stats["success_at_3"]) == pytest.approx((1 / 3, 2 / 3, 2 / 3))
    assert stats["turns_per_episode"] == 2.0 and stats["tool_call_rate"] == 0.0


def test_metrics_are_averaged_over_the_episodes_that_report_them(tokenizer, monkeypatch):
    class Counting(SelfCorrectEnv):
        def episode_metrics(self):
            return {"attempts": float(self.attempts), "accuracy": 5.0} if self.attempts > 1 else {}

    scripts = {"Farm A": [RIGHT], "Farm B": [WRONG, WRONG]}
    monkeypatch.setattr(rollout_mod, "generate_batch", scripted_turns(tokenizer, scripts))
    tasks = farm_tasks(scripts)
    trajectories = run_episodes(None, tokenizer, [Counting(max_turns=2), Counting(max_turns=2)], tasks,
                                [t["prompt"] for t in tasks],
                                RolloutSettings(max_turn_tokens=64, max_completion_length=400))
    stats = episode_stats(trajectories)
    assert stats["attempts"] == 2.0  # only the second episode reports it
    assert stats["accuracy"] == 0.5 and stats["env_accuracy"] == 5.0  # a colliding name does not overwrite ours


# ---------------------------------------------------------------------------------------------------------------
# Demonstrations for SFT
# ---------------------------------------------------------------------------------------------------------------

def _trained_and_ignored(tokenizer, example):
    ids, labels = example["input_ids"], example["labels"]
    assert len(ids) == len(labels)
    return (tokenizer.decode([t for t, lab in zip(ids, labels) if lab != -100]),
            tokenizer.decode([t for t, lab in zip(ids, labels) if lab == -100]))


def test_retry_demonstration_masks_the_wrong_attempt_and_the_feedback(tokenizer):
    task = self_correct_task()
    retry = SelfCorrectEnv(retry_demonstration_fraction=1.0)
    messages = retry.demonstration(task)
    assert messages == [{"role": "assistant", "content": "23 * 47 = 1081\nFinal Answer: 1082", "train": False},
                        {"role": "user", "content": DEFAULT_FEEDBACK},
                        {"role": "assistant", "content": RIGHT}]
    trained, ignored = _trained_and_ignored(tokenizer, environment_examples(tokenizer, retry, [task])[0])
    assert trained == RIGHT + "<|im_end|>"
    assert "Final Answer: 1082" in ignored and DEFAULT_FEEDBACK in ignored and ROW["question"] in ignored
    plain = SelfCorrectEnv(retry_demonstration_fraction=0.0)
    assert plain.demonstration(task) == [{"role": "assistant", "content": RIGHT}]
    # one attempt only (without tools) never shows a retry
    assert SelfCorrectEnv(retry_demonstration_fraction=1.0, tools_enabled=False).demonstration(task) == \
        [{"role": "assistant", "content": RIGHT}]


def test_retry_demonstrations_are_chosen_by_a_stable_hash_of_the_question():
    questions = [f"Question {i}: how many apples are left if {i} are eaten?" for i in range(200)]
    code = ("import json,sys; from agentic_rl.agent.self_correct_env import SelfCorrectEnv; env = SelfCorrectEnv(); "
            "qs = json.load(sys.stdin); print(json.dumps([len(env.demonstration({'question': q, 'answer': 'x\\n#### 3',"
            " 'ground_truth': '3'})) > 1 for q in qs]))")
    import json
    import os

    chosen = []
    for seed in ("1", "2"):  # Python's hash() of a string differs between these two processes
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO / "src")}
        out = subprocess.run([sys.executable, "-c", code], input=json.dumps(questions), capture_output=True,
                             text=True, env=env, check=True)
        chosen.append(json.loads(out.stdout))
    assert chosen[0] == chosen[1]
    env = SelfCorrectEnv()
    here = [len(env.demonstration({"question": q, "answer": "x\n#### 3", "ground_truth": "3"})) > 1
            for q in questions]
    assert here == chosen[0] and 0 < sum(here) < len(here)


def test_environment_examples_match_the_calculator_demonstrations(tokenizer):
    from agentic_rl.agent.tasks import demonstration_examples

    row = agent_rows([ROW])[0]
    assert CalculatorEnv.system_prompt == AGENT_SYSTEM_PROMPT and Environment.system_prompt is None
    for final_turn in ("steps", "answer"):
        env = CalculatorEnv(final_turn=final_turn)
        assert env.demonstration(row) == demonstration(row, tools=True, final_turn=final_turn)
        assert environment_examples(tokenizer, env, [row]) == demonstration_examples(
            tokenizer, [row], tool_schemas=env.tool_schemas(), final_turn=final_turn)
    with_schemas = environment_examples(tokenizer, CalculatorEnv(), [row])[0]
    without_schemas = environment_examples(tokenizer, CalculatorEnv(), [row], tools_in_prompt=False)[0]
    assert '"type": "function"' in tokenizer.decode(with_schemas["input_ids"])
    assert '"type": "function"' not in tokenizer.decode(without_schemas["input_ids"])
    with pytest.raises(ConfigError, match="final_turn"):
        CalculatorEnv(final_turn="short")


def test_base_demonstration_is_the_reference_solution():
    class Plain(Environment):
        pass

    row = {"question": "q", "answer": "39 * 83 = <<39*83=3237>>3237\n3237 - 21 = <<3237-21=3216>>3216\n#### 3,216"}
    assert Plain().demonstration(row) == [
        {"role": "assistant", "content": "39 * 83 = 3237\n3237 - 21 = 3216\nFinal Answer: 3216"}]
    with pytest.raises(DataError, match="answer"):
        Plain().demonstration({"question": "q"})


# ---------------------------------------------------------------------------------------------------------------
# An environment in TRL's environment_factory shape, written against the contract only
# ---------------------------------------------------------------------------------------------------------------

class Warehouse:
    """Keeps stock; the episode is scored by how many orders were placed."""

    def reset(self, **row) -> str | None:
        self.stock = {"apples": int(row.get("apples", 5))}
        self.orders = 0
        return f" (The warehouse holds {self.stock['apples']} apples.)"

    def order(self, item: str, count: int) -> str:
        """Order more of an item.

        Args:
            item: the item to order.
            count: how many to order.
        """
        if item not in self.stock:
            raise KeyError(f"no item called {item}")
        self.stock[item] += count
        self.orders += 1
        return f"{self.stock[item]} {item} in stock"

    def get_reward(self) -> float:
        return 0.5 * self.orders

    def _audit(self):  # private: not a tool
        return self.stock


def test_trl_shaped_class_tools_are_discovered_with_schemas():
    factory = environment_factory("tests.test_environments:Warehouse", {"max_turns": 3})
    env = factory()
    # (pytest may import this file under a second module name: the class is compared by name)
    assert isinstance(env, TRLEnvironment) and type(env.obj).__qualname__ == "Warehouse" and env.max_turns == 3
    assert factory() is not env and factory().obj is not env.obj
    assert env.tool_schemas() == [{"type": "function", "function": {
        "name": "order", "description": "Order more of an item.",
        "parameters": {"type": "object", "properties": {
            "item": {"type": "string", "description": "the item to order."},
            "count": {"type": "integer", "description": "how many to order."}}, "required": ["item", "count"]}}}]
    assert factory.settings_used == {*ENVIRONMENT_SETTINGS, "tools_enabled"}
    assert environment_settings_used("tests.test_environments:Warehouse") == {*ENVIRONMENT_SETTINGS, "tools_enabled"}


def test_trl_shaped_class_in_a_rollout(tokenizer, monkeypatch):
    order = render_tool_call("order", {"item": "apples", "count": 2})
    missing = render_tool_call("order", {"item": "pears", "count": 1})
    policy = scripted_turns(tokenizer, {"farm": [order, missing, "Final Answer: 7"]})
    monkeypatch.setattr(rollout_mod, "generate_batch", policy)
    factory = environment_factory(Warehouse, {"tool_call_reward": 0.25, "max_turns": 4})
    task = {**agent_rows([ROW])[0], "apples": 5}
    traj = run_episodes(None, tokenizer, [factory()], [task], [task["prompt"]],
                        RolloutSettings(max_turn_tokens=64, max_completion_length=500))[0]
    # the reset observation is appended to the last user message of the prompt before tokenizing it
    expected_prompt = prompt_with_observation(task["prompt"], " (The warehouse holds 5 apples.)")
    assert expected_prompt[-1]["content"] == ROW["question"] + " (The warehouse holds 5 apples.)"
    assert task["prompt"][-1]["content"] == ROW["question"]  # the task itself is left as it was
    assert traj.prompt_ids == ChatFormat(tokenizer).prompt_ids(expected_prompt, factory.example.tool_schemas())
    # a tool that raises is an error observation; the episode goes on
    assert [m["content"] for m in traj.messages if m["role"] == "tool"] == [
        "7 apples in stock", "error: order failed: KeyError: 'no item called pears'"]
    assert traj.tool_calls == 2 and traj.tool_errors == 1 and traj.answered
    # step rewards: a useful call, a failed call, then get_reward() (one order placed) at the answer turn
    assert traj.step_rewards == pytest.approx([0.25, 0.0, 0.5])
    assert not traj.correct  # ground truth 1081 is the row's; "7" is not it


def test_an_exception_in_a_user_environments_reset_is_a_one_line_error(tokenizer):
    class Broken(Warehouse):
        def reset(self, **row):
            return row["sku"]

    class Plain:  # our Environment API: reset(task) and step(text)
        def reset(self, task):
            raise RuntimeError("inventory offline")

        def step(self, text):
            raise AssertionError("never reached")

    task = agent_rows([ROW])[0]
    columns = ", ".join(task)
    with pytest.raises(DataError, match=rf"^Broken\.reset\(\) raised KeyError: 'sku' \(task columns: {columns}\)$"):
        run_episodes(None, tokenizer, [environment_factory(Broken, {})()], [task], [task["prompt"]],
                     RolloutSettings(max_turn_tokens=8, max_completion_length=50))
    with pytest.raises(DataError, match=r"^Plain\.reset\(\) raised RuntimeError: inventory offline"):
        environment_examples(tokenizer, Plain(), [task])


@pytest.mark.parametrize("reward, shown", [(math.nan, "nan"), ("high", "'high'"), (True, "True")])
def test_get_reward_must_return_a_finite_number(reward, shown):
    class Scored(Warehouse):
        def get_reward(self):
            return reward

    env = environment_factory(Scored, {})()
    env.reset({"question": "q", "ground_truth": "1"})
    with pytest.raises(RewardError, match=rf"Scored\.get_reward\(\) must return a finite number, got {shown}$"):
        env.step("Final Answer: 1")


def test_without_get_reward_the_answer_is_checked_against_the_ground_truth():
    class Unscored(Warehouse):
        get_reward = None

    env = environment_factory(Unscored, {"answer_reward": 2.0})()
    env.reset({"question": "q", "ground_truth": "12"})
    assert env.step("Final Answer: 12").reward == 2.0
    env.reset({"question": "q", "ground_truth": "12"})
    assert env.step("Final Answer: 13").reward == 0.0


def test_trl_shaped_class_with_an_undocumented_or_untyped_tool_is_refused():
    class NoDoc(Warehouse):
        def cancel(self, item: str) -> str:
            return item

    class NoTypes(Warehouse):
        def cancel(self, item) -> str:
            """Cancel an order."""
            return item

    with pytest.raises(ConfigError, match=r"NoDoc\.cancel: a tool method needs a docstring"):
        environment_factory(NoDoc, {})
    with pytest.raises(ConfigError, match=r"NoTypes\.cancel: .*'item' needs a type annotation"):
        environment_factory(NoTypes, {})

    class StrictReset(Warehouse):
        def reset(self, apples: int = 5) -> None:
            self.orders = 0

    env = environment_factory(StrictReset, {})()
    with pytest.raises(ConfigError, match=r"StrictReset\.reset\(\) does not accept the task columns"):
        env.reset({"question": "q", "ground_truth": "1"})


# ---------------------------------------------------------------------------------------------------------------
# environment_factory: one settings vocabulary
# ---------------------------------------------------------------------------------------------------------------

def test_environment_factory_rejects_an_unknown_environment_argument():
    with pytest.raises(ConfigError, match="environment 'calculator' does not accept the argument 'bogus'"):
        environment_factory("calculator", {}, {"bogus": 1})
    with pytest.raises(ConfigError, match="environment 'self_correct' does not accept the argument 'final_turn'"):
        environment_factory("self_correct", {}, {"final_turn": "answer"})
    with pytest.raises(ConfigError, match="'max_turns', a common environment setting"):
        environment_factory("calculator", {}, {"max_turns": 2})
    with pytest.raises(ConfigError, match="unknown environment setting 'max_attempts'"):
        environment_factory("self_correct", {"max_attempts": 2})
    with pytest.raises(ConfigError, match="Warehouse' does not accept the argument 'size'"):
        environment_factory(Warehouse, {}, {"size": 3})
    with pytest.raises(ConfigError, match="unknown environment 'nope'"):
        environment_factory("nope", {})
    assert environment_factory("calculator", {}, {"final_turn": "answer"})().final_turn == "answer"


def test_common_settings_are_passed_only_where_the_signature_takes_them():
    settings = {"max_turns": 2, "max_tool_calls": 7, "tool_call_reward": 0.5, "tool_error_reward": -0.1,
                "answer_reward": 2.0}
    factory = environment_factory("self_correct", settings, {"wrong_attempt_reward": -0.3})
    env = factory()
    assert isinstance(env, SelfCorrectEnv) and env.max_turns == 2 and env.answer_reward == 2.0
    assert env.wrong_attempt_reward == -0.3 and not hasattr(env, "max_tool_calls")
    assert factory.settings_used == {"max_turns", "answer_reward", "tools_enabled"} == \
        environment_settings_used("self_correct")
    calculator = environment_factory("calculator", {**settings, "tools_enabled": False})()
    assert (calculator.max_turns, calculator.max_tool_calls, calculator.tool_call_reward,
            calculator.tool_error_reward, calculator.answer_reward, calculator.tools_enabled) == (
        2, 7, 0.5, -0.1, 2.0, False)
    assert environment_settings_used("calculator") == {*ENVIRONMENT_SETTINGS, "tools_enabled"}
    # None means "the environment's default"
    assert environment_factory("calculator", {"max_turns": None})().max_turns == CalculatorEnv().max_turns

    seen = {}

    def only_turns(max_turns: int = 1):
        seen["max_turns"] = max_turns
        return SelfCorrectEnv(max_turns=max_turns)

    def anything(**kwargs):
        seen["kwargs"] = kwargs
        return SelfCorrectEnv()

    register_environment("turns-only-env", only_turns)
    assert environment_settings_used("turns-only-env") == {"max_turns"}
    environment_factory("turns-only-env", settings)
    assert seen["max_turns"] == 2
    environment_factory(anything, settings)
    assert seen["kwargs"] == settings
    # a factory building an object that is no environment fails at factory time, one line
    with pytest.raises(ConfigError, match="must build an object with reset"):
        environment_factory(lambda: object(), {})
