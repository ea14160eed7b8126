"""Load any causal LM and its tokenizer, by Hub id or local directory, ready for training or generation.

``load_model_and_tokenizer(name_or_path)`` is the one loader every stage uses:

* **where**: a local directory first (a full model, or a PEFT adapter directory whose ``adapter_config.json`` names
  its base model), then the local Hugging Face cache, then the Hub — but only when the Hub is reachable. With
  ``HF_HUB_OFFLINE=1`` or no network the failure is immediate and one line long (no retry loop), suggesting a local
  path or the embedded model; ``embedded`` is the base shipped with the package (``models/embedded.py``);
* **dtype**: ``"auto"`` means bf16 on a GPU that supports it, fp32 on CPU (and on GPUs without bf16 when training;
  fp16 for inference there);
* **tokenizer**: a pad token is always set (the EOS token when the tokenizer has none); the chat template must exist,
  since every stage renders prompts with it. Left padding for batched generation is the evaluator's choice.
* **adapters**: a directory holding ``adapter_config.json`` loads the base model plus the adapter — as a trainable
  ``PeftModel`` with ``for_training=True``, merged (``merge_and_unload``) otherwise.
* **damage**: a local folder is checked before transformers sees it (:func:`check_model_dir`): ``config.json`` must
  be a JSON object, every ``*.safetensors`` header must read back whole (a truncated or overwritten file fails
  here), and the tokenizer files must be there — transformers 5 would otherwise build an empty one-token tokenizer
  and carry on. Weights whose shapes disagree with ``config.json``, config values of the wrong type and weights
  holding NaN/inf are caught after loading. Each is a one-line :class:`ModelLoadError`; export and serve load
  through the same functions.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from agentic_rl.errors import ModelLoadError
from agentic_rl.utils import supports_bf16

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16", "half": "float16"}
_EMBEDDED_HINT = "pass a local model directory, or 'embedded' (the base shipped with the package)"


def resolve_device(device: str | None = None) -> str:
    """``None`` -> ``"cuda"`` when a GPU is visible, else ``"cpu"``."""
    import torch

    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: Any = "auto", device: str | None = None, *, for_training: bool = True):
    """The torch dtype to load weights in: ``"auto"`` picks by device, strings like ``"bf16"`` are mapped."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        device = resolve_device(device)
        if device.startswith("cuda"):
            if supports_bf16():
                return torch.bfloat16
            return torch.float32 if for_training else torch.float16
        return torch.float32
    name = _DTYPES.get(str(dtype).lower())
    if name is None:
        raise ModelLoadError(f"unknown dtype '{dtype}'; use auto, float32, bfloat16 or float16")
    return getattr(torch, name)


