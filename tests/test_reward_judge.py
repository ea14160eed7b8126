"""The LLM-judge reward against the project's own OpenAI-compatible server (real uvicorn, real ``openai`` client).

The served judge is the micro model trained for a few seconds to answer three judge requests with fixed replies
(two with a ``Score: N`` line, one without), so the scores the reward parses are known in advance. A dead port and
a socket that accepts and never answers stand in for a judge that is down or hangs.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from test_serve import _free_port, serving

from agentic_rl.deploy.serve import create_app
from agentic_rl.errors import ConfigError
from agentic_rl.rewards import build_rewards
from agentic_rl.rewards.judge import JudgeError, JudgeReward, judge_messages, parse_score

KEY = "judge-key-123"
RUBRIC = "Is the final answer 12?"
QUESTION = "Ann has 3 boxes of 4 pens. How many pens?"
# (completion, the reply the served judge is trained to give, the reward that reply means)
CASES = [("3 * 4 = 12\nFinal Answer: 12", "Correct.\nScore: 9", 0.9),
         ("3 + 4 = 7\nFinal Answer: 7", "Wrong.\nScore: 2", 0.2),
         ("I like pens.", "No answer given.", None)]


def _prompt():
    """A TRL conversational prompt: the system message is not shown to the judge, the question is."""
    return [{"role": "system", "content": "Solve the problem."}, {"role": "user", "content": QUESTION}]


def _completion(text: str):
    return [{"role": "assistant", "content": text}]


@pytest.fixture(scope="module")
def judge_model_dir(tiny_model_dir, tmp_path_factory):
    """The micro model, trained until its greedy reply to each judge request in CASES is exactly the planned one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    pairs = []
    for completion, reply, _ in CASES:
        prompt = tokenizer.apply_chat_template(judge_messages(QUESTION, completion, RUBRIC), tokenize=False,
                                               add_generation_prompt=True)
        pairs.append((tokenizer(prompt, add_special_tokens=False)["input_ids"],
                      tokenizer(reply + "<|im_end|>", add_special_tokens=False)["input_ids"]))
    length = max(len(p) + len(r) for p, r in pairs)
    ids = torch.full((len(pairs), length), tokenizer.pad_token_id)
    labels = torch.full((len(pairs), length), -100)
    mask = torch.zeros((len(pairs), length), dtype=torch.long)
    for i, (p, r) in enumerate(pairs):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        labels[i, len(p):len(p) + len(r)] = torch.tensor(r)
        mask[i, :len(p) + len(r)] = 1

    def replies() -> list[str]:
        model.eval()
        with torch.no_grad():
            out = [model.generate(input_ids=torch.tensor([p]), max_new_tokens=16, do_sample=False)[0, len(p):]
                   for p, _ in pairs]
        model.train()
        return [tokenizer.decode(o, skip_special_tokens=True) for o in out]

    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for step in range(400):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 9 and loss.item() < 0.3 and replies() == [reply for _, reply, _ in CASES]:
            break
    else:
        pytest.fail(f"the judge model did not learn its replies: {replies()}")
    path = tmp_path_factory.mktemp("judge_model")
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def judge_server(judge_model_dir):
    # A 300 ms batching window: concurrent requests meet in one generate call, sequential ones do not.
    app = create_app(judge_model_dir, api_key=KEY, served_model_name="judge", max_new_tokens=16, batch_wait_ms=300)
    with serving(app) as url:
        yield app, url + "/v1"


def _served(app) -> int:
    """Sequences the server has generated so far (every chat request that reached the model)."""
    return sum(app.state.batcher.batch_sizes)


def test_parse_score_is_strict():
    assert parse_score("Correct.\nScore: 9") == 0.9
    assert parse_score("  score:10  ") == 1.0 and parse_score("Score: 0") == 0.0 and parse_score("Score: 7.5") == 0.75
    for reply in ("Score: 7/10", "Score: 11", "Score: -1", "Score: nine", "Score:", "The score is 8", "9", "",
                  "Score: 3\nScore: 3", "**Score: 8**", "Final Score: 8", None):
        assert parse_score(reply) is None, reply


