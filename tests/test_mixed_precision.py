"""bf16 mixed precision in the training stages: on by default where the hardware computes bf16 (a GPU that supports it,
a CPU with AVX512-BF16 or AMX-BF16), fp32 weights, the matmuls of training in bf16, models saved in fp32."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from conftest import grpo_config, pretrain_config, sft_config
from safetensors.torch import load_file

from agentic_rl import utils
from agentic_rl.train.grpo import GRPOConfig
from agentic_rl.train.pretrain import PretrainConfig
from agentic_rl.train.sft import SFTConfig


@pytest.mark.parametrize("capabilities, expected", [
    ({"avx512_bf16": True, "avx512_f": True}, True),
    ({"amx_bf16": True}, True),
    ({"avx512_f": True, "avx512_bf16": False, "avx2": True}, False),
    ({"architecture": "aarch64"}, False),
])
def test_the_cpu_default_follows_its_bf16_instructions(monkeypatch, capabilities, expected):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: capabilities)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(utils, "has_gpu", lambda: False)
    assert utils.cpu_computes_bf16() is expected
    assert utils.default_mixed_precision() is expected


def test_kernels_restricted_to_avx2_count_as_a_cpu_without_bf16(monkeypatch):
    """ATEN_CPU_CAPABILITY=avx2 (measuring what an AVX2-only CPU does) turns the bf16 default off."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": True, "amx_bf16": True})
    monkeypatch.setattr(utils, "has_gpu", lambda: False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert utils.default_mixed_precision() is False


@pytest.mark.parametrize("user_value", [None, "512"])
def test_importing_the_package_bounds_the_cpu_kernel_caches_and_keeps_a_users_value(user_value):
    """bf16 matmuls add oneDNN / ideep cache entries for every new sequence length; the package bounds both caches
    (benchmarks/bench_cpu_kernel_cache.py measures the memory) unless the user set the variables."""
    import os
    import subprocess
    import sys

    from agentic_rl import CPU_KERNEL_CACHE_CAPACITY

    variables = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
    env = {k: v for k, v in os.environ.items() if k not in variables}
    env.update({name: user_value for name in variables} if user_value else {})
    shown = subprocess.run([sys.executable, "-c", "import os, agentic_rl; print(os.environ['ONEDNN_PRIMITIVE_CACHE_"
                            "CAPACITY'], os.environ['LRU_CACHE_CAPACITY'])"], env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    assert shown == [user_value or CPU_KERNEL_CACHE_CAPACITY] * 2
    assert int(CPU_KERNEL_CACHE_CAPACITY) < 1024  # the libraries' default, hundreds of MB on a bf16 stage


@pytest.mark.parametrize("gpu_bf16", [True, False])
def test_on_a_gpu_the_gpu_decides(monkeypatch, gpu_bf16):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": not gpu_bf16})
    monkeypatch.setattr(utils, "has_gpu", lambda: True)
    monkeypatch.setattr(utils, "supports_bf16", lambda: gpu_bf16)
    assert utils.default_mixed_precision() is gpu_bf16


@pytest.mark.parametrize("native", [True, False])
def test_unset_bf16_resolves_to_the_hardware_default_and_a_set_value_is_kept(monkeypatch, native):
    monkeypatch.setattr(utils, "cpu_computes_bf16", lambda: native)
    monkeypatch.setattr(utils, "has_gpu", lambda: False)
    assert PretrainConfig().bf16 is native
    assert SFTConfig().bf16 is native
    assert GRPOConfig(model="m").bf16 is native
    # float32 weights asked for: no bf16 matmuls unless asked for too
    assert SFTConfig(dtype="float32").bf16 is False
    assert SFTConfig(dtype="float32", bf16=True).bf16 is True
    for value in (True, False):
        assert PretrainConfig(bf16=value).bf16 is value
        assert SFTConfig(bf16=value).bf16 is value
        assert GRPOConfig(model="m", bf16=value).bf16 is value


@pytest.fixture
def linear_outputs():
    """(dtype, grad enabled) of every nn.Linear output computed while the test runs."""
    seen: set[tuple[torch.dtype, bool]] = set()

    def record(module, args, output):
        if isinstance(module, torch.nn.Linear) and isinstance(output, torch.Tensor):
            seen.add((output.dtype, torch.is_grad_enabled()))

    handle = torch.nn.modules.module.register_module_forward_hook(record)
    yield seen
    handle.remove()


def _saved_dtypes(model_dir: str | Path) -> set[torch.dtype]:
    return {t.dtype for t in load_file(str(Path(model_dir) / "model.safetensors")).values()}


@pytest.mark.parametrize("bf16", [True, False])
def test_sft_trains_in_bf16_when_set_and_saves_fp32(tiny_model_dir, tmp_path, linear_outputs, bf16):
    from agentic_rl.train.sft import run

    result = run(sft_config(tiny_model_dir, tmp_path, full=True, bf16=bf16, batch_size=8, save_steps=10,
                            max_length=512, logging_steps=10))
    trained = {dtype for dtype, grad in linear_outputs if grad}
    assert trained == ({torch.bfloat16} if bf16 else {torch.float32})
    assert _saved_dtypes(result["model_dir"]) == {torch.float32}


@pytest.mark.stage
def test_pretrain_trains_in_bf16_when_set(tmp_path, linear_outputs):
    from agentic_rl.train.pretrain import run

    result = run(pretrain_config(tmp_path, bf16=True))
    assert {dtype for dtype, grad in linear_outputs if grad} == {torch.bfloat16}
    assert _saved_dtypes(result["model_dir"]) == {torch.float32}


@pytest.fixture
def decoding_outputs():
    """dtypes of the nn.Linear outputs of decoding steps (one new position per sequence, no gradient: the project's
    decode loop and transformers' generate; scoring passes cover whole sequences) while the test runs."""
    seen: set[torch.dtype] = set()

    def record(module, args, output):
        if (isinstance(module, torch.nn.Linear) and not torch.is_grad_enabled() and output.dim() == 3
                and output.shape[1] == 1):
            seen.add(output.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(record)
    yield seen
    handle.remove()


@pytest.mark.parametrize("bf16, backend, full, algorithm", [
    (True, "compact", False, "grpo"), (True, "trl", True, "grpo"), (True, "trl", False, "grpo"),
    (True, "trl", True, "rloo"), (False, "compact", False, "grpo")])
def test_grpo_trains_in_bf16_when_set_and_samples_in_fp32_on_a_cpu(tiny_model_dir, tmp_path, linear_outputs,
                                                                    decoding_outputs, bf16, backend, full, algorithm):
    """The loss and the log-prob passes (the policy's and the reference's) run in the set precision; sampling (the
    project's decode loop or TRL's own generation, GRPO's or RLOO's, of a full model or a LoRA one) and the held-out
    checks run the weights' fp32 on a CPU (generate.weights_precision), and the wrapper is back after."""
    from agentic_rl.train.grpo import run

    config = grpo_config(tiny_model_dir, tmp_path, max_steps=1, save_steps=10, gradient_accumulation_steps=4,
                         learning_rate=1e-5, generation_backend=backend, bf16=bf16, beta=0.04, heldout_every=1,
                         eval_samples=4, full=full, algorithm=algorithm)
    run(config)
    expected = torch.bfloat16 if bf16 else torch.float32
    assert decoding_outputs == {torch.float32}
    assert {dtype for dtype, grad in linear_outputs if grad} == {expected}
    assert {dtype for dtype, grad in linear_outputs if not grad} == {expected, torch.float32}


def test_decoding_sets_the_mixed_precision_wrapper_aside_only_while_it_decodes(tiny_model_dir, decoding_outputs):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from agentic_rl.models import generate
    from agentic_rl.models.loading import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(str(tiny_model_dir), dtype="float32", for_training=True)
    AcceleratorState._reset_state(reset_partial_state=True)  # as transformers does before each trainer's accelerator
    model = Accelerator(cpu=True, mixed_precision="bf16").prepare_model(model)
    wrapper = vars(model)["forward"]
    contexts = [[5, 6, 7, 8], [9, 10, 11]]
    fp32 = generate.generate_token_ids(model, contexts, max_new_tokens=4, stop_ids=[], pad_id=0)
    assert decoding_outputs == {torch.float32}
    assert vars(model)["forward"] is wrapper
    decoding_outputs.clear()
    with torch.no_grad():  # a one-token step through the wrapper, back in place: bf16 again
        model(input_ids=torch.tensor([[5]]))
    assert decoding_outputs == {torch.bfloat16}
    decoding_outputs.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(generate, "CPU_DECODES_IN_WEIGHTS_PRECISION", False)
        generate.generate_token_ids(model, contexts, max_new_tokens=4, stop_ids=[], pad_id=0)
    assert decoding_outputs == {torch.bfloat16}
    # a forward set on an instance without accelerate's wrapper (here one that counts its calls) is kept
    plain, _ = load_model_and_tokenizer(str(tiny_model_dir), dtype="float32", for_training=True)
    calls = []

    def replaced(*args, **kwargs):
        calls.append(1)
        return type(plain).forward(plain, *args, **kwargs)

    replaced.__signature__ = inspect.signature(plain.forward)
    plain.forward = replaced
    assert generate.generate_token_ids(plain, contexts, max_new_tokens=4, stop_ids=[], pad_id=0) == fp32
    assert calls
