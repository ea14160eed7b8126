"""Export a trained model as one self-contained directory that plain transformers and vLLM load as is.

    agentic-rl export runs/quickstart --out exported/
    agentic-rl export runs/quickstart/sft/adapter --out exported/ --dtype bfloat16

What is written to ``--out``:

* ``model.safetensors`` (or shards + ``model.safetensors.index.json``) and ``config.json`` — the *merged* weights:
  a LoRA adapter is folded into its base model (``W + (alpha / r) * B @ A``, PEFT's ``merge_and_unload``), so the
  result needs neither PEFT nor the base model;
* the tokenizer files with its chat template (``chat_template.jinja``) — the same template training and evaluation
  rendered prompts with, so a server applies exactly the prompt format the model learned;
* ``generation_config.json`` with the end-of-sequence and padding ids (vLLM reads its sampling defaults from it);
* ``export_info.json`` — where the weights came from (source, resolved directory, adapter, base, dtype).

``config.json`` and ``tokenizer_config.json`` also carry the transformers-4 spellings of v5's keys (``rope_theta``,
``torch_dtype``, a tokenizer class v4 knows, the chat template inline), so loaders pinned to transformers 4.x — many
vLLM releases — read the directory exactly as transformers 5 does.

The source may be

1. a **model directory** (``config.json`` + weights) — re-saved, optionally in another dtype;
2. a **PEFT adapter directory** (``adapter_config.json``) — merged onto its base (``base_model_name_or_path`` from the
   adapter config, or ``--base-model``);
3. a **stage directory** or a **pipeline run directory**. The model is searched for in this order, first hit wins:

   * stages, latest rung of the ladder first: ``<run>/grpo``, ``<run>/sft``, ``<run>/pretrain``, ``<run>/base``
     (``--stage NAME`` searches only that one), then ``<run>`` itself;
   * inside each: the directory itself, then ``model/`` (the stage's model), ``final/``, ``best/``, ``adapter/``, then
     the highest-numbered ``checkpoint-N/``.

   A run directory's ``export/`` folder (an earlier export) is never picked as a source.

Serve the result with ``agentic-rl serve DIR`` (CPU or GPU, batched) or, on a GPU, ``vllm serve DIR``.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from agentic_rl.config import setting
from agentic_rl.console import announce
from agentic_rl.errors import ConfigError, ModelLoadError
from agentic_rl.runs import MODEL_FOLDER
from agentic_rl.utils import log, write_json

STAGE_ORDER = ("grpo", "sft", "pretrain", "base")
MODEL_SUBDIRS = (MODEL_FOLDER, "final", "best", "adapter")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class ExportConfig:
    source: str = setting("", "what to export: a model directory, a PEFT adapter directory, or a stage/pipeline run "
                              "directory (searched grpo, sft, pretrain, base; model/ final/ best/ adapter/ "
                              "checkpoint-N/)", positional=True)
    out: str = setting("", "output directory for the merged model (required)")
    dtype: str = setting("auto", "dtype of the saved weights; auto keeps the source's (the base's for an adapter)",
                                 choices=DTYPES)
    stage: str | None = setting(None, "in a run directory, export this stage's model (e.g. sft) instead of searching "
                                      "the latest stage")
    base_model: str | None = setting(None, "base model for an adapter (default: base_model_name_or_path from "
                                           "adapter_config.json)")
    chat_template: str | None = setting(None, "a Jinja chat-template file to install in the tokenizer (needed when "
                                              "the source has none)")
    max_shard_size: str = setting("5GB", "largest safetensors shard, e.g. 2GB")
    overwrite: bool = setting(False, "replace the model files in a non-empty --out directory (an earlier export is "
                                     "always replaced)")
    trust_remote_code: bool = setting(False, "allow model code shipped with the checkpoint to run (off: only "
                                             "architectures transformers knows)")

    def __post_init__(self) -> None:
        if not self.source:
            raise ConfigError("export needs a SOURCE: a model, adapter or run directory (agentic-rl export SOURCE "
                              "--out DIR)")
        if not self.out:
            raise ConfigError("export needs --out DIR: the directory to write the merged model to")


# ---------------------------------------------------------------------------------------------------------------
# Finding the model
# ---------------------------------------------------------------------------------------------------------------

def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any((path / f).is_file() for f in WEIGHT_FILES)


def _is_adapter_dir(path: Path) -> bool:
    return (path / "adapter_config.json").is_file()


def _checkpoint_number(path: Path) -> int:
    match = re.fullmatch(r"checkpoint-(\d+)", path.name)
    return int(match.group(1)) if match else -1


def _find_in(directory: Path) -> Path | None:
    """The model in one directory: itself, a known sub-folder, or its latest ``checkpoint-N``."""
    if not directory.is_dir():
        return None
    for candidate in (directory, *(directory / sub for sub in MODEL_SUBDIRS)):
        if _is_model_dir(candidate) or _is_adapter_dir(candidate):
            return candidate
    checkpoints = sorted((p for p in directory.glob("checkpoint-*") if _checkpoint_number(p) >= 0),
                         key=_checkpoint_number, reverse=True)
    for candidate in checkpoints:
        if _is_model_dir(candidate) or _is_adapter_dir(candidate):
            return candidate
    return None


def resolve_source(source: str | Path, stage: str | None = None) -> Path:
    """The directory holding the weights to export, following the search order in the module docstring."""
    source = Path(source)
    if not source.exists():
        raise ModelLoadError(f"export source not found: {source}")
    if not source.is_dir():
        raise ModelLoadError(f"export source must be a directory (model, adapter or run), got file {source}")
    stages = (stage,) if stage else STAGE_ORDER
    for name in stages:
        found = _find_in(source / name)
        if found is not None:
            return found
    if stage:
        raise ModelLoadError(f"no model or adapter found for stage '{stage}' in {source / stage}")
    found = _find_in(source)
    if found is not None:
        return found
    raise ModelLoadError(
        f"no model found in {source}: expected config.json + model.safetensors, adapter_config.json, or a run "
        f"directory with {'/, '.join(STAGE_ORDER)}/ containing {'/, '.join(MODEL_SUBDIRS)}/ or checkpoint-N/")


# ---------------------------------------------------------------------------------------------------------------
# Loading and merging
# ---------------------------------------------------------------------------------------------------------------

def _source_dtype(model: str | Path) -> str:
    """The dtype recorded in a model's config.json (a local directory, or a hub id from the local cache);
    float32 when none is recorded."""
    config_path = Path(model) / "config.json"
    if config_path.is_file():
        from agentic_rl.models.loading import check_model_dir

        check_model_dir(model, tokenizer=False)  # a damaged config.json is a one-line error, not a traceback
        data = json.loads(config_path.read_text())
        value = data.get("dtype") or data.get("torch_dtype")
    else:
        try:
            from transformers import AutoConfig

            value = str(getattr(AutoConfig.from_pretrained(str(model)), "dtype", None) or "").replace("torch.", "")
        except (OSError, ValueError):
            value = None
    return value if value in DTYPES[1:] else "float32"


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file()


def load_merged(path: str | Path, *, dtype: str = "auto", base_model: str | None = None,
                trust_remote_code: bool = False):
    """(model, tokenizer, info) from a model or adapter directory: a plain transformers model, any adapter merged in.

    ``dtype`` ``auto`` keeps the dtype recorded in the (base) model's config.json. Also used by ``agentic-rl serve``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from agentic_rl.models.loading import check_model_dir, check_weights_finite, from_pretrained, load_tokenizer

    path = Path(path)
    info: dict = {"resolved": str(path)}
    if _is_adapter_dir(path):
        try:
            adapter_cfg = json.loads((path / "adapter_config.json").read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"{path / 'adapter_config.json'} is damaged: {str(exc).splitlines()[0]}") from None
        check_model_dir(path, tokenizer=False)
        base = base_model or adapter_cfg.get("base_model_name_or_path")
        if not base:
            raise ModelLoadError(f"{path / 'adapter_config.json'} names no base model; pass --base-model DIR")
        if not Path(base).exists() and (path / base).exists():  # a base path stored relative to the adapter
            base = str(path / base)
        info.update(kind="adapter", adapter=str(path), base_model=str(base))
        weights_from = base
    else:
        info.update(kind="model", base_model=None)
        weights_from = str(path)

    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    dtype = dtype if dtype != "auto" else _source_dtype(weights_from)
    info["dtype"] = dtype
    model = from_pretrained(AutoModelForCausalLM, str(weights_from), "model weights", dtype=getattr(torch, dtype),
                            trust_remote_code=trust_remote_code)

    if info["kind"] == "adapter":
        from peft import PeftModel

        from agentic_rl.models.fingerprint import check_adapter_base

        check_adapter_base(path, model, weights_from)  # a LoRA update fits any base of the same shapes: check which
        try:
            model = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelLoadError(f"cannot apply adapter {path} to {weights_from}: {str(exc).splitlines()[0]}") from None

    check_weights_finite(model, str(path))  # never re-save (or serve) NaN weights as a clean model
    tokenizer_from = str(path) if _has_tokenizer(path) else str(weights_from)
    # A folder without tokenizer files is an error here (transformers would build an empty one-token tokenizer).
    tokenizer = load_tokenizer(tokenizer_from, trust_remote_code=trust_remote_code, require_chat_template=False)
    info["tokenizer"] = tokenizer_from
    return model.eval(), tokenizer, info


