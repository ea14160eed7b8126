"""Look at a dataset the way the model will: ``agentic-rl data preview`` and ``agentic-rl data stats``.

``preview`` prints a few rows as training and evaluation see them: the prompt (system + user messages, or the
exact chat-template text when ``--model`` names a tokenizer) and the completion the model learns to write
(steps one per line, then ``Final Answer: N``). ``stats`` prints row counts, the step-count histogram, the range
of the ground-truth answers and question lengths.

The source is anything ``load_task_dataset`` reads: ``synthetic`` (default), ``synthetic:multiplication``,
``synthetic:multiplication-distractor``, ``synthetic:world``, ``synthetic:memory``, ``gsm8k`` (the hub's
``openai/gsm8k``), a hub id, a local file or a folder of ``train``/``test`` files (e.g. a copy of GSM8K as
``gsm8k/train.jsonl`` and ``gsm8k/test.jsonl`` with its ``question`` and ``answer`` columns), with optional column
mapping::

    agentic-rl data preview
    agentic-rl data stats --source openai/gsm8k --split test
    agentic-rl data preview --source my.jsonl --question-field problem --answer-field solution --model Qwen/Qwen3-0.6B
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from agentic_rl.config import SEED_RANGE, changed_from_default, check_range, setting
from agentic_rl.data.custom import TEXT_ANSWER_DATASETS, load_task_dataset
from agentic_rl.data.formats import SYSTEM_PROMPT, build_prompt, render_prompt
from agentic_rl.data.gsm8k import is_number
from agentic_rl.errors import ModelLoadError


@dataclass
class DataCommandConfig:
    action: str = setting("preview", "preview: a few rows as the model sees them; stats: counts, step histogram, "
                                     "answer range", positional=True, choices=["preview", "stats"])
    source: str = setting("synthetic", "synthetic, synthetic:multiplication(-distractor), synthetic:world, "
                                       "synthetic:memory, gsm8k, a hub dataset id, a "
                                       ".jsonl/.json/.parquet/.csv file, or a folder with train/test files")
    split: str = setting("train", "split to read (train or test)")
    n: int = setting(3, "rows to show in preview")
    question_field: str | None = setting(None, "column holding the question")
    answer_field: str | None = setting(None, "column holding the answer ('... #### N', '... Final Answer: N' or a "
                                             "number)")
    prompt_field: str | None = setting(None, "column holding the prompt (text or message list), instead of "
                                             "question_field")
    completion_field: str | None = setting(None, "column holding the completion, instead of answer_field")
    ground_truth_field: str | None = setting(None, "column holding the final answer")
    numeric_ground_truth: bool = setting(True, "require every ground truth to be a number (the numeric accuracy "
                                               "reward needs it)")
    max_samples: int | None = setting(None, "use this many rows, drawn at random with seed")
    seed: int = setting(0, "seed for the max_samples draw")
    synthetic_seed: int = setting(0, "synthetic source: generation seed")
    synthetic_train_size: int = setting(2000, "synthetic source: training rows")
    synthetic_test_size: int = setting(200, "synthetic source: test rows")
    min_steps: int = setting(1, "synthetic source: fewest steps per problem")
    max_steps: int = setting(3, "synthetic source: most steps per problem")
    model: str | None = setting(None, "model or tokenizer (hub id or folder) whose chat template renders the preview; "
                                      "without one the messages are shown")
    enable_thinking: bool = setting(False, "render Qwen3 prompts with thinking on")

    def __post_init__(self) -> None:
        check_range(self, ("n", "max_samples", "synthetic_train_size", "min_steps"), 1)
        check_range(self, "synthetic_test_size", 0)
        check_range(self, "max_steps", self.min_steps)
        check_range(self, ("seed", "synthetic_seed"), *SEED_RANGE)

    def load(self):
        synthetic = {}
        if self.source.startswith("synthetic"):
            synthetic = {"synthetic_seed": self.synthetic_seed, "synthetic_train_size": self.synthetic_train_size,
                         "synthetic_test_size": self.synthetic_test_size}
            steps = ("min_steps", "max_steps")
            # the world's questions have hops, not steps: the step settings reach it only if set (and are refused)
            for name in steps if self.source not in TEXT_ANSWER_DATASETS else changed_from_default(self, steps):
                synthetic[name] = getattr(self, name)
        return load_task_dataset(
            self.source, self.split, question_field=self.question_field, answer_field=self.answer_field,
            prompt_field=self.prompt_field, completion_field=self.completion_field,
            ground_truth_field=self.ground_truth_field, max_samples=self.max_samples, seed=self.seed,
            numeric_ground_truth=self.numeric_ground_truth, **synthetic)


def _load_tokenizer(name: str):
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
    except Exception as exc:  # offline hub, missing folder, unreadable files
        first = " ".join(str(exc).split())[:200]
        raise ModelLoadError(f"cannot load a tokenizer from '{name}' ({first})") from None
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(f"the tokenizer of '{name}' has no chat template; preview without --model")
    return tokenizer


def preview(config: DataCommandConfig, ds) -> list[dict[str, Any]]:
    """Print ``config.n`` rows as prompt + completion; return what was shown."""
    tokenizer = _load_tokenizer(config.model) if config.model else None
    shown = []
    for i in range(min(config.n, len(ds))):
        row = ds[i]
        messages = build_prompt(row["question"], SYSTEM_PROMPT)
        n_steps = row["num_steps"]
        print(f"=== row {i + 1} of {len(ds)} · ground truth {row['ground_truth']} · "
              f"{n_steps} step{'' if n_steps == 1 else 's'} ===")
        if tokenizer is not None:
            prompt = render_prompt(tokenizer, messages, enable_thinking=config.enable_thinking)
            completion = row["solution"] + (tokenizer.eos_token or "")
            print(prompt + completion)
        else:
            prompt = "\n".join(f"[{m['role']}] {m['content']}" for m in messages)
            completion = f"[assistant] {row['solution']}"
            print(prompt)
            print(completion)
        print()
        shown.append({"prompt": prompt, "completion": completion})
    return shown


def stats(ds) -> dict[str, Any]:
    """Counts, step-count histogram, answer range (and how many answers are text) and question lengths; printed
    and returned."""
    steps = Counter(ds["num_steps"])
    numeric = [float(a) for a in ds["ground_truth"] if is_number(a)]
    answers = numeric or [float("nan")]
    words = [len(q.split()) for q in ds["question"]]
    result = {
        "rows": len(ds),
        "text_answers": len(ds) - len(numeric), "distinct_answers": len(set(ds["ground_truth"])),
        "steps_histogram": dict(sorted(steps.items())),
        "answer_min": min(answers), "answer_max": max(answers),
        "answer_median": statistics.median(answers), "answer_mean": statistics.fmean(answers),
        "integer_answers": sum(a.is_integer() for a in answers) / len(ds),
        "question_words_mean": statistics.fmean(words), "question_words_max": max(words),
    }
    print(f"rows: {result['rows']}")
    print("steps per problem:")
    top = max(steps.values())
    for k, count in result["steps_histogram"].items():
        bar = "#" * max(1, round(40 * count / top))
        print(f"  {k:>3} | {bar} {count} ({100 * count / len(ds):.1f}%)")
    def fmt(x: float) -> str:
        return f"{int(x)}" if x.is_integer() else f"{x:.4g}"

    if numeric:
        print(f"answers: min {fmt(result['answer_min'])}, median {fmt(result['answer_median'])}, "
              f"mean {result['answer_mean']:.1f}, max {fmt(result['answer_max'])}; "
              f"{100 * result['integer_answers']:.1f}% integers")
    if result["text_answers"]:  # names or other text (e.g. synthetic:world)
        print(f"answers: {result['text_answers']} not numbers, {result['distinct_answers']} distinct answers")
    print(f"question length: mean {result['question_words_mean']:.1f} words, max {result['question_words_max']}")
    return result


def run(config: DataCommandConfig) -> dict[str, Any]:
    ds = config.load()  # never empty: load_task_dataset raises DataError for a split without rows
    if config.action == "stats":
        return {"action": "stats", "source": config.source, "split": config.split, **stats(ds)}
    return {"action": "preview", "source": config.source, "split": config.split, "rows": preview(config, ds)}

