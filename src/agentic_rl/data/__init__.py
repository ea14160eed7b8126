"""Datasets: GSM8K (hub or local files), the synthetic GSM8K-style task, custom datasets, and the shared formats."""

from agentic_rl.data.custom import load_task_dataset, register_dataset  # noqa: F401
from agentic_rl.data.formats import (  # noqa: F401
    FINAL_ANSWER_PREFIX,
    SYSTEM_PROMPT,
    build_prompt,
    format_solution,
    rl_row,
    sft_row,
)
from agentic_rl.data.gsm8k import (  # noqa: F401
    is_number,
    load_gsm8k,
    normalize_number,
    parse_gsm8k_answer,
    to_rl_dataset,
    to_sft_dataset,
)
from agentic_rl.data.synthetic import (  # noqa: F401
    arithmetic_corpus,
    generate_synthetic,
    multiplication_task,
    synthetic_splits,
)