def test_scores_cache_and_concurrency_against_a_real_server(judge_server, tmp_path, monkeypatch, capsys):
    app, url = judge_server
    monkeypatch.setenv("JUDGE_KEY", KEY)
    cache = tmp_path / "cache" / "judge.jsonl"
    spec = (f'judge(base_url={url},model=judge,rubric="{RUBRIC}",api_key_env=JUDGE_KEY,max_tokens=16,'
            f'cache_path={cache}):0.5')
    funcs, weights = build_rewards([spec])
    judge = funcs[0]
    assert isinstance(judge, JudgeReward) and judge.__name__ == "judge" and weights == [0.5]

    completions = [_completion(c) for c, _, _ in CASES]
    before = _served(app)
    scores = judge(completions, prompts=[_prompt()] * 3, ground_truth=["12"] * 3)
    assert scores == [0.9, 0.2, 0.0]                       # the unparseable reply scores unparseable_score (0)
    assert _served(app) - before == 3
    assert app.state.batcher.batch_sizes[-1] == 3          # sent concurrently: one batch on the server
    assert judge.stats == {"scored": 3, "requests": 3, "cache_hits": 0, "unparseable": 1, "failures": 0}
    assert "1 of 3 replies had no single 'Score: N' line" in capsys.readouterr().err

    # Parsed scores are cached (memory and disk): asking again sends nothing to the server.
    before = _served(app)
    assert judge(completions[:2] * 2, prompts=[_prompt()] * 4) == [0.9, 0.2, 0.9, 0.2]
    assert _served(app) == before and judge.stats["cache_hits"] == 4 and judge.stats["requests"] == 3
    lines = cache.read_text().splitlines()
    assert len(lines) == 2 and '"score": 0.9' in lines[0] and "Score: 9" in lines[0]
    # The unparseable reply is not cached: it is asked again (and counted again).
    assert judge(completions[2:], prompts=[_prompt()]) == [0.0]
    assert _served(app) == before + 1 and judge.stats["unparseable"] == 2

    # A new judge on the same cache file needs no request for the cached pairs; a duplicate in a batch is asked once;
    # max_concurrency=1 sends the rest one at a time (each its own batch on the server).
    fresh = JudgeReward(base_url=url, model="judge", rubric=RUBRIC, api_key_env="JUDGE_KEY", max_tokens=16,
                        cache_path=str(cache), max_concurrency=1, unparseable_score=0.05)
    before = _served(app)
    assert fresh(completions, prompts=[_prompt()] * 3) == [0.9, 0.2, 0.05]
    assert _served(app) - before == 1 and fresh.stats["cache_hits"] == 2 and fresh.stats["requests"] == 1
    other = JudgeReward(base_url=url, model="judge", rubric="Is it 13?", api_key_env="JUDGE_KEY", max_tokens=16,
                        max_concurrency=1)
    before, batches = _served(app), len(app.state.batcher.batch_sizes)
    other(completions[:2], prompts=[_prompt()] * 2)         # another rubric is another cache key: asked again
    assert _served(app) - before == 2 and app.state.batcher.batch_sizes[batches:] == [1, 1]


def test_wrong_key_or_model_is_an_error_even_with_a_fallback(judge_server, monkeypatch):
    _, url = judge_server
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)     # no key in the environment: "EMPTY" is sent
    no_key = JudgeReward(base_url=url, model="judge", fallback=0.5, max_tokens=16)
    with pytest.raises(JudgeError, match=rf"judge at {url} refused the request \(AuthenticationError"):
        no_key([_completion("x")], prompts=[_prompt()])
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    wrong_model = JudgeReward(base_url=url, model="gpt-judge", fallback=0.5, max_tokens=16)
    with pytest.raises(JudgeError, match="NotFoundError.*'gpt-judge' not found"):
        wrong_model([_completion("x")], prompts=[_prompt()])


def test_dead_endpoint_raises_one_line_or_scores_the_fallback():
    url = f"http://127.0.0.1:{_free_port()}/v1"             # nothing listens there
    judge = JudgeReward(base_url=url, model="m", timeout=2.0, max_retries=2, backoff=0.05)
    started = time.monotonic()
    with pytest.raises(JudgeError) as error:
        judge([_completion("a"), _completion("b")], prompts=[QUESTION, QUESTION])
    assert time.monotonic() - started < 2.0 * 3
    message = str(error.value)
    assert "\n" not in message and url in message and "failed after 3 attempt(s)" in message
    assert "APIConnectionError" in message and "fallback=" in message
    assert judge.stats["requests"] >= 3                      # the retries were made

    with_fallback = JudgeReward(base_url=url, model="m", timeout=2.0, max_retries=1, backoff=0.05, fallback=0.25)
    assert with_fallback([_completion("a"), _completion("b"), _completion("a")], prompts=[QUESTION] * 3) == [0.25] * 3
    assert with_fallback.stats["failures"] == 2 and with_fallback.cache == {}   # failures are not cached