def _install_chat_template(tokenizer, config: ExportConfig, source: Path) -> None:
    if config.chat_template:
        template = Path(config.chat_template)
        if not template.is_file():
            raise ConfigError(f"chat template file not found: {template}")
        tokenizer.chat_template = template.read_text()
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(f"the tokenizer of {source} has no chat template, so chat servers could not build "
                             f"prompts; pass --chat-template FILE.jinja")
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "1 + 1"}], tokenize=False,
                                      add_generation_prompt=True)
    except Exception as exc:  # a broken template is a user error: say which
        raise ModelLoadError(f"the chat template of {source} does not render: {exc}") from None


def _set_special_ids(model, tokenizer) -> None:
    """End-of-sequence and padding ids agree between tokenizer, model config and generation config."""
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    gen = model.generation_config
    eos = gen.eos_token_id
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids.insert(0, tokenizer.eos_token_id)
    if eos_ids:
        gen.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    if gen.pad_token_id is None and tokenizer.pad_token_id is not None:
        gen.pad_token_id = tokenizer.pad_token_id
    if getattr(model.config, "pad_token_id", None) is None and tokenizer.pad_token_id is not None:
        model.config.pad_token_id = tokenizer.pad_token_id


def _prepare_out(out: Path, source: Path, overwrite: bool) -> None:
    if out.resolve() == source.resolve():
        raise ConfigError(f"--out {out} is the source directory itself; choose a new directory")
    if out.exists() and any(out.iterdir()):
        # An earlier export (it has export_info.json) is replaced; anything else only with --overwrite.
        if not overwrite and not (out / "export_info.json").is_file():
            raise ConfigError(f"--out {out} is not empty; pass --overwrite to replace the model files in it")
        # Remove only files an export writes, so stale shards cannot mix with new ones.
        for path in out.iterdir():
            if path.is_file() and (path.suffix in (".safetensors", ".bin") or path.name.endswith(".index.json")):
                path.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _add_legacy_keys(out: Path) -> None:
    """Also write the transformers-4 spellings, so loaders pinned to transformers 4.x (vLLM releases often are) read
    the directory exactly as transformers 5 does.

    * ``config.json``: ``rope_theta`` / ``rope_scaling`` beside v5's ``rope_parameters`` (without them a v4 loader
      silently falls back to the architecture's default RoPE base — 10000 instead of Qwen3's 1000000) and
      ``torch_dtype`` beside ``dtype``;
    * ``tokenizer_config.json``: the generic fast-tokenizer class name (v5 writes ``TokenizersBackend``, which v4
      does not know) and the chat template inline (v4 before 4.47 reads only that, not ``chat_template.jinja``).
    """
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    sections = [config] + [v for v in config.values() if isinstance(v, dict) and "rope_parameters" in v]
    for section in sections:  # the top level, and e.g. text_config of multimodal models
        rope = section.get("rope_parameters")
        if isinstance(rope, dict) and "rope_theta" in rope:
            section.setdefault("rope_theta", rope["rope_theta"])
            if rope.get("rope_type", "default") != "default":
                section.setdefault("rope_scaling", {k: v for k, v in rope.items() if k != "rope_theta"})
    if "dtype" in config:
        config.setdefault("torch_dtype", config["dtype"])
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    tok_path = out / "tokenizer_config.json"
    if tok_path.is_file():
        tok = json.loads(tok_path.read_text())
        if tok.get("tokenizer_class") == "TokenizersBackend":
            tok["tokenizer_class"] = "PreTrainedTokenizerFast"
        template = out / "chat_template.jinja"
        if "chat_template" not in tok and template.is_file():
            tok["chat_template"] = template.read_text()
        for junk in ("is_local", "local_files_only"):  # loader state, not tokenizer settings
            tok.pop(junk, None)
        tok_path.write_text(json.dumps(tok, indent=2, ensure_ascii=False) + "\n")


