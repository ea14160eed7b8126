"""Tools for agent frameworks: :class:`~agentic_rl.tools.rl_training.RLTrainingTool` (``rl_training``) exposes
training, datasets, rewards, evaluation and status as one JSON-in / JSON-out tool (a hello-agents ``Tool`` when that
package is installed)."""


def __getattr__(name: str):
    # Lazy: importing the tool imports hello-agents when it is installed (a few seconds).
    if name in ("RLTrainingTool", "register"):
        from agentic_rl.tools import rl_training

        return getattr(rl_training, name)
    raise AttributeError(f"module 'agentic_rl.tools' has no attribute {name!r}")


__all__ = ["RLTrainingTool", "register"]
