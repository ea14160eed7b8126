"""The one prompt builder and answer format shared by SFT, GRPO and evaluation.

Answer format (what the model learns to write)::

    48 / 2 = 24
    48 + 24 = 72
    Final Answer: 72

one reasoning step per line, then exactly one ``Final Answer: N`` line. Prompts are conversational (a list of
``{"role", "content"}`` messages) so TRL and our evaluator render them with the model's own chat template; because
all three stages call :func:`build_prompt`, the tokens a model is trained on after the prompt are generated from the
very same prompt tokens at evaluation time.

Row formats (exactly these fields):

* SFT: ``prompt`` (system + user messages), ``completion`` (one assistant message), optional ``text``.
* RL:  ``question``, ``prompt`` (system + user messages), ``ground_truth`` (number as a string), ``full_answer``.

A task row of a dataset that gives an environment more to read than the question (the lookup chain of a world
question, the event log of a memory task) also carries ``task_data``: those columns as one JSON object, kept through
the RL rows and spread back into the task that ``env.reset`` and ``env.demonstration`` receive
(:func:`task_with_data`).
"""

from __future__ import annotations

import json
import re
from typing import Any

SYSTEM_PROMPT = (
    "Solve the math word problem. Write one reasoning step per line, "
    "then finish with a last line of the form 'Final Answer: N'."
)
FINAL_ANSWER_PREFIX = "Final Answer:"

# GSM8K's calculator annotations, e.g. "<<48/2=24>>".
CALC_ANNOTATION = re.compile(r"<<[^<>]*>>")
# The same, read as (expression, value): "<<48/2=24>>" -> ("48/2", "24").
CALC_STEP = re.compile(r"<<([^<>=]+)=([^<>]+)>>")


def resolve_system_prompt(setting: str | None) -> str | None:
    """A stage's ``system_prompt`` setting -> the system message: unset (None) is the standard instruction
    :data:`SYSTEM_PROMPT`, an empty string means no system message, anything else is used as given.

    SFT, GRPO and evaluation of one model must use the same value (the pipeline passes one value to all three):
    the tiny embedded model runs without one, which makes its prompts ~40 % shorter (and SFT that much faster).
    """
    if setting is None:
        return SYSTEM_PROMPT
    return setting or None


def build_prompt(question: str, system_prompt: str | None = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The conversational prompt every stage uses: an optional system message, then the question."""
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": question.strip()})
    return messages


def last_message_index(messages: Any, role: str = "user") -> int | None:
    """Position of the last ``role`` message of a conversation (for ``user``: the question, to which an environment
    appends its first observation); None for plain text or a conversation without such a message.

    >>> last_message_index(build_prompt("How many?"))
    1
    """
    if not isinstance(messages, (list, tuple)):
        return None
    return max((k for k, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == role), default=None)


def format_solution(steps: list[str], final_answer: str, *, answer_first: bool = False) -> str:
    """Steps one per line, then the final-answer line (the completion text the model learns to write).

    ``answer_first`` puts the final-answer line *before* the steps: the "answer, then justify" style of an
    imperfect demonstration, where the answer is committed to before any reasoning is written.
    """
    lines = [s.strip() for s in steps if s.strip()]
    final = f"{FINAL_ANSWER_PREFIX} {final_answer}"
    return "\n".join([final, *lines] if answer_first else [*lines, final])


def completion_message(solution: str) -> list[dict[str, str]]:
    """The completion as TRL's conversational prompt-completion format wants it: one assistant message.

    The end-of-sequence token is appended by the chat template / TRL when the row is tokenized, so the model learns
    to stop after the final answer.
    """
    return [{"role": "assistant", "content": solution}]


def sft_row(question: str, steps: list[str], final_answer: str, *, system_prompt: str | None = SYSTEM_PROMPT,
            with_text: bool = False, answer_first: bool = False) -> dict[str, Any]:
    solution = format_solution(steps, final_answer, answer_first=answer_first)
    row: dict[str, Any] = {"prompt": build_prompt(question, system_prompt), "completion": completion_message(solution)}
    if with_text:
        row["text"] = solution
    return row


def rl_row(question: str, ground_truth: str, full_answer: str, *,
           system_prompt: str | None = SYSTEM_PROMPT) -> dict[str, Any]:
    return {"question": question, "prompt": build_prompt(question, system_prompt),
            "ground_truth": ground_truth, "full_answer": full_answer}


#: The column holding a task's environment columns (a JSON object as text; see the module docstring).
TASK_DATA = "task_data"


def task_with_data(task: dict[str, Any]) -> dict[str, Any]:
    """``task`` with the columns of its ``task_data`` spread into it (a column the row has already keeps its value),
    as environments read them; a task without ``task_data`` unchanged.

    >>> task_with_data({"question": "q", "task_data": '{"chain": ["A"], "question": "x"}'})
    {'question': 'q', 'chain': ['A']}
    """
    if TASK_DATA not in task:
        return task
    from agentic_rl.errors import DataError

    raw = task[TASK_DATA]
    try:
        extra = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        raise DataError(f"a task's {TASK_DATA} is not a JSON object ({exc})") from None
    if not isinstance(extra, dict):
        raise DataError(f"a task's {TASK_DATA} must be a JSON object, got {type(extra).__name__}")
    out = {k: v for k, v in task.items() if k != TASK_DATA}
    return {**out, **{k: v for k, v in extra.items() if k not in out}}


def chat_template_kwargs(enable_thinking: bool = False) -> dict[str, Any]:
    """Extra arguments for ``apply_chat_template``: Qwen3 "thinking" is off unless asked for.

    Templates that do not know ``enable_thinking`` ignore it.
    """
    return {"enable_thinking": enable_thinking}


def render_prompt(tokenizer, messages: list[dict[str, str]], *, enable_thinking: bool = False) -> str:
    """The prompt string exactly as generation sees it (chat template + generation prompt)."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         **chat_template_kwargs(enable_thinking))


def accepted_answers(ground_truth: Any) -> list[Any]:
    """The answers a ground truth accepts: the items of a list (or of a string holding a JSON list of strings, as a
    dataset column stores several accepted answers, ``'["Paris", "Paris, France"]'``); else the ground truth alone.
    Demonstrations write the first; the verifier accepts any."""
    if isinstance(ground_truth, (list, tuple)):
        return list(ground_truth)
    if isinstance(ground_truth, str) and ground_truth.startswith("[") and ground_truth.endswith("]"):
        try:
            items = json.loads(ground_truth)
        except ValueError:
            return [ground_truth]
        if isinstance(items, list) and items and all(isinstance(item, str) for item in items):
            return items
    return [ground_truth]
