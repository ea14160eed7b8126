"""Evaluation in an environment: episodes with the training loop's own rollout, with tools and without.

For each held-out problem the model plays one greedy episode (:func:`agentic_rl.agent.rollout.run_episodes`, the
function GRPO samples with), or ``num_samples`` sampled episodes at ``temperature`` (seeded: the same seed plays the
same episodes). Reported next to accuracy (the environment's verdict, which for the shipped environments is
:func:`agentic_rl.rewards.is_correct` on the answer turn, as in training; with samples, the mean over all episodes,
an estimate of pass@1) and, when sampling, pass@k per problem (:func:`agentic_rl.eval.metrics.pass_at_k`): tool-call
rate (episodes with at least one valid call), tool calls per episode, tool error rate (error observations / calls),
useful-call rate, turns per episode, mean return, truncated rate, and the environment's own per-episode numbers
(``self_correct``: attempts and ``success_at_k``), all over every episode played.

*Without tools* is the same model under the standard system prompt with no tool schemas and the environment's tools
disabled (a call still made gets ``error: no tools are available``; ``self_correct`` allows one attempt): the gap
between the two settings is what the environment is worth to the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def evaluate_episodes(model, tokenizer, rows: list[dict[str, Any]], env_factory: Callable[[], Any], *,
                      tools: bool = True, tools_in_prompt: bool = True, max_turn_tokens: int = 48,
                      max_completion_length: int = 192, batch_size: int = 64, system_prompt: str | None = None,
                      num_samples: int = 1, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                      pass_at_k: list[int] | tuple[int, ...] = (), progress: str | None = None,
                      ) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """``(stats, episodes)`` of ``num_samples`` episodes per row: greedy with ``temperature`` 0 (one episode), else
    sampled at ``temperature`` / ``top_p`` from torch's random streams seeded with ``seed`` (the caller's streams are
    restored afterwards). ``stats`` holds :func:`agentic_rl.agent.rollout.episode_stats` over every episode and, when
    sampling, ``pass@k`` for each k of ``pass_at_k`` (k <= ``num_samples``); ``episodes`` one record per episode, in
    row order with a row's samples adjacent, with its row ``index`` and ``sample`` number; a wrong episode with tools
    in an environment with the calculator, whose row has reference steps, also gets ``category`` and
    ``category_reason`` (:func:`agentic_rl.eval.error_analysis.categorize_episode`), and likewise one in an
    environment with a ``search`` tool whose row has a lookup ``chain``
    (:func:`agentic_rl.eval.error_analysis.categorize_search_episode`).

    ``rows`` need ``question`` and ``ground_truth``; with tools a row's ``prompt`` (messages) is used as is, otherwise
    the prompt is built from the question with ``system_prompt`` (the system message itself, as
    :func:`agentic_rl.data.formats.resolve_system_prompt` resolves a stage's setting; None: no system message).
    ``batch_size`` rows are played in lock-step at a time, all their samples together. The model is put in eval mode
    and back in train mode if it was training. ``progress``: the label of a progress bar over the episodes (None: no
    bar).
    """
    import sys

    from tqdm.auto import tqdm

    from agentic_rl.agent.rollout import RolloutSettings, episode_stats, run_episodes
    from agentic_rl.data.formats import build_prompt
    from agentic_rl.eval.error_analysis import episode_classifier
    from agentic_rl.eval.metrics import pass_at_k as pass_at_k_of
    from agentic_rl.models.generate import seeded_sampling

    sampling = temperature > 0
    if num_samples < 1 or (num_samples > 1 and not sampling):
        raise ValueError(f"num_samples ({num_samples}) > 1 needs a temperature > 0, and at least 1")
    bad = [k for k in pass_at_k if not 1 <= k <= num_samples]
    if bad:
        raise ValueError(f"pass@k needs 1 <= k <= num_samples ({num_samples}), got {bad}")

    def prompt_of(row: dict[str, Any]) -> list[dict[str, str]]:
        if tools and isinstance(row.get("prompt"), list):
            return row["prompt"]
        return build_prompt(row["question"], system_prompt)

    settings = RolloutSettings(max_turn_tokens=max_turn_tokens, max_completion_length=max_completion_length,
                               do_sample=sampling, temperature=temperature if sampling else 1.0, top_p=top_p,
                               tools_in_prompt=tools_in_prompt and tools)
    was_training = model.training
    model.eval()
    trajectories = []
    classify = None
    bar = tqdm(total=len(rows) * num_samples, desc=progress, unit="episode", disable=progress is None,
               file=sys.stderr)
    try:
        with seeded_sampling(model, seed, enabled=sampling):
            for start in range(0, len(rows), batch_size):
                chunk = [row for row in rows[start:start + batch_size] for _ in range(num_samples)]
                envs = []
                for _ in chunk:
                    env = env_factory()
                    env.tools_enabled = tools
                    envs.append(env)
                if start == 0:  # every environment of the factory offers the same tools
                    classify = episode_classifier(envs[0])
                trajectories += run_episodes(model, tokenizer, envs, [dict(r) for r in chunk],
                                             [prompt_of(r) for r in chunk], settings)
                bar.update(len(chunk))
    finally:
        bar.close()
        if was_training:
            model.train()
    episodes = []
    for e, t in enumerate(trajectories):  # episode e plays row e // num_samples
        row = rows[e // num_samples]
        episodes.append({"index": e // num_samples, "sample": e % num_samples, "question": row.get("question"),
                         "ground_truth": str(row.get("ground_truth")), **t.summary()})
        category = classify(episodes[-1], row) if classify and not t.correct else None
        if category is not None:
            episodes[-1]["category"], episodes[-1]["category_reason"] = category
    stats = episode_stats(trajectories)
    if sampling:
        correct = [sum(t.correct for t in trajectories[i * num_samples:(i + 1) * num_samples])
                   for i in range(len(rows))]
        for k in sorted(set(pass_at_k)):
            stats[f"pass@{k}"] = sum(pass_at_k_of(num_samples, c, k) for c in correct) / max(len(rows), 1)
    return stats, episodes
