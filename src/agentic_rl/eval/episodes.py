"""Evaluation in an environment: greedy episodes with the training loop's own rollout, with tools and without.

For each held-out problem the model plays one greedy episode (:func:`agentic_rl.agent.rollout.run_episodes`, the
function GRPO samples with). Reported next to accuracy (the environment's verdict, which for the shipped environments
is :func:`agentic_rl.rewards.is_correct` on the answer turn, as in training): tool-call rate (episodes with at least one
valid call), tool calls per episode, tool error rate (error observations / calls), useful-call rate, turns per
episode, mean return, truncated rate, and the environment's own per-episode numbers (``self_correct``: attempts and
``success_at_k``).

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
                      progress: str | None = None) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """``(stats, episodes)`` of one greedy episode per row.

    ``rows`` need ``question`` and ``ground_truth``; with tools a row's ``prompt`` (messages) is used as is, otherwise
    the prompt is built from the question with ``system_prompt`` (the system message itself, as
    :func:`agentic_rl.data.formats.resolve_system_prompt` resolves a stage's setting; None: no system message).
    The model is put in eval mode and back in train mode if it was training. ``progress``: the label of a progress
    bar over the episodes (None: no bar).
    """
    import sys

    from tqdm.auto import tqdm

    from agentic_rl.agent.rollout import RolloutSettings, episode_stats, run_episodes
    from agentic_rl.data.formats import build_prompt

    def prompt_of(row: dict[str, Any]) -> list[dict[str, str]]:
        if tools and isinstance(row.get("prompt"), list):
            return row["prompt"]
        return build_prompt(row["question"], system_prompt)

    settings = RolloutSettings(max_turn_tokens=max_turn_tokens, max_completion_length=max_completion_length,
                               do_sample=False, tools_in_prompt=tools_in_prompt and tools)
    was_training = model.training
    model.eval()
    trajectories, prompts = [], []
    bar = tqdm(total=len(rows), desc=progress, unit="episode", disable=progress is None, file=sys.stderr)
    try:
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            envs = []
            for _ in chunk:
                env = env_factory()
                env.tools_enabled = tools
                envs.append(env)
            chunk_prompts = [prompt_of(r) for r in chunk]
            prompts += chunk_prompts
            trajectories += run_episodes(model, tokenizer, envs, [dict(r) for r in chunk], chunk_prompts, settings)
            bar.update(len(chunk))
    finally:
        bar.close()
        if was_training:
            model.train()
    episodes = [{"question": r.get("question"), "ground_truth": str(r.get("ground_truth")), **t.summary()}
                for r, t in zip(rows, trajectories)]
    return episode_stats(trajectories), episodes