@pytest.fixture()
def silent_server():
    """A TCP server on 127.0.0.1 that accepts connections and never answers; yields (url, accepted connections)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except (TimeoutError, OSError):
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1", accepted
    stop.set()
    thread.join(timeout=5)
    for conn in accepted:
        conn.close()
    listener.close()


def test_slow_endpoint_times_out_within_the_bound(silent_server):
    url, accepted = silent_server
    timeout, retries = 0.5, 1
    judge = JudgeReward(base_url=url, model="m", timeout=timeout, max_retries=retries, backoff=0.0)
    started = time.monotonic()
    with pytest.raises(JudgeError, match=r"failed after 2 attempt\(s\) \(timeout 0.5s each\): timed out"):
        judge([_completion("a")], prompts=[QUESTION])
    elapsed = time.monotonic() - started
    assert 0.9 * timeout * (retries + 1) <= elapsed < timeout * (retries + 1) + 1.0
    assert len(accepted) == 2 and judge.stats["requests"] == 2   # both attempts reached the server

    with_fallback = JudgeReward(base_url=url, model="m", timeout=timeout, max_retries=0, fallback=0.0)
    assert with_fallback([_completion("a"), _completion("b")], prompts=[QUESTION] * 2) == [0.0, 0.0]
    assert with_fallback.stats["failures"] == 2


def test_spec_mistakes_are_config_errors(tmp_path):
    cases = [
        ("judge(model=m)", "base_url must be an http"),
        ("judge(base_url=http://127.0.0.1:1/v1)", "model is required"),
        ("judge(base_url=http://127.0.0.1:1/v1,model=m,timeout=0)", "timeout must be > 0"),
        ("judge(base_url=http://127.0.0.1:1/v1,model=m,max_concurrency=0)", "max_concurrency must be an integer"),
        ("judge(base_url=http://127.0.0.1:1/v1,model=m,rubric_file=nope.txt)", "rubric_file nope.txt not found"),
        ("judge(base_url=http://127.0.0.1:1/v1,model=m,rubric=Score: 1)", "rubric must be non-empty text"),
        ("judge(base_url=http://127.0.0.1:1/v1,model=m,retries=2)", "has no parameter 'retries'"),
    ]
    for spec, message in cases:
        with pytest.raises(ConfigError, match=message):
            build_rewards([spec])
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("Correct, concise: 10.\n")
    funcs, _ = build_rewards([f"judge(base_url=http://127.0.0.1:1/v1,model=m,rubric_file={rubric})",
                              'judge(base_url=http://127.0.0.1:1/v1,model=m,rubric="Correct, concise: 10.")'])
    assert funcs[0].rubric == funcs[1].rubric == "Correct, concise: 10."
    assert [f.__name__ for f in funcs] == ["judge", "judge_2"]


def test_grpo_step_scored_by_the_judge(judge_server, tiny_model_dir, tmp_path, monkeypatch):
    """`--reward 'judge(...)'` in a real GRPO step: TRL hands the judge its prompts and completions, the server is
    asked, and the judge's own counts reach the training metrics."""
    from agentic_rl.train.grpo import GRPOConfig, run

    app, url = judge_server
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    before = _served(app)
    config = GRPOConfig(model=str(tiny_model_dir), preset="tiny", max_train_samples=4, max_steps=1, num_generations=2,
                        batch_size=2, gradient_accumulation_steps=1, max_completion_length=8, heldout_every=0,
                        report_to=["none"], output_dir=str(tmp_path / "grpo"), completions_every=1,
                        completions_per_log=64,  # all of the generation batch
                        rewards=[f"judge(base_url={url},model=judge,max_tokens=16,timeout=60):1.0"])
    result = run(config)
    assert result["steps"] == 1
    assert 1 <= _served(app) - before <= 2                 # two completions (one request if they are identical)
    row = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()][0]
    # the logged mean is that of the judge's scores of the step's generation batch (every row of completions.jsonl)
    scored = [json.loads(line) for line in (tmp_path / "grpo" / "completions.jsonl").read_text().splitlines()]
    assert scored and {c["step"] for c in scored} == {1}
    assert row["grpo/reward/judge"] == pytest.approx(sum(c["rewards"]["judge"] for c in scored) / len(scored))
    assert row["grpo/judge/unparseable_fraction"] in (0.0, 0.5, 1.0) and row["grpo/judge/failure_fraction"] == 0.0


