"""Task rows and tool-use demonstrations for agent training.

Rows are GSM8K-shaped (``question``, ``answer`` with ``<<a*b=c>>`` calculator annotations and a final ``#### N``);
the agent stages turn them into ``{"question", "prompt", "ground_truth", "answer"}`` with the agent system prompt.

A *demonstration* of a row replays its annotations as tool calls, one per turn, then writes the solution::

    assistant: <tool_call>{"name": "calculator", "arguments": {"expression": "39*83"}}</tool_call>
    tool:      3237
    assistant: <tool_call>{"name": "calculator", "arguments": {"expression": "3237-21"}}</tool_call>
    tool:      3216
    assistant: 39 * 83 = 3237 / 3237 - 21 = 3216 / Final Answer: 3216     (one step per line)

or, with ``final_turn="answer"`` (the embedded quickstart: less for a tiny model to copy), only
``Final Answer: 3216`` as the last turn.

:func:`demonstration_examples` tokenizes episodes with :func:`agentic_rl.agent.rollout.encode_episode` and sets the
labels of the prompt and of every tool-response token to -100: SFT learns the calls and the answer, never the
tool's output. :func:`environment_examples` does the same for any environment, from its ``demonstration(task)``:
labels are -100 on the prompt, on tool and ``user`` (feedback) messages and on assistant turns marked
``"train": False`` (e.g. the wrong first attempt of a self-correction demonstration).
"""

from __future__ import annotations

import random
from typing import Any

from agentic_rl.agent.reference import ground_truth_of, solution_steps
from agentic_rl.agent.rollout import (context_start, context_views, context_window_of, encode_episode,
                                     encode_episode_turns, prompt_with_observation, reset_episode)
from agentic_rl.agent.tool_format import ChatFormat, render_tool_call, tool_exchange
from agentic_rl.data.formats import (CALC_STEP, SYSTEM_PROMPT, accepted_answers, build_prompt, format_solution,
                                    task_with_data)
from agentic_rl.errors import DataError

AGENT_SYSTEM_PROMPT = (
    "Solve the math word problem. Use the calculator tool for arithmetic. Write one reasoning step per line, "
    "then finish with a last line of the form 'Final Answer: N'."
)


