"""A cheap fingerprint of a model's weights, so that a LoRA adapter is only ever merged onto the base it was trained on.

A LoRA adapter stores only the low-rank update; applied to any base of the same shapes it loads without complaint.
Training records the fingerprint of its base in the adapter folder (``base_fingerprint.json``); loading (eval, serve,
continued training) and export check the base they are about to apply it to and refuse a different one.

The fingerprint holds every parameter's name and shape and 32 evenly spaced values of it. The check requires the
same names and shapes and every sampled value equal up to float rounding (``torch.allclose`` with ``rtol=1e-2``,
``atol=1e-6``): the same base loaded in float32, bfloat16 or float16 (export ``--dtype float16``, or a GPU without
bf16) rounds each value by at most 2^-8 of it. A different initialisation moves every value by about its own size,
and training moves every value of a tensor it updates; some sampled values lie near zero, where even a small update
is many times 1 % of the value (a 1e-4 change of one projection is refused, see tests/test_fingerprint.py). Reading 32
values per tensor costs milliseconds even for billions of parameters; the file (one line per tensor, values to 4
significant digits) is about 100 kB for a model of 300 tensors.

The file also keeps the older format's ``fingerprint``: a hash of the names, shapes and sampled values rounded to
bfloat16. Files written before the sampled values were stored hold only that hash; they are checked by it, which is
exact for a base loaded in float32 or bfloat16; for a float16 base a hash that differs cannot tell rounding from
another base, so it is a warning, not a refusal.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from agentic_rl.utils import read_json, warn, write_json

BASE_FINGERPRINT_FILE = "base_fingerprint.json"
SAMPLES_PER_TENSOR = 32
HASH_SAMPLES_PER_TENSOR = 64  # what the hash-only format sampled; kept so old files still check
# Float rounding of one value is at most 2^-8 of it (bfloat16) plus 2^-11 (float16); atol covers float16's underflow
# of values below 6e-8. A different base, or a trained one, differs by far more on at least one sampled value.
RTOL, ATOL = 1e-2, 1e-6


def _samples(flat, count: int):
    step = max(1, flat.numel() // count)
    return flat[::step][:count]


def weights_fingerprint(model: Any) -> dict[str, Any]:
    """The fingerprint of a model's parameters, ready for ``base_fingerprint.json`` (see the module doc)::

        {"fingerprint": "<16 hex digits>", "tensors": {name: {"shape": [...], "values": [32 floats]}}}
    """
    import torch

    digest = hashlib.sha256()
    tensors: dict[str, dict[str, Any]] = {}
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            flat = param.detach().reshape(-1)
            old = _samples(flat, HASH_SAMPLES_PER_TENSOR).to(torch.bfloat16).to(torch.float32).cpu()
            digest.update(f"{name}:{tuple(param.shape)}:".encode())
            digest.update(old.numpy().tobytes())
            values = _samples(flat, SAMPLES_PER_TENSOR).to(torch.float32).cpu().tolist()
            tensors[name] = {"shape": list(param.shape), "values": [float(f"{v:.4g}") for v in values]}
    return {"fingerprint": digest.hexdigest()[:16], "tensors": tensors}


def write_base_fingerprint(adapter_dir: str | Path, fingerprint: dict[str, Any] | str, base: str | Path) -> None:
    """Record the base an adapter was trained on in ``adapter_dir`` (nothing for a full model directory).

    ``fingerprint`` is :func:`weights_fingerprint`'s value, or what :func:`read_base_fingerprint` read from the
    adapter a run continued (a bare hash string from an old file).
    """
    adapter_dir = Path(adapter_dir)
    if (adapter_dir / "adapter_config.json").is_file():
        data = dict(fingerprint) if isinstance(fingerprint, dict) else {"fingerprint": fingerprint}
        data["base_model"] = str(base)
        tensors = data.pop("tensors", None)
        if tensors is None:
            write_json(adapter_dir / BASE_FINGERPRINT_FILE, data)
            return
        # One line per tensor: indent=2 would put each of the thousands of values on a line of its own.
        head = json.dumps(data, indent=2)[:-2]
        rows = ",\n".join(f"    {json.dumps(name)}: {json.dumps(t)}" for name, t in tensors.items())
        (adapter_dir / BASE_FINGERPRINT_FILE).write_text(f'{head},\n  "tensors": {{\n{rows}\n  }}\n}}\n')


def read_base_fingerprint(adapter_dir: str | Path) -> dict[str, Any] | None:
    path = Path(adapter_dir) / BASE_FINGERPRINT_FILE
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("fingerprint"), str) else None


def base_mismatch(recorded: dict[str, Any], actual: dict[str, Any]) -> str | None:
    """Why the sampled weights in ``recorded`` are not those of ``actual`` (a short phrase), or None when they match
    up to float rounding. Both are :func:`weights_fingerprint` values; ``recorded`` must hold ``tensors``."""
    import torch

    want, have = recorded["tensors"], actual["tensors"]
    if set(want) != set(have):
        differing = sorted(set(want) ^ set(have))
        return f"other parameters ({differing[0]}{f' and {len(differing) - 1} more' if len(differing) > 1 else ''})"
    for name in sorted(want):
        if list(want[name].get("shape", [])) != have[name]["shape"]:
            return f"{name} has shape {tuple(want[name].get('shape', []))} there, {tuple(have[name]['shape'])} here"
        expected = torch.tensor(want[name].get("values", []), dtype=torch.float32)
        found = torch.tensor(have[name]["values"], dtype=torch.float32)
        if expected.shape != found.shape or not torch.allclose(found, expected, rtol=RTOL, atol=ATOL):
            return f"other values in {name}"
    return None


def check_adapter_base(adapter_dir: str | Path, base_model: Any, base_name: str | Path) -> None:
    """Raise :class:`ModelLoadError` when ``adapter_dir`` recorded a base whose weights differ from ``base_model``
    (loaded from ``base_name``) by more than float rounding. Adapters that recorded nothing (older runs, other
    tools) pass unchecked; an old hash-only record is checked by its hash (see the module doc)."""
    from agentic_rl.errors import ModelLoadError

    recorded = read_base_fingerprint(adapter_dir)
    if recorded is None:
        return
    actual = weights_fingerprint(base_model)
    if isinstance(recorded.get("tensors"), dict):
        why = base_mismatch(recorded, actual)
    elif actual["fingerprint"] == recorded["fingerprint"]:
        why = None
    elif any(str(p.dtype) == "torch.float16" for p in base_model.parameters()):
        warn(f"cannot check that {base_name} is the base the adapter in {adapter_dir} was trained on: its "
             f"{BASE_FINGERPRINT_FILE} holds only a hash, which float16 rounding changes; load the base in float32 "
             f"or bfloat16 to check it")
        return
    else:
        why = f"fingerprint {actual['fingerprint']}, recorded {recorded['fingerprint']}"
    if why is not None:
        raise ModelLoadError(f"the adapter in {adapter_dir} was trained on another base model "
                             f"({recorded.get('base_model')}) than {base_name} ({why}); pass --base-model with the "
                             f"base it was trained on")
