"""Errors a user can fix. The CLI prints them as one line (``error: ...``), never as a traceback."""


class AgenticRLError(Exception):
    """Base class: the message says what is wrong and, where possible, how to fix it."""


class ConfigError(AgenticRLError):
    """An unknown key, a value of the wrong type, or an inconsistent setting."""


class DataError(AgenticRLError):
    """A dataset that cannot be read or a row that is invalid (the message names file, row and field)."""


class ModelLoadError(AgenticRLError):
    """Weights or tokenizer that cannot be loaded (unreachable hub, missing directory, no chat template)."""


class RewardError(AgenticRLError):
    """A reward function that raised or returned something other than one finite number (or None) per completion."""


class TrainingError(AgenticRLError):
    """Training that cannot go on: the loss, the gradients or the weights became non-finite (NaN or inf)."""
