"""The shared prompt builder and answer format (data/formats.py)."""

import pytest

from agentic_rl.data.formats import (FINAL_ANSWER_PREFIX, SYSTEM_PROMPT, build_prompt, chat_template_kwargs,
                                     completion_message, format_solution, render_prompt, rl_row, sft_row)

# A Qwen3-like template: the generation prompt closes an empty think block when thinking is off.
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>"
            "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}{% endif %}")


def make_chat_tokenizer(folder=None):
    """A small word-level tokenizer with a chat template (no download); saved to ``folder`` when given."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<eos>": 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>")
    fast.chat_template = TEMPLATE
    if folder is not None:
        fast.save_pretrained(folder)
    return fast


def test_build_prompt_system_then_user():
    assert build_prompt("  What is 2 + 2? \n") == [{"role": "system", "content": SYSTEM_PROMPT},
                                                   {"role": "user", "content": "What is 2 + 2?"}]
    assert build_prompt("q", system_prompt=None) == [{"role": "user", "content": "q"}]
    assert build_prompt("q", system_prompt="Be brief.")[0]["content"] == "Be brief."
    assert FINAL_ANSWER_PREFIX in SYSTEM_PROMPT


def test_format_solution_one_step_per_line_then_final_answer():
    assert format_solution(["48 / 2 = 24", " ", "48 + 24 = 72 "], "72") == "48 / 2 = 24\n48 + 24 = 72\nFinal Answer: 72"
    assert format_solution([], "5") == "Final Answer: 5"
    assert completion_message("x") == [{"role": "assistant", "content": "x"}]


def test_row_fields_are_exact():
    row = sft_row("What is 2 + 2?", ["2 + 2 = 4"], "4")
    assert list(row) == ["prompt", "completion"]
    assert row["completion"] == [{"role": "assistant", "content": "2 + 2 = 4\nFinal Answer: 4"}]
    with_text = sft_row("What is 2 + 2?", ["2 + 2 = 4"], "4", with_text=True)
    assert list(with_text) == ["prompt", "completion", "text"] and with_text["text"] == "2 + 2 = 4\nFinal Answer: 4"
    rl = rl_row("What is 2 + 2?", "4", "2 + 2 = <<2+2=4>>4\n#### 4")
    assert list(rl) == ["question", "prompt", "ground_truth", "full_answer"]
    assert rl["prompt"] == row["prompt"] == build_prompt("What is 2 + 2?")


@pytest.mark.parametrize("thinking", [False, True])
def test_render_prompt_uses_the_chat_template_and_thinking_switch(thinking):
    tokenizer = make_chat_tokenizer()
    text = render_prompt(tokenizer, build_prompt("What is 2 + 2?"), enable_thinking=thinking)
    assert text.startswith(f"<|system|>{SYSTEM_PROMPT}<|end|>\n<|user|>What is 2 + 2?<|end|>\n<|assistant|>")
    assert text.endswith("<think></think>") is (not thinking)
    assert chat_template_kwargs() == {"enable_thinking": False}
    assert chat_template_kwargs(True) == {"enable_thinking": True}


def test_last_message_index_finds_the_last_message_of_a_role():
    from agentic_rl.data.formats import last_message_index

    chat = [*build_prompt("first?"), {"role": "assistant", "content": "4"}, {"role": "user", "content": "then?"}]
    assert last_message_index(chat) == 3 and last_message_index(chat, "assistant") == 2
    assert last_message_index(chat, "tool") is None and last_message_index("plain text prompt") is None
