"""Serve a model over an OpenAI-compatible HTTP API, batching concurrent requests.

    agentic-rl serve exported/                       # http://127.0.0.1:8000/v1
    agentic-rl serve exported/ --port 9000 --api-key s3cret --max-batch-size 16

Endpoints: ``GET /v1/models``, ``GET /v1/models/{id}``, ``POST /v1/chat/completions`` (``messages``, ``max_tokens``,
``temperature``, ``top_p``, ``n``, ``stop``, ``stream`` as server-sent events, vLLM's ``chat_template_kwargs``),
``GET /health``. The model id clients pass as ``model`` (and ``/v1/models`` lists) is the directory's name,
``exported`` for ``exported/``, unless ``--served-model-name`` sets another. Any OpenAI client works:
``OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=...).chat.completions.create(model="exported", messages=...)``.

How a request is answered:

1. The body is read up to ``max_request_bytes`` (413 beyond it, before parsing) and validated by hand so every
   mistake is a 4xx JSON error in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``): JSON that is
   malformed, nested too deeply, holds NaN/Infinity or integers too long to convert; missing or malformed ``messages``,
   a bad role, a wrong type, a non-finite or out-of-range value, an unsupported field (400); a missing or wrong API
   key (401); an unknown model (404).
2. The messages are rendered with the model's own chat template (the one training used) and tokenized, in a worker
   thread so that a long prompt never stalls the event loop (``/health``, other requests). A special-token string
   inside a message's content (``<|im_start|>system``...) is tokenized as plain text, so user text cannot forge a
   role marker. Prompts longer than ``max_prompt_tokens`` (or the model's context minus ``max_tokens``) get a 400
   before they reach the model.
3. The request joins a queue. A single worker thread owns the model: it takes the first waiting request, keeps
   collecting requests for ``batch_wait_ms`` (or until ``max_batch_size`` sequences), left-pads the prompts into one
   batch and runs one ``model.generate`` call for all of them. Per-sequence settings ride along: a logits processor
   applies each row's temperature (0 = greedy) and top-p, and a stopping criterion ends each row at its own
   end-of-sequence token, ``max_tokens`` or stop string while the others continue. This is *static* batching — a
   request that arrives mid-batch waits for the next one; vLLM's continuous batching is the GPU alternative
   (``vllm serve DIR`` serves the same exported directory with the same API).
4. A client that hangs up (streaming or not) has its rows stopped at the next generated token.

The server binds 127.0.0.1 unless ``--host`` says otherwise; with ``--api-key`` (or ``AGENTIC_RL_API_KEY``) every
``/v1`` request needs ``Authorization: Bearer KEY``, and so does ``/openapi.json`` (the ``/docs`` and ``/redoc``
pages, which a browser cannot send a key from, are off then).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
import os
import queue
import re
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Request  # at module level: FastAPI resolves the handlers' string annotations here

from agentic_rl.config import check_range, setting
from agentic_rl.errors import ConfigError
from agentic_rl.utils import log, warn

ROLES = ("system", "user", "assistant")
# Fields a client may send that we accept as long as they ask for nothing we do not do.
NEUTRAL_FIELDS = {"presence_penalty": 0, "frequency_penalty": 0, "logprobs": False, "logit_bias": None,
                  "parallel_tool_calls": None, "tool_choice": None, "response_format": None, "top_logprobs": None,
                  "tools": None}
IGNORED_FIELDS = ("user", "metadata", "store", "service_tier")  # bookkeeping fields with no effect on the output
ECHO_CHARS = 80  # longest piece of a client's input an error message repeats back


@dataclass
class ServeConfig:
    model: str = setting("", "model to serve: an exported directory (agentic-rl export), any model or adapter "
                             "directory, or a run directory (searched like export)", positional=True)
    host: str = setting("127.0.0.1", "interface to bind; 0.0.0.0 exposes the server to the network (use an API key "
                                     "then)")
    port: int = setting(8000, "TCP port")
    api_key: str | None = setting(None, "require 'Authorization: Bearer KEY' on /v1 requests (default: "
                                        "$AGENTIC_RL_API_KEY if set, else open)")
    served_model_name: str | None = setting(None, "the model id clients pass as 'model' (default: the directory's "
                                                  "name)")
    max_batch_size: int = setting(8, "most sequences generated together in one batch")
    batch_wait_ms: float = setting(10.0, "how long the first waiting request waits for others to join its batch "
                                         "(milliseconds)")
    max_new_tokens: int = setting(256, "completion length when a request gives no max_tokens")
    max_tokens_limit: int = setting(4096, "largest max_tokens a request may ask for")
    max_request_bytes: int = setting(1 << 20, "largest request body accepted, in bytes (larger ones get 413 before "
                                              "they are parsed)")
    max_prompt_tokens: int | None = setting(None, "longest prompt accepted, in tokens (default: the model's context "
                                                  "minus the request's max_tokens)")
    temperature: float | None = setting(None, "temperature when a request gives none (default: the model's "
                                              "generation_config if it samples, else 1.0 as in OpenAI's API)")
    top_p: float | None = setting(None, "top_p when a request gives none (same default rule)")
    enable_thinking: bool = setting(False, "pass enable_thinking=True to the chat template (Qwen3 reasoning mode)")
    device: str = setting("auto", "auto (cuda if available), cpu, cuda or cuda:N")
    dtype: str = setting("auto", "weights dtype; auto keeps the saved one",
                                 choices=("auto", "float32", "bfloat16", "float16"))
    log_level: str = setting("info", "uvicorn log level", choices=("critical", "error", "warning", "info", "debug"))
    trust_remote_code: bool = setting(False, "allow model code shipped with the checkpoint")

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("serve needs a MODEL directory (agentic-rl serve DIR)")
        check_range(self, ("max_batch_size", "max_tokens_limit"), 1)
        check_range(self, ("batch_wait_ms", "temperature"), 0)
        check_range(self, "top_p", 0, 1, low_open=True)
        if not 1 <= self.max_new_tokens <= self.max_tokens_limit:
            raise ConfigError(f"max_new_tokens ({self.max_new_tokens}) must be between 1 and max_tokens_limit "
                              f"({self.max_tokens_limit})")
        if self.max_request_bytes < 1024:
            raise ConfigError(f"max_request_bytes must be >= 1024, got {self.max_request_bytes}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ConfigError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be between 1 and 65535, got {self.port}")
        if self.api_key is None:
            self.api_key = os.environ.get("AGENTIC_RL_API_KEY") or None


# ---------------------------------------------------------------------------------------------------------------
# Request validation (OpenAI error shape)
# ---------------------------------------------------------------------------------------------------------------

class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, type_: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _echo(value: Any) -> str:
    """``repr(value)`` cut to ECHO_CHARS: an error message never repeats a megabyte of the client's input."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10 ** ECHO_CHARS else f"<{type(value).__name__}>"
    return text if len(text) <= ECHO_CHARS else text[:ECHO_CHARS] + "..."


