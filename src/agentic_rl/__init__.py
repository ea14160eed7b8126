"""agentic-rl: train LLM agents with reinforcement learning (SFT with LoRA, GRPO, tools), built on TRL."""

import os

__version__ = "0.2.0"

#: Entries kept by each of the CPU kernel caches that bf16 matmuls fill: oneDNN's primitive cache and ideep's
#: (PyTorch's oneDNN wrapper) computation cache, both 1024 by default. Each new sequence length adds entries, so
#: with variable-length batches they grow by hundreds of MB over a stage (the quickstart's bf16 SFT: 1.85 GB peak by
#: default, 0.83 GB at 64, same weights bit for bit, no slower; `benchmarks/bench_cpu_kernel_cache.py`). Both
#: libraries read the variables at their first use, so setting them here, before any matmul, is enough; a value the
#: user set is kept.
CPU_KERNEL_CACHE_CAPACITY = "64"
CPU_KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
for _variable in CPU_KERNEL_CACHE_VARIABLES:
    os.environ.setdefault(_variable, CPU_KERNEL_CACHE_CAPACITY)
del _variable
