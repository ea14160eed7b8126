"""Agent layer: tools and their schemas, tool-call parsing, the calculator environment, multi-turn rollouts with
env masks, per-step rewards summed into the return, SFT labels and GRPO loss masks that ignore tool tokens."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
from conftest import grpo_config, loss_gradient, read_jsonl

from agentic_rl.agent import rollout as rollout_mod
from agentic_rl.agent.calculator_env import CalculatorEnv, calculator
from agentic_rl.agent.env import ToolEnvironment, make_environment, register_environment, trajectory_return
from agentic_rl.agent.rollout import (RolloutSettings, encode_episode, episode_stats, make_rollout_func, run_episodes,
                                      trajectory_return_reward)
from agentic_rl.agent.tasks import agent_rows, demonstration, demonstration_examples
from agentic_rl.agent.tool_format import ChatFormat, parse_tool_calls, render_tool_call
from agentic_rl.agent.tools import Tool, ToolError, get_tool
from agentic_rl.errors import ConfigError

CALL = render_tool_call("calculator", {"expression": "23*47"})
QUESTION = "A farm has 23 boxes with 47 eggs in each box. How many eggs are there?"
ROW = {"question": QUESTION, "answer": "23 * 47 = <<23*47=1081>>1081\n#### 1081"}


def weather(city: str, days: int = 1) -> str:
    """Forecast for a city.

    Args:
        city: the city name.
        days: how many days ahead.
    """
    return f"{city}: sunny for {days} day(s)"


# ---------------------------------------------------------------------------------------------------------------
# Tools, parsing, environments (no model)
# ---------------------------------------------------------------------------------------------------------------

def test_tool_schema_is_derived_from_the_signature():
    tool = Tool(weather)
    fn = tool.schema["function"]
    assert fn["name"] == "weather" and fn["description"] == "Forecast for a city."
    assert fn["parameters"]["properties"] == {"city": {"type": "string", "description": "the city name."},
                                              "days": {"type": "integer", "description": "how many days ahead."}}
    assert fn["parameters"]["required"] == ["city"]
    assert tool({"city": "Oslo", "days": 3}) == "Oslo: sunny for 3 day(s)"
    with pytest.raises(ToolError, match="missing the required argument 'city'"):
        tool({})
    with pytest.raises(ToolError, match="must be integer"):
        tool({"city": "Oslo", "days": "three"})
    with pytest.raises(ToolError, match="unknown argument"):
        tool({"city": "Oslo", "when": 1})


def test_tool_and_environment_registries():
    assert get_tool("calculator")({"expression": "23*47"}) == "1081"
    assert get_tool("tests.test_agent:weather").name == "weather"
    with pytest.raises(ConfigError, match="unknown tool 'nope'"):
        get_tool("nope")
    env = make_environment("calculator", max_turns=2)
    assert isinstance(env, CalculatorEnv) and env.max_turns == 2

    register_environment("weather-env", lambda **kw: ToolEnvironment([weather], **kw))
    env = make_environment("weather-env", max_tool_calls=1)
    assert [t.name for t in env.tools] == ["weather"] and env.max_tool_calls == 1
    with pytest.raises(ConfigError, match="unknown environment"):
        make_environment("no-such-env")


def test_parse_tool_calls_in_qwen3_format():
    content, calls = parse_tool_calls("Let me compute.\n" + CALL)
    assert content == "Let me compute."
    assert [(c.name, c.arguments, c.error) for c in calls] == [("calculator", {"expression": "23*47"}, None)]
    _, calls = parse_tool_calls('<tool_call>\n{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}'
                                '\n</tool_call>')
    assert calls[0].arguments == {"expression": "1+1"}
    _, calls = parse_tool_calls('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"\n</tool_call>')
    assert calls[0].error and "not valid JSON" in calls[0].error
    _, calls = parse_tool_calls('<tool_call>\n{"name": "calculator"')
    assert calls[0].error and "not closed" in calls[0].error
    assert parse_tool_calls("Final Answer: 5") == ("Final Answer: 5", [])


@pytest.mark.parametrize("turn, expected", [
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": 23*47}\n</tool_call>', "not valid JSON"),
    ('<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>', "unknown tool 'search'"),
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "__import__(\'os\')"}}\n</tool_call>',
     "not allowed"),
    ('<tool_call>\n{"name": "calculator", "arguments": {"expr": "1+1"}}\n</tool_call>', "unknown argument"),
    ('<tool_call>\n{"arguments": {"expression": "1+1"}}\n</tool_call>', 'no "name"'),
])
def test_malformed_or_forbidden_call_yields_an_error_observation(turn, expected):
    env = CalculatorEnv()
    env.reset({"ground_truth": "1081"})
    result = env.step(turn)
    assert not result.done and result.reward == 0.0
    assert len(result.observation) == 1 and result.observation[0]["role"] == "tool"
    assert result.text.startswith("error:") and expected in result.text
    assert result.info["errors"] == 1 and env.tool_errors == 1


def test_a_refused_call_is_explained_by_the_first_failed_check_in_a_fixed_order():
    """Malformed, then tools off, then the call limit, then an unknown tool: every environment with tools refuses a
    call through this one ladder, so a call failing several checks always reads the same."""
    from agentic_rl.agent.env import call_refusal
    from agentic_rl.agent.tool_format import ToolCall

    tools = CalculatorEnv().tools
    broken, stranger, good = ToolCall(error="not valid JSON"), ToolCall(name="search"), ToolCall(name="calculator")
    at_limit = {"calls_made": 3, "max_calls": 3}
    assert call_refusal(broken, [], **at_limit) == "not valid JSON"
    assert call_refusal(stranger, [], **at_limit) == "no tools are available in this episode; answer directly"
    assert call_refusal(stranger, [], **at_limit, tools_off="write 'next'") == (
        "no tools are available in this episode; write 'next'")
    assert call_refusal(stranger, tools, **at_limit) == "the limit of 3 tool calls is reached; write the final answer"
    assert call_refusal(stranger, tools, calls_made=2, max_calls=3) == "unknown tool 'search'; available: calculator"
    assert call_refusal(good, tools, calls_made=2, max_calls=3) is None


def test_calculator_environment_rewards_and_limits():
    env = CalculatorEnv(max_turns=6, max_tool_calls=4, tool_call_reward=0.1, answer_reward=1.0)
    env.reset({"question": QUESTION, "ground_truth": "1081"})
    first = env.step(CALL)
    assert first.observation == [{"role": "tool", "name": "calculator", "content": "1081"}]
    assert first.reward == pytest.approx(0.1) and not first.done and first.info["useful"] == 1
    assert env.step(CALL).reward == 0.0  # a repeated call is valid but not useful
    ungrounded = env.step(render_tool_call("calculator", {"expression": "99*2"}))  # 99 and 2 are not in the question
    assert ungrounded.text == "198" and ungrounded.reward == 0.0 and ungrounded.info["useful"] == 0
    chained = env.step(render_tool_call("calculator", {"expression": "1081 + 23"}))  # grounded by a tool result
    assert chained.text == "1104" and chained.reward == pytest.approx(0.1)
    over = env.step(render_tool_call("calculator", {"expression": "23+47"}))
    assert "limit of 4 tool calls" in over.text and over.reward == 0.0
    answer = env.step("23 * 47 = 1081\nFinal Answer: 1081")
    assert answer.done and answer.reward == 1.0 and answer.info["correct"]
    env.reset({"question": QUESTION, "ground_truth": "1081"})
    wrong = env.step("Final Answer: 1080")
    assert wrong.done and wrong.reward == 0.0 and not wrong.info["correct"]
    loose = CalculatorEnv(grounded_calls_only=False)
    loose.reset({"question": QUESTION, "ground_truth": "1081"})
    assert loose.step(render_tool_call("calculator", {"expression": "99*2"})).reward == pytest.approx(0.1)



def test_reference_calls_only_rewards_the_solutions_steps_not_a_grounded_detail():
    """A call with a number the answer does not use is grounded (the number is in the question) but no step of the
    solution: with reference_calls_only it earns nothing, and each reference step rewards one call."""
    question = "A farm has 23 boxes with 47 eggs in each box. Leo is 34 years old. 5 eggs break. How many are left?"
    task = {"question": question, "ground_truth": "1076",
            "full_answer": "23 * 47 = <<23*47=1081>>1081\n1081 - 5 = <<1081-5=1076>>1076\n#### 1076"}

    def rewards(env, *expressions):
        env.reset(task)
        return [env.step(render_tool_call("calculator", {"expression": e})).reward for e in expressions]

    strict, grounded = CalculatorEnv(reference_calls_only=True), CalculatorEnv()
    assert rewards(grounded, "23*47", "1081-34") == [pytest.approx(0.1), pytest.approx(0.1)]  # the detail, grounded
    assert rewards(strict, "23*47", "1081-34") == [pytest.approx(0.1), 0.0]
    assert rewards(strict, "47*23", "1081-5", "1076+0") == [pytest.approx(0.1), pytest.approx(0.1), 0.0]
    # a task without annotations falls back to the grounded rule
    strict.reset({"question": question, "ground_truth": "1076"})
    assert strict.step(render_tool_call("calculator", {"expression": "23*47"})).reward == pytest.approx(0.1)
    assert strict.step(render_tool_call("calculator", {"expression": "99*2"})).reward == 0.0
    with pytest.raises(ConfigError, match=r"^reference_calls_only must be true or false, got 'yes'$"):
        CalculatorEnv(reference_calls_only="yes")
    assert calculator("(120 - 15) / 3") == "35"


def test_environment_stage_configs_are_validated():
    from agentic_rl.train.grpo import GRPOConfig
    from agentic_rl.train.sft import SFTConfig

    with pytest.raises(ConfigError, match=r"num_generations \(3\) must divide the generation batch \(8 = "):
        GRPOConfig(model="m", environment="calculator", num_generations=3, batch_size=8, generation_batch_size=8)
    with pytest.raises(ConfigError, match=r"^tool_error_reward must be <= 0, got 0.5$"):
        GRPOConfig(model="m", environment="calculator", tool_error_reward=0.5)
    with pytest.raises(ConfigError, match=r"direct_fraction \+ skip_tool_fraction must be <= 1, got 0.7 \+ 0.4"):
        SFTConfig(model="m", environment="calculator", direct_fraction=0.7, skip_tool_fraction=0.4)
    with pytest.raises(ConfigError, match=r"^skip_tool_fraction must be "):
        SFTConfig(model="m", environment="calculator", skip_tool_fraction=-0.1)
    with pytest.raises(ConfigError, match=r"^tool_error_reward must be <= 0"):
        SFTConfig(model="m", environment="calculator", tool_error_reward=0.5)


# ---------------------------------------------------------------------------------------------------------------
# Rollouts on the tiny model's tokenizer with a scripted policy
# ---------------------------------------------------------------------------------------------------------------

def scripted_policy(tokenizer, script, *, wrong_rows=()):
    """A stand-in for ``generate_batch``: turn k of every episode writes ``script[k]`` (k = tool responses so far);
    batch rows in ``wrong_rows`` write ``Final Answer: 0`` as their answer turn."""
    fmt = ChatFormat(tokenizer)
    response_id = tokenizer.convert_tokens_to_ids("<tool_response>")

    def generate(model, contexts, **kwargs):
        out = []
        for row, ids in enumerate(contexts):
            k = min(ids.count(response_id), len(script) - 1)
            text = script[k]
            if row in wrong_rows and "<tool_call>" not in text:
                text = "Final Answer: 0"
            out.append(fmt.encode(text) + [fmt.end_of_turn_id])
        return out

    return generate


def _episode(tokenizer, monkeypatch, script, **env_kwargs):
    monkeypatch.setattr(rollout_mod, "generate_batch", scripted_policy(tokenizer, script))
    task = agent_rows([ROW])[0]
    return run_episodes(None, tokenizer, [CalculatorEnv(**env_kwargs)], [task], [task["prompt"]],
                        RolloutSettings(max_turn_tokens=64, max_completion_length=400))[0]


def test_trajectory_return_is_the_sum_of_step_rewards(tokenizer, monkeypatch):
    traj = _episode(tokenizer, monkeypatch, [CALL, "23 * 47 = 1081\nFinal Answer: 1081"], tool_call_reward=0.25)
    assert traj.step_rewards == [0.25, 1.0] and traj.turns == 2
    assert traj.total_return == pytest.approx(1.25) == trajectory_return(traj.step_rewards)
    assert traj.correct and traj.tool_calls == 1 and traj.tool_errors == 0
    assert [m["role"] for m in traj.messages] == ["assistant", "tool", "assistant"]
    assert trajectory_return_reward([None], trajectory_return=[traj.total_return]) == [pytest.approx(1.25)]


def test_max_turns_is_respected(tokenizer, monkeypatch):
    traj = _episode(tokenizer, monkeypatch, [CALL], max_turns=3, max_tool_calls=10)
    assert traj.turns == 3 and len(traj.step_rewards) == 3
    assert traj.step_rewards == [pytest.approx(0.1), 0.0, 0.0]  # repeats are not useful; the last turn is scored
    assert traj.answered and not traj.correct
    stats = episode_stats([traj])
    assert stats["turns_per_episode"] == 3 and stats["tool_call_rate"] == 1.0


def test_env_mask_covers_exactly_the_tool_response_tokens(tokenizer, monkeypatch):
    traj = _episode(tokenizer, monkeypatch, [CALL, "Final Answer: 1081"])
    ids, mask = traj.completion_ids, traj.env_mask
    assert len(ids) == len(mask) and 0 in mask and mask[0] == 1 and mask[-1] == 1
    env_text = tokenizer.decode([t for t, m in zip(ids, mask) if m == 0])
    action_text = tokenizer.decode([t for t, m in zip(ids, mask) if m == 1])
    assert "<tool_response>\n1081\n</tool_response>" in env_text and "<tool_call>" not in env_text
    assert "<tool_response>" not in action_text and "Final Answer: 1081" in action_text and "23*47" in action_text
    # The SFT encoder splices a written episode into exactly the same tokens.
    schemas = [Tool(calculator).schema]
    prompt_ids, completion, sft_mask = encode_episode(ChatFormat(tokenizer), agent_rows([ROW])[0]["prompt"],
                                                      traj.messages, schemas)
    assert prompt_ids == traj.prompt_ids and completion == ids and sft_mask == mask
    # and the whole sequence is what the chat template renders for that conversation (tools in the system turn).
    rendered = tokenizer.apply_chat_template(agent_rows([ROW])[0]["prompt"] + traj.messages, tools=schemas,
                                             tokenize=False)
    assert '"name": "calculator"' in rendered
    assert tokenizer.decode(traj.prompt_ids + ids) == rendered.rstrip("\n")


def test_sft_labels_ignore_prompt_and_tool_tokens(tokenizer):
    row = agent_rows([ROW])[0]
    assert [m["role"] for m in demonstration(row)] == ["assistant", "tool", "assistant"]
    example = demonstration_examples(tokenizer, [row])[0]
    ids, labels = example["input_ids"], example["labels"]
    trained = tokenizer.decode([t for t, lab in zip(ids, labels) if lab != -100])
    ignored = tokenizer.decode([t for t, lab in zip(ids, labels) if lab == -100])
    assert "<tool_response>\n1081\n</tool_response>" in ignored and QUESTION in ignored
    assert "<tool_response>" not in trained and QUESTION not in trained
    assert '"expression": "23*47"' in trained and trained.rstrip().endswith("Final Answer: 1081<|im_end|>")
    direct = demonstration_examples(tokenizer, agent_rows([ROW], tools=False), tools=False)[0]
    assert "<tool_call>" not in tokenizer.decode(direct["input_ids"])


# ---------------------------------------------------------------------------------------------------------------
# GRPO through TRL: the tool tokens carry no loss
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_grpo_loss_has_no_gradient_on_tool_tokens(tiny_model_dir, tokenizer, monkeypatch, tmp_path, algorithm):
    """GRPO's token loss and RLOO's sequence loss (grpo --environment calculator --algorithm rloo) both ignore tool
    tokens."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from agentic_rl.train.grpo_trainer import RLOOEpisodeTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    rows = agent_rows([ROW, {"question": "Sam has 47 bags with 23 beads each. How many beads?",
                             "answer": "47 * 23 = <<47*23=1081>>1081\n#### 1081"}])
    script = [CALL, "Final Answer: 1081"]
    # Rows 1 and 3 of the batch answer wrongly, so every group of 2 has one right and one wrong episode.
    monkeypatch.setattr(rollout_mod, "generate_batch", scripted_policy(tokenizer, script, wrong_rows=(1, 3)))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer.padding_side = "left"
    args = GRPOConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4,
                      generation_batch_size=4, max_completion_length=200, max_steps=1, report_to=[], use_cpu=True,
                      beta=0.0, gradient_checkpointing=False, logging_steps=1,
                      scale_rewards="none" if algorithm == "rloo" else "group")
    rollout = make_rollout_func(lambda: CalculatorEnv(), rows,
                                RolloutSettings(max_turn_tokens=64, tools_in_prompt=False),
                                log_path=tmp_path / "rollouts.jsonl")
    trainer_class = RLOOEpisodeTrainer if algorithm == "rloo" else GRPOTrainer
    trainer = trainer_class(model=model, reward_funcs=[trajectory_return_reward], args=args,
                            train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in rows]),
                            processing_class=tokenizer, rollout_func=rollout)
    inputs = [{"prompt": rows[k]["prompt"]} for k in (0, 0, 1, 1)]  # as TRL's sampler repeats each prompt
    trainer.model.train()  # as inside trainer.train(): metrics go to the "train" bucket
    batch = trainer._generate_and_score_completions(inputs)

    tool_mask, completion_mask = batch["tool_mask"], batch["completion_mask"]
    assert tool_mask.shape == batch["completion_ids"].shape and (tool_mask == 0).any()
    for row in range(4):  # the zeros are exactly the tool-response tokens
        zeros = batch["completion_ids"][row][(tool_mask[row] == 0) & (completion_mask[row] == 1)]
        assert "<tool_response>" in tokenizer.decode(zeros)
    # Returns 0.1 + 1.0 (right) and 0.1 (wrong): advantages of opposite sign within each group.
    advantages = batch["advantages"]
    assert advantages[0] > 0 > advantages[1] and advantages[2] > 0 > advantages[3]

    # The GRPO loss's gradient w.r.t. the per-token log-probs is zero on tool tokens, non-zero on action tokens.
    grad = loss_gradient(trainer, batch, monkeypatch)
    action = (completion_mask * tool_mask).bool()
    assert torch.all(grad[~action] == 0)
    assert torch.all(grad[action] != 0)
    assert (tmp_path / "rollouts.jsonl").is_file()
    assert trainer._metrics["train"]["agent/tool_call_rate"] == [1.0]
    assert trainer._metrics["train"]["agent/accuracy"] == [0.5]