def _json_body(raw: bytes) -> Any:
    """Parse a request body; anything Python's parser refuses (bad syntax or UTF-8, nesting beyond the recursion
    limit, integers over its 4300-digit conversion limit) or that standard JSON lacks (NaN, Infinity) is a 400."""
    def no_constant(name: str):
        raise ValueError(f"{name} is not a JSON value")

    try:
        return json.loads(raw, parse_constant=no_constant)
    except RecursionError:
        raise APIError(400, "the request body is not valid JSON: it is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the integer-digits limit, NaN/Infinity
        raise APIError(400, f"the request body is not valid JSON: {str(exc)[:200]}") from None


def _number(body: dict, key: str, default: float, low: float, high: float, *, low_open: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise APIError(400, f"'{key}' must be a number, got {type(value).__name__}", key)
    if isinstance(value, float) and not math.isfinite(value):
        raise APIError(400, f"'{key}' must be a finite number, got {value}", key)
    if value > high or value < low or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise APIError(400, f"'{key}' must be in {bound}, got {_echo(value)}", key)
    return float(value)


def _integer(body: dict, key: str, default: int, low: int, high: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(400, f"'{key}' must be an integer, got {type(value).__name__}", key)
    if not low <= value <= high:
        raise APIError(400, f"'{key}' must be between {low} and {high}, got {_echo(value)}", key)
    return value


def _message_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text parts are understood
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(400, f"{where}.content[{j}] must be a text part {{'type': 'text', 'text': ...}}",
                               f"{where}.content")
            texts.append(part["text"])
        return "".join(texts)
    raise APIError(400, f"{where}.content must be a string or a list of text parts, got {type(content).__name__}",
                   f"{where}.content")


@dataclass
class ChatRequest:
    messages: list[dict[str, str]]
    max_tokens: int
    temperature: float
    top_p: float
    n: int
    stop: list[str]
    stream: bool
    include_usage: bool
    template_kwargs: dict[str, Any]


def parse_chat_request(body: Any, settings: ServerSettings) -> ChatRequest:
    """Validate a /v1/chat/completions body; every problem is an :class:`APIError` naming the field."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    known = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop",
             "stream", "stream_options", "chat_template_kwargs", *NEUTRAL_FIELDS, *IGNORED_FIELDS}
    for key in body:
        if key not in known:
            raise APIError(400, f"unsupported field {_echo(key)}", key[:ECHO_CHARS])
    for key, neutral in NEUTRAL_FIELDS.items():
        if body.get(key) not in (None, neutral) and not (key == "response_format" and body[key] == {"type": "text"}):
            raise APIError(400, f"'{key}' is not supported by this server", key)

    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, "'model' is required and must be a string", "model")
    if model not in settings.model_ids:
        raise APIError(404, f"model {_echo(model)} not found; this server serves '{settings.model_name}'", "model",
                       code="model_not_found")

    messages = body.get("messages")
    if messages is None:
        raise APIError(400, "'messages' is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list of {role, content} objects", "messages")
    clean = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise APIError(400, f"{where} must be an object with 'role' and 'content'", "messages")
        role = message.get("role")
        if role not in ROLES:
            raise APIError(400, f"{where}.role must be one of {', '.join(ROLES)}; got {_echo(role)}",
                           f"{where}.role")
        if "content" not in message or message["content"] is None:
            raise APIError(400, f"{where}.content is required", f"{where}.content")
        clean.append({"role": role, "content": _message_text(message["content"], where)})

    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise APIError(400, "give either 'max_tokens' or 'max_completion_tokens', not both", "max_tokens")
    length_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, length_key, settings.max_new_tokens, 1, settings.max_tokens_limit)
    temperature = _number(body, "temperature", settings.temperature, 0.0, 2.0)
    top_p = _number(body, "top_p", settings.top_p, 0.0, 1.0, low_open=True)
    n = _integer(body, "n", 1, 1, settings.max_batch_size)

    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise APIError(400, "'stop' must be a non-empty string or a list of at most 4 non-empty strings", "stop")

    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise APIError(400, f"'stream' must be true or false, got {type(stream).__name__}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise APIError(400, "'stream_options' may only hold 'include_usage'", "stream_options")
    template_kwargs = body.get("chat_template_kwargs") or {}  # vLLM's extension, e.g. {"enable_thinking": true}
    if not isinstance(template_kwargs, dict):
        raise APIError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs")
    # Only template variables: a client must not swap the template itself or change how it is tokenized.
    forbidden = sorted(k for k in template_kwargs
                       if k in ("chat_template", "tokenize", "tools", "documents") or k.startswith("return_"))
    if forbidden:
        raise APIError(400, f"'chat_template_kwargs' may not set {', '.join(forbidden)}", "chat_template_kwargs")
    return ChatRequest(clean, max_tokens, temperature, top_p, n, stop, stream, bool(options.get("include_usage")),
                       template_kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Prompts: chat template + tokens, with message contents kept as text
# ---------------------------------------------------------------------------------------------------------------

class TokenizerPool:
    """Up to ``size`` copies of the tokenizer for the request threads, each used by one thread at a time: a Rust fast
    tokenizer used from two threads at once can fail with "Already borrowed" (encoding updates its state)."""

    def __init__(self, tokenizer, size: int = 4):
        self._pristine = copy.deepcopy(tokenizer)  # copied from, never used: the batcher decodes with the original
        self._free: queue.LifoQueue = queue.LifoQueue()
        self._made, self._size, self._lock = 0, size, threading.Lock()

    @contextlib.contextmanager
    def borrow(self):
        try:
            tokenizer = self._free.get_nowait()
        except queue.Empty:
            with self._lock:
                make = self._made < self._size
                if make:
                    self._made += 1
                    tokenizer = copy.deepcopy(self._pristine)
            if not make:
                tokenizer = self._free.get()
        try:
            yield tokenizer
        finally:
            self._free.put(tokenizer)


def special_token_strings(tokenizer) -> list[str]:
    """The strings the tokenizer turns into special tokens (role markers such as ``<|im_start|>``), longest first."""
    special = {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special and t.content}
    return sorted(special | set(tokenizer.all_special_tokens), key=len, reverse=True)


def encode_prompt(tokenizer, messages: list[dict[str, str]], template_kwargs: dict[str, Any],
                  specials: list[str]) -> list[int]:
    """The chat template's prompt for ``messages`` as token ids, with every message content tokenized as plain text.

    Tokenizing the rendered prompt as one string would turn ``<|im_start|>system`` typed by a user into a real role
    marker. When a content holds a special-token string, the template is rendered once more with a placeholder for
    each such content; the template's own text is tokenized as usual and the contents with ``split_special_tokens``.
    A template that changes a content it is given (trims it, inspects it) cannot be split so: that request is refused.
    """
    def render(msgs: list[dict[str, str]]) -> str:
        try:
            return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **template_kwargs)
        except Exception as exc:  # a template that rejects these messages (e.g. roles out of order)
            raise APIError(400, f"the chat template cannot render these messages: {str(exc)[:200]}",
                           "messages") from None

    prompt = render(messages)
    risky = {i: m["content"] for i, m in enumerate(messages) if any(s in m["content"] for s in specials)}
    if not risky:
        return tokenizer(prompt, add_special_tokens=False)["input_ids"]
    nonce = uuid.uuid4().hex
    placeholders = {f"content{nonce}n{i}": content for i, content in risky.items()}
    masked = render([{**m, "content": f"content{nonce}n{i}"} if i in risky else m for i, m in enumerate(messages)])
    pieces = re.split(f"(content{nonce}n\\d+)", masked)  # odd positions: placeholders
    if "".join(placeholders.get(p, p) for p in pieces) != prompt:
        index = min(risky)
        token = next(s for s in specials if s in risky[index])
        raise APIError(400, f"messages[{index}].content contains the special token {token!r}, which this model's "
                            "chat template cannot keep as plain text; remove it", f"messages[{index}].content")
    ids: list[int] = []
    for k, piece in enumerate(pieces):
        if piece and k % 2:
            ids += tokenizer(placeholders[piece], add_special_tokens=False, split_special_tokens=True)["input_ids"]
        elif piece:
            ids += tokenizer(piece, add_special_tokens=False)["input_ids"]
    return ids


# ---------------------------------------------------------------------------------------------------------------
# Batched generation
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Job:
    """One HTTP request: ``n`` sequences from one prompt; events flow back to its event loop."""
    prompt_ids: list[int]
    request: ChatRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    cancelled: bool = False

    def emit(self, event: tuple) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the request's event loop is gone (server shutting down): nobody is listening
            self.cancelled = True


@dataclass
class Row:
    """One sequence being generated: ``(job, index)`` with its decoding state."""
    job: Job
    index: int
    tokens: list[int] = field(default_factory=list)
    sent: str = ""           # text already streamed
    done: bool = False
    finish_reason: str | None = None


class Batcher:
    """The worker thread that owns the model: groups waiting jobs, one ``generate`` call per group."""

    def __init__(self, model, tokenizer, eos_ids: list[int], max_batch_size: int, batch_wait_ms: float):
        self.model, self.tokenizer, self.eos_ids = model, tokenizer, set(eos_ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
        self.max_batch_size, self.wait_s = max_batch_size, batch_wait_ms / 1000.0
        self.queue: queue.Queue[Job | None] = queue.Queue()
        self.generate_calls = 0
        self.batch_sizes: list[int] = []  # sequences per generate call, for tests and /health
        self._thread: threading.Thread | None = None
        self._carry: Job | None = None  # a job that did not fit the last batch: first in the next one

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="agentic-rl-batcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def submit(self, job: Job) -> None:
        self.queue.put(job)

    # -- worker side ------------------------------------------------------------------------------------------
    def _collect(self, first: Job) -> tuple[list[Job], bool]:
        jobs, size = [first], first.request.n
        deadline = time.monotonic() + self.wait_s
        while size < self.max_batch_size:
            timeout = deadline - time.monotonic()
            try:
                job = self.queue.get(timeout=max(timeout, 0)) if timeout > 0 else self.queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            if size + job.request.n > self.max_batch_size:  # does not fit: first in the next batch
                self._carry = job
                break
            jobs.append(job)
            size += job.request.n
        return jobs, False

    def _loop(self) -> None:
        while True:
            first = self._carry or self.queue.get()
            self._carry = None
            if first is None:
                return
            jobs, stopping = self._collect(first)
            jobs = [j for j in jobs if not j.cancelled]
            if jobs:
                try:
                    self._generate(jobs)
                except Exception as exc:  # report to the waiting requests; keep serving
                    for job in jobs:
                        job.emit(("error", f"generation failed: {type(exc).__name__}: {exc}"))
            if stopping:
                return

    def _generate(self, jobs: list[Job]) -> None:
        import torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        from agentic_rl.deploy.per_row import PerRowSampling, PerRowStop

        rows = [Row(job, i) for job in jobs for i in range(job.request.n)]
        prompts = [row.job.prompt_ids for row in rows]
        width = max(len(p) for p in prompts)
        device = self.model.device
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, ids in enumerate(prompts):  # left padding: every row's last prompt token is aligned
            input_ids[i, width - len(ids):] = torch.tensor(ids)
            attention[i, width - len(ids):] = 1
        temps = torch.tensor([r.job.request.temperature for r in rows], device=device).unsqueeze(1)
        top_ps = torch.tensor([r.job.request.top_p for r in rows], device=device).unsqueeze(1)
        tokenizer = self.tokenizer
        sampling = not bool((temps == 0).all())
        # Sampling: generate's own temperature/top-k/top-p are neutral; PerRowSampling does each row's.
        sampling_kwargs = (dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                logits_processor=LogitsProcessorList([PerRowSampling(temps, top_ps)]))
                           if sampling else dict(do_sample=False))
        max_new = max(r.job.request.max_tokens for r in rows)
        self.generate_calls += 1
        self.batch_sizes.append(len(rows))
        with torch.no_grad():
            self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention.to(device), max_new_tokens=max_new,
                num_beams=1, **sampling_kwargs,
                stopping_criteria=StoppingCriteriaList([PerRowStop(rows, tokenizer, self.eos_ids)]),
                eos_token_id=sorted(self.eos_ids), pad_token_id=self.pad_id)
        for row in rows:  # rows cut short by the model's own max length
            if not row.done:
                row.done, row.finish_reason = True, "length"
                text = tokenizer.decode(row.tokens, skip_special_tokens=True)
                if row.job.request.stream and len(text) > len(row.sent):
                    row.job.emit(("delta", row.index, text[len(row.sent):]))
                row.job.emit(("done", row.index, text, len(row.tokens), "length"))


# ---------------------------------------------------------------------------------------------------------------
# The app
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class ServerSettings:
    model_name: str
    model_ids: set[str]
    max_new_tokens: int
    max_tokens_limit: int
    max_batch_size: int
    temperature: float
    top_p: float
    context_length: int | None
    max_prompt_tokens: int | None = None


def _load(config: ServeConfig):
    import torch

    from agentic_rl.deploy.export import load_merged, resolve_source

    path = resolve_source(config.model)
    model, tokenizer, info = load_merged(path, dtype=config.dtype, trust_remote_code=config.trust_remote_code)
    device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device).eval()
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"the tokenizer of {path} has no chat template; export the model with "
                          f"`agentic-rl export ... --chat-template FILE.jinja` first")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return path, model, tokenizer


def create_app(model_dir: str | Path, **settings: Any):
    """A FastAPI app serving ``model_dir``; ``settings`` are :class:`ServeConfig` fields (unknown ones are errors).

    The model is loaded here; the batching thread starts and stops with the app's lifespan (uvicorn or
    ``fastapi.testclient.TestClient``). ``app.state.batcher`` exposes ``generate_calls`` and ``batch_sizes``.
    """
    from agentic_rl.config import config_from_dict

    config = config_from_dict(ServeConfig, {"model": str(model_dir), **settings}, where="serve settings")
    return _create_app(config)


def _create_app(config: ServeConfig):
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import ClientDisconnect

    from agentic_rl.data.formats import chat_template_kwargs

    path, model, tokenizer = _load(config)
    name = config.served_model_name or Path(config.model).resolve().name
    gen = model.generation_config
    samples = bool(getattr(gen, "do_sample", False))
    default_t = config.temperature if config.temperature is not None else (
        float(gen.temperature) if samples and gen.temperature is not None else 1.0)
    default_p = config.top_p if config.top_p is not None else (
        float(gen.top_p) if samples and gen.top_p is not None else 1.0)
    eos = gen.eos_token_id if gen.eos_token_id is not None else tokenizer.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids.append(tokenizer.eos_token_id)
    settings = ServerSettings(model_name=name, model_ids={name, str(config.model)},
                              max_new_tokens=config.max_new_tokens, max_tokens_limit=config.max_tokens_limit,
                              max_batch_size=config.max_batch_size, temperature=default_t, top_p=default_p,
                              context_length=getattr(model.config, "max_position_embeddings", None),
                              max_prompt_tokens=config.max_prompt_tokens)
    batcher = Batcher(model, tokenizer, eos_ids, config.max_batch_size, config.batch_wait_ms)
    prompt_tokenizers = TokenizerPool(tokenizer)  # the request threads' own copies (the batcher decodes with tokenizer)
    specials = special_token_strings(tokenizer)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        batcher.start()
        try:
            yield
        finally:
            batcher.stop()

    # With an API key, the API's description is for key holders too; the docs pages cannot send a key, so they are off.
    open_docs = not config.api_key
    app = FastAPI(title="agentic-rl", lifespan=lifespan, openapi_url="/openapi.json" if open_docs else None,
                  docs_url="/docs" if open_docs else None, redoc_url="/redoc" if open_docs else None)
    app.state.batcher = batcher
    app.state.settings = settings
    app.state.model_path = path

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse({"error": {"message": str(exc.detail), "type": kind, "param": None, "code": None}},
                            status_code=exc.status_code)

    def check_key(request: Request) -> None:
        if not config.api_key:
            return
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header.lower().startswith("bearer ") else ""
        if not given or not secrets.compare_digest(given.encode(), config.api_key.encode()):
            raise APIError(401, "missing or invalid API key (send 'Authorization: Bearer KEY')",
                           type_="authentication_error", code="invalid_api_key")

    if not open_docs:
        @app.get("/openapi.json", include_in_schema=False)
        async def openapi(request: Request):
            check_key(request)
            return app.openapi()

    def model_card() -> dict[str, Any]:
        return {"id": name, "object": "model", "created": created, "owned_by": "agentic-rl",
                "max_model_len": settings.context_length}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": name, "generate_calls": batcher.generate_calls}

    @app.get("/v1/models")
    async def list_models(request: Request):
        check_key(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request):
        check_key(request)
        if model_id not in settings.model_ids:
            raise APIError(404, f"model '{model_id}' not found; this server serves '{name}'", "model",
                           code="model_not_found")
        return model_card()

    async def read_body(request: Request) -> bytes:
        """The body, refused with 413 as soon as it is known to exceed max_request_bytes (declared or streamed)."""
        limit = config.max_request_bytes
        too_large = APIError(413, f"the request body exceeds this server's limit of {limit} bytes (max_request_bytes)",
                             code="request_too_large")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
            raise too_large
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
        except ClientDisconnect:
            raise APIError(499, "the client closed the request") from None
        return b"".join(chunks)

    def prepare(raw: bytes) -> tuple[ChatRequest, list[int]]:
        """Parse, validate, render and tokenize one request (in a worker thread: none of it blocks the event loop)."""
        chat = parse_chat_request(_json_body(raw), settings)
        template_kwargs = {**chat_template_kwargs(config.enable_thinking), **chat.template_kwargs}
        with prompt_tokenizers.borrow() as prompt_tokenizer:
            prompt_ids = encode_prompt(prompt_tokenizer, chat.messages, template_kwargs, specials)
        if settings.max_prompt_tokens is not None and len(prompt_ids) > settings.max_prompt_tokens:
            raise APIError(400, f"the prompt has {len(prompt_ids)} tokens; this server accepts at most "
                                f"{settings.max_prompt_tokens} (max_prompt_tokens)", "messages",
                           code="context_length_exceeded")
        if settings.context_length and len(prompt_ids) + chat.max_tokens > settings.context_length:
            raise APIError(400, f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({chat.max_tokens}) exceeds "
                                f"the model's context of {settings.context_length} tokens", "max_tokens",
                           code="context_length_exceeded")
        return chat, prompt_ids

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        check_key(request)
        chat, prompt_ids = await run_in_threadpool(prepare, await read_body(request))
        job = Job(prompt_ids, chat, asyncio.get_running_loop(), asyncio.Queue())
        batcher.submit(job)
        reply_id = f"chatcmpl-{uuid.uuid4().hex}"
        base = {"id": reply_id, "created": int(time.time()), "model": name}

        if chat.stream:
            return StreamingResponse(_stream(job, base), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})

        choices: dict[int, dict[str, Any]] = {}
        completion_tokens = 0
        hung_up = asyncio.ensure_future(_disconnected(request))
        try:
            while len(choices) < chat.n:
                next_event = asyncio.ensure_future(job.events.get())
                await asyncio.wait((next_event, hung_up), return_when=asyncio.FIRST_COMPLETED)
                if not next_event.done():  # the client has gone: stop its rows at their next token
                    next_event.cancel()
                    job.cancelled = True
                    return JSONResponse(APIError(499, "the client closed the request").body(), status_code=499)
                event = next_event.result()
                if event[0] == "error":
                    raise APIError(500, event[1], type_="server_error")
                if event[0] == "done":
                    _, index, text, count, reason = event
                    completion_tokens += count
                    choices[index] = {"index": index, "message": {"role": "assistant", "content": text},
                                      "finish_reason": reason, "logprobs": None}
        except asyncio.CancelledError:
            job.cancelled = True
            raise
        finally:
            hung_up.cancel()
        return {**base, "object": "chat.completion", "choices": [choices[i] for i in range(chat.n)],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": completion_tokens,
                          "total_tokens": len(prompt_ids) + completion_tokens}}

    async def _disconnected(request: Request) -> None:
        """Returns once the client has closed the connection (the body is read by then: receive() only waits)."""
        with contextlib.suppress(Exception):  # a receive that fails means the connection is gone too
            while (await request.receive())["type"] != "http.disconnect":
                pass

    async def _stream(job: Job, base: dict[str, Any]):
        chunk = {**base, "object": "chat.completion.chunk"}

        def sse(choices: list[dict[str, Any]], **extra) -> str:
            return f"data: {json.dumps({**chunk, 'choices': choices, **extra})}\n\n"

        n = job.request.n
        try:
            for i in range(n):
                yield sse([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
            finished, completion_tokens = 0, 0
            while finished < n:
                event = await job.events.get()
                if event[0] == "error":
                    error = APIError(500, event[1], type_="server_error").body()
                    yield f"data: {json.dumps(error)}\n\n"
                    return
                if event[0] == "delta":
                    _, index, text = event
                    yield sse([{"index": index, "delta": {"content": text}, "finish_reason": None}])
                else:
                    _, index, _, count, reason = event
                    finished += 1
                    completion_tokens += count
                    yield sse([{"index": index, "delta": {}, "finish_reason": reason}])
            if job.request.include_usage:
                prompt_tokens = len(job.prompt_ids)
                yield sse([], usage={"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                     "total_tokens": prompt_tokens + completion_tokens})
            yield "data: [DONE]\n\n"
        finally:
            job.cancelled = True  # a client that hung up stops its rows at the next token

    return app


def run(config: ServeConfig) -> None:
    """Load the model and serve until interrupted."""
    import uvicorn

    if config.host not in ("127.0.0.1", "localhost", "::1") and not config.api_key:
        warn(f"serving on {config.host} without an API key: anyone who can reach this port can use the model")
    app = _create_app(config)
    log(f"serve: {app.state.model_path} as '{app.state.settings.model_name}' at "
        f"http://{config.host}:{config.port}/v1 (batch <= {config.max_batch_size}, wait {config.batch_wait_ms} ms"
        f"{', API key required' if config.api_key else ''})")
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level)

