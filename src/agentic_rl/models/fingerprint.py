"""A cheap fingerprint of a model's weights, so that a LoRA adapter is only ever merged onto the base it was trained on.

A LoRA adapter stores only the low-rank update; applied to any base of the same shapes it loads without complaint.
Training records the fingerprint of its base in the adapter folder (``base_fingerprint.json``); export checks the
base it is about to merge onto and refuses a different one.

The fingerprint hashes every parameter's name and shape and 64 evenly spaced values of it, rounded to bfloat16 so the
same weights give the same fingerprint whether they are loaded in float32 or bfloat16 (on CPU or GPU). Two models
that differ anywhere in architecture, or in the sampled values (any training or a different initialisation changes
them all), differ in fingerprint; reading 64 values per tensor costs milliseconds even for billions of parameters.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from agentic_rl.utils import read_json, write_json

BASE_FINGERPRINT_FILE = "base_fingerprint.json"
SAMPLES_PER_TENSOR = 64


def weights_fingerprint(model: Any) -> str:
    """A 16-hex-digit hash of a model's parameters (names, shapes and a sample of values; see the module doc)."""
    import torch

    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            flat = param.detach().reshape(-1)
            step = max(1, flat.numel() // SAMPLES_PER_TENSOR)
            sample = flat[::step][:SAMPLES_PER_TENSOR].to(torch.bfloat16).to(torch.float32).cpu()
            digest.update(f"{name}:{tuple(param.shape)}:".encode())
            digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:16]


def write_base_fingerprint(adapter_dir: str | Path, fingerprint: str, base: str | Path) -> None:
    """Record the base an adapter was trained on in ``adapter_dir`` (nothing for a full model directory)."""
    adapter_dir = Path(adapter_dir)
    if (adapter_dir / "adapter_config.json").is_file():
        write_json(adapter_dir / BASE_FINGERPRINT_FILE, {"fingerprint": fingerprint, "base_model": str(base)})


def read_base_fingerprint(adapter_dir: str | Path) -> dict[str, Any] | None:
    path = Path(adapter_dir) / BASE_FINGERPRINT_FILE
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("fingerprint"), str) else None


def check_adapter_base(adapter_dir: str | Path, base_model: Any, base_name: str | Path) -> None:
    """Raise :class:`ModelLoadError` when ``adapter_dir`` recorded a base whose weights differ from ``base_model``
    (loaded from ``base_name``). Adapters that recorded nothing (older runs, other tools) pass unchecked."""
    from agentic_rl.errors import ModelLoadError

    recorded = read_base_fingerprint(adapter_dir)
    if recorded is None:
        return
    actual = weights_fingerprint(base_model)
    if actual != recorded["fingerprint"]:
        raise ModelLoadError(f"the adapter in {adapter_dir} was trained on another base model "
                             f"({recorded.get('base_model')}, fingerprint {recorded['fingerprint']}) than {base_name} "
                             f"(fingerprint {actual}); pass --base-model with the base it was trained on")
