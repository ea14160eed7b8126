"""Datasets: GSM8K (hub or local files), the synthetic GSM8K-style task, custom datasets, and the shared formats."""

from agentic_rl.data.formats import (  # noqa: F401
    FINAL_ANSWER_PREFIX,
    SYSTEM_PROMPT,
    build_prompt,
    format_solution,
    rl_row,
    sft_row,
)