def test_demonstrations_call_the_tool_once_per_step_and_splits_stay_disjoint():
    from agentic_rl.data import load_task_dataset

    row = agent_rows([{"question": "q", "answer": "39 * 83 = <<39*83=3237>>3237\n3237 - 21 = <<3237-21=3216>>3216\n"
                                                  "#### 3216"}])[0]
    assert row["ground_truth"] == "3216"
    messages = demonstration(row)
    assert [m["content"] for m in messages] == [
        render_tool_call("calculator", {"expression": "39*83"}), "3237",
        render_tool_call("calculator", {"expression": "3237-21"}), "3216",
        "39 * 83 = 3237\n3237 - 21 = 3216\nFinal Answer: 3216"]
    # The environment stages' task source: its train and test splits never share a question.
    train = load_task_dataset("synthetic:multiplication", "train", synthetic_train_size=500).to_list()
    test = load_task_dataset("synthetic:multiplication", "test", synthetic_test_size=300).to_list()
    assert len(train) == 500 and len(test) == 300
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    # and its rows are multiplication tasks the calculator demonstration replays (a 2-digit x 2-digit first call)
    first_call = demonstration(agent_rows(train[:1])[0])[0]["content"]
    assert re.search(r'"expression": "\d\d\*\d\d"', first_call), first_call