class _ScriptedJudge(BaseHTTPRequestHandler):
    """Answers ``/<mode>/v1/chat/completions``: ``ok`` a chat completion scoring 8, ``html`` a web page, ``text``
    plain text, ``trickle`` a valid completion one byte every 0.25 s."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep the test output clean
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        mode = self.path.strip("/").split("/")[0]
        completion = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": "Fine.\nScore: 8"}}]})
        body, kind = {"ok": (completion, "application/json"), "trickle": (completion, "application/json"),
                      "html": ("<html><body><h1>Welcome to nginx!</h1></body></html>", "text/html"),
                      "text": ("upstream connect error", "text/plain")}[mode]
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            if mode == "trickle":
                for i in range(len(data)):
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    time.sleep(0.25)
            else:
                self.wfile.write(data)
        except OSError:  # the client gave up: that is the point of the trickle
            pass


@pytest.fixture()
def scripted_judge():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ScriptedJudge)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_scores_outside_zero_one_are_refused(tmp_path):
    base = "judge(base_url=http://127.0.0.1:1/v1,model=m"
    for setting in ("fallback=5", "fallback=-2", "unparseable_score=3", "fallback=nan", "unparseable_score=-0.1"):
        with pytest.raises(ConfigError, match=rf"judge: {setting.split('=')[0]} must be "):
            build_rewards([f"{base},{setting})"])
    funcs, _ = build_rewards([f"{base},fallback=1,unparseable_score=0.5)"])
    assert funcs[0].fallback == 1.0 and funcs[0].unparseable_score == 0.5


def test_cache_rows_outside_zero_one_are_asked_again(scripted_judge, tmp_path, capsys):
    cache = tmp_path / "cache.jsonl"
    judge = JudgeReward(base_url=scripted_judge + "/ok/v1", model="m", cache_path=str(cache))
    keys = [judge._key(QUESTION, text, None) for text in ("a", "b", "c", "d", "e")]
    rows = [{"key": keys[0], "score": 50}, {"key": keys[1], "score": -1}, {"key": keys[2], "score": float("nan")},
            {"key": keys[3], "score": True}, {"key": keys[4], "score": 0.3}]
    cache.write_text("".join(json.dumps(row) + "\n" for row in rows))
    judge = JudgeReward(base_url=scripted_judge + "/ok/v1", model="m", cache_path=str(cache))
    assert "skipped 4 cache row(s) without a key and a score in [0, 1]" in capsys.readouterr().err
    scores = judge([_completion(text) for text in "abcde"], prompts=[QUESTION] * 5)
    assert scores == [0.8, 0.8, 0.8, 0.8, 0.3]                    # the bad rows were asked again, the good one reused
    assert judge.stats["requests"] == 4 and judge.stats["cache_hits"] == 1


@pytest.mark.parametrize("mode", ["html", "text"])
def test_a_reply_that_is_not_a_chat_completion_is_a_failure(scripted_judge, mode):
    url = f"{scripted_judge}/{mode}/v1"
    judge = JudgeReward(base_url=url, model="m", timeout=5, max_retries=0)
    with pytest.raises(JudgeError) as error:
        judge([_completion("a")], prompts=[QUESTION])
    message = str(error.value)
    assert "\n" not in message and url in message and "not a chat completion" in message
    with_fallback = JudgeReward(base_url=url, model="m", timeout=5, max_retries=0, fallback=0.1)
    assert with_fallback([_completion("a"), _completion("b")], prompts=[QUESTION] * 2) == [0.1, 0.1]
    assert with_fallback.stats["failures"] == 2


def test_the_time_bound_holds_for_a_trickled_reply(scripted_judge):
    """The server sends a valid reply a byte every 0.25 s (~70 s in all): every read is quick, the request is not."""
    timeout, retries = 1.0, 1
    judge = JudgeReward(base_url=scripted_judge + "/trickle/v1", model="m", timeout=timeout, max_retries=retries,
                        backoff=0.0, fallback=0.0)
    started = time.monotonic()
    assert judge([_completion("a")], prompts=[QUESTION]) == [0.0]
    elapsed = time.monotonic() - started
    assert elapsed < timeout * (retries + 1) + 1.0, elapsed
    assert judge.stats["requests"] == 2 and judge.stats["failures"] == 1