def hub_reachable(timeout: float = 3.0) -> bool:
    """False when ``HF_HUB_OFFLINE`` is set or the Hub endpoint cannot be reached within ``timeout`` seconds."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    host = parsed.hostname or "huggingface.co"
    port = parsed.port or (443 if parsed.scheme != "http" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / "adapter_config.json").is_file()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def resolve_model_path(name: str) -> str:
    """A local directory for ``name`` when there is one (the path itself, or the Hub id's snapshot in the local
    cache), else ``name`` itself when the Hub is reachable; otherwise a one-line :class:`ModelLoadError` at once.

    Nothing here touches the network except a single TCP connect with a 3 s timeout: transformers' own lookups
    retry for tens of seconds when offline (even with ``local_files_only``, for the adapter-config probe).
    """
    from agentic_rl.models.embedded import EMBEDDED, embedded_base_dir

    if name == EMBEDDED:
        return str(embedded_base_dir())
    if Path(name).is_dir():
        return name
    if Path(name).exists() or name.startswith((".", "/", "~")):
        raise ModelLoadError(f"model path {name} is not a directory; {_EMBEDDED_HINT}")
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name, local_files_only=True)
    except Exception:  # not cached (or not a valid repo id): try the Hub below
        pass
    if not hub_reachable():
        why = "HF_HUB_OFFLINE=1" if os.environ.get("HF_HUB_OFFLINE") else "the Hugging Face Hub is unreachable"
        raise ModelLoadError(f"cannot load '{name}': not a local directory, not in the local cache, and {why}; "
                             f"{_EMBEDDED_HINT}")
    return name


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_model_dir(path: str | Path, *, tokenizer: bool = True) -> None:
    """One-line :class:`ModelLoadError` for a damaged model folder, before transformers reads it.

    Checks that ``config.json`` (when present) is a JSON object, that every ``*.safetensors`` header is complete,
    and (``tokenizer=True``) that tokenizer files are present.
    """
    path = Path(path)
    config_file = path / "config.json"
    if config_file.is_file():
        try:
            data = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"{config_file} is damaged: not valid JSON ({_one_line(exc)}); restore it from the "
                                 f"model's source") from None
        if not isinstance(data, dict):
            raise ModelLoadError(f"{config_file} is damaged: expected a JSON object, got {type(data).__name__}")
    for weights in sorted(path.glob("*.safetensors")):
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(weights), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"{weights} is damaged or incomplete ({_one_line(exc)}); copy or download it "
                                 f"again") from None
    if tokenizer and not _has_tokenizer(path):
        raise ModelLoadError(f"{path} has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}); copy them from the "
                             f"model it was trained from")


def check_weights_finite(model, where: str) -> None:
    """One-line :class:`ModelLoadError` when loaded weights hold NaN or inf (a diverged run saved anyway)."""
    bad = nonfinite_parameters(model)
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise ModelLoadError(f"the weights in {where} hold NaN/inf ({bad[0]}{more}): the model is corrupt; use an "
                             f"earlier checkpoint")


def from_pretrained(loader, name: str, kind: str, **kwargs):
    """``loader.from_pretrained`` on a resolved name; any failure becomes one ModelLoadError line.

    A local folder is first checked with :func:`check_model_dir` (its tokenizer files only when ``kind`` is
    ``"tokenizer"``).
    """
    path = resolve_model_path(name)
    if Path(path).is_dir():
        check_model_dir(path, tokenizer=kind == "tokenizer")
    where = f"directory {name}" if Path(name).is_dir() else f"'{name}'"
    try:
        return loader.from_pretrained(path, **kwargs)
    except RuntimeError as exc:
        if "mismatched_sizes" in str(exc) or "size mismatch" in str(exc):
            raise ModelLoadError(f"cannot load the {kind} from {where}: the weights' shapes do not match its "
                                 f"config.json (see the load report above); the folder mixes files of different "
                                 f"models") from None
        raise ModelLoadError(f"cannot load the {kind} from {where}: {_one_line(exc)}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:  # TypeError: a config value of the wrong type
        raise ModelLoadError(f"cannot load the {kind} from {where}: {_one_line(exc)}") from None
    except Exception as exc:  # e.g. ZeroDivisionError from num_attention_heads: 0 in a damaged config.json
        raise ModelLoadError(f"cannot load the {kind} from {where}: {type(exc).__name__}: {_one_line(exc)} "
                             f"(is its config.json damaged?)") from None


def load_tokenizer(name_or_path: str | Path, *, trust_remote_code: bool = False, require_chat_template: bool = True):
    """Tokenizer with a pad token and (unless ``require_chat_template=False``) a checked chat template."""
    from transformers import AutoTokenizer

    name = str(name_or_path)
    tokenizer = from_pretrained(AutoTokenizer, name, "tokenizer", trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError(f"tokenizer of {name} has neither a pad nor an EOS token; add one to its "
                                 f"tokenizer_config.json")
        tokenizer.pad_token = tokenizer.eos_token
    if require_chat_template and not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(f"tokenizer of {name} has no chat template (prompts are rendered with it); use an "
                             f"instruct/chat model or add chat_template.jinja to the directory")
    return tokenizer


def load_model_and_tokenizer(name_or_path: str | Path, *, dtype: Any = "auto", device: str | None = None,
                             trust_remote_code: bool = False, for_training: bool = True, adapter_ok: bool = True,
                             require_chat_template: bool = True) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for a Hub id, a model directory, or a PEFT adapter directory.

    The model is on ``device`` (default: GPU if present, else CPU) in the dtype :func:`resolve_dtype` picks; in
    train mode when ``for_training`` and in eval mode otherwise. An adapter directory gives a trainable ``PeftModel``
    with ``for_training=True``, and a merged plain model otherwise.
    """
    from transformers import AutoModelForCausalLM

    name = str(name_or_path)
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device, for_training=for_training)

    adapter_dir: Path | None = None
    base_name = name
    if Path(name).is_dir() and is_adapter_dir(name):
        if not adapter_ok:
            raise ModelLoadError(f"{name} holds a PEFT adapter, not a full model; pass the model with it merged in "
                                 f"(its run's model/ folder)")
        adapter_dir = Path(name)
        try:
            adapter_cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"{adapter_dir / 'adapter_config.json'}: unreadable ({_one_line(exc)})") from None
        base_name = adapter_cfg.get("base_model_name_or_path") or ""
        check_model_dir(adapter_dir, tokenizer=False)
        if not base_name:
            raise ModelLoadError(f"{adapter_dir / 'adapter_config.json'}: field 'base_model_name_or_path' is empty")
    elif Path(name).is_dir() and not (Path(name) / "config.json").is_file():
        raise ModelLoadError(f"{name} has neither config.json (a model) nor adapter_config.json (an adapter)")

    model = from_pretrained(AutoModelForCausalLM, base_name, "model", dtype=torch_dtype,
                            trust_remote_code=trust_remote_code)
    check_weights_finite(model, base_name)
    # The tokenizer: the adapter directory's own copy when it has one (SFT saves it there), else the base model's.
    tok_source = name if adapter_dir is not None and _has_tokenizer(adapter_dir) else base_name
    tokenizer = load_tokenizer(tok_source, trust_remote_code=trust_remote_code,
                               require_chat_template=require_chat_template)

    if adapter_dir is not None:
        from peft import PeftModel

        from agentic_rl.models.fingerprint import check_adapter_base

        check_adapter_base(adapter_dir, model, base_name)  # a LoRA update fits any base of the same shapes
        try:
            model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=for_training)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise ModelLoadError(f"cannot apply the adapter in {adapter_dir} to {base_name}: {_one_line(exc)}") \
                from None
        check_weights_finite(model, str(adapter_dir))
        if not for_training:
            model = model.merge_and_unload()

    _sync_special_ids(model, tokenizer)
    model.to(device)
    model.train(for_training)
    return model, tokenizer


