"""Multi-process training: SFT and GRPO under ``accelerate launch`` with 2 CPU processes (gloo) stay in sync.

Each rank runs the real CLI (``agentic_rl.cli.main``, what ``accelerate launch -m agentic_rl`` runs) with the shipped
``configs/accelerate/ddp.yaml``, then hashes the LoRA weights it ends with. To tell "kept in sync by DDP" apart from
"identical because every rank did the same thing", each rank gets a *different* seed (so a different LoRA
initialisation and data order): only DDP's initial broadcast from rank 0 and its gradient all-reduce make the final
weights equal, and the weights must also have moved (the LoRA ``B`` matrices start at zero).

CPU multi-process launch: ``accelerate launch --cpu`` starts ONE process unless MPI is set up, so the test uses the
multi-GPU launcher (torchrun) with ``ACCELERATE_USE_CPU=1``, which puts every rank on the CPU with the gloo backend.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_DRIVER = textwrap.dedent("""
    import hashlib, json, os, sys
    from pathlib import Path
    import torch
    from safetensors.torch import load_file
    from agentic_rl.cli import main

    stage, base_out, *args = sys.argv[1:]
    rank = int(os.environ["RANK"])
    out = Path(base_out) / f"rank{rank}"
    rc = main([stage, "--output-dir", str(out), "--seed", str(rank), *args])
    tensors = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].float().numpy().tobytes())
    info = {"rank": rank, "rc": rc, "sha256": digest.hexdigest(),
            "world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
            "lora_b_abs_sum": sum(float(t.abs().sum()) for n, t in tensors.items() if "lora_B" in n)}
    (Path(base_out) / f"rank{rank}.json").write_text(json.dumps(info))
""")


def _launch(tmp_path: Path, stage: str, args: list[str]) -> list[dict]:
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or shutil.which("accelerate")
    if accelerate is None:
        pytest.skip("the accelerate launcher is not installed")
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    out = tmp_path / stage
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tmp_path)}
    cmd = [accelerate, "launch", "--config_file", str(REPO / "configs" / "accelerate" / "ddp.yaml"),
           "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", "0",
           str(driver), stage, str(out), *args]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _assert_in_sync(ranks: list[dict]) -> None:
    assert [r["rc"] for r in ranks] == [0, 0]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["lora_b_abs_sum"] > 0, "LoRA B is still zero: no optimizer step changed the weights"
    assert ranks[0]["sha256"] == ranks[1]["sha256"], "the two processes ended with different weights"


@pytest.mark.slow
def test_sft_two_processes_end_with_identical_weights(tmp_path, tiny_model_dir):
    ranks = _launch(tmp_path, "sft", ["--model", str(tiny_model_dir), "--max-train-samples", "32", "--batch-size", "4",
                                      "--max-steps", "3", "--learning-rate", "1e-3", "--report-to", "none",
                                      "--no-merge"])
    _assert_in_sync(ranks)


# A reward with variance even on the untrained model's text (shorter is better), so GRPO's advantages are non-zero
# and every step moves the weights.
_LENGTH_REWARD = "length(alpha=0.01, target_length=0, only_correct=false, floor=null):1.0"


@pytest.mark.slow
def test_grpo_two_processes_end_with_identical_weights(tmp_path, tiny_model_dir):
    ranks = _launch(tmp_path, "grpo", ["--model", str(tiny_model_dir), "--preset", "tiny", "--max-train-samples",
                                       "16", "--batch-size", "8", "--num-generations", "4",
                                       "--max-completion-length", "8", "--max-steps", "2", "--learning-rate", "1e-2",
                                       "--reward", _LENGTH_REWARD, "--report-to", "none", "--heldout-every", "0",
                                       "--completions-every", "0"])
    _assert_in_sync(ranks)


_LENGTH_ENV = textwrap.dedent("""
    from agentic_rl.agent.env import Environment, StepResult

    class LengthEnv(Environment):
        '''One-turn episodes whose reward is shorter-is-better: a signal even for the untrained model's text.'''

        def reset(self, task):
            self.task = task
            return None

        def step(self, text):
            return StepResult(observation=[], reward=-0.01 * len(text), done=True,
                              info={"kind": "answer", "correct": False})
""")


@pytest.mark.slow
def test_grpo_in_an_environment_two_processes_end_with_identical_weights(tmp_path, tiny_model_dir):
    (tmp_path / "length_env.py").write_text(_LENGTH_ENV)
    ranks = _launch(tmp_path, "grpo", ["--model", str(tiny_model_dir), "--preset", "tiny", "--max-train-samples",
                                       "16", "--batch-size", "8", "--num-generations", "4",
                                       "--max-completion-length", "8", "--max-turn-tokens", "8", "--max-steps", "2",
                                       "--learning-rate", "1e-2", "--environment", "length_env:LengthEnv",
                                       "--report-to", "none", "--heldout-every", "0", "--completions-every", "0"])
    _assert_in_sync(ranks)
