"""agentic-rl: train LLM agents with reinforcement learning (SFT with LoRA, GRPO, tools), built on TRL."""

__version__ = "0.2.0"
