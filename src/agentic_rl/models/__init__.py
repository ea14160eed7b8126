"""Model loading and the embedded tiny base model (tokenizer + Qwen3 architecture). Imports torch lazily."""

from agentic_rl.models.loading import count_parameters, load_model_and_tokenizer, load_tokenizer, resolve_dtype
from agentic_rl.models.tiny import build_qwen3_shape_model, build_tiny_model, save_model_dir, train_tokenizer

__all__ = ["load_model_and_tokenizer", "load_tokenizer", "resolve_dtype", "count_parameters", "train_tokenizer",
           "build_tiny_model", "build_qwen3_shape_model", "save_model_dir"]
