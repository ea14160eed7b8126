"""The embedded tiny base model: a BPE tokenizer trained here and a small ``Qwen3ForCausalLM``.

Nothing is downloaded. The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on a text corpus
(one token per digit, so arithmetic is spelled digit by digit), with the special tokens and chat-template *shape* of
Qwen3: ``<|im_start|>role\\n...<|im_end|>`` turns, tool calls written as
``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` and tool results in ``<tool_response>`` blocks inside
a user turn. The model is a ``Qwen3ForCausalLM`` built from a small ``Qwen3Config`` (fp32, tied embeddings), so every
later stage runs the same code on it as on ``Qwen/Qwen3-0.6B``.

Public pieces:

* :func:`train_tokenizer` — corpus lines -> ``PreTrainedTokenizerFast`` with chat template (the pretrain stage
  passes :func:`agentic_rl.data.synthetic.default_tokenizer_corpus`);
* :func:`build_tiny_model` — a random-init ``Qwen3ForCausalLM`` from a preset (``micro``, ``tiny``, ``small``);
* :func:`build_qwen3_shape_model` — a random-init model with the real Qwen3-0.6B config *shape*, scaled down;
* :func:`save_model_dir` — model + tokenizer + generation config, loadable by plain ``from_pretrained``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from agentic_rl.errors import ConfigError

PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|endoftext|>"  # as in Qwen3: the id is recorded, never prepended
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # end of a turn = end of sequence for generation
EOS_TOKEN = IM_END
# Special (skipped when decoding with skip_special_tokens) and plain added tokens (kept, like Qwen3's).
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# ---------------------------------------------------------------------------------------------------------------
# Chat templates
# ---------------------------------------------------------------------------------------------------------------

# Shared Jinja pieces: the tools system block, one turn per message, tool results grouped in one user turn.
_TOOLS_BLOCK = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
)
_TOOL_CALLS = (
    "{%- if message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if (loop.first and content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}"
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}"
    "{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
)
_OTHER_TURNS = (
    "{%- elif message.role == 'user' or message.role == 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
)

#: The embedded model's template: Qwen3's shape without thinking blocks (``enable_thinking`` is accepted, ignored).
CHAT_TEMPLATE = (
    _TOOLS_BLOCK
    + "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    + _TOOL_CALLS
    + "{{- '<|im_end|>\\n' }}"
    + _OTHER_TURNS
    + "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: Qwen3's template shape *with* thinking blocks, for the Qwen3-0.6B stand-in: reasoning before ``</think>`` is cut
#: from past assistant turns, the last assistant turn is written as ``<think>\\n...\\n</think>\\n\\n`` + answer, and
#: ``enable_thinking=False`` puts an empty think block into the generation prompt (so prompt and prompt+completion
#: tokenize consistently for training).
QWEN3_STYLE_CHAT_TEMPLATE = (
    "{%- set ns2 = namespace(last_user=-1) %}"
    "{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns2.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    + _TOOLS_BLOCK
    + "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- set reasoning = '' %}"
    "{%- if message.reasoning_content is string %}{%- set reasoning = message.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns2.last_user and (loop.last or reasoning) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- endif %}"
    + _TOOL_CALLS
    + "{{- '<|im_end|>\\n' }}"
    + _OTHER_TURNS
    + "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# Text always added to the tokenizer's training corpus so that the chat scaffolding gets merged into few tokens.
_SCAFFOLD_TEXT = [
    "system\nuser\nassistant\n",
    "Final Answer: ",
    "# Tools\n\nYou may call one or more functions to assist with the user query.",
    '{"name": "calculator", "arguments": {"expression": "12 + 7"}}',
]

# ---------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512, *, chat_template: str = CHAT_TEMPLATE,
                    model_max_length: int = 1024):
    """Train a byte-level BPE on ``texts`` and wrap it as a ``PreTrainedTokenizerFast`` with a chat template.

    Digits are always split one per token (``Digits(individual_digits=True)``), so no number is a merged token.
    The 256 byte symbols are in the base alphabet, so any text (GSM8K, tool JSON) encodes without unknown tokens;
    ``vocab_size`` therefore must exceed 256 + the added tokens.

    >>> tok = train_tokenizer(["12 + 7 = 19"] * 50, vocab_size=300)
    >>> tok.tokenize("123")
    ['1', '2', '3']
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    n_added = len(SPECIAL_TOKENS) + len(MARKUP_TOKENS)
    if vocab_size < 256 + n_added + 1:
        raise ConfigError(f"vocab_size ({vocab_size}) must be at least {256 + n_added + 1}: the 256 byte symbols and "
                          f"{n_added} chat/tool tokens come first")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(MARKUP_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def corpus():
        yield from _SCAFFOLD_TEXT
        yield from texts

    tok.train_from_iterator(corpus(), trainer=trainer)
    # Markup tokens stay visible in decoded text (tool-call parsing needs them), as in Qwen3: added, not special.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = chat_template
    return fast


# ---------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------

#: Sizes sized for 2 CPU cores. ``tiny`` is the quickstart base (~3.4M parameters with a 1024-token vocabulary).
PRESETS: dict[str, dict[str, int]] = {
    "micro": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32),
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64),
    "small": dict(hidden_size=384, intermediate_size=1152, num_hidden_layers=6, num_attention_heads=6,
                  num_key_value_heads=2, head_dim=64),
}