def test_short_final_turn_copies_the_last_tool_result(tokenizer):
    from agentic_rl.errors import DataError

    row = agent_rows([{"question": "q", "answer": "39 * 83 = <<39*83=3237>>3237\n3237 - 21 = <<3237-21=3216>>3216\n"
                                                  "#### 3216"}])[0]
    messages = demonstration(row, final_turn="answer")
    assert [m["content"] for m in messages] == [
        render_tool_call("calculator", {"expression": "39*83"}), "3237",
        render_tool_call("calculator", {"expression": "3237-21"}), "3216", "Final Answer: 3216"]
    # without tools the answer turn still shows the steps (there is no tool result to copy)
    direct = demonstration(agent_rows([row], tools=False)[0], tools=False, final_turn="answer")
    assert [m["content"] for m in direct] == ["39 * 83 = 3237\n3237 - 21 = 3216\nFinal Answer: 3216"]
    example = demonstration_examples(tokenizer, [row], final_turn="answer")[0]
    trained = tokenizer.decode([t for t, lab in zip(example["input_ids"], example["labels"]) if lab != -100])
    assert trained.endswith("</tool_call><|im_end|>Final Answer: 3216<|im_end|>") and "39 * 83 =" not in trained
    with pytest.raises(DataError, match="final_turn"):
        demonstration(row, final_turn="short")