def _check_exported(out: Path) -> list[str]:
    """Tensor names in the written safetensors; an unmerged adapter (lora_ / base_model.) is an error."""
    from safetensors import safe_open

    files = sorted(out.glob("*.safetensors"))
    if not files or not (out / "config.json").is_file():
        raise ModelLoadError(f"export to {out} wrote no safetensors weights")
    names: list[str] = []
    for path in files:
        with safe_open(str(path), framework="pt") as fh:
            names.extend(fh.keys())
    leftovers = [n for n in names if "lora_" in n or n.startswith("base_model.")]
    if leftovers:
        raise ModelLoadError(f"export to {out} still holds adapter tensors (e.g. {leftovers[0]}); merge failed")
    return names


# ---------------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------------

def run(config: ExportConfig) -> Path:
    """Resolve the source, merge any adapter, write the model directory; returns its path."""
    source = Path(config.source)
    resolved = resolve_source(source, config.stage)
    out = Path(config.out)
    _prepare_out(out, resolved, config.overwrite)
    announce("export", config, line=f"export: loading {resolved} (dtype {config.dtype}) -> {out}")

    model, tokenizer, info = load_merged(resolved, dtype=config.dtype, base_model=config.base_model,
                                         trust_remote_code=config.trust_remote_code)
    _install_chat_template(tokenizer, config, resolved)
    _set_special_ids(model, tokenizer)

    model.save_pretrained(str(out), max_shard_size=config.max_shard_size)
    tokenizer.save_pretrained(str(out))
    model.generation_config.save_pretrained(str(out))
    _add_legacy_keys(out)
    # The weights stay under the base model's licence: carry its LICENSE file along when there is one.
    for origin in (resolved, Path(info.get("base_model") or resolved)):
        if (origin / "LICENSE").is_file() and not (out / "LICENSE").exists():
            shutil.copyfile(origin / "LICENSE", out / "LICENSE")

    tensors = _check_exported(out)
    info.update(source=str(source), out=str(out), tensors=len(tensors),
                parameters=sum(p.numel() for p in model.parameters()))
    write_json(out / "export_info.json", info)
    log(f"export: wrote {out} ({info['kind']}, {info['dtype']}, {info['parameters']:,} parameters)")
    return out

