"""Learning from every GRPO step: difficulty selection, zero-variance group refill, an SFT anchor loss, tied failures.

GRPO learns only from groups whose rewards differ: a group in which all ``num_generations`` completions score the
same has zero advantage everywhere. At a few-percent sampled accuracy most groups are all-wrong, so most of each step
is wasted. TRL 1.16 has no remedy; these options of the GRPO stage supply the ones the field relies on:

* **Difficulty selection** (before training): estimate every candidate prompt's pass rate from ``k`` samples of the
  starting policy at the training temperature (``k`` sampled episodes in an environment) and keep the prompts whose
  rate lies in a band (e.g. 0.1-0.9), where a group is likely to hold both right and wrong answers
  (:func:`estimate_pass_rates`, :func:`select_by_pass_rate`).
* **Zero-variance filtering with refill** (every generation batch, DAPO's dynamic sampling): drop the groups whose
  rewards all tie and generate replacement prompts until the batch is full of groups with signal, at most
  ``refill_max_draws`` extra generation rounds; what is still missing then is filled with dropped groups, so the batch
  shape never changes (:class:`agentic_rl.train.grpo_trainer.SignalGRPOTrainer`).
* **SFT anchor**: ``sft_loss_weight`` x the demonstrations' token-level negative log-likelihood is added to the GRPO
  loss of every micro-step, to stop the policy drifting from what SFT taught.
* **Tied failures pushed down** (episodes in an environment): a group whose episodes all fail with one reward gets
  ``tied_failure_weight`` x its reward's batch-normalised advantage instead of none
  (:func:`tied_failure_advantages`).

Logged (our names): ``grpo/signal/dropped_group_fraction`` (groups of the first draw with no signal),
``grpo/signal/refill_draws`` (extra generation rounds), ``grpo/signal/final_zero_std_fraction`` (groups without signal
left in the batch that trains), ``grpo/signal/sft_loss``, ``grpo/signal/tied_failure_fraction`` (episodes pushed
down).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agentic_rl.config import check_range
from agentic_rl.errors import ConfigError
from agentic_rl.utils import log

# ---------------------------------------------------------------------------------------------------------------
# Difficulty selection
# ---------------------------------------------------------------------------------------------------------------


def estimate_pass_rates(model, tokenizer, rows: list[dict[str, Any]], *, samples: int, temperature: float,
                        max_new_tokens: int, seed: int = 0, env_factory=None, tools_in_prompt: bool = True,
                        max_turn_tokens: int = 48) -> list[float]:
    """Per row: the share of ``samples`` completions (sampled at ``temperature``) that are correct (strict). With
    ``env_factory``, the share of ``samples`` sampled episodes in that environment, with its tools, that it scores
    correct (``max_new_tokens`` then bounds a whole episode, as ``max_completion_length`` does in training)."""
    if env_factory is not None:
        from agentic_rl.eval.episodes import evaluate_episodes

        _, episodes = evaluate_episodes(model, tokenizer, rows, env_factory, tools=True,
                                        tools_in_prompt=tools_in_prompt, max_turn_tokens=max_turn_tokens,
                                        max_completion_length=max_new_tokens, num_samples=samples,
                                        temperature=temperature, seed=seed, progress="difficulty selection")
        correct = [0] * len(rows)
        for episode in episodes:
            correct[episode["index"]] += bool(episode["correct"])
        return [c / samples for c in correct]
    from agentic_rl.models.generate import generate_batched
    from agentic_rl.rewards import is_correct

    generations = generate_batched(model, tokenizer, [r["prompt"] for r in rows], max_new_tokens=max_new_tokens,
                                   temperature=temperature, num_samples=samples, seed=seed)
    return [sum(is_correct(g.text, str(r["ground_truth"]), "strict") for g in gens) / samples
            for r, gens in zip(rows, generations)]


def select_by_pass_rate(rows: list[dict[str, Any]], rates: list[float], low: float, high: float
                        ) -> list[dict[str, Any]]:
    """The rows whose estimated pass rate lies in ``[low, high]``, in their order, each with its ``pass_rate``."""
    return [{**row, "pass_rate": rate} for row, rate in zip(rows, rates) if low <= rate <= high]


def pass_rate_histogram(rates: list[float], samples: int) -> dict[str, int]:
    """``{"0/4": 170, "1/4": 20, ...}``: how many prompts had each number of correct samples."""
    counts = {f"{c}/{samples}": 0 for c in range(samples + 1)}
    for rate in rates:
        counts[f"{round(rate * samples)}/{samples}"] += 1
    return counts


# ---------------------------------------------------------------------------------------------------------------
# Failures every sample repeats
# ---------------------------------------------------------------------------------------------------------------


def tied_failure_advantages(rewards, correct, num_generations: int, weight: float, scale: bool):
    """Advantages (N,) for the groups of ``num_generations`` episodes that all fail (``correct`` false) with the same
    reward: ``weight * min(0, (r - mean) / (std + 1e-4))`` with the batch's mean and standard deviation of
    ``rewards`` (without ``scale``, not divided; never positive: a failure is not reinforced, even where most of the
    batch scores less), zero for every other completion. GRPO gives such a group no signal (reward minus group mean
    is zero), so a mistake the policy makes in every sample is never pushed down; this is negative-sample
    reinforcement of it (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM
    Reasoning"), which moves probability from the repeated choice to the others the model gives some weight."""
    import torch

    groups = rewards.view(-1, num_generations)
    tied = (groups.max(dim=1).values - groups.min(dim=1).values) == 0
    failed = ~correct.view(-1, num_generations).any(dim=1)
    mean = rewards.mean()
    scaled = (rewards - mean) / (rewards.std() + 1e-4) if scale and rewards.numel() > 1 else rewards - mean
    mask = (tied & failed).repeat_interleave(num_generations)
    return torch.where(mask, weight * scaled.clamp(max=0.0), torch.zeros_like(rewards))


# ---------------------------------------------------------------------------------------------------------------
# Generation batches: select groups, concatenate batches of different widths
# ---------------------------------------------------------------------------------------------------------------

#: Keys of TRL's generation batch that are padded on the left (prompts); every other (B, T) tensor is right-padded.
_LEFT_PADDED = ("prompt_ids", "prompt_mask")


def _pad_value(key: str, pad_token_id: int) -> float:
    if key in ("prompt_ids", "completion_ids"):
        return pad_token_id
    if key == "turn_contexts":
        return -1  # a turn that is not there (agentic_rl.train.logprobs.TURN_CONTEXTS)
    if key == "tool_mask":
        return 1  # TRL pads the tool mask with 1 (padding is masked by completion_mask anyway)
    return 0


def group_has_signal(advantages, num_generations: int):
    """Bool per group: some completion of the group has a non-zero advantage (the rewards did not all tie); the
    advantages are one per completion (B,) or one per completion token (B, T)."""
    return advantages.reshape(advantages.shape[0] // num_generations, -1).abs().sum(dim=1) > 0


def select_rows(batch: dict[str, Any], rows) -> dict[str, Any]:
    """The generation batch restricted to ``rows`` (a 1-D index tensor) along the batch dimension."""
    size = batch["advantages"].shape[0]
    out = {}
    for key, value in batch.items():
        is_batched = hasattr(value, "shape") and value.dim() >= 1 and value.shape[0] == size
        out[key] = value.index_select(0, rows.to(value.device)) if is_batched else value
    return out


def concat_batches(parts: list[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
    """Concatenate generation batches along the batch dimension, re-padding (B, T) tensors to the widest part.

    A list with one entry per row in every part is concatenated too; any other value (a scalar, a setting) is
    the first part's. ``num_items_in_batch`` (the loss normaliser: completion tokens that carry loss) is recomputed
    for the result.
    """
    import torch

    out: dict[str, Any] = {}
    sizes = [p["advantages"].shape[0] for p in parts]
    for key, first in parts[0].items():
        if key == "num_items_in_batch":
            continue
        if isinstance(first, list) and all(isinstance(p.get(key), list) and len(p[key]) == n
                                           for p, n in zip(parts, sizes)):
            out[key] = [row for p in parts for row in p[key]]
            continue
        if not (hasattr(first, "shape") and first.dim() >= 1 and first.shape[0] == sizes[0]):
            out[key] = first
            continue
        values = [p[key] for p in parts]
        if first.dim() >= 2:
            width = max(v.shape[1] for v in values)
            padded = []
            for v in values:
                missing = width - v.shape[1]
                if missing:
                    fill = torch.full((v.shape[0], missing, *v.shape[2:]), _pad_value(key, pad_token_id),
                                      dtype=v.dtype, device=v.device)
                    v = torch.cat([fill, v] if key in _LEFT_PADDED else [v, fill], dim=1)
                padded.append(v)
            values = padded
        out[key] = torch.cat(values, dim=0)
    loss_mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
    out["num_items_in_batch"] = loss_mask.sum()
    return out


# ---------------------------------------------------------------------------------------------------------------
# SFT anchor
# ---------------------------------------------------------------------------------------------------------------

def tokenize_demonstrations(tokenizer, sft_rows: list[dict[str, Any]],
                            max_length: int) -> list[tuple[list[int], list[int]]]:
    """Each SFT row (conversational ``prompt`` + ``completion``) as (token ids, labels): -100 on the prompt's tokens,
    the completion's own ids after them."""
    from agentic_rl.data.formats import render_prompt

    out = []
    for row in sft_rows:
        prompt = render_prompt(tokenizer, row["prompt"])
        # The assistant turn as the chat template closes it: the text, then the end-of-turn token (the EOS).
        full = prompt + row["completion"][0]["content"] + (tokenizer.eos_token or "")
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        ids = tokenizer(full, add_special_tokens=False)["input_ids"][:max_length]
        if len(ids) > len(p_ids):
            out.append((ids, [-100] * len(p_ids) + ids[len(p_ids):]))
    return out


def select_groups(batch: dict[str, Any], groups, num_generations: int) -> dict[str, Any]:
    """The generation batch restricted to whole groups (indices of groups, each ``num_generations`` rows)."""
    import torch

    groups = torch.as_tensor(groups, dtype=torch.long).flatten()
    rows = (groups.unsqueeze(1) * num_generations + torch.arange(num_generations)).flatten()
    return select_rows(batch, rows)


def select_training_prompts(model, tokenizer, train, config, env_factory=None):
    """Difficulty selection: the training prompts whose pass rate, estimated from ``select_samples`` samples of the
    starting policy at the training temperature (episodes in the environment of ``env_factory`` when given), lies in
    the band; returns ``(dataset, record)`` where the record (written to ``difficulty.json``) holds the band, the
    counts and the histogram of estimated pass rates."""
    import datasets

    started = time.time()
    rows = train.to_list()[: config.select_candidates or None]
    low, high = config.select_pass_rate_low, config.select_pass_rate_high
    episode_settings = ({"env_factory": env_factory, "tools_in_prompt": config.tools_in_prompt,
                         "max_turn_tokens": config.max_turn_tokens} if env_factory is not None else {})
    rates = estimate_pass_rates(model, tokenizer, rows, samples=config.select_samples, temperature=config.temperature,
                                max_new_tokens=config.max_completion_length, seed=config.seed, **episode_settings)
    kept = select_by_pass_rate(rows, rates, low, high)
    log_selection(rates, len(kept), config.select_samples, low, high)
    histogram = pass_rate_histogram(rates, config.select_samples)
    if not kept:
        raise ConfigError(f"difficulty selection kept none of {len(rows)} prompts (correct samples per prompt: "
                          f"{histogram}); widen select_pass_rate_low/high, raise select_candidates or "
                          "select_samples, or set select_samples: 0")
    record = {"candidates": len(rows), "kept": len(kept), "band": [low, high], "samples": config.select_samples,
              "histogram": histogram, "seconds": round(time.time() - started, 1)}
    return datasets.Dataset.from_list(kept), record


def demonstrations_for(train, tokenizer, config, env_factory=None) -> list[tuple[list[int], list[int]]]:
    """The SFT anchor's demonstrations, tokenized: with ``sft_anchor_run``, that SFT run's own training rows
    (:func:`sft_run_demonstrations`); else the training prompts' reference solutions — in an environment its
    demonstration episodes (``env.demonstration(task)``), else steps first, then ``Final Answer: N``. Each is
    ``(token ids, labels)``, -100 where no loss goes (the prompt; an episode's tool and feedback messages)."""
    from agentic_rl.data.custom import parse_answer_text
    from agentic_rl.data.formats import completion_message, format_solution

    if config.sft_anchor_run:
        return sft_run_demonstrations(config.sft_anchor_run, tokenizer)
    if env_factory is not None:
        from agentic_rl.agent.env import demonstrated
        from agentic_rl.agent.tasks import environment_examples
        from agentic_rl.data.formats import task_with_data

        env = env_factory()
        tasks = [{"answer": row.get("full_answer", ""), **row} for row in train  # the RL rows' reference solution
                 if demonstrated(env, task_with_data(row))]
        if not tasks:  # here, before the run directory is claimed, not when the trainer finds none
            raise ConfigError(f"sft_loss_weight needs demonstrations, and the environment demonstrates none of the "
                              f"{len(train)} training rows; set sft_loss_weight: 0 or sft_anchor_run")
        examples = environment_examples(tokenizer, env, tasks, tools_in_prompt=config.tools_in_prompt)
        return [(list(e["input_ids"]), list(e["labels"])) for e in examples]
    rows = []
    for row in train:
        steps, _ = parse_answer_text(str(row.get("full_answer") or ""))
        rows.append({"prompt": row["prompt"],
                     "completion": completion_message(format_solution(steps, str(row["ground_truth"])))})
    return tokenize_demonstrations(tokenizer, rows, max_length=1024)


def sft_run_demonstrations(run_dir: str, tokenizer) -> list[tuple[list[int], list[int]]]:
    """The training rows of the SFT run in ``run_dir``, rebuilt from the settings it recorded (``config.yaml``) as
    that stage builds them: whole demonstration episodes with their labels in an environment, else the rows its
    steps reach (imperfect ones included) — what the compute-matched control continues to train on."""
    from agentic_rl.config import load_config
    from agentic_rl.train.sft import SFTConfig, build_environment_dataset, build_sft_dataset, rows_reached

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"sft_anchor_run: {path} not found; point it at an SFT run's folder (it holds config.yaml)")
    sft = load_config(SFTConfig, path)
    if sft.environment is not None:
        from agentic_rl.agent.settings import build_environment

        dataset, _ = build_environment_dataset(sft, build_environment(sft), tokenizer)
        return [(list(row["input_ids"]), list(row["labels"])) for row in dataset]
    return tokenize_demonstrations(tokenizer, list(rows_reached(build_sft_dataset(sft), sft)), max_length=1024)


def check_signal_settings(config: Any) -> None:
    """The GRPO stage's signal settings: refill draws, the difficulty band, the tied-failure weight (which needs
    episodes, whose correctness it reads, and trajectory credit, whose advantages it adds to), retry groups (which
    need episodes)."""
    if config.refill_max_draws < 0:
        raise ConfigError(f"refill_max_draws must be >= 0 (0 = off), got {config.refill_max_draws}")
    low, high = config.select_pass_rate_low, config.select_pass_rate_high
    if not 0.0 <= low <= high <= 1.0:
        raise ConfigError(f"difficulty band must satisfy 0 <= select_pass_rate_low ({low}) <= "
                          f"select_pass_rate_high ({high}) <= 1")
    check_range(config, ("select_samples", "sft_loss_weight", "tied_failure_weight"), 0)  # 0: off
    if config.tied_failure_weight and (config.environment is None or config.credit_assignment != "trajectory"):
        raise ConfigError("tied_failure_weight needs episodes in an environment (their correctness) and "
                          "credit_assignment: trajectory; set it to 0")
    if config.retry_groups and config.environment is None:
        raise ConfigError("retry_groups continues episodes after a wrong answer: it needs an environment "
                          "(--environment)")


def log_selection(rates: list[float], kept: int, samples: int, low: float, high: float) -> None:
    log(f"difficulty selection: {kept} of {len(rates)} prompts have a pass rate in [{low}, {high}] "
        f"({samples} samples each); histogram {pass_rate_histogram(rates, samples)}")
