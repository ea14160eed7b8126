"""The prompt an SFT row trains on is token-for-token the prompt GRPO generates from and evaluation uses.

Each side is tokenized by the code that really does it: TRL's SFTTrainer dataset preparation (prompt = the tokens
its completion mask leaves out), TRL's GRPOTrainer prompt tokenization, and our evaluator's batched generation input.
Checked on the embedded tokenizer and on a Qwen3-shaped one (whose template has the thinking switch).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentic_rl.data import load_gsm8k, to_rl_dataset, to_sft_dataset
from agentic_rl.data.formats import chat_template_kwargs, render_prompt


def _sft_prompt_ids(model, tokenizer, sft_rows, tmp_path):
    from trl import SFTConfig, SFTTrainer

    rows = sft_rows.map(lambda _: {"chat_template_kwargs": chat_template_kwargs(False)})
    args = SFTConfig(output_dir=str(tmp_path / "sft"), use_cpu=True, bf16=False, report_to="none", max_steps=1,
                     completion_only_loss=True)
    trainer = SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer)
    out = []
    for example in trainer.train_dataset:
        # TRL folds the completion mask into the labels: prompt positions carry -100 (no loss).
        ids, labels = example["input_ids"], example["labels"]
        prompt_len = next(i for i, label in enumerate(labels) if label != -100)
        out.append(ids[:prompt_len])
        # Everything after the prompt is trained on, and it includes the end-of-sequence token.
        assert labels[prompt_len:] == ids[prompt_len:]
        assert tokenizer.eos_token_id in labels[prompt_len:]
    return out


def _grpo_prompt_ids(model, tokenizer, rl_rows, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), use_cpu=True, bf16=False, report_to="none",
                      per_device_train_batch_size=2, num_generations=2, max_completion_length=8,
                      chat_template_kwargs=chat_template_kwargs(False))
    trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                          args=args, train_dataset=rl_rows, processing_class=tokenizer)
    tokenized = trainer._tokenize_prompts([row["prompt"] for row in rl_rows])
    ids = tokenized["input_ids"] if isinstance(tokenized, dict) else tokenized[0]
    return [list(x) for x in ids]


def _eval_prompt_ids(tokenizer, rl_rows):
    texts = [render_prompt(tokenizer, row["prompt"]) for row in rl_rows]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


@pytest.mark.stage  # its model fixture is requested by name, which the default tiering cannot see
@pytest.mark.parametrize("fixture_name", ["tiny_model_dir", "qwen3_shape_dir"])
def test_sft_grpo_and_eval_see_the_same_prompt_tokens(fixture_name, request, gsm8k_dir, tmp_path):
    model_dir = request.getfixturevalue(fixture_name)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = load_gsm8k(str(gsm8k_dir / "test.jsonl"), max_samples=4, seed=1)
    sft_ids = _sft_prompt_ids(model, tokenizer, to_sft_dataset(rows), tmp_path)
    rl_rows = to_rl_dataset(rows)
    grpo_ids = _grpo_prompt_ids(model, tokenizer, rl_rows, tmp_path)
    eval_ids = _eval_prompt_ids(tokenizer, rl_rows)
    assert len(sft_ids) == len(eval_ids) == 4
    for sft, grpo, ev in zip(sft_ids, grpo_ids, eval_ids):
        grpo = [t for t in grpo if t != tokenizer.pad_token_id]  # GRPO pads the batch (left); padding is not prompt
        assert sft == ev
        assert grpo == ev
    # The thinking switch is really off: Qwen3's template then closes an empty think block in the prompt.
    if fixture_name == "qwen3_shape_dir":
        assert "<think>\n\n</think>" in tokenizer.decode(eval_ids[0])