def test_sft_rows_split_into_tool_skip_tool_and_direct_demonstrations(tokenizer):
    from agentic_rl.agent.settings import build_environment
    from agentic_rl.agent.tasks import AGENT_SYSTEM_PROMPT
    from agentic_rl.data.formats import SYSTEM_PROMPT
    from agentic_rl.train.sft import SFTConfig, build_environment_dataset, load_task_rows

    def config(**fractions):
        return SFTConfig(model="m", environment="calculator", environment_args={"final_turn": "answer"},
                         dataset="synthetic:multiplication", max_train_samples=20, **fractions)

    sft = config(direct_fraction=0.25, skip_tool_fraction=0.35)
    rows = load_task_rows(sft).to_list()
    examples, counts = build_environment_dataset(sft, build_environment(sft), tokenizer)
    assert counts == {"environment": 8, "skip_tool": 7, "direct": 5, "not_demonstrated": 0} and len(examples) == 20
    truth = {r["question"]: r["ground_truth"] for r in rows}
    kinds = {"environment": [], "skip_tool": [], "direct": []}
    for example in examples:
        text = tokenizer.decode(example["input_ids"])
        trained = tokenizer.decode([t for t, lab in zip(example["input_ids"], example["labels"]) if lab != -100])
        answer = next(truth[q] for q in truth if q in text)
        if SYSTEM_PROMPT in text:  # the standard prompt: no tools offered
            assert '"name": "calculator"' not in text
            kinds["direct"].append((trained, answer))
        else:  # the environment's prompt with the tool schema (tools_in_prompt), whether the row calls it or not
            assert AGENT_SYSTEM_PROMPT in text and '"name": "calculator"' in text
            kinds["environment" if "<tool_call>" in trained else "skip_tool"].append((trained, answer))
    assert {k: len(v) for k, v in kinds.items()} == {k: counts[k] for k in kinds}
    # skip rows: the tool is offered but not called; the steps written out and the final answer
    assert all("<tool_response>" not in t and " = " in t and f"Final Answer: {a}" in t for t, a in kinds["skip_tool"])
    assert all(" = " in t and f"Final Answer: {a}" in t for t, a in kinds["direct"])
    # environment rows: the calls, then (final_turn "answer") only the final answer, nothing recomputed
    assert all(t.count("<tool_call>") >= 1 and " = " not in t
               and t.endswith(f"</tool_call><|im_end|>Final Answer: {a}<|im_end|>") for t, a in kinds["environment"])
    # the three kinds are disjoint: every row appears exactly once
    questions = [tokenizer.decode(e["input_ids"]) for e in examples]
    assert all(sum(r["question"] in q for q in questions) == 1 for r in rows)
    # skip_tool_fraction=0 keeps the two-way split
    plain = config(direct_fraction=0.25)
    _, counts = build_environment_dataset(plain, build_environment(plain), tokenizer)
    assert counts == {"environment": 15, "skip_tool": 0, "direct": 5, "not_demonstrated": 0}


