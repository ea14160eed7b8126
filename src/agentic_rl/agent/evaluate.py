"""Agent evaluation: the training loop's episodes, greedy, with tools executed — and the same model without tools.

For each held-out task the model plays one greedy episode in the environment (:func:`run_episodes`, the function
training uses). Reported next to accuracy (:func:`agentic_rl.rewards.is_correct` on the answer turn, as in
training): tool-call rate (episodes with at least one valid call), tool calls per episode, tool error rate (error
observations / calls), useful-call rate (grounded, new calls / calls), turns per episode, mean return, truncated rate.

*Without tools* means the plain (non-agent) system prompt, no tool schemas, and an environment whose tools are
disabled: a call still made gets ``error: no tools are available`` and the model must answer itself. The gap between
the two is what the tool is worth to this model.

Outputs in the run directory: ``agent_eval.json`` (both settings) and ``episodes_<setting>.jsonl`` (every episode:
messages, step rewards, return).

    python -m agentic_rl.agent.evaluate --model runs/quickstart-agentic/grpo/final --num-rows 200
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentic_rl.config import SEED_RANGE, check_range, setting
from agentic_rl.utils import log, run_dir, write_json, write_jsonl


@dataclass
class AgentEvalConfig:
    model: str = setting("", "model directory or hub id")
    output_dir: str | None = setting(None, "run directory (default runs/agent-eval)")
    dataset: str = setting("multiplication", "'multiplication' / 'arithmetic' (embedded synthetic test split) or a JSONL "
                                        "file of GSM8K-shaped rows")
    num_rows: int = setting(200, "held-out tasks to evaluate")
    heldout_rows: int = setting(200, "size of the synthetic held-out split (as in training)")
    data_seed: int = setting(0, "seed of the synthetic task split (as in training)")
    environment: str = setting("calculator", "environment: a registered name or module:factory")
    max_turns: int = setting(4, "assistant turns per episode")
    max_tool_calls: int = setting(3, "tool calls per episode")
    tools_in_prompt: bool = setting(True, "render the tool schemas into the prompt with the chat template")
    without_tools: bool = setting(True, "also evaluate the same model with tools disabled")
    max_turn_tokens: int = setting(48, "new tokens per assistant turn")
    max_completion_length: int = setting(192, "tokens after the prompt: all turns plus tool responses")
    batch_size: int = setting(64, "episodes generated together")

    def __post_init__(self) -> None:
        check_range(self, ("num_rows", "heldout_rows", "max_turns", "max_turn_tokens", "max_completion_length",
                           "batch_size"), 1)
        check_range(self, "max_tool_calls", 0)
        check_range(self, "data_seed", *SEED_RANGE)


def evaluate_agent(model, tokenizer, rows: list[dict[str, Any]], *, env_factory, tools: bool = True,
                   tools_in_prompt: bool = True, max_turn_tokens: int = 48, max_completion_length: int = 192,
                   batch_size: int = 64, system_prompt: str | None = None) -> tuple[dict[str, float], list[dict]]:
    """(stats, episodes) of greedy episodes on GSM8K-shaped ``rows``, with or without tools."""
    from agentic_rl.agent.rollout import RolloutSettings, episode_stats, run_episodes
    from agentic_rl.agent.tasks import agent_rows

    tasks = agent_rows(rows, tools=tools, system_prompt=system_prompt if tools else None)
    settings = RolloutSettings(max_turn_tokens=max_turn_tokens, max_completion_length=max_completion_length,
                               do_sample=False, tools_in_prompt=tools_in_prompt and tools)
    was_training = model.training
    model.eval()
    trajectories = []
    for start in range(0, len(tasks), batch_size):
        chunk = tasks[start:start + batch_size]
        envs = []
        for _ in chunk:
            env = env_factory()
            env.tools_enabled = tools
            envs.append(env)
        trajectories += run_episodes(model, tokenizer, envs, chunk, [t["prompt"] for t in chunk], settings)
    if was_training:
        model.train()
    episodes = [{"question": t["question"], "ground_truth": t["ground_truth"], **traj.summary()}
                for t, traj in zip(tasks, trajectories)]
    return episode_stats(trajectories), episodes


def run(config: AgentEvalConfig) -> dict[str, Any]:
    """Evaluate with tools (and, by default, without); returns ``{"with_tools": stats, "without_tools": stats}``."""
    from agentic_rl.agent.train import environment_factory, load_model, load_task_rows
    from agentic_rl.config import save_config

    out = run_dir(config.output_dir, "agent-eval")
    save_config(config, out / "config.yaml")
    model, tokenizer = load_model(config.model)
    rows = load_task_rows(config.dataset, "test", config.num_rows, heldout_rows=config.heldout_rows,
                          data_seed=config.data_seed)
    factory = environment_factory(_EnvSettings(config))
    result: dict[str, Any] = {"model": config.model, "num_rows": len(rows)}
    for name, tools in (("with_tools", True), ("without_tools", False)):
        if not tools and not config.without_tools:
            continue
        stats, episodes = evaluate_agent(model, tokenizer, rows, env_factory=factory, tools=tools,
                                         tools_in_prompt=config.tools_in_prompt,
                                         max_turn_tokens=config.max_turn_tokens,
                                         max_completion_length=config.max_completion_length,
                                         batch_size=config.batch_size)
        result[name] = stats
        write_jsonl(out / f"episodes_{name}.jsonl", episodes)
        log(f"agent eval {name}: " + "  ".join(f"{k}={v:.3f}" for k, v in stats.items()))
    write_json(out / "agent_eval.json", result)
    return result


class _EnvSettings:
    """The environment limits of an eval config (rewards do not matter for accuracy; training's defaults kept)."""

    def __init__(self, config: AgentEvalConfig):
        self.environment = config.environment
        self.max_turns = config.max_turns
        self.max_tool_calls = config.max_tool_calls
        self.tool_call_reward, self.tool_error_reward, self.answer_reward = 0.1, 0.0, 1.0


if __name__ == "__main__":  # pragma: no cover
    import sys

    from agentic_rl.cli import main

    sys.exit(main(["agent-eval", *sys.argv[1:]]))
