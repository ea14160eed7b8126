"""Token in, token out: a multi-turn rollout never re-tokenizes earlier turns. Each turn's context ids are a prefix of
the next turn's, the ids the policy generated reappear verbatim after them, and the sequence GRPO scores is the last
context plus the last turn; checked with the embedded tokenizer's template and with Qwen3's own chat template (which
renders tool calls and tool results, and drops the empty thinking block of earlier turns when a conversation is
rendered again, so re-rendering would change earlier turns' tokens)."""

from __future__ import annotations

import pytest

from agentic_rl.agent import rollout as rollout_mod
from agentic_rl.agent.calculator_env import CalculatorEnv
from agentic_rl.agent.rollout import RolloutSettings, run_episodes
from agentic_rl.agent.tasks import agent_rows
from agentic_rl.agent.tool_format import ChatFormat, render_tool_call

#: The chat template of Qwen3's tokenizer_config.json (Qwen/Qwen3-0.6B), as published.
QWEN3_CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with \
function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\
\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and \
not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1]\
.lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + \
'\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

ROWS = [{"question": "A farm has 23 boxes with 47 eggs in each box. How many eggs are there?",
         "answer": "23 * 47 = <<23*47=1081>>1081\n1081 - 81 = <<1081-81=1000>>1000\n#### 1000"},
        {"question": "Sam has 47 bags with 23 beads each. How many beads?",
         "answer": "47 * 23 = <<47*23=1081>>1081\n#### 1081"}]
#: What each episode's policy writes, turn by turn: tool calls, then an answer (episode 0 takes one turn more).
SCRIPTS = [[render_tool_call("calculator", {"expression": "23*47"}),
            render_tool_call("calculator", {"expression": "1081-81"}), "23 * 47 = 1081\nFinal Answer: 1000"],
           [render_tool_call("calculator", {"expression": "47*23"}), "Final Answer: 1081"]]


@pytest.fixture(scope="module", params=["embedded", "qwen3"])
def tokenizer(request):
    """The embedded tokenizer (trained here on a small corpus) with the embedded model's chat template, or with
    Qwen3's own."""
    from agentic_rl.data.synthetic import default_tokenizer_corpus
    from agentic_rl.models.tiny import CHAT_TEMPLATE, train_tokenizer

    template = CHAT_TEMPLATE if request.param == "embedded" else QWEN3_CHAT_TEMPLATE
    return train_tokenizer(default_tokenizer_corpus(300, seed=0), vocab_size=400, chat_template=template)


def is_prefix(shorter: list[int], longer: list[int]) -> bool:
    return len(shorter) <= len(longer) and longer[:len(shorter)] == shorter


def play(tokenizer, monkeypatch):
    """Two episodes in lock-step with a recording policy: returns the trajectories and, per episode, the contexts
    it was given and the ids it returned, turn by turn."""
    fmt = ChatFormat(tokenizer, {"enable_thinking": False})
    seen: list[list[tuple[list[int], list[int]]]] = [[], []]

    def generate_batch(model, contexts, **kwargs):
        active = [e for e in range(len(SCRIPTS)) if len(SCRIPTS[e]) > len(seen[e])]  # episodes still playing
        assert len(active) == len(contexts)
        out = []
        for episode, context in zip(active, contexts):
            ids = fmt.encode(SCRIPTS[episode][len(seen[episode])]) + [fmt.end_of_turn_id]
            seen[episode].append((list(context), ids))
            out.append(list(ids))
        return out

    monkeypatch.setattr(rollout_mod, "generate_batch", generate_batch)
    tasks = agent_rows(ROWS)
    trajectories = run_episodes(None, tokenizer, [CalculatorEnv(), CalculatorEnv()], tasks,
                                [t["prompt"] for t in tasks], RolloutSettings(max_turn_tokens=64,
                                                                              max_completion_length=600), fmt)
    return trajectories, seen, fmt, tasks


def test_each_turns_context_is_a_prefix_of_the_next(tokenizer, monkeypatch):
    trajectories, seen, fmt, tasks = play(tokenizer, monkeypatch)
    for episode, (traj, turns) in enumerate(zip(trajectories, seen)):
        assert traj.correct and traj.turns == len(SCRIPTS[episode]) == len(turns)
        assert traj.tool_calls == len(SCRIPTS[episode]) - 1 and traj.tool_errors == 0
        schemas = [t.schema for t in CalculatorEnv().tools]
        assert turns[0][0] == fmt.prompt_ids(tasks[episode]["prompt"], schemas) == traj.prompt_ids
        for (context, generated), (next_context, _) in zip(turns, turns[1:]):
            assert is_prefix(context, next_context)
            # the generated ids follow verbatim, then the tool result: never re-encoded from text
            assert next_context[len(context):len(context) + len(generated)] == generated
            observation = tokenizer.decode(next_context[len(context) + len(generated):])
            assert "<tool_response>" in observation and "<tool_call>" not in observation
        # the sequence GRPO scores is the last context plus the last turn
        last_context, last_generated = turns[-1]
        assert traj.prompt_ids + traj.completion_ids == last_context + last_generated


def test_re_rendering_the_conversation_would_change_earlier_turns_with_qwen3s_template(tokenizer, monkeypatch):
    """Why the check above matters: with Qwen3's template, the conversation rendered again after a tool result (as
    a rollout that re-tokenizes would build its next context) is not an extension of the context the first turn was
    sampled from, because the earlier turn loses the empty thinking block it was generated after."""
    trajectories, seen, fmt, tasks = play(tokenizer, monkeypatch)
    traj = trajectories[1]
    schemas = [t.schema for t in CalculatorEnv().tools]
    first_context = seen[1][0][0]
    re_rendered = fmt.prompt_ids(tasks[1]["prompt"] + traj.messages[:2], schemas)  # assistant call + tool result
    if tokenizer.chat_template == QWEN3_CHAT_TEMPLATE:
        assert "<think>\n\n</think>\n\n" in tokenizer.decode(first_context)
        assert not is_prefix(first_context, re_rendered)
    assert is_prefix(first_context, seen[1][1][0])  # the rollout's own next context is an extension either way


def test_an_episodes_text_is_the_rollouts_sequence(tokenizer, monkeypatch):
    """The text a pretraining corpus writes an episode as (:func:`agentic_rl.agent.rollout.episode_text`) encodes to
    exactly the ids the rollout played, with either template; a memory log's feedback messages (``user``) too."""
    from agentic_rl.agent.memory_env import MemoryEnv
    from agentic_rl.agent.rollout import encode_episode, episode_text
    from tests.test_memory_env import TASK as MEMORY_LOG

    trajectories, _, fmt, tasks = play(tokenizer, monkeypatch)
    schemas = [t.schema for t in CalculatorEnv().tools]
    for traj, task in zip(trajectories, tasks):
        text = episode_text(fmt, task["prompt"], traj.messages, schemas)
        assert fmt.encode(text) == traj.prompt_ids + traj.completion_ids
    messages = MemoryEnv().demonstration(MEMORY_LOG)
    prompt = [{"role": "user", "content": MEMORY_LOG["question"]}]
    prompt_ids, completion_ids, _ = encode_episode(fmt, prompt, messages)
    assert any(m["role"] == "user" for m in messages)
    assert fmt.encode(episode_text(fmt, prompt, messages)) == prompt_ids + completion_ids