# ---------------------------------------------------------------------------------------------------------------
# RLOO with the environment (grpo --environment calculator --algorithm rloo)
# ---------------------------------------------------------------------------------------------------------------

def test_agent_rloo_refuses_grpo_only_settings():
    from agentic_rl.config import config_from_dict
    from agentic_rl.train.grpo import GRPOConfig

    env = {"model": "m", "environment": "calculator"}
    assert GRPOConfig(**env, algorithm="rloo").algorithm == "rloo"
    with pytest.raises(ConfigError, match=r"loss_type \('grpo'\) is a GRPO setting; RLOO uses the leave-one-out "
                                          r"baseline .*; drop --loss-type"):
        GRPOConfig(**env, algorithm="rloo", loss_type="grpo")
    with pytest.raises(ConfigError, match=r"scale_rewards \('none'\) is a GRPO setting"):
        GRPOConfig(**env, algorithm="rloo", scale_rewards="none")
    with pytest.raises(ConfigError, match="must be one of grpo, rloo"):
        config_from_dict(GRPOConfig, {**env, "algorithm": "ppo"})


def _completion_logps(model, batch):
    """Per-token log-probs of the batch's completion tokens under ``model`` (plain forward, no TRL code): (B, C)."""
    import torch

    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits[:, -width - 1:-1]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


