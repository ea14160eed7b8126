"""The search environment: questions answered by looking things up in a local corpus with a BM25 search tool.

One tool, ``search(query)``, returns the texts of the ``top_k`` passages that score best for the query
(:class:`agentic_rl.agent.retrieval.Retriever`, one line each; default one passage). The model calls it in Qwen3's
format and reads the result in the next ``tool`` message::

    <tool_call>
    {"name": "search", "arguments": {"query": "Orla Venn"}}
    </tool_call>

and finishes with ``Final Answer: <name>``, scored by the project's verifier (:func:`agentic_rl.rewards.is_correct`:
the exact name after normalisation, one name only). Step rewards: a search whose results hold a passage the answer
needs earns ``useful_search_reward`` (0.1); a repeated query (same words, any case) or one that finds nothing costs
``wasted_search_reward`` (-0.05); a malformed call or one over ``max_tool_calls`` gets ``tool_error_reward``; a
correct answer ``answer_reward`` (1.0). Per episode (:meth:`SearchEnv.episode_metrics`): ``searches``,
``useful_searches``, ``wasted_searches`` and, when it searched, ``useful_search_rate``.

The corpus (``corpus``): ``synthetic:world`` (default), the passages of the fictional world whose questions the
``synthetic:world`` dataset asks (:func:`agentic_rl.data.custom.task_world`; ``world_seed`` must be the dataset's
``synthetic_seed``), or a JSONL file of passages ``{"id", "text", "title"?}``. A passage the answer needs is one of
the question's lookup chain: the row's ``supporting`` passage ids (with ``chain``, the titles to look up), or for a
world question without them (the stages pass only the question and its answer) the people and organisation its
wording goes through. For any other question it is a passage whose words contain the answer's.

The demonstration of a task (:meth:`SearchEnv.demonstration`) searches each entity of the chain in order, then
answers; a question without a chain gets one search with the question itself. Real demonstrations are imperfect, so
two shares of the world questions can be made so, each chosen by a stable hash of the question:
``wrong_search_fraction`` first searches a person the question does not need (a wasted lookup, then the right
ones), ``skipped_hop_fraction`` (questions of two hops or more) stops one lookup short and answers with the fact of
the last passage read, which is wrong. With ``answer_attempts`` above 1 (:class:`ToolEnvironment`), a wrong answer
is answered by feedback and the agent may search and answer again; ``retry_demonstration_fraction`` then shows a
share of the demonstrations with a wrong answer first (:meth:`SearchEnv.wrong_attempt`).
"""

from __future__ import annotations

import random
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from agentic_rl.agent.env import DEFAULT_FEEDBACK, ToolEnvironment, stable_fraction
from agentic_rl.agent.retrieval import Retriever, read_corpus, words
from agentic_rl.agent.tool_format import tool_exchange
from agentic_rl.agent.tools import DEFAULT_MAX_TOOL_RESULT_CHARS, DEFAULT_TOOL_TIMEOUT_S
from agentic_rl.config import check_range
from agentic_rl.data.formats import accepted_answers
from agentic_rl.errors import ConfigError

#: The corpus of the world the ``synthetic:world`` dataset asks about.
WORLD_CORPUS = "synthetic:world"
SEARCH_SYSTEM_PROMPT = (
    "Answer the question. Use the search tool to look up each person or organisation the question needs, one "
    "search per turn, then finish with a last line of the form 'Final Answer: <name>'."
)
NO_RESULT = "no passage matches the query"


@lru_cache(maxsize=4)
def _world_retriever(seed: int) -> tuple[Any, Retriever, dict[str, str]]:
    from agentic_rl.data.custom import task_world
    from agentic_rl.data.world import passages

    world = task_world(seed)
    texts = passages(world)
    return world, Retriever(texts), {p["title"]: p["id"] for p in texts}


