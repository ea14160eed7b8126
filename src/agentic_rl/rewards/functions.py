"""Reward functions: plain callables with TRL's signature ``reward(completions, **columns) -> list[float]``.

Each reward takes the completions (strings, or TRL message lists) and the dataset columns TRL passes as keyword
arguments (``ground_truth``, ``prompts``, ``completion_ids``, ...), and returns one float per completion. Each has a
``__name__`` (``accuracy``, ``length``, ...) so TRL logs it as ``rewards/accuracy/mean``, and a ``score(completion,
ground_truth)`` method for one sample. None of them raises on any completion text.

==================  ===================================================================================
reward              definition
==================  ===================================================================================
accuracy            r = 1 if the final answer equals the ground truth (rel/abs tolerance) else 0
length              r = r_acc - alpha * max(0, L - L_target); L in tokens with a tokenizer, else characters;
                    by default only correct answers are penalised and r never drops below 0
step                r = r_acc + beta * min(s, max_steps), s = distinct lines with an equation or "Step k";
                    by default the bonus goes to correct answers only
format              1 for "steps, then exactly one final answer as the last line"; 0.5 for one final answer
                    without steps before it or with text after it; 0 otherwise
process             share of distinct equations "a op b = c" that the safe calculator confirms
                    (0 when there are none): a step-level signal that needs no ground truth
combined            sum_i w_i * r_i over component rewards
==================  ===================================================================================

Example::

    >>> accuracy_reward(["48 / 2 = 24\\nFinal Answer: 24", "Final Answer: 25"], ground_truth=["24", "24"])
    [1.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agentic_rl.errors import ConfigError
from agentic_rl.rewards.calculator import MAX_EQUATIONS, check_equations, count_steps
from agentic_rl.rewards.extraction import FINAL_ANSWER_RE, MAX_MARKERS, completion_text, find_final_answers, is_correct

__all__ = ["AccuracyReward", "LengthPenaltyReward", "StepReward", "FormatReward", "ProcessReward",
           "CombinedReward", "accuracy_reward"]

MODES = ("strict", "lenient")


def _column(kwargs: dict[str, Any], key: str, n: int, reward: str) -> list[Any]:
    """The dataset column ``key`` as a list of ``n`` values (a single value is repeated)."""
    if key not in kwargs or kwargs[key] is None:
        columns = sorted(k for k in kwargs if k not in ("trainer_state", "log_extra", "log_metric", "environments"))
        raise ConfigError(f"reward '{reward}' needs a '{key}' column in the dataset; the columns given were: "
                          f"{', '.join(columns) or 'none'}")
    values = kwargs[key]
    if isinstance(values, (str, bytes, int, float)) or not hasattr(values, "__len__"):
        return [values] * n
    values = list(values)
    if len(values) != n:
        raise ConfigError(f"reward '{reward}': {len(values)} '{key}' values for {n} completions")
    return values


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ConfigError(f"reward mode must be one of {', '.join(MODES)}; got {mode!r}")
    return mode


class AccuracyReward:
    """1.0 when the completion's final answer equals ``ground_truth``, else 0.0 (see :func:`is_correct`).

    >>> AccuracyReward()(["Final Answer: 72.0", "72"], ground_truth=["72", "72"])
    [1.0, 0.0]
    >>> AccuracyReward(mode="lenient")(["so 72 in all"], ground_truth=["72"])
    [1.0]
    """

    def __init__(self, mode: str = "strict", rel_tol: float = 1e-6, abs_tol: float = 1e-6,
                 use_math_verify: bool = False, ground_truth_key: str = "ground_truth", name: str = "accuracy"):
        self.mode = _check_mode(mode)
        self.rel_tol = float(rel_tol)
        self.abs_tol = float(abs_tol)
        self.use_math_verify = bool(use_math_verify)
        self.ground_truth_key = ground_truth_key
        self.__name__ = name

    def score(self, completion: Any, ground_truth: Any) -> float:
        return 1.0 if is_correct(completion, ground_truth, self.mode, self.use_math_verify,
                                 self.rel_tol, self.abs_tol) else 0.0

    def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        truths = _column(kwargs, self.ground_truth_key, len(completions), self.__name__)
        return [self.score(c, t) for c, t in zip(completions, truths)]

    def __repr__(self) -> str:
        return f"AccuracyReward(mode={self.mode!r}, use_math_verify={self.use_math_verify})"


class _OnAccuracy:
    """Shared by rewards defined as accuracy plus a shaping term."""

    def __init__(self, mode: str, use_math_verify: bool, ground_truth_key: str, name: str):
        self.accuracy = AccuracyReward(mode=mode, use_math_verify=use_math_verify, ground_truth_key=ground_truth_key)
        self.ground_truth_key = ground_truth_key
        self.__name__ = name

    def _score(self, completion: Any, ground_truth: Any, length: int | None) -> float:
        raise NotImplementedError

    def score(self, completion: Any, ground_truth: Any) -> float:
        return self._score(completion, ground_truth, None)

    def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        truths = _column(kwargs, self.ground_truth_key, len(completions), self.__name__)
        ids = kwargs.get("completion_ids")
        lengths = [len(x) for x in ids] if ids is not None and len(ids) == len(completions) else [None] * len(truths)
        return [self._score(c, t, n) for c, t, n in zip(completions, truths, lengths)]


class LengthPenaltyReward(_OnAccuracy):
    """r = r_acc - alpha * max(0, L - target_length), clipped below at ``floor`` (None: no clipping).

    ``L`` counts tokens when a ``tokenizer`` is given (an object with ``encode`` or a name/path that
    ``AutoTokenizer`` loads) or ``use_completion_ids`` is set (TRL's ``completion_ids`` column), characters otherwise.
    With ``only_correct`` (the default) a wrong answer scores 0 and is not penalised further: the penalty only ranks
    correct answers, so it cannot teach a model that short wrong answers beat long right ones. Texts over
    ``MAX_TOKENIZE_CHARS`` are tokenized on their first part and the count extrapolated.

    >>> LengthPenaltyReward(alpha=0.01, target_length=10)(["1 + 1 = 2\\nFinal Answer: 2"], ground_truth=["2"])
    [0.85]
    """

    MAX_TOKENIZE_CHARS = 100_000

    def __init__(self, alpha: float = 0.001, target_length: int = 400, tokenizer: Any = None,
                 only_correct: bool = True, floor: float | None = 0.0, use_completion_ids: bool = False,
                 mode: str = "strict", use_math_verify: bool = False, ground_truth_key: str = "ground_truth",
                 name: str = "length"):
        super().__init__(_check_mode(mode), use_math_verify, ground_truth_key, name)
        if alpha < 0 or target_length < 0:
            raise ConfigError(f"length reward: alpha ({alpha}) and target_length ({target_length}) must be >= 0")
        self.alpha = float(alpha)
        self.target_length = int(target_length)
        self.tokenizer = tokenizer
        self.only_correct = bool(only_correct)
        self.floor = None if floor is None else float(floor)
        self.use_completion_ids = bool(use_completion_ids)
        self.unit = "tokens" if (tokenizer is not None or use_completion_ids) else "characters"

    def _tokenizer(self) -> Any:
        if isinstance(self.tokenizer, str):
            from transformers import AutoTokenizer

            try:
                self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer)
            except Exception as exc:  # noqa: BLE001 - any load failure is a user-fixable setting
                raise ConfigError(f"length reward: cannot load tokenizer {self.tokenizer!r}: {exc}") from None
        return self.tokenizer

    def length(self, completion: Any, n_ids: int | None = None) -> int:
        """The length ``L`` of a completion in this reward's unit."""
        if self.use_completion_ids and n_ids is not None:
            return n_ids
        text = completion_text(completion)
        if self.tokenizer is None:
            return len(text)
        tok = self._tokenizer()
        head = text[:self.MAX_TOKENIZE_CHARS]
        ids = tok.encode(head, add_special_tokens=False) if hasattr(tok, "encode") else tok(head)
        n = len(ids)
        if len(text) > len(head):  # extrapolate: scoring a huge completion must stay fast
            n = int(n * len(text) / max(1, len(head)))
        return n

    def _score(self, completion: Any, ground_truth: Any, n_ids: int | None) -> float:
        r_acc = self.accuracy.score(completion, ground_truth)
        if self.only_correct and r_acc <= 0:
            return r_acc
        excess = max(0, self.length(completion, n_ids) - self.target_length)
        r = r_acc - self.alpha * excess
        return max(self.floor, r) if self.floor is not None else r


class StepReward(_OnAccuracy):
    """r = r_acc + beta * min(s, max_steps); s = :func:`count_steps` (distinct lines with an equation or "Step k").

    With ``only_correct`` (the default) wrong answers get no bonus, so steps cannot be farmed without solving.

    >>> StepReward(beta=0.1)(["4 * 2 = 8\\n8 + 1 = 9\\nFinal Answer: 9", "4 * 2 = 8\\nFinal Answer: 8"],
    ...                      ground_truth=["9", "9"])
    [1.2, 0.0]
    """

    def __init__(self, beta: float = 0.1, max_steps: int = 5, only_correct: bool = True, mode: str = "strict",
                 use_math_verify: bool = False, ground_truth_key: str = "ground_truth", name: str = "step"):
        super().__init__(_check_mode(mode), use_math_verify, ground_truth_key, name)
        if max_steps < 0:
            raise ConfigError(f"step reward: max_steps must be >= 0, got {max_steps}")
        self.beta = float(beta)
        self.max_steps = int(max_steps)
        self.only_correct = bool(only_correct)

    def _score(self, completion: Any, ground_truth: Any, n_ids: int | None) -> float:
        r_acc = self.accuracy.score(completion, ground_truth)
        if self.only_correct and r_acc <= 0:
            return r_acc
        steps = count_steps(completion_text(completion), limit=self.max_steps)
        return r_acc + self.beta * min(steps, self.max_steps)


class FormatReward:
    """The answer format of :mod:`agentic_rl.data.formats`: reasoning lines, then exactly one ``Final Answer: N``
    line, as the last line.

    1.0 when that holds; 0.5 when there is exactly one ``Final Answer:`` line with a number but no reasoning line
    before it or other text after it; 0.0 with no final answer, two ``Final Answer:`` lines, one without a number,
    or answers that disagree (an inline "the final answer is 5" elsewhere must agree with the final line). Needs
    no ground truth.

    >>> FormatReward()(["2 + 2 = 4\\nFinal Answer: 4", "Final Answer: 4", "4", "Final Answer: 4\\nFinal Answer: 5"])
    [1.0, 0.5, 0.0, 0.0]
    """

    def __init__(self, name: str = "format"):
        self.__name__ = name

    def score(self, completion: Any, ground_truth: Any = None) -> float:
        text = completion_text(completion)
        close = text.rfind("</think>")
        if close != -1:
            text = text[close + len("</think>"):]
        finals = find_final_answers(text)
        if finals.conflict or finals.value is None:  # no answer, a non-number, or two different answers
            return 0.0
        lines = []  # "Final Answer:" lines (the marker starts the line, after optional markdown)
        for n, m in enumerate(FINAL_ANSWER_RE.finditer(text)):
            if n >= MAX_MARKERS:
                break
            before = text[max(0, m.start() - 64):m.start()]  # a marker line starts with at most some markup
            if m.start() > 64 and "\n" not in before:
                continue
            if not before.rsplit("\n", 1)[-1].strip(" \t*#>_") and ":" in m.group(0):
                lines.append(m)
                if len(lines) > 1:
                    return 0.0
        if len(lines) != 1:
            return 0.0
        marker = lines[0]
        line_end = text.find("\n", marker.end())
        is_last = line_end == -1 or not text[line_end:].strip()
        has_steps = bool(text[:marker.start()].strip())
        return 1.0 if (is_last and has_steps) else 0.5

    def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        return [self.score(c) for c in completions]


class ProcessReward:
    """Share of the distinct equations ``a op b = c`` in a completion that the safe calculator confirms.

    ``no_equation_value`` is the reward of a completion without equations (0 by default, so writing no arithmetic
    is not a way to avoid mistakes). Identical equations count once, so repeating a trivial correct one does not
    dilute a wrong one. Needs no ground truth.

    >>> ProcessReward()(["48 / 2 = 24\\n48 + 24 = 72", "48 / 2 = 24\\n48 + 24 = 70", "no arithmetic"])
    [1.0, 0.5, 0.0]
    """

    def __init__(self, no_equation_value: float = 0.0, max_equations: int = MAX_EQUATIONS, name: str = "process"):
        self.no_equation_value = float(no_equation_value)
        self.max_equations = int(max_equations)
        self.__name__ = name

    def score(self, completion: Any, ground_truth: Any = None) -> float:
        checks = check_equations(completion_text(completion), limit=self.max_equations)
        distinct = {(c.expression.replace(" ", ""), c.stated): c.ok for c in checks}
        if not distinct:
            return self.no_equation_value
        return sum(distinct.values()) / len(distinct)

    def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        return [self.score(c) for c in completions]


class CombinedReward:
    """sum_i w_i * r_i of component rewards (any TRL-style reward callables).

    >>> both = CombinedReward([AccuracyReward(), FormatReward()], [1.0, 0.2])
    >>> both(["2 + 2 = 4\\nFinal Answer: 4"], ground_truth=["4"])
    [1.2]
    """

    def __init__(self, rewards: Sequence[Callable[..., list[float]]], weights: Sequence[float] | None = None,
                 name: str = "combined"):
        self.rewards = list(rewards)
        self.weights = [1.0] * len(self.rewards) if weights is None else [float(w) for w in weights]
        if not self.rewards:
            raise ConfigError("combined reward: give at least one component reward")
        if len(self.weights) != len(self.rewards):
            raise ConfigError(f"combined reward: {len(self.weights)} weights for {len(self.rewards)} rewards")
        self.__name__ = name

    def components(self, completions: Sequence[Any], **kwargs: Any) -> dict[str, list[float]]:
        """Each component's rewards by name (a repeated name gets a ``_2``, ``_3`` suffix)."""
        out: dict[str, list[float]] = {}
        for reward in self.rewards:
            name = getattr(reward, "__name__", type(reward).__name__)
            key, k = name, 2
            while key in out:
                key, k = f"{name}_{k}", k + 1
            out[key] = [float(x) if x is not None else 0.0 for x in reward(completions, **kwargs)]
        return out

    def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        parts = list(self.components(completions, **kwargs).values())
        return [sum(w * part[i] for w, part in zip(self.weights, parts)) for i in range(len(completions))]


accuracy_reward = AccuracyReward()
