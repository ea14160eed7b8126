"""LLM-as-judge reward: another model scores each completion through any OpenAI-compatible chat endpoint.

    agentic-rl grpo --reward 'judge(base_url=http://127.0.0.1:8000/v1,model=qwen,rubric_file=rubric.txt):1.0'
    agentic-rl grpo --reward accuracy:1.0 --reward 'judge(base_url=...,model=m,rubric="Correct, concise"):0.5'

For every (prompt, completion) the judge gets a system message (the rubric and the reply format) and a user message
(the prompt, the response, optionally a reference column such as ``ground_truth``). Its reply must contain exactly
one line ``Score: N`` with N a number in [0, 10]; the reward is N / 10. Anything else — no such line, two of them,
``Score: 7/10``, ``Score: 11`` — is *unparseable*: it scores ``unparseable_score`` (in [0, 1], 0 by default), is
counted (``stats``, a warning per batch, and ``judge/unparseable_fraction`` in the training metrics) and is not cached.

Requests go out through the ``openai`` client (``pip install 'agentic-rl[judge]'``; imported only when a judge is
built) with at most ``max_concurrency`` in flight. Each request has ``timeout`` seconds; a connection error, a
timeout, a 429 or a 5xx is retried ``max_retries`` times with exponential back-off (``backoff`` x 1, 2, 4 ... s),
all within ``timeout x (max_retries + 1)`` per completion, so a call never hangs past that bound. The bound is on
the whole request, not on each network read: a reply that trickles in slower than ``timeout`` counts as timed out. A
reply that is not a chat completion (an HTML page, text that is not JSON) is a failed request. Once one
completion has used up its retries on an unreachable endpoint, the rest of the batch stops asking. Then:

* without ``fallback``, the call raises :class:`JudgeError` (one line naming the URL and the last error);
* with ``fallback=<float>`` (in [0, 1]), the failed completions score that value and are counted
  (``stats["failures"]``).

A wrong API key, model name or URL path (401/403/404) is always an error: no fallback hides a misconfiguration.

Scores are cached by (judge model, rubric, prompt, completion, reference) in memory, and in ``cache_path`` (JSONL,
one ``{"key", "score", "reply"}`` per line, appended) when given, so an identical completion — within a batch, later
in training, or in the next run — is never sent twice. A cache row whose score is not a number in [0, 1] is skipped
with a warning (that completion is asked again). The API key comes from the environment variable ``api_key_env``
(``OPENAI_API_KEY`` by default; ``EMPTY`` when unset, which local servers accept).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentic_rl.errors import AgenticRLError, ConfigError
from agentic_rl.rewards.extraction import completion_text
from agentic_rl.utils import iter_jsonl, warn

__all__ = ["JudgeReward", "JudgeError", "parse_score", "judge_messages", "DEFAULT_RUBRIC", "MAX_SCORE"]

MAX_SCORE = 10.0
DEFAULT_RUBRIC = ("Judge whether the response answers the prompt correctly and completely, with sound reasoning "
                  "and no irrelevant text.")
INSTRUCTIONS = ("You are a strict grader.\n{rubric}\n\nEnd your reply with one line of the form\nScore: N\nwhere N is "
                "a number from 0 to 10 (10 is best). Write no other line that starts with \"Score:\".")
_SCORE_LINE = re.compile(r"^[ \t]*score[ \t]*:(.*)$", re.IGNORECASE | re.MULTILINE)
_NUMBER = re.compile(r"^[ \t]*(\d+(?:\.\d+)?)[ \t]*$")
_PREVIEW = 160
MAX_REPLY_BYTES = 4 * 2**20  # a chat completion of max_tokens tokens is far smaller; more is not a judge's reply


class JudgeError(AgenticRLError):
    """The judge endpoint cannot be reached, times out, or rejects the request."""


def parse_score(reply: str | None) -> float | None:
    """The reward in [0, 1] from a judge's reply, or None when the reply is unparseable.

    >>> parse_score("Clear and correct.\\nScore: 8")
    0.8
    >>> [parse_score(r) for r in ("Score: 10", "score:  0.5 ", "Score: 7/10", "Score: 11", "8", "Score: 3\\nScore: 4")]
    [1.0, 0.05, None, None, None, None]
    """
    if not isinstance(reply, str):
        return None
    lines = _SCORE_LINE.findall(reply)
    if len(lines) != 1:
        return None
    number = _NUMBER.match(lines[0])
    if number is None:
        return None
    value = float(number.group(1))
    return value / MAX_SCORE if 0.0 <= value <= MAX_SCORE else None


def _prompt_text(prompt: Any) -> str:
    """A TRL prompt (a string or a message list) as text: a lone user message as is, else a role-tagged transcript."""
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    messages = [m for m in prompt if isinstance(m, dict)] if isinstance(prompt, (list, tuple)) else []
    if not messages:
        return str(prompt)
    shown = [m for m in messages if m.get("role") != "system"] or messages
    if len(shown) == 1 and shown[0].get("role") == "user":
        return completion_text(shown[0])
    return "\n\n".join(f"[{m.get('role', 'message')}]\n{completion_text(m)}" for m in shown)


def judge_messages(prompt: Any, completion: Any, rubric: str = DEFAULT_RUBRIC,
                   reference: Any = None) -> list[dict[str, str]]:
    """The chat messages the judge receives for one completion (also what the tests train a served model on)."""
    parts = []
    prompt_text = _prompt_text(prompt)
    if prompt_text:
        parts.append(f"Prompt:\n{prompt_text}")
    if reference is not None:
        parts.append(f"Reference answer:\n{reference}")
    parts.append(f"Response:\n{completion_text(completion)}")
    return [{"role": "system", "content": INSTRUCTIONS.format(rubric=rubric.strip())},
            {"role": "user", "content": "\n\n".join(parts)}]


class _Failed(Exception):
    """One completion could not be scored (carries the one-line reason; ``asked``: whether a request was sent)."""

    def __init__(self, message: str, asked: bool = True):
        super().__init__(message)
        self.asked = asked


class _TooSlow(Exception):
    """A request whose reply did not arrive whole within its time bound."""


def _reply_text(body: bytes, base_url: str) -> str:
    """The message text of an OpenAI chat-completion body; :class:`_Failed` when the body is not one (an HTML page,
    a proxy's error text, JSON of another shape)."""
    try:
        data = json.loads(body)
        choices = data["choices"]
        if not choices:
            return ""
        content = choices[0]["message"].get("content")
        if content is None or isinstance(content, str):
            return content or ""
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        pass
    preview = " ".join(body[:_PREVIEW].decode("utf-8", "replace").split())
    raise _Failed(f"judge at {base_url} replied with something that is not a chat completion "
                  f"(it starts {preview!r}); is base_url the OpenAI-compatible API (usually ending in /v1)?")


class JudgeReward:
    """A TRL reward ``judge(completions, prompts, **columns) -> list[float]`` scored by an LLM (module docstring).

    ``stats`` holds the running counts: ``scored`` (completions), ``requests`` (HTTP attempts sent),
    ``cache_hits``, ``unparseable`` and ``failures`` (completions given the fallback).
    """

    def __init__(self, base_url: str = "", model: str = "", rubric: str | None = None, rubric_file: str | None = None,
                 reference_column: str | None = None, api_key_env: str = "OPENAI_API_KEY", max_concurrency: int = 8,
                 timeout: float = 60.0, max_retries: int = 2, backoff: float = 1.0, fallback: float | None = None,
                 unparseable_score: float = 0.0, cache_path: str | None = None, temperature: float = 0.0,
                 max_tokens: int = 512, name: str = "judge"):
        if not isinstance(base_url, str) or not re.match(r"^https?://\S+$", base_url):
            raise ConfigError(f"judge: base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, "
                              f"got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ConfigError("judge: model is required (the judge's model id on that endpoint)")
        if rubric is not None and rubric_file is not None:
            raise ConfigError("judge: give rubric or rubric_file, not both")
        if rubric_file is not None:
            path = Path(str(rubric_file))
            if not path.is_file():
                raise ConfigError(f"judge: rubric_file {path} not found")
            rubric = path.read_text()
        if rubric is None:
            rubric = DEFAULT_RUBRIC
        if not isinstance(rubric, str) or not rubric.strip():
            raise ConfigError(f"judge: rubric must be non-empty text, got {rubric!r} (in a --reward spec, quote text "
                              "with ':' or ',' in it, or use rubric_file)")
        for key, value, low in (("max_concurrency", max_concurrency, 1), ("max_retries", max_retries, 0),
                                ("max_tokens", max_tokens, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"judge: {key} must be an integer >= {low}, got {value!r}")
        for key, value in (("timeout", timeout), ("backoff", backoff), ("temperature", temperature),
                           ("unparseable_score", unparseable_score), ("fallback", fallback)):
            if value is None and key == "fallback":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"judge: {key} must be a number, got {value!r}")
            if key in ("unparseable_score", "fallback") and not 0.0 <= value <= 1.0:
                raise ConfigError(f"judge: {key} must be a reward in [0, 1] like the judge's own scores, "
                                  f"got {value!r}")
        if timeout <= 0 or backoff < 0 or temperature < 0:
            raise ConfigError("judge: timeout must be > 0, backoff and temperature >= 0")
        try:
            import openai
        except ImportError:
            raise ConfigError("the judge reward needs the openai client: pip install 'agentic-rl[judge]' "
                              "(or pip install openai)") from None

        self.base_url, self.model, self.rubric = base_url, model, rubric.strip()
        self.reference_column = reference_column
        self.api_key_env = api_key_env
        self.max_concurrency, self.timeout, self.max_retries = max_concurrency, float(timeout), max_retries
        self.backoff, self.fallback = float(backoff), None if fallback is None else float(fallback)
        self.unparseable_score, self.temperature, self.max_tokens = float(unparseable_score), float(temperature), \
            max_tokens
        self.cache_path = Path(cache_path) if cache_path else None
        self.__name__ = name
        self._openai = openai
        self._client = openai.OpenAI(base_url=base_url, api_key=os.environ.get(api_key_env) or "EMPTY",
                                     max_retries=0, timeout=self.timeout)  # retries are ours (bounded, counted)
        self._lock = threading.Lock()
        self.cache: dict[str, float] = self._read_cache()
        self.stats = {"scored": 0, "requests": 0, "cache_hits": 0, "unparseable": 0, "failures": 0}

    # -- cache ----------------------------------------------------------------------------------------------------

    def _read_cache(self) -> dict[str, float]:
        cache: dict[str, float] = {}
        if self.cache_path is None or not self.cache_path.is_file():
            return cache
        bad = 0
        # skip_bad_lines: e.g. a line cut short when a run was killed mid-write
        for _, row in iter_jsonl(self.cache_path, skip_bad_lines=True):
            try:
                score = row["score"]
                if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0.0 <= score <= 1.0:
                    raise ValueError(score)  # NaN fails the range check too
                cache[str(row["key"])] = float(score)
            except (ValueError, KeyError, TypeError):
                bad += 1
        if bad:
            warn(f"judge: skipped {bad} cache row(s) without a key and a score in [0, 1] in {self.cache_path} "
                 "(those completions are asked again)")
        return cache

    def _key(self, prompt: str, completion: str, reference: Any) -> str:
        blob = json.dumps([self.model, self.rubric, prompt, completion, reference], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def _remember(self, key: str, score: float, reply: str) -> None:
        with self._lock:
            self.cache[key] = score
            if self.cache_path is not None:
                self.cache_path.parent.mkdir(parents=True, exist_ok=True)
                with self.cache_path.open("a") as fh:
                    fh.write(json.dumps({"key": key, "score": score, "reply": reply}, ensure_ascii=False) + "\n")

    # -- one request ----------------------------------------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.stats[name] += n

    def _ask(self, messages: list[dict[str, str]], endpoint_down: threading.Event) -> str:
        """The judge's reply text, retrying transient errors within ``timeout x (max_retries + 1)``."""
        openai = self._openai
        import httpx

        deadline = time.monotonic() + self.timeout * (self.max_retries + 1)
        last = "no attempt was made"
        for attempt in range(self.max_retries + 1):
            remaining = deadline - time.monotonic()
            if endpoint_down.is_set() or remaining <= 0:
                break
            self._count("requests")
            try:
                return _reply_text(self._request(messages, min(self.timeout, remaining)), self.base_url)
            except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError) as exc:
                raise JudgeError(f"judge at {self.base_url} refused the request ({type(exc).__name__}: "
                                 f"{_one_line(exc)}); check the model name, the URL and ${self.api_key_env}") from None
            except (openai.APITimeoutError, httpx.TimeoutException, _TooSlow):
                last = f"timed out after {self.timeout:g}s"
            except (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError,
                    httpx.TransportError) as exc:
                last = f"{type(exc).__name__}: {_one_line(exc)}"
            except openai.APIStatusError as exc:  # another 4xx: this request is wrong, asking again will not help
                raise _Failed(f"judge at {self.base_url} rejected a request ({exc.status_code}: "
                              f"{_one_line(exc)})") from None
            except openai.APIError as exc:  # e.g. a response the client cannot read
                raise _Failed(f"judge at {self.base_url} gave an unreadable response ({type(exc).__name__}: "
                              f"{_one_line(exc)})") from None
            if attempt < self.max_retries:
                time.sleep(max(0.0, min(self.backoff * 2 ** attempt, deadline - time.monotonic())))
        if last == "no attempt was made":  # another completion found the endpoint down first
            raise _Failed(f"judge at {self.base_url}: not asked, the endpoint failed for another request", asked=False)
        endpoint_down.set()
        raise _Failed(f"judge at {self.base_url} failed after {self.max_retries + 1} attempt(s) "
                      f"(timeout {self.timeout:g}s each): {last}")

    def _request(self, messages: list[dict[str, str]], budget: float) -> bytes:
        """The raw body of one chat-completion request, which must arrive whole within ``budget`` seconds.

        The HTTP client's timeout bounds each network read only; a server trickling its reply a byte at a time
        would never trip it, so the body is read as it streams in and the request is abandoned at its deadline.
        """
        request_deadline = time.monotonic() + budget
        body = bytearray()
        with self._client.with_options(timeout=budget).chat.completions.with_streaming_response.create(
                model=self.model, messages=messages, temperature=self.temperature,
                max_tokens=self.max_tokens) as response:
            for chunk in response.iter_bytes():
                body += chunk
                if time.monotonic() > request_deadline:
                    raise _TooSlow()
                if len(body) > MAX_REPLY_BYTES:
                    raise _Failed(f"judge at {self.base_url} sent a reply over {MAX_REPLY_BYTES // 2**20} MB")
        if time.monotonic() > request_deadline:
            raise _TooSlow()
        return bytes(body)

    # -- the reward -----------------------------------------------------------------------------------------------

    def __call__(self, completions: Sequence[Any], prompts: Sequence[Any] | None = None,
                 **columns: Any) -> list[float]:
        n = len(completions)
        prompt_list = list(prompts) if prompts is not None else [None] * n
        if len(prompt_list) != n:
            raise ConfigError(f"judge: {len(prompt_list)} prompts for {n} completions")
        references: list[Any] = [None] * n
        if self.reference_column is not None:
            if columns.get(self.reference_column) is None:
                raise ConfigError(f"judge: reference_column '{self.reference_column}' is not a dataset column")
            references = list(columns[self.reference_column])

        scores: list[float | None] = [None] * n
        todo: dict[str, tuple[list[dict[str, str]], list[int]]] = {}  # one request per distinct key
        for i, (prompt, completion, reference) in enumerate(zip(prompt_list, completions, references)):
            key = self._key(_prompt_text(prompt), completion_text(completion), reference)
            if key in self.cache:
                scores[i] = self.cache[key]
                self._count("cache_hits")
            elif key in todo:
                todo[key][1].append(i)
                self._count("cache_hits")
            else:
                todo[key] = (judge_messages(prompt, completion, self.rubric, reference), [i])

        unparseable: list[str] = []
        failures: list[_Failed] = []
        if todo:
            endpoint_down = threading.Event()
            with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(todo))) as pool:
                futures = {key: pool.submit(self._ask, messages, endpoint_down)
                           for key, (messages, _) in todo.items()}
            for key, future in futures.items():  # the pool has finished: every future is done
                indices = todo[key][1]
                try:
                    reply = future.result()
                except _Failed as exc:
                    failures.append(exc)
                    for i in indices:
                        scores[i] = self.fallback
                    continue
                score = parse_score(reply)
                if score is None:
                    unparseable.append(reply)
                    for i in indices:
                        scores[i] = self.unparseable_score
                else:
                    self._remember(key, score, reply)
                    for i in indices:
                        scores[i] = score
            self._count("unparseable", len(unparseable))
        self._count("scored", n)

        if failures:
            reason = str(next((f for f in failures if f.asked), failures[0]))
            if self.fallback is None:
                raise JudgeError(f"{reason}; is the server running? (or set fallback=<score> to score "
                                 "failed requests instead of stopping)")
            self._count("failures", len(failures))
            warn(f"judge: {len(failures)} of {len(todo)} request(s) failed, scored {self.fallback:g} (fallback); "
                 f"{reason}")
        if unparseable:
            preview = unparseable[0].strip().replace("\n", "\\n")[:_PREVIEW]
            warn(f"judge: {len(unparseable)} of {len(todo)} replies had no single 'Score: N' line (N in 0..10), "
                 f"scored {self.unparseable_score:g}; {self.stats['unparseable']} so far. First: {preview!r}")
        log_metric = columns.get("log_metric")
        if callable(log_metric) and todo:  # TRL's hook: shows up next to the reward in the training metrics
            log_metric("judge/unparseable_fraction", len(unparseable) / len(todo))
            log_metric("judge/failure_fraction", len(failures) / len(todo))
        return [float(s) for s in scores]  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"JudgeReward(base_url={self.base_url!r}, model={self.model!r})"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]