@lru_cache(maxsize=4)
def _world_titles(seed: int) -> dict[str, str]:
    """The title of each passage of the world, by its text (a tool result holds one passage text per line)."""
    from agentic_rl.data.world import passages

    return {p["text"]: p["title"] for p in passages(_world_retriever(seed)[0])}


@lru_cache(maxsize=4)
def _file_retriever(path: str, mtime_ns: int, size: int) -> Retriever:
    return Retriever(read_corpus(path))


@lru_cache(maxsize=1)
def _question_patterns() -> list[tuple[re.Pattern, str]]:
    from agentic_rl.data.world import LAST_HOP

    patterns = []
    for relation, template in LAST_HOP.items():
        regex = re.escape(template).replace(re.escape("{who}"), "(?P<who>.+?)")
        patterns.append((re.compile(f"^{regex}$"), relation))
    return patterns


_MENTOR_OF = "the mentor of "


def world_chain(world: Any, ids: dict[str, str], question: str) -> dict[str, Any] | None:
    """The lookups of a world question: ``{"chain", "supporting", "path", "answer"}`` (the titles to search in
    order, their passage ids, the relations followed, the answer), read from the question's wording; None when the
    question is not one of the world's templates. A template question about a person the world does not have is a
    :class:`ConfigError` (the corpus is another world than the dataset's)."""
    for pattern, last in _question_patterns():
        match = pattern.match(" ".join(str(question).split()))
        if not match:
            continue
        who, mentors = match.group("who"), 0
        while who.startswith(_MENTOR_OF):
            who, mentors = who[len(_MENTOR_OF):], mentors + 1
        if who not in ids:
            raise ConfigError(f"the question {question!r} asks about {who!r}, who is not in the search corpus's "
                              f"world (seed {world.seed}): set environment_args world_seed to the dataset's "
                              "synthetic_seed")
        path = ("mentor",) * mentors + (("works_at", "located_in") if last == "located_in" else (last,))
        chain = [who]
        for relation in path[:-1]:
            chain.append(world.get(chain[-1], relation))
        return {"chain": chain, "supporting": [ids[title] for title in chain], "path": path,
                "answer": world.get(chain[-1], path[-1])}
    return None