def _has_tokenizer(path: Path) -> bool:
    return any((Path(path) / f).is_file() for f in TOKENIZER_FILES)


def _sync_special_ids(model, tokenizer) -> None:
    """Make the model's pad id agree with the tokenizer (generation warns and mis-pads otherwise)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "pad_token_id", None) is None:
        base.config.pad_token_id = tokenizer.pad_token_id
    gen = getattr(base, "generation_config", None)
    if gen is not None:
        if gen.pad_token_id is None:
            gen.pad_token_id = tokenizer.pad_token_id
        if gen.eos_token_id is None:
            gen.eos_token_id = tokenizer.eos_token_id


def count_parameters(model) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total


def nonfinite_parameters(model, *, trainable_only: bool = False) -> list[str]:
    """Names of the parameters holding NaN or inf (all of them, or only the trainable ones); ``[]`` when clean.

    Cheap next to a training step or a save (the training guard runs it after every step): the norms of all the
    weights of a device in one multi-tensor pass and one sync — NaN or inf anywhere makes its tensor's norm non-finite
    — and only when one is, the exact per-tensor check (a norm can also overflow from finite weights above ~1e19,
    which that check then clears). On the quickstart's model 1 ms instead of 8 per call on one CPU thread.
    """
    import torch

    by_device: dict[Any, list[tuple[str, Any]]] = {}
    for name, param in model.named_parameters():
        if param.requires_grad or not trainable_only:
            by_device.setdefault(param.device, []).append((name, param))
    bad = []
    with torch.no_grad():
        for named in by_device.values():
            tensors = [p for _, p in named]
            if bool(torch.stack(torch._foreach_norm(tensors)).isfinite().all()):
                continue
            flags = torch.stack([torch.isfinite(p).all() for p in tensors]).tolist()
            bad += [n for (n, _), ok in zip(named, flags) if not ok]
    return bad



#: What a failed save reports: a full disk (or quota) is the usual cause, and the fix is the user's.
DISK_FULL_ERRNOS = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def save_model_atomically(model, tokenizer, path: str | Path) -> Path:
    """Write ``model`` and ``tokenizer`` (``save_pretrained``) into the folder ``path`` whole or not at all.

    The files go into a hidden sibling folder first, which is renamed to ``path`` once complete (an existing
    ``path`` is replaced only then), so a full disk or a crash mid-save never leaves a half-written model folder
    that a later stage would load. A failed write removes the partial folder and is one line
    (:class:`~agentic_rl.errors.AgenticRLError`), naming the disk being full when it is.
    """
    import shutil

    from agentic_rl.errors import AgenticRLError

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.parent / f".{path.name}.partial-{os.getpid()}"
    replaced = path.parent / f".{path.name}.replaced-{os.getpid()}"
    for leftover in (partial, replaced):  # from an earlier save of this process that was cut short
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        partial.mkdir()
        model.save_pretrained(str(partial))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(partial))
        if path.exists():
            path.rename(replaced)
        partial.rename(path)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if replaced.exists() and not path.exists():  # put the previous model back
            replaced.rename(path)
        if exc.errno in DISK_FULL_ERRNOS:
            raise AgenticRLError(f"the disk is full: could not save the model to {path} (nothing half-written was "
                                 "left); free some space and run the same command with --resume") from None
        raise AgenticRLError(f"could not save the model to {path}: {exc.strerror or exc}") from None
    shutil.rmtree(replaced, ignore_errors=True)
    return path