#: ``Qwen/Qwen3-0.6B``'s config.json minus the sizes (vocab, width, depth): what "the Qwen3 shape" means here.
QWEN3_0_6B_SHAPE = dict(
    architectures=["Qwen3ForCausalLM"], attention_bias=False, attention_dropout=0.0, head_dim=128,
    hidden_act="silu", initializer_range=0.02, max_position_embeddings=40960, model_type="qwen3",
    num_attention_heads=16, num_key_value_heads=8, rms_norm_eps=1e-6, rope_theta=1000000.0,
    tie_word_embeddings=True, use_sliding_window=False, sliding_window=None,
)


def _token_ids(tokenizer) -> dict[str, int]:
    return dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.convert_tokens_to_ids(BOS_TOKEN))


def build_tiny_model(tokenizer, preset: str = "tiny", *, max_position_embeddings: int = 1024, seed: int | None = None,
                     **overrides):
    """A random-init fp32 ``Qwen3ForCausalLM`` sized by ``preset`` (``micro`` | ``tiny`` | ``small``).

    ``overrides`` replace preset values (e.g. ``num_hidden_layers=2``). Embeddings are tied, as in Qwen3-0.6B.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if preset not in PRESETS:
        raise ConfigError(f"unknown model preset '{preset}'; choose one of {', '.join(PRESETS)}")
    sizes = {**PRESETS[preset], **overrides}
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_position_embeddings,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_bias=False,
        use_sliding_window=False,
        **sizes,
        **_token_ids(tokenizer),
    )
    if seed is not None:
        torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    _set_generation_config(model, tokenizer)
    return model


def build_qwen3_shape_model(tokenizer, *, num_hidden_layers: int = 2, hidden_size: int = 128,
                            intermediate_size: int = 384, num_attention_heads: int = 2, num_key_value_heads: int = 1,
                            seed: int | None = None):
    """Random-init stand-in for ``Qwen/Qwen3-0.6B``: the real config keys and structure (head_dim 128, GQA 2:1,
    q/k-norm, tied embeddings, rope 1e6) with fewer layers, a narrower width and the given tokenizer's vocabulary."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    sized = ("model_type", "rope_theta", "num_attention_heads", "num_key_value_heads")
    shape = {k: v for k, v in QWEN3_0_6B_SHAPE.items() if k not in sized}
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads, max_window_layers=num_hidden_layers,
        rope_parameters={"rope_theta": QWEN3_0_6B_SHAPE["rope_theta"], "rope_type": "default"},
        **shape, **_token_ids(tokenizer),
    )
    if seed is not None:
        torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    _set_generation_config(model, tokenizer)
    return model


def _set_generation_config(model, tokenizer) -> None:
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS_TOKEN),
        do_sample=False,
    )


def save_model_dir(model, tokenizer, path: str | Path) -> Path:
    """Write model (safetensors), tokenizer with chat template and generation config (eos/pad) into ``path``.

    The directory loads with plain ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``.
    Weights holding NaN or inf are refused (:class:`~agentic_rl.errors.TrainingError`) before anything is written.
    """
    from agentic_rl.errors import TrainingError
    from agentic_rl.models.loading import nonfinite_parameters, save_model_atomically

    path = Path(path)
    bad = nonfinite_parameters(model)
    if bad:  # a model folder must never hold NaN/inf weights: every later stage would load garbage
        raise TrainingError(f"not saving {path}: the weights hold NaN/inf ({bad[0]}"
                            f"{f' and {len(bad) - 1} more' if len(bad) > 1 else ''})")
    if getattr(model, "generation_config", None) is None or model.generation_config.eos_token_id is None:
        _set_generation_config(model, tokenizer)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    return save_model_atomically(model, tokenizer, path)  # whole or not at all (a full disk leaves no half folder)