def test_agent_rloo_trains_two_steps_with_leave_one_out_advantages_and_kl_in_the_reward(
        tiny_model_dir, tokenizer, monkeypatch, tmp_path):
    """Two real optimizer steps of ``grpo --environment calculator --algorithm rloo`` on the micro model.

    The policy is scripted (every episode calls the calculator, then episode 0 of the group answers right and
    episodes 1-3 wrongly), so the rewards of each group are exactly [1, 0, 0, 0]; the update, the reference, the
    KL and the optimizer are real. The advantages trained on are checked against an independent computation of
    RLOO's: leave-one-out of r − β·KL, with KL recomputed from plain forwards of the policy and its reference.
    """
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from agentic_rl.train import grpo_trainer
    from agentic_rl.train.grpo import run

    monkeypatch.setattr(rollout_mod, "generate_batch",
                        scripted_policy(tokenizer, [CALL, "Final Answer: 1081"], wrong_rows=(1, 2, 3)))
    captured = []

    class Recording(grpo_trainer.RLOOEpisodeTrainer):
        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            model = self.accelerator.unwrap_model(self.model)
            policy = _completion_logps(model, batch)
            with model.disable_adapter():  # the LoRA reference: the base model
                reference = _completion_logps(model, batch)
            mask = batch["completion_mask"] * batch["tool_mask"]
            captured.append({"advantages": batch["advantages"].clone(),
                             "kl": ((policy - reference) * mask).sum(1), "old_logps": batch["old_logps"].clone(),
                             "policy_logps": (policy * mask).sum(1), "action_tokens": mask.sum()})
            return batch

    episodes = grpo_trainer.VARIANTS[("rloo", "episodes")]
    monkeypatch.setitem(grpo_trainer.VARIANTS, ("rloo", "episodes"), dataclasses.replace(episodes, trainer=Recording))
    data = tmp_path / "task.jsonl"
    data.write_text(json.dumps(ROW) + "\n")
    out = tmp_path / "agent-rloo"
    beta = 0.05  # temperature 1 below: TRL divides the logits by it, the plain forwards of _completion_logps do not
    result = run(grpo_config(tiny_model_dir, out, environment="calculator", algorithm="rloo", dataset=str(data),
                             max_train_samples=1, num_generations=4, beta=beta, temperature=1.0, tool_call_reward=0.0,
                             max_turn_tokens=64, max_completion_length=200, save_steps=10, report_to=["tensorboard"]))

    assert result["steps"] == 2
    assert len(captured) == 2  # RLOO's trainer ran: one generation batch per optimizer step
    first, second = captured
    # Step 1: the fresh LoRA adapter is the reference, so the KL is exactly 0 and the advantages are the
    # leave-one-out ones of [1, 0, 0, 0]: 1 - 0 and 0 - 1/3 (GRPO's would be 0.75 / -0.25, or ±1.5 / ∓0.5 std-scaled).
    assert torch.all(first["kl"] == 0)
    assert first["advantages"].tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3], abs=1e-7)
    # Step 2: the policy moved, the KL is folded into the reward before the leave-one-out baseline.
    assert second["kl"].abs().max() > 1e-4
    penalised = torch.tensor([1.0, 0.0, 0.0, 0.0]) - beta * second["kl"]
    leave_one_out = torch.stack([penalised[i] - torch.cat([penalised[:i], penalised[i + 1:]]).mean()
                                 for i in range(4)])
    assert second["advantages"].tolist() == pytest.approx(leave_one_out.tolist(), abs=1e-5)
    # π_old is the sampling policy: the stored sequence log-probs are the policy's at generation time.
    for step in captured:
        assert step["old_logps"].tolist() == pytest.approx(step["policy_logps"].tolist(), abs=1e-4)

    assert (Path(result["model_dir"]) / "config.json").is_file()
    # The stage's logs: the documented metric names, RLOO's KL and the episode statistics, for both steps.
    metrics = read_jsonl(out / "metrics.jsonl")
    trained = [m for m in metrics if "grpo/reward" in m]
    assert [m["step"] for m in trained] == [1, 2]
    assert [m["grpo/reward"] for m in trained] == [0.25, 0.25]  # returns [1, 0, 0, 0] in each group
    assert [m["agent/accuracy"] for m in trained] == [0.25, 0.25]
    assert all(m["agent/tool_call_rate"] == 1.0 for m in trained)
    # RLOO's KL as RLOOTrainer logs it: the per-token mean of the k1 estimate over action tokens
    assert trained[0]["grpo/kl"] == 0.0
    assert trained[1]["grpo/kl"] == pytest.approx((second["kl"].sum() / second["action_tokens"]).item(), abs=1e-5)
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "grpo/reward", "grpo/kl", "grpo/entropy", "grpo/clip_ratio", "agent/accuracy",
            "agent/tool_call_rate"} <= tags
    assert [e.step for e in events.Scalars("grpo/reward")] == [1, 2]
