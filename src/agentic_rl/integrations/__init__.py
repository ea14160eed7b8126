"""Agent frameworks driving agentic-rl: :mod:`agentic_rl.integrations.hello_agents` holds ``rl_training``, the
training stages as one JSON-in / JSON-out tool (a hello-agents ``Tool`` when that package is installed) that also
takes the Hello-Agents book's calls as the book writes them."""


def __getattr__(name: str):
    # Lazy: importing the tool imports hello-agents when it is installed (a few seconds).
    if name in ("RLTrainingTool", "register"):
        from agentic_rl.integrations import hello_agents

        return getattr(hello_agents, name)
    raise AttributeError(f"module 'agentic_rl.integrations' has no attribute {name!r}")


__all__ = ["RLTrainingTool", "register"]