class SearchEnv(ToolEnvironment):
    """:class:`ToolEnvironment` with a BM25 ``search`` tool over a corpus (registered as ``search``; see the module
    docstring)."""

    system_prompt = SEARCH_SYSTEM_PROMPT
    text_answers = True  # answers are names: the stages load the dataset's answers as text

    def __init__(self, *, corpus: str = WORLD_CORPUS, world_seed: int = 0, top_k: int = 1,
                 useful_search_reward: float = 0.1, wasted_search_reward: float = -0.05, max_turns: int = 5,
                 max_tool_calls: int = 4, tool_error_reward: float = 0.0, answer_reward: float = 1.0,
                 tools_enabled: bool = True, wrong_search_fraction: float = 0.0, skipped_hop_fraction: float = 0.0,
                 tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
                 max_tool_result_chars: int = DEFAULT_MAX_TOOL_RESULT_CHARS, answer_attempts: int = 1,
                 wrong_attempt_reward: float = -0.2, feedback: str = DEFAULT_FEEDBACK,
                 retry_demonstration_fraction: float = 0.0):
        given = {"top_k": top_k, "world_seed": world_seed, "useful_search_reward": useful_search_reward,
                 "wasted_search_reward": wasted_search_reward, "wrong_search_fraction": wrong_search_fraction,
                 "skipped_hop_fraction": skipped_hop_fraction}
        check_range(given, "top_k", 1, integer=True, required=True)
        check_range(given, "world_seed", integer=True, required=True)  # the dataset's synthetic_seed
        check_range(given, "useful_search_reward", required=True)
        check_range(given, "wasted_search_reward", high=0, required=True)  # > 0 would reward repeating a search
        check_range(given, ("wrong_search_fraction", "skipped_hop_fraction"), 0, 1, required=True)
        if wrong_search_fraction + skipped_hop_fraction > 1.0:
            raise ConfigError("wrong_search_fraction + skipped_hop_fraction must be at most 1, got "
                              f"{wrong_search_fraction} + {skipped_hop_fraction}")
        super().__init__([self.search], max_turns=max_turns, max_tool_calls=max_tool_calls,
                         tool_call_reward=useful_search_reward, tool_error_reward=tool_error_reward,
                         answer_reward=answer_reward, tools_enabled=tools_enabled, tool_timeout_s=tool_timeout_s,
                         max_tool_result_chars=max_tool_result_chars, answer_attempts=answer_attempts,
                         wrong_attempt_reward=wrong_attempt_reward, feedback=feedback,
                         retry_demonstration_fraction=retry_demonstration_fraction)
        self.corpus, self.world_seed, self.top_k = str(corpus), world_seed, top_k
        self.useful_search_reward, self.wasted_search_reward = useful_search_reward, wasted_search_reward
        self.wrong_search_fraction, self.skipped_hop_fraction = wrong_search_fraction, skipped_hop_fraction
        self.world: Any = None
        self._ids: dict[str, str] = {}
        if self.corpus == WORLD_CORPUS:
            self.world, self.retriever, self._ids = _world_retriever(world_seed)
        else:
            path = Path(self.corpus)
            if not path.is_file():
                raise ConfigError(f"corpus must be {WORLD_CORPUS!r} or a JSONL file of passages; not found: {path}")
            stat = path.stat()
            self.retriever = _file_retriever(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        self.reset({})

    # -- the tool ------------------------------------------------------------------------------------------------

    def search(self, query: str) -> str:
        """Search the corpus for passages about a person, place or organisation.

        Args:
            query: the name (or words) to look up.
        """
        found = self.retriever.search(query, self.top_k)
        self._last_found = found
        return "\n".join(p["text"] for p in found) if found else NO_RESULT

    # -- episode -------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> None:
        super().reset(task)
        answers = [words(a) for a in accepted_answers(task.get("ground_truth", ""))]
        self._answer_words = [" ".join(w[1:] if w[:1] == ["the"] else w) for w in answers]
        self._lookups = self.lookups(task) if task else None
        self._queries: set[str] = set()
        self._last_found: list[dict[str, str]] = []
        self._wasted_now = 0
        self.searches = self.useful_searches = self.wasted_searches = 0
        return None

    def step(self, assistant_text: str):
        self._wasted_now = 0
        result = super().step(assistant_text)
        if self._wasted_now:
            result.reward += self._wasted_now * self.wasted_search_reward
            result.info["wasted"] = self._wasted_now
        return result

    def lookups(self, task: dict[str, Any]) -> dict[str, Any] | None:
        """The task's lookup chain: its own ``chain`` and ``supporting`` columns when it has them (rows of
        ``synthetic:world`` read directly), else read from a world question's wording (:func:`world_chain`; the
        stages pass only the question and its answer); None for a question of a user's corpus."""
        parsed = world_chain(self.world, self._ids, task.get("question", "")) if self.world else None
        chain, supporting = task.get("chain"), task.get("supporting")
        if chain and supporting:
            return {**(parsed or {"path": None, "answer": None}), "chain": list(chain), "supporting": list(supporting)}
        return parsed

    def _needed(self, passage: dict[str, str]) -> bool:
        """A passage of the question's lookup chain; without a chain, a passage whose words hold an answer's."""
        if self._lookups is not None:
            return passage["id"] in self._lookups["supporting"]
        text = f" {' '.join(words(passage['text']))} "
        return any(f" {answer} " in text for answer in self._answer_words if answer)

    def is_useful(self, call, result: str) -> bool:
        query = " ".join(words(call.arguments.get("query", "")))
        return query not in self._queries and any(self._needed(p) for p in self._last_found)

    def _run_call(self, call):
        self._last_found = []
        text, ok, useful = super()._run_call(call)
        if ok and call.name == "search":
            query = " ".join(words(call.arguments.get("query", "")))
            self.searches += 1
            self.useful_searches += int(useful)
            if query in self._queries or not self._last_found:
                self._wasted_now += 1
                self.wasted_searches += 1
            self._queries.add(query)
        return text, ok, useful

    def episode_metrics(self) -> dict[str, float]:
        """``searches`` that ran, how many were ``useful_searches`` / ``wasted_searches``, and the
        ``useful_search_rate`` of an episode that searched."""
        metrics = {**super().episode_metrics(), "searches": float(self.searches),
                   "useful_searches": float(self.useful_searches), "wasted_searches": float(self.wasted_searches)}
        if self.searches:
            metrics["useful_search_rate"] = self.useful_searches / self.searches
        return metrics

    # -- demonstrations ------------------------------------------------------------------------------------------

    def demonstration(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        """One search per entity of the question's chain (a question without one: one search with the question),
        each with the result the tool returns, then ``Final Answer: <answer>``; no searches when tools are
        disabled. The imperfect shares are described in the module docstring."""
        answers = [str(a) for a in accepted_answers(task.get("ground_truth", "")) if str(a).strip()]
        if not answers:
            raise ConfigError("a search demonstration needs the task's 'ground_truth' (the answer)")
        answer = answers[0]
        question = str(task.get("question", ""))
        lookups = self.lookups(task)
        queries = list(lookups["chain"]) if lookups else [question]
        skipped = False
        if self.tools_enabled and lookups:
            share = stable_fraction(question)
            if share < self.wrong_search_fraction:
                rng = random.Random(question)
                others = [p for p in self.world.people if p not in lookups["chain"]]
                queries.insert(0, rng.choice(others))
            elif (share < self.wrong_search_fraction + self.skipped_hop_fraction and len(queries) >= 2
                  and lookups["path"]):
                queries, skipped = queries[:-1], True  # the last passage read holds a person's facts
                last = lookups["path"][-1]
                answer = self.world.get(queries[-1], "lives_in" if last == "located_in" else last)
        messages: list[dict[str, Any]] = []
        if self.tools_enabled:
            for query in queries:
                messages += tool_exchange("search", {"query": query}, self.search(query))
        messages.append({"role": "assistant", "content": f"Final Answer: {answer}"})
        return messages if skipped else self.with_retry(task, messages)

    def wrong_attempt(self, task: dict[str, Any], messages: list[dict[str, Any]]) -> str:
        """The wrong answer of a retry demonstration: in the fictional world, another fact of the answer's kind (a
        place for a place, a person for a person, an organisation for an organisation) — the misreading a real
        reader makes: the same entity's other fact of that kind ("lives in" for "born in"), else one read in the
        demonstration's passages, else one of the world's, chosen by a stable hash of the question; elsewhere the
        default (:meth:`ToolEnvironment.wrong_attempt`)."""
        lookups = self.lookups(task) if self.world is not None else None
        if not lookups or not lookups["path"]:
            return super().wrong_attempt(task, messages)
        kinds = {"born_in": "place", "lives_in": "place", "located_in": "place", "works_at": "organisation",
                 "mentor": "person"}
        titles = _world_titles(self.world_seed)
        read = {titles[line] for m in messages if m["role"] == "tool" for line in m["content"].split("\n")
                if line in titles}
        answers = {str(a) for a in accepted_answers(task.get("ground_truth", ""))}
        kind = kinds[lookups["path"][-1]]
        same_kind = [(subject, obj) for subject, relation, obj in self.world.facts
                     if kinds[relation] == kind and obj not in answers]
        last = lookups["chain"][-1]
        others = sorted({obj for subject, obj in same_kind if subject == last}
                        or {obj for subject, obj in same_kind if subject in read} or {obj for _, obj in same_kind})
        question = str(task.get("question", ""))
        return f"Final Answer: {random.Random(f'retry:{question}').choice(others)}"
