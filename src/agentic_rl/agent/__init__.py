"""Agentic RL: multi-turn tool use with per-step rewards.

* :mod:`~agentic_rl.agent.env` — the environment API (``reset(task)``, ``step(text) -> StepResult``), the generic
  :class:`ToolEnvironment`, and the environment registry;
* :mod:`~agentic_rl.agent.tools` — tools as typed functions (schema from the signature) and the tool registry;
* :mod:`~agentic_rl.agent.tool_format` — Qwen3-format tool calls: parse, render, and the chat-template token pieces;
* :mod:`~agentic_rl.agent.calculator_env` — the calculator tool and environment;
* :mod:`~agentic_rl.agent.self_correct_env` — self-correction: attempts checked by the verifier, feedback, retries;
* :mod:`~agentic_rl.agent.trl_env` — environments written in TRL's ``environment_factory`` shape;
* :mod:`~agentic_rl.agent.rollout` — the multi-turn loop (training and evaluation), env masks, TRL ``rollout_func``;
* :mod:`~agentic_rl.agent.tasks` — task rows and tool-use demonstrations;
* :mod:`~agentic_rl.agent.settings` — the environment settings the stages share (``EnvironmentSettings``).

This package is the library; the stages are the main ones with ``--environment``: ``agentic-rl sft`` (tool-use
demonstrations, :mod:`agentic_rl.train.sft`), ``grpo`` (multi-turn episodes, :mod:`agentic_rl.train.grpo`), ``eval``
(with and without tools, :mod:`agentic_rl.eval.evaluate`), and ``agentic-rl quickstart --preset agentic``.
"""

from agentic_rl.agent.env import (ENVIRONMENT_SETTINGS, ENVIRONMENTS, Environment, StepResult, ToolEnvironment,
                                  environment_factory, environment_settings_used, make_environment,
                                  register_environment, trajectory_return)
from agentic_rl.agent.tools import TOOLS, Tool, ToolError, get_tool, register_tool

__all__ = ["ENVIRONMENT_SETTINGS", "environment_factory", "environment_settings_used", "ENVIRONMENTS", "Environment",
           "StepResult", "ToolEnvironment", "make_environment", "register_environment", "trajectory_return", "TOOLS",
           "Tool", "ToolError", "get_tool", "register_tool"]
