"""The memory environment: a log of events arrives one per turn, old turns leave the model's context, and a question
at the end asks about facts the model had to store as notes.

An episode (a row of the ``synthetic:memory`` dataset, :func:`agentic_rl.data.custom.memory_log_row`)::

    prompt     user: Log 17. Event 1 of 5: Orla Venkel was born in Dunmor Bay.
    turn 1     assistant: <tool_call>{"name": "remember", "arguments": {"key": "Orla Venkel",
                                                                      "text": "born in Dunmor Bay"}}</tool_call>
               tool: stored
               user: Event 2 of 5: The mentor of Kalo Renmi is Orla Venkel.
    turn 2     assistant: next
               user: Event 3 of 5: ...
    ...
    turn 5     user: Question: Where was the mentor of Kalo Renmi born?
    turn 6     assistant: <tool_call>{"name": "recall", "arguments": {"key": "Kalo Renmi"}}</tool_call>
               tool: mentor is Orla Venkel
    ...
    turn 8     assistant: Final Answer: Dunmor Bay

The prompt's user message is the log's header and its first event; the row number in the header makes every prompt
unique (the GRPO rollout maps a prompt back to its row by its text). The first event stays in the prompt for the
whole episode, so the dataset never puts a needed fact there. Only the latest ``context_window`` turns (an assistant
turn and the observation that answers it; default 2) stay in the model's context, so a fact read earlier must be
stored to be known at the question.

Log phase: each assistant turn either stores notes with one or more ``remember(key, text)`` calls (each answered
``stored`` in a ``tool`` message) or writes plain text ("next") to move on; either way the observation also carries
the next event as a ``user`` message ``Event i of n: ...``, and after the last event the ``user`` message
``Question: <question>``. Question phase: ``recall(key)`` returns the notes stored under the key, joined by "; "
(keys are compared ignoring case and spacing), or ``no note under '<key>'``; a turn without a tool call is the
answer, scored by the project's verifier (:func:`agentic_rl.rewards.is_correct`: the exact name after
normalisation, one name only), and ends the episode. ``max_turns`` bounds the episode (the last allowed turn is
scored as the answer); a log of n events needs at least n + 1 turns, and n + hops + 1 for an episode that stores
every event and recalls each hop (10 for the dataset's longest logs). Both tools work in either phase.

A note is *needed* when it holds a fact of the question's chain: its key is the fact's subject (a person or an
organisation) and its text contains the fact's note text (``note_text``: "born in Dunmor Bay", "mentor is Orla
Venkel", "works at the Salmi Guild", ...), case and spacing ignored. Step rewards: storing a needed fact for the
first time earns ``store_reward`` (0.1, per fact); recalling, for the first time, a key that holds a needed note
earns ``recall_reward`` (0.05); a recall of a key without notes, or an exact repeat of an earlier call, costs
``wasted_call_reward`` (-0.05); a malformed call, an unknown tool, bad arguments or a call over ``max_tool_calls``
gets an error observation and ``tool_error_reward``; a correct answer earns ``answer_reward`` (1.0). With
``tools_enabled`` false the episode still plays the whole log, and every call is an error observation (evaluation
without tools). Per episode (:meth:`MemoryEnv.episode_metrics`): ``stores``, ``needed_stores``, ``recalls``,
``useful_recalls``, ``wasted_calls``, ``needed_stored_rate`` (the share of the chain's facts stored) and
``reached_question`` (tool errors are counted by the rollout, as for every environment).

The demonstration of a task (:meth:`MemoryEnv.demonstration`) stores every event, one ``remember`` call per turn
(the first event, from the prompt, in turn 1; the demonstrator cannot know the question), then recalls each key of
the chain in order and answers. Real demonstrations are imperfect: ``skip_store_fraction`` is the share of events
(chosen by a stable hash of the log's header and the event's position) the demonstrator does not store, writing
"next" instead. When a needed event was skipped, it follows the chain as far as its notes go and answers from the
closest note it has: a note under the key where the chain breaks, else the last note it read on the chain, else the
first event's fact (still in view in the prompt), passing over any that would happen to be right. That answer is
wrong, as a real agent's would be. ``demonstration_max_hops`` limits the demonstrator to questions of at most that
many hops (:meth:`MemoryEnv.demonstrates`): SFT trains on those logs only and leaves the longer chains to RL.

Train and evaluate with ``--environment memory --dataset synthetic:memory --max-turns 10 --max-tool-calls 8``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agentic_rl.agent.env import Environment, StepResult, call_refusal, default_answer_check, stable_fraction
from agentic_rl.agent.rollout import context_window_of
from agentic_rl.agent.tool_format import clip, parse_tool_calls, render_tool_call, tool_message
from agentic_rl.agent.tools import Tool, ToolError
from agentic_rl.config import check_range
from agentic_rl.data.formats import accepted_answers
from agentic_rl.data.world import note_text
from agentic_rl.errors import ConfigError, DataError

MEMORY_SYSTEM_PROMPT = (
    "Read the log. Events arrive one per turn and only the latest turns stay visible. Store each fact you may need "
    "with the remember tool (key: the person or organisation it is about), or write 'next' to go on. When the "
    "question comes, recall the notes you need, then finish with a last line of the form 'Final Answer: <name>'."
)
STORED = "stored"
NO_NOTE = "no note under '{key}'"
#: What the demonstrator writes on a log turn where it stores nothing.
MOVE_ON = "next"
#: The columns of a memory task (besides ``question`` and ``ground_truth``).
TASK_COLUMNS = ("log_question", "events", "facts", "needed", "chain")


def normalise(text: str) -> str:
    """``text`` lowercased with its spacing collapsed: how keys are compared and notes matched."""
    return " ".join(str(text).lower().split())


class MemoryEnv(Environment):
    """An event log with ``remember``/``recall`` tools and a question at its end (registered as ``memory``; see the
    module docstring)."""

    system_prompt = MEMORY_SYSTEM_PROMPT
    text_answers = True  # answers are names: the stages load the dataset's answers as text

    def __init__(self, *, max_turns: int = 10, max_tool_calls: int = 8, store_reward: float = 0.1,
                 recall_reward: float = 0.05, wasted_call_reward: float = -0.05, tool_error_reward: float = 0.0,
                 answer_reward: float = 1.0, tools_enabled: bool = True, context_window: int | None = 2,
                 skip_store_fraction: float = 0.0, demonstration_max_hops: int | None = None,
                 answer_check: Callable[[str, str], bool] | None = None):
        given = {"max_turns": max_turns, "max_tool_calls": max_tool_calls, "store_reward": store_reward,
                 "recall_reward": recall_reward, "answer_reward": answer_reward,
                 "wasted_call_reward": wasted_call_reward, "tool_error_reward": tool_error_reward,
                 "skip_store_fraction": skip_store_fraction, "demonstration_max_hops": demonstration_max_hops}
        check_range(given, "max_turns", 1, integer=True, required=True)
        check_range(given, "max_tool_calls", 0, integer=True, required=True)
        check_range(given, ("store_reward", "recall_reward", "answer_reward"), required=True)
        # A positive value would reward repeating a call, or a broken one.
        check_range(given, ("wasted_call_reward", "tool_error_reward"), high=0, required=True)
        check_range(given, "skip_store_fraction", 0, 1, required=True)
        check_range(given, "demonstration_max_hops", 1, integer=True)  # None: every log is demonstrated
        self.max_turns, self.max_tool_calls = max_turns, max_tool_calls
        self.store_reward, self.recall_reward = store_reward, recall_reward
        self.wasted_call_reward, self.tool_error_reward = wasted_call_reward, tool_error_reward
        self.answer_reward = answer_reward
        self.tools_enabled = tools_enabled
        self.context_window = context_window
        context_window_of(self)  # the rollout's own check of the window
        self.skip_store_fraction = skip_store_fraction
        self.demonstration_max_hops = demonstration_max_hops
        self.answer_check = answer_check or default_answer_check
        self.tools = [Tool(self.remember), Tool(self.recall)]
        self._start({}, ([], [], [], [], ""))

    # -- the tools (their docstrings are the schemas the model sees) ------------------------------------------------

    def remember(self, key: str, text: str) -> str:
        """Store a note under a key, to recall it later.

        Args:
            key: the person or organisation the note is about.
            text: the fact to keep, e.g. "born in Dunmor Bay".
        """
        if not key.strip() or not text.strip():
            raise ToolError("remember needs a non-empty key and text")
        notes = self.notes.setdefault(normalise(key), [])
        if normalise(text) not in map(normalise, notes):
            notes.append(" ".join(text.split()))
        return STORED

    def recall(self, key: str) -> str:
        """The notes stored under a key.

        Args:
            key: the person or organisation whose notes to read.
        """
        notes = self.notes.get(normalise(key), [])
        return "; ".join(notes) if notes else NO_NOTE.format(key=clip(key, 80))

    # -- episode -------------------------------------------------------------------------------------------------

    @staticmethod
    def read_log(task: dict[str, Any]) -> tuple[list[str], list[tuple[str, str, str]], list[int], list[str], str]:
        """``(events, facts, needed, chain, question)`` of a memory task; a task without them is a one-line
        :class:`DataError` naming the columns."""
        missing = [c for c in TASK_COLUMNS if c not in task]
        if missing:
            raise DataError(f"a memory task needs the columns {', '.join(TASK_COLUMNS)} (the synthetic:memory "
                            f"dataset has them); missing: {', '.join(missing)}")
        events, facts = [str(e) for e in task["events"]], [tuple(map(str, f)) for f in task["facts"]]
        needed = [int(i) for i in task["needed"]]
        if not events or len(facts) != len(events) or any(len(f) != 3 for f in facts) \
                or any(not 0 <= i < len(events) for i in needed):
            raise DataError("a memory task needs one [subject, relation, object] fact per event and 'needed' "
                            "indices of its events")
        return events, facts, needed, [str(k) for k in task["chain"]], str(task["log_question"])

    def _start(self, task: dict[str, Any], log: tuple) -> None:
        self.task = task
        self.events, self.facts, self.needed, self.chain, self.question = log
        # the needed facts as (key, note text), both normalised: what a note must hold to count
        self._needed_notes = [(normalise(self.facts[i][0]), normalise(note_text(*self.facts[i][1:])))
                              for i in self.needed]
        self.notes: dict[str, list[str]] = {}
        self.turn, self.shown, self.asked = 0, 1, False
        self._seen_calls: set[str] = set()
        self._stored_needed: set[int] = set()
        self._recalled: set[str] = set()
        self.stores = self.needed_stores = self.recalls = self.useful_recalls = 0
        self.wasted_calls = self.tool_errors = 0

    def reset(self, task: dict[str, Any]) -> None:
        log = self.read_log(task)
        if self.max_turns < len(log[0]) + 1:
            raise ConfigError(f"a memory log of {len(log[0])} events needs max_turns >= {len(log[0]) + 1} to reach "
                              f"its question (set max_turns; {len(log[0]) + len(log[3]) + 1} lets an agent store "
                              "every event and recall each hop)")
        self._start(task, log)
        return None  # the first event is already in the prompt

    def step(self, assistant_text: str) -> StepResult:
        self.turn += 1
        content, calls = parse_tool_calls(assistant_text)
        if self.turn >= self.max_turns or (self.asked and not calls):
            return self._answer(content if calls else assistant_text, cut=bool(calls))
        reward, messages, errors, useful, wasted = 0.0, [], 0, 0, 0
        for call in calls:
            text, call_reward, kind = self._run_call(call)
            messages.append(tool_message(call.name, text))
            reward += call_reward
            errors += kind == "error"
            useful += kind == "useful"
            wasted += kind == "wasted"
        if not self.asked:
            if self.shown < len(self.events):
                messages.append({"role": "user", "content": f"Event {self.shown + 1} of {len(self.events)}: "
                                                            f"{self.events[self.shown]}"})
                self.shown += 1
            else:
                messages.append({"role": "user", "content": f"Question: {self.question}"})
                self.asked = True
        info = {"turn": self.turn, "kind": "tool" if calls else "log", "calls": len(calls), "errors": errors,
                "useful": useful, "wasted": wasted}
        return StepResult(observation=messages, reward=reward, done=False, info=info)

    def _answer(self, text: str, cut: bool) -> StepResult:
        correct = bool(self.answer_check(text, str(self.task.get("ground_truth", ""))))
        return StepResult(observation=[], reward=self.answer_reward if correct else 0.0, done=True,
                          info={"turn": self.turn, "kind": "answer", "correct": correct, "cut_by_max_turns": cut,
                                "asked": self.asked})

    def _run_call(self, call) -> tuple[str, float, str]:
        """(observation text, reward, kind: ``error``, ``useful``, ``wasted`` or ``ok``)."""
        error = call_refusal(call, self.offered_tools,
                             calls_made=self.stores + self.recalls + self.tool_errors,
                             max_calls=self.max_tool_calls, tools_off="write 'next' or the answer")
        if error is None:
            tool = next(t for t in self.tools if t.name == call.name)
            try:
                arguments = tool.check_arguments(call.arguments)
                before = set(self._stored_needed)
                text = tool.fn(**arguments)
            except ToolError as exc:
                error = clip(exc)
        if error is not None:
            self.tool_errors += 1
            return f"error: {error}", self.tool_error_reward, "error"
        signature = f"{call.name}:{json.dumps(arguments, sort_keys=True)}"
        repeat = signature in self._seen_calls
        self._seen_calls.add(signature)
        if call.name == "remember":
            self.stores += 1
            key, note = normalise(arguments["key"]), normalise(arguments["text"])
            fresh = [j for j, (k, n) in enumerate(self._needed_notes) if k == key and n in note and j not in before]
            self._stored_needed.update(fresh)
            self.needed_stores += bool(fresh)
            if fresh:
                return text, self.store_reward * len(fresh), "useful"
        else:
            self.recalls += 1
            key = normalise(arguments["key"])
            holds = any(k == key and any(n in normalise(t) for t in self.notes.get(key, []))
                        for k, n in self._needed_notes)
            first = key not in self._recalled
            self._recalled.add(key)
            if not repeat and key in self.notes and holds and first:
                self.useful_recalls += 1
                return text, self.recall_reward, "useful"
            if key not in self.notes:
                repeat = True  # a recall that finds nothing is wasted like a repeat
        if repeat:
            self.wasted_calls += 1
            return text, self.wasted_call_reward, "wasted"
        return text, 0.0, "ok"

    def episode_metrics(self) -> dict[str, float]:
        """Calls that ran (``stores``, ``recalls``), how many earned a reward (``needed_stores``,
        ``useful_recalls``) or were ``wasted_calls``, the share of the chain's facts stored
        (``needed_stored_rate``) and whether the question was asked (``reached_question``)."""
        return {"stores": float(self.stores), "needed_stores": float(self.needed_stores),
                "recalls": float(self.recalls), "useful_recalls": float(self.useful_recalls),
                "wasted_calls": float(self.wasted_calls),
                "needed_stored_rate": len(self._stored_needed) / max(len(self._needed_notes), 1),
                "reached_question": float(self.asked)}

    # -- demonstrations ------------------------------------------------------------------------------------------

    def skipped_events(self, task: dict[str, Any]) -> list[int]:
        """The events the demonstrator does not store: a ``skip_store_fraction`` share, chosen by a stable hash of
        the log's header (the prompt's text) and the event's position."""
        events = self.read_log(task)[0]
        header = str(task.get("question", ""))
        return [i for i in range(len(events)) if stable_fraction(f"{header}\n{i}") < self.skip_store_fraction]

    def demonstrates(self, task: dict[str, Any]) -> bool:
        """Whether the log's question is within ``demonstration_max_hops`` (every log when it is None)."""
        if self.demonstration_max_hops is None:
            return True
        return len(self.read_log(task)[3]) <= self.demonstration_max_hops

    def demonstration(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        """One ``remember`` call per event (or "next" for a skipped one), then one ``recall`` per key of the chain
        and ``Final Answer: <answer>``; without tools, "next" per event and the answer. The imperfect share is
        described in the module docstring."""
        events, facts, needed, chain, question = self.read_log(task)
        answers = [str(a) for a in accepted_answers(task.get("ground_truth", "")) if str(a).strip()]
        if not answers:
            raise ConfigError("a memory demonstration needs the task's 'ground_truth' (the answer)")
        skipped = set(self.skipped_events(task)) if self.tools_enabled else set(range(len(events)))
        notes: dict[str, list[str]] = {}
        messages: list[dict[str, Any]] = []
        for i, (subject, relation, obj) in enumerate(facts):
            following = (f"Event {i + 2} of {len(events)}: {events[i + 1]}" if i + 1 < len(events)
                         else f"Question: {question}")
            if i in skipped:
                messages.append({"role": "assistant", "content": MOVE_ON})
            else:
                text = note_text(relation, obj)
                notes.setdefault(normalise(subject), []).append(text)
                messages.append({"role": "assistant", "content": render_tool_call("remember", {"key": subject,
                                                                                              "text": text})})
                messages.append(tool_message("remember", STORED))
            messages.append({"role": "user", "content": following})
        answer = answers[0]
        if self.tools_enabled:
            read: list[str] = []  # the objects of the notes read on the chain, in order
            for key, index in zip(chain, needed):
                found = notes.get(normalise(key), [])
                messages.append({"role": "assistant", "content": render_tool_call("recall", {"key": key})})
                messages.append(tool_message("recall", "; ".join(found) if found else NO_NOTE.format(key=key)))
                if index in skipped:  # the chain breaks here: answer from the closest note
                    closest = [f[2] for f in facts if normalise(f[0]) == normalise(key) and note_text(*f[1:]) in found]
                    candidates = closest + read[::-1] + [f[2] for f in facts]
                    truth = str(task.get("ground_truth", ""))
                    answer = next((c for c in candidates if not self.answer_check(f"Final Answer: {c}", truth)),
                                  facts[0][2])
                    break
                read.append(facts[index][2])
        messages.append({"role": "assistant", "content": f"Final Answer: {answer}"})
        turns = sum(m["role"] == "assistant" for m in messages)
        calls = sum(m["role"] == "tool" for m in messages)
        if turns > self.max_turns or calls > self.max_tool_calls:
            raise ConfigError(f"the memory demonstration of a log of {len(events)} events takes {turns} turns and "
                              f"{calls} tool calls; set max_turns >= {turns} and max_tool_calls >= {calls}")
        return messages