def tool_call_scaffold(n_lines: int, seed: int = 0, *, every_tool: bool = False) -> list[str]:
    """Tokenizer-corpus lines that make tool calls few tokens: the agent system prompt, the role names and calculator
    calls as the model writes them, each in ``max(100, n_lines // 4)`` lines. BPE merges only what is frequent, so
    without them a call's JSON wrapper stays ~48 byte-level tokens (the context at an episode's second call ~200
    tokens) instead of 18. Passed as ``scaffold`` to :func:`agentic_rl.data.synthetic.default_tokenizer_corpus`.
    ``every_tool`` adds the calls of the search and memory tools (``search``, ``remember``, ``recall``) with names
    from a fictional world, as often as the calculator's (the shipped base's tokenizer serves every environment)."""
    rng = random.Random(f"agentic-rl-tool-scaffold:{seed}")
    calls = max(100, n_lines // 4)  # as frequent as the corpus's common words, or their pairs win the merges
    lines = [AGENT_SYSTEM_PROMPT, "system\n", "user\n", "assistant\n"] * calls  # roles start every turn
    lines += [render_tool_call("calculator", {"expression": f"{rng.randint(2, 99)}{rng.choice('+-*')}"
                                                            f"{rng.randint(2, 99)}"}) for _ in range(calls)]
    if every_tool:
        from agentic_rl.data.world import corpus_world, note_text

        world = corpus_world(seed, 0, namespace="tool-scaffold")
        for _ in range(calls):
            person = rng.choice(world.people)
            relation = rng.choice(("born_in", "lives_in", "works_at", "mentor"))
            lines += [render_tool_call("search", {"query": person}),
                      render_tool_call("remember", {"key": person, "text": note_text(relation, world.get(person,
                                                                                                       relation))}),
                      render_tool_call("recall", {"key": person})]
    return lines


def agent_rows(rows: list[dict[str, Any]], *, tools: bool = True, system_prompt: str | None = None
               ) -> list[dict[str, Any]]:
    """GSM8K-shaped rows -> agent task rows (``prompt`` uses the agent system prompt, or the plain one)."""
    prompt_text = system_prompt or (AGENT_SYSTEM_PROMPT if tools else SYSTEM_PROMPT)
    out = []
    for i, row in enumerate(rows):
        if "question" not in row:
            raise DataError(f"task row {i} has no 'question'")
        truth = str(row["ground_truth"]) if "ground_truth" in row else ground_truth_of(row.get("answer", ""))
        out.append({"question": row["question"], "prompt": build_prompt(row["question"], prompt_text),
                    "ground_truth": truth, "answer": row.get("answer", row.get("full_answer", ""))})
    return out


FINAL_TURNS = ("steps", "answer")


def demonstration(row: dict[str, Any], *, tools: bool = True, tool_name: str = "calculator",
                  final_turn: str = "steps") -> list[dict[str, str]]:
    """The assistant/tool messages of a demonstration episode for ``row`` (see the module docstring).

    ``final_turn`` is the answer turn after tool calls: ``"steps"`` writes the solution steps then the final-answer
    line; ``"answer"`` only the ``Final Answer: N`` line (N is the last tool result). A demonstration without tool
    calls always writes the steps.
    """
    if final_turn not in FINAL_TURNS:
        raise DataError(f"final_turn must be one of {FINAL_TURNS}, got {final_turn!r}")
    messages: list[dict[str, str]] = []
    if tools:
        for expression, value in CALC_STEP.findall(row["answer"]):
            messages += tool_exchange(tool_name, {"expression": expression.strip()}, value.strip())
    final = reference_answer(row["ground_truth"])
    steps = [] if messages and final_turn == "answer" else solution_steps(row["answer"])
    if [" ".join(step.split()) for step in steps] == [" ".join(final.split())]:
        steps = []  # a bare answer (a QA file's "Marseille") is the final answer, not a step before it
    messages.append({"role": "assistant", "content": format_solution(steps, final)})
    return messages


def reference_answer(ground_truth: Any) -> str:
    """The answer a demonstration writes: the ground truth, or the first of several accepted answers (a QA row's
    ``answers`` list, stored as a JSON list)."""
    return str(accepted_answers(ground_truth)[0])


def demonstration_examples(tokenizer, rows: list[dict[str, Any]], *, tools: bool = True,
                           tool_schemas: list[dict] | None = None, chat_template_kwargs: dict | None = None,
                           final_turn: str = "steps", call_tools: bool | None = None) -> list[dict[str, list[int]]]:
    """Tokenized SFT examples ``{"input_ids", "labels"}``; labels are -100 on the prompt and on tool tokens.

    ``tools`` says whether the tools are offered (the schemas go into the prompt); ``call_tools`` (default: ``tools``)
    whether the demonstration calls them — ``tools=True, call_tools=False`` answers directly under a tool prompt."""
    call_tools = tools if call_tools is None else call_tools
    fmt = ChatFormat(tokenizer, chat_template_kwargs if chat_template_kwargs is not None
                     else {"enable_thinking": False})
    examples = []
    for row in rows:
        messages = demonstration(row, tools=call_tools, final_turn=final_turn)
        prompt_ids, completion, mask = encode_episode(fmt, row["prompt"], messages,
                                                      tool_schemas if tools else None)
        labels = [-100] * len(prompt_ids) + [tok if m else -100 for tok, m in zip(completion, mask)]
        examples.append({"input_ids": prompt_ids + completion, "labels": labels})
    return examples


def _labelled(fmt: ChatFormat, prompt, messages, tools) -> dict[str, list[int]]:
    prompt_ids, completion, mask = encode_episode(fmt, prompt, messages, tools)
    labels = [-100] * len(prompt_ids) + [tok if m else -100 for tok, m in zip(completion, mask)]
    return {"input_ids": prompt_ids + completion, "labels": labels}


def view_examples(prompt_ids: list[int], completion: list[int], mask: list[int], spans: list[tuple[int, int]],
                  window: int | None) -> list[dict[str, list[int]]]:
    """One SFT example per context view of an encoded episode (:func:`agentic_rl.agent.rollout.context_views`):
    the prompt, then the view's part of the completion, labelled only on the tokens of the turns generated in that
    view. Without a ``window`` that is the one example of the whole episode."""
    starts = [context_start(spans, turn, window) for turn in range(len(spans))]
    examples = []
    for start, end, turns in context_views(spans, starts):
        labelled = {i for turn in turns for i in range(*spans[turn])}
        labels = [tok if mask[i] and i in labelled else -100 for i, tok in enumerate(completion[start:end], start)]
        examples.append({"input_ids": prompt_ids + completion[start:end], "labels": [-100] * len(prompt_ids) + labels})
    return examples


def environment_examples(tokenizer, env, tasks: list[dict[str, Any]], tools_in_prompt: bool = True,
                         chat_template_kwargs: dict | None = None) -> list[dict[str, list[int]]]:
    """Tokenized SFT examples ``{"input_ids", "labels"}`` of ``env.demonstration(task)`` for each task, for any
    environment. The prompt is ``task["prompt"]`` with the string ``env.reset(task)`` returns appended (as in a
    rollout), the environment's tool schemas in it when ``tools_in_prompt``; labels are -100 on the prompt, on
    tool and user messages and on assistant turns with ``"train": False``. A task's ``task_data`` columns are
    spread into it (:func:`agentic_rl.data.formats.task_with_data`) before ``reset`` and ``demonstration``. An
    environment with a ``context_window`` gives one example per context view of each demonstration
    (:func:`view_examples`): every turn is learnt in the context the rollout will generate it in."""
    fmt = ChatFormat(tokenizer, chat_template_kwargs if chat_template_kwargs is not None
                     else {"enable_thinking": False})
    examples = []
    for i, task in enumerate(tasks):
        if "prompt" not in task:
            raise DataError(f"task row {i} has no 'prompt'")
        task = task_with_data(task)
        prompt = prompt_with_observation(task["prompt"], reset_episode(env, task))
        tools = env.tool_schemas() if tools_in_prompt else None
        window = context_window_of(env)
        if window is None:
            examples.append(_labelled(fmt, prompt, env.demonstration(task), tools))
        else:
            examples += view_examples(*encode_episode_turns(fmt, prompt, env.demonstration(task), tools), window)
    return examples
